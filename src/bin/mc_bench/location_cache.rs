//! `--location-cache`: the location cache (`docs/location-cache.md`) against the limits it
//! is meant to reach, interleaved in one run. An in-process master served over TCP, two peer
//! processes with 1 GB segments (one mapped same-host, one over TCP), and in-process clients:
//!
//! - **hot same-host get** 64 KiB (one key read again and again) against one-thread memcpy
//!   of 64 KiB blocks;
//! - **cold same-host get** 64 KiB (a key never read before each time: every get is a miss)
//!   with the cache on, against the same with the cache off;
//! - **hot TCP get** 4 KiB p50 against the raw 64-byte loopback round trip;
//! - **hot TCP batch** of 32 × 4 KiB against the batch's own bytes in one raw exchange;
//! - **batch 64 × 512 KiB with the master 1 ms away** (a delaying proxy in front of it)
//!   against the same with the master next door;
//! - **upsert** p50 / p99 of a key 0, 1 and 16 other clients cache (printed, not judged).

use crate::interleave::{judge, Judged};
use crate::limits::{median, memcpy_gbps, RawTcp};
use crate::report::Report;
use crate::scenarios::{spawn_child_env, Peer};
use mooncake_rs::client::{Client, SetupConfig};
use mooncake_rs::master::{MasterConfig, MasterService};
use mooncake_rs::types::ReplicateConfig;
use std::time::{Duration, Instant};

#[path = "../mc_chaos/proxy.rs"]
#[allow(dead_code)] // mc_chaos uses the modes and counters this bench does not
mod proxy;

const KIB: usize = 1 << 10;

/// A client of `master`; the location cache on or off.
fn client(master: &str, cache: bool) -> Result<Client, String> {
    if !cache {
        std::env::set_var("MC_LOCATION_CACHE", "0");
    }
    let client = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        local_buffer_size: 64 << 20,
        master_server_addr: master.into(),
        ..SetupConfig::default()
    });
    std::env::remove_var("MC_LOCATION_CACHE");
    client.map_err(|e| format!("client setup: {e}"))
}

fn put(client: &Client, key: &str, size: usize, at: &str) -> Result<(), String> {
    let config = ReplicateConfig {
        preferred_segments: vec![at.to_string()],
        ..ReplicateConfig::default()
    };
    client
        .put(key, &vec![0x5a; size], &config)
        .map_err(|e| format!("put {key}: {e}"))
}

/// GB/s of gets of `keys` (round robin) of `size` bytes each, one thread, for `duration`.
fn get_gbps(
    client: &Client,
    keys: &[String],
    size: usize,
    duration: Duration,
) -> Result<f64, String> {
    let mut out = vec![0u8; size];
    let (mut bytes, mut i, started) = (0u64, 0usize, Instant::now());
    while started.elapsed() < duration {
        let key = &keys[i % keys.len()];
        client
            .get_into(key, &mut out)
            .map_err(|e| format!("get {key}: {e}"))?;
        bytes += size as u64;
        i += 1;
    }
    Ok(bytes as f64 / started.elapsed().as_secs_f64() / 1e9)
}

/// p50 in µs of one-thread gets of `key` (`size` bytes) for `duration`.
fn get_p50_us(client: &Client, key: &str, size: usize, duration: Duration) -> Result<f64, String> {
    let mut out = vec![0u8; size];
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        client
            .get_into(key, &mut out)
            .map_err(|e| format!("get {key}: {e}"))?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut samples))
}

/// Keys (or GB/s, with `gbps`) per second of batch gets of `keys`, `size` bytes each.
fn batch_rate(
    client: &Client,
    keys: &[String],
    size: usize,
    duration: Duration,
    gbps: bool,
) -> Result<f64, String> {
    let mut bufs: Vec<Vec<u8>> = keys.iter().map(|_| vec![0u8; size]).collect();
    let (mut batches, started) = (0usize, Instant::now());
    while started.elapsed() < duration {
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        for result in client.batch_get_into(keys, &mut slices) {
            result.map_err(|e| format!("batch get: {e}"))?;
        }
        batches += 1;
    }
    let per_s = (batches * keys.len()) as f64 / started.elapsed().as_secs_f64();
    Ok(if gbps {
        per_s * size as f64 / 1e9
    } else {
        per_s
    })
}

/// A master (caching for `lease_ms`) served over TCP, a proxy delaying every chunk to it by
/// 1 ms, and two peers with 1 GB segments: mapped same-host, and over TCP.
struct Pool {
    _service: std::sync::Arc<MasterService>,
    rpc: mooncake_rs::rpc::RpcServer,
    delayed: proxy::Proxy,
    same_host: (Peer, String),
    tcp: (Peer, String),
}

impl Pool {
    fn start(lease_ms: u64) -> Result<Pool, String> {
        let service = MasterService::new(MasterConfig {
            location_cache_lease_ms: lease_ms,
            ..MasterConfig::default()
        });
        let rpc = crate::scenarios::serve_master(service.clone())?;
        let master = rpc.local_addr().to_string();
        let delayed = proxy::Proxy::start(rpc.local_addr().port(), Duration::from_millis(1))
            .map_err(|e| e.to_string())?;
        delayed.set_mode(proxy::Mode::Delay);
        let serve = ["--serve-segment", &master, "1 GB"];
        Ok(Pool {
            same_host: spawn_child_env(&serve, &[("MC_SAME_HOST", "1")])?,
            tcp: spawn_child_env(&serve, &[("MC_SAME_HOST", "0")])?,
            _service: service,
            rpc,
            delayed,
        })
    }

