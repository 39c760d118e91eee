//! TLS for every connection (daemon pool and CLI), with libpq's meaning of `sslmode`, on
//! rustls:
//!
//! | sslmode       | TLS                          | server certificate                        |
//! |---------------|------------------------------|-------------------------------------------|
//! | `disable`     | never                        | —                                         |
//! | `prefer`      | if the server offers it      | not verified                              |
//! | `require`     | always (refused otherwise)   | not verified; verified as `verify-ca` when `sslrootcert` is given (libpq does the same) |
//! | `verify-ca`   | always                       | chain to `sslrootcert` (or system roots)  |
//! | `verify-full` | always                       | chain, and the certificate names the host |
//!
//! `sslcert` + `sslkey` present a client certificate (for `cert` authentication in
//! `pg_hba.conf`). Every file is read when the [`Tls`] is built — at configuration time —
//! so an unreadable file is a configuration error, never a connection loop.

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

/// The TLS keywords of a DSN (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// CA certificates (PEM). `None` or `system`: the system trust store.
    pub root_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
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
        let provider = Arc::new(ring::default_provider());
        let verifier = Verifier::new(&settings, provider.clone())?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let config = match (&settings.cert, &settings.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certs("sslcert", cert)?;
                let key = read_key(key)?;
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
    fn new(settings: &TlsSettings, provider: Arc<CryptoProvider>) -> Result<Verifier, TlsError> {
        let explicit = settings
            .root_cert
            .as_ref()
            .filter(|p| p.as_os_str() != "system");
        let verify = match settings.mode {
            SslMode::Disable | SslMode::Prefer => false,
            SslMode::Require => explicit.is_some(),
            SslMode::VerifyCa | SslMode::VerifyFull => true,
        };
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

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("sslkey", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::NoPem {
        keyword: "sslkey",
        path: path.to_path_buf(),
        what: "private key (PKCS#8, PKCS#1 or SEC1)",
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
}
