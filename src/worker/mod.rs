//! `qlsched worker`: executes the runs the replicas admit (docs/worker.md). A separate
//! process, logged in as the dispatcher role; replicas never execute work.
//!
//! An attempt's lease, as this worker moves it (docs/dispatcher.md, "The functions"):
//!
//! - **take** (`dispatch_take_start`, V25): queued runs of this worker's pools whose
//!   spec names an executor it runs → `running` (started in the take), under a lease (token +
//!   expiry on the database clock), several at a time (`take_batch`, `take_linger`);
//! - the executor runs while **heartbeats** extend the lease every `[worker] heartbeat`; a
//!   heartbeat answering "not held" stops the work (it may run elsewhere) and records
//!   nothing; one answering "cancel requested" stops it and finishes it `failed`;
//! - **finish** `succeeded` | `failed` with exit status, output tail, error, result, several
//!   attempts per call (`dispatch_finish_batch`, within `take_linger` of the first), each
//!   judged by its own lease;
//! - on stop: running attempts get `drain_timeout`, then are stopped and finished `failed`.
//!   None is left to expire while this process lives.
//!
//! The fence is the lease token checked by every call against the database clock: a worker
//! paused past its lease records nothing.
//! The worker also gives a lease up by its own monotonic clock: without a heartbeat answered
//! "held" the command is stopped a heartbeat and a kill grace before the lease could end
//! (counted from when the last extending call was sent), so it is gone before anyone else
//! may take the run.

mod attempt;
pub mod cadence;
pub mod daemon;
mod finisher;
pub mod metrics;
pub mod request;
pub mod secrets;
mod serve;
pub mod shell;
pub mod spec;
pub mod supervise;
pub mod tail;

use std::time::Duration;

pub use daemon::{run, WorkerError};

/// Why an executor is asked to stop before its command ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// An operator asked (`qlsched.request_cancel`).
    Cancel,
    /// The lease is not held any more.
    Lost,
    /// The worker is stopping and the drain timeout passed.
    Drain,
}

impl Stop {
    pub fn describe(self) -> &'static str {
        match self {
            Stop::Cancel => "cancelled at an operator's request",
            Stop::Lost => "lease lost",
            Stop::Drain => "interrupted: the worker stopped and its drain timeout passed",
        }
    }
}

/// What a run hands its executor.
#[derive(Debug, Clone)]
pub struct RunVars {
    pub run_id: uuid::Uuid,
    pub attempt_no: i32,
    pub scheduled_for_ms: i64,
    pub idempotency_key: String,
    pub trigger_id: String,
}

impl RunVars {
    /// The environment of a shell command (docs/worker.md, "shell").
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let scheduled = chrono::DateTime::from_timestamp_millis(self.scheduled_for_ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default();
        vec![
            ("QLSCHED_RUN_ID", self.run_id.to_string()),
            ("QLSCHED_ATTEMPT", self.attempt_no.to_string()),
            ("QLSCHED_SCHEDULED_FOR", scheduled),
            (
                "QLSCHED_SCHEDULED_FOR_MS",
                self.scheduled_for_ms.to_string(),
            ),
            ("QLSCHED_IDEMPOTENCY_KEY", self.idempotency_key.clone()),
            ("QLSCHED_TRIGGER_ID", self.trigger_id.clone()),
        ]
    }
}

/// What bounds an execution, from `[worker]`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub output_bound: usize,
    pub kill_grace: Duration,
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub succeeded: bool,
    pub exit_status: Option<i32>,
    pub output: String,
    pub error: Option<String>,
    pub result: Option<serde_json::Value>,
}

impl Outcome {
    pub fn succeeded(exit_status: Option<i32>, output: String, error: Option<String>) -> Outcome {
        Outcome {
            succeeded: true,
            exit_status,
            output,
            error,
            result: None,
        }
    }

    pub fn failed(exit_status: Option<i32>, output: String, error: String) -> Outcome {
        Outcome {
            succeeded: false,
            exit_status,
            output,
            error: Some(error),
            result: None,
        }
    }
}
