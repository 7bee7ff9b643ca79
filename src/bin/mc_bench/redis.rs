//! The `redis-server` peer (when the binary is on PATH): one client connection, one value SET
//! once, then rounds of timed GETs over loopback, interleaved with the scenario they judge.

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

/// A running `redis-server` holding one `size`-byte value, and one client connection to it.
/// The server is killed on drop.
pub struct Redis {
    _server: Server,
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    out: Vec<u8>,
    size: usize,
}

impl Redis {
    /// Starts `redis-server` on a free loopback port and SETs a `size`-byte value; `None` when
    /// the binary is not on PATH or does not answer within 5 s.
    pub fn start(size: usize) -> Option<Redis> {
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
        let server = Server(child);
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
        command(&mut stream, &[b"SET", b"bench", &vec![5u8; size]]).ok()?;
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        Some(Redis {
            _server: server,
            stream,
            reader,
            out: Vec::with_capacity(size + 2),
            size,
        })
    }

    /// One round: GB/s of back-to-back GETs of the value for `duration` (one connection).
    pub fn get_gbps(&mut self, duration: Duration) -> Result<f64, String> {
        let mut bytes = 0u64;
        let timed = Instant::now();
        while timed.elapsed() < duration {
            command(&mut self.stream, &[b"GET", b"bench"]).map_err(|e| format!("redis: {e}"))?;
            bulk_reply(&mut self.reader, &mut self.out).map_err(|e| format!("redis: {e}"))?;
            bytes += self.size as u64;
        }
        Ok(bytes as f64 / timed.elapsed().as_secs_f64() / 1e9)
    }
}
