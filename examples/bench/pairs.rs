//! Rows T and W: two variants of the same drain alternating on one server, so that machine
//! load hits both alike: plain vs TLS (verify-full) connections, and the schema as migrated
//! vs as before migration V7.

use crate::drain::drain_once;
use crate::env::{say, Bench};
use crate::report::Row;

/// Row T: plain and TLS (verify-full) drains alternating on one server with `ssl = on`.
pub async fn tls_rows(b: &mut Bench) {
    let s = b.sizes.clone();
    let port = b.srv.port();
    let ca = b
        .srv
        .ca
        .clone()
        .expect("the TLS mode starts the server with ssl = on");
    let plain =
        format!("host=127.0.0.1 port={port} user=qlsched_runtime dbname=qlsched sslmode=disable");
    let tls = format!(
        "host=127.0.0.1 port={port} user=qlsched_runtime dbname=qlsched sslmode=verify-full sslrootcert={}",
        ca.display()
    );
    let mut sums = [0.0f64; 2];
    for rep in 1..=s.pair_reps {
        for (k, (kind, dsn)) in [("plain", &plain), ("tls", &tls)].into_iter().enumerate() {
            say(&format!(
                "T. drain {} due, 3 replicas, {kind} (run {rep}/{})",
                s.pair_n, s.pair_reps
            ));
            b.runtime_dsn = dsn.clone();
            let d = drain_once(b, s.pair_n, 3).await;
            sums[k] += d.rate;
            b.row(
                Row::new(
                    "T",
                    &format!("tls_{kind}_{rep}"),
                    format!("drain {} due, 3 replicas, {kind} (run {rep})", s.pair_n),
                    d.rate,
                    "occ/s",
                )
                .higher_better(),
            );
            b.note(format!("{kind} run {rep}: {}", d.note));
        }
    }
    b.runtime_dsn = plain;
    let (p, t) = (sums[0] / s.pair_reps as f64, sums[1] / s.pair_reps as f64);
    let cost = 100.0 * (1.0 - t / p);
    b.row(
        Row::new("T", "tls_cost", format!("TLS cost: drain {}, 3 replicas, verify-full vs plain (means of {} alternating runs)", s.pair_n, s.pair_reps), cost, "% slower")
            .lower_better()
            .detail(format!("plain {p:.0} occ/s, TLS {t:.0} occ/s"))
            .target("≤ 10 %", cost <= 10.0),
    );
}

/// Row W: WAL per occurrence, schema as migrated vs as before migration V7 (the six foreign
/// keys of runs, attempts and run_events restored NOT VALID, the schedule table's project
/// index back and its fillfactor 100), alternating.
pub async fn wal_rows(b: &mut Bench) {
    let s = b.sizes.clone();
    const FKS: [(&str, &str, &str, &str); 6] = [
        ("runs", "runs_project_id_fkey", "project_id", "projects"),
        ("runs", "runs_trigger_id_fkey", "trigger_id", "triggers"),
        ("runs", "runs_task_id_fkey", "task_id", "tasks"),
        (
            "runs",
            "runs_execution_revision_id_fkey",
            "execution_revision_id",
            "execution_revisions",
        ),
        ("attempts", "attempts_run_id_fkey", "run_id", "runs"),
        ("run_events", "run_events_run_id_fkey", "run_id", "runs"),
    ];
    let ff = b
        .text(
            "select coalesce((select option_value from pg_options_to_table(
               (select reloptions from pg_class where oid = 'qlsched.trigger_schedules'::regclass))
              where option_name = 'fillfactor'), '100')",
        )
        .await;
    let had_idx = b
        .num("select count(*) from pg_indexes where schemaname = 'qlsched' and indexname = 'trigger_schedules_project_idx'")
        .await
        > 0.0;
    let mut sums = [0.0f64; 2];
    for rep in 1..=s.pair_reps {
        for (k, kind) in ["pre-v7", "migrated"].into_iter().enumerate() {
            let pre = kind == "pre-v7";
            for (tab, name, col, rf) in FKS {
                b.exec(&format!("SET client_min_messages = warning; ALTER TABLE qlsched.{tab} DROP CONSTRAINT IF EXISTS {name}")).await;
                if pre {
                    b.exec(&format!("ALTER TABLE qlsched.{tab} ADD CONSTRAINT {name} FOREIGN KEY ({col}) REFERENCES qlsched.{rf} NOT VALID")).await;
                }
            }
            if pre {
                b.exec("ALTER TABLE qlsched.trigger_schedules SET (fillfactor = 100);
                        CREATE INDEX IF NOT EXISTS trigger_schedules_project_idx ON qlsched.trigger_schedules (project_id)").await;
            } else {
                b.exec(&format!(
                    "ALTER TABLE qlsched.trigger_schedules SET (fillfactor = {ff})"
                ))
                .await;
                if !had_idx {
                    b.exec("SET client_min_messages = warning; DROP INDEX IF EXISTS qlsched.trigger_schedules_project_idx").await;
                }
            }
            say(&format!(
                "W. drain {} due, 3 replicas, schema {kind} (run {rep}/{})",
                s.pair_n, s.pair_reps
            ));
            let d = drain_once(b, s.pair_n, 3).await;
            sums[k] += d.wal_per_occ;
            b.row(
                Row::new(
                    "W",
                    &format!("wal_{kind}_{rep}"),
                    format!(
                        "drain {} due, 3 replicas, schema {kind} (run {rep})",
                        s.pair_n
                    ),
                    d.wal_per_occ,
                    "B/occ",
                )
                .lower_better()
                .detail(format!(
                    "{:.3} full-page images, {:.0} occ/s",
                    d.fpi_per_occ, d.rate
                )),
            );
            b.note(format!("{kind} run {rep}: {}", d.note));
            b.note(format!(
                "{kind} run {rep}: WAL of the drain from {} to {}",
                d.lsn0, d.lsn1
            ));
        }
    }
    let (before, after) = (sums[0] / s.pair_reps as f64, sums[1] / s.pair_reps as f64);
    b.row(
        Row::new(
            "W",
            "wal_migrated_vs_pre_v7",
            "WAL per admitted occurrence, schema as migrated (vs before V7)",
            after,
            "B",
        )
        .lower_better()
        .detail(format!(
            "before V7 {before:.0} B: {:.0} %",
            100.0 * after / before.max(1.0)
        ))
        .target("≤ 60 % of 2.6 kB (1560 B)", after <= 1560.0),
    );
}

