//! The web console in a real browser: headless Chromium driven over WebDriver
//! (chromedriver, the Debian packages `chromium` and `chromium-driver`), one browser for
//! the whole walk. Through every page: content present, filters and paging, no console
//! error and no failed request (the browser's log, where Chromium reports both, and CSP
//! violations too), keyboard focus order, JavaScript off, and a note holding a script shown
//! as text. Each run saves a screenshot per page under `target/console-screenshots/`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::helpers::cli::{ok, ql};
use crate::helpers::replica::ReplicaProc;
use crate::helpers::TestDb;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fails (never skips) when the browser is missing, naming the packages.
fn require_browser() {
    for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: the console's browser tests need the Debian packages \
             chromium and chromium-driver (apt-get install chromium chromium-driver; \
             scripts/test.sh installs them); missing: {package}"
        );
    }
}

async fn start_browser() -> (Driver, Client) {
    require_browser();
    let port = crate::helpers::pg::free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let profile = tempfile::tempdir().unwrap();
    let driver = Driver {
        child,
        port,
        _profile: profile,
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver did not listen within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caps = json!({
        "browserName": "chrome",
        "goog:loggingPrefs": { "browser": "ALL" },
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900",
                format!("--user-data-dir={}", driver._profile.path().display()),
            ],
        },
    });
    let caps = caps.as_object().unwrap().clone();
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session with headless Chromium");
    (driver, client)
}

/// A chromedriver command fantoccini has no method for: `POST /session/{id}/{path}`.
#[derive(Debug)]
struct Post {
    path: &'static str,
    body: Value,
}

impl WebDriverCompatibleCommand for Post {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or(""),
            self.path
        ))
    }
    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

/// The browser's log since the last call: console messages, failed loads, CSP violations.
async fn browser_log(c: &Client) -> Vec<Value> {
    let v = c
        .issue_cmd(Post {
            path: "se/log",
            body: json!({ "type": "browser" }),
        })
        .await
        .expect("the browser log");
    v.as_array().cloned().unwrap_or_default()
}

/// No error and no warning was logged (a failed request is an error entry).
async fn assert_clean_log(c: &Client, page: &str) {
    let bad: Vec<Value> = browser_log(c)
        .await
        .into_iter()
        .filter(|e| matches!(e["level"].as_str(), Some("SEVERE") | Some("WARNING")))
        .collect();
    assert!(bad.is_empty(), "{page}: the browser logged {bad:#?}");
}

fn shots_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    std::fs::write(shots_dir().join(format!("{name}.png")), png).unwrap();
}

