//! Drills: the real `qlsched` binary, real config files, real PostgreSQL, and a
//! failure injected again and again; each drill ends with the SQL invariant checker
//! ([`check`]) and prints its table. See docs/drills.md.
//!
//! Every drill has a short form (run by `cargo test`) and a long form, selected by the
//! environment (`scripts/drill.sh NAME [--cycles N] [--duration S]` sets it):
//! `QLSCHED_DRILL_LONG`, `QLSCHED_DRILL_CYCLES` and/or `QLSCHED_DRILL_DURATION` (seconds)
//! select the long form (the last two override its figures); `QLSCHED_DRILL_SEED` replays a
//! random schedule. Drills run one at a time (they measure recovery times on a
//! 2-core machine); other tests still run beside them.

pub mod check;

mod actor_crash;
mod backend_termination;
mod clock_skew;
mod commit_reply_lost;
mod findings;
mod kill_restart;
mod netns;
mod overlap;
mod partition;
mod pg_restart;
mod republish;
mod rolling_upgrade;
mod same_replica_id;
mod slow_link;
mod standby_promotion;
mod worker;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use qlsched::schema;

use crate::helpers::pg::Server;
use crate::helpers::proxy::Proxy;
use crate::helpers::replica::ReplicaProc;
use crate::helpers::{pg_config, TestDb};
use check::{Expect, Figures};

/// Every drill's triggers fire every second.
pub const EVERY_SECOND: &str = "* * * * * *";

/// Only one drill at a time: they are timing-sensitive and CPU-hungry.
static DRILL_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The drills' turn, for any test that must not share the cores with a drill.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    DRILL_LOCK.lock().await
}

/// A drill under way: its turn (the drill lock), its form, its seeded generator and its
/// report. Held for the whole drill.
pub struct Drill {
    pub p: Params,
    pub rng: Rng,
    pub report: Report,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Drill {
    /// Waits for the drill's turn, reads its form from the environment ([`Params::from_env`]
    /// with the `short` and `long` figures) and starts its report, whose set-up line
    /// `describe` writes from the form and the random seed.
    pub async fn begin(
        name: &'static str,
        short: (u32, u64),
        long: (u32, u64),
        describe: impl FnOnce(&Params, u64) -> String,
    ) -> Drill {
        let turn = exclusive().await;
        let p = Params::from_env(short, long);
        let rng = Rng::from_env();
        let report = Report::new(name, &p, describe(&p, rng.0));
        Drill {
            p,
            rng,
            report,
            _turn: turn,
        }
    }
}

/// Where most drills play out: a database with `triggers` every-second triggers, a
/// superuser connection for the checks, and the fleet of replicas (none started yet) on the
/// runtime role, connected directly or through the fault proxy.
pub struct Stage {
    // Dropped in this order: the replicas first, then what they talk to.
    pub fleet: Fleet,
    /// Made by [`Stage::through_proxy`].
    pub proxy: Option<Proxy>,
    pub sql: Client,
    pub db: TestDb,
    triggers: usize,
}

impl Stage {
    /// A fresh database, replicas connected directly.
    pub async fn new(triggers: usize, extra_toml: &str) -> Stage {
        Stage::on(TestDb::new().await, triggers, extra_toml).await
    }

    /// The same on a given database (e.g. on a server of the drill's own).
    pub async fn on(db: TestDb, triggers: usize, extra_toml: &str) -> Stage {
        db.seed(triggers, EVERY_SECOND).await;
        let sql = db.superuser().await;
        let fleet = Fleet::new(&db.dsn("qlsched_runtime"), extra_toml, &[]);
        Stage {
            fleet,
            proxy: None,
            sql,
            db,
            triggers,
        }
    }

    /// A fresh database that the replicas reach only through the fault proxy.
    pub async fn through_proxy(triggers: usize, extra_toml: &str) -> Stage {
        let db = TestDb::new().await;
        db.seed(triggers, EVERY_SECOND).await;
        let sql = db.superuser().await;
        let proxy = Proxy::start(db.port).await;
        let fleet = Fleet::new(&proxy.dsn("qlsched_runtime", &db.name), extra_toml, &[]);
        Stage {
            fleet,
            proxy: Some(proxy),
            sql,
            db,
            triggers,
        }
    }

    /// Starts replicas `ids`, waits until each is ready and the fleet is admitting.
    pub async fn start(&mut self, ids: &[&str]) {
        self.fleet.start(ids).await;
        self.wait_all_admitting().await;
    }

