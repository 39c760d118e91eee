//! The mechanical part of the rules for migrations on a live database (docs/design.md,
//! "Schema changes and rolling upgrades"). [`lint`] reads a migration's text (comments,
//! strings and dollar-quoted bodies removed) and names every statement that would hold a
//! busy table's lock for a scan, a rewrite or an index build, or take several tables'
//! locks out of [`LOCK_ORDER`]. A unit test runs it over every migration from V12 on.

use regex::Regex;
use std::sync::OnceLock;

use super::compat::{kind_of, BASELINE};

/// The one order in which relation locks are taken: the order in which the admission
/// statement opens its tables (trigger_schedules, triggers, tasks, projects,
/// execution_revisions, pruned_occurrences, trigger_overlap, runs, attempts, run_events; a unit test reads it from
/// `store::admission::ADMIT_SQL`), after replicas, which the claim statement opens first. (The
/// claim opens projects before tasks; a migration never needs both exclusively at once, and
/// the lock timeout ends any wait cycle.) A migration that locks several of these takes them
/// in this order, with `LOCK TABLE` statements before anything else.
pub const LOCK_ORDER: [&str; 13] = [
    "replicas",
    "trigger_schedules",
    "triggers",
    "tasks",
    "projects",
    "execution_revisions",
    "pruned_occurrences",
    // V26: the admission reads and writes its forbid and buffer_one triggers' overlap rows.
    "trigger_overlap",
    "runs",
    "attempts",
    "run_events",
    // V19: a run end writes its trigger's outcome row after its run row.
    "trigger_outcomes",
    "maintenance",
];

/// Tables every claim round, admission or dispatcher writes: a lock held on one of them for
/// a scan or a build stops the scheduler.
pub const BUSY_TABLES: [&str; 8] = [
    "replicas",
    "trigger_schedules",
    "runs",
    "pruned_occurrences",
    "attempts",
    "run_events",
    // V19: every run end writes its trigger's outcome row.
    "trigger_outcomes",
    "maintenance",
];

/// The problems of one migration file (empty = it follows the rules). Released migrations
/// (V1..V11) are not checked: they predate the rules and never change.
pub fn lint(version: i32, sql: &str) -> Vec<String> {
    if version <= BASELINE {
        return Vec::new();
    }
    let mut problems = Vec::new();
    if let Err(e) = kind_of(version, sql) {
        problems.push(e);
    }
    let re = res();
    let mut locked: Vec<usize> = Vec::new();
    let mut leading = true;
    let mut touched: Vec<&'static str> = Vec::new();
    for st in &statements(sql) {
        let short: String = st.chars().take(80).collect();
        if let Some(c) = re.lock.captures(st) {
            problems.extend(lock_problems(&short, &c[1], leading, &mut locked));
            continue;
        }
        leading = false;
        for target in re.target.captures_iter(st) {
            let t = bare(&target[1]);
            if let Some(o) = LOCK_ORDER.iter().find(|o| **o == t) {
                if !touched.contains(o) {
                    touched.push(o);
                }
            }
        }
        problems.extend(statement_problems(re, st, &short));
    }
    problems.extend(unlocked_problems(&touched, &locked));
    problems
}

/// A `LOCK` statement of `tables`: first, and each table in the lock order after those
/// already locked (`locked`, positions in [`LOCK_ORDER`], grows).
fn lock_problems(short: &str, tables: &str, leading: bool, locked: &mut Vec<usize>) -> Vec<String> {
    let mut problems = Vec::new();
    if !leading {
        problems.push(format!(
            "`{short}`: LOCK statements come first, before any other statement"
        ));
    }
    for t in tables.split(',') {
        let t = bare(t.trim());
        match LOCK_ORDER.iter().position(|o| *o == t) {
            None => problems.push(format!(
                "`{short}`: qlsched.{t} is not in the lock order (schema::lint::LOCK_ORDER)"
            )),
            Some(i) => {
                if locked.last().is_some_and(|l| *l >= i) {
                    problems.push(format!(
                            "`{short}`: qlsched.{t} is locked after qlsched.{}, against the lock order {}",
                            LOCK_ORDER[*locked.last().unwrap()],
                            LOCK_ORDER.join(" → ")
                        ));
                }
                locked.push(i);
            }
        }
    }
    problems
}

