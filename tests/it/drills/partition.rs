//! Drill 6, partition: replica `a` reaches PostgreSQL only through the fault proxy, `b`
//! directly. Just as `a` sends an admission, the proxy blackholes every connection of `a`
//! (no reset: bytes simply stop, in both directions), so `a` is cut off while it holds
//! leases. `b` takes those rows over, but only after the leases' database expiry, and
//! admits them. Then the partition heals: the admission `a` sent before the cut reaches
//! the server late and is fenced out (it writes nothing: `SELECT 0`, not a unique-key
//! error); `a` goes on admitting. 0 duplicates, 0 lost.

use std::time::Duration;

use super::check::{self, Expect, Held};
use super::{db_now, scalar, Drill, Fleet, Stage};
use crate::helpers::proxy::Fault;
use crate::helpers::wait_until;

const TRIGGERS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_replica_is_taken_over_after_expiry_and_its_stale_admission_is_fenced_out() {
    let mut drill = Drill::begin("partition", (1, 0), (6, 0), |p, _| {
        format!(
            "{} partitions of replica a (through the proxy) while it admits, replica b direct, lease 5 s, {TRIGGERS} every-second triggers",
            p.cycles
        )
    })
    .await;
    let mut stage = Stage::through_proxy(TRIGGERS, "").await;
    stage.fleet.start(&["a"]).await;
    let mut direct = Fleet::new(&stage.db.dsn("qlsched_runtime"), "", &[]);
    direct.start(&["b"]).await;
    stage.wait_all_admitting().await;
    let proxy = stage.proxy.as_ref().unwrap();

    let mut expect = Expect::every_second();
    let mut stale = Vec::new();
    let mut cut_ms = Vec::new();
    for cycle in 0..drill.p.cycles {
        proxy.arm(Fault::Partition, 1, 1);
        wait_until(
            "replica a partitioned mid-admission",
            Duration::from_secs(30),
            || async { proxy.partitioned() },
        )
        .await;
        let cut_at = db_now(&stage.sql).await;
        let held = check::held_by(&stage.sql, "a").await;
        assert!(!held.is_empty(), "a held no lease when it was cut off");
        wait_taken_over_by(&stage.sql, &held, "b", Duration::from_secs(30)).await;
        let healed_at = db_now(&stage.sql).await;
        cut_ms.push(healed_at - cut_at);
        proxy.heal();
        wait_until(
            "the stale admission answered after the heal",
            Duration::from_secs(30),
            || async { proxy.stats().after_heal.len() > stale.len() },
        )
        .await;
        stale = proxy.stats().after_heal;
        wait_until("a admitting again", Duration::from_secs(30), || async {
            scalar(
                &stage.sql,
                &format!(
                    "SELECT count(*) FROM qlsched.runs WHERE admitted_by = 'a' AND queued_at_ms > {healed_at}"
                ),
            )
            .await
                > 0
        })
        .await;
        expect.held.extend(held);
        if cycle + 1 < drill.p.cycles {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    stage.fleet.stop_all().await;
    direct.stop_all().await;

    drill.report.note(format!(
        "leases a held when cut off {} · partitions lasted (ms) {cut_ms:?} · the stale admission's replies after the heal {stale:?}",
        expect.held.len()
    ));
    let f = drill.report.finish(&stage.sql, &expect, &direct).await;
    assert_eq!(
        f.takeovers,
        expect.held.len() as i64,
        "every lease a held was taken over by b"
    );
    assert!(
        stale.iter().all(|r| r == "SELECT 0"),
        "the stale admission wrote something or hit the unique key instead of the fence: {stale:?}"
    );
}

/// Waits until `taker` has admitted the occurrence of every lease in `held`.
pub(super) async fn wait_taken_over_by(
    sql: &tokio_postgres::Client,
    held: &[Held],
    taker: &str,
    within: Duration,
) {
    let ids: Vec<&str> = held.iter().map(|h| h.trigger_id.as_str()).collect();
    let sfs: Vec<i64> = held.iter().map(|h| h.scheduled_for_ms).collect();
    wait_until("every lease of a taken over by b", within, || {
        let (ids, sfs) = (&ids, &sfs);
        async move {
            let n: i64 = sql
                .query_one(
                    "SELECT count(*) FROM unnest($1::text[], $2::bigint[]) h(trigger_id, sf)
                       JOIN qlsched.runs r ON r.trigger_id = h.trigger_id AND r.scheduled_for_ms = h.sf
                      WHERE r.admitted_by = $3",
                    &[ids, sfs, &taker],
                )
                .await
                .unwrap()
                .get(0);
            n == ids.len() as i64
        }
    })
    .await;
}
