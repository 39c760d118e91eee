//! Drill 4, physical standby promotion with a held claim: a primary and a streaming standby
//! made with `pg_basebackup -R` (same binaries). A claim is taken on the primary with a
//! known lease (`store::claim::claim_due`, as a replica would) and proven replayed on the
//! standby; the primary is stopped (fenced: it never comes back), the standby promoted
//! (its timeline changes) and fresh replicas are started against it. They are ready well
//! before the claim's expiry, yet take the row over only after its **database** expiry;
//! the occurrence then has exactly 1 run, 1 attempt and 2 events; 0 duplicates overall.
//! The long form repeats it: the promoted server becomes the next primary.

use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use super::check::{Expect, Held};
use super::{db_now, own_root, scalar, Drill, Fleet, OwnPg, EVERY_SECOND};
use crate::helpers::claimed::Claimed;
use crate::helpers::pg::{free_port, run_as, server_command, Server};
use crate::helpers::{wait_until, TestDb};

const TRIGGERS: usize = 5;
const LEASE_MS: i64 = 15_000;
const GRACE_MS: i64 = 60_000;
const HOLDER: &str = "holder-on-old-primary";

#[tokio::test]
async fn a_claim_held_across_a_standby_promotion_is_taken_over_only_after_its_database_expiry() {
    let mut drill = Drill::begin("standby_promotion", (1, 0), (3, 0), |p, _| {
        format!(
            "{} promotions, claim lease {} s, 2 fresh replicas per promotion, {TRIGGERS} every-second triggers",
            p.cycles,
            LEASE_MS / 1000
        )
    })
    .await;
    let mut primary = OwnPg::start("primary", "fsync = off").await;
    primary.db.seed(TRIGGERS, EVERY_SECOND).await;
    // Initialised and due: every cursor on the last whole second.
    crate::helpers::make_due_seconds_ago(&primary.db.superuser().await, 1).await;

    let mut expect = Expect::every_second();
    let mut timeline = timeline_of(&primary.db).await;
    let mut fleet = Fleet::new("", "", &[]);
    let mut notes = Vec::new();
    for _ in 0..drill.p.cycles {
        let standby = make_standby(&primary).await;

        // A claim on the primary, with a known lease, as a replica takes it.
        let row = Claimed::new(&primary.db, HOLDER, LEASE_MS)
            .await
            .row()
            .clone();
        let scheduled_for = row.next_fire_at_ms.expect("an initialised row");
        let expires = row.fence.expires_at_ms;
        // Lag carried over from the previous promotions (finding 4: a trigger behind its
        // schedule never catches up while its period is the cadence) must leave the held
        // occurrence within its grace at the takeover, or `skip` drops it by policy.
        assert!(
            expires - scheduled_for < GRACE_MS,
            "the held occurrence is already {} s behind: at its takeover it will be more than \
             the 60 s grace late and skipped by policy. Lag accumulates across promotions \
             (drills::findings::a_trigger_behind_its_schedule_catches_up_at_admission_speed)",
            (row.observed_at_ms - scheduled_for) / 1000
        );

        // Replayed on the standby: same owner, token and expiry.
        let on_standby = standby.db.superuser().await;
        wait_until(
            "the claim replayed on the standby",
            Duration::from_secs(30),
            || {
                let (c, row) = (&on_standby, &row);
                async move {
                    c.query_opt(
                        "SELECT 1 FROM qlsched.trigger_schedules
                      WHERE trigger_id = $1 AND claim_owner = $2 AND claim_token = $3
                        AND claim_version = $4 AND claim_expires_at_ms = $5",
                        &[
                            &row.trigger_id,
                            &row.fence.owner,
                            &row.fence.token,
                            &row.fence.version,
                            &row.fence.expires_at_ms,
                        ],
                    )
                    .await
                    .unwrap()
                    .is_some()
                }
            },
        )
        .await;
        drop(on_standby);

        // Fence the primary for good, promote the standby.
        let promoted = fail_over(&mut primary, &standby).await;
        let new_timeline = timeline_of(&standby.db).await;
        assert!(
            new_timeline > timeline,
            "timeline did not change: {timeline} → {new_timeline}"
        );

        // Fresh replicas against the promoted server.
        fleet = Fleet::new(&standby.db.dsn("qlsched_runtime"), "", &[]);
        fleet.start(&["a", "b"]).await;
        let ready_at = db_now(&promoted).await;
        assert!(
            ready_at + 2000 < expires,
            "the replicas were ready only {} ms before the claim's expiry: the drill proves nothing",
            expires - ready_at
        );
        // Until the database expiry the row stays the old holder's; then it is taken over.
        let run_queued_at: i64 = loop {
            let now = db_now(&promoted).await;
            let r = promoted
                .query_one(
                    "SELECT s.claim_token = $3 AND s.claim_owner = $4,
                            (SELECT min(queued_at_ms) FROM qlsched.runs r
                              WHERE r.trigger_id = $1 AND r.scheduled_for_ms = $2)
                       FROM qlsched.trigger_schedules s WHERE s.trigger_id = $1",
                    &[&row.trigger_id, &scheduled_for, &row.fence.token, &HOLDER],
                )
                .await
                .unwrap();
            let (still_held, queued): (Option<bool>, Option<i64>) = (r.get(0), r.get(1));
            if now < expires {
                assert_eq!(
                    still_held,
                    Some(true),
                    "the held claim changed {} ms before its database expiry",
                    expires - now
                );
            }
            if let Some(q) = queued {
                break q;
            }
            assert!(now < expires + 30_000, "the occurrence was never admitted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(run_queued_at >= expires);
        let key = qlsched::store::admission::idempotency_key(
            &row.trigger_id,
            row.def.trigger_revision,
            scheduled_for,
        );
        let shape: (i64, i64, i64) = {
            let r = promoted
                .query_one(
                    "SELECT count(DISTINCT r.run_id), count(DISTINCT a.attempt_id),
                            count(DISTINCT (e.run_id, e.seq))
                       FROM qlsched.runs r
                       LEFT JOIN qlsched.attempts a ON a.run_id = r.run_id
                       LEFT JOIN qlsched.run_events e ON e.run_id = r.run_id
                      WHERE r.idempotency_key = $1",
                    &[&key],
                )
                .await
                .unwrap();
            (r.get(0), r.get(1), r.get(2))
        };
        assert_eq!(shape, (1, 1, 2), "runs / attempts / events of {key}");
        expect.held.push(Held {
            trigger_id: row.trigger_id.clone(),
            owner: HOLDER.into(),
            scheduled_for_ms: scheduled_for,
            expires_at_ms: expires,
            freed_at_ms: i64::MAX,
        });
        notes.push(format!(
            "timeline {timeline} → {new_timeline}: replicas ready {} ms before the expiry, occurrence admitted {} ms after it (1 run / 1 attempt / 2 events)",
            expires - ready_at,
            run_queued_at - expires
        ));
        timeline = new_timeline;
        tokio::time::sleep(Duration::from_secs(2)).await;
        fleet.stop_all().await;
        primary = standby;
    }

    let sql = primary.db.superuser().await;
    for n in notes {
        drill.report.note(n);
    }
    drill.report.note(format!(
        "runs on the final primary {}",
        scalar(&sql, "SELECT count(*) FROM qlsched.runs").await
    ));
    let f = drill.report.finish(&sql, &expect, &fleet).await;
    assert_eq!(f.takeovers, drill.p.cycles as i64);
}

/// The current WAL timeline of a primary.
async fn timeline_of(db: &TestDb) -> i64 {
    let tli: String = db
        .superuser()
        .await
        .query_one(
            "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    i64::from_str_radix(&tli, 16).unwrap()
}

/// A streaming standby of `primary`: `pg_basebackup -R -X stream`, started, streaming.
async fn make_standby(primary: &OwnPg) -> OwnPg {
    let root = own_root("standby");
    std::fs::create_dir_all(&root).unwrap();
    if let Some(w) = run_as() {
        let path = std::ffi::CString::new(root.as_os_str().as_bytes()).unwrap();
        unsafe { libc::chown(path.as_ptr(), w.uid, w.gid) };
    }
    let data = root.join("data");
    let bindir = primary.server.bindir.clone();
    let out = server_command(&bindir.join("pg_basebackup"), false)
        .args(["-h", "127.0.0.1", "-p", &primary.server.port.to_string()])
        .args(["-U", "postgres", "-R", "-X", "stream", "-c", "fast", "-D"])
        .arg(&data)
        .output()
        .expect("run pg_basebackup");
    assert!(
        out.status.success(),
        "pg_basebackup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The copied configuration names the primary's socket directory: use our own.
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "\nunix_socket_directories = '{}'\n",
        root.display()
    ));
    std::fs::write(&conf, text).unwrap();
    let mut server = Server {
        bindir,
        root,
        data,
        port: free_port(),
        child: None,
        env: Vec::new(),
    };
    server.start();
    let port = server.port;
    let sql = primary.db.superuser().await;
    wait_until("the standby streaming", Duration::from_secs(30), || async {
        scalar(
            &sql,
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
        )
        .await
            > 0
    })
    .await;
    OwnPg {
        server,
        db: TestDb {
            name: "qlsched".into(),
            port,
        },
    }
}

/// Stops the primary for good (immediate) and promotes the standby; a superuser session on
/// the promoted server once it is out of recovery.
async fn fail_over(primary: &mut OwnPg, standby: &OwnPg) -> tokio_postgres::Client {
    primary.server.stop("immediate");
    promote(&standby.server);
    let promoted = standby.db.superuser().await;
    wait_until("the standby promoted", Duration::from_secs(30), || async {
        !promoted
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
    promoted
}

fn promote(standby: &Server) {
    let out = server_command(&standby.bindir.join("pg_ctl"), false)
        .args(["promote", "-w", "-t", "60", "-D"])
        .arg(&standby.data)
        .output()
        .expect("run pg_ctl promote");
    assert!(
        out.status.success(),
        "pg_ctl promote failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Drill 4b, fail-over through the DSN: replicas whose DSN lists the primary and its
/// streaming standby (`host=…,… port=…,… target_session_attrs=read-write`) keep running
/// while the primary is stopped for good and the standby promoted. Without a config change
/// or a restart they reconnect to the promoted server (the standby was refused while it was
/// read-only) and go on admitting; 0 duplicates, 0 lost. Reports the time from the
/// promotion to the first admission on the promoted server.
#[tokio::test]
async fn replicas_whose_dsn_lists_both_servers_follow_the_promotion_without_a_restart() {
    let mut drill = Drill::begin("failover_dsn", (1, 0), (1, 0), |_, _| {
        format!(
            "primary + streaming standby in one DSN (target_session_attrs=read-write, \
             connect_timeout=2), 2 replicas started once, {TRIGGERS} every-second triggers"
        )
    })
    .await;
    let primary = OwnPg::start("primary", "fsync = off").await;
    primary.db.seed(TRIGGERS, EVERY_SECOND).await;
    let standby = make_standby(&primary).await;
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=qlsched_runtime dbname=qlsched \
         target_session_attrs=read-write connect_timeout=2",
        primary.server.port, standby.server.port
    );
    let mut fleet = Fleet::new(&dsn, "", &[]);
    fleet.start(&["a", "b"]).await;
    let old = primary.db.superuser().await;
    wait_until(
        "admissions on the primary",
        Duration::from_secs(30),
        || async { scalar(&old, "SELECT count(*) FROM qlsched.runs").await >= 2 * TRIGGERS as i64 },
    )
    .await;
    let pids: Vec<u32> = ["a", "b"].iter().map(|id| fleet.get(id).pid()).collect();
    drop(old);

    let mut primary = primary;
    let promoted = fail_over(&mut primary, &standby).await;
    let promoted_at = db_now(&promoted).await;
    let first_admission = crate::helpers::poll_until(
        "an admission on the promoted server",
        Duration::from_secs(60),
        || async {
            let q = promoted
                .query_one(
                    "SELECT min(queued_at_ms) FROM qlsched.runs WHERE queued_at_ms >= $1",
                    &[&promoted_at],
                )
                .await
                .unwrap()
                .get::<_, Option<i64>>(0);
            q
        },
    )
    .await;
    // Every trigger admitting again, on the promoted server, from the same processes.
    wait_until(
        "every trigger admitted on the promoted server",
        Duration::from_secs(30),
        || async {
            promoted
                .query_one(
                    "SELECT count(DISTINCT trigger_id) FROM qlsched.runs WHERE queued_at_ms >= $1",
                    &[&promoted_at],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                >= TRIGGERS as i64
        },
    )
    .await;
    for (id, pid) in ["a", "b"].iter().zip(&pids) {
        assert_eq!(fleet.get(id).pid(), *pid, "replica {id} was restarted");
        assert!(
            fleet
                .get(id)
                .get("/readyz")
                .is_some_and(|(code, _)| code == 200),
            "replica {id} is not ready on the promoted server"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.stop_all().await;
    drill.report.note(format!(
        "promotion → first admission on the promoted server: {} ms (no restart, no config change)",
        first_admission - promoted_at
    ));
    drill
        .report
        .finish(&promoted, &Expect::every_second(), &fleet)
        .await;
}
