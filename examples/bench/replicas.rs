//! Replica processes of the real binary (found by the test kit beside this program, or
//! `QLSCHED_BIN`) with the default configuration except id, DSN, HTTP port and what a row
//! sets; readiness over HTTP, counters from `/metrics`, CPU and memory from /proc.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qlsched_testkit::pg::free_port;
use qlsched_testkit::replica::{binary, http_get};

pub struct Replica {
    pub id: String,
    pub port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

/// What a group of replicas is started with.
#[derive(Clone, Debug)]
pub struct Setup {
    pub dsn: String,
    /// `[scheduler]` lines, e.g. `claim_budget = 64`.
    pub scheduler: String,
    /// Further sections (e.g. `[retention]` …).
    pub extra: String,
}

impl Setup {
    /// The default configuration (claim budget, lease and cadence as shipped).
    pub fn default_config(dsn: &str) -> Setup {
        Setup {
            dsn: dsn.into(),
            scheduler: String::new(),
            extra: String::new(),
        }
    }
    pub fn with_budget(dsn: &str, budget: u32, lease: &str) -> Setup {
        Setup {
            dsn: dsn.into(),
            scheduler: format!("claim_budget = {budget}\nlease = \"{lease}\"\n"),
            extra: String::new(),
        }
    }
}

pub struct Group {
    pub replicas: Vec<Replica>,
}

impl Group {
    /// Starts `n` replicas `bench-r1 …` (does not wait for readiness).
    pub fn start(n: usize, s: &Setup) -> Group {
        let replicas = (1..=n)
            .map(|i| {
                let id = format!("bench-r{i}");
                let port = free_port();
                let dir = tempfile::tempdir().unwrap();
                let config = dir.path().join(format!("{id}.toml"));
                std::fs::write(
                    &config,
                    format!(
                        "[replica]\nid = \"{id}\"\n[database]\ndsn = \"{dsn}\"\napplication_name = \"qlsched-{id}\"\n\
                         [scheduler]\n{sch}\n[http]\nbind = \"127.0.0.1:{port}\"\n{extra}\n",
                        dsn = s.dsn,
                        sch = s.scheduler,
                        extra = s.extra
                    ),
                )
                .unwrap();
                let log = std::fs::File::create(dir.path().join("replica.log")).unwrap();
                let child = Command::new(binary())
                    .arg("run")
                    .arg("--config")
                    .arg(&config)
                    .env_remove("NOTIFY_SOCKET")
                    .env_remove("WATCHDOG_USEC")
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .expect("spawn the qlsched binary");
                Replica {
                    id,
                    port,
                    child,
                    dir,
                }
            })
            .collect();
        Group { replicas }
    }

    pub fn pids(&self) -> Vec<u32> {
        self.replicas.iter().map(|r| r.child.id()).collect()
    }

    /// Panics with the replica's log if one has exited.
    pub fn assert_alive(&mut self) {
        for r in &mut self.replicas {
            if let Ok(Some(status)) = r.child.try_wait() {
                panic!(
                    "replica {} exited ({status}): {}",
                    r.id,
                    tail(&r.dir.path().join("replica.log"))
                );
            }
        }
    }

    /// Waits until every replica answers /readyz with 200 (60 s at most).
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..self.replicas.len() {
            loop {
                if let Some((200, _)) = http_get(local(self.replicas[i].port), "/readyz") {
                    break;
                }
                self.assert_alive();
                assert!(
                    Instant::now() < deadline,
                    "replica {} not ready after 60 s",
                    self.replicas[i].id
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// The sum of a counter family (every label set) over the replicas.
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.replicas
            .iter()
            .filter_map(|r| http_get(local(r.port), "/metrics"))
            .map(|(_, body)| {
                body.lines()
                    .filter(|l| {
                        l.starts_with(name)
                            && matches!(l.as_bytes().get(name.len()), Some(b' ') | Some(b'{'))
                    })
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            })
            .sum()
    }

    pub fn cpu_ticks(&self) -> u64 {
        self.pids().into_iter().map(crate::env::cpu_ticks).sum()
    }

    /// SIGTERM to all, then wait for each (SIGKILL after 30 s).
    pub async fn stop(mut self) {
        for r in &self.replicas {
            unsafe { libc::kill(r.child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for r in &mut self.replicas {
            while r.child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn local(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

fn tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
