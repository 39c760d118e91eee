-- The dispatcher contract and `runs cancel` (docs/dispatcher.md; issue 21 items 1 and 4).
--
-- A run moves queued -> dispatching -> running -> succeeded | failed (the dispatcher), or
-- queued -> cancelled (an operator's `runs cancel`, only while its attempt is untouched).
-- Its first attempt moves claimed -> dispatching -> running -> succeeded | failed, or
-- claimed -> abandoned when its run is cancelled. V3's CHECKs already name every one of
-- these states and the events run.dispatching, run.started, run.finished and
-- run.cancelled, so no CHECK changes here.
--
-- Grants are column-level (installed by `db migrate`, src/store/migrate.rs): a dispatcher
-- may UPDATE runs(status) and attempts(state, started_at_ms, finished_at_ms, result,
-- error), an admin runs(status, cancelled) and attempts(state, finished_at_ms). Nothing
-- else of an admitted row can change, and these triggers make every status change a step
-- forward along the machine above: no role, the owner included, can move a finished run
-- back to queued (where a dispatcher would run it a second time) or cancel a run that a
-- dispatcher took.
--
-- Only UPDATEs of those columns fire them: the admission inserts, it never updates a run,
-- so its cost is unchanged.

CREATE FUNCTION qlsched.run_status_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       AND OLD.status || '>' || NEW.status NOT IN ('queued>dispatching', 'queued>cancelled',
           'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed') THEN
        RAISE EXCEPTION 'run % may not move from % to %', OLD.run_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.cancelled IS DISTINCT FROM OLD.cancelled
       AND NOT (NEW.cancelled AND NEW.status = 'cancelled') THEN
        RAISE EXCEPTION 'run %: cancelled is set together with status cancelled, and only then',
            OLD.run_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER runs_status_moves_forward BEFORE UPDATE OF status, cancelled ON qlsched.runs
    FOR EACH ROW EXECUTE FUNCTION qlsched.run_status_moves_forward();

CREATE FUNCTION qlsched.attempt_state_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state
       AND OLD.state || '>' || NEW.state NOT IN ('claimed>dispatching', 'claimed>abandoned',
           'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed') THEN
        RAISE EXCEPTION 'attempt % may not move from % to %', OLD.attempt_id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER attempts_state_moves_forward BEFORE UPDATE OF state ON qlsched.attempts
    FOR EACH ROW EXECUTE FUNCTION qlsched.attempt_state_moves_forward();
