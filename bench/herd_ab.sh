#!/usr/bin/env bash
# Boundary-herd A/B (issue 24): the same 10,000-trigger herd, laid out three ways, on ONE server
# in ONE run, boundaries alternating between the sets so machine load hits them alike.
#   bulk    : bench/load.sql (one transaction, cursor set in SQL), database qa
#   cli1    : `qlsched trigger publish` once per trigger, all sharing one task, database qb
#   clitask : `qlsched task publish` + `qlsched trigger publish` per trigger (a task and an
#             execution revision each), database qc
#   base    : as bulk, but bootstrapped, migrated and run by the binary QLSCHED_AB_BASE_BIN
#             (a baseline build): QLSCHED_AB_SETS="base bulk" compares two binaries in one run
# Each set fires every 3 minutes, offset by one minute (`0 K-59/3 * * * *`), so every minute
# boundary is one set's herd of HERD_N occurrences; each database has its own 3 replicas at the
# default configuration. Per boundary: time from the boundary until the last run committed,
# and the set's pg_stat_statements / pg_stat_user_tables / replica-metric deltas.
#   usage: bench/herd_ab.sh [HERD_N] [ROUNDS] [PUBLISH_P]   (defaults 10000 3 4)
# environment: QLSCHED_BENCH_BIN (binary), QLSCHED_AB_SETS (default "bulk cli1 clitask"),
#   QLSCHED_AB_BASE_BIN (the binary of set base),
#   QLSCHED_AB_STOCK=1 (stock server settings instead of the bench's tuned ones),
#   QLSCHED_BENCH_KEEP=1 (keep the work directory)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
. scripts/pg.sh
N=${1:-10000} ROUNDS=${2:-3} P=${3:-4}
SETS=(${QLSCHED_AB_SETS:-cli1 clitask bulk})   # bulk last: its first cursor is set at load time
QL=${QLSCHED_BENCH_BIN:-$ROOT/target/release/qlsched}
BIN=$(pg_find_bindir)
ql_of() { if [ "$1" = base ]; then echo "${QLSCHED_AB_BASE_BIN:?set base needs QLSCHED_AB_BASE_BIN}"; else echo "$QL"; fi; }
say() { printf '== %s\n' "$*" >&2; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { local p=$1; while port_busy "$p"; do p=$((p + 1)); done; echo "$p"; }
PORT=$(free_port 55541)
WORK=$(mktemp -d /tmp/qlsched-herdab.XXXXXX); chmod 755 "$WORK"
declare -a ALLPIDS=()
cleanup() {
  local p
  for p in "${ALLPIDS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  pg_stop "$WORK" immediate
  if [ "${QLSCHED_BENCH_KEEP:-0}" = 1 ]; then echo "work directory kept: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
PGCONF="
shared_buffers = 1GB
max_wal_size = 8GB
min_wal_size = 1GB
checkpoint_timeout = 30min"
[ "${QLSCHED_AB_STOCK:-0}" = 1 ] && PGCONF=""
PGCONF="$PGCONF
fsync = on
synchronous_commit = on
log_min_messages = warning
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.max = 5000
pg_stat_statements.track = top
pg_stat_statements.track_planning = on
max_pred_locks_per_transaction = 64"
pg_start "$WORK" "$PORT" "$PGCONF"
PSQL=("$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres)
sqlpg() { "${PSQL[@]}" -d postgres -c "$1"; }
sqld() { "${PSQL[@]}" -d "$1" -c "$2"; }
now_ms() { date +%s%3N; }
sqlpg "CREATE EXTENSION pg_stat_statements" >/dev/null

# database / role prefix per set: qa, qb, qc
declare -A DB=() OFF=()
i=0
for s in "${SETS[@]}"; do
  d=q$(printf "\\x$(printf %x $((97 + i)))"); DB[$s]=$d; OFF[$s]=$i; i=$((i + 1))
  "$(ql_of "$s")" db bootstrap --superuser-dsn "host=127.0.0.1 port=$PORT user=postgres dbname=postgres" \
      --prefix "$d" --database "$d" >"$WORK/boot-$d.log" 2>&1 || { cat "$WORK/boot-$d.log"; exit 1; }
  "$(ql_of "$s")" db migrate --prefix "$d" --dsn "host=127.0.0.1 port=$PORT user=${d}_owner dbname=$d" >"$WORK/mig-$d.log" 2>&1 \
      || { cat "$WORK/mig-$d.log"; exit 1; }
done
K=${#SETS[@]}
SPEC='{"image":"bench/noop:1","args":[]}'
cron_of() { local o=${OFF[$1]}; echo "0 $o-59/$K * * * *"; }

# bulk: bench/load.sql as it is, with only the cron and the first cursor of mode `minute`
# replaced (so the set fires every K minutes at its offset).
load_bulk() {
  local s=$1 d=${DB[$1]} now first
  now=$(now_ms)
  first=$(( (now + 30000) / 60000 + 1 ))
  while [ $(( first % K )) -ne "${OFF[$s]}" ]; do first=$((first + 1)); done
  sed -e "s|WHEN 'minute' THEN '0 \* \* \* \* \*'|WHEN 'minute' THEN '$(cron_of "$s")'|" \
      -e "s|WHEN 'minute' THEN ((:now_ms + :lead_ms) / 60000 + 1) \* 60000|WHEN 'minute' THEN $((first * 60000))|" \
      bench/load.sql >"$WORK/load-$s.sql"
  grep -q "$(cron_of "$s")" "$WORK/load-$s.sql" && grep -q "THEN $((first * 60000))" "$WORK/load-$s.sql" || { echo "load.sql substitution failed"; exit 1; }
  "${PSQL[@]}" -d "$d" -v n="$N" -v mode=minute -f "$WORK/load-$s.sql" >/dev/null
}
# cli: what a user does (project set, task publish, `trigger publish` per trigger, P at a time),
# through bench/publish_cli.sh (the CLI's transactions via pgbench -C; --verify compares).
publish_cli() {
  local s=$1 d=${DB[$1]} per_task=$2 t0
  t0=$(now_ms)
  bench/publish_cli.sh "$QL" "$BIN" "$PORT" "$d" "$d" "$N" "${OFF[$s]}" "$K" "$per_task" "$P"
  echo "published $N triggers of $s in $(( ($(now_ms) - t0) / 1000 )) s" >&2
}
# The real CLI, one process per trigger, P at a time (for the equivalence check).
publish_real_cli() { # db n per_task k m
  local d=$1 n=$2 per_task=$3 k=$4 m=$5
  local dsn="host=127.0.0.1 port=$PORT user=${d}_admin dbname=$d"
  "$QL" project set --dsn "$dsn" --id bench --status active >/dev/null
  "$QL" task publish --dsn "$dsn" --project bench --id bench-task --spec "$SPEC" >/dev/null
  export QL dsn SPEC per_task CRON="0 $k-59/$m * * * *"
  seq -f 'b%07g' 1 "$n" | xargs -P "$P" -n 1 sh -c '
    task=bench-task
    if [ "$per_task" = 1 ]; then task=t-$0; "$QL" task publish --dsn "$dsn" --project bench --id "$task" --spec "$SPEC" >/dev/null || exit 255; fi
    "$QL" trigger publish --dsn "$dsn" --id "$0" --project bench --task "$task" --cron "$CRON" >/dev/null || exit 255'
}
# canonical dump of what publishing wrote (absolute times and random ids left out, the rest as is)
canon() {
  sqld "$1" "select 'project', project_id, status from qlsched.projects order by 2" \
   && sqld "$1" "select 'task', task_id, project_id, revision, content_digest, (select spec || '/' || spec_digest || '/' || kind from qlsched.execution_revisions e where e.execution_revision_id = k.execution_revision_id) from qlsched.tasks k order by 2" \
   && sqld "$1" "select 'trigger', t.trigger_id, t.project_id, t.task_id, t.revision, t.kind, t.enabled, t.published_enabled, t.operator_disabled, t.cron_expr, t.timezone, t.misfire_policy, t.misfire_grace_ms, t.content_digest, t.deleted_at_ms is null,
                        s.project_id, s.trigger_revision, s.next_fire_at_ms = s.claimable_at_ms, (s.next_fire_at_ms / 60000) % $K, s.next_fire_at_ms % 60000, s.last_scheduled_at_ms, s.state_version, s.claim_owner, s.claim_token, s.claim_version, s.claim_expires_at_ms, s.claim_round,
                        t.xmin = s.xmin, s.updated_at_ms >= t.updated_at_ms
                   from qlsched.triggers t join qlsched.trigger_schedules s using (trigger_id) order by 2" \
   && sqld "$1" "select 'transactions', count(distinct xmin::text) from qlsched.trigger_schedules" \
   && sqld "$1" "select 'execution_revisions', count(*) from qlsched.execution_revisions"
}
verify() { # n per_task: real CLI into qv, publish_cli.sh into qw, rows compared
  local n=$1 per_task=$2 d
  for d in qv qw; do
    sqlpg "DROP DATABASE IF EXISTS $d" >/dev/null
    "$QL" db bootstrap --superuser-dsn "host=127.0.0.1 port=$PORT user=postgres dbname=postgres" --prefix "$d" --database "$d" >"$WORK/boot-$d.log" 2>&1 || { cat "$WORK/boot-$d.log"; exit 1; }
    "$QL" db migrate --prefix "$d" --dsn "host=127.0.0.1 port=$PORT user=${d}_owner dbname=$d" >"$WORK/mig-$d.log" 2>&1 || { cat "$WORK/mig-$d.log"; exit 1; }
  done
  publish_real_cli qv "$n" "$per_task" 0 "$K"
  bench/publish_cli.sh "$QL" "$BIN" "$PORT" qw qw "$n" 0 "$K" "$per_task" "$P"
  canon qv >"$WORK/canon-cli-$per_task.txt"; canon qw >"$WORK/canon-bench-$per_task.txt"
  if diff "$WORK/canon-cli-$per_task.txt" "$WORK/canon-bench-$per_task.txt" >"$WORK/canon-diff-$per_task.txt"; then
    echo "verify per_task=$per_task: $n triggers, real CLI and bench/publish_cli.sh rows identical ($(wc -l <"$WORK/canon-cli-$per_task.txt") lines; $(grep transactions "$WORK/canon-cli-$per_task.txt"))" | tee -a "$WORK/results.txt" >&2
  else
    echo "verify per_task=$per_task: DIFFERENT" | tee -a "$WORK/results.txt" >&2; head -20 "$WORK/canon-diff-$per_task.txt" | tee -a "$WORK/results.txt" >&2
  fi
}
if [ -n "${QLSCHED_AB_VERIFY:-}" ]; then
  K=3
  verify "$QLSCHED_AB_VERIFY" 0
  verify "$QLSCHED_AB_VERIFY" 1
  [ "${QLSCHED_AB_VERIFY_ONLY:-0}" = 1 ] && { cat "$WORK/results.txt"; exit 0; }
  K=${#SETS[@]}
fi
for s in "${SETS[@]}"; do
  say "creating set $s in database ${DB[$s]}"
  case $s in
    bulk|base) load_bulk "$s" ;;
    cli1) publish_cli "$s" 0 ;;
    clitask) publish_cli "$s" 1 ;;
  esac
done

# replicas: 3 per database, default config
declare -A RP=()
HTTP=$(free_port 19401)
for s in "${SETS[@]}"; do
  d=${DB[$s]}; ports=""
  for r in 1 2 3; do
    HTTP=$(free_port $((HTTP + 1)))
    cat >"$WORK/$d-r$r.toml" <<TOML
[replica]
id = "$d-r$r"
[database]
dsn = "host=127.0.0.1 port=$PORT user=${d}_runtime dbname=$d"
application_name = "$d-r$r"
[http]
bind = "127.0.0.1:$HTTP"
TOML
    "$(ql_of "$s")" run --config "$WORK/$d-r$r.toml" >>"$WORK/$d-r$r.log" 2>&1 &
    ALLPIDS+=($!); ports="$ports $HTTP"
  done
  RP[$s]=$ports
done
metric_sum() { # set metric
  local port t=0 v
  for port in ${RP[$1]}; do
    v=$(curl -fs "http://127.0.0.1:$port/metrics" | awk -v m="$2" '$1 == m {print $2}')
    t=$(awk -v a="$t" -v b="${v:-0}" 'BEGIN {print a + b}')
  done; echo "$t"
}
tabstats() { sqld "$1" "select n_tup_upd, n_tup_hot_upd, n_dead_tup, autovacuum_count, pg_relation_size('qlsched.trigger_schedules'),
                            pg_relation_size('qlsched.trigger_schedules_claimable_idx'), pg_relation_size('qlsched.trigger_schedules_pkey')
                       from pg_stat_user_tables where relid = 'qlsched.trigger_schedules'::regclass"; }
pgss() { # db -> per-statement rows for claim and admission
  sqlpg "select case when query ilike '%picked AS%' then 'claim' when query ilike '%INSERT INTO qlsched.runs%' then 'admit'
                     when query ilike 'BEGIN%SERIAL%' then 'begin' else 'other' end k,
                sum(calls), sum(rows), round(sum(shared_blks_hit)::numeric / greatest(sum(calls),1), 1),
                round(sum(shared_blks_read)::numeric / greatest(sum(calls),1), 1),
                round(sum(shared_blks_dirtied)::numeric / greatest(sum(calls),1), 1),
                round(sum(wal_bytes)::numeric / greatest(sum(calls),1)), round(sum(total_exec_time)::numeric, 1),
                round(sum(total_plan_time)::numeric, 1), sum(plans)
           from pg_stat_statements s join pg_database d on d.oid = s.dbid where d.datname = '$1'
          group by 1 order by 1" | sed 's/^/    /'
}
# the first boundary at least 20 s ahead (publishing takes minutes: the first occurrences of
# the earliest published triggers are past when the replicas start, and are caught up first)
B=$(( ($(now_ms) + 20000) / 60000 + 1 ))
for s in "${SETS[@]}"; do [ $(( B % K )) -eq "${OFF[$s]}" ] && S=$s; done
B=$((B * 60000))
echo "first boundary $B ($S), now $(now_ms)" >&2
RES=$WORK/results.txt
for b in $(seq 1 $((ROUNDS * K))); do
  d=${DB[$S]}
  # reset statistics ~3 s before the boundary
  while [ "$(now_ms)" -lt $((B - 3000)) ]; do sleep 0.2; done
  sqlpg "select pg_stat_statements_reset()" >/dev/null
  tb=$(tabstats "$d"); rt0=$(metric_sum "$S" qlsched_serialization_retries_total); ad0=$(metric_sum "$S" qlsched_admits_total)
  while :; do
    n=$(sqld "$d" "select count(*) from qlsched.runs where scheduled_for_ms = $B")
    [ "$n" -ge "$N" ] && break
    [ "$(now_ms)" -lt $((B + 50000)) ] || break
    sleep 0.1
  done
  t=$(sqld "$d" "select coalesce(max(queued_at_ms), 0) - $B from qlsched.runs where scheduled_for_ms = $B")
  ta=$(tabstats "$d"); rt1=$(metric_sum "$S" qlsched_serialization_retries_total); ad1=$(metric_sum "$S" qlsched_admits_total)
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  line="boundary $b set $S: $n/$N runs, last committed $t ms after the boundary; load $load; retries $(awk -v a="$rt1" -v b="$rt0" 'BEGIN{print a-b}') admits $(awk -v a="$ad1" -v b="$ad0" 'BEGIN{print a-b}'); schedules (upd hot dead autovac heap claimidx pkey) before $tb after $ta"
  echo "$line" | tee -a "$RES" >&2
  pgss "$d" >>"$RES"
  # next boundary: the next minute, the set whose offset matches
  B=$((B + 60000)); for s in "${SETS[@]}"; do [ $(( (B / 60000) % K )) -eq "${OFF[$s]}" ] && S=$s; done
done
for s in "${SETS[@]}"; do
  d=${DB[$s]}
  echo "set $s layout:" >>"$RES"
  sqld "$d" "select 'correlation', attname, correlation from pg_stats where schemaname = 'qlsched' and tablename = 'trigger_schedules' and attname in ('trigger_id','claimable_at_ms')" >>"$RES" || true
  sqld "$d" "select 'tasks', count(*) from qlsched.tasks union all select 'execution_revisions', count(*) from qlsched.execution_revisions
             union all select 'dups', count(*) from (select 1 from qlsched.runs group by trigger_id, scheduled_for_ms having count(*) > 1) x" >>"$RES"
done
cat "$RES"
cp "$RES" "${QLSCHED_AB_OUT:-/tmp/herd_ab_results.txt}"
