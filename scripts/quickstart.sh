#!/usr/bin/env bash
# qlsched end to end on a throwaway PostgreSQL: start a private cluster, bootstrap roles and
# database, migrate, publish sample triggers, run three replicas, manage triggers as an
# operator (list, show, disable/enable, fire, backfill), SIGKILL the replica holding the most
# leases and watch its rows taken over after the lease expiry, stop the rest with SIGTERM,
# check the invariants, clean up.
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

say "operator: managing triggers (admin role; the DSN comes from QLSCHED_DSN)"
export QLSCHED_DSN="$ADMIN"
op() { echo "\$ qlsched $(printf '%q ' "$@")"; $QL "$@" | sed 's/^/   /'; }
op trigger list --limit 4
op trigger show every-5s --count 3 --runs 3
op trigger disable every-5s --note "demo: paused during an incident" --actor demo
op trigger list --state disabled
sleep 6
op trigger enable every-5s --actor demo
sql "select 'every-5s runs scheduled while disabled: ' || count(*) from qlsched.runs r join qlsched.triggers t using (trigger_id) where trigger_id = 'every-5s' and r.scheduled_for_ms > t.disabled_at_ms and r.scheduled_for_ms <= t.enabled_at_ms"
op trigger fire nightly-berlin --request-id demo-1
op trigger fire nightly-berlin --request-id demo-1
FROM=$(date -u -d '3 days ago' +%Y-%m-%dT00:00:00Z); TO=$(date -u +%Y-%m-%dT00:00:00Z)
op trigger backfill nightly-berlin --from "$FROM" --to "$TO"
op trigger backfill nightly-berlin --from "$FROM" --to "$TO"
op runs list --trigger nightly-berlin --limit 5

say "SIGKILL the replica that holds the most leases right now"
# Admissions are held for 2 s by a table lock so that leases are held at the moment of the
# kill (without it an every-second lease lives for milliseconds); claims go on meanwhile.
# The victim's database sessions are cut with it, as when its VM dies: an admission it had
# already sent would otherwise still commit inside the lease once the lock is released.
"$BIN_DIR/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched \
  -c "BEGIN; LOCK TABLE qlsched.runs IN EXCLUSIVE MODE; SELECT pg_sleep(2); COMMIT;" >/dev/null &
LOCKER=$!
VICTIM=""
for _ in $(seq 1 40); do
  sleep 0.05
  VICTIM=$(sql "select claim_owner from qlsched.trigger_schedules where claim_owner is not null and claim_expires_at_ms > (extract(epoch from clock_timestamp())*1000)::bigint group by 1 order by count(*) desc, 1 limit 1")
  [ -n "$VICTIM" ] && [ -n "${PIDS[$VICTIM]:-}" ] && break
done
[ -n "$VICTIM" ] || { echo "no replica holds a lease" >&2; exit 1; }
HELD=$(sql "select string_agg(format('(%L,%s)', trigger_id, claim_expires_at_ms), ',') from qlsched.trigger_schedules where claim_owner = '$VICTIM' and claim_expires_at_ms > (extract(epoch from clock_timestamp())*1000)::bigint")
kill -KILL "${PIDS[$VICTIM]}"
sql "select count(pg_terminate_backend(pid)) from pg_stat_activity where application_name = 'qlsched-$VICTIM'" >/dev/null
KILLED_AT=$(sql "select (extract(epoch from clock_timestamp())*1000)::bigint")
echo "killed replica $VICTIM (pid ${PIDS[$VICTIM]}) holding $(sql "select count(*) from (values $HELD) h(t, e)") leases"
unset "PIDS[$VICTIM]"
wait "$LOCKER"
for round in 1 2; do sleep 4; say "status $((round * 4)) s after the kill"; status; done
echo "the killed replica's rows: lease expiry, first run after the kill, and who took it over"
sql "select format('   %-16s expired %s ms after the kill; next run %s ms after the expiry, by %s', h.t,
               h.e - $KILLED_AT, r.queued_at_ms - h.e, r.admitted_by)
       from (values $HELD) h(t, e)
       left join lateral (select queued_at_ms, admitted_by from qlsched.runs
                           where trigger_id = h.t and queued_at_ms > $KILLED_AT
                           order by queued_at_ms limit 1) r on true
      order by h.t"

say "SIGTERM the other replicas (graceful: drain, hand leases back)"
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
