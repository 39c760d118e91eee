//! Rows A: `qlsched apply` (docs/apply.md) at 10,000 triggers, through the real binary as
//! the admin role. A0 creates them (one file, one transaction); A1 applies the same file
//! again (all unchanged: target ≤ 5 s); A2 applies it with every cron changed (10,000 new
//! revisions: target ≤ 30 s) with no replica running, and reports its WAL per trigger; A3
//! runs 3 replicas over 200 every-second triggers and compares their lag p99 in a window
//! without an apply with the window of a third apply (every cron changed back) running
//! beside them (target ≤ 100 ms); A4 is the WAL one audit row adds to a publish, measured
//! as the WAL of appending copies of A2's audit rows (one statement, as the superuser)
//! divided by their count.
//!
//! The applied triggers fire once a year (`0 0 1 1 *`, then `0 0 2 1 *`): the apply's
//! writes, not their admissions, are what the lag row measures.

use std::process::Command;
use std::time::Instant;

use qlsched_testkit::replica::binary;

use crate::env::{now_ms, say, sleep_s, Bench};
use crate::lag::lag_stats;
use crate::load::{Layout, Load};
use crate::replicas::{Group, Setup};
use crate::report::Row;

/// The definition file of `n` triggers `apply-NNNNNNN` with `cron`.
fn file(n: u64, cron: &str) -> String {
    let mut f = String::from(
        "source = \"bench/apply\"\n\n[[project]]\nid = \"bench-apply\"\n\n[[task]]\nid = \"bench-apply-task\"\n\
         project = \"bench-apply\"\nspec = { executor = \"shell\", command = [\"true\"] }\n",
    );
    for i in 0..n {
        f.push_str(&format!(
            "\n[[trigger]]\nid = \"apply-{i:07}\"\nproject = \"bench-apply\"\ntask = \"bench-apply-task\"\ncron = \"{cron}\"\n"
        ));
    }
    f
}

/// Runs `qlsched apply -f path` as the admin role; returns (seconds, its last line).
async fn apply(b: &Bench, path: &std::path::Path) -> (f64, String) {
    let dsn = b.srv.dsn("qlsched_admin", "qlsched");
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        let out = Command::new(binary())
            .args(["apply", "-f"])
            .arg(&path)
            .env("QLSCHED_DSN", dsn)
            .env("USER", "bench")
            .output()
            .expect("run qlsched apply");
        let secs = t0.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "qlsched apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (secs, text.lines().last().unwrap_or("").to_string())
    })
    .await
    .unwrap()
}

pub async fn rows(b: &mut Bench) {
    let (n, second_n, base_s) = if b.sizes.smoke {
        (200, 20, 5.0)
    } else {
        (10_000, 200, 20.0)
    };
    say(&format!(
        "A. qlsched apply: {n} triggers created, unchanged, changed; lag of {second_n} every-second triggers beside it"
    ));
    b.reset().await;
    let dir = std::env::temp_dir().join(format!("qlsched-bench-apply-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (one, two, three) = (dir.join("1.toml"), dir.join("2.toml"), dir.join("3.toml"));
    std::fs::write(&one, file(n, "0 0 1 1 *")).unwrap();
    std::fs::write(&two, file(n, "0 0 2 1 *")).unwrap();
    std::fs::write(&three, file(n, "0 0 1 1 *")).unwrap();

    let (created_s, last) = apply(b, &one).await;
    b.check(
        &format!("A0: {last}"),
        last.contains(&format!("{} created", n + 2)),
    );
    b.row(
        Row::new(
            "A0",
            "apply_create",
            format!("qlsched apply creating {n} triggers (one transaction)"),
            created_s,
            "s",
        )
        .lower_better()
        .detail(last),
    );
    let (unchanged_s, last) = apply(b, &one).await;
    b.check(
        &format!("A1: {last}"),
        last.contains("0 created, 0 updated"),
    );
    b.row(
        Row::new(
            "A1",
            "apply_unchanged",
            format!("qlsched apply of {n} unchanged triggers"),
            unchanged_s,
            "s",
        )
        .lower_better()
        .detail(last)
        .target("≤ 5 s", unchanged_s <= 5.0),
    );
    b.checkpoint().await;
    let lsn = b.lsn().await;
    let audit0 = b
        .num("select coalesce(max(audit_id), 0) from qlsched.audit_log")
        .await as i64;
    let (changed_s, last) = apply(b, &two).await;
    let wal = b.wal_since(&lsn).await;
    b.check(
        &format!("A2: {last}"),
        last.contains(&format!("{n} updated")),
    );
    b.row(
        Row::new(
            "A2",
            "apply_changed",
            format!("qlsched apply of {n} changed triggers (new revisions), no replica running"),
            changed_s,
            "s",
        )
        .lower_better()
        .detail(format!(
            "{last}; WAL {:.0} B per changed trigger",
            wal / n as f64
        ))
        .target("≤ 30 s", changed_s <= 30.0),
    );

    // A4: the WAL of the audit rows alone, as copies of A2's rows.
    b.checkpoint().await;
    let lsn = b.lsn().await;
    b.exec(&format!(
        "INSERT INTO qlsched.audit_log (actor, host, source, source_label, object_kind, object_id,
                                        project_id, action, changes, note)
         SELECT actor, host, source, source_label, object_kind, object_id, project_id, action, changes, note
           FROM qlsched.audit_log WHERE audit_id > {audit0} AND object_kind = 'trigger'"
    ))
    .await;
    let audit_wal = b.wal_since(&lsn).await / n as f64;
    b.row(
        Row::new(
            "A4",
            "apply_audit_wal",
            "WAL one audit row adds to a trigger publish",
            audit_wal,
            "B",
        )
        .lower_better()
        .detail(format!(
            "{audit_wal:.0} B of the {:.0} B an applied trigger change writes ({:.0} %)",
            wal / n as f64,
            100.0 * audit_wal / (wal / n as f64)
        )),
    );

    // A3: lag beside an apply.
    let mut l = Load::new(Layout::Second);
    l.lead_ms = b.sizes.lag_lead_ms;
    b.load(second_n, &l).await;
    let g = Group::start(3, &Setup::default_config(&b.runtime_dsn));
    sleep_s(b.sizes.warm_s).await;
    let w0 = now_ms();
    sleep_s(base_s).await;
    let w1 = now_ms();
    let (apply_s, last) = apply(b, &three).await;
    let w2 = now_ms();
    sleep_s(2.0).await;
    g.stop().await;
    let (bc, _, base_p99, base_max) = lag_stats(b, w0, w1).await;
    let (ac, _, apply_p99, apply_max) = lag_stats(b, w1, w2).await;
    let dups = b.invariants("A3").await;
    b.check(&format!("A3: duplicates {dups}"), dups == 0);
    b.row(
        Row::new(
            "A3",
            "apply_lag_without",
            format!(
                "every-second lag p99 of {second_n} triggers, 3 replicas, no apply ({:.0} s)",
                (w1 - w0) as f64 / 1000.0
            ),
            base_p99,
            "ms p99",
        )
        .lower_better()
        .detail(format!("max {base_max:.0} ms over {bc} runs")),
    );
    b.row(
        Row::new(
            "A3",
            "apply_lag_during",
            format!("the same while qlsched apply changes {n} triggers ({apply_s:.1} s)"),
            apply_p99,
            "ms p99",
        )
        .lower_better()
        .detail(format!("max {apply_max:.0} ms over {ac} runs; {last}"))
        .target("≤ 100 ms", apply_p99 <= 100.0),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
