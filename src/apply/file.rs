//! The definition files of `qlsched apply` (issue 36 item 1): TOML, one file or a directory
//! of `*.toml` files, each naming its `source` (who owns its objects), then `[[project]]`,
//! `[[task]]` and `[[trigger]]` tables. Everything is checked before anything is written:
//! every problem is reported at once, each naming the file, the line and the key.
//!
//! ```toml
//! source = "team-payments/infra"
//!
//! [[project]]
//! id = "payments"                 # status = "active" (default) | "suspended" | "archived"
//!
//! [[task]]
//! id = "report"
//! project = "payments"
//! spec = { executor = "shell", command = ["sh", "-c", "echo report"] }
//!
//! [[trigger]]
//! id = "nightly"
//! project = "payments"
//! task = "report"
//! cron = "30 2 * * *"
//! tz = "Europe/Berlin"            # default "UTC"
//! misfire = "fire_once"           # default "skip"
//! grace_ms = 60000                # default 60000, 0..=86400000
//! disabled = false                # default false: the publisher's switch
//! jitter = "30s"                  # default none ("0s"); shorter than the shortest gap
//! start_at = "2026-03-01T00:00:00Z"   # default none (RFC 3339)
//! end_at = "2026-12-31T00:00:00Z"     # default none; after start_at
//! pause_after_failures = 3        # default none, 1..=1000
//! expect_success_within = "26h"   # default none, 1m..=366d
//! overlap = "forbid"              # default "allow" | "forbid" | "buffer_one" | "replace"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::options;
use crate::schedule::{min_gap, MisfirePolicy, Schedule, DEFAULT_MISFIRE_GRACE_MS};
use crate::store::manage::{
    OutcomePolicy, ProjectStatus, TriggerSpec, EXPECT_SUCCESS_WITHIN_MS, MAX_JITTER_MS,
    PAUSE_AFTER_FAILURES,
};
use crate::store::overlap::OverlapPolicy;

/// Where a value was written: file and line (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub file: PathBuf,
    pub line: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// One problem of the input: where, which key, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub place: Place,
    pub key: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.place, self.key, self.message)
    }
}

/// A project as the files define it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectDef {
    pub id: String,
    pub status: ProjectStatus,
    pub source: String,
    pub place: Place,
}

/// A task as the files define it; `spec` in the canonical JSON text (keys sorted, compact).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskDef {
    pub id: String,
    pub project: String,
    pub spec: String,
    pub source: String,
    pub place: Place,
}

/// A trigger as the files define it: what `trigger publish` takes.
#[derive(Clone, Debug)]
pub struct TriggerDef {
    pub spec: TriggerSpec,
    pub source: String,
    pub place: Place,
}

/// Every definition of the input, by id.
#[derive(Clone, Debug, Default)]
pub struct Definitions {
    pub projects: BTreeMap<String, ProjectDef>,
    pub tasks: BTreeMap<String, TaskDef>,
    pub triggers: BTreeMap<String, TriggerDef>,
    /// The source labels the files name.
    pub sources: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    source: Option<Spanned<String>>,
    #[serde(default)]
    project: Vec<Spanned<RawProject>>,
    #[serde(default)]
    task: Vec<Spanned<RawTask>>,
    #[serde(default)]
    trigger: Vec<Spanned<RawTrigger>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProject {
    id: Spanned<String>,
    status: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    id: Spanned<String>,
    project: Spanned<String>,
    spec: Spanned<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrigger {
    id: Spanned<String>,
    project: Spanned<String>,
    task: Spanned<String>,
    cron: Spanned<String>,
    tz: Option<Spanned<String>>,
    misfire: Option<Spanned<String>>,
    grace_ms: Option<Spanned<i64>>,
    disabled: Option<Spanned<bool>>,
    jitter: Option<Spanned<String>>,
    start_at: Option<Spanned<String>>,
    end_at: Option<Spanned<String>>,
    pause_after_failures: Option<Spanned<i64>>,
    expect_success_within: Option<Spanned<String>>,
    overlap: Option<Spanned<String>>,
}

/// Ids of projects, tasks (`[A-Za-z0-9][A-Za-z0-9._:-]{0,127}`) and triggers
/// (`[A-Za-z0-9][A-Za-z0-9._-]{0,127}`), as V1's checks.
fn valid_id(id: &str, colon: bool) -> bool {
    let mut chars = id.chars();
    (1..=128).contains(&id.len())
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') || (colon && c == ':')
        })
}

