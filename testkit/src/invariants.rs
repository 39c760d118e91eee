//! The exactly-once invariants, defined once in `sql/invariants.sql`: the tests and drills
//! run it through [`check`] / [`assert_holds`], the scripts with `psql -f` (the file's
//! header says how).

use tokio_postgres::{Client, SimpleQueryMessage};

/// The invariants' SQL: a script whose one query lists the violated invariants (rolled back;
/// run it outside a transaction, as a superuser or the owner).
pub const SQL: &str = include_str!("../sql/invariants.sql");

/// The name of the invariant every report leads with: two runs for one occurrence.
pub const DUPLICATE_OCCURRENCE: &str = "duplicate occurrence";

/// One violated invariant: its name (as the file lists them), how many offending keys, and
/// the first few of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: String,
    pub violations: i64,
    pub sample: String,
}

/// Every violated invariant, by name; empty when all hold.
pub async fn check(sql: &Client) -> Vec<Violation> {
    sql.simple_query(SQL)
        .await
        .unwrap_or_else(|e| panic!("the invariants query failed: {e:?}"))
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(Violation {
                invariant: r.get(0).unwrap_or_default().to_string(),
                violations: r.get(1).and_then(|n| n.parse().ok()).unwrap_or_default(),
                sample: r.get(2).unwrap_or_default().to_string(),
            }),
            _ => None,
        })
        .collect()
}

/// How many keys break `invariant` (0 when it holds).
pub fn count(found: &[Violation], invariant: &str) -> i64 {
    found
        .iter()
        .filter(|v| v.invariant == invariant)
        .map(|v| v.violations)
        .sum()
}

/// Panics naming every violated invariant, its count and sample keys.
pub async fn assert_holds(sql: &Client) {
    let found = check(sql).await;
    assert!(
        found.is_empty(),
        "exactly-once invariants violated:\n{}",
        found
            .iter()
            .map(|v| format!("  {}: {} ({})", v.invariant, v.violations, v.sample))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
