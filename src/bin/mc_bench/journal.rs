//! `--journal`: what the master's journal costs and what a restart takes.
//!
//! - **Throughput**: put (start + end), get (replica list) and remove of fresh 4 KiB keys
//!   through the RPC server, 8 client threads, against a master with a journal and one
//!   without, in interleaved rounds of the same length (the limit: the master without).
//! - **Restart**: N objects committed through an in-process master with a journal, which is
//!   then dropped; a new master opens the directory and the owner re-attaches its segment;
//!   the time until every key's replica list is served again, against reading the journal's
//!   files from the page cache (the least a replay must do). Also the journal's bytes per
//!   object against the key plus its five numbers (id, size, segment, offset, length).

use crate::interleave::{judge, Judged};
use crate::report::Report;
use mooncake_rs::master::{
    JournalOptions, MasterApi, MasterConfig, MasterService, RemoteMaster, RpcMasterClient,
};
use mooncake_rs::rpc::Timeouts;
use mooncake_rs::types::{ClientId, ReplicateConfig, Segment, Uuid};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const THREADS: usize = 8;
const BATCH: usize = 1000;

fn segment(name: &str, epoch: u64) -> Segment {
    Segment {
        epoch,
        ..crate::load::segment(name)
    }
}

/// A directory under the temp dir, deleted on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(name: &str) -> Scratch {
        let unique = format!(
            "mc-bench-{name}-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        );
        Scratch(std::env::temp_dir().join(unique))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn put_batch(
    master: &dyn MasterApi,
    client: ClientId,
    keys: &[String],
    size: u64,
) -> Result<(), String> {
    put_batch_with(master, client, keys, size, ReplicateConfig::default())
}

/// Puts (start + end) `keys` of `size` bytes each with `config`; every key must succeed.
pub(crate) fn put_batch_with(
    master: &dyn MasterApi,
    client: ClientId,
    keys: &[String],
    size: u64,
    config: ReplicateConfig,
) -> Result<(), String> {
    let sizes = vec![size; keys.len()];
    let grants = master
        .batch_put_start(client, keys.to_vec(), sizes, config)
        .map_err(|e| format!("put start: {e}"))?;
    let tokens = grants
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("put start: {e}"))?
        .into_iter()
        .map(|grant| grant.token)
        .collect();
    let ends = master
        .batch_put_end(client, keys.to_vec(), tokens)
        .map_err(|e| format!("put end: {e}"))?;
    ends.into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("put end: {e}"))?;
    Ok(())
}

/// What each client thread does per key.
#[derive(Clone, Copy)]
pub(crate) enum Mix {
    /// Put (start + end) and get the replica list: 2 operations.
    PutGet,
    /// Put, get and remove: 3 operations (a removal waits until it is safe).
    PutGetRemove,
}

impl Mix {
    /// The mix's name in a bench line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mix::PutGet => "put+get",
            Mix::PutGetRemove => "put+get+remove",
        }
    }
}

/// Operations per second of [`THREADS`] clients of the master at `addr` for `duration`,
/// each running `mix` on fresh 4 KiB keys.
pub(crate) fn ops_per_second(
    addr: &str,
    duration: Duration,
    round: u64,
    mix: Mix,
) -> Result<f64, String> {
    let barrier = Arc::new(Barrier::new(THREADS));
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (addr, barrier, stop, ops) =
                (addr.to_string(), barrier.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let timeouts = Timeouts {
                    connect: Duration::from_secs(3),
                    request: Duration::from_secs(10),
                };
                let master = RpcMasterClient::with_timeouts(&addr, timeouts)
                    .map(RemoteMaster)
                    .map_err(|e| format!("connect: {e}"))?;
                let client = Uuid::random();
                barrier.wait();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("r{round}-t{thread}-{i}");
                    put_batch(&master, client, std::slice::from_ref(&key), 4096)?;
                    let _ = master.batch_get_replica_list(vec![key.clone()]);
                    let done = match mix {
                        Mix::PutGet => 2,
                        Mix::PutGetRemove => {
                            let _ = master.batch_remove(vec![key], true);
                            3
                        }
                    };
                    ops.fetch_add(done, Ordering::Relaxed);
                    i += 1;
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(duration);
    let counted = ops.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().map_err(|_| "worker panicked")??;
    }
    Ok(counted as f64 / duration.as_secs_f64())
}

