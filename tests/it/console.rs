//! The web console over plain HTTP (the browser tests are in `console_browser`): its JSON
//! is the CLI's `--json` (one query layer), values are escaped, the security headers are
//! set, the auth rules hold, and the config refuses an unguarded console on a non-loopback
//! address before PostgreSQL is opened.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::cli::{ok, ql};
use crate::helpers::http::{self, check_config, header, secret_file};
use crate::helpers::replica::ReplicaProc;
use crate::helpers::TestDb;

/// One HTTP/1.0 GET with extra headers: (status, lower-cased headers, body).
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> http::Response {
    http::get(addr, Some("localhost"), path, headers)
}

/// A project, a task and triggers: `con-a` every second (runs come), `con-b` daily,
/// `con-x` disabled with a note holding a script, all in `proj`.
pub async fn seed(db: &TestDb) {
    let mut admin = db.admin_with_project().await;
    for (id, cron) in [
        ("con-a", "* * * * * *"),
        ("con-b", "0 3 * * *"),
        ("con-x", "30 2 * * *"),
    ] {
        let spec =
            qlsched::store::manage::TriggerSpec::new(id, "proj", "task", cron, "Europe/Berlin");
        qlsched::store::manage::publish_trigger(&mut admin, &spec)
            .await
            .unwrap();
    }
    ok(ql(
        db,
        &[
            "trigger",
            "disable",
            "con-x",
            "--note",
            "<script>window.__xss=1</script> & <b>bold</b>",
            "--actor",
            "<img src=x onerror=alert(1)>",
        ],
    ));
}

/// The keys of a JSON object.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
    k.sort();
    k
}

#[tokio::test]
async fn console_json_is_the_clis_json_and_pages_escape_every_value() {
    let db = TestDb::new().await;
    seed(&db).await;
    let mut r = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "con1", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    crate::helpers::wait_until("a run of con-a", Duration::from_secs(20), || async {
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a'")
            .await
            >= 2
    })
    .await;

    // Escaping: the note and the actor are shown as text, never as markup.
    let (status, h, page) = get(r.http, "/triggers/con-x", &[]);
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("&lt;script&gt;window.__xss=1&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;"),
        "{page}"
    );
    assert!(
        page.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<script>window") && !page.contains("<b>bold") && !page.contains("<img"),
        "{page}"
    );
    // Without credentials (a loopback console) nobody acts: no form, a POST refused.
    assert!(!page.contains("method=\"post\""), "{page}");
    let (status, _, text) = http::post(r.http, "/triggers/con-a/disable", &[SAME_SITE], "note=x");
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("only an operator"), "{text}");
    // Security headers.
    let csp = header(&h, "content-security-policy").expect("a CSP");
    for part in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header(&h, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(&h, "referrer-policy"), Some("no-referrer"));
    // No inline script or style anywhere in the page.
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "{page}"
    );
    // A search value is reflected escaped.
    let (_, _, page) = get(
        r.http,
        "/triggers?q=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        &[],
    );
    assert!(
        page.contains("value=\"&lt;script&gt;alert(1)&lt;/script&gt;\""),
        "{page}"
    );

    // The API answers with the CLI's --json fields (same values where time does not move).
    let api = |path: &str| {
        let (status, h, body) = get(r.http, path, &[]);
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(
            header(&h, "content-type"),
            Some("application/json"),
            "{path}"
        );
        serde_json::from_str::<Value>(&body).unwrap()
    };
    let cli = |args: &[&str]| serde_json::from_str::<Value>(&ok(ql(&db, args))).unwrap();

    let show_api = api("/api/v1/triggers/con-x");
    let show_cli = cli(&[
        "trigger", "show", "con-x", "--json", "--count", "10", "--runs", "50",
    ]);
    assert_eq!(keys(&show_api), keys(&show_cli));
    for k in [
        "trigger_id",
        "revision",
        "disabled_note",
        "disabled_by",
        "enabled",
        "cron_expr",
        "timezone",
        "upcoming",
    ] {
        assert_eq!(show_api[k], show_cli[k], "{k}");
    }
    let list_api = api("/api/v1/triggers?limit=2");
    let list_cli = cli(&["trigger", "list", "--json", "--limit", "2"]);
    assert_eq!(keys(&list_api), keys(&list_cli));
    assert_eq!(list_api["next_after"], list_cli["next_after"]);
    assert_eq!(list_api["next_after"], "con-b");
    assert_eq!(
        keys(&list_api["triggers"][0]),
        keys(&list_cli["triggers"][0])
    );
    let status_api = api("/api/v1/overview");
    let status_cli = cli(&["status", "--json"]);
    for k in keys(&status_cli) {
        assert!(
            status_api.get(&k).is_some(),
            "overview lacks status's `{k}`"
        );
    }
    assert_eq!(status_api["served_by"]["replica_id"], "con1");
    assert!(
        status_api["admissions"]["minutes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["admitted"].as_i64() >= Some(1)),
        "{status_api}"
    );
    let runs_api = api("/api/v1/runs?trigger=con-a&limit=1");
    let runs_cli = cli(&[
        "runs",
        "list",
        "--trigger",
        "con-a",
        "--limit",
        "1",
        "--json",
    ]);
    assert_eq!(keys(&runs_api), keys(&runs_cli));
    assert_eq!(keys(&runs_api["runs"][0]), keys(&runs_cli["runs"][0]));
    // Keyset paging: the second page starts below the first.
    let next = runs_api["next_before"].as_str().expect("a next page");
    let page2 = api(&format!("/api/v1/runs?trigger=con-a&limit=1&before={next}"));
    assert_ne!(page2["runs"][0]["run_id"], runs_api["runs"][0]["run_id"]);
    assert!(
        page2["runs"][0]["queued_at_ms"].as_i64() <= runs_api["runs"][0]["queued_at_ms"].as_i64()
    );

    // Bounds: a page of more than 100 is refused, naming the bound.
    let (status, _, body) = get(r.http, "/api/v1/triggers?limit=101", &[]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("1..=100"), "{body}");
    let (status, _, _) = get(r.http, "/triggers/no-such-trigger", &[]);
    assert_eq!(status, 404);
    // The pages never show the DSN.
    let (_, _, page) = get(r.http, "/", &[]);
    assert!(
        page.contains("con1")
            && !page.contains(&db.dsn("qlsched_runtime"))
            && !page.contains("dbname="),
        "{page}"
    );
    r.terminate(Duration::from_secs(20)).await;
}

