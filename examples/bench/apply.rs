//! Rows A: `qlsched apply` at 10,000 triggers (docs/apply.md), the real binary against the
//! bench server as the admin role.
//!
//! - A1: applying a file of 10,000 triggers the database already holds unchanged (target
//!   ≤ 5 s): the files read and checked, the definitions read back, the plan, nothing written.
//! - A2: the same file with every trigger's cron changed (target ≤ 30 s): 10,000 new
//!   revisions, fences and audit rows in one transaction.
//! - A3: while A2 runs, the admission lag p99 of 200 other every-second triggers admitted by 3
//!   replicas (target ≤ 100 ms), beside the same replicas' p99 over a window without an apply.
//! - A4: the WAL an audit row adds to a publish: `trigger publish` of a changed cron, per
//!   publish, beside the WAL of the same publish's audit row alone (copies of the rows the
//!   publishes wrote, inserted in a transaction that is rolled back).
//!
//! The applied triggers live in a project of their own and are due once a year (1 January),
//! so the replicas admit only the every-second triggers during the windows.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use qlsched_testkit::replica::binary;

use crate::env::{now_ms, say, sleep_s, Bench};
use crate::lag::lag_stats;
use crate::load::{Layout, Load};
use crate::replicas::{Group, Setup};
use crate::report::Row;

const SOURCE: &str = "bench/apply";

/// A definition file of `n` triggers `a<7-digit index>` of project `applied`, all on `cron`.
fn write_file(path: &Path, n: u64, cron: &str) {
    let mut s = format!(
        "source = \"{SOURCE}\"\n\n[[project]]\nid = \"applied\"\n\n[[task]]\nid = \"applied-task\"\n\
         project = \"applied\"\nspec = {{ executor = \"shell\", command = [\"/bin/true\"] }}\n"
    );
    for i in 1..=n {
        s.push_str(&format!(
            "\n[[trigger]]\nid = \"a{i:07}\"\nproject = \"applied\"\ntask = \"applied-task\"\ncron = \"{cron}\"\n"
        ));
    }
    std::fs::write(path, s).expect("write the definition file");
}

/// `qlsched ARGS` as the admin role; returns (seconds, success, stderr's last line).
fn ql(b: &Bench, args: &[&str]) -> (f64, bool, String) {
    let t0 = Instant::now();
    let out = Command::new(binary())
        .args(args)
        .env("QLSCHED_DSN", b.srv.dsn("qlsched_admin", "qlsched"))
        .env("USER", "bench")
        .output()
        .expect("run qlsched");
    let secs = t0.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or("").to_string();
    (secs, out.status.success(), last)
}

/// `qlsched apply -f FILE`, checked to have succeeded.
fn apply(b: &mut Bench, file: &Path, what: &str) -> f64 {
    let (secs, ok, err) = ql(b, &["apply", "-f", file.to_str().unwrap()]);
    b.check(&format!("A: {what}: apply exited 0 ({err})"), ok);
    secs
}

pub async fn rows(b: &mut Bench) {
    let smoke = b.sizes.smoke;
    let n: u64 = if smoke { 300 } else { 10_000 };
    let lag_n: u64 = if smoke { 20 } else { 200 };
    let base_s = if smoke { 4.0 } else { 20.0 };
    say(&format!(
        "A. apply: {n} triggers from a file (created, unchanged, changed) while 3 replicas admit {lag_n} every-second triggers"
    ));
    b.reset().await;
    let dir = tempfile::tempdir().unwrap();
    let (first, changed) = (
        dir.path().join("first.toml"),
        dir.path().join("changed.toml"),
    );
    write_file(&first, n, "0 3 1 1 *");
    write_file(&changed, n, "0 4 1 1 *");

    let created_s = apply(b, &first, "create");
    let held = b
        .num("select count(*) from qlsched.triggers where project_id = 'applied'")
        .await as u64;
    b.check(
        &format!("A: the first apply created {held} of {n} triggers"),
        held == n,
    );

    // The every-second triggers and the replicas admitting them.
    let mut l = Load::new(Layout::Second);
    l.prefix = "s";
    l.lead_ms = b.sizes.lag_lead_ms;
    b.load(lag_n, &l).await;
    b.checkpoint().await;
    let mut g = Group::start(3, &Setup::default_config(&b.runtime_dsn));
    g.wait_ready().await;
    sleep_s(b.sizes.warm_s).await;

    // A window without an apply.
    let w0 = now_ms();
    sleep_s(base_s).await;
    let w1 = now_ms();

    // A1: unchanged.
    let revisions =
        "select coalesce(sum(revision), 0) from qlsched.triggers where project_id = 'applied'";
    let rev0 = b.num(revisions).await;
    let unchanged_s = apply(b, &first, "unchanged");
    let rev1 = b.num(revisions).await;
    b.check(
        &format!("A1: an unchanged apply minted no revision ({rev0} → {rev1})"),
        rev0 == rev1,
    );

    // A2 and A3: changed, while the replicas admit.
    let a0 = now_ms();
    let changed_s = apply(b, &changed, "changed");
    let a1 = now_ms();
    let moved = b
        .num("select count(*) from qlsched.triggers where project_id = 'applied' and cron_expr = '0 4 1 1 *'")
        .await as u64;
    b.check(
        &format!("A2: the changed apply moved {moved} of {n} triggers"),
        moved == n,
    );
    sleep_s(b.sizes.tail_s).await;
    g.assert_alive();
    g.stop().await;
    let dups = b.invariants("apply").await;
    let (cnt0, _, p99_base, max_base) = lag_stats(b, w0, w1).await;
    let (cnt1, _, p99_apply, max_apply) = lag_stats(b, a0, a1).await;
    b.check(
        &format!(
            "A3: duplicates {dups}; runs admitted without / during the apply: {cnt0} / {cnt1}"
        ),
        // An apply shorter than 2 s (the smoke's 300 triggers) may span no whole second: no
        // run is due inside it, and its row then says nothing about the lag.
        dups == 0 && cnt0 > 0.0 && (cnt1 > 0.0 || a1 - a0 < 2000),
    );

    b.row(
        Row::new(
            "A1",
            "apply_unchanged_s",
            format!("`qlsched apply` of {n} unchanged triggers (whole command: read, check, plan)"),
            unchanged_s,
            "s",
        )
        .lower_better()
        .detail(format!(
            "creating them from the same file took {created_s:.1} s; revisions unchanged"
        ))
        .target("≤ 5 s", unchanged_s <= 5.0),
    );
    b.row(
        Row::new(
            "A2",
            "apply_changed_s",
            format!("`qlsched apply` of {n} triggers, every cron changed (one transaction)"),
            changed_s,
            "s",
        )
        .lower_better()
        .detail(format!("{moved} triggers moved to their new cron"))
        .target("≤ 30 s", changed_s <= 30.0),
    );
    b.row(
        Row::new(
            "A3",
            "apply_lag_p99_ms",
            format!(
                "admission lag p99 of {lag_n} every-second triggers (3 replicas) while A2 runs"
            ),
            p99_apply,
            "ms p99",
        )
        .lower_better()
        .detail(format!(
            "during the apply: p99 {p99_apply:.0} ms, max {max_apply:.0} ms over {cnt1} runs in {:.1} s; \
             the same replicas without an apply: p99 {p99_base:.0} ms, max {max_base:.0} ms over {cnt0} runs in {:.1} s; duplicates {dups}",
            (a1 - a0) as f64 / 1000.0,
            (w1 - w0) as f64 / 1000.0
        ))
        .target("≤ 100 ms", p99_apply <= 100.0 && dups == 0),
    );

    audit_wal_row(b).await;
}

