//! qlsched — a leaderless cluster cron scheduler on PostgreSQL.
//!
//! How it behaves and why — the lease state machine, claiming, waking, the lease deadline,
//! the replica-id guard, admission, the lifecycle — is written once, in `docs/design.md`;
//! source comments point there by section name ("docs/design.md, Waking").

pub mod actors;
pub mod apply;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod db;
pub mod engine;
pub mod health;
pub mod http;
pub mod identity;
pub mod metrics;
pub mod present;
pub mod retention;
pub mod schedule;
pub mod schema;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod worker;
