-- Fewer writes per admitted occurrence (docs/design.md, "Integrity of admitted work").
--
-- Every admitted run paid seven foreign-key checks: runs -> projects, triggers, tasks and
-- execution_revisions, attempts -> runs, and run_events -> runs (two events). Each check is
-- an index probe plus a FOR KEY SHARE row lock, which writes a WAL record and, under
-- SERIALIZABLE, a predicate lock on the probed index page. None of them can fail:
--   * the admission (src/store/admit.rs) and an operator's fire or backfill
--     (src/store/triggers/admit.rs) take the project, trigger, task and execution revision
--     of a run from the definition rows themselves, read in the same transaction (the
--     admission re-verifies their revisions and digests, a fire holds them FOR SHARE);
--   * the attempt and both events are inserted from the RETURNING of the run insert, in the
--     same statement: they only ever reference a run written together with them.
-- What the checks also guarded against, a referenced row disappearing later, is ruled out
-- below instead: definition rows and admitted runs are permanent. No role is granted DELETE
-- or TRUNCATE on them, and these triggers refuse both even to the tables' owner.
ALTER TABLE qlsched.runs
    DROP CONSTRAINT runs_project_id_fkey,
    DROP CONSTRAINT runs_trigger_id_fkey,
    DROP CONSTRAINT runs_task_id_fkey,
    DROP CONSTRAINT runs_execution_revision_id_fkey;
ALTER TABLE qlsched.attempts DROP CONSTRAINT attempts_run_id_fkey;
ALTER TABLE qlsched.run_events DROP CONSTRAINT run_events_run_id_fkey;

CREATE FUNCTION qlsched.refuse_removal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'qlsched.% rows are permanent: admitted runs refer to them', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation',
              HINT = 'disable or delete a trigger with `qlsched trigger disable|delete`; runs are never removed';
END
$$;

CREATE TRIGGER projects_are_permanent BEFORE DELETE OR TRUNCATE ON qlsched.projects
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_removal();
CREATE TRIGGER execution_revisions_are_permanent BEFORE DELETE OR TRUNCATE ON qlsched.execution_revisions
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_removal();
CREATE TRIGGER tasks_are_permanent BEFORE DELETE OR TRUNCATE ON qlsched.tasks
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_removal();
CREATE TRIGGER triggers_are_permanent BEFORE DELETE OR TRUNCATE ON qlsched.triggers
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_removal();
CREATE TRIGGER runs_are_permanent BEFORE DELETE OR TRUNCATE ON qlsched.runs
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_removal();

-- Each schedule-row update (one at the claim, one at the admission) is a non-HOT update
-- (claimable_at_ms is indexed and changes both times), so it adds an entry to every index
-- of the table. The project index served only a project's suspend/resume, which now reaches
-- the rows through triggers_project_idx and the primary key.
DROP INDEX qlsched.trigger_schedules_project_idx;

-- Room on each page for the new row versions. Both updates are non-HOT, but a new version
-- that fits on the old one's page dirties one heap page instead of two and needs no extra
-- lock record (a version that must move to another page first marks the old one locked).
-- This applies to pages written from now on; `VACUUM FULL qlsched.trigger_schedules` at a
-- quiet moment applies it to an existing table (replicas re-decide rows it moves).
ALTER TABLE qlsched.trigger_schedules SET (fillfactor = 70);