/// What one statement other than a `LOCK` does that a live database cannot afford.
fn statement_problems(re: &Res, st: &str, short: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(c) = re.index.captures(st) {
        let t = bare(&c[3]);
        if c.get(2).is_some() {
            problems.push(format!(
                "`{short}`: CREATE INDEX CONCURRENTLY cannot run in a migration's transaction; \
                 declare it in schema::CONCURRENT_INDEXES"
            ));
        } else if BUSY_TABLES.contains(&t.as_str()) {
            problems.push(format!(
                "`{short}`: plain CREATE INDEX on qlsched.{t} blocks its writers for the whole \
                 build; declare a concurrent build in schema::CONCURRENT_INDEXES"
            ));
        }
    }
    if re.add_check.is_match(st) && !st.contains("not valid") {
        problems.push(format!(
            "`{short}`: ADD CONSTRAINT CHECK/FOREIGN KEY scans the table under its lock; add it \
             NOT VALID, then VALIDATE CONSTRAINT in a later migration"
        ));
    }
    if re.add_unique.is_match(st) && !st.contains("using index") {
        problems.push(format!(
            "`{short}`: ADD UNIQUE/PRIMARY KEY builds an index under the table's lock; build it \
             concurrently and add the constraint USING INDEX"
        ));
    }
    if re.alter_type.is_match(st) {
        problems.push(format!(
            "`{short}`: ALTER COLUMN … TYPE rewrites or scans the table under an exclusive lock"
        ));
    }
    if re.set_not_null.is_match(st) {
        problems.push(format!(
            "`{short}`: SET NOT NULL scans the table under an exclusive lock; add a CHECK \
             (col IS NOT NULL) NOT VALID and VALIDATE it instead"
        ));
    }
    if re.rewrite.is_match(st) {
        problems.push(format!(
            "`{short}`: VACUUM FULL / CLUSTER rewrites the table under an exclusive lock"
        ));
    }
    problems
}

