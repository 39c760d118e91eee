//! The password file, as libpq reads it: `PGPASSFILE` or `~/.pgpass`, lines
//! `host:port:database:user:password` with `*` wildcards and `\\:`/`\\\\` escapes; ignored
//! when group or others can read it.

use std::path::{Path, PathBuf};

use tokio_postgres::config::Host;

use super::credfile::{self, CredFileError, Rule};

fn passfile_path() -> Option<PathBuf> {
    match std::env::var_os("PGPASSFILE") {
        Some(p) => Some(PathBuf::from(p)),
        None => std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")),
    }
}

/// What the passfile says for a connection config.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The password of the first matching line.
    Found(String),
    /// No passfile, an unreadable one, or no line matches.
    Missing,
    /// The passfile has group or world access: ignored, as libpq does (the caller warns).
    Ignored { path: PathBuf, mode: u32 },
}

/// The password for `pg`'s first host, port, database and user from the passfile. As libpq:
/// a passfile others can read is ignored (judged on the open file); a missing one silently.
pub fn password(pg: &tokio_postgres::Config) -> Lookup {
    let Some(path) = passfile_path() else {
        return Lookup::Missing;
    };
    let text = match credfile::read_text(&path, Rule::Password) {
        Ok(text) => text,
        Err(CredFileError::PasswordMode { mode }) => return Lookup::Ignored { path, mode },
        Err(_) => return Lookup::Missing,
    };
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        // libpq matches a socket directory as `localhost`
        Some(Host::Unix(_)) | None => "localhost".to_string(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = pg.get_user().unwrap_or("").to_string();
    let db = pg.get_dbname().unwrap_or(&user).to_string();
    match passfile_lookup(&text, &[&host, &port, &db, &user]) {
        Some(pw) => Lookup::Found(pw),
        None => Lookup::Missing,
    }
}

/// The password of the first passfile line matching `host, port, database, user`.
pub fn passfile_lookup(text: &str, want: &[&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_passfile_line(line);
        if fields.len() != 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(want.iter())
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

fn split_passfile_line(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    out.last_mut().expect("non-empty").push(n);
                }
            }
            ':' if out.len() < 5 => out.push(String::new()),
            c => out.last_mut().expect("non-empty").push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passfile_lines_match_with_wildcards_and_escapes() {
        let text = "# comment\n\
                    otherhost:5432:*:u:nope\n\
                    127.0.0.1:*:qlsched:qlsched_admin:pa\\:ss\\\\word\n\
                    *:*:*:*:fallback\n";
        assert_eq!(
            passfile_lookup(text, &["127.0.0.1", "5432", "qlsched", "qlsched_admin"]),
            Some("pa:ss\\word".into())
        );
        assert_eq!(
            passfile_lookup(text, &["db", "5432", "x", "y"]),
            Some("fallback".into())
        );
        assert_eq!(passfile_lookup("a:b:c:d\n", &["a", "b", "c", "d"]), None);
    }
}
