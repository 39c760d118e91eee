# Sourced by scripts/bench.sh for --capacity / --capacity-smoke (issue 24, item 4). Uses
# bench.sh's server, helpers and replicas; runs only its own rows and exits.
#
# Sustained every-second capacity of 3 replicas with the default configuration, found by
# stepping the load. For each step N (CAP_STEPS) until the first that falls behind:
#   publish     every-second triggers (`* * * * * *`, ids c…) up to N through the statements of
#               `qlsched trigger publish` (bench/scale_lib.sh publish_second: bench/publish_trigger.sql
#               with the every-second cron, one transaction per trigger on a new connection); the
#               first step's triggers are published in trials at several parallelisms, the rest at
#               the fastest. Replicas are stopped meanwhile.
#   reset       with no replica running (nothing they hold can be confused): runs, attempts,
#               run_events and replicas truncated as bench/reset.sql does (the disk stays bounded:
#               5,000/s is 300k runs a minute), then every cursor moved to the same whole second
#               T0 a few seconds ahead (the columns a re-publish resets), CHECKPOINT
#   run         3 replicas, default config; WARM s after max(T0, ready) a window of WIN whole
#               seconds [w0, w1]; SLACK_MS after w1 it counts the runs scheduled in the window:
#               due = N × WIN (every trigger is due at every whole second from T0 on); lag =
#               queued_at - scheduled_for of those runs
#   kept up     admitted = due (an occurrence not committed SLACK_MS after it was due counts as
#               missing) and lag p99 ≤ 1 s, no duplicates
#   measured    server CPU over the window (postmaster + its children, /proc, % of one core),
#               WAL bytes per second (pg_current_wal_lsn at w0 and w1), replica CPU and
#               VmRSS/VmHWM at w1
# Then the highest step that kept up is held for HOLD s (triggers beyond it deleted, with the
# replicas stopped) and measured the same way: that is the capacity row.
. bench/scale_lib.sh
if [ "$MODE" = capacity ]; then
  CAP_STEPS="2000 3000 4000 5000 6000 7000 8000 9000 10000 12000 14000 16000"
  WIN=60; HOLD=300; WARM=15; TRIAL_N=500
else
  CAP_STEPS="100 200"; WIN=20; HOLD=20; WARM=5; TRIAL_N=20
fi
CAP_STEPS=${QLSCHED_BENCH_CAP_STEPS:-$CAP_STEPS}
WIN=${QLSCHED_BENCH_CAP_WINDOW_S:-$WIN}; HOLD=${QLSCHED_BENCH_CAP_HOLD_S:-$HOLD}
TRIAL_PS=${QLSCHED_BENCH_PUBLISH_PS:-"2 4 8"}
SLACK_MS=2000
P_BEST=""

say "C. capacity: every-second triggers, steps $CAP_STEPS, ${WIN} s windows, then ${HOLD} s at the highest that keeps up; 3 replicas (default config)"
reset_db
sql "SET client_min_messages = warning; DROP SEQUENCE IF EXISTS public.bench_publish_seq" >/dev/null

