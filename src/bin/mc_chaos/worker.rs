//! A worker process: one client of the pool running a seeded random mix of operations on the
//! shared key space until its deadline, checking every byte it reads against
//! [`crate::value`] and journaling every call for the checker.
//!
//! Versions are `worker << 48 | incarnation << 32 | sequence`, unique across restarts.

use crate::journal::{now_ns, Event, Journal};
use crate::value;
use mooncake_rs::client::{Client, RangeRequest, SetupConfig};
use mooncake_rs::p2p::{P2pClient, P2pSetupConfig};
use mooncake_rs::stream::HostStream;
use mooncake_rs::types::ReplicateConfig;
use mooncake_rs::ErrorCode;
use std::time::Duration;

/// Everything a worker is started with (its command line).
pub struct WorkerArgs {
    pub master: String,
    /// The metadata server URL (`http://…/metadata`).
    pub metadata: String,
    /// The P2P cluster's master (`host:port`) and the host this worker's P2P accessor binds
    /// and advertises (reachable from every P2P owner, also one in a network namespace).
    pub p2p_master: String,
    pub p2p_host: String,
    pub worker: u64,
    pub incarnation: u64,
    pub seed: u64,
    pub journal: String,
    pub keys: usize,
    pub max_value: usize,
    /// CLOCK_MONOTONIC nanoseconds at which to stop.
    pub deadline_ns: u64,
    /// `Some(host:port)`: this worker is a dummy of that real client (`setup_dummy`); its
    /// registered memory then comes from the shared-memory pool.
    pub dummy_of: Option<String>,
    /// The prefix of the keys it writes and reads (`k`; `ha` in the HA cell).
    pub key_space: String,
}

/// The operations a worker draws from, with their weights.
pub const OPS: &[(&str, u32)] = &[
    ("put", 10),
    ("put_from", 8),
    ("put_batch", 5),
    ("batch_put_from", 5),
    ("put_multi", 5),
    ("upsert", 10),
    ("upsert_from", 6),
    ("upsert_batch", 4),
    ("get", 14),
    ("batch_get", 6),
    ("get_multi", 4),
    ("get_ranges", 5),
    ("session_get", 4),
    ("remove", 4),
    ("batch_remove", 2),
    ("remove_all", 1),
    ("stream_put", 5),
    ("stream_get", 6),
    ("p2p_put_fwd", 4),
    ("p2p_put_rev", 4),
    ("p2p_batch_put_fwd", 2),
    ("p2p_batch_put_rev", 2),
    ("p2p_get_fwd", 5),
    ("p2p_get_rev", 5),
    ("p2p_batch_get_fwd", 2),
    ("p2p_batch_get_rev", 2),
    ("p2p_remove", 6),
];

fn rc<T>(result: &Result<T, ErrorCode>) -> i32 {
    match result {
        Ok(_) => 0,
        Err(code) => code.code(),
    }
}

pub(crate) struct Worker {
    pub(crate) client: Client,
    pub(crate) journal: Journal,
    pub(crate) rng: fastrand::Rng,
    pub(crate) args: WorkerArgs,
    sequence: u64,
    /// Registered memory for the zero-copy writes (`*_from`, multi-buffer): heap memory, or a
    /// dummy's shared-memory block; lives as long as the process.
    registered: &'static mut [u8],
    /// Destination of reads (unregistered: the copying read path).
    read_buf: Vec<u8>,
    pub(crate) config: ReplicateConfig,
    /// The stream of the on-stream operations ([`crate::stream_ops`]); drained after each.
    pub(crate) stream: HostStream,
    /// The accessor of the P2P cluster ([`crate::p2p_ops`]).
    pub(crate) p2p: P2pClient,
}

