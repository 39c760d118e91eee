-- The setup of the retention-choice comparison (examples/bench/retention_choice.rs fills in
-- {P}, {EMPTY}, {T0}, {WIDTH_MS} and {TRIGGERS}): the bench project and task, result marks,
-- layouts B and C (runs, attempts and run_events range-partitioned on scheduled_for_ms; C with
-- an unpartitioned key table), and the procedures that admit, prune, drop partitions and
-- delete keys in each layout. Run as the superuser on a freshly migrated database.
SET session_replication_role = replica;
INSERT INTO qlsched.projects (project_id, status, created_at_ms, updated_at_ms) VALUES ('bench', 'active', 0, 0);
INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
SELECT '00000000-0000-4000-8000-00000000be4c', 'bench', 'remote_worker', s, encode(sha256(convert_to(s, 'UTF8')), 'hex'), 0
  FROM (VALUES ('{"image":"bench/noop:1","args":[]}')) v(s);
INSERT INTO qlsched.tasks (task_id, project_id, revision, content_digest, execution_revision_id, updated_at_ms)
SELECT 'bench-task', 'bench', 1, encode(sha256(convert_to('task:v1' || E'\n' || 'bench' || E'\n' || e.spec_digest, 'UTF8')), 'hex'),
       e.execution_revision_id, 0 FROM qlsched.execution_revisions e;
RESET session_replication_role;
CREATE SCHEMA bench;
CREATE TABLE bench.results (id serial, round int, layout text, phase text, n bigint, ms numeric, wal numeric, fpi numeric, cpu_ticks numeric, server_ticks numeric);
-- Per-session marks: wall clock, WAL position, this backend's CPU (utime + stime).
CREATE FUNCTION bench.my_ticks() RETURNS bigint LANGUAGE sql AS $$
  SELECT (f[14])::bigint + (f[15])::bigint
    FROM (SELECT regexp_split_to_array(split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ') AS g) x,
         LATERAL (SELECT array_prepend('', array_prepend('', g)) AS f) y $$;
CREATE UNLOGGED TABLE bench.mark (t timestamptz, lsn pg_lsn, fpi bigint, ticks bigint);
CREATE FUNCTION bench.start() RETURNS void LANGUAGE sql AS $$
  DELETE FROM bench.mark; INSERT INTO bench.mark SELECT clock_timestamp(), pg_current_wal_lsn(), (SELECT wal_fpi FROM pg_stat_wal), bench.my_ticks() $$;
CREATE FUNCTION bench.stop(round int, layout text, phase text, n bigint) RETURNS void LANGUAGE sql AS $$
  INSERT INTO bench.results (round, layout, phase, n, ms, wal, fpi, cpu_ticks)
  SELECT round, layout, phase, n, extract(epoch FROM clock_timestamp() - m.t) * 1000, pg_wal_lsn_diff(pg_current_wal_lsn(), m.lsn),
         (SELECT wal_fpi FROM pg_stat_wal) - m.fpi, bench.my_ticks() - m.ticks FROM bench.mark m $$;

-- B and C: the same columns, checks and defaults, partitioned on scheduled_for_ms; the
-- partition key is added to attempts and events and to every unique key.
-- (Re)creates a layout empty: A's tables truncated (as a fresh install), B's and C's schemas anew.
CREATE PROCEDURE bench.fresh(layout text) LANGUAGE plpgsql AS $$
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
  FOR p IN 0..({P} + {EMPTY} - 1) LOOP
    EXECUTE format('CREATE TABLE %I.runs_p%s PARTITION OF %I.runs FOR VALUES FROM (%s) TO (%s)', s, p, s, {T0}::bigint + p * {WIDTH_MS}, {T0}::bigint + (p + 1) * {WIDTH_MS});
    EXECUTE format('CREATE TABLE %I.attempts_p%s PARTITION OF %I.attempts FOR VALUES FROM (%s) TO (%s)', s, p, s, {T0}::bigint + p * {WIDTH_MS}, {T0}::bigint + (p + 1) * {WIDTH_MS});
    EXECUTE format('CREATE TABLE %I.run_events_p%s PARTITION OF %I.run_events FOR VALUES FROM (%s) TO (%s)', s, p, s, {T0}::bigint + p * {WIDTH_MS}, {T0}::bigint + (p + 1) * {WIDTH_MS});
  END LOOP;
  IF layout = 'C' THEN
    CREATE TABLE part_c.run_keys (idempotency_key text PRIMARY KEY, scheduled_for_ms bigint NOT NULL);
    CREATE INDEX ON part_c.run_keys (scheduled_for_ms);
  END IF;
END $$;
CALL bench.fresh('B'); CALL bench.fresh('C');

-- The admission: one statement per batch, one transaction per batch (like the daemon's,
-- which also re-reads and advances the schedule rows; that part is the same in every layout
-- and left out). Occurrence i: trigger i % {TRIGGERS}, scheduled for T0 + (i / {TRIGGERS}) s.
CREATE PROCEDURE bench.admit(layout text, n bigint, batch int) LANGUAGE plpgsql AS $$
DECLARE lo bigint := 0; q text;
BEGIN
  q := CASE layout
  WHEN 'A' THEN $q$
    WITH src AS (SELECT gen_random_uuid() AS run_id, gen_random_uuid() AS attempt_id, 'b' || lpad((i % {TRIGGERS} + 1)::text, 7, '0') AS tid,
                        {T0}::bigint + (i / {TRIGGERS}) * 1000 AS sf FROM generate_series($1, $2) i),
    run AS (INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id,
                                      idempotency_key, status, scheduled_for_ms, queued_at_ms, admitted_by)
            SELECT run_id, 'bench', tid, 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c', 'ql3:cron:v1:' || tid || ':1:' || sf,
                   'queued', sf, sf + 5, 'bench' FROM src
            ON CONFLICT (idempotency_key) DO NOTHING RETURNING run_id, queued_at_ms),
    att AS (INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
            SELECT src.attempt_id, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms FROM src JOIN run USING (run_id)),
    ev AS (INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
           SELECT run.run_id, e.seq, e.kind, run.queued_at_ms FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) e(seq, kind))
    SELECT count(*) FROM run $q$
  WHEN 'B' THEN $q$
    WITH src AS (SELECT gen_random_uuid() AS run_id, gen_random_uuid() AS attempt_id, 'b' || lpad((i % {TRIGGERS} + 1)::text, 7, '0') AS tid,
                        {T0}::bigint + (i / {TRIGGERS}) * 1000 AS sf FROM generate_series($1, $2) i),
    run AS (INSERT INTO part_b.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id,
                                     idempotency_key, status, scheduled_for_ms, queued_at_ms, admitted_by)
            SELECT run_id, 'bench', tid, 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c', 'ql3:cron:v1:' || tid || ':1:' || sf,
                   'queued', sf, sf + 5, 'bench' FROM src
            ON CONFLICT (idempotency_key, scheduled_for_ms) DO NOTHING RETURNING run_id, queued_at_ms, scheduled_for_ms),
    att AS (INSERT INTO part_b.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms, scheduled_for_ms)
            SELECT src.attempt_id, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms, run.scheduled_for_ms FROM src JOIN run USING (run_id)),
    ev AS (INSERT INTO part_b.run_events (run_id, seq, kind, at_ms, scheduled_for_ms)
           SELECT run.run_id, e.seq, e.kind, run.queued_at_ms, run.scheduled_for_ms FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) e(seq, kind))
    SELECT count(*) FROM run $q$
  ELSE $q$
    WITH src AS (SELECT gen_random_uuid() AS run_id, gen_random_uuid() AS attempt_id, 'b' || lpad((i % {TRIGGERS} + 1)::text, 7, '0') AS tid,
                        {T0}::bigint + (i / {TRIGGERS}) * 1000 AS sf FROM generate_series($1, $2) i),
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
    SELECT count(*) FROM run $q$ END;
  WHILE lo < n LOOP
    EXECUTE q USING lo, least(lo + batch, n) - 1;
    COMMIT;
    lo := lo + batch;
  END LOOP;
