# Sourced by scripts/bench.sh for --herd100k / --herd100k-smoke (issue 24, item 3). Uses
# bench.sh's server, helpers and replicas; runs only its own rows and exits.
#
# HERD_N every-minute triggers (`0 * * * * *`, ids h…) published through bench/publish_cli.sh
# (the statements of `qlsched trigger publish`, one transaction per trigger on a new connection;
# the first triggers are published in trials at several parallelisms and the rest at the
# fastest), then SECOND_N every-second triggers (ids s…) the same way. 3 replicas with the
# default configuration. Once the catch-up of the boundaries that passed while publishing is
# over, from the first minute boundary at least 10 s later, for each of HERD_B consecutive
# boundaries B:
#   herd time    max(queued_at) - B over the HERD_N runs scheduled for B, once all are there;
#                a psql `\watch` session counts them (every QLSCHED_BENCH_HERD_POLL_S s,
#                default 1: each count of 100,000 runs costs tens of ms of server CPU, which
#                at 10 Hz was a third of a core taken from the herd) and the first poll that
#                saw all of them is reported too
#   lag          p50/p99/max of queued_at - scheduled_for of the every-second runs scheduled in
#                [B, B + herd time] and in [B, B + 60 s), with admitted vs due in each window
#   memory       VmRSS/VmHWM of each replica once the herd is in
# then duplicates over all runs (0) and lost (admitted = due) for every herd boundary.
. bench/scale_lib.sh
if [ "$MODE" = herd100k ]; then
  HERD_N=100000; SECOND_N=200; HERD_B=3; TRIAL_N=2000
else
  HERD_N=500; SECOND_N=20; HERD_B=1; TRIAL_N=50
fi
HERD_N=${QLSCHED_BENCH_HERD_N:-$HERD_N}
POLL_S=${QLSCHED_BENCH_HERD_POLL_S:-1}
TRIAL_PS=${QLSCHED_BENCH_PUBLISH_PS:-"1 2 4 8"}
# the trials publish at most half of the triggers
[ $(( TRIAL_N * $(wc -w <<<"$TRIAL_PS") * 2 )) -le "$HERD_N" ] || TRIAL_N=$(( HERD_N / ($(wc -w <<<"$TRIAL_PS") * 2) ))
[ "$TRIAL_N" -gt 0 ] || die "QLSCHED_BENCH_HERD_N=$HERD_N is too small for trials at $TRIAL_PS"

say "H. herd: $HERD_N every-minute + $SECOND_N every-second triggers, 3 replicas (default config), $HERD_B boundaries"
reset_db
sql "SET client_min_messages = warning; DROP SEQUENCE IF EXISTS public.bench_publish_seq" >/dev/null
t_pub=$(now_ms)
publish_trials minute "$TRIAL_N" "$TRIAL_PS"
rest=$(( HERD_N - PUB_DONE ))
say "   publishing the other $rest every-minute triggers, $PUB_BEST at a time"
t_rest=$(now_ms)
publish_minute "$rest" "$PUB_BEST"
rest_ms=$(( $(now_ms) - t_rest ))
rest_rate=$(calc "$rest / ($rest_ms > 0 ? $rest_ms : 1) * 1000")
publish_second "$SECOND_N" "$PUB_BEST"
pub_s=$(calc "($(now_ms) - $t_pub) / 1000")
say "   published in $(fmt "$pub_s") s (the bulk at $(fmt "$rest_rate") triggers/s)"
nh=$(sql "select count(*) from qlsched.trigger_schedules where trigger_id like 'h%'")
ns=$(sql "select count(*) from qlsched.trigger_schedules where trigger_id like 's%'")
[ "$nh" = "$HERD_N" ] && [ "$ns" = "$SECOND_N" ] || die "published $nh every-minute and $ns every-second triggers, expected $HERD_N and $SECOND_N"
row "H" "publishing through \`trigger publish\`'s transactions (bench/publish_cli.sh, a new connection each)" \
    "$HERD_N every-minute + $SECOND_N every-second triggers in $(fmt "$pub_s") s; trials of $TRIAL_N: $PUB_TRIALS; the other $rest at P=$PUB_BEST: $(fmt "$rest_rate") triggers/s" "—" "—"
