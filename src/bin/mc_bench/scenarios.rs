//! The scenarios: embedded put/get, TCP get between two processes, small-object latency and
//! batched small gets — each printed against the limit measured in the same run.

use crate::interleave::{judge, Judged};
use crate::limits::{self, median, Pool, RawBatch, RawTcp, RawTcpLanes};
use crate::redis::Redis;
use crate::report::Report;
use mooncake_rs::alloc::OffsetAllocator;
use mooncake_rs::client::{parse_size, Client, SetupConfig};
use mooncake_rs::master::{MasterConfig, MasterService};
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

/// Serves `service` over TCP on a free loopback port (the bench's in-process masters).
pub(crate) fn serve_master(
    service: std::sync::Arc<mooncake_rs::master::MasterService>,
) -> Result<mooncake_rs::rpc::RpcServer, String> {
    let addr = "127.0.0.1:0".parse().map_err(|_| "addr")?;
    mooncake_rs::master::remote::serve(addr, service).map_err(|e| format!("rpc server: {e}"))
}

pub(crate) fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// The limits of a store copy of 4 MiB: one-thread memcpy, and memcpy split as the copy
/// crew splits it (a 4 MiB copy is cut into at most 4 pieces of 1 MiB, one per crew thread).
pub(crate) struct CopyLimits {
    pub one_thread: f64,
    pub split: f64,
    pub split_name: String,
}

impl CopyLimits {
    pub(crate) fn measure(duration: Duration) -> CopyLimits {
        let threads = mooncake_rs::device::copy_threads().min(4);
        CopyLimits {
            one_thread: limits::memcpy_gbps(4 * MIB, duration),
            split: limits::memcpy_split_gbps(4 * MIB, threads, duration),
            split_name: format!("memcpy {threads} threads (copy crew's split)"),
        }
    }
}

/// A 4 MiB store copy judged twice: against one-thread memcpy and against memcpy split like
/// the copy crew's (the like-for-like limit when the crew has several threads).
fn copy_lines(report: &mut Report, name: &str, value: f64, limits: &CopyLimits) {
    report.line(name, value, "GB/s", "memcpy 1 thread", limits.one_thread);
    report.line(name, value, "GB/s", &limits.split_name, limits.split);
}

fn embedded(report: &mut Report, memcpy: &CopyLimits, rounds: Rounds) -> Result<(), String> {
    let duration = rounds.duration;
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
    copy_lines(
        report,
        "embedded put_from 4MiB",
        gbps(put_bytes, put_time),
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
    copy_lines(
        report,
        "embedded get_into 4MiB",
        gbps(bytes, start.elapsed().as_secs_f64()),
        memcpy,
    );
    let reads = client.metrics().paths.local_segment_to_host;
    copies_line(
        report,
        "embedded get_into copies/op",
        reads.copied_bytes - reads_before.copied_bytes,
        bytes,
    );
    small_gets(report, &client, rounds)?;
    client.teardown();
    Ok(())
}

/// Single-key 4 KiB gets of the embedded store (one master query and one copy per call, so
/// the line shows the per-call cost around the copy) against one-thread memcpy of the same
/// 4 KiB blocks into as many destinations, interleaved.
fn small_gets(report: &mut Report, client: &Client, rounds: Rounds) -> Result<(), String> {
    const SMALL: usize = 4096;
    const KEYS: usize = 32;
    const DESTINATIONS: usize = 16;
    let src = Pool::new(KEYS, SMALL, 5);
    let keys: Vec<String> = (0..KEYS).map(|k| format!("s{k}")).collect();
    for (key, value) in keys.iter().zip(&src.bufs) {
        client
            .put_from(key, value, &ReplicateConfig::default())
            .map_err(|e| format!("put_from: {e}"))?;
    }
    let mut limit_dst = Pool::new(DESTINATIONS, SMALL, 0);
    let mut dst = Pool::new(DESTINATIONS, SMALL, 0);
    judge(
        report,
        &rounds.judged(
            "embedded get_into 4KiB, 1 key per call",
            "GB/s",
            "memcpy 1 thread, 32 -> 16 x 4KiB",
        ),
        || {
            Ok(limits::copy_between_gbps(
                &src,
                &mut limit_dst,
                rounds.duration,
            ))
        },
        || {
            let (mut bytes, mut i) = (0u64, 0usize);
            let start = Instant::now();
            while start.elapsed() < rounds.duration {
                client
                    .get_into(&keys[i % KEYS], &mut dst.bufs[i % DESTINATIONS])
                    .map_err(|e| format!("get_into: {e}"))?;
                bytes += SMALL as u64;
                i += 1;
            }
            Ok(gbps(bytes, start.elapsed().as_secs_f64()))
        },
    )?;
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
    memcpy: &CopyLimits,
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
    copy_lines(report, "embedded put 4MiB", gbps(bytes, time), memcpy);
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

/// How each judged scenario and its limit are measured (see `interleave`): rounds of each,
/// alternately, of about `duration` each.
#[derive(Clone, Copy)]
pub(crate) struct Rounds {
    pub(crate) duration: Duration,
    pub(crate) rounds: usize,
}

impl Rounds {
    /// The line description for `name` against `limit_name`.
    pub(crate) fn judged<'a>(
        &self,
        name: &'a str,
        unit: &'static str,
        limit_name: &'a str,
    ) -> Judged<'a> {
        Judged {
            name,
            unit,
            limit_name,
            rounds: self.rounds,
        }
    }
}

