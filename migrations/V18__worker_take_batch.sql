-- qlsched: expand
-- A take of `qlsched worker` that reads only the runs it takes (issue 34; docs/worker.md,
-- "Which runs a worker takes"; docs/benchmark.md, row W1).
--
-- dispatch_take_executable (V17) decides per candidate run whether it belongs to the
-- caller: it joins the run's execution revision and parses its spec twice (spec_pool and
-- spec_executor, plpgsql with an EXCEPTION block: a subtransaction each), and checks the
-- spec's digest of every candidate. Behind a queued backlog that is most of the statement.
--
-- 1. An execution revision carries its spec's pool and executor as stored generated columns
--    (computed once, at publish; older binaries' inserts get them too). A generated column
--    is evaluated as the inserting role: `db migrate` grants EXECUTE on spec_pool and
--    spec_executor to the admin role, the one that publishes (src/schema/grants.rs).
-- 2. A run carries them as well, copied by the admission from the revision it pins (nullable:
--    NULL on the runs an older binary admitted, and on the runs queued before this migration).
--    runs_take_idx (pool, queued_at_ms), partial on queued runs that name an executor, is the
--    new take's order per pool; runs_queued_legacy_idx (queued_at_ms), partial on queued runs
--    without the copy, is its fallback for those. Both are built CONCURRENTLY after this
--    transaction (src/schema/apply.rs CONCURRENT_INDEXES).
-- 3. dispatch_take_batch: dispatch_take_executable's contract (same arguments, same rows),
--    reading each pool's oldest runs through runs_take_idx and the runs without the copy
--    through runs_queued_legacy_idx (the revision's generated columns decide those), the
--    digest checked once per distinct revision of the runs taken. EXECUTE to the dispatcher
--    role only (src/schema/grants.rs EXECUTE_GRANTS). dispatch_take_executable stays as it is
--    for workers of the previous release.
--
-- Expand: nullable columns, two generated columns on a definition table, indexes and a
-- function; nothing an older binary writes is refused. Adding a stored generated column
-- rewrites qlsched.execution_revisions under its ACCESS EXCLUSIVE lock: one row per task
-- publish, each spec parsed once; admissions wait for it (they read the table), claims do not.

-- The tables this migration changes, in the lock order (src/schema/lint.rs LOCK_ORDER): each
-- ADD COLUMN takes ACCESS EXCLUSIVE; qlsched.runs only for a catalog change (no scan, no
-- rewrite).
LOCK TABLE qlsched.execution_revisions IN ACCESS EXCLUSIVE MODE;
LOCK TABLE qlsched.runs IN ACCESS EXCLUSIVE MODE;

ALTER TABLE qlsched.execution_revisions
    -- The spec's "pool" ('default' when absent or not JSON): qlsched.spec_pool.
    ADD COLUMN pool text GENERATED ALWAYS AS (qlsched.spec_pool(spec)) STORED,
    -- The spec's "executor" (NULL when absent or not JSON): qlsched.spec_executor.
    ADD COLUMN executor text GENERATED ALWAYS AS (qlsched.spec_executor(spec)) STORED;

ALTER TABLE qlsched.runs
    -- The pinned revision's pool and executor, copied at admission; NULL when an older binary
    -- admitted the run (the pool of a revision is never NULL).
    ADD COLUMN pool text,
    ADD COLUMN executor text;

-- dispatch_take_executable (V17) through runs_take_idx: up to max_runs queued runs of
-- `pools` (never NULL) whose spec names one of `executors`, oldest queued_at_ms first across
-- the pools (ties in any order), each under a lease of lease_ms from the database clock.
-- Each pool's oldest candidates are locked FOR UPDATE SKIP LOCKED in its own index range,
-- and so are the oldest runs queued without the copied columns (runs_queued_legacy_idx);
-- with several pools, candidates beyond the max_runs oldest stay locked, untaken, until the
-- caller's transaction ends. A run whose pinned revision fails its digest is failed here,
-- never handed out (the digest is computed once per revision among the candidates).
CREATE FUNCTION qlsched.dispatch_take_batch(worker_id text, pools text[], executors text[],
                                            max_runs integer, lease_ms bigint)
RETURNS TABLE (run_id uuid, attempt_id uuid, attempt_no integer, lease_token uuid,
               lease_expires_at_ms bigint, trigger_id text, scheduled_for_ms bigint,
               queued_at_ms bigint, idempotency_key text, spec text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned for each call's max_runs: a generic plan, estimating LIMIT $n at a tenth of the
-- table, chose scans of the whole backlog.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    good uuid[];
    bad uuid[];
BEGIN
    IF worker_id IS NULL OR length(worker_id) NOT BETWEEN 1 AND 200
       OR pools IS NULL OR cardinality(pools) NOT BETWEEN 1 AND 32 OR array_position(pools, NULL) IS NOT NULL
       OR executors IS NULL OR cardinality(executors) NOT BETWEEN 1 AND 16
       OR max_runs IS NULL OR max_runs NOT BETWEEN 1 AND 1000
       OR lease_ms IS NULL OR lease_ms NOT BETWEEN 1000 AND 86400000 THEN
        RAISE EXCEPTION 'dispatch_take_batch: worker_id 1..200 characters, pools 1..32 (no NULL), executors 1..16, max_runs 1..1000, lease_ms 1000..86400000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH copied AS MATERIALIZED (
        SELECT t.run_id, t.queued_at_ms, t.execution_revision_id
          FROM (SELECT DISTINCT p FROM unnest(pools) p) ps
         CROSS JOIN LATERAL (
               SELECT r.run_id, r.queued_at_ms, r.execution_revision_id
                 FROM qlsched.runs r
                WHERE r.pool = ps.p AND r.status = 'queued' AND r.executor IS NOT NULL
                  AND NOT r.cancelled AND r.executor = ANY (executors)
                  AND EXISTS (SELECT 1 FROM qlsched.attempts a
                               WHERE a.run_id = r.run_id AND a.state = 'claimed'
                                 AND num_nonnulls(a.worker_id, a.session_id, a.lease_id,
                                                  a.lease_expires_at_ms, a.offer_id,
                                                  a.callback_token, a.started_at_ms,
                                                  a.finished_at_ms, a.result, a.error) = 0
                                 AND (a.not_before_ms IS NULL OR a.not_before_ms <= now_ms)
                               -- A probe per run in index order, never a semi-join that reads
                               -- every claimed attempt first (OFFSET 0 keeps it a subplan).
                               OFFSET 0)
                ORDER BY r.queued_at_ms
                LIMIT max_runs
                FOR UPDATE OF r SKIP LOCKED) t),
    legacy AS MATERIALIZED (
        SELECT r.run_id, r.queued_at_ms, r.execution_revision_id
          FROM qlsched.runs r
         WHERE r.status = 'queued' AND r.pool IS NULL AND NOT r.cancelled
           -- The revisions of the pools and executors asked for: read once (an InitPlan),
           -- then a cheap filter per run, before the attempt's probe.
           AND r.execution_revision_id = ANY (ARRAY(
                   SELECT e.execution_revision_id FROM qlsched.execution_revisions e
                    WHERE e.pool = ANY (pools) AND e.executor = ANY (executors)))
           AND EXISTS (SELECT 1 FROM qlsched.attempts a
                        WHERE a.run_id = r.run_id AND a.state = 'claimed'
                          AND num_nonnulls(a.worker_id, a.session_id, a.lease_id,
                                           a.lease_expires_at_ms, a.offer_id,
                                           a.callback_token, a.started_at_ms,
                                           a.finished_at_ms, a.result, a.error) = 0
                          AND (a.not_before_ms IS NULL OR a.not_before_ms <= now_ms)
                        OFFSET 0)
         ORDER BY r.queued_at_ms
         LIMIT max_runs
         FOR UPDATE OF r SKIP LOCKED),
    cand AS MATERIALIZED (
        SELECT c.run_id, c.queued_at_ms, c.execution_revision_id
          FROM (SELECT * FROM copied UNION ALL SELECT * FROM legacy) c
         ORDER BY c.queued_at_ms
         LIMIT max_runs),
    rev AS MATERIALIZED (
        SELECT e.execution_revision_id,
               e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex') AS intact
          FROM qlsched.execution_revisions e
         WHERE e.execution_revision_id IN (SELECT cand.execution_revision_id FROM cand))
    SELECT array_agg(cand.run_id) FILTER (WHERE rev.intact),
           array_agg(cand.run_id) FILTER (WHERE NOT rev.intact)
      INTO good, bad
      FROM cand JOIN rev ON rev.execution_revision_id = cand.execution_revision_id;
    IF bad IS NOT NULL THEN
        UPDATE qlsched.runs r SET status = 'failed' WHERE r.run_id = ANY (bad);
        UPDATE qlsched.attempts a
           SET state = 'failed', finished_at_ms = now_ms,
               error = 'the execution revision this run pins fails its digest: not executed'
         WHERE a.run_id = ANY (bad) AND a.state = 'claimed';
        INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
        SELECT b, 3, 'run.finished', now_ms FROM unnest(bad) b;
    END IF;
    IF good IS NULL THEN
        RETURN;
    END IF;
    UPDATE qlsched.runs r SET status = 'dispatching' WHERE r.run_id = ANY (good);
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT g, 3, 'run.dispatching', now_ms FROM unnest(good) g;
    RETURN QUERY
    WITH att AS (
        UPDATE qlsched.attempts a
           SET state = 'dispatching', worker_id = dispatch_take_batch.worker_id,
               lease_id = gen_random_uuid()::text, lease_expires_at_ms = now_ms + lease_ms
         WHERE a.run_id = ANY (good) AND a.state = 'claimed'
        RETURNING a.run_id, a.attempt_id, a.attempt_no, a.lease_id, a.lease_expires_at_ms)
    SELECT att.run_id, att.attempt_id, att.attempt_no, att.lease_id::uuid, att.lease_expires_at_ms,
           r.trigger_id, r.scheduled_for_ms, r.queued_at_ms, r.idempotency_key, e.spec
      FROM att
      JOIN qlsched.runs r ON r.run_id = att.run_id
      JOIN qlsched.execution_revisions e ON e.execution_revision_id = r.execution_revision_id
     ORDER BY r.queued_at_ms;
END
$$;

REVOKE ALL ON FUNCTION qlsched.dispatch_take_batch(text, text[], text[], integer, bigint) FROM PUBLIC;
