#!/usr/bin/env bash
# Lag of every-second occurrences while their task is deployed (issue 30, item 13): a private
# durable PostgreSQL, 300 every-second triggers of one task published with the CLI, 2 replicas
# at the default config, a quiet window, then 20 `qlsched task publish` with a changed spec
# 0.3-0.8 s apart. Prints count / p50 / p99 / max of queued_at - scheduled_for for the
# occurrences scheduled in the quiet window and in the deploy window, duplicates and holes.
# Not part of the test suite; about a minute after the build.
#   usage: bench/deploy_lag.sh [RUNS]      (RUNS deploy windows in a row, default 1)
# environment:
#   QLSCHED_BENCH_BIN   use this qlsched binary instead of building target/release/qlsched
#   QLSCHED_BENCH_PORT  first PostgreSQL port to try (default 55541)
#   QLSCHED_BENCH_KEEP=1  keep the work directory (server and replica logs)
#   QLSCHED_BENCH_DEPLOY_PHASE_MS  start each deploy this many ms after a whole second (local
#                       clock) instead of at random: lands deploys between claims and admissions
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pg.sh
RUNS=${1:-1}
TRIGGERS=300 DEPLOYS=20 QUIET_S=8

say() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
die() { echo "deploy_lag: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }

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
PORT=$(free_port "${QLSCHED_BENCH_PORT:-55541}")
HTTP1=$(free_port 19401); HTTP2=$(free_port $((HTTP1 + 1)))

WORK=$(mktemp -d /tmp/qlsched-deploy-lag.XXXXXX)
chmod 755 "$WORK"
RPIDS=()
cleanup() {
  local p
  for p in "${RPIDS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  pg_stop "$WORK" immediate
  if [ "${QLSCHED_BENCH_KEEP:-0}" = 1 ]; then echo "deploy_lag: work directory kept: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

say "private PostgreSQL on 127.0.0.1:$PORT (fsync on, synchronous_commit on) in $WORK"
pg_start "$WORK" "$PORT" "shared_buffers = 256MB
fsync = on
synchronous_commit = on
log_min_messages = warning"
SU="host=127.0.0.1 port=$PORT user=postgres dbname=postgres"
ADMIN="host=127.0.0.1 port=$PORT user=qlsched_admin dbname=qlsched"
RUNTIME="host=127.0.0.1 port=$PORT user=qlsched_runtime dbname=qlsched"
sql() { "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched -c "$1"; }
"$QL" db bootstrap --superuser-dsn "$SU" >"$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log" >&2; die "bootstrap failed"; }
"$QL" db migrate --dsn "host=127.0.0.1 port=$PORT user=qlsched_owner dbname=qlsched" >>"$WORK/setup.log" 2>&1 \
  || { cat "$WORK/setup.log" >&2; die "migrate failed"; }

say "publishing $TRIGGERS every-second triggers of one task (qlsched trigger publish, 4 at a time)"
"$QL" project set --dsn "$ADMIN" --id bench --status active >/dev/null
"$QL" task publish --dsn "$ADMIN" --project bench --id deploy-task --spec '{"image":"bench/noop:0"}' >/dev/null
seq -f 'd%05g' 1 "$TRIGGERS" | xargs -P4 -I{} "$QL" trigger publish --dsn "$ADMIN" --project bench \
  --task deploy-task --id {} --cron '* * * * * *' >/dev/null

start_replica() { # N HTTP_PORT
  cat >"$WORK/r$1.toml" <<TOML
[replica]
id = "deploy-r$1"
[database]
dsn = "$RUNTIME"
application_name = "qlsched-deploy-r$1"
[http]
bind = "127.0.0.1:$2"
TOML
  "$QL" run --config "$WORK/r$1.toml" >>"$WORK/r$1.log" 2>&1 &
  RPIDS+=($!)
}
say "starting 2 replicas (default config)"
start_replica 1 "$HTTP1"; start_replica 2 "$HTTP2"
deadline=$(( $(date +%s) + 60 ))
for port in "$HTTP1" "$HTTP2"; do
  until curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt $deadline ] || die "replica on :$port not ready after 60 s"
    sleep 0.1
  done
done
sleep 3

# stats W0 W1: "count|p50|p99|max" of queued_at - scheduled_for over the runs scheduled in [W0, W1]
stats() {
  sql "select count(*), coalesce(percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms), 0),
              round(coalesce(percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms), 0)),
              coalesce(max(queued_at_ms - scheduled_for_ms), 0)
         from qlsched.runs where scheduled_for_ms between $1 and $2"
}
# The database clock's whole seconds decide the instants: windows are taken from it.
db_ms() { sql "select (extract(epoch from clock_timestamp()) * 1000)::bigint"; }
redecides() {
  local port total=0 v
  for port in "$HTTP1" "$HTTP2"; do
    v=$(curl -fs "http://127.0.0.1:$port/metrics" | awk '$1 == "qlsched_redecides_total" {print $2}')
    total=$(( total + ${v:-0} ))
  done
  echo "$total"
}