/// One file's checker: turns spans into places and collects problems.
struct Checker<'a> {
    file: &'a Path,
    text: &'a str,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn place(&self, span: Range<usize>) -> Place {
        let at = span.start.min(self.text.len());
        Place {
            file: self.file.to_path_buf(),
            line: self.text[..at].matches('\n').count() + 1,
        }
    }
    fn problem(&mut self, span: Range<usize>, key: &str, message: impl Into<String>) {
        let place = self.place(span);
        self.problems.push(Problem {
            place,
            key: key.into(),
            message: message.into(),
        });
    }
    fn id(&mut self, v: &Spanned<String>, key: &str, colon: bool) -> Option<String> {
        if valid_id(v.get_ref(), colon) {
            return Some(v.get_ref().clone());
        }
        let alphabet = if colon { "._:-" } else { "._-" };
        self.problem(
            v.span(),
            key,
            format!(
                "`{}`: must be 1 to 128 characters, letters, digits and {alphabet}, starting with a letter or digit",
                v.get_ref()
            ),
        );
        None
    }
}

/// Parses and checks one file's text (`file` names it in problems). Returns its definitions
/// (those that passed) and every problem found.
pub fn parse_file(file: &Path, text: &str) -> (Definitions, Vec<Problem>) {
    let mut c = Checker {
        file,
        text,
        problems: Vec::new(),
    };
    let mut out = Definitions::default();
    let raw: RawFile = match toml::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            let message = e.message().to_string();
            c.problem(span, "(file)", message);
            return (out, c.problems);
        }
    };
    let source = match &raw.source {
        Some(s) if !s.get_ref().trim().is_empty() && s.get_ref().chars().count() <= 200 => {
            s.get_ref().clone()
        }
        Some(s) => {
            c.problem(s.span(), "source", "must be 1 to 200 characters");
            String::new()
        }
        None => {
            c.problem(0..0, "source", "missing: every file names the source label that owns its objects (for example \"team-payments/infra\")");
            String::new()
        }
    };
    out.sources.push(source.clone());
    for p in &raw.project {
        let place = c.place(p.span());
        let p = p.get_ref();
        let status = match &p.status {
            None => Some(ProjectStatus::Active),
            Some(s) => match s.get_ref().parse() {
                Ok(st) => Some(st),
                Err(e) => {
                    c.problem(
                        s.span(),
                        "project.status",
                        format!("{e} (active, suspended or archived)"),
                    );
                    None
                }
            },
        };
        if let (Some(id), Some(status)) = (c.id(&p.id, "project.id", true), status) {
            out.projects.insert(
                id.clone(),
                ProjectDef {
                    id,
                    status,
                    source: source.clone(),
                    place,
                },
            );
        }
    }
    for t in &raw.task {
        let place = c.place(t.span());
        let t = t.get_ref();
        let id = c.id(&t.id, "task.id", true);
        let project = c.id(&t.project, "task.project", true);
        let spec = match serde_json::to_value(t.spec.get_ref()) {
            Ok(v) if v.is_object() => {
                let text = v.to_string();
                match crate::worker::spec::parse(&text) {
                    Ok(_) => Some(text),
                    Err(e) => {
                        c.problem(t.spec.span(), "task.spec", e.to_string());
                        None
                    }
                }
            }
            _ => {
                c.problem(
                    t.spec.span(),
                    "task.spec",
                    "must be a table (the spec as a TOML inline or sub-table)",
                );
                None
            }
        };
        if let (Some(id), Some(project), Some(spec)) = (id, project, spec) {
            out.tasks.insert(
                id.clone(),
                TaskDef {
                    id,
                    project,
                    spec,
                    source: source.clone(),
                    place,
                },
            );
        }
    }
    for t in &raw.trigger {
        let place = c.place(t.span());
        if let Some(def) = trigger(&mut c, t.get_ref()) {
            out.triggers.insert(
                def.trigger_id.clone(),
                TriggerDef {
                    spec: def,
                    source: source.clone(),
                    place,
                },
            );
        }
    }
    (out, c.problems)
}