#[test]
fn an_unguarded_console_off_loopback_is_refused_before_postgresql_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let (good, out) = check_config(dir.path(), "bind = \"0.0.0.0:9187\"\nconsole = \"on\"");
    assert!(!good, "{out}");
    assert!(
        out.contains("http.console = on")
            && out.contains("console_auth_file")
            && out.contains("loopback"),
        "{out}"
    );
    // auto on a non-loopback address: valid, the console is simply off (served: see below).
    let (good, out) = check_config(dir.path(), "bind = \"0.0.0.0:9187\"");
    assert!(good, "{out}");
    // A secret file readable by others is refused, naming the file, the key and the bound.
    let loose = secret_file(dir.path(), "loose", "0123456789abcdef0123\n", 0o604);
    let (good, out) = check_config(
        dir.path(),
        &format!("bind = \"0.0.0.0:9187\"\nconsole_auth_file = \"{loose}\""),
    );
    assert!(!good, "{out}");
    assert!(
        out.contains("http.console_auth_file")
            && out.contains(&loose)
            && out.contains("has mode 0604"),
        "{out}"
    );
    // Too short a token; an unknown mode; a pool out of bounds.
    let short = secret_file(dir.path(), "short", "abc\n", 0o600);
    let (good, out) = check_config(
        dir.path(),
        &format!("console_auth_file = \"{short}\"\nconsole = \"sometimes\"\nconsole_pool_size = 9"),
    );
    assert!(!good, "{out}");
    for needle in [
        "at least 16 characters",
        "http.console = sometimes",
        "auto, on, off",
        "http.console_pool_size = 9",
        "1..=8",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    // The secret never appears in a message.
    assert!(!out.contains("0123456789abcdef"), "{out}");
}

#[tokio::test]
async fn off_loopback_the_console_is_off_without_a_token_and_needs_it_with_one() {
    let db = TestDb::new().await;
    let dsn = db.dsn("qlsched_runtime");
    // No auth file, bound to every address: the console is off; health still answers.
    let mut open = ReplicaProc::spawn_via(&[], "0.0.0.0", &dsn, "open", "", &[]);
    open.wait_ready(Duration::from_secs(30)).await;
    let (status, _, _) = get(open.http, "/", &[]);
    assert_eq!(
        status, 404,
        "the console must be off without console_auth_file"
    );
    let (status, _, _) = get(open.http, "/api/v1/overview", &[]);
    assert_eq!(status, 404);
    assert_eq!(get(open.http, "/healthz", &[]).0, 200);
    open.terminate(Duration::from_secs(20)).await;

    // With a bearer token: 401 without it or with another, 200 with it.
    let dir = tempfile::tempdir().unwrap();
    let token = "s3cret-token-0123456789";
    let file = secret_file(dir.path(), "token", &format!("{token}\n"), 0o600);
    // The replica file already has an [http] section: the key comes through the environment.
    let mut guarded = ReplicaProc::spawn_via(
        &[],
        "0.0.0.0",
        &dsn,
        "guarded",
        "",
        &[
            ("QLSCHED__HTTP__CONSOLE_AUTH_FILE", file.as_str()),
            // Plain HTTP off loopback must be asked for (the test has no certificate).
            ("QLSCHED__HTTP__ALLOW_PLAIN_HTTP", "true"),
        ],
    );
    guarded.wait_ready(Duration::from_secs(30)).await;
    for path in ["/", "/triggers", "/api/v1/runs", "/static/console.css"] {
        let (status, h, body) = get(guarded.http, path, &[]);
        assert_eq!(status, 401, "{path}: {body}");
        assert!(header(&h, "www-authenticate").is_some_and(|v| v.starts_with("Bearer")));
        assert!(!body.contains(token));
        let (status, _, _) = get(
            guarded.http,
            path,
            &[("Authorization", "Bearer wrong-token-0123456789")],
        );
        assert_eq!(status, 401, "{path}");
        let (status, _, body) = get(
            guarded.http,
            path,
            &[("Authorization", &format!("Bearer {token}"))],
        );
        assert_eq!(status, 200, "{path}: {body}");
        assert!(!body.contains(token), "{path} shows the token");
    }
    // Health and metrics stay open (probes and Prometheus carry no credentials).
    assert_eq!(get(guarded.http, "/readyz", &[]).0, 200);
    guarded.terminate(Duration::from_secs(20)).await;

    // Basic credentials: the browser's prompt.
    let file = secret_file(dir.path(), "basic", "ops:correct-horse\n", 0o600);
    let mut basic = ReplicaProc::spawn(
        &dsn,
        "basic",
        "",
        &[("QLSCHED__HTTP__CONSOLE_AUTH_FILE", file.as_str())],
    );
    basic.wait_ready(Duration::from_secs(30)).await;
    let (status, h, _) = get(basic.http, "/", &[]);
    assert_eq!(status, 401, "credentials set on loopback are required too");
    assert!(header(&h, "www-authenticate").is_some_and(|v| v.starts_with("Basic")));
    // base64("ops:correct-horse")
    let (status, _, _) = get(
        basic.http,
        "/",
        &[("Authorization", "Basic b3BzOmNvcnJlY3QtaG9yc2U=")],
    );
    assert_eq!(status, 200);
    basic.terminate(Duration::from_secs(20)).await;
}

