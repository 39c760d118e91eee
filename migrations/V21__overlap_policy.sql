-- qlsched: expand
-- The overlap policy of a trigger (docs/policies-overlap.md; docs/design.md, "Overlap";
-- issue 35 item 1): allow (the default, today's behaviour), forbid, buffer_one, replace.
--
-- The decision reads one thing, the number of unfinished runs (queued, dispatching or
-- running; a run waiting for a retry is queued) of the trigger, kept in the trigger's row of
-- qlsched.trigger_overlap, and every writer that changes that number locks that row first:
--
-- - a run is *counted* when its overlap_policy column is set (the admission, `trigger
--   fire` and `trigger backfill` set it from the trigger's policy; NULL for an allow
--   trigger, so an allow trigger's runs call no trigger function at all: the WHEN clauses
--   below are false for them);
-- - inserting a counted run (any path) runs overlap_admit() first: it locks the row, reads
--   the count and decides: admit, skip (recorded: a count by reason and the last
--   instants), buffer (buffer_one: the whole run row kept in the row), or, for replace,
--   cancel the unfinished runs (a queued one cancelled, a taken one asked to stop at its
--   next heartbeat) and admit; a run really inserted raises the count (overlap_counted());
-- - a counted run that ends (succeeded, failed, cancelled, or a queued run pruned) runs
--   overlap_run_ended(): it locks the row, lowers the count and, when it reaches 0 with an
--   occurrence buffered, admits that occurrence in the same transaction;
-- - overlap_adopt() (publish, when a trigger's policy becomes something other than allow)
--   creates or locks the row, marks the trigger's unfinished runs counted and recounts them.
--
-- The admission is SERIALIZABLE, the others READ COMMITTED; none relies on SSI for this: a
-- writer that changed the row after the admission's snapshot makes the admission's lock
-- fail with a serialization failure (retried), one in flight makes it wait for that
-- outcome, and one that comes later waits for the admission's commit.
--
-- Expand: a nullable column on runs (a catalog change), a table, functions and triggers.
-- An older binary never sets the column, so its runs are not counted (and never refused).

-- The tables this migration changes, in the lock order (src/schema/lint.rs LOCK_ORDER):
-- ADD COLUMN takes ACCESS EXCLUSIVE for a catalog change only (a constant default, no
-- rewrite); the CHECK on triggers scans the definitions once, the one on runs is NOT VALID
-- (new rows are checked, admitted work is not scanned); CREATE TRIGGER takes SHARE ROW
-- EXCLUSIVE.
LOCK TABLE qlsched.triggers IN ACCESS EXCLUSIVE MODE;
LOCK TABLE qlsched.runs IN ACCESS EXCLUSIVE MODE;

ALTER TABLE qlsched.triggers
    ADD COLUMN overlap_policy text NOT NULL DEFAULT 'allow'
        CHECK (overlap_policy IN ('allow', 'forbid', 'buffer_one', 'replace'));

-- The policy the run was admitted under when it is counted (see above); NULL: not counted.
ALTER TABLE qlsched.runs ADD COLUMN overlap_policy text;
ALTER TABLE qlsched.runs ADD CONSTRAINT runs_overlap_policy_check
    CHECK (overlap_policy IN ('allow', 'forbid', 'buffer_one', 'replace')) NOT VALID;

-- One row per trigger whose policy was ever other than allow: the lock of its decisions.
CREATE TABLE qlsched.trigger_overlap (
    trigger_id        text PRIMARY KEY REFERENCES qlsched.triggers,
    -- Counted runs of the trigger that are queued, dispatching or running.
    unfinished        integer NOT NULL DEFAULT 0 CHECK (unfinished >= 0),
    -- buffer_one: the run row of the one occurrence kept (jsonb of qlsched.runs), admitted
    -- when the count reaches 0.
    buffered          jsonb,
    -- Occurrences not admitted because of an unfinished run (reason `overlap`).
    skipped_overlap   bigint NOT NULL DEFAULT 0,
    -- scheduled_for_ms of the last skipped occurrences, newest last (at most 5).
    last_skipped_ms   bigint[] NOT NULL DEFAULT '{}',
    updated_at_ms     bigint NOT NULL
-- Room on each page so the count's updates stay HOT: an update that inserted an index entry
-- would conflict with the page-level predicate locks concurrent SERIALIZABLE admissions
-- hold on the primary key's leaf pages.
) WITH (fillfactor = 50);

-- Records a skip of `sf` (reason overlap) on the locked row of `trigger`.
CREATE FUNCTION qlsched.overlap_record_skip(trigger text, sf bigint, now_ms bigint)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE qlsched.trigger_overlap o
       SET skipped_overlap = o.skipped_overlap + 1,
           last_skipped_ms = (o.last_skipped_ms || sf)[greatest(cardinality(o.last_skipped_ms) - 3, 1):],
           updated_at_ms = now_ms
     WHERE o.trigger_id = trigger;
$$;

-- BEFORE INSERT of a counted run: the decision. The request's own policy (`trigger fire
-- --overlap`, `trigger backfill`) is the run's overlap_policy. Returns NULL (nothing
-- inserted) for a skip or a kept occurrence. With no unfinished run (the common case) it
-- only locks the row: the count is raised by overlap_counted() once the run is really
-- inserted (an existing key is dropped by the statement's ON CONFLICT after this trigger),
-- and nothing else is read, so a SERIALIZABLE admission takes no predicate lock on the
-- pages of runs' keys that other replicas' admissions insert into.
CREATE FUNCTION qlsched.overlap_admit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Point accesses only: under SERIALIZABLE a sequential scan would take a relation-level
-- predicate lock on the small table and conflict with every other admission.
SET enable_seqscan = off
AS $$
DECLARE
    now_ms bigint;
    n integer;
    has_buffer boolean;
BEGIN
    IF NEW.overlap_policy = 'replace' THEN
        -- The runs before the row: the order of every run end (run row, then this row).
        PERFORM 1 FROM qlsched.runs r
          WHERE r.trigger_id = NEW.trigger_id AND r.status IN ('queued', 'dispatching', 'running')
            AND r.overlap_policy IS NOT NULL
          FOR UPDATE;
    END IF;
    SELECT o.unfinished, o.buffered IS NOT NULL INTO n, has_buffer
      FROM qlsched.trigger_overlap o WHERE o.trigger_id = NEW.trigger_id FOR UPDATE;
    IF NOT FOUND THEN
        -- Not adopted (a run marked by hand): not counted, nothing decided.
        NEW.overlap_policy := NULL;
        RETURN NEW;
    END IF;
    IF n = 0 OR NEW.overlap_policy = 'allow' THEN
        RETURN NEW;
    END IF;
    -- A key that exists already is left to the statement's ON CONFLICT: nothing decided.
    IF EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.idempotency_key = NEW.idempotency_key) THEN
        RETURN NEW;
    END IF;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    IF NEW.overlap_policy = 'forbid' THEN
        PERFORM qlsched.overlap_record_skip(NEW.trigger_id, NEW.scheduled_for_ms, now_ms);
        RETURN NULL;
    END IF;
    IF NEW.overlap_policy = 'buffer_one' THEN
        IF has_buffer THEN
            PERFORM qlsched.overlap_record_skip(NEW.trigger_id, NEW.scheduled_for_ms, now_ms);
        ELSE
            UPDATE qlsched.trigger_overlap o SET buffered = to_jsonb(NEW), updated_at_ms = now_ms
             WHERE o.trigger_id = NEW.trigger_id;
        END IF;
        RETURN NULL;
    END IF;
    PERFORM qlsched.overlap_replace(NEW.trigger_id, now_ms);
    RETURN NEW;
END
$$;

-- AFTER INSERT of a counted run (the row locked by overlap_admit in the same transaction):
-- the count goes up.
CREATE FUNCTION qlsched.overlap_counted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    UPDATE qlsched.trigger_overlap o
       SET unfinished = o.unfinished + 1,
           updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
     WHERE o.trigger_id = NEW.trigger_id;
    RETURN NULL;
END
$$;

-- replace: every unfinished counted run of `trigger` (locked by the caller) gets a cancel:
-- a queued run whose live attempt is untouched is cancelled (run cancelled, attempt
-- abandoned, event run.cancelled; its end lowers the count), a taken one is asked to stop
-- (cancel_requested_at_ms: its holder's next heartbeat answers it, an expiry no longer
-- retries it), as qlsched.request_cancel does for an operator.
CREATE FUNCTION qlsched.overlap_replace(trigger text, now_ms bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q uuid[];
BEGIN
    SELECT array_agg(r.run_id) INTO q FROM qlsched.runs r
     WHERE r.trigger_id = trigger AND r.status = 'queued' AND r.overlap_policy IS NOT NULL
       AND NOT r.cancelled;
    IF q IS NOT NULL THEN
        UPDATE qlsched.runs r SET status = 'cancelled', cancelled = true WHERE r.run_id = ANY (q);
        UPDATE qlsched.attempts a SET state = 'abandoned', finished_at_ms = now_ms
         WHERE a.run_id = ANY (q) AND a.state = 'claimed';
        INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
        SELECT x, 3, 'run.cancelled', now_ms FROM unnest(q) AS x;
    END IF;
    UPDATE qlsched.runs r SET cancel_requested_at_ms = now_ms
     WHERE r.trigger_id = trigger AND r.status IN ('dispatching', 'running')
       AND r.overlap_policy IS NOT NULL AND r.cancel_requested_at_ms IS NULL;
END
$$;

-- AFTER a counted run ended (status succeeded, failed or cancelled, or a queued run
-- deleted by a prune): the count goes down under the row's lock; when it reaches 0 and an
-- occurrence is buffered, that occurrence is admitted now (run, claimed attempt, events
-- run.created and run.queued, queued_at_ms now) while the trigger is enabled, not deleted
-- and its project active; otherwise it is recorded as a skip. Runs as the owner whatever
-- role ended the run (a dispatcher's protocol call, an admin's `runs cancel`).
CREATE FUNCTION qlsched.overlap_run_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    n integer;
    buf jsonb;
    r qlsched.runs;
    live boolean;
BEGIN
    SELECT o.unfinished, o.buffered INTO n, buf
      FROM qlsched.trigger_overlap o WHERE o.trigger_id = OLD.trigger_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    n := greatest(n - 1, 0);
    UPDATE qlsched.trigger_overlap o
       SET unfinished = n, buffered = CASE WHEN n = 0 THEN NULL ELSE o.buffered END,
           updated_at_ms = now_ms
     WHERE o.trigger_id = OLD.trigger_id;
    IF n > 0 OR buf IS NULL THEN
        RETURN NULL;
    END IF;
    r := jsonb_populate_record(NULL::qlsched.runs, buf);
    SELECT t.enabled AND t.deleted_at_ms IS NULL AND p.status = 'active' INTO live
      FROM qlsched.triggers t JOIN qlsched.projects p ON p.project_id = t.project_id
     WHERE t.trigger_id = r.trigger_id;
    IF NOT coalesce(live, false) THEN
        PERFORM qlsched.overlap_record_skip(r.trigger_id, r.scheduled_for_ms, now_ms);
        RETURN NULL;
    END IF;
    r.queued_at_ms := now_ms;
    INSERT INTO qlsched.runs SELECT r.* ON CONFLICT (idempotency_key) DO NOTHING;
    IF FOUND THEN
        INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
        VALUES (gen_random_uuid(), r.run_id, 1, 'remote_worker', 'claimed', now_ms);
        INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
        VALUES (r.run_id, 1, 'run.created', now_ms), (r.run_id, 2, 'run.queued', now_ms);
    END IF;
    RETURN NULL;
END
$$;

-- Makes `trigger`'s unfinished runs counted and its row's count exact: called by `trigger
-- publish` (admin role) in the publish transaction when the policy becomes other than
-- allow. Locking: the row first (created or locked by the upsert), then the runs not
-- counted yet (their ends take no row lock, so no cycle with a run end), then the count in
-- a fresh snapshot: a counted run's end in flight either committed before (excluded) or
-- waits for this transaction (counted, then lowered). Admissions, fires and backfills of
-- the trigger are held off by the caller's locks (the trigger row, the schedule row).
CREATE FUNCTION qlsched.overlap_adopt(trigger text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    n integer;
BEGIN
    INSERT INTO qlsched.trigger_overlap AS o (trigger_id, updated_at_ms) VALUES (trigger, now_ms)
    ON CONFLICT (trigger_id) DO UPDATE SET updated_at_ms = now_ms;
    UPDATE qlsched.runs r SET overlap_policy = 'allow'
     WHERE r.trigger_id = trigger AND r.status IN ('queued', 'dispatching', 'running')
       AND r.overlap_policy IS NULL;
    SELECT count(*) INTO n FROM qlsched.runs r
     WHERE r.trigger_id = trigger AND r.status IN ('queued', 'dispatching', 'running');
    UPDATE qlsched.trigger_overlap o SET unfinished = n WHERE o.trigger_id = trigger;
    RETURN n;
END
$$;

-- Retention of the recorded skips: the instants scheduled before `before_ms` leave the list
-- of the last ones (the count stays). Called by the replica that holds the prune lease after
-- its batches, with the horizon it pruned finished runs to (src/retention.rs); EXECUTE to
-- the runtime role only. Locking: each changed row's lock, one short statement; a row an
-- admission holds is waited for.
CREATE FUNCTION qlsched.overlap_prune_skips(before_ms bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    IF before_ms IS NULL THEN
        RAISE EXCEPTION 'overlap_prune_skips: before_ms must be given' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE qlsched.trigger_overlap o
       SET last_skipped_ms = ARRAY(SELECT x FROM unnest(o.last_skipped_ms) WITH ORDINALITY AS u(x, i)
                                    WHERE x >= before_ms ORDER BY i)
     WHERE o.last_skipped_ms[1] < before_ms;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE TRIGGER runs_overlap_admit BEFORE INSERT ON qlsched.runs
    FOR EACH ROW WHEN (NEW.overlap_policy IS NOT NULL)
    EXECUTE FUNCTION qlsched.overlap_admit();
CREATE TRIGGER runs_overlap_counted AFTER INSERT ON qlsched.runs
    FOR EACH ROW WHEN (NEW.overlap_policy IS NOT NULL)
    EXECUTE FUNCTION qlsched.overlap_counted();
CREATE TRIGGER runs_overlap_ended AFTER UPDATE OF status ON qlsched.runs
    FOR EACH ROW WHEN (NEW.overlap_policy IS NOT NULL
                       AND OLD.status IN ('queued', 'dispatching', 'running')
                       AND NEW.status IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION qlsched.overlap_run_ended();
CREATE TRIGGER runs_overlap_pruned AFTER DELETE ON qlsched.runs
    FOR EACH ROW WHEN (OLD.overlap_policy IS NOT NULL
                       AND OLD.status IN ('queued', 'dispatching', 'running'))
    EXECUTE FUNCTION qlsched.overlap_run_ended();

REVOKE ALL ON FUNCTION qlsched.overlap_record_skip(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.overlap_admit() FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.overlap_counted() FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.overlap_replace(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.overlap_run_ended() FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.overlap_adopt(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION qlsched.overlap_prune_skips(bigint) FROM PUBLIC;
