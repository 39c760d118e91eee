//! `trigger backfill`: every occurrence of a past window that has no run yet.

use clap::Args;
use serde_json::json;

use super::{actor, parse_time};
use crate::cli::connect::{self, Target};
use crate::cli::error::CliError;
use crate::present as render;
use crate::schedule::Schedule;
use crate::store::triggers;
use crate::store::{manage, retention};

/// `--max` may not exceed this: one backfill admits at most 100,000 occurrences.
pub const BACKFILL_HARD_CAP: usize = 100_000;
/// Default `--max`.
pub const BACKFILL_DEFAULT_MAX: usize = 1_000;
pub use crate::store::retention::BACKFILL_HORIZON_MARGIN as HORIZON_MARGIN;
/// Default occurrences per committed chunk.
pub const BACKFILL_DEFAULT_CHUNK: usize = 500;

pub use crate::schedule::occurrences_in;

/// What `trigger backfill` takes.
#[derive(Args, Debug)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub target: Target,
    pub id: String,
    /// Window start, inclusive (RFC 3339).
    #[arg(long)]
    pub from: String,
    /// Window end, exclusive (RFC 3339, not in the future).
    #[arg(long)]
    pub to: String,
    /// Refuse a window with more occurrences than this (at most 100000).
    #[arg(long, default_value_t = BACKFILL_DEFAULT_MAX)]
    pub max: usize,
    /// Occurrences per committed transaction.
    #[arg(long, default_value_t = BACKFILL_DEFAULT_CHUNK)]
    pub chunk: usize,
    #[arg(long)]
    pub actor: Option<String>,
    /// The overlap policy of these occurrences (default allow: every one asked for is
    /// admitted whatever the trigger's policy; docs/policies-overlap.md).
    #[arg(long, default_value = "allow", value_parser = crate::store::overlap::OverlapPolicy::NAMES)]
    pub overlap: String,
    #[arg(long)]
    pub json: bool,
}

/// `trigger backfill`: every check happens before the first write; then chunks commit in
/// order, each on its own, so an interrupted run leaves a prefix and a re-run completes it.
pub async fn backfill(a: BackfillArgs) -> Result<(), CliError> {
    let (from, to) = checked_args(&a)?;
    let mut client = connect::connect_target(&a.target).await?;
    check_window(&client, &a, from, to).await?;
    // Expression, zone and revision from one row version; each chunk re-checks the revision
    // under the trigger's lock (store::triggers::backfill_definition).
    let def = triggers::backfill_definition(&mut client, &a.id).await?;
    let revision = def.revision;
    let schedule = Schedule::parse(&def.cron_expr, &def.timezone)?;
    let occurrences =
        occurrences_in(&schedule, from, to, a.max).ok_or(CliError::WindowOverCap { max: a.max })?;
    let by = format!("backfill:{}", actor(&client, a.actor.as_deref()).await?);
    let mut total = triggers::BackfillCount::default();
    for chunk in occurrences.chunks(a.chunk) {
        let overlap = a.overlap.parse().expect("clap checked the spelling");
        let c = triggers::backfill_chunk_with(&mut client, &a.id, revision, chunk, &by, overlap)
            .await?;
        total.admitted += c.admitted;
        total.already_existed += c.already_existed;
    }
    print_backfill(&a, revision, from, to, occurrences.len(), &total)
}

/// The window (`--from` before `--to`) and the bounds of `--max` and `--chunk`, before
/// connecting.
fn checked_args(a: &BackfillArgs) -> Result<(i64, i64), CliError> {
    let from = parse_time("--from", &a.from)?;
    let to = parse_time("--to", &a.to)?;
    if from >= to {
        return Err(CliError::WindowOrder {
            from: a.from.clone(),
            to: a.to.clone(),
        });
    }
    if !(1..=BACKFILL_HARD_CAP).contains(&a.max) {
        return Err(CliError::MaxOutOfRange {
            max: a.max,
            hard_cap: BACKFILL_HARD_CAP,
        });
    }
    if !(1..=10_000).contains(&a.chunk) {
        return Err(CliError::ChunkOutOfRange { chunk: a.chunk });
    }
    Ok((from, to))
}

/// The window is in the past by the database clock and after the retention horizon (a
/// window the pruner may already have reached could re-admit pruned occurrences: the horizon
/// is the one the pruning replicas recorded, qlsched.maintenance).
async fn check_window(
    client: &tokio_postgres::Client,
    a: &BackfillArgs,
    from: i64,
    to: i64,
) -> Result<(), CliError> {
    let now = manage::db_now(client).await?;
    if to > now {
        return Err(CliError::WindowInFuture {
            to: a.to.clone(),
            now: render::utc(Some(now)),
        });
    }
    if let Some((floor, finished_after)) =
        retention::backfill_floor_ms(client, HORIZON_MARGIN).await?
    {
        if from < floor {
            let why = match finished_after {
                Some(ms) if ms > 0 => format!(
                    "retention.finished_after {} before the database clock, plus {} s margin, or the latest horizon pruned",
                    render_span(ms),
                    HORIZON_MARGIN.as_secs()
                ),
                _ => "the latest horizon pruned".to_owned(),
            };
            return Err(CliError::WindowPastHorizon {
                from: a.from.clone(),
                horizon: render::utc(Some(floor)),
                why,
            });
        }
    }
    Ok(())
}

/// What the backfill did, as JSON or one line.
fn print_backfill(
    a: &BackfillArgs,
    revision: i64,
    from: i64,
    to: i64,
    occurrences: usize,
    total: &triggers::BackfillCount,
) -> Result<(), CliError> {
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "trigger_id": a.id, "revision": revision, "from_ms": from, "to_ms": to,
                "occurrences": occurrences, "admitted": total.admitted,
                "already_existed": total.already_existed,
            }))?
        );
    } else {
        println!(
            "trigger {} backfill [{}, {}): {} occurrences, {} admitted, {} already existed",
            a.id,
            render::utc(Some(from)),
            render::utc(Some(to)),
            occurrences,
            total.admitted,
            total.already_existed
        );
    }
    Ok(())
}

/// `30d`, `36h`, `90s`: the largest whole unit.
fn render_span(ms: i64) -> String {
    match ms {
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurrences_cover_a_half_open_window_and_stop_past_the_cap() {
        let s = Schedule::parse("*/15 * * * *", "UTC").unwrap();
        let from = parse_time("--from", "2026-01-01T00:00:00Z").unwrap();
        let to = parse_time("--to", "2026-01-01T01:00:00Z").unwrap();
        let got = occurrences_in(&s, from, to, 10).unwrap();
        assert_eq!(got.len(), 4, "00:00 included, 01:00 excluded");
        assert_eq!(got[0], from);
        assert!(occurrences_in(&s, from, to, 3).is_none());
        assert_eq!(occurrences_in(&s, from, to, 4).unwrap().len(), 4);
    }

    #[test]
    fn backfill_follows_the_gap_rule_in_the_trigger_zone() {
        // Europe/Berlin 2026-03-29: 02:30 does not exist; it fires once at 03:00 CEST.
        let s = Schedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
        let from = parse_time("--from", "2026-03-28T00:00:00Z").unwrap();
        let to = parse_time("--to", "2026-03-30T00:00:00Z").unwrap();
        let got = occurrences_in(&s, from, to, 10).unwrap();
        assert_eq!(
            got,
            vec![
                parse_time("x", "2026-03-28T01:30:00Z").unwrap(),
                parse_time("x", "2026-03-29T01:00:00Z").unwrap()
            ]
        );
    }
}
