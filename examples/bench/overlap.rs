//! Rows O (issue 35 item 8): the overlap policy's cost. One server (stock, durable), one run:
//! 10,000 every-minute triggers under `allow` due at second 0 and 10,000 under `forbid` due at
//! second 30, both published as `trigger publish` writes them, 3 replicas at the default
//! config; the two herds alternate, one each half minute, so load on the machine falls on
//! both alike. Every run of a herd is ended (`runs cancel`, one status change each, as a
//! worker's finish is) as soon as the herd is committed, well before its next boundary, so
//! `forbid` admits every occurrence and what is measured is its check: the lock of the
//! trigger's row, the count, the count's write at admission and at the run's end.
//!
//! - O1: the slowest `forbid` boundary against the slowest `allow` one (target ≤ 1.15×);
//!   with `QLSCHED_BENCH_OVERLAP_CONTROL=allow` both herds are under allow (a control run:
//!   the ratio of the phase alone);
//! - O2, O3: WAL bytes per occurrence of each herd, from a CHECKPOINT before its boundary to
//!   its last run committed; O4, O5: WAL bytes per run of the end of each herd's runs.

use qlsched::store::manage::{self, OverlapPolicy, TriggerSpec};

use crate::env::{now_ms, say, sleep_s, Bench};
use crate::replicas::{Group, Setup};
use crate::report::Row;

const N: u64 = 10_000;