/// One `[[trigger]]` checked as `trigger publish` checks it before connecting.
fn trigger(c: &mut Checker<'_>, t: &RawTrigger) -> Option<TriggerSpec> {
    let id = c.id(&t.id, "trigger.id", false);
    let project = c.id(&t.project, "trigger.project", true);
    let task = c.id(&t.task, "trigger.task", true);
    let tz =
        t.tz.as_ref()
            .map_or("UTC".to_string(), |z| z.get_ref().clone());
    let schedule_ok = match Schedule::parse(t.cron.get_ref(), &tz) {
        Ok(_) => true,
        Err(e) => {
            match (&t.tz, e.to_string().contains("zone")) {
                (Some(z), true) => c.problem(z.span(), "trigger.tz", e.to_string()),
                _ => c.problem(t.cron.span(), "trigger.cron", e.to_string()),
            }
            false
        }
    };
    let misfire = match &t.misfire {
        None => Some(MisfirePolicy::Skip),
        Some(m) => match m.get_ref().parse() {
            Ok(p) => Some(p),
            Err(e) => {
                c.problem(
                    m.span(),
                    "trigger.misfire",
                    format!("{e} (skip or fire_once)"),
                );
                None
            }
        },
    };
    let grace = t
        .grace_ms
        .as_ref()
        .map_or(DEFAULT_MISFIRE_GRACE_MS, |g| *g.get_ref());
    let grace_ok = (0..=86_400_000).contains(&grace);
    if !grace_ok {
        let span = t.grace_ms.as_ref().map_or(0..0, |g| g.span());
        c.problem(
            span,
            "trigger.grace_ms",
            format!("{grace}: must be within 0..=86400000"),
        );
    }
    let options = options(c, t);
    let (id, project, task, misfire, options) = (id?, project?, task?, misfire?, options?);
    if !schedule_ok || !grace_ok {
        return None;
    }
    let mut spec = TriggerSpec::new(&id, &project, &task, t.cron.get_ref(), &tz);
    spec.misfire_policy = misfire;
    spec.misfire_grace_ms = grace;
    spec.enabled = !t.disabled.as_ref().is_some_and(|d| *d.get_ref());
    spec.jitter_ms = options.jitter_ms;
    spec.start_at_ms = options.start_at_ms;
    spec.end_at_ms = options.end_at_ms;
    spec.outcome_policy = options.outcome_policy;
    spec.overlap_policy = options.overlap_policy;
    if let (Some(j), Ok(schedule)) = (&t.jitter, Schedule::parse(t.cron.get_ref(), &tz)) {
        if let Err(e) = jitter_fits(&spec, &schedule) {
            c.problem(
                j.span(),
                "trigger.jitter",
                format!("`{}`: {e}", j.get_ref()),
            );
            return None;
        }
    }
    Some(spec)
}

/// The timing and policy options of a `[[trigger]]`, as `trigger publish` takes them.
struct Options {
    jitter_ms: i64,
    start_at_ms: Option<i64>,
    end_at_ms: Option<i64>,
    outcome_policy: OutcomePolicy,
    overlap_policy: OverlapPolicy,
}