/// A filter that matches few triggers searches a bounded stretch of ids per page (10,000),
/// and `next_after` continues the walk: no request reads the whole table.
#[tokio::test]
async fn a_filtered_trigger_page_walks_a_bounded_stretch_and_continues_after_it() {
    let db = TestDb::new().await;
    db.seed_bulk(10_050, "0 0 1 1 *", 86_400_000).await;
    let client = db.client("qlsched_runtime").await;
    let f = |after: Option<&'static str>| qlsched::store::browse::TriggerFilter {
        project: None,
        state: qlsched::store::triggers::StateFilter::Disabled,
        prefix: None,
        after,
        limit: 5,
    };
    // No trigger is disabled: the first page looked at 10,000 ids and says where it stopped.
    let p1 = qlsched::present::triggers::trigger_page(&client, &f(None), true)
        .await
        .unwrap();
    assert!(p1.triggers.is_empty());
    assert_eq!(p1.next_after.as_deref(), Some("trg-09999"));
    // The rest (50 ids) ends the walk.
    let p2 = qlsched::present::triggers::trigger_page(&client, &f(Some("trg-09999")), true)
        .await
        .unwrap();
    assert!(p2.triggers.is_empty());
    assert_eq!(p2.next_after, None);
    // The CLI's walk is not bounded: it reads on until the page is full (here: to the end).
    let cli = qlsched::present::triggers::trigger_page(&client, &f(None), false)
        .await
        .unwrap();
    assert!(cli.triggers.is_empty() && cli.next_after.is_none());
    // A prefix is searched from the prefix on.
    let g = qlsched::store::browse::TriggerFilter {
        state: qlsched::store::triggers::StateFilter::All,
        prefix: Some("trg-1004"),
        ..f(None)
    };
    let p = qlsched::present::triggers::trigger_page(&client, &g, true)
        .await
        .unwrap();
    let ids: Vec<&str> = p
        .triggers
        .iter()
        .map(|t| t.view.trigger_id.as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "trg-10040",
            "trg-10041",
            "trg-10042",
            "trg-10043",
            "trg-10044"
        ]
    );
    assert_eq!(p.next_after.as_deref(), Some("trg-10044"));
}

/// Writes `n` succeeded cron runs of `con-b` scheduled from `from_ms` on, one per ms, each
/// admitted 10 ms after its instant (only `runs`: what the admission history reads).
async fn runs_at(su: &tokio_postgres::Client, from_ms: i64, n: i64) {
    su.execute(
        "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                   task_revision, execution_revision_id, idempotency_key, status,
                                   scheduled_for_ms, queued_at_ms, admitted_by)
         SELECT gen_random_uuid(), 'proj', 'con-b', 1, 'task', 1, gen_random_uuid(),
                'ql3:cron:v1:con-b:1:' || sf, 'succeeded', sf, sf + 10, 'test'
           FROM (SELECT $1::bigint + g AS sf FROM generate_series(0, $2::bigint - 1) g) x",
        &[&from_ms, &n],
    )
    .await
    .unwrap();
}

/// The overview's hour of admissions reads only the minutes it has not closed: a minute that
/// ended over a minute ago is kept from the console's earlier read (the bound that keeps the
/// overview cheap behind a busy hour; docs/benchmark.md, console row). Shown by runs written
/// into such a minute after the first read: the overview keeps its count, a fresh read of
/// the history sees them.
#[tokio::test]
async fn the_overview_rereads_only_the_minutes_it_has_not_closed() {
    let db = TestDb::new().await;
    seed(&db).await;
    let su = db.superuser().await;
    let minute = (crate::helpers::db_now_ms(&su).await / 60_000 - 5) * 60_000;
    runs_at(&su, minute + 30_000, 3).await;
    let mut r = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "con1", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    let in_minute = |body: &str| -> Option<i64> {
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        v["admissions"]["minutes"]
            .as_array()?
            .iter()
            .find(|m| m["minute_start_ms"].as_i64() == Some(minute))?["admitted"]
            .as_i64()
    };
    let (status, _, first) = get(r.http, "/api/v1/overview", &[]);
    assert_eq!(status, 200, "{first}");
    assert_eq!(in_minute(&first), Some(3), "{first}");

    runs_at(&su, minute + 40_000, 2).await;
    let (status, _, second) = get(r.http, "/api/v1/overview", &[]);
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        in_minute(&second),
        Some(3),
        "the closed minute was read again: {second}"
    );
    let fresh = qlsched::store::browse::admission_history(&su, "cron", None)
        .await
        .unwrap();
    let fresh = serde_json::to_string(&serde_json::json!({ "admissions": fresh })).unwrap();
    assert_eq!(in_minute(&fresh), Some(5), "{fresh}");
    assert!(r.terminate(Duration::from_secs(20)).await.success());
}

