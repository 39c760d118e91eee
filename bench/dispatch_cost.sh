#!/usr/bin/env bash
# What dispatching one run costs the server through the dispatcher protocol (docs/dispatcher.md,
# V16), beside what admitting it cost: a private durable PostgreSQL with pg_stat_statements,
# RUNS queued runs written by `qlsched trigger backfill`, then pgbench as the dispatcher role,
# one client, each transaction one run: dispatch_take (batch 1), dispatch_start,
# dispatch_heartbeat, dispatch_finish, each its own autocommit call. Then one replica at the
# default configuration admits 100 every-second triggers for 20 s. Per statement, from
# pg_stat_statements: calls, mean execution time and WAL bytes per call (the WAL of each
# call's commit record is not in it, for the protocol calls and the admission alike). Not part
# of the test suite; about a minute after the build.
#   usage: bench/dispatch_cost.sh [RUNS]      (default 2000)
# environment:
#   QLSCHED_BENCH_BIN   use this qlsched binary instead of building target/release/qlsched
#   QLSCHED_BENCH_PORT  first PostgreSQL port to try (default 55561)
#   QLSCHED_BENCH_KEEP=1  keep the work directory
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pg.sh
RUNS=${1:-2000}

say() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
die() { echo "dispatch_cost: $*" >&2; exit 1; }

if [ -n "${QLSCHED_BENCH_BIN:-}" ]; then
  QL=$QLSCHED_BENCH_BIN
else
  say "building (cargo build --release --bin qlsched)"
  cargo build --release --quiet --bin qlsched
  QL=$PWD/target/release/qlsched
fi
pg_ensure_installed
BIN=$(pg_find_bindir)
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { local p=$1; while port_busy "$p"; do p=$((p + 1)); done; echo "$p"; }
PORT=$(free_port "${QLSCHED_BENCH_PORT:-55561}")
HTTP=$(free_port 19451)