/// The median latency in µs of `f(i)` (i = 0, 1, …) called one after the other for about
/// `duration`.
pub(crate) fn p50_for(
    duration: Duration,
    mut f: impl FnMut(usize) -> Result<(), String>,
) -> Result<f64, String> {
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < duration {
        let t = Instant::now();
        f(lat.len())?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut lat))
}

/// The raw limits as closures returning one round's value (for `interleave::judge`).
pub(crate) fn raw_gbps<'a>(
    raw: &'a mut RawTcp,
    size: usize,
    duration: Duration,
) -> impl FnMut() -> Result<f64, String> + 'a {
    move || {
        raw.get_gbps(size, duration)
            .map_err(|e| format!("raw tcp: {e}"))
    }
}

/// One round of the raw round trip (µs) of an 8-byte request answered with `size` bytes,
/// times `factor`.
pub(crate) fn raw_rtt<'a>(
    raw: &'a mut RawTcp,
    size: usize,
    duration: Duration,
    factor: f64,
) -> impl FnMut() -> Result<f64, String> + 'a {
    move || {
        raw.rtt_us(size, duration)
            .map(|us| us * factor)
            .map_err(|e| format!("raw tcp: {e}"))
    }
}

/// The TCP scenarios between two processes; with `redis` (a running `redis-server`), the
/// 1 MiB get is also judged against Redis GETs of the same size, interleaved.
fn over_tcp(report: &mut Report, rounds: Rounds, mut redis: Option<Redis>) -> Result<(), String> {
    let duration = rounds.duration;
    let mut raw = RawTcp::connect().map_err(|e| format!("raw tcp: {e}"))?;
    let service = MasterService::new(MasterConfig::default());
    let rpc = crate::scenarios::serve_master(service.clone())?;
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
    judge(
        report,
        &rounds.judged(
            "tcp get 4MiB (2 processes)",
            "GB/s",
            "raw tcp 1 stream 4MiB",
        ),
        raw_gbps(&mut raw, 4 * MIB, duration),
        || timed_gets(&client, &big, 4 * MIB, duration),
    )?;

    // The engine cuts a 4 MiB get into parts on up to MC_TCP_LANES_PER_PEER connections:
    // the like-for-like limit fetches it the same way.
    let mut lanes = RawTcpLanes::connect(mooncake_rs::transfer::tcp_parts(4 * MIB as u64))
        .map_err(|e| format!("raw tcp lanes: {e}"))?;
    let lanes_name = format!("raw tcp {} streams 4MiB", lanes.lanes());
    judge(
        report,
        &rounds.judged("tcp get 4MiB (2 processes)", "GB/s", &lanes_name),
        || {
            lanes
                .get_gbps(4 * MIB, duration)
                .map_err(|e| format!("raw tcp lanes: {e}"))
        },
        || timed_gets(&client, &big, 4 * MIB, duration),
    )?;

    let mid = put_objects(&client, "g1m-", 16, MIB, &peer_name)?;
    if let Some(redis) = redis.as_mut() {
        judge(
            report,
            &rounds.judged(
                "tcp get 1MiB (2 processes) vs redis",
                "GB/s",
                "redis GET 1MiB 1 connection",
            ),
            || redis.get_gbps(duration),
            || timed_gets(&client, &mid, MIB, duration),
        )?;
    }
    judge(
        report,
        &rounds.judged(
            "tcp get 1MiB (2 processes)",
            "GB/s",
            "raw tcp 1 stream 1MiB",
        ),
        raw_gbps(&mut raw, MIB, duration),
        || timed_gets(&client, &mid, MIB, duration),
    )?;

    let small = put_objects(&client, "g4k-", 64, 4096, &peer_name)?;
    let mut buf = vec![0u8; 4096];
    judge(
        report,
        &rounds.judged("tcp get 4KiB p50", "us", "raw tcp 4KiB rtt p50"),
        raw_rtt(&mut raw, 4096, duration, 1.0),
        || {
            p50_for(duration, |i| {
                client
                    .get_into(&small[i % small.len()], &mut buf)
                    .map(|_| ())
                    .map_err(|e| format!("get 4KiB: {e}"))
            })
        },
    )?;
    judge(
        report,
        &rounds.judged("  part: master query p50", "us", "raw tcp 64B rtt p50"),
        raw_rtt(&mut raw, 64, duration, 1.0),
        || {
            p50_for(duration, |i| {
                client
                    .get_size(&small[i % small.len()])
                    .map(|_| ())
                    .map_err(|e| format!("get_size: {e}"))
            })
        },
    )?;
    let pins: Vec<_> = client
        .pin(&small)
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("pin: {e}"))?;
    judge(
        report,
        &rounds.judged("  part: data read 4KiB p50", "us", "raw tcp 4KiB rtt p50"),
        raw_rtt(&mut raw, 4096, duration, 1.0),
        || {
            p50_for(duration, |i| {
                client
                    .read_pinned(&pins[i % pins.len()], &mut buf)
                    .map(|_| ())
                    .map_err(|e| format!("read_pinned: {e}"))
            })
        },
    )?;
    client
        .unpin(&pins.iter().map(|p| p.pin_id).collect::<Vec<_>>())
        .map_err(|e| format!("unpin: {e}"))?;

    let keys: Vec<&String> = small.iter().take(32).collect();
    let mut outs = vec![vec![0u8; 4096]; 32];
    let mut batch = || {
        let (mut got, start) = (0u64, Instant::now());
        while start.elapsed() < duration {
            let mut views: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            let results = client.batch_get_into(&keys, &mut views);
            if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
                return Err(format!("batch get: {e}"));
            }
            got += 32;
        }
        Ok(got as f64 / start.elapsed().as_secs_f64())
    };
    // Like for like: what a batch get must at least do on raw TCP, a small master exchange
    // then one data exchange with all 32 x 4 KiB, back to back for the same duration.
    let mut raw_batch = RawBatch::connect().map_err(|e| format!("raw tcp: {e}"))?;
    judge(
        report,
        &rounds.judged(
            "tcp batch 32x4KiB gets",
            "key/s",
            "raw 64B master + 128KiB data",
        ),
        || {
            raw_batch
                .keys_per_s(32, 4096, duration)
                .map_err(|e| format!("raw tcp: {e}"))
        },
        &mut batch,
    )?;
    drop(raw_batch);
    // The data part alone (one raw round trip answered with 32 x 4 KiB) and, as the issue
    // first put it, one 64-byte round trip (which no transport moving 128 KiB can reach).
    for (size, limit_name) in [
        (32 * 4096, "32 keys per raw 128KiB rtt"),
        (64, "32 keys per raw 64B rtt"),
    ] {
        let mut rtt = raw_rtt(&mut raw, size, duration, 1.0);
        judge(
            report,
            &rounds.judged("tcp batch 32x4KiB gets", "key/s", limit_name),
            move || rtt().map(|us| 32.0 / (us / 1e6)),
            &mut batch,
        )?;
    }

    let src = Pool::new(4, 4 * MIB, 1);
    let cfg = ReplicateConfig {
        preferred_segments: vec![peer_name.clone()],
        ..ReplicateConfig::default()
    };
    let mut i = 0usize;
    judge(
        report,
        &rounds.judged(
            "tcp put_from 4MiB (2 processes)",
            "GB/s",
            "raw tcp 1 stream 4MiB",
        ),
        raw_gbps(&mut raw, 4 * MIB, duration),
        || {
            let (mut bytes, mut t_put) = (0u64, 0.0);
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
            Ok(gbps(bytes, t_put))
        },
    )?;
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
    /// The memcpy limit and the TCP scenarios between two processes, each judged against
    /// its interleaved raw-TCP limit (`--tcp`).
    Tcp,
    /// The same-host scenarios against interleaved memcpy (`--same-host`).
    SameHost,
}

