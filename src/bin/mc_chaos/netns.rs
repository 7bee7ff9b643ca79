//! A network namespace with a veth pair to the host, for partitioning one process: the
//! host end gets `10.77.N.1/24`, the namespace end `10.77.N.2/24` (the first `N` in 1..=250
//! whose subnet no host interface uses). A process started through [`Namespace::wrap`]
//! (`nsenter --net`, which execs the program: its pid is the process's own, so signals reach
//! it) sees only the namespace's network; it shares the host's mounts (`ip netns exec` would
//! give it a copy of them, which would keep a loop-mounted SSD tier of `disk_devices` alive
//! after the host unmounts it); [`Namespace::partition`] sets the namespace end down (new
//! connections either way fail with `ENETUNREACH`, packets of open ones are dropped) and up
//! again.
//!
//! Needs root, the `ip` tool and `nsenter`; [`Namespace::create`] says why when it cannot be had, and
//! the soak then skips the partition fault (printing that reason). Owned by the fault driver
//! (single thread); dropping it deletes the namespace, which removes both veth ends.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A created namespace and its veth pair.
pub struct Namespace {
    name: String,
    inner_dev: String,
    /// The host end's address (what processes in the namespace dial to reach the host).
    pub host_ip: String,
    /// The namespace end's address (what the host dials to reach the namespace).
    pub inner_ip: String,
}

/// Runs `ip ARGS`; the error names the command and its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The first `10.77.N.0/24` no interface of the host uses.
fn free_subnet() -> Result<u8, String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map_err(|e| format!("ip addr show: {e}"))?;
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    (1..=250u8)
        .find(|n| !used.contains(&format!("10.77.{n}.")))
        .ok_or_else(|| "every 10.77.N.0/24 is in use".to_string())
}

impl Namespace {
    /// Creates namespace `mcchaos-<pid>` with its veth pair, both ends up. Errors: why not
    /// (not root, no `ip`, the kernel refused); whatever was made is removed again.
    pub fn create() -> Result<Namespace, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (network namespaces need CAP_NET_ADMIN)".into());
        }
        let pid = std::process::id();
        let subnet = free_subnet()?;
        let name = format!("mcchaos-{pid}");
        let host_dev = format!("mcv{pid}h");
        let inner_dev = format!("mcv{pid}n");
        ip(&["netns", "add", &name])?;
        let ns = Namespace {
            name,
            inner_dev,
            host_ip: format!("10.77.{subnet}.1"),
            inner_ip: format!("10.77.{subnet}.2"),
        };
        let (host_cidr, inner_cidr) = (format!("{}/24", ns.host_ip), format!("{}/24", ns.inner_ip));
        ip(&[
            "link",
            "add",
            &host_dev,
            "type",
            "veth",
            "peer",
            "name",
            &ns.inner_dev,
        ])?;
        ip(&["link", "set", &ns.inner_dev, "netns", &ns.name])?;
        ip(&["addr", "add", &host_cidr, "dev", &host_dev])?;
        ip(&["link", "set", &host_dev, "up"])?;
        ns.exec_ip(&["addr", "add", &inner_cidr, "dev", &ns.inner_dev])?;
        ns.exec_ip(&["link", "set", "lo", "up"])?;
        ns.partition(false)?;
        Ok(ns)
    }

    fn exec_ip(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// `program args` run inside the namespace: the program and arguments to spawn.
    pub fn wrap(&self, program: PathBuf, args: Vec<String>) -> (PathBuf, Vec<String>) {
        let mut all = vec![
            format!("--net=/run/netns/{}", self.name),
            "--".into(),
            program.display().to_string(),
        ];
        all.extend(args);
        (PathBuf::from("nsenter"), all)
    }

    /// Cuts (`true`) or restores (`false`) the namespace's link to the host.
    pub fn partition(&self, cut: bool) -> Result<(), String> {
        let state = if cut { "down" } else { "up" };
        self.exec_ip(&["link", "set", &self.inner_dev, state])
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(err) = ip(&["netns", "del", &self.name]) {
            eprintln!("mc_chaos: {err}");
        }
    }
}
