//! The scenarios: embedded put/get, TCP get between two processes, small-object latency and
//! batched small gets — each printed against the limit measured in the same run.

use crate::limits::{self, median, Pool};
use crate::redis;
use crate::report::Report;
use mooncake_rs::client::{parse_size, Client, SetupConfig};
use mooncake_rs::master::{MasterConfig, MasterService, OffsetAllocator};
use mooncake_rs::rpc::RpcServer;
use mooncake_rs::types::ReplicateConfig;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const MIB: usize = 1 << 20;

/// Child mode: a client with a segment on `args[0]`'s master; prints `READY <name>`, serves
/// until stdin closes.
pub fn serve_segment(args: &[String]) -> i32 {
    let (Some(master), Some(size)) = (args.first(), args.get(1)) else {
        eprintln!("usage: mc_bench --serve-segment <master addr> <segment size>");
        return 2;
    };
    let Ok(size) = parse_size(size) else {
        eprintln!("bad size {size}");
        return 2;
    };
    let client = match Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: size,
        local_buffer_size: 0,
        master_server_addr: master.clone(),
        ..SetupConfig::default()
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("segment server setup failed: {e}");
            return 1;
        }
    };
    println!("READY {}", client.get_hostname());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    client.teardown();
    0
}

pub(crate) struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// A segment peer reached over TCP (`MC_SAME_HOST=0`: these scenarios measure that path;
/// `same_host.rs` measures the mapped one).
fn spawn_peer(master: &str, size: &str) -> Result<(Peer, String), String> {
    spawn_child_env(&["--serve-segment", master, size], &[("MC_SAME_HOST", "0")])
}

/// Starts this binary in a child mode (`args`) and returns it with the rest of its
/// `READY ...` line. The child ends when its stdin closes (on drop).
pub(crate) fn spawn_child(args: &[&str]) -> Result<(Peer, String), String> {
    spawn_child_env(args, &[])
}

