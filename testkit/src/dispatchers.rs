//! The stage on which a reference dispatcher (`examples/dispatcher.rs`, `examples/dispatcher.py`)
//! runs what a replica admits: two every-second triggers, one replica, and a command whose
//! outcome depends on the trigger.

use std::time::Duration;

use crate::replica::ReplicaProc;
use crate::{wait_until, TestDb};

pub struct Stage {
    pub replica: ReplicaProc,
    /// Where each run's command writes its idempotency key, in a file named for its run id.
    pub out: tempfile::TempDir,
    /// The command each run executes: trg-00000's succeed, trg-00001's fail (exit 3).
    pub command: String,
}

impl Stage {
    /// Triggers trg-00000 and trg-00001 (every second) and replica `r1` admitting them.
    pub async fn new(db: &TestDb) -> Stage {
        db.seed(2, "* * * * * *").await;
        let mut replica = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "r1", "", &[]);
        replica.wait_ready(Duration::from_secs(30)).await;
        let out = tempfile::tempdir().unwrap();
        let command = format!(
            "echo \"$QLSCHED_IDEMPOTENCY_KEY\" > {}/\"$QLSCHED_RUN_ID\"; test \"$QLSCHED_TRIGGER_ID\" = trg-00000 || exit 3",
            out.path().display()
        );
        Stage {
            replica,
            out,
            command,
        }
    }

    /// Waits until each trigger has 3 finished runs, stops the replica, waits until whatever
    /// it admitted before it stopped is finished too, then stops the dispatcher `child` with
    /// SIGTERM and requires a clean exit.
    pub async fn finish(&mut self, db: &TestDb, child: &mut tokio::process::Child) {
        wait_until(
            "3 finished runs of each trigger",
            Duration::from_secs(30),
            || async {
                db.count(
                    "SELECT least(count(*) FILTER (WHERE trigger_id = 'trg-00000' AND status = 'succeeded'),
                                  count(*) FILTER (WHERE trigger_id = 'trg-00001' AND status = 'failed'))
                       FROM qlsched.runs",
                )
                .await
                    >= 3
            },
        )
        .await;
        self.replica.terminate(Duration::from_secs(20)).await;
        wait_until("no unfinished run", Duration::from_secs(20), || async {
            db.count(
                "SELECT count(*) FROM qlsched.runs WHERE status NOT IN ('succeeded', 'failed')",
            )
            .await
                == 0
        })
        .await;
        unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
        let st = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("the dispatcher stops on SIGTERM")
            .unwrap();
        assert!(st.success(), "{st}");
    }
}
