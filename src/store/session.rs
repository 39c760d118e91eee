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
    /// The driver's settings and the TLS connector (see [`super::Target`]).
    pub pg: super::Target,
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
    /// Statements prepared on this connection, by their text.
    prepared: std::collections::HashMap<&'static str, tokio_postgres::Statement>,
}

impl Session {
    pub fn new(connector: Connector) -> Session {
        Session {
            connector,
            client: None,
            prepared: std::collections::HashMap::new(),
        }
    }

    /// The open connection, connecting first when there is none (or its backend is gone).
    pub async fn client(&mut self) -> Result<&tokio_postgres::Client, StoreError> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.discard();
        }
        if self.client.is_none() {
            let client = self.connector.connect().await?;
            // The statements this connection runs are prepared once, and their generic plans
            // are the right ones (tests/it/plans.rs): use them from the first execution, so
            // nothing is planned per round or per batch.
            client
                .batch_execute("SET plan_cache_mode = force_generic_plan")
                .await?;
            self.client = Some(client);
        }
        Ok(self.client.as_ref().expect("connected above"))
    }

    /// Drops the connection: its last statement's outcome is unknown, so nothing else may
    /// run behind it on the same backend.
    pub fn discard(&mut self) {
        self.client = None;
        self.prepared.clear();
    }

    /// The connection and `sql` prepared on it: prepared once per connection and executed
    /// with its cached generic plan (the session sets `plan_cache_mode = force_generic_plan`;
    /// `tests/it/plans.rs` proves the generic plans are the right ones).
    pub async fn prepared(
        &mut self,
        sql: &'static str,
    ) -> Result<(&tokio_postgres::Client, tokio_postgres::Statement), StoreError> {
        self.client().await?;
        let client = self.client.as_ref().expect("connected above");
        let stmt = match self.prepared.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = client.prepare(sql).await?;
                self.prepared.insert(sql, s.clone());
                s
            }
        };
        Ok((client, stmt))
    }
}
