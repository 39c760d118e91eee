//! The http executor (docs/worker.md, "http"): one HTTP/1.1 request per attempt, with the
//! run's key in `Idempotency-Key`; TLS verified against the system's roots (rustls, ring).
//! A 2xx answer succeeds; the status is the attempt's exit status and its result
//! (`{"http_status": N}`), the body's tail its output. No redirect is followed.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use super::secrets::Redactor;
use super::spec::HttpSpec;
use super::tail::Tail;
use super::{Limits, Outcome, RunVars, Stop};

/// The whole request's bound when the spec sets no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Sends the request; `headers` are the spec's, secrets resolved.
pub async fn run(
    spec: &HttpSpec,
    headers: Vec<(String, String)>,
    vars: &RunVars,
    timeout: Option<Duration>,
    limits: &Limits,
    redactor: &Redactor,
    stop: &mut watch::Receiver<Option<Stop>>,
) -> Outcome {
    let timeout = timeout.unwrap_or(DEFAULT_TIMEOUT);
    let call = call(
        spec,
        headers,
        vars,
        limits.output_bound + redactor.longest(),
    );
    let res = tokio::select! {
        r = tokio::time::timeout(timeout, call) => match r {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {}", crate::config::format_duration(timeout))),
        },
        s = super::shell::stopped(stop) => Err(s.describe().to_string()),
    };
    match res {
        Err(e) => Outcome::failed(None, String::new(), redactor.redact(&e)),
        Ok((status, body)) => {
            let output = body.text(limits.output_bound, redactor);
            let result = Some(serde_json::json!({ "http_status": status }));
            let mut o = if (200..300).contains(&status) {
                Outcome::succeeded(Some(i32::from(status)), output, None)
            } else {
                Outcome::failed(
                    Some(i32::from(status)),
                    output,
                    format!("answered HTTP {status}"),
                )
            };
            o.result = result;
            o
        }
    }
}

async fn call(
    spec: &HttpSpec,
    headers: Vec<(String, String)>,
    vars: &RunVars,
    keep: usize,
) -> Result<(u16, Tail), String> {
    let uri = &spec.url;
    let host = uri.host().ok_or("the URL has no host")?;
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((bare_host, port))
        .await
        .map_err(|e| format!("connecting to {host}:{port}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let mut req = http::Request::builder()
        .method(spec.method.as_str())
        .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            http::header::HOST,
            uri.authority().map_or(host, |a| a.as_str()),
        )
        .header("Idempotency-Key", &vars.idempotency_key)
        .header(
            http::header::USER_AGENT,
            concat!("qlsched-worker/", env!("CARGO_PKG_VERSION")),
        );
    for (k, v) in &headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let body = Full::new(Bytes::from(spec.body.clone().unwrap_or_default()));
    let req = req
        .body(body)
        .map_err(|e| format!("building the request: {e}"))?;
    if https {
        let name = rustls::pki_types::ServerName::try_from(bare_host.to_string())
            .map_err(|e| format!("{host}: not a TLS server name ({e})"))?;
        let tls = tokio_rustls::TlsConnector::from(client_config()?)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
        exchange(TokioIo::new(tls), req, keep).await
    } else {
        exchange(TokioIo::new(tcp), req, keep).await
    }
}

async fn exchange<T>(
    io: T,
    req: http::Request<Full<Bytes>>,
    keep: usize,
) -> Result<(u16, Tail), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let conn = tokio::spawn(conn);
    let res = send
        .send_request(req)
        .await
        .map_err(|e| format!("sending the request: {e}"));
    let out = match res {
        Err(e) => Err(e),
        Ok(res) => {
            let status = res.status().as_u16();
            let mut body = res.into_body();
            let mut tail = Tail::new(keep);
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => {
                        if let Some(d) = f.data_ref() {
                            tail.push(d);
                        }
                    }
                    Err(e) => return Err(format!("reading the answer's body: {e}")),
                }
            }
            Ok((status, tail))
        }
    };
    conn.abort();
    out
}

/// rustls with ring, verifying against the system's roots (loaded once).
fn client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err("no trusted root certificate found on this host".to_string());
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS set-up: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(cfg))
        })
        .clone()
}
