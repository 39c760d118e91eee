-- Operator management of triggers: disable/enable with a note, soft delete, and runs the
-- operator admits by hand (trigger fire) besides cron occurrences and backfills.

-- operator_disabled: an operator's `trigger disable` is in force (the trigger stays
-- disabled across a republish until `trigger enable`). The last disable and the last enable
-- are kept (who, when, the note) and shown by `trigger show` / `trigger list`.
-- deleted_at_ms: `trigger delete`; the row stays so the runs that reference it stay intact,
-- it leaves every listing and its id is never reused.
ALTER TABLE qlsched.triggers
    ADD COLUMN operator_disabled boolean NOT NULL DEFAULT false,
    ADD COLUMN disabled_note  text CHECK (length(disabled_note) <= 1000),
    ADD COLUMN disabled_by    text CHECK (length(disabled_by) <= 200),
    ADD COLUMN disabled_at_ms bigint,
    ADD COLUMN enabled_by     text CHECK (length(enabled_by) <= 200),
    ADD COLUMN enabled_at_ms  bigint,
    ADD COLUMN deleted_by     text CHECK (length(deleted_by) <= 200),
    ADD COLUMN deleted_at_ms  bigint,
    ADD CONSTRAINT operator_disabled_is_disabled CHECK (NOT (operator_disabled AND enabled)),
    ADD CONSTRAINT deleted_is_disabled CHECK (deleted_at_ms IS NULL OR NOT enabled);

-- `trigger list --project P` pages by id inside a project (keyset on trigger_id); without
-- a project it pages along the primary key.
CREATE INDEX triggers_project_page_idx
    ON qlsched.triggers (project_id, trigger_id) WHERE deleted_at_ms IS NULL;

-- A run fired by hand carries the operator's request id and its own key kind; cron
-- occurrences and backfills keep the cron key (so one occurrence is one run whoever
-- admitted it).
ALTER TABLE qlsched.runs
    ADD COLUMN request_id text CHECK (request_id ~ '^[A-Za-z0-9._:-]{1,128}$');
-- (V3 declared the key check inline; spanning several columns, it is named runs_check.)
ALTER TABLE qlsched.runs DROP CONSTRAINT runs_check;
ALTER TABLE qlsched.runs ADD CONSTRAINT runs_idempotency_key_check CHECK (
    idempotency_key = CASE
        WHEN request_id IS NULL
        THEN 'ql3:cron:v1:' || trigger_id || ':' || trigger_revision || ':' || scheduled_for_ms
        ELSE 'ql3:manual:v1:' || trigger_id || ':' || trigger_revision || ':' || request_id
    END);
