-- qlsched: expand
-- A forbid trigger's admission writes nothing but the schedule row when the trigger has no
-- unfinished run (docs/policies-overlap.md, "What it costs"; docs/design.md, "Overlap").
--
-- Until now every forbid or buffer_one occurrence cost one more row write: the admission
-- raised the count on the trigger's qlsched.trigger_overlap row (V26, V27), even in the
-- common case, where the previous run had ended long before. The schedule row is written by
-- that admission anyway (its cursor), so part of the count is now kept there:
--
--   unfinished runs = trigger_overlap.unfinished
--                     + trigger_schedules.overlap_admitted - trigger_overlap.overlap_released
--
-- - A scheduled admission whose claim found the trigger idle (that sum 0, nothing kept) adds
--   1 to overlap_admitted in the UPDATE that advances the cursor (the "fast path",
--   src/store/admission.rs): no read or write of the overlap row. Every other member is
--   decided by overlap_decide_with, as V27's overlap_decide did, on the sum.
-- - A run end lowers the sum under the overlap row's lock: overlap_released + 1 while the
--   schedule row's part is above 0, else unfinished - 1. It reads the schedule row without
--   locking it (the lock order is the schedule row before the overlap row).
-- - An insert of a counted run outside an admission (`trigger fire`, `trigger backfill`, the
--   console's) locks the schedule row, then the overlap row, and when the trigger has no
--   unfinished run adds 1 to both overlap_admitted and overlap_released (the sum
--   unchanged) before deciding and counting as before. That write is what keeps the fast
--   path exact: an admission whose claim read the trigger idle before that insert either
--   finds the schedule row at another address (refused, decided again at once) or fails to
--   serialize (retried, then refused the same way), and a claim that read the two rows at
--   different moments sees a sum above 0.
-- - overlap_adopt (publish) recounts as before and sets overlap_released to
--   overlap_admitted, so a trigger whose policy is not forbid keeps the schedule row's
--   part at 0: the row trigger inside an admission (replace, buffer_one keeping its
--   occurrence) can read the count from the overlap row alone.
-- - A buffered occurrence admitted at a run end is inserted as counted by the run end itself
--   (it holds the overlap row; no schedule row lock after it).
--
-- Why it is exact without SSI: the fast path's precondition (no unfinished run, nothing
-- kept) can only end by an insert of a counted run, and every such insert outside the
-- lease holder's own admission writes the schedule row first. A run end cannot make an idle
-- trigger busy.
--
-- Older binaries: their claim reads the overlap row's TID and their admission calls
-- overlap_decide, which now reads the schedule row's part by the trigger's key and decides
-- on the sum (under SERIALIZABLE that read takes a page-level predicate lock on the schedule
-- table's primary key: possibly more serialization retries while they run); their counted
-- inserts through the row trigger (every one for a binary older than V26) read and mark it
-- as a fire does. Their `trigger show` prints the overlap row's part of the count only.
--
-- Expand: two columns with a constant default (catalog changes, no rewrite), functions
-- replaced in place with the same signatures (grants kept), two new functions.

LOCK TABLE qlsched.trigger_schedules IN ACCESS EXCLUSIVE MODE;
LOCK TABLE qlsched.trigger_overlap IN ACCESS EXCLUSIVE MODE;

-- Counted runs admitted through the schedule row (the fast path), and the manual inserts'
-- marks (see above). Only ever raised.
ALTER TABLE qlsched.trigger_schedules ADD COLUMN overlap_admitted bigint NOT NULL DEFAULT 0;
-- Of overlap_admitted, the runs that ended (or were not inserted) and the marks. Only ever
-- raised.
ALTER TABLE qlsched.trigger_overlap ADD COLUMN overlap_released bigint NOT NULL DEFAULT 0;

-- V27's overlap_decide on the sum: `admitted` is each member's schedule row's
-- overlap_admitted as the admission's UPDATE left it. Reads and writes each member's row in
-- turn, reached by the TID the claim read (V27's comments hold).
CREATE FUNCTION qlsched.overlap_decide_with(tids tid[], trigger_ids text[], policies text[], keys text[],
                                            tombed boolean[], sfs bigint[], admitted bigint[])
RETURNS TABLE (trigger_id text, busy boolean, kept boolean)
LANGUAGE plpgsql STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    ts tid[];
    ids text[];
    bs boolean[];
    ks boolean[];
BEGIN
    WITH w AS (
        UPDATE qlsched.trigger_overlap o
           SET last_busy = o.unfinished + x.adm - o.overlap_released > 0 AND NOT x.tombed
                           AND NOT EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.idempotency_key = x.ikey),
               unfinished = o.unfinished
                            + (NOT x.tombed
                               AND NOT (o.unfinished + x.adm - o.overlap_released > 0
                                        AND NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                                         WHERE r.idempotency_key = x.ikey)))::int,
               updated_at_ms = now_ms
          FROM unnest(tids, trigger_ids, keys, tombed, admitted) AS x(tid, trigger_id, ikey, tombed, adm)
         WHERE o.ctid = x.tid AND o.trigger_id || '' = x.trigger_id
        RETURNING o.ctid, o.trigger_id, o.last_busy, o.buffered IS NOT NULL AS kept
    )
    SELECT array_agg(w.ctid), array_agg(w.trigger_id), array_agg(w.last_busy), array_agg(w.kept)
      INTO ts, ids, bs, ks FROM w;
    IF coalesce(cardinality(ids), 0) < cardinality(trigger_ids) THEN
        WITH w AS (
            UPDATE qlsched.trigger_overlap o
               SET last_busy = o.unfinished + x.adm - o.overlap_released > 0 AND NOT x.tombed
                               AND NOT EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.idempotency_key = x.ikey),
                   unfinished = o.unfinished
                                + (NOT x.tombed
                                   AND NOT (o.unfinished + x.adm - o.overlap_released > 0
                                            AND NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                                             WHERE r.idempotency_key = x.ikey)))::int,
                   updated_at_ms = now_ms
              FROM unnest(trigger_ids, keys, tombed, admitted) AS x(trigger_id, ikey, tombed, adm)
             WHERE o.trigger_id = x.trigger_id AND x.trigger_id <> ALL (coalesce(ids, '{}'))
            RETURNING o.ctid, o.trigger_id, o.last_busy, o.buffered IS NOT NULL AS kept
        )
        SELECT coalesce(ts, '{}') || coalesce(array_agg(w.ctid), '{}'),
               coalesce(ids, '{}') || coalesce(array_agg(w.trigger_id), '{}'),
               coalesce(bs, '{}') || coalesce(array_agg(w.last_busy), '{}'),
               coalesce(ks, '{}') || coalesce(array_agg(w.kept), '{}')
          INTO ts, ids, bs, ks FROM w;
    END IF;
    IF true = ANY (bs) THEN
        UPDATE qlsched.trigger_overlap o
           SET skipped_overlap = o.skipped_overlap + 1,
               last_skipped_ms = (o.last_skipped_ms || x.sf)[greatest(cardinality(o.last_skipped_ms) - 3, 1):]
          FROM unnest(ts, ids, bs, ks) AS y(tid, trigger_id, busy, kept),
               unnest(trigger_ids, policies, sfs) AS x(trigger_id, policy, sf)
         WHERE o.ctid = y.tid AND y.busy AND x.trigger_id = y.trigger_id
           AND (x.policy = 'forbid' OR y.kept);
    END IF;
    RETURN QUERY SELECT * FROM unnest(ids, bs, ks);
