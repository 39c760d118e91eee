//! Compatible schema ranges (docs/design.md, "Schema changes and rolling upgrades"): what
//! each migration is (expand or contract), the set of migrations a binary carries, and the
//! rule by which a binary accepts a database that a newer binary migrated.

use std::fmt;

use refinery::Migration;

use super::{ConcurrentIndex, Grant};

/// The newest migration released before schema compatibility existed. A database at it (or
/// earlier) serves only binaries that know it: the floor never drops below it.
pub const BASELINE: i32 = 11;

/// Whether a binary that does not know a migration keeps working on a database that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Adds what an older binary never touches (tables, nullable columns, functions, indexes).
    Expand,
    /// Drops or tightens something: binaries that do not know this migration are refused.
    Contract,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Expand => "expand",
            Kind::Contract => "contract",
        }
    }
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "expand" => Some(Kind::Expand),
            "contract" => Some(Kind::Contract),
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// V1..V11, released before migrations carried a header (their files, and so their
/// checksums, never change). What each did to a binary that did not know it; they all
/// predate compatibility, so whatever they are, a database at V11 needs a binary that knows
/// V11 (the floor starts at [`BASELINE`]).
const RELEASED: [(i32, Kind); 11] = [
    (1, Kind::Expand),    // definition tables
    (2, Kind::Expand),    // trigger_schedules
    (3, Kind::Expand),    // runs, attempts, run_events
    (4, Kind::Expand),    // capability, replicas
    (5, Kind::Expand),    // claim_round column, recovery index
    (6, Kind::Contract),  // the run key check replaced
    (7, Kind::Contract),  // definitions and runs made permanent
    (8, Kind::Contract),  // published_enabled joins the trigger digest; manual key v2
    (9, Kind::Expand),    // guard session columns (nullable)
    (10, Kind::Contract), // status may only move forward
    (11, Kind::Contract), // attempts and events made permanent; prune_finished
];

/// The header every migration from V12 on starts with.
pub const HEADER_PREFIX: &str = "-- qlsched: ";

/// The kind a migration file declares on its first line (`-- qlsched: expand` or
/// `-- qlsched: contract`), or the released table's for V1..V11.
pub fn kind_of(version: i32, sql: &str) -> Result<Kind, String> {
    if let Some((_, k)) = RELEASED.iter().find(|(v, _)| *v == version) {
        return Ok(*k);
    }
    let first = sql.lines().next().unwrap_or("").trim_end();
    first
        .strip_prefix(HEADER_PREFIX)
        .and_then(Kind::parse)
        .ok_or_else(|| {
            format!(
                "the first line must be `{HEADER_PREFIX}expand` or `{HEADER_PREFIX}contract` \
                 (docs/design.md, \"Schema changes and rolling upgrades\"), not `{first}`"
            )
        })
}

/// The migrations a binary carries, with their kinds, the grants it installs and its
/// declared concurrent index builds. [`MigrationSet::embedded`] is this binary's; a test
/// may add to one to stand for a newer binary.
#[derive(Clone, Debug)]
pub struct MigrationSet {
    /// Sorted by version.
    pub migrations: Vec<Migration>,
    pub grants: Vec<Grant>,
    pub indexes: Vec<ConcurrentIndex>,
}

impl MigrationSet {
    pub fn embedded() -> MigrationSet {
        let mut migrations = super::embedded::migrations::runner()
            .get_migrations()
            .clone();
        migrations.sort_by_key(|m| m.version());
        MigrationSet {
            migrations,
            grants: super::manifest(),
            indexes: super::CONCURRENT_INDEXES.to_vec(),
        }
    }

    /// Adds a migration (file name `V<n>__<name>.sql`, text), keeping the order.
    pub fn with_migration(
        mut self,
        file: &str,
        sql: &str,
    ) -> Result<MigrationSet, refinery::Error> {
        self.migrations.push(Migration::unapplied(file, sql)?);
        self.migrations.sort_by_key(|m| m.version());
        Ok(self)
    }

    /// The newest migration this set knows.
    pub fn newest(&self) -> i32 {
        self.migrations.last().map(|m| m.version()).unwrap_or(0)
    }

    pub fn get(&self, version: i32) -> Option<&Migration> {
        self.migrations.iter().find(|m| m.version() == version)
    }

