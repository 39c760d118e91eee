#!/usr/bin/env bash
# qlsched end to end on a throwaway PostgreSQL: start a private cluster, bootstrap roles and
# database, migrate, publish sample triggers, run three replicas, SIGKILL one half-way and
# watch the others take over, stop the rest with SIGTERM, check the invariants, clean up.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pg.sh
pg_ensure_installed
BIN_DIR=$(pg_find_bindir)
PORT=${QLSCHED_QUICKSTART_PORT:-55439}
WORK=$(mktemp -d /tmp/qlsched-quickstart.XXXXXX)
chmod 755 "$WORK"
declare -A PIDS=()

cleanup() {
  for r in "${!PIDS[@]}"; do kill -KILL "${PIDS[$r]}" 2>/dev/null || true; done
  pg_stop "$WORK" immediate
  rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building qlsched"
cargo build --quiet --bin qlsched
QL=target/debug/qlsched

say "starting a private PostgreSQL on 127.0.0.1:$PORT ($WORK)"
pg_start "$WORK" "$PORT"
SU="host=127.0.0.1 port=$PORT user=postgres dbname=postgres"
OWNER="host=127.0.0.1 port=$PORT user=qlsched_owner dbname=qlsched"
ADMIN="host=127.0.0.1 port=$PORT user=qlsched_admin dbname=qlsched"
RUNTIME="host=127.0.0.1 port=$PORT user=qlsched_runtime dbname=qlsched"
sql() { "$BIN_DIR/psql" -X -q -At -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched -c "$1"; }

say "bootstrap, migrate, readiness gate"
$QL db bootstrap --superuser-dsn "$SU"
$QL db migrate --dsn "$OWNER"
$QL db check --dsn "$RUNTIME"

say "publishing sample triggers"
$QL project set --dsn "$ADMIN" --id demo
$QL task publish --dsn "$ADMIN" --project demo --id report --spec '{"image":"demo/report:1","args":["--daily"]}'
for i in $(seq -w 1 20); do
  $QL trigger publish --dsn "$ADMIN" --project demo --task report --id "every-second-$i" --cron '* * * * * *' >/dev/null
done
echo "20 triggers firing every second"
$QL trigger publish --dsn "$ADMIN" --project demo --task report --id every-5s --cron '*/5 * * * * *' --misfire fire_once
$QL trigger publish --dsn "$ADMIN" --project demo --task report --id nightly-berlin --cron '30 2 * * *' --tz Europe/Berlin
$QL trigger explain --cron '30 2 * * *' --tz Europe/Berlin --after 2026-03-27T00:00:00Z --count 3
if $QL trigger publish --dsn "$ADMIN" --project demo --task report --id broken --cron '61 * * * *' 2>"$WORK/err"; then
  echo "a bad expression was accepted" >&2; exit 1
fi
echo "refused as expected: $(cat "$WORK/err")"

say "starting replicas a, b, c (lease 6s for the demo)"
export QLSCHED__DATABASE__DSN="$RUNTIME" QLSCHED__SCHEDULER__LEASE=6s QLSCHED__SCHEDULER__CADENCE=1s QLSCHED__LOG__LEVEL=info
for r in a b c; do
  $QL run --config "config/replica-$r.toml" >"$WORK/replica-$r.log" 2>&1 &
  PIDS[$r]=$!
done
for _ in $(seq 1 100); do
  [ "$(sql "select count(*) from qlsched.replicas where stopped_at_ms is null")" = 3 ] && break
  sleep 0.2
done

status() { $QL status --dsn "$RUNTIME" | sed 's/^/   /'; }
for round in 1 2 3; do sleep 4; say "status after $((round * 4)) s"; status; done

say "SIGKILL replica b (pid ${PIDS[b]}) while it holds leases"
sql "select 'b holds ' || count(*) || ' leases' from qlsched.trigger_schedules where claim_owner = 'b'"
kill -KILL "${PIDS[b]}"; unset 'PIDS[b]'
KILLED_AT=$(sql "select (extract(epoch from clock_timestamp())*1000)::bigint")
for round in 1 2 3; do sleep 4; say "status $((round * 4)) s after the kill"; status; done
sql "select 'first run admitted after the kill: ' || coalesce(min(queued_at_ms) - $KILLED_AT, -1) || ' ms later, by ' || string_agg(distinct admitted_by, ',') from qlsched.runs where queued_at_ms > $KILLED_AT"

say "SIGTERM replicas a and c (graceful: drain, hand leases back)"
for r in "${!PIDS[@]}"; do kill -TERM "${PIDS[$r]}"; done
for r in "${!PIDS[@]}"; do wait "${PIDS[$r]}" && echo "replica $r exited 0"; done
PIDS=()
grep -h '"leases handed over"' "$WORK"/replica-*.log | sed 's/^/   /' || true

say "invariants"
RUNS=$(sql "select count(*) from qlsched.runs")
DUPS=$(sql "select count(*) from (select trigger_id, scheduled_for_ms from qlsched.runs group by 1,2 having count(*) > 1) d")
BAD=$(sql "select count(*) from qlsched.runs r where (select count(*) from qlsched.attempts a where a.run_id = r.run_id) <> 1 or (select count(*) from qlsched.run_events e where e.run_id = r.run_id) <> 2")
LIVE=$(sql "select count(*) from qlsched.trigger_schedules where claim_owner is not null and claim_expires_at_ms > (extract(epoch from clock_timestamp())*1000)::bigint")
BY=$(sql "select string_agg(admitted_by || '=' || n, ' ') from (select admitted_by, count(*) n from qlsched.runs group by 1 order by 1) x")
echo "runs admitted: $RUNS ($BY)"
echo "invariant: duplicate occurrences=$DUPS, runs without exactly 1 attempt + 2 events=$BAD, live claims left=$LIVE"
if [ "$RUNS" -gt 0 ] && [ "$DUPS" = 0 ] && [ "$BAD" = 0 ] && [ "$LIVE" = 0 ]; then
  echo "OK: every occurrence admitted exactly once"
else
  echo "FAILED" >&2; exit 1
fi
