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

use super::{conn, Conn, Pool, StoreError};

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
/// one PostgreSQL session. Needs two pooled connections at once (the pool holds at least two).
pub async fn require_session_pooling(pool: &Pool) -> Result<(), StoreError> {
    let a = conn(pool).await?;
    let b = conn(pool).await?;
    a.simple_query("BEGIN").await?;
    let first = backend_pid(&b).await;
    a.simple_query("COMMIT").await?;
    let first = first?;
    for _ in 0..2 {
        let now = backend_pid(&b).await?;
        if now != first {
            return Err(StoreError::TransactionPooling { first, now });
        }
    }
    Ok(())
}
