//! The pruner (docs/design.md, "Retention"): a task of each replica, off the claim path.
//! Every `retention.interval` it refreshes the retention gauges and tries to take the
//! 'prune' lease; the holder prunes batch after batch, each its own short transaction, until
//! a batch comes back short, renewing the lease while it works, then gives the lease back.

use std::time::{Duration, Instant};

use slog::{debug, info, warn, Logger};

use crate::config::RetentionConfig;
use crate::db;
use crate::db::{Pool, StoreError};
use crate::metrics::Metrics;
use crate::store::retention;

/// How long one claim of the 'prune' lease lasts (database clock). A holder that dies mid-pass
/// leaves it to the next replica after this.
pub const PRUNE_LEASE: Duration = Duration::from_secs(60);
/// The holder renews the lease before starting a batch once less than this is left.
pub const RENEW_BELOW: Duration = Duration::from_secs(20);

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// Whether this replica held the lease during the pass.
    pub held_lease: bool,
    pub batches: u32,
    pub pruned: i64,
    /// Audit rows removed (retention.audit_after).
    pub audit_pruned: i64,
}

/// One replica's pruner.
pub struct Pruner {
    pub owner: String,
    pub cfg: RetentionConfig,
    pub metrics: Metrics,
    pub log: Logger,
}

impl Pruner {
    /// Runs a pass every `interval` until dropped (the replica aborts it at stop). Errors are
    /// logged and counted; the next pass tries again.
    pub async fn run(self, pool: Pool) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let conn = match db::conn(&pool).await {
                Ok(c) => c,
                Err(e) => {
                    self.metrics.errors.inc();
                    warn!(self.log, "prune pass skipped: no connection"; "error" => %e);
                    continue;
                }
            };
            match self.pass(&conn).await {
                Ok(r) if r.pruned > 0 => {
                    info!(self.log, "pruned finished runs"; "runs" => r.pruned, "batches" => r.batches)
                }
                Ok(r) => debug!(self.log, "prune pass"; "held_lease" => r.held_lease),
                Err(e) => {
                    self.metrics.errors.inc();
                    warn!(self.log, "prune pass failed; retried next interval"; "error" => %e);
                }
            }
        }
    }

    /// One pass on `client`: gauges, then (if retention is on and the lease is free) prune.
    pub async fn pass(&self, client: &tokio_postgres::Client) -> Result<PassReport, StoreError> {
        let mut report = PassReport::default();
        if self.cfg.finished_after.is_some() || self.cfg.audit_after.is_some() {
            // Recorded for `trigger backfill`: 0 = finished runs are kept forever.
            let keep = self.cfg.finished_after.unwrap_or(Duration::ZERO);
            if let Some(mut lease) =
                retention::claim_lease(client, &self.owner, PRUNE_LEASE, keep).await?
            {
                report.held_lease = true;
                retention::record_alert_age(client, &self.owner, self.cfg.queued_alert_after)
                    .await?;
                let mut renew_at = Instant::now() + lease.remaining.saturating_sub(RENEW_BELOW);
                while self.cfg.finished_after.is_some() {
                    if Instant::now() >= renew_at {
                        match retention::claim_lease(client, &self.owner, PRUNE_LEASE, keep).await?
                        {
                            Some(l) => lease = l,
                            None => break,
                        }
                        renew_at = Instant::now() + lease.remaining.saturating_sub(RENEW_BELOW);
                    }
                    let started = Instant::now();
                    let pruned = retention::prune_batch(
                        client,
                        keep,
                        self.cfg.batch,
                        &self.owner,
                        lease.token,
                    )
                    .await?;
                    self.metrics
                        .prune_duration_seconds
                        .observe(started.elapsed().as_secs_f64());
                    report.batches += 1;
                    for (status, n) in &pruned.by_status {
                        self.metrics
                            .runs_pruned
                            .get_or_create(&vec![("status".to_owned(), status.clone())])
                            .inc_by(u64::try_from(*n).unwrap_or(0));
                    }
                    report.pruned += pruned.total();
                    if pruned.total() < i64::from(self.cfg.batch) {
                        break;
                    }
                }
                // The recorded overlap skips keep their instants as long as finished runs.
                retention::prune_skips(client, keep).await?;
                if let Some(audit_keep) = self.cfg.audit_after {
                    // Audit rows in batches of the same size, under the same lease (checked
                    // by prune_audit itself on every batch).
                    loop {
                        let n = retention::prune_audit_batch(
                            client,
                            audit_keep,
                            self.cfg.batch,
                            &self.owner,
                            lease.token,
                        )
                        .await?;
                        report.audit_pruned += n;
                        if n < i64::from(self.cfg.batch) {
                            break;
                        }
                    }
                }
                retention::release_lease(client, &self.owner, lease.token).await?;
            }
        }
        let view = retention::view(client, self.cfg.queued_alert_after).await?;
        self.metrics.old_queued_runs.set(view.old_queued);
        let by_pool = retention::queued_by_pool(client).await?;
        self.metrics.queued_runs.clear();
        for (pool, n) in by_pool {
            self.metrics
                .queued_runs
                .get_or_create(&vec![("pool".to_owned(), pool)])
                .set(n);
        }
        self.metrics.lapsed_attempts.set(view.lapsed_attempts);
        let outcomes = crate::store::triggers::outcome::gauges(client).await?;
        self.metrics.triggers_overdue.clear();
        self.metrics.triggers_system_paused.clear();
        for (project, overdue, paused) in outcomes {
            let label = vec![("project".to_owned(), project)];
            if overdue > 0 {
                self.metrics
                    .triggers_overdue
                    .get_or_create(&label)
                    .set(overdue);
            }
            if paused > 0 {
                self.metrics
                    .triggers_system_paused
                    .get_or_create(&label)
                    .set(paused);
            }
        }
        self.metrics
            .oldest_finished_run_age_seconds
            .set(view.oldest_finished_age_ms.unwrap_or(0) as f64 / 1000.0);
        Ok(report)
    }
}
