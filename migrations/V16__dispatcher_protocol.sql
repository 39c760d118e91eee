-- qlsched: expand
-- The dispatcher protocol, enforced by the database (docs/dispatcher.md; issue 33 items 1-3).
--
-- 1. Six functions, owned by the owner role, SECURITY DEFINER, search_path pinned, EXECUTE
--    to the dispatcher role only (granted by `db migrate`, src/store/migrate.rs
--    EXECUTE_GRANTS): dispatch_take, dispatch_start, dispatch_heartbeat, dispatch_finish,
--    dispatch_release, dispatch_expire. A taken attempt carries a lease: a token (stored in
--    attempts.lease_id) and an expiry (lease_expires_at_ms) on the database clock. Every write
--    but the take and the expiry is fenced by both, the way a schedule row's cursor move is:
--    a worker paused past its lease records nothing, starts nothing, extends nothing. Expiry
--    marks a lapsed attempt lost (state failed, error 'lost: …') and queues the run again
--    under a new attempt while the task's spec allows (max_attempts, retry_backoff_ms), or
--    fails it. No replica calls any of them. A seventh, request_cancel (EXECUTE to the admin
--    role only), asks the holders of taken runs to stop them; their heartbeats answer it.
-- 2. Triggers that keep history unforgeable for every role, the direct statements of
--    V10's contract included (they stay granted until the contract migration, a release
--    later): an event after admission must be the event of its run's current status that
--    the run does not have yet, and its seq is assigned here (max + 1); `cancelled` and
--    status `cancelled` move together; a finished attempt is frozen; an untouched attempt
--    is written only by a step of the state machine; an attempt taken through the
--    functions is written only by them; results and errors are bounded; no second attempt
--    while one is live; execution revisions are immutable (the admin role's UPDATE grant goes
--    with the contract).
--
-- Expand: four nullable columns, triggers and functions; nothing an older binary writes is
-- refused. The two partial indexes are built CONCURRENTLY after this transaction
-- (src/store/migrate/apply.rs CONCURRENT_INDEXES). The admission's rows (attempt 1
-- `claimed`, events 1 `run.created` and 2 `run.queued`) pass the WHEN clauses below without
-- calling any trigger function; each admitted run does add one entry to
-- runs_queued_order_idx (the take's order), removed from its predicate when it is taken.

-- The tables this migration changes, locked first in the lock order (src/store/migrate/lint.rs
-- LOCK_ORDER): CREATE TRIGGER takes SHARE ROW EXCLUSIVE, ADD COLUMN ACCESS EXCLUSIVE, each for
-- a catalog change only (no scan, no rewrite).
LOCK TABLE qlsched.execution_revisions IN SHARE ROW EXCLUSIVE MODE;
LOCK TABLE qlsched.runs IN ACCESS EXCLUSIVE MODE;
LOCK TABLE qlsched.attempts IN ACCESS EXCLUSIVE MODE;
LOCK TABLE qlsched.run_events IN SHARE ROW EXCLUSIVE MODE;

-- When an operator asked the dispatcher holding a taken run to stop it
-- (qlsched.request_cancel); its heartbeat answers it, and an expiry no longer retries it.
ALTER TABLE qlsched.runs ADD COLUMN cancel_requested_at_ms bigint;

ALTER TABLE qlsched.attempts
    -- A retried attempt is not taken before this instant (database clock, Unix ms).
    ADD COLUMN not_before_ms bigint,
    -- What dispatch_finish records beside outcome, error and result.
    ADD COLUMN exit_status integer,
    ADD COLUMN output_tail text;

-- "The owner" below: the role running the statement is the tables' owner or a member of it
-- (a superuser). Inside the SECURITY DEFINER functions current_user is the owner.

-- V10's run machine, extended: release and retry move a run back to queued, a run whose
-- pinned spec fails its digest at take fails from queued; only the owner (the functions)
-- may make those moves. The cancelled flag equals (status = 'cancelled') after every update.
CREATE OR REPLACE FUNCTION qlsched.run_status_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    step text := OLD.status || '>' || NEW.status;
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       AND step NOT IN ('queued>dispatching', 'queued>cancelled',
           'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed')
       AND NOT (step IN ('dispatching>queued', 'running>queued', 'queued>failed')
                AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER')) THEN
        RAISE EXCEPTION 'run % may not move from % to %', OLD.run_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.cancelled IS DISTINCT FROM (NEW.status = 'cancelled') THEN
        RAISE EXCEPTION 'run %: cancelled is set together with status cancelled, and only then',
            OLD.run_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

-- V10's attempt machine, extended: a release gives a taken attempt back (dispatching ->
-- claimed), a corrupt pinned spec fails an untouched one (claimed -> failed); owner only.
CREATE OR REPLACE FUNCTION qlsched.attempt_state_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    step text := OLD.state || '>' || NEW.state;
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state
       AND step NOT IN ('claimed>dispatching', 'claimed>abandoned',
           'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed')
       AND NOT (step IN ('dispatching>claimed', 'claimed>failed')
                AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER')) THEN
        RAISE EXCEPTION 'attempt % may not move from % to %', OLD.attempt_id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

-- Every update of an attempt, whoever writes it: a finished attempt is frozen; outside the
-- functions an update is a step of the machine (it moves `state`) and never touches an
-- attempt taken through them; result and error are bounded.
CREATE FUNCTION qlsched.attempt_follows_the_protocol() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('succeeded', 'failed', 'abandoned') THEN
        RAISE EXCEPTION 'attempt % is finished (%): it is frozen', OLD.attempt_id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        IF NEW.state = OLD.state THEN
            RAISE EXCEPTION 'attempt %: a write outside the dispatcher functions must move its state', OLD.attempt_id
                USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.lease_id IS NOT NULL THEN
            RAISE EXCEPTION 'attempt % was taken through qlsched.dispatch_take: only the dispatcher functions write it', OLD.attempt_id
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF octet_length(NEW.result::text) > 65536 OR octet_length(NEW.error) > 8192
       OR octet_length(NEW.output_tail) > 8192 THEN
        RAISE EXCEPTION 'attempt %: result is bounded to 64 KiB, error and output tail to 8 KiB', OLD.attempt_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER attempts_follow_the_protocol BEFORE UPDATE ON qlsched.attempts
    FOR EACH ROW EXECUTE FUNCTION qlsched.attempt_follows_the_protocol();

-- Attempt 1 comes with its run (the admission's one statement; the unique (run_id,
-- attempt_no) refuses a second one). Any later attempt only from dispatch_expire, and only
-- while the run has no live attempt.
CREATE FUNCTION qlsched.attempt_is_the_only_live_one() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'run %: attempts after the first are created only by qlsched.dispatch_expire', NEW.run_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM qlsched.attempts a
                WHERE a.run_id = NEW.run_id AND a.state IN ('claimed', 'dispatching', 'running')) THEN
        RAISE EXCEPTION 'run % already has a live attempt', NEW.run_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER attempts_one_live BEFORE INSERT ON qlsched.attempts
    FOR EACH ROW WHEN (NEW.attempt_no > 1) EXECUTE FUNCTION qlsched.attempt_is_the_only_live_one();

