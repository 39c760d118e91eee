//! Operator trigger management through the real binary (`qlsched trigger list | show |
//! disable | enable | delete | fire | backfill`), on a real PostgreSQL, with replicas
//! running where the guarantee is about concurrency with the cron.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use qlsched::schedule::MisfirePolicy;
use qlsched::store::manage::{self, TriggerSpec};
use qlsched::store::triggers;

use crate::helpers::cli::{command, ok, ql, refused, stderr, stdout};
use crate::helpers::replica::{binary, ReplicaProc};
use crate::helpers::{iso, wait_until, RunsLock, TestDb};

fn ql_env(db: &TestDb, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = command(db, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run qlsched")
}

async fn runs_of(db: &TestDb, trigger: &str) -> i64 {
    db.superuser()
        .await
        .query_one(
            "SELECT count(*) FROM qlsched.runs WHERE trigger_id = $1",
            &[&trigger],
        )
        .await
        .unwrap()
        .get(0)
}

/// Runs of `trigger` matching an extra SQL condition on `r` (e.g. `r.queued_at_ms > $2`).
async fn runs_where(db: &TestDb, trigger: &str, cond: &str, v: i64) -> i64 {
    db.superuser()
        .await
        .query_one(
            &format!("SELECT count(*) FROM qlsched.runs r WHERE r.trigger_id = $1 AND {cond}"),
            &[&trigger, &v],
        )
        .await
        .unwrap()
        .get(0)
}

fn replica(db: &TestDb, id: &str) -> ReplicaProc {
    ReplicaProc::spawn(&db.dsn("qlsched_runtime"), id, "", &[])
}

#[tokio::test]
async fn list_pages_by_id_shows_state_with_the_note_and_hides_deleted_triggers() {
    let db = TestDb::new().await;
    db.seed(5, "0 3 * * *").await;
    let mut admin = db.admin().await;
    let mut berlin = TriggerSpec::new("trg-00001", "proj", "task", "30 2 * * *", "Europe/Berlin");
    berlin.misfire_policy = MisfirePolicy::FireOnce;
    manage::publish_trigger(&mut admin, &berlin).await.unwrap();
    ok(ql(
        &db,
        &["trigger", "disable", "trg-00002", "--note", "incident 42"],
    ));
    ok(ql(&db, &["trigger", "delete", "trg-00004"]));
    let again: serde_json::Value =
        serde_json::from_str(&ok(ql(&db, &["trigger", "disable", "trg-00002", "--json"]))).unwrap();
    assert_eq!(again["changed"], false, "{again}");
    assert_eq!(again["state"], "disabled", "{again}");

    let page1: serde_json::Value =
        serde_json::from_str(&ok(ql(&db, &["trigger", "list", "--json", "--limit", "2"]))).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["triggers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["trigger_id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&page1), ["trg-00000", "trg-00001"]);
    assert_eq!(page1["next_after"], "trg-00001");
    assert_eq!(page1["triggers"][1]["timezone"], "Europe/Berlin");
    assert!(
        page1["triggers"][1]["next_fire_local"]
            .as_str()
            .unwrap()
            .contains(":30:00 CE"),
        "{page1}"
    );
    let page2: serde_json::Value = serde_json::from_str(&ok(ql(
        &db,
        &[
            "trigger",
            "list",
            "--json",
            "--limit",
            "2",
            "--after",
            "trg-00001",
        ],
    )))
    .unwrap();
    assert_eq!(
        ids(&page2),
        ["trg-00002", "trg-00003"],
        "deleted trg-00004 is gone"
    );
    let disabled: serde_json::Value = serde_json::from_str(&ok(ql(
        &db,
        &["trigger", "list", "--json", "--state", "disabled"],
    )))
    .unwrap();
    assert_eq!(ids(&disabled), ["trg-00002"]);
    assert_eq!(disabled["triggers"][0]["disabled_note"], "incident 42");
    assert_eq!(
        disabled["triggers"][0]["disabled_by"],
        "tester via qlsched_admin"
    );
    assert_eq!(disabled["next_after"], serde_json::Value::Null);
    let none: serde_json::Value = serde_json::from_str(&ok(ql(
        &db,
        &["trigger", "list", "--json", "--project", "other"],
    )))
    .unwrap();
    assert_eq!(ids(&none), Vec::<String>::new());

    let table = ok(ql(&db, &["trigger", "list"]));
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("NEXT (LOCAL)"),
        "{table}"
    );
    assert_eq!(lines.len(), 5, "header + 4 live triggers: {table}");
    assert!(table.contains("incident 42"), "{table}");
    assert!(!table.contains("trg-00004"), "{table}");
}

