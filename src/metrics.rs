//! Prometheus metrics of one replica (served as text on `/metrics`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets of the on-time lag (seconds).
const LAG_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Buckets of the misfire lag (seconds): beyond the grace, up to days.
const MISFIRE_LAG_BUCKETS: [f64; 9] = [
    60.0,
    300.0,
    900.0,
    3600.0,
    4.0 * 3600.0,
    12.0 * 3600.0,
    86400.0,
    3.0 * 86400.0,
    7.0 * 86400.0,
];

/// Every metric the daemon exports. Cheap to clone (all handles are shared).
#[derive(Clone)]
pub struct Metrics {
    pub ticks: Counter,
    pub claims: Counter,
    pub admits: Counter,
    pub skips: Counter,
    pub initialisations: Counter,
    pub rejects: Counter,
    pub fence_losses: Counter,
    pub duplicate_keys: Counter,
    pub overlap_skips: Counter,
    pub serialization_retries: Counter,
    pub unknown_outcomes: Counter,
    pub actor_restarts: Counter,
    pub errors: Counter,
    pub redecides: Counter,
    pub error_backoffs: Counter,
    pub orphan_releases: Counter,
    pub wakeups: Counter,
    pub notifications: Counter,
    /// Notifications on the wake channel that were not qlsched's (docs/design.md, "Waking").
    pub notifications_ignored: Counter,
    /// Lag of cron occurrences admitted on time (within their grace): what alerts watch.
    pub lag_seconds: Histogram,
    /// Lag of cron occurrences admitted late by `misfire = fire_once` (after an outage):
    /// apart, so a recovery does not move the on-time quantiles.
    pub misfire_lag_seconds: Histogram,
    pub live_claims: Gauge,
    pub due_backlog: Gauge,
    pub oldest_due_age_seconds: Gauge<f64, AtomicU64>,
    pub ready: Gauge,
    /// Runs pruned by retention, labelled by status (docs/design.md, "Retention").
    pub runs_pruned: Family<Vec<(String, String)>, Counter>,
    /// Duration of one prune batch (one transaction).
    pub prune_duration_seconds: Histogram,
    /// Age of the oldest retained finished run (by admission), refreshed by each prune pass.
    pub oldest_finished_run_age_seconds: Gauge<f64, AtomicU64>,
    /// Queued runs admitted more than `retention.queued_alert_after` ago.
    pub old_queued_runs: Gauge,
    /// Queued runs per pool (of each run's pinned spec), read up to
    /// `store::retention::QUEUED_BY_POOL_CAP` runs (docs/worker.md, "Metrics").
    pub queued_runs: Family<Vec<(String, String)>, Gauge>,
    /// Console and `/api/` requests whose credentials were wrong (docs/console.md).
    pub console_login_failures: Counter,
    /// 1 when the replica's database connections go over TCP to a non-loopback host with an
    /// sslmode that an attacker on the path can defeat (disable, prefer, require without a
    /// root certificate); 0 otherwise.
    pub database_tls_unverified: Gauge,
    /// Attempts of the dispatcher protocol past their lease, not yet expired.
    pub lapsed_attempts: Gauge,
    /// Triggers whose success deadline passed, per project (docs/policies-outcome.md).
    pub triggers_overdue: Family<Vec<(String, String)>, Gauge>,
    /// Triggers the system paused after their failures, per project.
    pub triggers_system_paused: Family<Vec<(String, String)>, Gauge>,
}

/// Buckets of one prune batch (seconds).
const PRUNE_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ticks: Counter::default(),
            claims: Counter::default(),
            admits: Counter::default(),
            skips: Counter::default(),
            initialisations: Counter::default(),
            rejects: Counter::default(),
            fence_losses: Counter::default(),
            duplicate_keys: Counter::default(),
            overlap_skips: Counter::default(),
            serialization_retries: Counter::default(),
            unknown_outcomes: Counter::default(),
            actor_restarts: Counter::default(),
            errors: Counter::default(),
            redecides: Counter::default(),
            error_backoffs: Counter::default(),
            orphan_releases: Counter::default(),
            wakeups: Counter::default(),
            notifications: Counter::default(),
            notifications_ignored: Counter::default(),
            lag_seconds: Histogram::new(LAG_BUCKETS),
            misfire_lag_seconds: Histogram::new(MISFIRE_LAG_BUCKETS),
            live_claims: Gauge::default(),
            due_backlog: Gauge::default(),
            oldest_due_age_seconds: Gauge::default(),
            ready: Gauge::default(),
            runs_pruned: Family::default(),
            prune_duration_seconds: Histogram::new(PRUNE_BUCKETS),
            oldest_finished_run_age_seconds: Gauge::default(),
            old_queued_runs: Gauge::default(),
            queued_runs: Family::default(),
            console_login_failures: Counter::default(),
            database_tls_unverified: Gauge::default(),
            lapsed_attempts: Gauge::default(),
            triggers_overdue: Family::default(),
            triggers_system_paused: Family::default(),
        }
    }
}

