//! `--master-scale`: what one master holds and does at a scale of millions of objects, in
//! process (no RPC in the way of the table's own cost) and over RPC.
//!
//! - **Memory**: the master's resident memory per object (RSS growth over the objects put,
//!   64-byte values, 23-byte keys, one replica) at each size, and per additional replica.
//! - **Throughput**: single-key and batched (1 000 keys) put, get (replica list), exist and
//!   remove op/s at each size, for each thread count of [`thread_counts`] (1, 2, 4, … up to
//!   this machine's cores: the same command measures 8 and 16 threads on a machine that has
//!   them); at the first size also over loopback RPC (the request path: decode, shard lock,
//!   encode), servers of as many threads, the same connections to each. Every phase is
//!   measured [`REPEATS`] times, the thread counts taking turns each time; a line reports the
//!   median.
//! - **Scans**: the latency of single-key gets while `remove_all` of the whole table runs.
//!
//! Sizes: 1 M (`--quick`), or 1 M, 10 M and 30 M (about 6 GB of this process).

use crate::limits::{median, percentile};
use crate::report::Report;
use mooncake_rs::master::{MasterApi, MasterConfig, MasterService, RemoteMasterApi};
use mooncake_rs::types::{ClientId, ReplicateConfig, Uuid};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keys put per batch call.
const BATCH: usize = 1000;

/// This process's resident set, in bytes.
fn rss_bytes() -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm").map_err(|e| format!("statm: {e}"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .ok_or("statm: no resident field")?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(pages * u64::try_from(page).unwrap_or(4096))
}

/// The 23-byte key of object `index`.
fn key(index: usize) -> String {
    format!("scale-object-{index:010}")
}

fn keys(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(key).collect()
}

/// A master with `segments` mounted 1 TiB segments (owned by no real process) and the
/// client that owns them.
fn master(segments: usize) -> Result<(Arc<MasterService>, ClientId), String> {
    let service = MasterService::new(MasterConfig::default());
    let owner = Uuid::random();
    for index in 0..segments {
        service
            .mount_segment(owner, crate::load::segment(&format!("scale-{index}")))
            .map_err(|e| format!("mount: {e}"))?;
    }
    Ok((service, owner))
}

/// Puts the objects `range` (64 B each, `replicas` replicas) in batches; the owner pings
/// between batches (it would expire otherwise).
fn fill(
    master: &dyn MasterApi,
    owner: ClientId,
    range: std::ops::Range<usize>,
    replicas: u64,
) -> Result<(), String> {
    let config = ReplicateConfig {
        replica_num: replicas,
        ..ReplicateConfig::default()
    };
    for first in range.clone().step_by(BATCH) {
        let batch = keys(first..range.end.min(first + BATCH));
        crate::journal::put_batch_with(master, owner, &batch, 64, config.clone())?;
        master.ping(owner).map_err(|e| format!("ping: {e}"))?;
    }
    Ok(())
}

/// The operations measured.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Put,
    Get,
    Exist,
    Remove,
}

const OPS: [Op; 4] = [Op::Put, Op::Get, Op::Exist, Op::Remove];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::Exist => "exist",
            Op::Remove => "remove",
        }
    }

    /// Runs the operation on `keys`, one call for them all.
    fn call(self, master: &dyn MasterApi, owner: ClientId, keys: &[String]) -> Result<(), String> {
        fn all_ok<T, E>(op: Op, answers: Vec<Result<T, E>>) -> Result<(), String> {
            match answers.iter().all(Result::is_ok) {
                true => Ok(()),
                false => Err(format!("{}: a key failed", op.name())),
            }
        }
        let keys_owned = keys.to_vec();
        match self {
            Op::Put => crate::journal::put_batch_with(master, owner, keys, 64, Default::default()),
            Op::Get => all_ok(
                self,
                master
                    .batch_get_replica_list(keys_owned)
                    .map_err(|e| e.to_string())?,
            ),
            Op::Exist => all_ok(
                self,
                master
                    .batch_exist_key(keys_owned)
                    .map_err(|e| e.to_string())?,
            ),
            Op::Remove => all_ok(
                self,
                master
                    .batch_remove(keys_owned, true)
                    .map_err(|e| e.to_string())?,
            ),
        }
    }
}

