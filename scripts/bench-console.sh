#!/usr/bin/env bash
# The web console's bench row (issue 23): page render time at 100,000 triggers and 10 M runs,
# and the scheduler's lag while a page is reloaded every second. Starts a private, durable
# PostgreSQL (like scripts/bench.sh), bulk-generates triggers and runs in SQL, starts one
# replica (release build, default config, console on loopback) that also admits 200
# every-second triggers, then:
#   1 pages    every console page and its /api/v1 twin, QLSCHED_BENCH_CONSOLE_REPS times each
#              (curl's time to the last byte over loopback: the server's time plus a loopback
#              round trip): median, p95 and max per page; bound 200 ms
#   2 lag      queued_at - scheduled_for of the every-second triggers' runs: p50/p99 over a
#              window without console traffic, then over an equal window with the overview, the
#              triggers page, one trigger and the runs page each reloaded every second
# Prints a markdown table (and keeps it in $WORK/result.md when QLSCHED_BENCH_KEEP=1).
#
# usage: scripts/bench-console.sh
# environment:
#   QLSCHED_BENCH_CONSOLE_TRIGGERS  triggers (default 100000)
#   QLSCHED_BENCH_CONSOLE_RUNS      runs (default 10000000), spread over the last 7 days
#   QLSCHED_BENCH_CONSOLE_REPS      requests per page (default 20)
#   QLSCHED_BENCH_CONSOLE_LAG_S     seconds of each lag window (default 60)
#   QLSCHED_BENCH_PORT              first PostgreSQL port to try (default 55461)
#   QLSCHED_BENCH_BIN               use this qlsched binary instead of target/release/qlsched
#   QLSCHED_BENCH_KEEP=1            keep the work directory
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
. scripts/pg.sh

TRIGGERS=${QLSCHED_BENCH_CONSOLE_TRIGGERS:-100000}
RUNS=${QLSCHED_BENCH_CONSOLE_RUNS:-10000000}
REPS=${QLSCHED_BENCH_CONSOLE_REPS:-20}
LAG_S=${QLSCHED_BENCH_CONSOLE_LAG_S:-60}
SECOND_N=200

say() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
die() { echo "bench-console: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

if [ -n "${QLSCHED_BENCH_BIN:-}" ]; then
  QL=$QLSCHED_BENCH_BIN
else
  say "building (cargo build --release --bin qlsched)"
  cargo build --release --quiet --bin qlsched
  QL=$ROOT/target/release/qlsched
fi
[ -x "$QL" ] || die "$QL is not executable"
command -v curl >/dev/null || die "curl is missing (apt-get install curl)"
pg_ensure_installed
BIN=$(pg_find_bindir)

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { local p=$1; while port_busy "$p"; do p=$((p + 1)); done; echo "$p"; }
PORT=$(free_port "${QLSCHED_BENCH_PORT:-55461}")
HTTP=$(free_port 19361)
WORK=$(mktemp -d /tmp/qlsched-bench-console.XXXXXX)
chmod 755 "$WORK"
RPID=""
cleanup() {
  [ -n "$RPID" ] && kill -KILL "$RPID" 2>/dev/null || true
  pg_stop "$WORK" immediate
  if [ "${QLSCHED_BENCH_KEEP:-0}" = 1 ]; then echo "bench-console: work directory kept: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

say "starting a private PostgreSQL on 127.0.0.1:$PORT (fsync on, shared_buffers 1GB) in $WORK"
pg_start "$WORK" "$PORT" "
shared_buffers = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
maintenance_work_mem = 512MB
log_min_messages = warning"
SU="host=127.0.0.1 port=$PORT user=postgres dbname=postgres"
OWNER="host=127.0.0.1 port=$PORT user=qlsched_owner dbname=qlsched"
RUNTIME="host=127.0.0.1 port=$PORT user=qlsched_runtime dbname=qlsched"
PSQL=("$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched)
sql() { "${PSQL[@]}" -c "$1"; }
"$QL" db bootstrap --superuser-dsn "$SU" >"$WORK/bootstrap.log" 2>&1 || { cat "$WORK/bootstrap.log" >&2; die "bootstrap failed"; }
"$QL" db migrate --dsn "$OWNER" >"$WORK/migrate.log" 2>&1 || { cat "$WORK/migrate.log" >&2; die "migrate failed"; }

say "loading $TRIGGERS triggers (none due for a day)"
t0=$(now_ms)
"${PSQL[@]}" -v n="$TRIGGERS" -v mode=idle -f bench/load.sql >/dev/null

say "generating $RUNS runs over the last 7 days (1 in 1000 manual, 1 in 500 a backfill; the rest cron)"
# The secondary indexes are built once after the load (same definitions, read from the
# catalogue), as a long-running installation would have them; the primary key and the
# unique key are maintained row by row.
"${PSQL[@]}" <<SQL >/dev/null
SET session_replication_role = replica;
CREATE TEMP TABLE idx AS
  SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS def
    FROM pg_index i WHERE indrelid = 'qlsched.runs'::regclass
     AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid);
DO \$\$ DECLARE r record; BEGIN
  FOR r IN SELECT name FROM idx LOOP EXECUTE 'DROP INDEX ' || r.name; END LOOP;
END \$\$;
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms \gset
-- Run g: trigger b<g mod N>, scheduled ((RUNS - g) / RUNS) of 7 days ago, lag 5..200 ms.
INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                          execution_revision_id, idempotency_key, status, scheduled_for_ms,
                          queued_at_ms, admitted_by, request_id)
SELECT gen_random_uuid(), 'bench', t, 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c',
       CASE WHEN g % 1000 = 0 THEN 'ql3:manual:v2:' || t || ':m' || g
            ELSE 'ql3:cron:v1:' || t || ':1:' || s END,
       CASE WHEN g > $RUNS - 5000 THEN 'queued' ELSE 'succeeded' END,
       s, s + 5 + (g * 7919) % 195,
       CASE WHEN g % 500 = 0 AND g % 1000 <> 0 THEN 'backfill:bench' ELSE 'bench-seed' END,
       CASE WHEN g % 1000 = 0 THEN 'm' || g END
  FROM (SELECT g, 'b' || lpad((g % $TRIGGERS + 1)::text, 7, '0') AS t,
               :now_ms - 7 * 86400000::bigint * ($RUNS - g) / $RUNS - 1000 AS s
          FROM generate_series(1::bigint, $RUNS) g) x;
DO \$\$ DECLARE r record; BEGIN
  FOR r IN SELECT def FROM idx LOOP EXECUTE r.def; END LOOP;
END \$\$;
SQL
sql "VACUUM ANALYZE qlsched.runs" >/dev/null
sql "VACUUM ANALYZE qlsched.triggers" >/dev/null
sql "VACUUM ANALYZE qlsched.trigger_schedules" >/dev/null
load_s=$(( ($(now_ms) - t0) / 1000 ))
sizes=$(sql "select (select count(*) from qlsched.triggers) || ' triggers, ' || (select count(*) from qlsched.runs) || ' runs, runs table + indexes ' || pg_size_pretty(pg_total_relation_size('qlsched.runs'))")
say "loaded in ${load_s} s: $sizes"

say "adding $SECOND_N every-second triggers (due from 3 s on) and starting the replica"
"${PSQL[@]}" -v n="$SECOND_N" -v mode=second -v prefix=s -v lead_ms=3000 -f bench/load.sql >/dev/null
cat >"$WORK/r.toml" <<TOML
[replica]
id = "bench-console"
[database]
dsn = "$RUNTIME"
[http]
bind = "127.0.0.1:$HTTP"
TOML
"$QL" run --config "$WORK/r.toml" >"$WORK/r.log" 2>&1 &
RPID=$!
deadline=$(( $(date +%s) + 60 ))
until curl -fs "http://127.0.0.1:$HTTP/readyz" >/dev/null 2>&1; do
  kill -0 "$RPID" 2>/dev/null || { tail -20 "$WORK/r.log" >&2; die "the replica exited"; }
  [ "$(date +%s)" -lt $deadline ] || die "the replica was not ready after 60 s"
  sleep 0.1
done
BASE="http://127.0.0.1:$HTTP"
MID=$(printf 'b%07d' $((TRIGGERS / 2)))
CURSOR=$(curl -fs "$BASE/api/v1/runs?limit=100" | sed -n 's/.*"next_before": "\([^"]*\)".*/\1/p')

# ---- 1. pages -----------------------------------------------------------------------------
PAGES=(
  "/"
  "/api/v1/overview"
  "/triggers"
  "/triggers?limit=100&after=$MID"
  "/triggers?q=b00999"
  "/triggers?project=bench&state=disabled"
  "/api/v1/triggers?limit=100"
  "/triggers/$MID"
  "/api/v1/triggers/$MID"
  "/runs"
  "/runs?limit=100&before=$CURSOR"
  "/runs?trigger=$MID"
  "/runs?kind=manual"
  "/runs?kind=backfill&status=succeeded"
  "/runs?status=queued"
  "/api/v1/runs?limit=100"
)
ROWS=()
worst=0
say "1. pages: $REPS requests each (after one warm-up)"
for p in "${PAGES[@]}"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$BASE$p")
  times=()
  for _ in $(seq 1 "$REPS"); do
    times+=("$(curl -s -o /dev/null -w '%{time_total}' "$BASE$p")")
  done
  stats=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR] = $1 * 1000} END {
    m = a[int((NR + 1) / 2)]; p95 = a[int(NR * 0.95 + 0.999)]; printf "%.1f|%.1f|%.1f", m, p95, a[NR] }')
  IFS='|' read -r med p95 max <<<"$stats"
  worst=$(awk -v a="$worst" -v b="$p95" 'BEGIN {print (b > a) ? b : a}')
  ROWS+=("| \`${p//|/\\|}\` | $code | $med | $p95 | $max |")
  say "   $p: HTTP $code, median $med ms, p95 $p95 ms, max $max ms"
