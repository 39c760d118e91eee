-- Back to a freshly migrated database (definitions of the bench project/task are kept):
-- no triggers, no schedule rows, no admitted work, no replicas. Run as the superuser.
\set ON_ERROR_STOP on
-- Definition rows and runs are permanent (V7 refuses DELETE and TRUNCATE with a trigger);
-- the benchmark resets them as the superuser with triggers off.
SET session_replication_role = replica;
TRUNCATE qlsched.run_events, qlsched.attempts, qlsched.runs, qlsched.trigger_schedules,
         qlsched.triggers, qlsched.replicas;
