//! Reads `src/**/*.rs` and lists, for each top-level module of the crate, the other top-level
//! modules it names (`crate::m`, `use crate::m`, `super::m` resolving to the crate root), and
//! which of those arrows run upward in [`LAYERS`]. Shared by `cargo run --example layers` and
//! the integration test `layers` (tests/it/layers.rs), so the picture and the check agree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layer order, lowest first. A module may name modules of its own layer or of a lower
/// one; naming a higher one is an upward arrow. Modules of one layer are peers.
pub const LAYERS: &[&[&str]] = &[
    // Primitives without I/O of their own: the database clock's SQL fragment, pure cron and
    // misfire decisions, the metrics registry, the replica's health flags.
    &["clock", "schedule", "metrics", "health"],
    // Reaching PostgreSQL the way libpq does: conninfo, passfile, hosts, TLS, sessions, pool.
    &["db"],
    // Layered configuration files, parsed once into types (the DSN into a `db::Target`).
    &["config"],
    // The root logger, built from the configuration.
    &["telemetry"],
    // Schema management: migrations, compatibility, grants, readiness, `db status`.
    &["schema"],
    // Every SQL statement, returning typed rows.
    &["store"],
    // The admission decision over claimed rows (no actix).
    &["engine"],
    // The replica's actors, the retention sweep and the replica's identity lock.
    &["actors", "retention", "identity"],
    // Text shared by the command line and the console: durations, spans, state, tables.
    &["present"],
    // The HTTP endpoints and the web console.
    &["http", "console"],
    // The composition roots: builds and runs a replica (startup) or a worker (worker, which
    // shares startup's signal handling).
    &["startup", "worker"],
    // Definitions as code: the files of `qlsched apply` (they check specs as the worker would).
    &["apply"],
    // The command line (`run` calls into startup, `worker` into worker).
    &["cli"],
];

/// One reference from a file of one top-level module to another top-level module.
#[derive(Clone, Debug)]
pub struct Arrow {
    pub from: String,
    pub to: String,
    pub file: PathBuf,
    pub line: usize,
}

impl Arrow {
    /// Whether the arrow runs from a lower layer to a higher one (`None`: a module missing
    /// from [`LAYERS`]).
    pub fn upward(&self) -> Option<bool> {
        Some(rank(&self.to)? > rank(&self.from)?)
    }
}

/// The layer of a top-level module, lowest 0.
pub fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every arrow between two different top-level modules under `src`.
pub fn arrows(src: &Path) -> Vec<Arrow> {
    let mut files = Vec::new();
    collect(src, &mut files);
    files.sort();
    let macros = exported_macros(src, &files);
    let mut out = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap_or(&file).to_path_buf();
        let Some(path) = module_path(&rel) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        scan_file(&text, &path, &file, &macros, &mut out);
    }
    out
}

/// The top-level modules found under `src` (directories and files other than lib/main).
pub fn modules(src: &Path) -> Vec<String> {
    let mut m: Vec<String> = std::fs::read_dir(src)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let p = e.path();
                    let name = p.file_stem()?.to_str()?.to_owned();
                    let keep = p.is_dir() || p.extension().is_some_and(|x| x == "rs");
                    (keep && name != "lib" && name != "main").then_some(name)
                })
                .collect()
        })
        .unwrap_or_default();
    m.sort();
    m.dedup();
    m
}

/// The arrows grouped by source module, then target module (first occurrence kept).
pub fn picture(arrows: &[Arrow]) -> BTreeMap<String, BTreeMap<String, Arrow>> {
    let mut p: BTreeMap<String, BTreeMap<String, Arrow>> = BTreeMap::new();
    for a in arrows {
        p.entry(a.from.clone())
            .or_default()
            .entry(a.to.clone())
            .or_insert_with(|| a.clone());
    }
    p
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

/// `store/claim.rs` → `[store, claim]`; `store/mod.rs` → `[store]`; lib.rs/main.rs → none.
fn module_path(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.is_empty() || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main")) {
        return None;
    }
    Some(parts)
}

fn scan_file(
    text: &str,
    path: &[String],
    file: &Path,
    macros: &BTreeMap<String, String>,
    out: &mut Vec<Arrow>,
) {
    let from = &path[0];
    let mut inline_depth = 0usize;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.starts_with("//") {
            continue;
        }
        if line.starts_with("mod ") && line.trim_end().ends_with('{') {
            inline_depth += 1;
        }
        let code = line.split("//").next().unwrap_or("");
        for to in referenced(code, path, inline_depth, macros) {
            if to != *from {
                out.push(Arrow {
                    from: from.clone(),
                    to,
                    file: file.to_path_buf(),
                    line: i + 1,
                });
            }
        }
    }
}

/// The top-level modules one line of code names.
fn referenced(
    code: &str,
    path: &[String],
    inline_depth: usize,
    macros: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at].ends_with('$') {
            continue;
        }
        if let Some(name) = ident(&code[at + "crate::".len()..]) {
            found.push(top_level(name, macros));
        }
    }
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") {
            continue;
        }
        let mut rest = &code[at..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        // The module the `super`s land in: the file's own path plus any inline module.
        let depth = path.len() + inline_depth;
        if ups < depth {
            let landed = depth - ups;
            if landed == 0 {
                if let Some(name) = ident(rest) {
                    found.push(top_level(name, macros));
                }
            }
        }
    }
    found
}

/// A name after `crate::`: a top-level module, or a `#[macro_export]` macro, which counts
/// as the module that defines it.
fn top_level(name: &str, macros: &BTreeMap<String, String>) -> String {
    macros.get(name).cloned().unwrap_or_else(|| name.to_owned())
}

/// Each `#[macro_export] macro_rules! name` under `src`, and its top-level module.
fn exported_macros(src: &Path, files: &[PathBuf]) -> BTreeMap<String, String> {
    let mut macros = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap_or(file);
        let Some(path) = module_path(rel) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let mut exported = false;
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("macro_rules!") {
                if let (true, Some(name)) = (exported, ident(rest.trim_start())) {
                    macros.insert(name.to_owned(), path[0].clone());
                }
            }
            exported = line == "#[macro_export]";
        }
    }
    macros
}

fn ident(s: &str) -> Option<&str> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| &s[..end])
}
