-- Everyday edits that lost or duplicated an occurrence (docs/design.md, "Who turns a
-- trigger on and off" and "Manual fire").
--
-- Tables are taken in the engine's order (triggers before runs), each for one short
-- catalogue change: nothing here scans or rewrites runs.

-- published_enabled: what the publisher last said (`trigger publish [--disabled]`), part of
-- the content digest. operator_disabled (V6) is the operator's switch. A live trigger runs
-- when both agree: enabled = published_enabled AND NOT operator_disabled. `trigger enable`
-- only withdraws an operator's disable; it no longer overrides a publisher's --disabled.
--
-- Existing rows: the digest tells what was published. A trigger that an operator enabled
-- against a publish-disabled definition (possible before this migration) keeps firing: it
-- counts as published enabled, and an identical `publish --disabled` now turns it off,
-- because publish compares published_enabled as well as the digest.
ALTER TABLE qlsched.triggers ADD COLUMN published_enabled boolean NOT NULL DEFAULT true;
UPDATE qlsched.triggers
   SET published_enabled = false
 WHERE NOT enabled
   AND content_digest <> encode(sha256(convert_to(concat_ws(E'\n', 'trigger:v1', project_id, task_id,
           cron_expr, timezone, misfire_policy, misfire_grace_ms::text, 'true'), 'UTF8')), 'hex');

-- A manual fire's key no longer carries the trigger revision: one request id is one run
-- per trigger across republishes (ql3:manual:v2:<trigger>:<request id>). Keys written
-- before stay valid, and `trigger fire` looks them up too.
--
-- The new check accepts every row the old one did, so it is added NOT VALID: validating
-- would read all of runs under this migration's exclusive lock and could not fail.
ALTER TABLE qlsched.runs DROP CONSTRAINT runs_idempotency_key_check;
ALTER TABLE qlsched.runs ADD CONSTRAINT runs_idempotency_key_check CHECK (
    CASE
        WHEN request_id IS NULL
        THEN idempotency_key = 'ql3:cron:v1:' || trigger_id || ':' || trigger_revision || ':' || scheduled_for_ms
        ELSE idempotency_key = 'ql3:manual:v2:' || trigger_id || ':' || request_id
          OR idempotency_key = 'ql3:manual:v1:' || trigger_id || ':' || trigger_revision || ':' || request_id
    END) NOT VALID;
