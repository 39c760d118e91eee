-- qlsched: expand
-- The instant a trigger's cursor may never return to (docs/design.md, "Who moves the
-- cursor"). A republish clears `last_scheduled_at_ms`, so a new revision's first cursor
-- could be set at or before an instant admitted under the previous revision, and that
-- instant would be admitted a second time under the new revision's key.
--
-- admitted_through_ms: the latest scheduled instant ever admitted for the trigger by a cron
-- admission, under any revision; raised by every cron admission (GREATEST), never lowered
-- and never cleared by a publish, enable or disable. A publish and an enable set the first
-- cursor strictly after max(database clock, admitted_through_ms, last_scheduled_at_ms, the
-- latest cron run of the trigger), so a clock that steps back (a promoted standby behind
-- the old primary) cannot move a cursor back over admitted instants either.
--
-- Expand: a nullable column nobody before V14 reads; a V13 binary's admission leaves it
-- alone (its `last_scheduled_at_ms` and its runs still count at the next publish).
ALTER TABLE qlsched.trigger_schedules ADD COLUMN admitted_through_ms bigint;

-- The record starts from the cron runs already admitted (runs_trigger_idx, one backward
-- probe per trigger).
UPDATE qlsched.trigger_schedules s
   SET admitted_through_ms = (SELECT max(r.scheduled_for_ms) FROM qlsched.runs r
                               WHERE r.trigger_id = s.trigger_id
                                 AND r.idempotency_key LIKE 'ql3:cron:%')
 WHERE EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.trigger_id = s.trigger_id);
