//! The hardware limits measured in the same run: single-thread memcpy bandwidth, raw
//! loopback TCP single-stream throughput and round trips ([`RawTcp`]), and the least a
//! batch get must do on raw TCP ([`RawBatch`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A pool of pre-faulted buffers used round-robin so copies run at DRAM, not cache, speed.
pub struct Pool {
    pub bufs: Vec<Vec<u8>>,
}

impl Pool {
    /// `count` buffers of `size` bytes, buffer `i` filled with `seed + i`, every page written
    /// (a zero fill alone would leave fresh pages unmapped: their first copy would fault).
    pub fn new(count: usize, size: usize, seed: u8) -> Pool {
        let bufs = (0..count)
            .map(|i| {
                let fill = seed.wrapping_add(i as u8);
                let mut buf = vec![fill; size];
                for page in buf.iter_mut().step_by(4096) {
                    // SAFETY: `page` is a valid, exclusive reference into `buf`.
                    unsafe { std::ptr::write_volatile(page, fill) };
                }
                buf
            })
            .collect();
        Pool { bufs }
    }
}

/// GB/s of `memcpy` of `size`-byte blocks between two pools, for about `duration`.
pub fn memcpy_gbps(size: usize, duration: Duration) -> f64 {
    let src = Pool::new(16, size, 1);
    let mut dst = Pool::new(16, size, 2);
    copy_between_gbps(&src, &mut dst, duration)
}

/// Runs `step(state, i)` for i = 0, 1, … on one thread per state (the caller's included), all
/// of them in lockstep — every thread's step `i` ends before any step `i + 1` starts, as a
/// caller waits for all pieces of one split operation — for about `duration`. Returns the
/// steps each thread made and the seconds they took, or the first step's error.
pub fn lockstep<S: Send>(
    states: Vec<S>,
    duration: Duration,
    step: impl Fn(&mut S, usize) -> std::io::Result<()> + Sync,
) -> std::io::Result<(u64, f64)> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let threads = states.len().max(1);
    let barrier = std::sync::Barrier::new(threads);
    let (stop, steps) = (AtomicBool::new(false), AtomicU64::new(0));
    let failure: std::sync::Mutex<Option<std::io::Error>> = std::sync::Mutex::new(None);
    let start = Instant::now();
    let run = |t: usize, mut state: S| {
        for i in 0.. {
            barrier.wait();
            if stop.load(Ordering::Acquire) {
                return;
            }
            if let Err(e) = step(&mut state, i) {
                failure.lock().unwrap().get_or_insert(e);
                stop.store(true, Ordering::Release);
            }
            barrier.wait();
            if t == 0 {
                steps.fetch_add(1, Ordering::Relaxed);
                if start.elapsed() >= duration {
                    stop.store(true, Ordering::Release);
                }
            }
        }
    };
    std::thread::scope(|scope| {
        let mut states = states.into_iter().enumerate();
        let first = states.next();
        for (t, state) in states {
            let run = &run;
            scope.spawn(move || run(t, state));
        }
        if let Some((t, state)) = first {
            run(t, state);
        }
    });
    if let Some(e) = failure.into_inner().unwrap() {
        return Err(e);
    }
    Ok((steps.into_inner(), start.elapsed().as_secs_f64()))
}

/// GB/s of `size`-byte memcpys each cut into `threads` equal pieces copied at once by
/// `threads` threads in lockstep (see [`lockstep`]), for about `duration`: the like-for-like
/// limit of a store copy the copy crew splits across that many threads.
pub fn memcpy_split_gbps(size: usize, threads: usize, duration: Duration) -> f64 {
    let threads = threads.max(1);
    let src = Pool::new(16, size, 1);
    let mut dst = Pool::new(16, size, 2);
    let piece = size.div_ceil(threads);
    // Each thread owns the same piece of every destination block.
    let mut parts: Vec<Vec<&mut [u8]>> = (0..threads).map(|_| Vec::new()).collect();
    for block in dst.bufs.iter_mut() {
        for (t, chunk) in block.chunks_mut(piece).enumerate() {
            parts[t].push(chunk);
        }
    }
    let parts: Vec<(usize, Vec<&mut [u8]>)> = parts.into_iter().enumerate().collect();
    let done = lockstep(parts, duration, |(t, mine), i| {
        let block = i % src.bufs.len();
        copy_block(mine[block], &src.bufs[block][*t * piece..]);
        Ok(())
    });
    let (steps, seconds) = done.unwrap_or((0, 1.0));
    (steps * size as u64) as f64 / seconds / 1e9
}

