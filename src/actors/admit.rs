//! The admit actor: the single writer of leases on this replica. It queues the decisions
//! claim actors send and hands them to the [`Engine`] in batches, one batch at a time: the
//! decisions that arrive while a batch runs go together into the next one (one round trip
//! and one WAL flush for many occurrences).

use actix::prelude::*;
use slog::{debug, o, warn, Logger};
use tokio::sync::oneshot;

use super::Settings;
use crate::db::session::Session;
use crate::engine::{AdmitError, Engine, Job, JobResult};
use crate::metrics::Metrics;

pub struct AdmitActor {
    /// The engine, absent while a batch runs (it is moved into the batch's future).
    engine: Option<Engine>,
    log: Logger,
    queue: Vec<(Job, oneshot::Sender<JobResult>)>,
    busy: bool,
}

impl AdmitActor {
    /// `log` is the replica's root logger; the actor adds its own `actor` key.
    pub fn new(settings: &Settings, metrics: Metrics, log: &Logger) -> Self {
        let log = log.new(o!("actor" => "admit"));
        AdmitActor {
            engine: Some(Engine {
                // The server cancels what the engine abandons (statement_timeout = the bound).
                session: Session::bounded(settings.connector.clone(), settings.admit_timeout),
                log: log.clone(),
                metrics,
                admit_timeout: settings.admit_timeout,
                max_retries: settings.max_serialization_retries,
                reject_backoff: settings.reject_backoff,
            }),
            log,
            queue: Vec::new(),
            busy: false,
        }
    }

    /// Takes everything queued and runs it as one batch; when done, the next batch.
    fn run_batch(&mut self, ctx: &mut Context<Self>) {
        if self.queue.is_empty() {
            self.busy = false;
            return;
        }
        let Some(mut engine) = self.engine.take() else {
            return;
        };
        let (jobs, replies): (Vec<Job>, Vec<_>) =
            std::mem::take(&mut self.queue).into_iter().unzip();
        ctx.spawn(
            async move {
                let results = engine.process(jobs).await;
                (engine, results)
            }
            .into_actor(self)
            .map(move |(engine, results), act, ctx| {
                act.engine = Some(engine);
                let admitted = results
                    .iter()
                    .any(|r| matches!(r, Ok(crate::engine::Outcome::Admitted { .. })));
                if admitted && super::faults::admit_actor_should_die() {
                    // Fault drill: the transaction committed, the replies are never sent.
                    ctx.stop();
                    return;
                }
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
                act.run_batch(ctx);
            }),
        );
    }
}

impl Actor for AdmitActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(HARD_MAILBOX);
        debug!(self.log, "admit actor started");
    }
}

/// Mailbox bound: at most one message per live claim actor, which the hard cap bounds.
pub const HARD_MAILBOX: usize = super::HARD_CLAIM_CAP as usize * 2;

/// One decided lease, sent by a claim actor: queued for the next batch, answered with how
/// the lease ended.
#[derive(Debug, Message)]
#[rtype(result = "JobResult")]
pub struct Admit(pub Job);

impl Handler<Admit> for AdmitActor {
    type Result = ResponseFuture<JobResult>;

    fn handle(&mut self, Admit(job): Admit, ctx: &mut Self::Context) -> Self::Result {
        let (reply, rx) = oneshot::channel();
        self.queue.push((job, reply));
        if !self.busy {
            // Start once the mailbox is drained, so that the decisions the claim actors of
            // one round send together land in one batch: the context polls its mailbox
            // empty before it polls the futures spawned while handling it. (A zero-delay
            // timer did the same a timer tick later: about 1 ms on every batch.)
            self.busy = true;
            ctx.spawn(fut::ready(()).map(|(), act: &mut Self, ctx| act.run_batch(ctx)));
        }
        Box::pin(async move { rx.await.unwrap_or(Err(AdmitError::ActorGone)) })
    }
}

/// Stops the actor (operators' and tests' way to exercise the supervisor's restart).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for AdmitActor {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        warn!(self.log, "admit actor asked to stop");
        ctx.stop();
    }
}
