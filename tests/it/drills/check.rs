//! The invariant checker every drill ends with: plain SQL over the admitted work, run after
//! every replica has stopped.
//!
//! - the exactly-once invariants of the kit (`testkit/sql/invariants.sql`): `duplicates`
//!   counts the occurrences admitted more than once, `violated` every other invariant broken;
//! - nothing was dispatched: every run is queued as admitted, one attempt and two events;
//! - no claim is left on any schedule row;
//! - per trigger, the admitted `scheduled_for` set against what the cron and the misfire
//!   policy require. The drills use fixed-period triggers (`* * * * * *`, `skip`, grace
//!   60 s), so the requirement is: every period between the trigger's first admitted
//!   occurrence and its final cursor is admitted, except an occurrence whose whole grace
//!   window lies inside a window when no replica was up (the only time `skip` may drop
//!   one). A required occurrence without a run is `lost` when it sits in a hole shorter
//!   than the grace (no misfire decision can explain it) and `misfired` when the hole is a
//!   grace or longer (the fleet found it more than the grace late: overload, not a fence
//!   failure; still a drill failure); a run off the cron grid or at or
//!   after the cursor is `unexpected`; a trigger never admitted at all is `starved`; an
//!   occurrence an overlap policy skipped is recorded (a count per trigger, V21) and is
//!   accounted for, not lost, up to that count;
//! - takeovers: of the leases a killed or cut-off replica held, the occurrences another
//!   replica admitted; `early_takeovers` are those admitted before the database expiry of
//!   the lease (and before the holder's successor could have released it): must be 0.
//!
//! The worker drills admit no work of their own; they end with [`executed`]: every run settled
//! with exactly one recorded outcome, within its `max_attempts`, as the dispatcher protocol
//! says.

use std::fmt::Write as _;

use tokio_postgres::Client;

use crate::helpers::invariants::{self, Violation};

/// What the drill knows about its run, beyond the database.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// The triggers' fixed period (1 000 ms for `* * * * * *`).
    pub period_ms: i64,
    /// Their misfire grace (policy `skip`).
    pub grace_ms: i64,
    /// Database-clock windows `[from, to]` when no replica was up.
    pub down: Vec<(i64, i64)>,
    /// Leases held by a replica at the moment it was killed or cut off.
    pub held: Vec<Held>,
}

impl Expect {
    /// Every-second `skip` triggers with the default 60 s grace.
    pub fn every_second() -> Expect {
        Expect {
            period_ms: 1000,
            grace_ms: 60_000,
            ..Expect::default()
        }
    }
}

/// One lease a replica held when it was killed or cut off.
#[derive(Clone, Debug)]
pub struct Held {
    pub trigger_id: String,
    pub owner: String,
    /// The row's cursor when the lease was taken: the occurrence the lease was for.
    pub scheduled_for_ms: i64,
    /// The lease's database expiry.
    pub expires_at_ms: i64,
    /// Database time from which the holder's id could release it (a restart of the same
    /// id releases its predecessor's leases at once); `i64::MAX` if never.
    pub freed_at_ms: i64,
}

/// The figures of one drill.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub triggers: i64,
    pub expected: i64,
    pub admitted: i64,
    /// Occurrences admitted more than once.
    pub duplicates: i64,
    pub lost: i64,
    /// Required occurrences missing in a hole at least a grace long: what `skip` does to an
    /// occurrence found more than the grace late (an overloaded or absent fleet).
    pub misfired: i64,
    pub unexpected: i64,
    pub starved: i64,
    /// Runs no longer as admitted (queued, one attempt, two events): no drill dispatches.
    pub bad_shape: i64,
    /// Every other exactly-once invariant broken.
    pub violated: Vec<Violation>,
    pub claims_left: i64,
    pub max_lag_ms: i64,
    pub takeovers: i64,
    pub early_takeovers: i64,
    /// Runs admitted per replica id.
    pub by_replica: Vec<(String, i64)>,
}

/// The leases `owner` holds right now (call it just after the owner was killed or cut off).
pub async fn held_by(sql: &Client, owner: &str) -> Vec<Held> {
    sql.query(
        "SELECT trigger_id, claim_owner, next_fire_at_ms, claim_expires_at_ms
           FROM qlsched.trigger_schedules
          WHERE claim_owner = $1 AND next_fire_at_ms IS NOT NULL",
        &[&owner],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| Held {
        trigger_id: r.get(0),
        owner: r.get(1),
        scheduled_for_ms: r.get(2),
        expires_at_ms: r.get(3),
        freed_at_ms: i64::MAX,
    })
    .collect()
}

