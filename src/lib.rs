//! qlsched — a leaderless cluster cron scheduler on PostgreSQL.
//!
//! # The lease state machine of a `trigger_schedules` row
//!
//! ```text
//!   publish (admin)         claim_due (any replica)          admit / advance (the holder)
//!  ───────────────▶ FREE ───────────────────────────▶ CLAIMED ─────────────────────────▶ FREE
//!   new revision:    ▲   due: claimable_at_ms <= now   owner, token, version+1,       cursor moved,
//!   cursor NULL,     │   (database clock)              expiry = now + lease           claim cleared
//!   claim cleared    │                                   │
//!                    └─── release (holder: reject back-off, graceful stop) ◀─┘
//!                    └─── expiry: any replica may claim again once now >= expiry
//! ```
//!
//! The **fence** is the four-part claim (owner, token, version, expiry) plus the row's
//! `state_version`: every write by a holder carries all of it in its WHERE, and the expiry is
//! judged by the database clock inside that same statement. Any change to the row (a
//! takeover, a republish, a release) bumps `state_version`, so a stale holder's write matches
//! no row and is rolled back. Node clocks decide nothing.

pub mod actors;
pub mod cli;
pub mod clock;
pub mod config;
pub mod http;
pub mod metrics;
pub mod schedule;
pub mod startup;
pub mod store;
pub mod telemetry;
