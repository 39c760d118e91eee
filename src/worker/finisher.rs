//! The worker's finishes, several per call (V25 `dispatch_finish_batch`; docs/worker.md,
//! "Attempts, leases and stopping"). An attempt that ended hands its outcome here and waits
//! for the answer; one task collects the outcomes that arrive within `take_linger` of the
//! first (at most `concurrency` of them) and records them in one call, each judged by its own
//! lease: a refused one is answered "not recorded" alone. While the database does not answer,
//! the call is tried again a bounded number of times, then every attempt of the batch hears
//! the error (its lease will expire).

use std::time::Duration;

use slog::{warn, Logger};
use tokio::sync::{mpsc, oneshot};

use crate::db::{self, Pool};
use crate::store::worker::{self as calls, Finish, Taken};

/// How often a batch is tried while the database does not answer (each within the lease).
const TRIES: u32 = 5;

/// What the finish of one attempt answered: recorded (true), refused because its lease was
/// not held (false), or the error of the last try.
pub(super) type Answer = Result<bool, String>;

struct Ended {
    taken: Taken,
    finish: Finish,
    answer: oneshot::Sender<Answer>,
}

/// The handle the attempts hand their outcomes to; its task ends when the last handle goes.
#[derive(Clone)]
pub(super) struct Finisher {
    tx: mpsc::UnboundedSender<Ended>,
}

impl Finisher {
    /// Starts the collecting task on the current thread's local set.
    pub fn spawn(pool: Pool, linger: Duration, max: usize, log: Logger) -> Finisher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::task::spawn_local(collect(pool, rx, linger, max.clamp(1, 1000), log));
        Finisher { tx }
    }

    /// Records `f` for `t` (in a batch with the other attempts that ended meanwhile).
    pub async fn finish(&self, t: &Taken, f: Finish) -> Answer {
        let (answer, rx) = oneshot::channel();
        let ended = Ended {
            taken: t.clone(),
            finish: f,
            answer,
        };
        if self.tx.send(ended).is_err() {
            return Err("the worker's finisher has stopped".into());
        }
        rx.await
            .unwrap_or_else(|_| Err("the worker's finisher has stopped".into()))
    }
}

async fn collect(
    pool: Pool,
    mut rx: mpsc::UnboundedReceiver<Ended>,
    linger: Duration,
    max: usize,
    log: Logger,
) {
    while let Some(first) = rx.recv().await {
        let until = tokio::time::Instant::now() + linger;
        let mut batch = vec![first];
        // The ones already waiting are taken even with a zero linger (the timeout polls first).
        while batch.len() < max {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(e)) => batch.push(e),
                Ok(None) | Err(_) => break,
            }
        }
        record(&pool, batch, &log).await;
    }
}

async fn record(pool: &Pool, batch: Vec<Ended>, log: &Logger) {
    let pairs: Vec<(&Taken, &Finish)> = batch.iter().map(|e| (&e.taken, &e.finish)).collect();
    let mut delay = Duration::from_millis(200);
    let mut tries = 0;
    let answers = loop {
        tries += 1;
        let res = async {
            let c = db::conn(pool).await?;
            calls::finish_batch(&c, &pairs).await
        }
        .await;
        match res {
            Ok(recorded) => break recorded.into_iter().map(Ok).collect::<Vec<Answer>>(),
            Err(e) if tries < TRIES => {
                warn!(log, "finish failed; trying again"; "attempts" => pairs.len(), "error" => %e,
                      "retry_in_ms" => delay.as_millis() as u64);
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => break vec![Err(e.to_string()); pairs.len()],
        }
    };
    drop(pairs);
    for (e, a) in batch.into_iter().zip(answers) {
        let _ = e.answer.send(a);
    }
}
