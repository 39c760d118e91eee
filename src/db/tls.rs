//! TLS for every connection (daemon pool and CLI), with libpq's meaning of `sslmode`, on
//! rustls:
//!
//! | sslmode       | TLS                          | server certificate                        |
//! |---------------|------------------------------|-------------------------------------------|
//! | `disable`     | never                        | —                                         |
//! | `prefer`      | if the server offers it      | not verified                              |
//! | `require`     | always (refused otherwise)   | not verified; verified as `verify-ca` when a root file is given or `~/.postgresql/root.crt` exists (libpq does the same) |
//! | `verify-ca`   | always                       | chain to the root file                    |
//! | `verify-full` | always                       | chain, and the certificate names the host |
//!
//! The root file is `sslrootcert`, else `~/.postgresql/root.crt` (a verify mode without
//! either is refused, naming the file); `sslrootcert=system` is the system trust store and
//! forces `verify-full` (a weaker mode with it is refused), as libpq 16 does.
//! `sslcert` + `sslkey` present a client certificate (for `cert` authentication in
//! `pg_hba.conf`); an encrypted PKCS#8 key is opened with `sslpassword`, and a key file
//! others can read is refused, with libpq's rule. Every file is read when the [`Tls`] is
//! built — at configuration time — so an unreadable file is a configuration error, never a
//! connection loop. Expired and not-yet-valid server certificates are named as such.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode as DriverSslMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::Socket;
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values. `allow` is not supported (it means "plain first").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres itself must do: offer TLS or not, and refuse a plain server.
    fn driver_mode(self) -> DriverSslMode {
        match self {
            SslMode::Disable => DriverSslMode::Disable,
            SslMode::Prefer => DriverSslMode::Prefer,
            _ => DriverSslMode::Require,
        }
    }
}

/// The TLS keywords of a DSN (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
/// `sslpassword`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// CA certificates (PEM); `system`: the system trust store; `None`:
    /// `~/.postgresql/root.crt`.
    pub root_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Opens an encrypted client key (`sslpassword`). Never printed.
    pub key_password: Option<String>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("mode", &self.mode)
            .field("root_cert", &self.root_cert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("key_password", &self.key_password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Where libpq looks for the root file when `sslrootcert` is not given.
pub fn default_root_cert() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".postgresql/root.crt"))
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{keyword} file {}: cannot read it ({source}); fix the path or make it readable by the service user", path.display())]
    Unreadable {
        keyword: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{keyword} file {}: no PEM {what} in it", path.display())]
    NoPem {
        keyword: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    #[error("sslcert and sslkey must be given together")]
    CertWithoutKey,
    #[error("sslcert/sslkey: the client certificate and key do not form a usable pair ({0})")]
    ClientKey(rustls::Error),
    #[error("sslrootcert: {0}")]
    Roots(String),
    #[error(
        "root certificate file {} does not exist; either provide the file, use the system's \
         trusted roots with sslrootcert=system, or change sslmode to disable server \
         certificate verification", path.display()
    )]
    NoRootFile { path: PathBuf },
    #[error("weak sslmode {0:?} may not be used with sslrootcert=system (use \"verify-full\")")]
    WeakModeWithSystemRoots(&'static str),
    #[error(
        "sslkey file {}: has group or world access ({mode:04o}); it must be u=rw (0600) or \
         less if owned by the current user, or u=rw,g=r (0640) or less if owned by root",
        path.display()
    )]
    KeyPermissions { path: PathBuf, mode: u32 },
    #[error("sslkey file {}: the key is encrypted; give its passphrase as sslpassword", path.display())]
    KeyNeedsPassword { path: PathBuf },
    #[error("sslkey file {}: cannot decrypt the key with sslpassword ({reason})", path.display())]
    KeyPassword { path: PathBuf, reason: String },
    #[error(
        "sslkey file {}: encrypted in the legacy OpenSSL PEM format, which is not supported; \
         convert it with `openssl pkcs8 -topk8 -v2 aes-256-cbc -in OLD -out NEW`",
        path.display()
    )]
    LegacyEncryptedKey { path: PathBuf },
}

/// The one TLS connector of every connection. Cloning is cheap.
#[derive(Clone)]
pub struct Tls {
    settings: Arc<TlsSettings>,
    inner: MakeRustlsConnect,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tls").field(&self.settings).finish()
    }
}

