//! HTTPS on the HTTP port (`[http] tls_cert_file`, `tls_key_file`): rustls with the ring
//! provider (the one the database connections use). The certificate chain and key are read
//! at configuration time, and again when either file changes: each handshake looks at the
//! files' metadata at most once a second, and a changed pair is loaded for the next
//! connections, so a renewed certificate needs no restart. A pair that does not load (a key
//! written before its certificate, say) is logged and the previous pair kept until the
//! files change again. The key is checked on the open file as libpq checks a key.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::crypto::ring;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use slog::{info, warn};

use crate::config::tls::{load, LoadError};
use crate::config::TlsFiles;

/// How often a handshake looks whether the files changed.
const RECHECK: Duration = Duration::from_secs(1);

/// What identifies a file's content cheaply: inode, size and modification time.
type Stamp = [(u64, u64, i64, i64); 2];

fn stamp(files: &TlsFiles) -> std::io::Result<Stamp> {
    let one = |p: &std::path::Path| {
        std::fs::metadata(p).map(|m| (m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
    };
    Ok([one(&files.cert)?, one(&files.key)?])
}

struct Loaded {
    key: Arc<CertifiedKey>,
    stamp: Option<Stamp>,
    /// The stamp of a pair that did not load (logged once).
    failed: Option<Stamp>,
    checked: Instant,
}

/// The server's certificate, re-read when its files change.
pub struct Reloading {
    files: TlsFiles,
    log: slog::Logger,
    state: Mutex<Loaded>,
}

impl fmt::Debug for Reloading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Reloading {
    pub fn new(files: TlsFiles, log: slog::Logger) -> Result<Reloading, LoadError> {
        let stamp = stamp(&files).ok();
        let key = load(&files)?;
        Ok(Reloading {
            files,
            log,
            state: Mutex::new(Loaded {
                key,
                stamp,
                failed: None,
                checked: Instant::now(),
            }),
        })
    }

    /// The pair to present now, loading the files again when they changed.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.checked.elapsed() >= RECHECK {
            s.checked = Instant::now();
            if let Ok(now) = stamp(&self.files) {
                if Some(now) != s.stamp && Some(now) != s.failed {
                    match load(&self.files) {
                        Ok(key) => {
                            s.key = key;
                            s.stamp = Some(now);
                            s.failed = None;
                            info!(self.log, "HTTP TLS certificate reloaded";
                                "cert" => %self.files.cert.display());
                        }
                        Err(e) => {
                            s.failed = Some(now);
                            warn!(self.log, "HTTP TLS certificate changed but does not load; serving the previous one";
                                "error" => %e);
                        }
                    }
                }
            }
        }
        s.key.clone()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls server configuration of the HTTP port (HTTP/1.1, TLS 1.2 and 1.3).
pub fn server_config(
    files: &TlsFiles,
    log: &slog::Logger,
) -> Result<rustls::ServerConfig, LoadError> {
    let resolver = Reloading::new(files.clone(), log.clone())?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| LoadError::Cert(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}
