//! `qlsched status`: admissions and lag per kind of run (cron, manual, backfill), so a
//! backfill's hours-old occurrences or an operator's fire never show as cron lag.

use std::time::Duration;

use crate::helpers::cli::{ok, ql};
use crate::helpers::iso;
use crate::helpers::replica::ReplicaProc;
use crate::helpers::{wait_until, TestDb};

/// A replica admits a few every-second occurrences (lag: milliseconds); then a backfill of
/// the ten minutes before them (lag: up to ten minutes) and two manual fires. The cron lag
/// stays the replica's, each kind counts only its own admissions, and the text names them.
#[tokio::test]
async fn status_splits_admissions_and_lag_by_cron_manual_and_backfill() {
    let db = TestDb::new().await;
    let id = db.seed(1, "* * * * * *").await.remove(0);
    let mut a = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "st", "", &[]);
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until("3 cron runs", Duration::from_secs(30), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 3
    })
    .await;
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    let (first, cron) = {
        let r = db
            .superuser()
            .await
            .query_one(
                "SELECT min(scheduled_for_ms), count(*), max(queued_at_ms - scheduled_for_ms)
                   FROM qlsched.runs",
                &[],
            )
            .await
            .unwrap();
        let worst: i64 = r.get(2);
        assert!(worst < 5_000, "the replica itself admitted {worst} ms late");
        (r.get::<_, i64>(0), r.get::<_, i64>(1))
    };
    // 600 whole seconds before the first cron occurrence: [first - 600 s, first).
    ok(ql(
        &db,
        &[
            "trigger",
            "backfill",
            &id,
            "--from",
            &iso(first - 600_000),
            "--to",
            &iso(first - 1),
        ],
    ));
    for req in ["st-1", "st-2"] {
        ok(ql(&db, &["trigger", "fire", &id, "--request-id", req]));
    }
    let json = ok(ql(&db, &["status", "--json", "--last", "1000"]));
    let s: serde_json::Value = serde_json::from_str(&json).unwrap();
    let k = &s["by_kind"];
    let num = |v: &serde_json::Value| {
        v.as_f64()
            .unwrap_or_else(|| panic!("not a number: {v} in {json}"))
    };
    assert_eq!(num(&k["cron"]["lag_sample"]) as i64, cron, "{json}");
    assert!(num(&k["cron"]["lag_p99_ms"]) < 5_000.0, "{json}");
    assert_eq!(num(&k["backfill"]["lag_sample"]), 600.0, "{json}");
    assert!(num(&k["backfill"]["lag_p50_ms"]) > 240_000.0, "{json}");
    assert_eq!(num(&k["manual"]["lag_sample"]), 2.0, "{json}");
    assert_eq!(num(&k["manual"]["admitted_last_minute"]), 2.0, "{json}");
    assert_eq!(num(&k["backfill"]["admitted_last_minute"]), 600.0, "{json}");
    // The replica's runs are seconds old: all (or, on a slow machine, some) in the minute.
    assert!(
        num(&k["cron"]["admitted_last_minute"]) <= cron as f64,
        "{json}"
    );

    // The console's bounded read (the newest admissions read once, shared by the kinds)
    // gives what the unbounded one gives when the bound covers every run …
    let su = db.superuser().await;
    let by_kind = |s: qlsched::store::status::Status| serde_json::to_value(s.by_kind).unwrap();
    let unbounded = qlsched::store::status::read(&su, 1000).await.unwrap();
    let bounded = qlsched::store::status::read_bounded(&su, 1000, Some(20_000))
        .await
        .unwrap();
    assert_eq!(by_kind(bounded), by_kind(unbounded));
    // … and with a bound of 5, the lag covers the 5 newest: the 2 fires and 3 of the backfill.
    let tight = qlsched::store::status::read_bounded(&su, 1000, Some(5))
        .await
        .unwrap()
        .by_kind;
    assert_eq!(
        (
            tight.manual.lag_sample,
            tight.backfill.lag_sample,
            tight.cron.lag_sample
        ),
        (2, 3, 0)
    );
    assert_eq!(tight.backfill.admitted_last_minute, 600);

    let text = ok(ql(&db, &["status"]));
    for (kind, sample) in [("cron", cron), ("manual", 2), ("backfill", 600)] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(kind)
                && l.trim_end().ends_with(&format!("over {sample} runs"))),
            "no `{kind}` line over {sample} runs:\n{text}"
        );
    }
}