done

# ---- 2. lag with and without reloads ------------------------------------------------------
lag() { # $1 $2 = window in ms: count|p50|p99|max of the every-second triggers' runs
  sql "select count(*), round(percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms)::numeric, 1),
              round(percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms)::numeric, 1),
              max(queued_at_ms - scheduled_for_ms)
         from qlsched.runs where trigger_id like 's%' and scheduled_for_ms between $1 and $2"
}
say "2. lag of the every-second triggers: ${LAG_S} s quiet, then ${LAG_S} s with reloads"
q0=$(now_ms); sleep "$LAG_S"; q1=$(now_ms)
sleep 3
quiet=$(lag "$q0" "$q1")
say "   quiet window: $quiet"
r0=$(now_ms)
end=$(( r0 + LAG_S * 1000 ))
reloads=0
while [ "$(now_ms)" -lt $end ]; do
  tick=$(now_ms)
  for p in "/" "/triggers" "/triggers/$MID" "/runs"; do curl -s -o /dev/null "$BASE$p"; reloads=$((reloads + 1)); done
  left=$(( 1000 - ($(now_ms) - tick) ))
  [ $left -gt 0 ] && sleep "$(awk -v l=$left 'BEGIN {print l / 1000}')"
done
r1=$(now_ms)
sleep 3
busy=$(lag "$r0" "$r1")
say "   reload window: $busy ($reloads page loads)"
kill -TERM "$RPID"; wait "$RPID" 2>/dev/null || true; RPID=""

IFS='|' read -r qn qp50 qp99 qmax <<<"$quiet"
IFS='|' read -r bn bp50 bp99 bmax <<<"$busy"
{
  echo "Console bench: $sizes (loaded in ${load_s} s); $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD 2>/dev/null)"
  echo
  echo "| page | HTTP | median ms | p95 ms | max ms |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "Worst p95: $worst ms (bound 200 ms: $(awk -v w="$worst" 'BEGIN {print (w <= 200) ? "PASS" : "FAIL"}'))."
  echo
  echo "| lag of $SECOND_N every-second triggers, ${LAG_S} s each | runs | p50 ms | p99 ms | max ms |"
  echo "|---|---|---|---|---|"
  echo "| no console traffic | $qn | $qp50 | $qp99 | $qmax |"
  echo "| overview, triggers, trigger, runs each reloaded every second ($reloads loads) | $bn | $bp50 | $bp99 | $bmax |"
} | tee "$WORK/result.md"
