//! One taken attempt, from the take to its finish (the lease machine in `worker/mod.rs`):
//! the take started it (V25); check the spec, resolve its secrets, execute while heartbeats
//! extend the lease, finish (in a batch: [`super::finisher`]). Every call is fenced by the
//! attempt's lease token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{info, o, warn, Logger};
use tokio::sync::watch;

use super::finisher::Finisher;
use super::metrics::WorkerMetrics;
use super::secrets::{Credentials, Redactor};
use super::spec::{self, Executor, Spec, Text};
use super::{request, shell, Limits, Outcome, RunVars, Stop};
use crate::config::worker::WorkerConfig;
use crate::db::{self, Pool};
use crate::store::worker::{self as calls, Beat, Finish, Taken};

/// The database keeps at most this much of an error.
const ERROR_MAX: usize = 8192;

/// What every attempt of a worker shares.
pub(super) struct Shared {
    pub pool: Pool,
    pub cfg: WorkerConfig,
    pub metrics: WorkerMetrics,
    pub log: Logger,
    pub credentials: Credentials,
    /// Records the outcomes, several per call.
    pub finisher: Finisher,
    /// `Some(Stop::Drain)` once the drain timeout passed: running attempts are stopped.
    pub drain: watch::Receiver<Option<Stop>>,
}

impl Shared {
    fn lease_ms(&self) -> i64 {
        self.cfg.lease.as_millis() as i64
    }
}

/// Runs one taken attempt to its end. The take started it: `held_since` is when the take was
/// sent (the lease runs from the database's reading of its clock, after that).
pub(super) async fn run(shared: Arc<Shared>, t: Taken, held_since: Instant) {
    let log = shared
        .log
        .new(o!("run_id" => t.run_id.to_string(), "attempt" => t.attempt_no));
    let m = &shared.metrics;
    m.taken.inc();
    let taken_at_ms = t.lease_expires_at_ms - shared.lease_ms();
    m.queue_wait_seconds
        .observe((taken_at_ms - t.queued_at_ms).max(0) as f64 / 1000.0);
    let spec = match spec::parse(t.spec.as_deref().unwrap_or("")) {
        Ok(Some(s)) => s,
        Ok(None) => {
            // The take hands out only runs whose spec names an executor this worker runs.
            let o = Outcome::failed(None, String::new(), "invalid spec: no executor".into());
            finish(&shared, &t, o, &Redactor::default(), &log).await;
            return;
        }
        Err(e) => {
            let o = Outcome::failed(None, String::new(), format!("invalid spec: {e}"));
            finish(&shared, &t, o, &Redactor::default(), &log).await;
            return;
        }
    };
    let mut redactor = Redactor::default();
    let resolved = match resolve(&spec, &shared.credentials, &mut redactor) {
        Ok(r) => r,
        Err(e) => {
            let o = Outcome::failed(None, String::new(), e);
            finish(&shared, &t, o, &redactor, &log).await;
            return;
        }
    };
    m.running.inc();
    let began = Instant::now();
    let (outcome, lost) = execute(&shared, &t, &spec, resolved, &redactor, held_since, &log).await;
    m.running.dec();
    m.execution_seconds.observe(began.elapsed().as_secs_f64());
    if lost {
        m.lost.inc();
        warn!(log, "lease lost: the command was stopped and nothing is recorded (the run may be retried elsewhere)");
        return;
    }
    finish(&shared, &t, outcome, &redactor, &log).await;
}

/// The spec's values with secrets read; each secret's value joins the redactor.
fn resolve(
    spec: &Spec,
    creds: &Credentials,
    redactor: &mut Redactor,
) -> Result<Vec<(String, String)>, String> {
    let pairs: &[(String, Text)] = match &spec.executor {
        Executor::Shell(s) => &s.env,
        Executor::Http(h) => &h.headers,
    };
    let mut out = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        let value = match v {
            Text::Plain(s) => s.clone(),
            Text::Secret(name) => {
                let secret = creds.resolve(name).map_err(|e| e.to_string())?;
                redactor.add(secret.expose());
                secret.expose().to_string()
            }
        };
        out.push((k.clone(), value));
    }
    Ok(out)
}

/// How long after sending a call that granted (or extended) the lease this worker holds it by
/// its own monotonic clock: the lease less a margin of `heartbeat + kill_grace`, so that a
/// command stopped then (SIGTERM, `kill_grace`, SIGKILL) is gone before the lease can end on
/// the database clock; the margin is at most `lease − 2 × heartbeat`, so a healthy attempt
/// always has a heartbeat's answer in hand before its deadline.
pub(super) fn hold_for(lease: Duration, heartbeat: Duration, kill_grace: Duration) -> Duration {
    let margin = (heartbeat + kill_grace).min(lease.saturating_sub(heartbeat * 2));
    lease - margin
}

