//! `--ssd`: the SSD tier (`docs/ssd-tier.md`) against `fio` on the same directory, in
//! interleaved rounds of the same length, block size and parallelism.
//!
//! - **Disk-tier get** of 4 MiB and 64 KiB objects (every one on disk: a working set 8× the
//!   segment, then only keys whose replica is LOCAL_DISK), [`THREADS`] threads each getting
//!   random keys into their own buffer, against `fio --rw=randread --direct=1` with the same
//!   block size and `--numjobs` (psync: one I/O in flight per job, as one get per thread).
//! - **Demotion**: record bytes written per second while [`THREADS`] writers keep putting fresh
//!   keys into a full pool (the owner writes up to 16 records at a time, each `fdatasync`ed),
//!   against `fio --rw=write --direct=1 --fdatasync=1` with the object size as block size and
//!   16 jobs. Twice: into a **full tier** ([`FULL_TIER_SEGMENTS`] segments, trimmed by age, so
//!   records overwrite the spare files of trimmed ones: the steady state of a cache; fio
//!   rewrites its own files), and into a **growing tier** (no size limit: every record is a
//!   new file; fio writes new files of the object's size, each once).
//! - **DRAM hit** with the tier on: 4 KiB get latency (one thread, p50) of an object in
//!   memory, from a client with an SSD tier against one without.
//!
//! Needs `fio` on the PATH (Debian's `fio`); the directory is under `TMPDIR` (the temp dir),
//! so point `TMPDIR` at the disk to measure.

use crate::interleave::{judge, Judged};
use crate::journal::Scratch;
use crate::report::Report;
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Getting (and putting) threads, and fio's `--numjobs` for the reads.
const THREADS: usize = 4;
/// Parallel demotions of one tier (the owner's `DEMOTION_PARALLELISM`), fio's jobs for writes.
const DEMOTION_JOBS: usize = 16;
const MIB: u64 = 1 << 20;
/// The segment of the demotion lines' clients: room for [`DEMOTION_JOBS`] demotions of the
/// largest object in flight besides the puts that wait for them, as a real pool has.
const DEMOTION_SEGMENT: u64 = 256 * MIB;
/// The full tier's size limit, in segments.
const FULL_TIER_SEGMENTS: u64 = 16;
const TIER_LIMIT_VAR: &str = "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES";

/// A limit measured by `fio` (MB/s).
type Limit<'a> = dyn Fn() -> Result<f64, String> + 'a;

/// One embedded client with a `segment`-byte segment and, with `ssd`, an SSD tier there.
fn client(segment: u64, ssd: Option<&Path>) -> Result<Client, String> {
    Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: segment,
        local_buffer_size: 0,
        master_server_addr: "embedded".into(),
        ssd_offload_path: ssd.map(|p| p.display().to_string()).unwrap_or_default(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("setup: {e}: {}", mooncake_rs::error::last_error_message()))
}

/// A client whose tier in `dir` holds at most `limit` bytes, filled with `size`-byte objects
/// until it trims and reuses files (bounded: 120 s).
fn full_tier_client(segment: u64, dir: &Path, limit: u64, size: usize) -> Result<Client, String> {
    std::env::set_var(TIER_LIMIT_VAR, limit.to_string());
    let client = client(segment, Some(dir));
    std::env::remove_var(TIER_LIMIT_VAR);
    let client = client?;
    let value = vec![0xa5u8; size];
    let until = Instant::now() + Duration::from_secs(120);
    for i in 0.. {
        if client.metrics().ssd.is_some_and(|s| s.reused > 0) {
            return Ok(client);
        }
        if Instant::now() > until {
            return Err(format!("a {limit}-byte tier never reused a file"));
        }
        put(&client, &format!("fill-{i}"), &value)?;
    }
    unreachable!("the loop returns")
}

/// Puts `key`, waiting (bounded) while a full pool waits for demotions.
fn put(client: &Client, key: &str, value: &[u8]) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match client.put_from(key, value, &ReplicateConfig::default()) {
            Ok(()) => return Ok(()),
            Err(ErrorCode::NoAvailableHandle) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(format!("put {key}: {e}")),
        }
    }
}

fn on_disk(client: &Client, key: &str) -> bool {
    let answer = client.batch_get_replica_desc(&[key]).remove(0);
    answer.is_ok_and(|q| q.replicas.iter().any(|r| r.disk.is_some()))
}

/// Runs `fio` with `args` (plus JSON output) in `dir`; returns its summed bandwidth in MB/s.
fn fio(dir: &Path, args: &[String]) -> Result<f64, String> {
    let output = Command::new("fio")
        .arg(format!("--directory={}", dir.display()))
        .args([
            "--group_reporting",
            "--output-format=json",
            "--name=mc-bench",
        ])
        .args(args)
        .output()
        .map_err(|e| format!("fio: {e} (install Debian's fio)"))?;
    if !output.status.success() {
        return Err(format!("fio: {}", String::from_utf8_lossy(&output.stderr)));
    }
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("fio output: {e}"))?;
    let job = &json["jobs"][0];
    let bytes = job["read"]["bw_bytes"].as_f64().unwrap_or(0.0)
        + job["write"]["bw_bytes"].as_f64().unwrap_or(0.0);
    Ok(bytes / 1e6)
}

