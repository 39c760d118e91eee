//! "A claimed row": due rows leased through `claim::claim_due` exactly as a replica's claim
//! round leases them, with the pool they were claimed through and the admission a replica
//! would build for each.

use qlsched::db;
use qlsched::db::{Conn, Pool};
use qlsched::store::admission::{self, Admission, AdmitOutcome, Occurrence};
use qlsched::store::claim::ClaimedRow;

use super::TestDb;

pub struct Claimed {
    /// The runtime-role pool the rows were claimed through (two connections).
    pub pool: Pool,
    pub rows: Vec<ClaimedRow>,
}

impl Claimed {
    /// Claims exactly one due row of `db` for `owner` with a lease of `lease_ms`.
    pub async fn new(db: &TestDb, owner: &str, lease_ms: i64) -> Claimed {
        let c = Claimed::up_to(db, owner, lease_ms, 1).await;
        assert_eq!(c.rows.len(), 1, "expected one due row");
        c
    }

    /// Claims up to `limit` due rows of `db` for `owner` with a lease of `lease_ms`.
    pub async fn up_to(db: &TestDb, owner: &str, lease_ms: i64, limit: i64) -> Claimed {
        let pool = db.runtime_pool(2);
        let rows = claim_due(&pool, owner, lease_ms, limit).await;
        Claimed { pool, rows }
    }

    /// One more due row claimed through the same pool (exactly one).
    pub async fn another(&self, owner: &str, lease_ms: i64) -> ClaimedRow {
        let mut rows = self.claim_more(owner, lease_ms, 1).await;
        assert_eq!(rows.len(), 1, "expected one more due row");
        rows.remove(0)
    }

    /// Up to `limit` more due rows claimed through the same pool (maybe none).
    pub async fn claim_more(&self, owner: &str, lease_ms: i64, limit: i64) -> Vec<ClaimedRow> {
        claim_due(&self.pool, owner, lease_ms, limit).await
    }

    /// The claimed row (of a single claim).
    pub fn row(&self) -> &ClaimedRow {
        &self.rows[0]
    }

    /// The admission of the claimed row's due occurrence.
    pub fn admission(&self) -> Admission<'_> {
        admission(self.row())
    }

    /// The admissions of every claimed row, in claim order.
    pub fn admissions(&self) -> Vec<Admission<'_>> {
        self.rows.iter().map(admission).collect()
    }

    pub async fn conn(&self) -> Conn<'_> {
        db::conn(&self.pool).await.unwrap()
    }

    /// Admits `a` alone, on a connection of the claim's pool.
    pub async fn admit(&self, a: &Admission<'_>) -> AdmitOutcome {
        let conn = self.conn().await;
        crate::drive::admit_once(&conn, a).await.unwrap()
    }
}

async fn claim_due(pool: &Pool, owner: &str, lease_ms: i64, limit: i64) -> Vec<ClaimedRow> {
    let conn = db::conn(pool).await.unwrap();
    crate::drive::claim_due(&conn, owner, lease_ms, limit, uuid::Uuid::new_v4())
        .await
        .unwrap()
}

/// The admission a replica builds for a claimed row: its due occurrence, the cursor moved
/// one second on, admitted by the claim's owner.
pub fn admission(c: &ClaimedRow) -> Admission<'_> {
    let sf = c.next_fire_at_ms.expect("initialised row");
    Admission::new(
        c,
        Occurrence {
            scheduled_for_ms: sf,
            next_fire_at_ms: sf + 1000,
            run_id: admission::mint_run_id(&c.fence.owner),
            attempt_id: uuid::Uuid::new_v4(),
        },
    )
}
