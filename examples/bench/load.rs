//! Putting triggers into the database: a bulk load in SQL (consistent with what
//! `store::manage` writes, digests computed the same way; fast, for drains, lag and idle
//! rows), and publishing through the library's `publish_trigger`, one transaction per
//! trigger on a connection of its own, several at a time: what `qlsched trigger publish`
//! writes (the herd rows use it: bulk-loaded herds run 2–3× faster than published ones).

use std::time::Instant;

use qlsched::store::manage::{self, TriggerSpec};

use crate::env::Bench;

/// How the bulk-loaded triggers are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Due at `fire_ms` (default: a second ago), once a year after that: a drain.
    Due,
    /// `S * * * * *` with S = index % 60, the first such second at least `lead_ms` ahead.
    Stagger,
    /// Nothing due for a day.
    Idle,
    /// Every second, from the first whole second at least `lead_ms` ahead.
    Second,
    /// Like `Due`, but holding a live claim of another owner that expires in an hour.
    Claimed,
}

#[derive(Clone, Debug)]
pub struct Load {
    pub layout: Layout,
    pub first: u64,
    pub prefix: &'static str,
    pub lead_ms: i64,
    pub grace_ms: i64,
    pub fire_ms: Option<i64>,
}

impl Load {
    pub fn new(layout: Layout) -> Load {
        Load {
            layout,
            first: 1,
            prefix: "b",
            lead_ms: 3000,
            grace_ms: 60_000,
            fire_ms: None,
        }
    }
}

/// The definition rows every benchmark trigger shares: project `bench`, task `bench-task`
/// with one execution revision (its digest is sha256(spec) or every admission is refused).
const DEFINITIONS: &str = "
INSERT INTO qlsched.projects (project_id, status, created_at_ms, updated_at_ms)
VALUES ('bench', 'active', NOW_MS, NOW_MS) ON CONFLICT DO NOTHING;
INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
SELECT '00000000-0000-4000-8000-00000000be4c', 'bench', 'remote_worker', spec,
       encode(sha256(convert_to(spec, 'UTF8')), 'hex'), NOW_MS
  FROM (VALUES ('{\"image\":\"bench/noop:1\",\"args\":[]}')) AS v(spec)
ON CONFLICT DO NOTHING;
INSERT INTO qlsched.tasks (task_id, project_id, revision, content_digest, execution_revision_id, updated_at_ms)
SELECT 'bench-task', 'bench', 1,
       encode(sha256(convert_to('task:v1' || E'\\n' || 'bench' || E'\\n' || e.spec_digest, 'UTF8')), 'hex'),
       e.execution_revision_id, NOW_MS
  FROM qlsched.execution_revisions e WHERE e.execution_revision_id = '00000000-0000-4000-8000-00000000be4c'
ON CONFLICT DO NOTHING;
";

impl Bench {
    /// Back to a freshly migrated database (definitions of the bench project and task
    /// kept): no triggers, schedules, runs or replicas. Definition rows and runs are
    /// permanent (V7 refuses DELETE and TRUNCATE with a trigger), so the superuser resets
    /// them with triggers off.
    pub async fn reset(&self) {
        self.exec(
            "SET session_replication_role = replica;
             TRUNCATE qlsched.run_events, qlsched.attempts, qlsched.runs, qlsched.trigger_schedules,
                      qlsched.triggers, qlsched.trigger_overlap, qlsched.replicas, qlsched.trigger_outcomes;
             RESET session_replication_role",
        )
        .await;
    }

