//! A linearizability check of the location cache (`docs/location-cache.md`) with real
//! processes: a `mooncake_master`, one writer process (it owns the segment) upserting and
//! force-removing a shared key set, and three reader processes with the cache on reading it
//! as fast as they can. The readers reach the master through a proxy that delays every chunk
//! by [`MASTER_DELAY`] (their revocations arrive late: a write acknowledged without waiting
//! for them would be read stale), and one reader is SIGSTOPped for longer than a cached lease
//! and resumed.
//!
//! Every operation is logged with its start and end on `CLOCK_MONOTONIC` (shared by the
//! processes of one machine). The check: a get that started after a write of its key was
//! acknowledged returns that write's value or the value of a write that overlapped the get
//! (never an older one); every value read is exactly some write's bytes; the writer is never
//! held up by the stopped reader for more than one cached lease.
//!
//! The child processes are this test binary run again with `MC_LIN_ROLE` set (the test
//! `child_process` does nothing without it).

mod common;

use common::{local_client, signal_child, Master, TcpProxy};
use mooncake_rs::error::ErrorCode;
use mooncake_rs::types::ReplicateConfig;
use std::collections::HashMap;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: u64 = 8;
const VALUE_LEN: usize = 4096;
const CACHE_LEASE_MS: u64 = 1_000;
const RUN: Duration = Duration::from_secs(6);
const READERS: usize = 3;
/// How much longer than the readers the writer runs (they start 1.5 s after it).
const WRITER_EXTRA: Duration = Duration::from_millis(3_000);
/// Reads one reader logs at most.
const MAX_READS: usize = 60_000;
/// What the proxy between the readers and the master adds to every chunk, each way.
const MASTER_DELAY: Duration = Duration::from_millis(30);
/// The writer's pause between writes (readers hit their caches between them).
const WRITE_PAUSE: Duration = Duration::from_millis(20);
/// How long the first reader stays stopped (longer than a cached lease).
const STOPPED: Duration = Duration::from_millis(2_500);

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The bytes of version `version` of key `key`: a header naming both, then a pattern of both.
fn value(key: u64, version: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(VALUE_LEN);
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    let mut x = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version;
    while out.len() < VALUE_LEN {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push((x >> 56) as u8);
    }
    out
}

/// What a logged operation left (or found) under its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Version(u64),
    Absent,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    key: u64,
    outcome: Outcome,
    start: u64,
    end: u64,
}

fn log_line(kind: &str, op: &Op) -> String {
    let outcome = match op.outcome {
        Outcome::Version(v) => v.to_string(),
        Outcome::Absent => "absent".into(),
    };
    format!("LIN {kind} {} {outcome} {} {}\n", op.key, op.start, op.end)
}

fn parse(line: &str) -> Option<(String, Op)> {
    let mut parts = line.strip_prefix("LIN ")?.split(' ');
    let kind = parts.next()?.to_string();
    let key = parts.next()?.parse().ok()?;
    let outcome = match parts.next()? {
        "absent" => Outcome::Absent,
        v => Outcome::Version(v.parse().ok()?),
    };
    let start = parts.next()?.parse().ok()?;
    let end = parts.next()?.parse().ok()?;
    Some((
        kind,
        Op {
            key,
            outcome,
            start,
            end,
        },
    ))
}

