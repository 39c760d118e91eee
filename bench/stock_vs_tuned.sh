# Sourced by scripts/bench.sh for --stock-vs-tuned / --stock-vs-tuned-smoke (issue 24, item 2:
# stock and tuned servers, and graphile-worker in the same run). Uses bench.sh's helpers,
# replicas and qlsched binary; runs its own two servers and exits.
#
# Two private durable PostgreSQL servers (the system one, or QLSCHED_BENCH_PGVER=16|17|18 from
# /var/tmp/qlsched-pg), side by side:
#   stock  initdb's defaults (shared_buffers 128MB, max_wal_size 1GB, checkpoint_timeout 5min);
#          only listen_addresses/port/unix_socket_directories set, plus pg_stat_statements when
#          bench.sh loads it
#   tuned  what bench.sh's server runs (pg_start's lines + bench.sh's PGCONF: shared_buffers 1GB,
#          max_wal_size 8GB, checkpoint_timeout 30min, …)
# On each, alternating stock / tuned row by row:
#   drain  N due triggers (bench/load.sql), 3 replicas (bench.sh's drain_once), twice each
#   lag    200 every-second triggers (bench/load.sql), 3 replicas, default config, p99 of
#          queued_at - scheduled_for over LAG_S s
#   herd   N every-minute triggers published as `trigger publish` writes them
#          (bench/publish_cli.sh, 4 at a time), 3 replicas, default config, B consecutive
#          boundaries: time from each boundary until the last of its runs is committed
#   graphile  graphile-worker 0.18 (npm, cached in QLSCHED_GRAPHILE_DIR, default
#          /var/tmp/qlsched-graphile) in its own database on the same server: a crontab of N
#          every-minute entries (one task identifier, distinct ?id= and payload each), 3 worker
#          processes (bench/graphile/driver.cjs, default options, a no-op task), B boundaries:
#          time from each boundary until its N jobs are inserted (the first worker's cron
#          statement returned: graphile inserts a boundary's jobs in one statement and the other
#          instances wait on its locks; checked by counting _private_known_crontabs rows whose
#          last_execution is the boundary, polled at 5 Hz)
# Every row is profiled on its server as counter deltas over the row: pg_stat_wal,
# pg_stat_bgwriter (pg_stat_checkpointer on 17+), pg_stat_io (16+), pg_stat_database.
# Sizes: N = 10,000 triggers / crontab entries, B = 3 boundaries, drain 10,000 (twice per server),
# LAG_S = 60; smoke: 300, 1, 300 (once), 20.
# environment:
#   QLSCHED_BENCH_PGVER=16|17|18   run both servers on that version (pg_fetch_version, cached in
#                                  /var/tmp/qlsched-pg) instead of the system server; 16+ adds pg_stat_io
#   QLSCHED_SVT_GRAPHILE_SERVERS   servers graphile-worker runs on (default "stock tuned"; smoke "tuned")
#   QLSCHED_GRAPHILE_DIR           npm cache of graphile-worker (default /var/tmp/qlsched-graphile)
#   QLSCHED_SVT_N, QLSCHED_SVT_BOUNDARIES  override N and B
#   QLSCHED_SVT_ROWS               rows to run (default "drain lag herd graphile")
ROOT=${ROOT:-$PWD}
SVT_SMOKE=0; [ "$MODE" = stock-vs-tuned-smoke ] && SVT_SMOKE=1
if [ $SVT_SMOKE = 1 ]; then
  SVT_N=300;   SVT_B=1; SVT_DRAIN=300;   SVT_DRAIN_REPS=1; SVT_LAG_N=200; SVT_LAG_S=20; SVT_LEAD=5000
  SVT_G_SERVERS=${QLSCHED_SVT_GRAPHILE_SERVERS:-tuned}
else
  SVT_N=10000; SVT_B=3; SVT_DRAIN=10000; SVT_DRAIN_REPS=2; SVT_LAG_N=200; SVT_LAG_S=60; SVT_LEAD=10000
  SVT_G_SERVERS=${QLSCHED_SVT_GRAPHILE_SERVERS:-stock tuned}
fi
SVT_N=${QLSCHED_SVT_N:-$SVT_N}; SVT_B=${QLSCHED_SVT_BOUNDARIES:-$SVT_B}
GDIR=${QLSCHED_GRAPHILE_DIR:-/var/tmp/qlsched-graphile}
declare -A CEIL_TPS=([3]=1) CEIL_B_TPS=(); ISO_OK=yes   # drain_once's ceiling ratio is not reported in this mode
STEADY_WARM=5   # seconds after the replicas start before the lag window opens

