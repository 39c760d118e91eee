#!/usr/bin/env bash
# Prints the product's claim statement (CLAIM_DUE_SQL in src/store/claim.rs) with its
# parameters inlined (round id random, no guard heartbeat), without the trailing semicolon, so a pgbench script can end it with
# ';' or '\gset'. The benchmark therefore always measures the statement the daemon runs.
#   usage: bench/claim_sql.sh OWNER_SQL_EXPR LEASE_MS LIMIT [all|core]
#          core: only the leased rows, without the round's probe row
#   e.g.   bench/claim_sql.sh "'bench-probe'" 30000 16
set -euo pipefail
owner=$1 lease=$2 limit=$3 part=${4:-all}
root="$(cd "$(dirname "$0")/.." && pwd)"
# The statement comes from the library itself (examples/claim-sql.rs), so the benchmark
# always measures the statement the daemon runs, whatever Rust builds its text.
sql=$(cd "$root" && cargo run --quiet --example claim-sql)
if [ -z "$sql" ]; then
  echo "bench/claim_sql.sh: examples/claim-sql.rs printed nothing" >&2; exit 1
fi
if [ "$part" = core ]; then
  # Only the leased rows (no probe row): for pgbench scripts that \gset one row.
  sql=$(printf '%s\n' "$sql" | sed -e '/^SELECT claimed\.\*/,$d'; echo "SELECT claimed.* FROM claimed")
fi
extra=$(printf '%s' "$sql" | grep -o '\$[0-9][0-9]*' | sort -u | grep -vxE '\$[1-6]' || true)
if [ -n "$extra" ]; then
  echo "bench/claim_sql.sh: CLAIM_DUE_SQL uses parameters beyond \$1..\$6: $extra" >&2; exit 1
fi
printf '%s\n' "$sql" | sed -e "s/\$1\b/($owner)/g" -e "s/\$2\b/($lease)::bigint/g" -e "s/\$3\b/$limit/g" \
  -e "s/\$4\b/gen_random_uuid()/g" -e "s/\$5\b/'00000000-0000-0000-0000-000000000000'/g" -e "s/\$6\b/0/g"
