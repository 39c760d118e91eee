#!/usr/bin/env bash
# Retention: batched deletes vs time partitions, measured (issue 21 item 2; docs/design.md,
# "Retention"). On one private, durable PostgreSQL (scripts/pg.sh, like scripts/bench.sh;
# autovacuum off so that every VACUUM is one we measure), in one run, the same occurrences
# (a run + its attempt + 2 events each, admitted in batches of 64 per transaction, then
# finished) are removed in three layouts:
#   A  delete     the shipped schema (`qlsched db migrate` with the binary under test),
#                 removed through the real `qlsched.prune_finished` path (batch 1000, one
#                 transaction per batch, under the prune lease), then VACUUM
#   B  partition  runs, attempts and run_events range-partitioned on scheduled_for_ms (the
#                 partition key in every unique key: (run_id, sf), (idempotency_key, sf),
#                 attempts/events carry sf), removed by DROP TABLE of whole partitions after
#                 checking that none of their runs is unfinished. Per-partition unique keys
#                 keep a cron key unique (the key embeds scheduled_for_ms), but NOT a manual
#                 fire's key ql3:manual:v2:<trigger>:<request id>
#   C  partition  B plus what makes every key unique again: an unpartitioned key table
#      + keys     (idempotency_key primary key) that each admission inserts into first
#                 (ON CONFLICT DO NOTHING arbitrates there), removed by DROP of the partitions
#                 plus batched DELETE of the keys (1000 per transaction), then VACUUM
# Measured per layout: admission (µs, WAL bytes, backend CPU per occurrence), removal and
# VACUUM (µs, WAL bytes, backend CPU, total server CPU per removed occurrence), table +
# index size before, after the removal and after VACUUM, and a lookup by run_id (what the
# dispatcher and `runs cancel --run` do; a partitioned table has no global index on it).
#
# usage: bench/retention_choice.sh [--quick]
#   default  200k occurrences per layout in 4 partitions of 50k (+ 20 empty future ones),
#            the oldest 3 removed: about 5 min
#   --quick  40k occurrences: about 1 min (checks the script)
# environment: QLSCHED_BENCH_BIN (qlsched binary; default: cargo build --release),
#   QLSCHED_BENCH_PORT (first port tried, default 55471), QLSCHED_BENCH_KEEP=1 (keep the work dir)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
. scripts/pg.sh

N=200000; MODE=default
case "${1:-}" in
  "") ;;
  --quick) N=40000; MODE=quick ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: bench/retention_choice.sh [--quick]" >&2; exit 2 ;;
esac
P=4; KEEP=1; EMPTY=20; BATCH=64; PRUNE_BATCH=1000; TRIGGERS=1000
PER_P=$((N / P)); REMOVED=$(( PER_P * (P - KEEP) ))
WIDTH_MS=$(( PER_P / TRIGGERS * 1000 ))   # one occurrence per trigger per second

