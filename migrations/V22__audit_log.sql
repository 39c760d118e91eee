-- qlsched: expand
-- The audit log (docs/audit.md; issue 36 item 4): one row for every change to a project, task
-- or trigger and every operator action (publish, disable, enable, delete, fire, backfill,
-- runs cancel, runs prune), appended in the transaction of the change itself.
--
-- Expand: a new table, a trigger function and a prune function; nothing an older binary
-- reads or writes changes. An older binary's commands append no row (they do not know the
-- table); a newer one's do.
--
-- Append-only for every role: the admin and runtime roles hold SELECT and a column-level
-- INSERT that leaves out audit_id, at_ms and db_user, so the database's clock and
-- session_user are always the ones recorded; nobody but the owner holds UPDATE or DELETE,
-- and a statement trigger refuses UPDATE and TRUNCATE to the owner too, and DELETE outside
-- qlsched.prune_audit (the retention path, V11's pattern).

CREATE TABLE qlsched.audit_log (
    audit_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms         bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    db_user       text NOT NULL DEFAULT session_user,
    -- Who the client says it is (the CLI: --actor or the login user) and its host: reported
    -- by the client, unlike db_user.
    actor         text CHECK (length(actor) <= 200),
    host          text CHECK (length(host) <= 255),
    source        text NOT NULL CHECK (source IN ('cli', 'apply', 'console', 'system')),
    -- apply: the files' source label.
    source_label  text CHECK (length(source_label) <= 200),
    object_kind   text NOT NULL CHECK (object_kind IN ('project', 'task', 'trigger', 'maintenance')),
    object_id     text NOT NULL CHECK (length(object_id) BETWEEN 1 AND 200),
    project_id    text,
    action        text NOT NULL CHECK (action ~ '^[a-z][a-z_.]{0,63}$'),
    -- {"field": {"before": …, "after": …}} for a change of a definition; what was done
    -- (counts, run ids) for an action that writes runs.
    changes       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(changes) = 'object'),
    note          text CHECK (length(note) <= 1000)
);
-- Newest first, in pages (`qlsched audit`, the console's /audit); retention walks it oldest first.
CREATE INDEX audit_log_at_idx ON qlsched.audit_log (at_ms, audit_id);
-- One object's history (`qlsched audit --trigger ID`).
CREATE INDEX audit_log_object_idx ON qlsched.audit_log (object_kind, object_id, at_ms, audit_id);
-- One project's history (`qlsched audit --project P`).
CREATE INDEX audit_log_project_idx ON qlsched.audit_log (project_id, at_ms, audit_id)
    WHERE project_id IS NOT NULL;

-- Refuses UPDATE and TRUNCATE always, and DELETE unless issued from a frame of
-- qlsched.prune_audit that marked its transaction (the grants already refuse every role but
-- the owner; this holds the owner to the retention path as well).
CREATE FUNCTION qlsched.audit_is_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ctx text;
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('qlsched.pruning_audit', true) = 'on' THEN
        GET DIAGNOSTICS ctx = PG_CONTEXT;
        IF ctx ~ '(^|\n)PL/pgSQL function qlsched\.prune_audit\(bigint,integer,text,uuid\) line [0-9]+ at ' THEN
            RETURN NULL;
        END IF;
    END IF;
    RAISE EXCEPTION 'qlsched.audit_log is append-only (% refused)', TG_OP
        USING ERRCODE = 'restrict_violation',
              HINT = 'audit rows are removed only by retention ([retention] audit_after)';
END
$$;
REVOKE ALL ON FUNCTION qlsched.audit_is_append_only() FROM PUBLIC;

CREATE TRIGGER audit_log_is_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON qlsched.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION qlsched.audit_is_append_only();

-- Deletes up to max_rows audit rows older than keep_ms by the database clock, oldest first,
-- in the caller's transaction; returns how many. Refuses a keep_ms under 7 days (no caller
-- can empty the log) or over 3650 days, and unless the caller holds the 'prune' lease (as
-- prune_finished, V11). EXECUTE to the runtime role only.
CREATE FUNCTION qlsched.prune_audit(keep_ms bigint, max_rows integer, lease_owner text, lease_token uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
BEGIN
    IF keep_ms IS NULL OR keep_ms < 604800000 OR keep_ms > 315360000000
       OR max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        RAISE EXCEPTION 'prune_audit: keep_ms must be within 7..=3650 days and max_rows within 1..=10000'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM qlsched.maintenance m
      WHERE m.task = 'prune' AND m.lease_owner = prune_audit.lease_owner
        AND m.lease_token = prune_audit.lease_token
        AND m.lease_expires_at > clock_timestamp()
      FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'prune_audit: the prune lease is not held by % (token %)',
            prune_audit.lease_owner, prune_audit.lease_token
            USING ERRCODE = 'lock_not_available';
    END IF;
    PERFORM set_config('qlsched.pruning_audit', 'on', true);
    WITH old AS (
        SELECT a.audit_id FROM qlsched.audit_log a
         WHERE a.at_ms < (extract(epoch FROM clock_timestamp()) * 1000)::bigint - keep_ms
         ORDER BY a.at_ms, a.audit_id
         LIMIT max_rows
    ), d AS (
        DELETE FROM qlsched.audit_log a USING old WHERE a.audit_id = old.audit_id RETURNING 1
    )
    SELECT count(*) INTO n FROM d;
    PERFORM set_config('qlsched.pruning_audit', 'off', true);
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION qlsched.prune_audit(bigint, integer, text, uuid) FROM PUBLIC;
