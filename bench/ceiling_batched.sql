-- The batched raw-SQL ceiling, admission half (issue 24): appended by scripts/bench.sh to the
-- product's claim statement with the claim budget as its LIMIT, whose final SELECT is replaced by
-- bench/ceiling_batched.sh so that it returns the batch as arrays (\gset b_). One pgbench
-- transaction = one batch: CLAIM(budget) (autocommit), then ONE SERIALIZABLE transaction that
-- writes, per occurrence, what the admission writes — the run (idempotency key, ON CONFLICT DO
-- NOTHING), its attempt, its two events — and moves the cursor under the full fence (owner,
-- token, version, state_version, lease unexpired on the database clock), rows reached by TID.
-- No actor, no decision (the cursor moves a fixed hour), no definition re-check: the fastest
-- hand-written SQL for the same rows and index entries. Run ids are laid out like the
-- product's (a per-client prefix, then the clock) so concurrent clients append to their own
-- key ranges. 4 round trips per batch (claim, BEGIN, the statement, COMMIT); the product
-- pipelines the last three into one.
-- pgbench substitutes colon-prefixed words everywhere, hence no literal holds a colon before a letter.
BEGIN ISOLATION LEVEL SERIALIZABLE;
WITH obs AS MATERIALIZED (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), d AS (
    SELECT * FROM unnest(':b_tids'::tid[], ':b_ids'::text[], ':b_svs'::int8[], ':b_tokens'::uuid[],
                         ':b_cvs'::int8[], ':b_sfs'::int8[], ':b_projects'::text[], ':b_revs'::int8[],
                         ':b_tasks'::text[], ':b_krevs'::int8[], ':b_erevs'::uuid[])
        WITH ORDINALITY AS d(tid, trigger_id, sv, token, cv, sf, project_id, rev, task_id, krev, erev, i)
), adv AS (
    UPDATE qlsched.trigger_schedules s
       SET next_fire_at_ms = d.sf + 3600000, last_scheduled_at_ms = d.sf,
           claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
           claimable_at_ms = d.sf + 3600000, state_version = s.state_version + 1, updated_at_ms = obs.now_ms
      FROM obs, d
     WHERE s.ctid = ANY (':b_tids'::tid[]) AND s.ctid = d.tid AND s.trigger_id || '' = d.trigger_id
       AND s.state_version = d.sv AND s.claim_owner = 'pgbench-' || :client_id AND s.claim_token = d.token
       AND s.claim_version = d.cv AND s.claim_expires_at_ms > obs.now_ms
    RETURNING s.trigger_id, d.project_id, d.rev, d.task_id, d.krev, d.erev, d.sf, obs.now_ms,
              (lpad(to_hex(:client_id + 1), 8, '0') || lpad(to_hex(obs.now_ms), 12, '0') || lpad(to_hex(d.i), 4, '0')
               || substr(md5(random()::text), 1, 8))::uuid AS run_id
), run AS (
    INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                              execution_revision_id, idempotency_key, status, scheduled_for_ms,
                              queued_at_ms, admitted_by)
    SELECT run_id, project_id, trigger_id, rev, task_id, krev, erev,
           concat_ws(chr(58), 'ql3', 'cron', 'v1', trigger_id, rev::text, sf::text), 'queued', sf, now_ms,
           'pgbench-' || :client_id
      FROM adv
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING run_id, queued_at_ms
), att AS (
    INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
    SELECT gen_random_uuid(), run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms FROM run
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, e.seq, e.kind, run.queued_at_ms
      FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) AS e(seq, kind)
)
SELECT count(*) AS admitted FROM adv;
COMMIT;
