//! Prometheus metrics of one worker (served as text on `/metrics`; docs/worker.md,
//! "Metrics"). Counters are prefixed `qlsched_worker_`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets of an execution (seconds): a second to a day.
const EXECUTION_BUCKETS: [f64; 14] = [
    0.1,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    4.0 * 3600.0,
    86400.0,
];

/// Buckets of the wait from admission (queued) to the take (seconds).
const QUEUE_WAIT_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// Every metric of the worker. Cheap to clone (shared handles).
#[derive(Clone)]
pub struct WorkerMetrics {
    /// Attempts this worker took.
    pub taken: Counter,
    /// Attempts it finished `succeeded`.
    pub succeeded: Counter,
    /// Attempts it finished `failed` (non-zero exit, non-2xx, timeout, cancel, drain, a bad
    /// spec or secret).
    pub failed: Counter,
    /// Attempts whose lease it lost (a heartbeat, start or finish refused): nothing recorded.
    pub lost: Counter,
    /// Attempts given back unstarted (a stop).
    pub released: Counter,
    /// Lapsed attempts (anyone's) its expiry calls marked lost.
    pub expired: Counter,
    /// Of those, runs queued again under a new attempt.
    pub retried: Counter,
    /// Attempts running now.
    pub running: Gauge,
    /// 1 while the worker takes runs (`/readyz` 200).
    pub ready: Gauge,
    /// Start to end of an execution.
    pub execution_seconds: Histogram,
    /// Admission (queued) to take, database clock.
    pub queue_wait_seconds: Histogram,
    /// 1 for each pool this worker takes from (`qlsched_worker_pools{pool="…"}`): with the
    /// replicas' `qlsched_queued_runs{pool="…"}`, the alert on queued work no worker serves.
    pub pools: Family<Vec<(String, String)>, Gauge>,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        WorkerMetrics {
            taken: Counter::default(),
            succeeded: Counter::default(),
            failed: Counter::default(),
            lost: Counter::default(),
            released: Counter::default(),
            expired: Counter::default(),
            retried: Counter::default(),
            running: Gauge::default(),
            ready: Gauge::default(),
            execution_seconds: Histogram::new(EXECUTION_BUCKETS),
            queue_wait_seconds: Histogram::new(QUEUE_WAIT_BUCKETS),
            pools: Family::default(),
        }
    }
}

impl WorkerMetrics {
    /// Marks the pools this worker serves (its `[worker] pools`).
    pub fn serve_pools(&self, pools: &[String]) {
        for p in pools {
            self.pools
                .get_or_create(&vec![("pool".to_owned(), p.clone())])
                .set(1);
        }
    }

    pub fn registry(&self) -> Registry {
        let mut root = Registry::with_prefix("qlsched");
        let r = root.sub_registry_with_prefix("worker");
        r.register("taken", "Attempts taken", self.taken.clone());
        r.register(
            "succeeded",
            "Attempts finished succeeded",
            self.succeeded.clone(),
        );
        r.register("failed", "Attempts finished failed", self.failed.clone());
        r.register(
            "lost",
            "Attempts whose lease this worker lost",
            self.lost.clone(),
        );
        r.register(
            "released",
            "Attempts given back unstarted",
            self.released.clone(),
        );
        r.register(
            "expired",
            "Lapsed attempts marked lost by this worker's expiry calls",
            self.expired.clone(),
        );
        r.register(
            "retried",
            "Runs queued again by this worker's expiry calls",
            self.retried.clone(),
        );
        r.register("running", "Attempts running now", self.running.clone());
        r.register("ready", "1 while the worker takes runs", self.ready.clone());
        r.register(
            "execution_seconds",
            "Duration of an execution",
            self.execution_seconds.clone(),
        );
        r.register(
            "queue_wait_seconds",
            "From admission to take (database clock)",
            self.queue_wait_seconds.clone(),
        );
        r.register(
            "pools",
            "1 for each pool this worker takes from",
            self.pools.clone(),
        );
        root
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry()).expect("encoding metrics to a String cannot fail");
        out
    }
}
