//! What can go wrong while loading the configuration.

use std::fmt;
use std::path::PathBuf;

/// One thing wrong with the configuration: where it was written, which key, what value, and
/// what the value must be. Rendered as `{file}: {key} = {value}: {bound}`.
///
/// `value` never carries a secret: passwords are shown as `***` and DSNs are redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The layer that wrote the key: the replica file as given, `env QLSCHED__…`, or
    /// `default.toml (built in)`.
    pub file: String,
    /// Dotted key, e.g. `scheduler.claim_budget`.
    pub key: String,
    /// The offending value as written (redacted where secret).
    pub value: String,
    /// What the value must be, e.g. `must be within 1..=256`.
    pub bound: String,
}

impl ConfigProblem {
    pub(super) fn new(
        file: impl Into<String>,
        key: impl Into<String>,
        value: impl Into<String>,
        bound: impl Into<String>,
    ) -> Self {
        ConfigProblem {
            file: file.into(),
            key: key.into(),
            value: value.into(),
            bound: bound.into(),
        }
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} = {}: {}",
            self.file, self.key, self.value, self.bound
        )
    }
}

/// Why the configuration could not be loaded. Raised before any database connection opens.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The replica's config file could not be read (missing, unreadable).
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Every problem found, all at once; displayed one per line.
    #[error("{}", ProblemLines(.0))]
    Problems(Vec<ConfigProblem>),
}

impl ConfigError {
    /// The collected problems (empty for `Io`).
    pub fn problems(&self) -> &[ConfigProblem] {
        match self {
            ConfigError::Problems(p) => p,
            ConfigError::Io { .. } => &[],
        }
    }
}

struct ProblemLines<'a>(&'a [ConfigProblem]);

impl fmt::Display for ProblemLines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}