/// fio's arguments for [`DEMOTION_JOBS`] jobs writing `size`-byte files that do not exist
/// yet, each written once with `O_DIRECT` and `fdatasync`ed (created when first opened, no
/// preallocation), for `secs`: enough files per job that a round never runs out of new ones
/// at 4 GB/s (each loop's files are unlinked if one does, so no file is ever rewritten).
fn new_files_fio_args(size: usize, duration: Duration, secs: &str) -> Vec<String> {
    const MAX_RATE: f64 = 4e9;
    let per_job = (duration.as_secs_f64() * MAX_RATE / size as f64 / DEMOTION_JOBS as f64).ceil();
    [
        "--rw=write",
        "--direct=1",
        "--fdatasync=1",
        "--ioengine=psync",
        "--fallocate=none",
        "--create_on_open=1",
        "--openfiles=1",
        "--file_service_type=sequential",
        "--unlink_each_loop=1",
        "--time_based",
    ]
    .map(String::from)
    .into_iter()
    .chain([
        format!("--bs={size}"),
        format!("--filesize={size}"),
        format!("--nrfiles={}", (per_job as u64).max(64)),
        format!("--numjobs={DEMOTION_JOBS}"),
        secs.to_string(),
    ])
    .collect()
}

/// Empties `dir` (fio's new-file rounds start from no files).
fn recreate_dir(dir: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// MB/s of [`THREADS`] threads getting random keys of `keys` (`size` bytes each) for
/// `duration`.
fn get_rate(
    client: &Client,
    keys: &Arc<Vec<String>>,
    size: usize,
    duration: Duration,
) -> Result<f64, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (client, keys, stop, bytes) =
                (client.clone(), keys.clone(), stop.clone(), bytes.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut out = vec![0u8; size];
                while !stop.load(Ordering::Relaxed) {
                    let key = &keys[fastrand::usize(..keys.len())];
                    let n = client
                        .get_into(key, &mut out)
                        .map_err(|e| format!("get {key}: {e}"))?;
                    bytes.fetch_add(n, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker
            .join()
            .map_err(|_| "a get thread panicked".to_string())??;
    }
    Ok(bytes.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// Record MB/s written while [`THREADS`] writers put fresh `size`-byte keys for `duration`.
fn demotion_rate(
    client: &Client,
    size: usize,
    duration: Duration,
    round: u64,
) -> Result<f64, String> {
    let written = |c: &Client| c.metrics().ssd.map_or(0, |s| s.writes);
    let before = written(client);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let writers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (client, stop) = (client.clone(), stop.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let value = vec![thread as u8; size];
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    put(&client, &format!("w{round}-{thread}-{i}"), &value)?;
                    i += 1;
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(duration);
    let records = written(client) - before;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer
            .join()
            .map_err(|_| "a put thread panicked".to_string())??;
    }
    Ok(records as f64 * size as f64 / elapsed.as_secs_f64() / 1e6)
}

/// p50 in µs of single-thread 4 KiB gets of one in-memory key.
fn dram_hit_p50(client: &Client, key: &str, duration: Duration) -> Result<f64, String> {
    let mut out = vec![0u8; 4096];
    let mut samples = Vec::new();
    let until = Instant::now() + duration;
    while Instant::now() < until {
        let started = Instant::now();
        client
            .get_into(key, &mut out)
            .map_err(|e| format!("get {key}: {e}"))?;
        samples.push(started.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Ok(samples.get(samples.len() / 2).copied().unwrap_or(0.0))
}

/// The disk-tier measurements for objects of `size` bytes.
fn run_size(
    report: &mut Report,
    size: usize,
    label: &str,
    duration: Duration,
    rounds: usize,
) -> Result<(), String> {
    let scratch = Scratch::new("ssd");
    let (tier_dir, fio_dir) = (scratch.0.join("tier"), scratch.0.join("fio"));
    let fio_read_dir = scratch.0.join("fio-read");
    for dir in [&fio_dir, &fio_read_dir] {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let segment = 64 * MIB;
    let client = client(segment, Some(&tier_dir))?;
    let count = (8 * segment as usize / size).max(64);
    let value = vec![0x5au8; size];
    for i in 0..count {
        put(&client, &format!("r-{i}"), &value)?;
    }
    let per_job = format!("--size={}", count * size / THREADS);
    let bs = format!("--bs={size}");
    // fio's read files are written now, with the records they are compared with: both are
    // equally old when read (a virtual disk's host cache favours what was written last).
    let read_jobs = format!("--numjobs={THREADS}");
    let layout = [
        "--rw=write",
        "--direct=1",
        "--ioengine=psync",
        &bs,
        &per_job,
        &read_jobs,
    ];
    fio(&fio_read_dir, &layout.map(String::from))?;
    let secs = format!("--runtime={}ms", duration.as_millis());
    let fio_args = |mode: &[&str]| -> Vec<String> {
        let common = ["--direct=1", "--ioengine=psync", "--time_based"];
        let sized = [bs.clone(), per_job.clone(), secs.clone()];
        (mode.iter().chain(&common).map(|s| s.to_string()))
            .chain(sized)
            .collect()
    };
    // Demotions first, while every object in memory is evictable (the reads below lease
    // what they look at).
    let jobs = format!("--numjobs={DEMOTION_JOBS}");
    let write_args = fio_args(&["--rw=write", "--fdatasync=1", &jobs]);
    let new_files_args = new_files_fio_args(size, duration, &secs);
    let new_files_dir = scratch.0.join("fio-new-files");
    let full_dir = scratch.0.join("full-tier");
    let full = full_tier_client(
        DEMOTION_SEGMENT,
        &full_dir,
        FULL_TIER_SEGMENTS * DEMOTION_SEGMENT,
        size,
    )?;
    let growing = self::client(DEMOTION_SEGMENT, Some(&scratch.0.join("growing-tier")))?;
    let round = AtomicU64::new(0);
    // The full tier writes into spare files, as fio rewrites its own files; the growing tier
    // creates a file per record, as fio does with new files of the record's size.
    let overwrite_limit = format!("fio write direct fdatasync bs={label}, {DEMOTION_JOBS} jobs");
    let new_files_limit =
        format!("fio write direct fdatasync into new {label} files, {DEMOTION_JOBS} jobs");
    let overwrite = || fio(&fio_dir, &write_args);
    let new_files = || {
        recreate_dir(&new_files_dir)?;
        fio(&new_files_dir, &new_files_args)
    };
    let tiers: [(&str, &Client, &str, &Limit); 2] = [
        ("full", &full, &overwrite_limit, &overwrite),
        ("growing", &growing, &new_files_limit, &new_files),
    ];
    for (tier, client, limit_name, limit) in tiers {
        judge(
            report,
            &Judged {
                name: &format!(
                    "ssd tier: demotion of {label} objects, {tier} tier, MB/s ({THREADS} put thr)"
                ),
                unit: "MB/s",
                limit_name,
                rounds,
            },
            limit,
            || {
                demotion_rate(
                    client,
                    size,
                    duration,
                    round.fetch_add(1, Ordering::Relaxed),
                )
            },
        )?;
    }
    drop((full, growing));
    let keys: Vec<String> = (0..count)
        .map(|i| format!("r-{i}"))
        .filter(|k| on_disk(&client, k))
        .collect();
    if keys.len() < count / 2 {
        return Err(format!(
            "only {} of {count} objects reached the disk",
            keys.len()
        ));
    }
    let keys = Arc::new(keys);
    let read_args = fio_args(&["--rw=randread", &read_jobs]);
    judge(
        report,
        &Judged {
            name: &format!("ssd tier: get {label} from disk, MB/s ({THREADS} thr)"),
            unit: "MB/s",
            limit_name: &format!("fio randread direct bs={label}, {THREADS} jobs"),
            rounds,
        },
        || fio(&fio_read_dir, &read_args),
        || get_rate(&client, &keys, size, duration),
    )?;
    Ok(())
}

/// The DRAM-hit latency with the tier on against off.
fn dram_hit(report: &mut Report, duration: Duration, rounds: usize) -> Result<(), String> {
    let scratch = Scratch::new("ssd-hit");
    let with_tier = client(64 * MIB, Some(&scratch.0))?;
    let without = client(64 * MIB, None)?;
    for c in [&with_tier, &without] {
        put(c, "hot", &[7u8; 4096])?;
    }
    judge(
        report,
        &Judged {
            name: "ssd tier on: 4 KiB DRAM-hit get p50 (1 thr)",
            unit: "us",
            limit_name: "the same get, tier off (1 thr)",
            rounds,
        },
        || dram_hit_p50(&without, "hot", duration),
        || dram_hit_p50(&with_tier, "hot", duration),
    )?;
    Ok(())
}

/// Runs the `--ssd` lines.
pub fn run(report: &mut Report, quick: bool) -> Result<(), String> {
    let duration = Duration::from_millis(if quick { 500 } else { 2000 });
    let rounds = if quick { 3 } else { 5 };
    dram_hit(report, duration, rounds)?;
    run_size(report, 4 << 20, "4 MiB", duration, rounds)?;
    run_size(report, 64 << 10, "64 KiB", duration, rounds)
}