/// Parses one optional value with `parse`, reporting a refusal under `key`. `Err`: refused.
fn opt<T>(
    c: &mut Checker<'_>,
    v: &Option<Spanned<String>>,
    key: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, ()> {
    let Some(v) = v else { return Ok(None) };
    parse(v.get_ref()).map(Some).map_err(|e| {
        c.problem(v.span(), key, format!("`{}`: {e}", v.get_ref()));
    })
}

/// The options of `t` within `trigger publish`'s bounds; `None` when any is refused (each
/// refusal reported).
fn options(c: &mut Checker<'_>, t: &RawTrigger) -> Option<Options> {
    let jitter = opt(c, &t.jitter, "trigger.jitter", |s| {
        let ms = options::parse_jitter(s)?;
        if (0..=MAX_JITTER_MS).contains(&ms) {
            Ok(ms)
        } else {
            Err(format!("{ms} ms must be within 0..={MAX_JITTER_MS}"))
        }
    });
    let start = opt(c, &t.start_at, "trigger.start_at", options::parse_instant);
    let end = opt(c, &t.end_at, "trigger.end_at", options::parse_instant);
    let expect = opt(
        c,
        &t.expect_success_within,
        "trigger.expect_success_within",
        |s| {
            let ms = options::policy_duration(s)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))?;
            if EXPECT_SUCCESS_WITHIN_MS.contains(&ms) {
                Ok(ms)
            } else {
                Err(format!(
                    "{ms} ms must be within 1 minute..=366 days ({}..={} ms)",
                    EXPECT_SUCCESS_WITHIN_MS.start(),
                    EXPECT_SUCCESS_WITHIN_MS.end()
                ))
            }
        },
    );
    let overlap = opt(c, &t.overlap, "trigger.overlap", |s| {
        s.parse::<OverlapPolicy>()
    });
    let pause = match &t.pause_after_failures {
        None => Ok(None),
        Some(n) => match i32::try_from(*n.get_ref()) {
            Ok(v) if PAUSE_AFTER_FAILURES.contains(&v) => Ok(Some(v)),
            _ => {
                c.problem(
                    n.span(),
                    "trigger.pause_after_failures",
                    format!(
                        "{}: must be within {}..={} consecutive failed runs",
                        n.get_ref(),
                        PAUSE_AFTER_FAILURES.start(),
                        PAUSE_AFTER_FAILURES.end()
                    ),
                );
                Err(())
            }
        },
    };
    let (jitter, start, end, expect, overlap, pause) = (
        jitter.ok()?,
        start.ok()?,
        end.ok()?,
        expect.ok()?,
        overlap.ok()?,
        pause.ok()?,
    );
    if let (Some(s), Some(e), Some(at)) = (start, end, &t.end_at) {
        if s >= e {
            c.problem(
                at.span(),
                "trigger.end_at",
                format!("the window's end must be after its start ({s} ms >= {e} ms)"),
            );
            return None;
        }
    }
    Some(Options {
        jitter_ms: jitter.unwrap_or(0),
        start_at_ms: start,
        end_at_ms: end,
        outcome_policy: OutcomePolicy {
            pause_after_failures: pause,
            expect_success_within_ms: expect,
        },
        overlap_policy: overlap.unwrap_or_default(),
    })
}

/// `trigger publish`'s jitter check from now on: shorter than the shortest gap between two
/// consecutive occurrences in the window.
fn jitter_fits(spec: &TriggerSpec, schedule: &Schedule) -> Result<(), String> {
    if spec.jitter_ms == 0 {
        return Ok(());
    }
    let now = chrono::Utc::now().timestamp_millis();
    let from = spec.start_at_ms.map_or(now, |s| now.max(s - 1));
    match min_gap(schedule, from, spec.end_at_ms, spec.jitter_ms) {
        Some(gap) if gap.gap_ms <= spec.jitter_ms => Err(format!(
            "{} ms must be shorter than the shortest gap between two consecutive occurrences, {} ms (after the occurrence at {})",
            spec.jitter_ms,
            gap.gap_ms,
            options::instant_text(gap.after_ms)
        )),
        _ => Ok(()),
    }
}

/// The `*.toml` files of `paths` (a file as given; a directory's `*.toml` files, not its
/// subdirectories), in name order.
pub fn files_of(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Problem> {
    let mut out = Vec::new();
    for p in paths {
        let unreadable = |e: std::io::Error| Problem {
            place: Place {
                file: p.clone(),
                line: 0,
            },
            key: "(file)".into(),
            message: format!("cannot be read: {e}"),
        };
        if p.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(unreadable)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && f.extension().is_some_and(|x| x == "toml"))
                .collect();
            in_dir.sort();
            out.extend(in_dir);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Reads and checks every file of `paths`, then the files together: an id defined twice
/// (in one file or two) is refused naming both places, and a trigger's task must be in the
/// trigger's project when the files define that task. `Err`: every problem, nothing usable.
pub fn load(paths: &[PathBuf]) -> Result<Definitions, Vec<Problem>> {
    let files = files_of(paths).map_err(|p| vec![p])?;
    let mut all = Definitions::default();
    let mut problems = Vec::new();
    for f in &files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                problems.push(Problem {
                    place: Place {
                        file: f.clone(),
                        line: 0,
                    },
                    key: "(file)".into(),
                    message: format!("cannot be read: {e}"),
                });
                continue;
            }
        };
        let (defs, found) = parse_file(f, &text);
        problems.extend(found);
        merge(&mut all, defs, &mut problems);
    }
    for t in all.triggers.values() {
        if let Some(task) = all.tasks.get(&t.spec.task_id) {
            if task.project != t.spec.project_id {
                problems.push(Problem {
                    place: t.place.clone(),
                    key: "trigger.task".into(),
                    message: format!(
                        "task {} is in project {} ({}), not {}",
                        task.id, task.project, task.place, t.spec.project_id
                    ),
                });
            }
        }
    }
    if problems.is_empty() {
        Ok(all)
    } else {
        Err(problems)
    }
}