/// The writer: versions 1.. of every key, then upserts (and now and then a forced removal)
/// of random keys until `RUN` is over. Logs every acknowledged write.
fn writer(master: &str) {
    let client = local_client(master, 128 << 20, 1 << 20);
    let config = ReplicateConfig::default();
    let mut out = std::io::stdout().lock();
    let mut version = 0u64;
    let mut write = |key: u64, remove: bool, out: &mut dyn Write| {
        let start = monotonic_ns();
        let outcome = if remove {
            match client.remove(&format!("k{key}"), true) {
                Ok(()) | Err(ErrorCode::ObjectNotFound) => Outcome::Absent,
                Err(e) => panic!("remove k{key}: {e}"),
            }
        } else {
            version += 1;
            client
                .upsert(&format!("k{key}"), &value(key, version), &config)
                .unwrap_or_else(|e| panic!("upsert k{key}: {e}"));
            Outcome::Version(version)
        };
        let op = Op {
            key,
            outcome,
            start,
            end: monotonic_ns(),
        };
        out.write_all(log_line("W", &op).as_bytes()).unwrap();
    };
    for key in 0..KEYS {
        write(key, false, &mut out);
    }
    out.write_all(b"LIN READY 0 0 0 0\n").unwrap();
    out.flush().unwrap();
    // Outlives the readers (they start later): its teardown takes every key away.
    let until = Instant::now() + RUN + WRITER_EXTRA;
    while Instant::now() < until {
        write(fastrand::u64(..KEYS), fastrand::u8(..10) == 0, &mut out);
        std::thread::sleep(WRITE_PAUSE);
    }
    out.flush().unwrap();
    client.teardown();
}

/// A reader: random keys until `RUN` is over or `MAX_READS`; logs every outcome, and
/// reports bytes that are no write's as `BAD`.
fn reader(master: &str) {
    let client = local_client(master, 0, 1 << 20);
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; VALUE_LEN];
    let until = Instant::now() + RUN;
    let mut reads = 0;
    while Instant::now() < until && reads < MAX_READS {
        reads += 1;
        let key = fastrand::u64(..KEYS);
        let start = monotonic_ns();
        let outcome = match client.get_into(&format!("k{key}"), &mut buf) {
            Ok(n) => {
                let version = u64::from_le_bytes(buf[8..16].try_into().unwrap());
                if n as usize != VALUE_LEN || buf != value(key, version) {
                    writeln!(out, "LIN BAD {key} 0 {start} {}", monotonic_ns()).unwrap();
                    continue;
                }
                Outcome::Version(version)
            }
            Err(ErrorCode::ObjectNotFound) => Outcome::Absent,
            // Being rewritten: no value either way (not logged).
            Err(ErrorCode::ReplicaIsNotReady) => continue,
            Err(e) => panic!("get k{key}: {e}"),
        };
        let op = Op {
            key,
            outcome,
            start,
            end: monotonic_ns(),
        };
        out.write_all(log_line("R", &op).as_bytes()).unwrap();
    }
    let stats = client.metrics().location_cache;
    writeln!(
        out,
        "LIN STATS {} {} {} {} {}",
        stats.hits, stats.misses, stats.revocations, stats.clears, stats.renewals
    )
    .unwrap();
    out.flush().unwrap();
    client.teardown();
}

