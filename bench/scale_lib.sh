# Helpers shared by bench/herd100k.sh and bench/capacity.sh (issue 24, items 3 and 4). Sourced
# by them inside scripts/bench.sh: uses its server (PORT, BIN, QL, WORK), sql, say, die, now_ms,
# calc, fmt and its ROWS / APPENDIX.

# publish_minute N P: N every-minute triggers (`0 * * * * *`, ids h<7 digits>) through
# bench/publish_cli.sh, P at a time: the statements of `qlsched trigger publish`, one
# transaction per trigger on a new connection each.
publish_minute() {
  bench/publish_cli.sh "$QL" "$BIN" "$PORT" qlsched qlsched "$1" 0 1 0 "$2" h
}

# publish_second N P [PFX]: N every-second triggers (`* * * * * *`, ids <PFX><7 digits>, default
# s) the same way: bench/publish_trigger.sql with only the cron and its first occurrence
# changed (the next whole second after the publish's clock, as Schedule::next_after_ms finds it
# for `* * * * * *`), P at a time, pgbench -C. The project and task come from publish_cli.sh
# (N = 0: `project set` and `task publish` only).
publish_second() {
  local n=$1 p=$2 pfx=${3:-s} out=$WORK/publish_second.out
  [ -f "$WORK/publish_second.sql" ] || {
    bench/publish_cli.sh "$QL" "$BIN" "$PORT" qlsched qlsched 0 0 1 0 1 "$pfx"
    sed -e 's|^SELECT ((:now_ms / 60000 + 1) .* AS first \\gset$|SELECT (:now_ms / 1000 + 1) * 1000 AS first \\gset|' \
        -e "s|^SELECT CASE WHEN :m = 1 THEN .* AS cron \\\\gset\$|SELECT '* * * * * *' AS cron \\\\gset|" \
        bench/publish_trigger.sql >"$WORK/publish_second.sql"
    grep -q "^SELECT (:now_ms / 1000 + 1) \* 1000 AS first" "$WORK/publish_second.sql" &&
      grep -q "^SELECT '\* \* \* \* \* \*' AS cron" "$WORK/publish_second.sql" ||
      die "bench/publish_trigger.sql changed: cannot derive the every-second publish from it"
  }
  pub_second_run() { # clients transactions-per-client
    [ "$2" -gt 0 ] || return 0
    "$BIN/pgbench" -n -C -c "$1" -j "$1" -t "$2" -D pfx="$pfx" -D per_task=0 -D k=0 -D m=1 -D grace=60000 \
        -h 127.0.0.1 -p "$PORT" -U postgres -f "$WORK/publish_second.sql" qlsched >"$out" 2>&1 \
      || { cat "$out" >&2; die "publishing every-second triggers failed"; }
    grep -q 'number of failed transactions: 0' "$out" || { cat "$out" >&2; die "publishing every-second triggers failed"; }
  }
  pub_second_run "$p" $(( n / p ))
  pub_second_run 1 $(( n % p ))
}

# publish_trials KIND T "P1 P2 ...": publishes T triggers with each parallelism in turn (KIND =
# minute | second), all of them real triggers of the run; sets PUB_BEST (the fastest P),
# PUB_RATE (its rate, triggers/s), PUB_TRIALS (text) and PUB_DONE (triggers published).
publish_trials() {
  local kind=$1 t=$2 p t0 ms rate
  PUB_BEST=""; PUB_RATE=0; PUB_TRIALS=""; PUB_DONE=0
  for p in $3; do
    t0=$(now_ms)
    "publish_$kind" "$t" "$p"
    ms=$(( $(now_ms) - t0 )); rate=$(calc "$t / ($ms > 0 ? $ms : 1) * 1000")
    PUB_TRIALS+="${PUB_TRIALS:+, }P=$p $(fmt "$rate") /s"
    PUB_DONE=$(( PUB_DONE + t ))
    say "   publish trial: $t $kind triggers, $p at a time: $ms ms, $(fmt "$rate") triggers/s"
    if awk "BEGIN {exit !($rate > $PUB_RATE)}"; then PUB_RATE=$rate; PUB_BEST=$p; fi
  done
}

vmrss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# replica_mem: "VmRSS/VmHWM MiB" of each running replica, and SCALE_HWM_MAX (KiB)
replica_mem() {
  local p txt="" h
  SCALE_HWM_MAX=0
  for p in "${RPIDS[@]}"; do
    h=$(vmhwm_kb "$p")
    [ "$h" -gt "$SCALE_HWM_MAX" ] && SCALE_HWM_MAX=$h
    txt+="${txt:+, }$(fmt "$(calc "$(vmrss_kb "$p") / 1024")" 1)/$(fmt "$(calc "$h / 1024")" 1)"
  done
  echo "$txt"
}
dup_count() { sql "select count(*) from (select 1 from qlsched.runs group by trigger_id, scheduled_for_ms having count(*) > 1) d"; }

# scale_finish: print the rows; outside the smoke modes keep them in
# bench/results/<date>-<commit>-<mode>.md. Exits.
scale_finish() {
  local table r result
  table="| # | measurement | measured | target | verdict |
|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do table+=$'\n'"| ${r//|/ | } |"; done
  kill "$SAMPLER" 2>/dev/null || true; SAMPLER=""
  local meta="mode **$MODE** · $(date -u +%Y-%m-%dT%H:%MZ) · commit \`$COMMIT$DIRTY\` · $(uname -m) · nproc $(nproc) · PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') (fsync on, synchronous_commit on, shared_buffers 1GB, max_wal_size 8GB) · run $(( $(date +%s) - BUILD_DONE )) s · 1-min load average during the run: $(sort -n "$WORK/loadavg.log" | awk 'NR == 1 {min = $1} {max = $1; s += $1; n++} END {if (n) printf "min %s, mean %.2f, max %s", min, s / n, max}')"
  echo; echo "$meta"; echo; echo "$table"; echo
  if [ "${MODE%-smoke}" != "$MODE" ]; then
    result=$WORK/result.md
  else
    mkdir -p bench/results
    result=bench/results/$(date -u +%Y-%m-%dT%H%MZ)-$COMMIT$DIRTY-$MODE.md
  fi
  { echo "# qlsched benchmark, $MODE mode"; echo; echo "$meta"; echo
    echo "- machine activity before: $LOAD_BEFORE"; echo "- machine activity after:  $(load_sample)"; echo
    echo "$table"; echo; echo "## Evidence"; echo
    for r in "${APPENDIX[@]}"; do printf '%s\n\n' "$r"; done; } >"$result"
  echo "results kept in $result"
  [ "${MODE%-smoke}" != "$MODE" ] && { echo; sed -n '/^## Evidence/,$p' "$result"; }
  exit 0
}
