//! `mc_chaos`: a chaos soak of a real pool on 127.0.0.1 with an independent checker.
//!
//! A `mooncake_master`, `--owners` `mooncake_client` processes contributing tiny segments
//! (memory pressure, eviction), and `--workers` worker processes (this binary, `worker`
//! subcommand) running a seeded random mix of puts, upserts, batch and zero-copy and
//! multi-buffer writes, whole, batch, multi-buffer, ranged and session reads, removes and
//! remove_all on a shared key space of self-describing values ([`value`]); `--dummies` more
//! workers run it as dummies of the last owner (standalone mode). Half the workers reach the
//! master through a fault-injecting proxy ([`proxy`]). A fault driver ([`faults`]) SIGKILLs
//! (and restarts) and SIGSTOPs/SIGCONTs workers, dummies, owners (the dummies' real client
//! among them) and the master, and makes the proxy delay, trickle and reset. The owners keep
//! evicted objects in small SSD tiers whose records the driver damages ([`disk_faults`]). The run fails
//! when no byte moved through a mapped same-host segment or for a dummy. At the end the checker ([`checker`]) reads every
//! journal; the master's accounting must equal the live objects once the TTLs have passed,
//! and descriptor counts and RSS must be bounded.
//!
//! Usage: `mc_chaos [--seed N] [--duration SECS] [--workers N] [--dummies N] [--owners N]
//! [--keys N] [--max-value BYTES] [--segment SIZE] [--ssd-limit SIZE] [--call-limit-ms MS]
//! [--dir PATH] [--markdown] [--p2p-outage-max-ms MS] [--faults KIND,KIND,...]
//! [--cluster-key]` (`--faults`: draw only these fault kinds, to chase one; `--cluster-key`:
//! every process holds a cluster key and [`intruder`]s without it are refused).
//! Exit code 0: no violation; 1: violations (printed with the seed, the key's history and
//! the faults around it); 2: bad arguments or the cluster could not start.

mod checker;
mod cluster;
mod disk_devices;
mod disk_faults;
mod faults;
mod ha_cell;
mod intruder;
mod journal;
mod netns;
mod p2p_audit;
mod p2p_ops;
mod peer_front;
mod proxy;
mod report;
mod stream_ops;
mod value;
mod worker;

use std::time::Duration;

/// The run's settings (command line).
#[derive(Clone, Debug)]
pub struct Settings {
    pub seed: u64,
    pub duration: Duration,
    pub workers: u64,
    /// Worker processes whose client is a dummy of the last owner (`--dummies`, default 1).
    pub dummies: u64,
    /// Workers of the HA cell (`--ha-workers`, default 2; 0: no HA cell, see `ha_cell`).
    pub ha_workers: u64,
    pub owners: usize,
    pub keys: usize,
    pub max_value: usize,
    pub segment: String,
    /// Bytes of each owner's SSD tier (`--ssd-limit`, default 1 MiB, so it is always full
    /// and trimming; 0: no tier and no disk faults, see `disk_faults`).
    pub ssd_limit: u64,
    /// How long past its deadline a worker may still be in a call before it counts as hung
    /// (each call's own limit is [`checker::call_limit_ns`]).
    pub call_limit: Duration,
    pub dir: std::path::PathBuf,
    pub markdown: bool,
    /// Longest partition or SIGSTOP of a P2P owner (`--p2p-outage-max-ms`, default 4000 ms,
    /// twice the P2P master's client TTL, so that some outages expire the owner).
    pub p2p_outage_max: Duration,
    /// The only fault kinds to draw (`--faults a,b`; empty: every kind the run supports).
    pub faults: Vec<String>,
    /// Every process of the run holds a cluster key (`--cluster-key`; see `faults::run`),
    /// and the `intruder` fault is drawn.
    pub cluster_key: bool,
}