die() { echo "retention_choice: $*" >&2; exit 1; }
say() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
if [ -n "${QLSCHED_BENCH_BIN:-}" ]; then QL=$QLSCHED_BENCH_BIN; else
  say "building (cargo build --release --bin qlsched)"; cargo build --release --quiet --bin qlsched; QL=$ROOT/target/release/qlsched; fi
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo "-dirty" || true)
pg_ensure_installed
BIN=$(pg_find_bindir)
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORT=${QLSCHED_BENCH_PORT:-55471}; while port_busy "$PORT"; do PORT=$((PORT + 1)); done
WORK=$(mktemp -d /tmp/qlsched-choice.XXXXXX); chmod 755 "$WORK"
cleanup() { pg_stop "$WORK" immediate; if [ "${QLSCHED_BENCH_KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

say "private PostgreSQL on 127.0.0.1:$PORT (fsync on, synchronous_commit on, autovacuum off) in $WORK"
pg_start "$WORK" "$PORT" "
shared_buffers = 512MB
max_wal_size = 8GB
min_wal_size = 1GB
checkpoint_timeout = 30min
fsync = on
synchronous_commit = on
full_page_writes = on
autovacuum = off
log_min_messages = warning"
SU="host=127.0.0.1 port=$PORT user=postgres dbname=postgres"
"$QL" db bootstrap --superuser-dsn "$SU" >"$WORK/bootstrap.log" 2>&1 || { cat "$WORK/bootstrap.log" >&2; die "bootstrap failed"; }
"$QL" db migrate --dsn "host=127.0.0.1 port=$PORT user=qlsched_owner dbname=qlsched" >"$WORK/migrate.log" 2>&1 || { cat "$WORK/migrate.log" >&2; die "migrate failed"; }
PSQL=("$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d qlsched)
export PGOPTIONS="-c client_min_messages=warning"
sql() { "${PSQL[@]}" -c "$1"; }
sqlf() { "${PSQL[@]}" -f -; }
PM_PID=$(head -1 "$WORK/data/postmaster.pid")
CLK_TCK=$(getconf CLK_TCK)
# All CPU the server spent: the postmaster, its live children and the children it reaped.
server_ticks() {
  local t c
  t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$PM_PID/stat")
  for c in $(cat "/proc/$PM_PID/task/$PM_PID/children" 2>/dev/null); do
    t=$(( t + $(awk '{print $14 + $15}' "/proc/$c/stat" 2>/dev/null || echo 0) ))
  done
  echo "$t"
}

T0=$(( ($(date +%s) - 86400) / 3600 * 3600 * 1000 ))   # yesterday, on the hour
say "setup: $N occurrences per layout in $P partitions of $PER_P (+ $EMPTY empty), the oldest $((P - KEEP)) removed ($REMOVED occurrences)"
sqlf >/dev/null <<SQL
SET session_replication_role = replica;
INSERT INTO qlsched.projects (project_id, status, created_at_ms, updated_at_ms) VALUES ('bench', 'active', 0, 0);
INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
SELECT '00000000-0000-4000-8000-00000000be4c', 'bench', 'remote_worker', s, encode(sha256(convert_to(s, 'UTF8')), 'hex'), 0
  FROM (VALUES ('{"image":"bench/noop:1","args":[]}')) v(s);
INSERT INTO qlsched.tasks (task_id, project_id, revision, content_digest, execution_revision_id, updated_at_ms)
SELECT 'bench-task', 'bench', 1, encode(sha256(convert_to('task:v1' || E'\\n' || 'bench' || E'\\n' || e.spec_digest, 'UTF8')), 'hex'),
       e.execution_revision_id, 0 FROM qlsched.execution_revisions e;
RESET session_replication_role;
CREATE SCHEMA bench;
CREATE TABLE bench.results (id serial, round int, layout text, phase text, n bigint, ms numeric, wal numeric, fpi numeric, cpu_ticks numeric, server_ticks numeric);
-- Per-session marks: wall clock, WAL position, this backend's CPU (utime + stime).
CREATE FUNCTION bench.my_ticks() RETURNS bigint LANGUAGE sql AS \$\$
  SELECT (f[14])::bigint + (f[15])::bigint
    FROM (SELECT regexp_split_to_array(split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ') AS g) x,
         LATERAL (SELECT array_prepend('', array_prepend('', g)) AS f) y \$\$;
CREATE UNLOGGED TABLE bench.mark (t timestamptz, lsn pg_lsn, fpi bigint, ticks bigint);
CREATE FUNCTION bench.start() RETURNS void LANGUAGE sql AS \$\$
  DELETE FROM bench.mark; INSERT INTO bench.mark SELECT clock_timestamp(), pg_current_wal_lsn(), (SELECT wal_fpi FROM pg_stat_wal), bench.my_ticks() \$\$;
CREATE FUNCTION bench.stop(round int, layout text, phase text, n bigint) RETURNS void LANGUAGE sql AS \$\$
  INSERT INTO bench.results (round, layout, phase, n, ms, wal, fpi, cpu_ticks)
  SELECT round, layout, phase, n, extract(epoch FROM clock_timestamp() - m.t) * 1000, pg_wal_lsn_diff(pg_current_wal_lsn(), m.lsn),
         (SELECT wal_fpi FROM pg_stat_wal) - m.fpi, bench.my_ticks() - m.ticks FROM bench.mark m \$\$;

-- B and C: the same columns, checks and defaults, partitioned on scheduled_for_ms; the
-- partition key is added to attempts and events and to every unique key.
-- (Re)creates a layout empty: A's tables truncated (as a fresh install), B's and C's schemas anew.
CREATE PROCEDURE bench.fresh(layout text) LANGUAGE plpgsql AS \$\$
DECLARE s text := CASE layout WHEN 'B' THEN 'part_b' ELSE 'part_c' END;
BEGIN
  IF layout = 'A' THEN
    SET LOCAL session_replication_role = replica;
    TRUNCATE qlsched.run_events, qlsched.attempts, qlsched.runs;
    UPDATE qlsched.maintenance SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, pruned_through_ms = NULL;
    RETURN;
  END IF;
  EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', s);
  EXECUTE format('CREATE SCHEMA %I', s);
  EXECUTE format('CREATE TABLE %I.runs (LIKE qlsched.runs INCLUDING DEFAULTS INCLUDING CONSTRAINTS, PRIMARY KEY (run_id, scheduled_for_ms), UNIQUE (idempotency_key, scheduled_for_ms)) PARTITION BY RANGE (scheduled_for_ms)', s);
  EXECUTE format('CREATE INDEX ON %I.runs (trigger_id, scheduled_for_ms)', s);
  EXECUTE format('CREATE INDEX ON %I.runs (queued_at_ms)', s);
  EXECUTE format('CREATE INDEX ON %I.runs (status, run_id) WHERE status IN (''queued'', ''dispatching'', ''running'')', s);
  EXECUTE format('CREATE INDEX ON %I.runs (queued_at_ms) WHERE status IN (''succeeded'', ''failed'', ''cancelled'')', s);
  EXECUTE format('CREATE TABLE %I.attempts (LIKE qlsched.attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS, scheduled_for_ms bigint NOT NULL, PRIMARY KEY (attempt_id, scheduled_for_ms), UNIQUE (run_id, attempt_no, scheduled_for_ms)) PARTITION BY RANGE (scheduled_for_ms)', s);
  EXECUTE format('CREATE TABLE %I.run_events (LIKE qlsched.run_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS, scheduled_for_ms bigint NOT NULL, PRIMARY KEY (run_id, seq, scheduled_for_ms)) PARTITION BY RANGE (scheduled_for_ms)', s);
  FOR p IN 0..($P + $EMPTY - 1) LOOP
    EXECUTE format('CREATE TABLE %I.runs_p%s PARTITION OF %I.runs FOR VALUES FROM (%s) TO (%s)', s, p, s, $T0::bigint + p * $WIDTH_MS, $T0::bigint + (p + 1) * $WIDTH_MS);
    EXECUTE format('CREATE TABLE %I.attempts_p%s PARTITION OF %I.attempts FOR VALUES FROM (%s) TO (%s)', s, p, s, $T0::bigint + p * $WIDTH_MS, $T0::bigint + (p + 1) * $WIDTH_MS);
    EXECUTE format('CREATE TABLE %I.run_events_p%s PARTITION OF %I.run_events FOR VALUES FROM (%s) TO (%s)', s, p, s, $T0::bigint + p * $WIDTH_MS, $T0::bigint + (p + 1) * $WIDTH_MS);
  END LOOP;
  IF layout = 'C' THEN
    CREATE TABLE part_c.run_keys (idempotency_key text PRIMARY KEY, scheduled_for_ms bigint NOT NULL);
    CREATE INDEX ON part_c.run_keys (scheduled_for_ms);
  END IF;
END \$\$;
CALL bench.fresh('B'); CALL bench.fresh('C');

-- The admission: one statement per batch, one transaction per batch (like the daemon's,
-- which also re-reads and advances the schedule rows; that part is the same in every layout
-- and left out). Occurrence i: trigger i % $TRIGGERS, scheduled for T0 + (i / $TRIGGERS) s.
CREATE PROCEDURE bench.admit(layout text, n bigint, batch int) LANGUAGE plpgsql AS \$\$
DECLARE lo bigint := 0; q text;
BEGIN
  q := CASE layout
  WHEN 'A' THEN \$q\$
    WITH src AS (SELECT gen_random_uuid() AS run_id, gen_random_uuid() AS attempt_id, 'b' || lpad((i % $TRIGGERS + 1)::text, 7, '0') AS tid,
                        $T0::bigint + (i / $TRIGGERS) * 1000 AS sf FROM generate_series(\$1, \$2) i),
    run AS (INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id,
                                      idempotency_key, status, scheduled_for_ms, queued_at_ms, admitted_by)
            SELECT run_id, 'bench', tid, 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c', 'ql3:cron:v1:' || tid || ':1:' || sf,
                   'queued', sf, sf + 5, 'bench' FROM src
            ON CONFLICT (idempotency_key) DO NOTHING RETURNING run_id, queued_at_ms),
    att AS (INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
            SELECT src.attempt_id, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms FROM src JOIN run USING (run_id)),
    ev AS (INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
           SELECT run.run_id, e.seq, e.kind, run.queued_at_ms FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) e(seq, kind))
    SELECT count(*) FROM run \$q\$
  WHEN 'B' THEN \$q\$
    WITH src AS (SELECT gen_random_uuid() AS run_id, gen_random_uuid() AS attempt_id, 'b' || lpad((i % $TRIGGERS + 1)::text, 7, '0') AS tid,
                        $T0::bigint + (i / $TRIGGERS) * 1000 AS sf FROM generate_series(\$1, \$2) i),
    run AS (INSERT INTO part_b.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id,
                                     idempotency_key, status, scheduled_for_ms, queued_at_ms, admitted_by)
            SELECT run_id, 'bench', tid, 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c', 'ql3:cron:v1:' || tid || ':1:' || sf,
                   'queued', sf, sf + 5, 'bench' FROM src
            ON CONFLICT (idempotency_key, scheduled_for_ms) DO NOTHING RETURNING run_id, queued_at_ms, scheduled_for_ms),
    att AS (INSERT INTO part_b.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms, scheduled_for_ms)
            SELECT src.attempt_id, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms, run.scheduled_for_ms FROM src JOIN run USING (run_id)),
    ev AS (INSERT INTO part_b.run_events (run_id, seq, kind, at_ms, scheduled_for_ms)
           SELECT run.run_id, e.seq, e.kind, run.queued_at_ms, run.scheduled_for_ms FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) e(seq, kind))
    SELECT count(*) FROM run \$q\$
  ELSE \$q\$
    WITH src AS (SELECT gen_random_uuid() AS run_id, gen_random_uuid() AS attempt_id, 'b' || lpad((i % $TRIGGERS + 1)::text, 7, '0') AS tid,
                        $T0::bigint + (i / $TRIGGERS) * 1000 AS sf FROM generate_series(\$1, \$2) i),
    k AS (INSERT INTO part_c.run_keys (idempotency_key, scheduled_for_ms)
          SELECT 'ql3:cron:v1:' || tid || ':1:' || sf, sf FROM src
          ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key),
    run AS (INSERT INTO part_c.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id,
                                     idempotency_key, status, scheduled_for_ms, queued_at_ms, admitted_by)
            SELECT run_id, 'bench', tid, 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c', k.idempotency_key,
                   'queued', sf, sf + 5, 'bench' FROM src JOIN k ON k.idempotency_key = 'ql3:cron:v1:' || tid || ':1:' || sf
            RETURNING run_id, queued_at_ms, scheduled_for_ms),
    att AS (INSERT INTO part_c.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms, scheduled_for_ms)
            SELECT src.attempt_id, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms, run.scheduled_for_ms FROM src JOIN run USING (run_id)),
    ev AS (INSERT INTO part_c.run_events (run_id, seq, kind, at_ms, scheduled_for_ms)
           SELECT run.run_id, e.seq, e.kind, run.queued_at_ms, run.scheduled_for_ms FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) e(seq, kind))
    SELECT count(*) FROM run \$q\$ END;
  WHILE lo < n LOOP
    EXECUTE q USING lo, least(lo + batch, n) - 1;
    COMMIT;
    lo := lo + batch;
  END LOOP;