impl Tls {
    /// Reads every file the settings name and builds the rustls configuration.
    pub fn new(settings: TlsSettings) -> Result<Tls, TlsError> {
        Tls::with_default_root(settings, default_root_cert())
    }

    /// Like [`Tls::new`], with `default_root` in place of `~/.postgresql/root.crt`.
    pub fn with_default_root(
        settings: TlsSettings,
        default_root: Option<PathBuf>,
    ) -> Result<Tls, TlsError> {
        let provider = Arc::new(ring::default_provider());
        let verifier = Verifier::new(&settings, default_root, provider.clone())?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let config = match (&settings.cert, &settings.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certs("sslcert", cert)?;
                let key = read_key(key, settings.key_password.as_deref())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(TlsError::ClientKey)?
            }
            _ => return Err(TlsError::CertWithoutKey),
        };
        Ok(Tls {
            settings: Arc::new(settings),
            inner: MakeRustlsConnect::new(config),
        })
    }

    /// Plain settings for a driver config that carries only an `sslmode` it understands
    /// (tests, tools): no files, nothing to fail.
    pub fn from_driver(pg: &tokio_postgres::Config) -> Tls {
        let mode = match pg.get_ssl_mode() {
            DriverSslMode::Disable => SslMode::Disable,
            DriverSslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        Tls::new(TlsSettings {
            mode,
            ..TlsSettings::default()
        })
        .expect("no files to read, no roots to load")
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// Sets the driver's own `sslmode` to match (offer TLS or not; refuse a plain server).
    pub fn apply(&self, pg: &mut tokio_postgres::Config) {
        pg.ssl_mode(self.settings.mode.driver_mode());
    }
}

impl MakeTlsConnect<Socket> for Tls {
    type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        // The driver asks for a connector before it knows whether TLS will be spoken, with
        // an empty name for a Unix socket. No handshake ever runs without a name (the driver
        // refuses it, and a socket is never offered TLS: see `hosts::one_host`), so the
        // placeholder is never verified against anything.
        let domain = if domain.is_empty() {
            "localhost"
        } else {
            domain
        };
        MakeTlsConnect::<Socket>::make_tls_connect(&mut self.inner, domain)
    }
}

/// What the server-side refusal "server does not support TLS" (tokio-postgres's words)
/// means for an operator.
pub const NO_TLS_OFFERED_HINT: &str = "the server did not offer TLS but sslmode requires it \
     (require, verify-ca, verify-full): turn on ssl in postgresql.conf (or TLS in the \
     pooler in front of it), or set sslmode=prefer/disable in the DSN";

/// A handshake refusal, in words that say what to change.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("server certificate not trusted by {roots} ({reason:?}); set sslrootcert to the CA file that signed the server's certificate")]
    Untrusted {
        roots: String,
        reason: CertificateError,
    },
    #[error("server certificate does not name host {expected:?} (sslmode=verify-full; it names {presented}); connect with a host name the certificate lists, or reissue it with that name")]
    HostMismatch { expected: String, presented: String },
    #[error("server certificate expired{}; renew it on the server", .when.as_deref().unwrap_or(""))]
    Expired { when: Option<String> },
    #[error("server certificate is not valid yet{}; check the server's certificate dates and both clocks", .when.as_deref().unwrap_or(""))]
    NotYetValid { when: Option<String> },
}

/// " at T (now N)" for a validity error that carries its times.
fn validity_times(at: UnixTime, now: UnixTime) -> Option<String> {
    let fmt = |t: UnixTime| {
        chrono::DateTime::from_timestamp(t.as_secs() as i64, 0)
            .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_else(|| t.as_secs().to_string())
    };
    Some(format!(" at {} (now {})", fmt(at), fmt(now)))
}

#[derive(Debug)]
struct Verifier {
    mode: SslMode,
    /// `None`: accept any certificate (prefer, require without a CA file).
    webpki: Option<Arc<WebPkiServerVerifier>>,
    roots_label: String,
    provider: Arc<CryptoProvider>,
}

