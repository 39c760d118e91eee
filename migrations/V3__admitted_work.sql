-- Admitted work. The scheduler only ever inserts: a queued run, its first claimed
-- remote_worker attempt (every worker/session/lease/offer/callback/start/result/error
-- field NULL) and the run.created + run.queued events.

CREATE TABLE qlsched.runs (
    run_id                uuid PRIMARY KEY,
    project_id            text NOT NULL REFERENCES qlsched.projects,
    trigger_id            text NOT NULL REFERENCES qlsched.triggers,
    trigger_revision      bigint NOT NULL,
    task_id               text NOT NULL REFERENCES qlsched.tasks,
    task_revision         bigint NOT NULL,
    execution_revision_id uuid NOT NULL REFERENCES qlsched.execution_revisions,
    idempotency_key       text NOT NULL UNIQUE
                          CHECK (idempotency_key = 'ql3:cron:v1:' || trigger_id || ':'
                                 || trigger_revision || ':' || scheduled_for_ms),
    status                text NOT NULL DEFAULT 'queued'
                          CHECK (status IN ('queued', 'dispatching', 'running', 'succeeded', 'failed', 'cancelled')),
    cancelled             boolean NOT NULL DEFAULT false,
    scheduled_for_ms      bigint NOT NULL,
    queued_at_ms          bigint,
    admitted_by           text NOT NULL
);
CREATE INDEX runs_trigger_idx ON qlsched.runs (trigger_id, scheduled_for_ms);
CREATE INDEX runs_queued_at_idx ON qlsched.runs (queued_at_ms);

CREATE TABLE qlsched.attempts (
    attempt_id        uuid PRIMARY KEY,
    run_id            uuid NOT NULL REFERENCES qlsched.runs,
    attempt_no        integer NOT NULL CHECK (attempt_no > 0),
    executor          text NOT NULL CHECK (executor = 'remote_worker'),
    state             text NOT NULL
                      CHECK (state IN ('claimed', 'dispatching', 'running', 'succeeded', 'failed', 'abandoned')),
    worker_id         text,
    session_id        text,
    lease_id          text,
    lease_expires_at_ms bigint,
    offer_id          text,
    callback_token    text,
    started_at_ms     bigint,
    finished_at_ms    bigint,
    result            jsonb,
    error             text,
    created_at_ms     bigint NOT NULL,
    UNIQUE (run_id, attempt_no)
);

CREATE TABLE qlsched.run_events (
    run_id    uuid NOT NULL REFERENCES qlsched.runs,
    seq       integer NOT NULL CHECK (seq > 0),
    kind      text NOT NULL CHECK (kind IN ('run.created', 'run.queued', 'run.dispatching',
                                            'run.started', 'run.finished', 'run.cancelled')),
    at_ms     bigint NOT NULL,
    PRIMARY KEY (run_id, seq)
);
