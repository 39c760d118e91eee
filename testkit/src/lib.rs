//! Test harness: one throwaway PostgreSQL per test binary, a migrated template database,
//! and a fresh database per test (`CREATE DATABASE … TEMPLATE`, tens of ms).

pub mod bench_server;
pub mod claimed;
pub mod cli;
pub mod deadhost;
pub mod delay;
pub mod dispatchers;
pub mod drive;
pub mod http;
pub mod invariants;
pub mod netns;
pub mod pg;
pub mod pgbouncer;
pub mod proxy;
pub mod replica;
pub mod tls;
pub mod twin;
pub mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use qlsched::db;
use qlsched::db::Pool;
use qlsched::schema::{self, Roles};
use qlsched::store::manage::{self, TriggerSpec};

pub const PREFIX: &str = "qlsched";
pub const TEMPLATE: &str = "qlsched_template";

pub struct Cluster {
    pub port: u16,
    pub root: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
pub static NEXT_DB: AtomicU32 = AtomicU32::new(0);

static ROOTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Stops the cluster under `root` and removes its files when the test binary exits.
pub fn remove_at_exit(root: PathBuf) {
    let mut roots = ROOTS.lock().unwrap();
    if roots.is_empty() {
        unsafe { libc::atexit(remove_clusters_at_exit) };
    }
    roots.push(root);
}

extern "C" fn remove_clusters_at_exit() {
    let roots = ROOTS.lock().map(|r| r.clone()).unwrap_or_default();
    for root in roots {
        // The postmaster gets SIGQUIT from its parent-death signal; remove its files.
        let pid_file = root.join("data/postmaster.pid");
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.lines().next()?.parse::<i32>().ok())
        {
            unsafe { libc::kill(pid, libc::SIGQUIT) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// Starts a server under `root` (emptied first) for the rest of the test process: it is the
/// child of a thread that lives as long as the process, so its parent-death signal fires only
/// when the test binary exits. `prepare` runs on the initialised data directory before the
/// start; `root` is removed at exit. Returns the port.
pub(crate) fn start_for_the_process(
    root: &std::path::Path,
    conf: String,
    what: &str,
    prepare: impl FnOnce(&pg::Server) + Send + 'static,
) -> u16 {
    let _ = std::fs::remove_dir_all(root);
    let (tx, rx) = std::sync::mpsc::channel();
    let thread_root = root.to_path_buf();
    std::thread::spawn(move || {
        let mut server = pg::Server::init(&thread_root, &conf);
        prepare(&server);
        server.start();
        tx.send(server.port).unwrap();
        let _keep = server;
        loop {
            std::thread::park();
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("{what} failed to start (see panic above)"));
    remove_at_exit(root.to_path_buf());
    port
}

/// Runs `f` to completion on a runtime and a thread of its own (so it can be called from
/// inside a test's runtime), panicking with `what` if it panicked.
pub(crate) fn on_own_runtime<F>(what: &str, f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
    .join()
    .unwrap_or_else(|_| panic!("{what}"));
}

/// The shared cluster, started on first use with a migrated template database.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("qlsched-it-{}", std::process::id()));
        // pg_stat_statements keeps every test's statements: tests that count a database's
        // statements read deltas, which an eviction of older entries would make negative.
        let port = start_for_the_process(
            &root,
            "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             shared_preload_libraries = 'pg_stat_statements'\n\
             pg_stat_statements.max = 50000\n"
                .into(),
            "PostgreSQL",
            |_| {},
        );
        on_own_runtime("template database", make_template(port));
        Cluster { port, root }
    })
}

pub fn pg_config(port: u16, user: &str, db: &str) -> tokio_postgres::Config {
    format!("host=127.0.0.1 port={port} user={user} dbname={db} connect_timeout=10")
        .parse()
        .unwrap()
}

pub async fn make_template(port: u16) {
    let roles = roles();
    schema::bootstrap(&pg_config(port, "postgres", "postgres"), &roles, TEMPLATE)
        .await
        .expect("bootstrap");
    schema::migrate(&pg_config(port, &roles.owner, TEMPLATE), &roles)
        .await
        .expect("migrate");
}

/// A fresh database made from the migrated template.
#[derive(Clone)]
pub struct TestDb {
    pub name: String,
    pub port: u16,
}

impl TestDb {
    pub async fn new() -> TestDb {
        TestDb::from_template(cluster().port, "t").await.0
    }

    /// A fresh database `<letter><pid>_<n>` on the server at `port`, made from its migrated
    /// template, with the superuser connection that made it.
    pub async fn from_template(port: u16, letter: &str) -> (TestDb, tokio_postgres::Client) {
        let name = format!(
            "{letter}{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::SeqCst)
        );
        let admin = db::connect(&pg_config(port, "postgres", "postgres"))
            .await
            .unwrap();
        admin
            .batch_execute(&format!(
                "CREATE DATABASE {name} TEMPLATE {TEMPLATE} OWNER {PREFIX}_owner"
            ))
            .await
            .expect("create test database");
        // `CREATE DATABASE` gives PUBLIC CONNECT and TEMPORARY; `db bootstrap` revokes what
        // qlsched's roles must not hold (TEMPORARY: `db check` refuses it). CONNECT stays with
        // PUBLIC here, for the roles tests create.
        admin
            .batch_execute(&format!("REVOKE TEMPORARY ON DATABASE {name} FROM PUBLIC"))
            .await
            .expect("revoke TEMPORARY on the test database");
        (TestDb { name, port }, admin)
    }

    pub fn config(&self, user: &str) -> tokio_postgres::Config {
        pg_config(self.port, user, &self.name)
    }

    pub fn dsn(&self, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={}",
            self.port, self.name
        )
    }

    pub async fn client(&self, user: &str) -> tokio_postgres::Client {
        db::connect(&self.config(user)).await.unwrap()
    }
    /// Statements the runtime role has run in this database, counted by the server
    /// (`pg_stat_statements`, read from the `postgres` database so that this database stays
    /// free of extension objects).
    pub async fn runtime_statements(&self) -> i64 {
        self.runtime_statement_texts()
            .await
            .iter()
            .map(|(_, calls)| calls)
            .sum()
    }

    /// The runtime role's statements in this database with their calls
    /// (`pg_stat_statements`).
    pub async fn runtime_statement_texts(&self) -> Vec<(String, i64)> {
        self.statement_texts_of("qlsched_runtime").await
    }

    /// `role`'s statements in this database with their calls (`pg_stat_statements`).
    pub async fn statement_texts_of(&self, role: &str) -> Vec<(String, i64)> {
        let (client, connection) = pg_config(self.port, "postgres", "postgres")
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .unwrap();
        client
            .query(
                "SELECT s.query, s.calls FROM pg_stat_statements s
                   JOIN pg_database d ON d.oid = s.dbid JOIN pg_roles r ON r.oid = s.userid
                  WHERE d.datname = $1 AND r.rolname = $2",
                &[&self.name, &role],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    pub async fn superuser(&self) -> tokio_postgres::Client {
        self.client("postgres").await
    }
    /// The database clock, in ms since the epoch (the scheduler's time authority).
    pub async fn now_ms(&self) -> i64 {
        db_now_ms(&self.superuser().await).await
    }
    /// Replicas' wake-up listeners connected to this database.
    pub async fn listeners(&self) -> i64 {
        self.count(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND query = 'LISTEN qlsched_wake'",
        )
        .await
    }
    /// Publishes the every-second trigger `trigger` in project `proj` and waits (up to
    /// `within`) for its first run.
    pub async fn publish_and_await_first_run(
        &self,
        admin: &mut tokio_postgres::Client,
        trigger: &str,
        within: Duration,
    ) -> FirstRun {
        manage::publish_trigger(
            admin,
            &TriggerSpec::new(trigger, "proj", "task", "* * * * * *", "UTC"),
        )
        .await
        .unwrap();
        // The database clock the publish read "now" at.
        let published = self
            .count(&format!(
                "SELECT updated_at_ms FROM qlsched.triggers WHERE trigger_id = '{trigger}'"
            ))
            .await;
        let runs = format!("SELECT count(*) FROM qlsched.runs WHERE trigger_id = '{trigger}'");
        wait_until(&format!("the first run of {trigger}"), within, || async {
            self.count(&runs).await >= 1
        })
        .await;
        let (scheduled, queued) = self.first_run(trigger).await;
        FirstRun {
            published,
            scheduled,
            queued,
        }
    }
    /// (scheduled_for, queued_at) of the first run of `trigger`.
    async fn first_run(&self, trigger: &str) -> (i64, i64) {
        let r = self
            .superuser()
            .await
            .query_one(
                "SELECT scheduled_for_ms, queued_at_ms FROM qlsched.runs WHERE trigger_id = $1
                  ORDER BY scheduled_for_ms LIMIT 1",
                &[&trigger],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    }
    /// An admin connection, after making project `proj` (active) and task `task`.
    pub async fn admin_with_project(&self) -> tokio_postgres::Client {
        let mut admin = self.admin().await;
        manage::set_project(&mut admin, "proj", "active")
            .await
            .unwrap();
        manage::publish_task(&mut admin, "proj", "task", "{\"image\":\"demo\"}")
            .await
            .unwrap();
        admin
    }
    pub async fn admin(&self) -> tokio_postgres::Client {
        self.client("qlsched_admin").await
    }
    /// How a replica's claim round and admit engine connect to this database.
    pub fn connector(&self) -> qlsched::db::session::Connector {
        qlsched::db::session::Connector {
            pg: self.config("qlsched_runtime").into(),
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// Actor settings for driving a supervisor in-process against this database: budget 16,
    /// lease 30 s, cadence 1 s, no guard, no listener. Tests change what they need.
    pub fn actor_settings(&self, owner: &str) -> qlsched::actors::Settings {
        qlsched::actors::Settings {
            owner: owner.into(),
            claim_budget: 16,
            lease: Duration::from_secs(30),
            cadence: Duration::from_secs(1),
            drain: Duration::from_secs(2),
            admit_timeout: Duration::from_secs(2),
            max_serialization_retries: 5,
            reject_backoff: Duration::from_secs(60),
            listen: false,
            guard: None,
            backlog_interval: Duration::from_secs(10),
            connector: self.connector(),
        }
    }

    /// [`TestDb::actor_settings`] with the given cadence and lease.
    pub fn settings(
        &self,
        owner: &str,
        cadence_ms: u64,
        lease_ms: u64,
    ) -> qlsched::actors::Settings {
        qlsched::actors::Settings {
            cadence: Duration::from_millis(cadence_ms),
            lease: Duration::from_millis(lease_ms),
            ..self.actor_settings(owner)
        }
    }

    /// Backends of this database waiting for a lock (any kind).
    pub async fn lock_waiters(&self) -> i64 {
        self.count(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await
    }

    /// Runs per status and state of their last attempt, `status/state:n` in order, space
    /// separated (`queued/claimed:3 succeeded/succeeded:2`).
    pub async fn status_counts(&self) -> String {
        self.superuser()
            .await
            .query(
                "SELECT r.status || '/' || a.state || ':' || count(*)
                   FROM qlsched.runs r
                   JOIN LATERAL (SELECT a.state FROM qlsched.attempts a WHERE a.run_id = r.run_id
                                  ORDER BY a.attempt_no DESC LIMIT 1) a ON true
                  GROUP BY r.status, a.state ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn runtime_pool(&self, size: u32) -> Pool {
        db::build_pool(
            self.config("qlsched_runtime"),
            size,
            Duration::from_secs(10),
            &discard_log(),
        )
    }

    /// One active project, one task, and `n` triggers `trg-00000…` with the given
    /// expression, published one by one (each cursor at its first occurrence after its
    /// publish, as publishing sets it).
    pub async fn seed(&self, n: usize, expr: &str) -> Vec<String> {
        let mut admin = self.admin_with_project().await;
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let id = format!("trg-{i:05}");
            manage::publish_trigger(
                &mut admin,
                &TriggerSpec::new(&id, "proj", "task", expr, "UTC"),
            )
            .await
            .unwrap();
            ids.push(id);
        }
        ids
    }

    /// A fresh database with `n` every-second triggers (see [`TestDb::seed`]), all
    /// initialised and due 100 ms ago.
    pub async fn with_due(n: usize) -> TestDb {
        let db = TestDb::new().await;
        db.seed(n, "* * * * * *").await;
        db.make_due(-100).await;
        db
    }

    /// Sets every schedule's cursor to `offset_ms` relative to the database clock (negative
    /// = due in the past), as an initialised-and-due state, without waiting for a claim.
    pub async fn make_due(&self, offset_ms: i64) {
        self.superuser()
            .await
            .execute(
                "UPDATE qlsched.trigger_schedules
                    SET next_fire_at_ms = (extract(epoch FROM clock_timestamp())*1000)::bigint + $1,
                        claimable_at_ms = (extract(epoch FROM clock_timestamp())*1000)::bigint + $1,
                        state_version = state_version + 1",
                &[&offset_ms],
            )
            .await
            .unwrap();
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.superuser()
            .await
            .query_one(sql, &[])
            .await
            .unwrap()
            .get(0)
    }

    /// The exactly-once invariants every test ends with (`sql/invariants.sql`).
    pub async fn assert_invariants(&self) {
        invariants::assert_holds(&self.superuser().await).await;
    }
}

pub fn discard_log() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

/// Polls `cond` until it holds or `within` passes; panics naming `what` on time-out.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first run of an every-second trigger published during a test, by the database clock:
/// when the publish read the clock, the first occurrence's instant and when that was
/// admitted.
#[derive(Clone, Copy, Debug)]
pub struct FirstRun {
    pub published: i64,
    pub scheduled: i64,
    pub queued: i64,
}

impl FirstRun {
    /// The first run is the very first occurrence after the publish (nothing skipped), and it
    /// was admitted at most `within_ms` after its time (`why` names that bound).
    pub fn assert_first_admitted_within(&self, within_ms: i64, why: &str) {
        assert_eq!(
            self.scheduled,
            (self.published / 1000 + 1) * 1000,
            "the first run is not the first occurrence after the publish at {}",
            self.published
        );
        assert!(
            self.queued - self.scheduled <= within_ms,
            "admitted {} ms after its time: {why}",
            self.queued - self.scheduled
        );
    }
}

pub fn unique_owner(tag: &str) -> String {
    format!("{tag}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// Polls `f` until it yields a value or `within` passes; panics naming `what` on time-out.
pub async fn poll_until<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl TestDb {
    /// Like `seed`, but in a few bulk statements (fast for thousands of triggers). Rows are
    /// initialised and due `due_offset_ms` from now (negative = overdue).
    pub async fn seed_bulk(&self, n: usize, expr: &str, due_offset_ms: i64) {
        let admin = self.admin_with_project().await;
        let digest = TriggerSpec::new("x", "proj", "task", expr, "UTC").content_digest();
        admin
            .execute(
                "INSERT INTO qlsched.triggers (trigger_id, project_id, task_id, revision, cron_expr, timezone, content_digest, updated_at_ms)
                 SELECT 'trg-' || lpad(g::text, 5, '0'), 'proj', 'task', 1, $2, 'UTC', $3, 0 FROM generate_series(0, $1 - 1) g",
                &[&(n as i32), &expr, &digest],
            )
            .await
            .unwrap();
        admin
            .execute(
                "INSERT INTO qlsched.trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms, claimable_at_ms, updated_at_ms)
                 SELECT trigger_id, 'proj', 1, now_ms + $1, now_ms + $1, now_ms
                   FROM qlsched.triggers, (SELECT (extract(epoch FROM clock_timestamp())*1000)::bigint AS now_ms) c",
                &[&due_offset_ms],
            )
            .await
            .unwrap();
        self.superuser()
            .await
            .batch_execute("ANALYZE")
            .await
            .unwrap();
    }
}

/// The rows of `sql` (no parameters) as pairs of their first two columns.
pub async fn pairs<A, B>(c: &tokio_postgres::Client, sql: &str) -> Vec<(A, B)>
where
    A: for<'a> tokio_postgres::types::FromSql<'a>,
    B: for<'a> tokio_postgres::types::FromSql<'a>,
{
    c.query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The backend pid of the session `c`.
pub async fn backend_pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// `sql` (a removal of admitted work) on `c` is refused by the permanence guard.
pub async fn assert_removal_refused(c: &tokio_postgres::Client, sql: &str) {
    let err = c.batch_execute(sql).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::RESTRICT_VIOLATION),
        "`{sql}`: {err}"
    );
}

/// Each run's command ran once, with its own key: `dir` holds one file per run, named for
/// its run id and holding its idempotency key (what the reference dispatchers' test command
/// writes), and nothing else.
pub async fn assert_each_run_wrote_its_key(su: &tokio_postgres::Client, dir: &std::path::Path) {
    let runs: Vec<(uuid::Uuid, String)> =
        pairs(su, "SELECT run_id, idempotency_key FROM qlsched.runs").await;
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), runs.len());
    for (id, key) in &runs {
        let written = std::fs::read_to_string(dir.join(id.to_string())).unwrap();
        assert_eq!(written.trim(), key);
    }
}

/// Terminates the backends of the current database that match `filter` (an SQL condition on
/// `pg_stat_activity`); how many.
pub async fn terminate_backends(c: &tokio_postgres::Client, filter: &str) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND {filter}) t"
    );
    c.query_one(&sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .get(0)
}

/// Every schedule row due `secs` whole seconds ago by the database clock (on a second
/// boundary, as an every-second cron would have it).
pub async fn make_due_seconds_ago(c: &tokio_postgres::Client, secs: i64) {
    c.execute(
        "UPDATE qlsched.trigger_schedules
            SET next_fire_at_ms = ((extract(epoch FROM clock_timestamp()) * 1000)::bigint / 1000 - $1) * 1000,
                claimable_at_ms = ((extract(epoch FROM clock_timestamp()) * 1000)::bigint / 1000 - $1) * 1000,
                state_version = state_version + 1",
        &[&secs],
    )
    .await
    .unwrap();
}

/// Runs written as an admission writes them (the run, events 1 `run.created` and 2
/// `run.queued`, attempt 1), one per row of `rows`: a query of `run_id`, `trigger_id`,
/// `execution_revision_id`, `status`, `scheduled_for_ms`, `queued_at_ms` and `admitted_by`
/// (project `proj`, task `task`, revisions 1, a cron key). The attempt is `claimed` for a
/// queued run and takes the run's status otherwise.
pub async fn insert_runs(su: &tokio_postgres::Client, rows: &str) {
    su.batch_execute(&format!(
        "WITH spec AS ({rows}),
              run AS (
           INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                     task_revision, execution_revision_id, idempotency_key,
                                     status, scheduled_for_ms, queued_at_ms, admitted_by)
           SELECT run_id, 'proj', trigger_id, 1, 'task', 1, execution_revision_id,
                  'ql3:cron:v1:' || trigger_id || ':1:' || scheduled_for_ms, status,
                  scheduled_for_ms, queued_at_ms, admitted_by
             FROM spec
           RETURNING run_id, queued_at_ms, status),
              ev AS (
           INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
           SELECT run_id, s, CASE s WHEN 1 THEN 'run.created' ELSE 'run.queued' END, queued_at_ms
             FROM run, generate_series(1, 2) s)
         INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
         SELECT gen_random_uuid(), run_id, 1, 'remote_worker',
                CASE status WHEN 'queued' THEN 'claimed' ELSE status END, queued_at_ms FROM run"
    ))
    .await
    .unwrap_or_else(|e| panic!("inserting runs of `{rows}`: {e:?}"));
}

/// The role names of the test cluster's install (prefix [`PREFIX`]).
pub fn roles() -> Roles {
    Roles::with_prefix(PREFIX).unwrap()
}

/// Unix ms as RFC 3339 UTC with milliseconds, the form the CLI takes.
pub fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The plan `explain` (an `EXPLAIN …` statement) prints, one line per plan line.
pub async fn plan(
    c: &tokio_postgres::Client,
    explain: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> String {
    c.query(explain, params)
        .await
        .unwrap_or_else(|e| panic!("{explain}: {e:?}"))
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The pages an `EXPLAIN (ANALYZE, BUFFERS)` plan reports for one node: the sum of the
/// figures (hit, read, dirtied, written) of the first `Buffers:` line at or after the first
/// line containing `node` (`""`: the top node, i.e. the whole statement). Panics, showing the
/// plan, when there is none.
pub fn plan_buffers(plan: &str, node: &str) -> u64 {
    plan.lines()
        .skip_while(|l| !l.contains(node))
        .find_map(|l| l.trim_start().strip_prefix("Buffers:"))
        .unwrap_or_else(|| panic!("no buffers of `{node}` in the plan:\n{plan}"))
        .split_whitespace()
        .filter_map(|w| w.split_once('=').and_then(|(_, n)| n.parse::<u64>().ok()))
        .sum()
}

/// The actual rows an `EXPLAIN ANALYZE` plan reports on a node line (`rows=64` before
/// PostgreSQL 18, `rows=64.00` from 18 on).
pub fn line_actual_rows(line: &str) -> Option<u64> {
    let n = line.split("actual rows=").nth(1)?;
    let n: String = n
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    n.parse::<f64>().ok().map(|n| n.round() as u64)
}

/// The actual rows of the first line of `plan` containing `node`; panics, showing the plan,
/// when there is none.
pub fn plan_actual_rows(plan: &str, node: &str) -> u64 {
    plan.lines()
        .find(|l| l.contains(node))
        .and_then(line_actual_rows)
        .unwrap_or_else(|| panic!("no actual rows of `{node}` in the plan:\n{plan}"))
}

/// The database clock on `c`, in ms since the epoch: the scheduler's time authority, read with
/// the scheduler's own SQL fragment (`qlsched::db_now_ms!`). The one reading of it in the tests.
pub async fn db_now_ms(c: &tokio_postgres::Client) -> i64 {
    c.query_one(concat!("SELECT ", qlsched::db_now_ms!()), &[])
        .await
        .unwrap()
        .get(0)
}

/// A superuser transaction holding `LOCK TABLE qlsched.runs IN EXCLUSIVE MODE`: claims go on
/// (they never touch `runs`), every admission waits for the lock before it touches any row
/// (the INSERT's table lock is taken when the statement starts). `release` commits; dropped
/// unreleased, it rolls back when its connection closes.
pub struct RunsLock(tokio_postgres::Client);

impl RunsLock {
    pub async fn take(db: &TestDb) -> RunsLock {
        let c = db.superuser().await;
        c.batch_execute("BEGIN; LOCK TABLE qlsched.runs IN EXCLUSIVE MODE")
            .await
            .unwrap();
        RunsLock(c)
    }

    pub async fn release(&self) {
        self.0.batch_execute("COMMIT").await.unwrap();
    }
}

/// A supervisor driven in-process with `s` (no watchdog heartbeat), with its metrics and
/// health handles.
pub fn start_supervisor(
    s: qlsched::actors::Settings,
) -> (
    actix::Addr<qlsched::actors::supervisor::Supervisor>,
    qlsched::metrics::Metrics,
    qlsched::health::Health,
) {
    use actix::Actor;
    let (metrics, health) = (
        qlsched::metrics::Metrics::default(),
        qlsched::health::Health::default(),
    );
    let sup = qlsched::actors::supervisor::Supervisor::new(
        s,
        metrics.clone(),
        &discard_log(),
        None,
        health.clone(),
    )
    .start();
    (sup, metrics, health)
}
