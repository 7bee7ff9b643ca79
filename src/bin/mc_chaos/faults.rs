//! The run: starts the cluster, drives faults at seeded random times until the end, then
//! runs the checker and the end-of-run accounting checks and prints the report.

use crate::checker::{self, FaultWindow, Tagged, Timeouts};
use crate::cluster::{free_port, http_get, metric, sibling, wait_until, Proc};
use crate::disk_devices::LoopTiers;
use crate::ha_cell::HaCell;
use crate::journal::{self, now_ns};
use crate::netns::Namespace;
use crate::peer_front::{Directory, PROXIED_OWNER};
use crate::proxy::{Mode, Proxy};
use crate::{report, Settings};
use mooncake_rs::client::{Client, SetupConfig};
use std::time::Duration;

/// How long the fault proxies' delay mode holds every chunk.
pub(crate) const DELAY: Duration = Duration::from_millis(200);

/// Every fault kind, in report order.
pub const KINDS: &[&str] = &[
    "kill_worker",
    "stop_worker",
    "kill_owner",
    "stop_owner",
    "kill_master",
    "stop_master",
    "proxy_delay",
    "proxy_trickle",
    "proxy_reset",
    "peer_delay",
    "peer_trickle",
    "peer_reset",
    "kill_p2p_owner",
    "stop_p2p_owner",
    "kill_p2p_master",
    "partition",
    "kill_dummy",
    "stop_dummy",
    "kill_real_client",
    "stop_real_client",
    "kill_leader",
    "stop_leader",
    "kill_etcd",
    "partition_leader",
    "corrupt_record",
    "truncate_record",
    "delete_record",
    "disk_full",
    "disk_slow",
    "disk_eio",
    "intruder",
];

/// The kinds drawn only in a keyed run (`--cluster-key`).
pub const KEYED_KINDS: &[&str] = &["intruder"];

/// The kinds that act on the HA cell (not drawn in a run without it).
const HA_KINDS: &[&str] = &[
    "kill_leader",
    "stop_leader",
    "kill_etcd",
    "partition_leader",
];

/// The kinds that act on dummies or their real client (not drawn in a run without dummies).
const DUMMY_KINDS: &[&str] = &[
    "kill_dummy",
    "stop_dummy",
    "kill_real_client",
    "stop_real_client",
];

/// The client timeouts of [`CLIENT_ENV`], for the checker's call limits.
pub const TIMEOUTS: Timeouts = Timeouts {
    rpc_ms: 5000,
    connect_ms: 1000,
    transfer_ms: 5000,
};

/// Client-side timeouts given to every worker and owner, so a call's limit is known (the
/// same numbers as [`TIMEOUTS`]).
const CLIENT_ENV: &[(&str, &str)] = &[
    ("MC_RPC_TIMEOUT_MS", "5000"),
    ("MC_RPC_CONNECT_TIMEOUT_MS", "1000"),
    ("MC_TRANSFER_TIMEOUT_MS", "5000"),
    // Dummies and their real client: a SIGSTOP of either (up to 3 s) outlasts the TTL, so
    // abandoned calls and dropped dummies happen in the soak.
    ("MC_DUMMY_TTL_MS", "2000"),
    ("MC_LOG", "error"),
];

/// What differs between the worker processes of a run.
struct WorkerLaunch {
    master: String,
    key_space: &'static str,
    number: usize,
    incarnation: u64,
    journal: std::path::PathBuf,
    metadata: String,
}

struct Cluster {
    master: Proc,
    owners: Vec<Proc>,
    /// The workers (`worker-N`), then the dummies (`dummy-N`, workers whose client is a
    /// dummy of owner [`Cluster::real_client`]); `incarnations` has one entry each.
    workers: Vec<Proc>,
    incarnations: Vec<u64>,
    proxy: Proxy,
    /// In front of owner [`PROXIED_OWNER`]'s data port.
    peer_proxy: Proxy,
    directory: Directory,
    /// The owner that serves the dummies (the last one: the first is behind the data proxy
    /// and maps no segment for same-host peers) and its segment name.
    real_client: usize,
    real_client_name: String,
    master_port: u16,
    metrics_port: u16,
    /// The owners' data ports (their segment names are `127.0.0.1:<port>`).
    owner_ports: Vec<u16>,
    /// The P2P cluster: its master (`--deployment_mode P2P`) and owners; owner
    /// [`PARTITIONED_OWNER`] runs in [`Cluster::netns`] when there is one.
    p2p_master: Proc,
    p2p_owners: Vec<Proc>,
    /// `host:port` of the P2P master, as workers and owners on the host dial it.
    p2p_master_addr: String,
    /// The P2P master's `/metrics` port (on 127.0.0.1).
    p2p_metrics_port: u16,
    /// The host address of the P2P cluster (the veth's host end, else 127.0.0.1).
    p2p_host: String,
    /// The HA cell (`--ha-workers` > 0).
    ha: Option<HaCell>,
    /// The owners' tiers on loop devices (`disk_full`, `disk_slow`, `disk_eio`); `Err` says why not
    /// (then, or without tiers, the tiers are plain directories).
    disks: Result<LoopTiers, String>,
    /// Dropped last: the processes inside are gone by then.
    netns: Result<Namespace, String>,
}

