//! The run's context: the private server, superuser connections, the rows collected so far,
//! and the probes every row uses (clocks, WAL positions, CPU ticks, pg_stat_statements).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use qlsched_testkit::bench_server::BenchServer;

use crate::report::Row;
use crate::sizes::Sizes;

pub struct Bench {
    pub srv: BenchServer,
    /// The superuser on database `qlsched`.
    pub su: tokio_postgres::Client,
    /// The superuser on database `postgres` (where pg_stat_statements lives).
    pub su_pg: tokio_postgres::Client,
    pub sizes: Sizes,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// The DSN the replicas use (the runtime role; the TLS row switches it).
    pub runtime_dsn: String,
    /// Occurrences per second of the per-occurrence and the batched ceiling, by clients.
    pub ceiling: HashMap<usize, f64>,
    pub ceiling_batched: HashMap<usize, f64>,
    /// Whether the admission ran inside its SERIALIZABLE transaction (row 2a).
    pub iso_ok: bool,
    /// Duplicates and lost occurrences seen by any row (the smoke mode fails on them).
    pub violations: Vec<String>,
    qdb_oid: u32,
    runtime_oid: u32,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Prints a step, with the seconds since the run started.
pub fn say(s: &str) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let t = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64();
    eprintln!("\x1b[1m== [{t:5.1} s] {s}\x1b[0m");
}

pub fn clk_tck() -> f64 {
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime + stime of a process, in clock ticks (0 when it is gone).
pub fn cpu_ticks(pid: u32) -> u64 {
    stat_fields(pid).map(|f| f[11] + f[12]).unwrap_or(0)
}

/// utime + stime + cutime + cstime of a process (its reaped children counted), in clock
/// ticks (0 when it is gone).
pub fn cpu_ticks_with_children(pid: u32) -> u64 {
    stat_fields(pid)
        .map(|f| f[11] + f[12] + f[13] + f[14])
        .unwrap_or(0)
}

/// Fields 3.. of /proc/PID/stat as numbers (index 0 = field 3, the state, read as 0).
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    Some(
        rest.split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect(),
    )
}

/// Peak resident set (VmHWM) of a process, KiB.
pub fn vmhwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The machine's busy CPU so far (ticks over all CPUs, everything but idle and iowait).
pub fn machine_busy_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    if f.len() < 8 {
        return 0;
    }
    f[0] + f[1] + f[2] + f[5] + f[6] + f[7]
}

pub fn nproc() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

pub async fn sleep_s(s: f64) {
    tokio::time::sleep(Duration::from_secs_f64(s.max(0.0))).await;
}

/// The header of the statement-profile tables in the notes.
pub const PGSS_HEAD: &str = "| calls | plans | rows/call | plan ms/call | exec ms/call | total ms | blocks/call | WAL B/call | query |\n|---|---|---|---|---|---|---|---|---|";

