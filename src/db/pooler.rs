//! Refuses a pooler that hands one client connection to different PostgreSQL sessions
//! (PgBouncer with `pool_mode = transaction` or `statement`).
//!
//! tokio-postgres prepares named statements (`s0`, `s1`, …) for parameterised queries and
//! uses them in a later message exchange; behind transaction pooling that exchange may reach
//! another server connection ("prepared statement … does not exist"), or another replica's
//! statement of the same name ("… already exists"). PgBouncer tracks prepared statements
//! only from 1.21 (`max_prepared_statements`); Debian 12 ships 1.18. Session pooling keeps
//! one server connection per client connection and works.
//!
//! The probe costs five round trips at start, and never prepares a statement itself
//! (simple-query protocol): connection A opens a transaction (pinning a server connection),
//! connection B notes its backend pid, A commits, B asks for its pid twice more. On a direct
//! connection or a session pooler B's pid never changes. A transaction pooler hands B the
//! server connection A just released (PgBouncer reuses the last released one first, or with
//! `server_round_robin` the oldest: one of the two asks sees it).

use std::time::Duration;

use super::{conn, Conn, Pool, StoreError, Target};

async fn backend_pid(c: &Conn<'_>) -> Result<i32, StoreError> {
    let rows = c.simple_query("SELECT pg_backend_pid()").await?;
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
            _ => None,
        })
        .ok_or(StoreError::NoBackendPid)
}

/// `Err(StoreError::TransactionPooling)` when one client connection is served by more than
/// one PostgreSQL session, naming the pooler's version when its admin console tells it
/// (`target` is where the pool connects). Needs two pooled connections at once (the pool
/// holds at least two).
pub async fn require_session_pooling(pool: &Pool, target: &Target) -> Result<(), StoreError> {
    let a = conn(pool).await?;
    let b = conn(pool).await?;
    a.simple_query("BEGIN").await?;
    let first = backend_pid(&b).await;
    a.simple_query("COMMIT").await?;
    let first = first?;
    for _ in 0..2 {
        let now = backend_pid(&b).await?;
        if now != first {
            let pooler = pooler_version(target).await;
            return Err(StoreError::TransactionPooling { first, now, pooler });
        }
    }
    Ok(())
}

/// The pooler's own version (`PgBouncer 1.18.0`), from `SHOW VERSION` on its admin console
/// (database `pgbouncer`, same host and role), or `None` when it does not answer there:
/// only roles in its `admin_users` or `stats_users` may ask, and a pooled connection never
/// shows it (server parameters are the server's).
pub async fn pooler_version(target: &Target) -> Option<String> {
    let mut console = target.clone();
    console.dbname("pgbouncer");
    let ask = async {
        let client = super::connect(&console).await.ok()?;
        let rows = client.simple_query("SHOW VERSION").await.ok()?;
        rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()
        .flatten()
}
