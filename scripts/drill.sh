#!/usr/bin/env bash
# Runs the long form of one drill (or all of them) against a throwaway PostgreSQL and prints
# its table: occurrences expected, admitted, duplicates, lost, max lag, takeovers.
#
#   scripts/drill.sh NAME [--cycles N] [--duration S] [--seed X]
#
# NAME: kill_restart | backend_termination | pg_restart | standby_promotion |
#       commit_reply_lost | partition | actor_crash | clock_skew | same_replica_id |
#       netns (kernel partition + flapping link; needs root) | slow_link | republish |
#       failover_dsn (a promotion followed through a two-host DSN) |
#       rolling_upgrade (db migrate behind a reader, replicas moved one at a time onto a
#       second binary with one more migration, and back) |
#       worker_kill | worker_stop | worker_pg_restart | worker_netns (needs root)
#       (`qlsched worker` SIGKILLed, SIGSTOPped past its lease, PostgreSQL restarted under
#       50 running runs, a worker cut off in a network namespace) |
#       overlap (3 replicas and 2 workers, every-second triggers under --overlap forbid, a
#       third running longer than their period) | all
# --cycles N    kills / stops / terminations / restarts / promotions / faults / cuts / flaps /
#               drain rows (slow_link) / rolling passes (rolling_upgrade)
# --duration S  seconds of steady load (actor_crash, slow_link, overlap); seconds the reader holds
#               runs during db migrate (rolling_upgrade)
# --seed X      replays the random schedule a table printed
# Without --cycles/--duration the drill's own long-form figures apply (docs/drills.md).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pg.sh

DRILLS="kill_restart backend_termination pg_restart standby_promotion commit_reply_lost partition actor_crash clock_skew same_replica_id netns slow_link failover_dsn rolling_upgrade republish worker_kill worker_stop worker_pg_restart worker_netns overlap"
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
name=$1; shift
case " $DRILLS all " in *" $name "*) ;; *) echo "unknown drill: $name" >&2; usage ;; esac
export QLSCHED_DRILL_LONG=1
while [ $# -gt 0 ]; do
  case $1 in
    --cycles) export QLSCHED_DRILL_CYCLES=${2:?--cycles needs a number}; shift 2 ;;
    --duration) export QLSCHED_DRILL_DURATION=${2:?--duration needs seconds}; shift 2 ;;
    --seed) export QLSCHED_DRILL_SEED=${2:?--seed needs a number}; shift 2 ;;
    *) usage ;;
  esac
done

pg_ensure_installed
export QLSCHED_PG_BINDIR="$(pg_find_bindir)"
filter="drills::$name::"
skip=()
case $name in
  standby_promotion) filter="drills::standby_promotion::a_claim_held" ;;
  failover_dsn) filter="drills::standby_promotion::replicas_whose_dsn" ;;
  worker_kill) filter="drills::worker::a_worker_sigkilled" ;;
  worker_stop) filter="drills::worker::a_worker_sigstopped" ;;
  worker_pg_restart) filter="drills::worker::postgres_restarted" ;;
  worker_netns) filter="drills::worker::a_worker_cut_off" ;;
esac
if [ "$name" = all ]; then filter="drills::"; skip=(--skip drills::findings::); fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --features fault-injection --test it "$filter" -- --nocapture --test-threads 1 "${skip[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
echo
echo "================ drill tables ================"
sed -n '/==== drill /,/^==== end/p' "$log" | sed 's/^.*==== drill /==== drill /' | grep -v '^==== end' || true
exit "$status"