/// 100,000 triggers: the page query walks the primary key (or the project index) and
/// stops at the page size; nothing scans or sorts the trigger or schedule table.
#[tokio::test]
async fn listing_100000_triggers_is_an_index_scan_that_stops_at_the_page() {
    // Seeding 100,000 rows loads both cores: not alongside the timing-sensitive drills.
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    db.seed_bulk(100_000, "* * * * *", 60_000).await;
    let su = db.superuser().await;
    let explain = format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {}",
        triggers::LIST_SQL
    );
    for (project, after) in [
        (None::<&str>, None::<&str>),
        (None, Some("trg-50000")),
        (Some("proj"), Some("trg-99000")),
    ] {
        let plan = crate::helpers::plan(&su, &explain, &[&project, &"all", &after, &100i64]).await;
        assert!(
            plan.contains("Index Scan using triggers_pkey on triggers")
                || plan.contains("Index Scan using triggers_project_page_idx on triggers"),
            "{plan}"
        );
        // (`projects` and the empty `runs` may be read sequentially: one row, none.)
        assert!(!plan.contains("Seq Scan on triggers"), "{plan}");
        assert!(!plan.contains("Seq Scan on trigger_schedules"), "{plan}");
        assert!(!plan.contains("Sort Key: t.trigger_id"), "{plan}");
        let limit_rows = plan
            .lines()
            .find(|l| l.trim_start().starts_with("Limit"))
            .unwrap_or_default()
            .to_string();
        // PostgreSQL 18 prints actual rows with two decimals (`rows=100.00`).
        assert!(
            limit_rows.contains("rows=100 ") || limit_rows.contains("rows=100.00 "),
            "{plan}"
        );
    }
}

#[tokio::test]
async fn show_prints_definition_state_claim_upcoming_occurrences_and_last_runs() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    manage::publish_trigger(
        &mut admin,
        &TriggerSpec::new("nightly", "proj", "task", "30 2 * * *", "Europe/Berlin"),
    )
    .await
    .unwrap();
    ok(ql(
        &db,
        &["trigger", "fire", "nightly", "--request-id", "r1"],
    ));
    let text = ok(ql(&db, &["trigger", "show", "nightly", "--count", "3"]));
    assert!(text.contains("nightly (revision 1)"), "{text}");
    assert!(text.contains("30 2 * * *  in Europe/Berlin"), "{text}");
    assert!(text.contains("next 3 occurrences:"), "{text}");
    assert!(
        text.contains("CET (+01:00)") || text.contains("CEST (+02:00)"),
        "{text}"
    );
    assert!(text.contains("last 1 runs:"), "{text}");
    assert!(text.contains("ql3:manual:v2:nightly:r1"), "{text}");
    let j: serde_json::Value =
        serde_json::from_str(&ok(ql(&db, &["trigger", "show", "nightly", "--json"]))).unwrap();
    assert_eq!(j["revision"], 1);
    assert_eq!(j["upcoming"].as_array().unwrap().len(), 5);
    assert_eq!(j["held"], false);
    ok(ql(
        &db,
        &[
            "trigger",
            "disable",
            "nightly",
            "--note",
            "db migration",
            "--actor",
            "alice",
        ],
    ));
    let text = ok(ql(&db, &["trigger", "show", "nightly"]));
    assert!(
        text.contains("by alice via qlsched_admin: db migration"),
        "{text}"
    );
    assert!(text.contains("next 0 occurrences:"), "{text}");
}