/// Owners of the P2P cluster; the first one is the partitioned one.
const P2P_OWNERS: usize = 2;
/// The P2P owner that runs in the network namespace.
const PARTITIONED_OWNER: usize = 0;

fn env() -> Vec<(String, String)> {
    CLIENT_ENV
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Cluster {
    fn worker_args(&self, settings: &Settings, index: usize, deadline_ns: u64) -> Vec<String> {
        let port = if index % 2 == 1 {
            self.proxy.port
        } else {
            self.master_port
        };
        let incarnation = self.incarnations[index];
        let journal = settings.dir.join(format!(
            "{}-{incarnation}.log",
            worker_label(settings, index)
        ));
        let worker = WorkerLaunch {
            master: format!("127.0.0.1:{port}"),
            key_space: "k",
            number: index + 1,
            incarnation,
            journal,
            metadata: self.directory.url(),
        };
        let mut args = self.launch_args(settings, worker, deadline_ns);
        if index >= settings.workers as usize {
            args.extend(["--dummy-of".into(), self.real_client_name.clone()]);
        }
        args
    }

    /// The arguments of HA cell worker `index`: the cell's `etcd://` master, key space `ha`,
    /// worker numbers from 1001 on.
    fn ha_worker_args(&self, settings: &Settings, index: usize, deadline_ns: u64) -> Vec<String> {
        let Some(ha) = &self.ha else {
            return Vec::new();
        };
        let incarnation = ha.incarnations[index];
        let worker = WorkerLaunch {
            master: ha.master_addr(),
            key_space: "ha",
            number: 1001 + index,
            incarnation,
            journal: settings
                .dir
                .join(format!("ha-worker-{index}-{incarnation}.log")),
            metadata: "P2PHANDSHAKE".into(),
        };
        self.launch_args(settings, worker, deadline_ns)
    }

    /// The `worker` subcommand's arguments for `worker`.
    fn launch_args(
        &self,
        settings: &Settings,
        worker: WorkerLaunch,
        deadline_ns: u64,
    ) -> Vec<String> {
        [
            "worker".to_string(),
            "--master".into(),
            worker.master,
            "--key-space".into(),
            worker.key_space.into(),
            "--worker".into(),
            worker.number.to_string(),
            "--incarnation".into(),
            worker.incarnation.to_string(),
            "--seed".into(),
            settings.seed.to_string(),
            "--journal".into(),
            worker.journal.display().to_string(),
            "--keys".into(),
            settings.keys.to_string(),
            "--metadata".into(),
            worker.metadata,
            "--max-value".into(),
            settings.max_value.to_string(),
            "--deadline-ns".into(),
            deadline_ns.to_string(),
            "--p2p-master".into(),
            self.p2p_master_addr.clone(),
            "--p2p-host".into(),
            self.p2p_host.clone(),
        ]
        .into()
    }

    fn start(settings: &Settings, deadline_ns: u64) -> Result<Cluster, String> {
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 5 + settings.owners {
            let port = free_port();
            if port != 0 && !ports.contains(&port) {
                ports.push(port);
            }
        }
        let (master_port, metrics_port, metadata_port) = (ports[0], ports[1], ports[2]);
        let (p2p_port, p2p_metrics_port) = (ports[3], ports[4]);
        let owner_ports = &ports[5..];
        let mut master_args = vec![
            format!("--rpc_port={master_port}"),
            "--rpc_address=127.0.0.1".into(),
            format!("--metrics_port={metrics_port}"),
            "--metrics_host=127.0.0.1".into(),
            "--enable_http_metadata_server=true".into(),
            format!("--http_metadata_server_port={metadata_port}"),
            "--http_metadata_server_host=127.0.0.1".into(),
            "--client_ttl=2".into(),
            "--default_kv_lease_ttl=500".into(),
            "--put_start_discard_timeout_sec=3".into(),
            "--put_start_release_timeout_sec=10".into(),
            "--write_quarantine_ms=10000".into(),
        ];
        if write_through(settings) {
            master_args.push("--enable_offload".into());
        }
        let mut master = Proc::new("master", sibling("mooncake_master"), master_args, env())
            .ready_on_port(master_port);
        master.start()?;
        let peer_proxy = Proxy::start(owner_ports[PROXIED_OWNER], DELAY)
            .map_err(|e| format!("peer proxy: {e}"))?;
        let names = owner_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut directory = Directory::new(metadata_port, names, peer_proxy.port);
        let disks = match settings.ssd_limit {
            0 => Err("no SSD tiers".to_string()),
            _ => LoopTiers::create(
                &(0..owner_ports.len())
                    .map(|index| crate::disk_faults::tier_dir(&settings.dir, index))
                    .collect::<Vec<_>>(),
            ),
        };
        let mut owners = Vec::new();
        for (index, port) in owner_ports.iter().enumerate() {
            let mut args = vec![
                format!("--master_server_address=127.0.0.1:{master_port}"),
                format!("--host=127.0.0.1:{port}"),
                format!("--global_segment_size={}", settings.segment),
                "--local_buffer_size=0".into(),
                // Dummies attach by segment name; no service port (it would clash across owners).
                "--port=0".into(),
                format!("--metadata_server={}", directory.url()),
            ];
            // The proxied owner serves only over TCP (through its data proxy): same-host
            // readers would otherwise map its segment and bypass the proxy. The other owners
            // keep the same-host path, so the soak exercises both.
            let mut owner_env = env();
            if index == PROXIED_OWNER {
                owner_env.push(("MC_SAME_HOST".into(), "0".into()));
            }
            if settings.ssd_limit > 0 {
                let dir = crate::disk_faults::tier_dir(&settings.dir, index);
                args.push("--enable_offload".into());
                args.push(format!("--ssd_offload_path={}", dir.display()));
                let limit = settings.ssd_limit.to_string();
                owner_env.push(("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES".into(), limit));
            }
            let mut owner = Proc::new(
                &format!("owner-{index}"),
                sibling("mooncake_client"),
                args,
                owner_env,
            )
            .ready_on_line();
            owner.start()?;
            directory.refresh(index)?;
            owners.push(owner);
        }
        let proxy = Proxy::start(master_port, DELAY).map_err(|e| format!("proxy: {e}"))?;
        let netns = Namespace::create();
        let p2p_host = match &netns {
            Ok(ns) => ns.host_ip.clone(),
            Err(_) => "127.0.0.1".to_string(),
        };
        let p2p_master_addr = format!("{p2p_host}:{p2p_port}");
        let p2p_master_args = vec![
            "--deployment_mode=P2P".to_string(),
            format!("--rpc_port={p2p_port}"),
            format!("--rpc_address={p2p_host}"),
            format!("--metrics_port={p2p_metrics_port}"),
            "--metrics_host=127.0.0.1".into(),
            "--client_ttl=2".into(),
        ];
        let mut p2p_master = Proc::new(
            "p2p-master",
            sibling("mooncake_master"),
            p2p_master_args,
            env(),
        )
        .ready_on_addr(&p2p_master_addr);
        p2p_master.start()?;
        let tier = mooncake_rs::client::parse_size(&settings.segment).unwrap_or(6 << 20);
        let mut p2p_owners = Vec::new();
        let owner_args = |host: &str| -> Vec<String> {
            vec![
                format!("--master_server_address={p2p_master_addr}"),
                format!("--host={host}"),
                "--deployment_mode=P2P".into(),
                format!(
                    r#"--tiered_backend_config={{"tiers":[{{"type":"DRAM","capacity":{tier},"priority":100,"allocator_type":"OFFSET"}}]}}"#
                ),
                "--local_buffer_size=4 MB".into(),
            ]
        };
        for index in 0..P2P_OWNERS {
            let program = sibling("mooncake_client");
            let (program, args) = match (&netns, index == PARTITIONED_OWNER) {
                (Ok(ns), true) => ns.wrap(program, owner_args(&ns.inner_ip)),
                _ => (program, owner_args(&p2p_host)),
            };
            let mut owner =
                Proc::new(&format!("p2p-owner-{index}"), program, args, env()).ready_on_line();
            owner.start()?;
            p2p_owners.push(owner);
        }
        let real_client = settings.owners - 1;
        let mut cluster = Cluster {
            master,
            owners,
            workers: Vec::new(),
            incarnations: vec![0; (settings.workers + settings.dummies) as usize],
            proxy,
            peer_proxy,
            directory,
            real_client,
            real_client_name: format!("127.0.0.1:{}", owner_ports[real_client]),
            master_port,
            metrics_port,
            owner_ports: owner_ports.to_vec(),
            p2p_master,
            p2p_owners,
            p2p_master_addr,
            p2p_metrics_port,
            p2p_host,
            ha: None,
            disks,
            netns,
        };
        if settings.ha_workers > 0 {
            let ha = HaCell::start(&settings.dir, &settings.segment, &env())?;
            cluster.ha = Some(ha);
            let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            for index in 0..settings.ha_workers as usize {
                if let Some(ha) = cluster.ha.as_mut() {
                    ha.incarnations.push(0);
                }
                let args = cluster.ha_worker_args(settings, index, deadline_ns);
                let mut worker = Proc::new(&format!("ha-worker-{index}"), me.clone(), args, env());
                worker.start()?;
                if let Some(ha) = cluster.ha.as_mut() {
                    ha.workers.push(worker);
                }
            }
        }
        let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        for index in 0..(settings.workers + settings.dummies) as usize {
            let args = cluster.worker_args(settings, index, deadline_ns);
            let label = worker_label(settings, index);
            let mut worker = Proc::new(&label, me.clone(), args, env());
            worker.start()?;
            cluster.workers.push(worker);
        }
        Ok(cluster)
    }
}

/// `worker-N` for the first `--workers` entries of [`Cluster::workers`], `dummy-N` after.
fn worker_label(settings: &Settings, index: usize) -> String {
    match index.checked_sub(settings.workers as usize) {
        Some(dummy) => format!("dummy-{dummy}"),
        None => format!("worker-{index}"),
    }
}

/// Whether the run's master copies every write to its owner's SSD tier when it ends
/// (`--enable_offload`, write-through): in runs with tiers and an odd seed, so the soak
/// covers objects in memory and on disk at once as well as demotion on eviction alone.
fn write_through(settings: &Settings) -> bool {
    settings.ssd_limit > 0 && settings.seed % 2 == 1
}

/// Runs the soak; the process exit code.
pub fn run(settings: &Settings) -> i32 {
    if let Err(err) = std::fs::create_dir_all(&settings.dir) {
        eprintln!("mc_chaos: {}: {err}", settings.dir.display());
        return 2;
    }
    println!(
        "mc_chaos: seed {} duration {} s, journals in {}{}",
        settings.seed,
        settings.duration.as_secs(),
        settings.dir.display(),
        match write_through(settings) {
            true => "; SSD tiers written through (--enable_offload)",
            false => "",
        }
    );
    if settings.cluster_key {
        match use_cluster_key(settings) {
            Ok(path) => println!("mc_chaos: every process holds the cluster key {path}"),
            Err(message) => {
                eprintln!("mc_chaos: cluster key: {message}");
                return 2;
            }
        }
    }
    let started = now_ns();
    let deadline_ns = started + settings.duration.as_nanos() as u64;
    let mut cluster = match Cluster::start(settings, deadline_ns) {
        Ok(cluster) => cluster,
        Err(message) => {
            eprintln!("mc_chaos: cluster: {message}");
            return 2;
        }
    };
    let mut rng = fastrand::Rng::with_seed(settings.seed);
    let mut kinds: Vec<&'static str> = KINDS.to_vec();
    if settings.dummies == 0 {
        kinds.retain(|k| !DUMMY_KINDS.contains(k));
    }
    if cluster.ha.is_none() {
        kinds.retain(|k| !HA_KINDS.contains(k));
    }
    if settings.ssd_limit == 0 {
        kinds.retain(|k| !crate::disk_faults::DISK_KINDS.contains(k));
    }
    if !settings.cluster_key {
        kinds.retain(|k| !KEYED_KINDS.contains(k));
    }
    if !settings.faults.is_empty() {
        kinds.retain(|k| settings.faults.iter().any(|chosen| chosen == k));
    }
    if let Err(reason) = &cluster.disks {
        if settings.ssd_limit > 0 {
            println!("mc_chaos: disk_full, disk_slow and disk_eio faults SKIPPED: {reason}");
        }
        kinds.retain(|k| !crate::disk_devices::DEVICE_KINDS.contains(k));
    }
    match &cluster.netns {
        Ok(ns) => println!(
            "mc_chaos: p2p-owner-{PARTITIONED_OWNER} runs in a network namespace at {} (host end {})",
            ns.inner_ip, ns.host_ip
        ),
        Err(reason) => {
            println!("mc_chaos: partition fault SKIPPED: {reason}");
            kinds.retain(|k| *k != "partition");
        }
    }
    let mut windows: Vec<FaultWindow> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    // Faults stop a little before the workers' deadline so every restart settles.
    let faults_until = deadline_ns.saturating_sub(5_000_000_000);
    let mut round: Vec<&'static str> = Vec::new();
    std::thread::sleep(Duration::from_secs(2));
    let mut rounds = 0u32;
    while now_ns() < faults_until {
        // Rounds of every kind in a seeded order: each kind comes once per round. The first
        // round is paced to fit the run (shorter gaps and pauses when the run is short), so
        // every run of the bounded test's length injects every kind at least once.
        if round.is_empty() {
            rounds += 1;
            round = kinds.clone();
            rng.shuffle(&mut round);
        }
        let share = match rounds == 1 {
            true => Duration::from_nanos(
                faults_until.saturating_sub(now_ns()) / round.len().max(1) as u64,
            ),
            false => Duration::MAX,
        };
        let gap = Duration::from_millis(rng.u64(300..2500)).min(share / 5);
        std::thread::sleep(gap);
        if now_ns() >= faults_until {
            break;
        }
        let Some(kind) = round.pop() else { break };
        let pause_cap = share / 3;
        match inject(
            &mut cluster,
            settings,
            kind,
            &mut rng,
            deadline_ns,
            pause_cap,
        ) {
            Ok(window) => {
                println!(
                    "  t+{:.1} s {} {} for {} ms",
                    (window.start - started) as f64 / 1e9,
                    window.kind,
                    window.target,
                    (window.end - window.start) / 1_000_000
                );
                windows.push(window);
            }
            Err(message) => {
                println!("  fault {kind}: {message}");
                problems.push(message);
            }
        }
    }
    // Every worker exits at its deadline; one still running past the call limit hung.
    let grace = settings.call_limit + Duration::from_secs(10);
    let wait_from = std::time::Instant::now();
    let ha_workers = cluster.ha.as_mut().map(|ha| ha.workers.iter_mut());
    for worker in cluster
        .workers
        .iter_mut()
        .chain(ha_workers.into_iter().flatten())
    {
        let left = grace.saturating_sub(wait_from.elapsed())
            + Duration::from_secs(deadline_ns.saturating_sub(now_ns()) / 1_000_000_000 + 1);
        if !worker.wait_exit(left) {
            problems.push(format!(
                "{} still running {} s past its deadline (a call hung)",
                worker.label,
                grace.as_secs()
            ));
            worker.kill();
        }
    }
    println!("mc_chaos: workers done; end-of-run checks");
    let through_peer_proxy = cluster.peer_proxy.forwarded();
    println!("mc_chaos: owner-{PROXIED_OWNER}'s data proxy forwarded {through_peer_proxy} bytes");
    if through_peer_proxy == 0 {
        problems.push(format!(
            "no byte reached owner-{PROXIED_OWNER} through its data proxy"
        ));
    }
    let accounting = end_checks(&mut cluster, settings, &mut problems);
    println!("mc_chaos: checking the journals");

    let mut events: Vec<Tagged> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&settings.dir) {
        // The workers' journals (the HA cell keeps its etcd and master data in directories).
        let logs = entries.flatten().filter(|e| e.path().is_file());
        for entry in logs {
            let source = entry.file_name().to_string_lossy().into_owned();
            match journal::read_all(&entry.path()) {
                Ok(list) => events.extend(list.into_iter().map(|event| Tagged {
                    source: source.clone(),
                    event,
                })),
                Err(err) => problems.push(format!("journal {source}: {err}")),
            }
        }
    }
    let (same_host_bytes, dummy_bytes, cache_hits) = traffic_totals(&events);
    let (dummy_calls, dummy_ok) = dummy_calls(&events);
    println!(
        "mc_chaos: workers moved {same_host_bytes} bytes through mapped same-host segments; \
         real clients moved {dummy_bytes} bytes for dummies, whose {dummy_calls} calls \
         ({dummy_ok} ok) are in the table; location caches answered {cache_hits} lookups"
    );
    // Owner PROXIED_OWNER serves over TCP only: with no other owner nothing is mapped.
    if same_host_bytes == 0 && settings.owners > 1 {
        problems.push("no byte moved through a mapped same-host segment".into());
    }
    if settings.dummies > 0 && dummy_bytes == 0 {
        problems.push("no byte moved for a dummy by its real client".into());
    }
    let verdict = checker::check(&events, &windows, TIMEOUTS);
    let elapsed = Duration::from_nanos(now_ns() - started);
    let partitions = windows.iter().filter(|w| w.kind == "partition").count();
    let notes = vec![match &cluster.netns {
        Ok(_) => format!("{partitions} partitions of p2p-owner-{PARTITIONED_OWNER}"),
        Err(reason) => format!("0 partitions: the partition fault was SKIPPED ({reason})"),
    }];
    report::print(
        settings,
        &verdict,
        &windows,
        (&problems, &notes),
        &accounting,
        elapsed,
    );
    if verdict.violations.is_empty() && problems.is_empty() {
        0
    } else {
        println!(
            "mc_chaos: FAILED; reproduce with --seed {} --duration {}",
            settings.seed,
            settings.duration.as_secs()
        );
        1
    }
}

