//! The supervisor of one shell command (docs/worker.md, "shell"): the worker does not start a
//! command itself but this small process, the same binary run as `qlsched
//! __qlsched-supervise -- ARGV…` (before any of the command line is parsed), which starts the
//! command and outlives the worker if it must:
//!
//! - it is the **subreaper** of everything the command starts (`PR_SET_CHILD_SUBREAPER`): a
//!   process whose parent ended becomes its child, not init's, so the whole tree stays in
//!   reach, double forks and `setsid` included;
//! - its standard input is a pipe from the worker: `T` asks it to send SIGTERM to the
//!   command's process group, `K` to SIGKILL the whole tree; the end of the pipe (the worker
//!   died, even by SIGKILL, or dropped the attempt) SIGKILLs the whole tree at once;
//! - when the command's first process ends, whatever it left running is SIGKILLed, and the
//!   supervisor ends the way the command did (its exit status, or the same signal), so the
//!   worker reads the command's own status;
//! - SIGTERM, SIGINT or SIGHUP sent to the supervisor itself are passed to the command's group.
//!
//! The command runs in a process group of its own, with `/dev/null` as standard input and the
//! supervisor's standard output and error (the worker's pipes) and environment (the cleared
//! one the worker gave it). Its first process is SIGKILLed if the supervisor dies (its
//! parent-death signal). The supervisor calls nothing but system calls, and reads `/proc` to
//! find every descendant.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

/// `argv[1]` of the supervisor.
pub const ARG: &str = "__qlsched-supervise";

/// What the worker writes to a supervisor's standard input.
pub const TERM: u8 = b'T';
pub const KILL: u8 = b'K';

/// Runs as the supervisor and exits when `argv[1]` is [`ARG`]; returns otherwise. Called
/// first thing in `main`.
pub fn main_if_asked() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(ARG)) {
        return;
    }
    let argv: Vec<OsString> = args.skip_while(|a| a != "--").skip(1).collect();
    std::process::exit(supervise(argv));
}

/// Exit status of a supervisor that could not start its command (as a shell's).
const NOT_STARTED: i32 = 127;

fn supervise(argv: Vec<OsString>) -> i32 {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("qlsched supervisor: no command");
        return NOT_STARTED;
    };
    // SAFETY: plain system calls on this single-threaded process.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("qlsched supervisor: signalfd: {e}");
            return NOT_STARTED;
        }
    };
    let me = std::process::id() as libc::pid_t;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .process_group(0)
        .stdin(std::process::Stdio::null());
    // SAFETY: between fork and exec only prctl and getppid (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != me {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("could not start {}: {e}", program.to_string_lossy());
            return NOT_STARTED;
        }
    };
    let pid = child.id() as libc::pid_t;
    // The std handle is never waited on: every child is reaped below with waitpid.
    std::mem::forget(child);
    let mut tree = Tree {
        pid,
        me,
        status: None,
    };
    let status = watch(&mut tree, &signals);
    tree.kill();
    mirror(status)
}

/// The command's first process, this supervisor, and the command's wait status once reaped.
struct Tree {
    pid: libc::pid_t,
    me: libc::pid_t,
    status: Option<libc::c_int>,
}

impl Tree {
    /// Reaps every ended child, keeping the command's status; whether any child is left.
    fn reap(&mut self) -> bool {
        loop {
            let mut status = 0;
            // SAFETY: waitpid on any child of this process, without blocking.
            let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if r == 0 {
                return true;
            }
            if r < 0 {
                // ECHILD: no child at all (EINTR cannot happen: SIGCHLD is blocked).
                return false;
            }
            if r == self.pid {
                self.status = Some(status);
            }
        }
    }

    /// SIGKILLs the command's group and every descendant of this process until none is left.
    /// With no child left there is no descendant either (an orphan becomes this subreaper's
    /// child): the common end, a command that left nothing running, costs no `/proc` scan.
    fn kill(&mut self) {
        for _ in 0..1000 {
            if !self.reap() {
                return;
            }
            signal(-self.pid, libc::SIGKILL);
            for d in descendants(self.me) {
                signal(d, libc::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// SIGCHLD and the stop signals, blocked and read from a signalfd.
struct Signals {
    fd: libc::c_int,
}

impl Signals {
    fn block() -> std::io::Result<Signals> {
        // SAFETY: sigset manipulation and signalfd on this process; no memory shared.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Signals { fd })
        }
    }

    /// The next pending signal's number, if any.
    fn read(&self) -> Option<i32> {
        // SAFETY: reads one siginfo into a zeroed struct of the right size.
        unsafe {
            let mut info: libc::signalfd_siginfo = std::mem::zeroed();
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            let n = libc::read(self.fd, &mut info as *mut _ as *mut libc::c_void, size);
            (n == size as isize).then_some(info.ssi_signo as i32)
        }
    }
}

/// Until the command's first process ends: passes the worker's requests and the stop signals
/// on, SIGKILLs the tree when the worker is gone; returns the command's wait status.
fn watch(tree: &mut Tree, signals: &Signals) -> libc::c_int {
    let pid = tree.pid;
    let mut worker_gone = false;
    loop {
        tree.reap();
        if let Some(status) = tree.status {
            return status;
        }
        let mut fds = [
            libc::pollfd {
                fd: signals.fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative fd is skipped by poll: the worker is gone, nothing to read.
                fd: if worker_gone { -1 } else { 0 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on two valid pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            continue;
        }
        if fds[0].revents != 0 {
            while let Some(sig) = signals.read() {
                if sig != libc::SIGCHLD {
                    signal(-pid, libc::SIGTERM);
                }
            }
        }
        if fds[1].revents != 0 {
            let mut buf = [0u8; 64];
            // SAFETY: reads into a local buffer.
            let got = unsafe { libc::read(0, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
            if got <= 0 {
                // The worker is gone (or dropped the attempt): nothing may run on.
                worker_gone = true;
                tree.kill();
                continue;
            }
            for b in &buf[..got as usize] {
                match *b {
                    TERM => signal(-pid, libc::SIGTERM),
                    KILL => tree.kill(),
                    _ => {}
                }
            }
        }
    }
}

/// Every process whose chain of parents leads to `root`, from `/proc`.
fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // "pid (comm) state ppid …": comm may hold anything, so read after its last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

fn signal(pid: libc::pid_t, sig: libc::c_int) {
    if pid != 0 && pid != -1 {
        // SAFETY: kill(2); no memory involved.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Ends this process the way the command ended: its exit status, or its signal.
fn mirror(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        return libc::WEXITSTATUS(status);
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: resets the signal's action, unblocks it and raises it on this process, with
        // core dumps off (the command's core, if any, is the command's).
        unsafe {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        return 128 + sig;
    }
    NOT_STARTED
}
