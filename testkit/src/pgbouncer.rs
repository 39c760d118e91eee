//! A PgBouncer (Debian package `pgbouncer`) on a free loopback port in front of the shared
//! PostgreSQL, in the pooling mode a test asks for. It runs as the server's OS user
//! (PgBouncer refuses root) and dies with the test.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::pg;

pub struct PgBouncer {
    pub port: u16,
    pub dir: tempfile::TempDir,
    child: Child,
}

fn binary() -> PathBuf {
    let path = PathBuf::from("/usr/sbin/pgbouncer");
    assert!(
        path.exists(),
        "PgBouncer not found at {}: install it with `apt-get install -y pgbouncer` (Debian \
         package pgbouncer; scripts/test.sh does this when run as root)",
        path.display()
    );
    path
}

impl PgBouncer {
    /// Starts PgBouncer with `pool_mode` (`session` or `transaction`) for every database of
    /// the PostgreSQL on `pg_port`, and waits until it accepts connections.
    pub fn start(pg_port: u16, pool_mode: &str) -> PgBouncer {
        let bin = binary();
        let dir = tempfile::tempdir().unwrap();
        pg::chown_for_server(dir.path());
        let port = pg::free_port();
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("userlist.txt"),
            "\"postgres\" \"\"\n\"qlsched_runtime\" \"\"\n\"qlsched_admin\" \"\"\n\"qlsched_owner\" \"\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host=127.0.0.1 port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {d}/userlist.txt\npool_mode = {pool_mode}\n\
                 stats_users = qlsched_runtime\n\
                 max_client_conn = 500\ndefault_pool_size = 20\n\
                 logfile = {d}/pgbouncer.log\npidfile = {d}/pgbouncer.pid\n"
            ),
        )
        .unwrap();
        for f in ["userlist.txt", "pgbouncer.ini"] {
            pg::chown_for_server(&dir.path().join(f));
        }
        let child = pg::server_command(&bin, true)
            .arg(dir.path().join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "PgBouncer did not listen within 20 s; log:\n{}",
                std::fs::read_to_string(dir.path().join("pgbouncer.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        PgBouncer { port, dir, child }
    }

    pub fn dsn(&self, user: &str, db: &str) -> String {
        format!("host=127.0.0.1 port={} user={user} dbname={db}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