const OCCURRENCES_SQL: &str = "
WITH r AS (
    SELECT trigger_id, scheduled_for_ms, count(*) AS n FROM qlsched.runs GROUP BY 1, 2
), span AS (
    SELECT s.trigger_id, min(r.scheduled_for_ms) AS first_ms, s.next_fire_at_ms AS cursor_ms
      FROM qlsched.trigger_schedules s LEFT JOIN r ON r.trigger_id = s.trigger_id
     GROUP BY s.trigger_id, s.next_fire_at_ms
), want AS (
    SELECT span.trigger_id, g AS at_ms
      FROM span, generate_series(span.first_ms, span.cursor_ms - $1, $1) g
     WHERE NOT EXISTS (SELECT 1 FROM unnest($3::bigint[], $4::bigint[]) w(d0, d1)
                        WHERE w.d0 <= g AND g + $2 <= w.d1)
), missing AS (
    SELECT want.trigger_id, want.at_ms FROM want
     WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.trigger_id = want.trigger_id
                                          AND r.scheduled_for_ms = want.at_ms)
), holes AS (
    SELECT trigger_id, count(*) AS len
      FROM (SELECT trigger_id,
                   at_ms - $1 * row_number() OVER (PARTITION BY trigger_id ORDER BY at_ms) AS island
              FROM missing) m
     GROUP BY trigger_id, island
), per AS (
    -- Per trigger, the missing occurrences in short and in long holes, less the skips its
    -- overlap policy recorded (V21): a recorded skip is accounted for, first against the
    -- short holes (which nothing else explains), then against the long ones.
    SELECT h.trigger_id,
           coalesce(sum(h.len) FILTER (WHERE h.len * $1 < $2), 0) AS short,
           coalesce(sum(h.len) FILTER (WHERE h.len * $1 >= $2), 0) AS long,
           coalesce((SELECT o.skipped_overlap FROM qlsched.trigger_overlap o
                      WHERE o.trigger_id = h.trigger_id), 0) AS skipped
      FROM holes h GROUP BY h.trigger_id
)
SELECT (SELECT count(*) FROM span),
       (SELECT count(*) FROM want),
       (SELECT count(*) FROM r),
       (SELECT coalesce(sum(greatest(short - skipped, 0)), 0)::bigint FROM per),
       (SELECT coalesce(sum(greatest(long - greatest(skipped - short, 0), 0)), 0)::bigint FROM per),
       (SELECT count(*) FROM r JOIN span USING (trigger_id)
         WHERE r.scheduled_for_ms % $1 <> 0 OR r.scheduled_for_ms >= span.cursor_ms
            OR span.cursor_ms IS NULL),
       (SELECT count(*) FROM span WHERE first_ms IS NULL),
       (SELECT coalesce(max(queued_at_ms - scheduled_for_ms), 0) FROM qlsched.runs),
       (SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL)";

const SHAPE_SQL: &str = "
SELECT count(*) FROM qlsched.runs r
 WHERE r.status <> 'queued'
    OR (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id) <> 1
    OR (SELECT count(*) FROM qlsched.run_events e WHERE e.run_id = r.run_id) <> 2";

const TAKEOVER_SQL: &str = "
SELECT count(*) FILTER (WHERE r.admitted_by <> h.owner),
       count(*) FILTER (WHERE r.admitted_by <> h.owner AND r.queued_at_ms < least(h.exp, h.freed))
  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[])
       AS h(trigger_id, owner, sf, exp, freed)
  JOIN qlsched.runs r ON r.trigger_id = h.trigger_id AND r.scheduled_for_ms = h.sf";

/// Runs every check; the caller prints the figures and then asserts them clean.
pub async fn check(sql: &Client, expect: &Expect) -> Figures {
    let (d0, d1): (Vec<i64>, Vec<i64>) = expect.down.iter().copied().unzip();
    let row = sql
        .query_one(
            OCCURRENCES_SQL,
            &[&expect.period_ms, &expect.grace_ms, &d0, &d1],
        )
        .await
        .unwrap();
    let mut f = Figures {
        triggers: row.get(0),
        expected: row.get(1),
        admitted: row.get(2),
        lost: row.get(3),
        misfired: row.get(4),
        unexpected: row.get(5),
        starved: row.get(6),
        max_lag_ms: row.get(7),
        claims_left: row.get(8),
        ..Figures::default()
    };
    let mut violated = invariants::check(sql).await;
    f.duplicates = invariants::count(&violated, invariants::DUPLICATE_OCCURRENCE);
    violated.retain(|v| v.invariant != invariants::DUPLICATE_OCCURRENCE);
    f.violated = violated;
    f.bad_shape = sql.query_one(SHAPE_SQL, &[]).await.unwrap().get(0);
    let h = &expect.held;
    let ids: Vec<&str> = h.iter().map(|h| h.trigger_id.as_str()).collect();
    let owners: Vec<&str> = h.iter().map(|h| h.owner.as_str()).collect();
    let sfs: Vec<i64> = h.iter().map(|h| h.scheduled_for_ms).collect();
    let exps: Vec<i64> = h.iter().map(|h| h.expires_at_ms).collect();
    let freed: Vec<i64> = h.iter().map(|h| h.freed_at_ms).collect();
    let row = sql
        .query_one(TAKEOVER_SQL, &[&ids, &owners, &sfs, &exps, &freed])
        .await
        .unwrap();
    f.takeovers = row.get(0);
    f.early_takeovers = row.get(1);
    f.by_replica = crate::helpers::pairs(
        sql,
        "SELECT admitted_by, count(*) FROM qlsched.runs GROUP BY 1 ORDER BY 1",
    )
    .await;
    f
}