END \$\$;

-- A's removal: the daemon's path, batch after batch (one transaction each) until short.
CREATE PROCEDURE bench.prune_a(horizon bigint, batch int, tok uuid) LANGUAGE plpgsql AS \$\$
DECLARE got bigint;
BEGIN
  LOOP
    SELECT coalesce(sum(pruned), 0) INTO got FROM qlsched.prune_finished(horizon, batch, 'bench-choice', tok);
    COMMIT;
    EXIT WHEN got < batch;
  END LOOP;
END \$\$;
-- B and C: whole partitions below the horizon go, one transaction per partition, each
-- after checking that it holds no unfinished run (those are never pruned).
CREATE PROCEDURE bench.drop_parts(s text, horizon bigint) LANGUAGE plpgsql AS \$\$
DECLARE p record; unfinished bigint;
BEGIN
  FOR p IN SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS b FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = format('%I.runs', s)::regclass ORDER BY c.relname LOOP
    IF (regexp_match(p.b, 'TO \(''?(-?[0-9]+)'))[1]::bigint <= horizon THEN
      EXECUTE format('SELECT count(*) FROM %I.%I WHERE status IN (''queued'', ''dispatching'', ''running'')', s, p.relname) INTO unfinished;
      IF unfinished = 0 THEN
        EXECUTE format('DROP TABLE %I.%I, %I.%I, %I.%I', s, p.relname, s, replace(p.relname, 'runs_', 'attempts_'), s, replace(p.relname, 'runs_', 'run_events_'));
      END IF;
      COMMIT;
    END IF;
  END LOOP;
