#!/usr/bin/env bash
# qlsched end to end on a throwaway PostgreSQL: start a private cluster, bootstrap roles and
# database, migrate, publish a task whose spec a worker runs (a shell command) and sample
# triggers from a definition file with `qlsched apply`, backfill, run three replicas and `qlsched worker` that executes their runs, show a
# failed run's output, manage triggers as an operator (list, show, disable/enable, fire), SIGKILL the replica holding the most leases and watch its
# rows taken over after the lease expiry, stop admissions and watch a short retention (1m)
# prune every finished run, stop the rest with SIGTERM, check the invariants, clean up.
# Each replica serves its read-only web console on its loopback HTTP port (printed below).
#
#   scripts/quickstart.sh [--keep [SECONDS]]
#
# --keep: before stopping, keep the surviving replicas running SECONDS (default 600) so their
#         consoles can be opened in a browser; Ctrl-C ends the wait (and cleans up).
set -euo pipefail
KEEP=0
while [ $# -gt 0 ]; do
  case $1 in
    --keep)
      KEEP=600
      if [ $# -gt 1 ] && [[ $2 =~ ^[0-9]+$ ]]; then KEEP=$2; shift; fi
      shift ;;
    *) echo "usage: scripts/quickstart.sh [--keep [SECONDS]]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
. scripts/pg.sh
pg_ensure_installed
BIN_DIR=$(pg_find_bindir)
PORT=${QLSCHED_QUICKSTART_PORT:-55439}
WORK=$(mktemp -d /tmp/qlsched-quickstart.XXXXXX)
chmod 755 "$WORK"
declare -A PIDS=()
WORKER_PID=""

