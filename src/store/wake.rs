//! Change notifications on one channel: publishing or enabling a trigger wakes the replicas
//! at once instead of after their idle interval. The payload is the earliest instant the
//! change makes something claimable (Unix ms, database clock); empty means "now". Any role
//! that can connect may notify the channel: a notification whose payload is not that, or
//! whose sender's role may not change schedules, is ignored ([`Heard::Ignored`]).
//!
//! Notifications are an optimisation only. A lost one, a listener that reconnects, or a
//! connection pooler that does not carry `LISTEN` (PgBouncer in transaction mode) only means
//! the change is picked up at the next cadence round.

use futures::StreamExt;
use tokio::sync::mpsc;

use crate::db::session::Connector;
use crate::db::StoreError;

/// The channel every replica listens on.
pub const CHANNEL: &str = "qlsched_wake";

/// Sends a wake-up in the caller's transaction (delivered at its commit, never before).
pub async fn notify(
    client: &impl tokio_postgres::GenericClient,
    at_ms: Option<i64>,
) -> Result<(), StoreError> {
    client
        .execute(
            "SELECT pg_notify('qlsched_wake', coalesce($1::bigint::text, ''))",
            &[&at_ms],
        )
        .await?;
    Ok(())
}

/// What the listener heard on [`CHANNEL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// A wake-up: something may be claimable at this instant (Unix ms, database clock;
    /// `None` = now).
    Wake(Option<i64>),
    /// A notification that is not a qlsched wake-up, ignored: `why` says what gave it away.
    Ignored { sender_pid: i32, why: &'static str },
}

/// A wake-up's payload: empty (now) or an instant in Unix ms, in decimal digits, as
/// [`notify`] sends it. Anything else (`Some(None)` is "now") is not one: `None`.
pub fn parse_payload(payload: &str) -> Option<Option<i64>> {
    if payload.is_empty() {
        return Some(None);
    }
    if !payload.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    payload.parse::<i64>().ok().map(Some) // too many digits: out of range, None
}

/// Of the sessions `$1` (notification senders' backend pids), those whose role may not
/// change a schedule (no UPDATE on `trigger_schedules`, as the owner, admin and runtime
/// roles and superusers have): worker_ingress, the dispatcher, any role outside qlsched.
/// Their notifications on the channel cannot be qlsched's. A sender already gone from
/// `pg_stat_activity` cannot be told (its role is not recorded anywhere) and is believed:
/// a wake-up only starts a claim round early.
///
/// Locking: reads `pg_stat_activity` (pid and role are visible to every role) and the
/// catalog; takes no lock.
const FOREIGN_SENDERS_SQL: &str = "SELECT a.pid FROM pg_stat_activity a
     WHERE a.pid = ANY ($1::int4[]) AND a.usesysid IS NOT NULL
       AND NOT has_table_privilege(a.usesysid, 'qlsched.trigger_schedules', 'UPDATE')";

/// At most this many notifications are judged with one lookup of their senders.
const BATCH: usize = 256;

/// Opens a dedicated connection that listens on [`CHANNEL`]. Each notification arrives on the
/// receiver as [`Heard`]: a wake-up, or ignored when its payload is not an instant or its
/// sender's role may not change schedules (any role that can connect may `NOTIFY`). The
/// receiver ends when the connection does; dropping it closes the connection.
pub async fn listen(connector: &Connector) -> Result<mpsc::UnboundedReceiver<Heard>, StoreError> {
    let (client, mut connection) = crate::db::session::bounded(
        "connecting the listener",
        connector.connect_timeout,
        async { Ok(connector.pg.connect_raw().await?) },
    )
    .await?;
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<(i32, String)>();
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    tokio::spawn(async move {
        while let Some(Ok(msg)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = msg {
                if raw_tx
                    .send((n.process_id(), n.payload().to_owned()))
                    .is_err()
                {
                    break;
                }
            }
        }
    });
    client.batch_execute(LISTEN).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let first = tokio::select! {
                n = raw_rx.recv() => match n { Some(n) => n, None => break },
                _ = tx.closed() => break,
            };
            let mut batch = vec![first];
            while batch.len() < BATCH {
                match raw_rx.try_recv() {
                    Ok(n) => batch.push(n),
                    Err(_) => break,
                }
            }
            let Ok(foreign) = foreign_senders(&client, &batch).await else {
                break; // the connection broke: the caller reconnects
            };
            for (pid, payload) in batch {
                let heard = match parse_payload(&payload) {
                    None => Heard::Ignored {
                        sender_pid: pid,
                        why: "its payload is not an instant",
                    },
                    Some(_) if foreign.contains(&pid) => Heard::Ignored {
                        sender_pid: pid,
                        why: "its sender's role may not change schedules",
                    },
                    Some(at) => Heard::Wake(at),
                };
                if tx.send(heard).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// The listener's one statement, by which its session is found in `pg_stat_activity`.
const LISTEN: &str = "LISTEN qlsched_wake";

/// The senders of `batch` whose notifications are not qlsched's ([`FOREIGN_SENDERS_SQL`]),
/// asked only about notifications with a well-formed payload. The lookup runs on the
/// listener's own connection, which then repeats its `LISTEN` (a no-op) so that its last
/// statement stays the one it is known by.
async fn foreign_senders(
    client: &tokio_postgres::Client,
    batch: &[(i32, String)],
) -> Result<Vec<i32>, tokio_postgres::Error> {
    let mut pids: Vec<i32> = batch
        .iter()
        .filter(|(_, payload)| parse_payload(payload).is_some())
        .map(|(pid, _)| *pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    if pids.is_empty() {
        return Ok(pids);
    }
    let rows = client.query(FOREIGN_SENDERS_SQL, &[&pids]).await?;
    client.batch_execute(LISTEN).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

#[cfg(test)]
mod tests {
    use super::parse_payload;

    #[test]
    fn a_payload_is_empty_or_an_instant_in_decimal_digits() {
        assert_eq!(parse_payload(""), Some(None));
        assert_eq!(
            parse_payload("1767225600000"),
            Some(Some(1_767_225_600_000))
        );
        for bad in [
            "soon",
            "+1767225600000",
            "-5",
            " 1767225600000",
            "1767225600000 ",
            "1e12",
            "99999999999999999999",
            "0x10",
        ] {
            assert_eq!(parse_payload(bad), None, "{bad:?}");
        }
    }
}
