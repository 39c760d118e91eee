//! Records the git commit the binary is built from (`qlsched --version`).
//!
//! `QLSCHED_GIT_COMMIT` in the build environment wins (a build from a source tarball can
//! name its commit); otherwise `git rev-parse` in the source tree; outside a git checkout
//! (or without git) the commit is "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=QLSCHED_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    // The migrations are embedded (refinery): a new file must rebuild the crate.
    println!("cargo:rerun-if-changed=migrations");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let commit = match std::env::var("QLSCHED_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git(&dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into()),
    };
    if commit != "unknown" {
        // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it points to (a
        // commit), and packed-refs (a gc). In a worktree these live in different places,
        // which `git rev-parse --git-path` resolves.
        let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
        if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            watched.push(branch);
        }
        for name in watched {
            if let Some(path) = git(&dir, &["rev-parse", "--git-path", &name]) {
                let path = Path::new(&dir).join(path);
                if path.exists() {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
        }
    }
    println!("cargo:rustc-env=QLSCHED_GIT_COMMIT={commit}");
}

/// The trimmed stdout of a successful git command run in `dir`; None on any failure.
fn git(dir: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}