/// A replica holds the claim and its admission is in flight (waiting on a lock); `disable`
/// returns; once the admission may proceed it commits nothing for the disabled trigger,
/// while the replica keeps admitting the other trigger.
#[tokio::test]
async fn disable_fences_a_held_claim_so_no_run_is_admitted_after_it_returns() {
    let db = TestDb::new().await;
    db.seed(2, "* * * * * *").await;
    let (target, canary) = ("trg-00000", "trg-00001");
    let mut a = replica(&db, "a");
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until("a run of the target", Duration::from_secs(30), || async {
        runs_of(&db, target).await >= 1
    })
    .await;
    let lock = RunsLock::take(&db).await;
    wait_until(
        "the replica to hold the target's claim with its admission waiting",
        Duration::from_secs(30),
        || async {
            db.lock_waiters().await >= 1
                && db
                    .count("SELECT count(*) FROM qlsched.trigger_schedules WHERE trigger_id = 'trg-00000' AND claim_owner = 'a'")
                    .await
                    == 1
        },
    )
    .await;
    let before = runs_of(&db, target).await;
    ok(ql(
        &db,
        &["trigger", "disable", target, "--note", "fence test"],
    ));
    let returned_at = db.now_ms().await;
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE trigger_id = 'trg-00000' AND claim_owner IS NULL AND claimable_at_ms IS NULL")
            .await,
        1,
        "the claim is cleared and the row left the claim index"
    );
    lock.release().await;
    wait_until(
        "3 canary runs admitted after the disable",
        Duration::from_secs(30),
        || async { runs_where(&db, canary, "r.queued_at_ms > $2", returned_at).await >= 3 },
    )
    .await;
    assert_eq!(
        runs_of(&db, target).await,
        before,
        "a run after disable returned"
    );
    assert_eq!(
        runs_where(&db, target, "r.queued_at_ms > $2", returned_at).await,
        0
    );
    // Repeating it is a no-op.
    let again = ok(ql(&db, &["trigger", "disable", target]));
    assert!(again.contains("already disabled"), "{again}");
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    db.assert_invariants().await;
}

/// A fire_once trigger disabled for a few seconds: enabling starts at the first occurrence
/// after now; nothing of the disabled span is admitted.
#[tokio::test]
async fn enable_starts_after_now_and_never_replays_the_disabled_span() {
    let db = TestDb::new().await;
    db.seed(2, "* * * * * *").await;
    let (target, canary) = ("trg-00000", "trg-00001");
    let mut admin = db.admin().await;
    let mut spec = TriggerSpec::new(target, "proj", "task", "* * * * * *", "UTC");
    spec.misfire_policy = MisfirePolicy::FireOnce;
    manage::publish_trigger(&mut admin, &spec).await.unwrap();
    let mut a = replica(&db, "a");
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until("2 runs of the target", Duration::from_secs(30), || async {
        runs_of(&db, target).await >= 2
    })
    .await;
    ok(ql(&db, &["trigger", "disable", target]));
    let disabled_at = db.now_ms().await;
    wait_until(
        "the canary to pass 3 s of the disabled span",
        Duration::from_secs(30),
        || async {
            runs_where(&db, canary, "r.scheduled_for_ms > $2", disabled_at + 3_000).await >= 1
        },
    )
    .await;
    let out = ok(ql(&db, &["trigger", "enable", target]));
    assert!(out.contains("trigger trg-00000 enabled"), "{out}");
    let enabled_at = db.now_ms().await;
    wait_until(
        "a run of the target after enable",
        Duration::from_secs(30),
        || async { runs_where(&db, target, "r.queued_at_ms > $2", enabled_at).await >= 2 },
    )
    .await;
    assert_eq!(
        db.superuser()
            .await
            .query_one(
                "SELECT count(*) FROM qlsched.runs WHERE trigger_id = $1
                    AND scheduled_for_ms > $2 AND scheduled_for_ms <= $3",
                &[&target, &disabled_at, &enabled_at],
            )
            .await
            .unwrap()
            .get::<_, i64>(0),
        0,
        "an occurrence of the disabled span was admitted"
    );
    let again = ok(ql(&db, &["trigger", "enable", target]));
    assert!(again.contains("already enabled"), "{again}");
    let shown = ok(ql(&db, &["trigger", "show", target]));
    assert!(shown.contains("last enable"), "{shown}");
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    db.assert_invariants().await;
}

