-- Definition tables: owned by management (admin role), read by the runtime.
-- Times are Unix milliseconds on the database clock.

CREATE TABLE qlsched.projects (
    project_id     text PRIMARY KEY CHECK (project_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    status         text NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'suspended', 'archived')),
    created_at_ms  bigint NOT NULL,
    updated_at_ms  bigint NOT NULL
);

-- An immutable execution revision: what a worker will run. The spec is kept as the exact
-- text that was digested so the digest can be re-verified at every admission.
CREATE TABLE qlsched.execution_revisions (
    execution_revision_id uuid PRIMARY KEY,
    project_id     text NOT NULL REFERENCES qlsched.projects,
    kind           text NOT NULL CHECK (kind = 'remote_worker'),
    spec           text NOT NULL,
    spec_digest    text NOT NULL CHECK (spec_digest ~ '^[0-9a-f]{64}$'),
    created_at_ms  bigint NOT NULL
);

CREATE TABLE qlsched.tasks (
    task_id        text PRIMARY KEY CHECK (task_id ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    project_id     text NOT NULL REFERENCES qlsched.projects,
    revision       bigint NOT NULL CHECK (revision > 0),
    content_digest text NOT NULL CHECK (content_digest ~ '^[0-9a-f]{64}$'),
    execution_revision_id uuid NOT NULL REFERENCES qlsched.execution_revisions,
    updated_at_ms  bigint NOT NULL
);
CREATE INDEX tasks_project_idx ON qlsched.tasks (project_id);

CREATE TABLE qlsched.triggers (
    trigger_id     text PRIMARY KEY CHECK (trigger_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    project_id     text NOT NULL REFERENCES qlsched.projects,
    task_id        text NOT NULL REFERENCES qlsched.tasks,
    revision       bigint NOT NULL CHECK (revision > 0),
    kind           text NOT NULL DEFAULT 'cron' CHECK (kind = 'cron'),
    enabled        boolean NOT NULL DEFAULT true,
    cron_expr      text NOT NULL CHECK (length(cron_expr) BETWEEN 1 AND 256),
    timezone       text NOT NULL CHECK (length(timezone) BETWEEN 1 AND 64),
    misfire_policy text NOT NULL DEFAULT 'skip' CHECK (misfire_policy IN ('skip', 'fire_once')),
    misfire_grace_ms bigint NOT NULL DEFAULT 60000 CHECK (misfire_grace_ms BETWEEN 0 AND 86400000),
    content_digest text NOT NULL CHECK (content_digest ~ '^[0-9a-f]{64}$'),
    updated_at_ms  bigint NOT NULL
);
CREATE INDEX triggers_project_idx ON qlsched.triggers (project_id);
CREATE INDEX triggers_task_idx ON qlsched.triggers (task_id);