/// GB/s of one-thread `memcpy` of blocks from `src` into `dst` for about `duration`: copy `i`
/// goes from `src.bufs[i % src]` to `dst.bufs[i % dst]`, so the working set and the reuse of
/// each side are those of a scenario that reads the same sources into the same destinations.
/// Of blocks of different lengths the shorter length is copied.
pub fn copy_between_gbps(src: &Pool, dst: &mut Pool, duration: Duration) -> f64 {
    let (mut bytes, mut i) = (0u64, 0usize);
    let (sources, destinations) = (src.bufs.len().max(1), dst.bufs.len().max(1));
    let start = Instant::now();
    while start.elapsed() < duration && !src.bufs.is_empty() && !dst.bufs.is_empty() {
        let from = &src.bufs[i % sources];
        let to = &mut dst.bufs[i % destinations];
        bytes += copy_block(to, from) as u64;
        i += 1;
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// The memcpy of every limit: copies the first `min(len)` bytes of `from` into `to` (kept
/// from being optimised away) and returns how many.
pub fn copy_block(to: &mut [u8], from: &[u8]) -> usize {
    let n = from.len().min(to.len());
    to[..n].copy_from_slice(&from[..n]);
    std::hint::black_box(&to[..n]);
    n
}

/// Largest answer the raw server sends (its payload buffer).
const RAW_PAYLOAD: usize = 64 << 20;

/// A loopback server answering each 8-byte request `n` with `n` bytes (a "get" on raw TCP),
/// taken round-robin from a 64 MiB payload so that, like the store's gets, it does not send
/// the same cache-warm bytes every time.
fn raw_server() -> std::io::Result<(u16, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let handle = std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let payload = vec![7u8; RAW_PAYLOAD];
        let mut request = [0u8; 8];
        let mut turn = 0usize;
        while stream.read_exact(&mut request).is_ok() {
            let n = (u64::from_le_bytes(request) as usize).clamp(1, RAW_PAYLOAD);
            let slot = turn % (RAW_PAYLOAD / n);
            turn += 1;
            if stream
                .write_all(&payload[slot * n..(slot + 1) * n])
                .is_err()
            {
                return;
            }
        }
    });
    Ok((port, handle))
}

/// Raw loopback TCP, the limit of the TCP scenarios: one persistent connection (with
/// `TCP_NODELAY`) to a server thread of this process that answers an 8-byte request with `n`
/// bytes. Measure it interleaved with the scenario it judges (see `interleave`). Not
/// thread-safe (`&mut self`); dropping it closes the connection and joins the server thread.
pub struct RawTcp {
    stream: Option<TcpStream>,
    server: Option<std::thread::JoinHandle<()>>,
    /// Destination buffers, used round-robin like the scenarios' `Pool`s.
    bufs: Pool,
}

impl RawTcp {
    /// Starts the server thread and connects to it. Errors: the socket's.
    pub fn connect() -> std::io::Result<RawTcp> {
        let (port, server) = raw_server()?;
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        Ok(RawTcp {
            stream: Some(stream),
            server: Some(server),
            bufs: Pool::new(4, 0, 0),
        })
    }

    /// One raw get of `size` bytes into destination buffer `k % 4`.
    fn get(&mut self, size: usize, k: usize) -> std::io::Result<()> {
        let stream = self
            .stream
            .as_mut()
            .ok_or(std::io::ErrorKind::NotConnected)?;
        let buf = &mut self.bufs.bufs[k % 4];
        if buf.len() != size {
            *buf = vec![0u8; size];
        }
        stream.write_all(&(size as u64).to_le_bytes())?;
        // Awaited awake, as the store's clients await their answers.
        mooncake_rs::spin::before_read(stream);
        stream.read_exact(buf)
    }

