-- qlsched: expand
-- Compatible schema ranges and replica versions (docs/design.md, "Schema changes and rolling
-- upgrades"; issue 22 items 1 and 5). Nothing here touches what a V11 or V12 binary reads or
-- writes: two new tables and two nullable columns.

-- The kind of every applied migration (expand or contract), written by `db migrate` in the
-- migration's own transaction (this one back-fills V1..V13). The latest contract applied
-- (at least V11) is the floor: a binary that does not know it is refused by `db check`; a
-- binary that knows it runs on any later database whose newer migrations are all expands.
CREATE TABLE qlsched.schema_compat (
    version      integer PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('expand', 'contract')),
    -- The binary (version+commit) whose `db migrate` recorded it.
    recorded_by  text NOT NULL
);

-- Every privilege the last `db migrate` installed, per role kind: `db check` requires the
-- roles to hold exactly these (a grant by hand is drift) and this binary's own grants to be
-- among them (a newer migrator's grants on objects this binary does not know are not drift).
CREATE TABLE qlsched.grant_manifest (
    role_kind    text NOT NULL,
    object_type  text NOT NULL CHECK (object_type IN ('table', 'column', 'function')),
    object       text NOT NULL,
    column_name  text NOT NULL DEFAULT '',
    privilege    text NOT NULL,
    PRIMARY KEY (role_kind, object_type, object, column_name, privilege)
);

-- What each replica runs: its binary (version+commit) and the newest migration it knows,
-- set when it takes its guard row (`qlsched db status` lists them). NULL: a replica of a
-- binary before V13.
ALTER TABLE qlsched.replicas
    ADD COLUMN binary_version   text,
    ADD COLUMN newest_migration integer;