END \$\$;
CREATE PROCEDURE bench.delete_keys(horizon bigint, batch int) LANGUAGE plpgsql AS \$\$
DECLARE got bigint;
BEGIN
  LOOP
    DELETE FROM part_c.run_keys WHERE idempotency_key IN
      (SELECT idempotency_key FROM part_c.run_keys WHERE scheduled_for_ms < horizon ORDER BY scheduled_for_ms LIMIT batch);
    GET DIAGNOSTICS got = ROW_COUNT;
    COMMIT;
    EXIT WHEN got < batch;
  END LOOP;
END \$\$;
-- Table + index bytes of a layout (partitions summed).
CREATE FUNCTION bench.size(layout text) RETURNS bigint LANGUAGE sql AS \$\$
  SELECT sum(pg_total_relation_size(r.relid))::bigint FROM (
    SELECT coalesce(p.relid, t::regclass) AS relid FROM unnest(CASE layout WHEN 'A' THEN ARRAY['qlsched.runs', 'qlsched.attempts', 'qlsched.run_events']
                                         WHEN 'B' THEN ARRAY['part_b.runs', 'part_b.attempts', 'part_b.run_events']
                                         ELSE ARRAY['part_c.runs', 'part_c.attempts', 'part_c.run_events', 'part_c.run_keys'] END) t
           LEFT JOIN LATERAL pg_partition_tree(t::regclass) p ON p.isleaf) r \$\$;