#[tokio::test]
async fn fire_twice_with_one_request_id_admits_one_run_while_a_replica_runs() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let id = "trg-00000";
    let mut a = replica(&db, "a");
    a.wait_ready(Duration::from_secs(30)).await;
    let first: serde_json::Value = serde_json::from_str(&ok(ql(
        &db,
        &["trigger", "fire", id, "--request-id", "deploy-7", "--json"],
    )))
    .unwrap();
    assert_eq!(first["admitted"], true);
    assert_eq!(first["idempotency_key"], "ql3:manual:v2:trg-00000:deploy-7");
    let second = ok(ql(
        &db,
        &["trigger", "fire", id, "--request-id", "deploy-7"],
    ));
    assert!(second.contains("already fired"), "{second}");
    assert!(
        second.contains(first["run_id"].as_str().unwrap()),
        "the same run: {second}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE request_id = 'deploy-7'")
            .await,
        1
    );
    // Without a request id: a random one, printed, and a second run.
    let random = ok(ql(&db, &["trigger", "fire", id]));
    assert!(random.contains("(request id "), "{random}");
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE request_id IS NOT NULL")
            .await,
        2
    );
    // A manual run is a complete admission: queued, a claimed attempt, both events.
    assert_eq!(
        db.count(
            "SELECT count(*) FROM qlsched.runs r JOIN qlsched.attempts t USING (run_id)
              WHERE r.request_id = 'deploy-7' AND r.status = 'queued' AND t.state = 'claimed'
                AND r.admitted_by = 'fire:tester via qlsched_admin'"
        )
        .await,
        1
    );
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    db.assert_invariants().await;
}

#[tokio::test]
async fn delete_drops_the_trigger_from_list_for_good_and_keeps_its_runs_readable() {
    let db = TestDb::new().await;
    db.seed(2, "* * * * * *").await;
    ok(ql(
        &db,
        &["trigger", "fire", "trg-00000", "--request-id", "a"],
    ));
    ok(ql(
        &db,
        &["trigger", "fire", "trg-00000", "--request-id", "b"],
    ));
    ok(ql(&db, &["trigger", "delete", "trg-00000"]));
    let again = ok(ql(&db, &["trigger", "delete", "trg-00000"]));
    assert!(again.contains("already deleted"), "{again}");
    let list = ok(ql(&db, &["trigger", "list"]));
    assert!(
        !list.contains("trg-00000") && list.contains("trg-00001"),
        "{list}"
    );
    let runs = ok(ql(&db, &["runs", "list", "--trigger", "trg-00000"]));
    assert_eq!(runs.lines().count(), 2, "{runs}");
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE trigger_id = 'trg-00000' AND claimable_at_ms IS NULL")
            .await,
        1,
        "never claimed again"
    );
    let shown = ok(ql(&db, &["trigger", "show", "trg-00000"]));
    assert!(shown.contains("deleted"), "{shown}");
    // Refused from now on: fire, enable, disable, backfill and a republish of the id.
    refused(
        ql(&db, &["trigger", "fire", "trg-00000"]),
        4,
        &["trg-00000 was deleted"],
    );
    refused(
        ql(&db, &["trigger", "enable", "trg-00000"]),
        4,
        &["trg-00000 was deleted"],
    );
    refused(
        ql(&db, &["trigger", "disable", "trg-00000"]),
        4,
        &["trg-00000 was deleted"],
    );
    refused(
        ql(
            &db,
            &[
                "trigger",
                "backfill",
                "trg-00000",
                "--from",
                "2026-01-01T00:00:00Z",
                "--to",
                "2026-01-01T00:00:10Z",
            ],
        ),
        4,
        &["trg-00000 was deleted"],
    );
    refused(
        ql(
            &db,
            &[
                "trigger",
                "publish",
                "--id",
                "trg-00000",
                "--project",
                "proj",
                "--task",
                "task",
                "--cron",
                "* * * * *",
            ],
        ),
        4,
        &["never reused"],
    );
}

