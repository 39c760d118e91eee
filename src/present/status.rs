//! `qlsched status` as text: replicas, claims, backlog, runs by kind and the retention line.
//! The rows are [`crate::store::status`]'s.

use std::fmt::Write;

use super::text::{two_units, utc};
use crate::store::retention::OLD_QUEUED_CAP;
use crate::store::status::{RetentionStatus, Status};

impl Status {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "replicas:");
        for r in &self.replicas {
            let _ = writeln!(
                s,
                "  {:<12} {:<5} heartbeat {:>6} ms ago  claims {:>4}  {}:{}",
                r.replica_id,
                if r.live { "live" } else { "gone" },
                r.heartbeat_age_ms,
                r.live_claims,
                r.hostname,
                r.pid
            );
        }
        let ms = |v: Option<f64>| {
            v.map(|x| format!("{x:.0} ms"))
                .unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(s, "live claims: {}", self.live_claims);
        let _ = writeln!(
            s,
            "due backlog: {} (oldest {})",
            self.due_backlog,
            self.oldest_due_age_ms
                .map(|x| format!("{x} ms"))
                .unwrap_or_else(|| "-".into())
        );
        let _ = writeln!(
            s,
            "runs by kind:  admitted in the last minute  lag p50 / p99 over the kind's last runs"
        );
        for (kind, k) in self.by_kind.iter() {
            let _ = writeln!(
                s,
                "  {:<9} {:>6}  p50 {:>10}  p99 {:>10}  over {} runs",
                kind,
                k.admitted_last_minute,
                ms(k.lag_p50_ms),
                ms(k.lag_p99_ms),
                k.lag_sample
            );
        }
        let _ = writeln!(s, "{}", self.retention.render());
        s
    }
}

impl RetentionStatus {
    /// `retention: finished runs kept 30d (horizon pruned through T), oldest finished run
    /// 2d 3h old; queued runs older than 1h: 0`.
    pub fn render(&self) -> String {
        let v = &self.view;
        let kept = match v.finished_after_ms {
            None => "not yet recorded by a replica".to_owned(),
            Some(0) => "forever".to_owned(),
            Some(ms) => two_units(ms),
        };
        let through = utc(v.pruned_through_ms);
        let oldest = v
            .oldest_finished_age_ms
            .map(two_units)
            .unwrap_or_else(|| "-".into());
        format!(
            "retention: finished runs kept {kept} (pruned through {through}); oldest finished run {oldest} old; queued runs older than {}: {}",
            two_units(self.queued_alert_after_ms),
            if v.old_queued >= OLD_QUEUED_CAP {
                format!("{} or more", OLD_QUEUED_CAP)
            } else {
                v.old_queued.to_string()
            }
        )
    }
}
