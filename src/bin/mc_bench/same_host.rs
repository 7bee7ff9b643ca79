//! Same-host scenarios: get/put between this process and a peer process of the same host
//! whose segment the client maps (`MC_SAME_HOST=1`, one memcpy per object), against
//! one-thread memcpy of the same block size, measured interleaved in the same run (memcpy,
//! get, put, memcpy, ... per round; best of N rounds, with the spread of the N).

use crate::limits::{self, Pool};
use crate::report::Report;
use crate::scenarios::{gbps, spawn_child_env, MIB};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::master::{MasterConfig, MasterService};
use mooncake_rs::rpc::RpcServer;
use mooncake_rs::types::ReplicateConfig;
use std::time::{Duration, Instant};

/// Bytes moved per timed round (above the caches; 3 sizes x rounds of it stay under the
/// master's eviction watermark of the 1 GB segment: removed objects are freed only after
/// their read leases end).
const ROUND_BYTES: usize = 32 * MIB;

/// Best value and spread ((best - worst) / best) of one measured series.
struct Series(Vec<f64>);

impl Series {
    fn best(&self) -> f64 {
        self.0.iter().copied().fold(0.0, f64::max)
    }

    fn spread_pct(&self) -> f64 {
        let worst = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let best = self.best();
        if best > 0.0 {
            (best - worst) / best * 100.0
        } else {
            0.0
        }
    }
}

/// Runs the scenarios; `rounds` interleaved rounds per size (`duration` per memcpy sample).
pub fn run(report: &mut Report, rounds: usize, duration: Duration) -> Result<(), String> {
    let service = MasterService::new(MasterConfig::default());
    let rpc = RpcServer::start("127.0.0.1:0".parse().map_err(|_| "addr")?, service.clone())
        .map_err(|e| format!("rpc server: {e}"))?;
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
        measure(report, &client, &cfg, size, batch, rounds, duration)?;
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

/// One size: per round a memcpy sample, a put of `ROUND_BYTES` in fresh keys (`batch` keys
/// per call), a get of them all, and their removal (not timed).
fn measure(
    report: &mut Report,
    client: &Client,
    cfg: &ReplicateConfig,
    size: usize,
    batch: usize,
    rounds: usize,
    duration: Duration,
) -> Result<(), String> {
    let count = ROUND_BYTES / size;
    let src = Pool::new(4, size, 3);
    let mut dst = Pool::new(batch.max(4), size, 0);
    let (mut memcpy, mut gets, mut puts) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        memcpy.push(limits::memcpy_gbps(size, duration));
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
    let (memcpy, gets, puts) = (Series(memcpy), Series(gets), Series(puts));
    let label = match (size >= MIB, batch) {
        (true, _) => format!("{}MiB", size / MIB),
        (false, 1) => format!("{}KiB", size >> 10),
        (false, n) => format!("{n}x{}KiB batch", size >> 10),
    };
    let limit = format!(
        "memcpy 1 thread {}KiB (+-{:.0}%)",
        size >> 10,
        memcpy.spread_pct()
    );
    report.line(
        &format!("same-host get {label} (+-{:.0}%)", gets.spread_pct()),
        gets.best(),
        "GB/s",
        &limit,
        memcpy.best(),
    );
    report.line(
        &format!("same-host put {label} (+-{:.0}%)", puts.spread_pct()),
        puts.best(),
        "GB/s",
        &limit,
        memcpy.best(),
    );
    Ok(())
}
