//! Draining at stop: claiming stops, the live claim actors are waited for up to the drain
//! bound, and a claim statement in flight is always waited for (it is bounded), so that
//! whatever it leased is handed over by the caller too.

use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::Supervisor;

/// The stop: whether claiming has stopped, and who waits for the drain and for the claim
/// statement in flight.
#[derive(Default)]
pub(super) struct DrainState {
    pub(super) stopping: bool,
    pub(super) waiters: Vec<oneshot::Sender<()>>,
    /// Waiting for the claim statement in flight to end (a stop past its drain).
    pub(super) round_waiters: Vec<oneshot::Sender<()>>,
}

impl Supervisor {
    /// Drained = no claim actor alive and no claim statement in flight.
    pub(super) fn maybe_drained(&mut self) {
        if self.live.is_empty() && self.gate.idle() {
            for w in self.drain.waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// The claim statement in flight ended: wake a stop waiting for it.
    pub(super) fn round_ended(&mut self) {
        for w in self.drain.round_waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

/// Stop claiming, wait up to `drain` for the live claim actors, then report how many were
/// still running (their leases are released by the caller or expire). A claim statement in
/// flight is always waited for (it is bounded), so that whatever it leased is released by
/// the caller too.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Drain(pub Duration);

impl Handler<Drain> for Supervisor {
    type Result = ResponseActFuture<Self, usize>;

    fn handle(&mut self, msg: Drain, _ctx: &mut Self::Context) -> Self::Result {
        self.drain.stopping = true;
        let (tx, rx) = oneshot::channel();
        self.drain.waiters.push(tx);
        self.maybe_drained();
        let round_bound = self.settings.claim_bound() + Duration::from_secs(1);
        Box::pin(
            async move {
                let _ = tokio::time::timeout(msg.0, rx).await;
            }
            .into_actor(self)
            .then(move |_, act, _| {
                // Past the drain: claim actors are abandoned, but a round still in flight
                // is waited for.
                let waiting = !act.gate.idle();
                let (tx, rx) = oneshot::channel::<()>();
                if waiting {
                    act.drain.round_waiters.push(tx);
                }
                async move {
                    if waiting {
                        let _ = tokio::time::timeout(round_bound, rx).await;
                    }
                }
                .into_actor(act)
            })
            .map(|_, act, _| act.live.len()),
        )
    }
}
