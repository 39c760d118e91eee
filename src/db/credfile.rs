//! Files that hold a secret (a database password, the console's credentials, a TLS private
//! key): opened first, then judged by the metadata of the open descriptor (`fstat`), so the
//! file that is checked is the file that is read, whatever is renamed over the path
//! meanwhile. The rules are libpq's:
//!
//! - a password file (its passfile rule): no bit for group or others (`0600` or less);
//! - a key (its client's private-key rule, which the console's credentials follow too): no
//!   bit for group or others (`0600` or less), or, when owned by root, at most group read
//!   (`0640`), so a root-managed file can be handed to the service's group. As libpq, the
//!   owner is not checked otherwise: a file this process can read with such a mode is its
//!   own or root's.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Which of libpq's rules a file must pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// libpq's passfile rule: no group or other bits.
    Password,
    /// libpq's private-key rule: 0600, or 0640 when owned by root.
    Key,
}

/// Why a secret file was refused; each message starts where "FILE " leaves off.
#[derive(Debug, thiserror::Error)]
pub enum CredFileError {
    #[error("must exist and be readable ({0})")]
    Open(std::io::Error),
    #[error("is not a regular file")]
    NotRegular,
    #[error(
        "has mode {mode:04o}; a password file must give group and others no access \
         (libpq's passfile rule): chmod 600"
    )]
    PasswordMode { mode: u32 },
    #[error(
        "has mode {mode:04o}; a key must be u=rw (0600) or less, or u=rw,g=r (0640) or less \
         when owned by root (libpq's rule): chmod 600"
    )]
    KeyMode { mode: u32 },
}

/// Opens `path`, checks the open file against `rule`, and reads it whole.
pub fn read(path: &Path, rule: Rule) -> Result<Vec<u8>, CredFileError> {
    let mut file = std::fs::File::open(path).map_err(CredFileError::Open)?;
    let meta = file.metadata().map_err(CredFileError::Open)?;
    check(&meta, rule)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(CredFileError::Open)?;
    Ok(bytes)
}

/// `read` as text (UTF-8).
pub fn read_text(path: &Path, rule: Rule) -> Result<String, CredFileError> {
    String::from_utf8(read(path, rule)?).map_err(|_| {
        CredFileError::Open(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not UTF-8 text",
        ))
    })
}

fn check(meta: &std::fs::Metadata, rule: Rule) -> Result<(), CredFileError> {
    if !meta.is_file() {
        return Err(CredFileError::NotRegular);
    }
    let mode = meta.mode() & 0o7777;
    match rule {
        Rule::Password if mode & 0o077 != 0 => Err(CredFileError::PasswordMode { mode }),
        Rule::Password => Ok(()),
        Rule::Key => {
            let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
            if mode & 0o777 & !allowed != 0 {
                Err(CredFileError::KeyMode { mode })
            } else {
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(mode: u32) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "s3cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, p)
    }

    #[test]
    fn a_password_file_with_group_or_other_bits_is_refused_naming_its_mode() {
        for mode in [0o644, 0o640, 0o604, 0o610] {
            let (_d, p) = file(mode);
            let e = read(&p, Rule::Password).unwrap_err().to_string();
            assert!(e.contains(&format!("{mode:04o}")), "{e}");
        }
        for mode in [0o600, 0o400] {
            let (_d, p) = file(mode);
            assert_eq!(read(&p, Rule::Password).unwrap(), b"s3cret\n");
        }
    }

    #[test]
    fn a_key_may_be_0640_only_when_owned_by_root() {
        let root = unsafe { libc::geteuid() } == 0;
        let (_d, p) = file(0o640);
        assert_eq!(
            read(&p, Rule::Key).is_ok(),
            root,
            "0640 owned by the test's user"
        );
        if root {
            // Not root-owned: 0600 at most.
            std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
            assert!(matches!(
                read(&p, Rule::Key),
                Err(CredFileError::KeyMode { mode: 0o640 })
            ));
        }
        for mode in [0o644, 0o660, 0o604] {
            let (_d, p) = file(mode);
            assert!(read(&p, Rule::Key).is_err(), "{mode:o}");
        }
        let (_d, p) = file(0o600);
        assert!(read(&p, Rule::Key).is_ok());
    }

    #[test]
    fn a_directory_is_not_a_secret_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            read(dir.path(), Rule::Password),
            Err(CredFileError::NotRegular)
        ));
    }
}
