-- qlsched: expand
-- The admission's overlap decision (V26's qlsched.overlap_decide) made cheaper, same
-- signature, same result, same locks (docs/policies-overlap.md, "What it costs").
--
-- V26's function was one SQL-language UPDATE that joined each row to a second read of itself
-- (to have the count before the write) and wrote the skip columns for every member. Measured
-- with pgbench on 64 forbid members whose runs had all ended (the herd of benchmark row O1):
-- about 0.75 ms a call, of which the SQL function's planning at every call was about 0.2 ms
-- and the self-read and the skip columns' expressions most of the rest; one plain UPDATE of
-- the same 64 rows by TID costs about 0.35 ms.
--
-- Now, in PL/pgSQL (its statements' plans are kept for the session):
-- 1. one UPDATE writes every member's row at the TID the claim read: the count raised for a
--    member that is not busy, and the decision recorded in the row itself (last_busy, a new
--    column), which RETURNING reads back with the buffered flag: no second read of the row;
-- 2. only for members whose row was not at that TID (changed since the claim), the same
--    UPDATE by the primary key, as V26's fallback;
-- 3. only when a member was busy, its skip recorded (forbid, or buffer_one with an occurrence
--    kept) by the TID of the version step 1 or 2 wrote: this transaction's own row version, so
--    no predicate lock is taken.
-- Each row is still read and written in turn (one tuple-level predicate lock at most at any
-- time, dropped by the write), and a row changed after this transaction's snapshot still
-- fails the write to serialize.
--
-- Expand: a nullable column without a default on trigger_overlap (a catalog change), a
-- function replaced in place (its grants stay: EXECUTE to the runtime role only).

LOCK TABLE qlsched.trigger_overlap IN ACCESS EXCLUSIVE MODE;

-- Whether the last scheduled admission's decision (overlap_decide) found a run of the trigger
-- unfinished and the occurrence's key new (busy); NULL before its first such decision.
ALTER TABLE qlsched.trigger_overlap ADD COLUMN last_busy boolean;

CREATE OR REPLACE FUNCTION qlsched.overlap_decide(tids tid[], trigger_ids text[], policies text[], keys text[],
                                                  tombed boolean[], sfs bigint[])
RETURNS TABLE (trigger_id text, busy boolean, kept boolean)
LANGUAGE plpgsql STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Point accesses only (a sequential scan under SERIALIZABLE would lock the whole table).
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
    -- busy: a run of the trigger is unfinished and the key is new (read only then), the key
    -- not a tombstone. A member that is not busy and not a tombstone raises the count.
    WITH w AS (
        UPDATE qlsched.trigger_overlap o
           SET last_busy = o.unfinished > 0 AND NOT x.tombed
                           AND NOT EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.idempotency_key = x.ikey),
               unfinished = o.unfinished
                            + (NOT x.tombed
                               AND NOT (o.unfinished > 0
                                        AND NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                                         WHERE r.idempotency_key = x.ikey)))::int,
               updated_at_ms = now_ms
          FROM unnest(tids, trigger_ids, keys, tombed) AS x(tid, trigger_id, ikey, tombed)
         -- The TID reached by a TID scan; the key compared as an expression, never probed.
         WHERE o.ctid = x.tid AND o.trigger_id || '' = x.trigger_id
        RETURNING o.ctid, o.trigger_id, o.last_busy, o.buffered IS NOT NULL AS kept
    )
    SELECT array_agg(w.ctid), array_agg(w.trigger_id), array_agg(w.last_busy), array_agg(w.kept)
      INTO ts, ids, bs, ks FROM w;
    IF coalesce(cardinality(ids), 0) < cardinality(trigger_ids) THEN
        -- Rows not at the claim's TID (a new version since, or no TID given): by key.
        WITH w AS (
            UPDATE qlsched.trigger_overlap o
               SET last_busy = o.unfinished > 0 AND NOT x.tombed
                               AND NOT EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.idempotency_key = x.ikey),
                   unfinished = o.unfinished
                                + (NOT x.tombed
                                   AND NOT (o.unfinished > 0
                                            AND NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                                             WHERE r.idempotency_key = x.ikey)))::int,
                   updated_at_ms = now_ms
              FROM unnest(trigger_ids, keys, tombed) AS x(trigger_id, ikey, tombed)
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
        -- The skips (V21's overlap_record_skip): a busy forbid member, or a busy buffer_one
        -- member with an occurrence kept already. A busy buffer_one member with nothing kept
        -- is left to V21's row trigger, which keeps it.
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