END $$;

-- A's removal: the daemon's path, batch after batch (one transaction each) until short.
CREATE PROCEDURE bench.prune_a(horizon bigint, batch int, tok uuid) LANGUAGE plpgsql AS $$
DECLARE got bigint;
BEGIN
  LOOP
    SELECT coalesce(sum(pruned), 0) INTO got FROM qlsched.prune_finished(horizon, batch, 'bench-choice', tok);
    COMMIT;
    EXIT WHEN got < batch;
  END LOOP;
END $$;
-- B and C: whole partitions below the horizon go, one transaction per partition, each
-- after checking that it holds no unfinished run (those are never pruned).
CREATE PROCEDURE bench.drop_parts(s text, horizon bigint) LANGUAGE plpgsql AS $$
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
END $$;
CREATE PROCEDURE bench.delete_keys(horizon bigint, batch int) LANGUAGE plpgsql AS $$
DECLARE got bigint;
BEGIN
  LOOP
    DELETE FROM part_c.run_keys WHERE idempotency_key IN
      (SELECT idempotency_key FROM part_c.run_keys WHERE scheduled_for_ms < horizon ORDER BY scheduled_for_ms LIMIT batch);
    GET DIAGNOSTICS got = ROW_COUNT;
    COMMIT;
    EXIT WHEN got < batch;
  END LOOP;
END $$;
-- Table + index bytes of a layout (partitions summed).
CREATE FUNCTION bench.size(layout text) RETURNS bigint LANGUAGE sql AS $$
  SELECT sum(pg_total_relation_size(r.relid))::bigint FROM (
    SELECT coalesce(p.relid, t::regclass) AS relid FROM unnest(CASE layout WHEN 'A' THEN ARRAY['qlsched.runs', 'qlsched.attempts', 'qlsched.run_events']
                                         WHEN 'B' THEN ARRAY['part_b.runs', 'part_b.attempts', 'part_b.run_events']
                                         ELSE ARRAY['part_c.runs', 'part_c.attempts', 'part_c.run_events', 'part_c.run_keys'] END) t
           LEFT JOIN LATERAL pg_partition_tree(t::regclass) p ON p.isleaf) r $$;