/// The console's transaction: read-only, its timeouts, and no JIT compilation (the planner
/// guesses a third of `runs` for a range bounded by the database clock, and compiled the
/// overview's queries on a large table: hundreds of ms each).
#[tokio::test]
async fn the_console_transaction_is_read_only_bounded_and_never_jit_compiled() {
    let db = TestDb::new().await;
    let mut c = db.client("qlsched_runtime").await;
    let show = |rows: Vec<tokio_postgres::Row>| rows[0].get::<_, String>(0);
    assert_eq!(
        show(c.query("SHOW jit", &[]).await.unwrap()),
        "on",
        "the server's default"
    );
    let tx = qlsched::console::read_only(&mut c, Duration::from_millis(1500))
        .await
        .unwrap();
    let mut got = Vec::new();
    for g in [
        "jit",
        "statement_timeout",
        "lock_timeout",
        "transaction_read_only",
    ] {
        got.push(show(tx.query(&format!("SHOW {g}"), &[]).await.unwrap()));
    }
    assert_eq!(got, ["off", "1500ms", "1500ms", "on"]);
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn a_runs_page_shows_its_attempts_output_escaped_and_its_json_is_runs_show() {
    let db = TestDb::new().await;
    seed(&db).await;
    let mut r = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "con-run", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    crate::helpers::wait_until("a run of con-a", Duration::from_secs(20), || async {
        db.count(
            "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a' AND status = 'queued'",
        )
        .await
            >= 1
    })
    .await;
    // A dispatcher takes one run, starts it and records a failure whose output and error
    // carry markup.
    let d = db.client("qlsched_dispatcher").await;
    let taken = d
        .query_one(
            "SELECT run_id, attempt_id, lease_token FROM qlsched.dispatch_take('w-<i>', NULL, 1, 60000)",
            &[],
        )
        .await
        .unwrap();
    let (run_id, attempt, token): (uuid::Uuid, uuid::Uuid, uuid::Uuid) =
        (taken.get(0), taken.get(1), taken.get(2));
    let started: bool = d
        .query_one(
            "SELECT qlsched.dispatch_start($1, $2, 60000)",
            &[&attempt, &token],
        )
        .await
        .unwrap()
        .get(0);
    assert!(started);
    let output = "report <b>done</b>\n--- stderr ---\n<script>window.__out=1</script> & more\n";
    let finished: bool = d
        .query_one(
            "SELECT qlsched.dispatch_finish($1, $2, 'failed', 3, $3, 'exited with status 3 <img src=x>', NULL)",
            &[&attempt, &token, &output],
        )
        .await
        .unwrap()
        .get(0);
    assert!(finished);

    // The page: the attempt, its exit status, error and output, every one escaped.
    let (status, _, page) = get(r.http, &format!("/runs/{run_id}"), &[]);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Attempt 1: failed"), "{page}");
    assert!(page.contains("w-&lt;i&gt;"), "{page}");
    assert!(page.contains("<dd class=\"exit\">3</dd>"), "{page}");
    assert!(
        page.contains("exited with status 3 &lt;img src=x&gt;"),
        "{page}"
    );
    assert!(
        page.contains(
            "report &lt;b&gt;done&lt;/b&gt;\n--- stderr ---\n&lt;script&gt;window.__out=1&lt;/script&gt; &amp; more"
        ),
        "{page}"
    );
    assert!(
        !page.contains("<script>window") && !page.contains("<b>done") && !page.contains("<img"),
        "{page}"
    );
    // The runs list links to it.
    let (_, _, list) = get(r.http, "/runs?trigger=con-a&status=failed", &[]);
    assert!(list.contains(&format!("href=\"/runs/{run_id}\"")), "{list}");

    // The JSON is `runs show --json`'s, the output as recorded.
    let (status, _, body) = get(r.http, &format!("/api/v1/runs/{run_id}"), &[]);
    assert_eq!(status, 200, "{body}");
    let api: Value = serde_json::from_str(&body).unwrap();
    let cli: Value = serde_json::from_str(&ok(ql(
        &db,
        &["runs", "show", &run_id.to_string(), "--json"],
    )))
    .unwrap();
    assert_eq!(keys(&api), keys(&cli));
    assert_eq!(api["attempts"], cli["attempts"]);
    assert_eq!(api["attempts"][0]["output_tail"], output);
    assert_eq!(api["attempts"][0]["exit_status"], 3);
    // And `runs show` prints the output's lines.
    let text = ok(ql(&db, &["runs", "show", &run_id.to_string()]));
    assert!(
        text.contains("    <script>window.__out=1</script> & more"),
        "{text}"
    );

    // A bad id is refused, an unknown one is not found.
    let (status, _, _) = get(r.http, "/api/v1/runs/not-a-uuid", &[]);
    assert_eq!(status, 400);
    let (status, _, _) = get(r.http, &format!("/runs/{}", uuid::Uuid::new_v4()), &[]);
    assert_eq!(status, 404);
    r.terminate(Duration::from_secs(20)).await;
}

/// A refused POST: who sends it, its headers and body, and the status it gets.
type Refusal<'a> = (&'a str, Vec<(&'a str, &'a str)>, String, u16);