/// Resolves with the in-flight call's answer; never while none is in flight.
async fn answer_of<F: std::future::Future + Unpin>(call: &mut Option<F>) -> F::Output {
    match call {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Executes while heartbeats extend the lease; (outcome, lease lost). `held_since` is when the
/// start was sent: the local deadline counts from it, then from each heartbeat that answered
/// "held", as sent. Past the deadline with no such answer the work is stopped as for a lost
/// lease, whatever the database says (it may not be reachable).
#[allow(clippy::too_many_arguments)]
async fn execute(
    shared: &Shared,
    t: &Taken,
    spec: &Spec,
    resolved: Vec<(String, String)>,
    redactor: &Redactor,
    held_since: Instant,
    log: &Logger,
) -> (Outcome, bool) {
    let limits = Limits {
        output_bound: shared.cfg.output_bound,
        kill_grace: shared.cfg.kill_grace,
    };
    let (stop_tx, stop_rx) = watch::channel(None::<Stop>);
    let exec = run_executor(spec, resolved, run_vars(t), limits, redactor, stop_rx);
    tokio::pin!(exec);
    let every = shared.cfg.heartbeat;
    let hold = hold_for(shared.cfg.lease, every, shared.cfg.kill_grace);
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut drain = shared.drain.clone();
    let deadline = tokio::time::sleep_until((held_since + hold).into());
    tokio::pin!(deadline);
    // The heartbeat in flight, with the instant it was sent; the loop keeps watching the
    // command, the deadline and the drain while it waits for the answer.
    let mut call = None;
    let mut stopped: Option<Stop> = None;
    let stop = |s: Stop, why: &str, stopped: &mut Option<Stop>| {
        // Lost overrides what came before (nothing may be recorded any more).
        if stopped.is_none() || (s == Stop::Lost && *stopped != Some(Stop::Lost)) {
            info!(log, "stopping the command"; "why" => s.describe(), "because" => why);
            *stopped = Some(s);
            let _ = stop_tx.send(Some(s));
        }
    };
    loop {
        tokio::select! {
            o = &mut exec => return (o, stopped == Some(Stop::Lost)),
            _ = beat.tick(), if stopped != Some(Stop::Lost) && call.is_none() => {
                let sent = Instant::now();
                call = Some(Box::pin(async move {
                    let answer = async {
                        let c = db::conn(&shared.pool).await?;
                        calls::heartbeat(&c, t, shared.lease_ms()).await
                    };
                    (sent, tokio::time::timeout(every, answer).await)
                }));
            }
            (sent, answer) = answer_of(&mut call) => {
                call = None;
                match answer {
                    Ok(Ok(Beat::Held)) => deadline.as_mut().reset((sent + hold).into()),
                    Ok(Ok(Beat::CancelRequested)) => {
                        deadline.as_mut().reset((sent + hold).into());
                        stop(Stop::Cancel, "an operator asked", &mut stopped);
                    }
                    Ok(Ok(Beat::Lost)) => stop(Stop::Lost, "the heartbeat was refused", &mut stopped),
                    Ok(Err(e)) => warn!(log, "heartbeat failed"; "error" => %e),
                    Err(_) => warn!(log, "heartbeat timed out"),
                }
            }
            _ = &mut deadline, if stopped != Some(Stop::Lost) => {
                stop(
                    Stop::Lost,
                    "no heartbeat answered before the lease could end (by this worker's clock)",
                    &mut stopped,
                );
            }
            s = shell::stopped(&mut drain), if stopped.is_none() => {
                stop(s, "the drain timeout passed", &mut stopped);
            }
        }
    }
}

/// The variables a command or request gets about its run.
fn run_vars(t: &Taken) -> RunVars {
    RunVars {
        run_id: t.run_id,
        attempt_no: t.attempt_no,
        scheduled_for_ms: t.scheduled_for_ms,
        idempotency_key: t.idempotency_key.clone(),
        trigger_id: t.trigger_id.clone(),
    }
}

/// Runs the spec's executor to its end, a timeout or a stop sent on `stop`.
async fn run_executor(
    spec: &Spec,
    resolved: Vec<(String, String)>,
    vars: RunVars,
    limits: Limits,
    redactor: &Redactor,
    mut stop: watch::Receiver<Option<Stop>>,
) -> Outcome {
    match &spec.executor {
        Executor::Shell(s) => {
            shell::run(
                s,
                resolved,
                &vars,
                spec.timeout,
                &limits,
                redactor,
                &mut stop,
            )
            .await
        }
        Executor::Http(h) => {
            request::run(
                h,
                resolved,
                &vars,
                spec.timeout,
                &limits,
                redactor,
                &mut stop,
            )
            .await
        }
    }
}

/// Records the outcome; the lease decides whether it is (a refused finish is a lost lease).
async fn finish(shared: &Shared, t: &Taken, o: Outcome, redactor: &Redactor, log: &Logger) {
    let m = &shared.metrics;
    let error = o.error.map(|e| bounded(redactor.redact(&e), ERROR_MAX));
    let f = Finish {
        succeeded: o.succeeded,
        exit_status: o.exit_status,
        output_tail: Some(o.output).filter(|s| !s.is_empty()),
        error: error.clone(),
        result: o.result,
    };
    match shared.finisher.finish(t, f.clone()).await {
        Ok(true) => {
            if f.succeeded {
                m.succeeded.inc();
            } else {
                m.failed.inc();
            }
            info!(log, "finished"; "succeeded" => f.succeeded, "exit_status" => f.exit_status,
                  "error" => error.as_deref().unwrap_or(""));
        }
        Ok(false) => {
            m.lost.inc();
            warn!(log, "lease lost before the finish: outcome not recorded"; "succeeded" => f.succeeded);
        }
        Err(e) => {
            m.lost.inc();
            warn!(log, "could not record the outcome (the lease will expire)"; "error" => e);
        }
    }
}

fn bounded(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut i = max;
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        s.truncate(i);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::hold_for;
    use std::time::Duration;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn a_lease_is_given_up_a_heartbeat_and_a_kill_grace_before_it_can_end() {
        // Defaults: stopped 20 s early, so the group is gone (grace 10 s) 10 s before the end.
        assert_eq!(hold_for(s(60.0), s(10.0), s(10.0)), s(40.0));
        assert_eq!(hold_for(s(5.0), s(1.0), s(1.0)), s(3.0));
    }

    #[test]
    fn a_long_kill_grace_never_leaves_less_than_two_heartbeats_of_hold() {
        assert_eq!(hold_for(s(5.0), s(1.0), s(10.0)), s(2.0));
        assert_eq!(hold_for(s(30.0), s(10.0), s(0.1)), s(20.0));
    }
}