/// Keys per thread of a single-key phase, and batches per thread of a batched one: also with
/// `--quick`, phases of a few ms (10 000 keys) gave two threads the rate of one on this VM
/// (the second CPU's wake-up is part of a phase that short).
fn rounds(batch: usize) -> usize {
    match batch {
        1 => 40_000,
        _ => 40,
    }
}

/// Who a phase's workers call: one master per worker thread (the in-process service shared,
/// or one RPC connection each), and the prefix of the keys they own.
struct Target<'a> {
    masters: Vec<&'a dyn MasterApi>,
    prefix: String,
}

/// Times every phase is measured; a line reports the median of its phases.
const REPEATS: usize = 3;

/// The thread counts measured: powers of two from 1 up to this machine's cores (at least 2).
fn thread_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism()
        .map_or(2, usize::from)
        .max(2);
    std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n <= cores)
        .collect()
}

/// The median op/s of each operation (in [`OPS`] order) for each of `targets`, over
/// [`REPEATS`] rounds of phases of fresh keys (put all, get all, exist all, remove all),
/// `batch` keys per call; the targets take turns in each round (one target's keys at a time
/// in the table), so that a slow minute of the machine falls on all of them. The owner is
/// kept alive throughout (a phase of many connections can outlast its TTL).
fn op_rates(targets: &[Target], owner: ClientId, batch: usize) -> Result<Vec<Vec<f64>>, String> {
    let calls = rounds(batch);
    let thread_keys: Vec<Vec<Vec<String>>> = targets
        .iter()
        .map(|target| {
            (0..target.masters.len())
                .map(|t| {
                    (0..calls * batch)
                        .map(|i| format!("{}-{t}-{i:08}", target.prefix))
                        .collect()
                })
                .collect()
        })
        .collect();
    let mut phases = vec![vec![Vec::new(); OPS.len()]; targets.len()];
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<(), String> {
        let heartbeat = scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = targets[0].masters[0].ping(owner);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let measured = measure_phases(targets, owner, batch, &thread_keys, &mut phases);
        stop.store(true, Ordering::Relaxed);
        let _ = heartbeat.join();
        measured
    })?;
    Ok(phases
        .into_iter()
        .map(|target| target.into_iter().map(|mut op| median(&mut op)).collect())
        .collect())
}

