//! Running the real `qlsched` binary as an operator would, against a test database.

use std::process::{Command, Output};

use super::replica::binary;
use super::TestDb;

/// `qlsched <args>` with `QLSCHED_DSN` pointing at the admin role; no ambient password.
pub fn ql(db: &TestDb, args: &[&str]) -> Output {
    command(db, args).output().expect("run qlsched")
}

/// The command [`ql`] runs, to spawn it instead (e.g. to let it block on a lock).
pub fn command(db: &TestDb, args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env("QLSCHED_DSN", db.dsn("qlsched_admin"))
        .env("USER", "tester")
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", "/nonexistent/pgpass");
    cmd
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
pub fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Asserts the exit code and that stderr names each of `needles`; returns stderr.
pub fn refused(o: Output, code: i32, needles: &[&str]) -> String {
    let err = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "stderr: {err}\nstdout: {}",
        stdout(&o)
    );
    for needle in needles {
        assert!(err.contains(needle), "stderr lacks `{needle}`: {err}");
    }
    err
}

/// The arguments of `trigger backfill TRIGGER --from FROM --to TO`, then `extra`.
pub fn backfill_args<'a>(
    trigger: &'a str,
    from: &'a str,
    to: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["trigger", "backfill", trigger, "--from", from, "--to", to];
    args.extend_from_slice(extra);
    args
}

/// `trigger backfill TRIGGER` over `[from_ms, to_ms)` (Unix ms), then `extra`.
pub fn backfill(db: &TestDb, trigger: &str, from_ms: i64, to_ms: i64, extra: &[&str]) -> Output {
    let (from, to) = (crate::iso(from_ms), crate::iso(to_ms));
    ql(db, &backfill_args(trigger, &from, &to, extra))
}

/// A command's `--json` output, parsed (panics showing it when it is not JSON).
pub fn json(out: String) -> serde_json::Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}
