//! `qlsched db status` as text. The facts are [`crate::schema::report`]'s.

use std::fmt::Write;

use crate::schema::report::SchemaStatus;

impl SchemaStatus {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "applied migrations:");
        for a in &self.applied {
            let note = match a.binary {
                "same" => "",
                "changed" => "  (CHANGED: checksum differs from this binary's)",
                _ => "  (newer than this binary)",
            };
            let _ = writeln!(
                s,
                "  {:<48} {:<8} checksum {:<20} applied {}{note}",
                a.file,
                a.kind.as_deref().unwrap_or("?"),
                a.checksum,
                a.applied_on
            );
        }
        let _ = writeln!(
            s,
            "compatible range: V{}..V{} (served: binaries whose newest known migration is V{} \
             or later; the floor is {}; the database's newest is V{})",
            self.floor,
            self.newest,
            self.floor,
            self.floor_migration
                .as_deref()
                .unwrap_or("the baseline V11"),
            self.newest
        );
        let _ = writeln!(
            s,
            "this binary: qlsched {}, knows up to V{}: {}",
            self.binary_version,
            self.binary_newest_migration,
            if self.binary_served {
                "served by this database"
            } else {
                "NOT served (see `qlsched db check`)"
            }
        );
        for d in &self.deprecations {
            let _ = writeln!(s, "{d}");
        }
        let _ = writeln!(s, "live replicas: {}", self.replicas.len());
        for r in &self.replicas {
            let _ = writeln!(
                s,
                "  {:<24} {:<24} {} knows up to {} (heartbeat {} ms ago)",
                r.replica_id,
                r.hostname,
                r.binary_version
                    .as_deref()
                    .unwrap_or("(version not recorded)"),
                r.newest_migration
                    .map(|v| format!("V{v}"))
                    .unwrap_or_else(|| "?".into()),
                r.heartbeat_age_ms
            );
        }
        s
    }
}