/// Runs a worker; the exit code (0 at the deadline, 3 when setup never succeeded, 4 when
/// the journal cannot be written).
pub fn run(args: WorkerArgs) -> i32 {
    let journal = match Journal::open(&args.journal) {
        Ok(journal) => journal,
        Err(err) => {
            eprintln!("worker {}: journal {}: {err}", args.worker, args.journal);
            return 4;
        }
    };
    let client = loop {
        let setup = match &args.dummy_of {
            Some(real_client) => Client::setup_dummy(0, 32 << 20, real_client),
            None => Client::setup(SetupConfig {
                local_hostname: "127.0.0.1".into(),
                global_segment_size: 0,
                local_buffer_size: 32 << 20,
                master_server_addr: args.master.clone(),
                metadata_server: args.metadata.clone(),
                ..SetupConfig::default()
            }),
        };
        match setup {
            Ok(client) => break client,
            Err(code) if now_ns() < args.deadline_ns => {
                eprintln!("worker {}: setup: {code:?}; retrying", args.worker);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(code) => {
                eprintln!("worker {}: setup: {code:?}", args.worker);
                return 3;
            }
        }
    };
    let p2p = loop {
        let config = P2pSetupConfig {
            local_hostname: args.p2p_host.clone(),
            tiered_backend_config_json: r#"{"tiers":[]}"#.into(),
            local_buffer_size: 32 * args.max_value.max(value::HEADER_LEN) as u64,
            master_server_addr: args.p2p_master.clone(),
            ..P2pSetupConfig::default()
        };
        match P2pClient::setup_p2p(config) {
            Ok(p2p) => break p2p,
            Err(code) if now_ns() < args.deadline_ns => {
                eprintln!("worker {}: P2P setup: {code:?}; retrying", args.worker);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(code) => {
                eprintln!("worker {}: P2P setup: {code:?}", args.worker);
                return 3;
            }
        }
    };
    let stream = match HostStream::new() {
        Ok(stream) => stream,
        Err(err) => {
            eprintln!("worker {}: host stream: {err}", args.worker);
            return 3;
        }
    };
    let registered_len = 4 * args.max_value.max(value::HEADER_LEN) + 4096;
    let registered = match registered_memory(&client, registered_len) {
        Ok(memory) => memory,
        Err(code) => {
            eprintln!("worker {}: shared memory: {code:?}", args.worker);
            return 3;
        }
    };
    let mut worker = Worker {
        registered,
        read_buf: vec![0u8; args.max_value.max(value::HEADER_LEN)],
        client,
        rng: fastrand::Rng::with_seed(args.seed ^ (args.worker << 48) ^ (args.incarnation << 32)),
        sequence: 0,
        config: ReplicateConfig::default(),
        stream,
        p2p,
        args,
        journal,
    };
    let addr = worker.registered.as_ptr() as usize;
    if let Err(code) = worker.client.register_buffer(addr, registered_len) {
        eprintln!("worker {}: register_buffer: {code:?}", worker.args.worker);
        return 3;
    }
    let total: u32 = OPS.iter().map(|(_, w)| w).sum();
    let mut traffic_due = 0;
    while now_ns() < worker.args.deadline_ns {
        if now_ns() >= traffic_due {
            traffic_due = now_ns() + TRAFFIC_PERIOD_NS;
            if let Err(err) = worker.record_traffic() {
                eprintln!("worker {}: journal write: {err}", worker.args.worker);
                return 4;
            }
        }
        let mut pick = worker.rng.u32(0..total);
        let op = OPS
            .iter()
            .find(|(_, weight)| {
                if pick < *weight {
                    return true;
                }
                pick -= weight;
                false
            })
            .map_or("get", |(name, _)| name);
        if let Err(err) = worker.step(op) {
            eprintln!("worker {}: journal write: {err}", worker.args.worker);
            return 4;
        }
    }
    if let Err(err) = worker.record_traffic() {
        eprintln!("worker {}: journal write: {err}", worker.args.worker);
        return 4;
    }
    let _ = worker.client.unregister_buffer(addr);
    worker.client.teardown();
    worker.p2p.teardown();
    0
}

/// How often a worker journals its [`Event::Traffic`] totals.
const TRAFFIC_PERIOD_NS: u64 = 2_000_000_000;

/// `len` bytes of memory `client` can register for zero-copy writes, zeroed, kept for the
/// process's life: heap memory, or for a dummy a block of the shared-memory pool (the only
/// memory its real client can map).
fn registered_memory(client: &Client, len: usize) -> Result<&'static mut [u8], ErrorCode> {
    if !client.is_dummy() {
        return Ok(vec![0u8; len].leak());
    }
    let addr = client.alloc_from_mem_pool(len as u64)?;
    // SAFETY: a fresh block of at least `len` zeroed bytes, mapped for the process's life
    // (never freed), used only through this slice.
    Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) })
}

