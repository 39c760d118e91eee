//! The HTTP port's certificate and key (`[http] tls_cert_file`, `tls_key_file`), read and
//! checked: at configuration time (`check-config`, start) and by the HTTP server whenever the
//! files change (src/http/tls.rs). The key is checked on the open file as libpq checks a key.

use std::fmt;
use std::sync::Arc;

use rustls::crypto::ring;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::TlsFiles;
use crate::db::credfile::{self, Rule};

/// Why a certificate/key pair did not load: blamed on the file at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    Cert(String),
    Key(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Cert(m) => write!(f, "http.tls_cert_file: {m}"),
            LoadError::Key(m) => write!(f, "http.tls_key_file: {m}"),
        }
    }
}

/// Reads and checks the pair: a PEM chain, and a PEM private key (PKCS#8, PKCS#1 or SEC1)
/// that passes libpq's key rule and matches the first certificate.
pub fn load(files: &TlsFiles) -> Result<Arc<CertifiedKey>, LoadError> {
    let pem = std::fs::read(&files.cert)
        .map_err(|e| LoadError::Cert(format!("must exist and be readable ({e})")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LoadError::Cert(format!("is not a PEM certificate chain ({e})")))?;
    if certs.is_empty() {
        return Err(LoadError::Cert("holds no PEM certificate".into()));
    }
    let pem = credfile::read(&files.key, Rule::Key).map_err(|e| LoadError::Key(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| LoadError::Key(format!("holds no PEM private key ({e})")))?;
    let signer = ring::sign::any_supported_type(&key)
        .map_err(|e| LoadError::Key(format!("is not a usable private key ({e})")))?;
    let ck = CertifiedKey::new(certs, signer);
    ck.keys_match().map_err(|e| {
        LoadError::Key(format!(
            "does not match the certificate of http.tls_cert_file ({e})"
        ))
    })?;
    Ok(Arc::new(ck))
}
