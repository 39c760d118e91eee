-- The capability the binary checks at readiness: a daemon refuses a database whose
-- schema does not expose the capability it was built for.
CREATE TABLE qlsched.capability (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    name       text NOT NULL,
    version    integer NOT NULL
);
INSERT INTO qlsched.capability (name, version) VALUES ('cluster_scheduler_admission', 1);

-- Replicas: one row per replica id, with a heartbeat judged by the database clock.
-- A second live process with the same id is refused (see store::replicas).
CREATE TABLE qlsched.replicas (
    replica_id        text PRIMARY KEY CHECK (replica_id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    incarnation       uuid NOT NULL,
    hostname          text NOT NULL,
    pid               integer NOT NULL,
    started_at_ms     bigint NOT NULL,
    heartbeat_at_ms   bigint NOT NULL,
    expires_at_ms     bigint NOT NULL,
    stopped_at_ms     bigint
);
