//! A no-op HTTP server on loopback for the worker rows' HTTP executor: HTTP/1.1 with
//! keep-alive, 204 No Content to every request (its body read and dropped), and a count of
//! the requests it answered.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Sink {
    pub addr: SocketAddr,
    answered: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    /// Listens on 127.0.0.1 at a free port, serving on the current runtime.
    pub async fn start() -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the sink");
        let addr = listener.local_addr().unwrap();
        let answered = Arc::new(AtomicU64::new(0));
        let count = answered.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, count.clone()));
            }
        });
        Sink {
            addr,
            answered,
            task,
        }
    }

    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers the requests of one connection until the client closes it or asks to.
async fn serve(mut s: TcpStream, answered: Arc<AtomicU64>) {
    let _ = s.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        let body: usize = header("content-length:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let close = header("connection:").is_some_and(|v| v == "close");
        while buf.len() < end + 4 + body {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + 4 + body);
        if s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        answered.fetch_add(1, Ordering::Relaxed);
        if close {
            return;
        }
    }
}