impl Verifier {
    fn new(
        settings: &TlsSettings,
        default_root: Option<PathBuf>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Verifier, TlsError> {
        let system = settings
            .root_cert
            .as_ref()
            .is_some_and(|p| p.as_os_str() == "system");
        // The root file: sslrootcert, else ~/.postgresql/root.crt when it exists.
        let explicit = match &settings.root_cert {
            Some(p) if !system => Some(p.clone()),
            Some(_) => None,
            None => default_root.clone().filter(|p| p.exists()),
        };
        let verify = match settings.mode {
            SslMode::Disable | SslMode::Prefer => false,
            SslMode::Require => explicit.is_some(),
            SslMode::VerifyCa | SslMode::VerifyFull => true,
        };
        if verify && explicit.is_none() && !system {
            return Err(TlsError::NoRootFile {
                path: default_root.unwrap_or_else(|| "~/.postgresql/root.crt".into()),
            });
        }
        let explicit = explicit.as_ref();
        let mode = match settings.mode {
            SslMode::Require if verify => SslMode::VerifyCa,
            m => m,
        };
        let (webpki, roots_label) = if !verify {
            (None, String::new())
        } else {
            let mut roots = RootCertStore::empty();
            let label = match explicit {
                Some(path) => {
                    let (added, _) =
                        roots.add_parsable_certificates(read_certs("sslrootcert", path)?);
                    if added == 0 {
                        return Err(TlsError::NoPem {
                            keyword: "sslrootcert",
                            path: path.clone(),
                            what: "CA certificate usable as a trust anchor",
                        });
                    }
                    format!("CA file {}", path.display())
                }
                None => {
                    let found = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(found.certs);
                    if roots.is_empty() {
                        return Err(TlsError::Roots(format!(
                            "no sslrootcert given and the system trust store is empty ({} \
                             errors); name the CA file with sslrootcert=/path/ca.crt",
                            found.errors.len()
                        )));
                    }
                    "the system trust store".to_owned()
                }
            };
            let v = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| TlsError::Roots(e.to_string()))?;
            (Some(v), label)
        };
        Ok(Verifier {
            mode,
            webpki,
            roots_label,
            provider,
        })
    }

    fn refuse(&self, r: Refusal) -> rustls::Error {
        // `Other` displays its message; an `InvalidCertificate` would show only its Debug form.
        rustls::Error::Other(rustls::OtherError(Arc::new(r)))
    }
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        // The chain is checked before the name: a name error means the chain is trusted.
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Ok(v) => Ok(v),
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.mode == SslMode::VerifyCa => Ok(ServerCertVerified::assertion()),
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName)) => Err(self
                .refuse(Refusal::HostMismatch {
                    expected: server_name.to_str().into_owned(),
                    presented: "other names".to_owned(),
                })),
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected,
                presented,
            })) => Err(self.refuse(Refusal::HostMismatch {
                expected: expected.to_str().into_owned(),
                presented: presented.join(", "),
            })),
            Err(rustls::Error::InvalidCertificate(CertificateError::Expired)) => {
                Err(self.refuse(Refusal::Expired { when: None }))
            }
            Err(rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
                time,
                not_after,
            })) => Err(self.refuse(Refusal::Expired {
                when: validity_times(not_after, time),
            })),
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidYet)) => {
                Err(self.refuse(Refusal::NotYetValid { when: None }))
            }
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext {
                time,
                not_before,
            })) => Err(self.refuse(Refusal::NotYetValid {
                when: validity_times(not_before, time),
            })),
            Err(rustls::Error::InvalidCertificate(reason)) => {
                Err(self.refuse(Refusal::Untrusted {
                    roots: self.roots_label.clone(),
                    reason,
                }))
            }
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn read(keyword: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable {
        keyword,
        path: path.to_path_buf(),
        source,
    })
}

fn read_certs(
    keyword: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(keyword, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoPem {
            keyword,
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// Reads the client key: refused when others can read it (libpq's rule), decrypted with
/// `password` when it is an encrypted PKCS#8 key.
fn read_key(path: &Path, password: Option<&str>) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_key_file(path)?;
    let text = String::from_utf8_lossy(&pem);
    if text.contains("Proc-Type: 4,ENCRYPTED") {
        return Err(TlsError::LegacyEncryptedKey {
            path: path.to_path_buf(),
        });
    }
    if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
        use pkcs8::der::pem::PemLabel;
        let Some(password) = password else {
            return Err(TlsError::KeyNeedsPassword {
                path: path.to_path_buf(),
            });
        };
        let bad = |reason: String| TlsError::KeyPassword {
            path: path.to_path_buf(),
            reason,
        };
        let (label, doc) =
            pkcs8::SecretDocument::from_pem(&text).map_err(|e| bad(e.to_string()))?;
        pkcs8::EncryptedPrivateKeyInfo::validate_pem_label(label)
            .map_err(|e| bad(e.to_string()))?;
        let info: pkcs8::EncryptedPrivateKeyInfo<'_> =
            doc.decode_msg().map_err(|e| bad(e.to_string()))?;
        let plain = info
            .decrypt(password)
            .map_err(|_| bad("wrong passphrase, or an unsupported cipher".into()))?;
        return Ok(PrivateKeyDer::Pkcs8(plain.as_bytes().to_vec().into()));
    }
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::NoPem {
        keyword: "sslkey",
        path: path.to_path_buf(),
        what: "private key (PKCS#8, PKCS#1 or SEC1)",
    })
}

