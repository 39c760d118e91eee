-- Scheduler state: exactly one row per trigger head.
--
-- claimable_at_ms is the single column the claim scans. It is kept by every writer:
--   free row, pending initialisation  -> 0 (sorts first, like NULLS FIRST on the cursor)
--   free row with a cursor            -> next_fire_at_ms
--   live claim                        -> claim_expires_at_ms (comes back into range at expiry)
--   released with back-off            -> release time + back-off
--   disabled trigger / inactive project -> NULL (outside the partial index entirely)
-- so the claim is an index range scan `claimable_at_ms <= now` that never walks over
-- live-claimed, disabled or suspended rows, however many there are.
CREATE TABLE qlsched.trigger_schedules (
    trigger_id           text PRIMARY KEY REFERENCES qlsched.triggers ON DELETE CASCADE,
    project_id           text NOT NULL REFERENCES qlsched.projects,
    trigger_revision     bigint NOT NULL CHECK (trigger_revision > 0),
    next_fire_at_ms      bigint,
    last_scheduled_at_ms bigint,
    state_version        bigint NOT NULL DEFAULT 1 CHECK (state_version > 0),
    claim_owner          text,
    claim_token          uuid,
    claim_version        bigint NOT NULL DEFAULT 0 CHECK (claim_version >= 0),
    claim_expires_at_ms  bigint,
    claimable_at_ms      bigint,
    updated_at_ms        bigint NOT NULL,
    -- the three live-claim columns are set and cleared together
    CONSTRAINT claim_all_or_nothing CHECK (
        (claim_owner IS NULL AND claim_token IS NULL AND claim_expires_at_ms IS NULL)
        OR (claim_owner IS NOT NULL AND claim_token IS NOT NULL AND claim_expires_at_ms IS NOT NULL)),
    -- a claimed row becomes claimable again exactly at its expiry
    CONSTRAINT claimed_row_claimable_at_expiry CHECK (
        claim_owner IS NULL OR claimable_at_ms = claim_expires_at_ms)
);

CREATE INDEX trigger_schedules_claimable_idx
    ON qlsched.trigger_schedules (claimable_at_ms, project_id, trigger_id)
    WHERE claimable_at_ms IS NOT NULL;
CREATE INDEX trigger_schedules_owner_idx
    ON qlsched.trigger_schedules (claim_owner) WHERE claim_owner IS NOT NULL;
CREATE INDEX trigger_schedules_project_idx ON qlsched.trigger_schedules (project_id);