/// [`spawn_child`] with extra environment variables for the child.
pub(crate) fn spawn_child_env(
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<(Peer, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the peer process: {e}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no peer stdout")?;
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let name = line
        .trim()
        .strip_prefix("READY ")
        .ok_or_else(|| format!("peer said {line:?}"))?
        .to_string();
    Ok((Peer(child), name))
}

pub(crate) fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

fn embedded(report: &mut Report, memcpy: f64, duration: Duration) -> Result<(), String> {
    let client = Client::setup(SetupConfig {
        local_hostname: "bench".into(),
        global_segment_size: 256 * MIB as u64,
        local_buffer_size: 16 * MIB as u64,
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("embedded setup: {e}"))?;
    let size = 4 * MIB;
    let path_before = client.metrics().paths.host_to_local_segment;
    let src = Pool::new(16, size, 3);
    let cfg = ReplicateConfig::default();
    let (mut put_time, mut put_bytes, mut i) = (0.0, 0u64, 0usize);
    let start = Instant::now();
    while start.elapsed() < duration {
        let key = format!("e{}", i % 32);
        let _ = client.remove(&key, true);
        let t = Instant::now();
        client
            .put_from(&key, &src.bufs[i % 16], &cfg)
            .map_err(|e| format!("put_from: {e}"))?;
        put_time += t.elapsed().as_secs_f64();
        put_bytes += size as u64;
        i += 1;
    }
    report.line(
        "embedded put_from 4MiB",
        gbps(put_bytes, put_time),
        "GB/s",
        "memcpy 1 thread",
        memcpy,
    );
    let path = client.metrics().paths.host_to_local_segment;
    copies_line(
        report,
        "embedded put_from copies/op",
        path.copied_bytes - path_before.copied_bytes,
        put_bytes,
    );
    copying_put(report, &client, &src, memcpy, duration)?;
    let reads_before = client.metrics().paths.local_segment_to_host;
    let mut dst = Pool::new(16, size, 0);
    let keys = i.min(32);
    let (mut bytes, mut gets) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < duration {
        let k = gets as usize;
        client
            .get_into(&format!("e{}", k % keys), &mut dst.bufs[k % 16])
            .map_err(|e| format!("get_into: {e}"))?;
        bytes += size as u64;
        gets += 1;
    }
    report.line(
        "embedded get_into 4MiB",
        gbps(bytes, start.elapsed().as_secs_f64()),
        "GB/s",
        "memcpy 1 thread",
        memcpy,
    );
    let reads = client.metrics().paths.local_segment_to_host;
    copies_line(
        report,
        "embedded get_into copies/op",
        reads.copied_bytes - reads_before.copied_bytes,
        bytes,
    );
    client.teardown();
    Ok(())
}

/// Prints local copies per payload byte (1.0 = each byte copied once) against one copy.
pub fn copies_line(report: &mut Report, name: &str, copied: u64, bytes: u64) {
    let copies = copied as f64 / bytes.max(1) as f64;
    report.line(name, copies, "count", "one copy", 1.0);
}

/// The copying `put` (Mooncake's staging family): now one copy, like `put_from`.
fn copying_put(
    report: &mut Report,
    client: &Client,
    src: &Pool,
    memcpy: f64,
    duration: Duration,
) -> Result<(), String> {
    let before = client.metrics().paths.host_to_local_segment;
    let (mut time, mut bytes, mut i) = (0.0, 0u64, 0usize);
    let start = Instant::now();
    while start.elapsed() < duration {
        let key = format!("c{}", i % 8);
        let _ = client.remove(&key, true);
        let t = Instant::now();
        client
            .put(&key, &src.bufs[i % 16], &ReplicateConfig::default())
            .map_err(|e| format!("put: {e}"))?;
        time += t.elapsed().as_secs_f64();
        bytes += src.bufs[i % 16].len() as u64;
        i += 1;
    }
    report.line(
        "embedded put 4MiB",
        gbps(bytes, time),
        "GB/s",
        "memcpy 1 thread",
        memcpy,
    );
    let after = client.metrics().paths.host_to_local_segment;
    copies_line(
        report,
        "embedded put copies/op",
        after.copied_bytes - before.copied_bytes,
        bytes,
    );
    Ok(())
}

fn timed_gets(
    client: &Client,
    keys: &[String],
    size: usize,
    duration: Duration,
) -> Result<f64, String> {
    let mut dst = Pool::new(4, size, 0);
    let (mut bytes, mut n) = (0u64, 0usize);
    let start = Instant::now();
    while start.elapsed() < duration {
        client
            .get_into(&keys[n % keys.len()], &mut dst.bufs[n % 4])
            .map_err(|e| format!("get_into: {e}"))?;
        bytes += size as u64;
        n += 1;
    }
    Ok(gbps(bytes, start.elapsed().as_secs_f64()))
}

fn put_objects(
    client: &Client,
    prefix: &str,
    count: usize,
    size: usize,
    peer: &str,
) -> Result<Vec<String>, String> {
    let cfg = ReplicateConfig {
        preferred_segments: vec![peer.to_string()],
        ..ReplicateConfig::default()
    };
    let value = vec![9u8; size];
    (0..count)
        .map(|i| {
            let key = format!("{prefix}{i}");
            client
                .put_from(&key, &value, &cfg)
                .map(|()| key)
                .map_err(|e| format!("put_from {prefix}{i}: {e}"))
        })
        .collect()
}

fn over_tcp(
    report: &mut Report,
    raw: &limits::RawTcp,
    raw_1m: f64,
    redis_1m: Option<f64>,
    duration: Duration,
    samples: usize,
) -> Result<(), String> {
    let service = MasterService::new(MasterConfig::default());
    let rpc = RpcServer::start("127.0.0.1:0".parse().map_err(|_| "addr")?, service.clone())
        .map_err(|e| format!("rpc server: {e}"))?;
    let master = rpc.local_addr().to_string();
    let (peer, peer_name) = spawn_peer(&master, "512 MB")?;
    let client = Client::setup(SetupConfig {
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        local_buffer_size: 0,
        master_server_addr: master.clone(),
        ..SetupConfig::default()
    })
    .map_err(|e| format!("client setup: {e}"))?;

    let big = put_objects(&client, "g4m-", 16, 4 * MIB, &peer_name)?;
    let value = timed_gets(&client, &big, 4 * MIB, duration)?;
    report.line(
        "tcp get 4MiB (2 processes)",
        value,
        "GB/s",
        "raw tcp 1 stream 4MiB",
        raw.get_gbps,
    );

    let mid = put_objects(&client, "g1m-", 16, MIB, &peer_name)?;
    let value = timed_gets(&client, &mid, MIB, duration)?;
    match redis_1m {
        Some(redis) => report.line(
            "tcp get 1MiB (2 processes)",
            value,
            "GB/s",
            "redis GET 1MiB",
            redis,
        ),
        None => report.line(
            "tcp get 1MiB (2 processes)",
            value,
            "GB/s",
            "raw tcp 1 stream 1MiB",
            raw_1m,
        ),
    }

    let small = put_objects(&client, "g4k-", 64, 4096, &peer_name)?;
    let mut buf = vec![0u8; 4096];
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        let t = Instant::now();
        client
            .get_into(&small[i % small.len()], &mut buf)
            .map_err(|e| format!("get 4KiB: {e}"))?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    report.line(
        "tcp get 4KiB p50",
        median(&mut lat),
        "us",
        "raw tcp 64B rtt p50",
        raw.rtt_us,
    );
    let p50 = |f: &mut dyn FnMut(usize) -> Result<(), String>| -> Result<f64, String> {
        let mut lat = Vec::with_capacity(samples);
        for i in 0..samples {
            let t = Instant::now();
            f(i)?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(median(&mut lat))
    };
    let query = p50(&mut |i| {
        client
            .get_size(&small[i % small.len()])
            .map(|_| ())
            .map_err(|e| format!("get_size: {e}"))
    })?;
    report.line(
        "  part: master query p50",
        query,
        "us",
        "raw tcp 64B rtt p50",
        raw.rtt_us,
    );
    let pins: Vec<_> = client
        .pin(&small)
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("pin: {e}"))?;
    let data = p50(&mut |i| {
        client
            .read_pinned(&pins[i % pins.len()], &mut buf)
            .map(|_| ())
            .map_err(|e| format!("read_pinned: {e}"))
    })?;
    report.line(
        "  part: data read 4KiB p50",
        data,
        "us",
        "raw tcp 64B rtt p50",
        raw.rtt_us,
    );
    client
        .unpin(&pins.iter().map(|p| p.pin_id).collect::<Vec<_>>())
        .map_err(|e| format!("unpin: {e}"))?;

    let keys: Vec<&String> = small.iter().take(32).collect();
    let mut outs = vec![vec![0u8; 4096]; 32];
    let (mut got, start) = (0u64, Instant::now());
    while start.elapsed() < duration {
        let mut views: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        let results = client.batch_get_into(&keys, &mut views);
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            return Err(format!("batch get: {e}"));
        }
        got += 32;
    }
    let rate = got as f64 / start.elapsed().as_secs_f64();
    report.line(
        "tcp batch 32x4KiB gets",
        rate,
        "key/s",
        "32 keys per raw rtt",
        32.0 / (raw.rtt_us / 1e6),
    );

    let src = Pool::new(4, 4 * MIB, 1);
    let cfg = ReplicateConfig {
        preferred_segments: vec![peer_name.clone()],
        ..ReplicateConfig::default()
    };
    let (mut bytes, mut t_put, mut i) = (0u64, 0.0, 0usize);
    let start = Instant::now();
    while start.elapsed() < duration {
        let key = format!("p4m-{}", i % 16);
        let _ = client.remove(&key, true);
        let t = Instant::now();
        client
            .put_from(&key, &src.bufs[i % 4], &cfg)
            .map_err(|e| format!("put 4MiB: {e}"))?;
        t_put += t.elapsed().as_secs_f64();
        bytes += 4 * MIB as u64;
        i += 1;
    }
    report.line(
        "tcp put_from 4MiB (2 processes)",
        gbps(bytes, t_put),
        "GB/s",
        "raw tcp 1 stream 4MiB",
        raw.get_gbps,
    );
    client.teardown();
    drop(peer);
    rpc.shutdown();
    service.shutdown();
    Ok(())
}

/// Master segment allocator: ns per allocate+free pair under churn (target well under 1 µs).
fn allocator(report: &mut Report, duration: Duration) {
    let allocator = OffsetAllocator::new(1 << 34);
    let mut live = Vec::with_capacity(1024);
    let (mut ops, start) = (0u64, Instant::now());
    while start.elapsed() < duration {
        for i in 0..1024u64 {
            live.push(allocator.allocate(64 + (i % 97) * 64));
        }
        // free every other allocation first, then the rest: exercises coalescing
        let (even, odd): (Vec<_>, Vec<_>) =
            live.drain(..).enumerate().partition(|(j, _)| j % 2 == 0);
        drop(even);
        drop(odd);
        ops += 1024;
    }
    let ns = start.elapsed().as_nanos() as f64 / ops as f64;
    report.line(
        "master alloc+free pair",
        ns / 1000.0,
        "us",
        "1 us budget",
        1.0,
    );
}

/// Which scenarios a run measures.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Only {
    /// Every limit and scenario.
    All,
    /// The memcpy limit, the embedded scenarios and the device scenarios (`--device`).
    Device,
    /// The memcpy limit and the on-stream scenarios (`--stream`).
    Stream,
    /// The master load test (`--load`).
    Load,
    /// The same-host scenarios against interleaved memcpy (`--same-host`).
    SameHost,
}