/// Runs the limits and scenarios `only` selects, printing as it goes.
pub fn run_all(report: &mut Report, quick: bool, only: Only) -> Result<(), String> {
    let duration = Duration::from_millis(if quick { 300 } else { 1500 });
    let rounds = Rounds {
        duration,
        rounds: if quick { 3 } else { 5 },
    };
    let copy_limits = CopyLimits::measure(duration);
    let memcpy = copy_limits.one_thread;
    report.limit("memcpy 1 thread 4MiB", memcpy, "GB/s");
    report.limit(
        &format!("{} 4MiB", copy_limits.split_name),
        copy_limits.split,
        "GB/s",
    );
    match only {
        Only::All => {}
        Only::Device => {
            embedded(report, &copy_limits, rounds)?;
            return crate::device::run(report, duration);
        }
        Only::Stream => return crate::stream::run(report, memcpy, quick),
        Only::Load => return crate::load::run(report),
        Only::Tcp => return over_tcp(report, rounds, Redis::start(MIB)),
        Only::SameHost => return crate::same_host::run(report, if quick { 3 } else { 7 }),
    }
    allocator(report, duration);
    embedded(report, &copy_limits, rounds)?;
    crate::stream::run(report, memcpy, quick)?;
    crate::device::run(report, duration)?;
    over_tcp(report, rounds, Redis::start(MIB))?;
    crate::same_host::run(report, if quick { 3 } else { 7 })?;
    crate::p2p::run(report, rounds)
}
