//! The HTTP port as an attacker on the path or in a browser meets it: a Host allowlist for
//! the console and `/api/` (DNS rebinding), TLS with a certificate re-read when it is
//! replaced on disk, and failed logins throttled, logged and counted. Every request goes to
//! loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, ServerName};

use crate::helpers::http::{check_config, get, header, parse, secret_file};
use crate::helpers::replica::ReplicaProc;
use crate::helpers::TestDb;

#[tokio::test]
async fn a_wrong_host_gets_421_and_the_own_host_200() {
    let db = TestDb::new().await;
    let mut r = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "host1", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    let port = r.http.port();

    // DNS rebinding: a page of rebind.example reads the console through the operator's
    // tunnel with its own name in Host.
    for path in [
        "/",
        "/api/v1/overview",
        "/api/v1/triggers",
        "/static/console.js",
    ] {
        let (status, _, body) = get(r.http, Some("rebind.example"), path, &[]);
        assert_eq!(status, 421, "{path} with Host: rebind.example: {body}");
        let (status, _, _) = get(r.http, Some(&format!("rebind.example:{port}")), path, &[]);
        assert_eq!(status, 421, "{path} with Host: rebind.example:{port}");
        let (status, _, _) = get(r.http, None, path, &[]);
        assert_eq!(status, 421, "{path} without Host");
    }
    // Its own names: the loopback names.
    for host in [
        "localhost".to_owned(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (status, _, body) = get(r.http, Some(&host), "/api/v1/overview", &[]);
        assert_eq!(status, 200, "Host: {host}: {body}");
    }
    // Probes and Prometheus scrape by address, whatever the Host.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _, _) = get(r.http, Some("10.1.2.3:9187"), path, &[]);
        assert_eq!(status, 200, "{path}");
    }
    r.terminate(Duration::from_secs(20)).await;

    // [http] public_names adds the names the console is reached by (case-insensitive).
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "host2",
        "",
        &[("QLSCHED__HTTP__PUBLIC_NAMES", "[\"sched.example.org\"]")],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    for host in [
        "sched.example.org".to_owned(),
        format!("SCHED.example.org:{port}"),
    ] {
        let (status, _, body) = get(r.http, Some(&host), "/api/v1/overview", &[]);
        assert_eq!(status, 200, "Host: {host}: {body}");
    }
    let (status, _, _) = get(r.http, Some("other.example.org"), "/", &[]);
    assert_eq!(status, 421);
    r.terminate(Duration::from_secs(20)).await;
}

#[tokio::test]
async fn failed_logins_are_throttled_with_429_logged_without_the_secret_and_counted() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let token = "right-token-0123456789";
    let file = secret_file(dir.path(), "token", &format!("{token}\n"), 0o600);
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "throttle1",
        "",
        &[("QLSCHED__HTTP__CONSOLE_AUTH_FILE", file.as_str())],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    let wrong = "Bearer wrong-guess-0123456789";
    // The default bound: 10 failed logins per client address per minute.
    for i in 1..=10 {
        let (status, _, _) = get(
            r.http,
            Some("localhost"),
            "/api/v1/overview",
            &[("Authorization", wrong)],
        );
        assert_eq!(status, 401, "failed login {i}");
    }
    let (status, h, body) = get(
        r.http,
        Some("localhost"),
        "/api/v1/overview",
        &[("Authorization", wrong)],
    );
    assert_eq!(status, 429, "the 11th failed login within a minute: {body}");
    let retry: u64 = header(&h, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    // Throttled: even the right token waits (a guess must not be confirmed meanwhile).
    let (status, _, _) = get(
        r.http,
        Some("localhost"),
        "/api/v1/overview",
        &[("Authorization", &format!("Bearer {token}"))],
    );
    assert_eq!(status, 429);
    // Health and metrics are not throttled; the failures are counted there.
    let (status, _, metrics) = get(r.http, Some("localhost"), "/metrics", &[]);
    assert_eq!(status, 200);
    let count: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("qlsched_console_login_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no qlsched_console_login_failures_total in:\n{metrics}"));
    assert!(count >= 10.0, "{count}");
    // A replica on loopback: its database connections are not flagged.
    assert!(
        metrics
            .lines()
            .any(|l| l == "qlsched_database_tls_unverified 0"),
        "{metrics}"
    );
    // Logged with the client's address, never with what it sent.
    let log = r.log();
    assert!(
        log.lines()
            .any(|l| l.contains("console login failed") && l.contains("127.0.0.1")),
        "{log}"
    );
    assert!(
        !log.contains("wrong-guess") && !log.contains(token),
        "{log}"
    );
    r.terminate(Duration::from_secs(20)).await;
}