/// Opens the client key and checks the open file with libpq's rule (u=rw (0600) or less;
/// u=rw,g=r (0640) or less when owned by root: a service reading a root-owned key through
/// its group), then reads it.
fn read_key_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    use crate::db::credfile::{self, CredFileError, Rule};
    credfile::read(path, Rule::Key).map_err(|e| match e {
        CredFileError::KeyMode { mode } => TlsError::KeyPermissions {
            path: path.to_path_buf(),
            mode,
        },
        CredFileError::Open(source) => TlsError::Unreadable {
            keyword: "sslkey",
            path: path.to_path_buf(),
            source,
        },
        other => TlsError::Unreadable {
            keyword: "sslkey",
            path: path.to_path_buf(),
            source: std::io::Error::other(other.to_string()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_names_round_trip() {
        for m in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            assert_eq!(SslMode::parse(m).unwrap().as_str(), m);
        }
        assert_eq!(SslMode::parse("allow"), None);
    }

    #[test]
    fn unreadable_key_names_keyword_and_file() {
        let err = Tls::new(TlsSettings {
            mode: SslMode::Require,
            root_cert: None,
            cert: Some("/nonexistent/client.crt".into()),
            key: Some("/nonexistent/client.key".into()),
            key_password: None,
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("sslcert file /nonexistent/client.crt"),
            "{err}"
        );
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn verify_modes_with_a_missing_ca_file_fail_at_build() {
        let err = Tls::new(TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some("/nonexistent/ca.crt".into()),
            ..TlsSettings::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("sslrootcert file /nonexistent/ca.crt"),
            "{err}"
        );
    }

    fn write_file(dir: &Path, name: &str, text: &[u8], mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    /// A CA and a `localhost` server certificate valid from `not_before` to `not_after`.
    fn ca_and_server(
        not_before: (i32, u8, u8),
        not_after: (i32, u8, u8),
    ) -> (rcgen::Certificate, CertificateDer<'static>) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = p.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        p.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        p.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let server = p.signed_by(&key, &ca, &ca_key).unwrap();
        (ca, server.der().clone())
    }

    fn verify(ca: &rcgen::Certificate, server: &CertificateDer<'static>) -> String {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = write_file(dir.path(), "ca.crt", ca.pem().as_bytes(), 0o644);
        let settings = TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some(ca_file),
            ..TlsSettings::default()
        };
        let v = Verifier::new(&settings, None, Arc::new(ring::default_provider())).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        match v.verify_server_cert(server, &[], &name, &[], UnixTime::now()) {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_expired_or_not_yet_valid_server_certificate_is_named_as_such() {
        let (ca, good) = ca_and_server((2020, 1, 1), (2090, 1, 1));
        assert_eq!(verify(&ca, &good), "ok");
        let (ca, expired) = ca_and_server((2020, 1, 1), (2021, 1, 1));
        let e = verify(&ca, &expired);
        assert!(
            e.contains("server certificate expired at 2021-01-01"),
            "{e}"
        );
        assert!(!e.contains("sslrootcert"), "not a trust problem: {e}");
        let (ca, future) = ca_and_server((2090, 1, 1), (2091, 1, 1));
        let e = verify(&ca, &future);
        assert!(e.contains("not valid yet at 2090-01-01"), "{e}");
    }

    #[test]
    fn verify_modes_read_the_default_root_file_or_refuse_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let default_root = dir.path().join(".postgresql/root.crt");
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            let settings = TlsSettings {
                mode,
                ..TlsSettings::default()
            };
            let e = Tls::with_default_root(settings, Some(default_root.clone()))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("root certificate file {}", default_root.display()))
                    && e.contains("sslrootcert=system"),
                "{e}"
            );
        }
        // With the file there, verify-full uses it, and require verifies the chain with it
        // (libpq's verify-ca).
        std::fs::create_dir_all(default_root.parent().unwrap()).unwrap();
        let (ca, _) = ca_and_server((2020, 1, 1), (2090, 1, 1));
        std::fs::write(&default_root, ca.pem()).unwrap();
        for (mode, effective) in [
            (SslMode::VerifyFull, SslMode::VerifyFull),
            (SslMode::Require, SslMode::VerifyCa),
        ] {
            let settings = TlsSettings {
                mode,
                ..TlsSettings::default()
            };
            let v = Verifier::new(
                &settings,
                Some(default_root.clone()),
                Arc::new(ring::default_provider()),
            )
            .unwrap();
            assert_eq!(v.mode, effective);
            assert!(v.roots_label.contains("root.crt"), "{}", v.roots_label);
        }
        // require without any root file verifies nothing, as libpq.
        let none = Verifier::new(
            &TlsSettings {
                mode: SslMode::Require,
                ..TlsSettings::default()
            },
            Some(dir.path().join("absent.crt")),
            Arc::new(ring::default_provider()),
        )
        .unwrap();
        assert!(none.webpki.is_none());
    }

    /// A client certificate and its key, the key PEM as given.
    fn client_pair(dir: &Path, key_pem: &[u8], mode: u32) -> TlsSettings {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let cert_file = write_file(dir, "client.crt", cert.pem().as_bytes(), 0o644);
        let key_bytes = if key_pem.is_empty() {
            key.serialize_pem().into_bytes()
        } else {
            key_pem.to_vec()
        };
        let key_file = write_file(dir, "client.key", &key_bytes, mode);
        TlsSettings {
            mode: SslMode::Require,
            cert: Some(cert_file),
            key: Some(key_file),
            ..TlsSettings::default()
        }
    }

    #[test]
    fn a_client_key_others_can_read_is_refused_with_libpqs_rule() {
        let dir = tempfile::tempdir().unwrap();
        let e = Tls::new(client_pair(dir.path(), b"", 0o644))
            .unwrap_err()
            .to_string();
        assert!(e.contains("group or world access (0644)"), "{e}");
        Tls::new(client_pair(dir.path(), b"", 0o600)).unwrap();
        // Owned by root, group-readable is allowed (a service reads it through its group).
        let owned_by_root = unsafe { libc::geteuid() } == 0;
        let r = Tls::new(client_pair(dir.path(), b"", 0o640));
        assert_eq!(r.is_ok(), owned_by_root, "{r:?}");
    }

    #[test]
    fn an_encrypted_client_key_opens_with_sslpassword_only() {
        use pkcs8::der::Decode;
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let der = key.serialize_der();
        let info = pkcs8::PrivateKeyInfo::from_der(&der).unwrap();
        let params = pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(
            2048,
            b"saltsaltsaltsalt",
            b"0123456789abcdef",
        )
        .unwrap();
        let encrypted = info.encrypt_with_params(params, "s3cret").unwrap();
        let pem = encrypted
            .to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF)
            .unwrap();
        let mut settings = client_pair(dir.path(), pem.as_bytes(), 0o600);
        let e = Tls::new(settings.clone()).unwrap_err().to_string();
        assert!(e.contains("give its passphrase as sslpassword"), "{e}");
        settings.key_password = Some("not-it-9".into());
        let e = Tls::new(settings.clone()).unwrap_err().to_string();
        assert!(e.contains("cannot decrypt"), "{e}");
        assert!(
            !e.contains("not-it-9"),
            "the passphrase is never shown: {e}"
        );
        settings.key_password = Some("s3cret".into());
        // The decrypted key is the certificate's pair (rustls checks it when it builds).
        let cert = rcgen::CertificateParams::new(vec!["client".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        write_file(dir.path(), "client.crt", cert.pem().as_bytes(), 0o644);
        Tls::new(settings.clone()).unwrap();
        assert!(!format!("{settings:?}").contains("s3cret"));
        // The legacy OpenSSL encryption is named, with the conversion to run.
        let legacy = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00\n\nAAAA\n-----END RSA PRIVATE KEY-----\n";
        let e = Tls::new(client_pair(dir.path(), legacy.as_bytes(), 0o600))
            .unwrap_err()
            .to_string();
        assert!(e.contains("openssl pkcs8 -topk8"), "{e}");
    }
}
