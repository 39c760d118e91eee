//! Advisory locks (docs/design.md, "Advisory locks"). PostgreSQL lets any role that can
//! connect take any advisory lock — the zero-privilege worker_ingress role included — so
//! qlsched never waits for one without a bound, and a refusal names the sessions that hold
//! it (pid, role, application), for the operator to let finish or to end.

use std::fmt;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::StoreError;

/// The bound on a lock wait when the session sets no `lock_timeout` of its own (a DSN's
/// `options=-c lock_timeout=…` replaces it).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Bounds every lock wait of the rest of the caller's transaction by the session's own
/// `lock_timeout`, or [`DEFAULT_WAIT`] when it has none (0); returns the bound in force.
///
/// Locking: takes none; `SET LOCAL` semantics (`set_config(…, true)`), so the session's
/// setting is back at the end of the transaction.
pub async fn bound_waits(
    client: &impl tokio_postgres::GenericClient,
) -> Result<String, StoreError> {
    let default = format!("{}ms", DEFAULT_WAIT.as_millis());
    Ok(client
        .query_one(
            "SELECT set_config('lock_timeout',
                               CASE current_setting('lock_timeout') WHEN '0' THEN $1
                                    ELSE current_setting('lock_timeout') END, true)",
            &[&default],
        )
        .await?
        .get(0))
}

/// A session holding an advisory lock, as the lock table and `pg_stat_activity` show it to
/// any role (pid, role and application name are visible to all; the query is not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    pub role: Option<String>,
    pub application: Option<String>,
    /// Since when: the start of its transaction (of its session for a session lock), UTC.
    pub since: Option<String>,
    /// `ExclusiveLock` or `ShareLock`.
    pub mode: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} (role {}, application {:?}, {}{})",
            self.pid,
            self.role.as_deref().unwrap_or("?"),
            self.application.as_deref().unwrap_or(""),
            self.since
                .as_deref()
                .map_or(String::new(), |s| format!("since {s}, ")),
            self.mode
        )
    }
}

/// The holders of a lock, for an error message: each one, and what to do about them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holders(pub Vec<Holder>);

impl fmt::Display for Holders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "free now (its holder released it meanwhile)");
        }
        let all: Vec<String> = self.0.iter().map(Holder::to_string).collect();
        write!(
            f,
            "held by {}; a session that is not a qlsched command can be ended with \
             SELECT pg_terminate_backend(<pid>)",
            all.join("; ")
        )
    }
}

/// The sessions holding the advisory lock `key` (a one-bigint key) in this database.
///
/// Locking: reads the lock table and `pg_stat_activity` (both readable by every role);
/// takes no lock.
pub async fn holders(
    client: &impl tokio_postgres::GenericClient,
    key: i64,
) -> Result<Holders, StoreError> {
    let rows = client
        .query(
            "SELECT l.pid, a.usename::text, a.application_name, l.mode,
                    to_char(coalesce(a.xact_start, a.backend_start) AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
               FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND ((l.classid::bigint << 32) | l.objid::bigint) = $1
              ORDER BY l.pid",
            &[&key],
        )
        .await?;
    Ok(Holders(
        rows.iter()
            .map(|r| Holder {
                pid: r.get(0),
                role: r.get(1),
                application: r.get(2),
                mode: r.get(3),
                since: r.get(4),
            })
            .collect(),
    ))
}

/// `e`, the error of a statement whose lock waits [`bound_waits`] bounded by `bound`, as the
/// caller's error: a wait that timed out (SQLSTATE 55P03) names the holders of `lock` (key
/// `key`), read on `client` (outside the failed transaction, which the caller ended);
/// anything else is `e` itself.
pub async fn wait_error(
    client: &impl tokio_postgres::GenericClient,
    e: tokio_postgres::Error,
    what: &'static str,
    (lock, key): (&'static str, i64),
    bound: String,
) -> StoreError {
    if e.code() != Some(&SqlState::LOCK_NOT_AVAILABLE) {
        return e.into();
    }
    match holders(client, key).await {
        Ok(holders) => StoreError::LockWait {
            what,
            lock,
            bound,
            holders: holders.to_string(),
        },
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::{Holder, Holders};

    #[test]
    fn holders_are_named_with_pid_role_and_application() {
        let h = Holders(vec![Holder {
            pid: 42,
            role: Some("qlsched_worker_ingress".into()),
            application: Some("psql".into()),
            since: Some("2026-12-05T06:00:00Z".into()),
            mode: "ExclusiveLock".into(),
        }]);
        assert_eq!(
            h.to_string(),
            "held by pid 42 (role qlsched_worker_ingress, application \"psql\", since \
             2026-12-05T06:00:00Z, ExclusiveLock); \
             a session that is not a qlsched command can be ended with SELECT \
             pg_terminate_backend(<pid>)"
        );
        assert!(Holders::default().to_string().starts_with("free now"));
    }
}