-- An event after the admission's two is the event of its run's current status, once per
-- step: run.queued (queued again), run.dispatching, run.started (running), run.finished
-- (succeeded, failed), run.cancelled; the run's last event must not already be it. Its seq
-- is assigned here, the next after the run's last, so the V10 statements that write a
-- fixed seq stay right after a release. Every writer of a step holds its run row locked
-- (it updated the run in the same transaction), so two steps never race for a seq.
CREATE FUNCTION qlsched.run_event_follows_its_run() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    st text;
    last_seq integer;
    last_kind text;
    want text;
BEGIN
    SELECT r.status INTO st FROM qlsched.runs r WHERE r.run_id = NEW.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_events: run % does not exist', NEW.run_id USING ERRCODE = 'check_violation';
    END IF;
    SELECT e.seq, e.kind INTO last_seq, last_kind FROM qlsched.run_events e
     WHERE e.run_id = NEW.run_id ORDER BY e.seq DESC LIMIT 1;
    want := CASE st WHEN 'queued' THEN 'run.queued' WHEN 'dispatching' THEN 'run.dispatching'
                    WHEN 'running' THEN 'run.started' WHEN 'cancelled' THEN 'run.cancelled'
                    ELSE 'run.finished' END;
    IF NEW.kind <> want OR last_seq IS NULL OR last_kind = want THEN
        RAISE EXCEPTION 'run_events: % is not the next event of run % (status %, last event %)',
            NEW.kind, NEW.run_id, st, coalesce(last_kind, 'none')
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.seq := last_seq + 1;
    RETURN NEW;