/// The auth file of the action tests: an operator and a viewer, each with its role.
pub(crate) const ROLES_FILE: &str =
    "# who may act\noperator alice:alice-password-1\nviewer bob:bob-password-12\n";
/// base64("alice:alice-password-1") and base64("bob:bob-password-12").
pub(crate) const ALICE: (&str, &str) = ("Authorization", "Basic YWxpY2U6YWxpY2UtcGFzc3dvcmQtMQ==");
pub(crate) const BOB: (&str, &str) = ("Authorization", "Basic Ym9iOmJvYi1wYXNzd29yZC0xMg==");
/// What a browser sends with a form post from the console's own page.
const SAME_SITE: (&str, &str) = ("Sec-Fetch-Site", "same-origin");

/// The value of the first `<input name=NAME value=…>` of `form_id`'s form in `page`.
fn form_field(page: &str, form_id: &str, name: &str) -> String {
    let form = page
        .split(&format!("id=\"{form_id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no form {form_id} in {page}"));
    let form = form.split("</form>").next().unwrap();
    let at = form
        .find(&format!("name=\"{name}\" value=\""))
        .unwrap_or_else(|| panic!("no {name} in form {form_id}: {form}"));
    let rest = &form[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// A form body, percent-encoded.
fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The console's audit rows of a trigger (newest first), from `qlsched audit --json`.
fn console_audit(db: &TestDb, trigger: &str) -> Vec<Value> {
    let page: Value =
        serde_json::from_str(&ok(ql(db, &["audit", "--json", "--trigger", trigger]))).unwrap();
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["source"] == "console")
        .cloned()
        .collect()
}

/// A replica on loopback whose console has the operator and the viewer of [`ROLES_FILE`],
/// with `seed`'s triggers and `con-s`, every second.
async fn console_with_roles(db: &TestDb, dir: &std::path::Path) -> ReplicaProc {
    seed(db).await;
    let mut admin = db.admin().await;
    let spec =
        qlsched::store::manage::TriggerSpec::new("con-s", "proj", "task", "* * * * * *", "UTC");
    qlsched::store::manage::publish_trigger(&mut admin, &spec)
        .await
        .unwrap();
    let file = secret_file(dir, "roles", ROLES_FILE, 0o600);
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "act1",
        "",
        &[("QLSCHED__HTTP__CONSOLE_AUTH_FILE", file.as_str())],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    r
}

/// An operator disables a trigger with a note: the answer comes after the fence, so the
/// replica admits nothing more for it while it keeps admitting its other triggers; enable
/// brings it back. A viewer sees no action and its forged POST is refused (403), so is a
/// post from another site and one without the page's token; each action is one audit row
/// naming the console user, the client address and source console.
#[tokio::test]
async fn an_operator_disables_and_enables_and_a_viewer_or_another_site_cannot() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let mut r = console_with_roles(&db, dir.path()).await;

    // A viewer reads the page but sees no action.
    let (status, _, page) = get(r.http, "/triggers/con-a", &[BOB]);
    assert_eq!(status, 200, "{page}");
    assert!(
        !page.contains("id=\"actions\"") && !page.contains("method=\"post\""),
        "{page}"
    );
    // The operator's page has the forms and the token.
    let (status, h, page) = get(r.http, "/triggers/con-a", &[ALICE]);
    assert_eq!(status, 200, "{page}");
    assert_eq!(header(&h, "set-cookie"), None, "the page sets no cookie");
    let token = form_field(&page, "disable-form", "csrf");
    let disable = form(&[("csrf", &token), ("note", "incident <42> & co")]);

    // Refused, each with nothing written: a viewer (even with the operator's token), another
    // site's form, no token, a token made for another user, no credentials at all.
    let refusals: [Refusal; 6] = [
        ("a viewer", vec![BOB, SAME_SITE], disable.clone(), 403),
        (
            "another site",
            vec![
                ALICE,
                ("Sec-Fetch-Site", "cross-site"),
                ("Origin", "https://evil.example"),
            ],
            disable.clone(),
            403,
        ),
        (
            "an old client from another origin",
            vec![ALICE, ("Origin", "https://evil.example")],
            disable.clone(),
            403,
        ),
        (
            "no token",
            vec![ALICE, SAME_SITE],
            form(&[("note", "x")]),
            403,
        ),
        (
            "a forged token",
            vec![ALICE, SAME_SITE],
            form(&[
                (
                    "csrf",
                    &format!("{}.{}", token.split('.').next().unwrap(), "ab".repeat(32)),
                ),
                ("note", "x"),
            ]),
            403,
        ),
        ("no credentials", vec![SAME_SITE], disable.clone(), 401),
    ];
    for (who, headers, body, want) in &refusals {
        let (status, _, text) = http::post(r.http, "/triggers/con-a/disable", headers, body);
        assert_eq!(status, *want, "{who}: {text}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.triggers WHERE trigger_id = 'con-a' AND enabled")
            .await,
        1,
        "a refused POST changed the trigger"
    );
    assert!(console_audit(&db, "con-a").is_empty());
    // GET is not an action.
    assert_eq!(get(r.http, "/triggers/con-a/disable", &[ALICE]).0, 404);

    // The operator disables with a note; an empty note is refused first.
    let (status, _, text) = http::post(
        r.http,
        "/triggers/con-a/disable",
        &[ALICE, SAME_SITE],
        &form(&[("csrf", &token), ("note", "  ")]),
    );
    assert_eq!(status, 400, "{text}");
    // A client that sends no fetch metadata but its own origin is accepted too.
    let (status, h, text) = http::post(
        r.http,
        "/triggers/con-a/disable",
        &[ALICE, ("Origin", "http://localhost")],
        &disable,
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(header(&h, "set-cookie"), None, "an action needs no cookie");
    assert!(text.contains("Disabled"), "{text}");
    let runs_at_answer = db
        .count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a'")
        .await;
    // Fenced: the replica goes on admitting con-s, and nothing more of con-a.
    let s_at_answer = db
        .count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-s'")
        .await;
    crate::helpers::wait_until(
        "two more runs of con-s",
        Duration::from_secs(20),
        || async {
            db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-s'")
                .await
                >= s_at_answer + 2
        },
    )
    .await;
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a'")
            .await,
        runs_at_answer,
        "a run of con-a was admitted after the disable answered"
    );
    let (_, _, page) = get(r.http, "/triggers/con-a", &[ALICE]);
    assert!(page.contains("incident &lt;42&gt; &amp; co"), "{page}");
    assert!(page.contains("id=\"enable-form\""), "{page}");

    // Enable: the cursor after now, and runs come again.
    let token = form_field(&page, "enable-form", "csrf");
    let (status, _, text) = http::post(
        r.http,
        "/triggers/con-a/enable",
        &[ALICE, SAME_SITE],
        &form(&[("csrf", &token)]),
    );
    assert_eq!(status, 200, "{text}");
    crate::helpers::wait_until(
        "a run of con-a after the enable",
        Duration::from_secs(20),
        || async {
            db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a'")
                .await
                > runs_at_answer
        },
    )
    .await;

    // One audit row per action: the console user, the client address, source console.
    let rows = console_audit(&db, "con-a");
    let actions: Vec<&str> = rows.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["enable", "disable"], "{rows:#?}");
    for e in &rows {
        assert_eq!(e["actor"], "alice", "{e}");
        assert_eq!(e["host"], "127.0.0.1", "{e}");
        assert_eq!(e["db_user"], "qlsched_runtime", "{e}");
    }
    assert_eq!(rows[1]["note"], "incident <42> & co");
    assert_eq!(rows[1]["changes"]["enabled"]["after"], false, "{}", rows[1]);
    r.terminate(Duration::from_secs(20)).await;
}