/// Runs the limits and scenarios `only` selects, printing as it goes.
pub fn run_all(report: &mut Report, quick: bool, only: Only) -> Result<(), String> {
    let duration = Duration::from_millis(if quick { 300 } else { 1500 });
    let samples = if quick { 300 } else { 3000 };
    let memcpy = limits::memcpy_gbps(4 * MIB, duration);
    report.limit("memcpy 1 thread 4MiB", memcpy, "GB/s");
    match only {
        Only::All => {}
        Only::Device => {
            embedded(report, memcpy, duration)?;
            return crate::device::run(report, duration);
        }
        Only::Stream => return crate::stream::run(report, memcpy, quick),
        Only::Load => return crate::load::run(report),
        Only::SameHost => {
            return crate::same_host::run(report, if quick { 3 } else { 7 }, duration / 5)
        }
    }
    let raw = limits::raw_tcp(4 * MIB, duration, samples).map_err(|e| format!("raw tcp: {e}"))?;
    report.limit("raw tcp 1 stream 4MiB", raw.get_gbps, "GB/s");
    report.limit("raw tcp 64B rtt p50", raw.rtt_us, "us");
    let raw_1m = limits::raw_tcp(MIB, duration, 1)
        .map_err(|e| format!("raw tcp: {e}"))?
        .get_gbps;
    report.limit("raw tcp 1 stream 1MiB", raw_1m, "GB/s");
    let redis_1m = redis::get_gbps(MIB, duration);
    if let Some(redis) = redis_1m {
        report.limit("redis GET 1MiB", redis, "GB/s");
    }
    allocator(report, duration);
    embedded(report, memcpy, duration)?;
    crate::stream::run(report, memcpy, quick)?;
    crate::device::run(report, duration)?;
    over_tcp(report, &raw, raw_1m, redis_1m, duration, samples)?;
    crate::same_host::run(report, if quick { 3 } else { 7 }, duration / 5)?;
    crate::p2p::run(report, &raw, raw_1m, duration, samples)
}