impl Bench {
    pub async fn new(srv: BenchServer, sizes: Sizes) -> Bench {
        srv.install().await;
        let su = srv.connect("postgres", "qlsched").await;
        let su_pg = srv.connect("postgres", "postgres").await;
        let qdb_oid: u32 = su_pg
            .query_one("select oid from pg_database where datname = 'qlsched'", &[])
            .await
            .unwrap()
            .get(0);
        let runtime_oid: u32 = su_pg
            .query_one(
                "select oid from pg_roles where rolname = 'qlsched_runtime'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let runtime_dsn = srv.dsn("qlsched_runtime", "qlsched");
        Bench {
            srv,
            su,
            su_pg,
            sizes,
            rows: Vec::new(),
            notes: Vec::new(),
            runtime_dsn,
            ceiling: HashMap::new(),
            ceiling_batched: HashMap::new(),
            iso_ok: true,
            violations: Vec::new(),
            qdb_oid,
            runtime_oid,
        }
    }

    pub fn row(&mut self, r: Row) {
        eprintln!("   {} {}: {}", r.id, r.measurement, r.detail);
        self.rows.push(r);
    }

    pub fn note(&mut self, n: impl Into<String>) {
        self.notes.push(n.into());
    }

    pub async fn exec(&self, sql: &str) {
        self.su
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{e:?}: {sql}"));
    }

    /// The first column of the one row `sql` returns, as a number (any numeric type).
    pub async fn num(&self, sql: &str) -> f64 {
        num_on(&self.su, sql).await
    }

    pub async fn text(&self, sql: &str) -> String {
        let wrapped = format!("select ({sql})::text");
        self.su
            .query_one(&wrapped, &[])
            .await
            .unwrap_or_else(|e| panic!("{e:?}: {sql}"))
            .get::<_, Option<String>>(0)
            .unwrap_or_default()
    }

    pub async fn db_now_ms(&self) -> i64 {
        self.num("select (extract(epoch from clock_timestamp()) * 1000)::bigint")
            .await as i64
    }

    /// With `QLSCHED_BENCH_WAL_WARM_MB=N`: writes and drops N MB of table and checkpoints, so
    /// the server reuses old WAL segments as one that has run for a while does (a fresh server
    /// writes each new 16 MB segment full of zeros first, a stall for the commits waiting on it).
    pub async fn warm_wal(&mut self, label: &str) {
        let Some(mb) = std::env::var("QLSCHED_BENCH_WAL_WARM_MB")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        else {
            return;
        };
        self.exec(&format!(
            "create table bench_wal_warm as
             select g, repeat('x', 1000) pad from generate_series(1, {mb} * 1000) g"
        ))
        .await;
        self.exec("drop table bench_wal_warm").await;
        self.checkpoint().await;
        self.note(format!(
            "{label}: {mb} MB of WAL written and checkpointed before it (QLSCHED_BENCH_WAL_WARM_MB), so the server reuses segments"
        ));
    }

    /// Samples `role`'s active backends every 5 ms for `secs`: what they wait on, and how
    /// many are active in each 20 ms slice of the second (the instant is at the slice 0).
    pub async fn sample_waits(&self, role: &str, secs: f64) -> String {
        use std::collections::BTreeMap;
        let end = now_ms() + (secs * 1000.0) as i64;
        let (mut waits, mut slices): (BTreeMap<String, u64>, BTreeMap<i64, (u64, u64)>) =
            Default::default();
        let mut samples = 0u64;
        while now_ms() < end {
            let t = now_ms();
            let rows = self
                .su_pg
                .query(
                    "select coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-'), count(*)
                       from pg_stat_activity where usename = $1 and state = 'active' group by 1",
                    &[&role],
                )
                .await
                .unwrap();
            samples += 1;
            let slice = slices.entry((t % 1000) / 20 * 20).or_default();
            slice.1 += 1;
            for r in rows {
                let n: i64 = r.get(1);
                *waits.entry(r.get(0)).or_default() += n as u64;
                slice.0 += n as u64;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut w: Vec<_> = waits.into_iter().collect();
        w.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        if w.is_empty() {
            return format!("{samples} samples; no backend was ever seen active");
        }
        format!(
            "{samples} samples; backend-samples by wait: {}; mean active backends by ms after the instant: {}",
            w.iter().take(12).map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "),
            slices
                .iter()
                .take_while(|(ms, _)| {
                    // Up to the last slice with activity worth printing (0.05 backends).
                    slices
                        .range(**ms..)
                        .any(|(_, (n, k))| *n as f64 >= 0.05 * (*k).max(1) as f64)
                })
                .map(|(ms, (n, k))| format!("{ms}:{:.1}", *n as f64 / (*k).max(1) as f64))
                .collect::<Vec<_>>()
                .join(" ")
        )
    }

    pub async fn checkpoint(&self) {
        self.exec("CHECKPOINT").await;
    }

    pub async fn runs(&self) -> i64 {
        self.num("select count(*) from qlsched.runs").await as i64
    }

    /// The exactly-once invariants, as the test kit defines them once
    /// (`qlsched_testkit::invariants`): every violated one is recorded as broken by `what`;
    /// returns the duplicate occurrences (0 when the invariant holds), for the row.
    pub async fn invariants(&mut self, what: &str) -> i64 {
        use qlsched_testkit::invariants;
        let found = invariants::check(&self.su).await;
        for v in &found {
            self.check(
                &format!("{what}: {} ×{} ({})", v.invariant, v.violations, v.sample),
                false,
            );
        }
        invariants::count(&found, invariants::DUPLICATE_OCCURRENCE)
    }

    /// Records a broken invariant (duplicates, lost occurrences) seen by a row.
    pub fn check(&mut self, what: &str, ok: bool) {
        if !ok {
            eprintln!("bench: invariant broken: {what}");
            self.violations.push(what.to_string());
        }
    }

    pub async fn lsn(&self) -> String {
        self.text("pg_current_wal_lsn()").await
    }

    pub async fn wal_since(&self, lsn: &str) -> f64 {
        self.num(&format!(
            "select pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn}')"
        ))
        .await
    }

    /// The server's CPU so far (ticks): the postmaster, its live children and the children
    /// it has reaped.
    pub fn server_ticks(&self) -> u64 {
        let pm = self.srv.postmaster_pid();
        let own = stat_fields(pm)
            .map(|f| f[11] + f[12] + f[13] + f[14])
            .unwrap_or(0);
        let children =
            std::fs::read_to_string(format!("/proc/{pm}/task/{pm}/children")).unwrap_or_default();
        own + children
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .map(cpu_ticks)
            .sum::<u64>()
    }

    fn pgss_where(&self) -> String {
        format!("dbid = {} and userid = {}", self.qdb_oid, self.runtime_oid)
    }

    pub async fn pgss_reset(&self) {
        if self.srv.pgss {
            self.su_pg
                .batch_execute("select pg_stat_statements_reset()")
                .await
                .unwrap();
        }
    }

    /// A sum over the runtime role's statements since the last reset (0 without pgss).
    pub async fn pgss_sum(&self, expr: &str, filter: &str) -> f64 {
        if !self.srv.pgss {
            return 0.0;
        }
        num_on(
            &self.su_pg,
            &format!(
                "select coalesce(sum({expr}), 0) from pg_stat_statements where {} {filter}",
                self.pgss_where()
            ),
        )
        .await
    }

    /// Planning as a percentage of the runtime role's plan + execution time.
    pub async fn pgss_plan_pct(&self) -> f64 {
        let plan = self.pgss_sum("total_plan_time", "").await;
        let all = self.pgss_sum("total_plan_time + total_exec_time", "").await;
        crate::stats::ratio(100.0 * plan, all).unwrap_or(0.0)
    }

    /// The runtime role's top statements as markdown rows, ordered by `order` desc.
    pub async fn pgss_top(&self, order: &str, limit: u32) -> String {
        self.pgss_top_where(&self.pgss_where(), order, limit).await
    }

    /// [`Bench::pgss_top`] for another role's statements on database `qlsched`.
    pub async fn pgss_top_of(&self, role: &str, order: &str, limit: u32) -> String {
        let filter = format!(
            "dbid = {} and userid = (select oid from pg_roles where rolname = '{role}')",
            self.qdb_oid
        );
        self.pgss_top_where(&filter, order, limit).await
    }

    async fn pgss_top_where(&self, filter: &str, order: &str, limit: u32) -> String {
        if !self.srv.pgss {
            return "| (pg_stat_statements not available) |".into();
        }
        let rows = self
            .su_pg
            .query(
                &format!(
                    "select concat_ws(chr(31), calls, plans, round(rows::numeric / greatest(calls, 1), 1),
                            round((total_plan_time / greatest(calls, 1))::numeric, 3), round(mean_exec_time::numeric, 3),
                            round((total_plan_time + total_exec_time)::numeric, 1),
                            round((shared_blks_hit + shared_blks_read)::numeric / greatest(calls, 1)),
                            round(wal_bytes / greatest(calls, 1)),
                            left(regexp_replace(query, '\\s+', ' ', 'g'), 100))
                       from pg_stat_statements where {filter} order by {order} desc limit {limit}"
                ),
                &[],
            )
            .await
            .unwrap();
        let body: Vec<String> = rows
            .iter()
            .map(|r| {
                let cells: Vec<String> = r
                    .get::<_, String>(0)
                    .split('\u{1f}')
                    .map(|c| c.replace('|', "\\|"))
                    .collect();
                format!("| {} |", cells.join(" | "))
            })
            .collect();
        format!("{PGSS_HEAD}\n{}", body.join("\n"))
    }

    /// Calls of the runtime role's statements by kind, per second and replica.
    pub async fn pgss_mix(&self, secs: f64, replicas: f64) -> String {
        if !self.srv.pgss {
            return String::new();
        }
        let rows = self
            .su_pg
            .query(
                &format!(
                    "select kind, n::float8 from (
                       select case when query ilike '%picked AS%' then 'claim'
                                   when query ilike '%count(*)%claimable_at_ms%' then 'backlog gauge'
                                   when query ilike '%UPDATE qlsched.replicas%' then 'heartbeat'
                                   else 'other' end as kind, sum(calls) as n
                         from pg_stat_statements where {} group by 1) x order by n desc",
                    self.pgss_where()
                ),
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                format!(
                    "{} {:.2}",
                    r.get::<_, String>(0),
                    r.get::<_, f64>(1) / secs / replicas
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Every setting not at its default, server-side (for the result file).
    pub async fn settings(&self) -> std::collections::BTreeMap<String, String> {
        let rows = self
            .su
            .query(
                "select name, current_setting(name) from pg_settings
                  where source not in ('default', 'client', 'session', 'override')
                    and name not in ('unix_socket_directories', 'port', 'ssl_cert_file', 'ssl_key_file')
                  order by name",
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }
}

/// The first column of the one row `sql` returns on `c`, as f64.
pub async fn num_on(c: &tokio_postgres::Client, sql: &str) -> f64 {
    let wrapped = format!("select coalesce(({sql})::float8, 0)");
    c.query_one(&wrapped, &[])
        .await
        .unwrap_or_else(|e| panic!("{e:?}: {sql}"))
        .get(0)
}
