-- The exactly-once invariants of admitted work, the one definition that the integration
-- tests, the drills, the quickstart and the benchmark all run (docs/design.md, "Integrity of
-- admitted work", "Retention"; docs/dispatcher.md).
--
-- Output: one row per violated invariant, `invariant | violations | sample` (how many
-- offending keys, and the first five of them in key order); no row when every invariant
-- holds. From a shell, fail on any row:
--
--   out=$(psql -X -q -At -v ON_ERROR_STOP=1 -d DB -f testkit/sql/invariants.sql)
--   [ -z "$out" ] || { echo "$out" >&2; exit 1; }
--
-- Removed runs. The database keeps nothing of a pruned run, so the checks that concern
-- removals read a relation `removed_runs (run_id uuid, trigger_id text, scheduled_for_ms
-- bigint, request_id text, status text)`, the runs a caller's own audit saw deleted. A caller
-- that keeps one creates a temporary view of that name in the same session first (psql runs
-- `-c` and `-f` in order in one session); without one the relation is an empty temporary
-- table created here. Everything here is rolled back: the check writes nothing.
--
-- Extending it. A kind of admission record besides a run (a skip recorded by a misfire
-- policy) joins `occurrences`: an occurrence has one outcome, a run or a skip. Attempts are
-- already counted per run (retries add attempts 2, 3, … under one run, each `failed` but the
-- last); a new status or event kind adds its line to `status_of` or to `steps`.
--
-- Names and meanings (each a CTE of offending keys below):
--   duplicate occurrence         two outcomes (runs, removed runs included, and the skips
--                                and the buffered occurrence an overlap policy recorded, V21)
--                                for one trigger and instant among cron and backfill runs (a
--                                manual fire is keyed by its request id: one run per key is the
--                                unique index)
--
-- Overlap skips (V21). qlsched.trigger_overlap keeps, per trigger, the count of occurrences
-- an overlap policy skipped and the instants of the last few; a checker that finds an
-- instant without a run counts it as accounted for up to that count (tests/it/drills/check.rs).
-- Here the recorded instants and a buffered occurrence join `occurrences`; on a database
-- before V21 the temporary view below is empty.
--   attempts not numbered 1..n   a run without attempts, or with a gap in their numbers
--   live attempt                 an unfinished run without exactly one live attempt (claimed,
--                                dispatching, running) as its last, or a finished run with one
--   attempt state of status      the last attempt's state is not the one the run's status
--                                implies (queued: claimed, …, cancelled: abandoned)
--   claimed attempt touched      a claimed attempt carrying a worker, lease, start or outcome
--   events not numbered 1..n     a gap in a run's event numbers
--   admission events             event 1 is not run.created or event 2 not run.queued
--   event not a step             an event that does not follow the one before it by a step of
--                                the run's state machine
--   last event of status         the last event is not the event of the run's status
--   finishing event              a finished run without exactly one run.finished or
--                                run.cancelled, or an unfinished run with one
--   orphan attempt, orphan event an attempt or event whose run does not exist
--   dangling run                 a run whose project, trigger, task or execution revision
--                                does not exist
--   unfinished run removed       a removed run that was queued, dispatching or running
--   overlap count                a trigger whose overlap count (the overlap row's part, and
--                                since V28 the schedule row's) is not its number of unfinished
--                                counted runs (overlap_policy set)

BEGIN;
SET LOCAL client_min_messages = warning;
CREATE TEMPORARY TABLE IF NOT EXISTS removed_runs (
    run_id            uuid,
    trigger_id        text,
    scheduled_for_ms  bigint,
    request_id        text,
    status            text
);

DO $$
BEGIN
    IF to_regclass('qlsched.trigger_overlap') IS NULL THEN
        CREATE TEMPORARY VIEW overlap_outcomes (trigger_id, scheduled_for_ms) AS
            SELECT NULL::text, NULL::bigint WHERE false;
    ELSE
        CREATE TEMPORARY VIEW overlap_outcomes (trigger_id, scheduled_for_ms) AS
            SELECT o.trigger_id, x FROM qlsched.trigger_overlap o, unnest(o.last_skipped_ms) AS x
            UNION ALL
            SELECT o.trigger_id, (o.buffered ->> 'scheduled_for_ms')::bigint FROM qlsched.trigger_overlap o
             WHERE o.buffered IS NOT NULL AND o.buffered ->> 'request_id' IS NULL;
    END IF;
    -- The count an overlap policy decides on (V21; since V28 partly kept on the schedule row).
    IF to_regclass('qlsched.trigger_overlap') IS NULL THEN
        CREATE TEMPORARY VIEW overlap_counts (trigger_id, counted) AS
            SELECT NULL::text, NULL::bigint WHERE false;
    ELSIF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                   WHERE a.attrelid = 'qlsched.trigger_overlap'::regclass
                     AND a.attname = 'overlap_released' AND NOT a.attisdropped) THEN
        EXECUTE 'CREATE TEMPORARY VIEW overlap_counts (trigger_id, counted) AS
            SELECT o.trigger_id, o.unfinished + coalesce(s.overlap_admitted, 0) - o.overlap_released
              FROM qlsched.trigger_overlap o
              LEFT JOIN qlsched.trigger_schedules s ON s.trigger_id = o.trigger_id';
    ELSE
        CREATE TEMPORARY VIEW overlap_counts (trigger_id, counted) AS
            SELECT o.trigger_id, o.unfinished::bigint FROM qlsched.trigger_overlap o;
    END IF;
END
$$;

WITH
-- What each status implies: its run is finished or not, the state of its last attempt, the
-- kind of its last event.
status_of (status, finished, attempt_state, last_event) AS (VALUES
    ('queued', false, 'claimed', 'run.queued'),
    ('dispatching', false, 'dispatching', 'run.dispatching'),
    ('running', false, 'running', 'run.started'),
    ('succeeded', true, 'succeeded', 'run.finished'),
    ('failed', true, 'failed', 'run.finished'),
    ('cancelled', true, 'abandoned', 'run.cancelled')),
-- The run's state machine as events: each pair is an event and one that may follow it.
steps (prev, kind) AS (VALUES
    ('run.created', 'run.queued'),
    ('run.queued', 'run.dispatching'),
    ('run.queued', 'run.started'),        -- taken and started in one call (V25)
    ('run.queued', 'run.cancelled'),
    ('run.queued', 'run.finished'),       -- its pinned spec failed its digest at the take
    ('run.dispatching', 'run.started'),
    ('run.dispatching', 'run.finished'),
    ('run.dispatching', 'run.queued'),    -- released, or retried after its lease expired
    ('run.started', 'run.finished'),
    ('run.started', 'run.queued')),       -- retried after its lease expired
occurrences AS (
    SELECT trigger_id, scheduled_for_ms FROM qlsched.runs WHERE request_id IS NULL
    UNION ALL
    SELECT trigger_id, scheduled_for_ms FROM removed_runs WHERE request_id IS NULL
    UNION ALL
    SELECT trigger_id, scheduled_for_ms FROM overlap_outcomes),
attempts_of AS (
    SELECT a.run_id, count(*) AS n, max(a.attempt_no) AS top,
           count(*) FILTER (WHERE a.state IN ('claimed', 'dispatching', 'running')) AS live,
           (array_agg(a.state ORDER BY a.attempt_no DESC))[1] AS last_state
      FROM qlsched.attempts a GROUP BY a.run_id),
events AS (
    SELECT e.run_id, e.seq, e.kind,
           lag(e.kind) OVER (PARTITION BY e.run_id ORDER BY e.seq) AS prev
      FROM qlsched.run_events e),
events_of AS (
    SELECT e.run_id, count(*) AS n, max(e.seq) AS top,
           count(*) FILTER (WHERE e.kind IN ('run.finished', 'run.cancelled')) AS finishing,
           (array_agg(e.kind ORDER BY e.seq DESC))[1] AS last_kind,
           bool_and(e.seq <> 1 OR e.kind = 'run.created')
               AND bool_and(e.seq <> 2 OR e.kind = 'run.queued')
               AND bool_or(e.seq = 1) AND bool_or(e.seq = 2) AS admitted
      FROM qlsched.run_events e GROUP BY e.run_id),
runs AS (
    SELECT r.run_id, r.status, s.finished, s.attempt_state, s.last_event,
           a.n AS attempts, a.top AS top_attempt, a.live, a.last_state,
           e.n AS events, e.top AS top_event, e.finishing, e.last_kind, e.admitted
      FROM qlsched.runs r
      JOIN status_of s ON s.status = r.status
      LEFT JOIN attempts_of a ON a.run_id = r.run_id
      LEFT JOIN events_of e ON e.run_id = r.run_id),
offences (invariant, key) AS (
    SELECT 'duplicate occurrence', trigger_id || '@' || scheduled_for_ms
      FROM occurrences GROUP BY trigger_id, scheduled_for_ms HAVING count(*) > 1
    UNION ALL
    SELECT 'attempts not numbered 1..n', run_id::text FROM runs
     WHERE attempts IS NULL OR attempts <> top_attempt
    UNION ALL
    SELECT 'live attempt', run_id::text FROM runs
     WHERE coalesce(live, 0) <> CASE WHEN finished THEN 0 ELSE 1 END
        OR (NOT finished AND last_state NOT IN ('claimed', 'dispatching', 'running'))
    UNION ALL
    SELECT 'attempt state of status', run_id::text FROM runs
     WHERE last_state IS DISTINCT FROM attempt_state
    UNION ALL
    SELECT 'claimed attempt touched', a.attempt_id::text FROM qlsched.attempts a
     WHERE a.state = 'claimed'
       AND num_nonnulls(a.worker_id, a.session_id, a.lease_id, a.lease_expires_at_ms,
                        a.offer_id, a.callback_token, a.started_at_ms, a.finished_at_ms,
                        a.result, a.error) > 0
    UNION ALL
    SELECT 'events not numbered 1..n', run_id::text FROM runs WHERE events <> top_event
    UNION ALL
    SELECT 'admission events', run_id::text FROM runs WHERE admitted IS NOT TRUE
    UNION ALL
    SELECT 'event not a step', e.run_id || '#' || e.seq FROM events e
     WHERE e.prev IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.prev = e.prev AND s.kind = e.kind)
    UNION ALL
    SELECT 'last event of status', run_id::text FROM runs
     WHERE last_kind IS DISTINCT FROM last_event
    UNION ALL
    SELECT 'finishing event', run_id::text FROM runs
     WHERE coalesce(finishing, 0) <> CASE WHEN finished THEN 1 ELSE 0 END
    UNION ALL
    SELECT 'orphan attempt', a.attempt_id::text FROM qlsched.attempts a
     WHERE NOT EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.run_id = a.run_id)
    UNION ALL
    SELECT 'orphan event', e.run_id || '#' || e.seq FROM qlsched.run_events e
     WHERE NOT EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.run_id = e.run_id)
    UNION ALL
    SELECT 'dangling run', r.run_id::text FROM qlsched.runs r
     WHERE NOT EXISTS (SELECT 1 FROM qlsched.projects p WHERE p.project_id = r.project_id)
        OR NOT EXISTS (SELECT 1 FROM qlsched.triggers t WHERE t.trigger_id = r.trigger_id)
        OR NOT EXISTS (SELECT 1 FROM qlsched.tasks k WHERE k.task_id = r.task_id)
        OR NOT EXISTS (SELECT 1 FROM qlsched.execution_revisions x
                        WHERE x.execution_revision_id = r.execution_revision_id)
    UNION ALL
    SELECT 'overlap count', c.trigger_id FROM overlap_counts c
     WHERE c.counted <> (SELECT count(*) FROM qlsched.runs r
                          WHERE r.trigger_id = c.trigger_id AND r.overlap_policy IS NOT NULL
                            AND r.status IN ('queued', 'dispatching', 'running'))
    UNION ALL
    SELECT 'unfinished run removed', d.run_id::text FROM removed_runs d
     WHERE d.status NOT IN (SELECT status FROM status_of WHERE finished))
SELECT invariant, count(*) AS violations,
       array_to_string((array_agg(key ORDER BY key))[1:5], ' ') AS sample
  FROM offences
 GROUP BY invariant
 ORDER BY invariant;

ROLLBACK;
