-- Bulk-publish benchmark triggers with plain SQL, as the superuser, consistent with what
-- src/store/manage.rs writes (projects / execution_revisions / tasks / triggers /
-- trigger_schedules, digests computed the same way). Used by scripts/bench.sh.
--
-- psql variables:
--   n        number of triggers to add
--   first    index of the first one (ids are <prefix><7-digit index>; default 1)
--   prefix   trigger id prefix (default 'b')
--   mode     due      : cron '0 0 0 1 1 *', cursor = claimable_at = :fire_ms (free, due at fire_ms)
--            stagger  : cron 'S * * * * *' with S = index % 60, cursor = the first such second
--                       at least :lead_ms after now (free, spread over a minute)
--            idle     : cron '0 0 0 1 1 *', cursor = claimable_at = now + 1 day (nothing due)
--            second   : cron '* * * * * *' for every trigger, cursor = the first whole second
--                       at least :lead_ms after now (all due every second)
--            minute   : cron '0 * * * * *' for every trigger, cursor = the first minute boundary
--                       at least :lead_ms after now (all due at the same instant)
--            claimed  : like due, but holding a live claim by another owner that expires in
--                       1 h (claimable_at = expiry, as the claim statement leaves it)
--   fire_ms  cursor for due/claimed (default now - 1000)
--   lead_ms  for stagger (default 3000)
--   grace    misfire_grace_ms (default 60000)
\set ON_ERROR_STOP on
\if :{?first}
\else
\set first 1
\endif
\if :{?prefix}
\else
\set prefix b
\endif
\if :{?lead_ms}
\else
\set lead_ms 3000
\endif
\if :{?grace}
\else
\set grace 60000
\endif
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms \gset
\if :{?fire_ms}
\else
SELECT :now_ms - 1000 AS fire_ms \gset
\endif

-- Referential integrity holds by construction; skip the per-row FK triggers for the bulk load.
SET session_replication_role = replica;
BEGIN;
INSERT INTO qlsched.projects (project_id, status, created_at_ms, updated_at_ms)
VALUES ('bench', 'active', :now_ms, :now_ms) ON CONFLICT DO NOTHING;
-- One immutable execution revision; spec_digest = sha256(spec) or every admission is refused.
INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
SELECT '00000000-0000-4000-8000-00000000be4c', 'bench', 'remote_worker', spec,
       encode(sha256(convert_to(spec, 'UTF8')), 'hex'), :now_ms
  FROM (VALUES ('{"image":"bench/noop:1","args":[]}')) AS v(spec)
ON CONFLICT DO NOTHING;
INSERT INTO qlsched.tasks (task_id, project_id, revision, content_digest, execution_revision_id, updated_at_ms)
SELECT 'bench-task', 'bench', 1,
       encode(sha256(convert_to('task:v1' || E'\n' || 'bench' || E'\n' || e.spec_digest, 'UTF8')), 'hex'),
       e.execution_revision_id, :now_ms
  FROM qlsched.execution_revisions e WHERE e.execution_revision_id = '00000000-0000-4000-8000-00000000be4c'
ON CONFLICT DO NOTHING;

CREATE TEMP TABLE bench_new ON COMMIT DROP AS
SELECT :'prefix' || lpad(g::text, 7, '0') AS trigger_id,
       CASE :'mode' WHEN 'stagger' THEN (g % 60) || ' * * * * *'
                    WHEN 'minute' THEN '0 * * * * *' WHEN 'second' THEN '* * * * * *'
                    ELSE '0 0 0 1 1 *' END AS cron_expr,
       CASE :'mode'
         WHEN 'stagger' THEN
           (SELECT CASE WHEN b <= :now_ms + :lead_ms THEN b + 60000 ELSE b END
              FROM (SELECT (:now_ms / 60000) * 60000 + (g % 60) * 1000 AS b) x)
         WHEN 'minute' THEN ((:now_ms + :lead_ms) / 60000 + 1) * 60000
         WHEN 'second' THEN ((:now_ms + :lead_ms) / 1000 + 1) * 1000
         WHEN 'idle' THEN :now_ms + 86400000
         ELSE :fire_ms::bigint
       END AS next_fire_at_ms
  FROM generate_series(:first::bigint, :first::bigint + :n - 1) g;

-- content digest exactly as TriggerSpec::content_digest (enabled prints as "true").
INSERT INTO qlsched.triggers (trigger_id, project_id, task_id, revision, kind, enabled, cron_expr, timezone,
                              misfire_policy, misfire_grace_ms, content_digest, updated_at_ms)
SELECT trigger_id, 'bench', 'bench-task', 1, 'cron', true, cron_expr, 'UTC', 'skip', :grace,
       encode(sha256(convert_to(concat_ws(E'\n', 'trigger:v1', 'bench', 'bench-task', cron_expr, 'UTC',
                                          'skip', (:grace)::text, 'true'), 'UTF8')), 'hex'),
       :now_ms
  FROM bench_new;

INSERT INTO qlsched.trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms,
                                       state_version, claim_owner, claim_token, claim_version,
                                       claim_expires_at_ms, claimable_at_ms, updated_at_ms)
SELECT trigger_id, 'bench', 1, next_fire_at_ms,
       CASE WHEN :'mode' = 'claimed' THEN 2 ELSE 1 END,
       CASE WHEN :'mode' = 'claimed' THEN 'bench-other' END,
       CASE WHEN :'mode' = 'claimed' THEN gen_random_uuid() END,
       CASE WHEN :'mode' = 'claimed' THEN 1 ELSE 0 END,
       CASE WHEN :'mode' = 'claimed' THEN :now_ms + 3600000 END,
       CASE WHEN :'mode' = 'claimed' THEN :now_ms + 3600000 ELSE next_fire_at_ms END,
       :now_ms
  FROM bench_new;
COMMIT;
RESET session_replication_role;
ANALYZE qlsched.projects, qlsched.execution_revisions, qlsched.tasks, qlsched.triggers, qlsched.trigger_schedules;
