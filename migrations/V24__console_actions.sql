-- qlsched: expand
-- Operator actions from the web console (docs/console.md, "Actions"; docs/design.md, "Acting
-- from the console"; issue 37). A replica serves the console as the runtime role, which may
-- not disable, cancel or lock triggers, and holds no admin credentials. Each action is one
-- narrow owner-owned SECURITY DEFINER function, EXECUTE granted to the runtime role only:
--
--   console_disable        `trigger disable` (a note is required)
--   console_enable         `trigger enable`
--   console_fire           `trigger fire` (one request id, one run), and a retry of a failed run
--   console_backfill       `trigger backfill` of at most 1000 past occurrences
--   console_cancel_queued  `runs cancel` of a trigger's queued runs in a window (at most 1000)
--   console_request_cancel asks the holder of a running run to stop it (request_cancel, V16)
--
-- Each runs the checks of its CLI command (trigger state, project status, the intact
-- execution revision, revision fence, bounds), takes the same locks in the same order, and
-- appends exactly one audit row (source 'console', the console user as actor, the client
-- address as host) when it changes something. The cron arithmetic (the first cursor of an
-- enable, a backfill's instants) stays in the binary, as for the replicas' own admissions;
-- the functions check what they are given against the database (after every instant
-- admitted and the clock, in the past and after the retention horizon), so the runtime role
-- gains no write it could not already make: it admits cron-keyed runs and moves cursors
-- itself.
--
-- Expand: new functions only; nothing an older binary reads or writes changes.

-- The fields that differ between two snapshots of a row, as {"field": {"before", "after"}}
-- (the CLI's audit::diff). Owner only: called from the functions below.
CREATE FUNCTION qlsched.console_diff(before jsonb, after jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(jsonb_object_agg(k, jsonb_build_object('before', coalesce(before -> k, 'null'::jsonb),
                                                           'after', coalesce(after -> k, 'null'::jsonb))),
                    '{}'::jsonb)
      FROM (SELECT jsonb_object_keys(coalesce(before, '{}'::jsonb)) AS k
            UNION SELECT jsonb_object_keys(coalesce(after, '{}'::jsonb))) keys
     WHERE (before -> k) IS DISTINCT FROM (after -> k)
$$;
REVOKE ALL ON FUNCTION qlsched.console_diff(jsonb, jsonb) FROM PUBLIC;

-- The trigger's fields as an audit row compares them (audit::ObjectKind::Trigger).
CREATE FUNCTION qlsched.console_snapshot(trigger_id text) RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT to_jsonb(t) - 'updated_at_ms' - 'content_digest'
      FROM qlsched.triggers t WHERE t.trigger_id = console_snapshot.trigger_id
$$;
REVOKE ALL ON FUNCTION qlsched.console_snapshot(text) FROM PUBLIC;

-- Appends the console's audit row: who (actor, host) and what.
CREATE FUNCTION qlsched.console_audit(trigger_id text, project_id text, action text, changes jsonb,
                                      actor text, host text, note text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO qlsched.audit_log (actor, host, source, object_kind, object_id, project_id, action, changes, note)
    VALUES (actor, host, 'console', 'trigger', trigger_id, project_id, action, changes, note)
$$;
REVOKE ALL ON FUNCTION qlsched.console_audit(text, text, text, jsonb, text, text, text) FROM PUBLIC;

-- The actor and host every action is given: the console user (1..=100 characters) and the
-- client address (at most 255).
CREATE FUNCTION qlsched.console_check_who(actor text, host text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF actor IS NULL OR length(actor) NOT BETWEEN 1 AND 100 OR length(host) > 255 THEN
        RAISE EXCEPTION 'console action: the actor (1..=100 characters) and host (at most 255) must be given'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_check_who(text, text) FROM PUBLIC;

-- `trigger disable` (store::triggers::disable): the trigger row FOR UPDATE, refused when
-- deleted; an operator-disabled trigger is left as it is ('unchanged'); otherwise the
-- operator's switch, note, who and when are written and the schedule row leaves the claim
-- index with any live claim fenced out (claim and state versions bumped), so the holder's
-- admission commits nothing; an admission past its UPDATE holds the schedule row and is
-- waited for. Returns 'disabled' or 'unchanged'.
CREATE FUNCTION qlsched.console_disable(trigger_id text, note text, actor text, host text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    before jsonb;
BEGIN
    PERFORM qlsched.console_check_who(actor, host);
    IF note IS NULL OR length(btrim(note)) = 0 OR length(note) > 1000 THEN
        RAISE EXCEPTION 'console_disable: a note (1..=1000 characters) is required'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT tr.project_id, tr.operator_disabled, tr.deleted_at_ms IS NOT NULL AS deleted INTO t
      FROM qlsched.triggers tr WHERE tr.trigger_id = console_disable.trigger_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown trigger `%`', trigger_id USING ERRCODE = 'no_data_found';
    END IF;
    IF t.deleted THEN
        RAISE EXCEPTION 'trigger % is deleted', trigger_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF t.operator_disabled THEN
        RETURN 'unchanged';
    END IF;
    before := qlsched.console_snapshot(trigger_id);
    UPDATE qlsched.triggers tr
       SET enabled = false, operator_disabled = true, disabled_note = console_disable.note,
           disabled_by = actor || ' via console',
           disabled_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
     WHERE tr.trigger_id = console_disable.trigger_id;
    UPDATE qlsched.trigger_schedules s
       SET claimable_at_ms = NULL, claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
           claim_version = s.claim_version + CASE WHEN s.claim_owner IS NULL THEN 0 ELSE 1 END,
           state_version = s.state_version + 1,
           updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
     WHERE s.trigger_id = console_disable.trigger_id;
    PERFORM qlsched.console_audit(trigger_id, t.project_id, 'disable',
                                  qlsched.console_diff(before, qlsched.console_snapshot(trigger_id)),
                                  actor, host, note);
    RETURN 'disabled';
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_disable(text, text, text, text) FROM PUBLIC;

-- `trigger enable` (store::triggers::enable), with the first cursor computed by the caller
-- from `revision`'s expression after the floor and the clock it read (CursorFloor::first).
-- Locks as the CLI: the trigger FOR UPDATE, the project FOR SHARE, the schedule row FOR
-- UPDATE, then reads the clock and the floor (every instant admitted under any revision).
-- Returns 'stale' (nothing written; the caller reads again and retries) unless the
-- revision is still `revision` and first_ms is after both, and not before the window's
-- start: the first occurrence after an earlier reading that is after the present floor and
-- clock is the first occurrence after them. A NULL first_ms (an expression that no longer
-- parses or never fires again) is written as the CLI writes it. Refused when deleted or
-- disabled by its publisher; 'unchanged' when running.
CREATE FUNCTION qlsched.console_enable(trigger_id text, revision bigint, first_ms bigint, actor text, host text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    active boolean;
    floor_ms bigint;
    now_ms bigint;
    before jsonb;
    claimable bigint;
BEGIN
    PERFORM qlsched.console_check_who(actor, host);
    SELECT tr.project_id, tr.enabled, tr.published_enabled, tr.operator_disabled, tr.revision AS rev,
           tr.start_at_ms, tr.deleted_at_ms IS NOT NULL AS deleted INTO t
      FROM qlsched.triggers tr WHERE tr.trigger_id = console_enable.trigger_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown trigger `%`', trigger_id USING ERRCODE = 'no_data_found';
    END IF;
    IF t.deleted THEN
        RAISE EXCEPTION 'trigger % is deleted', trigger_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF NOT t.published_enabled THEN
        RAISE EXCEPTION 'trigger % is disabled by its publisher: only a publish turns it on', trigger_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF t.enabled AND NOT t.operator_disabled THEN
        RETURN 'unchanged';
    END IF;
    before := qlsched.console_snapshot(trigger_id);
    SELECT p.status = 'active' INTO active FROM qlsched.projects p WHERE p.project_id = t.project_id FOR SHARE;
    SELECT greatest(s.admitted_through_ms, s.last_scheduled_at_ms,
                    (SELECT max(r.scheduled_for_ms) FROM qlsched.runs r
                      WHERE r.trigger_id = s.trigger_id AND r.idempotency_key LIKE 'ql3:cron:%'))
      INTO floor_ms
      FROM qlsched.trigger_schedules s WHERE s.trigger_id = console_enable.trigger_id
       FOR UPDATE OF s;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF t.rev <> revision
       OR (first_ms IS NOT NULL AND (first_ms <= now_ms OR first_ms <= coalesce(floor_ms, first_ms - 1)
                                     OR first_ms < coalesce(t.start_at_ms, first_ms))) THEN
        RETURN 'stale';
    END IF;
    UPDATE qlsched.triggers tr
       SET enabled = true, operator_disabled = false, enabled_by = actor || ' via console',
           enabled_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
     WHERE tr.trigger_id = console_enable.trigger_id;
    UPDATE qlsched.trigger_schedules s
       SET next_fire_at_ms = first_ms,
           claimable_at_ms = CASE WHEN active THEN
               CASE WHEN first_ms IS NULL THEN 0
                    WHEN first_ms > tr.end_at_ms THEN NULL
                    ELSE first_ms + CASE WHEN tr.jitter_ms > 0 THEN
                        (('x' || left(encode(sha256(convert_to(s.trigger_id || ':' || first_ms::text, 'UTF8')), 'hex'), 16))::bit(64)::bigint
                         & 9223372036854775807) % tr.jitter_ms ELSE 0 END
               END END,
           claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
           claim_version = s.claim_version + CASE WHEN s.claim_owner IS NULL THEN 0 ELSE 1 END,
           state_version = s.state_version + 1,
           updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
      FROM qlsched.triggers tr
     WHERE s.trigger_id = console_enable.trigger_id AND tr.trigger_id = s.trigger_id
    RETURNING s.claimable_at_ms INTO claimable;
    IF claimable IS NOT NULL THEN
        -- Wake the replicas for the first occurrence (delivered at commit), as store::wake.
        PERFORM pg_notify('qlsched_wake', claimable::text);
    END IF;
    PERFORM qlsched.console_audit(trigger_id, t.project_id, 'enable',
                                  qlsched.console_diff(before, qlsched.console_snapshot(trigger_id)),
                                  actor, host, NULL);
    RETURN 'enabled';
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_enable(text, bigint, bigint, text, text) FROM PUBLIC;

-- What a fire or a backfill needs before it writes a run (store::triggers::manual,
-- lock_admittable): the trigger FOR SHARE, live (not deleted, enabled), its project FOR
-- SHARE and active, its task's execution revision intact. Returns the trigger's project and
-- revision.
CREATE FUNCTION qlsched.console_lock_admittable(trigger_id text, OUT project_id text, OUT revision bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    status text;
BEGIN
    SELECT tr.project_id AS project, tr.revision AS rev, tr.enabled, tr.deleted_at_ms IS NOT NULL AS deleted INTO t
      FROM qlsched.triggers tr WHERE tr.trigger_id = console_lock_admittable.trigger_id FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown trigger `%`', trigger_id USING ERRCODE = 'no_data_found';
    END IF;
    IF t.deleted THEN
        RAISE EXCEPTION 'trigger % is deleted', trigger_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF NOT t.enabled THEN
        RAISE EXCEPTION 'trigger % is disabled', trigger_id USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    SELECT p.status INTO status FROM qlsched.projects p WHERE p.project_id = t.project FOR SHARE;
    IF status IS DISTINCT FROM 'active' THEN
        RAISE EXCEPTION 'trigger %: its project % is %', trigger_id, t.project, status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM qlsched.triggers tr
          JOIN qlsched.tasks k ON k.task_id = tr.task_id
          JOIN qlsched.execution_revisions e ON e.execution_revision_id = k.execution_revision_id
         WHERE tr.trigger_id = console_lock_admittable.trigger_id AND e.kind = 'remote_worker'
           AND e.project_id = tr.project_id
           AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')) THEN
        RAISE EXCEPTION 'trigger %: its execution revision does not match its digest', trigger_id
            USING ERRCODE = 'data_corrupted';
    END IF;
    project_id := t.project;
    revision := t.rev;
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_lock_admittable(text) FROM PUBLIC;

-- Inserts the runs of `d` (scheduled instant or NULL for now, run id, attempt id, key,
-- request id) as store::triggers::manual's ADMIT_MANUAL_SQL does: a queued run, its claimed
-- attempt, run.created and run.queued, from the trigger's current definition; a key that
-- exists or an instant with a cron-keyed run is skipped. `overlap`: the request's overlap
-- policy (NULL: the trigger's). Returns the runs written.
CREATE FUNCTION qlsched.console_admit(trigger_id text, sfs bigint[], run_ids uuid[], attempt_ids uuid[],
                                      keys text[], request_ids text[], admitted_by text, overlap text)
RETURNS TABLE (run_id uuid, scheduled_for_ms bigint)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
WITH obs AS MATERIALIZED (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms), d AS (
    SELECT * FROM unnest(sfs, run_ids, attempt_ids, keys, request_ids)
        AS d(sf, run_id, attempt_id, ikey, request_id)
), run AS (
    INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                              execution_revision_id, idempotency_key, status, scheduled_for_ms,
                              queued_at_ms, admitted_by, request_id, pool, executor, overlap_policy)
    SELECT d.run_id, t.project_id, t.trigger_id, t.revision, k.task_id, k.revision, k.execution_revision_id,
           d.ikey, 'queued', coalesce(d.sf, obs.now_ms), obs.now_ms, admitted_by, d.request_id, e.pool, e.executor,
           CASE WHEN t.overlap_policy = 'allow' THEN NULL ELSE coalesce(overlap, t.overlap_policy) END
      FROM d, obs, qlsched.triggers t
      JOIN qlsched.tasks k ON k.task_id = t.task_id
      JOIN qlsched.execution_revisions e ON e.execution_revision_id = k.execution_revision_id
     WHERE t.trigger_id = console_admit.trigger_id AND e.kind = 'remote_worker' AND e.project_id = t.project_id
       AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')
       AND (d.sf IS NULL OR NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                         WHERE r.trigger_id = t.trigger_id AND r.scheduled_for_ms = d.sf
                                           AND r.idempotency_key LIKE 'ql3:cron:%'))
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING run_id, queued_at_ms, scheduled_for_ms
), att AS (
    INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
    SELECT d.attempt_id, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms
      FROM run JOIN d ON d.run_id = run.run_id
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, e.seq, e.kind, run.queued_at_ms
      FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) AS e(seq, kind)
)
SELECT run.run_id, run.scheduled_for_ms FROM run
$$;
REVOKE ALL ON FUNCTION qlsched.console_admit(text, bigint[], uuid[], uuid[], text[], text[], text, text) FROM PUBLIC;

-- `trigger fire` (store::triggers::manual::fire): one run now under the key
-- ql3:manual:v2:<trigger>:<request id>; the same request id again admits nothing and
-- returns the run it admitted ('existing'), so a double click is one run. retry_of: a
-- failed run of this trigger fired again by hand, under the request id `retry.<run id>`
-- (request_id is then ignored), so retrying it twice is one run too. An occurrence the
-- trigger's overlap policy keeps out is 'overlap_skipped' or 'overlap_buffered', as the CLI
-- reports it. Returns the outcome and the run (NULL when kept out).
CREATE FUNCTION qlsched.console_fire(trigger_id text, request_id text, retry_of uuid, run_id uuid,
                                     attempt_id uuid, actor text, host text, note text,
                                     OUT outcome text, OUT fired_run_id uuid)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    rid text := request_id;
    ikey text;
    r record;
BEGIN
    PERFORM qlsched.console_check_who(actor, host);
    IF length(note) > 1000 THEN
        RAISE EXCEPTION 'console_fire: a note has at most 1000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO t FROM qlsched.console_lock_admittable(trigger_id);
    IF retry_of IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM qlsched.runs x WHERE x.run_id = retry_of
                          AND x.trigger_id = console_fire.trigger_id AND x.status = 'failed') THEN
            RAISE EXCEPTION 'run % is not a failed run of trigger %', retry_of, trigger_id
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        rid := 'retry.' || retry_of::text;
    END IF;
    IF rid IS NULL OR rid !~ '^[A-Za-z0-9._:-]{1,128}$' THEN
        RAISE EXCEPTION 'console_fire: a request id is 1..=128 characters of [A-Za-z0-9._:-]'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    ikey := 'ql3:manual:v2:' || trigger_id || ':' || rid;
    SELECT * INTO r FROM qlsched.console_admit(trigger_id, ARRAY[NULL::bigint], ARRAY[run_id], ARRAY[attempt_id],
                                               ARRAY[ikey], ARRAY[rid], 'console:' || actor, NULL);
    IF FOUND THEN
        PERFORM qlsched.console_audit(trigger_id, t.project_id, 'fire',
            jsonb_build_object('run_id', r.run_id::text, 'request_id', rid, 'idempotency_key', ikey,
                               'scheduled_for_ms', r.scheduled_for_ms, 'retry_of', retry_of::text),
            actor, host, note);
        outcome := 'admitted';
        fired_run_id := r.run_id;
        RETURN;
    END IF;
    SELECT x.run_id INTO fired_run_id FROM qlsched.runs x WHERE x.idempotency_key = ikey;
    IF FOUND THEN
        outcome := 'existing';
        RETURN;
    END IF;
    SELECT CASE WHEN coalesce(o.buffered ->> 'idempotency_key' = ikey, false)
                THEN 'overlap_buffered' ELSE 'overlap_skipped' END
      INTO outcome FROM qlsched.trigger_overlap o WHERE o.trigger_id = console_fire.trigger_id;
    outcome := coalesce(outcome, 'overlap_skipped');
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_fire(text, text, uuid, uuid, uuid, text, text, text) FROM PUBLIC;

-- One `trigger backfill` of past occurrences (store::triggers::manual::backfill_chunk_with,
-- overlap allow): at most 1000 instants (the CLI's default --max), strictly increasing, all
-- before the database clock and none before the recorded retention horizon (the caller
-- also refuses a window that starts inside the horizon's margin, as the CLI does), under
-- the trigger's current revision (refused if it is not `revision`), with the cron key; an
-- instant that already has a run counts as already existing. Holds the advisory lock
-- `runs prune` takes exclusively, shared, as the CLI's chunk does. Returns how many runs
-- were admitted; one audit row when any was.
CREATE FUNCTION qlsched.console_backfill(trigger_id text, revision bigint, instants bigint[], run_ids uuid[],
                                         attempt_ids uuid[], actor text, host text, note text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    n int := cardinality(instants);
    horizon bigint;
    admitted bigint;
    first_sf bigint;
    last_sf bigint;
BEGIN
    PERFORM qlsched.console_check_who(actor, host);
    IF n IS NULL OR n < 1 OR n > 1000 OR cardinality(run_ids) <> n OR cardinality(attempt_ids) <> n
       OR length(note) > 1000 THEN
        RAISE EXCEPTION 'console_backfill: 1..=1000 instants, each with a run id and an attempt id'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(instants) WITH ORDINALITY AS i(sf, o)
                 JOIN unnest(instants) WITH ORDINALITY AS j(sf, o) ON j.o = i.o + 1
                WHERE j.sf <= i.sf)
       OR EXISTS (SELECT 1 FROM unnest(instants) AS i(sf) WHERE i.sf IS NULL) THEN
        RAISE EXCEPTION 'console_backfill: the instants must be strictly increasing'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO t FROM qlsched.console_lock_admittable(trigger_id);
    IF t.revision <> console_backfill.revision THEN
        RAISE EXCEPTION 'trigger % was republished (revision % -> %) since the backfill was computed',
            trigger_id, console_backfill.revision, t.revision USING ERRCODE = 'serialization_failure';
    END IF;
    IF instants[n] >= (extract(epoch FROM clock_timestamp()) * 1000)::bigint THEN
        RAISE EXCEPTION 'console_backfill: the window must end in the past' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock_shared(8173034294560948225);
    SELECT m.pruned_through_ms INTO horizon FROM qlsched.maintenance m WHERE m.task = 'prune';
    IF instants[1] < horizon THEN
        RAISE EXCEPTION 'console_backfill: the window starts before the retention horizon %', horizon
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*), min(a.scheduled_for_ms), max(a.scheduled_for_ms) INTO admitted, first_sf, last_sf
      FROM qlsched.console_admit(trigger_id, instants, run_ids, attempt_ids,
               ARRAY(SELECT 'ql3:cron:v1:' || trigger_id || ':' || revision || ':' || i
                       FROM unnest(instants) WITH ORDINALITY AS u(i, o) ORDER BY o),
               array_fill(NULL::text, ARRAY[n]), 'backfill:console:' || actor, 'allow') a;
    IF admitted > 0 THEN
        PERFORM qlsched.console_audit(trigger_id, t.project_id, 'backfill',
            jsonb_build_object('revision', revision, 'admitted', admitted, 'already_existed', n - admitted,
                               'first_scheduled_for_ms', first_sf, 'last_scheduled_for_ms', last_sf),
            actor, host, note);
    END IF;
    RETURN admitted;
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_backfill(text, bigint, bigint[], uuid[], uuid[], text, text, text) FROM PUBLIC;

-- `runs cancel` of one trigger's queued runs scheduled in [from_ms, to_ms) (NULL: no bound),
-- at most 1000 per call, oldest first (store::runs CANCEL_SQL): only untouched runs (one
-- attempt, claimed, no worker field set), each locked FOR UPDATE SKIP LOCKED as a
-- dispatcher's take asks, so one a dispatcher holds is left alone. Run cancelled, attempt
-- abandoned, event run.cancelled. Deleted triggers' runs may be cancelled. Returns how many;
-- one audit row when any was.
CREATE FUNCTION qlsched.console_cancel_queued(trigger_id text, from_ms bigint, to_ms bigint,
                                              actor text, host text, note text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    project text;
    ids text[];
BEGIN
    PERFORM qlsched.console_check_who(actor, host);
    IF length(note) > 1000 THEN
        RAISE EXCEPTION 'console_cancel_queued: a note has at most 1000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT tr.project_id INTO project FROM qlsched.triggers tr WHERE tr.trigger_id = console_cancel_queued.trigger_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown trigger `%`', trigger_id USING ERRCODE = 'no_data_found';
    END IF;
    WITH obs AS MATERIALIZED (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms), picked AS (
        SELECT r.run_id FROM qlsched.runs r
         WHERE r.trigger_id = console_cancel_queued.trigger_id AND r.status = 'queued' AND NOT r.cancelled
           AND (from_ms IS NULL OR r.scheduled_for_ms >= from_ms)
           AND (to_ms IS NULL OR r.scheduled_for_ms < to_ms)
           AND (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id) = 1
           AND EXISTS (SELECT 1 FROM qlsched.attempts a
                        WHERE a.run_id = r.run_id AND a.attempt_no = 1 AND a.state = 'claimed'
                          AND num_nonnulls(a.worker_id, a.session_id, a.lease_id, a.lease_expires_at_ms,
                                           a.offer_id, a.callback_token, a.started_at_ms,
                                           a.finished_at_ms, a.result, a.error) = 0)
         ORDER BY r.scheduled_for_ms, r.run_id
         LIMIT 1000
         FOR UPDATE OF r SKIP LOCKED
    ), run AS (
        UPDATE qlsched.runs r SET status = 'cancelled', cancelled = true
          FROM picked WHERE r.run_id = picked.run_id AND r.status = 'queued'
        RETURNING r.run_id
    ), att AS (
        UPDATE qlsched.attempts a SET state = 'abandoned', finished_at_ms = obs.now_ms
          FROM run, obs WHERE a.run_id = run.run_id AND a.attempt_no = 1 AND a.state = 'claimed'
    ), ev AS (
        INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
        SELECT run.run_id, 3, 'run.cancelled', obs.now_ms FROM run, obs
    )
    SELECT coalesce(array_agg(run.run_id::text ORDER BY run.run_id), '{}') INTO ids FROM run;
    IF cardinality(ids) > 0 THEN
        PERFORM qlsched.console_audit(trigger_id, project, 'runs.cancel',
            jsonb_build_object('cancelled', cardinality(ids), 'run_ids', to_jsonb(ids),
                               'from_ms', from_ms, 'to_ms', to_ms),
            actor, host, note);
    END IF;
    RETURN cardinality(ids);
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_cancel_queued(text, bigint, bigint, text, text, text) FROM PUBLIC;

-- A cancel request for a run a worker holds (dispatching or running): what
-- qlsched.request_cancel (V16) does for one run, the holder stopping it at its next
-- heartbeat (docs/dispatcher.md). Returns 1 when asked, 0 when the run was not held or
-- was asked already; one audit row when asked.
CREATE FUNCTION qlsched.console_request_cancel(run_id uuid, actor text, host text, note text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
BEGIN
    PERFORM qlsched.console_check_who(actor, host);
    IF length(note) > 1000 THEN
        RAISE EXCEPTION 'console_request_cancel: a note has at most 1000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE qlsched.runs x SET cancel_requested_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
     WHERE x.run_id = console_request_cancel.run_id AND x.status IN ('dispatching', 'running')
       AND x.cancel_requested_at_ms IS NULL
    RETURNING x.trigger_id, x.project_id INTO r;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    PERFORM qlsched.console_audit(r.trigger_id, r.project_id, 'runs.cancel_request',
        jsonb_build_object('run_id', run_id::text), actor, host, note);
    RETURN 1;
END
$$;
REVOKE ALL ON FUNCTION qlsched.console_request_cancel(uuid, text, text, text) FROM PUBLIC;