/// The same-host bytes, dummy bytes and location-cache hits of every journal's last
/// [`journal::Event::Traffic`] (each incarnation's totals), added up.
fn traffic_totals(events: &[Tagged]) -> (u64, u64, u64) {
    let mut last: std::collections::HashMap<&str, (u64, u64, u64)> = Default::default();
    for tagged in events {
        if let journal::Event::Traffic {
            same_host_bytes,
            dummy_bytes,
            cache_hits,
            ..
        } = tagged.event
        {
            let seen = last.entry(&tagged.source).or_default();
            *seen = (
                seen.0.max(same_host_bytes),
                seen.1.max(dummy_bytes),
                seen.2.max(cache_hits),
            );
        }
    }
    last.values()
        .fold((0, 0, 0), |(s, d, h), (same, dummy, hits)| {
            (s + same, d + dummy, h + hits)
        })
}

/// Calls the dummies journaled (reads, write ends, removes) and how many succeeded.
fn dummy_calls(events: &[Tagged]) -> (u64, u64) {
    events
        .iter()
        .filter(|t| t.source.starts_with("dummy-"))
        .filter_map(|t| match t.event {
            journal::Event::Read { rc, .. }
            | journal::Event::WriteEnd { rc, .. }
            | journal::Event::Remove { rc, .. } => Some(rc == 0),
            journal::Event::Corrupt { .. } => Some(true),
            _ => None,
        })
        .fold((0, 0), |(calls, ok), success| {
            (calls + 1, ok + u64::from(success))
        })
}