checkpoint
start_replicas 3 64 30s
wait_ready
t_ready=$(now_ms)
# The boundaries that passed while publishing are caught up (or skipped past the grace) at
# start; wait until every every-minute cursor is in the future, then take the first boundary at
# least 10 s later.
catch_deadline=$(( t_ready + 180000 ))
while :; do
  behind=$(sql "select count(*) from qlsched.trigger_schedules
                 where trigger_id like 'h%' and next_fire_at_ms <= (extract(epoch from clock_timestamp()) * 1000)::bigint")
  [ "$behind" = 0 ] && break
  [ "$(now_ms)" -lt $catch_deadline ] || { note "catch-up: $behind every-minute cursors still due 180 s after the replicas were ready"; break; }
  sleep 0.5
done
catch_s=$(calc "($(now_ms) - $t_ready) / 1000")
first_boundary=$(( ($(now_ms) + 10000) / 60000 * 60000 + 60000 ))
say "   replicas ready; catch-up over $(fmt "$catch_s" 1) s later; first boundary in $(( (first_boundary - $(now_ms)) / 1000 )) s"

herd_max=0; lag_herd_max=0; lag_min_max=0; lost_total=0; sec_missing=0
BS=(); TQ=(); NS=(); SEEN=(); MEM=()
for b in $(seq 1 "$HERD_B"); do
  B=$(( first_boundary + (b - 1) * 60000 ))
  # sleep until 1 s before the boundary, then poll every POLL_S s in one psql session
  sl=$(( B - 1000 - $(now_ms) )); [ $sl -gt 0 ] && sleep "$(calc "$sl / 1000")"
  poll=$WORK/herd_poll_$b.txt
  # one backend, the queued_at index (the poll's cost follows the herd, not the table's history)
  printf '%s\n' "SET max_parallel_workers_per_gather = 0; SET enable_seqscan = off;" "\\timing on" \
    "select (extract(epoch from clock_timestamp()) * 1000)::bigint, count(*) from qlsched.runs where queued_at_ms >= $((B - 5000)) and scheduled_for_ms = $B and trigger_id like 'h%' \\watch $POLL_S" \
    | "${PSQL[@]}" -d qlsched >"$poll" 2>&1 &
  watcher=$!
  seen=""; deadline=$(( B + 58000 ))
  while :; do
    sleep "$POLL_S"
    last=$(grep -E '^[0-9]+\|[0-9]+$' "$poll" | tail -1 || true)
    if [ -n "$last" ] && [ "${last#*|}" -ge "$HERD_N" ]; then seen=${last%|*}; break; fi
    [ "$(now_ms)" -lt $deadline ] || break
    kill -0 $watcher 2>/dev/null || { cat "$poll" >&2; die "the polling psql exited"; }
  done
  kill $watcher 2>/dev/null || true; wait $watcher 2>/dev/null || true
  mem=$(replica_mem)
  read -r n tq < <(sql "select count(*), coalesce(max(queued_at_ms), 0) - $B from qlsched.runs where scheduled_for_ms = $B and trigger_id like 'h%'" | tr '|' ' ')
  polls=$(grep -cE '^[0-9]+\|[0-9]+$' "$poll" || true)
  poll_ms=$(awk '/^Time:/ {s += $2; k++} END {printf "%.1f", k ? s / k : 0}' "$poll")
  poll_span=$(grep -E '^[0-9]+\|[0-9]+$' "$poll" | awk -F'|' 'NR == 1 {a = $1} {z = $1} END {print z - a}')
  hz=$(calc "($polls > 1 ? ($polls - 1) / ($poll_span > 0 ? $poll_span : 1) * 1000 : 0)")
  # the count at t = B + 1 s, 2 s, ... (last poll at or before each second)
  curve=$(grep -E '^[0-9]+\|[0-9]+$' "$poll" | awk -F'|' -v B="$B" '{s = int(($1 - B) / 1000); if ($1 >= B) c[s] = $2; if (s > m) m = s} END {for (i = 0; i <= m && i < 60; i++) if (i in c) printf "%s%d s: %d", (k++ ? ", " : ""), i + 1, c[i]}')
  lost=$(( HERD_N - n )); [ $lost -lt 0 ] && lost=0; lost_total=$(( lost_total + lost ))
  [ "$tq" -gt "$herd_max" ] && herd_max=$tq
  seen_txt="not seen complete by $(( (deadline - B) / 1000 )) s"; [ -n "$seen" ] && seen_txt="first poll seeing all: $(( seen - B )) ms"
  say "   boundary $b: $n/$HERD_N runs, last queued $tq ms after the boundary ($seen_txt); replicas RSS/HWM MiB: $mem"
  BS+=("$B"); TQ+=("$tq"); NS+=("$n"); SEEN+=("$seen_txt ($polls polls at $(fmt "$hz" 1) Hz, $poll_ms ms each)"); MEM+=("$mem")
  note "boundary $b ($(date -u -d @$((B / 1000)) +%H:%M:%S) UTC): herd runs counted per second after the boundary (last poll in each second): $curve"
done
# The every-second lag during each herd and over each whole minute, queried once the last
# minute is over (no query runs on the server during a herd but the poll).
sl=$(( first_boundary + HERD_B * 60000 + 2000 - $(now_ms) )); [ $sl -gt 0 ] && sleep "$(calc "$sl / 1000")"
lagq() { # from to: admitted|due|p50|p99|max over the every-second runs scheduled in [from, to]
  local d; d=$(( ( ($2 / 1000) - (($1 + 999) / 1000) + 1 ) * SECOND_N ))
  sql "select count(*), $d, coalesce(percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms), 0),
              coalesce(percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms), 0),
              coalesce(max(queued_at_ms - scheduled_for_ms), 0)
         from qlsched.runs where trigger_id like 's%' and scheduled_for_ms between $1 and $2"
}
for i in "${!BS[@]}"; do
  b=$((i + 1)); B=${BS[$i]}; tq=${TQ[$i]}; n=${NS[$i]}
  he=$(( B + (tq > 0 ? tq : 0) )); me=$(( B + 59000 ))
  IFS='|' read -r ha hd hp50 hp99 hmax <<<"$(lagq "$B" "$he")"
  IFS='|' read -r ma md mp50 mp99 mmax <<<"$(lagq "$B" "$me")"
  awk "BEGIN {exit !($hp99 > $lag_herd_max)}" && lag_herd_max=$hp99
  awk "BEGIN {exit !($mp99 > $lag_min_max)}" && lag_min_max=$mp99
  sec_missing=$(( sec_missing + (hd > ha ? hd - ha : 0) + (md > ma ? md - ma : 0) ))
  row "H" "boundary $b: $HERD_N every-minute occurrences admitted (from the boundary to the last commit's queued_at)" \
      "$(fmt "$(calc "$tq / 1000")" 2) s; $n/$HERD_N admitted; ${SEEN[$i]}" \
      "≤ 10 s, all admitted" "$(verdict "$tq <= 10000 && $n >= $HERD_N")"
  row "H" "boundary $b: lag of the $SECOND_N every-second triggers during the herd (scheduled in [B, B + $(fmt "$(calc "$tq / 1000")" 1) s])" \
      "p50 $(fmt "$hp50") ms, p99 $(fmt "$hp99") ms, max $(fmt "$hmax") ms; admitted $ha / $hd due" \
      "p99 ≤ 250 ms, all admitted" "$(verdict "$hp99 <= 250 && $ha >= $hd")"
  row "H" "boundary $b: every-second lag over the whole minute [B, B + 59 s]" \
      "p50 $(fmt "$mp50") ms, p99 $(fmt "$mp99") ms, max $(fmt "$mmax") ms; admitted $ma / $md due" "—" "—"
  row "H" "boundary $b: replica memory once the herd is in (VmRSS/VmHWM MiB per replica)" "${MEM[$i]}" "—" "—"