/// A double-clicked "Fire now" posts the page's request id twice: one run. A console
/// backfill is bounded as the CLI's default (`--max 1000`): a window of 1001 occurrences is
/// refused by both, nothing written; 1000 are shown first and admitted on confirmation.
/// Cancelling queued runs shows their count first. A run a worker holds is asked to stop
/// from its page; once failed, its retry admits one run however often it is posted. Each
/// action is in `qlsched audit`.
#[tokio::test]
async fn a_double_fire_admits_one_run_and_backfill_and_cancel_are_bounded_and_confirmed() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let mut r = console_with_roles(&db, dir.path()).await;
    let (_, _, page) = get(r.http, "/triggers/con-b", &[ALICE]);
    let token = form_field(&page, "fire-form", "csrf");
    let request_id = form_field(&page, "fire-form", "request_id");
    let body = form(&[("csrf", &token), ("request_id", &request_id)]);
    let clicks: Vec<_> = (0..2)
        .map(|_| {
            let (addr, body) = (r.http, body.clone());
            std::thread::spawn(move || {
                http::post(addr, "/triggers/con-b/fire", &[ALICE, SAME_SITE], &body)
            })
        })
        .collect();
    for c in clicks {
        let (status, _, text) = c.join().unwrap();
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-b' AND idempotency_key LIKE 'ql3:manual:%'")
            .await,
        1,
        "a double click admitted two runs"
    );

    // Backfill of con-s (every second): 1001 occurrences refused by the console and by the
    // CLI alike; 1000 shown, then admitted on confirmation.
    let now = db.now_ms().await;
    let from_ms = (now / 1000 - 1500) * 1000;
    let iso = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let (from, over, to) = (
        iso(from_ms),
        iso(from_ms + 1_001_000),
        iso(from_ms + 1_000_000),
    );
    let backfill = |pairs: &[(&str, &str)]| {
        let mut all = vec![("csrf", token.as_str())];
        all.extend_from_slice(pairs);
        http::post(
            r.http,
            "/triggers/con-s/backfill",
            &[ALICE, SAME_SITE],
            &form(&all),
        )
    };
    let (status, _, text) = backfill(&[("from", &from), ("to", &over), ("confirm", "yes")]);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("more than 1000 occurrences"), "{text}");
    let cli = ql(
        &db,
        &[
            "trigger", "backfill", "con-s", "--from", &from, "--to", &over,
        ],
    );
    assert!(!cli.status.success(), "the CLI refuses the same window");
    let backfilled = "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-s' AND admitted_by LIKE 'backfill:%'";
    assert_eq!(db.count(backfilled).await, 0);
    let (status, _, text) = backfill(&[("from", &from), ("to", &to)]);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("1000 occurrences"), "{text}");
    assert_eq!(db.count(backfilled).await, 0, "the confirmation step wrote");
    let (status, _, text) = backfill(&[("from", &from), ("to", &to), ("confirm", "yes")]);
    assert_eq!(status, 200, "{text}");
    assert_eq!(db.count(backfilled).await, 1000);

    // Cancel the queued runs of the window: the count first, then the cancel.
    let cancel = |pairs: &[(&str, &str)]| {
        let mut all = vec![
            ("csrf", token.as_str()),
            ("from", from.as_str()),
            ("to", to.as_str()),
        ];
        all.extend_from_slice(pairs);
        http::post(
            r.http,
            "/triggers/con-s/cancel",
            &[ALICE, SAME_SITE],
            &form(&all),
        )
    };
    let (status, _, text) = cancel(&[]);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("1000 queued runs"), "{text}");
    let (status, _, text) = cancel(&[("confirm", "yes")]);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("1000 runs cancelled"), "{text}");
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-s' AND admitted_by LIKE 'backfill:%' AND status = 'cancelled'")
            .await,
        1000
    );

    // Each action once in the audit log, with the console user and source.
    let fire = console_audit(&db, "con-b");
    assert_eq!(fire.len(), 1, "{fire:#?}");
    assert_eq!(fire[0]["action"], "fire");
    let s = console_audit(&db, "con-s");
    let actions: Vec<&str> = s.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["runs.cancel", "backfill"], "{s:#?}");
    assert_eq!(s[1]["changes"]["admitted"], 1000);
    for e in fire.iter().chain(&s) {
        assert_eq!(
            (e["actor"].as_str(), e["host"].as_str()),
            (Some("alice"), Some("127.0.0.1")),
            "{e}"
        );
    }

    // A run a worker runs: its page offers the cancel request, which reaches it; once it
    // failed, its retry admits one run however often it is posted.
    let d = db.client("qlsched_dispatcher").await;
    let taken = d
        .query_one(
            "SELECT run_id, attempt_id, lease_token FROM qlsched.dispatch_take('w', NULL, 1, 60000)",
            &[],
        )
        .await
        .unwrap();
    let (run, attempt, lease): (uuid::Uuid, uuid::Uuid, uuid::Uuid) =
        (taken.get(0), taken.get(1), taken.get(2));
    d.execute(
        "SELECT qlsched.dispatch_start($1, $2, 60000)",
        &[&attempt, &lease],
    )
    .await
    .unwrap();
    let (_, _, page) = get(r.http, &format!("/runs/{run}"), &[ALICE]);
    let token = form_field(&page, "cancel-request-form", "csrf");
    let post = |what: &str| {
        http::post(
            r.http,
            &format!("/runs/{run}/{what}"),
            &[ALICE, SAME_SITE],
            &form(&[("csrf", &token)]),
        )
    };
    let (status, _, text) = post("cancel-request");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("Asked its worker"), "{text}");
    let asked = format!(
        "SELECT count(*) FROM qlsched.runs WHERE run_id = '{run}' AND cancel_requested_at_ms IS NOT NULL"
    );
    assert_eq!(db.count(&asked).await, 1);
    d.execute(
        "SELECT qlsched.dispatch_finish($1, $2, 'failed', 1, '', 'exit 1', NULL)",
        &[&attempt, &lease],
    )
    .await
    .unwrap();
    for _ in 0..2 {
        let (status, _, text) = post("retry");
        assert_eq!(status, 200, "{text}");
    }
    let retried = format!("SELECT count(*) FROM qlsched.runs WHERE request_id = 'retry.{run}'");
    assert_eq!(db.count(&retried).await, 1, "two retries admitted two runs");
    let rows = db
        .count("SELECT count(*) FROM qlsched.audit_log WHERE source = 'console' AND action IN ('runs.cancel_request', 'fire') AND changes->>'run_id' IS NOT NULL")
        .await;
    assert_eq!(
        rows, 3,
        "the cancel request, con-b's fire and the one retry"
    );
    r.terminate(Duration::from_secs(20)).await;
}

