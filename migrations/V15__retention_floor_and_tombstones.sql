-- qlsched: expand
-- Retention, round three (docs/design.md, "Retention"; docs/operations.md, "Pruning a queued
-- backlog"; issue 30 items 2, 4 and 6).
--
-- Expand: a column, a table, functions and a row trigger. A binary before V15 keeps every
-- grant it checks for, and nothing it writes is refused: its replicas claim the 'prune'
-- lease through the columns they always wrote, and call prune_finished with the same
-- signature. Until every replica runs V15 or later, an older replica's admission does not
-- read the tombstones of item 2. Narrowing the runtime role's UPDATE on
-- qlsched.maintenance to the lease columns is left to a contract of a later release; until
-- then the row trigger below refuses, to every role but the owner (the SECURITY DEFINER
-- prune functions) and superusers, a change of the recorded horizon, and a change of the
-- floor to any role that does not manage definitions (the admin role: it may INSERT
-- schedule rows; the runtime may not).
--
-- 1. The floor of retention is the database's: qlsched.maintenance.finished_after_floor_ms,
--    written by the admin role alone (a column grant). A replica's retention.finished_after
--    is a request: prune_finished keeps every finished run at least the floor, counted by
--    the database clock from when the run finished (its attempt's finish, its last event),
--    whatever horizon its caller passes. prune_queued refuses a bound in the future.
-- 2. A pruned occurrence never comes back: a cron-keyed run removed at or after its
--    trigger's cursor (a backfill ran ahead of a lagging cursor) leaves its key in
--    qlsched.pruned_occurrences, and the cron admission moves past a key found there
--    without writing a run (src/store/admit.rs, ADMIT_SQL). A tombstone behind its trigger's
--    cursor can never be reached again and is removed by prune_finished.
-- 3. prune_finished takes the prune lock that prune_queued takes and each `trigger
--    backfill` chunk holds shared, so a chunk's horizon check and its inserts see no prune
--    in between.

ALTER TABLE qlsched.maintenance
    ADD COLUMN finished_after_floor_ms bigint NOT NULL DEFAULT 60000
        CHECK (finished_after_floor_ms >= 0);

CREATE TABLE qlsched.pruned_occurrences (
    idempotency_key   text PRIMARY KEY,
    trigger_id        text NOT NULL,
    scheduled_for_ms  bigint NOT NULL,
    pruned_at_ms      bigint NOT NULL
);
-- Only runs removed ahead of their cursor leave one, and prune_finished removes those the
-- cursor has passed: the table stays small, and its clean-up reads it whole.

-- Of run_ids (already locked FOR UPDATE by the calling prune function), the ones that may be
-- removed now, recording a tombstone for each cron-keyed run at or after its trigger's
-- cursor (or whose schedule row is gone, or not initialised). Such a run is removed only if
-- its schedule row is unclaimed and can be locked FOR SHARE at once (SKIP LOCKED; the lock
-- lasts to the end of the caller's transaction): no admission of that row is then in
-- flight (one needs the claim), and a claim (FOR UPDATE SKIP LOCKED) takes the row only
-- after this transaction ends, so its admission's snapshot holds the tombstone. The others
-- are left for a later pass. Cursors only move forward (a first cursor is set after every
-- instant already admitted), so a run found behind its cursor needs nothing. Owner-only:
-- EXECUTE is granted to no role; the SECURITY DEFINER prune functions call it.
CREATE FUNCTION qlsched.keep_pruned_out(run_ids uuid[])
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    held text[];
    ids uuid[];
BEGIN
    SELECT coalesce(array_agg(s.trigger_id), '{}') INTO held FROM (
        SELECT s.trigger_id FROM qlsched.trigger_schedules s
         WHERE s.trigger_id IN (
                   SELECT r.trigger_id FROM qlsched.runs r
                     JOIN qlsched.trigger_schedules c ON c.trigger_id = r.trigger_id
                    WHERE r.run_id = ANY (run_ids) AND r.idempotency_key LIKE 'ql3:cron:%'
                      AND (c.next_fire_at_ms IS NULL OR c.next_fire_at_ms <= r.scheduled_for_ms))
           AND s.claim_owner IS NULL
         FOR SHARE SKIP LOCKED) s;
    INSERT INTO qlsched.pruned_occurrences (idempotency_key, trigger_id, scheduled_for_ms, pruned_at_ms)
    SELECT r.idempotency_key, r.trigger_id, r.scheduled_for_ms,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint
      FROM qlsched.runs r
      LEFT JOIN qlsched.trigger_schedules s ON s.trigger_id = r.trigger_id
     WHERE r.run_id = ANY (run_ids) AND r.idempotency_key LIKE 'ql3:cron:%'
       AND (s.trigger_id IS NULL OR s.trigger_id = ANY (held))
       AND (s.next_fire_at_ms IS NULL OR s.next_fire_at_ms <= r.scheduled_for_ms)
    ON CONFLICT (idempotency_key) DO NOTHING;
    SELECT array_agg(r.run_id) INTO ids
      FROM qlsched.runs r
      LEFT JOIN qlsched.trigger_schedules s ON s.trigger_id = r.trigger_id
     WHERE r.run_id = ANY (run_ids)
       AND (r.idempotency_key NOT LIKE 'ql3:cron:%' OR s.trigger_id IS NULL
            OR s.trigger_id = ANY (held) OR s.next_fire_at_ms > r.scheduled_for_ms);
    RETURN ids;
END
$$;
REVOKE ALL ON FUNCTION qlsched.keep_pruned_out(uuid[]) FROM PUBLIC;

-- V11's prune_finished, same signature (a binary before V15 calls it unchanged):
-- horizon_ms is the caller's request; the horizon used is the earlier of it and the
-- database clock minus the floor. A run goes when it finished (its attempts' finish and
-- its events) and was scheduled before that horizon; the batch still walks
-- runs_finished_idx (admission order: a run finishes after its admission).
CREATE OR REPLACE FUNCTION qlsched.prune_finished(horizon_ms bigint, max_rows integer, lease_owner text, lease_token uuid)
RETURNS TABLE (status text, pruned bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids uuid[];
    h bigint;
BEGIN
    IF horizon_ms IS NULL OR max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'prune_finished: horizon_ms must be given and max_rows within 1..=10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT least(horizon_ms,
                 (extract(epoch FROM clock_timestamp()) * 1000)::bigint - m.finished_after_floor_ms)
      INTO h
      FROM qlsched.maintenance m
      WHERE m.task = 'prune' AND m.lease_owner = prune_finished.lease_owner
        AND m.lease_token = prune_finished.lease_token
        AND m.lease_expires_at > clock_timestamp()
      FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'prune_finished: the prune lease is not held by % (token %)',
            prune_finished.lease_owner, prune_finished.lease_token
            USING ERRCODE = 'lock_not_available';
    END IF;
    -- Each `trigger backfill` chunk holds this lock shared from its horizon check to its
    -- commit (src/store/runs.rs, PRUNE_QUEUED_LOCK), as for prune_queued.
    PERFORM pg_advisory_xact_lock(8173034294560948225);
    UPDATE qlsched.maintenance m
       SET pruned_through_ms = greatest(coalesce(m.pruned_through_ms, h), h)
     WHERE m.task = 'prune';
    SELECT array_agg(s.run_id) INTO ids FROM (
        SELECT r.run_id FROM qlsched.runs r
         WHERE r.queued_at_ms < h AND r.scheduled_for_ms < h
           AND r.status IN ('succeeded', 'failed', 'cancelled')
           AND NOT EXISTS (SELECT 1 FROM qlsched.attempts a
                            WHERE a.run_id = r.run_id AND a.finished_at_ms >= h)
           AND NOT EXISTS (SELECT 1 FROM qlsched.run_events e
                            WHERE e.run_id = r.run_id AND e.at_ms >= h)
         ORDER BY r.queued_at_ms
         LIMIT max_rows
         FOR UPDATE OF r SKIP LOCKED) s;
    -- Tombstones behind their trigger's cursor: never reached again.
    DELETE FROM qlsched.pruned_occurrences p
     WHERE p.idempotency_key IN (
           SELECT p2.idempotency_key FROM qlsched.pruned_occurrences p2
             JOIN qlsched.trigger_schedules s ON s.trigger_id = p2.trigger_id
            WHERE s.next_fire_at_ms > p2.scheduled_for_ms
            LIMIT max_rows);
    IF ids IS NULL THEN
        RETURN;
    END IF;
    ids := qlsched.keep_pruned_out(ids);
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

-- V12's prune_queued, same signature: a bound after the database clock is refused, and a
-- cron-keyed run at or after its trigger's cursor leaves a tombstone (keep_pruned_out).
CREATE OR REPLACE FUNCTION qlsched.prune_queued(before_ms bigint, run_ids uuid[])
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
    IF before_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint THEN
        RAISE EXCEPTION 'prune_queued: before_ms % is after the database clock', before_ms
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
    ids := qlsched.keep_pruned_out(ids);
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

-- The horizon and the floor are not the runtime's to move (item 6). Raised as
-- insufficient_privilege, like the permission check the later contract will make.
CREATE FUNCTION qlsched.maintenance_horizon_is_guarded() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    table_owner name;
    superuser boolean;
BEGIN
    SELECT r.rolname INTO table_owner FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
     WHERE c.oid = TG_RELID;
    SELECT r.rolsuper INTO superuser FROM pg_roles r WHERE r.rolname = current_user;
    IF current_user = table_owner OR coalesce(superuser, false) THEN
        RETURN NEW;
    END IF;
    IF NEW.pruned_through_ms IS DISTINCT FROM OLD.pruned_through_ms THEN
        RAISE EXCEPTION 'qlsched.maintenance.pruned_through_ms is moved only by the prune functions (role %)', current_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.finished_after_floor_ms IS DISTINCT FROM OLD.finished_after_floor_ms
       AND NOT has_table_privilege(current_user, 'qlsched.trigger_schedules', 'INSERT') THEN
        RAISE EXCEPTION 'the floor of retention (qlsched.maintenance.finished_after_floor_ms) is the admin role''s (role %)', current_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER maintenance_horizon_guarded BEFORE UPDATE ON qlsched.maintenance
    FOR EACH ROW EXECUTE FUNCTION qlsched.maintenance_horizon_is_guarded();