/// Cron has admitted the recent part of a window; backfill adds exactly the earlier,
/// missing occurrences, concurrently with the running replica, with no duplicate.
#[tokio::test]
async fn backfill_over_a_window_cron_partly_admitted_adds_only_the_missing_ones() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let id = "trg-00000";
    let mut a = replica(&db, "a");
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until("3 cron runs", Duration::from_secs(30), || async {
        runs_of(&db, id).await >= 3
    })
    .await;
    let (first_cron, last_cron) = {
        let r = db
            .superuser()
            .await
            .query_one(
                "SELECT min(scheduled_for_ms), max(scheduled_for_ms) FROM qlsched.runs",
                &[],
            )
            .await
            .unwrap();
        (r.get::<_, i64>(0), r.get::<_, i64>(1))
    };
    let from = first_cron - 20_000;
    let to = last_cron + 1;
    let cron_in_window = runs_where(&db, id, "r.scheduled_for_ms <= $2", last_cron).await;
    let out: serde_json::Value = serde_json::from_str(&ok(ql(
        &db,
        &[
            "trigger",
            "backfill",
            id,
            "--from",
            &iso(from),
            "--to",
            &iso(to),
            "--json",
            "--chunk",
            "7",
        ],
    )))
    .unwrap();
    let expected = (to - from + 999) / 1000;
    assert_eq!(out["occurrences"], expected);
    assert_eq!(out["admitted"], 20, "{out}");
    assert_eq!(out["already_existed"], cron_in_window, "{out}");
    assert_eq!(
        db.superuser()
            .await
            .query_one(
                "SELECT count(*) FROM qlsched.runs WHERE scheduled_for_ms >= $1 AND scheduled_for_ms < $2",
                &[&from, &to],
            )
            .await
            .unwrap()
            .get::<_, i64>(0),
        expected
    );
    // Running it again admits nothing.
    let again = ok(ql(
        &db,
        &[
            "trigger",
            "backfill",
            id,
            "--from",
            &iso(from),
            "--to",
            &iso(to),
        ],
    ));
    assert!(again.contains(" 0 admitted"), "{again}");
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    db.assert_invariants().await;
}

/// A backfill of 1,000 occurrences in chunks of 100 is held in its sixth chunk (an
/// uncommitted run with one of its keys) and SIGKILLed there: five whole chunks are
/// committed and nothing else; run again it completes, with no duplicate.
#[tokio::test]
async fn a_backfill_killed_half_way_and_run_again_completes_without_duplicates() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let id = "trg-00000";
    let mut a = replica(&db, "a");
    a.wait_ready(Duration::from_secs(30)).await;
    let from = (db.now_ms().await / 1000 - 2_000) * 1000;
    let to = from + 1_000_000;
    let (from_s, to_s) = (iso(from), iso(to));
    let blocked_at = from + 550_000;
    let blocker = db.superuser().await;
    blocker
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                                       execution_revision_id, idempotency_key, scheduled_for_ms, admitted_by)
             SELECT gen_random_uuid(), 'proj', '{id}', 1, 'task', 1, execution_revision_id,
                    'ql3:cron:v1:{id}:1:{blocked_at}', {blocked_at}, 'blocker' FROM qlsched.tasks"
        ))
        .await
        .unwrap();
    let mut child = Command::new(binary())
        .args([
            "trigger", "backfill", id, "--from", &from_s, "--to", &to_s, "--chunk", "100",
        ])
        .env("QLSCHED_DSN", db.dsn("qlsched_admin"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "the backfill to wait in its sixth chunk",
        Duration::from_secs(30),
        || async { db.lock_waiters().await >= 1 },
    )
    .await;
    let in_window = "SELECT count(*) FROM qlsched.runs WHERE admitted_by LIKE 'backfill:%'";
    assert_eq!(db.count(in_window).await, 500, "five whole chunks");
    child.kill().unwrap();
    child.wait().unwrap();
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        db.count(in_window).await,
        500,
        "nothing of the killed chunk"
    );
    db.assert_invariants().await;

    let out: serde_json::Value = serde_json::from_str(&ok(ql(
        &db,
        &[
            "trigger", "backfill", id, "--from", &from_s, "--to", &to_s, "--json",
        ],
    )))
    .unwrap();
    assert_eq!(out["admitted"], 500, "{out}");
    assert_eq!(out["already_existed"], 500, "{out}");
    assert_eq!(db.count(in_window).await, 1_000);
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    db.assert_invariants().await;
}

