# Sourced by scripts/bench.sh for --retention / --retention-quick (issue 21's target rows;
# docs/benchmark.md, "Retention"). Uses bench.sh's server, helpers and replicas.
#
# One run on one server: 1,000 every-second triggers, 3 replicas with [retention]
# finished_after = "2m", interval = "5s", batch = $RET_BATCH, and the reference dispatcher
# (examples/dispatcher.rs) finishing every run.
#   main   MAIN_S seconds with retention on: table + index size of runs, attempts and
#          run_events sampled every 30 s (the row compares the end with the middle)
#   alt    then ALT_S-second phases, replicas restarted between them: off (finished_after
#          "0"), on, off, on. Lag p99 of the "on" phases vs the "off" ones. Each "on" phase
#          starts with the backlog the "off" phase before it left (finished runs past the
#          horizon): how fast the pruner removes it while admission goes on is the prune
#          throughput row; WAL and server CPU per pruned run come from pg_stat_statements
#          (the prune statement) and from the difference between "on" and "off" phases.
# Every run admitted is seen: those still in qlsched.runs at the end, and the pruned ones,
# which a statement-level AFTER DELETE trigger on qlsched.runs (added here, bench only)
# copies into an unlogged side table bench_audit.pruned. Lost = occurrences due in the run
# window without a run in either; duplicates = (trigger, scheduled_for) pairs with two runs;
# unfinished pruned = side-table rows whose status was not finished when deleted.

ret_bytes() { sql "select pg_total_relation_size('qlsched.runs') + pg_total_relation_size('qlsched.attempts') + pg_total_relation_size('qlsched.run_events')"; }
# Sum of a counter family over the running replicas (all label sets).
metric_family_sum() {
  local port total=0 v
  for port in "${RPORTS[@]}"; do
    v=$(curl -fs "http://127.0.0.1:$port/metrics" | awk -v m="$1" 'index($1, m) == 1 && (length($1) == length(m) || substr($1, length(m) + 1, 1) == "{") {s += $2} END {print s + 0}')
    total=$(awk -v a="$total" -v b="${v:-0}" 'BEGIN {print a + b}')
  done
  echo "$total"
}
PM_PID=$(head -1 "$WORK/data/postmaster.pid")
# All CPU the server spent so far: postmaster, its live children and the children it reaped.
server_ticks() {
  local t c
  t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$PM_PID/stat")
  for c in $(cat "/proc/$PM_PID/task/$PM_PID/children" 2>/dev/null); do
    t=$(( t + $(awk '{print $14 + $15}' "/proc/$c/stat" 2>/dev/null || echo 0) ))
  done
  echo "$t"
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }

if [ "$MODE" = retention ]; then MAIN_S=600; ALT_S=60; else MAIN_S=240; ALT_S=40; fi
MAIN_S=${QLSCHED_BENCH_RET_MAIN_S:-$MAIN_S}; ALT_S=${QLSCHED_BENCH_RET_ALT_S:-$ALT_S}   # (checking the script itself)
RET_N=1000; RET_WARM=5
RET_BATCH=${QLSCHED_BENCH_PRUNE_BATCH:-1000}
DISPATCHERS=2; DISPATCHER_BATCH=500; DISPATCHER_IDLE_MS=50
if [ -n "${QLSCHED_BENCH_DISPATCHER:-}" ]; then DISP=$QLSCHED_BENCH_DISPATCHER; else
  say "building the reference dispatcher (cargo build --release --example dispatcher)"
  cargo build --release --quiet --example dispatcher
  DISP=$ROOT/target/release/examples/dispatcher
