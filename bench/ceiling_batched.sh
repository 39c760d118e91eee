#!/usr/bin/env bash
# Prints the pgbench script of the batched raw-SQL ceiling (issue 24): the product's claim
# statement (bench/claim_sql.sh, LIMIT = BATCH, autocommit) returning its batch as arrays,
# then bench/ceiling_batched.sql (one SERIALIZABLE transaction writing the batch).
#   usage: bench/ceiling_batched.sh BATCH [LEASE_MS]
set -euo pipefail
batch=$1 lease=${2:-30000}
root="$(cd "$(dirname "$0")/.." && pwd)"
core=$("$root/bench/claim_sql.sh" "'pgbench-' || :client_id" "$lease" "$batch" core)
printf '%s\n' "$core" | grep -q '^SELECT claimed\.\* FROM claimed$' \
  || { echo "bench/ceiling_batched.sh: the claim statement no longer ends in SELECT claimed.* FROM claimed" >&2; exit 1; }
printf '%s\n' "$core" | sed '$d'
cat <<'SQL'
SELECT '{' || string_agg('"' || ctid || '"', ',') || '}' AS tids, '{' || string_agg(trigger_id, ',') || '}' AS ids,
       '{' || string_agg(state_version::text, ',') || '}' AS svs, '{' || string_agg(claim_token::text, ',') || '}' AS tokens,
       '{' || string_agg(claim_version::text, ',') || '}' AS cvs, '{' || string_agg(next_fire_at_ms::text, ',') || '}' AS sfs,
       '{' || string_agg(project_id, ',') || '}' AS projects, '{' || string_agg(trigger_revision::text, ',') || '}' AS revs,
       '{' || string_agg(task_id, ',') || '}' AS tasks, '{' || string_agg(revision::text, ',') || '}' AS krevs,
       '{' || string_agg(execution_revision_id::text, ',') || '}' AS erevs
  FROM claimed \gset b_
SQL
echo
grep -v "^--" "$root/bench/ceiling_batched.sql"
