//! Same-host scenarios: get/put between this process and a peer process of the same host
//! whose segment the client maps (`MC_SAME_HOST=1`, one memcpy per object), against
//! one-thread memcpy of exactly the same copies ([`CopyLimit`]: the same block size, the same
//! sources and destinations, a pre-faulted working set as large as the objects of a round),
//! interleaved in the same run (limit put, limit get, put, get per round); each line prints
//! the medians, the ratio of the medians and of the best rounds, and both spreads.

use crate::interleave::{Judged, Spread, Verdict};
use crate::limits::{copy_block, Pool};
use crate::report::Report;
use crate::scenarios::{gbps, spawn_child_env, MIB};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::master::{MasterConfig, MasterService};
use mooncake_rs::types::ReplicateConfig;
use std::time::Instant;

/// Bytes moved per timed round (above the caches; 3 sizes x rounds of it stay under the
/// master's eviction watermark of the 1 GB segment: removed objects are freed only after
/// their read leases end).
const ROUND_BYTES: usize = 32 * MIB;

/// Runs the scenarios; `rounds` interleaved rounds per size.
pub fn run(report: &mut Report, rounds: usize) -> Result<(), String> {
    let service = MasterService::new(MasterConfig::default());
    let rpc = crate::scenarios::serve_master(service.clone())?;
    let master = rpc.local_addr().to_string();
    let (peer, peer_name) = spawn_child_env(
        &["--serve-segment", &master, "1 GB"],
        &[("MC_SAME_HOST", "1")],
    )?;
    let client = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        local_buffer_size: 0,
        master_server_addr: master.clone(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("client setup: {e}"))?;
    let cfg = ReplicateConfig {
        preferred_segments: vec![peer_name],
        ..ReplicateConfig::default()
    };
    for (size, batch) in [(4 * MIB, 1), (64 << 10, 1), (64 << 10, 64)] {
        measure(report, &client, &cfg, size, batch, rounds)?;
    }
    let m = client.metrics().transfer;
    if m.tcp_read_bytes + m.tcp_write_bytes != 0 || m.same_host_read_bytes == 0 {
        return Err(format!(
            "same-host scenarios did not stay on the mapped path: {m:?}"
        ));
    }
    client.teardown();
    drop(peer);
    rpc.shutdown();
    Ok(())
}

/// The limit of one size: the copies a round of the scenario makes, by one-thread memcpy with
/// no store in between. A put copies source block `i % batch % 4` into block `i` of a
/// pre-faulted working set of [`ROUND_BYTES`] (as the put fills fresh objects of the mapped,
/// pre-faulted segment); a get copies block `i` of that set into destination `i % batch` (as
/// the get reads each object into the caller's buffers).
struct CopyLimit {
    set: Vec<u8>,
    size: usize,
    batch: usize,
}

impl CopyLimit {
    fn new(size: usize, batch: usize) -> CopyLimit {
        CopyLimit {
            set: vec![1u8; ROUND_BYTES],
            size,
            batch,
        }
    }

    /// GB/s of the put's copies from `src`.
    fn put(&mut self, src: &Pool) -> f64 {
        let start = Instant::now();
        for (i, block) in self.set.chunks_exact_mut(self.size).enumerate() {
            copy_block(block, &src.bufs[i % self.batch % src.bufs.len()]);
        }
        gbps(ROUND_BYTES as u64, start.elapsed().as_secs_f64())
    }

    /// GB/s of the get's copies into `dst`.
    fn get(&self, dst: &mut Pool) -> f64 {
        let start = Instant::now();
        for (i, block) in self.set.chunks_exact(self.size).enumerate() {
            let slot = i % self.batch % dst.bufs.len();
            copy_block(&mut dst.bufs[slot], block);
        }
        gbps(ROUND_BYTES as u64, start.elapsed().as_secs_f64())
    }
}

/// The medians, spreads and ratios of `scenario` against `limit` (one value per round).
fn print_judged(
    report: &mut Report,
    name: &str,
    limit_name: &str,
    limit: &[f64],
    scenario: &[f64],
) {
    let what = Judged {
        name,
        unit: "GB/s",
        limit_name,
        rounds: scenario.len(),
    };
    let verdict = Verdict {
        scenario: Spread::of(scenario),
        limit: Spread::of(limit),
    };
    report.judged(&what, &verdict);
}

/// One size: per round the limit's put and get copies ([`CopyLimit`]), then a put of
/// `ROUND_BYTES` in fresh keys (`batch` keys per call) from the same sources, a get of them
/// all into the same destinations, and their removal (not timed).
fn measure(
    report: &mut Report,
    client: &Client,
    cfg: &ReplicateConfig,
    size: usize,
    batch: usize,
    rounds: usize,
) -> Result<(), String> {
    let count = ROUND_BYTES / size;
    let src = Pool::new(4, size, 3);
    let mut dst = Pool::new(batch.max(4), size, 0);
    let mut limit = CopyLimit::new(size, batch);
    let (mut limit_puts, mut limit_gets) = (Vec::new(), Vec::new());
    let (mut gets, mut puts) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        limit_puts.push(limit.put(&src));
        limit_gets.push(limit.get(&mut dst));
        let keys: Vec<String> = (0..count)
            .map(|i| format!("sh{size}-{round}-{i}"))
            .collect();
        let start = Instant::now();
        for chunk in keys.chunks(batch) {
            let bufs: Vec<&[u8]> = (0..chunk.len())
                .map(|i| src.bufs[i % 4].as_slice())
                .collect();
            let results = client.batch_put_from(chunk, &bufs, cfg);
            if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
                return Err(format!("same-host put of {size} bytes: {e}"));
            }
        }
        puts.push(gbps(ROUND_BYTES as u64, start.elapsed().as_secs_f64()));
        let start = Instant::now();
        for chunk in keys.chunks(batch) {
            let results = if batch == 1 {
                vec![client.get_into(&chunk[0], &mut dst.bufs[0])]
            } else {
                let mut bufs: Vec<&mut [u8]> = dst
                    .bufs
                    .iter_mut()
                    .take(chunk.len())
                    .map(|b| b.as_mut_slice())
                    .collect();
                client.batch_get_into(chunk, &mut bufs)
            };
            if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
                return Err(format!(
                    "same-host get of {size} bytes ({} of round {round}): {e}",
                    chunk[0]
                ));
            }
        }
        gets.push(gbps(ROUND_BYTES as u64, start.elapsed().as_secs_f64()));
        for chunk in keys.chunks(256) {
            let removed = client.batch_remove(chunk, true);
            if let Some(Err(e)) = removed.into_iter().find(|r| r.is_err()) {
                return Err(format!(
                    "removing the {size}-byte objects of round {round}: {e}"
                ));
            }
        }
    }
    let label = match (size >= MIB, batch) {
        (true, _) => format!("{}MiB", size / MIB),
        (false, 1) => format!("{}KiB", size >> 10),
        (false, n) => format!("{n}x{}KiB batch", size >> 10),
    };
    let set = ROUND_BYTES / MIB;
    print_judged(
        report,
        &format!("same-host get {label}"),
        &format!("memcpy same copies, {set}MiB set"),
        &limit_gets,
        &gets,
    );
    print_judged(
        report,
        &format!("same-host put {label}"),
        &format!("memcpy same copies, {set}MiB set"),
        &limit_puts,
        &puts,
    );
    Ok(())
}
