//! The result file of one run: JSON with a versioned schema (`"schema": 1`) and a markdown
//! table beside it, and the comparison of two result files against a noise band.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::stats::{self, Band};

/// The version of the JSON layout; bump it when a field changes meaning.
pub const SCHEMA: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResultFile {
    pub schema: u32,
    pub mode: String,
    /// UTC, RFC 3339, when the run started.
    pub started_at: String,
    pub duration_s: f64,
    pub commit: String,
    pub dirty: bool,
    pub machine: Machine,
    pub postgres: Postgres,
    pub rows: Vec<Row>,
    /// Evidence: plans, statement profiles, per-run details.
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub nproc: usize,
    pub memory_kib: u64,
    pub kernel: String,
    pub cpu: String,
    /// 1-minute load average at the start and the end of the run.
    pub load_before: f64,
    pub load_after: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Postgres {
    pub version: String,
    /// Every setting not at its built-in default (`pg_settings.source <> 'default'`,
    /// client-side ones left out).
    pub settings: BTreeMap<String, String>,
}

/// One row of the table. `key` is stable across runs (compare matches rows by it);
/// `value` is the row's headline figure in `unit`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub id: String,
    pub key: String,
    pub measurement: String,
    pub value: Option<f64>,
    pub unit: String,
    /// `Some(true)` when a higher value is better (rates), `Some(false)` when lower is
    /// (times, sizes), `None` otherwise.
    pub higher_is_better: Option<bool>,
    /// The value as a share of the raw-SQL ceiling, where the row has one.
    pub ceiling_ratio: Option<f64>,
    pub detail: String,
    pub target: String,
    pub verdict: Verdict,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// No target, or a figure only for reference.
    None,
}

impl Verdict {
    pub fn of(ok: bool) -> Verdict {
        if ok {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }
    fn text(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::None => "—",
        }
    }
}

impl Row {
    /// A row with its headline figure; detail, target, verdict and ratio added with the
    /// builder methods below.
    pub fn new(id: &str, key: &str, measurement: impl Into<String>, value: f64, unit: &str) -> Row {
        Row {
            id: id.into(),
            key: key.into(),
            measurement: measurement.into(),
            value: Some(value),
            unit: unit.into(),
            higher_is_better: None,
            ceiling_ratio: None,
            detail: String::new(),
            target: "—".into(),
            verdict: Verdict::None,
        }
    }
    pub fn higher_better(mut self) -> Row {
        self.higher_is_better = Some(true);
        self
    }
    pub fn lower_better(mut self) -> Row {
        self.higher_is_better = Some(false);
        self
    }
    pub fn detail(mut self, d: impl Into<String>) -> Row {
        self.detail = d.into();
        self
    }
    pub fn target(mut self, t: &str, ok: bool) -> Row {
        self.target = t.into();
        self.verdict = Verdict::of(ok);
        self
    }
    pub fn ceiling(mut self, ratio: Option<f64>) -> Row {
        self.ceiling_ratio = ratio;
        self
    }
    fn measured(&self) -> String {
        let mut s = match self.value {
            Some(v) => format!("{} {}", fmt_num(v), self.unit),
            None => String::new(),
        };
        if let Some(r) = self.ceiling_ratio {
            s.push_str(&format!(", **{r:.2}× ceiling**"));
        }
        if !self.detail.is_empty() {
            s.push_str(if s.is_empty() { "" } else { "; " });
            s.push_str(&self.detail);
        }
        s
    }
}

/// A figure with as many decimals as its size deserves.
pub fn fmt_num(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.3}"),
    }
}

impl ResultFile {
    /// The markdown table (and the evidence) of this run.
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = format!(
            "# qlsched benchmark, {} mode\n\n{} · commit `{}{}` · {} s · nproc {} · {} MiB · {} · {} · \
             PostgreSQL {} · load {:.2} → {:.2}\n\n",
            self.mode,
            self.started_at,
            self.commit,
            if self.dirty { "-dirty" } else { "" },
            self.duration_s.round(),
            m.nproc,
            m.memory_kib / 1024,
            m.cpu,
            m.kernel,
            self.postgres.version,
            m.load_before,
            m.load_after
        );
        let settings: Vec<String> = self
            .postgres
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        s.push_str(&format!("Server settings: {}\n\n", settings.join(", ")));
        s.push_str("| # | measurement | measured | target | verdict |\n|---|---|---|---|---|\n");
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                r.id,
                cell(&r.measurement),
                cell(&r.measured()),
                cell(&r.target),
                r.verdict.text()
            ));
        }
        if !self.notes.is_empty() {
            s.push_str("\n## Evidence\n\n");
            for n in &self.notes {
                s.push_str(n);
                s.push_str("\n\n");
            }
        }
        s
    }

    /// Writes `<stem>.json` and `<stem>.md` into `dir`; returns the JSON path.
    pub fn write(&self, dir: &Path, stem: &str) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join(format!("{stem}.json"));
        std::fs::write(&json, serde_json::to_string_pretty(self)? + "\n")?;
        std::fs::write(dir.join(format!("{stem}.md")), self.markdown())?;
        Ok(json)
    }

    pub fn read(path: &Path) -> Result<ResultFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        match v.get("schema").and_then(|s| s.as_u64()) {
            Some(s) if s == SCHEMA as u64 => {}
            other => {
                return Err(format!(
                    "{}: schema {other:?}, this program reads schema {SCHEMA}",
                    path.display()
                ))
            }
        }
        serde_json::from_value(v).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// One row of a comparison: the same key in both files.
