//! The integration tests: one binary, one throwaway PostgreSQL.

use qlsched_testkit as helpers;

mod apply;
mod audit;
mod config_validation;
mod connect;
mod console;
mod console_browser;
mod contrib;
mod coordinator;
mod counting;
mod cursor_floor;
mod daemon;
mod dispatch_protocol;
mod dispatcher;
mod docs_drift;
mod drills;
mod edges;
mod edits;
mod engine;
mod guard;
mod integrity;
#[cfg(feature = "fault-injection")]
mod interrupted_migrate;
mod invariants;
mod layers;
mod lifecycle;
mod live_migrate;
mod locks;
mod manage_projects;
mod manage_triggers;
mod manage_wake;
mod migrations;
mod on_time;
mod operate;
mod pgbouncer;
mod plans;
mod retention;
mod roles;
mod runs_cancel;
mod runs_prune;
mod status;
mod store_admit;
mod store_claim;
mod tls;
mod transport;
mod worker;