/// Where a refused command is pointed: the admin DSN, no DSN at all, or another one.
enum Dsn {
    Admin,
    Unset,
    Given(&'static str),
}

/// One refusal: the command, its target, the exit code and what stderr must name.
struct Refusal {
    args: Vec<String>,
    dsn: Dsn,
    code: i32,
    names: String,
}

fn refusal(args: &[&str], code: i32, names: &str) -> Refusal {
    Refusal {
        args: args.iter().map(|a| a.to_string()).collect(),
        dsn: Dsn::Admin,
        code,
        names: names.into(),
    }
}

/// Everything a trigger command could write (definitions, schedules, projects, runs), as one
/// digest.
async fn written_state(db: &TestDb) -> String {
    db.superuser()
        .await
        .query_one(
            "SELECT md5(concat_ws('|',
                (SELECT string_agg(t::text, ',' ORDER BY trigger_id) FROM qlsched.triggers t),
                (SELECT string_agg(s::text, ',' ORDER BY trigger_id) FROM qlsched.trigger_schedules s),
                (SELECT string_agg(p::text, ',' ORDER BY project_id) FROM qlsched.projects p),
                (SELECT count(*) FROM qlsched.runs)))",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Runs every case and asserts its exit code, the culprit named on stderr, and that the
/// database is exactly as before it.
async fn assert_each_refused_writing_nothing(db: &TestDb, cases: &[Refusal]) {
    for c in cases {
        let before = written_state(db).await;
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let out = match c.dsn {
            Dsn::Admin => ql(db, &args),
            Dsn::Given(dsn) => ql_env(db, &args, &[("QLSCHED_DSN", dsn)]),
            Dsn::Unset => Command::new(binary())
                .args(&args)
                .env_remove("QLSCHED_DSN")
                .output()
                .unwrap(),
        };
        let err = stderr(&out);
        let shown = format!("`qlsched {}`", args.join(" "));
        assert_eq!(
            out.status.code(),
            Some(c.code),
            "{shown}\nstderr: {err}\nstdout: {}",
            stdout(&out)
        );
        assert!(
            err.contains(&c.names),
            "{shown}: stderr lacks `{}`: {err}",
            c.names
        );
        assert_eq!(written_state(db).await, before, "{shown} wrote something");
    }
}

/// Every refusal: its exit code (2 bad argument, 3 unknown trigger, 4 refused by state, 1
/// unreachable database), the argument or id named, nothing written.
#[tokio::test]
async fn every_refusal_exits_with_its_code_names_the_culprit_and_writes_nothing() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let id = "trg-00000";
    let (t0, t1) = ("2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z");
    let backfill = |extra: &[&str]| -> Vec<String> {
        ["trigger", "backfill", id]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect()
    };
    let long_note = "n".repeat(1001);
    let long_actor = "w".repeat(101);
    let mut by_argument_or_id = vec![];
    for cmd in ["show", "disable", "enable", "delete", "fire"] {
        by_argument_or_id.push(refusal(
            &["trigger", cmd, "nope"],
            3,
            "unknown trigger `nope`",
        ));
    }
    by_argument_or_id.extend([
        refusal(
            &["trigger", "backfill", "nope", "--from", t0, "--to", t1],
            3,
            "unknown trigger `nope`",
        ),
        Refusal {
            args: backfill(&["--from", t1, "--to", t0]),
            ..refusal(&[], 2, "--from")
        },
        Refusal {
            args: backfill(&["--from", "yesterday", "--to", t0]),
            ..refusal(&[], 2, "--from `yesterday`")
        },
        Refusal {
            args: backfill(&["--from", t0, "--to", "2026-13-01"]),
            ..refusal(&[], 2, "--to `2026-13-01`")
        },
        Refusal {
            args: backfill(&["--from", t0, "--to", t1]),
            ..refusal(&[], 2, "--max 1000")
        },
        Refusal {
            args: backfill(&["--from", t0, "--to", t1, "--max", "100001"]),
            ..refusal(&[], 2, "--max 100001")
        },
        Refusal {
            args: backfill(&["--from", t0, "--to", "2999-01-01T00:00:00Z"]),
            ..refusal(&[], 2, "--to 2999-01-01T00:00:00Z is in the future")
        },
        refusal(
            &["trigger", "fire", id, "--request-id", "a b"],
            2,
            "--request-id `a b`",
        ),
        refusal(&["trigger", "list", "--limit", "0"], 2, "--limit 0"),
        refusal(
            &["trigger", "disable", id, "--note", &long_note],
            2,
            "--note: 1001 characters",
        ),
        refusal(
            &["trigger", "disable", id, "--actor", &long_actor],
            2,
            "--actor: 101 characters",
        ),
        refusal(
            &[
                "trigger",
                "publish",
                "--id",
                "old",
                "--project",
                "proj",
                "--task",
                "task",
                "--cron",
                "0 0 0 1 1 ? 2020",
            ],
            2,
            "no occurrence after now",
        ),
        Refusal {
            dsn: Dsn::Unset,
            ..refusal(&["trigger", "list"], 2, "QLSCHED_DSN")
        },
        Refusal {
            dsn: Dsn::Given("host=127.0.0.1 port=1 user=x dbname=y connect_timeout=2"),
            ..refusal(
                &["trigger", "list"],
                1,
                "cannot reach the database at 127.0.0.1:1",
            )
        },
    ]);
    assert_each_refused_writing_nothing(&db, &by_argument_or_id).await;