END
$$;

CREATE TRIGGER run_events_follow_their_run BEFORE INSERT ON qlsched.run_events
    FOR EACH ROW
    WHEN (NOT ((NEW.seq = 1 AND NEW.kind = 'run.created') OR (NEW.seq = 2 AND NEW.kind = 'run.queued')))
    EXECUTE FUNCTION qlsched.run_event_follows_its_run();

-- What already-queued runs execute never changes: no UPDATE of an execution revision, by
-- any role (a superuser who tampers for a test disables this trigger first).
CREATE FUNCTION qlsched.refuse_revision_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'qlsched.execution_revisions rows are immutable: publish the task again for a new revision'
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER execution_revisions_are_immutable BEFORE UPDATE ON qlsched.execution_revisions
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.refuse_revision_update();

-- An integer setting of a task's spec (JSON object) within lo..hi, or the default when the
-- spec is not JSON, lacks the key or holds anything else.
CREATE FUNCTION qlsched.spec_setting(spec text, key text, dflt bigint, lo bigint, hi bigint)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v bigint;
BEGIN
    v := (spec::jsonb ->> key)::bigint;
    RETURN CASE WHEN v BETWEEN lo AND hi THEN v ELSE dflt END;
EXCEPTION WHEN others THEN
    RETURN dflt;
END
$$;

-- The pool a task's spec names ("pool", default 'default').
CREATE FUNCTION qlsched.spec_pool(spec text) RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN coalesce(spec::jsonb ->> 'pool', 'default');
EXCEPTION WHEN others THEN
    RETURN 'default';
END
$$;

