-- qlsched: expand
-- Who owns a trigger as code (issue 36; docs/apply.md, "Ownership"): the `source` label of
-- the definition files that last applied it with `qlsched apply`. NULL: unlabelled (a
-- trigger only `trigger publish` ever wrote; publish never changes the label). `qlsched
-- apply --prune` deletes only triggers that carry the files' own label, and `qlsched
-- export --source S` writes only S's triggers.
--
-- Expand: one nullable column without a default (a catalog change, no rewrite, no scan); an
-- older binary never reads or writes it, and its publishes keep the label (it names its
-- columns). The bound on its length is a NOT VALID check (no scan; every row is NULL).

LOCK TABLE qlsched.triggers IN ACCESS EXCLUSIVE MODE;

ALTER TABLE qlsched.triggers ADD COLUMN source_label text;

ALTER TABLE qlsched.triggers
    ADD CONSTRAINT triggers_source_label_check
    CHECK (length(source_label) BETWEEN 1 AND 200) NOT VALID;