# bench.sh's own server is not used: this mode runs two of its own
pg_stop "$WORK"
SRVBIN=$BIN
if [ -n "${QLSCHED_BENCH_PGVER:-}" ]; then
  SRVBIN=$(pg_fetch_version "$QLSCHED_BENCH_PGVER") || die "no PostgreSQL $QLSCHED_BENCH_PGVER"
  BIN=$SRVBIN   # its psql and pgbench too
fi
SVT_MAJOR=$("$SRVBIN/postgres" --version | grep -oE '[0-9]+' | head -1)
SVT_VERSION=$("$SRVBIN/postgres" --version | awk '{print $3}')
PGSS=off
if [ -f "$SRVBIN/../lib/pg_stat_statements.so" ] || [ -f "$("$SRVBIN/pg_config" --pkglibdir 2>/dev/null)/pg_stat_statements.so" ]; then PGSS=on; fi
SVT_PGSS_CONF=""
[ $PGSS = on ] && SVT_PGSS_CONF="shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.max = 2000
pg_stat_statements.track = top
pg_stat_statements.track_utility = on
pg_stat_statements.track_planning = on"
# tuned = bench.sh's server exactly: pg_start's max_connections + PGCONF (which carries the
# pg_stat_statements lines when bench.sh found the library next to the system server)
SVT_TUNED_CONF="max_connections = 200
$(printf '%s\n' "$PGCONF" | grep -v -E '^(shared_preload_libraries|pg_stat_statements\.)')
$SVT_PGSS_CONF"
SVT_STOCK_CONF="$SVT_PGSS_CONF"

declare -A SVT_PORT=() SVT_QDB=() SVT_ROID=()
declare -a GPIDS=()
svt_cleanup() {
  local p s
  for p in "${GPIDS[@]:-}"; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true; done
  for s in stock tuned; do
    [ -f "$WORK/$s/data/postmaster.pid" ] && as_pg "$SRVBIN/pg_ctl" -D "$WORK/$s/data" -m immediate -w stop >/dev/null 2>&1 || true
  done
}
trap 'svt_cleanup; cleanup' EXIT

