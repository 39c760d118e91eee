//! A slow link on loopback: a TCP forwarder that delays every byte by half the round-trip
//! time in each direction, as a delay line (bytes sent back to back stay back to back, so a
//! pipelined exchange still costs one round trip). `tc netem` is not available here.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub struct DelayProxy {
    pub port: u16,
    accept: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port; forwards to `127.0.0.1:upstream_port` with `rtt`
    /// added to every round trip.
    pub async fn start(upstream_port: u16, rtt: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let one_way = rtt / 2;
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(line(cr, sw, one_way));
                    tokio::spawn(line(sr, cw, one_way));
                });
            }
        });
        DelayProxy { port, accept }
    }

    pub fn dsn(&self, user: &str, db: &str) -> String {
        format!("host=127.0.0.1 port={} user={user} dbname={db}", self.port)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One direction: read, stamp, and write each chunk once its delay has passed.
async fn line(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
