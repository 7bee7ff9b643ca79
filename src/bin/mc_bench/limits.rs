//! The hardware limits measured in the same run: single-thread memcpy bandwidth, raw
//! loopback TCP single-stream throughput and the 64-byte round trip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A pool of pre-faulted buffers used round-robin so copies run at DRAM, not cache, speed.
pub struct Pool {
    pub bufs: Vec<Vec<u8>>,
}

impl Pool {
    pub fn new(count: usize, size: usize, seed: u8) -> Pool {
        Pool {
            bufs: (0..count)
                .map(|i| vec![seed.wrapping_add(i as u8); size])
                .collect(),
        }
    }
}

/// GB/s of `memcpy` of `size`-byte blocks between two pools, for about `duration`.
pub fn memcpy_gbps(size: usize, duration: Duration) -> f64 {
    let src = Pool::new(16, size, 1);
    let mut dst = Pool::new(16, size, 2);
    let mut bytes = 0u64;
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < duration {
        let k = i % 16;
        dst.bufs[k].copy_from_slice(&src.bufs[k]);
        std::hint::black_box(&dst.bufs[k]);
        bytes += size as u64;
        i += 1;
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// A loopback server answering an 8-byte request `n` with `n` bytes (a "get" on raw TCP);
/// `n == 0` is a 64-byte echo for round trips.
fn raw_server() -> std::io::Result<(u16, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let handle = std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let payload = vec![7u8; 64 << 20];
        let mut request = [0u8; 8];
        let mut echo = [0u8; 64];
        while stream.read_exact(&mut request).is_ok() {
            let n = u64::from_le_bytes(request) as usize;
            let ok = if n == 0 {
                stream
                    .read_exact(&mut echo)
                    .and_then(|_| stream.write_all(&echo))
            } else {
                stream.write_all(&payload[..n.min(payload.len())])
            };
            if ok.is_err() {
                return;
            }
        }
    });
    Ok((port, handle))
}

/// Raw loopback TCP: single-stream GB/s for `size`-byte responses and the 64-byte round trip
/// median in µs.
pub struct RawTcp {
    pub get_gbps: f64,
    pub rtt_us: f64,
}

pub fn raw_tcp(size: usize, duration: Duration, rtt_samples: usize) -> std::io::Result<RawTcp> {
    let (port, server) = raw_server()?;
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; size];
    let mut bytes = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        stream.write_all(&(size as u64).to_le_bytes())?;
        stream.read_exact(&mut buf)?;
        bytes += size as u64;
    }
    let get_gbps = bytes as f64 / start.elapsed().as_secs_f64() / 1e9;
    let mut samples = Vec::with_capacity(rtt_samples);
    let mut echo = [1u8; 64];
    for _ in 0..rtt_samples {
        let t = Instant::now();
        stream.write_all(&0u64.to_le_bytes())?;
        stream.write_all(&echo)?;
        stream.read_exact(&mut echo)?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(stream);
    let _ = server.join();
    Ok(RawTcp {
        get_gbps,
        rtt_us: median(&mut samples),
    })
}

/// The median of `samples` (0 for none).
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}