    // Refused by state: a disabled trigger is neither fired nor backfilled.
    ok(ql(&db, &["trigger", "disable", id]));
    let by_state = [
        refusal(&["trigger", "fire", id], 4, "trg-00000 is disabled"),
        Refusal {
            args: backfill(&["--from", t0, "--to", t1, "--max", "5000"]),
            ..refusal(&[], 4, "trg-00000 is disabled")
        },
    ];
    assert_each_refused_writing_nothing(&db, &by_state).await;
}

/// A role with a real password (scram, via a pg_hba line for it alone): the password is
/// taken from `--password-file`, `PGPASSWORD` or a passfile; a DSN password works but
/// warns; a wrong or missing password fails naming the host; no output shows a password.
#[tokio::test]
async fn credentials_come_from_a_file_the_environment_or_a_passfile_and_are_never_printed() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    let role = format!("pw_{}", db.name);
    let secret = "s3cret-not-for-logs";
    su.batch_execute(&format!(
        "SET password_encryption = 'scram-sha-256';
         CREATE ROLE {role} LOGIN PASSWORD '{secret}' IN ROLE qlsched_admin;
         GRANT CONNECT ON DATABASE {} TO {role}",
        db.name
    ))
    .await
    .unwrap();
    let hba = crate::helpers::cluster().root.join("data/pg_hba.conf");
    let old = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all {role} 127.0.0.1/32 scram-sha-256\n{old}"),
    )
    .unwrap();
    su.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let dsn = format!(
        "host=127.0.0.1 port={} user={role} dbname={}",
        db.port, db.name
    );
    let list = |env: &[(&str, &str)], extra: &[&str]| {
        let mut args = vec!["trigger", "list"];
        args.extend_from_slice(extra);
        let mut all = vec![("QLSCHED_DSN", dsn.as_str())];
        all.extend_from_slice(env);
        ql_env(&db, &args, &all)
    };
    wait_until(
        "pg_hba to require a password",
        Duration::from_secs(10),
        || async { !list(&[], &[]).status.success() },
    )
    .await;
    let no_pw = refused(list(&[], &[]), 1, &[&format!("127.0.0.1:{}", db.port)]);
    assert!(no_pw.contains("password"), "{no_pw}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    // libpq's passfile rule: no access for group or others.
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut outputs = vec![ok_output(list(
        &[],
        &["--password-file", file.to_str().unwrap()],
    ))];
    outputs.push(ok_output(list(&[("PGPASSWORD", secret)], &[])));
    let pass = dir.path().join("pgpass");
    std::fs::write(
        &pass,
        format!("127.0.0.1:{}:{}:{role}:{secret}\n", db.port, db.name),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o600)).unwrap();
    outputs.push(ok_output(list(
        &[("PGPASSFILE", pass.to_str().unwrap())],
        &[],
    )));
    let in_dsn = format!("{dsn} password={secret}");
    let warned = ql_env(&db, &["trigger", "list"], &[("QLSCHED_DSN", &in_dsn)]);
    assert!(warned.status.success(), "{}", stderr(&warned));
    assert!(stderr(&warned).contains("warning: the DSN carries a password"));
    outputs.push(warned);
    let wrong = list(&[("PGPASSWORD", "wrong-guess-xyz")], &[]);
    refused_ref(&wrong, 1, &format!("127.0.0.1:{}", db.port));
    outputs.push(wrong);
    for o in &outputs {
        assert!(
            !stdout(o).contains(secret) && !stderr(o).contains(secret),
            "a password was printed"
        );
        assert!(
            !stderr(o).contains("wrong-guess-xyz"),
            "a password was printed"
        );
    }

    std::fs::write(&hba, old).unwrap();
    su.batch_execute("SELECT pg_reload_conf()").await.unwrap();
}