fn parse_settings(args: &[String]) -> Result<Settings, String> {
    let mut settings = Settings {
        seed: journal::now_ns() ^ u64::from(std::process::id()),
        duration: Duration::from_secs(90),
        workers: 3,
        dummies: 1,
        ha_workers: 2,
        owners: 2,
        keys: 48,
        max_value: 1 << 20,
        segment: "6 MB".into(),
        ssd_limit: 1 << 20,
        call_limit: Duration::from_secs(50),
        dir: std::path::PathBuf::new(),
        markdown: false,
        p2p_outage_max: Duration::from_millis(4000),
        faults: Vec::new(),
        cluster_key: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--markdown" {
            settings.markdown = true;
            continue;
        }
        if flag == "--cluster-key" {
            settings.cluster_key = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--seed" => settings.seed = number()?,
            "--duration" => settings.duration = Duration::from_secs(number()?),
            "--workers" => settings.workers = number()?.clamp(1, 64),
            "--dummies" => settings.dummies = number()?.min(16),
            "--ha-workers" => settings.ha_workers = number()?.min(16),
            "--owners" => settings.owners = number()?.clamp(1, 16) as usize,
            "--keys" => settings.keys = number()?.clamp(1, 1 << 20) as usize,
            "--max-value" => settings.max_value = (number()? as usize).max(value::HEADER_LEN + 1),
            "--segment" => settings.segment = value.clone(),
            "--ssd-limit" => {
                let bytes = mooncake_rs::client::parse_size(value);
                settings.ssd_limit =
                    bytes.map_err(|_| format!("--ssd-limit {value}: not a size"))?
            }
            "--call-limit-ms" => settings.call_limit = Duration::from_millis(number()?),
            "--p2p-outage-max-ms" => {
                settings.p2p_outage_max = Duration::from_millis(number()?.max(201))
            }
            "--dir" => settings.dir = value.into(),
            "--faults" => {
                settings.faults = value.split(',').map(str::to_string).collect();
                if let Some(unknown) = settings
                    .faults
                    .iter()
                    .find(|k| !faults::KINDS.contains(&k.as_str()))
                {
                    return Err(format!("--faults: no fault kind {unknown:?}"));
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if settings.dir.as_os_str().is_empty() {
        settings.dir = std::env::temp_dir().join(format!("mc_chaos-{}", settings.seed));
    }
    // The checker reads every journal in the directory: an earlier run's (the same seed, so
    // the same default directory) would mix its calls into this one's and fail it.
    let used = std::fs::read_dir(&settings.dir).is_ok_and(|mut entries| entries.next().is_some());
    if used {
        let dir = settings.dir.display();
        return Err(format!(
            "{dir} holds an earlier run: remove it or pass another --dir"
        ));
    }
    Ok(settings)
}

fn worker_args(args: &[String]) -> Result<worker::WorkerArgs, String> {
    let get = |name: &str| -> Result<String, String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .ok_or(format!("worker: missing {name}"))
    };
    let number = |name: &str| -> Result<u64, String> {
        get(name)?
            .parse()
            .map_err(|_| format!("worker: {name} is not a number"))
    };
    Ok(worker::WorkerArgs {
        master: get("--master")?,
        metadata: get("--metadata")?,
        p2p_master: get("--p2p-master")?,
        p2p_host: get("--p2p-host")?,
        worker: number("--worker")?,
        incarnation: number("--incarnation")?,
        seed: number("--seed")?,
        journal: get("--journal")?,
        keys: number("--keys")? as usize,
        max_value: number("--max-value")? as usize,
        deadline_ns: number("--deadline-ns")?,
        dummy_of: get("--dummy-of").ok(),
        key_space: get("--key-space").unwrap_or_else(|_| "k".into()),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        let code = match worker_args(&args[1..]) {
            Ok(parsed) => worker::run(parsed),
            Err(message) => {
                eprintln!("mc_chaos {message}");
                2
            }
        };
        std::process::exit(code);
    }
    let settings = match parse_settings(&args) {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("mc_chaos: {message}");
            std::process::exit(2);
        }
    };
    std::process::exit(faults::run(&settings));
}