impl Metrics {
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("qlsched");
        r.register("ticks", "Scheduler rounds run", self.ticks.clone());
        r.register("claims", "Schedule rows leased", self.claims.clone());
        r.register(
            "admits",
            "Occurrences admitted as runs",
            self.admits.clone(),
        );
        r.register(
            "skips",
            "Misfired occurrences skipped (cursor moved, no run), counted when the move committed",
            self.skips.clone(),
        );
        r.register(
            "initialisations",
            "Schedules initialised (first cursor set), counted when the move committed",
            self.initialisations.clone(),
        );
        r.register(
            "rejects",
            "Claims rejected (definition cannot be evaluated, or a corrupt execution revision), counted when the release with back-off committed",
            self.rejects.clone(),
        );
        r.register(
            "fence_losses",
            "Writes refused because the claim was no longer ours",
            self.fence_losses.clone(),
        );
        r.register(
            "duplicate_keys",
            "Occurrences whose idempotency key already existed (admitted before, e.g. by a backfill); cursor advanced, nothing written",
            self.duplicate_keys.clone(),
        );
        r.register(
            "overlap_skips",
            "Occurrences a scheduled admission did not admit because a run of the trigger was unfinished (overlap policy forbid or buffer_one: recorded as a skip, or kept); cursor advanced",
            self.overlap_skips.clone(),
        );
        r.register(
            "serialization_retries",
            "Admission transactions retried after 40001/40P01",
            self.serialization_retries.clone(),
        );
        r.register(
            "unknown_outcomes",
            "Admissions whose COMMIT reply was lost, resolved by key and fence",
            self.unknown_outcomes.clone(),
        );
        r.register(
            "actor_restarts",
            "Child actors restarted by the supervisor",
            self.actor_restarts.clone(),
        );
        r.register(
            "errors",
            "Errors sent to the diagnostic sink (database unreachable, statement failed)",
            self.errors.clone(),
        );
        r.register(
            "redecides",
            "Admissions refused because the definition moved on (new trigger revision, row moved); released to be decided again at once",
            self.redecides.clone(),
        );
        r.register(
            "error_backoffs",
            "Claims released with an exponential back-off after an admission error",
            self.error_backoffs.clone(),
        );
        r.register(
            "orphan_releases",
            "Rows released because the claim round that leased them never got its reply",
            self.orphan_releases.clone(),
        );
        r.register(
            "wakeups",
            "Rounds started at the instant a row became claimable (before the cadence tick)",
            self.wakeups.clone(),
        );
        r.register(
            "notifications",
            "Change notifications received (publish, enable, project resume) that woke the scheduler",
            self.notifications.clone(),
        );
        r.register(
            "notifications_ignored",
            "Notifications on the wake channel ignored: a payload that is not an instant, or a sender whose role may not change schedules",
            self.notifications_ignored.clone(),
        );
        // Labelled by the kind of run: the daemon admits only cron occurrences (manual fires
        // and backfills are admitted by the CLI and not observed here).
        let cron = r.sub_registry_with_label(("kind".into(), "cron".into()));
        cron.register(
            "lag_seconds",
            "queued_at - scheduled_for of cron occurrences admitted on time, within their misfire grace (database clock); misfires are in qlsched_misfire_lag_seconds",
            self.lag_seconds.clone(),
        );
        cron.register(
            "misfire_lag_seconds",
            "queued_at - scheduled_for of cron occurrences admitted late by misfire = fire_once (database clock)",
            self.misfire_lag_seconds.clone(),
        );
        r.register(
            "live_claims",
            "Leases this replica holds now",
            self.live_claims.clone(),
        );
        r.register(
            "due_backlog",
            "Schedule rows due and unclaimed (refreshed every metrics.backlog_interval)",
            self.due_backlog.clone(),
        );
        r.register(
            "oldest_due_age_seconds",
            "Age of the oldest due and unclaimed row",
            self.oldest_due_age_seconds.clone(),
        );
        r.register(
            "ready",
            "1 while the replica is ready (admitting), 0 otherwise",
            self.ready.clone(),
        );
        r.register(
            "runs_pruned",
            "Finished runs removed by retention (with their attempts and events), by status",
            self.runs_pruned.clone(),
        );
        r.register(
            "prune_duration_seconds",
            "Duration of one prune batch (one transaction through qlsched.prune_finished)",
            self.prune_duration_seconds.clone(),
        );
        r.register(
            "oldest_finished_run_age_seconds",
            "Age of the oldest retained finished run, by admission (refreshed every retention.interval)",
            self.oldest_finished_run_age_seconds.clone(),
        );
        r.register(
            "old_queued_runs",
            "Queued runs admitted more than retention.queued_alert_after ago (refreshed every retention.interval)",
            self.old_queued_runs.clone(),
        );
        r.register(
            "queued_runs",
            "Queued runs per pool of their pinned spec, up to 100000 read (refreshed every retention.interval)",
            self.queued_runs.clone(),
        );
        r.register(
            "console_login_failures",
            "Console and /api/ requests that carried wrong credentials (each logged with the client address)",
            self.console_login_failures.clone(),
        );
        r.register(
            "database_tls_unverified",
            "1 when database connections go over TCP to a non-loopback host with sslmode disable, prefer, or require without a root certificate (no protection against an attacker on the path)",
            self.database_tls_unverified.clone(),
        );
        r.register(
            "lapsed_attempts",
            "Attempts taken under a dispatcher lease that ended (database clock) and that no qlsched.dispatch_expire has marked lost yet (refreshed every retention.interval)",
            self.lapsed_attempts.clone(),
        );
        r.register(
            "triggers_overdue",
            "Running triggers with --expect-success-within and no success within it, per project (refreshed every retention.interval)",
            self.triggers_overdue.clone(),
        );
        r.register(
            "triggers_system_paused",
            "Triggers disabled by qlsched after --pause-after-failures consecutive failed runs and not enabled since, per project (refreshed every retention.interval)",
            self.triggers_system_paused.clone(),
        );
        r
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry()).expect("encoding metrics to a String cannot fail");
        out
    }
}