# svt_start NAME PORT CONF: initdb + start a private durable server in $WORK/NAME (as pg_start)
svt_start() {
  local dir=$WORK/$1
  mkdir -p "$dir"; [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
  as_pg "$SRVBIN/initdb" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 -D "$dir/data" >/dev/null
  printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\n%s\n" "$2" "$dir" "$3" >>"$dir/data/postgresql.conf"
  as_pg "$SRVBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
}
# use_server NAME: points bench.sh's helpers (sql, load, reset_db, start_replicas, pgss_*) at it
use_server() {
  SVT_CUR=$1; PORT=${SVT_PORT[$1]}
  SU="host=127.0.0.1 port=$PORT user=postgres dbname=postgres"
  OWNER="host=127.0.0.1 port=$PORT user=qlsched_owner dbname=qlsched"
  RUNTIME="host=127.0.0.1 port=$PORT user=qlsched_runtime dbname=qlsched"
  PSQL=("$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres)
  QDB_OID=${SVT_QDB[$1]:-0}; RUNTIME_OID=${SVT_ROID[$1]:-0}
}
p=$(free_port "$PORT")
for s in stock tuned; do
  SVT_PORT[$s]=$p; p=$(free_port $((p + 1)))
  conf=$SVT_STOCK_CONF; [ $s = tuned ] && conf=$SVT_TUNED_CONF
  say "starting the $s PostgreSQL $SVT_VERSION on 127.0.0.1:${SVT_PORT[$s]} in $WORK/$s"
  svt_start "$s" "${SVT_PORT[$s]}" "$conf"
  use_server "$s"
  "$QL" db bootstrap --superuser-dsn "$SU" >"$WORK/$s-bootstrap.log" 2>&1 || { cat "$WORK/$s-bootstrap.log" >&2; die "bootstrap ($s) failed"; }
  "$QL" db migrate --dsn "$OWNER" >"$WORK/$s-migrate.log" 2>&1 || { cat "$WORK/$s-migrate.log" >&2; die "migrate ($s) failed"; }
  [ $PGSS = on ] && sqlpg "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
  SVT_QDB[$s]=$(sqlpg "select oid from pg_database where datname = 'qlsched'")
  SVT_ROID[$s]=$(sqlpg "select oid from pg_roles where rolname = 'qlsched_runtime'")
done
SVT_SETTINGS=""
for s in stock tuned; do
  use_server "$s"
  SVT_SETTINGS+="- $s: $(sqlpg "select string_agg(name || ' ' || setting || coalesce(unit, ''), ', ' order by name) from pg_settings
      where name in ('shared_buffers','max_wal_size','min_wal_size','checkpoint_timeout','wal_buffers','max_connections','fsync','synchronous_commit','full_page_writes','bgwriter_lru_maxpages','effective_cache_size')")"$'\n'
done

# ---- profile: counter snapshots and their deltas ------------------------------------------------
SVT_SNAP_SQL="select 'wal records', wal_records::numeric from pg_stat_wal
 union all select 'wal full-page images', wal_fpi from pg_stat_wal
 union all select 'wal bytes', wal_bytes from pg_stat_wal
 union all select 'wal buffers full', wal_buffers_full from pg_stat_wal"
[ "$SVT_MAJOR" -lt 18 ] && SVT_SNAP_SQL+="
 union all select 'wal writes', wal_write from pg_stat_wal
 union all select 'wal syncs', wal_sync from pg_stat_wal"
if [ "$SVT_MAJOR" -lt 17 ]; then SVT_SNAP_SQL+="
 union all select 'checkpoints timed', checkpoints_timed from pg_stat_bgwriter
 union all select 'checkpoints requested', checkpoints_req from pg_stat_bgwriter
 union all select 'buffers written by checkpoints', buffers_checkpoint from pg_stat_bgwriter
 union all select 'buffers written by backends', buffers_backend from pg_stat_bgwriter"
else SVT_SNAP_SQL+="
 union all select 'checkpoints timed', num_timed from pg_stat_checkpointer
 union all select 'checkpoints requested', num_requested from pg_stat_checkpointer
 union all select 'buffers written by checkpoints', buffers_written from pg_stat_checkpointer"
fi
SVT_SNAP_SQL+="
 union all select 'buffers written by bgwriter', buffers_clean from pg_stat_bgwriter
 union all select 'bgwriter stops (maxwritten_clean)', maxwritten_clean from pg_stat_bgwriter
 union all select 'buffers allocated', buffers_alloc from pg_stat_bgwriter"
[ "$SVT_MAJOR" -ge 16 ] && SVT_SNAP_SQL+="
 union all select 'io client backends, relations: reads', coalesce(sum(reads), 0) from pg_stat_io where backend_type = 'client backend' and object = 'relation'
 union all select 'io client backends, relations: writes', coalesce(sum(writes), 0) from pg_stat_io where backend_type = 'client backend' and object = 'relation'
 union all select 'io client backends, relations: extends', coalesce(sum(extends), 0) from pg_stat_io where backend_type = 'client backend' and object = 'relation'
 union all select 'io client backends, relations: evictions', coalesce(sum(evictions), 0) from pg_stat_io where backend_type = 'client backend' and object = 'relation'
 union all select 'io all processes, relations: writes', coalesce(sum(writes), 0) from pg_stat_io where object = 'relation'
 union all select 'io all processes, relations: evictions', coalesce(sum(evictions), 0) from pg_stat_io where object = 'relation'
 union all select 'io all processes, relations: fsyncs', coalesce(sum(fsyncs), 0) from pg_stat_io where object = 'relation'"
[ "$SVT_MAJOR" -ge 18 ] && SVT_SNAP_SQL+="
 union all select 'io wal: writes', coalesce(sum(writes), 0) from pg_stat_io where object = 'wal'
 union all select 'io wal: fsyncs', coalesce(sum(fsyncs), 0) from pg_stat_io where object = 'wal'"
SVT_SNAP_SQL+="
 union all select 'db blocks read', sum(blks_read) from pg_stat_database
 union all select 'db blocks hit', sum(blks_hit) from pg_stat_database
 union all select 'db commits', sum(xact_commit) from pg_stat_database"
# svt_snap FILE: one \"counter|value\" line per counter (after a second, so that backends that
# went idle have flushed their statistics)
svt_snap() { sleep 1.2; "${PSQL[@]}" -d postgres -c "$SVT_SNAP_SQL" >"$1"; }
# svt_delta BEFORE AFTER KEY: AFTER - BEFORE per counter into $WORK/prof-KEY (for the table)
svt_delta() {
  awk -F'|' 'NR == FNR {b[$1] = $2; next} {printf "%s|%.0f\n", $1, $2 - b[$1]}' "$1" "$2" >"$WORK/prof-$3"
}
declare -a SVT_PROF_ROWS=()
# svt_profile LABEL KEY_STOCK KEY_TUNED: a markdown table of both deltas and their ratio
svt_profile() {
  local a=$WORK/prof-$2 b=$WORK/prof-$3
  [ -f "$a" ] && [ -f "$b" ] || return 0
  printf '\n**%s** (counter deltas over the row)\n\n| counter | stock | tuned | stock ÷ tuned |\n|---|---|---|---|\n' "$1"
  awk -F'|' 'NR == FNR {s[$1] = $2; next}
    {r = ($2 > 0) ? sprintf("%.2f", s[$1] / $2) : (s[$1] > 0 ? "∞" : "—"); printf "| %s | %s | %s | %s |\n", $1, s[$1], $2, r}' "$a" "$b"
}

# ---- drain: bench.sh's drain_once, defined further down in bench.sh ------------------------------
eval "$(sed -n '/^drain_once() {/,/^}/p' scripts/bench.sh)"
declare -F drain_once >/dev/null || die "drain_once not found in scripts/bench.sh"
svt_drain() { # NAME REP
  use_server "$1"
  say "drain: $SVT_DRAIN due, 3 replicas, $1 server (run $2/$SVT_DRAIN_REPS)"
  # snapshot after drain_once's load and checkpoint: it calls pgss_reset just before starting
  SVT_SNAP_AT_RESET=$WORK/snap-drain-$1-$2-a
  drain_once "$SVT_DRAIN" 3
  SVT_SNAP_AT_RESET=""
  svt_snap "$WORK/snap-drain-$1-$2-b"
  svt_delta "$WORK/snap-drain-$1-$2-a" "$WORK/snap-drain-$1-$2-b" "drain-$1-$2"
  SVT_DRAIN_RATE[$1]+="$(fmt "$D_RATE") "
  SVT_DRAIN_WAL[$1]+="$(fmt "$D_WAL") "
  note "drain ($1 server, run $2): $D_NOTE"
}
pgss_reset() {
  [ $PGSS = on ] && sqlpg "select pg_stat_statements_reset()" >/dev/null || true
  if [ -n "${SVT_SNAP_AT_RESET:-}" ]; then "${PSQL[@]}" -d postgres -c "$SVT_SNAP_SQL" >"$SVT_SNAP_AT_RESET"; fi
}
declare -A SVT_DRAIN_RATE=() SVT_DRAIN_WAL=()

# ---- lag: 200 every-second triggers ----------------------------------------------------------------
declare -A SVT_LAG_P99=() SVT_LAG_TXT=()
svt_lag() { # NAME
  local ts te w0 w1 stats expected lag_n p50 p99 lmax dups
  use_server "$1"
  say "lag: $SVT_LAG_N every-second triggers, 3 replicas (default config), ${SVT_LAG_S} s window, $1 server"
  reset_db; load "$SVT_LAG_N" second lead_ms=3000; checkpoint
  svt_snap "$WORK/snap-lag-$1-a"
  ts=$(now_ms)
  start_replicas 3 64 30s
  sleep $(( SVT_LAG_S + STEADY_WARM + 3 ))
  te=$(now_ms)
  w0=$(( ts + STEADY_WARM * 1000 )); w1=$(( te - 3000 ))
  stats=$(lag_stats "$w0" "$w1")
  expected=$(sql "select count(*) * (floor($w1 / 1000.0) - ceil($w0 / 1000.0) + 1)::bigint from qlsched.triggers")
  stop_replicas
  svt_snap "$WORK/snap-lag-$1-b"; svt_delta "$WORK/snap-lag-$1-a" "$WORK/snap-lag-$1-b" "lag-$1"
  dups=$(sql "select count(*) from (select 1 from qlsched.runs group by trigger_id, scheduled_for_ms having count(*) > 1) d")
  IFS='|' read -r lag_n p50 p99 lmax <<<"$stats"
  SVT_LAG_P99[$1]=$p99
  SVT_LAG_OK[$1]=$([ "$lag_n" -ge "$expected" ] && [ "$dups" = 0 ] && echo 1 || echo 0)
  SVT_LAG_TXT[$1]="p50 $(fmt "$p50") ms, p99 $(fmt "$p99") ms, max $(fmt "$lmax") ms; admitted $lag_n / $expected due in the $(( (w1 - w0) / 1000 )) s window, duplicates $dups"
  say "   $1: ${SVT_LAG_TXT[$1]}"
}
declare -A SVT_LAG_OK=()

# ---- herd: N every-minute triggers published through the CLI path --------------------------------
declare -A SVT_HERD_MS=() SVT_HERD_TXT=() SVT_HERD_OK=()
# svt_next_boundary: the first minute boundary at least SVT_LEAD ms from now
svt_next_boundary() { echo $(( ($(now_ms) + SVT_LEAD) / 60000 * 60000 + 60000 )); }
svt_herd() { # NAME
  local t_pub pub_s first b boundary deadline n t ms="" detail="" dups ok=1
  use_server "$1"
  say "herd: $SVT_N every-minute triggers published through the CLI path, 3 replicas (default config), $SVT_B boundaries, $1 server"
  reset_db; t_pub=$(now_ms)
  bench/publish_cli.sh "$QL" "$BIN" "$PORT" qlsched qlsched "$SVT_N" 0 1 0 4
  pub_s=$(calc "($(now_ms) - $t_pub) / 1000"); checkpoint
  SVT_PUB_RATE[$1]=$(calc "$SVT_N / ($pub_s > 0 ? $pub_s : 1)")
  start_replicas 3 64 30s
  wait_ready
  first=$(svt_next_boundary)
  while [ "$(now_ms)" -lt $((first - 3000)) ]; do sleep 0.2; done
  svt_snap "$WORK/snap-herd-$1-a"
  for b in $(seq 0 $((SVT_B - 1))); do
    boundary=$((first + b * 60000))
    n=$(herd_count "$boundary" "$SVT_N")
    t=$(sql "select coalesce(max(queued_at_ms) - $boundary, 999999) from qlsched.runs where scheduled_for_ms = $boundary")
    [ "$n" -ge "$SVT_N" ] || { ok=0; svt_herd_diag "$1" "$boundary"; }
    ms+="$t "; detail+="$t ms ($n runs); "
    say "   $1 boundary $((b + 1)): $n/$SVT_N runs, last committed $t ms after the boundary"
  done
  stop_replicas
  svt_snap "$WORK/snap-herd-$1-b"; svt_delta "$WORK/snap-herd-$1-a" "$WORK/snap-herd-$1-b" "herd-$1"
  dups=$(sql "select count(*) from (select 1 from qlsched.runs group by trigger_id, scheduled_for_ms having count(*) > 1) d")
  [ "$dups" = 0 ] || ok=0
  SVT_HERD_MS[$1]=$ms; SVT_HERD_OK[$1]=$ok
  SVT_HERD_TXT[$1]="${detail}duplicates $dups; published in $(fmt "$pub_s") s ($(fmt "${SVT_PUB_RATE[$1]}") triggers/s)"
}
declare -A SVT_PUB_RATE=()
# svt_herd_diag NAME BOUNDARY: what the database and the replicas looked like when a boundary
# was not complete after 60 s (into the evidence)
svt_herd_diag() {
  local i alive="" logs=""
  for i in "${!RPIDS[@]}"; do
    alive+="r$((i + 1)) $(kill -0 "${RPIDS[$i]}" 2>/dev/null && echo running || echo EXITED); "
    logs+=$'\n'"r$((i + 1)).log (last 8 lines):"$'\n'"$(tail -8 "$WORK/r$((i + 1)).log" | cut -c1-400 | sed 's/^/    /')"
  done
  note "INCOMPLETE herd boundary $2 on the $1 server: replicas $alive
schedules (count, min/max next_fire_at_ms, min claimable_at_ms, claimed): $(sql "select count(*), min(next_fire_at_ms), max(next_fire_at_ms), min(claimable_at_ms), count(claim_owner) from qlsched.trigger_schedules")
runs by scheduled_for_ms: $(sql "select string_agg(scheduled_for_ms || ': ' || n, ', ') from (select scheduled_for_ms, count(*) n from qlsched.runs group by 1 order by 1) x")
replica rows: $(sql "select string_agg(replica_id || ' hb ' || heartbeat_at_ms, ', ') from qlsched.replicas" 2>&1 | head -3)
runtime sessions on this server (state, wait event): $(sqlpg "select count(*) || ' ' || coalesce(string_agg(distinct state || '/' || coalesce(wait_event, '-'), ', '), '') from pg_stat_activity where usename = 'qlsched_runtime'")
replica config DSNs: $(grep -h '^dsn' "$WORK"/r[123].toml | sort | uniq -c | tr '\n' ' ')
$logs"
}

# ---- graphile-worker 0.18 ------------------------------------------------------------------------
declare -A SVT_G_MS=() SVT_G_TXT=() SVT_G_OK=()
svt_graphile_install() {
  command -v node >/dev/null && command -v npm >/dev/null || die "node and npm are needed for the graphile-worker comparison"
  if [ ! -f "$GDIR/node_modules/graphile-worker/package.json" ]; then
    say "installing graphile-worker@0.18 with npm into $GDIR"
    mkdir -p "$GDIR"; [ -f "$GDIR/package.json" ] || echo '{"name":"qlsched-graphile-bench","private":true}' >"$GDIR/package.json"
    (cd "$GDIR" && npm install --no-audit --no-fund --loglevel=error graphile-worker@0.18 >&2)
  fi
  SVT_G_VERSION=$(node -p "require('$GDIR/node_modules/graphile-worker/package.json').version")
}
svt_graphile() { # NAME
  local conn log first b boundary deadline n t tmin tmax ms="" detail="" ok=1 i left executed
  use_server "$1"
  say "graphile-worker $SVT_G_VERSION: $SVT_N every-minute crontab entries, 3 workers, $SVT_B boundaries, $1 server"
  PGOPTIONS="-c client_min_messages=warning" sqlpg "DROP DATABASE IF EXISTS graphile" >/dev/null; sqlpg "CREATE DATABASE graphile" >/dev/null
  conn="postgres://postgres@127.0.0.1:$PORT/graphile"
  QLSCHED_GRAPHILE_DIR=$GDIR node bench/graphile/driver.cjs migrate "$conn" >"$WORK/graphile-$1-migrate.log" 2>&1 \
    || { cat "$WORK/graphile-$1-migrate.log" >&2; die "graphile-worker migrations failed"; }
  GPIDS=()
  for i in 1 2 3; do
    QLSCHED_GRAPHILE_DIR=$GDIR node bench/graphile/driver.cjs run "$conn" "$SVT_N" "g$i" >"$WORK/graphile-$1-$i.log" 2>"$WORK/graphile-$1-$i.err" &
    GPIDS+=($!)
  done
  deadline=$(( $(now_ms) + 120000 ))
  for i in 1 2 3; do
    until grep -q '"ev":"ready"' "$WORK/graphile-$1-$i.log"; do
      kill -0 "${GPIDS[$((i - 1))]}" 2>/dev/null || { tail -20 "$WORK/graphile-$1-$i.err" >&2; die "graphile worker $i exited"; }
      [ "$(now_ms)" -lt $deadline ] || die "graphile worker $i not ready after 120 s"
      sleep 0.2
    done
  done
  first=$(svt_next_boundary)
  while [ "$(now_ms)" -lt $((first - 3000)) ]; do sleep 0.2; done
  svt_snap "$WORK/snap-graphile-$1-a"
  for b in $(seq 0 $((SVT_B - 1))); do
    boundary=$((first + b * 60000)); deadline=$((boundary + 60000))
    while :; do
      n=$(sqld graphile "select count(*) from graphile_worker._private_known_crontabs where last_execution = to_timestamp($boundary / 1000.0)")
      [ "$n" -ge "$SVT_N" ] && break
      [ "$(now_ms)" -lt $deadline ] || break
      sleep 0.2
    done
    t=$(( $(now_ms) - boundary ))   # the poll's own bound
    sleep 0.3
    read -r tmin tmax < <(cat "$WORK"/graphile-"$1"-[123].log | grep '"ev":"scheduled"' | grep "\"ts\":$boundary," \
      | sed -E 's/.*"at":([0-9]+).*/\1/' | awk -v b="$boundary" 'NR == 1 {mn = $1; mx = $1} {if ($1 < mn) mn = $1; if ($1 > mx) mx = $1} END {if (NR) print mn - b, mx - b; else print "", ""}')
    [ "$n" -ge "$SVT_N" ] && [ -n "$tmin" ] || ok=0
    ms+="${tmin:-$t} "
    detail+="${tmin:-?} ms (all 3 instances' cron statements done by ${tmax:-?} ms; poll saw $n/$SVT_N by $t ms); "
    say "   graphile $1 boundary $((b + 1)): $n/$SVT_N jobs, first cron statement returned ${tmin:-?} ms, last ${tmax:-?} ms after the boundary (poll: $t ms)"
  done
  # let the workers run the jobs, then stop them
  deadline=$(( $(now_ms) + 60000 ))
  until [ "$(sqld graphile "select count(*) from graphile_worker._private_jobs")" = 0 ] || [ "$(now_ms)" -ge $deadline ]; do sleep 0.5; done
  left=$(sqld graphile "select count(*) from graphile_worker._private_jobs")
  for i in "${GPIDS[@]}"; do kill -TERM "$i" 2>/dev/null || true; done
  for i in "${GPIDS[@]}"; do
    local w=0; while kill -0 "$i" 2>/dev/null && [ $w -lt 50 ]; do sleep 0.2; w=$((w + 1)); done
    kill -KILL "$i" 2>/dev/null || true; wait "$i" 2>/dev/null || true
  done
  GPIDS=()
  executed=$(for i in 1 2 3; do grep '"ev":"executed"' "$WORK/graphile-$1-$i.log" | tail -1 | sed -E 's/.*"n":([0-9]+).*/\1/'; done | awk '{s += $1} END {print s + 0}')
  svt_snap "$WORK/snap-graphile-$1-b"; svt_delta "$WORK/snap-graphile-$1-a" "$WORK/snap-graphile-$1-b" "graphile-$1"
  SVT_G_MS[$1]=$ms; SVT_G_OK[$1]=$ok
  SVT_G_TXT[$1]="${detail}no-op jobs run by the workers $executed (all boundaries since start), left in the queue $left"
}
sqld() { "${PSQL[@]}" -d "$1" -c "$2"; }

# ---- the run: stock and tuned alternate row by row ------------------------------------------------
SVT_ROWS=" ${QLSCHED_SVT_ROWS:-drain lag herd graphile} "
if [[ $SVT_ROWS == *" drain "* ]]; then
  for rep in $(seq 1 "$SVT_DRAIN_REPS"); do
    if [ $((rep % 2)) = 1 ]; then order="stock tuned"; else order="tuned stock"; fi
    for s in $order; do svt_drain "$s" "$rep"; done
  done
fi
if [[ $SVT_ROWS == *" lag "* ]]; then for s in stock tuned; do svt_lag "$s"; done; fi
if [[ $SVT_ROWS == *" graphile "* ]]; then svt_graphile_install; fi
for s in tuned stock; do
  if [[ $SVT_ROWS == *" herd "* ]]; then svt_herd "$s"; fi
  if [[ $SVT_ROWS == *" graphile "* ]]; then case " $SVT_G_SERVERS " in *" $s "*) svt_graphile "$s" ;; esac; fi
done

# ---- results ---------------------------------------------------------------------------------------
svt_max() { printf '%s\n' $1 | sort -n | tail -1; }
for s in stock tuned; do
  [ -n "${SVT_DRAIN_RATE[$s]:-}" ] || continue
  row "S" "drain $SVT_DRAIN due, 3 replicas, $s server (bench.sh's drain_once; $SVT_DRAIN_REPS run(s), alternating servers)" \
      "$(echo ${SVT_DRAIN_RATE[$s]} | sed 's/ /, /g') occ/s; WAL $(echo ${SVT_DRAIN_WAL[$s]} | sed 's/ /, /g') B per occurrence" "reference" "—"
done
for s in stock tuned; do
  [ -n "${SVT_HERD_MS[$s]:-}" ] || continue
  hmax=$(svt_max "${SVT_HERD_MS[$s]}")
  row "S" "herd $SVT_N every-minute triggers published through the CLI path, 3 replicas, default config, $s server, $SVT_B boundaries" \
      "${SVT_HERD_TXT[$s]}" "≤ 1000 ms at every boundary" "$(verdict "$hmax <= 1000 && ${SVT_HERD_OK[$s]} == 1")"
done
for s in stock tuned; do
  [ -n "${SVT_G_MS[$s]:-}" ] || continue
  row "S" "graphile-worker $SVT_G_VERSION, $SVT_N every-minute crontab entries, 3 workers, $s server, $SVT_B boundaries" \
      "${SVT_G_TXT[$s]}" "reference" "$([ "${SVT_G_OK[$s]}" = 1 ] && echo "—" || echo "INCOMPLETE")"
  [ -n "${SVT_HERD_MS[$s]:-}" ] || continue
  # per boundary: graphile's time ÷ qlsched's time on the same server (boundary k with boundary k)
  ratios=$(paste -d' ' <(printf '%s\n' ${SVT_G_MS[$s]}) <(printf '%s\n' ${SVT_HERD_MS[$s]}) | awk '{printf "%.2f\n", $1 / ($2 > 0 ? $2 : 1)}')
  rmin=$(printf '%s\n' $ratios | sort -g | head -1)
  row "S" "herd $SVT_N: qlsched vs graphile-worker on the $s server (graphile's time ÷ qlsched's, boundary by boundary)" \
      "$(echo $ratios | sed 's/ /×, /g')× (qlsched $(echo ${SVT_HERD_MS[$s]} | sed 's/ / ms, /g') ms; graphile $(echo ${SVT_G_MS[$s]} | sed 's/ / ms, /g') ms)" \
      "≥ 3× at every boundary" "$(verdict "$rmin >= 3 && ${SVT_HERD_OK[$s]} == 1 && ${SVT_G_OK[$s]} == 1")"
done
for s in stock tuned; do
  [ -n "${SVT_LAG_P99[$s]:-}" ] || continue
  row "S" "lag, $SVT_LAG_N every-second triggers, 3 replicas, default config, $s server" "${SVT_LAG_TXT[$s]}" \
      "p99 ≤ 20 ms" "$(verdict "${SVT_LAG_P99[$s]} <= 20 && ${SVT_LAG_OK[$s]} == 1")"
done
SVT_PROFILE="$(svt_profile "herd ($SVT_B boundaries, from 3 s before the first until the replicas stopped)" herd-stock herd-tuned)
$(svt_profile "drain, run 1" drain-stock-1 drain-tuned-1)
$(if [ "$SVT_DRAIN_REPS" -ge 2 ]; then svt_profile "drain, run 2" drain-stock-2 drain-tuned-2; fi)
$(svt_profile "lag ($SVT_LAG_S s window)" lag-stock lag-tuned)
$(svt_profile "graphile-worker herd ($SVT_B boundaries, incl. its workers running the no-op jobs)" graphile-stock graphile-tuned)"
# graphile on one server only: its profile against qlsched's herd on the same server
for s in stock tuned; do
  if [ -f "$WORK/prof-graphile-$s" ] && [ ! -f "$WORK/prof-graphile-$([ $s = stock ] && echo tuned || echo stock)" ]; then
    SVT_PROFILE+="$(printf '\n**herd on the %s server: qlsched vs graphile-worker** (counter deltas; graphile'"'"'s include its workers running the no-op jobs, qlsched'"'"'s no dispatch)\n\n| counter | qlsched | graphile-worker | qlsched ÷ graphile |\n|---|---|---|---|\n' "$s"; awk -F'|' 'NR == FNR {s[$1] = $2; next} {r = ($2 > 0) ? sprintf("%.2f", s[$1] / $2) : "—"; printf "| %s | %s | %s | %s |\n", $1, s[$1], $2, r}' "$WORK/prof-herd-$s" "$WORK/prof-graphile-$s")"
  fi
done

for s in stock tuned; do   # log_checkpoints is on by default from PostgreSQL 15
  ck=$(grep -E 'checkpoint (starting|complete)' "$WORK/$s/server.log" | sed 's/^/    /' || true)
  note "checkpoints logged by the $s server during the run:"$'\n\n'"${ck:-    (none)}"
done
FINISHED_AT=$(date +%s)
kill "$SAMPLER" 2>/dev/null || true; SAMPLER=""
LOAD_RANGE=$(sort -n "$WORK/loadavg.log" | awk 'NR == 1 {min = $1} {max = $1; s += $1; n++} END {if (n) printf "min %s, mean %.2f, max %s (%d samples)", min, s / n, max, n}')
META="mode **$MODE** · $(date -u +%Y-%m-%dT%H:%MZ) · commit \`$COMMIT$DIRTY\` · nproc $(nproc) · PostgreSQL $SVT_VERSION (two private durable servers) · graphile-worker ${SVT_G_VERSION:-?} on node $(node --version 2>/dev/null) · $((FINISHED_AT - STARTED_AT)) s · 1-min load average during the run: $LOAD_RANGE"
TABLE="| # | measurement | measured | target | verdict |
|---|---|---|---|---|"
for r in "${ROWS[@]}"; do TABLE+=$'\n'"| ${r//|/ | } |"; done
OUT="# qlsched benchmark, stock vs tuned PostgreSQL and graphile-worker

$META

Server settings (pg_settings):

$SVT_SETTINGS
$TABLE

## Profile: stock vs tuned
$SVT_PROFILE

## Evidence

$(for a in "${APPENDIX[@]}"; do printf '%s\n\n' "$a"; done)"
echo
echo "$OUT"
if [ $SVT_SMOKE = 0 ]; then
  mkdir -p bench/results
  RESULT=bench/results/$(date -u +%Y-%m-%dT%H%MZ)-$COMMIT$DIRTY-stock-vs-tuned.md
  echo "$OUT" >"$RESULT"
  echo "results kept in $RESULT"
fi
exit 0