impl Figures {
    /// Adds another database's figures (max lag: the larger).
    pub fn add(&mut self, o: &Figures) {
        self.triggers += o.triggers;
        self.expected += o.expected;
        self.admitted += o.admitted;
        self.duplicates += o.duplicates;
        self.lost += o.lost;
        self.misfired += o.misfired;
        self.unexpected += o.unexpected;
        self.starved += o.starved;
        self.bad_shape += o.bad_shape;
        self.violated.extend(o.violated.iter().cloned());
        self.claims_left += o.claims_left;
        self.max_lag_ms = self.max_lag_ms.max(o.max_lag_ms);
        self.takeovers += o.takeovers;
        self.early_takeovers += o.early_takeovers;
        self.by_replica.extend(o.by_replica.iter().cloned());
    }

    /// 0 duplicates, 0 lost, and every other invariant.
    pub fn assert_clean(&self, report: &str) {
        let mut problems: Vec<String> = [
            ("duplicate occurrences", self.duplicates),
            ("lost occurrences", self.lost),
            (
                "occurrences misfired (found more than the grace late)",
                self.misfired,
            ),
            (
                "runs not as admitted (queued, 1 attempt, 2 events)",
                self.bad_shape,
            ),
            ("claims left", self.claims_left),
            ("runs off the cron grid or past the cursor", self.unexpected),
            ("triggers never admitted", self.starved),
            ("takeovers before the database expiry", self.early_takeovers),
        ]
        .iter()
        .filter(|(_, n)| *n != 0)
        .map(|(what, n)| format!("{what}: {n}"))
        .collect();
        problems.extend(
            self.violated
                .iter()
                .map(|v| format!("{}: {} ({})", v.invariant, v.violations, v.sample)),
        );
        assert!(
            problems.is_empty() && self.admitted > 0,
            "drill invariants violated: {}\n{report}",
            if problems.is_empty() {
                "nothing admitted".to_string()
            } else {
                problems.join(", ")
            }
        );
    }

    /// The drill table: one header, one row, then the secondary figures.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| occurrences expected | admitted | duplicates | lost | max lag | takeovers |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|");
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} s | {} |",
            self.expected,
            self.admitted,
            self.duplicates,
            self.lost,
            self.max_lag_ms as f64 / 1000.0,
            self.takeovers
        );
        let by: Vec<String> = self
            .by_replica
            .iter()
            .map(|(r, n)| format!("{r}={n}"))
            .collect();
        let _ = writeln!(
            s,
            "triggers {} · misfired {} · early takeovers {} · runs not as admitted {} · claims left {} \
             · off-grid {} · never admitted {} · admitted by {}",
            self.triggers,
            self.misfired,
            self.early_takeovers,
            self.bad_shape,
            self.claims_left,
            self.unexpected,
            self.starved,
            by.join(" ")
        );
        s
    }
}

/// What the dispatcher protocol left of runs that workers executed (the worker drills), read
/// once every run has settled: each run finished with exactly one recorded outcome, no
/// attempt beyond the spec's `max_attempts`, and the kit's protocol invariants (events
/// agree with the status, live attempts with the live status, one run per occurrence).
#[derive(Clone, Debug, Default)]
pub struct Executed {
    pub runs: i64,
    pub succeeded: i64,
    pub failed: i64,
    /// Runs still `queued`, `dispatching` or `running`.
    pub unsettled: i64,
    /// Runs without exactly one `run.finished` event, or with more than one attempt
    /// finished by a worker (an attempt marked lost by an expiry is not a worker's outcome).
    pub outcomes_not_one: i64,
    /// Attempts marked lost (`lost: lease expired …`).
    pub lost_attempts: i64,
    /// Runs with more than one attempt (queued again after a lost one).
    pub retried: i64,
    /// Runs with more attempts than `max_attempts`.
    pub over_attempts: i64,
    /// Runs whose events or live attempts break the protocol.
    pub protocol_breaks: i64,
    pub duplicates: i64,
}