impl Worker {
    /// Journals this incarnation's data-path totals so far ([`Event::Traffic`]).
    fn record_traffic(&mut self) -> std::io::Result<()> {
        let metrics = self.client.metrics();
        let dummy = self.client.dummy_stats().unwrap_or_default();
        self.journal.record(&Event::Traffic {
            at: now_ns(),
            same_host_bytes: metrics.transfer.same_host_read_bytes
                + metrics.transfer.same_host_write_bytes,
            dummy_bytes: dummy.zero_copy_bytes + dummy.staged_bytes,
            cache_hits: metrics.location_cache.hits,
        })
    }

    fn key(&mut self) -> String {
        let space = self.args.key_space.clone();
        self.key_in(&space)
    }

    fn key_in(&mut self, prefix: &str) -> String {
        format!("{prefix}/{}", self.rng.usize(0..self.args.keys))
    }

    pub(crate) fn distinct_keys(&mut self, count: usize) -> Vec<String> {
        let space = self.args.key_space.clone();
        self.distinct_keys_in(&space, count)
    }

    /// `count` distinct keys of the key space `prefix/N`.
    pub(crate) fn distinct_keys_in(&mut self, prefix: &str, count: usize) -> Vec<String> {
        let mut keys: Vec<String> = Vec::with_capacity(count);
        while keys.len() < count.min(self.args.keys) {
            let key = self.key_in(prefix);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    pub(crate) fn version(&mut self) -> u64 {
        self.sequence += 1;
        (self.args.worker << 48) | (self.args.incarnation << 32) | self.sequence
    }

    /// A value length: mostly small, some medium, a few near the maximum.
    pub(crate) fn length(&mut self) -> usize {
        let max = self.args.max_value.max(value::HEADER_LEN + 1);
        let cap = match self.rng.u32(0..10) {
            0..=5 => 4096,
            6..=8 => 256 * 1024,
            _ => max,
        };
        self.rng.usize(value::HEADER_LEN..=cap.min(max))
    }

    fn step(&mut self, op: &str) -> std::io::Result<()> {
        match op {
            "put" | "upsert" | "put_from" | "upsert_from" => self.write_one(op),
            "put_batch" | "upsert_batch" | "batch_put_from" | "put_multi" => self.write_many(op),
            "get" => self.get(),
            "batch_get" => self.batch_get(),
            "get_multi" => self.get_multi(),
            "get_ranges" => self.get_ranges(),
            "session_get" => self.session_get(),
            "remove" | "batch_remove" | "remove_all" => self.remove(op),
            "stream_get" => self.stream_get(),
            "stream_put" => self.stream_put(),
            "p2p_remove" => self.p2p_remove(),
            p2p if p2p.starts_with("p2p_put") || p2p.starts_with("p2p_batch_put") => {
                self.p2p_put(p2p)
            }
            p2p if p2p.starts_with("p2p_get") || p2p.starts_with("p2p_batch_get") => {
                self.p2p_get(p2p)
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn begin(&mut self, op: &str, key: &str, version: u64) -> std::io::Result<()> {
        self.journal.record(&Event::WriteBegin {
            at: now_ns(),
            op: op.into(),
            key: key.into(),
            version,
        })
    }

    pub(crate) fn end(&mut self, key: &str, version: u64, rc: i32) -> std::io::Result<()> {
        self.journal.record(&Event::WriteEnd {
            at: now_ns(),
            key: key.into(),
            version,
            rc,
        })
    }

    fn write_one(&mut self, op: &str) -> std::io::Result<()> {
        let key = self.key();
        let version = self.version();
        let len = self.length();
        self.begin(op, &key, version)?;
        let result = match op {
            "put" | "upsert" => {
                let bytes = value::build(&key, version, len);
                if op == "put" {
                    self.client.put(&key, &bytes, &self.config)
                } else {
                    self.client.upsert(&key, &bytes, &self.config)
                }
            }
            _ => {
                let offset = self.rng.usize(0..4096);
                let region = &mut self.registered[offset..offset + len];
                value::fill(region, &key, version);
                if op == "put_from" {
                    self.client.put_from(&key, region, &self.config)
                } else {
                    self.client.upsert_from(&key, region, &self.config)
                }
            }
        };
        self.end(&key, version, rc(&result))
    }

    fn write_many(&mut self, op: &str) -> std::io::Result<()> {
        let count = self.rng.usize(1..=4);
        let keys = self.distinct_keys(count);
        let mut plans = Vec::with_capacity(keys.len());
        for key in &keys {
            let version = self.version();
            let len = self.length().min(self.args.max_value);
            plans.push((version, len));
            self.begin(op, key, version)?;
        }
        let results: Vec<i32> = match op {
            "put_batch" | "upsert_batch" => {
                let values: Vec<Vec<u8>> = keys
                    .iter()
                    .zip(&plans)
                    .map(|(key, (version, len))| value::build(key, *version, *len))
                    .collect();
                let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
                let result = if op == "put_batch" {
                    self.client.put_batch(&keys, &slices, &self.config)
                } else {
                    self.client.upsert_batch(&keys, &slices, &self.config)
                };
                vec![rc(&result); keys.len()]
            }
            _ => {
                // Consecutive regions of the registered buffer; multi-buffer values are cut
                // in up to three parts at random points.
                let mut offset = 0;
                let mut ranges = Vec::with_capacity(keys.len());
                for (key, (version, len)) in keys.iter().zip(&plans) {
                    value::fill(&mut self.registered[offset..offset + len], key, *version);
                    ranges.push((offset, *len));
                    offset += len;
                }
                let registered = &self.registered;
                if op == "batch_put_from" {
                    let bufs: Vec<&[u8]> =
                        ranges.iter().map(|&(o, l)| &registered[o..o + l]).collect();
                    self.client
                        .batch_put_from(&keys, &bufs, &self.config)
                        .iter()
                        .map(rc)
                        .collect()
                } else {
                    let mut cuts = Vec::with_capacity(ranges.len());
                    for &(o, l) in &ranges {
                        let a = self.rng.usize(0..=l);
                        let b = self.rng.usize(a..=l);
                        cuts.push(vec![
                            &registered[o..o + a],
                            &registered[o + a..o + b],
                            &registered[o + b..o + l],
                        ]);
                    }
                    self.client
                        .batch_put_from_multi_buffers(&keys, &cuts, &self.config)
                        .iter()
                        .map(rc)
                        .collect()
                }
            }
        };
        for ((key, (version, _)), code) in keys.iter().zip(&plans).zip(results) {
            self.end(key, *version, code)?;
        }
        Ok(())
    }

    /// Journals a whole-value read of `key` (`size` bytes in `bytes`), checking every byte.
    pub(crate) fn record_whole(
        &mut self,
        op: &str,
        begin: u64,
        key: &str,
        result: Result<&[u8], ErrorCode>,
    ) -> std::io::Result<()> {
        let checked = result.map(|bytes| value::check_whole(bytes, key));
        self.journal
            .record(&read_event((op, begin, now_ns()), key, checked))
    }

    fn get(&mut self) -> std::io::Result<()> {
        let key = self.key();
        let begin = now_ns();
        let mut buf = std::mem::take(&mut self.read_buf);
        let result = self.client.get_into(&key, &mut buf);
        let out = self.record_whole("get", begin, &key, result.map(|n| &buf[..n as usize]));
        self.read_buf = buf;
        out
    }

    fn batch_get(&mut self) -> std::io::Result<()> {
        let count = self.rng.usize(1..=4);
        let keys = self.distinct_keys(count);
        let begin = now_ns();
        let mut bufs: Vec<Vec<u8>> = keys
            .iter()
            .map(|_| vec![0u8; self.args.max_value.max(value::HEADER_LEN)])
            .collect();
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
        let results = self.client.batch_get_into(&keys, &mut slices);
        for ((key, result), buf) in keys.iter().zip(results).zip(&bufs) {
            self.record_whole("batch_get", begin, key, result.map(|n| &buf[..n as usize]))?;
        }
        Ok(())
    }

    fn get_multi(&mut self) -> std::io::Result<()> {
        let key = self.key();
        let begin = now_ns();
        let size = match self.client.get_size(&key) {
            Ok(size) => size as usize,
            Err(code) => {
                return self.record_whole("get_multi", begin, &key, Err(code));
            }
        };
        let a = self.rng.usize(0..=size);
        let b = self.rng.usize(a..=size);
        let mut parts = [vec![0u8; a], vec![0u8; b - a], vec![0u8; size - b]];
        let mut lists = vec![parts.iter_mut().map(Vec::as_mut_slice).collect::<Vec<_>>()];
        let result = self
            .client
            .batch_get_into_multi_buffers(&[key.as_str()], &mut lists)
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError));
        let whole: Vec<u8> = parts.concat();
        self.record_whole(
            "get_multi",
            begin,
            &key,
            result.map(|n| &whole[..(n as usize).min(whole.len())]),
        )
    }

    /// Records a ranged read: the header fragment names the version, the other fragment
    /// must be exactly those bytes of that version.
    fn record_ranged(
        &mut self,
        (op, begin, key): (&str, u64, &str),
        header: &[u8],
        (offset, range): (u64, &[u8]),
        result: Result<(), ErrorCode>,
    ) -> std::io::Result<()> {
        let end = now_ns();
        let checked = result.map(|()| {
            value::read_header(header, key).and_then(|(version, len)| {
                value::check_range(header, 0, key, version, len)?;
                value::check_range(range, offset, key, version, len)?;
                Ok(version)
            })
        });
        self.journal
            .record(&read_event((op, begin, end), key, checked))
    }

    fn get_ranges(&mut self) -> std::io::Result<()> {
        let key = self.key();
        let offset = self.rng.u64(0..4096);
        let len = self.rng.u64(1..=512);
        let begin = now_ns();
        let hl = value::HEADER_LEN as u64;
        let mut buf = vec![0u8; value::HEADER_LEN + len as usize];
        let keys = [vec![key.clone()]];
        let request = RangeRequest {
            keys: &keys,
            dst_offsets: &[vec![vec![0, hl]]],
            src_offsets: &[vec![vec![0, offset]]],
            sizes: &[vec![vec![hl, len]]],
        };
        let results = self
            .client
            .get_into_ranges(&mut [buf.as_mut_slice()], &request);
        let fragments: Vec<Result<u64, ErrorCode>> =
            results.into_iter().flatten().flatten().collect();
        let result = match fragments.iter().find_map(|r| r.err()) {
            Some(code) => Err(code),
            None if fragments.len() == 2 => Ok(()),
            None => Err(ErrorCode::InternalError),
        };
        let (header, range) = buf.split_at(value::HEADER_LEN);
        self.record_ranged(("get_ranges", begin, &key), header, (offset, range), result)
    }

    fn session_get(&mut self) -> std::io::Result<()> {
        let key = self.key();
        let offset = self.rng.u64(0..4096);
        let len = self.rng.usize(1..=512);
        let begin = now_ns();
        let keys = [key.as_str()];
        let started = self
            .client
            .batch_get_session_start(&keys)
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError));
        let mut header = vec![0u8; value::HEADER_LEN];
        let mut range = vec![0u8; len];
        let result = match started {
            Err(code) => Err(code),
            Ok(()) => {
                let mut lists = vec![vec![header.as_mut_slice(), range.as_mut_slice()]];
                let read = self
                    .client
                    .batch_get_into_multi_buffer_ranges(&keys, &mut lists, &[vec![0, offset]])
                    .pop()
                    .unwrap_or(Err(ErrorCode::InternalError));
                let ended = self.client.batch_get_session_end(&keys);
                read.and(ended).map(|_| ())
            }
        };
        self.record_ranged(
            ("session_get", begin, &key),
            &header,
            (offset, &range),
            result,
        )
    }

    fn remove(&mut self, op: &str) -> std::io::Result<()> {
        let begin = now_ns();
        let outcomes: Vec<(String, i32)> = match op {
            "remove" => {
                let key = self.key();
                let result = self.client.remove(&key, false);
                vec![(key, rc(&result))]
            }
            "batch_remove" => {
                let count = self.rng.usize(1..=4);
                let keys = self.distinct_keys(count);
                let results = self.client.batch_remove(&keys, false);
                keys.into_iter().zip(results.iter().map(rc)).collect()
            }
            _ => vec![("*".into(), rc(&self.client.remove_all(false)))],
        };
        let end = now_ns();
        for (key, code) in outcomes {
            self.journal.record(&Event::Remove {
                begin,
                end,
                op: op.into(),
                key,
                rc: code,
            })?;
        }
        Ok(())
    }
}

/// The journal event of a checked read over `[begin, end]`: the call's error code, the
/// version whose bytes it returned, or what was wrong with them.
fn read_event(
    (op, begin, end): (&str, u64, u64),
    key: &str,
    checked: Result<Result<u64, String>, ErrorCode>,
) -> Event {
    let (op, key) = (op.to_string(), key.to_string());
    match checked {
        Err(code) => Event::Read {
            begin,
            end,
            op,
            key,
            version: 0,
            rc: code.code(),
        },
        Ok(Ok(version)) => Event::Read {
            begin,
            end,
            op,
            key,
            version,
            rc: 0,
        },
        Ok(Err(detail)) => Event::Corrupt {
            begin,
            end,
            op,
            key,
            detail,
        },
    }
}