SQL

declare -A SIZE=()
children() { tr ' ' '\n' <"/proc/$PM_PID/task/$PM_PID/children" | grep . | sort | tr '\n' ' '; }
# phase LAYOUT PHASE N SQL...: runs SQL in one session between marks; server CPU = the change
# of server_ticks once that session's backend has exited and been reaped.
phase() {
  local layout=$1 ph=$2 n=$3 s0 s1 kids i; shift 3
  kids=$(children); s0=$(server_ticks)
  { echo "SELECT bench.start();"; printf '%s\n' "$@"; echo "SELECT bench.stop($ROUND, '$layout', '$ph', $n);"; } | sqlf >/dev/null
  for i in $(seq 100); do [ "$(children)" = "$kids" ] && break; sleep 0.05; done
  s1=$(server_ticks)
  sql "UPDATE bench.results SET server_ticks = $((s1 - s0)) WHERE id = (SELECT max(id) FROM bench.results)" >/dev/null
}
HORIZON=$(( T0 + (P - KEEP) * WIDTH_MS ))
TOKEN=$(sql "select gen_random_uuid()")
# Two rounds, the second in reverse order, so that a change of machine load hits every layout.
for ROUND in 1 2; do
ORDER="A B C"; [ $ROUND = 2 ] && ORDER="C B A"
for L in $ORDER; do
  case $L in A) S=qlsched ;; B) S=part_b ;; C) S=part_c ;; esac
  sql "CALL bench.fresh('$L')" >/dev/null
  say "round $ROUND, $L: admit $N occurrences in batches of $BATCH (one transaction each)"
  sql "CHECKPOINT" >/dev/null
  phase $L admit "$N" "CALL bench.admit('$L', $N, $BATCH);"
  # Finished the same way in every layout: run succeeded, attempt succeeded (the V10
  # forward-only row triggers are skipped: the step itself is not what is compared).
  say "round $ROUND, $L: finish them, VACUUM ANALYZE, CHECKPOINT"
  sqlf >/dev/null <<SQL
