//! Hosts that never answer, on loopback: the first host of a DSN that has died.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A listening port that drops every new SYN, as a vanished cloud VM behind a firewall
/// does: its accept queue (backlog 0) is full and nothing is ever accepted, so a connect
/// hangs until the client gives up.
pub struct SynDrop {
    pub port: u16,
    _listener: std::net::TcpListener,
    _queued: Vec<std::net::TcpStream>,
}

impl SynDrop {
    pub fn start() -> SynDrop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // Re-listen with a backlog of 0 (std uses 128).
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        assert_eq!(unsafe { libc::listen(fd, 0) }, 0);
        let port = listener.local_addr().unwrap().port();
        // Fill the queue: the kernel keeps one completed connection beyond the backlog.
        let mut queued = Vec::new();
        for _ in 0..2 {
            if let Ok(s) = std::net::TcpStream::connect_timeout(
                &([127, 0, 0, 1], port).into(),
                std::time::Duration::from_millis(200),
            ) {
                queued.push(s);
            }
        }
        assert!(!queued.is_empty(), "could not fill the accept queue");
        SynDrop {
            port,
            _listener: listener,
            _queued: queued,
        }
    }
}

/// A port that accepts connections, counts them and never sends a byte: a server hung
/// after the TCP handshake.
pub struct Tarpit {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Tarpit {
    pub async fn start() -> Tarpit {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(s);
            }
        });
        Tarpit {
            port,
            accepted,
            task,
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Tarpit {
    fn drop(&mut self) {
        self.task.abort();
    }
}
