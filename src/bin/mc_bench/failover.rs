//! `--failover`: how long clients of an HA group wait when its leader dies.
//!
//! A real etcd (Debian's `etcd`, on loopback ports), two `mooncake_master`s with journals
//! (`--enable_ha`, the default 5 s lease), a `mooncake_client` owning a 256 MB segment and two
//! in-process clients following `etcd://`. Each round SIGKILLs the leader and measures, from
//! the kill, the first successful get of a committed key on **every** client (the slower of
//! the two), against the moment etcd dropped the dead leader's key (the floor: nobody may
//! lead before); then the killed master is started again as a standby. Prints p50/p99 over
//! the rounds (10; 3 with `--quick`).
//!
//! Before the kills, the HA group's cost: put + get (and put + get + remove) ops/s of 8 RPC
//! clients against
//! the leader (journal, lease fence, the standby copying the journal), against a plain
//! `mooncake_master` process (no journal, no HA) under the same load, interleaved rounds
//! (`journal.rs`'s load).

use crate::children::{free_port, master_process, sibling, wait_for, Process};
use crate::limits::percentile;
use crate::report::Report;
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::ha::etcd::Etcd;
use mooncake_rs::ha::member::view_key;
use mooncake_rs::master::{MasterApi, RemoteMaster, RpcMasterClient};
use mooncake_rs::rpc::Timeouts;
use mooncake_rs::types::{ReplicateConfig, Uuid};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait for anything in a round.
const ROUND_LIMIT: Duration = Duration::from_secs(30);

/// The group's processes and directories.
struct Group {
    scratch: PathBuf,
    etcd_port: u16,
    _etcd: Process,
    masters: Vec<(u16, Option<Process>)>,
}