    /// Waits until every seeded trigger has at least one run.
    pub async fn wait_all_admitting(&self) {
        wait_all_admitting(&self.sql, self.triggers as i64, Duration::from_secs(30)).await;
    }
}

/// Short or long form, from the environment.
#[derive(Clone, Debug)]
pub struct Params {
    pub long: bool,
    pub cycles: u32,
    pub duration: Duration,
}

impl Params {
    /// `short` applies under `cargo test`; `long` is the default of the long form, whose
    /// figures `QLSCHED_DRILL_CYCLES` / `QLSCHED_DRILL_DURATION` override.
    pub fn from_env(short: (u32, u64), long: (u32, u64)) -> Params {
        let num = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let cycles = num("QLSCHED_DRILL_CYCLES");
        let secs = num("QLSCHED_DRILL_DURATION");
        let asked = std::env::var_os("QLSCHED_DRILL_LONG").is_some();
        if cycles.is_none() && secs.is_none() && !asked {
            return Params {
                long: false,
                cycles: short.0,
                duration: Duration::from_secs(short.1),
            };
        }
        Params {
            long: true,
            cycles: cycles.map(|c| c as u32).unwrap_or(long.0),
            duration: Duration::from_secs(secs.unwrap_or(long.1)),
        }
    }

    pub fn form(&self) -> &'static str {
        if self.long {
            "long form"
        } else {
            "short form"
        }
    }
}

/// A small seeded generator (xorshift64*): drills print the seed, `QLSCHED_DRILL_SEED`
/// replays it.
pub struct Rng(pub u64, u64);

impl Rng {
    pub fn from_env() -> Rng {
        let seed = std::env::var("QLSCHED_DRILL_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0 | 1);
        Rng(seed, seed)
    }
    /// A generator of its own for one actor of a drill, seeded from the drill's.
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed | 1, seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.1;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.1 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A duration uniformly in `[lo, hi]` (milliseconds).
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// The database clock, Unix ms (the helpers' one reading of it).
pub use crate::helpers::db_now_ms as db_now;

pub async fn scalar(sql: &Client, query: &str) -> i64 {
    sql.query_one(query, &[]).await.unwrap().get(0)
}

/// Waits until no backend of the runtime role is left in this database (stopped replicas'
/// connections closed, terminated backends gone).
pub async fn wait_runtime_backends_gone(sql: &Client, what: &str, within: Duration) {
    crate::helpers::wait_until(what, within, || async {
        scalar(
            sql,
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND usename = 'qlsched_runtime'",
        )
        .await
            == 0
    })
    .await;
}

/// Waits until every seeded trigger has at least one run: the fleet is admitting.
pub async fn wait_all_admitting(sql: &Client, triggers: i64, within: Duration) {
    crate::helpers::wait_until(
        "every trigger admitted at least once",
        within,
        || async move {
            scalar(sql, "SELECT count(DISTINCT trigger_id) FROM qlsched.runs").await >= triggers
        },
    )
    .await;
}

/// SIGKILLs replica `id` as soon as it holds a lease (polling for at most `within`, then
/// killing anyway) and returns the leases it held at its death.
pub async fn kill_holding_leases(
    fleet: &mut Fleet,
    sql: &Client,
    id: &str,
    within: Duration,
) -> Vec<check::Held> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let n: i64 = sql
            .query_one(
                "SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            break;
        }
    }
    fleet.kill(id);
    check::held_by(sql, id).await
}

/// The replicas of one drill: same database, same extra config; killed ones are kept (with
/// their logs) until the end.
pub struct Fleet {
    dsn: String,
    extra_toml: String,
    env: Vec<(String, String)>,
    pub live: BTreeMap<String, ReplicaProc>,
    dead: Vec<ReplicaProc>,
}

impl Fleet {
    /// Replicas log at info (the per-admission debug lines cost CPU the drills need).
    pub fn new(dsn: &str, extra_toml: &str, env: &[(&str, &str)]) -> Fleet {
        let mut all = vec![("QLSCHED__LOG__LEVEL".to_string(), "info".to_string())];
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Fleet {
            dsn: dsn.to_string(),
            extra_toml: extra_toml.to_string(),
            env: all,
            live: BTreeMap::new(),
            dead: Vec::new(),
        }
    }

    /// Spawns replica `id` (with extra environment) without waiting for it.
    pub fn spawn(&mut self, id: &str, env: &[(&str, &str)]) {
        let mut all: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        all.extend_from_slice(env);
        let r = ReplicaProc::spawn(&self.dsn, id, &self.extra_toml, &all);
        if let Some(old) = self.live.insert(id.to_string(), r) {
            self.dead.push(old);
        }
    }

    /// Spawns replica `id` through a command prefix (`ip netns exec NAME`) with HTTP bound
    /// to `http_ip`, without waiting for it.
    pub fn spawn_via(&mut self, prefix: &[String], http_ip: &str, id: &str) {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let r = ReplicaProc::spawn_via(prefix, http_ip, &self.dsn, id, &self.extra_toml, &env);
        if let Some(old) = self.live.insert(id.to_string(), r) {
            self.dead.push(old);
        }
    }

    pub async fn wait_ready(&mut self, id: &str) {
        self.live
            .get_mut(id)
            .expect("spawned")
            .wait_ready(Duration::from_secs(30))
            .await;
    }

    /// Spawns the replicas and waits until each is ready.
    pub async fn start(&mut self, ids: &[&str]) {
        for id in ids {
            self.spawn(id, &[]);
        }
        for id in ids {
            self.wait_ready(id).await;
        }
    }