# Smoke only: one every-second trigger published by the real CLI and one by publish_second,
# their rows compared (all columns but the id and the clock-derived ones), then both removed.
if [ "$MODE" = capacity-smoke ]; then
  publish_second 1 1 v
  "$QL" trigger publish --dsn "host=127.0.0.1 port=$PORT user=qlsched_admin dbname=qlsched" --id v-cli \
      --project bench --task bench-task --cron '* * * * * *' >"$WORK/verify-cli.log" 2>&1 || { cat "$WORK/verify-cli.log" >&2; die "trigger publish failed"; }
  canon() { sql "select to_jsonb(t) - 'trigger_id' - 'updated_at_ms' - 'created_at_ms', to_jsonb(s) - 'trigger_id' - 'updated_at_ms' - 'next_fire_at_ms' - 'claimable_at_ms',
                        s.next_fire_at_ms = s.claimable_at_ms and s.next_fire_at_ms % 1000 = 0 and s.next_fire_at_ms > s.updated_at_ms and s.next_fire_at_ms <= s.updated_at_ms + 1000
                   from qlsched.triggers t join qlsched.trigger_schedules s using (trigger_id) where trigger_id $1"; }
  a=$(canon "= 'v-cli'"); b=$(canon "like 'v0%'")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then v=identical; else v=DIFFERENT; note "CLI:  $a"$'\n\n'"bench: $b"; fi
  row "C" "every-second publish path vs \`qlsched trigger publish --cron '* * * * * *'\` (triggers + trigger_schedules rows, but ids and clock columns; first cursor = next whole second)" "$v" "identical" "$([ $v = identical ] && echo PASS || echo FAIL)"
  sql "SET session_replication_role = replica; DELETE FROM qlsched.trigger_schedules WHERE trigger_id LIKE 'v%'; DELETE FROM qlsched.triggers WHERE trigger_id LIKE 'v%'" >/dev/null
fi

cap_published() { sql "select count(*) from qlsched.triggers where trigger_id like 'c%'"; }
# cap_publish N: publish every-second triggers up to N in all; sets CAP_PUB_TXT
cap_publish() {
  local want=$1 have add t0 ms
  have=$(cap_published); add=$(( want - have )); CAP_PUB_TXT="none added"
  [ "$add" -gt 0 ] || return 0
  if [ -z "$P_BEST" ]; then
    publish_second 0 1 c   # project, task and the publish script first, outside the trials
    local trial=$(( TRIAL_N * $(wc -w <<<"$TRIAL_PS") <= add ? TRIAL_N : add / $(wc -w <<<"$TRIAL_PS") ))
    publish_trials_c "$trial"
    add=$(( want - $(cap_published) ))
  fi
  t0=$(now_ms); publish_second "$add" "$P_BEST" c; ms=$(( $(now_ms) - t0 ))
  CAP_PUB_TXT="$add published at P=$P_BEST in $(fmt "$(calc "$ms / 1000")" 1) s ($(fmt "$(calc "$add / ($ms > 0 ? $ms : 1) * 1000")") triggers/s)"
}
publish_trials_c() { # trial size: the same trials as bench/scale_lib.sh publish_trials, prefix c
  publish_second_c() { publish_second "$1" "$2" c; }
  publish_trials second_c "$1" "$TRIAL_PS"
  P_BEST=${PUB_BEST:-4}
  row "C" "publishing every-second triggers through \`trigger publish\`'s transactions (a new connection each)" \
      "trials of $1: $PUB_TRIALS; the rest at P=$P_BEST" "—" "—"
}

# cap_prepare: no replica runs. Truncate admitted work, move every cursor to T0, checkpoint.
cap_prepare() {
  "${PSQL[@]}" -d qlsched >/dev/null <<'SQL'
SET session_replication_role = replica;
TRUNCATE qlsched.run_events, qlsched.attempts, qlsched.runs, qlsched.replicas;
SQL
  checkpoint
  T0=$(( ($(now_ms) + 3000) / 1000 * 1000 + 1000 ))
  sql "SET session_replication_role = replica;
       UPDATE qlsched.trigger_schedules
          SET next_fire_at_ms = $T0, claimable_at_ms = $T0, last_scheduled_at_ms = NULL,
              claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
              claim_version = claim_version + 1, state_version = state_version + 1,
              updated_at_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint" >/dev/null
}

# cap_run N SECONDS: one measured window; sets S_PASS, S_TXT, S_WHY
cap_run() {
  local n=$1 win=$2 ready w0 w1 sl lsn0 lsn1 st0 st1 rt0=0 rt1=0 p mem adm p50 p99 lmax due miss dups wal cpu rcpu secs
  cap_prepare
  start_replicas 3 64 30s
  wait_ready
  ready=$(now_ms)
  w0=$(( ( (ready > T0 ? ready : T0) + WARM * 1000 + 999) / 1000 * 1000 )); w1=$(( w0 + win * 1000 - 1 ))
  sl=$(( w0 - $(now_ms) )); [ $sl -gt 0 ] && sleep "$(calc "$sl / 1000")"
  lsn0=$(sql "select pg_current_wal_lsn()"); st0=$(server_ticks)
  for p in "${RPIDS[@]}"; do rt0=$(( rt0 + $(cpu_ticks "$p") )); done
  local m0; m0=$(now_ms)
  sl=$(( w1 + 1 - $(now_ms) )); [ $sl -gt 0 ] && sleep "$(calc "$sl / 1000")"
  lsn1=$(sql "select pg_current_wal_lsn()"); st1=$(server_ticks)
  for p in "${RPIDS[@]}"; do kill -0 "$p" 2>/dev/null || die "a replica exited during the window (see $WORK)"; rt1=$(( rt1 + $(cpu_ticks "$p") )); done
  secs=$(calc "($(now_ms) - $m0) / 1000")
  mem=$(replica_mem)
  sl=$(( w1 + SLACK_MS - $(now_ms) )); [ $sl -gt 0 ] && sleep "$(calc "$sl / 1000")"
  IFS='|' read -r adm p50 p99 lmax <<<"$(sql "select count(*), coalesce(percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms), 0),
          coalesce(percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms), 0),
          coalesce(max(queued_at_ms - scheduled_for_ms), 0)
     from qlsched.runs where trigger_id like 'c%' and scheduled_for_ms between $w0 and $w1")"
  local late; late=$(sql "select count(*) from qlsched.runs where trigger_id like 'c%' and scheduled_for_ms between $w0 and $w1 and queued_at_ms - scheduled_for_ms > 1000")
  # where in the window the lag was: per 30 s of scheduled time, and the tables' autovacuums
  local buckets av
  buckets=$(sql "select string_agg(format('%s-%s s p50 %s / p99 %s / max %s ms', b * 30, b * 30 + 30, round(p50), round(p99), mx), '; ' order by b)
     from (select (scheduled_for_ms - $w0) / 30000 b,
                  percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms) p50,
                  percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms) p99,
                  max(queued_at_ms - scheduled_for_ms) mx
             from qlsched.runs where trigger_id like 'c%' and scheduled_for_ms between $w0 and $w1 group by 1) x")
  av=$(sql "select string_agg(format('%s %s autovacuums (last %s UTC) %s autoanalyzes, %s dead tuples', relname, autovacuum_count,
                  coalesce(to_char(last_autovacuum at time zone 'UTC', 'HH24:MI:SS'), '-'), autoanalyze_count, n_dead_tup), '; ' order by relname)
     from pg_stat_user_tables where schemaname = 'qlsched' and relname in ('trigger_schedules', 'runs', 'attempts', 'run_events')")
  note "N=$n, ${win} s window from $(date -u -d @$((w0 / 1000)) +%H:%M:%S) UTC: lag by scheduled time: $buckets. Tables at its end (counters since the server started): $av"
  stop_replicas
  local adm_later; adm_later=$(sql "select count(*) from qlsched.runs where trigger_id like 'c%' and scheduled_for_ms between $w0 and $w1")
  dups=$(dup_count)
  due=$(( n * win )); miss=$(( due - adm )); [ $miss -lt 0 ] && miss=0
  wal=$(sql "select pg_wal_lsn_diff('$lsn1', '$lsn0')")
  cpu=$(calc "100 * ($st1 - $st0) / $CLK_TCK / $secs"); rcpu=$(calc "100 * ($rt1 - $rt0) / $CLK_TCK / $secs")
  S_PASS=$(verdict "$adm >= $due && $p99 <= 1000 && $dups == 0")
  S_WHY=""
  [ "$miss" -gt 0 ] && S_WHY="missing $miss of $due ($(fmt "$(calc "100 * $miss / $due")" 2) %) ${SLACK_MS} ms after the window"
  awk "BEGIN {exit !($p99 > 1000)}" && S_WHY+="${S_WHY:+; }lag p99 $(fmt "$p99") ms > 1000 ms"
  [ "$dups" -gt 0 ] && S_WHY+="${S_WHY:+; }$dups duplicates"
  S_P99=$p99
  S_KEY="lag p99 $(fmt "$p99") ms, server CPU $(fmt "$cpu") % of one core, WAL $(fmt "$(calc "$wal / $secs / 1048576")" 2) MiB/s, replica VmRSS/VmHWM MiB $mem"
  S_TXT="admitted $adm / $due due (missing $miss; $adm_later once the replicas stopped), lag p50 $(fmt "$p50") ms, p99 $(fmt "$p99") ms, max $(fmt "$lmax") ms ($late over 1 s), duplicates $dups; server CPU $(fmt "$cpu") % of one core ($(nproc) cores), WAL $(fmt "$(calc "$wal / $secs / 1048576")" 2) MiB/s ($(fmt "$(calc "$wal / ($adm > 0 ? $adm : 1)")") B per run), replica CPU $(fmt "$rcpu") % (3 together), replica VmRSS/VmHWM MiB: $mem"
  say "   N=$n, ${win} s: $S_PASS — $S_TXT"
}