/// Runs the role named by `MC_LIN_ROLE` (nothing without it: a plain test run).
#[test]
fn child_process() {
    let (Ok(role), Ok(master)) = (std::env::var("MC_LIN_ROLE"), std::env::var("MC_LIN_MASTER"))
    else {
        return;
    };
    match role.as_str() {
        "writer" => writer(&master),
        "reader" => reader(&master),
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: &str, master: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MC_LIN_ROLE", role)
        .env("MC_LIN_MASTER", master)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a child test process")
}

/// Collects a child's log (bounded: the child ends by itself after `RUN`).
fn collect(child: Child) -> Vec<String> {
    let output = child.wait_with_output().expect("child output");
    assert!(
        output.status.success(),
        "a child failed: {:?}",
        output.status
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with("LIN "))
        .map(String::from)
        .collect()
}

/// The violations of `reads` against the acknowledged `writes` (one key's, any order).
fn violations(writes: &[Op], reads: &[Op]) -> Vec<String> {
    let mut writes = writes.to_vec();
    writes.sort_by_key(|w| w.end);
    let mut found = Vec::new();
    for read in reads {
        // The last write acknowledged before the read started, and every write that
        // overlapped the read.
        let acked = writes.iter().rev().find(|w| w.end < read.start);
        let mut allowed: Vec<Outcome> = writes
            .iter()
            .filter(|w| w.start < read.end && acked.is_none_or(|a| w.end > a.end))
            .map(|w| w.outcome)
            .collect();
        match acked {
            Some(a) => allowed.push(a.outcome),
            None => allowed.push(Outcome::Absent),
        }
        if !allowed.contains(&read.outcome) {
            found.push(format!(
                "key {}: read [{}, {}] returned {:?}; last acknowledged before it: {:?}",
                read.key, read.start, read.end, read.outcome, acked
            ));
        }
    }
    found
}

#[test]
fn no_get_returns_a_value_older_than_an_acknowledged_write() {
    let lease = format!("--location_cache_lease_ms={CACHE_LEASE_MS}");
    let master = Master::start(&[&lease]);
    let addr = master.addr();
    let slow_link = TcpProxy::start_delayed(master.port, MASTER_DELAY);
    let readers_addr = format!("127.0.0.1:{}", slow_link.port);
    let writer = spawn("writer", &addr);
    // Readers start once every key has a first version (the writer logs READY): reads of
    // never-written keys are not the point here.
    std::thread::sleep(Duration::from_millis(1_500));
    let readers: Vec<Child> = (0..READERS)
        .map(|_| spawn("reader", &readers_addr))
        .collect();
    std::thread::sleep(Duration::from_millis(1_500));
    signal_child(&readers[0], libc::SIGSTOP);
    let stopped_at = monotonic_ns();
    std::thread::sleep(STOPPED);
    let resumed_at = monotonic_ns();
    signal_child(&readers[0], libc::SIGCONT);

    let mut writes: HashMap<u64, Vec<Op>> = HashMap::new();
    let mut slowest_write_while_stopped = 0u64;
    for line in collect(writer) {
        if let Some(("W", op)) = parse(&line).as_ref().map(|(k, op)| (k.as_str(), *op)) {
            if op.start >= stopped_at && op.end <= resumed_at {
                slowest_write_while_stopped = slowest_write_while_stopped.max(op.end - op.start);
            }
            writes.entry(op.key).or_default().push(op);
        }
    }
    let mut all_violations = Vec::new();
    let (mut reads_total, mut hits_total, mut renewals_total) = (0usize, 0u64, 0u64);
    let mut bad = Vec::new();
    for reader in readers {
        let mut reads: HashMap<u64, Vec<Op>> = HashMap::new();
        for line in collect(reader) {
            if let Some(stats) = line.strip_prefix("LIN STATS ") {
                let counts: Vec<u64> = stats.split(' ').map(|n| n.parse().unwrap()).collect();
                hits_total += counts[0];
                renewals_total += counts[4];
                continue;
            }
            match parse(&line) {
                Some((kind, op)) if kind == "R" => reads.entry(op.key).or_default().push(op),
                Some((kind, op)) if kind == "BAD" => bad.push(op),
                _ => {}
            }
        }
        for (key, key_reads) in &reads {
            reads_total += key_reads.len();
            let key_writes = writes.get(key).map(Vec::as_slice).unwrap_or(&[]);
            all_violations.extend(violations(key_writes, key_reads));
        }
    }
    assert!(bad.is_empty(), "reads returned bytes of no write: {bad:?}");
    assert!(
        all_violations.is_empty(),
        "{} of {reads_total} reads returned an older value than an acknowledged write; first: {:?}",
        all_violations.len(),
        &all_violations[..all_violations.len().min(5)]
    );
    let writes_total: usize = writes.values().map(Vec::len).sum();
    assert!(writes_total > 50, "only {writes_total} writes");
    // Misses cost a 60 ms round trip through the proxy, hits microseconds: a run on a busy
    // machine (freshness lost while a reader waits for a core) reads less, never nothing.
    assert!(reads_total > 300, "only {reads_total} reads");
    assert!(hits_total > 100, "only {hits_total} cache hits");
    // A stopped holder delays a write by at most one cached lease (plus scheduling).
    assert!(
        slowest_write_while_stopped < (CACHE_LEASE_MS + 700) * 1_000_000,
        "a write took {} ms while a holder was stopped",
        slowest_write_while_stopped / 1_000_000
    );
    eprintln!(
        "checked {reads_total} reads ({hits_total} cache hits, {renewals_total} renewals) against \
         {writes_total} writes; slowest write while a reader was stopped: {} ms",
        slowest_write_while_stopped / 1_000_000
    );
}