cleanup() {
  for r in "${!PIDS[@]}"; do kill -KILL "${PIDS[$r]}" 2>/dev/null || true; done
  [ -z "$WORKER_PID" ] || kill -KILL "$WORKER_PID" 2>/dev/null || true
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
DISPATCH="host=127.0.0.1 port=$PORT user=qlsched_dispatcher dbname=qlsched"
sql() { "$BIN_DIR/psql" -X -q -At -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched -c "$1"; }

say "bootstrap, migrate, readiness gate"
$QL db bootstrap --superuser-dsn "$SU"
$QL db migrate --dsn "$OWNER"
$QL db check --dsn "$RUNTIME"

# The quickstart's own audit, not part of qlsched: the database records every run row ever
# inserted or deleted (row triggers, as the superuser), so that the exactly-once check at the
# end still sees the runs retention has pruned by then (testkit/sql/invariants.sql reads the
# pruned ones as its removed_runs).
sql "CREATE TABLE public.quickstart_audit (op text, trigger_id text, scheduled_for_ms bigint, run_id uuid, status text, admitted_by text, request_id text);
     CREATE FUNCTION public.quickstart_audit() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
       SET search_path = pg_catalog AS \$\$ BEGIN
         IF TG_OP = 'INSERT' THEN
           INSERT INTO public.quickstart_audit VALUES ('admitted', NEW.trigger_id, NEW.scheduled_for_ms, NEW.run_id, NEW.status, NEW.admitted_by, NEW.request_id);
         ELSE
           INSERT INTO public.quickstart_audit VALUES ('pruned', OLD.trigger_id, OLD.scheduled_for_ms, OLD.run_id, OLD.status, OLD.admitted_by, OLD.request_id);
         END IF;
         RETURN NULL; END \$\$;
     REVOKE ALL ON FUNCTION public.quickstart_audit() FROM PUBLIC;
     CREATE TRIGGER quickstart_audit AFTER INSERT OR DELETE ON qlsched.runs
       FOR EACH ROW EXECUTE FUNCTION public.quickstart_audit();"

say "publishing the sample project, task and triggers as code: a definition file, qlsched apply (docs/apply.md)"
# The spec `qlsched worker` runs (docs/worker.md): a shell command in a cleared environment
# with the run's QLSCHED_* variables; an occurrence whose second ends in 7 fails (exit 1).
cat >"$WORK/demo.toml" <<'TOML'
source = "quickstart"

[[project]]
id = "demo"

[[task]]
id = "report"
project = "demo"
spec = { executor = "shell", timeout = "30s", command = ["sh", "-c", 'echo "report for $QLSCHED_SCHEDULED_FOR (attempt $QLSCHED_ATTEMPT)"; if [ $((QLSCHED_SCHEDULED_FOR_MS / 1000 % 10)) = 7 ]; then echo "no data for second 7" >&2; exit 1; fi'] }

[[trigger]]
id = "every-5s"
project = "demo"
task = "report"
cron = "*/5 * * * * *"
misfire = "fire_once"

[[trigger]]
id = "nightly-berlin"
project = "demo"
task = "report"
cron = "30 2 * * *"
tz = "Europe/Berlin"
TOML
for i in $(seq -w 1 20); do
  printf '\n[[trigger]]\nid = "every-second-%s"\nproject = "demo"\ntask = "report"\ncron = "* * * * * *"\n' "$i" >>"$WORK/demo.toml"
done
echo "\$ qlsched apply -f demo.toml        # 1 project, 1 task, 22 triggers (20 of them every second)"
$QL apply --dsn "$ADMIN" -f "$WORK/demo.toml" --actor demo | grep -v '^create trigger every-second-' | sed 's/^/   /'
echo "\$ qlsched apply -f demo.toml --check   # the same file again: nothing to do, exit 0"
$QL apply --dsn "$ADMIN" -f "$WORK/demo.toml" --check | tail -1 | sed 's/^/   /'
echo "\$ qlsched audit --trigger every-5s      # the apply's audit entry"
$QL audit --dsn "$ADMIN" --trigger every-5s --limit 1 | sed 's/^/   /'
$QL trigger explain --cron '30 2 * * *' --tz Europe/Berlin --after 2026-03-27T00:00:00Z --count 3
if $QL trigger publish --dsn "$ADMIN" --project demo --task report --id broken --cron '61 * * * *' 2>"$WORK/err"; then
  echo "a bad expression was accepted" >&2; exit 1
fi
echo "refused as expected: $(cat "$WORK/err")"

say "backfill three past days, before the replicas start (once they record retention 1m, a window that old is refused: see below)"
export QLSCHED_DSN="$ADMIN"
op() { echo "\$ qlsched $(printf '%q ' "$@")"; $QL "$@" | sed 's/^/   /'; }
FROM=$(date -u -d '3 days ago' +%Y-%m-%dT00:00:00Z); TO=$(date -u +%Y-%m-%dT00:00:00Z)
op trigger backfill nightly-berlin --from "$FROM" --to "$TO"
op trigger backfill nightly-berlin --from "$FROM" --to "$TO"

say "starting replicas a, b, c (lease 6s, retention 1m tried every 2s, for the demo) and a worker"
# The worker, logged in as the dispatcher role: takes the queued runs of pool "default" and
# runs the task's command for each, at most 16 at a time (docs/worker.md). It starts before
# the replicas' QLSCHED__* overrides below are exported: those are a replica's keys.
cat >"$WORK/worker.toml" <<TOML
[worker]
id = "worker-1"
pools = ["default"]
concurrency = 16
poll = "200ms"
drain_timeout = "10s"
kill_grace = "2s"

[database]
dsn = "$DISPATCH"

[http]
bind = "127.0.0.1:9194"
TOML
$QL check-config --config "$WORK/worker.toml"
$QL worker --config "$WORK/worker.toml" >"$WORK/worker.log" 2>&1 &
WORKER_PID=$!
export QLSCHED__DATABASE__DSN="$RUNTIME" QLSCHED__SCHEDULER__LEASE=6s QLSCHED__SCHEDULER__CADENCE=1s QLSCHED__LOG__LEVEL=info
export QLSCHED__RETENTION__FINISHED_AFTER=1m QLSCHED__RETENTION__INTERVAL=2s
for r in a b c; do
  $QL run --config "config/replica-$r.toml" >"$WORK/replica-$r.log" 2>&1 &
  PIDS[$r]=$!
done
for _ in $(seq 1 100); do
  [ "$(sql "select count(*) from qlsched.replicas where stopped_at_ms is null")" = 3 ] && break
  sleep 0.2
done

console_port() { grep -oP '^bind = "127\.0\.0\.1:\K[0-9]+' "config/replica-$1.toml"; }
console_urls() {
  for r in "$@"; do
    echo "   console of replica $r: http://127.0.0.1:$(console_port "$r")/  (JSON: http://127.0.0.1:$(console_port "$r")/api/v1/overview)"
  done
}
echo "each replica serves its read-only web console on loopback (docs/console.md):"
console_urls a b c
echo "   the worker's metrics: http://127.0.0.1:9194/metrics"

status() { $QL status --dsn "$RUNTIME" | sed 's/^/   /'; }
for round in 1 2 3; do sleep 4; say "status after $((round * 4)) s"; status; done

say "the worker's runs: one that failed on purpose, with its output"
FAILED=""
for _ in $(seq 1 50); do
  FAILED=$(sql "select run_id from qlsched.runs where status = 'failed' order by queued_at_ms limit 1")
  [ -n "$FAILED" ] && break
  sleep 0.2
done
[ -n "$FAILED" ] || { echo "no run failed (every occurrence whose second ends in 7 should); the worker's log:" >&2; tail -20 "$WORK/worker.log" >&2; exit 1; }
op runs show "$FAILED"
sql "select '   runs executed so far: ' || string_agg(status || ' ' || n, ', ') from (select status, count(*) n from qlsched.runs where status in ('succeeded', 'failed') group by 1 order by 1) x"

say "operator: managing triggers (admin role; the DSN comes from QLSCHED_DSN)"
op trigger list --limit 4
op trigger show every-5s --count 3 --runs 3
op trigger disable every-5s --note "demo: paused during an incident" --actor demo
op trigger list --state disabled
sleep 6
op trigger enable every-5s --actor demo
sql "select 'every-5s runs scheduled while disabled: ' || count(*) from qlsched.runs r join qlsched.triggers t using (trigger_id) where trigger_id = 'every-5s' and r.scheduled_for_ms > t.disabled_at_ms and r.scheduled_for_ms <= t.enabled_at_ms"
op trigger fire nightly-berlin --request-id demo-1
op trigger fire nightly-berlin --request-id demo-1
op runs list --trigger nightly-berlin --limit 5
say "the audit log: who disabled, enabled and fired, when, and what changed (docs/audit.md)"
op audit --limit 4

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

say "retention: admissions stop, the worker finishes the rest, a prune removes them after 1m"
for t in $(sql "select trigger_id from qlsched.triggers where deleted_at_ms is null order by 1"); do
  $QL trigger disable "$t" --note "demo: watch retention" --actor demo >/dev/null
done
echo "every trigger disabled: nothing more is admitted"
unfinished="select count(*) from qlsched.runs where status in ('queued', 'dispatching', 'running')"
for _ in $(seq 1 150); do [ "$(sql "$unfinished")" = 0 ] && break; sleep 0.2; done
[ "$(sql "$unfinished")" = 0 ] || { echo "the worker left runs unfinished" >&2; exit 1; }
finished() { sql "select coalesce(sum(n), 0) || ' (' || coalesce(string_agg(status || ' ' || n, ', '), 'none') || '), with ' || (select count(*) from qlsched.attempts) || ' attempts and ' || (select count(*) from qlsched.run_events) || ' events' from (select status, count(*) n from qlsched.runs group by 1 order by 1) x"; }
BEFORE=$(finished)
echo "finished runs: $BEFORE; the newest was admitted $(sql "select round((extract(epoch from clock_timestamp())*1000 - max(queued_at_ms)) / 1000.0) from qlsched.runs") s ago"
for _ in $(seq 1 120); do [ "$(sql "select count(*) from qlsched.runs")" = 0 ] && break; sleep 1; done
[ "$(sql "select count(*) from qlsched.runs")" = 0 ] || { echo "retention left finished runs: $(finished)" >&2; exit 1; }
echo "finished runs: $BEFORE → $(finished), pruned through $(sql "select to_char(to_timestamp(pruned_through_ms / 1000.0) at time zone 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') from qlsched.maintenance")"
status
metric() ( # the pruned counter a surviving replica exports (bash's /dev/tcp: no curl needed)
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
  grep '^qlsched_runs_pruned_total' <&3 | sed "s/^/   replica $2: /"
)
for r in "${!PIDS[@]}"; do metric "$(grep -oP '^bind = "127\.0\.0\.1:\K[0-9]+' "config/replica-$r.toml")" "$r" || true; done
echo "the pruned window cannot be admitted again:"
if $QL trigger backfill nightly-berlin --from "$FROM" --to "$TO" 2>"$WORK/err"; then
  echo "a backfill over the pruned window was accepted" >&2; exit 1
fi
echo "   refused as expected: $(cat "$WORK/err")"

if [ "$KEEP" -gt 0 ]; then
  say "keeping the cluster for $KEEP s so the consoles can be opened (Ctrl-C ends it)"
  console_urls "${!PIDS[@]}"
  sleep "$KEEP"
fi

say "SIGTERM the worker and the other replicas (graceful: drain, hand leases back)"
kill -TERM "$WORKER_PID"; wait "$WORKER_PID" && echo "worker exited 0"; WORKER_PID=""
for r in "${!PIDS[@]}"; do kill -TERM "${PIDS[$r]}"; done
for r in "${!PIDS[@]}"; do wait "${PIDS[$r]}" && echo "replica $r exited 0"; done
PIDS=()
grep -h '"leases handed over"' "$WORK"/replica-*.log | sed 's/^/   /' || true

say "invariants (over every run ever admitted, the pruned ones included: the audit)"
RUNS=$(sql "select count(*) from public.quickstart_audit where op = 'admitted'")
PRUNED=$(sql "select count(*) from public.quickstart_audit where op = 'pruned'")
LEFT=$(sql "select count(*) from qlsched.runs")
GONE=$(sql "select count(*) from public.quickstart_audit a where op = 'admitted' and not exists (select 1 from qlsched.runs r where r.run_id = a.run_id) and not exists (select 1 from public.quickstart_audit p where p.op = 'pruned' and p.run_id = a.run_id)")
# The exactly-once invariants the tests and the benchmark check too, over the runs left and
# the pruned ones (an occurrence admitted again after its first run was pruned counts twice).
VIOLATED=$("$BIN_DIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched \
  -c "CREATE TEMPORARY VIEW removed_runs AS SELECT run_id, trigger_id, scheduled_for_ms, request_id, status FROM public.quickstart_audit WHERE op = 'pruned'" \
  -f testkit/sql/invariants.sql)
LIVE=$(sql "select count(*) from qlsched.trigger_schedules where claim_owner is not null and claim_expires_at_ms > (extract(epoch from clock_timestamp())*1000)::bigint")
BY=$(sql "select string_agg(admitted_by || '=' || n, ' ') from (select admitted_by, count(*) n from public.quickstart_audit where op = 'admitted' group by 1 order by 1) x")
echo "runs admitted: $RUNS ($BY), pruned: $PRUNED, left: $LEFT"
echo "invariants violated (invariant|count|sample): ${VIOLATED:-none}; runs gone without a prune=$GONE, live claims left=$LIVE"
if [ "$RUNS" -gt 0 ] && [ "$PRUNED" -gt 0 ] && [ "$((PRUNED + LEFT))" = "$RUNS" ] && [ -z "$VIOLATED" ] \
   && [ "$GONE" = 0 ] && [ "$LIVE" = 0 ]; then
  echo "OK: every occurrence admitted exactly once"
else
  echo "FAILED" >&2; exit 1
fi
