//! `qlsched runs cancel` (issue 21 item 4): queued, untouched runs are cancelled; runs a
//! dispatcher took are left alone and counted; over `--max` nothing is written; exit codes.

use qlsched::store::dispatch::TAKE_SQL;
use qlsched::store::triggers::{backfill_chunk, fire};
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::cli::{ok, ql, refused};
use crate::helpers::TestDb;

const FROM: &str = "2026-01-01T00:00:00Z";
const TO: &str = "2026-01-01T01:00:00Z";
/// 2026-01-01T00:00:00Z in Unix ms.
const FROM_MS: i64 = 1_767_225_600_000;

/// trg-00000 (every second) with `backfill` runs at minutes 0..b and `cron` runs (admitted
/// by a replica id) at minutes 30..30+c of the window's hour.
async fn runs(db: &TestDb, b: i64, c: i64) {
    db.seed(1, "* * * * * *").await;
    let mut admin = db.admin().await;
    let at = |m: i64| FROM_MS + m * 60_000;
    let bf: Vec<i64> = (0..b).map(at).collect();
    let cr: Vec<i64> = (30..30 + c).map(at).collect();
    backfill_chunk(&mut admin, "trg-00000", 1, &bf, "backfill:test")
        .await
        .unwrap();
    backfill_chunk(&mut admin, "trg-00000", 1, &cr, "r1")
        .await
        .unwrap();
}

fn json(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test]
async fn cancel_by_run_cancels_one_untouched_run_and_a_repeat_changes_nothing() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let mut admin = db.admin().await;
    let f = fire(&mut admin, "trg-00000", "oops", "tester")
        .await
        .unwrap();
    let id = f.run_id.to_string();
    let out = json(ok(ql(&db, &["runs", "cancel", "--run", &id, "--json"])));
    assert_eq!(out["cancelled"], 1, "{out}");
    assert_eq!(db.status_counts().await, "cancelled/abandoned:1");
    let su = db.superuser().await;
    let r = su
        .query_one(
            "SELECT r.cancelled, a.finished_at_ms IS NOT NULL, e.kind
               FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)
               JOIN qlsched.run_events e ON e.run_id = r.run_id AND e.seq = 3",
            &[],
        )
        .await
        .unwrap();
    assert!(r.get::<_, bool>(0));
    assert!(r.get::<_, bool>(1));
    assert_eq!(r.get::<_, String>(2), "run.cancelled");
    let again = json(ok(ql(&db, &["runs", "cancel", "--run", &id, "--json"])));
    assert_eq!(again["cancelled"], 0);
    assert_eq!(again["already_cancelled"], 1);
    // A dispatcher never takes a cancelled run.
    let d = db.client("qlsched_dispatcher").await;
    assert!(d.query(TAKE_SQL, &[&10i64]).await.unwrap().is_empty());
    db.assert_invariants().await;
}

#[tokio::test]
async fn cancel_by_window_and_kind_leaves_other_kinds_and_taken_runs_alone_and_counts_them() {
    let db = TestDb::new().await;
    runs(&db, 10, 0).await;
    let d = db.client("qlsched_dispatcher").await;
    // Two backfill runs taken and committed; one more held by a take still in progress.
    let first: Vec<Uuid> = d
        .query(TAKE_SQL, &[&2i64])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(first.len(), 2);
    d.batch_execute("BEGIN").await.unwrap();
    assert_eq!(d.query(TAKE_SQL, &[&1i64]).await.unwrap().len(), 1);
    // Then 5 cron runs in the window, and a manual fire now (outside it).
    let mut admin = db.admin().await;
    let cron: Vec<i64> = (30..35).map(|m| FROM_MS + m * 60_000).collect();
    backfill_chunk(&mut admin, "trg-00000", 1, &cron, "r1")
        .await
        .unwrap();
    fire(&mut admin, "trg-00000", "keep", "tester")
        .await
        .unwrap();
    let out = json(ok(ql(
        &db,
        &[
            "runs",
            "cancel",
            "--trigger",
            "trg-00000",
            "--from",
            FROM,
            "--to",
            TO,
            "--kind",
            "backfill",
            "--json",
        ],
    )));
    d.batch_execute("COMMIT").await.unwrap();
    assert_eq!(out["matched"], 10, "{out}");
    assert_eq!(out["cancelled"], 7, "{out}");
    assert_eq!(out["left_alone"], 3, "2 taken + 1 being taken: {out}");
    assert_eq!(
        db.status_counts().await,
        "cancelled/abandoned:7 dispatching/dispatching:3 queued/claimed:6"
    );
    // The cron kind next, then everything: the manual run (outside the window) stays.
    let out = json(ok(ql(
        &db,
        &[
            "runs",
            "cancel",
            "--trigger",
            "trg-00000",
            "--from",
            FROM,
            "--to",
            TO,
            "--kind",
            "cron",
            "--json",
        ],
    )));
    assert_eq!(out["cancelled"], 5, "{out}");
    let text = ok(ql(
        &db,
        &[
            "runs",
            "cancel",
            "--trigger",
            "trg-00000",
            "--from",
            FROM,
            "--to",
            TO,
        ],
    ));
    assert!(
        text.contains(
            "15 matched, 0 cancelled, 3 left alone (taken by a dispatcher), 12 already cancelled"
        ),
        "{text}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'queued' AND idempotency_key LIKE 'ql3:manual:%'")
            .await,
        1
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn over_max_refuses_before_writing_anything() {
    let db = TestDb::new().await;
    runs(&db, 10, 0).await;
    let snapshot = "SELECT sum(hashtext(x::text)) FROM (SELECT r, a FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)) x";
    let before = db.count(snapshot).await;
    refused(
        ql(
            &db,
            &[
                "runs",
                "cancel",
                "--trigger",
                "trg-00000",
                "--from",
                FROM,
                "--to",
                TO,
                "--max",
                "9",
            ],
        ),
        2,
        &["more than 9 queued runs match (--max 9); nothing was written"],
    );
    assert_eq!(db.count(snapshot).await, before);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.run_events").await,
        20
    );
    // Exactly --max is fine.
    let out = json(ok(ql(
        &db,
        &[
            "runs",
            "cancel",
            "--trigger",
            "trg-00000",
            "--from",
            FROM,
            "--to",
            TO,
            "--max",
            "10",
            "--json",
        ],
    )));
    assert_eq!(out["cancelled"], 10);
    db.assert_invariants().await;
}