fn ca() -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "qlsched console test CA");
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (p.self_signed(&key).unwrap(), key)
}

/// A server certificate for `localhost` signed by the CA, written (atomically, by rename)
/// to `cert` and `key` (0600); returns its DER.
fn issue(ca: &(rcgen::Certificate, KeyPair), cn: &str, cert: &Path, key: &Path) -> Vec<u8> {
    let k = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    let c = p.signed_by(&k, &ca.0, &ca.1).unwrap();
    let tmp = secret_file(key.parent().unwrap(), "key.tmp", &k.serialize_pem(), 0o600);
    std::fs::rename(&tmp, key).unwrap();
    let tmp = cert.with_extension("crt-tmp");
    std::fs::write(&tmp, c.pem()).unwrap();
    std::fs::rename(&tmp, cert).unwrap();
    c.der().to_vec()
}

/// GET over TLS trusting `ca` for `localhost`: (status, the leaf certificate served).
fn tls_get(addr: SocketAddr, ca: &[u8], path: &str) -> Result<(u16, Vec<u8>), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca.to_vec()))
        .map_err(|e| e.to_string())?;
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(Arc::new(cfg), ServerName::try_from("localhost").unwrap())
            .map_err(|e| e.to_string())?;
    let mut sock =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    write!(tls, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    if let Err(e) = tls.read_to_end(&mut buf) {
        if buf.is_empty() {
            return Err(e.to_string());
        }
    }
    let leaf = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or("no certificate")?;
    Ok((parse(&String::from_utf8_lossy(&buf)).0, leaf))
}

#[tokio::test]
async fn a_plain_connection_to_the_tls_port_fails_and_a_replaced_certificate_is_served() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("http.crt"), dir.path().join("http.key"));
    let ca = ca();
    let ca_der = ca.0.der().to_vec();
    let first = issue(&ca, "first", &cert, &key);
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    let r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "tls1",
        "",
        &[
            ("QLSCHED__HTTP__TLS_CERT_FILE", c.as_str()),
            ("QLSCHED__HTTP__TLS_KEY_FILE", k.as_str()),
        ],
    );
    crate::helpers::wait_until("/readyz over TLS", Duration::from_secs(30), || async {
        matches!(tls_get(r.http, &ca_der, "/readyz"), Ok((200, _)))
    })
    .await;
    let (status, leaf) = tls_get(r.http, &ca_der, "/api/v1/overview").unwrap();
    assert_eq!(status, 200);
    assert!(leaf == first, "the first certificate is served");

    // Plain HTTP to the TLS port gets no HTTP answer.
    let (status, _, body) = get(r.http, Some("localhost"), "/healthz", &[]);
    assert_eq!(status, 0, "plain HTTP answered on the TLS port: {body}");

    // A renewed certificate (a new key too) replaces the files: new connections get it,
    // without a restart.
    let second = issue(&ca, "second", &cert, &key);
    crate::helpers::wait_until(
        "the renewed certificate served",
        Duration::from_secs(10),
        || {
            let got = tls_get(r.http, &ca_der, "/healthz");
            let second = second.clone();
            async move { matches!(got, Ok((200, leaf)) if leaf == second) }
        },
    )
    .await;
    let log = r.log();
    assert!(log.contains("certificate reloaded"), "{log}");
}

