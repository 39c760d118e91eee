//! A network namespace of the test's own, joined to the host by a veth pair, for drills that
//! cut a replica off at the kernel (link down: packets are dropped, nothing is reset, TCP
//! retransmits until its user timeout) instead of at a userspace proxy.
//!
//! Addresses: `10.213.<n>.1/30` on the host end, `.2` inside the namespace; `n` is derived
//! from the process id, so concurrent test binaries do not collide. Nothing is routed
//! anywhere else. Needs root (`ip netns add`); removed on drop.

use std::net::Ipv4Addr;
use std::process::Command;

pub struct NetNs {
    pub name: String,
    /// The host end of the veth pair (taken down to cut the namespace off).
    pub host_if: String,
    pub host_ip: Ipv4Addr,
    pub ns_ip: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run `ip {}`: {e} (Debian package iproute2)", args.join(" ")));
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fails with what to do when the drill cannot make namespaces.
pub fn require_root(drill: &str) {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "drill {drill} needs root: it creates a network namespace and a veth pair \
         (`ip netns add`, `ip link add … type veth`); run it as root (CI does)"
    );
}

impl NetNs {
    /// Creates namespace `qlsched-<tag>-<pid>` and the veth pair, both ends up.
    pub fn create(tag: &str) -> NetNs {
        let pid = std::process::id();
        let n = (pid % 250) as u8 + 1;
        let name = format!("qlsched-{tag}-{pid}");
        let host_if = format!("qh{tag}{}", pid % 100_000);
        let ns_if = format!("qn{tag}{}", pid % 100_000);
        let host_ip = Ipv4Addr::new(10, 213, n, 1);
        let ns_ip = Ipv4Addr::new(10, 213, n, 2);
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let _ = Command::new("ip").args(["link", "del", &host_if]).output();
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ]);
        ip(&["link", "set", &ns_if, "netns", &name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        let in_ns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &name, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        in_ns(&["addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if]);
        in_ns(&["link", "set", &ns_if, "up"]);
        in_ns(&["link", "set", "lo", "up"]);
        NetNs {
            name,
            host_if,
            host_ip,
            ns_ip,
        }
    }

    /// Takes the host end down: the namespace keeps its address and route, its packets are
    /// dropped, no one is told.
    pub fn cut(&self) {
        ip(&["link", "set", &self.host_if, "down"]);
    }

    pub fn heal(&self) {
        ip(&["link", "set", &self.host_if, "up"]);
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn exec_prefix(&self) -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.name.clone(),
        ]
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