    /// Adds `n` triggers `<prefix><7-digit index>` in one transaction.
    pub async fn load(&self, n: u64, l: &Load) {
        let now = self.db_now_ms().await;
        let fire = l.fire_ms.unwrap_or(now - 1000);
        let (lead, grace, first) = (l.lead_ms, l.grace_ms, l.first);
        let cron = match l.layout {
            Layout::Stagger => "(g % 60) || ' * * * * *'",
            Layout::Second => "'* * * * * *'",
            _ => "'0 0 0 1 1 *'",
        };
        let next = match l.layout {
            Layout::Stagger => format!(
                "(SELECT CASE WHEN b <= {now} + {lead} THEN b + 60000 ELSE b END
                    FROM (SELECT ({now} / 60000) * 60000 + (g % 60) * 1000 AS b) x)"
            ),
            Layout::Second => format!("(({now} + {lead}) / 1000 + 1) * 1000"),
            Layout::Idle => format!("{now} + 86400000"),
            Layout::Due | Layout::Claimed => format!("{fire}::bigint"),
        };
        let claimed = l.layout == Layout::Claimed;
        let (sv, owner, token, cv, expires, claimable) = if claimed {
            (
                "2",
                "'bench-other'",
                "gen_random_uuid()",
                "1",
                format!("{now} + 3600000"),
                format!("{now} + 3600000"),
            )
        } else {
            (
                "1",
                "NULL",
                "NULL",
                "0",
                "NULL".into(),
                "next_fire_at_ms".into(),
            )
        };
        let sql = format!(
            "SET session_replication_role = replica;
             BEGIN;
             {defs}
             CREATE TEMP TABLE bench_new ON COMMIT DROP AS
             SELECT '{prefix}' || lpad(g::text, 7, '0') AS trigger_id, {cron} AS cron_expr,
                    {next} AS next_fire_at_ms
               FROM generate_series({first}::bigint, {first}::bigint + {n} - 1) g;
             INSERT INTO qlsched.triggers (trigger_id, project_id, task_id, revision, kind, enabled, cron_expr,
                                           timezone, misfire_policy, misfire_grace_ms, content_digest, updated_at_ms)
             SELECT trigger_id, 'bench', 'bench-task', 1, 'cron', true, cron_expr, 'UTC', 'skip', {grace},
                    encode(sha256(convert_to(concat_ws(E'\\n', 'trigger:v1', 'bench', 'bench-task', cron_expr, 'UTC',
                                                       'skip', ({grace})::text, 'true'), 'UTF8')), 'hex'),
                    {now}
               FROM bench_new;
             INSERT INTO qlsched.trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms,
                                                    state_version, claim_owner, claim_token, claim_version,
                                                    claim_expires_at_ms, claimable_at_ms, updated_at_ms)
             SELECT trigger_id, 'bench', 1, next_fire_at_ms, {sv}, {owner}, {token}, {cv}, {expires},
                    {claimable}, {now}
               FROM bench_new;
             COMMIT;
             RESET session_replication_role;
             ANALYZE qlsched.projects, qlsched.execution_revisions, qlsched.tasks, qlsched.triggers,
                     qlsched.trigger_schedules",
            defs = DEFINITIONS.replace("NOW_MS", &now.to_string()),
            prefix = l.prefix,
        );
        self.exec(&sql).await;
    }

    /// Publishes `n` triggers `<prefix><7-digit index>` (from `first`) with `cron` through
    /// `manage::publish_trigger`, `parallel` at a time, each on a new connection as the
    /// admin role (what `seq | xargs -P qlsched trigger publish` writes, without spawning a
    /// process per trigger). Project `bench` and task `bench-task` are set first. Returns
    /// the seconds it took.
    pub async fn publish(
        &self,
        prefix: &str,
        first: u64,
        n: u64,
        cron: &str,
        parallel: usize,
    ) -> f64 {
        self.publish_jittered(prefix, first, n, cron, parallel, 0)
            .await
    }

    /// [`Bench::publish`] with `--jitter` of `jitter_ms` on every trigger (0: none).
    pub async fn publish_jittered(
        &self,
        prefix: &str,
        first: u64,
        n: u64,
        cron: &str,
        parallel: usize,
        jitter_ms: i64,
    ) -> f64 {
        let t0 = Instant::now();
        let mut admin = self.srv.connect("qlsched_admin", "qlsched").await;
        manage::set_project(&mut admin, "bench", "active")
            .await
            .expect("project set");
        manage::publish_task(
            &mut admin,
            "bench",
            "bench-task",
            r#"{"image":"bench/noop:1","args":[]}"#,
        )
        .await
        .expect("task publish");
        let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(first));
        let end = first + n;
        let mut tasks = Vec::new();
        for _ in 0..parallel.max(1) {
            let (next, config, prefix, cron) = (
                next.clone(),
                self.srv.config("qlsched_admin", "qlsched"),
                prefix.to_string(),
                cron.to_string(),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    let (mut c, conn) = config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                    tokio::spawn(conn);
                    let spec = TriggerSpec {
                        jitter_ms,
                        ..TriggerSpec::new(
                            &format!("{prefix}{i:07}"),
                            "bench",
                            "bench-task",
                            &cron,
                            "UTC",
                        )
                    };
                    manage::publish_trigger(&mut c, &spec)
                        .await
                        .expect("trigger publish");
                }
            }));
        }
        for t in tasks {
            t.await.expect("a publishing task");
        }
        t0.elapsed().as_secs_f64()
    }
}