/// Writes a fresh key (from the seed) to `cluster.key` in the run's directory (mode 0600) and
/// names it in `MC_CLUSTER_KEY_FILE`, which this process and every process it starts (master,
/// owners, workers, dummies, the P2P and HA clusters) read; returns its path.
fn use_cluster_key(settings: &Settings) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut rng = fastrand::Rng::with_seed(settings.seed ^ 0x006b_6579);
    let hex: String = (0..32).map(|_| format!("{:02x}", rng.u8(..))).collect();
    let path = settings.dir.join("cluster.key");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::Write::write_all(&mut file, format!("{hex}\n").as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // Before any thread of this process reads the environment (the cluster starts after).
    std::env::set_var("MC_CLUSTER_KEY_FILE", &path);
    Ok(path.display().to_string())
}

/// Injects one fault of `kind` and returns its window; a stop, delay or partition lasts at
/// most `pause_cap`.
fn inject(
    cluster: &mut Cluster,
    settings: &Settings,
    kind: &'static str,
    rng: &mut fastrand::Rng,
    deadline_ns: u64,
    pause_cap: Duration,
) -> Result<FaultWindow, String> {
    let start = now_ns();
    let pause =
        Duration::from_millis(rng.u64(200..3000)).min(pause_cap.max(Duration::from_millis(200)));
    let workers = settings.workers as usize;
    let target = match kind {
        "kill_worker" | "stop_worker" | "kill_dummy" | "stop_dummy" => {
            let index = match kind.ends_with("_dummy") {
                true => rng.usize(workers..cluster.workers.len()),
                false => rng.usize(0..workers),
            };
            if kind.starts_with("kill_") {
                cluster.workers[index].kill();
                std::thread::sleep(Duration::from_millis(rng.u64(50..1000)));
                cluster.incarnations[index] += 1;
                let args = cluster.worker_args(settings, index, deadline_ns);
                let worker = &mut cluster.workers[index];
                worker.set_args(args);
                worker.start()?;
            } else {
                cluster.workers[index].stop();
                std::thread::sleep(pause);
                cluster.workers[index].cont();
            }
            cluster.workers[index].label.clone()
        }
        "kill_owner" | "stop_owner" | "kill_real_client" | "stop_real_client" => {
            let index = match kind.ends_with("_real_client") {
                true => cluster.real_client,
                false => rng.usize(0..cluster.owners.len()),
            };
            let owner = &mut cluster.owners[index];
            if kind.starts_with("kill_") {
                owner.kill();
                std::thread::sleep(Duration::from_millis(rng.u64(50..1000)));
                owner.start()?;
                cluster.directory.refresh(index)?;
            } else {
                owner.stop();
                std::thread::sleep(pause.min(settings.p2p_outage_max));
                owner.cont();
            }
            owner.label.clone()
        }
        "kill_master" => {
            cluster.master.kill();
            std::thread::sleep(Duration::from_millis(rng.u64(50..1500)));
            cluster.master.start()?;
            cluster.directory.republish()?;
            "master".into()
        }
        "stop_master" => {
            cluster.master.stop();
            std::thread::sleep(pause);
            cluster.master.cont();
            "master".into()
        }
        "corrupt_record" | "truncate_record" | "delete_record" => {
            let dirs: Vec<std::path::PathBuf> = (0..cluster.owners.len())
                .map(|index| crate::disk_faults::tier_dir(&settings.dir, index))
                .collect();
            crate::disk_faults::inject(&dirs, kind, rng).unwrap_or_else(|| "no record".into())
        }
        "disk_full" | "disk_slow" | "disk_eio" => {
            let disks = cluster.disks.as_ref().map_err(|e| e.clone())?;
            let index = rng.usize(0..cluster.owners.len());
            match kind {
                "disk_full" => disks.fill(index, pause)?,
                "disk_slow" => disks.slow(index, pause)?,
                _ => {
                    // The owner keeps serving from DRAM on a dead disk for the window; then
                    // the repair: it has to let go of the filesystem before it can come back.
                    let target = disks.shut_down(index);
                    std::thread::sleep(pause);
                    let owner = &mut cluster.owners[index];
                    owner.kill();
                    let remounted = disks.remount(index);
                    let started = owner.start();
                    remounted?;
                    started?;
                    cluster.directory.refresh(index)?;
                    target?
                }
            }
        }
        "kill_p2p_owner" | "stop_p2p_owner" => {
            let index = rng.usize(0..cluster.p2p_owners.len());
            let owner = &mut cluster.p2p_owners[index];
            if kind == "kill_p2p_owner" {
                owner.kill();
                std::thread::sleep(Duration::from_millis(rng.u64(50..1000)));
                owner.start()?;
            } else {
                owner.stop();
                std::thread::sleep(pause);
                owner.cont();
            }
            owner.label.clone()
        }
        "kill_p2p_master" => {
            cluster.p2p_master.kill();
            std::thread::sleep(Duration::from_millis(rng.u64(50..1500)));
            cluster.p2p_master.start()?;
            "p2p-master".into()
        }
        "kill_leader" | "stop_leader" | "kill_etcd" | "partition_leader" => {
            let ha = cluster.ha.as_mut().ok_or("no HA cell")?;
            ha.inject(kind, pause, rng)?
        }
        "intruder" => {
            let owner = cluster.owner_ports[rng.usize(0..cluster.owner_ports.len())];
            crate::intruder::inject(cluster.master_port, cluster.metrics_port, owner)?
        }
        "partition" => {
            let ns = cluster.netns.as_ref().map_err(Clone::clone)?;
            // Up to twice the P2P master's client TTL (2 s): long ones make it drop the
            // owner and its routes, which the owner re-registers once the link is back.
            ns.partition(true)?;
            let longest = settings.p2p_outage_max.as_millis() as u64;
            let outage = Duration::from_millis(rng.u64(200..longest));
            std::thread::sleep(outage.min(pause_cap.max(Duration::from_millis(200))));
            ns.partition(false)?;
            cluster.p2p_owners[PARTITIONED_OWNER].label.clone()
        }
        _ => {
            let mode = match kind {
                "proxy_delay" | "peer_delay" => Mode::Delay,
                "proxy_trickle" | "peer_trickle" => Mode::Trickle,
                _ => Mode::Reset,
            };
            let (proxy, target) = if kind.starts_with("peer_") {
                (
                    &cluster.peer_proxy,
                    format!("owner-{PROXIED_OWNER} data proxy"),
                )
            } else {
                (&cluster.proxy, "proxy".to_string())
            };
            proxy.set_mode(mode);
            std::thread::sleep(pause);
            proxy.set_mode(Mode::Pass);
            target
        }
    };
    Ok(FaultWindow {
        kind,
        target,
        start,
        end: now_ns(),
    })
}

