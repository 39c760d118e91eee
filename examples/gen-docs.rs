//! Writes the man pages and shell completions of `qlsched`, generated from its clap
//! definitions so they cannot drift from the binary (`scripts/package.sh` runs this before
//! `cargo deb`):
//!
//! ```text
//! cargo run --example gen-docs -- OUT_DIR
//!   OUT_DIR/man/qlsched.1               the command and its list of subcommands
//!   OUT_DIR/man/qlsched-<command>.1     one page per subcommand group (`qlsched-db.1` covers
//!                                       db bootstrap, db migrate and db check)
//!   OUT_DIR/completions/qlsched.bash, _qlsched, qlsched.fish
//! ```

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;

const BIN: &str = "qlsched";

/// Where the Debian package puts things: the one part of the pages that is not about the
/// command line.
const INSTALLATION: &str = r#".SH FILES
.TP
\fI/etc/qlsched/NAME.toml\fR
the replica file of the unit instance \fBqlsched@NAME\fR (an example:
\fI/etc/qlsched/replica.toml.example\fR)
.TP
\fI/etc/qlsched/NAME.password\fR
its database password, handed to the instance as a systemd credential
.TP
\fI/lib/systemd/system/qlsched@.service\fR
the template unit
.TP
\fI/usr/share/qlsched/\fR
Prometheus alert rules and a Grafana dashboard
.SH "SEE ALSO"
\fBsystemctl\fR(1), \fI/usr/share/doc/qlsched/operations.md\fR
"#;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        eprintln!("usage: gen-docs OUT_DIR");
        return ExitCode::from(2);
    };
    match generate(Path::new(&out)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gen-docs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn generate(out: &Path) -> io::Result<Vec<PathBuf>> {
    let mut cmd = qlsched::cli::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();

    let man_dir = out.join("man");
    fs::create_dir_all(&man_dir)?;
    written.push(write(&man_dir.join(format!("{BIN}.1")), |w| {
        page(&cmd).render(w)?;
        w.write_all(INSTALLATION.as_bytes())
    })?);
    for group in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
        let page = man_dir.join(format!("{BIN}-{}.1", group.get_name()));
        written.push(write(&page, |w| group_page(group, w))?);
    }

    let completions = out.join("completions");
    fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = qlsched::cli::Cli::command();
        written.push(clap_complete::generate_to(
            shell,
            &mut cmd,
            BIN,
            &completions,
        )?);
    }
    Ok(written)
}

/// One page for a top-level subcommand: its own synopsis, description and options, then a
/// section per member command (`DB BOOTSTRAP`: what it does, its synopsis, its options).
fn group_page(group: &clap::Command, w: &mut dyn io::Write) -> io::Result<()> {
    let man = page(group);
    let members: Vec<&clap::Command> = group
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .collect();
    if members.is_empty() {
        return man.render(w);
    }
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if group.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    for member in members {
        let heading = format!("{} {}", group.get_name(), member.get_name()).to_uppercase();
        writeln!(w, ".SH \"{heading}\"")?;
        let sub = page(member);
        w.write_all(&fragment(
            |b| sub.render_description_section(b),
            Heading::Drop,
        )?)?;
        writeln!(w, ".SS Synopsis")?;
        w.write_all(&fragment(
            |b| sub.render_synopsis_section(b),
            Heading::Drop,
        )?)?;
        if member.get_arguments().any(|a| !a.is_hide_set()) {
            w.write_all(&fragment(
                |b| sub.render_options_section(b),
                Heading::Demote,
            )?)?;
        }
    }
    Ok(())
}

fn page(cmd: &clap::Command) -> Man {
    Man::new(cmd.clone())
        .source(format!("{BIN} {}", env!("CARGO_PKG_VERSION")))
        .manual("qlsched manual")
}

/// What to do with the `.SH` headings of a section rendered for use inside another section.
enum Heading {
    Drop,
    /// `.SH OPTIONS` becomes `.SS "Options"`.
    Demote,
}

/// A rendered section, without the string definitions every rendering repeats at its top
/// (the page's title rendering has them already), its `.SH` lines dropped or demoted.
fn fragment(
    render: impl FnOnce(&mut Vec<u8>) -> io::Result<()>,
    headings: Heading,
) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    render(&mut buf)?;
    let text = String::from_utf8(buf).map_err(io::Error::other)?;
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with(r".ie \n(.g .ds Aq") || line.starts_with(".el .ds Aq") {
            continue;
        }
        match (line.strip_prefix(".SH "), &headings) {
            (Some(_), Heading::Drop) => {}
            (Some(heading), Heading::Demote) => {
                let title = heading.trim_matches('"').to_lowercase();
                let title = match title.get(..1) {
                    Some(first) => format!("{}{}", first.to_uppercase(), &title[1..]),
                    None => title,
                };
                out.push_str(&format!(".SS \"{title}\"\n"));
            }
            (None, _) => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(out.into_bytes())
}

fn write(
    path: &Path,
    render: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let mut buf = Vec::new();
    render(&mut buf)?;
    fs::write(path, buf)?;
    Ok(path.to_path_buf())
}