#[derive(Debug, PartialEq)]
pub struct Compared {
    pub key: String,
    pub old: f64,
    pub new: f64,
    pub ratio: f64,
    pub band: Band,
}

/// Rows of `new` against those of `old` with the same key and a value in both; rows present
/// in one file only are listed by key in the second vector.
pub fn compare(old: &ResultFile, new: &ResultFile, width: f64) -> (Vec<Compared>, Vec<String>) {
    let mut out = Vec::new();
    let mut unmatched = Vec::new();
    for n in &new.rows {
        let Some(o) = old.rows.iter().find(|o| o.key == n.key) else {
            unmatched.push(n.key.clone());
            continue;
        };
        let (Some(ov), Some(nv)) = (o.value, n.value) else {
            continue;
        };
        if let (Some(b), Some(r)) = (
            stats::band(ov, nv, width, n.higher_is_better),
            stats::ratio(nv, ov),
        ) {
            out.push(Compared {
                key: n.key.clone(),
                old: ov,
                new: nv,
                ratio: r,
                band: b,
            });
        }
    }
    for o in &old.rows {
        if !new.rows.iter().any(|n| n.key == o.key) {
            unmatched.push(o.key.clone());
        }
    }
    (out, unmatched)
}

/// The comparison as text; the number of rows worse than the band is the second value.
pub fn render_comparison(c: &[Compared], unmatched: &[String], width: f64) -> (String, usize) {
    let mut s = format!(
        "| row | old | new | new/old | ±{:.0} % |\n|---|---|---|---|---|\n",
        width * 100.0
    );
    let mut worse = 0;
    for r in c {
        let flag = match r.band {
            Band::Within => "within",
            Band::Better => "BETTER",
            Band::Worse => {
                worse += 1;
                "WORSE"
            }
            Band::Changed => "CHANGED",
        };
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {flag} |\n",
            r.key,
            fmt_num(r.old),
            fmt_num(r.new),
            r.ratio
        ));
    }
    if !unmatched.is_empty() {
        s.push_str(&format!("\nin one file only: {}\n", unmatched.join(", ")));
    }
    (s, worse)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rows: Vec<Row>) -> ResultFile {
        ResultFile {
            schema: SCHEMA,
            mode: "quick".into(),
            started_at: "2026-12-04T00:00:00Z".into(),
            duration_s: 1.0,
            commit: "abc1234".into(),
            dirty: false,
            machine: Machine::default(),
            postgres: Postgres::default(),
            rows,
            notes: vec![],
        }
    }

    #[test]
    fn a_result_file_round_trips_with_its_schema() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(vec![Row::new("7", "herd_10000", "herd", 612.0, "ms")
            .lower_better()
            .target("≤ 2000 ms", true)]);
        let path = f.write(dir.path(), "run").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"schema\": 1"), "{text}");
        assert_eq!(ResultFile::read(&path).unwrap(), f);
        let md = std::fs::read_to_string(dir.path().join("run.md")).unwrap();
        assert!(
            md.contains("| 7 | herd | 612 ms | ≤ 2000 ms | PASS |"),
            "{md}"
        );
    }

    #[test]
    fn another_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        std::fs::write(&path, r#"{"schema": 0, "rows": []}"#).unwrap();
        assert!(ResultFile::read(&path).unwrap_err().contains("schema"));
    }

    #[test]
    fn compare_flags_rows_outside_the_band() {
        let old = file(vec![
            Row::new("2", "drain", "d", 1000.0, "occ/s").higher_better(),
            Row::new("7", "herd", "h", 600.0, "ms").lower_better(),
            Row::new("5", "idle", "i", 0.2, "st/s"),
        ]);
        let new = file(vec![
            Row::new("2", "drain", "d", 1050.0, "occ/s").higher_better(),
            Row::new("7", "herd", "h", 700.0, "ms").lower_better(),
            Row::new("9", "new", "n", 1.0, "x"),
        ]);
        let (c, unmatched) = compare(&old, &new, 0.10);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].band, Band::Within);
        assert_eq!(c[1].band, Band::Worse);
        assert_eq!(unmatched, vec!["new".to_string(), "idle".to_string()]);
        let (text, worse) = render_comparison(&c, &unmatched, 0.10);
        assert_eq!(worse, 1);
        assert!(
            text.contains("| herd | 600 | 700 | 1.167 | WORSE |"),
            "{text}"
        );
    }
}
