//! Rows RC: retention by batched deletes vs time partitions, measured on one server in one
//! run. The same occurrences (run + attempt + 2 events each, admitted in batches of 64 per
//! transaction, then finished) are removed in three layouts:
//! A, the shipped schema, through the real `qlsched.prune_finished` path (batch 1000, one
//! transaction per batch, under the prune lease), then VACUUM; B, runs/attempts/run_events
//! range-partitioned on scheduled_for_ms, removed by DROP of whole partitions once none of
//! their runs is unfinished (per-partition unique keys cannot refuse a manual key admitted
//! again in another partition: the last row shows it); C, B plus an unpartitioned key table
//! every admission inserts into first, its keys removed by batched DELETE. Per layout:
//! admission, removal and VACUUM (µs, WAL bytes, backend and server CPU per occurrence),
//! sizes before, after the removal and after VACUUM, and a lookup by run_id. Two rounds, the
//! second in reverse order. The layouts' SQL is the data file bench/retention_choice.sql.

use crate::env::{clk_tck, say, sleep_s, Bench};
use crate::report::Row;

const SETUP: &str = include_str!("../../bench/retention_choice.sql");

fn children(pm: u32) -> String {
    let mut c: Vec<String> = std::fs::read_to_string(format!("/proc/{pm}/task/{pm}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    c.sort();
    c.join(" ")
}

/// Runs `stmts` in one session between marks (wall clock, WAL, full-page images, the
/// backend's CPU); server CPU is the change of the server's ticks once that backend is reaped.
async fn phase(b: &Bench, round: u32, layout: &str, ph: &str, n: u64, stmts: &[String]) {
    let pm = b.srv.postmaster_pid();
    let (kids, s0) = (children(pm), b.server_ticks());
    {
        let c = b.srv.connect("postgres", "qlsched").await;
        c.batch_execute("SET client_min_messages = warning; SELECT bench.start()")
            .await
            .unwrap();
        for s in stmts {
            c.batch_execute(s)
                .await
                .unwrap_or_else(|e| panic!("{e:?}: {s}"));
        }
        c.batch_execute(&format!(
            "SELECT bench.stop({round}, '{layout}', '{ph}', {n})"
        ))
        .await
        .unwrap();
    }
    for _ in 0..100 {
        if children(pm) == kids {
            break;
        }
        sleep_s(0.05).await;
    }
    let s1 = b.server_ticks();
    b.exec(&format!(
        "UPDATE bench.results SET server_ticks = {} WHERE id = (SELECT max(id) FROM bench.results)",
        s1.saturating_sub(s0)
    ))
    .await;
}

pub async fn rows(b: &mut Bench, n: u64) {
    let (p, keep, empty, batch, prune_batch, triggers) = (4u64, 1u64, 20u64, 64, 1000, 1000u64);
    let per_p = n / p;
    let removed = per_p * (p - keep);
    let width_ms = per_p / triggers * 1000;
    let now_s = crate::env::now_ms() / 1000;
    let t0 = (now_s - 86_400) / 3600 * 3600 * 1000;
    say(&format!("RC. retention choice: {n} occurrences per layout in {p} partitions of {per_p} (+ {empty} empty), the oldest {} removed ({removed})", p - keep));
    b.reset().await;
    b.exec("SET session_replication_role = replica; TRUNCATE qlsched.projects, qlsched.execution_revisions, qlsched.tasks CASCADE; RESET session_replication_role").await;
    b.exec("SET client_min_messages = warning; DROP SCHEMA IF EXISTS bench CASCADE; DROP SCHEMA IF EXISTS part_b CASCADE; DROP SCHEMA IF EXISTS part_c CASCADE").await;
    let setup = SETUP
        .replace("{P}", &p.to_string())
        .replace("{EMPTY}", &empty.to_string())
        .replace("{T0}", &t0.to_string())
        .replace("{WIDTH_MS}", &width_ms.to_string())
        .replace("{TRIGGERS}", &triggers.to_string());
    b.exec(&format!("SET client_min_messages = warning; {setup}"))
        .await;
    let horizon = t0 + ((p - keep) * width_ms) as i64;
    let token = b.text("gen_random_uuid()").await;
    let mut sizes = std::collections::BTreeMap::new();
    let rounds = if b.sizes.smoke { 1 } else { 2 };
    for round in 1..=rounds {
        let order = if round == 1 {
            ["A", "B", "C"]
        } else {
            ["C", "B", "A"]
        };
        for l in order {
            let s = match l {
                "A" => "qlsched",
                "B" => "part_b",
                _ => "part_c",
            };
            b.exec(&format!("CALL bench.fresh('{l}')")).await;
            say(&format!(
                "RC. round {round}, {l}: admit {n} occurrences in batches of {batch}"
            ));
            b.checkpoint().await;
            phase(
                b,
                round,
                l,
                "admit",
                n,
                &[format!("CALL bench.admit('{l}', {n}, {batch})")],
            )
            .await;
            b.exec(&format!(
                "SET session_replication_role = replica;
                 UPDATE {s}.runs SET status = 'succeeded';
                 UPDATE {s}.attempts SET state = 'succeeded', started_at_ms = created_at_ms, finished_at_ms = created_at_ms + 100;
                 RESET session_replication_role"
            ))
            .await;
            b.exec(&format!(
                "VACUUM ANALYZE {s}.runs, {s}.attempts, {s}.run_events"
            ))
            .await;
            b.checkpoint().await;
            let before = b.num(&format!("select bench.size('{l}')")).await;
            b.exec(&format!("DROP TABLE IF EXISTS bench.ids; CREATE TABLE bench.ids AS SELECT run_id FROM {s}.runs ORDER BY random() LIMIT 2000")).await;
            phase(b, round, l, "lookup", 10_000, &[format!(
                "DO $$ DECLARE id uuid; BEGIN FOR r IN 1..5 LOOP FOR id IN SELECT run_id FROM bench.ids LOOP PERFORM 1 FROM {s}.runs WHERE run_id = id; END LOOP; END LOOP; END $$"
            )])
            .await;
            say(&format!("RC. round {round}, {l}: remove the {removed} occurrences scheduled before the horizon"));
            b.checkpoint().await;
            let remove: Vec<String> = match l {
                "A" => {
                    b.exec(&format!("UPDATE qlsched.maintenance SET lease_owner = 'bench-choice', lease_token = '{token}', lease_expires_at = clock_timestamp() + interval '1 hour' WHERE task = 'prune'")).await;
                    vec![format!(
                        "CALL bench.prune_a({horizon}, {prune_batch}, '{token}')"
                    )]
                }
                "B" => vec![format!("CALL bench.drop_parts('part_b', {horizon})")],
                _ => vec![
                    format!("CALL bench.drop_parts('part_c', {horizon})"),
                    format!("CALL bench.delete_keys({horizon}, {prune_batch})"),
                ],
            };
            phase(b, round, l, "remove", removed, &remove).await;
            let left = n - removed;
            let runs = b.num(&format!("select count(*) from {s}.runs")).await as u64;
            let atts = b.num(&format!("select count(*) from {s}.attempts")).await as u64;
            let evs = b.num(&format!("select count(*) from {s}.run_events")).await as u64;
            let keys = if l == "C" {
                b.num("select count(*) from part_c.run_keys").await as u64
            } else {
                left
            };
            b.check(
                &format!("retention choice {l}: left {runs} runs, {atts} attempts, {evs} events, {keys} keys; expected {left}, {left}, {}, {left}", 2 * left),
                runs == left && atts == left && evs == 2 * left && keys == left,
            );
            let after = b.num(&format!("select bench.size('{l}')")).await;
            b.checkpoint().await;
            let vac = if l == "C" {
                format!("VACUUM {s}.runs, {s}.attempts, {s}.run_events, part_c.run_keys")
            } else {
                format!("VACUUM {s}.runs, {s}.attempts, {s}.run_events")
            };
            phase(b, round, l, "vacuum", removed, &[vac]).await;
            let vacuumed = b.num(&format!("select bench.size('{l}')")).await;
            sizes.insert(l, (before, after, vacuumed));
        }
    }
    // The same manual key admitted at two times lands in two partitions of B: both commit.
    let mk = "'ql3:manual:v2:b0000001:req-1'";
    b.exec(&format!(
        "INSERT INTO part_b.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id, idempotency_key, status, scheduled_for_ms, queued_at_ms, admitted_by, request_id)
         SELECT gen_random_uuid(), 'bench', 'b0000001', 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c', {mk}, 'queued', sf, sf, 'bench', 'req-1'
           FROM (VALUES ({horizon} + 1), ({horizon} + {width_ms} + 1)) v(sf)
         ON CONFLICT (idempotency_key, scheduled_for_ms) DO NOTHING"
    ))
    .await;
    let dupb = b
        .num(&format!(
            "select count(*) from part_b.runs where idempotency_key = {mk}"
        ))
        .await;
    let tck = clk_tck();
    for l in ["A", "B", "C"] {
        for ph in ["admit", "remove", "vacuum", "lookup"] {
            let r = b
                .su
                .query_one(
                    "select (1000 * sum(ms) / sum(n))::float8, (sum(wal) / sum(n))::float8,
                            (1e6 * sum(cpu_ticks) / $3::float8 / sum(n))::float8, (1e6 * coalesce(sum(server_ticks), 0) / $3::float8 / sum(n))::float8
                       from bench.results where layout = $1 and phase = $2",
                    &[&l, &ph, &tck],
                )
                .await
                .unwrap();
            let (us, wal, cpu, srv): (f64, f64, f64, f64) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            b.row(
                Row::new(
                    "RC",
                    &format!("choice_{l}_{ph}"),
                    format!("retention choice, layout {l}: {ph}, per occurrence"),
                    us,
                    "µs",
                )
                .lower_better()
                .detail(format!(
                    "WAL {wal:.0} B, backend CPU {cpu:.1} µs, server CPU {srv:.1} µs"
                )),
            );
        }
        let (bf, af, vf) = sizes[l];
        b.row(
            Row::new(
                "RC",
                &format!("choice_{l}_size_after_vacuum"),
                format!("retention choice, layout {l}: size after removal + VACUUM"),
                vf / 1_048_576.0,
                "MiB",
            )
            .lower_better()
            .detail(format!(
                "before removal {:.1} MiB, after removal {:.1} MiB",
                bf / 1_048_576.0,
                af / 1_048_576.0
            )),
        );
    }
    b.row(
        Row::new("RC", "choice_B_manual_key_rows", "retention choice, layout B: rows left by one manual key admitted at two times in two partitions (1 = unique)", dupb, "rows")
            .detail("B's per-partition key cannot refuse the second; A and C refuse it")
            .target("2 (the reason for A)", dupb == 2.0),
    );
    b.exec("SET client_min_messages = warning; DROP SCHEMA bench CASCADE; DROP SCHEMA part_b CASCADE; DROP SCHEMA part_c CASCADE").await;
    b.reset().await;
}
