-- qlsched: expand
-- Two changes to the policies of issue 35 (docs/policies-overlap.md, docs/policies-outcome.md).
--
-- 1. The overlap decision of a scheduled admission moves into the admission statement
--    (src/store/admission.rs): for a forbid or buffer_one trigger the statement reads the
--    trigger's qlsched.trigger_overlap row, decides, and writes the row (the count raised for
--    an admitted run, the skip recorded for a skipped one) in one UPDATE for the whole batch,
--    in the same SERIALIZABLE transaction. The runs it inserts carry runs.overlap_counted = true: V21's
--    row triggers before and after the insert (overlap_admit, overlap_counted) are not called
--    for them, since the statement already did their work. A run's end is unchanged: it lowers
--    the count (overlap_run_ended) whoever counted it.
--
--    Every other insert of a counted run leaves overlap_counted NULL and is decided by V21's
--    triggers as before: `trigger fire`, `trigger backfill`, a buffered occurrence admitted at
--    a run end, a replace admission, a buffer_one admission that keeps its occurrence, and the
--    admission statement of a binary older than V26. Both paths write the same row under the
--    same lock, so they exclude each other as V21 describes.
--
-- 2. A pause by the system (V19's trigger_outcome_of_run, after pause_after_failures
--    consecutive failed runs) appends one row to qlsched.audit_log (V22) in the same
--    transaction: source 'system', actor 'qlsched', action 'pause' on the trigger, the switch
--    and the count as its changes, the note naming the count and the last error.
--
-- Expand: a nullable column without a default on runs (a catalog change, no rewrite); the
-- two insert triggers recreated with one more condition in their WHEN (an older binary never
-- sets the column, so its runs are decided as before); a function replaced in place.

LOCK TABLE qlsched.runs IN ACCESS EXCLUSIVE MODE;

-- true: the admission statement decided and counted this run itself (V26); NULL otherwise.
ALTER TABLE qlsched.runs ADD COLUMN overlap_counted boolean;

CREATE OR REPLACE TRIGGER runs_overlap_admit BEFORE INSERT ON qlsched.runs
    FOR EACH ROW WHEN (NEW.overlap_policy IS NOT NULL AND NEW.overlap_counted IS NULL)
    EXECUTE FUNCTION qlsched.overlap_admit();
CREATE OR REPLACE TRIGGER runs_overlap_counted AFTER INSERT ON qlsched.runs
    FOR EACH ROW WHEN (NEW.overlap_policy IS NOT NULL AND NEW.overlap_counted IS NULL)
    EXECUTE FUNCTION qlsched.overlap_counted();