fn ok_output(o: Output) -> Output {
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    o
}

fn refused_ref(o: &Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "stderr lacks `{needle}`: {err}");
}

/// An operator's disable stays in force when the trigger is republished with a changed
/// definition (a deployment during an incident does not re-enable it); `enable` ends it.
#[tokio::test]
async fn a_republish_keeps_an_operator_disable_until_enable() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let id = "trg-00000";
    let mut admin = db.admin().await;
    triggers::disable(&mut admin, id, Some("incident"), "ops")
        .await
        .unwrap();
    let p = manage::publish_trigger(
        &mut admin,
        &TriggerSpec::new(id, "proj", "task", "*/2 * * * * *", "UTC"),
    )
    .await
    .unwrap();
    assert_eq!((p.revision, p.changed), (2, true));
    let v = triggers::show(&admin, id).await.unwrap();
    assert!(!v.enabled && v.operator_disabled, "{v:?}");
    assert_eq!(v.disabled_note.as_deref(), Some("incident"));
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claimable_at_ms IS NULL")
            .await,
        1,
        "not claimable"
    );
    assert_eq!(
        triggers::enable(&mut admin, id, "ops").await.unwrap(),
        triggers::Changed::Yes
    );
    let v = triggers::show(&admin, id).await.unwrap();
    assert!(v.enabled && !v.operator_disabled, "{v:?}");
    assert_eq!(
        v.disabled_note.as_deref(),
        Some("incident"),
        "kept on record"
    );
    assert_eq!(v.enabled_by.as_deref(), Some("ops"));
}

/// A manual fire and a cron occurrence may fall on the same millisecond: they are different
/// runs (different key kinds), so a backfill of that instant still admits the occurrence.
#[tokio::test]
async fn a_backfill_admits_an_occurrence_a_manual_fire_shares_the_millisecond_with() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let id = "trg-00000";
    let mut admin = db.admin().await;
    let fired = triggers::fire(&mut admin, id, "same-ms", "operator:test")
        .await
        .unwrap();
    assert!(fired.admitted);
    let at = fired.scheduled_for_ms;
    let n = triggers::backfill_chunk(&mut admin, id, 1, &[at], "backfill:test")
        .await
        .unwrap();
    assert_eq!(
        (n.admitted, n.already_existed),
        (1, 0),
        "the cron occurrence at {at} was skipped because a manual run shares its instant"
    );
    assert_eq!(
        runs_where(&db, id, "r.scheduled_for_ms = $2", at).await,
        2,
        "the manual run and the occurrence"
    );
    db.assert_invariants().await;
}
