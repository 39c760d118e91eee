//! Drill: republishing under load. Three replicas at default config admit 100 every-second
//! triggers while four operators republish random triggers through a link with 25 ms of
//! one-way delay (a remote `qlsched trigger publish`): each publish switches its trigger
//! between two expressions with the same instants (`* * * * * *` and `0-59 * * * * *`), so
//! every publish is a new revision whose keys differ from the last. A publish whose writes
//! land a round trip or two after its clock reading must neither admit an instant a second
//! time under the new revision nor skip one: 0 duplicates, 0 lost.

use std::time::{Duration, Instant};

use qlsched::store::manage::{self, TriggerSpec};

use super::check::Expect;
use super::{db_now, scalar, Drill, Stage, EVERY_SECOND};
use crate::helpers::delay::DelayProxy;
use crate::helpers::wait_until;

const TRIGGERS: usize = 100;
const OPERATORS: usize = 4;
const SAME_INSTANTS: &str = "0-59 * * * * *";

#[tokio::test]
async fn republishing_over_a_slow_link_admits_every_instant_once() {
    let mut drill = Drill::begin("republish", (0, 30), (0, 60), |p, seed| {
        format!(
            "3 replicas (default config), {TRIGGERS} every-second triggers, {OPERATORS} operators \
             republishing random triggers for {} s through 25 ms one-way delay, seed {seed}",
            p.duration.as_secs()
        )
    })
    .await;
    let mut stage = Stage::new(TRIGGERS, "").await;
    stage.start(&["a", "b", "c"]).await;

    let link = DelayProxy::start(stage.db.port, Duration::from_millis(50)).await;
    let until = Instant::now() + drill.p.duration;
    let mut operators = Vec::new();
    for op in 0..OPERATORS {
        let config: tokio_postgres::Config = format!(
            "host=127.0.0.1 port={} user=qlsched_admin dbname={} connect_timeout=10",
            link.port, stage.db.name
        )
        .parse()
        .unwrap();
        let mut rng = super::Rng::seeded(drill.rng.next() ^ op as u64);
        operators.push(tokio::spawn(async move {
            let mut admin = qlsched::db::connect(&config).await.unwrap();
            let (mut publishes, mut changed) = (0u64, 0u64);
            while Instant::now() < until {
                let id = format!("trg-{:05}", rng.below(TRIGGERS as u64));
                let expr = if rng.below(2) == 0 {
                    EVERY_SECOND
                } else {
                    SAME_INSTANTS
                };
                let spec = TriggerSpec::new(&id, "proj", "task", expr, "UTC");
                publishes += 1;
                if manage::publish_trigger(&mut admin, &spec)
                    .await
                    .unwrap()
                    .changed
                {
                    changed += 1;
                }
                tokio::time::sleep(rng.millis(0, 200)).await;
            }
            (publishes, changed)
        }));
    }
    let (mut publishes, mut changed) = (0, 0);
    for o in operators {
        let (p, c) = o.await.unwrap();
        publishes += p;
        changed += c;
    }
    // Every trigger admitted past the last publish: its last revision's first occurrences
    // are in before the replicas stop.
    let ended = db_now(&stage.sql).await;
    wait_until(
        "every trigger admitted past the last publish",
        Duration::from_secs(30),
        || async {
            scalar(
                &stage.sql,
                &format!(
                    "SELECT count(DISTINCT trigger_id) FROM qlsched.runs
                      WHERE scheduled_for_ms > {ended} + 1000"
                ),
            )
            .await
                == TRIGGERS as i64
        },
    )
    .await;
    stage.fleet.stop_all().await;
    drill.report.note(format!(
        "publishes: {publishes}, of which {changed} made a new revision"
    ));
    assert!(changed > 0, "no publish made a new revision");
    drill
        .report
        .finish(&stage.sql, &Expect::every_second(), &stage.fleet)
        .await;
}
