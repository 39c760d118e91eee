-- The replica-id guard asks the database, not a process table, whether a holder still lives
-- (issue 19, B11). A process table is per PID namespace: from another container a live
-- holder looks dead, and a restarted container's new process has the dead one's PID (1).
-- The holder records the database session it works on (its claim connection: the backend
-- pid and that backend's start); a holder with that session gone is gone. NULL (a holder
-- from before this migration) is judged by the guard's expiry alone.
ALTER TABLE qlsched.replicas
    ADD COLUMN session_pid        integer,
    ADD COLUMN session_started_at timestamptz;