    /// A migration's kind (an unheaded one from V12 on counts as a contract: the unit test
    /// `every_migration_from_v12_declares_its_kind` refuses it before it ships).
    pub fn kind(&self, version: i32) -> Kind {
        self.get(version)
            .map(|m| kind_of(version, m.sql().unwrap_or("")).unwrap_or(Kind::Contract))
            .unwrap_or(Kind::Contract)
    }
}

/// The file name of a migration.
pub fn file_name(version: i32, name: &str) -> String {
    format!("V{version}__{name}.sql")
}

/// What a database says about the binaries it serves: the newest migration applied, and
/// the floor (the latest contract applied, at least [`BASELINE`]) with its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub floor: i32,
    /// The contract migration that set the floor (None: the baseline).
    pub floor_file: Option<String>,
    pub newest: i32,
    pub newest_file: Option<String>,
}

impl Range {
    /// Whether a binary whose newest known migration is `newest_known` may run on it
    /// (given that every migration it knows is applied unchanged).
    pub fn serves(&self, newest_known: i32) -> bool {
        newest_known >= self.floor
    }
}

/// Reads the range from the history and `qlsched.schema_compat` (V13), in the caller's
/// snapshot. Kinds the database does not record (a database before V13) count as contract
/// for anything past the baseline, so an unknown database is never served by mistake.
pub async fn range(client: &tokio_postgres::Client) -> Result<Range, crate::db::StoreError> {
    let row = client
        .query_one(
            &format!(
                "SELECT to_regclass('qlsched.schema_compat') IS NOT NULL,
                        (SELECT max(version) FROM {h})",
                h = super::HISTORY_TABLE
            ),
            &[],
        )
        .await?;
    let has_compat: bool = row.get(0);
    let newest: Option<i32> = row.get(1);
    let newest = newest.unwrap_or(0);
    let floor: Option<(i32, String)> = if has_compat {
        client
            .query_opt(
                &format!(
                    "SELECT h.version, h.name FROM {h} h
                       LEFT JOIN qlsched.schema_compat c ON c.version = h.version
                      WHERE h.version > $1 AND coalesce(c.kind, 'contract') = 'contract'
                      ORDER BY h.version DESC LIMIT 1",
                    h = super::HISTORY_TABLE
                ),
                &[&BASELINE],
            )
            .await?
            .map(|r| (r.get(0), r.get(1)))
    } else {
        client
            .query_opt(
                &format!(
                    "SELECT version, name FROM {h} WHERE version > $1 ORDER BY version DESC LIMIT 1",
                    h = super::HISTORY_TABLE
                ),
                &[&BASELINE],
            )
            .await?
            .map(|r| (r.get(0), r.get(1)))
    };
    let newest_file = client
        .query_opt(
            &format!(
                "SELECT name FROM {h} WHERE version = $1",
                h = super::HISTORY_TABLE
            ),
            &[&newest],
        )
        .await?
        .map(|r| file_name(newest, &r.get::<_, String>(0)));
    Ok(match floor {
        Some((v, name)) => Range {
            floor: v,
            floor_file: Some(file_name(v, &name)),
            newest,
            newest_file,
        },
        None => Range {
            floor: BASELINE,
            floor_file: None,
            newest,
            newest_file,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_from_v12_declares_its_kind() {
        let set = MigrationSet::embedded();
        for m in set.migrations.iter().filter(|m| m.version() > BASELINE) {
            if let Err(e) = kind_of(m.version(), m.sql().unwrap_or("")) {
                panic!("{}: {e}", file_name(m.version(), m.name()));
            }
        }
    }

    #[test]
    fn a_migration_without_the_header_is_refused_and_released_ones_need_none() {
        assert!(kind_of(12, "CREATE TABLE qlsched.x (a int);").is_err());
        assert!(kind_of(12, "-- qlsched: expandx\n").is_err());
        assert_eq!(
            kind_of(14, "-- qlsched: contract\nDROP TABLE x;"),
            Ok(Kind::Contract)
        );
        assert_eq!(kind_of(13, "-- qlsched: expand\n"), Ok(Kind::Expand));
        assert_eq!(
            kind_of(3, "CREATE TABLE qlsched.runs ();"),
            Ok(Kind::Expand)
        );
        assert_eq!(kind_of(11, ""), Ok(Kind::Contract));
    }
}