SET session_replication_role = replica;
UPDATE $S.runs SET status = 'succeeded';
UPDATE $S.attempts SET state = 'succeeded', started_at_ms = created_at_ms, finished_at_ms = created_at_ms + 100;
RESET session_replication_role;
VACUUM ANALYZE $S.runs, $S.attempts, $S.run_events;
CHECKPOINT;
SQL
  SIZE[$L:before]=$(sql "select bench.size('$L')")
  # A lookup by run_id (the dispatcher's START/FINISH, runs cancel --run): 2000 ids, 5 rounds.
  sql "DROP TABLE IF EXISTS bench.ids; CREATE TABLE bench.ids AS SELECT run_id FROM $S.runs ORDER BY random() LIMIT 2000" >/dev/null
  phase $L lookup 10000 "DO \$\$ DECLARE id uuid; BEGIN FOR r IN 1..5 LOOP FOR id IN SELECT run_id FROM bench.ids LOOP PERFORM 1 FROM $S.runs WHERE run_id = id; END LOOP; END LOOP; END \$\$;"
  say "round $ROUND, $L: remove the $REMOVED occurrences scheduled before the horizon"
  sql "CHECKPOINT" >/dev/null
  case $L in
    A) sql "UPDATE qlsched.maintenance SET lease_owner = 'bench-choice', lease_token = '$TOKEN', lease_expires_at = clock_timestamp() + interval '1 hour' WHERE task = 'prune'" >/dev/null
       phase A remove "$REMOVED" "CALL bench.prune_a($HORIZON, $PRUNE_BATCH, '$TOKEN');" ;;
    B) phase B remove "$REMOVED" "CALL bench.drop_parts('part_b', $HORIZON);" ;;
    C) phase C remove "$REMOVED" "CALL bench.drop_parts('part_c', $HORIZON);" "CALL bench.delete_keys($HORIZON, $PRUNE_BATCH);" ;;
  esac
  left=$(sql "select count(*) from $S.runs")
  [ "$left" = $((N - REMOVED)) ] || die "$L: $left runs left after the removal, expected $((N - REMOVED))"
  [ "$(sql "select count(*) from $S.attempts")" = $((N - REMOVED)) ] || die "$L: attempts left do not match"
  [ "$(sql "select count(*) from $S.run_events")" = $(( 2 * (N - REMOVED) )) ] || die "$L: events left do not match"
  [ $L != C ] || [ "$(sql "select count(*) from part_c.run_keys")" = $((N - REMOVED)) ] || die "C: keys left do not match"
  SIZE[$L:removed]=$(sql "select bench.size('$L')")
  sql "CHECKPOINT" >/dev/null
  case $L in
    A) phase A vacuum "$REMOVED" "VACUUM qlsched.runs, qlsched.attempts, qlsched.run_events;" ;;
    B) phase B vacuum "$REMOVED" "VACUUM part_b.runs, part_b.attempts, part_b.run_events;" ;;
    C) phase C vacuum "$REMOVED" "VACUUM part_c.runs, part_c.attempts, part_c.run_events, part_c.run_keys;" ;;
  esac
  SIZE[$L:vacuumed]=$(sql "select bench.size('$L')")
done
done

# Exactly-once across partitions: the same manual key admitted at two times lands in two
# partitions of B (both rows commit); in A and C the second is refused.
MK="'ql3:manual:v2:b0000001:req-1'"
dupb=$(sqlf <<SQL
INSERT INTO part_b.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id, idempotency_key, status, scheduled_for_ms, queued_at_ms, admitted_by, request_id)
SELECT gen_random_uuid(), 'bench', 'b0000001', 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c', $MK, 'queued', sf, sf, 'bench', 'req-1'
  FROM (VALUES ($HORIZON + 1), ($HORIZON + $WIDTH_MS + 1)) v(sf)