/// The phases of [`op_rates`]: op/s pushed to `phases[target][op]`.
fn measure_phases(
    targets: &[Target],
    owner: ClientId,
    batch: usize,
    thread_keys: &[Vec<Vec<String>>],
    phases: &mut [Vec<Vec<f64>>],
) -> Result<(), String> {
    let calls = rounds(batch);
    let turns = (0..REPEATS).flat_map(|_| targets.iter().enumerate());
    for (index, target) in turns {
        for (line, op) in OPS.into_iter().enumerate() {
            let started = Instant::now();
            std::thread::scope(|scope| {
                let workers: Vec<_> = thread_keys[index]
                    .iter()
                    .zip(&target.masters)
                    .map(|(keys, &master)| {
                        scope.spawn(move || -> Result<(), String> {
                            for chunk in keys.chunks(batch) {
                                op.call(master, owner, chunk)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .try_for_each(|w| w.join().map_err(|_| "worker panicked".to_string())?)
            })?;
            let ops = (target.masters.len() * calls * batch) as f64;
            phases[index][line].push(ops / started.elapsed().as_secs_f64());
        }
    }
    Ok(())
}

/// Keys of each thread's private table in [`machine_scaling`] (fewer with more than 8 threads:
/// 8 M keys in all at most).
const PRIVATE_KEYS: usize = 1_000_000;

/// What this machine gives several threads for work like a table's that shares nothing: each
/// thread looks up its own keys in its own hash map of [`PRIVATE_KEYS`] 23-byte keys. The
/// median rate of [`REPEATS`] rounds per thread count (taking turns), reported against that
/// many times one thread's: the limit the table's own scaling lines are read against.
fn machine_scaling(report: &mut Report) {
    let lookups = rounds(1) * 10;
    let counts = thread_counts();
    let most = counts.iter().max().copied().unwrap_or(1);
    let per_table = PRIVATE_KEYS.min(8 * PRIVATE_KEYS / most);
    let tables: Vec<std::collections::HashMap<String, usize>> = (0..most)
        .map(|t| {
            (0..per_table)
                .map(|i| (format!("private-{t}-{i:010}"), i))
                .collect()
        })
        .collect();
    let probes: Vec<Vec<String>> = (0..tables.len())
        .map(|t| {
            (0..lookups)
                .map(|i| format!("private-{t}-{:010}", i * 7919 % per_table))
                .collect()
        })
        .collect();
    let mut phases = vec![Vec::new(); counts.len()];
    for _ in 0..REPEATS {
        for (index, &threads) in counts.iter().enumerate() {
            let started = Instant::now();
            let found: usize = std::thread::scope(|scope| {
                let workers: Vec<_> = tables[..threads]
                    .iter()
                    .zip(&probes)
                    .map(|(table, keys)| {
                        scope.spawn(move || keys.iter().filter_map(|k| table.get(k)).count())
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
            });
            let elapsed = started.elapsed().as_secs_f64();
            phases[index].push(std::hint::black_box(found) as f64 / elapsed);
        }
    }
    let rates: Vec<f64> = phases.iter_mut().map(|phase| median(phase)).collect();
    for (&threads, rate) in counts.iter().zip(&rates).skip(1) {
        let name = format!("machine: private hash-map lookups, {threads} threads");
        let limit = format!("{threads} x 1 thread");
        report.line(&name, *rate, "op/s", &limit, threads as f64 * rates[0]);
    }
}

/// Connections of each RPC measurement per server thread of the largest server: enough
/// calls in flight for all its threads.
const RPC_CONNECTIONS_PER_THREAD: usize = 2;

/// The same service behind RPC servers of each of [`thread_counts`] threads (loopback), the
/// same number of connections to each. The servers stop on drop.
struct RpcServers {
    _servers: Vec<mooncake_rs::rpc::RpcServer>,
    /// Per server: its thread count and the connections to it.
    connections: Vec<(usize, Vec<RemoteMasterApi>)>,
}

impl RpcServers {
    fn start(service: &Arc<MasterService>) -> Result<RpcServers, String> {
        let api: Arc<dyn MasterApi> = service.clone();
        let counts = thread_counts();
        let per_server = RPC_CONNECTIONS_PER_THREAD * counts.iter().max().copied().unwrap_or(1);
        let mut servers = Vec::new();
        let mut connections = Vec::new();
        for threads in counts {
            let addr = "127.0.0.1:0".parse().map_err(|_| "addr")?;
            let server =
                mooncake_rs::master::remote::serve_with_threads(addr, api.clone(), threads)
                    .map_err(|e| format!("rpc server: {e}"))?;
            let target = server.local_addr().to_string();
            let list = (0..per_server)
                .map(|_| crate::load::connect(&target, Duration::from_secs(30)))
                .collect::<Result<Vec<_>, _>>()?;
            connections.push((threads, list));
            servers.push(server);
        }
        Ok(RpcServers {
            _servers: servers,
            connections,
        })
    }

    /// The request path's op/s of `batch`-key calls per server, taking turns; `in_process`
    /// holds the one-thread in-process op/s of the same calls.
    fn report(
        &self,
        report: &mut Report,
        owner: ClientId,
        batch: usize,
        in_process: &[f64],
    ) -> Result<(), String> {
        let targets: Vec<Target> = self
            .connections
            .iter()
            .map(|(threads, list)| Target {
                masters: list.iter().map(|c| c as &dyn MasterApi).collect(),
                prefix: format!("scale-rpc-{threads}-{batch}"),
            })
            .collect();
        let rates = op_rates(&targets, owner, batch)?;
        let mode = mode_name(batch);
        for (line, op) in OPS.into_iter().enumerate() {
            let one = rates[0][line];
            for ((threads, list), rate) in self.connections.iter().zip(&rates) {
                let name = format!(
                    "{} op/s over RPC, {mode}, {} connections, {}",
                    op.name(),
                    list.len(),
                    threads_name(*threads, "server thread")
                );
                match threads {
                    1 => report.line(
                        &name,
                        rate[line],
                        "op/s",
                        "in process, 1 thread",
                        in_process[line],
                    ),
                    n => report.line(
                        &name,
                        rate[line],
                        "op/s",
                        &format!("{n} x 1 server thread"),
                        *n as f64 * one,
                    ),
                }
            }
        }
        Ok(())
    }
}

/// "1 thread", "2 threads", … (`what` the singular).
fn threads_name(threads: usize, what: &str) -> String {
    match threads {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

fn mode_name(batch: usize) -> &'static str {
    match batch {
        1 => "single-key",
        _ => "batch of 1000",
    }
}

/// At most this many latencies are kept (a uniform sample of a longer run).
const SAMPLES: usize = 4_000_000;

/// Single-key gets of `probes` until `stop`: a uniform sample of their latencies (µs) over
/// the whole run, the slowest, and how many.
fn get_latencies(
    master: &dyn MasterApi,
    probes: &[String],
    stop: &AtomicBool,
) -> (Vec<f64>, f64, u64) {
    let (mut sample, mut slowest, mut gets, mut stride) = (Vec::new(), 0.0f64, 0u64, 1u64);
    for key in probes.iter().cycle() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let sent = Instant::now();
        let _ = master.batch_get_replica_list(vec![key.clone()]);
        let latency = sent.elapsed().as_secs_f64() * 1e6;
        slowest = slowest.max(latency);
        gets += 1;
        if gets % stride == 0 {
            sample.push(latency);
            if sample.len() >= SAMPLES {
                // Every other one: the sample stays uniform over the run.
                sample = sample.iter().step_by(2).copied().collect();
                stride *= 2;
            }
        }
    }
    (sample, slowest, gets)
}

/// Gets while `remove_all` empties the table, against gets of the same keys on the idle
/// master just before.
fn gets_under_remove_all(
    report: &mut Report,
    master: &Arc<MasterService>,
    owner: ClientId,
    objects: usize,
) -> Result<(), String> {
    let probes: Vec<String> = (0..1000).map(|i| format!("scale-probe-{i:04}")).collect();
    // Read all the time, the probes hold read leases: `remove_all` (not forced) skips them.
    crate::journal::put_batch_with(&**master, owner, &probes, 64, Default::default())?;
    let stop = AtomicBool::new(false);
    let (mut idle, _, _) = std::thread::scope(|scope| {
        let getter = scope.spawn(|| get_latencies(&**master, &probes, &stop));
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        getter.join().unwrap_or_default()
    });
    stop.store(false, Ordering::Relaxed);
    let ((mut during, slowest, gets), removed, scan) = std::thread::scope(|scope| {
        let getter = scope.spawn(|| get_latencies(&**master, &probes, &stop));
        // The owner of the objects stays alive through a long scan (not measured).
        let heartbeat = scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = master.ping(owner);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let started = Instant::now();
        let before = master.metrics().scan_removed;
        let removed = crate::load::remove_all_until_done(&**master, false)
            .map(|(calls, longest)| (master.metrics().scan_removed - before, calls, longest));
        let scan = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let _ = heartbeat.join();
        (getter.join().unwrap_or_default(), removed, scan)
    });
    let (removed, calls, longest) = removed?;
    if removed != objects as u64 {
        return Err(format!("remove_all removed {removed} of {objects}"));
    }
    let name = format!(
        "get p50 during remove_all of {removed} keys ({:.1} s, {calls} calls)",
        scan.as_secs_f64()
    );
    report.line(
        &name,
        percentile(&mut during, 0.5),
        "us",
        "idle get p50",
        percentile(&mut idle, 0.5),
    );
    let name = format!("get p99 during remove_all ({gets} gets)");
    report.line(
        &name,
        percentile(&mut during, 0.99),
        "us",
        "idle get p99",
        percentile(&mut idle, 0.99),
    );
    report.line(
        "get max during remove_all",
        slowest,
        "us",
        "2 s ping timeout",
        2e6,
    );
    report.line(
        &format!("remove_all of {removed} keys, longest call"),
        longest.as_secs_f64(),
        "s",
        "30 s RPC timeout",
        30.0,
    );
    Ok(())
}

/// Runs the scenario and prints its lines.
pub fn run(report: &mut Report, quick: bool) -> Result<(), String> {
    let sizes: &[usize] = if quick {
        &[1_000_000]
    } else {
        &[1_000_000, 10_000_000, 30_000_000]
    };
    let (service, owner) = master(1)?;
    // Started before the base is taken: their threads and buffers are not the table's.
    let mut rpc = Some(RpcServers::start(&service)?);
    let base = rss_bytes()?;
    let mut filled = 0;
    // op/s at the first size: the limit of the same line at the larger sizes.
    let mut first_rates: Vec<f64> = Vec::new();
    for &size in sizes {
        fill(&*service, owner, filled..size, 1)?;
        filled = size;
        let per_object = (rss_bytes()?.saturating_sub(base)) as f64 / size as f64;
        report.line(
            &format!("master RSS per object at {size} objects (1 replica)"),
            per_object,
            "B",
            "200 B target",
            200.0,
        );
        let mut line = 0;
        for batch in [1, BATCH] {
            let targets = in_process(&service, batch);
            let rates = op_rates(&targets, owner, batch)?;
            let mode = mode_name(batch);
            for (index, op) in OPS.into_iter().enumerate() {
                let one = rates[0][index];
                if first_rates.len() <= line {
                    first_rates.push(one);
                }
                for (target, rate) in targets.iter().zip(&rates) {
                    let threads = target.masters.len();
                    let name = format!(
                        "{} op/s at {size} objects, {mode}, {}",
                        op.name(),
                        threads_name(threads, "thread")
                    );
                    match threads {
                        1 => report.line(
                            &name,
                            one,
                            "op/s",
                            "same at 1 M objects",
                            first_rates[line],
                        ),
                        n => report.line(
                            &name,
                            rate[index],
                            "op/s",
                            &format!("{n} x 1 thread"),
                            n as f64 * one,
                        ),
                    }
                }
                line += 1;
            }
            if let Some(rpc) = &rpc {
                rpc.report(report, owner, batch, &rates[0])?;
            }
        }
        // Measured at the first size only: its servers and connections go.
        rpc = None;
    }
    gets_under_remove_all(report, &service, owner, filled)?;
    drop(service);
    // SAFETY: malloc_trim has no preconditions; it returns the freed table to the system so
    // that the next base is not inflated by it.
    unsafe { libc::malloc_trim(0) };
    let (service, owner) = master(2)?;
    let base = rss_bytes()?;
    let size = sizes[0];
    fill(&*service, owner, 0..size, 2)?;
    let two = (rss_bytes()?.saturating_sub(base)) as f64 / size as f64;
    report.line(
        &format!("master RSS per object at {size} objects (2 replicas)"),
        two,
        "B",
        "200 B target",
        200.0,
    );
    drop(service);
    spread_rates(report)?;
    // Last: its tables would otherwise be reused by the master and hide its memory growth.
    machine_scaling(report);
    Ok(())
}

/// Each of [`thread_counts`] threads calling `service` in process, `batch` keys per call.
fn in_process(service: &Arc<MasterService>, batch: usize) -> Vec<Target<'_>> {
    thread_counts()
        .into_iter()
        .map(|threads| Target {
            masters: vec![&**service as &dyn MasterApi; threads],
            prefix: format!("scale-op-{threads}-{batch}"),
        })
        .collect()
}

/// Segments of [`spread_rates`]' pool per thread of its largest thread count.
const SPREAD_SEGMENTS_PER_THREAD: usize = 4;

/// op/s of each thread count on an empty pool of [`SPREAD_SEGMENTS_PER_THREAD`] segments per
/// thread of the largest count: placement starts at a random segment, so threads'
/// allocations seldom meet at one segment's allocator lock (the single-segment lines above
/// always do).
fn spread_rates(report: &mut Report) -> Result<(), String> {
    let most = thread_counts().into_iter().max().unwrap_or(1);
    let segments = SPREAD_SEGMENTS_PER_THREAD * most;
    let (service, owner) = master(segments)?;
    for batch in [1, BATCH] {
        let targets = in_process(&service, batch);
        let rates = op_rates(&targets, owner, batch)?;
        let mode = mode_name(batch);
        for (index, op) in OPS.into_iter().enumerate() {
            let one = rates[0][index];
            for (target, rate) in targets.iter().zip(&rates).skip(1) {
                let threads = target.masters.len();
                let name = format!(
                    "{} op/s, {mode}, {segments} segments, {threads} threads",
                    op.name()
                );
                let limit = format!("{threads} x 1 thread, same pool");
                report.line(&name, rate[index], "op/s", &limit, threads as f64 * one);
            }
        }
    }
    Ok(())
}