fi
DISPATCHER_DSN="host=127.0.0.1 port=$PORT user=qlsched_dispatcher dbname=qlsched"
declare -a DPIDS=()
start_dispatcher() {
  local i
  for i in $(seq "$DISPATCHERS"); do
    "$DISP" --dsn "$DISPATCHER_DSN" --batch "$DISPATCHER_BATCH" --idle-ms "$DISPATCHER_IDLE_MS" >>"$WORK/dispatcher$i.log" 2>&1 &
    DPIDS+=($!)
  done
}
stop_dispatcher() { local p; for p in "${DPIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
                    for p in "${DPIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done; DPIDS=(); }
trap 'stop_dispatcher; cleanup' EXIT
ret_toml() { printf '[retention]\nfinished_after = "%s"\ninterval = "5s"\nbatch = %s\n' "$1" "$RET_BATCH"; }

say "R. retention: $RET_N every-second triggers, 3 replicas, reference dispatcher, finished_after 2m; main ${MAIN_S} s, then off/on/off/on ${ALT_S} s each"
reset_db; load "$RET_N" second lead_ms=5000
sql "SET client_min_messages = warning;
     CREATE SCHEMA IF NOT EXISTS bench_audit;
     CREATE UNLOGGED TABLE bench_audit.pruned (run_id uuid, trigger_id text, scheduled_for_ms bigint, queued_at_ms bigint, status text);
     CREATE FUNCTION bench_audit.log_pruned() RETURNS trigger LANGUAGE plpgsql AS \$\$
     BEGIN
       INSERT INTO bench_audit.pruned SELECT run_id, trigger_id, scheduled_for_ms, queued_at_ms, status FROM gone;
       RETURN NULL;
     END \$\$;
     CREATE TRIGGER zz_bench_audit_pruned AFTER DELETE ON qlsched.runs REFERENCING OLD TABLE AS gone
       FOR EACH STATEMENT EXECUTE FUNCTION bench_audit.log_pruned();
     GRANT USAGE ON SCHEMA bench_audit TO qlsched_owner;
     GRANT INSERT ON bench_audit.pruned TO qlsched_owner;
     CREATE VIEW bench_audit.all_runs AS
       SELECT run_id, trigger_id, scheduled_for_ms, queued_at_ms, status, false AS pruned FROM qlsched.runs
       UNION ALL SELECT run_id, trigger_id, scheduled_for_ms, queued_at_ms, status, true FROM bench_audit.pruned" >/dev/null
checkpoint

# ---- main phase: retention on -------------------------------------------------------------
PRUNED_METRIC=0   # pruned runs counted by the replicas' metrics, summed over phases
REPLICA_EXTRA=$(ret_toml 2m)
RUN_T0=$(now_ms)
start_replicas 3 64 30s
start_dispatcher
wait_ready
MAIN_T0=$RUN_T0
SIZES=(); SIZE_TXT=""
for i in $(seq 1 $((MAIN_S / 30))); do
  while [ "$(now_ms)" -lt $((MAIN_T0 + i * 30000)) ]; do sleep 0.5; done
  b=$(ret_bytes); SIZES+=("$b")
  n=$(sql "select count(*) from qlsched.runs")
  vac=$(sql "select string_agg(relname || ' ' || n_dead_tup || ' dead, ' || autovacuum_count || ' autovacuums', '; ' order by relname)
               from pg_stat_user_tables where schemaname = 'qlsched' and relname in ('runs', 'attempts', 'run_events')")
  SIZE_TXT+="$((i * 30)) s: $(mib "$b") MiB ($n runs; $vac); "
  say "   $((i * 30)) s: runs+attempts+events with indexes $(mib "$b") MiB, $n runs retained, pruned so far $(metric_family_sum qlsched_runs_pruned_total)"
  for p in "${RPIDS[@]}" "${DPIDS[@]}"; do kill -0 "$p" 2>/dev/null || die "a replica or the dispatcher exited (see $WORK)"; done
done
MAIN_T1=$(now_ms)
PRUNED_METRIC=$(calc "$PRUNED_METRIC + $(metric_family_sum qlsched_runs_pruned_total)")
SKIPS=$(metric_family_sum qlsched_skips_total)   # occurrences the misfire policy skipped (late past the grace)
FINISH_P99=$(sql "select coalesce(percentile_cont(0.99) within group (order by a.finished_at_ms - r.queued_at_ms), -1)
                    from qlsched.runs r join qlsched.attempts a using (run_id) where a.finished_at_ms is not null")
FINISH_MAX=$(sql "select coalesce(max(a.finished_at_ms - r.queued_at_ms), -1) from qlsched.runs r join qlsched.attempts a using (run_id) where a.finished_at_ms is not null")
UNFINISHED_OLD=$(sql "select count(*) from qlsched.runs where status in ('queued', 'dispatching', 'running') and queued_at_ms < $(now_ms) - 5000")
stop_replicas
HALF=${SIZES[$(( ${#SIZES[@]} / 2 - 1 ))]}; LAST=${SIZES[$(( ${#SIZES[@]} - 1 ))]}
HALF_S=$(( MAIN_S / 2 ))

# ---- alternating phases ------------------------------------------------------------------------
pgss_reset
declare -a PH_INBATCH=() PH_KIND=() PH_W0=() PH_W1=() PH_TICKS=() PH_WAL=() PH_PRUNED=() PH_SECS=() PH_BURST=()
for kind in off on off on; do
  if [ $kind = on ]; then REPLICA_EXTRA=$(ret_toml 2m); else REPLICA_EXTRA=$(ret_toml 0); fi
  say "R. phase retention $kind, ${ALT_S} s"
  lsn0=$(sql "select pg_current_wal_lsn()"); k0=$(server_ticks); p0=$(now_ms)
  start_replicas 3 64 30s
  wait_ready
  # The burst: from the sample before the pruned counter first moved to the last sample at
  # which it still moved (the pass ends when a batch comes back short: the backlog is gone).
  burst=""; prev=0; prev_t=$(now_ms); b_start=""; b_end=""; b_n0=0; b_n1=0
  while [ "$(now_ms)" -lt $((p0 + ALT_S * 1000)) ]; do
    sleep 1
    if [ $kind = on ] && [ -z "$b_end" ]; then
      c=$(metric_family_sum qlsched_runs_pruned_total); t=$(now_ms)
      backlog=$(sql "select count(*) from qlsched.runs where status in ('succeeded', 'failed', 'cancelled') and queued_at_ms < (extract(epoch from clock_timestamp()) * 1000)::bigint - 120000")
      if [ -z "$b_start" ] && [ "$(calc "($c > 0)")" = 1 ]; then b_start=$prev_t; b_n0=$prev; fi
      if [ -n "$b_start" ] && [ "$(calc "($c == $prev)")" = 1 ]; then b_end=$prev_t; b_n1=$prev; fi
      burst+="$(( (t - p0) / 1000 )) s: pruned $c, backlog $backlog; "
      prev=$c; prev_t=$t
    fi
  done
  p1=$(now_ms)
  if [ ${#PH_KIND[@]} = 3 ]; then
    # the last phase: let the replicas decide every occurrence of the window before they stop
    # (bounded), so that a backlog at the end is not counted as lost
    until [ "$(sql "select count(*) from qlsched.trigger_schedules where next_fire_at_ms <= $((p1 - 3000))")" = 0 ] \
          || [ "$(now_ms)" -gt $((p1 + 120000)) ]; do sleep 1; done
  fi
  SKIPS=$(calc "$SKIPS + $(metric_family_sum qlsched_skips_total)")
  pr=$(metric_family_sum qlsched_runs_pruned_total)
  # pruned runs per second spent inside prune batches (qlsched_prune_duration_seconds)
  pdur=$(metric_family_sum qlsched_prune_duration_seconds_sum)
  [ $kind = on ] && PH_INBATCH+=("$(calc "$pr / ($pdur > 0 ? $pdur : 1)")|$pr runs in $(fmt "$pdur" 2) s of prune batches")
  PRUNED_METRIC=$(calc "$PRUNED_METRIC + $pr")
  stop_replicas
  k1=$(server_ticks); lsn1=$(sql "select pg_current_wal_lsn()")
  PH_KIND+=("$kind"); PH_W0+=($((p0 + RET_WARM * 1000))); PH_W1+=($((p1 - 3000)))
  PH_TICKS+=($((k1 - k0))); PH_WAL+=("$(sql "select pg_wal_lsn_diff('$lsn1', '$lsn0')")"); PH_PRUNED+=("$pr"); PH_SECS+=("$(calc "($(now_ms) - $p0) / 1000")")
  if [ -n "$b_end" ]; then PH_BURST+=("$(calc "($b_n1 - $b_n0) / (($b_end - $b_start) / 1000)")|$((b_n1 - b_n0)) runs in $(fmt "$(calc "($b_end - $b_start) / 1000")" 1) s")
  elif [ $kind = on ]; then PH_BURST+=("0|backlog not cleared within the phase: $burst"); fi
  [ $kind = on ] && note "prune burst, phase $((${#PH_KIND[@]})): $burst"
done
RUN_T1=$p1   # the last phase's replicas stopped here
stop_dispatcher
PRUNE_STATS=$( [ $PGSS = on ] && sqlpg "select coalesce(sum(calls), 0) || '|' || coalesce(sum(wal_bytes), 0) || '|' || coalesce(sum(total_exec_time), 0)
                                           from pg_stat_statements where dbid = $QDB_OID and userid = $RUNTIME_OID and query ilike '%prune_finished%'" || echo "0|0|0")
IFS='|' read -r PRUNE_CALLS PRUNE_WAL PRUNE_MS <<<"$PRUNE_STATS"

# ---- accounting over the whole run ------------------------------------------------------------
W0=$(( RUN_T0 + RET_WARM * 1000 )); W1=$(( RUN_T1 - 3000 ))
read -r DUE GOT DUPS UNFIN_PRUNED AUDIT_N < <(sql "
  select (select count(*) from qlsched.triggers) * (floor($W1 / 1000.0) - ceil($W0 / 1000.0) + 1)::bigint,
         (select count(*) from (select distinct trigger_id, scheduled_for_ms from bench_audit.all_runs where scheduled_for_ms between $W0 and $W1) x),
         (select count(*) from (select 1 from bench_audit.all_runs group by trigger_id, scheduled_for_ms having count(*) > 1) d),
         (select count(*) from bench_audit.pruned where status not in ('succeeded', 'failed', 'cancelled')),
         (select count(*) from bench_audit.pruned)" | tr '|' ' ')
LOST=$(( DUE - GOT ))
lag_of() { # W0 W1 -> "n|p50|p99|max"
  sql "select count(*), coalesce(percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms), 0),
              coalesce(percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms), 0), coalesce(max(queued_at_ms - scheduled_for_ms), 0)
         from bench_audit.all_runs where scheduled_for_ms between $1 and $2"
}
IFS='|' read -r ML_N ML_P50 ML_P99 ML_MAX <<<"$(lag_of $((MAIN_T0 + RET_WARM * 1000)) $((MAIN_T1 - 3000)))"
# lag p99 over the "on" phases and over the "off" phases (each phase's window pooled)
pooled_p99() {
  local w="" i
  for i in "${!PH_KIND[@]}"; do [ "${PH_KIND[$i]}" = "$1" ] && w+="${w:+ or }scheduled_for_ms between ${PH_W0[$i]} and ${PH_W1[$i]}"; done
  sql "select count(*) || '|' || coalesce(percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms), 0) || '|' ||
              coalesce(percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms), 0) from bench_audit.all_runs where $w"
}
IFS='|' read -r ON_N ON_P50 ON_P99 <<<"$(pooled_p99 on)"
IFS='|' read -r OFF_N OFF_P50 OFF_P99 <<<"$(pooled_p99 off)"
PH_TXT=""; for i in "${!PH_KIND[@]}"; do
  IFS='|' read -r n p50 p99 mx <<<"$(lag_of "${PH_W0[$i]}" "${PH_W1[$i]}")"
  PH_TXT+="phase $((i + 1)) ${PH_KIND[$i]}: p99 $(fmt "$p99") ms (p50 $(fmt "$p50"), max $(fmt "$mx"), $n runs), pruned ${PH_PRUNED[$i]}, server CPU $(fmt "$(calc "100 * ${PH_TICKS[$i]} / $CLK_TCK / ${PH_SECS[$i]}")") % of one core, WAL $(fmt "$(calc "${PH_WAL[$i]} / 1048576 / ${PH_SECS[$i]}")" 2) MiB/s; "
done
# marginal server CPU and WAL per pruned run: "on" phases minus "off" phases, per second
CPU_ON=0; CPU_OFF=0; WAL_ON=0; WAL_OFF=0; S_ON=0; S_OFF=0; N_ON=0
for i in "${!PH_KIND[@]}"; do
  if [ "${PH_KIND[$i]}" = on ]; then CPU_ON=$((CPU_ON + PH_TICKS[i])); WAL_ON=$(calc "$WAL_ON + ${PH_WAL[$i]}"); S_ON=$(calc "$S_ON + ${PH_SECS[$i]}"); N_ON=$(calc "$N_ON + ${PH_PRUNED[$i]}")
  else CPU_OFF=$((CPU_OFF + PH_TICKS[i])); WAL_OFF=$(calc "$WAL_OFF + ${PH_WAL[$i]}"); S_OFF=$(calc "$S_OFF + ${PH_SECS[$i]}"); fi
done
N_ON_D=$(calc "($N_ON > 0 ? $N_ON : 1)")
CPU_PER=$(calc "1e6 * ($CPU_ON / $CLK_TCK - $CPU_OFF / $CLK_TCK * $S_ON / $S_OFF) / $N_ON_D")
WAL_PER=$(calc "($WAL_ON - $WAL_OFF * $S_ON / $S_OFF) / $N_ON_D")
PGSS_WAL_PER=$(calc "$PRUNE_WAL / $N_ON_D"); PGSS_MS_PER=$(calc "1000 * $PRUNE_MS / $N_ON_D")

SIZE_RATIO=$(calc "$LAST / $HALF")
row "R" "retention 2m: $RET_N every-second triggers, 3 replicas, reference dispatcher ($DISPATCHERS × batch $DISPATCHER_BATCH, idle $DISPATCHER_IDLE_MS ms), [retention] interval 5s batch $RET_BATCH, ${MAIN_S} s: runs + attempts + events with indexes at the end vs at ${HALF_S} s; whole run (main + alternating phases)" \
    "$(mib "$LAST") MiB at ${MAIN_S} s vs $(mib "$HALF") MiB at ${HALF_S} s = **$(fmt "$SIZE_RATIO" 3)×**; due $DUE, admitted $GOT (lost $LOST, of which skipped by the misfire policy (late past the 60 s grace) $(fmt "$SKIPS")), duplicates $DUPS, unfinished runs pruned $UNFIN_PRUNED (of $AUDIT_N pruned; the replicas' counters say $(fmt "$PRUNED_METRIC")); dispatcher: finish − admission p99 $(fmt "$FINISH_P99") ms, max $(fmt "$FINISH_MAX") ms (runs retained at ${MAIN_S} s), unfinished older than 5 s then: $UNFINISHED_OLD; main-phase lag p50 $(fmt "$ML_P50") ms, p99 $(fmt "$ML_P99") ms, max $(fmt "$ML_MAX") ms" \
    "≤ 1.1×; 0 duplicates, 0 lost, 0 unfinished pruned" "$(verdict "$SIZE_RATIO <= 1.1 && $DUPS == 0 && $LOST == 0 && $UNFIN_PRUNED == 0")"
row "R" "lag p99 with pruning vs without: alternating ${ALT_S} s phases off/on/off/on (replicas restarted each phase; first ${RET_WARM} s of each excluded)" \
    "on $(fmt "$ON_P99") ms (p50 $(fmt "$ON_P50"), $ON_N runs) vs off $(fmt "$OFF_P99") ms (p50 $(fmt "$OFF_P50"), $OFF_N runs) = **$(fmt "$(calc "$ON_P99 / ($OFF_P99 > 0 ? $OFF_P99 : 1)")" 2)×**" \
    "≤ 1.2×" "$(verdict "$ON_P99 <= 1.2 * $OFF_P99")"
for i in "${!PH_BURST[@]}"; do
  IFS='|' read -r rate txt <<<"${PH_BURST[$i]}"
  IFS='|' read -r irate itxt <<<"${PH_INBATCH[$i]}"
  row "R" "prune throughput while admitting $RET_N/s: the backlog one ${ALT_S} s \"off\" phase left, removed at the start of the next \"on\" phase (batch $RET_BATCH); pruned-counter samples every ~1 s" \
      "**$(fmt "$rate") runs/s** ($txt) = $(fmt "$(calc "$rate / $RET_N")" 2)× the admission rate; inside prune batches over the whole phase: $(fmt "$irate") runs/s ($itxt)" "≥ 3× the admission rate ($((3 * RET_N))/s)" "$(verdict "$rate >= 3 * $RET_N")"
done
row "R" "WAL and server CPU per pruned occurrence (run + attempt + 5 events), \"on\" phases" \
    "prune statement (pg_stat_statements): $(fmt "$PGSS_WAL_PER") B WAL and $(fmt "$PGSS_MS_PER" 1) µs server time per pruned run ($PRUNE_CALLS calls); marginal, on − off phases: $(fmt "$WAL_PER") B WAL and $(fmt "$CPU_PER" 1) µs server CPU per pruned run ($(fmt "$N_ON") pruned)" \
    "reported" "—"
note "retention main phase sizes (runs + attempts + run_events with indexes): $SIZE_TXT"
note "retention phases: $PH_TXT"
note "retention accounting window: scheduled_for $W0 .. $W1 ms; runs in bench_audit.pruned (side table filled by an AFTER DELETE statement trigger on qlsched.runs, unlogged: no WAL, a little server CPU inside each prune batch): $AUDIT_N"
LOAD_AFTER=$(load_sample)
note "machine activity before: $LOAD_BEFORE; after: $LOAD_AFTER; 1-minute load average during the run (every 5 s): $(sort -n "$WORK/loadavg.log" | awk 'NR == 1 {min = $1} {max = $1; s += $1; n++} END {if (n) printf "min %s, mean %.2f, max %s (%d samples)", min, s / n, max, n}')"
finish_own_rows
