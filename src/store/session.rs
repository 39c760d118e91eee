//! A dedicated connection owned by one actor (the claim round of the supervisor, the admit
//! engine). Not pooled on purpose: when a statement's outcome is unknown (a client-side
//! time-out, a lost reply) the connection is dropped, never handed to the next user with a
//! transaction possibly still committing on its backend.

use std::time::Duration;

use super::StoreError;

/// Awaits `fut` for at most `after`; a time-out becomes [`StoreError::Timeout`] naming `what`.
pub async fn bounded<T>(
    what: &'static str,
    after: Duration,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(after, fut)
        .await
        .unwrap_or(Err(StoreError::Timeout { what, after }))
}

/// How to open a connection: the replica's PostgreSQL settings and the connect bound.
#[derive(Clone)]
pub struct Connector {
    pub pg: tokio_postgres::Config,
    pub connect_timeout: Duration,
}

impl Connector {
    pub async fn connect(&self) -> Result<tokio_postgres::Client, StoreError> {
        bounded(
            "connecting to the database",
            self.connect_timeout,
            super::connect(&self.pg),
        )
        .await
    }
}

/// One connection, opened on first use and re-opened after it broke or was discarded.
pub struct Session {
    connector: Connector,
    client: Option<tokio_postgres::Client>,
}

impl Session {
    pub fn new(connector: Connector) -> Session {
        Session {
            connector,
            client: None,
        }
    }

    /// The open connection, connecting first when there is none (or its backend is gone).
    pub async fn client(&mut self) -> Result<&tokio_postgres::Client, StoreError> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            self.client = Some(self.connector.connect().await?);
        }
        Ok(self.client.as_ref().expect("connected above"))
    }

    /// Drops the connection: its last statement's outcome is unknown, so nothing else may
    /// run behind it on the same backend.
    pub fn discard(&mut self) {
        self.client = None;
    }
}