-- Takes up to max_runs queued runs for worker_id in queued_at_ms order across every
-- replica (ties in any order), from the given pools (NULL: all), each under a lease of
-- lease_ms from the database clock. A run is taken when it is queued, not cancelled, and
-- its one live attempt is `claimed`, untouched and past its not_before_ms. Runs locked by
-- anyone (another take, a `runs cancel`) are skipped (FOR UPDATE SKIP LOCKED); PostgreSQL
-- re-checks the status on the newest row version, so a run is taken once. A run whose
-- pinned execution revision no longer matches its digest is failed here, never handed out.
-- Returns the lease token to pass to every later call.
CREATE FUNCTION qlsched.dispatch_take(worker_id text, pools text[], max_runs integer, lease_ms bigint)
RETURNS TABLE (run_id uuid, attempt_id uuid, attempt_no integer, lease_token uuid,
               lease_expires_at_ms bigint, trigger_id text, scheduled_for_ms bigint,
               idempotency_key text, spec text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    good uuid[];
    bad uuid[];
BEGIN
    IF worker_id IS NULL OR length(worker_id) NOT BETWEEN 1 AND 200
       OR max_runs IS NULL OR max_runs NOT BETWEEN 1 AND 1000
       OR lease_ms IS NULL OR lease_ms NOT BETWEEN 1000 AND 86400000 THEN
        RAISE EXCEPTION 'dispatch_take: worker_id 1..200 characters, max_runs 1..1000, lease_ms 1000..86400000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(p.run_id) FILTER (WHERE p.intact), array_agg(p.run_id) FILTER (WHERE NOT p.intact)
      INTO good, bad
      FROM (SELECT r.run_id,
                   e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex') AS intact
              FROM qlsched.runs r
              JOIN qlsched.execution_revisions e ON e.execution_revision_id = r.execution_revision_id
             WHERE r.status = 'queued' AND NOT r.cancelled
               AND (pools IS NULL OR qlsched.spec_pool(e.spec) = ANY (pools))
               AND EXISTS (SELECT 1 FROM qlsched.attempts a
                            WHERE a.run_id = r.run_id AND a.state = 'claimed'
                              AND num_nonnulls(a.worker_id, a.session_id, a.lease_id,
                                               a.lease_expires_at_ms, a.offer_id,
                                               a.callback_token, a.started_at_ms,
                                               a.finished_at_ms, a.result, a.error) = 0
                              AND (a.not_before_ms IS NULL OR a.not_before_ms <= now_ms))
             ORDER BY r.queued_at_ms
             LIMIT max_runs
             FOR UPDATE OF r SKIP LOCKED) p;
    IF bad IS NOT NULL THEN
        UPDATE qlsched.runs r SET status = 'failed' WHERE r.run_id = ANY (bad);
        UPDATE qlsched.attempts a
           SET state = 'failed', finished_at_ms = now_ms,
               error = 'the execution revision this run pins fails its digest: not executed'
         WHERE a.run_id = ANY (bad) AND a.state = 'claimed';
        INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
        SELECT b, 3, 'run.finished', now_ms FROM unnest(bad) b;
    END IF;
    IF good IS NULL THEN
        RETURN;
    END IF;
    UPDATE qlsched.runs r SET status = 'dispatching' WHERE r.run_id = ANY (good);
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT g, 3, 'run.dispatching', now_ms FROM unnest(good) g;
    RETURN QUERY
    WITH att AS (
        UPDATE qlsched.attempts a
           SET state = 'dispatching', worker_id = dispatch_take.worker_id,
               lease_id = gen_random_uuid()::text, lease_expires_at_ms = now_ms + lease_ms
         WHERE a.run_id = ANY (good) AND a.state = 'claimed'
        RETURNING a.run_id, a.attempt_id, a.attempt_no, a.lease_id, a.lease_expires_at_ms)
    SELECT att.run_id, att.attempt_id, att.attempt_no, att.lease_id::uuid, att.lease_expires_at_ms,
           r.trigger_id, r.scheduled_for_ms, r.idempotency_key, e.spec
      FROM att
      JOIN qlsched.runs r ON r.run_id = att.run_id
      JOIN qlsched.execution_revisions e ON e.execution_revision_id = r.execution_revision_id
     ORDER BY r.queued_at_ms;
END
$$;

-- The fence of every call below: locks the attempt's run FOR UPDATE (the lock a take, a
-- cancel, an expiry and every other call ask for), then reads the attempt again — a new
-- snapshot, after whoever held the lock committed — and answers the run id when the attempt
-- is in one of the given states, holds this token and its lease has not ended by the
-- database clock read after the lock; NULL otherwise. (One statement joining attempt and
-- run FOR UPDATE OF the run would re-check only the run's newest version after a wait, and
-- pass on the attempt as it was before a concurrent release or expiry.)
CREATE FUNCTION qlsched.dispatch_held(attempt uuid, token uuid, states text[])
RETURNS uuid LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    run uuid;
BEGIN
    SELECT a.run_id INTO run FROM qlsched.attempts a WHERE a.attempt_id = attempt;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM qlsched.runs r WHERE r.run_id = run FOR UPDATE;
    PERFORM 1 FROM qlsched.attempts a
      WHERE a.attempt_id = attempt AND a.lease_id = token::text AND a.state = ANY (states)
        AND a.lease_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN run;
END
$$;

-- The work started: attempt and run `running`, started_at_ms, event run.started; the lease
-- is extended to lease_ms from now. false (and nothing written) when the lease is not held.
CREATE FUNCTION qlsched.dispatch_start(attempt uuid, token uuid, lease_ms bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms bigint;
    run uuid;
BEGIN
    IF lease_ms IS NULL OR lease_ms NOT BETWEEN 1000 AND 86400000 THEN
        RAISE EXCEPTION 'dispatch_start: lease_ms 1000..86400000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    run := qlsched.dispatch_held(attempt, token, ARRAY['dispatching']);
    IF run IS NULL THEN
        RETURN false;
    END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    UPDATE qlsched.runs r SET status = 'running' WHERE r.run_id = run;
    UPDATE qlsched.attempts a SET state = 'running', started_at_ms = now_ms,
           lease_expires_at_ms = now_ms + lease_ms
     WHERE a.attempt_id = attempt;
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) VALUES (run, 3, 'run.started', now_ms);
    RETURN true;
END
$$;