#[tokio::test]
async fn exit_codes_name_bad_input_unknown_ids_and_a_taken_run() {
    let db = TestDb::new().await;
    runs(&db, 1, 0).await;
    let unknown = Uuid::new_v4().to_string();
    refused(
        ql(&db, &["runs", "cancel", "--run", &unknown]),
        3,
        &[&unknown],
    );
    refused(
        ql(
            &db,
            &[
                "runs",
                "cancel",
                "--trigger",
                "nope",
                "--from",
                FROM,
                "--to",
                TO,
            ],
        ),
        3,
        &["trigger nope does not exist"],
    );
    refused(
        ql(&db, &["runs", "cancel", "--run", "not-a-uuid"]),
        2,
        &["not-a-uuid"],
    );
    refused(
        ql(
            &db,
            &[
                "runs",
                "cancel",
                "--trigger",
                "trg-00000",
                "--from",
                TO,
                "--to",
                FROM,
            ],
        ),
        2,
        &["is not before"],
    );
    refused(
        ql(
            &db,
            &[
                "runs",
                "cancel",
                "--trigger",
                "trg-00000",
                "--from",
                "yesterday",
                "--to",
                TO,
            ],
        ),
        2,
        &["yesterday"],
    );
    refused(
        ql(
            &db,
            &[
                "runs",
                "cancel",
                "--trigger",
                "trg-00000",
                "--from",
                FROM,
                "--to",
                TO,
                "--max",
                "0",
            ],
        ),
        2,
        &["--max 0"],
    );
    refused(ql(&db, &["runs", "cancel"]), 2, &[]);
    let d = db.client("qlsched_dispatcher").await;
    let taken: Uuid = d.query_one(TAKE_SQL, &[&1i64]).await.unwrap().get(0);
    let id = taken.to_string();
    refused(
        ql(&db, &["runs", "cancel", "--run", &id]),
        4,
        &["taken by a dispatcher", "nothing was written"],
    );
    assert_eq!(db.status_counts().await, "dispatching/dispatching:1");
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_cancel_racing_two_dispatchers_never_cancels_a_taken_run() {
    let db = TestDb::new().await;
    runs(&db, 60, 0).await;
    // 140 more instants, none on a whole minute (those have runs already).
    let more: Vec<i64> = (1..)
        .filter(|s| s % 60 != 0)
        .take(140)
        .map(|s| FROM_MS + 1_000 * s)
        .collect();
    backfill_chunk(
        &mut db.admin().await,
        "trg-00000",
        1,
        &more,
        "backfill:test",
    )
    .await
    .unwrap();
    let dispatch = |db: TestDb| async move {
        let c = db.client("qlsched_dispatcher").await;
        let mut n = 0usize;
        loop {
            let t = c.query(TAKE_SQL, &[&3i64]).await.unwrap().len();
            if t == 0 {
                return n;
            }
            n += t;
        }
    };
    let (d1, d2) = (
        tokio::spawn(dispatch(db.clone())),
        tokio::spawn(dispatch(db.clone())),
    );
    let cli_db = db.clone();
    let cancel = tokio::task::spawn_blocking(move || {
        ok(ql(
            &cli_db,
            &[
                "runs",
                "cancel",
                "--trigger",
                "trg-00000",
                "--from",
                FROM,
                "--to",
                TO,
                "--json",
            ],
        ))
    });
    let (taken, out) = (
        d1.await.unwrap() + d2.await.unwrap(),
        json(cancel.await.unwrap()),
    );
    let cancelled = out["cancelled"].as_i64().unwrap();
    assert_eq!(out["matched"], 200, "{out}");
    assert_eq!(
        cancelled + out["left_alone"].as_i64().unwrap(),
        200,
        "{out}"
    );
    assert_eq!(
        taken as i64 + cancelled,
        200,
        "every run taken or cancelled, not both"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'cancelled'")
            .await,
        cancelled
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'dispatching'")
            .await,
        taken as i64
    );
    db.assert_invariants().await;
}
