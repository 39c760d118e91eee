//! TLS with libpq's `sslmode` meanings, against a PostgreSQL with `ssl = on` and against the
//! plain one; client-certificate authentication; a replica admitting over `verify-full`.

use std::time::Duration;

use qlsched::db;
use qlsched::db::dsn::parse_with_password as parse_dsn_with_password;

use crate::helpers::replica::ReplicaProc;
use crate::helpers::tls::{tls_cluster, tls_db, CERT_USER};
use crate::helpers::{cluster, wait_until};

/// Connects with `dsn`; Ok(whether the session is encrypted) or the error as the operator
/// would read it.
async fn session_ssl(dsn: &str) -> Result<bool, String> {
    let target = parse_dsn_with_password(dsn).map_err(|e| format!("dsn: {e}"))?;
    let client = db::connect(&target).await.map_err(|e| e.to_string())?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

fn tls_dsn(extra: &str) -> String {
    format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10 {extra}",
        tls_cluster().port
    )
}

/// The user a session over `dsn` is (connecting must succeed: `what` otherwise).
async fn user_of(dsn: &str, what: &str) -> String {
    db::connect(&parse_dsn_with_password(dsn).unwrap())
        .await
        .expect(what)
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn every_sslmode_connects_to_a_tls_server_and_encrypts_unless_disabled() {
    let ca = tls_cluster().ca();
    let ca = ca.display();
    for (extra, encrypted) in [
        ("sslmode=disable".to_owned(), false),
        (String::new(), true), // prefer, the default
        ("sslmode=prefer".to_owned(), true),
        ("sslmode=require".to_owned(), true),
        (format!("sslmode=require sslrootcert={ca}"), true),
        (format!("sslmode=verify-ca sslrootcert={ca}"), true),
        (format!("sslmode=verify-full sslrootcert={ca}"), true),
    ] {
        let got = session_ssl(&tls_dsn(&extra)).await;
        assert_eq!(got, Ok(encrypted), "{extra}");
    }
    // verify-ca checks the chain only: a host name the certificate does not list is fine.
    let dsn = format!(
        "host=wrong.example hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-ca sslrootcert={ca}",
        tls_cluster().port
    );
    assert_eq!(session_ssl(&dsn).await, Ok(true));
}

#[tokio::test]
async fn against_a_plain_server_prefer_falls_back_and_require_modes_say_what_to_change() {
    let ca = tls_cluster().ca();
    let plain = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10",
        cluster().port
    );
    for mode in ["sslmode=disable", "sslmode=prefer", ""] {
        assert_eq!(
            session_ssl(&format!("{plain} {mode}")).await,
            Ok(false),
            "{mode}"
        );
    }
    for mode in ["require", "verify-ca", "verify-full"] {
        let err = session_ssl(&format!(
            "{plain} sslmode={mode} sslrootcert={}",
            ca.display()
        ))
        .await
        .unwrap_err();
        for part in ["server did not offer TLS", "turn on ssl"] {
            assert!(err.contains(part), "{mode}: {part:?} not in {err}");
        }
    }
}

#[tokio::test]
async fn verify_full_refuses_a_host_name_the_certificate_does_not_list() {
    let c = tls_cluster();
    let dsn = format!(
        "host=wrong.example hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-full sslrootcert={}",
        c.port,
        c.ca().display()
    );
    let err = session_ssl(&dsn).await.unwrap_err();
    assert!(
        err.contains("does not name host \"wrong.example\""),
        "{err}"
    );
    assert!(err.contains("verify-full"), "{err}");
    assert!(
        err.contains("localhost"),
        "names what the certificate lists: {err}"
    );
}

#[tokio::test]
async fn verify_modes_refuse_a_server_certificate_from_another_ca_and_name_the_ca_file() {
    let other = tls_cluster().other_ca();
    for mode in ["verify-ca", "verify-full", "require"] {
        let err = session_ssl(&tls_dsn(&format!(
            "sslmode={mode} sslrootcert={}",
            other.display()
        )))
        .await
        .unwrap_err();
        assert!(err.contains("not trusted"), "{mode}: {err}");
        assert!(err.contains(&other.display().to_string()), "{mode}: {err}");
        assert!(err.contains("set sslrootcert"), "{mode}: {err}");
    }
}

