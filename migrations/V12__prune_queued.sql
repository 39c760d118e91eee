-- qlsched: expand
-- `qlsched runs prune --queued-before T` (docs/operations.md, "Pruning a queued backlog";
-- issue 21 item 3): an operator removes queued runs nobody will dispatch, each with its
-- attempts and events, through one more narrow path: qlsched.prune_queued, owned by the
-- owner role, SECURITY DEFINER, EXECUTE granted to the admin role only (by `db migrate`,
-- src/store/migrate.rs EXECUTE_GRANTS). No role gains DELETE.
--
-- Functions only: no table is created, altered or indexed, and no table lock is taken
-- (CREATE OR REPLACE FUNCTION locks the function alone; the permanence triggers V7 and V11
-- created keep calling qlsched.refuse_removal by name).

-- V11's removal guard, extended: a DELETE on runs, attempts or run_events passes only from
-- a context frame of its own of prune_finished or prune_queued (a line of PG_CONTEXT
-- starting with it, not text quoted in some statement's frame), with the transaction-local
-- setting qlsched.pruning on. A DO block or any other function setting the GUC is still
-- refused; TRUNCATE always is. The guard keeps mistakes out, not the owner: the owner (or a
-- superuser) may disable the trigger anyway, and a statement whose own text forges a frame
-- line on a line of its own passes the context check too.
CREATE OR REPLACE FUNCTION qlsched.refuse_removal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ctx text;
BEGIN
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME IN ('runs', 'attempts', 'run_events')
       AND current_setting('qlsched.pruning', true) = 'on' THEN
        GET DIAGNOSTICS ctx = PG_CONTEXT;
        IF ctx ~ '(^|\n)PL/pgSQL function qlsched\.(prune_finished\(bigint,integer,text,uuid\)|prune_queued\(bigint,uuid\[\]\)) line [0-9]+ at ' THEN
            RETURN NULL;
        END IF;
    END IF;
    RAISE EXCEPTION 'qlsched.% rows are permanent: admitted runs refer to them', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation',
              HINT = 'disable or delete a trigger with `qlsched trigger disable|delete`; finished runs are removed only by retention ([retention] finished_after), a queued backlog only by `qlsched runs prune`';
END
$$;

-- Removes those of run_ids (at most 10000) that are still queued and untouched, admitted
-- (queued_at_ms) and scheduled before before_ms, with their attempts and events, in the
-- caller's transaction; returns how many. Untouched is `runs cancel`'s (src/store/runs.rs):
-- not cancelled, one attempt, `claimed`, every worker field as admitted. Each run is locked
-- FOR UPDATE SKIP LOCKED, the lock a dispatcher's take asks for: a run a dispatcher holds
-- is skipped, one it took and committed fails the re-check of its status; the rest are
-- left alone (the caller counts them).
--
-- Exactly-once afterwards: a removed run's idempotency key is gone, so before deleting
-- anything the recorded horizon qlsched.maintenance.pruned_through_ms is raised to at least
-- before_ms, and `trigger backfill` refuses every window starting before it. A removed cron
-- run's occurrence is behind its trigger's cursor and never admitted again. A manual fire
-- retried with the same request id after its run was removed is admitted again: that is the
-- operator's matter (docs/operations.md).
CREATE FUNCTION qlsched.prune_queued(before_ms bigint, run_ids uuid[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids uuid[];
BEGIN
    IF before_ms IS NULL OR run_ids IS NULL OR cardinality(run_ids) > 10000 THEN
        RAISE EXCEPTION 'prune_queued: before_ms and run_ids must be given, run_ids at most 10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Each `trigger backfill` chunk takes this lock shared (src/store/runs.rs,
    -- PRUNE_QUEUED_LOCK): a chunk that started first commits before anything is removed
    -- here, and one that starts later waits and then reads the raised horizon, so it never
    -- admits again an occurrence whose run this removes.
    PERFORM pg_advisory_xact_lock(8173034294560948225);
    SELECT array_agg(s.run_id) INTO ids FROM (
        SELECT r.run_id FROM qlsched.runs r
         WHERE r.run_id = ANY (run_ids) AND r.status = 'queued' AND NOT r.cancelled
           AND r.queued_at_ms < before_ms AND r.scheduled_for_ms < before_ms
           AND (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id) = 1
           AND EXISTS (SELECT 1 FROM qlsched.attempts a
                        WHERE a.run_id = r.run_id AND a.attempt_no = 1 AND a.state = 'claimed'
                          AND num_nonnulls(a.worker_id, a.session_id, a.lease_id,
                                           a.lease_expires_at_ms, a.offer_id, a.callback_token,
                                           a.started_at_ms, a.finished_at_ms, a.result,
                                           a.error) = 0)
         FOR UPDATE OF r SKIP LOCKED) s;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    UPDATE qlsched.maintenance m
       SET pruned_through_ms = greatest(coalesce(m.pruned_through_ms, before_ms), before_ms)
     WHERE m.task = 'prune';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'prune_queued: the prune maintenance row is missing'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM set_config('qlsched.pruning', 'on', true);
    WITH d AS (DELETE FROM qlsched.runs r
                WHERE r.run_id = ANY (ids) AND r.status = 'queued' AND NOT r.cancelled
               RETURNING r.run_id)
    SELECT array_agg(d.run_id) INTO ids FROM d;
    IF ids IS NOT NULL THEN
        DELETE FROM qlsched.run_events e WHERE e.run_id = ANY (ids);
        DELETE FROM qlsched.attempts a WHERE a.run_id = ANY (ids);
    END IF;
    PERFORM set_config('qlsched.pruning', 'off', true);
    RETURN coalesce(cardinality(ids), 0);
END
$$;
REVOKE ALL ON FUNCTION qlsched.prune_queued(bigint, uuid[]) FROM PUBLIC;
