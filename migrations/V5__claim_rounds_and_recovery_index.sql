-- Each claim statement stamps the rows it leases with its round id. A round whose reply
-- never reached the replica (client time-out, lost reply) can then be found and its rows
-- released by the replica that sent it, instead of sitting leased until expiry.
ALTER TABLE qlsched.trigger_schedules ADD COLUMN claim_round uuid;

-- Start-up recovery reads only unfinished runs; without an index it scanned every run.
CREATE INDEX runs_unfinished_idx ON qlsched.runs (status, run_id)
    WHERE status IN ('queued', 'dispatching', 'running');
