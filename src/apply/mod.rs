//! Schedules as code (issue 36): definition files of projects, tasks and triggers
//! ([`file`]), checked in full before anything is written. The plan against the database,
//! `qlsched apply` and `qlsched export` build on it (docs/apply.md).

pub mod export;
pub mod file;
pub mod options;
pub mod plan;
pub mod write;
