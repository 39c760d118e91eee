-- qlsched: expand
-- A take that starts what it takes, and finishes in batches (issue 34 item 8, row W1;
-- docs/dispatcher.md, docs/worker.md "Attempts, leases and stopping").
--
-- Before this, `qlsched worker` made three calls per run: a take (V18, per batch), then
-- dispatch_start and dispatch_finish (V16) once per run, each locking its run, re-reading
-- its attempt and writing a run row version, an attempt row version and an event, every one
-- a non-HOT update (status and state are in the tables' indexes and index predicates).
--
-- 1. dispatch_take_start: dispatch_take_batch's selection and arguments, and each run taken
--    is started in the same transaction: run `running`, attempt `running` with started_at_ms
--    and worker, lease token and expiry (lease_ms from the database clock read at the
--    take's start, before its rows were chosen: never later than a start would have set
--    it), event run.started. One row version of run and attempt and one event per run
--    instead of two of each: a run so taken never is `dispatching` and has no
--    run.dispatching event (created, queued, started, finished).
-- 2. dispatch_finish_batch: dispatch_finish for up to 1000 attempts in one transaction.
--    The runs are locked FOR UPDATE in run_id order (every batch in the same order), then
--    each attempt is read again and judged alone, as dispatch_held does: held (this token,
--    an outcome its state allows, lease not ended by the database clock read after the
--    locks) is recorded, anything else is answered `recorded = false` and not written; one
--    refusal never fails the others.
-- 3. The two state machines allow the owner (the functions) the steps queued -> running
--    (run) and claimed -> running (attempt) that the folded take makes; every other role's
--    steps are unchanged.
--
-- Expand: two new functions and two trigger functions replaced with a superset for the
-- owner; no table changes, no lock beyond the catalog's. Older workers keep calling
-- dispatch_take_batch, dispatch_start and dispatch_finish, which are unchanged.

CREATE OR REPLACE FUNCTION qlsched.run_status_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    step text := OLD.status || '>' || NEW.status;
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       AND step NOT IN ('queued>dispatching', 'queued>cancelled',
           'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed')
       AND NOT (step IN ('dispatching>queued', 'running>queued', 'queued>failed', 'queued>running')
                AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER')) THEN
        RAISE EXCEPTION 'run % may not move from % to %', OLD.run_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.cancelled IS DISTINCT FROM (NEW.status = 'cancelled') THEN
        RAISE EXCEPTION 'run %: cancelled is set together with status cancelled, and only then',
            OLD.run_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION qlsched.attempt_state_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    step text := OLD.state || '>' || NEW.state;
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state
       AND step NOT IN ('claimed>dispatching', 'claimed>abandoned',
           'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed')
       AND NOT (step IN ('dispatching>claimed', 'claimed>failed', 'claimed>running')
                AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER')) THEN
        RAISE EXCEPTION 'attempt % may not move from % to %', OLD.attempt_id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

-- dispatch_take_batch (V18) whose runs come back started: the same arguments, selection,
-- order and rows; run and attempt are `running`, the attempt's started_at_ms is the take's
-- instant and its lease ends lease_ms after it (database clock). The caller executes at once
-- and heartbeats, then finishes (dispatch_finish or dispatch_finish_batch); there is nothing
-- to release (a worker that stops drains what it took).
CREATE FUNCTION qlsched.dispatch_take_start(worker_id text, pools text[], executors text[],
                                            max_runs integer, lease_ms bigint)
RETURNS TABLE (run_id uuid, attempt_id uuid, attempt_no integer, lease_token uuid,
               lease_expires_at_ms bigint, trigger_id text, scheduled_for_ms bigint,
               queued_at_ms bigint, idempotency_key text, spec text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned for each call's max_runs (V18: a generic plan scanned the whole backlog).
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
        RAISE EXCEPTION 'dispatch_take_start: worker_id 1..200 characters, pools 1..32 (no NULL), executors 1..16, max_runs 1..1000, lease_ms 1000..86400000'
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
                               OFFSET 0)
                ORDER BY r.queued_at_ms
                LIMIT max_runs
                FOR UPDATE OF r SKIP LOCKED) t),
    legacy AS MATERIALIZED (
        SELECT r.run_id, r.queued_at_ms, r.execution_revision_id
          FROM qlsched.runs r
         WHERE r.status = 'queued' AND r.pool IS NULL AND NOT r.cancelled
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
    UPDATE qlsched.runs r SET status = 'running' WHERE r.run_id = ANY (good);
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT g, 3, 'run.started', now_ms FROM unnest(good) g;
    RETURN QUERY
    WITH att AS (
        UPDATE qlsched.attempts a
           SET state = 'running', worker_id = dispatch_take_start.worker_id,
               lease_id = gen_random_uuid()::text, lease_expires_at_ms = now_ms + lease_ms,
               started_at_ms = now_ms
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

-- dispatch_finish for each element of the arrays (one attempt each, all of the same length
-- 1..1000, no attempt twice): outcome 'succeeded' (only from running) or 'failed', exit
-- status, output tail (its last 2 KiB when over 8 KiB), error (at most 8 KiB), result (at
-- most 64 KiB). Answers, in the order given, whether each was recorded: false (and nothing
-- written for it) when its lease is not held. A bad argument refuses the whole call.
-- Locking: the runs of the given attempts FOR UPDATE, in run_id order (it waits for a call
-- in flight on one of them: an expiry, a heartbeat, a cancel), then each attempt is read
-- again under its run's lock.
CREATE FUNCTION qlsched.dispatch_finish_batch(attempt_ids uuid[], tokens uuid[], outcomes text[],
                                              exit_statuses integer[], output_tails text[],
                                              errors text[], results jsonb[])
RETURNS TABLE (attempt_id uuid, recorded boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    n integer := cardinality(attempt_ids);
    now_ms bigint;
    held uuid[];
    held_runs uuid[];
    held_outcomes text[];
BEGIN
    IF attempt_ids IS NULL OR n NOT BETWEEN 1 AND 1000
       OR cardinality(tokens) IS DISTINCT FROM n OR cardinality(outcomes) IS DISTINCT FROM n
       OR cardinality(exit_statuses) IS DISTINCT FROM n OR cardinality(output_tails) IS DISTINCT FROM n
       OR cardinality(errors) IS DISTINCT FROM n OR cardinality(results) IS DISTINCT FROM n
       OR (SELECT count(DISTINCT x) FROM unnest(attempt_ids) x) <> n
       OR EXISTS (SELECT 1 FROM unnest(outcomes, errors, results) d(o, e, r)
                   WHERE d.o IS NULL OR d.o NOT IN ('succeeded', 'failed')
                      OR octet_length(d.e) > 8192 OR octet_length(d.r::text) > 65536) THEN
        RAISE EXCEPTION 'dispatch_finish_batch: 1..1000 distinct attempts, every array as long, outcome succeeded|failed, error at most 8 KiB, result at most 64 KiB'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM qlsched.runs r
      WHERE r.run_id IN (SELECT a.run_id FROM qlsched.attempts a WHERE a.attempt_id = ANY (attempt_ids))
      ORDER BY r.run_id
      FOR UPDATE OF r;
    -- A new snapshot, after whoever held a lock committed; the clock read after the locks.
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    SELECT array_agg(d.a), array_agg(x.run_id), array_agg(d.o) INTO held, held_runs, held_outcomes
      FROM unnest(attempt_ids, tokens, outcomes) d(a, t, o)
      JOIN qlsched.attempts x ON x.attempt_id = d.a
     WHERE x.lease_id = d.t::text AND x.lease_expires_at_ms > now_ms
       AND x.state = ANY (CASE d.o WHEN 'succeeded' THEN ARRAY['running']
                                   ELSE ARRAY['dispatching', 'running'] END);
    IF held IS NOT NULL THEN
        UPDATE qlsched.runs r SET status = h.o
          FROM unnest(held_runs, held_outcomes) h(run, o)
         WHERE r.run_id = h.run;
        UPDATE qlsched.attempts x
           SET state = d.o, finished_at_ms = now_ms, exit_status = d.s,
               output_tail = CASE WHEN octet_length(d.t) > 8192 THEN right(d.t, 2048) ELSE d.t END,
               error = d.e, result = d.r
          FROM unnest(attempt_ids, outcomes, exit_statuses, output_tails, errors, results) d(a, o, s, t, e, r)
         WHERE x.attempt_id = d.a AND d.a = ANY (held);
        INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
        SELECT h, 3, 'run.finished', now_ms FROM unnest(held_runs) h;
    END IF;
    RETURN QUERY
    SELECT d.a, d.a = ANY (coalesce(held, '{}'::uuid[]))
      FROM unnest(attempt_ids) WITH ORDINALITY d(a, i)
     ORDER BY d.i;
END
$$;

REVOKE ALL ON FUNCTION qlsched.dispatch_take_start(text, text[], text[], integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_finish_batch(uuid[], uuid[], text[], integer[], text[], text[], jsonb[]) FROM PUBLIC;