    /// SIGKILL (and reap: a zombie would still look alive to the replica-id guard).
    pub fn kill(&mut self, id: &str) {
        if let Some(mut r) = self.live.remove(id) {
            r.kill();
            self.dead.push(r);
        }
    }

    pub fn get(&self, id: &str) -> &ReplicaProc {
        &self.live[id]
    }

    /// A replica that has exited (its log stays readable).
    pub fn stopped(&self, id: &str) -> &ReplicaProc {
        self.dead
            .iter()
            .rev()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no stopped replica {id}"))
    }

    /// Sum of a metric over the live replicas.
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.live.values().filter_map(|r| r.metric(name)).sum()
    }

    /// SIGTERM every live replica and require a clean exit (drain, leases handed back).
    pub async fn stop_all(&mut self) {
        for r in self.live.values() {
            r.signal(libc::SIGTERM);
        }
        let ids: Vec<String> = self.live.keys().cloned().collect();
        for id in ids {
            let mut r = self.live.remove(&id).unwrap();
            let status = r.wait_exit(Duration::from_secs(30)).await;
            assert!(
                status.success(),
                "replica {id} exited with {status}; log:\n{}",
                tail(&r.log(), 40)
            );
            self.dead.push(r);
        }
    }

    /// The last lines of every replica's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for r in self.dead.iter().chain(self.live.values()) {
            s.push_str(&format!("--- replica {} ---\n{}", r.id, tail(&r.log(), 15)));
        }
        s
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}

/// One drill's printed result.
pub struct Report {
    pub drill: &'static str,
    pub setup: String,
    pub started: Instant,
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(drill: &'static str, p: &Params, setup: String) -> Report {
        Report {
            drill,
            setup: format!("{}: {setup}", p.form()),
            started: Instant::now(),
            notes: Vec::new(),
        }
    }

    pub fn note(&mut self, s: impl Into<String>) {
        self.notes.push(s.into());
    }

    /// Prints the table (between markers scripts/drill.sh looks for) and returns it.
    pub fn print(&self, f: &Figures) -> String {
        self.print_table(&f.table())
    }

    /// Prints a table under the drill's header, then the notes; returns what it printed.
    pub fn print_table(&self, table: &str) -> String {
        let mut s = format!(
            "==== drill {} ({}; {:.1} s)\n",
            self.drill,
            self.setup,
            self.started.elapsed().as_secs_f64()
        );
        s.push_str(table);
        for n in &self.notes {
            s.push_str(n);
            s.push('\n');
        }
        s.push_str("==== end\n");
        println!("\n{s}");
        s
    }

    /// Checks (once the stopped replicas' last statements have ended), prints, asserts clean.
    pub async fn finish(&self, sql: &Client, expect: &Expect, fleet: &Fleet) -> Figures {
        self.finish_all(&[(sql, expect)], &[fleet]).await
    }

    /// The same over several databases: one table with the figures summed (max lag: the
    /// largest).
    pub async fn finish_all(&self, dbs: &[(&Client, &Expect)], fleets: &[&Fleet]) -> Figures {
        let mut all = Figures::default();
        for (sql, expect) in dbs {
            wait_runtime_backends_gone(
                sql,
                "the stopped replicas' backends gone",
                Duration::from_secs(30),
            )
            .await;
            all.add(&check::check(sql, expect).await);
        }
        let table = self.print(&all);
        let logs: String = fleets.iter().map(|f| f.logs()).collect();
        all.assert_clean(&format!("{table}{logs}"));
        all
    }
}

/// A PostgreSQL server of the drill's own (for drills that stop, restart or promote it),
/// with the qlsched roles and a migrated database `qlsched`; stopped and removed on drop.
pub struct OwnPg {
    pub server: Server,
    pub db: TestDb,
}

static NEXT_OWN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A fresh directory for one more server of this drill.
pub fn own_root(tag: &str) -> std::path::PathBuf {
    let n = NEXT_OWN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let root = std::env::temp_dir().join(format!("qlsched-drill-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

impl OwnPg {
    /// initdb, start (from the calling thread: the server dies with it), bootstrap, migrate.
    pub async fn start(tag: &str, extra_conf: &str) -> OwnPg {
        let mut server = Server::init(&own_root(tag), extra_conf);
        server.start();
        let port = server.port;
        let roles = crate::helpers::roles();
        schema::bootstrap(&pg_config(port, "postgres", "postgres"), &roles, "qlsched")
            .await
            .expect("bootstrap");
        schema::migrate(&pg_config(port, &roles.owner, "qlsched"), &roles)
            .await
            .expect("migrate");
        OwnPg {
            server,
            db: TestDb {
                name: "qlsched".into(),
                port,
            },
        }
    }
}

impl Drop for OwnPg {
    fn drop(&mut self) {
        self.server.stop("immediate");
        let _ = std::fs::remove_dir_all(&self.server.root);
    }
}