/// A4: WAL of a `trigger publish` (with its audit row) and of the audit row alone.
/// Measured after a warm round, with the pages' hint bits already set (a first read of rows
/// after a checkpoint writes full-page images of them, which would be counted otherwise).
async fn audit_wal_row(b: &mut Bench) {
    let m: u64 = if b.sizes.smoke { 5 } else { 50 };
    let copies: u64 = if b.sizes.smoke { 20 } else { 200 };
    let publish_all = |b: &mut Bench, cron: &str| {
        for i in 1..=m {
            let (_, ok, err) = ql(
                b,
                &[
                    "trigger",
                    "publish",
                    "--id",
                    &format!("a{i:07}"),
                    "--project",
                    "applied",
                    "--task",
                    "applied-task",
                    "--cron",
                    cron,
                ],
            );
            b.check(&format!("A4: trigger publish {i} exited 0 ({err})"), ok);
        }
    };
    publish_all(b, "0 5 1 1 *");
    b.exec("VACUUM qlsched.audit_log, qlsched.triggers, qlsched.trigger_schedules")
        .await;
    let lsn = b.lsn().await;
    publish_all(b, "0 6 1 1 *");
    let per_publish = b.wal_since(&lsn).await / m as f64;
    let last_cli = format!(
        "SELECT actor, host, source, source_label, object_kind, object_id, project_id, action, changes, note
           FROM qlsched.audit_log WHERE object_kind = 'trigger' AND source = 'cli'
          ORDER BY audit_id DESC LIMIT {m}"
    );
    let audited = b
        .num(&format!(
            "select count(*) from ({last_cli}) x where changes ? 'cron_expr'"
        ))
        .await as u64;
    b.check(
        &format!("A4: {audited} audit rows with the cron change of {m} CLI publishes"),
        audited == m,
    );
    // The audit rows alone: {copies} copies of each row those publishes wrote, inserted in a
    // transaction that is rolled back, measured at the WAL insert position.
    b.exec("VACUUM qlsched.audit_log").await;
    let mut tx_client = b.srv.connect("postgres", "qlsched").await;
    let tx = tx_client.transaction().await.unwrap();
    let l0: String = tx
        .query_one("select pg_current_wal_insert_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    tx.execute(
        &format!(
            "INSERT INTO qlsched.audit_log (actor, host, source, source_label, object_kind, object_id,
                                            project_id, action, changes, note)
             SELECT x.* FROM ({last_cli}) x, generate_series(1, {copies})"
        ),
        &[],
    )
    .await
    .unwrap();
    let audit_bytes: f64 = tx
        .query_one(
            "select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::text::pg_lsn)::float8",
            &[&l0],
        )
        .await
        .unwrap()
        .get(0);
    tx.rollback().await.unwrap();
    let per_row = audit_bytes / (m * copies) as f64;
    b.row(
        Row::new(
            "A4",
            "audit_wal_per_publish_b",
            "WAL an audit row adds to a `trigger publish` (a changed cron)",
            per_row,
            "B",
        )
        .lower_better()
        .detail(format!(
            "the audit row alone {per_row:.0} B (heap and its 4 indexes; {} copies of the {m} rows) of \
             {per_publish:.0} B per publish ({:.0} %; {m} publishes after a warm round)",
            m * copies,
            100.0 * per_row / per_publish.max(1.0)
        )),
    );
}