/// Publishes `n` triggers `{prefix}{i}` with `cron` under `policy`, 4 at a time.
async fn publish(b: &Bench, prefix: &str, cron: &str, policy: OverlapPolicy, n: u64) -> f64 {
    let t0 = std::time::Instant::now();
    let mut admin = b.srv.connect("qlsched_admin", "qlsched").await;
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
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (next, config, prefix, cron) = (
            next.clone(),
            b.srv.config("qlsched_admin", "qlsched"),
            prefix.to_string(),
            cron.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let (mut c, conn) = config
                .connect(tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let spec = TriggerSpec {
                    overlap_policy: policy,
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

/// One herd: waits for its `n` runs at `boundary` (CHECKPOINT taken before it), returns
/// (ms from the boundary to the last commit, WAL bytes per occurrence, WAL bytes per run of
/// ending them all).
async fn herd(b: &mut Bench, g: &Group, prefix: &str, boundary: i64) -> (f64, f64, f64) {
    while now_ms() < boundary - 8_000 {
        sleep_s(0.5).await;
    }
    // Whatever is still queued (the occurrences caught up when the replicas started) ends
    // now: under forbid an unfinished run would have the herd skipped.
    end_queued(b, None).await;
    b.checkpoint().await;
    b.check(
        &format!("{prefix} herd at {boundary}: its CHECKPOINT ended before the boundary"),
        now_ms() < boundary,
    );
    let retries0 = g.metric_sum("qlsched_serialization_retries_total");
    let lsn0 = b.lsn().await;
    let q = format!(
        "select count(*) from qlsched.runs where scheduled_for_ms = {boundary} and trigger_id like '{prefix}%'"
    );
    loop {
        if b.num(&q).await as u64 >= N || now_ms() > boundary + 25_000 {
            break;
        }
        sleep_s(0.2).await;
    }
    let c = b.num(&q).await as u64;
    b.check(
        &format!("herd {prefix} at {boundary}: {c}/{N} runs"),
        c >= N,
    );
    let wal = b.wal_since(&lsn0).await / c.max(1) as f64;
    wal_records(b, prefix, &lsn0, c).await;
    let t = b
        .num(&format!(
            "select coalesce(max(queued_at_ms), 0) - {boundary} from qlsched.runs
              where scheduled_for_ms = {boundary} and trigger_id like '{prefix}%'"
        ))
        .await;
    // End every run of the herd (the admin's cancel: a queued run's end).
    let lsn1 = b.lsn().await;
    let ended = end_queued(b, Some(boundary)).await;
    let end_wal = b.wal_since(&lsn1).await / ended.max(1) as f64;
    let retries = g.metric_sum("qlsched_serialization_retries_total") - retries0;
    eprintln!(
        "   {prefix} herd at {boundary}: {c} runs, last committed {t:.0} ms after it, {wal:.0} B/occ, ending them {end_wal:.0} B/run, {retries:.0} serialization failures retried"
    );
    (t, wal, end_wal)
}

/// Prints where a herd's WAL went: the record kinds of `pg_waldump --stats=record` from
/// `lsn0` to now, the largest first, in bytes per occurrence (of `n`), full-page images
/// apart.
async fn wal_records(b: &Bench, prefix: &str, lsn0: &str, n: u64) {
    let end = b.lsn().await;
    let out = qlsched_testkit::pg::server_command(&b.srv.server.bindir.join("pg_waldump"), false)
        .args(["--stats=record", "-p"])
        .arg(b.srv.server.data.join("pg_wal"))
        .args(["--start", lsn0, "--end", &end])
        .output();
    let Ok(out) = out else {
        eprintln!("   {prefix}: pg_waldump did not run");
        return;
    };
    // Lines: `Heap/HOT_UPDATE  N ( p)  rec_bytes ( p)  fpi_bytes ( p)  combined ( p)`; the
    // percentages in parentheses go first.
    let pct = regex::Regex::new(r"\(\s*[0-9.]+\)").unwrap();
    let mut kinds: Vec<(f64, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = pct.replace_all(l, "");
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 5 || !f[0].contains('/') {
                return None;
            }
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
            let (count, rec, fpi) = (num(1)?, num(2)?, num(3)?);
            Some((
                (rec + fpi) / n.max(1) as f64,
                format!(
                    "{} {:.0}+{:.0} B ({:.2}/occ)",
                    f[0],
                    rec / n.max(1) as f64,
                    fpi / n.max(1) as f64,
                    count / n.max(1) as f64
                ),
            ))
        })
        .collect();
    kinds.sort_by(|a, b| b.0.total_cmp(&a.0));
    let top: Vec<String> = kinds.into_iter().take(8).map(|k| k.1).collect();
    eprintln!(
        "   {prefix} WAL per occurrence, record+FPI: {}",
        top.join("; ")
    );
}

/// Cancels the queued runs (of `boundary`, or all), 2,000 per `runs cancel` chunk; how many.
async fn end_queued(b: &Bench, boundary: Option<i64>) -> usize {
    let ids: Vec<uuid::Uuid> =
        b.su.query(
            "select run_id from qlsched.runs
              where status = 'queued' and ($1::bigint is null or scheduled_for_ms = $1)",
            &[&boundary],
        )
        .await
        .expect("runs")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut admin = b.srv.connect("qlsched_admin", "qlsched").await;
    for chunk in ids.chunks(2_000) {
        qlsched::store::runs::cancel_chunk(&mut admin, chunk)
            .await
            .expect("runs cancel");
    }
    ids.len()
}

pub async fn rows(b: &mut Bench, boundaries: usize) {
    say(&format!(
        "O. overlap: {N} `0 * * * * *` triggers under allow and {N} `30 * * * * *` under forbid, 3 replicas, {boundaries} boundaries each"
    ));
    b.reset().await;
    // QLSCHED_BENCH_OVERLAP_PRED_PAGE=N (a diagnosis, not a row): the server's
    // max_pred_locks_per_page (stock 2), i.e. how many rows of one page a SERIALIZABLE
    // transaction may read before its predicate locks become one lock on the whole page.
    if let Ok(n) = std::env::var("QLSCHED_BENCH_OVERLAP_PRED_PAGE") {
        let n: u32 = n
            .parse()
            .expect("QLSCHED_BENCH_OVERLAP_PRED_PAGE: a number");
        say(&format!("diagnosis: max_pred_locks_per_page = {n}"));
        b.exec(&format!("ALTER SYSTEM SET max_pred_locks_per_page = {n}"))
            .await;
        b.exec("SELECT pg_reload_conf()").await;
    }
    let pub_a = publish(b, "a", "0 * * * * *", OverlapPolicy::Allow, N).await;
    // QLSCHED_BENCH_OVERLAP_CONTROL=allow publishes the second herd under allow too: an A/A
    // run that measures what the half-minute phase alone costs (autovacuum, checkpoints).
    let control = std::env::var("QLSCHED_BENCH_OVERLAP_CONTROL").as_deref() == Ok("allow");
    let second = if control {
        say("control run: the second herd under allow as well");
        OverlapPolicy::Allow
    } else {
        OverlapPolicy::Forbid
    };
    let pub_f = publish(b, "f", "30 * * * * *", second, N).await;
    b.checkpoint().await;
    let mut g = Group::start(3, &Setup::default_config(&b.runtime_dsn));
    g.wait_ready().await;
    // The first allow boundary at least 20 s from now, its forbid herd 30 s later.
    let first = (now_ms() + 20_000) / 60_000 * 60_000 + 60_000;
    // Skips before the first measured herd (the occurrences due while the runs caught up at
    // start were still queued) are forbid doing its job, not part of the rows.
    // Early enough that the CHECKPOINT after it (the catch-up's runs ended, the publish's
    // pages) is over long before the first boundary: the one each herd takes 8 s before its
    // boundary then has little to write and ends before it.
    while now_ms() < first - 25_000 {
        sleep_s(0.5).await;
    }
    end_queued(b, None).await;
    b.checkpoint().await;
    let skipped_before = b
        .num("select coalesce(sum(skipped_overlap), 0) from qlsched.trigger_overlap")
        .await;
    let (mut allow, mut forbid) = (Vec::new(), Vec::new());
    for i in 0..boundaries {
        let at = first + i as i64 * 60_000;
        allow.push(herd(b, &g, "a", at).await);
        forbid.push(herd(b, &g, "f", at + 30_000).await);
    }
    g.stop().await;
    let dups = b.invariants("overlap").await;
    b.check(&format!("overlap: duplicates {dups}"), dups == 0);
    let skipped = b
        .num("select coalesce(sum(skipped_overlap), 0) from qlsched.trigger_overlap")
        .await
        - skipped_before;
    b.check(
        &format!("overlap: {skipped} occurrences skipped under forbid"),
        skipped == 0.0,
    );
    let max = |v: &[(f64, f64, f64)]| v.iter().map(|x| x.0).fold(0.0, f64::max);
    let mean = |v: &[(f64, f64, f64)], f: fn(&(f64, f64, f64)) -> f64| {
        v.iter().map(f).sum::<f64>() / v.len() as f64
    };
    let (ma, mf) = (max(&allow), max(&forbid));
    let ratio = mf / ma.max(1.0);
    let list = |v: &[(f64, f64, f64)]| {
        v.iter()
            .map(|x| format!("{:.0}", x.0))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    b.row(
        Row::new(
            "O1",
            "overlap_forbid_herd_ratio",
            format!(
                "{}{N}-trigger minute herd under forbid against the same herd under allow, alternating half minutes, same server and replicas, every run ended before its next boundary (published in {pub_a:.0} s and {pub_f:.0} s)",
                if control {
                    "CONTROL RUN, the second herd under allow too (what the phase alone costs): "
                } else {
                    ""
                }
            ),
            ratio,
            "× (slowest forbid / slowest allow)",
        )
        .lower_better()
        .detail(format!(
            "allow {} ms, forbid {} ms; duplicates {dups}; skipped {skipped}",
            list(&allow),
            list(&forbid)
        ))
        .target("≤ 1.15×", ratio <= 1.15 && dups == 0 && skipped == 0.0),
    );
    for (id, key, what, v, f) in [
        (
            "O2",
            "overlap_wal_allow",
            "allow herd",
            &allow,
            (|x: &(f64, f64, f64)| x.1) as fn(&(f64, f64, f64)) -> f64,
        ),
        ("O3", "overlap_wal_forbid", "forbid herd", &forbid, |x| x.1),
        (
            "O4",
            "overlap_wal_end_allow",
            "end of an allow run (runs cancel)",
            &allow,
            |x| x.2,
        ),
        (
            "O5",
            "overlap_wal_end_forbid",
            "end of a forbid run (runs cancel)",
            &forbid,
            |x| x.2,
        ),
    ] {
        b.row(
            Row::new(
                id,
                key,
                format!("WAL per occurrence: {what}, mean of {boundaries} boundaries"),
                mean(v, f),
                "B/occ",
            )
            .lower_better()
            .detail(
                v.iter()
                    .map(|x| format!("{:.0}", f(x)))
                    .collect::<Vec<_>>()
                    .join(" / "),
            ),
        );
    }
}
