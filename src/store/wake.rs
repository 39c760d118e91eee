//! Change notifications on one channel: publishing or enabling a trigger wakes the replicas
//! at once instead of after their idle interval. The payload is the earliest instant the
//! change makes something claimable (Unix ms, database clock); empty means "now".
//!
//! Notifications are an optimisation only. A lost one, a listener that reconnects, or a
//! connection pooler that does not carry `LISTEN` (PgBouncer in transaction mode) only means
//! the change is picked up at the next cadence round.

use futures::StreamExt;
use tokio::sync::mpsc;

use super::session::Connector;
use super::StoreError;

/// The channel every replica listens on.
pub const CHANNEL: &str = "qlsched_wake";

/// Sends a wake-up in the caller's transaction (delivered at its commit, never before).
pub async fn notify(
    client: &impl tokio_postgres::GenericClient,
    at_ms: Option<i64>,
) -> Result<(), StoreError> {
    client
        .execute(
            "SELECT pg_notify('qlsched_wake', coalesce($1::bigint::text, ''))",
            &[&at_ms],
        )
        .await?;
    Ok(())
}

/// Opens a dedicated connection that listens on [`CHANNEL`]. Each notification arrives on the
/// receiver as its instant (`None` = now); the receiver ends when the connection does.
pub async fn listen(
    connector: &Connector,
) -> Result<(tokio_postgres::Client, mpsc::UnboundedReceiver<Option<i64>>), StoreError> {
    let (client, mut connection) = super::session::bounded(
        "connecting the listener",
        connector.connect_timeout,
        async { Ok(connector.pg.connect_raw().await?) },
    )
    .await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    tokio::spawn(async move {
        while let Some(Ok(msg)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = msg {
                if tx.send(n.payload().parse::<i64>().ok()).is_err() {
                    break;
                }
            }
        }
    });
    client.batch_execute("LISTEN qlsched_wake").await?;
    Ok((client, rx))
}
