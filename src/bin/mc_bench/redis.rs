//! Optional comparison with `redis-server` (when the binary is on PATH): one client, SET then
//! timed GETs of a 1 MiB value over loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn command(stream: &mut TcpStream, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    stream.write_all(&out)
}

fn bulk_reply(reader: &mut BufReader<TcpStream>, into: &mut Vec<u8>) -> std::io::Result<()> {
    let mut header = String::new();
    reader.read_line(&mut header)?;
    let len: usize = header
        .trim()
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected reply {header:?}")))?;
    into.resize(len + 2, 0);
    reader.read_exact(into)
}

/// GB/s of redis GET for a `size`-byte value, or `None` when redis-server is not available.
pub fn get_gbps(size: usize, duration: Duration) -> Option<f64> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let _server = Server(child);
    let start = Instant::now();
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => return None,
        }
    };
    stream.set_nodelay(true).ok()?;
    let mut reader = BufReader::with_capacity(4 << 20, stream.try_clone().ok()?);
    let value = vec![5u8; size];
    command(&mut stream, &[b"SET", b"bench", &value]).ok()?;
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut out = Vec::with_capacity(size + 2);
    let mut bytes = 0u64;
    let timed = Instant::now();
    while timed.elapsed() < duration {
        command(&mut stream, &[b"GET", b"bench"]).ok()?;
        bulk_reply(&mut reader, &mut out).ok()?;
        bytes += size as u64;
    }
    Some(bytes as f64 / timed.elapsed().as_secs_f64() / 1e9)
}