/// V18's take indexes, as `db migrate` builds them (src/schema/apply.rs CONCURRENT_INDEXES).
const TAKE_INDEXES: &str = "
    CREATE INDEX IF NOT EXISTS runs_take_idx ON qlsched.runs (pool, queued_at_ms)
        WHERE status = 'queued' AND NOT cancelled AND executor IS NOT NULL;
    CREATE INDEX IF NOT EXISTS runs_queued_legacy_idx ON qlsched.runs (queued_at_ms)
        WHERE status = 'queued' AND pool IS NULL";

/// Row WT: what V18 costs the admission (issue 34): WAL per admitted occurrence and drain
/// rate with the task's spec naming an executor (so every run enters `runs_take_idx`),
/// schema as migrated vs without V18's two take indexes (the copied columns are still
/// written: about 16 bytes of the run row), alternating.
pub async fn wal_take_rows(b: &mut Bench) {
    let s = b.sizes.clone();
    // The bench project and task exist once a load wrote them; the drains keep the spec.
    b.reset().await;
    b.load(1, &crate::load::Load::new(crate::load::Layout::Due))
        .await;
    crate::worker::set_spec(
        b,
        r#"{"executor":"http","method":"POST","url":"http://127.0.0.1:9/","timeout":"10s"}"#,
    )
    .await;
    let mut sums = [[0.0f64; 2]; 2];
    for rep in 1..=s.pair_reps {
        for (k, kind) in ["without-v18-indexes", "migrated"].into_iter().enumerate() {
            if k == 0 {
                b.exec(
                    "SET client_min_messages = warning;
                        DROP INDEX IF EXISTS qlsched.runs_take_idx, qlsched.runs_queued_legacy_idx",
                )
                .await;
            } else {
                b.exec(TAKE_INDEXES).await;
            }
            say(&format!(
                "WT. drain {} due, 3 replicas, schema {kind} (run {rep}/{})",
                s.pair_n, s.pair_reps
            ));
            let d = drain_once(b, s.pair_n, 3).await;
            sums[k][0] += d.wal_per_occ;
            sums[k][1] += d.rate;
            b.row(
                Row::new(
                    "WT",
                    &format!("wal_take_{kind}_{rep}"),
                    format!(
                        "drain {} due, 3 replicas, schema {kind} (run {rep})",
                        s.pair_n
                    ),
                    d.wal_per_occ,
                    "B/occ",
                )
                .lower_better()
                .detail(format!(
                    "{:.3} full-page images, {:.0} occ/s",
                    d.fpi_per_occ, d.rate
                )),
            );
            b.note(format!("{kind} run {rep}: {}", d.note));
        }
    }
    b.exec(TAKE_INDEXES).await;
    let reps = s.pair_reps as f64;
    let ([wal0, rate0], [wal1, rate1]) = (sums[0].map(|v| v / reps), sums[1].map(|v| v / reps));
    b.row(
        Row::new(
            "WT",
            "wal_take_migrated_vs_without",
            "WAL per admitted occurrence with V18's take indexes (vs without them)",
            wal1,
            "B",
        )
        .lower_better()
        .detail(format!(
            "without {wal0:.0} B ({:+.0} B, {:+.1} %); drain {rate1:.0} occ/s vs {rate0:.0} occ/s without",
            wal1 - wal0,
            100.0 * (wal1 - wal0) / wal0.max(1.0)
        )),
    );
}
