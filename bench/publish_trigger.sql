-- One `qlsched trigger publish` of a new cron trigger, statement for statement as
-- src/store/manage.rs publish_trigger runs it (one transaction per trigger), for pgbench
-- (bench/publish_cli.sh runs it with -C: a new connection per publish, as each CLI call makes).
-- Variables (pgbench -D): pfx (trigger id prefix), per_task (1: the trigger's own task t-<id>,
-- published first in its own transaction as `qlsched task publish` does; 0: task bench-task), k and m (the
-- cron is `0 k-59/m * * * *`, or `0 * * * * *` when m = 1: the first occurrence is computed here the way
-- Schedule::next_after_ms finds it), grace (misfire grace ms).
-- The trigger id comes from a sequence (public.bench_publish_seq) so that 4 clients publish
-- ids in order, as `seq | xargs -P4` does. pgbench substitutes colon-words, so the cron and
-- the digest input are built with chr(58)-free text and concat_ws.
SELECT ':pfx' || lpad(nextval('public.bench_publish_seq')::text, 7, '0') AS id \gset
\if :per_task
SELECT 't-' || ':id' AS task \gset
BEGIN;
SELECT revision, content_digest, execution_revision_id, project_id FROM qlsched.tasks
 WHERE task_id = ':task' FOR UPDATE;
INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
VALUES (gen_random_uuid(), 'bench', 'remote_worker', '{"image":"bench/noop:1","args":[]}', encode(sha256(convert_to('{"image":"bench/noop:1","args":[]}', 'UTF8')), 'hex'),
        (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
RETURNING execution_revision_id AS xid \gset
INSERT INTO qlsched.tasks (task_id, project_id, revision, content_digest, execution_revision_id, updated_at_ms)
VALUES (':task', 'bench', 1,
        encode(sha256(convert_to('task' || chr(58) || 'v1' || E'\n' || 'bench' || E'\n'
                                 || encode(sha256(convert_to('{"image":"bench/noop:1","args":[]}', 'UTF8')), 'hex'), 'UTF8')), 'hex'),
        ':xid', (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (task_id) DO UPDATE
  SET revision = qlsched.tasks.revision + 1, content_digest = EXCLUDED.content_digest,
      execution_revision_id = EXCLUDED.execution_revision_id, updated_at_ms = EXCLUDED.updated_at_ms
RETURNING revision;
COMMIT;
\else
SELECT 'bench-task' AS task \gset
\endif
BEGIN;
SELECT revision, content_digest, deleted_at_ms IS NOT NULL, published_enabled
  FROM qlsched.triggers WHERE trigger_id = ':id' FOR UPDATE;
SELECT status FROM qlsched.projects WHERE project_id = 'bench' FOR SHARE;
SELECT project_id FROM qlsched.tasks WHERE task_id = ':task' FOR SHARE;
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms \gset
SELECT ((:now_ms / 60000 + 1) + ((:k - (:now_ms / 60000 + 1) % :m) + :m) % :m) * 60000 AS first \gset
SELECT CASE WHEN :m = 1 THEN '0 * * * * *' ELSE '0 ' || :k || '-59/' || :m || ' * * * *' END AS cron \gset
INSERT INTO qlsched.triggers (trigger_id, project_id, task_id, revision, kind, enabled, published_enabled,
                              cron_expr, timezone, misfire_policy, misfire_grace_ms, content_digest,
                              updated_at_ms)
VALUES (':id', 'bench', ':task', 1, 'cron', true, true, ':cron', 'UTC', 'skip', :grace,
        encode(sha256(convert_to(concat_ws(E'\n', 'trigger' || chr(58) || 'v1', 'bench', ':task', ':cron', 'UTC',
                                           'skip', (:grace)::text, 'true'), 'UTF8')), 'hex'),
        (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (trigger_id) DO UPDATE
  SET project_id = EXCLUDED.project_id, task_id = EXCLUDED.task_id,
      revision = qlsched.triggers.revision + 1,
      published_enabled = EXCLUDED.published_enabled,
      enabled = EXCLUDED.published_enabled AND NOT qlsched.triggers.operator_disabled,
      cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone,
      misfire_policy = EXCLUDED.misfire_policy, misfire_grace_ms = EXCLUDED.misfire_grace_ms,
      content_digest = EXCLUDED.content_digest, updated_at_ms = EXCLUDED.updated_at_ms
RETURNING revision, enabled;
INSERT INTO qlsched.trigger_schedules AS s (trigger_id, project_id, trigger_revision, next_fire_at_ms,
                                            claimable_at_ms, updated_at_ms)
VALUES (':id', 'bench', 1, :first, :first, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
ON CONFLICT (trigger_id) DO UPDATE
  SET project_id = EXCLUDED.project_id, trigger_revision = EXCLUDED.trigger_revision,
      next_fire_at_ms = EXCLUDED.next_fire_at_ms, last_scheduled_at_ms = NULL,
      claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
      claim_version = s.claim_version + 1, state_version = s.state_version + 1,
      claimable_at_ms = EXCLUDED.claimable_at_ms, updated_at_ms = EXCLUDED.updated_at_ms;
SELECT pg_notify('qlsched_wake', (:first)::text);
COMMIT;
