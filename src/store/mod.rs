//! Every SQL statement of qlsched, in one place. Each file is named for the rows it writes or
//! reads; each function for the question it answers, and carries, in one comment, the reason
//! its locking is right.
//!
//! Time is always the database clock (`clock_timestamp()` in Unix ms, [`crate::db_now_ms`]),
//! observed inside the same statement that acts on it. Connections come from [`crate::db`].

pub mod admission;
pub mod browse;
pub mod claim;
pub mod dispatch;
#[cfg(test)]
mod lock_order;
pub mod manage;

pub mod queued_prune;
pub mod recovery;
pub mod release;
pub mod replicas;
pub mod retention;
pub mod runs;
pub mod status;
pub mod triggers;
pub mod wake;
pub mod worker;

/// A read-only REPEATABLE READ transaction: one snapshot for reads that must agree.
pub async fn snapshot(
    client: &mut tokio_postgres::Client,
) -> Result<tokio_postgres::Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}
