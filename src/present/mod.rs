//! Text shared by the command line and the web console: times in UTC and a trigger's zone,
//! durations, aligned tables ([`text`]); `qlsched status` ([`status`]) and `qlsched db
//! status` ([`report`]) as text; the trigger and run views as `--json`, the CLI and the
//! console show them ([`triggers`]). Below here (`store`, `schema`, `db`, `engine`,
//! `actors`) values are typed; words and layout are chosen here.

pub mod audit;
pub mod report;
pub mod status;
pub mod text;
pub mod triggers;

pub use text::{local, rfc3339, span, table, two_units, utc};
