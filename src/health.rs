//! What `/readyz` answers, kept by the lifecycle and the supervisor.
//!
//! Ready = the lifecycle is running (started, not stopping, supervisor alive) **and** the
//! database answers: claim rounds failing for longer than one lease make the replica not
//! ready; the first successful round makes it ready again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    running: AtomicBool,
    db_failing: AtomicBool,
    guard_lost: AtomicBool,
}

impl Health {
    pub fn set_running(&self, running: bool) {
        self.inner.running.store(running, Ordering::SeqCst);
    }
    pub fn set_db_failing(&self, failing: bool) {
        self.inner.db_failing.store(failing, Ordering::SeqCst);
    }
    pub fn is_running(&self) -> bool {
        self.inner.running.load(Ordering::SeqCst)
    }
    pub fn is_db_failing(&self) -> bool {
        self.inner.db_failing.load(Ordering::SeqCst)
    }
    /// A claim round found the replica-id guard no longer ours.
    pub fn set_guard_lost(&self) {
        self.inner.guard_lost.store(true, Ordering::SeqCst);
    }
    pub fn is_guard_lost(&self) -> bool {
        self.inner.guard_lost.load(Ordering::SeqCst)
    }
    pub fn is_ready(&self) -> bool {
        self.is_running() && !self.is_db_failing()
    }
}
