-- Retention of admitted work (docs/design.md, "Retention"; issue 21 items 2, 3, 5).
--
-- Finished runs (succeeded, failed, cancelled) older than the configured horizon are removed,
-- each together with its attempts and events, by one narrow path: qlsched.prune_finished,
-- owned by the owner role, SECURITY DEFINER, EXECUTE granted to the runtime role only (by
-- `db migrate`, since role names carry the install's prefix). No role gains DELETE.
-- Replicas take turns under a lease on the 'prune' maintenance row, claimed like a schedule
-- row (FOR UPDATE SKIP LOCKED, expiry judged by the database clock).

CREATE TABLE qlsched.maintenance (
    task               text PRIMARY KEY CHECK (task IN ('prune')),
    lease_owner        text,
    lease_token        uuid,
    lease_expires_at   timestamptz,
    -- retention.finished_after (ms) of the replica that last claimed the lease; 0 = forever,
    -- NULL = no replica has claimed it yet. `trigger backfill` reads it.
    finished_after_ms  bigint CHECK (finished_after_ms >= 0),
    -- The highest horizon any prune ever used: a run scheduled before it may be gone, even
    -- if retention was lengthened since. `trigger backfill` reads it.
    pruned_through_ms  bigint,
    -- retention.queued_alert_after (ms) of the replica that last pruned: `qlsched status`
    -- counts queued runs older than this (1 hour while none has).
    queued_alert_after_ms bigint CHECK (queued_alert_after_ms > 0),
    last_pass_at       timestamptz
);
INSERT INTO qlsched.maintenance (task) VALUES ('prune');

-- Finished runs in admission order: what a prune batch walks and where the oldest retained
-- finished run is read. Admissions never write it (a new run is queued, outside the
-- predicate); a run enters it when a dispatcher finishes it, an update that is not HOT
-- anyway (status is a key of runs_unfinished_idx). Without it a batch would walk every old
-- queued run on runs_queued_at_idx before reaching a finished one.
CREATE INDEX runs_finished_idx ON qlsched.runs (queued_at_ms)
    WHERE status IN ('succeeded', 'failed', 'cancelled');

-- The permanence triggers of V7 refuse DELETE and TRUNCATE on runs even to the owner; V11
-- extends them to attempts and run_events and lets exactly one DELETE through: one issued
-- inside qlsched.prune_finished, which marks its transaction with the transaction-local
-- setting qlsched.pruning for the length of its deletes. Any role may set a custom setting,
-- so the trigger also requires the call stack (PG_CONTEXT) to be inside prune_finished;
-- and the runtime and admin roles hold no DELETE privilege at all, so their DELETE is
-- refused by the privilege check before any trigger runs. TRUNCATE is always refused.
CREATE OR REPLACE FUNCTION qlsched.refuse_removal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ctx text;
BEGIN
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME IN ('runs', 'attempts', 'run_events')
       AND current_setting('qlsched.pruning', true) = 'on' THEN
        GET DIAGNOSTICS ctx = PG_CONTEXT;
        -- A frame of its own (a line of the context starting with it), not text quoted in
        -- some statement's frame.
        IF ctx ~ '(^|\n)PL/pgSQL function qlsched\.prune_finished\(bigint,integer,text,uuid\) line [0-9]+ at ' THEN
            RETURN NULL;
        END IF;
    END IF;
    RAISE EXCEPTION 'qlsched.% rows are permanent: admitted runs refer to them', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation',
              HINT = 'disable or delete a trigger with `qlsched trigger disable|delete`; finished runs are removed only by retention ([retention] finished_after)';
END
$$;

CREATE TRIGGER attempts_are_permanent BEFORE DELETE OR TRUNCATE ON qlsched.attempts
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_removal();
CREATE TRIGGER run_events_are_permanent BEFORE DELETE OR TRUNCATE ON qlsched.run_events
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_removal();

-- Deletes up to max_rows finished runs admitted (queued_at_ms) and scheduled before
-- horizon_ms, with their attempts and events, in the caller's transaction; returns the
-- count per status. Refuses unless the caller holds the 'prune' lease (owner and token, not
-- expired by the database clock); holds the lease row locked to the end of the transaction,
-- so no other replica's claim can take the turn mid-batch. Queued, dispatching and running
-- runs are never selected. Runs locked by someone else are skipped, never waited for.
CREATE FUNCTION qlsched.prune_finished(horizon_ms bigint, max_rows integer, lease_owner text, lease_token uuid)
RETURNS TABLE (status text, pruned bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids uuid[];
BEGIN
    IF horizon_ms IS NULL OR max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'prune_finished: horizon_ms must be given and max_rows within 1..=10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM qlsched.maintenance m
      WHERE m.task = 'prune' AND m.lease_owner = prune_finished.lease_owner
        AND m.lease_token = prune_finished.lease_token
        AND m.lease_expires_at > clock_timestamp()
      FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'prune_finished: the prune lease is not held by % (token %)',
            prune_finished.lease_owner, prune_finished.lease_token
            USING ERRCODE = 'lock_not_available';
    END IF;
    UPDATE qlsched.maintenance m
       SET pruned_through_ms = greatest(coalesce(m.pruned_through_ms, horizon_ms), horizon_ms)
     WHERE m.task = 'prune';
    SELECT array_agg(s.run_id) INTO ids FROM (
        SELECT r.run_id FROM qlsched.runs r
         WHERE r.queued_at_ms < horizon_ms AND r.scheduled_for_ms < horizon_ms
           AND r.status IN ('succeeded', 'failed', 'cancelled')
         ORDER BY r.queued_at_ms
         LIMIT max_rows
         FOR UPDATE SKIP LOCKED) s;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('qlsched.pruning', 'on', true);
    DELETE FROM qlsched.run_events e WHERE e.run_id = ANY (ids);
    DELETE FROM qlsched.attempts a WHERE a.run_id = ANY (ids);
    RETURN QUERY
        WITH d AS (DELETE FROM qlsched.runs r WHERE r.run_id = ANY (ids) RETURNING r.status)
        SELECT d.status, count(*) FROM d GROUP BY d.status ORDER BY d.status;
    PERFORM set_config('qlsched.pruning', 'off', true);
END
$$;
REVOKE ALL ON FUNCTION qlsched.prune_finished(bigint, integer, text, uuid) FROM PUBLIC;