    fn master(&self) -> String {
        self.rpc.local_addr().to_string()
    }

    fn delayed_master(&self) -> String {
        format!("127.0.0.1:{}", self.delayed.port)
    }
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// p50 and p99 in µs of upserts of one 4 KiB key that `holders` other clients cache (each
/// reads it again after every upsert), for `duration`.
fn upsert_latency(
    pool: &Pool,
    writer: &Client,
    holders: usize,
    duration: Duration,
) -> Result<(f64, f64), String> {
    let key = format!("upsert-{holders}");
    let at = &pool.tcp.1;
    put(writer, &key, 4 * KIB, at)?;
    let readers: Vec<Client> = (0..holders)
        .map(|_| client(&pool.master(), true))
        .collect::<Result<_, _>>()?;
    let config = ReplicateConfig {
        preferred_segments: vec![at.clone()],
        ..ReplicateConfig::default()
    };
    let value = vec![7u8; 4 * KIB];
    let mut out = vec![0u8; 4 * KIB];
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        for reader in &readers {
            reader
                .get_into(&key, &mut out)
                .map_err(|e| format!("get {key}: {e}"))?;
        }
        let t = Instant::now();
        writer
            .upsert(&key, &value, &config)
            .map_err(|e| format!("upsert {key}: {e}"))?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    for reader in readers {
        reader.teardown();
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Ok((at(0.5), at(0.99)))
}

/// Runs the lines.
pub fn run(report: &mut Report, quick: bool) -> Result<(), String> {
    let duration = Duration::from_millis(if quick { 300 } else { 1500 });
    let rounds = if quick { 3 } else { 5 };
    let pool = Pool::start(2_000)?;
    let master = pool.master();
    let on = client(&master, true)?;
    let (same_host, tcp) = (pool.same_host.1.clone(), pool.tcp.1.clone());

    put(&on, "hot-64k", 64 * KIB, &same_host)?;
    let hot = vec!["hot-64k".to_string()];
    judge(
        report,
        &Judged {
            name: "location cache: same-host hot get 64 KiB, GB/s (1 thr)",
            unit: "GB/s",
            limit_name: "memcpy 64 KiB blocks (1 thr)",
            rounds,
        },
        || Ok(memcpy_gbps(64 * KIB, duration)),
        || get_gbps(&on, &hot, 64 * KIB, duration),
    )?;

    put(&on, "hot-4k", 4 * KIB, &tcp)?;
    let mut raw = RawTcp::connect().map_err(|e| e.to_string())?;
    judge(
        report,
        &Judged {
            name: "location cache: TCP hot get 4 KiB p50 (1 thr)",
            unit: "us",
            limit_name: "raw TCP 64 B round trip p50 (1 stream)",
            rounds,
        },
        || raw.rtt_us(64, duration).map_err(|e| e.to_string()),
        || get_p50_us(&on, "hot-4k", 4 * KIB, duration),
    )?;

    let batch = keys("batch-4k", 32);
    for key in &batch {
        put(&on, key, 4 * KIB, &tcp)?;
    }
    judge(
        report,
        &Judged {
            name: "location cache: TCP hot batch 32 x 4 KiB, keys/s (1 thr)",
            unit: "keys/s",
            limit_name: "raw TCP: the batch's 128 KiB in one exchange (1 stream)",
            rounds,
        },
        || {
            let gbps = raw
                .get_gbps(32 * 4 * KIB, duration)
                .map_err(|e| e.to_string())?;
            Ok(gbps * 1e9 / (4 * KIB) as f64)
        },
        || batch_rate(&on, &batch, 4 * KIB, duration, false),
    )?;

    let far = client(&pool.delayed_master(), true)?;
    let big = keys("batch-512k", 64);
    for key in &big {
        put(&on, key, 512 * KIB, &tcp)?;
    }
    judge(
        report,
        &Judged {
            name: "location cache: batch 64 x 512 KiB, master 1 ms away, GB/s (1 thr)",
            unit: "GB/s",
            limit_name: "the same, master next door (1 thr)",
            rounds,
        },
        || batch_rate(&on, &big, 512 * KIB, duration, true),
        || batch_rate(&far, &big, 512 * KIB, duration, true),
    )?;
    far.teardown();

    for holders in [0, 1, 16] {
        let (p50, p99) = upsert_latency(&pool, &on, holders, duration)?;
        report.line(
            &format!("location cache: upsert 4 KiB p50, {holders} holders (1 thr)"),
            p50,
            "us",
            &format!("p99 {p99:.1} us"),
            p99,
        );
    }
    on.teardown();
    drop(pool);

    // Every get a miss: a master whose cached lease is 1 ms, 1 000 keys read in turn.
    let cold_pool = Pool::start(1)?;
    let writer = client(&cold_pool.master(), false)?;
    let cold = keys("cold-64k", 1_000);
    for key in &cold {
        put(&writer, key, 64 * KIB, &cold_pool.same_host.1)?;
    }
    writer.teardown();
    let cold_on = client(&cold_pool.master(), true)?;
    let cold_off = client(&cold_pool.master(), false)?;
    judge(
        report,
        &Judged {
            name: "location cache on: same-host cold get 64 KiB (every get a miss), GB/s (1 thr)",
            unit: "GB/s",
            limit_name: "the same, cache off (1 thr)",
            rounds,
        },
        || get_gbps(&cold_off, &cold, 64 * KIB, duration),
        || get_gbps(&cold_on, &cold, 64 * KIB, duration),
    )?;
    cold_on.teardown();
    cold_off.teardown();
    Ok(())
}