/// A master (journaled in `dir` if given) with one big segment, served over RPC.
fn served(dir: Option<&Path>) -> Result<(Arc<MasterService>, mooncake_rs::rpc::RpcServer), String> {
    let service = match dir {
        Some(dir) => MasterService::open(MasterConfig::default(), JournalOptions::new(dir))
            .map_err(|e| format!("journal: {e}"))?,
        None => MasterService::new(MasterConfig::default()),
    };
    let owner = Uuid::random();
    service
        .mount_segment(owner, segment("bench-owner", 1))
        .map_err(|e| format!("mount: {e}"))?;
    // The owner (in process, not measured) stays alive: it pings while the master runs.
    let weak = Arc::downgrade(&service);
    std::thread::spawn(move || {
        while let Some(service) = weak.upgrade() {
            let _ = service.ping(owner);
            drop(service);
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let rpc = crate::scenarios::serve_master(service.clone())?;
    Ok((service, rpc))
}

fn throughput(report: &mut Report, quick: bool) -> Result<(), String> {
    let scratch = Scratch::new("journal-ops");
    let (plain, plain_rpc) = served(None)?;
    let (journaled, journaled_rpc) = served(Some(&scratch.0))?;
    let (plain_addr, journaled_addr) = (
        plain_rpc.local_addr().to_string(),
        journaled_rpc.local_addr().to_string(),
    );
    compare(
        report,
        quick,
        ("journal on", &journaled_addr),
        ("journal off", &plain_addr),
    )?;
    let flushes = journaled.metrics().journal.map_or(0, |j| j.flushes);
    eprintln!("journal: {flushes} group commits");
    plain_rpc.shutdown();
    journaled_rpc.shutdown();
    drop((plain, journaled));
    Ok(())
}

/// One judged line per [`Mix`]: ops/s of 8 client threads against the master at
/// `scenario.1`, limit the master at `limit.1` under the same load, interleaved rounds.
pub(crate) fn compare(
    report: &mut Report,
    quick: bool,
    scenario: (&str, &str),
    limit: (&str, &str),
) -> Result<(), String> {
    let duration = Duration::from_millis(if quick { 500 } else { 2000 });
    let round = AtomicU64::new(0);
    let next = || round.fetch_add(1, Ordering::Relaxed);
    for mix in [Mix::PutGet, Mix::PutGetRemove] {
        let what = Judged {
            name: &format!("{}: {} ops/s (8 thr)", scenario.0, mix.name()),
            unit: "ops/s",
            limit_name: &format!("{}, same load", limit.0),
            rounds: 5,
        };
        judge(
            report,
            &what,
            || ops_per_second(limit.1, duration, next(), mix),
            || ops_per_second(scenario.1, duration, next(), mix),
        )?;
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    entries
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Seconds to read every file of `dir` (the limit of a replay).
fn read_all(dir: &Path) -> Result<f64, String> {
    let started = Instant::now();
    let mut total = 0usize;
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        total += std::fs::read(entry.path())
            .map_err(|e| e.to_string())?
            .len();
    }
    std::hint::black_box(total);
    Ok(started.elapsed().as_secs_f64())
}

fn restart(report: &mut Report, objects: usize) -> Result<(), String> {
    let scratch = Scratch::new("journal-restart");
    let owner = Uuid::random();
    let mounted = segment("bench-owner", 7);
    let keys: Vec<String> = (0..objects).map(|i| format!("object-{i:08}")).collect();
    {
        let master = MasterService::open(MasterConfig::default(), JournalOptions::new(&scratch.0))
            .map_err(|e| format!("journal: {e}"))?;
        master
            .mount_segment(owner, mounted.clone())
            .map_err(|e| format!("mount: {e}"))?;
        for chunk in keys.chunks(BATCH) {
            put_batch(&*master, owner, chunk, 4096)?;
        }
        master.shutdown();
    }
    let bytes = dir_bytes(&scratch.0);
    let read_s = read_all(&scratch.0)?;
    let started = Instant::now();
    let master = MasterService::open(MasterConfig::default(), JournalOptions::new(&scratch.0))
        .map_err(|e| format!("journal: {e}"))?;
    let reattached = Segment {
        epoch: 8,
        ..mounted.clone()
    };
    let adopted = master
        .reattach_segment(owner, mounted.epoch, reattached)
        .map_err(|e| format!("reattach: {e}"))?;
    if !adopted {
        return Err("the segment was not re-attached".into());
    }
    for chunk in keys.chunks(BATCH) {
        let answers = master
            .batch_get_replica_list(chunk.to_vec())
            .map_err(|e| format!("get: {e}"))?;
        if let Some(missing) = answers.iter().position(Result::is_err) {
            return Err(format!(
                "{} is not readable after the restart",
                chunk[missing]
            ));
        }
    }
    let restart_s = started.elapsed().as_secs_f64();
    let name = format!("journal restart: {objects} objects readable");
    report.line(&name, restart_s, "s", "read the journal files", read_s);
    let raw = keys.iter().map(|k| k.len() as f64 + 40.0).sum::<f64>() / objects as f64;
    report.line(
        "journal bytes per object",
        bytes as f64 / objects as f64,
        "B",
        "key + 5 numbers, raw",
        raw,
    );
    Ok(())
}

/// Runs the journal scenarios.
pub fn run(report: &mut Report, quick: bool) -> Result<(), String> {
    throughput(report, quick)?;
    restart(report, if quick { 100_000 } else { 1_000_000 })
}
