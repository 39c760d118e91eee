//! Secrets stay off the database (docs/worker.md, "Secrets"): a spec names a secret
//! (`{"secret": "backup-token"}`) and the worker reads the file of that name from its
//! credentials directory (systemd `LoadCredential=`, or `[worker] credentials_directory`),
//! checked as libpq checks a password file (no access for group or others). Every resolved
//! value is redacted from the output tail and the error an attempt records.

use std::path::{Path, PathBuf};

use crate::db::credfile::{self, CredFileError, Rule};
use crate::db::dsn::Secret;

/// Why a secret could not be resolved; never carries the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret `{name}`: this worker has no credentials directory ([worker] credentials_directory or $CREDENTIALS_DIRECTORY)")]
    NoDirectory { name: String },
    #[error("secret `{name}`: {} {source}", path.display())]
    File {
        name: String,
        path: PathBuf,
        source: CredFileError,
    },
}

/// Where secrets are read from.
#[derive(Debug, Clone)]
pub struct Credentials {
    dir: Option<PathBuf>,
}

impl Credentials {
    pub fn new(dir: Option<PathBuf>) -> Credentials {
        Credentials { dir }
    }

    /// The secret `name` (a name checked by the spec: no `/`), one trailing newline trimmed.
    pub fn resolve(&self, name: &str) -> Result<Secret, SecretError> {
        let dir = self
            .dir
            .as_deref()
            .ok_or_else(|| SecretError::NoDirectory {
                name: name.to_string(),
            })?;
        let path = dir.join(name);
        let text = read(&path).map_err(|source| SecretError::File {
            name: name.to_string(),
            path: path.clone(),
            source,
        })?;
        let text = text.strip_suffix('\n').unwrap_or(&text);
        Ok(Secret::new(text.strip_suffix('\r').unwrap_or(text)))
    }
}

fn read(path: &Path) -> Result<String, CredFileError> {
    credfile::read_text(path, Rule::Password)
}

/// Replaces every resolved secret's value in a text by `[redacted]`.
#[derive(Default, Clone)]
pub struct Redactor {
    values: Vec<String>,
}

impl Redactor {
    /// Adds a value to hide (an empty one hides nothing).
    pub fn add(&mut self, value: &str) {
        if !value.is_empty() && !self.values.iter().any(|v| v == value) {
            self.values.push(value.to_string());
            // Longest first: a secret containing another is hidden whole.
            self.values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        }
    }

    /// The longest value hidden, in bytes (a tail keeps this much more before redacting, so
    /// a secret cut by the tail's start cannot show in part).
    pub fn longest(&self) -> usize {
        self.values.first().map_or(0, String::len)
    }

    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "[redacted]");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_redacted_longest_first() {
        let mut r = Redactor::default();
        r.add("abc");
        r.add("abcdef");
        r.add("");
        assert_eq!(r.redact("x abcdef y abc z"), "x [redacted] y [redacted] z");
        assert_eq!(r.longest(), 6);
    }
}