ON CONFLICT (idempotency_key, scheduled_for_ms) DO NOTHING;
SELECT count(*) FROM part_b.runs WHERE idempotency_key = $MK;
SQL
)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- report ---------------------------------------------------------------------------------
r() { sql "select coalesce(round($2, ${3:-0}), 0) from bench.results where layout = '$1' and phase = '$4'"; }
per() { # LAYOUT PHASE -> "µs | WAL B | backend CPU µs | server CPU µs" per occurrence
  sql "select round(1000 * sum(ms) / sum(n), 1) || ' | ' || round(sum(wal) / sum(n)) || ' | ' || round(1e6 * sum(cpu_ticks) / $CLK_TCK / sum(n), 1) || ' | ' || round(1e6 * sum(server_ticks) / $CLK_TCK / sum(n), 1)
           || ' | ' || string_agg(round(1000 * ms / n, 1)::text, ' / ' order by round)
         from bench.results where layout = '$1' and phase = '$2'"
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
TOTALS=$(sql "select string_agg(layout || '=' || round((sum_ms) * 1000 / n_rm, 1) || '/' || round(sum_wal / n_rm) || '/' || round(1e6 * sum_srv / $CLK_TCK / n_rm, 1), ' ' order by layout)
                from (select layout, sum(ms) sum_ms, sum(wal) sum_wal, sum(server_ticks) sum_srv, sum(n) / 2 n_rm
                        from bench.results where phase in ('remove', 'vacuum') group by layout) x")
OUT=$( {
  echo "commit \`$COMMIT$DIRTY\` · $(date -u +%Y-%m-%dT%H:%MZ) · mode $MODE · PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') · nproc $(nproc) · load average before $LOAD_BEFORE, after $LOAD_AFTER"
  echo
  echo "Two rounds (A B C, then C B A); figures are over both rounds (sizes: round 2). $N occurrences per layout (run + attempt + 2 events), $P partitions of $PER_P holding them + $EMPTY empty ones, $REMOVED removed (the oldest $((P - KEEP)) partitions' worth); admission in batches of $BATCH, one transaction each; removal batch $PRUNE_BATCH."
  echo
  echo "| layout | phase | µs per occurrence | WAL B per occurrence | backend CPU µs per occurrence | server CPU µs per occurrence | µs per occurrence, round 1 / 2 |"
  echo "|---|---|---|---|---|---|---|"
  for L in A B C; do for ph in admit remove vacuum; do echo "| $L | $ph | $(per $L $ph) |"; done; done
  echo
  echo "Removal + VACUUM per removed occurrence (µs wall / WAL B / server CPU µs): $TOTALS"
  echo
  echo "| layout | size before removal | after removal | after VACUUM | lookup by run_id (µs, $P + $EMPTY partitions for B/C) |"
  echo "|---|---|---|---|---|"
  for L in A B C; do
    echo "| $L | $(mib "${SIZE[$L:before]}") MiB | $(mib "${SIZE[$L:removed]}") MiB | $(mib "${SIZE[$L:vacuumed]}") MiB | $(sql "select round(1000 * sum(ms) / sum(n), 1) from bench.results where layout = '$L' and phase = 'lookup'") |"
  done
  echo
  echo "Manual key across partitions: the same key \`ql3:manual:v2:b0000001:req-1\` admitted at two times $WIDTH_MS ms apart in layout B left $dupb rows (1 = unique; B's per-partition key cannot refuse the second)."
  echo
  echo "A = batched deletes through qlsched.prune_finished (shipped schema); B = partitions on scheduled_for_ms, DROP of old partitions; C = B + an unpartitioned key table (every admission inserts its key there first; the keys are removed by batched DELETE)."
} )
echo "$OUT"
if [ "$MODE" != quick ]; then
  mkdir -p bench/results
  RESULT=bench/results/$(date -u +%Y-%m-%dT%H%MZ)-$COMMIT$DIRTY-retention-choice.md
  { echo "# Retention: batched deletes vs partitions (bench/retention_choice.sh)"; echo; echo "$OUT"; echo; echo "Raw phases:"; echo
    "${PSQL[@]}" -c "select layout, phase, n, round, round(ms) ms, wal, fpi, cpu_ticks, server_ticks from bench.results order by layout, phase, round" | sed 's/^/    /'; } >"$RESULT"
  echo "results kept in $RESULT"
fi