-- Extends a held lease to lease_ms from now. Answers the new expiry (NULL when the lease is
-- not held: ended, released, expired, finished, or another token; stop the work) and
-- whether an operator asked to stop the run (qlsched.request_cancel): finish it `failed`.
CREATE FUNCTION qlsched.dispatch_heartbeat(attempt uuid, token uuid, lease_ms bigint)
RETURNS TABLE (lease_expires_at_ms bigint, cancel_requested boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    now_ms bigint;
    run uuid;
BEGIN
    IF lease_ms IS NULL OR lease_ms NOT BETWEEN 1000 AND 86400000 THEN
        RAISE EXCEPTION 'dispatch_heartbeat: lease_ms 1000..86400000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    run := qlsched.dispatch_held(attempt, token, ARRAY['dispatching', 'running']);
    IF run IS NULL THEN
        RETURN QUERY SELECT NULL::bigint, false;
        RETURN;
    END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    UPDATE qlsched.attempts a SET lease_expires_at_ms = now_ms + lease_ms WHERE a.attempt_id = attempt;
    RETURN QUERY SELECT now_ms + lease_ms, r.cancel_requested_at_ms IS NOT NULL
                   FROM qlsched.runs r WHERE r.run_id = run;
END
$$;

-- Records how the work ended: outcome 'succeeded' (only from running) or 'failed', the exit
-- status, the last 8 KiB of output, an error (at most 8 KiB) and a result (at most 64 KiB).
-- Attempt and run take the outcome, event run.finished. false when the lease is not held.
CREATE FUNCTION qlsched.dispatch_finish(attempt uuid, token uuid, outcome text, exit_status integer,
                                        output_tail text, error text, result jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms bigint;
    run uuid;
BEGIN
    IF outcome IS NULL OR outcome NOT IN ('succeeded', 'failed')
       OR octet_length(error) > 8192 OR octet_length(result::text) > 65536 THEN
        RAISE EXCEPTION 'dispatch_finish: outcome succeeded|failed, error at most 8 KiB, result at most 64 KiB'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    run := qlsched.dispatch_held(attempt, token,
                                 CASE outcome WHEN 'succeeded' THEN ARRAY['running']
                                              ELSE ARRAY['dispatching', 'running'] END);
    IF run IS NULL THEN
        RETURN false;
    END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    UPDATE qlsched.runs r SET status = outcome WHERE r.run_id = run;
    UPDATE qlsched.attempts a
       SET state = outcome, finished_at_ms = now_ms, exit_status = dispatch_finish.exit_status,
           output_tail = CASE WHEN octet_length(dispatch_finish.output_tail) > 8192
                              THEN right(dispatch_finish.output_tail, 2048)
                              ELSE dispatch_finish.output_tail END,
           error = dispatch_finish.error, result = dispatch_finish.result
     WHERE a.attempt_id = attempt;
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) VALUES (run, 3, 'run.finished', now_ms);
    RETURN true;
END
$$;

-- Gives a held attempt whose work never started back (a graceful stop): attempt `claimed`
-- and untouched again, run `queued` (its queued_at_ms unchanged: it is taken first), event
-- run.queued. false when the lease is not held or the work started.
CREATE FUNCTION qlsched.dispatch_release(attempt uuid, token uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms bigint;
    run uuid;
BEGIN
    run := qlsched.dispatch_held(attempt, token, ARRAY['dispatching']);
    IF run IS NULL THEN
        RETURN false;
    END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    UPDATE qlsched.runs r SET status = 'queued' WHERE r.run_id = run;
    UPDATE qlsched.attempts a
       SET state = 'claimed', worker_id = NULL, lease_id = NULL, lease_expires_at_ms = NULL
     WHERE a.attempt_id = attempt;
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) VALUES (run, 3, 'run.queued', now_ms);
    RETURN true;
END
$$;

-- Up to max_rows attempts taken through dispatch_take whose lease ended by the database
-- clock, oldest expiry first, are marked lost (state failed, error 'lost: …'); each run is
-- queued again under attempt_no + 1 (same run, same idempotency key), not taken before
-- retry_backoff_ms from now, while attempt_no < max_attempts of its pinned spec (default
-- 1) and no cancel was requested, and failed otherwise. Runs locked by someone (a late call of the holder, a take) are
-- skipped. Any dispatcher or worker may run it; replicas never do.
CREATE FUNCTION qlsched.dispatch_expire(max_rows integer)
RETURNS TABLE (lost bigint, retried bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    x record;
    n_lost bigint := 0;
    n_retried bigint := 0;
    max_attempts bigint;
BEGIN
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'dispatch_expire: max_rows 1..10000' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR x IN
        SELECT a.attempt_id, a.attempt_no, a.lease_expires_at_ms, r.run_id, e.spec,
               r.cancel_requested_at_ms IS NOT NULL AS cancel_requested
          FROM qlsched.attempts a
          JOIN qlsched.runs r ON r.run_id = a.run_id
          JOIN qlsched.execution_revisions e ON e.execution_revision_id = r.execution_revision_id
         WHERE a.state IN ('dispatching', 'running') AND a.lease_id IS NOT NULL
           AND a.lease_expires_at_ms <= now_ms
         ORDER BY a.lease_expires_at_ms
         LIMIT max_rows
         FOR UPDATE OF r SKIP LOCKED
    LOOP
        -- Re-read under the run lock: a finish or heartbeat may have committed meanwhile.
        PERFORM 1 FROM qlsched.attempts a
          WHERE a.attempt_id = x.attempt_id AND a.state IN ('dispatching', 'running')
            AND a.lease_expires_at_ms <= now_ms;
        CONTINUE WHEN NOT FOUND;
        max_attempts := qlsched.spec_setting(x.spec, 'max_attempts', 1, 1, 100);
        UPDATE qlsched.attempts a
           SET state = 'failed', finished_at_ms = now_ms,
               error = format('lost: lease expired at %s ms (attempt %s of %s)%s',
                              x.lease_expires_at_ms, x.attempt_no, max_attempts,
                              CASE WHEN x.cancel_requested THEN '; a cancel was requested: not retried' ELSE '' END)
         WHERE a.attempt_id = x.attempt_id;
        n_lost := n_lost + 1;
        IF x.attempt_no < max_attempts AND NOT x.cancel_requested THEN
            UPDATE qlsched.runs r SET status = 'queued' WHERE r.run_id = x.run_id;
            INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state,
                                          created_at_ms, not_before_ms)
            VALUES (gen_random_uuid(), x.run_id, x.attempt_no + 1, 'remote_worker', 'claimed', now_ms,
                    now_ms + qlsched.spec_setting(x.spec, 'retry_backoff_ms', 0, 0, 86400000));
            INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) VALUES (x.run_id, 3, 'run.queued', now_ms);
            n_retried := n_retried + 1;
        ELSE
            UPDATE qlsched.runs r SET status = 'failed' WHERE r.run_id = x.run_id;
            INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) VALUES (x.run_id, 3, 'run.finished', now_ms);
        END IF;
    END LOOP;
    RETURN QUERY SELECT n_lost, n_retried;
END
$$;

-- An operator asks the dispatchers holding run_ids (at most 10000; dispatching or running)
-- to stop them: their heartbeats answer cancel_requested, an expiry no longer retries them.
-- The run stays the dispatcher's: its holder finishes it (failed), or its lease ends.
-- Returns how many runs were asked. EXECUTE to the admin role only (`runs cancel` of taken
-- runs is an operator command). Locking: each run's row lock, taken by the UPDATE (it waits
-- for a protocol call in flight on the same run).
CREATE FUNCTION qlsched.request_cancel(run_ids uuid[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    IF run_ids IS NULL OR cardinality(run_ids) > 10000 THEN
        RAISE EXCEPTION 'request_cancel: run_ids must be given, at most 10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE qlsched.runs r SET cancel_requested_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
     WHERE r.run_id = ANY (run_ids) AND r.status IN ('dispatching', 'running')
       AND r.cancel_requested_at_ms IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION qlsched.request_cancel(uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_take(text, text[], integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_start(uuid, uuid, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_heartbeat(uuid, uuid, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_finish(uuid, uuid, text, integer, text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_release(uuid, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_expire(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.dispatch_held(uuid, uuid, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.spec_setting(text, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.spec_pool(text) FROM PUBLIC;
