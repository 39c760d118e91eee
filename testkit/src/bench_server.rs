//! A private PostgreSQL with chosen settings that lives as long as its value: durable by
//! default (fsync, synchronous_commit and full_page_writes on), `pg_stat_statements` loaded
//! when the server has it, optionally with `ssl = on` and a CA and server certificate for
//! 127.0.0.1, and `qlsched` bootstrapped and migrated into database `qlsched` (roles
//! `qlsched_owner`, `qlsched_admin`, `qlsched_runtime`, …). The benchmark measures on it; a
//! test that needs production-like durability can use it too.

use std::path::{Path, PathBuf};

use qlsched::schema::{self, Roles};

use crate::pg;

/// The settings of the benchmark's tuned server (beyond the kit's own lines).
pub const TUNED: &str = "shared_buffers = 1GB\nmax_wal_size = 8GB\nmin_wal_size = 1GB\n\
    checkpoint_timeout = 30min\n";

/// Durability as production runs it: every commit flushed.
pub const DURABLE: &str = "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n";

pub const DATABASE: &str = "qlsched";
pub const PREFIX: &str = "qlsched";

pub struct BenchServer {
    pub server: pg::Server,
    /// Whether `pg_stat_statements` is loaded (and created in database `postgres`).
    pub pgss: bool,
    /// The CA certificate clients verify the server with (`ssl = on` only).
    pub ca: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

fn pgss_available(bindir: &Path) -> bool {
    let lib = bindir.join("../lib/pg_stat_statements.so");
    let pkglib = std::process::Command::new(bindir.join("pg_config"))
        .arg("--pkglibdir")
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .map(|d| d.join("pg_stat_statements.so"));
    lib.exists() || pkglib.is_some_and(|p| p.exists())
}

impl BenchServer {
    /// initdb and start a server with `conf` appended (after [`DURABLE`] and the
    /// `pg_stat_statements` lines); with `tls`, certificates are made and `ssl = on`.
    pub fn start(conf: &str, tls: bool) -> BenchServer {
        let dir = tempfile::Builder::new()
            .prefix("qlsched-bench-")
            .tempdir()
            .expect("a temporary directory");
        pg::chown_for_server(dir.path());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("pg");
        let pgss = pgss_available(&pg::bindir());
        let mut all = String::from(DURABLE);
        all.push_str("log_line_prefix = '%m [%p] %v '\n");
        if pgss {
            all.push_str(
                "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.max = 2000\n\
                 pg_stat_statements.track = top\npg_stat_statements.track_utility = on\n\
                 pg_stat_statements.track_planning = on\n",
            );
        }
        let ca = tls.then(|| {
            let certs = dir.path().join("certs");
            std::fs::create_dir_all(&certs).unwrap();
            std::fs::set_permissions(&certs, std::fs::Permissions::from_mode(0o755)).unwrap();
            make_certs(&certs);
            all.push_str(&format!(
                "ssl = on\nssl_cert_file = '{c}/server.crt'\nssl_key_file = '{c}/server.key'\n",
                c = certs.display()
            ));
            certs.join("ca.crt")
        });
        all.push_str(conf);
        let mut server = pg::Server::init(&root, &all);
        server.start();
        BenchServer {
            server,
            pgss,
            ca,
            _dir: dir,
        }
    }

    /// [`BenchServer::start`] on a thread that then lives as long as the process (the
    /// server's parent-death signal follows the thread that started it), so that a caller
    /// can do other work meanwhile; the server arrives on the returned channel.
    pub fn start_in_background(conf: &str, tls: bool) -> std::sync::mpsc::Receiver<BenchServer> {
        let (tx, rx) = std::sync::mpsc::channel();
        let conf = conf.to_string();
        std::thread::spawn(move || {
            let _ = tx.send(BenchServer::start(&conf, tls));
            loop {
                std::thread::park();
            }
        });
        rx
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// The server's log so far.
    pub fn log_path(&self) -> PathBuf {
        self.server.root.join("server.log")
    }

    pub fn config(&self, user: &str, db: &str) -> tokio_postgres::Config {
        crate::pg_config(self.port(), user, db)
    }

    pub fn dsn(&self, user: &str, db: &str) -> String {
        self.server.dsn(user, db)
    }

    /// A connection (its driver spawned on the current runtime).
    pub async fn connect(&self, user: &str, db: &str) -> tokio_postgres::Client {
        let (client, conn) = self
            .config(user, db)
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect as {user} to {db}: {e}"));
        tokio::spawn(conn);
        client
    }

    /// Bootstraps the roles and database `qlsched` and migrates it, as `qlsched db bootstrap`
    /// and `qlsched db migrate` do; creates `pg_stat_statements` in database `postgres` (its
    /// view shows every database, so the qlsched schema stays exactly as migrated).
    pub async fn install(&self) -> Roles {
        self.install_into(DATABASE).await
    }

    /// [`BenchServer::install`] into another database (its roles are shared).
    pub async fn install_into(&self, db: &str) -> Roles {
        let roles = Roles::with_prefix(PREFIX).unwrap();
        schema::bootstrap(&self.config("postgres", "postgres"), &roles, db)
            .await
            .expect("bootstrap");
        schema::migrate(&self.config(&roles.owner, db), &roles)
            .await
            .expect("migrate");
        if self.pgss {
            self.connect("postgres", "postgres")
                .await
                .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .await
                .expect("create pg_stat_statements");
        }
        roles
    }

    /// The postmaster's pid.
    pub fn postmaster_pid(&self) -> u32 {
        self.server.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }
}

/// A CA and a server certificate for 127.0.0.1 and localhost into `dir` (the key owned by
/// the server user, 0600).
fn make_certs(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "qlsched bench CA");
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = p.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let server = p.signed_by(&key, &ca, &ca_key).unwrap();
    for (name, text) in [
        ("server.crt", server.pem()),
        ("server.key", key.serialize_pem()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        pg::chown_for_server(&path);
    }
}