/// A migration that changes several tables must lock each of them first.
fn unlocked_problems(touched: &[&'static str], locked: &[usize]) -> Vec<String> {
    let mut problems = Vec::new();
    if touched.len() > 1 {
        for t in touched {
            let i = LOCK_ORDER.iter().position(|o| o == t).unwrap();
            if !locked.contains(&i) {
                problems.push(format!(
                    "changes {} tables ({}): begin with LOCK TABLE statements taking each of them \
                     in the lock order ({}); qlsched.{t} is not locked",
                    touched.len(),
                    touched.join(", "),
                    LOCK_ORDER.join(" → ")
                ));
            }
        }
    }
    problems
}

struct Res {
    lock: Regex,
    target: Regex,
    index: Regex,
    add_check: Regex,
    add_unique: Regex,
    alter_type: Regex,
    set_not_null: Regex,
    rewrite: Regex,
}

fn res() -> &'static Res {
    static RES: OnceLock<Res> = OnceLock::new();
    const NAME: &str = r#"((?:"?[a-z_][a-z0-9_$]*"?\.)?"?[a-z_][a-z0-9_$]*"?)"#;
    RES.get_or_init(|| Res {
        lock: Regex::new(r"^lock (?:table )?(?:only )?(.+?)(?: in [a-z ]+ mode)?(?: nowait)?$")
            .unwrap(),
        target: Regex::new(&format!(
            r"(?:^alter table (?:if exists )?(?:only )?|^create (?:or replace )?(?:constraint )?trigger .*? on |^drop trigger (?:if exists )?[^ ]+ on ){NAME}"
        ))
        .unwrap(),
        index: Regex::new(&format!(
            r"^create (unique )?index (concurrently )?(?:if not exists )?(?:[^ ]+ )?on (?:only )?{NAME}"
        ))
        .unwrap(),
        add_check: Regex::new(r#"\badd (?:constraint "?[a-z0-9_$]+"? )?(?:check|foreign key)\b"#)
            .unwrap(),
        add_unique: Regex::new(
            r#"\badd (?:constraint "?[a-z0-9_$]+"? )?(?:unique|primary key)\b"#,
        )
        .unwrap(),
        alter_type: Regex::new(r#"\balter (?:column )?"?[a-z0-9_$]+"? (?:set data )?type\b"#)
            .unwrap(),
        set_not_null: Regex::new(r#"\balter (?:column )?"?[a-z0-9_$]+"? set not null\b"#).unwrap(),
        rewrite: Regex::new(r"^(?:vacuum (?:\(.*full.*\)|full)|cluster)\b").unwrap(),
    })
}

/// A table name without its schema and quotes, lower case.
fn bare(name: &str) -> String {
    let name = name.rsplit('.').next().unwrap_or(name);
    name.trim_matches('"').to_string()
}

/// The statements of a migration, lower case, with comments, string literals and
/// dollar-quoted bodies blanked and whitespace collapsed.
fn statements(sql: &str) -> Vec<String> {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &sql[i..];
        if rest.starts_with("--") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map(|e| e + 2).unwrap_or(rest.len());
            out.push(' ');
        } else if b[i] == b'\'' {
            let mut j = i + 1;
            while j < b.len() {
                if b[j] == b'\'' {
                    if j + 1 < b.len() && b[j + 1] == b'\'' {
                        j += 2;
                        continue;
                    }
                    break;
                }
                j += 1;
            }
            out.push_str("''");
            i = j + 1;
        } else if b[i] == b'$' {
            let tag_end = rest[1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map(|e| e + 1);
            match tag_end {
                Some(e) if rest.as_bytes()[e] == b'$' => {
                    let tag = &rest[..=e];
                    let body_end = rest[tag.len()..]
                        .find(tag)
                        .map(|p| tag.len() + p + tag.len())
                        .unwrap_or(rest.len());
                    out.push_str(" $body$ ");
                    i += body_end;
                }
                _ => {
                    out.push('$');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out.split(';')
        .map(|s| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_lowercase()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::compat::{file_name, MigrationSet};

    #[test]
    fn every_migration_from_v12_follows_the_live_database_rules() {
        let set = MigrationSet::embedded();
        let mut all = Vec::new();
        for m in &set.migrations {
            for p in lint(m.version(), m.sql().unwrap_or("")) {
                all.push(format!("{}: {p}", file_name(m.version(), m.name())));
            }
        }
        assert!(
            all.is_empty(),
            "migrations break the rules:\n{}",
            all.join("\n")
        );
    }

    fn one(sql: &str) -> Vec<String> {
        lint(20, &format!("-- qlsched: expand\n{sql}"))
    }

    #[test]
    fn good_samples_pass() {
        for sql in [
            "ALTER TABLE qlsched.runs ADD COLUMN note text;",
            "CREATE TABLE qlsched.x (a int); CREATE INDEX x_a ON qlsched.x (a);",
            "ALTER TABLE qlsched.runs ADD CONSTRAINT c CHECK (a > 0) NOT VALID;",
            "ALTER TABLE qlsched.runs VALIDATE CONSTRAINT c;",
            "CREATE OR REPLACE FUNCTION qlsched.f() RETURNS int LANGUAGE sql AS $$ CREATE INDEX i ON qlsched.runs (a); SELECT 1 $$;",
            "-- CREATE INDEX i ON qlsched.runs (a);\nSELECT 'ALTER COLUMN a TYPE int';",
            "LOCK TABLE qlsched.runs, qlsched.attempts IN ACCESS EXCLUSIVE MODE;\nALTER TABLE qlsched.runs ADD COLUMN a int;\nALTER TABLE qlsched.attempts ADD COLUMN b int;",
            "ALTER TABLE qlsched.runs ADD CONSTRAINT u UNIQUE USING INDEX runs_u;",
        ] {
            assert_eq!(one(sql), Vec::<String>::new(), "{sql}");
        }
    }

    #[test]
    fn bad_samples_are_refused_each_for_its_rule() {
        let cases: [(&str, &str); 12] = [
            ("CREATE INDEX runs_x ON qlsched.runs (status);", "plain CREATE INDEX on qlsched.runs"),
            ("CREATE UNIQUE INDEX IF NOT EXISTS a ON ONLY qlsched.attempts (x);", "plain CREATE INDEX on qlsched.attempts"),
            ("create index on qlsched.trigger_schedules (x)", "plain CREATE INDEX on qlsched.trigger_schedules"),
            ("CREATE INDEX CONCURRENTLY r ON qlsched.runs (x);", "cannot run in a migration's transaction"),
            ("ALTER TABLE qlsched.runs ADD CONSTRAINT c CHECK (a > 0);", "NOT VALID"),
            ("ALTER TABLE qlsched.attempts ADD FOREIGN KEY (run_id) REFERENCES qlsched.runs;", "NOT VALID"),
            ("ALTER TABLE qlsched.runs ALTER COLUMN status TYPE varchar(20);", "ALTER COLUMN … TYPE"),
            ("ALTER TABLE qlsched.runs ALTER COLUMN queued_at_ms SET NOT NULL;", "SET NOT NULL"),
            ("LOCK TABLE qlsched.runs IN SHARE MODE; LOCK TABLE qlsched.trigger_schedules IN SHARE MODE;", "against the lock order"),
            ("ALTER TABLE qlsched.runs ADD COLUMN a int; LOCK qlsched.attempts;", "come first"),
            ("ALTER TABLE qlsched.runs ADD COLUMN a int; ALTER TABLE qlsched.attempts ADD COLUMN b int;", "qlsched.runs is not locked"),
            ("VACUUM FULL qlsched.trigger_schedules;", "rewrites"),
        ];
        for (sql, want) in cases {
            let got = one(sql);
            assert!(
                got.iter().any(|p| p.contains(want)),
                "{sql}: wanted `{want}`, got {got:?}"
            );
        }
        let unheaded = lint(20, "ALTER TABLE qlsched.runs ADD COLUMN a int;");
        assert!(
            unheaded[0].contains("the first line must be"),
            "{unheaded:?}"
        );
        assert!(lint(5, "CREATE INDEX a ON qlsched.runs (x);").is_empty());
    }
}