#[tokio::test]
async fn cert_authentication_accepts_the_client_certificate_and_refuses_without_it() {
    let c = tls_cluster();
    let _db = tls_db().await;
    let base = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user={CERT_USER} dbname=postgres \
         sslmode=verify-full sslrootcert={}",
        c.port,
        c.ca().display()
    );
    let with = format!(
        "{base} sslcert={} sslkey={}",
        c.client_cert().display(),
        c.client_key().display()
    );
    assert_eq!(
        user_of(&with, "client certificate accepted").await,
        CERT_USER
    );

    let err = session_ssl(&base).await.unwrap_err();
    assert!(err.contains("certificate"), "{err}");
    let plain = format!("{base} sslmode=disable");
    let err = session_ssl(&plain).await.unwrap_err();
    assert!(err.contains("pg_hba.conf rejects"), "{err}");
}

#[tokio::test]
async fn an_unreadable_key_file_is_a_config_error_naming_the_keyword_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.toml");
    std::fs::write(
        &path,
        format!(
            "[replica]\nid = \"a\"\n[database]\ndsn = \"host=db sslmode=verify-full sslrootcert={ca} \
             sslcert={c} sslkey=/nonexistent/client.key\"\n",
            ca = tls_cluster().ca().display(),
            c = tls_cluster().client_cert().display()
        ),
    )
    .unwrap();
    let err = qlsched::config::Config::load_with_env(&path, [])
        .unwrap_err()
        .to_string();
    assert!(err.contains("database.dsn"), "{err}");
    assert!(err.contains("sslkey file /nonexistent/client.key"), "{err}");
}

#[tokio::test]
async fn a_replica_admits_over_verify_full_tls() {
    let c = tls_cluster();
    let db = tls_db().await;
    db.seed(5, "* * * * * *").await;
    let dsn = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=qlsched_runtime dbname={} \
         sslmode=verify-full sslrootcert={}",
        db.port,
        db.name,
        c.ca().display()
    );
    let mut a = ReplicaProc::spawn(&dsn, "a", "", &[]);
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until(
        "10 runs admitted over TLS",
        Duration::from_secs(30),
        || async { db.count("SELECT count(*) FROM qlsched.runs").await >= 10 },
    )
    .await;
    let plain = db
        .count(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.usename = 'qlsched_runtime' AND NOT s.ssl",
        )
        .await;
    let tls = db
        .count(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.usename = 'qlsched_runtime' AND s.ssl",
        )
        .await;
    assert_eq!(plain, 0, "every runtime connection is encrypted");
    assert!(tls >= 1, "the replica holds TLS connections");
    assert!(a.log().contains("sslmode=verify-full"), "{}", a.log());
    let status = a.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}; log:\n{}", a.log());
    db.assert_invariants().await;
}

#[tokio::test]
async fn an_encrypted_client_key_authenticates_with_sslpassword() {
    use pkcs8::der::Decode;
    let c = tls_cluster();
    let _db = tls_db().await;
    let plain = std::fs::read_to_string(c.client_key()).unwrap();
    let (_, der) = pkcs8::SecretDocument::from_pem(&plain).unwrap();
    let info = pkcs8::PrivateKeyInfo::from_der(der.as_bytes()).unwrap();
    let params = pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(
        2048,
        b"0123456789abcdef",
        b"fedcba9876543210",
    )
    .unwrap();
    let pem = info
        .encrypt_with_params(params, "pass phrase")
        .unwrap()
        .to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client.key");
    std::fs::write(&key, pem.as_bytes()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let dsn = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user={CERT_USER} dbname=postgres \
         sslmode=verify-full sslrootcert={} sslcert={} sslkey={} sslpassword='pass phrase'",
        c.port,
        c.ca().display(),
        c.client_cert().display(),
        key.display()
    );
    assert_eq!(
        user_of(&dsn, "the decrypted key authenticates").await,
        CERT_USER
    );
    let without = dsn.replace("sslpassword='pass phrase'", "");
    let e = parse_dsn_with_password(&without).unwrap_err().to_string();
    assert!(e.contains("give its passphrase as sslpassword"), "{e}");
}

#[tokio::test]
async fn verify_full_reads_the_root_file_in_home_or_refuses_naming_it() {
    let c = tls_cluster();
    let db = tls_db().await;
    let home = tempfile::tempdir().unwrap();
    let dsn = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=qlsched_admin dbname={} sslmode=verify-full",
        c.port, db.name
    );
    let run = || {
        std::process::Command::new(crate::helpers::replica::binary())
            .args(["trigger", "list", "--dsn", &dsn])
            .env("HOME", home.path())
            .env_remove("PGSSLROOTCERT")
            .env_remove("PGPASSWORD")
            .output()
            .unwrap()
    };
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "root certificate file {}/.postgresql/root.crt does not exist",
            home.path().display()
        )),
        "{err}"
    );
    std::fs::create_dir_all(home.path().join(".postgresql")).unwrap();
    std::fs::copy(c.ca(), home.path().join(".postgresql/root.crt")).unwrap();
    let out = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
