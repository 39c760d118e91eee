-- The raw-SQL ceiling, admission half: appended by scripts/bench.sh to the product's claim
-- statement (LIMIT 1, RETURNING ... \gset c_) to make one pgbench transaction = one occurrence:
--   CLAIM(1) (autocommit), then BEGIN SERIALIZABLE; lock the row under its fence; insert the
--   run, the attempt and both events; fenced UPDATE of the cursor; COMMIT.
-- Hand-written the way the reference measurements (pg-ceiling.md, script D) wrote it, adapted to
-- our schema (claimable_at_ms, the full run row, the ql3 idempotency key). 7 round trips.
-- Note: pgbench substitutes colon-prefixed words everywhere, even inside string literals and
-- comments, hence the key is built with concat_ws and no literal holds a colon before a letter.
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT next_fire_at_ms AS sf
  FROM qlsched.trigger_schedules
 WHERE trigger_id = :c_trigger_id AND trigger_revision = :c_trigger_revision
   AND state_version = :c_state_version AND claim_owner = :c_claim_owner
   AND claim_token = :c_claim_token::uuid AND claim_version = :c_claim_version
   FOR UPDATE \gset
INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                          execution_revision_id, idempotency_key, status, scheduled_for_ms,
                          queued_at_ms, admitted_by)
VALUES (gen_random_uuid(), :c_project_id, :c_trigger_id, :c_trigger_revision, :c_task_id, :c_revision,
        :c_execution_revision_id::uuid,
        concat_ws(':', 'ql3', 'cron', 'v1', :c_trigger_id::text, :c_trigger_revision::text, :sf::text),
        'queued', :sf, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'pgbench')
RETURNING run_id, queued_at_ms \gset
INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
VALUES (gen_random_uuid(), :run_id, 1, 'remote_worker', 'claimed', :queued_at_ms);
INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
VALUES (:run_id, 1, 'run.created', :queued_at_ms), (:run_id, 2, 'run.queued', :queued_at_ms);
UPDATE qlsched.trigger_schedules
   SET next_fire_at_ms = :sf::bigint + 3600000, last_scheduled_at_ms = :sf,
       claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
       claimable_at_ms = :sf::bigint + 3600000, state_version = state_version + 1,
       updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
 WHERE trigger_id = :c_trigger_id AND trigger_revision = :c_trigger_revision
   AND state_version = :c_state_version AND claim_owner = :c_claim_owner
   AND claim_token = :c_claim_token::uuid AND claim_version = :c_claim_version
   AND claim_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
RETURNING state_version AS new_sv \gset
COMMIT;