#[test]
fn a_console_off_loopback_without_tls_is_refused_unless_plain_http_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let token = secret_file(dir.path(), "token", "0123456789abcdef0123\n", 0o600);
    // The install the docs described before: a token, plain HTTP on every address.
    let old = format!("bind = \"0.0.0.0:9187\"\nconsole_auth_file = \"{token}\"");
    let (good, out) = check_config(dir.path(), &old);
    assert!(
        !good,
        "a console off loopback without TLS was accepted: {out}"
    );
    for needle in ["http.allow_plain_http", "tls_cert_file", "tls_key_file"] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let (good, out) = check_config(dir.path(), &format!("{old}\nallow_plain_http = true"));
    assert!(good, "{out}");
    // The console off: nothing to protect, no TLS needed.
    let (good, out) = check_config(dir.path(), "bind = \"0.0.0.0:9187\"\nconsole = \"off\"");
    assert!(good, "{out}");
    // A key file others can read is refused, naming the key, the file and its mode.
    let ca = ca();
    let (cert, key) = (dir.path().join("c.crt"), dir.path().join("c.key"));
    issue(&ca, "c", &cert, &key);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (good, out) = check_config(
        dir.path(),
        &format!("{old}\ntls_cert_file = {cert:?}\ntls_key_file = {key:?}"),
    );
    assert!(!good, "{out}");
    assert!(
        out.contains("http.tls_key_file")
            && out.contains(&key.display().to_string())
            && out.contains("0644"),
        "{out}"
    );
    // Credentials required on loopback too when asked.
    let (good, out) = check_config(dir.path(), "console_require_auth = true");
    assert!(!good && out.contains("http.console_require_auth"), "{out}");
}

/// Which targets are warned about at start (and exported as
/// `qlsched_database_tls_unverified`): TCP to a host other than loopback with an `sslmode`
/// that an attacker on the path can defeat. Parsed only: nothing connects.
#[test]
fn weak_sslmodes_to_non_loopback_hosts_are_named_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let root = dir.path().join("root.crt");
    std::fs::write(&root, ca.0.pem()).unwrap();
    let root = root.display().to_string();
    let weak = |dsn: &str| {
        let t = qlsched::db::dsn::parse_with_env(dsn, |_| None).unwrap();
        qlsched::startup::unverified_tcp_hosts(&t)
    };
    let home = std::env::var("HOME").unwrap_or_default();
    let default_root = std::path::Path::new(&home).join(".postgresql/root.crt");
    assert!(
        !default_root.exists(),
        "{default_root:?} would make require verify"
    );
    for (dsn, want) in [
        ("host=db1 dbname=q", vec!["db1"]),
        ("host=db1 dbname=q sslmode=prefer", vec!["db1"]),
        ("host=db1 dbname=q sslmode=disable", vec!["db1"]),
        ("host=db1 dbname=q sslmode=require", vec!["db1"]),
        ("host=db1,127.0.0.1,localhost dbname=q", vec!["db1"]),
        ("host=db1 hostaddr=192.0.2.7 dbname=q", vec!["192.0.2.7"]),
        ("host=localhost hostaddr=127.0.0.1 dbname=q", vec![]),
        ("host=127.0.0.1 dbname=q sslmode=disable", vec![]),
        ("host=::1 dbname=q", vec![]),
        ("host=/var/run/postgresql dbname=q", vec![]),
    ] {
        assert_eq!(weak(dsn), want, "{dsn}");
    }
    for mode in ["require", "verify-ca", "verify-full"] {
        let dsn = format!("host=db1 dbname=q sslmode={mode} sslrootcert={root}");
        assert!(weak(&dsn).is_empty(), "{dsn}");
    }
}