    /// GB/s of back-to-back `size`-byte gets (1..=64 MiB) for about `duration`.
    pub fn get_gbps(&mut self, size: usize, duration: Duration) -> std::io::Result<f64> {
        for k in 0..4 {
            self.get(size, k)?; // sizes and faults the buffers, untimed
        }
        let (mut bytes, mut k) = (0u64, 0usize);
        let start = Instant::now();
        while start.elapsed() < duration {
            self.get(size, k)?;
            bytes += size as u64;
            k += 1;
        }
        Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e9)
    }

    /// The median round trip in µs of an 8-byte request answered with `size` bytes, over
    /// round trips made one after the other for about `duration`.
    pub fn rtt_us(&mut self, size: usize, duration: Duration) -> std::io::Result<f64> {
        for k in 0..4 {
            self.get(size, k)?;
        }
        let mut samples = Vec::new();
        let start = Instant::now();
        while start.elapsed() < duration {
            let t = Instant::now();
            self.get(size, samples.len())?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(median(&mut samples))
    }
}

/// Raw loopback TCP over `lanes` connections at once: each get of `size` bytes is cut into
/// `lanes` equal parts fetched in parallel, one per connection, in lockstep — the
/// like-for-like limit of a store get that its engine splits across `MC_TCP_LANES_PER_PEER`
/// connections. Not thread-safe (`&mut self`).
pub struct RawTcpLanes {
    lanes: Vec<RawTcp>,
}

impl RawTcpLanes {
    /// `lanes` (at least 1) connections, each to a server thread of its own.
    pub fn connect(lanes: usize) -> std::io::Result<RawTcpLanes> {
        let lanes = (0..lanes.max(1))
            .map(|_| RawTcp::connect())
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(RawTcpLanes { lanes })
    }

    /// How many connections a get is cut across.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// GB/s of back-to-back `size`-byte gets, each split across the lanes, for `duration`.
    pub fn get_gbps(&mut self, size: usize, duration: Duration) -> std::io::Result<f64> {
        let part = size.div_ceil(self.lanes.len());
        for lane in &mut self.lanes {
            for k in 0..4 {
                lane.get(part, k)?; // sizes and faults the buffers, untimed
            }
        }
        let lanes: Vec<&mut RawTcp> = self.lanes.iter_mut().collect();
        let (steps, seconds) = lockstep(lanes, duration, |lane, i| lane.get(part, i))?;
        Ok((steps * size as u64) as f64 / seconds / 1e9)
    }
}

/// The least a batch get of `keys` small objects must do on raw loopback TCP: one small
/// exchange with a "master" (an 8-byte request answered with [`MASTER_ANSWER`] bytes) and then
/// one exchange with a "data" server answered with all the objects' bytes at once — two round
/// trips on two persistent connections (`TCP_NODELAY`) to two server threads, as a batch get
/// makes one master query and one pipelined data exchange. Not thread-safe (`&mut self`).
pub struct RawBatch {
    master: RawTcp,
    data: RawTcp,
}

/// Bytes of the raw "master" answer (a small RPC reply).
pub const MASTER_ANSWER: usize = 64;

impl RawBatch {
    /// Starts both server threads and connects to them. Errors: the sockets'.
    pub fn connect() -> std::io::Result<RawBatch> {
        Ok(RawBatch {
            master: RawTcp::connect()?,
            data: RawTcp::connect()?,
        })
    }

    /// Keys per second of back-to-back raw batches of `keys` objects of `size` bytes (a
    /// master exchange, then the data exchange) for about `duration`, the same shape as a
    /// batch-get round. Errors: the sockets'.
    pub fn keys_per_s(
        &mut self,
        keys: usize,
        size: usize,
        duration: Duration,
    ) -> std::io::Result<f64> {
        let answer = keys * size;
        for k in 0..4 {
            self.master.get(MASTER_ANSWER, k)?;
            self.data.get(answer, k)?;
        }
        let (mut batches, start) = (0usize, Instant::now());
        while start.elapsed() < duration {
            self.master.get(MASTER_ANSWER, batches)?;
            self.data.get(answer, batches)?;
            batches += 1;
        }
        Ok((batches * keys) as f64 / start.elapsed().as_secs_f64())
    }
}

impl Drop for RawTcp {
    fn drop(&mut self) {
        drop(self.stream.take());
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}

/// The median of `samples` (0 for none).
/// The `q` quantile (0..=1) of `samples` (sorted in place); 0 when empty.
pub fn percentile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples.get(index).copied().unwrap_or(0.0)
}

pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}