/// Adds one file's definitions, refusing an id already defined (naming both places).
fn merge(all: &mut Definitions, defs: Definitions, problems: &mut Vec<Problem>) {
    fn twice(kind: &str, id: &str, first: &Place, again: &Place) -> Problem {
        Problem {
            place: again.clone(),
            key: format!("{kind}.id"),
            message: format!("{kind} `{id}` is defined twice: here and at {first}"),
        }
    }
    for (id, p) in defs.projects {
        match all.projects.get(&id) {
            Some(first) => problems.push(twice("project", &id, &first.place, &p.place)),
            None => {
                all.projects.insert(id, p);
            }
        }
    }
    for (id, t) in defs.tasks {
        match all.tasks.get(&id) {
            Some(first) => problems.push(twice("task", &id, &first.place, &t.place)),
            None => {
                all.tasks.insert(id, t);
            }
        }
    }
    for (id, t) in defs.triggers {
        match all.triggers.get(&id) {
            Some(first) => problems.push(twice("trigger", &id, &first.place, &t.place)),
            None => {
                all.triggers.insert(id, t);
            }
        }
    }
    for s in defs.sources {
        if !all.sources.contains(&s) {
            all.sources.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"source = "team-payments/infra"

[[project]]
id = "payments"

[[task]]
id = "report"
project = "payments"
spec = { executor = "shell", command = ["sh", "-c", "echo report"] }

[[trigger]]
id = "nightly"
project = "payments"
task = "report"
cron = "30 2 * * *"
tz = "Europe/Berlin"
misfire = "fire_once"
"#;

    #[test]
    fn a_good_file_gives_every_definition_with_defaults() {
        let (d, problems) = parse_file(Path::new("a.toml"), GOOD);
        assert_eq!(problems, vec![]);
        assert_eq!(d.sources, ["team-payments/infra"]);
        assert_eq!(d.projects["payments"].status, ProjectStatus::Active);
        assert_eq!(
            d.tasks["report"].spec,
            r#"{"command":["sh","-c","echo report"],"executor":"shell"}"#
        );
        let t = &d.triggers["nightly"];
        assert_eq!(t.place.line, 11, "the line of its [[trigger]] header");
        assert_eq!(t.spec.misfire_policy, MisfirePolicy::FireOnce);
        assert_eq!(t.spec.misfire_grace_ms, DEFAULT_MISFIRE_GRACE_MS);
        assert!(t.spec.enabled);
    }

    #[test]
    fn the_publish_options_are_read_and_default_to_unset() {
        let (d, _) = parse_file(Path::new("a.toml"), GOOD);
        let t = &d.triggers["nightly"].spec;
        assert_eq!((t.jitter_ms, t.start_at_ms, t.end_at_ms), (0, None, None));
        assert_eq!(t.outcome_policy, OutcomePolicy::default());
        assert_eq!(t.overlap_policy, OverlapPolicy::Allow);
        let all = format!(
            "{GOOD}jitter = \"30s\"\nstart_at = \"2026-03-01T00:00:00Z\"\nend_at = \"2036-03-01T01:00:00+01:00\"\npause_after_failures = 3\nexpect_success_within = \"2d\"\noverlap = \"buffer_one\"\n"
        );
        let (d, problems) = parse_file(Path::new("a.toml"), &all);
        assert_eq!(problems, vec![]);
        let t = &d.triggers["nightly"].spec;
        assert_eq!(t.jitter_ms, 30_000);
        assert_eq!(t.start_at_ms, Some(1_772_323_200_000));
        assert_eq!(
            t.end_at_ms,
            options::parse_instant("2036-03-01T00:00:00Z").ok()
        );
        assert_eq!(t.outcome_policy.pause_after_failures, Some(3));
        assert_eq!(
            t.outcome_policy.expect_success_within_ms,
            Some(2 * 86_400_000)
        );
        assert_eq!(t.overlap_policy, OverlapPolicy::BufferOne);
    }

    #[test]
    fn a_publish_option_out_of_bounds_is_refused_naming_its_line_and_key() {
        let cases = [
            (
                "jitter = \"2d\"",
                "trigger.jitter",
                "must be within 0..=86400000",
            ),
            ("jitter = \"soon\"", "trigger.jitter", "`soon`"),
            ("jitter = \"24h\"", "trigger.jitter", "shortest gap"),
            ("start_at = \"tomorrow\"", "trigger.start_at", "RFC 3339"),
            (
                "end_at = \"2026-13-01T00:00:00Z\"",
                "trigger.end_at",
                "RFC 3339",
            ),
            (
                "start_at = \"2030-01-01T00:00:00Z\"\nend_at = \"2029-01-01T00:00:00Z\"",
                "trigger.end_at",
                "after its start",
            ),
            (
                "pause_after_failures = 0",
                "trigger.pause_after_failures",
                "1..=1000",
            ),
            (
                "pause_after_failures = 1001",
                "trigger.pause_after_failures",
                "1..=1000",
            ),
            (
                "expect_success_within = \"30s\"",
                "trigger.expect_success_within",
                "1 minute..=366 days",
            ),
            (
                "expect_success_within = \"367d\"",
                "trigger.expect_success_within",
                "1 minute..=366 days",
            ),
            (
                "expect_success_within = \"1w\"",
                "trigger.expect_success_within",
                "`1w`",
            ),
            (
                "overlap = \"queue\"",
                "trigger.overlap",
                "unknown overlap policy `queue`",
            ),
        ];
        for (line, key, says) in cases {
            let text = format!("{GOOD}{line}\n");
            let at = text.lines().count();
            let (d, p) = parse_file(Path::new("o.toml"), &text);
            assert!(d.triggers.is_empty(), "{line}: refused, not defined");
            assert_eq!(p.len(), 1, "{line}: {p:?}");
            assert_eq!(
                (p[0].key.as_str(), p[0].place.line),
                (key, at),
                "{line}: {p:?}"
            );
            let shown = p[0].to_string();
            assert!(
                shown.starts_with(&format!("o.toml:{at}: {key}: ")),
                "{shown}"
            );
            assert!(shown.contains(says), "{line}: {shown}");
        }
    }

    #[test]
    fn every_problem_names_the_file_the_line_and_the_key() {
        let bad = GOOD
            .replace("cron = \"30 2 * * *\"", "cron = \"61 2 * * *\"")
            .replace(
                "misfire = \"fire_once\"",
                "misfire = \"sometimes\"\ngrace_ms = -1",
            )
            .replace("id = \"payments\"\n", "id = \"pay ments\"\n");
        let (_, problems) = parse_file(Path::new("b.toml"), &bad);
        let lines: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        let keys: Vec<(&str, usize)> = problems
            .iter()
            .map(|p| (p.key.as_str(), p.place.line))
            .collect();
        assert_eq!(
            keys,
            [
                ("project.id", 4),
                ("trigger.cron", 15),
                ("trigger.misfire", 17),
                ("trigger.grace_ms", 18)
            ],
            "{lines:#?}"
        );
        assert!(
            lines[0].starts_with("b.toml:4: project.id: `pay ments`"),
            "{lines:#?}"
        );
    }

    #[test]
    fn a_file_without_source_or_with_an_unknown_key_is_refused() {
        let (_, p) = parse_file(
            Path::new("c.toml"),
            &GOOD.replace("source = \"team-payments/infra\"\n", ""),
        );
        assert_eq!((p[0].key.as_str(), p[0].place.line), ("source", 1));
        let (_, p) = parse_file(Path::new("c.toml"), &format!("{GOOD}colour = \"blue\"\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].message.contains("colour"), "{p:?}");
    }

    #[test]
    fn an_id_defined_in_two_files_is_refused_naming_both() {
        let dir = std::env::temp_dir().join(format!("qlsched-apply-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.toml"), GOOD).unwrap();
        std::fs::write(dir.join("b.toml"), "source = \"other\"\n\n[[trigger]]\nid = \"nightly\"\nproject = \"payments\"\ntask = \"report\"\ncron = \"* * * * *\"\n").unwrap();
        let problems = load(std::slice::from_ref(&dir)).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let text = problems[0].to_string();
        assert!(
            text.contains("b.toml:3: trigger.id: trigger `nightly` is defined twice: here and at"),
            "{text}"
        );
        assert!(text.contains("a.toml:11"), "{text}");
    }
}
