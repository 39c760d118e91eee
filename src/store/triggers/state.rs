//! `trigger disable | enable | delete`: one transaction each, the trigger row `FOR UPDATE`.

use super::{lock_trigger, Changed};
use crate::db_now_ms;
use crate::schedule::Schedule;
use crate::store::audit::{self, ObjectKind};
use crate::store::manage::{lock_cursor_floor, lock_project_status, ManageError, ProjectStatus};

/// Takes the schedule row out of the claim index and fences out any live claim
/// (`fence_out_claim!`): the holder's admission commits nothing. An admission already past
/// its UPDATE holds the row lock; we wait for it, so its run is committed before this
/// command returns, never after.
const FENCE_OUT: &str = concat!(
    "UPDATE qlsched.trigger_schedules s
        SET claimable_at_ms = NULL, ",
    fence_out_claim!(),
    " WHERE s.trigger_id = $1"
);

/// `trigger disable`: takes effect at once (see [`FENCE_OUT`]); keeps the note, who and
/// when. The operator's switch is recorded even when the publisher has the trigger disabled
/// already, so a later publish with `enabled` does not start it (docs/design.md, "Who turns
/// a trigger on and off"). Disabling an operator-disabled trigger changes nothing.
pub async fn disable(
    client: &mut tokio_postgres::Client,
    id: &str,
    note: Option<&str>,
    by: &str,
) -> Result<Changed, ManageError> {
    let tx = client.transaction().await?;
    let t = lock_trigger(&tx, id, "UPDATE").await?;
    if t.deleted {
        return Err(ManageError::Deleted { id: id.into() });
    }
    if t.operator_disabled {
        tx.commit().await?;
        return Ok(Changed::AlreadyThatWay);
    }
    let before = audit::snapshot(&tx, ObjectKind::Trigger, id).await?;
    tx.execute(
        concat!(
            "UPDATE qlsched.triggers
                SET enabled = false, operator_disabled = true, disabled_note = $2, disabled_by = $3,
                    disabled_at_ms = ",
            db_now_ms!(),
            " WHERE trigger_id = $1"
        ),
        &[&id, &note, &by],
    )
    .await?;
    tx.execute(FENCE_OUT, &[&id]).await?;
    audit::append_change(
        &tx,
        ObjectKind::Trigger,
        id,
        "disable",
        before.as_ref(),
        note,
    )
    .await?;
    tx.commit().await?;
    Ok(Changed::Yes)
}

/// `trigger enable`: withdraws an operator's disable. The cursor moves to the first
/// occurrence after this transaction's clock reading (and after every instant already
/// admitted, see [`lock_cursor_floor`]), so the disabled span is never
/// replayed (whatever the misfire policy) and an occurrence due just after the enable is
/// admitted. Keeps who and when (the last disable's note stays on record). Enabling a
/// running trigger changes nothing; a trigger its publisher disabled is refused (only a
/// publish turns it on; docs/design.md, "Who turns a trigger on and off").
///
/// Locking: trigger row `FOR UPDATE`, then the project row `FOR SHARE` while its status
/// decides whether the row is claimable, then the schedule row `FOR UPDATE` before the clock
/// is read (as in publish).
pub async fn enable(
    client: &mut tokio_postgres::Client,
    id: &str,
    by: &str,
) -> Result<Changed, ManageError> {
    let tx = client.transaction().await?;
    let t = lock_trigger(&tx, id, "UPDATE").await?;
    if t.deleted {
        return Err(ManageError::Deleted { id: id.into() });
    }
    if !t.published_enabled {
        return Err(ManageError::PublishedDisabled { id: id.into() });
    }
    if t.enabled && !t.operator_disabled {
        tx.commit().await?;
        return Ok(Changed::AlreadyThatWay);
    }
    let before = audit::snapshot(&tx, ObjectKind::Trigger, id).await?;
    let active = lock_project_status(&tx, &t.project).await? == ProjectStatus::Active;
    let floor = lock_cursor_floor(&tx, id).await?;
    // A stored definition that no longer parses (or never fires again) gets no cursor: the
    // claim then rejects it with back-off and a diagnostic, as any corrupt definition.
    let now = crate::store::manage::db_now(&tx).await?;
    let first = Schedule::parse(&t.cron_expr, &t.timezone)
        .ok()
        .and_then(|s| floor.first(&s, now, t.start_at_ms));
    tx.execute(
        concat!(
            "UPDATE qlsched.triggers
                SET enabled = true, operator_disabled = false, enabled_by = $2, enabled_at_ms = ",
            db_now_ms!(),
            " WHERE trigger_id = $1"
        ),
        &[&id, &by],
    )
    .await?;
    let claimable_at: Option<i64> = tx
        .query_opt(
            concat!(
                "UPDATE qlsched.trigger_schedules s
                SET next_fire_at_ms = $3::bigint,
                    -- at the first cursor's jittered instant (none past the window's end)
                    claimable_at_ms = CASE WHEN $2 THEN ",
                claimable_at_sql!("s.trigger_id", "$3::bigint"),
                " END,
                    ",
                fence_out_claim!(),
                " FROM qlsched.triggers t WHERE s.trigger_id = $1 AND t.trigger_id = s.trigger_id
             RETURNING s.claimable_at_ms"
            ),
            &[&id, &active, &first],
        )
        .await?
        .and_then(|r| r.get(0));
    if let Some(at) = claimable_at {
        // Wake the replicas for the first occurrence (delivered at commit).
        crate::store::wake::notify(&tx, Some(at)).await?;
    }
    audit::append_change(
        &tx,
        ObjectKind::Trigger,
        id,
        "enable",
        before.as_ref(),
        None,
    )
    .await?;
    tx.commit().await?;
    Ok(Changed::Yes)
}

/// `trigger delete`: the trigger stops for good (disabled, fenced out like a disable) and
/// leaves every listing; the row stays so its runs keep their reference and stay readable.
/// Deleting a deleted trigger changes nothing.
pub async fn delete(
    client: &mut tokio_postgres::Client,
    id: &str,
    by: &str,
) -> Result<Changed, ManageError> {
    let tx = client.transaction().await?;
    let changed = delete_in(&tx, id, by).await?;
    tx.commit().await?;
    Ok(changed)
}

/// [`delete`] in the caller's transaction (`qlsched apply --prune`); the caller commits.
pub async fn delete_in(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    by: &str,
) -> Result<Changed, ManageError> {
    if lock_trigger(tx, id, "UPDATE").await?.deleted {
        return Ok(Changed::AlreadyThatWay);
    }
    let before = audit::snapshot(tx, ObjectKind::Trigger, id).await?;
    tx.execute(
        concat!(
            "UPDATE qlsched.triggers
                SET enabled = false, deleted_by = $2, deleted_at_ms = ",
            db_now_ms!(),
            " WHERE trigger_id = $1"
        ),
        &[&id, &by],
    )
    .await?;
    tx.execute(FENCE_OUT, &[&id]).await?;
    audit::append_change(tx, ObjectKind::Trigger, id, "delete", before.as_ref(), None).await?;
    Ok(Changed::Yes)
}