impl Group {
    fn start() -> Result<Group, String> {
        let unique = format!(
            "mc-bench-failover-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        );
        let scratch = std::env::temp_dir().join(unique);
        let (etcd_port, peer_port) = (free_port()?, free_port()?);
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let etcd = Command::new("etcd")
            .arg(format!("--data-dir={}", scratch.join("etcd").display()))
            .arg(format!("--listen-client-urls={}", url(etcd_port)))
            .arg(format!("--advertise-client-urls={}", url(etcd_port)))
            .arg(format!("--listen-peer-urls={}", url(peer_port)))
            .arg(format!("--initial-advertise-peer-urls={}", url(peer_port)))
            .arg(format!("--initial-cluster=default={}", url(peer_port)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start etcd (Debian package etcd-server): {e}"))?;
        let mut group = Group {
            scratch,
            etcd_port,
            _etcd: Process(etcd),
            masters: Vec::new(),
        };
        let endpoint = [format!("127.0.0.1:{etcd_port}")];
        if !wait_for(ROUND_LIMIT, || {
            Etcd::connect(&endpoint, Duration::from_secs(1)).is_ok()
        }) {
            return Err("etcd did not start".into());
        }
        for _ in 0..2 {
            let port = free_port()?;
            group.masters.push((port, None));
        }
        for index in 0..2 {
            group.start_master(index)?;
        }
        Ok(group)
    }

    fn start_master(&mut self, index: usize) -> Result<(), String> {
        let (port, _) = self.masters[index];
        let journal = self.scratch.join(format!("journal-{index}"));
        let child = master_process(
            port,
            &[
                "--enable_ha".into(),
                format!("--etcd_endpoints=127.0.0.1:{}", self.etcd_port),
                format!("--journal_dir={}", journal.display()),
            ],
        )?;
        self.masters[index].1 = Some(child);
        Ok(())
    }

    fn addr(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.etcd_port)
    }

    /// The index of the master whose address the view names.
    fn leader(&self, etcd: &Etcd) -> Option<usize> {
        let view = etcd.get(&view_key("mooncake_cluster")).ok()??;
        let port: u16 = view.value.rsplit(':').next()?.parse().ok()?;
        self.masters.iter().position(|(p, _)| *p == port)
    }
}

/// A segment descriptor mounted on the master at `addr` by a client that pings it every
/// 500 ms until dropped (the throughput load's puts are placed there; no bytes move).
struct MountedOwner {
    stop: Arc<AtomicBool>,
    pinger: Option<std::thread::JoinHandle<()>>,
}

impl MountedOwner {
    fn mount(addr: &str) -> Result<MountedOwner, String> {
        let timeouts = Timeouts {
            connect: Duration::from_secs(3),
            request: Duration::from_secs(10),
        };
        let master = RpcMasterClient::with_timeouts(addr, timeouts)
            .map(RemoteMaster)
            .map_err(|e| format!("connect: {e}"))?;
        let owner = Uuid::random();
        master
            .mount_segment(owner, crate::load::segment("bench-owner"))
            .map_err(|e| format!("mount: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let pinger = std::thread::spawn(move || {
            while !flag.load(Ordering::Acquire) {
                let _ = master.ping(owner);
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Ok(MountedOwner {
            stop,
            pinger: Some(pinger),
        })
    }
}

impl Drop for MountedOwner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(pinger) = self.pinger.take() {
            let _ = pinger.join();
        }
    }
}

/// Ops/s against the group's leader against a plain master, interleaved (see the module doc).
fn throughput(report: &mut Report, quick: bool, group: &Group, etcd: &Etcd) -> Result<(), String> {
    let leader = group.leader(etcd).ok_or("no leader")?;
    let leader_addr = format!("127.0.0.1:{}", group.masters[leader].0);
    let plain_port = free_port()?;
    let _plain = master_process(plain_port, &[])?;
    let plain_addr = format!("127.0.0.1:{plain_port}");
    let _owners = [
        MountedOwner::mount(&leader_addr)?,
        MountedOwner::mount(&plain_addr)?,
    ];
    crate::journal::compare(
        report,
        quick,
        ("HA leader (journal, standby copying)", &leader_addr),
        ("plain master", &plain_addr),
    )
}

impl Drop for Group {
    fn drop(&mut self) {
        self.masters.clear();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

fn client(addr: &str) -> Result<Client, String> {
    Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: "P2PHANDSHAKE".into(),
        global_segment_size: 0,
        local_buffer_size: 0,
        master_server_addr: addr.into(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("client setup: {e}"))
}

fn peer(addr: &str, scratch: &Path) -> Result<Process, String> {
    let child = Command::new(sibling("mooncake_client")?)
        .arg(format!("--master_server_address={addr}"))
        .arg("--host=127.0.0.1")
        .arg("--port=0")
        .arg("--global_segment_size=256 MB")
        .arg("--local_buffer_size=0")
        .env("MC_SAME_HOST", "0")
        .current_dir(scratch)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start mooncake_client: {e}"))?;
    Ok(Process(child))
}

/// Members of the group's in-sync list (see `ha::member`).
fn in_sync_members(etcd: &Etcd) -> usize {
    let list = etcd
        .get("mooncake-store/mooncake_cluster/in_sync")
        .ok()
        .flatten();
    let value = list.map(|v| v.value).unwrap_or_default();
    let parsed: serde_json::Value = serde_json::from_str(&value).unwrap_or_default();
    parsed["members"].as_array().map_or(0, Vec::len)
}

/// Runs the failover rounds and prints their lines.
pub fn run(report: &mut Report, quick: bool) -> Result<(), String> {
    let mut group = Group::start()?;
    let etcd = Etcd::connect(
        &[format!("127.0.0.1:{}", group.etcd_port)],
        Duration::from_secs(1),
    )
    .map_err(|e| format!("etcd: {e}"))?;
    if !wait_for(ROUND_LIMIT, || group.leader(&etcd).is_some()) {
        return Err("no leader elected".into());
    }
    if !wait_for(ROUND_LIMIT, || in_sync_members(&etcd) == 2) {
        return Err("the standby never got in sync".into());
    }
    throughput(report, quick, &group, &etcd)?;
    std::fs::create_dir_all(&group.scratch).map_err(|e| e.to_string())?;
    let _peer = peer(&group.addr(), &group.scratch)?;
    let clients = [client(&group.addr())?, client(&group.addr())?];
    let value = vec![7u8; 4096];
    let put = wait_for(ROUND_LIMIT, || {
        clients[0]
            .put_from("committed", &value, &ReplicateConfig::default())
            .is_ok()
    });
    if !put {
        return Err("the first put never succeeded".into());
    }
    std::thread::sleep(Duration::from_millis(500));
    let rounds = if quick { 3 } else { 10 };
    let (mut recovered, mut expired) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        // Both masters in the in-sync list: the standby copied the journal and may take over.
        if !wait_for(ROUND_LIMIT, || in_sync_members(&etcd) == 2) {
            return Err("the standby never got in sync".into());
        }
        let leader = group.leader(&etcd).ok_or("no leader")?;
        let killed = Instant::now();
        group.masters[leader].1 = None; // SIGKILL
        let mut key_gone = None;
        let mut done = [None, None];
        let finished = wait_for(ROUND_LIMIT, || {
            if key_gone.is_none() && group.leader(&etcd) != Some(leader) {
                key_gone = Some(killed.elapsed());
            }
            for (slot, client) in done.iter_mut().zip(&clients) {
                let mut buf = vec![0u8; 4096];
                if slot.is_none() && client.get_into("committed", &mut buf) == Ok(4096) {
                    *slot = Some(killed.elapsed());
                }
            }
            done.iter().all(Option::is_some)
        });
        if !finished {
            return Err(format!(
                "the clients did not recover within {ROUND_LIMIT:?}"
            ));
        }
        let slowest = done.iter().flatten().max().copied().unwrap_or_default();
        recovered.push(slowest.as_secs_f64());
        expired.push(key_gone.unwrap_or(slowest).as_secs_f64());
        group.start_master(leader)?;
    }
    let name = format!("failover: get on every client p50 ({rounds} kills, 5 s lease)");
    let (r50, e50) = (
        percentile(&mut recovered.clone(), 0.5),
        percentile(&mut expired.clone(), 0.5),
    );
    report.line(&name, r50, "s", "leader's key gone in etcd p50", e50);
    let name = format!("failover: get on every client p99 ({rounds} kills)");
    let (r99, e99) = (
        percentile(&mut recovered, 0.99),
        percentile(&mut expired, 0.99),
    );
    report.line(&name, r99, "s", "leader's key gone in etcd p99", e99);
    Ok(())
}