/// The V24 functions called as the runtime role, held to the CLI's outcomes where they
/// rewrite its statements: an enable's jittered claim instant is the Rust one
/// (`Timing::claimable_at_ms`, as `trigger enable` writes it); a stale cursor is answered
/// `stale` and nothing written; a disabled trigger is refused a fire (as `trigger fire`);
/// a retry admits one run of a failed run only; a cancel request reaches only a held run;
/// each write is one audit row, a refusal none.
#[tokio::test]
async fn the_console_functions_keep_the_clis_checks_and_write_one_audit_row_each() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let mut spec =
        qlsched::store::manage::TriggerSpec::new("con-j", "proj", "task", "*/5 * * * *", "UTC");
    spec.jitter_ms = 120_000;
    qlsched::store::manage::publish_trigger(&mut admin, &spec)
        .await
        .unwrap();
    let rt = db.client("qlsched_runtime").await;
    let audit_rows = || db.count("SELECT count(*) FROM qlsched.audit_log WHERE source = 'console'");
    let call = |sql: &'static str| {
        let rt = &rt;
        async move { rt.query_one(sql, &[]).await.map(|r| r.get::<_, String>(0)) }
    };

    assert_eq!(
        call("SELECT qlsched.console_disable('con-j', 'why', 'alice', '10.0.0.1')")
            .await
            .unwrap(),
        "disabled"
    );
    assert_eq!(
        call("SELECT qlsched.console_disable('con-j', 'again', 'alice', '10.0.0.1')")
            .await
            .unwrap(),
        "unchanged"
    );
    assert_eq!(
        audit_rows().await,
        1,
        "an unchanged disable appends nothing"
    );
    // A fire of a disabled trigger is refused, as the CLI's.
    let e = call("SELECT outcome FROM qlsched.console_fire('con-j', 'r1', NULL, gen_random_uuid(), gen_random_uuid(), 'alice', '', NULL)")
        .await
        .unwrap_err();
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(msg.contains("is disabled"), "{e:?}");
    let cli = ql(&db, &["trigger", "fire", "con-j", "--request-id", "r1"]);
    assert!(!cli.status.success(), "the CLI refuses it too");

    // Enable: a cursor in the past is stale; the next occurrence is written with the Rust
    // jitter.
    let now = db.now_ms().await;
    let stale = format!(
        "SELECT qlsched.console_enable('con-j', 1, {}, 'alice', '')",
        now - 1
    );
    let got: String = rt.query_one(&stale, &[]).await.unwrap().get(0);
    assert_eq!(got, "stale");
    let schedule = qlsched::schedule::Schedule::parse("*/5 * * * *", "UTC").unwrap();
    let first = schedule.next_after_ms(now + 1000).unwrap();
    let enable = format!("SELECT qlsched.console_enable('con-j', 1, {first}, 'alice', '')");
    let got: String = rt.query_one(&enable, &[]).await.unwrap().get(0);
    assert_eq!(got, "enabled");
    let row = rt
        .query_one(
            "SELECT next_fire_at_ms, claimable_at_ms FROM qlsched.trigger_schedules WHERE trigger_id = 'con-j'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), first);
    assert_eq!(
        Some(row.get::<_, i64>(1)),
        spec.timing().claimable_at_ms(first)
    );
    assert_ne!(
        row.get::<_, i64>(1),
        first,
        "the jitter of this instant is not 0"
    );
    assert_eq!(audit_rows().await, 2);

    // A run that did not fail is not retried; a failed one is, once.
    ok(ql(&db, &["trigger", "fire", "con-j", "--request-id", "r2"]));
    let run: uuid::Uuid = db
        .superuser()
        .await
        .query_one(
            "SELECT run_id FROM qlsched.runs WHERE request_id = 'r2'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let retry = format!(
        "SELECT outcome FROM qlsched.console_fire('con-j', '', '{run}', gen_random_uuid(), gen_random_uuid(), 'alice', '', NULL)"
    );
    let e = rt.query_one(&retry, &[]).await.unwrap_err();
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(msg.contains("not a failed run"), "{e:?}");
    // Take it, start it: a cancel request reaches it (once); then it fails.
    let d = db.client("qlsched_dispatcher").await;
    let taken = d
        .query_one(
            "SELECT attempt_id, lease_token FROM qlsched.dispatch_take('w', NULL, 1, 60000)",
            &[],
        )
        .await
        .unwrap();
    let (attempt, token): (uuid::Uuid, uuid::Uuid) = (taken.get(0), taken.get(1));
    d.execute(
        "SELECT qlsched.dispatch_start($1, $2, 60000)",
        &[&attempt, &token],
    )
    .await
    .unwrap();
    let ask = format!("SELECT qlsched.console_request_cancel('{run}', 'alice', '', 'stuck')");
    assert_eq!(rt.query_one(&ask, &[]).await.unwrap().get::<_, i64>(0), 1);
    assert_eq!(rt.query_one(&ask, &[]).await.unwrap().get::<_, i64>(0), 0);
    d.execute(
        "SELECT qlsched.dispatch_finish($1, $2, 'failed', 1, '', 'exit 1', NULL)",
        &[&attempt, &token],
    )
    .await
    .unwrap();
    for want in ["admitted", "existing"] {
        let got: String = rt.query_one(&retry, &[]).await.unwrap().get(0);
        assert_eq!(got, want);
    }
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM qlsched.runs WHERE request_id = 'retry.{run}'"
        ))
        .await,
        1
    );
    // disable, enable, cancel request, retry: one row each, all the runtime role's.
    let rows: Vec<(String, String, String)> = db
        .superuser()
        .await
        .query(
            "SELECT action, actor, db_user FROM qlsched.audit_log WHERE source = 'console' ORDER BY audit_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let actions: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        actions,
        ["disable", "enable", "runs.cancel_request", "fire"]
    );
    assert!(
        rows.iter()
            .all(|r| r.1 == "alice" && r.2 == "qlsched_runtime"),
        "{rows:?}"
    );
}