for run in $(seq 1 "$RUNS"); do
  q0=$(db_ms); sleep "$QUIET_S"; q1=$(db_ms)
  d0=$(db_ms); r0=$(redecides)
  for i in $(seq 1 "$DEPLOYS"); do
    "$QL" task publish --dsn "$ADMIN" --project bench --id deploy-task \
      --spec "{\"image\":\"bench/noop:$run.$i\"}" >/dev/null
    if [ -n "${QLSCHED_BENCH_DEPLOY_PHASE_MS:-}" ]; then
      # aligned: the next deploy starts PHASE ms after a whole second (local clock)
      sleep "$(awk -v t="$(now_ms)" -v p="$QLSCHED_BENCH_DEPLOY_PHASE_MS" -v g="$(( 300 + RANDOM % 500 ))" \
        'BEGIN {n = t + g; n = n - n % 1000 + 1000 + p; printf "%.3f", (n - t) / 1000}')"
    else
      sleep "0.$(( 3 + RANDOM % 6 ))"
    fi
  done
  d1=$(db_ms); r1=$(redecides)
  sleep 3   # the last instants of the window are admitted
  IFS='|' read -r qn qp50 qp99 qmax <<<"$(stats "$(( q0 + 1000 ))" "$(( q1 - 1000 ))")"
  IFS='|' read -r dn dp50 dp99 dmax <<<"$(stats "$d0" "$d1")"
  expected=$(( ( d1 / 1000 - (d0 + 999) / 1000 + 1 ) * TRIGGERS ))
  # The instants a deploy committed in (each deploy pins a new execution revision, stamped with
  # the database clock): where a refused admission would show.
  IFS='|' read -r hi hn hp99 hmax <<<"$(sql "select count(distinct scheduled_for_ms), count(*), round(coalesce(percentile_cont(0.99) within group
      (order by queued_at_ms - scheduled_for_ms), 0)), coalesce(max(queued_at_ms - scheduled_for_ms), 0)
    from qlsched.runs where scheduled_for_ms in (select created_at_ms / 1000 * 1000 from qlsched.execution_revisions
                                                  where created_at_ms between $d0 and $d1)")"
  dups=$(sql "select count(*) from (select 1 from qlsched.runs group by trigger_id, scheduled_for_ms having count(*) > 1) d")
  printf 'run %s  quiet %2d s: %5d occurrences, lag p50 %s ms, p99 %s ms, max %s ms\n' \
    "$run" $(( (q1 - q0) / 1000 - 2 )) "$qn" "$qp50" "$qp99" "$qmax"
  printf 'run %s  %d deploys in %.1f s: %5d of %d occurrences, lag p50 %s ms, p99 %s ms, max %s ms; redecides %d; duplicates %s\n' \
    "$run" "$DEPLOYS" "$(awk "BEGIN {print ($d1 - $d0) / 1000}")" "$dn" "$expected" "$dp50" "$dp99" "$dmax" \
    $(( r1 - r0 )) "$dups"
  printf 'run %s  the %d instants the deploys committed in: %5d occurrences, lag p99 %s ms, max %s ms\n' \
    "$run" "$hi" "$hn" "$hp99" "$hmax"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; PostgreSQL $("$BIN/postgres" --version | awk '{print $3}')"
