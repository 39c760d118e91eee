//! Readiness over HTTP: /healthz while the process runs, /readyz 200 after start and 503 from
//! the first moment of a stop, while the drain is still running.

use std::time::{Duration, Instant};

use super::{count, RunsLock, ADMISSIONS_WAITING_FOR_A_LOCK, LEASES_OF, RUNS_ADMITTED_BY};
use crate::helpers::replica::ReplicaProc;
use crate::helpers::{poll_until, wait_until, TestDb};

#[tokio::test]
async fn readyz_is_503_from_the_first_moment_of_a_stop_while_the_drain_is_still_running() {
    let db = TestDb::new().await;
    db.seed(3, "* * * * * *").await;
    let su = db.superuser().await;
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "r",
        "lease = \"10s\"\nadmit_timeout = \"8s\"\ndrain = \"5s\"",
        &[("QLSCHED__DATABASE__APPLICATION_NAME", "ready-r")],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    assert_eq!(r.get("/healthz"), Some((200, "ok\n".into())));
    assert_eq!(r.get("/readyz"), Some((200, "ready\n".into())));
    wait_until("a run is admitted", Duration::from_secs(30), || async {
        count(&su, RUNS_ADMITTED_BY, "r").await >= 1
    })
    .await;

    // Make the drain last: the next admission blocks, so its lease stays live.
    let lock = RunsLock::take(&db).await;
    wait_until(
        "an admission is waiting for the lock",
        Duration::from_secs(10),
        || async { count(&su, ADMISSIONS_WAITING_FOR_A_LOCK, "ready-r").await >= 1 },
    )
    .await;
    assert!(count(&su, LEASES_OF, "r").await >= 1);

    let sent = Instant::now();
    r.signal(libc::SIGTERM);
    let (status, body) = poll_until("/readyz turns 503", Duration::from_secs(5), || {
        let res = r.get("/readyz").filter(|(s, _)| *s != 200);
        async move { res }
    })
    .await;
    let withdrawn_after = sent.elapsed();
    assert_eq!((status, body.as_str()), (503, "not ready\n"));
    // Still draining: the process serves /healthz and holds its leases.
    assert_eq!(r.get("/healthz").map(|x| x.0), Some(200));
    let metrics = r.get("/metrics").expect("metrics while draining").1;
    assert_eq!(
        crate::helpers::replica::metric(&metrics, "qlsched_ready"),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        count(&su, LEASES_OF, "r").await >= 1,
        "leases released already"
    );
    assert!(!r.log().contains("leases handed over"), "{}", r.log());
    // And it stays withdrawn for the rest of the drain (sampled for half a second).
    let window = Instant::now();
    while window.elapsed() < Duration::from_millis(500) {
        if let Some((s, _)) = r.get("/readyz") {
            assert_eq!(s, 503, "readiness came back during the drain");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("readiness withdrawn {withdrawn_after:?} after SIGTERM (drain 5s)");

    // Let the blocked admission through: the drain completes, leases are handed over.
    lock.release().await;
    let status = r.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}; log:\n{}", r.log());
    assert!(r.log().contains("leases handed over"), "{}", r.log());
    assert_eq!(count(&su, LEASES_OF, "r").await, 0);
    db.assert_invariants().await;
}