/// The end-of-run accounting: what was measured, for the report.
#[derive(Default)]
pub struct Accounting {
    pub live_objects: u64,
    pub live_bytes: u64,
    /// Live objects whose replica is a disk record, and the record files the tiers hold.
    pub disk_objects: u64,
    pub disk_records: u64,
    /// The last master incarnation's demotions committed, failed (the owner could not write:
    /// the victim was dropped), skipped (a stuck tier: dropped), disk replicas it forgot as
    /// lost, objects it evicted from the tiers, write-through copies committed, and
    /// evictions that freed only memory (the object had a copy on disk).
    pub disk_counters: [Option<u64>; 7],
    pub master_objects: Option<u64>,
    pub master_bytes_used: Option<u64>,
    pub active_pins: Option<u64>,
    pub deferred_frees: Option<u64>,
    pub usage: Vec<(String, usize, u64)>,
    pub p2p: crate::p2p_audit::P2pAccounting,
}

/// After the TTLs: the master's accounting must equal the live objects (as a fresh client
/// sees them), no pin or deferred free may be left, the P2P master's routes must match what
/// its owners hold ([`crate::p2p_audit`]), and every server's descriptors and RSS must be
/// bounded.
fn end_checks(
    cluster: &mut Cluster,
    settings: &Settings,
    problems: &mut Vec<String>,
) -> Accounting {
    let mut accounting = Accounting::default();
    if let Some(ha) = &cluster.ha {
        if !wait_until(Duration::from_secs(20), || ha.leader().is_some()) {
            problems.push("no master of the HA cell leads at the end".into());
        }
    }
    let scrape = |port: u16| http_get(port, "/metrics").unwrap_or_default();
    // Leases (500 ms), the client TTL (2 s) of the exited workers and the write quarantine
    // (10 s) must all have run out.
    let settled = wait_until(Duration::from_secs(40), || {
        let text = scrape(cluster.metrics_port);
        metric(&text, "mooncake_master_active_pins") == Some(0)
            && metric(&text, "mooncake_master_deferred_frees_pending") == Some(0)
            && metric(&text, "mooncake_master_clients_alive") == Some(settings.owners as u64)
    });
    if !settled {
        problems.push("pins, deferred frees or dead clients still held 40 s after the end".into());
    }
    let checker = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        local_buffer_size: 0,
        master_server_addr: format!("127.0.0.1:{}", cluster.master_port),
        ..SetupConfig::default()
    });
    let checker = match checker {
        Ok(client) => client,
        Err(code) => {
            problems.push(format!("end check: client setup {code:?}"));
            return accounting;
        }
    };
    let keys: Vec<String> = (0..settings.keys).map(|i| format!("k/{i}")).collect();
    for query in checker.batch_get_replica_desc(&keys).into_iter().flatten() {
        accounting.live_objects += 1;
        // In memory, on disk, or both (a write-through copy of an object in memory).
        if query.replicas.iter().any(|r| r.disk.is_none()) {
            // The master allocates in 64-byte units (src/alloc.rs, ALIGNMENT).
            accounting.live_bytes += query.size.div_ceil(64) * 64;
        }
        if query.replicas.iter().any(|r| r.disk.is_some()) {
            accounting.disk_objects += 1;
        }
    }
    // Records the master let go are deleted by their owners soon after.
    let dirs = (0..cluster.owners.len()).map(|i| crate::disk_faults::tier_dir(&settings.dir, i));
    let dirs: Vec<std::path::PathBuf> = dirs.collect();
    let records = || {
        let files = dirs
            .iter()
            .map(|dir| crate::disk_faults::record_files(dir).len());
        files.sum::<usize>() as u64
    };
    wait_until(Duration::from_secs(20), || {
        records() == accounting.disk_objects
    });
    accounting.disk_records = records();
    if accounting.disk_records != accounting.disk_objects {
        problems.push(format!(
            "the tiers hold {} records, the master lists {} disk objects",
            accounting.disk_records, accounting.disk_objects
        ));
    }
    let text = scrape(cluster.metrics_port);
    accounting.master_objects = metric(&text, "mooncake_master_objects");
    accounting.master_bytes_used = metric(&text, "mooncake_master_bytes_used");
    accounting.active_pins = metric(&text, "mooncake_master_active_pins");
    accounting.deferred_frees = metric(&text, "mooncake_master_deferred_frees_pending");
    accounting.disk_counters = [
        "demotions_committed_total",
        "demotions_failed_total",
        "demotions_skipped_total",
        "disk_replicas_lost_total",
        "disk_evicted_objects_total",
        "offloads_committed_total",
        "memory_released_total",
    ]
    .map(|name| metric(&text, &format!("mooncake_master_{name}")));
    if accounting.master_objects != Some(accounting.live_objects) {
        problems.push(format!(
            "master counts {:?} objects, {} are live",
            accounting.master_objects, accounting.live_objects
        ));
    }
    if accounting.master_bytes_used != Some(accounting.live_bytes) {
        problems.push(format!(
            "master counts {:?} bytes used, live objects hold {}",
            accounting.master_bytes_used, accounting.live_bytes
        ));
    }
    checker.teardown();
    let prefix = crate::p2p_ops::P2P_PREFIX;
    let p2p_keys: Vec<String> = (0..settings.keys)
        .map(|i| format!("{prefix}/{i}"))
        .collect();
    accounting.p2p = crate::p2p_audit::audit(
        &cluster.p2p_master_addr,
        cluster.p2p_metrics_port,
        &p2p_keys,
        problems,
    );
    let segment = mooncake_rs::client::parse_size(&settings.segment).unwrap_or(0);
    let mut servers: Vec<&Proc> = vec![&cluster.master, &cluster.p2p_master];
    servers.extend(cluster.owners.iter());
    servers.extend(cluster.p2p_owners.iter());
    for server in servers {
        match server.usage() {
            Some((fds, rss)) => {
                accounting.usage.push((server.label.clone(), fds, rss));
                if fds > 256 {
                    problems.push(format!("{} holds {fds} descriptors", server.label));
                }
                if rss > segment + (256 << 20) {
                    problems.push(format!("{} resident {} MiB", server.label, rss >> 20));
                }
            }
            None => problems.push(format!("{} is not running at the end", server.label)),
        }
    }
    accounting
}

#[cfg(test)]
mod tests {
    use super::{CLIENT_ENV, TIMEOUTS};

    #[test]
    fn the_checker_limits_use_the_timeouts_the_clients_get() {
        let get = |name: &str| {
            CLIENT_ENV
                .iter()
                .find(|(k, _)| *k == name)
                .and_then(|(_, v)| v.parse::<u64>().ok())
        };
        assert_eq!(get("MC_RPC_TIMEOUT_MS"), Some(TIMEOUTS.rpc_ms));
        assert_eq!(get("MC_RPC_CONNECT_TIMEOUT_MS"), Some(TIMEOUTS.connect_ms));
        assert_eq!(get("MC_TRANSFER_TIMEOUT_MS"), Some(TIMEOUTS.transfer_ms));
    }
}
