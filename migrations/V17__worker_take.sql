-- qlsched: expand
-- The take of `qlsched worker` (docs/worker.md, "Which runs a worker takes").
--
-- dispatch_take (V16) filters on the pool only, so a worker that executes the spec itself
-- would take runs whose spec names no executor (the runs of external dispatchers) and could
-- only give them back, again and again. dispatch_take_executable is the same take with one
-- more filter, the spec's "executor" among those the caller runs, and answers the run's
-- queued_at_ms as well (the worker's queue-wait histogram). EXECUTE to the dispatcher role
-- only (src/store/migrate.rs EXECUTE_GRANTS), like the other protocol calls.
--
-- Expand: two functions, no table is locked or changed; dispatch_take stays as it is.

-- The executor a task's spec names ("executor"); NULL when the spec is not a JSON object or
-- names none (such runs are never taken by dispatch_take_executable).
CREATE FUNCTION qlsched.spec_executor(spec text) RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN spec::jsonb ->> 'executor';
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

-- dispatch_take (V16) for runs whose pinned spec names one of `executors` (never NULL):
-- up to max_runs queued runs in queued_at_ms order across every replica, from the given
-- pools (NULL: all), each under a lease of lease_ms from the database clock. Runs locked by
-- anyone are skipped (FOR UPDATE SKIP LOCKED); a run whose pinned revision fails its digest
-- is failed here, never handed out. Returns the lease token to pass to every later call.
CREATE FUNCTION qlsched.dispatch_take_executable(worker_id text, pools text[], executors text[],
                                                 max_runs integer, lease_ms bigint)
RETURNS TABLE (run_id uuid, attempt_id uuid, attempt_no integer, lease_token uuid,
               lease_expires_at_ms bigint, trigger_id text, scheduled_for_ms bigint,
               queued_at_ms bigint, idempotency_key text, spec text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    good uuid[];
    bad uuid[];
BEGIN
    IF worker_id IS NULL OR length(worker_id) NOT BETWEEN 1 AND 200
       OR executors IS NULL OR cardinality(executors) NOT BETWEEN 1 AND 16
       OR max_runs IS NULL OR max_runs NOT BETWEEN 1 AND 1000
       OR lease_ms IS NULL OR lease_ms NOT BETWEEN 1000 AND 86400000 THEN
        RAISE EXCEPTION 'dispatch_take_executable: worker_id 1..200 characters, executors 1..16, max_runs 1..1000, lease_ms 1000..86400000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(p.run_id) FILTER (WHERE p.intact), array_agg(p.run_id) FILTER (WHERE NOT p.intact)
      INTO good, bad
      FROM (SELECT r.run_id,
                   e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex') AS intact
              FROM qlsched.runs r
              JOIN qlsched.execution_revisions e ON e.execution_revision_id = r.execution_revision_id
             WHERE r.status = 'queued' AND NOT r.cancelled
               AND (pools IS NULL OR qlsched.spec_pool(e.spec) = ANY (pools))
               AND qlsched.spec_executor(e.spec) = ANY (executors)
               AND EXISTS (SELECT 1 FROM qlsched.attempts a
                            WHERE a.run_id = r.run_id AND a.state = 'claimed'
                              AND num_nonnulls(a.worker_id, a.session_id, a.lease_id,
                                               a.lease_expires_at_ms, a.offer_id,
                                               a.callback_token, a.started_at_ms,
                                               a.finished_at_ms, a.result, a.error) = 0
                              AND (a.not_before_ms IS NULL OR a.not_before_ms <= now_ms))
             ORDER BY r.queued_at_ms
             LIMIT max_runs
             FOR UPDATE OF r SKIP LOCKED) p;
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
           SET state = 'dispatching', worker_id = dispatch_take_executable.worker_id,
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

REVOKE ALL ON FUNCTION qlsched.spec_executor(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_take_executable(text, text[], text[], integer, bigint) FROM PUBLIC;