const EXECUTED_SQL: &str = "
WITH per AS (
    SELECT r.run_id, r.status,
           (SELECT count(*) FROM qlsched.run_events e
             WHERE e.run_id = r.run_id AND e.kind = 'run.finished') AS finished_events,
           (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id) AS attempts,
           (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id
               AND a.state IN ('succeeded', 'failed')
               AND (a.error IS NULL OR a.error NOT LIKE 'lost:%')) AS by_worker,
           (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id
               AND a.state = 'failed' AND a.error LIKE 'lost:%') AS lost
      FROM qlsched.runs r
)
SELECT count(*),
       count(*) FILTER (WHERE status = 'succeeded'),
       count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE status IN ('queued', 'dispatching', 'running')),
       count(*) FILTER (WHERE status IN ('succeeded', 'failed')
                          AND (finished_events <> 1 OR by_worker > 1)),
       coalesce(sum(lost), 0)::bigint,
       count(*) FILTER (WHERE attempts > 1),
       count(*) FILTER (WHERE attempts > $1)
  FROM per";

const PROTOCOL_SQL: &str = "
SELECT count(*) FROM qlsched.runs r
 WHERE (SELECT count(*) <> max(e.seq) FROM qlsched.run_events e WHERE e.run_id = r.run_id)
    OR (SELECT e.kind FROM qlsched.run_events e WHERE e.run_id = r.run_id ORDER BY e.seq DESC LIMIT 1)
       <> CASE r.status WHEN 'queued' THEN 'run.queued' WHEN 'dispatching' THEN 'run.dispatching'
                        WHEN 'running' THEN 'run.started' WHEN 'cancelled' THEN 'run.cancelled'
                        ELSE 'run.finished' END
    OR (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id
           AND a.state IN ('claimed', 'dispatching', 'running'))
       <> CASE WHEN r.status IN ('queued', 'dispatching', 'running') THEN 1 ELSE 0 END";

/// Runs the execution checks; the caller prints the figures and then asserts them clean.
pub async fn executed(sql: &Client, max_attempts: i64) -> Executed {
    let r = sql.query_one(EXECUTED_SQL, &[&max_attempts]).await.unwrap();
    let one =
        |q: &'static str| async move { sql.query_one(q, &[]).await.unwrap().get::<_, i64>(0) };
    Executed {
        runs: r.get(0),
        succeeded: r.get(1),
        failed: r.get(2),
        unsettled: r.get(3),
        outcomes_not_one: r.get(4),
        lost_attempts: r.get(5),
        retried: r.get(6),
        over_attempts: r.get(7),
        protocol_breaks: one(PROTOCOL_SQL).await,
        duplicates: one(
            "SELECT coalesce(sum(n - 1), 0)::bigint FROM (SELECT count(*) AS n FROM qlsched.runs
              GROUP BY trigger_id, scheduled_for_ms) d",
        )
        .await,
    }
}

impl Executed {
    /// Every run settled with one outcome, within its attempts, by the protocol.
    pub fn assert_clean(&self, report: &str) {
        let problems: Vec<String> = [
            ("runs not settled", self.unsettled),
            (
                "runs without exactly one recorded outcome",
                self.outcomes_not_one,
            ),
            ("runs beyond max_attempts", self.over_attempts),
            ("runs breaking the protocol", self.protocol_breaks),
            ("duplicate occurrences", self.duplicates),
        ]
        .iter()
        .filter(|(_, n)| *n != 0)
        .map(|(what, n)| format!("{what}: {n}"))
        .collect();
        assert!(
            problems.is_empty() && self.runs > 0,
            "drill invariants violated: {}\n{report}",
            if problems.is_empty() {
                "no run at all".to_string()
            } else {
                problems.join(", ")
            }
        );
    }

    /// The worker drills' table.
    pub fn table(&self, live_twice: i64, samples: u64) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| runs | succeeded | failed | one outcome each | lost attempts | retried | two live attempts (max, {samples} samples) | duplicates |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|");
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {live_twice} | {} |",
            self.runs,
            self.succeeded,
            self.failed,
            self.runs - self.outcomes_not_one - self.unsettled,
            self.lost_attempts,
            self.retried,
            self.duplicates
        );
        let _ = writeln!(
            s,
            "unsettled {} · beyond max_attempts {} · protocol breaks {}",
            self.unsettled, self.over_attempts, self.protocol_breaks
        );
        s
    }
}
