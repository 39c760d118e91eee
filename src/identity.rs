//! The replica's identity lock (docs/design.md, "The replica-id guard"). While a replica lives
//! it holds an advisory lock named by its id ([`replicas::hold_identity`]) on a connection of
//! its own that runs nothing else, so no statement time-out ever drops it (a claim round that
//! times out drops the claim connection, the session the guard row names). A second process
//! of the same host name judges the holder alive while that lock is held, whatever became of
//! the recorded session. The lock is taken once the guard row is this process's, before
//! READY; a connection that ended (a server restart, a terminated backend) is replaced and the
//! lock taken again at the guard's refresh interval.

use std::time::Duration;

use slog::{warn, Logger};

use crate::db::{self, StoreError};
use crate::store::replicas;

/// The lock's keeper; dropping it ends the connection, which releases the lock.
pub struct Identity {
    keeper: actix_rt::task::JoinHandle<()>,
}

impl Identity {
    /// Takes the lock (each try bounded by `bound`) and keeps it, checking the connection
    /// every `every`.
    pub async fn hold(
        target: db::Target,
        owner: &str,
        bound: Duration,
        every: Duration,
        log: &Logger,
    ) -> Identity {
        let held = take(&target, owner, bound, log).await;
        let (owner, log) = (owner.to_string(), log.clone());
        let keeper = actix_rt::spawn(async move {
            let mut held = held;
            loop {
                tokio::time::sleep(every).await;
                if !matches!(&held, Some(c) if !c.is_closed()) {
                    held = take(&target, &owner, bound, &log).await;
                }
            }
        });
        Identity { keeper }
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// A new connection holding the lock, or `None` (logged) when it could not be taken.
async fn take(
    target: &db::Target,
    owner: &str,
    bound: Duration,
    log: &Logger,
) -> Option<tokio_postgres::Client> {
    let res = tokio::time::timeout(bound, async {
        let c = db::connect(target).await?;
        let held = replicas::hold_identity(&c, owner).await?;
        Ok::<_, StoreError>(held.then_some(c))
    })
    .await;
    match res {
        Ok(Ok(Some(c))) => return Some(c),
        Ok(Ok(None)) => warn!(log, "another session holds this replica id's identity lock (a previous process of this id still connected?); trying again"),
        Ok(Err(e)) => warn!(log, "could not take the replica id's identity lock; trying again"; "error" => %e),
        Err(_) => warn!(log, "taking the replica id's identity lock timed out; trying again";
                        "bound_ms" => bound.as_millis() as u64),
    }
    None
}
