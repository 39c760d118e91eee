//! sd_notify on a fake socket: READY=1 once /readyz answers 200, WATCHDOG=1 on every tick,
//! STOPPING=1 at SIGTERM, and nothing needed without systemd.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::helpers::replica::{Options, ReplicaProc, Systemd};
use crate::helpers::TestDb;

const WATCHDOG_USEC: u64 = 2_000_000;

#[tokio::test]
async fn under_a_notify_socket_the_daemon_reports_ready_pings_the_watchdog_and_reports_stopping() {
    let db = TestDb::new().await;
    db.seed(2, "* * * * * *").await;
    let dir = tempfile::tempdir().unwrap();
    let mut sock = NotifySocket::bind(&dir.path().join("notify.sock"));

    let mut d = under_systemd(&db, "n", &sock, WATCHDOG_USEC);
    let before_ready = sock.until("READY=1", Duration::from_secs(30), &d);
    assert_eq!(
        d.get("/readyz").map(|r| r.0),
        Some(200),
        "READY=1 was sent before /readyz answered 200; log:\n{}",
        d.log()
    );
    assert!(!before_ready.iter().any(|(_, m)| m == "STOPPING=1"));
    let ready_at = sock.seen.last().unwrap().0;

    // The watchdog: WATCHDOG_PID is the daemon's own pid (the sd-notify crate, unlike
    // libsystemd, requires it to be set), so the supervisor's timer pings on every tick.
    while sock.count_after("WATCHDOG=1", ready_at) < 4 {
        sock.until("WATCHDOG=1", Duration::from_secs(10), &d);
    }
    let pings: Vec<Instant> = sock
        .seen
        .iter()
        .filter(|(at, m)| *at >= ready_at && m == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .collect();
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    println!("watchdog ping gaps after READY=1: {gaps:?} (WATCHDOG_USEC={WATCHDOG_USEC})");
    assert!(
        gaps.iter()
            .all(|g| *g < Duration::from_micros(WATCHDOG_USEC)),
        "a watchdog gap exceeded WATCHDOG_USEC: {gaps:?}"
    );

    d.signal(libc::SIGTERM);
    sock.until("STOPPING=1", Duration::from_secs(10), &d);
    let status = d.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "exit {status}; log:\n{}", d.log());
    assert_eq!(
        sock.seen.iter().filter(|(_, m)| m == "READY=1").count(),
        1,
        "{:?}",
        sock.seen
    );

    // Without NOTIFY_SOCKET (not under systemd) notification is a no-op.
    let mut plain = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "n", "", &[]);
    plain.wait_ready(Duration::from_secs(30)).await;
    plain.signal(libc::SIGTERM);
    assert!(plain.wait_exit(Duration::from_secs(30)).await.success());
}

#[tokio::test]
async fn a_watchdog_interval_shorter_than_two_scheduler_ticks_is_refused_at_start() {
    // Pings come once per tick (cadence 1s): with WatchdogSec=1s one late tick would get the
    // service killed, so the daemon must refuse this pairing instead of flapping.
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let mut sock = NotifySocket::bind(&dir.path().join("notify.sock"));
    let mut d = under_systemd(&db, "w", &sock, 1_000_000);
    let status = d.wait_exit(Duration::from_secs(15)).await;
    assert!(!status.success(), "log:\n{}", d.log());
    assert!(
        d.log().contains("at least twice scheduler.cadence"),
        "{}",
        d.log()
    );
    sock.drain();
    assert!(
        !sock.seen.iter().any(|(_, m)| m == "READY=1"),
        "{:?}",
        sock.seen
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.replicas").await,
        0,
        "refused before it took the replica id"
    );
}

/// Replica `id` started the way systemd starts it, with `sock` as its notify socket.
fn under_systemd(db: &TestDb, id: &str, sock: &NotifySocket, watchdog_usec: u64) -> ReplicaProc {
    let systemd = Systemd {
        notify_socket: &sock.path,
        watchdog_usec,
    };
    ReplicaProc::start(
        &db.dsn("qlsched_runtime"),
        id,
        Options {
            systemd: Some(systemd),
            ..Options::default()
        },
    )
}

/// A datagram socket standing in for systemd's: every line received, with when it arrived.
struct NotifySocket {
    path: PathBuf,
    rx: mpsc::Receiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
    stop: Arc<AtomicBool>,
}

impl NotifySocket {
    fn bind(path: &Path) -> NotifySocket {
        let sock = UnixDatagram::bind(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !stopped.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let at = Instant::now();
                    for line in String::from_utf8_lossy(&buf[..n]).lines() {
                        let _ = tx.send((at, line.to_string()));
                    }
                }
            }
        });
        NotifySocket {
            path: path.to_path_buf(),
            rx,
            seen: Vec::new(),
            stop,
        }
    }

    /// Receives until `state` arrives (bounded); returns the messages received before it.
    fn until(&mut self, state: &str, within: Duration, d: &ReplicaProc) -> Vec<(Instant, String)> {
        let deadline = Instant::now() + within;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(msg) => {
                    self.seen.push(msg.clone());
                    if msg.1 == state {
                        return before;
                    }
                    before.push(msg);
                }
                Err(_) => panic!(
                    "no {state} within {within:?}; received {:?}; log:\n{}",
                    self.seen,
                    d.log()
                ),
            }
        }
    }

    /// Takes whatever has arrived so far without waiting.
    fn drain(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            self.seen.push(msg);
        }
    }

    fn count_after(&self, state: &str, after: Instant) -> usize {
        self.seen
            .iter()
            .filter(|(at, m)| *at >= after && m == state)
            .count()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