END
$$;
REVOKE ALL ON FUNCTION qlsched.overlap_decide_with(tid[], text[], text[], text[], boolean[], bigint[], bigint[]) FROM PUBLIC;

-- The V26/V27 binaries' call: the schedule rows' part read by key, then the same decision.
CREATE OR REPLACE FUNCTION qlsched.overlap_decide(tids tid[], trigger_ids text[], policies text[], keys text[],
                                                  tombed boolean[], sfs bigint[])
RETURNS TABLE (trigger_id text, busy boolean, kept boolean)
LANGUAGE plpgsql STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT * FROM qlsched.overlap_decide_with(
        tids, trigger_ids, policies, keys, tombed, sfs,
        ARRAY(SELECT coalesce((SELECT s.overlap_admitted FROM qlsched.trigger_schedules s
                                WHERE s.trigger_id = u.id), 0)
                FROM unnest(trigger_ids) WITH ORDINALITY AS u(id, i) ORDER BY u.i));
END
$$;

-- The fast path's undo: a member counted on its schedule row whose run was not inserted
-- (its key existed, or was a tombstone). EXECUTE to the runtime role only.
CREATE FUNCTION qlsched.overlap_release(trigger_ids text[])
RETURNS integer
LANGUAGE sql STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
    WITH u AS (
        UPDATE qlsched.trigger_overlap o
           SET overlap_released = o.overlap_released + 1,
               updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
         WHERE o.trigger_id = ANY (trigger_ids)
        RETURNING 1
    )
    SELECT count(*)::integer FROM u;
$$;
REVOKE ALL ON FUNCTION qlsched.overlap_release(text[]) FROM PUBLIC;