-- The admission's overlap decision (src/store/admission.rs, the `ovd` step): for each
-- forbid or buffer_one member whose trigger has the row, read the row, decide, and write it,
-- one row after the other in one UPDATE. The decision (V21's): a run of the trigger is
-- unfinished and the occurrence's key is new (the key is read only then) is busy; a busy
-- forbid member, or a busy buffer_one member with an occurrence kept already, is skipped (the
-- count of skips and the last 4 instants, as overlap_record_skip); a busy buffer_one member
-- with nothing kept is left to V21's row trigger (the row written unchanged); a member whose
-- key is a tombstone is not decided (written unchanged); every other member raises the count
-- for the run the statement then inserts as counted (overlap_undo lowers it again if that
-- insert finds its key taken). Returns each row's trigger, whether it was busy and whether an
-- occurrence was kept; a trigger without the row (never adopted) is not returned: not counted.
--
-- Why one UPDATE that reads and writes each row in turn: under SERIALIZABLE each row read
-- takes a tuple-level predicate lock, and a transaction holding more than 2 of one page (or
-- more than a relation's share of max_pred_locks_per_transaction) has them promoted to one
-- page-level (relation-level) lock; a batch reading its rows first and writing them after
-- held such a lock on trigger_overlap's pages, and every other admission's write of a row
-- there was a read-write conflict (serialization failures at every minute boundary). A tuple
-- lock is dropped when its own transaction writes the tuple, so read-then-write per row never
-- holds more than one. Each row is reached by the TID the claim read (`tids`, a TID scan,
-- no B-tree page lock); a row changed since the claim (a new version at a new TID) or without
-- a TID is reached by its primary key. A row changed after this transaction's snapshot fails
-- it to serialize. EXECUTE to the runtime role only (the admitting role).
CREATE FUNCTION qlsched.overlap_decide(tids tid[], trigger_ids text[], policies text[], keys text[],
                                       tombed boolean[], sfs bigint[])
RETURNS TABLE (trigger_id text, busy boolean, kept boolean)
LANGUAGE sql STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Point accesses only (a sequential scan under SERIALIZABLE would lock the whole table).
SET enable_seqscan = off
AS $$
    UPDATE qlsched.trigger_overlap o
       SET unfinished = o.unfinished + (NOT x.tombed AND NOT d.busy)::int,
           skipped_overlap = o.skipped_overlap + d.skip::int,
           last_skipped_ms = CASE WHEN d.skip
                                  THEN (o.last_skipped_ms || x.sf)[greatest(cardinality(o.last_skipped_ms) - 3, 1):]
                                  ELSE o.last_skipped_ms END,
           updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
      FROM unnest(tids, trigger_ids, policies, keys, tombed, sfs) AS x(tid, trigger_id, policy, ikey, tombed, sf),
           LATERAL (SELECT p.pt, b.busy, b.busy AND (x.policy = 'forbid' OR p.kept) AS skip, p.kept
                      -- By the claim's TID; by the key only when that found nothing (the LIMIT
                      -- stops the append after the first branch's row).
                      FROM (SELECT q.ctid AS pt, q.unfinished, q.buffered IS NOT NULL AS kept
                              FROM qlsched.trigger_overlap q
                             WHERE q.ctid = x.tid AND q.trigger_id || '' = x.trigger_id
                            UNION ALL
                            SELECT q.ctid, q.unfinished, q.buffered IS NOT NULL
                              FROM qlsched.trigger_overlap q
                             WHERE q.trigger_id = x.trigger_id
                             LIMIT 1) p,
                           LATERAL (SELECT CASE WHEN p.unfinished > 0
                                                THEN NOT x.tombed
                                                     AND NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                                                      WHERE r.idempotency_key = x.ikey)
                                                ELSE false END AS busy
                                    OFFSET 0) b) d
     WHERE o.ctid = d.pt
    RETURNING o.trigger_id, d.busy, d.kept
$$;
REVOKE ALL ON FUNCTION qlsched.overlap_decide(tid[], text[], text[], text[], boolean[], bigint[]) FROM PUBLIC;

-- The count overlap_decide raised for a member whose run the admission then did not insert
-- (its key existed: a backfill admitted the occurrence), lowered again in the same statement.
-- EXECUTE to the runtime role only.
CREATE FUNCTION qlsched.overlap_undo(trigger_ids text[])
RETURNS integer
LANGUAGE sql STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
    WITH u AS (
        UPDATE qlsched.trigger_overlap o
           SET unfinished = o.unfinished - 1,
               updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
         WHERE o.trigger_id = ANY (trigger_ids)
        RETURNING 1
    )
    SELECT count(*)::integer FROM u;
$$;
REVOKE ALL ON FUNCTION qlsched.overlap_undo(text[]) FROM PUBLIC;

-- V19's function with the audit row of a pause.
CREATE OR REPLACE FUNCTION qlsched.trigger_outcome_of_run() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    pause integer;
    t record;
    err text;
    n integer;
BEGIN
    IF NEW.status = 'succeeded' THEN
        INSERT INTO qlsched.trigger_outcomes AS o (trigger_id, project_id, last_success_at_ms,
                                                   last_success_run_id, updated_at_ms)
        VALUES (NEW.trigger_id, NEW.project_id, now_ms, NEW.run_id, now_ms)
        ON CONFLICT (trigger_id) DO UPDATE
           SET last_success_at_ms = now_ms, last_success_run_id = NEW.run_id,
               consecutive_failures = 0,
               success_due_at_ms = CASE WHEN o.enabled_since_ms IS NOT NULL
                                             AND o.expect_success_within_ms IS NOT NULL
                                        THEN greatest(o.enabled_since_ms, now_ms) + o.expect_success_within_ms END,
               updated_at_ms = now_ms;
        RETURN NULL;
    END IF;
    IF NEW.status = 'cancelled' THEN
        INSERT INTO qlsched.trigger_outcomes AS o (trigger_id, project_id, last_cancelled_at_ms,
                                                   last_cancelled_run_id, updated_at_ms)
        VALUES (NEW.trigger_id, NEW.project_id, now_ms, NEW.run_id, now_ms)
        ON CONFLICT (trigger_id) DO UPDATE
           SET last_cancelled_at_ms = now_ms, last_cancelled_run_id = NEW.run_id, updated_at_ms = now_ms;
        RETURN NULL;
    END IF;
    -- Failed. The trigger row first when a pause may follow (the lock order of publish and
    -- disable: trigger row, then outcome row).
    SELECT tr.pause_after_failures INTO pause FROM qlsched.triggers tr WHERE tr.trigger_id = NEW.trigger_id;
    IF pause IS NOT NULL THEN
        SELECT tr.enabled, tr.deleted_at_ms, tr.pause_after_failures INTO t
          FROM qlsched.triggers tr WHERE tr.trigger_id = NEW.trigger_id FOR NO KEY UPDATE;
    END IF;
    SELECT left(coalesce(a.error, 'exit status ' || a.exit_status, 'failed without an error recorded'), 1000)
      INTO err
      FROM qlsched.attempts a WHERE a.run_id = NEW.run_id ORDER BY a.attempt_no DESC LIMIT 1;
    err := coalesce(err, 'failed without an attempt');
    INSERT INTO qlsched.trigger_outcomes AS o (trigger_id, project_id, last_failure_at_ms,
                                               last_failure_run_id, last_failure_error,
                                               consecutive_failures, updated_at_ms)
    VALUES (NEW.trigger_id, NEW.project_id, now_ms, NEW.run_id, err, 1, now_ms)
    ON CONFLICT (trigger_id) DO UPDATE
       SET last_failure_at_ms = now_ms, last_failure_run_id = NEW.run_id, last_failure_error = err,
           consecutive_failures = o.consecutive_failures + 1, updated_at_ms = now_ms
    RETURNING o.consecutive_failures INTO n;
    IF pause IS NULL THEN
        RETURN NULL;
    END IF;
    IF t.enabled AND t.deleted_at_ms IS NULL AND n >= t.pause_after_failures THEN
        -- `trigger disable` (src/store/triggers/state.rs), by the system.
        UPDATE qlsched.triggers
           SET enabled = false, operator_disabled = true, disabled_by = 'qlsched', disabled_at_ms = now_ms,
               disabled_note = left(format('paused after %s consecutive failed runs; last error: %s', n, err), 1000)
         WHERE trigger_id = NEW.trigger_id;
        UPDATE qlsched.trigger_schedules s
           SET claimable_at_ms = NULL, claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
               claim_version = s.claim_version + CASE WHEN s.claim_owner IS NULL THEN 0 ELSE 1 END,
               state_version = s.state_version + 1, updated_at_ms = now_ms
         WHERE s.trigger_id = NEW.trigger_id;
        UPDATE qlsched.trigger_outcomes SET system_paused_at_ms = now_ms WHERE trigger_id = NEW.trigger_id;
        -- The pause in the audit log, as `trigger disable` records an operator's (V26).
        INSERT INTO qlsched.audit_log (actor, source, object_kind, object_id, project_id, action,
                                       changes, note)
        VALUES ('qlsched', 'system', 'trigger', NEW.trigger_id, NEW.project_id, 'pause',
                jsonb_build_object('enabled', jsonb_build_object('before', true, 'after', false),
                                   'consecutive_failures', jsonb_build_object('before', n - 1, 'after', n)),
                left(format('paused after %s consecutive failed runs; last error: %s', n, err), 1000));
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION qlsched.trigger_outcome_of_run() FROM PUBLIC;