best=""; best_txt=""; fail=""; fail_why=""
for n in $CAP_STEPS; do
  say "C. step $n every-second triggers"
  cap_publish "$n"
  cap_run "$n" "$WIN"
  row "C" "step $n every-second triggers, ${WIN} s window ($CAP_PUB_TXT)" "$S_TXT" "admitted = due, lag p99 ≤ 1 s" "$S_PASS"
  if [ "$S_PASS" = PASS ]; then best=$n; best_txt=$S_TXT; else fail=$n; fail_why=$S_WHY; break; fi
done

hold_txt="no step kept up"; hold_pass=FAIL
if [ -n "$best" ]; then
  if [ "$(cap_published)" -gt "$best" ]; then
    "${PSQL[@]}" -d qlsched >/dev/null <<SQL
SET session_replication_role = replica;
TRUNCATE qlsched.run_events, qlsched.attempts, qlsched.runs;
DELETE FROM qlsched.trigger_schedules WHERE trigger_id LIKE 'c%' AND trigger_id >
  (SELECT trigger_id FROM qlsched.triggers WHERE trigger_id LIKE 'c%' ORDER BY trigger_id OFFSET $((best - 1)) LIMIT 1);
DELETE FROM qlsched.triggers WHERE trigger_id LIKE 'c%' AND trigger_id >
  (SELECT trigger_id FROM qlsched.triggers WHERE trigger_id LIKE 'c%' ORDER BY trigger_id OFFSET $((best - 1)) LIMIT 1);