WORK=$(mktemp -d /tmp/qlsched-dispatch-cost.XXXXXX)
chmod 755 "$WORK"
RPID=
cleanup() {
  [ -n "$RPID" ] && kill -KILL "$RPID" 2>/dev/null || true
  pg_stop "$WORK" immediate
  if [ "${QLSCHED_BENCH_KEEP:-0}" = 1 ]; then echo "dispatch_cost: work directory kept: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

say "private PostgreSQL on 127.0.0.1:$PORT (fsync on, synchronous_commit on, pg_stat_statements) in $WORK"
pg_start "$WORK" "$PORT" "shared_buffers = 256MB
fsync = on
synchronous_commit = on
shared_preload_libraries = 'pg_stat_statements'
log_min_messages = warning"
SU="host=127.0.0.1 port=$PORT user=postgres dbname=postgres"
ADMIN="host=127.0.0.1 port=$PORT user=qlsched_admin dbname=qlsched"
sql() { "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched -c "$1"; }
"$QL" db bootstrap --superuser-dsn "$SU" >"$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log" >&2; die "bootstrap failed"; }
"$QL" db migrate --dsn "host=127.0.0.1 port=$PORT user=qlsched_owner dbname=qlsched" >>"$WORK/setup.log" 2>&1 \
  || { cat "$WORK/setup.log" >&2; die "migrate failed"; }
sql "CREATE EXTENSION pg_stat_statements" >/dev/null

say "$RUNS queued runs (qlsched trigger backfill of an every-second trigger)"
"$QL" project set --dsn "$ADMIN" --id bench --status active >/dev/null
"$QL" task publish --dsn "$ADMIN" --project bench --id cost-task --spec '{"image":"bench/noop:0"}' >/dev/null
"$QL" trigger publish --dsn "$ADMIN" --project bench --task cost-task --id backlog --cron '* * * * * *' >/dev/null
now=$(sql "select (extract(epoch from clock_timestamp()))::bigint")
from=$(date -u -d "@$(( now - RUNS - 6 ))" +%Y-%m-%dT%H:%M:%SZ)
to=$(date -u -d "@$(( now - 6 ))" +%Y-%m-%dT%H:%M:%SZ)
"$QL" trigger backfill --dsn "$ADMIN" --from "$from" --to "$to" --max "$RUNS" backlog >"$WORK/backfill.log" 2>&1 \
  || { cat "$WORK/backfill.log" >&2; die "backfill failed"; }
# No replica runs yet; disabled before one does, so only the backfilled runs are queued.
"$QL" trigger disable --dsn "$ADMIN" --note "dispatch_cost: backfilled only" backlog >/dev/null
queued=$(sql "select count(*) from qlsched.runs where status = 'queued'")
[ "$queued" -ge "$RUNS" ] || die "only $queued runs queued"
sql "VACUUM ANALYZE; CHECKPOINT; SELECT pg_stat_statements_reset()" >/dev/null

say "pgbench as qlsched_dispatcher: $RUNS runs, each taken, started, heartbeaten and finished"
cat >"$WORK/dispatch_one.sql" <<'SQL'
SELECT attempt_id AS a, lease_token AS t FROM qlsched.dispatch_take('bench', NULL, 1, 30000) \gset
SELECT qlsched.dispatch_start(':a'::uuid, ':t'::uuid, 30000);
SELECT lease_expires_at_ms FROM qlsched.dispatch_heartbeat(':a'::uuid, ':t'::uuid, 30000);
SELECT qlsched.dispatch_finish(':a'::uuid, ':t'::uuid, 'succeeded', 0, NULL, NULL, NULL);
SQL
"$BIN/pgbench" -n -c 1 -t "$RUNS" -f "$WORK/dispatch_one.sql" -h 127.0.0.1 -p "$PORT" -U qlsched_dispatcher qlsched \
  >"$WORK/pgbench.log" 2>&1 || { cat "$WORK/pgbench.log" >&2; die "pgbench failed"; }
done_runs=$(sql "select count(*) from qlsched.runs where status = 'succeeded'")
[ "$done_runs" -eq "$RUNS" ] || die "$done_runs of $RUNS runs finished"
# per_call PATTERN: calls|mean ms|WAL bytes per call of the statements whose text matches
per_call() {
  sql "select coalesce(sum(calls), 0), round((sum(total_exec_time) / nullif(sum(calls), 0))::numeric, 3),
              round(sum(wal_bytes) / nullif(sum(calls), 0))
         from pg_stat_statements where query like '$1' and dbid = (select oid from pg_database where datname = 'qlsched')"
}
printf '%-12s %8s %10s %12s\n' call calls "mean ms" "WAL B/call"
total_ms=0 total_wal=0
for f in take start heartbeat finish; do
  IFS='|' read -r calls ms wal <<<"$(per_call "%qlsched.dispatch_$f(%")"
  printf '%-12s %8s %10s %12s\n' "$f" "$calls" "$ms" "$wal"
  total_ms=$(awk -v a="$total_ms" -v b="$ms" 'BEGIN {print a + b}')
  total_wal=$(( total_wal + ${wal:-0} ))
done
printf '%-12s %8s %10s %12s\n' "one run" "" "$total_ms" "$total_wal"

say "one replica admits 100 every-second triggers for 20 s (the admission, for comparison)"
seq -f 'a%04g' 1 100 | xargs -P4 -I{} "$QL" trigger publish --dsn "$ADMIN" --project bench \
  --task cost-task --id {} --cron '* * * * * *' >/dev/null
sql "SELECT pg_stat_statements_reset()" >/dev/null
cat >"$WORK/r.toml" <<TOML
[replica]
id = "cost-r1"
[database]
dsn = "host=127.0.0.1 port=$PORT user=qlsched_runtime dbname=qlsched"
[http]
bind = "127.0.0.1:$HTTP"
TOML
"$QL" run --config "$WORK/r.toml" >"$WORK/r.log" 2>&1 &
RPID=$!
sleep 20
kill -TERM "$RPID"; wait "$RPID" || true; RPID=
IFS='|' read -r calls rows ms wal <<<"$(sql "select sum(calls), sum(rows), round((sum(total_exec_time) / nullif(sum(rows), 0))::numeric, 3),
         round(sum(wal_bytes) / nullif(sum(rows), 0))
    from pg_stat_statements where query like '%INSERT INTO qlsched.runs%' and query like '%trigger_schedules%'")"
printf '%-12s %8s %10s %12s   (%s admission statements; per occurrence)\n' admission "$rows" "$ms" "$wal" "$calls"