done
stop_replicas
dups=$(dup_count)
row "H" "herd $HERD_N × $HERD_B boundaries: duplicates over all runs; lost = due − admitted" \
    "duplicates $dups; lost $lost_total of $(( HERD_N * HERD_B )) herd occurrences; every-second missing in the windows $sec_missing; slowest boundary $(fmt "$(calc "$herd_max / 1000")" 2) s; worst every-second p99 during a herd $(fmt "$lag_herd_max") ms (whole minute $(fmt "$lag_min_max") ms)" \
    "0 duplicates, 0 lost; each boundary ≤ 10 s; every-second p99 during the herd ≤ 250 ms" \
    "$(verdict "$dups == 0 && $lost_total == 0 && $herd_max <= 10000 && $lag_herd_max <= 250")"
note "setup: publishing took $(fmt "$pub_s") s; after the replicas were ready the catch-up of boundaries passed while publishing took $(fmt "$catch_s" 1) s; the first measured boundary was $(( (first_boundary - t_ready) / 1000 )) s after ready. Replicas: 3, default configuration (claim_budget 64, lease 30 s). Polls: one psql session, \`\\watch $POLL_S\`, counting runs scheduled for the boundary through the queued_at index (no parallel workers, no seq scan: about 20 ms per poll with 100k rows in the range, measured on a scratch table)."
scale_finish
