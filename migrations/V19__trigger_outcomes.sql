-- qlsched: expand
-- Trigger outcomes (docs/policies-outcome.md; issue 35 items 2-4): the last success, the last
-- failure with its error and the consecutive failures of every trigger, kept where a run's
-- outcome is recorded; a trigger paused by the system after N consecutive failed runs
-- (`trigger publish --pause-after-failures N`); a trigger overdue when it has had no success
-- within a window (`--expect-success-within DURATION`).
--
-- 1. qlsched.trigger_outcomes, one row per trigger that has had a run end since this
--    migration or that has one of the two policies. Nobody but the owner writes it: no role
--    has a grant on it beyond SELECT (src/schema/grants.rs).
-- 2. qlsched.trigger_outcome_of_run(), a deferred constraint trigger on runs, fires once per
--    run that reaches succeeded, failed or cancelled, whoever moves it there (the dispatcher
--    role's protocol functions of V16/V17 and its V10 statements, the admin role's
--    `runs cancel` and qlsched.prune_queued). Deferred to the commit, so it reads the run's
--    last attempt after the same transaction recorded its error (dispatch_finish updates the
--    run before the attempt). SECURITY DEFINER: it runs as the owner whatever role finished
--    the run. When the failures reach the trigger's pause_after_failures it disables the
--    trigger exactly as `trigger disable` does (fenced, out of the claim index), by
--    `qlsched`, with a note naming the count and the last error.
-- 3. qlsched.trigger_outcome_follows_trigger(), an AFTER trigger on triggers: keeps the
--    outcome row's copy of the window and the instant the trigger last started running, so
--    success_due_at_ms (when it becomes overdue) is maintained on each change, and resets the
--    failures when the trigger is enabled again.
-- No role may EXECUTE either function: PostgreSQL checks EXECUTE on a trigger function only
-- when the trigger is created (by the owner, here).
--
-- Lock order of a run end: the run row (the finishing statement), then — only for a failed
-- run of a trigger with pause_after_failures — the trigger row FOR NO KEY UPDATE, then the
-- outcome row; publish, disable, enable and delete take the trigger row, then the outcome
-- row: the same order. A pause then takes the schedule row, as `trigger disable` does.
--
-- Existing runs are not read: a trigger's summary is empty until its first run ends after
-- this migration (a backfill would scan every retained run under the migration's locks).
--
-- Expand: two nullable columns with NOT VALID checks (no scan), a new table, triggers and
-- functions; an older binary writes nothing these refuse. The two partial indexes on the new
-- table are built CONCURRENTLY after this transaction (src/schema/apply.rs CONCURRENT_INDEXES).

LOCK TABLE qlsched.triggers IN ACCESS EXCLUSIVE MODE;
LOCK TABLE qlsched.runs IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE qlsched.triggers
    ADD COLUMN pause_after_failures integer,
    ADD COLUMN expect_success_within_ms bigint;
ALTER TABLE qlsched.triggers
    ADD CONSTRAINT triggers_pause_after_failures_bound
        CHECK (pause_after_failures BETWEEN 1 AND 1000) NOT VALID;
ALTER TABLE qlsched.triggers
    ADD CONSTRAINT triggers_expect_success_within_bound
        CHECK (expect_success_within_ms BETWEEN 60000 AND 31622400000) NOT VALID;

CREATE TABLE qlsched.trigger_outcomes (
    trigger_id               text PRIMARY KEY,
    project_id               text NOT NULL,
    last_success_at_ms       bigint,
    last_success_run_id      uuid,
    last_failure_at_ms       bigint,
    last_failure_run_id      uuid,
    -- The error of the failed run's last attempt ('lost: …' when its lease ended), first
    -- 1000 characters.
    last_failure_error       text CHECK (length(last_failure_error) <= 1000),
    last_cancelled_at_ms     bigint,
    last_cancelled_run_id    uuid,
    -- Failed runs since the last success (or the last enable); a cancelled run changes nothing.
    consecutive_failures     integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    -- When the system paused the trigger after pause_after_failures failures (cleared by an
    -- enable or a delete).
    system_paused_at_ms      bigint,
    -- The trigger's expect_success_within_ms, copied by trigger_outcome_follows_trigger.
    expect_success_within_ms bigint,
    -- When the trigger last started running (published enabled, enabled by an operator, or
    -- its window changed); NULL while it is not running.
    enabled_since_ms         bigint,
    -- greatest(enabled_since_ms, last_success_at_ms) + expect_success_within_ms while the
    -- trigger runs and has a window; NULL otherwise. Overdue when it is past.
    success_due_at_ms        bigint,
    updated_at_ms            bigint NOT NULL
);

-- Keeps the outcome row of a trigger in step with its definition and state. Runs after
-- every INSERT of a trigger with a policy and every UPDATE that changes its state or its
-- policies (the WHEN clauses below). Locking: the caller holds the trigger row (publish,
-- disable, enable, delete, a pause); the outcome row FOR UPDATE after it.
CREATE FUNCTION qlsched.trigger_outcome_follows_trigger() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    running boolean := NEW.enabled AND NEW.deleted_at_ms IS NULL;
    started boolean := TG_OP = 'UPDATE' AND NOT OLD.enabled AND NEW.enabled;
    o qlsched.trigger_outcomes%ROWTYPE;
    since bigint;
BEGIN
    IF NEW.pause_after_failures IS NOT NULL OR NEW.expect_success_within_ms IS NOT NULL THEN
        INSERT INTO qlsched.trigger_outcomes (trigger_id, project_id, updated_at_ms)
        VALUES (NEW.trigger_id, NEW.project_id, now_ms)
        ON CONFLICT (trigger_id) DO NOTHING;
    END IF;
    SELECT * INTO o FROM qlsched.trigger_outcomes WHERE trigger_id = NEW.trigger_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    since := CASE WHEN NOT running THEN NULL
                  WHEN o.enabled_since_ms IS NULL OR started
                       OR o.expect_success_within_ms IS DISTINCT FROM NEW.expect_success_within_ms
                  THEN now_ms
                  ELSE o.enabled_since_ms END;
    UPDATE qlsched.trigger_outcomes
       SET project_id = NEW.project_id,
           expect_success_within_ms = NEW.expect_success_within_ms,
           enabled_since_ms = since,
           success_due_at_ms = CASE WHEN since IS NOT NULL AND NEW.expect_success_within_ms IS NOT NULL
                                    THEN greatest(since, coalesce(o.last_success_at_ms, since))
                                         + NEW.expect_success_within_ms END,
           consecutive_failures = CASE WHEN started THEN 0 ELSE o.consecutive_failures END,
           system_paused_at_ms = CASE WHEN running OR NEW.deleted_at_ms IS NOT NULL THEN NULL
                                      ELSE o.system_paused_at_ms END,
           updated_at_ms = now_ms
     WHERE trigger_id = NEW.trigger_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER triggers_outcome_on_insert AFTER INSERT ON qlsched.triggers
    FOR EACH ROW
    WHEN (NEW.pause_after_failures IS NOT NULL OR NEW.expect_success_within_ms IS NOT NULL)
    EXECUTE FUNCTION qlsched.trigger_outcome_follows_trigger();

CREATE TRIGGER triggers_outcome_on_update AFTER UPDATE ON qlsched.triggers
    FOR EACH ROW
    WHEN ((OLD.enabled, OLD.deleted_at_ms, OLD.project_id, OLD.pause_after_failures, OLD.expect_success_within_ms)
          IS DISTINCT FROM
          (NEW.enabled, NEW.deleted_at_ms, NEW.project_id, NEW.pause_after_failures, NEW.expect_success_within_ms))
    EXECUTE FUNCTION qlsched.trigger_outcome_follows_trigger();

-- Records how a run ended in its trigger's outcome row, and pauses the trigger after
-- pause_after_failures consecutive failed runs. A failed run's error is its last attempt's
-- (a lost attempt's is 'lost: lease expired …'), else its exit status. A cancelled run is
-- recorded as such and neither counts as a failure nor ends a streak of them.
CREATE FUNCTION qlsched.trigger_outcome_of_run() RETURNS trigger
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
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER runs_record_their_outcome AFTER UPDATE ON qlsched.runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION qlsched.trigger_outcome_of_run();

REVOKE ALL ON TABLE qlsched.trigger_outcomes FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.trigger_outcome_follows_trigger() FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.trigger_outcome_of_run() FROM PUBLIC;
