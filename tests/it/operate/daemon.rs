//! The real binary started the way systemd starts it, for the notify tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::helpers::replica::{binary, http_get};
use crate::helpers::{poll_until, wait_until};

/// The real binary started the way systemd starts it: `WATCHDOG_PID` must be the daemon's own
/// pid, which `ReplicaProc` cannot know in advance, so a shell sets it and `exec`s the daemon
/// (same pid).
pub struct Daemon {
    child: Option<Child>,
    http: SocketAddr,
    log_path: PathBuf,
}

pub fn write_config(dir: &Path, id: &str, dsn: &str, http: SocketAddr) -> PathBuf {
    let path = dir.join(format!("{id}.toml"));
    std::fs::write(
        &path,
        format!(
            "[replica]\nid = \"{id}\"\n\n[database]\ndsn = \"{dsn}\"\n\n[scheduler]\n\
             lease = \"5s\"\ncadence = \"1s\"\nadmit_timeout = \"2s\"\n\n[http]\nbind = \"{http}\"\n\n\
             [log]\nformat = \"json\"\nlevel = \"debug\"\n"
        ),
    )
    .unwrap();
    path
}

impl Daemon {
    /// `notify`: the fake notify socket and the WATCHDOG_USEC to announce; None: not under
    /// systemd (no NOTIFY_SOCKET, no watchdog).
    pub fn spawn(
        config: &Path,
        log_path: &Path,
        http: SocketAddr,
        notify: Option<(&Path, u64)>,
    ) -> Daemon {
        let log = std::fs::File::create(log_path).unwrap();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("WATCHDOG_PID=$$; export WATCHDOG_PID; exec \"$0\" \"$@\"")
            .arg(binary())
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC");
        if let Some((path, usec)) = notify {
            cmd.env("NOTIFY_SOCKET", path)
                .env("WATCHDOG_USEC", usec.to_string());
        }
        Daemon {
            child: Some(cmd.spawn().expect("spawn qlsched")),
            http,
            log_path: log_path.to_path_buf(),
        }
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http, path)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    pub async fn wait_ready(&mut self, within: Duration) {
        let child = self.child.as_mut().unwrap();
        let http = self.http;
        let log = self.log_path.clone();
        wait_until("the daemon answers /readyz 200", within, || {
            let exited = child.try_wait().unwrap();
            assert!(
                exited.is_none(),
                "exited with {exited:?} before it was ready; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            let ready = matches!(http_get(http, "/readyz"), Some((200, _)));
            async move { ready }
        })
        .await;
    }

    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let child = self.child.as_mut().unwrap();
        let status = poll_until("the daemon exits", within, || {
            let s = child.try_wait().unwrap();
            async move { s }
        })
        .await;
        self.child = None;
        status
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
