#!/usr/bin/env bash
# Prints the product's claim statement (CLAIM_DUE_SQL in src/store/claim.rs) with its three
# parameters inlined, without the trailing semicolon, so a pgbench script can end it with
# ';' or '\gset'. The benchmark therefore always measures the statement the daemon runs.
#   usage: bench/claim_sql.sh OWNER_SQL_EXPR LEASE_MS LIMIT [SRC]
#   e.g.   bench/claim_sql.sh "'bench-probe'" 30000 16
set -euo pipefail
owner=$1 lease=$2 limit=$3
src=${4:-"$(dirname "$0")/../src/store/claim.rs"}
sql=$(awk '/pub const CLAIM_DUE_SQL: &str = "/{f=1; sub(/.*= "/, ""); if ($0 != "") print; next}
           f && /";[[:space:]]*$/ {sub(/";[[:space:]]*$/, ""); print; exit}
           f {print}' "$src")
if [ -z "$sql" ]; then
  echo "bench/claim_sql.sh: cannot find 'pub const CLAIM_DUE_SQL: &str = \"…\";' in $src" >&2; exit 1
fi
if printf '%s' "$sql" | grep -q '\\'; then
  echo "bench/claim_sql.sh: CLAIM_DUE_SQL contains a backslash escape; teach this extractor about it" >&2; exit 1
fi
extra=$(printf '%s' "$sql" | grep -o '\$[0-9][0-9]*' | sort -u | grep -vxE '\$[123]' || true)
if [ -n "$extra" ]; then
  echo "bench/claim_sql.sh: CLAIM_DUE_SQL uses parameters beyond \$1 owner, \$2 lease_ms, \$3 limit: $extra" >&2; exit 1
fi
printf '%s\n' "$sql" | sed -e "s/\$1\b/($owner)/g" -e "s/\$2\b/($lease)::bigint/g" -e "s/\$3\b/$limit/g"
