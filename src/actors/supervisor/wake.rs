//! Waking (docs/design.md, "Waking"): a round starts before the next cadence tick when a row
//! becomes claimable sooner — at the head of the claim index as the last round read it, at a
//! cursor a claim actor just moved, or at the instant a change notification names. Database
//! instants become local ones through the last round's [`DbClock`], and only the earliest
//! wake is kept.

use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{debug, warn};

use super::Supervisor;
use crate::clock::DbClock;
use crate::store::wake::Heard;

/// The wake state: the pending wake and the clock it is reckoned by.
#[derive(Default)]
pub(super) struct WakeState {
    /// The next precise wake-up (a row becomes claimable), before the next tick.
    pub(super) at: Option<(Instant, SpawnHandle)>,
    /// The last round's observation of the database clock.
    pub(super) clock: Option<DbClock>,
}

impl Supervisor {
    /// Listens for change notifications on a dedicated connection, reconnecting with a
    /// back-off; tied to this actor's life.
    pub(super) fn start_listener(&mut self, ctx: &mut Context<Self>) {
        if !self.settings.listen {
            return;
        }
        let (connector, addr, log, metrics) = (
            self.settings.connector.clone(),
            ctx.address(),
            self.log.clone(),
            self.metrics.clone(),
        );
        ctx.spawn(
            async move {
                let mut delay = Duration::from_millis(500);
                loop {
                    match crate::store::wake::listen(&connector).await {
                        Ok(mut rx) => {
                            delay = Duration::from_millis(500);
                            debug!(log, "listening for change notifications");
                            while let Some(heard) = rx.recv().await {
                                match heard {
                                    Heard::Wake(at_ms) => addr.do_send(Wake { at_ms }),
                                    Heard::Ignored { sender_pid, why } => {
                                        metrics.notifications_ignored.inc();
                                        debug!(log, "ignored a notification on the wake channel";
                                               "sender_pid" => sender_pid, "why" => why);
                                    }
                                }
                            }
                            warn!(log, "change listener disconnected; changes are picked up at the cadence until it reconnects");
                        }
                        Err(e) => debug!(log, "change listener cannot connect"; "error" => %e),
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
            .into_actor(self),
        );
    }

    /// A round observed the database clock and the next instant a row becomes claimable.
    pub(super) fn wake_for_round(
        &mut self,
        clock: DbClock,
        next_due_ms: Option<i64>,
        ctx: &mut Context<Self>,
    ) {
        self.wake.clock = Some(clock);
        if let Some(next) = next_due_ms {
            self.wake_at(clock.local_after(next), ctx);
        }
    }

    /// Wakes at `at` (when a row becomes claimable) unless an earlier wake is already set or
    /// the cadence tick comes first anyway. A wake that finds a round running leaves the
    /// catch-up signal, so the round after it starts at once.
    pub(super) fn wake_at(&mut self, at: Instant, ctx: &mut Context<Self>) {
        let now = Instant::now();
        if at >= now + self.settings.cadence {
            return;
        }
        if let Some((t, h)) = self.wake.at {
            if t <= at {
                return;
            }
            ctx.cancel_future(h);
        }
        let h = ctx.run_later(at.saturating_duration_since(now), |act, ctx| {
            act.wake.at = None;
            act.metrics.wakeups.inc();
            act.gate.due_again();
            act.start_round(ctx);
        });
        self.wake.at = Some((at, h));
    }
}

/// A change notification: something may be claimable at `at_ms` (database clock; `None` =
/// now).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Wake {
    pub at_ms: Option<i64>,
}

impl Handler<Wake> for Supervisor {
    type Result = ();

    /// An instant ahead of the last round's observation is waited for (when it is still
    /// ahead locally); anything else — now, the past, or no round observed yet — starts a
    /// round at once.
    fn handle(&mut self, msg: Wake, ctx: &mut Self::Context) {
        self.metrics.notifications.inc();
        if self.drain.stopping {
            return;
        }
        let at = match (msg.at_ms, self.wake.clock) {
            (Some(at), Some(clock)) if clock.is_ahead(at) => Some(clock.local_at(at)),
            _ => None,
        };
        match at {
            Some(at) if at > Instant::now() => self.wake_at(at, ctx),
            _ => {
                self.gate.due_again();
                self.start_round(ctx);
            }
        }
    }
}