VACUUM qlsched.trigger_schedules;
VACUUM qlsched.triggers;
SQL
  fi
  [ "$(cap_published)" = "$best" ] || die "expected $best triggers for the hold, found $(cap_published)"
  say "C. hold: $best every-second triggers for ${HOLD} s"
  cap_run "$best" "$HOLD"
  hold_pass=$S_PASS; hold_txt=$S_KEY
  row "C" "hold: $best every-second triggers (the highest step that kept up), ${HOLD} s window" "$S_TXT" "admitted = due, lag p99 ≤ 1 s" "$S_PASS"
fi
fail_txt="none of the steps up to $(awk '{print $NF}' <<<"$CAP_STEPS") failed"
[ -n "$fail" ] && fail_txt="first step that failed: $fail ($fail_why)"
row "C" "sustained every-second capacity, 3 replicas, default config (highest step kept up for ${WIN} s, then held ${HOLD} s)" \
    "${best:-none} every-second triggers: hold $hold_pass ($hold_txt); $fail_txt" \
    "≥ 5,000 with p99 ≤ 1 s for 5 min" "$(verdict "${best:-0} >= 5000 && $HOLD >= 300 && \"$hold_pass\" == \"PASS\"")"
note "method: between steps the replicas are stopped, then runs/attempts/run_events/replicas are truncated (as bench/reset.sql does) and every schedule cursor is moved to one whole second T0 ahead (the columns a re-publish resets), CHECKPOINT, 3 replicas started; the window starts ${WARM} s after max(T0, ready) and counts whole seconds; admitted is counted ${SLACK_MS} ms after the window ends. Server CPU: utime + stime of the postmaster's children (and those it reaped) over the window, /proc. Steps: $CAP_STEPS."
scale_finish