-- V21's decision for an insert of a counted run by anything but V26's admission statement,
-- on the sum. Inside the admission statement of a V28 binary (the transaction setting
-- qlsched.in_admission: the lease holder, which has written the schedule row itself; a
-- replace member, or a buffer_one member that keeps its occurrence) it reads only the overlap
-- row: the schedule row's part is 0 for those policies (overlap_adopt), and reading the
-- schedule table by key under SERIALIZABLE would lock leaf pages of its primary key.
-- Everywhere else (fire, backfill, the console's; an older binary's admission) it locks the
-- schedule row first and, when the trigger has no unfinished run, marks it (see above; with
-- a run unfinished no claim can hold the trigger idle, and none can see it idle before this
-- commits: a run end waits for the overlap row held here). The mark is harmless where it is
-- not needed (the sum unchanged), so whatever a session's default isolation level, nothing
-- but the V28 admission skips it.
CREATE OR REPLACE FUNCTION qlsched.overlap_admit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    now_ms bigint;
    n bigint;
    released bigint;
    admitted bigint;
    outside boolean := current_setting('qlsched.in_admission', true) IS DISTINCT FROM 'on';
    has_buffer boolean;
BEGIN
    IF outside THEN
        SELECT s.overlap_admitted INTO admitted FROM qlsched.trigger_schedules s
         WHERE s.trigger_id = NEW.trigger_id FOR NO KEY UPDATE;
    END IF;
    IF NEW.overlap_policy = 'replace' THEN
        -- The runs before the row: the order of every run end (run row, then this row).
        PERFORM 1 FROM qlsched.runs r
          WHERE r.trigger_id = NEW.trigger_id AND r.status IN ('queued', 'dispatching', 'running')
            AND r.overlap_policy IS NOT NULL
          FOR UPDATE;
    END IF;
    SELECT o.unfinished, o.overlap_released, o.buffered IS NOT NULL INTO n, released, has_buffer
      FROM qlsched.trigger_overlap o WHERE o.trigger_id = NEW.trigger_id FOR UPDATE;
    IF NOT FOUND THEN
        -- Not adopted (a run marked by hand): not counted, nothing decided.
        NEW.overlap_policy := NULL;
        RETURN NEW;
    END IF;
    n := n + coalesce(admitted - released, 0);
    IF outside AND n <= 0 THEN
        UPDATE qlsched.trigger_schedules s SET overlap_admitted = s.overlap_admitted + 1
         WHERE s.trigger_id = NEW.trigger_id;
        UPDATE qlsched.trigger_overlap o SET overlap_released = o.overlap_released + 1
         WHERE o.trigger_id = NEW.trigger_id;
    END IF;
    IF n <= 0 OR NEW.overlap_policy = 'allow' THEN
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

-- V21's run end on the sum. The schedule row is read, not locked (it comes before this row
-- in the lock order); inside a V28 admission statement (qlsched.in_admission: a replace
-- member's cancels) its part is 0 (overlap_adopt) and it is not read. A buffered occurrence admitted here is
-- inserted as counted (overlap_counted true: the row triggers are not called for it) and
-- counted on this row.
CREATE OR REPLACE FUNCTION qlsched.overlap_run_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    unf integer;
    released bigint;
    admitted bigint;
    n bigint;
    buf jsonb;
    r qlsched.runs;
    live boolean;
BEGIN
    SELECT o.unfinished, o.overlap_released, o.buffered INTO unf, released, buf
      FROM qlsched.trigger_overlap o WHERE o.trigger_id = OLD.trigger_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF current_setting('qlsched.in_admission', true) IS DISTINCT FROM 'on' THEN
        SELECT s.overlap_admitted INTO admitted FROM qlsched.trigger_schedules s
         WHERE s.trigger_id = OLD.trigger_id;
    END IF;
    admitted := coalesce(admitted, released);
    IF admitted - released > 0 THEN
        released := released + 1;
    ELSE
        unf := greatest(unf - 1, 0);
    END IF;
    n := greatest(unf + admitted - released, 0);
    UPDATE qlsched.trigger_overlap o
       SET unfinished = unf, overlap_released = released,
           buffered = CASE WHEN n = 0 THEN NULL ELSE o.buffered END,
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
    r.overlap_counted := true;
    INSERT INTO qlsched.runs SELECT r.* ON CONFLICT (idempotency_key) DO NOTHING;
    IF FOUND THEN
        UPDATE qlsched.trigger_overlap o SET unfinished = o.unfinished + 1
         WHERE o.trigger_id = OLD.trigger_id;
        INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
        VALUES (gen_random_uuid(), r.run_id, 1, 'remote_worker', 'claimed', now_ms);
        INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
        VALUES (r.run_id, 1, 'run.created', now_ms), (r.run_id, 2, 'run.queued', now_ms);
    END IF;
    RETURN NULL;
END
$$;

-- V21's adoption, with the schedule row's part set to 0 (overlap_released =
-- overlap_admitted): the recount covers every unfinished run. The caller (publish) holds
-- the schedule row.
CREATE OR REPLACE FUNCTION qlsched.overlap_adopt(trigger text)
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
    UPDATE qlsched.trigger_overlap o
       SET unfinished = n,
           overlap_released = coalesce((SELECT s.overlap_admitted FROM qlsched.trigger_schedules s
                                         WHERE s.trigger_id = trigger), 0)
     WHERE o.trigger_id = trigger;
    RETURN n;
END
$$;
