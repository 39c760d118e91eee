//! Schema management: roles and bootstrap ([`roles`]), the migration runner ([`apply`]) and
//! expand/contract compatibility ([`compat`]), drift between the applied stream and the
//! binary's ([`drift`]), the grant tables ([`grants`]) and manifest ([`manifest`]), the
//! readiness gate and privilege audit ([`readiness`]), `db status` ([`report`]) and the lint
//! of migration files ([`lint`]). Migrations are embedded with refinery (checksummed); grants
//! are installed by code because role names carry an install-specific prefix.

mod embedded {
    refinery::embed_migrations!("migrations");
}
pub mod apply;
pub mod compat;
pub mod drift;
pub mod grants;
pub mod lint;
pub mod manifest;
pub mod readiness;
pub mod report;
pub mod roles;

#[cfg(feature = "fault-injection")]
pub use apply::migrate_set_killed_after;
pub use apply::{
    build_indexes, migrate, migrate_set, Blocked, ConcurrentIndex, GaveUp, MigrateOptions, Wait,
    CONCURRENT_INDEXES,
};
pub use compat::{file_name, Kind, MigrationSet, Range, BASELINE};
pub use drift::{drift_of, stream_drift, Drift};
pub use grants::{
    expected_column_privileges, expected_privileges, manifest, table_privileges, COLUMN_GRANTS,
    DISPATCHER_GRANTS, EXECUTE_GRANTS, GRANTS, PRIVILEGES,
};
pub use manifest::{Grant, Object};
pub use readiness::{check, check_with, current_role};
pub use roles::{bootstrap, Roles};

/// This binary's version as `db status` and the replica guard row show it: the package
/// version and the commit it was built from.
pub const BINARY_VERSION: &str =
    concat!(env!("CARGO_PKG_VERSION"), "+", env!("QLSCHED_GIT_COMMIT"));

/// The newest migration this binary carries.
pub fn newest_known() -> i32 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
        .unwrap_or(0)
}

/// The capability this binary was built for.
pub const CAPABILITY: (&str, i32) = ("cluster_scheduler_admission", 1);
/// Where refinery records the applied stream.
pub const HISTORY_TABLE: &str = "qlsched.schema_migrations";

/// How many migrations this binary carries.
pub fn embedded_count() -> usize {
    embedded::migrations::runner().get_migrations().len()
}

fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Quotes for callers that build DDL (tests, bootstrap passwords).
pub fn quote_ident(s: &str) -> String {
    ident(s)
}
pub fn quote_literal(s: &str) -> String {
    literal(s)
}

#[cfg(test)]
mod tests {
    /// The checksums databases already hold for V1–V4 (written by refinery 0.8). `db check`
    /// compares them with the binary's, so a refinery upgrade that changed its checksum
    /// format would make every existing install look drifted.
    const RELEASED: [(i32, &str, u64); 4] = [
        (1, "definitions", 14791040587439287459),
        (2, "trigger_schedules", 9068370986614859968),
        (3, "admitted_work", 14139397345312043001),
        (4, "capability", 1188957103559766989),
    ];

    #[test]
    fn released_migrations_keep_the_checksums_existing_databases_recorded() {
        let runner = super::embedded::migrations::runner();
        for (version, name, checksum) in RELEASED {
            let m = runner
                .get_migrations()
                .iter()
                .find(|m| m.version() == version)
                .unwrap_or_else(|| panic!("migration V{version} is missing"));
            assert_eq!(m.name(), name, "name of V{version}");
            assert_eq!(
                m.checksum(),
                checksum,
                "checksum of V{version}__{name}.sql changed: a migration file was edited, or \
                 refinery changed its checksum format (existing databases would fail db check)"
            );
        }
    }
}
