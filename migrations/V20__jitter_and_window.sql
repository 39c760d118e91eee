-- qlsched: expand
-- Jitter and validity windows of cron triggers (docs/policies-jitter.md; issue 35 items 5, 6).
--
-- triggers.jitter_ms: each occurrence is due at its nominal instant plus a deterministic
-- offset in [0, jitter_ms) of the trigger id and the nominal instant (schedule::timing); 0 =
-- none, the behaviour before V20. triggers.start_at_ms / end_at_ms: no occurrence whose
-- nominal instant is before the start or after the end is admitted by the schedule; NULL =
-- unbounded. All three are part of the trigger's content digest when set, so changing them
-- is a new revision; `trigger publish` checks jitter < the shortest gap between occurrences
-- and start < end before writing.
--
-- runs.due_at_ms: the jittered instant the occurrence was due at, beside its nominal
-- scheduled_for_ms (which, with the idempotency key, stays the nominal instant). Written by
-- the cron admission only when the trigger has a jitter; NULL otherwise.
--
-- Expand: columns with a constant default or none (no rewrite, no scan); a binary before V20
-- does not read them and admits as if every trigger had no jitter and no window. The CHECKs
-- are NOT VALID: they hold for every row written from now on, and the rows before V20 hold
-- them by their defaults.
LOCK TABLE qlsched.triggers IN ACCESS EXCLUSIVE MODE;
LOCK TABLE qlsched.runs IN ACCESS EXCLUSIVE MODE;

ALTER TABLE qlsched.triggers
    ADD COLUMN jitter_ms bigint NOT NULL DEFAULT 0,
    ADD COLUMN start_at_ms bigint,
    ADD COLUMN end_at_ms bigint;

ALTER TABLE qlsched.triggers
    ADD CONSTRAINT triggers_jitter_ms_check CHECK (jitter_ms >= 0 AND jitter_ms <= 86400000) NOT VALID;

ALTER TABLE qlsched.triggers
    ADD CONSTRAINT triggers_window_check CHECK (start_at_ms < end_at_ms) NOT VALID;

ALTER TABLE qlsched.runs ADD COLUMN due_at_ms bigint;
