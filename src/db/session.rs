//! A dedicated connection owned by one actor (the claim round of the supervisor, the admit
//! engine). Not pooled on purpose: when a statement's outcome is unknown (a client-side
//! time-out, a lost reply) the connection is dropped, never handed to the next user with a
//! transaction possibly still committing on its backend.
//!
//! A session may carry a server-side `statement_timeout` equal to its users' client-side
//! bound, so that a statement the client abandoned (a time-out) is cancelled by the server
//! too, instead of committing later (after the replica released its leases at stop).
//!
//! Everything that happens before a statement of the caller is sent (connecting, the
//! session's setup, preparing) fails as [`StoreError::NotSent`]: nothing can have been
//! written.

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
    /// Opens a connection within `connect_timeout`; any failure is [`StoreError::NotSent`].
    pub async fn connect(&self) -> Result<tokio_postgres::Client, StoreError> {
        bounded(
            "connecting to the database",
            self.connect_timeout,
            super::connect(&self.pg),
        )
        .await
        .map_err(not_sent)
    }
}

/// Marks an error as happening before anything of the caller was sent.
fn not_sent(e: StoreError) -> StoreError {
    match e {
        StoreError::NotSent(_) => e,
        e => StoreError::NotSent(Box::new(e)),
    }
}

/// One connection, opened on first use and re-opened after it broke or was discarded.
pub struct Session {
    connector: Connector,
    /// Server-side `statement_timeout` set on every connection of this session.
    statement_timeout: Option<Duration>,
    client: Option<tokio_postgres::Client>,
    /// Statements prepared on this connection, by their text.
    prepared: std::collections::HashMap<&'static str, tokio_postgres::Statement>,
}

impl Session {
    /// A session without a server-side statement bound.
    pub fn new(connector: Connector) -> Session {
        Session {
            connector,
            statement_timeout: None,
            client: None,
            prepared: std::collections::HashMap::new(),
        }
    }

    /// A session whose statements the server cancels after `bound` (`statement_timeout`),
    /// matching the client-side bound its users put on each statement: a statement the
    /// client abandoned cannot commit afterwards.
    pub fn bounded(connector: Connector, bound: Duration) -> Session {
        Session {
            statement_timeout: Some(bound),
            ..Session::new(connector)
        }
    }

    /// The server-side statement bound of this session, if any.
    pub fn statement_timeout(&self) -> Option<Duration> {
        self.statement_timeout
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
            let mut setup = String::from("SET plan_cache_mode = force_generic_plan");
            if let Some(bound) = self.statement_timeout {
                // At least 1 ms: 0 would mean no bound at all.
                let ms = bound.as_millis().max(1);
                setup.push_str(&format!("; SET statement_timeout = {ms}"));
            }
            client
                .batch_execute(&setup)
                .await
                .map_err(|e| not_sent(e.into()))?;
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
                let s = client.prepare(sql).await.map_err(|e| not_sent(e.into()))?;
                self.prepared.insert(sql, s.clone());
                s
            }
        };
        Ok((client, stmt))
    }
}

impl Session {
    /// [`Session::client`] within `after`; a time-out is [`StoreError::NotSent`] (nothing of
    /// the caller's was sent yet).
    pub async fn client_within(
        &mut self,
        after: Duration,
    ) -> Result<&tokio_postgres::Client, StoreError> {
        let ready = tokio::time::timeout(after, async { self.client().await.map(|_| ()) }).await;
        match ready {
            Ok(Ok(())) => Ok(self.client.as_ref().expect("connected above")),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(self.not_ready_within(after)),
        }
    }

    /// The connection was not ready within `after`: it is discarded, and nothing of the
    /// caller's was sent.
    fn not_ready_within(&mut self, after: Duration) -> StoreError {
        self.discard();
        not_sent(StoreError::Timeout {
            what: "getting the connection ready",
            after,
        })
    }

    /// [`Session::prepared`] within `after`; a time-out is [`StoreError::NotSent`].
    pub async fn prepared_within(
        &mut self,
        sql: &'static str,
        after: Duration,
    ) -> Result<(&tokio_postgres::Client, tokio_postgres::Statement), StoreError> {
        let ready =
            tokio::time::timeout(after, async { self.prepared(sql).await.map(|(_, s)| s) }).await;
        match ready {
            Ok(Ok(stmt)) => Ok((self.client.as_ref().expect("prepared above"), stmt)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(self.not_ready_within(after)),
        }
    }
}