/// The text of the element `css` finds.
async fn text_of(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The trigger ids the triggers table lists, in order.
async fn trigger_ids(c: &Client) -> Vec<String> {
    texts(c, "#triggers tbody tr td:first-child").await
}

async fn texts(c: &Client, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in c.find_all(Locator::Css(css)).await.unwrap() {
        out.push(e.text().await.unwrap());
    }
    out
}

/// Waits (bounded) until the page's URL satisfies `cond` and its `h1` is there.
async fn await_url(c: &Client, what: &str, cond: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let url = c.current_url().await.unwrap().to_string();
        if cond(&url) && c.find(Locator::Css("h1")).await.is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still at {url}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn submit_filter(c: &Client, fields: &[(&str, &str)]) {
    let before = c.current_url().await.unwrap().to_string();
    for (name, value) in fields {
        let e = c
            .find(Locator::Css(&format!("form.filters [name=\"{name}\"]")))
            .await
            .unwrap();
        if e.tag_name().await.unwrap() == "select" {
            e.select_by_value(value).await.unwrap();
        } else {
            e.clear().await.unwrap();
            e.send_keys(value).await.unwrap();
        }
    }
    click(c, "form.filters button[type=submit]").await;
    await_url(c, "the filtered page", |u| u != before).await;
}

/// Clicks the element `css` selects.
async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Where keyboard focus goes on `Tab` from the top of the page: the region of each stop.
async fn focus_regions(c: &Client, stops: usize) -> Vec<(String, String)> {
    c.execute(
        "document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);",
        vec![],
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    for _ in 0..stops {
        let tab = KeyActions::new("kb".into())
            .then(KeyAction::Down { value: '\u{e004}' })
            .then(KeyAction::Up { value: '\u{e004}' });
        c.perform_actions(tab).await.unwrap();
        let v = c
            .execute(
                "const e = document.activeElement;
                 const r = e.closest('header nav') ? 'nav' : e.closest('form') ? 'filters'
                         : e.closest('table') ? 'table' : e.closest('nav.paging') ? 'paging' : 'other';
                 return [r, (e.getAttribute('name') || e.textContent || '').trim().slice(0, 30)];",
                vec![],
            )
            .await
            .unwrap();
        out.push((
            v[0].as_str().unwrap_or("").to_owned(),
            v[1].as_str().unwrap_or("").to_owned(),
        ));
    }
    out
}

#[tokio::test]
async fn the_console_in_headless_chromium() {
    let started = Instant::now();
    let db = TestDb::new().await;
    super::console::seed(&db).await;
    let mut admin = db.admin().await;
    qlsched::store::manage::set_project(&mut admin, "other", "active")
        .await
        .unwrap();
    qlsched::store::manage::publish_task(&mut admin, "other", "task-o", "{}")
        .await
        .unwrap();
    // Monthly in Berlin: the next ten occurrences cross a DST change.
    for (id, project, task, cron) in [
        ("con-m", "proj", "task", "0 3 1 * *"),
        ("oth-1", "other", "task-o", "*/5 * * * *"),
    ] {
        let spec =
            qlsched::store::manage::TriggerSpec::new(id, project, task, cron, "Europe/Berlin");
        qlsched::store::manage::publish_trigger(&mut admin, &spec)
            .await
            .unwrap();
    }
    ok(ql(&db, &["trigger", "fire", "con-b", "--request-id", "r1"]));
    let mut r = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "web1", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    crate::helpers::wait_until("runs of con-a", Duration::from_secs(20), || async {
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a'")
            .await
            >= 4
    })
    .await;
    let base = format!("http://{}", r.http);
    let (_driver, c) = start_browser().await;
    let go = |path: &str| format!("{base}{path}");

    // Overview.
    c.goto(&go("/")).await.unwrap();
    assert_eq!(texts(&c, "h1").await, ["Overview"]);
    let body = text_of(&c, "main").await;
    for needle in [
        "web1",
        "Due backlog",
        "Refusals and back-offs",
        "retention:",
    ] {
        assert!(body.contains(needle), "overview lacks {needle}: {body}");
    }
    assert_eq!(
        c.find_all(Locator::Css("svg.chart")).await.unwrap().len(),
        2
    );
    assert!(
        !c.find_all(Locator::Css("svg.chart rect.bar"))
            .await
            .unwrap()
            .is_empty(),
        "no admission bar"
    );
    // The script ran (CSP allows the file), and its auto-refresh control is there.
    assert!(c
        .find(Locator::Css("html[data-js=ready] #auto-refresh"))
        .await
        .is_ok());
    screenshot(&c, "overview").await;
    assert_clean_log(&c, "/").await;

    // Triggers: keyset paging of 2.
    c.goto(&go("/triggers?limit=2")).await.unwrap();
    let pages: [&[&str]; 3] = [&["con-a", "con-b"], &["con-m", "con-x"], &["oth-1"]];
    for (n, page) in pages.iter().enumerate() {
        if n > 0 {
            click(&c, "a[rel=next]").await;
            let after = format!("after={}", pages[n - 1].last().unwrap());
            await_url(&c, &format!("page {}", n + 1), |u| u.contains(&after)).await;
        }
        assert_eq!(trigger_ids(&c).await, *page, "page {}", n + 1);
    }
    assert!(
        c.find(Locator::Css("a[rel=next]")).await.is_err(),
        "a last page has no next"
    );
    // Filters: id prefix, project, state.
    c.goto(&go("/triggers")).await.unwrap();
    submit_filter(&c, &[("q", "con-")]).await;
    assert_eq!(trigger_ids(&c).await, ["con-a", "con-b", "con-m", "con-x"]);
    submit_filter(&c, &[("q", ""), ("project", "other")]).await;
    assert_eq!(trigger_ids(&c).await, ["oth-1"]);
    submit_filter(&c, &[("project", ""), ("state", "disabled")]).await;
    assert_eq!(trigger_ids(&c).await, ["con-x"]);
    // Keyboard: the main navigation first, then the filters, then the table's links.
    c.goto(&go("/triggers")).await.unwrap();
    let stops = focus_regions(&c, 10).await;
    let regions: Vec<&str> = stops.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        regions,
        [
            "nav", "nav", "nav", "nav", "filters", "filters", "filters", "filters", "table",
            "table"
        ],
        "{stops:?}"
    );
    assert_eq!(stops[0].1, "Overview");
    assert_eq!(stops[3].1, "Audit");
    assert_eq!(stops[4].1, "q");
    assert_eq!(stops[8].1, "con-a");
    screenshot(&c, "triggers").await;
    assert_clean_log(&c, "/triggers").await;

    // One trigger: definition, next 10 occurrences with a DST mark, its runs and chart.
    c.goto(&go("/triggers/con-m")).await.unwrap();
    assert_eq!(texts(&c, "h1").await, ["Trigger con-m"]);
    assert_eq!(texts(&c, "#upcoming tbody tr").await.len(), 10);
    let dst = texts(&c, "#upcoming .dst").await;
    assert!(
        dst.iter().any(|d| d.contains("+01:00 → +02:00")),
        "no DST mark in {dst:?}"
    );
    screenshot(&c, "trigger-dst").await;
    c.goto(&go("/triggers/con-a")).await.unwrap();
    assert!(texts(&c, "#runs tbody tr").await.len() >= 4);
    assert!(c.find(Locator::Css("svg.chart polyline")).await.is_ok());
    screenshot(&c, "trigger").await;
    // The note holding a script is text, and nothing ran.
    c.goto(&go("/triggers/con-x")).await.unwrap();
    let note = text_of(&c, "#disable-note").await;
    assert!(
        note.contains("<script>window.__xss=1</script> & <b>bold</b>")
            && note.contains("<img src=x onerror=alert(1)>"),
        "{note}"
    );
    let xss = c.execute("return window.__xss === undefined && !document.querySelector('#disable-note b, #disable-note img, main script');", vec![]).await.unwrap();
    assert_eq!(xss, json!(true), "markup from the note reached the DOM");
    assert_clean_log(&c, "/triggers/{id}").await;

    // Runs: filter by kind, by trigger; keyset paging.
    c.goto(&go("/runs")).await.unwrap();
    assert!(texts(&c, "#runs tbody tr").await.len() >= 5);
    submit_filter(&c, &[("kind", "manual")]).await;
    assert_eq!(
        texts(&c, "#runs tbody tr td:nth-child(3)").await,
        ["manual"]
    );
    assert_eq!(texts(&c, "#runs tbody tr td:nth-child(2)").await, ["con-b"]);
    submit_filter(
        &c,
        &[("kind", ""), ("trigger", "con-a"), ("status", "queued")],
    )
    .await;
    let kinds = texts(&c, "#runs tbody tr td:nth-child(3)").await;
    assert!(
        kinds.len() >= 4 && kinds.iter().all(|k| k == "cron"),
        "{kinds:?}"
    );
    c.goto(&go("/runs?trigger=con-a&limit=2")).await.unwrap();
    let first = texts(&c, "#runs tbody tr td:first-child").await;
    click(&c, "a[rel=next]").await;
    await_url(&c, "older runs", |u| u.contains("before=")).await;
    let second = texts(&c, "#runs tbody tr td:first-child").await;
    assert_eq!(second.len(), 2);
    assert!(
        first.iter().all(|id| !second.contains(id)),
        "{first:?} {second:?}"
    );
    c.goto(&go("/runs")).await.unwrap();
    screenshot(&c, "runs").await;
    assert_clean_log(&c, "/runs").await;

    // One run: a dispatcher takes a run of con-a and records a failure whose output carries
    // markup; the page shows the attempt and its output as text, and nothing ran.
    let run_id = fail_one_run(&db, "<script>window.__out=1</script> & <b>bold</b>").await;
    c.goto(&go(&format!("/runs/{run_id}"))).await.unwrap();
    assert_eq!(texts(&c, "h1").await, [format!("Run {run_id}")]);
    assert_eq!(text_of(&c, "#run-status").await, "failed");
    let attempts = text_of(&c, "section[aria-labelledby=attempts-h]").await;
    assert!(
        attempts.contains("Attempt 1: failed")
            && attempts.contains("<script>window.__out=1</script> & <b>bold</b>"),
        "{attempts}"
    );
    let out = c.execute("return window.__out === undefined && !document.querySelector('main pre b, main pre script');", vec![]).await.unwrap();
    assert_eq!(out, json!(true), "markup from the output reached the DOM");
    assert!(texts(&c, "#events tbody tr").await.len() >= 4);
    screenshot(&c, "run").await;
    assert_clean_log(&c, "/runs/{id}").await;

    // JavaScript off: every page still works, filters too (plain GET forms).
    c.issue_cmd(Post {
        path: "goog/cdp/execute",
        body: json!({ "cmd": "Emulation.setScriptExecutionDisabled", "params": { "value": true } }),
    })
    .await
    .expect("disable JavaScript");
    let run_page = format!("/runs/{run_id}");
    for path in [
        "/",
        "/triggers",
        "/triggers/con-a",
        "/runs",
        run_page.as_str(),
    ] {
        c.goto(&go(path)).await.unwrap();
        assert!(
            c.find(Locator::Css("html[data-js]")).await.is_err(),
            "{path}: the script ran with JavaScript off"
        );
        assert!(
            c.find(Locator::Css("main table")).await.is_ok(),
            "{path}: no table"
        );
    }
    c.goto(&go("/triggers")).await.unwrap();
    submit_filter(&c, &[("q", "oth")]).await;
    assert_eq!(trigger_ids(&c).await, ["oth-1"]);
    assert_clean_log(&c, "JavaScript off").await;

    c.close().await.unwrap();
    r.terminate(Duration::from_secs(20)).await;
    eprintln!("console browser walk: {:?}", started.elapsed());
}

/// Takes one queued run through the dispatcher protocol and records it failed with `output`
/// as its output tail; returns the run's id.
async fn fail_one_run(db: &TestDb, output: &str) -> uuid::Uuid {
    let d = db.client("qlsched_dispatcher").await;
    let taken = d
        .query_one(
            "SELECT run_id, attempt_id, lease_token FROM qlsched.dispatch_take('w-shot', NULL, 1, 60000)",
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
    assert!(started, "the taken run starts");
    let finished: bool = d
        .query_one(
            "SELECT qlsched.dispatch_finish($1, $2, 'failed', 1, $3, 'exited with status 1', NULL)",
            &[&attempt, &token, &output],
        )
        .await
        .unwrap()
        .get(0);
    assert!(finished, "the started run finishes");
    run_id
}

/// Sends `header` with every request of the browser from now on (Chromium's DevTools
/// protocol): the console's credentials, as a browser sends them after its login prompt.
async fn send_header(c: &Client, header: (&str, &str)) {
    for (cmd, params) in [
        ("Network.enable", json!({})),
        (
            "Network.setExtraHTTPHeaders",
            json!({ "headers": { header.0: header.1 } }),
        ),
    ] {
        c.issue_cmd(Post {
            path: "goog/cdp/execute",
            body: json!({ "cmd": cmd, "params": params }),
        })
        .await
        .expect(cmd);
    }
}

/// Sets the value of the input `css` selects (a `datetime-local` takes no typed keys
/// portably).
async fn set_value(c: &Client, css: &str, value: &str) {
    c.execute(
        "document.querySelector(arguments[0]).value = arguments[1];",
        vec![json!(css), json!(value)],
    )
    .await
    .unwrap();
}

/// The operator's actions in the browser: disable with a note, a double-clicked fire (one
/// run), a backfill through its confirmation page, a failed run retried; a viewer's page
/// has no form, and a form posted from another origin is refused. Screenshots of the
/// actions, the confirmation and the outcome for docs/console.md.
#[tokio::test]
async fn console_actions_in_headless_chromium() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    super::console::seed(&db).await;
    let file =
        crate::helpers::http::secret_file(dir.path(), "roles", super::console::ROLES_FILE, 0o600);
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "web2",
        "",
        &[("QLSCHED__HTTP__CONSOLE_AUTH_FILE", file.as_str())],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    crate::helpers::wait_until("a run of con-a", Duration::from_secs(20), || async {
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a'")
            .await
            >= 1
    })
    .await;
    let failed = fail_one_run(&db, "boom").await;
    let base = format!("http://{}", r.http);
    let go = |path: &str| format!("{base}{path}");
    let (_driver, c) = start_browser().await;

    // A viewer: every page, no form that acts.
    send_header(&c, super::console::BOB).await;
    c.goto(&go("/triggers/con-a")).await.unwrap();
    assert!(
        c.find(Locator::Css("#actions")).await.is_err(),
        "a viewer sees actions"
    );
    assert!(c.find(Locator::Css("form[method=post]")).await.is_err());
    assert_clean_log(&c, "the viewer's trigger page").await;

    // The operator: disable con-b with a note.
    send_header(&c, super::console::ALICE).await;
    c.goto(&go("/triggers/con-b")).await.unwrap();
    screenshot(&c, "trigger-actions").await;
    c.find(Locator::Css("#disable-note-input"))
        .await
        .unwrap()
        .send_keys("maintenance <window> & more")
        .await
        .unwrap();
    click(&c, "#disable").await;
    await_url(&c, "the disable's answer", |u| u.ends_with("/disable")).await;
    assert!(text_of(&c, "#outcome").await.starts_with("Disabled"));
    screenshot(&c, "action-done").await;
    assert_clean_log(&c, "the disable").await;
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.triggers WHERE trigger_id = 'con-b' AND operator_disabled AND disabled_note = 'maintenance <window> & more'")
            .await,
        1
    );
    c.goto(&go("/triggers/con-b")).await.unwrap();
    assert!(text_of(&c, "#disable-note")
        .await
        .contains("maintenance <window> & more"));
    assert!(c.find(Locator::Css("#enable")).await.is_ok());

    // A double click on "Fire now": one run.
    c.goto(&go("/triggers/con-a")).await.unwrap();
    c.execute(
        "const b = document.getElementById('fire'); b.click(); b.click();",
        vec![],
    )
    .await
    .unwrap();
    await_url(&c, "the fire's answer", |u| u.ends_with("/fire")).await;
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a' AND idempotency_key LIKE 'ql3:manual:%'")
            .await,
        1,
        "a double click admitted two runs"
    );

    // Backfill ten minutes of con-a: the confirmation says what, then it is done.
    let now = db.now_ms().await;
    let minute = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms / 60_000 * 60_000)
            .unwrap()
            .format("%Y-%m-%dT%H:%M")
            .to_string()
    };
    c.goto(&go("/triggers/con-a")).await.unwrap();
    set_value(&c, "#backfill-from", &minute(now - 1_800_000)).await;
    set_value(&c, "#backfill-to", &minute(now - 1_200_000)).await;
    click(&c, "#backfill").await;
    await_url(&c, "the backfill's confirmation", |u| {
        u.ends_with("/backfill")
    })
    .await;
    assert!(text_of(&c, "#plan").await.starts_with("600 occurrences"));
    screenshot(&c, "backfill-confirm").await;
    let backfilled = "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'con-a' AND admitted_by LIKE 'backfill:%'";
    assert_eq!(db.count(backfilled).await, 0, "the confirmation page wrote");
    click(&c, "#confirm").await;
    crate::helpers::wait_until("the backfill's answer", Duration::from_secs(10), || async {
        c.find(Locator::Css("#outcome")).await.is_ok()
    })
    .await;
    assert_eq!(db.count(backfilled).await, 600);
    assert_clean_log(&c, "the backfill").await;

    // Retry the failed run: one manual run, however often.
    c.goto(&go(&format!("/runs/{failed}"))).await.unwrap();
    click(&c, "#retry").await;
    await_url(&c, "the retry's answer", |u| u.ends_with("/retry")).await;
    assert!(text_of(&c, "#outcome")
        .await
        .starts_with("Admitted one run"));
    let retried = format!("SELECT count(*) FROM qlsched.runs WHERE request_id = 'retry.{failed}'");
    assert_eq!(db.count(&retried).await, 1);

    // Another site's form, posted with the operator's credentials: refused.
    let token = c
        .find(Locator::Css("input[name=csrf]"))
        .await
        .map(|_| ())
        .ok();
    assert!(token.is_none(), "the retry's answer holds no form");
    c.goto(&go("/triggers/con-a")).await.unwrap();
    let csrf = c
        .find(Locator::Css(
            "#enable-form input[name=csrf], #disable-form input[name=csrf]",
        ))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    let evil = format!(
        "data:text/html,<form method=post action='{}'><input name=csrf value='{csrf}'><input name=note value=x></form>",
        go("/triggers/con-a/disable")
    );
    c.goto(&evil).await.unwrap();
    c.execute("document.forms[0].submit();", vec![])
        .await
        .unwrap();
    // The answer is plain text (no page of the console's: nothing to act from).
    crate::helpers::wait_until(
        "the cross-site post's answer",
        Duration::from_secs(10),
        || async {
            c.current_url()
                .await
                .unwrap()
                .as_str()
                .ends_with("/disable")
                && c.find(Locator::Css("body")).await.is_ok()
        },
    )
    .await;
    let body = text_of(&c, "body").await;
    assert!(
        body.contains("403 Forbidden") && body.contains("same origin"),
        "{body}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.triggers WHERE trigger_id = 'con-a' AND enabled")
            .await,
        1,
        "the cross-site post disabled the trigger"
    );

    // Every action in the audit log with the console user.
    let page: Value = serde_json::from_str(&ok(ql(&db, &["audit", "--json"]))).unwrap();
    let mine: Vec<(String, String)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["source"] == "console")
        .map(|e| {
            assert_eq!(e["actor"], "alice", "{e}");
            (
                e["object_id"].as_str().unwrap().to_owned(),
                e["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(mine.len(), 4, "{mine:?}");
    for want in ["disable", "fire", "backfill"] {
        assert!(mine.iter().any(|(_, a)| a == want), "{want}: {mine:?}");
    }
    c.close().await.unwrap();
    r.terminate(Duration::from_secs(20)).await;
}
