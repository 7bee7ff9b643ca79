//! A fault-injecting TCP proxy owned by the suite: it forwards 127.0.0.1:`port` to a target
//! and, on command, delays every chunk, trickles bytes one at a time, or resets every
//! connection (RST) for a while. Threads only; each connection has two pump threads.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to the bytes it forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass = 0,
    /// The proxy's delay (see [`Proxy::start`]) before every forwarded chunk.
    Delay = 1,
    /// Single-byte writes (the first 512 bytes of each chunk, a pause every 8).
    Trickle = 2,
    /// Every open connection is reset, and new ones are reset on arrival.
    Reset = 3,
}

struct Shared {
    mode: AtomicU8,
    /// What [`Mode::Delay`] holds every chunk for, in µs (set at start).
    delay_us: AtomicU64,
    stop: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
    /// Bytes written to either side so far.
    forwarded: AtomicU64,
}

/// A running proxy; dropped: it stops accepting (open connections end with their peers).
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

/// Makes the next close of `stream`'s socket send RST instead of FIN.
fn abort_on_close(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized linger struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

impl Proxy {
    /// Listens on a free port and forwards to 127.0.0.1:`target`; [`Mode::Delay`] holds
    /// every chunk for `delay`.
    pub fn start(target: u16, delay: Duration) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Pass as u8),
            delay_us: AtomicU64::new(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX)),
            stop: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            forwarded: AtomicU64::new(0),
        });
        let accept_shared = Arc::clone(&shared);
        std::thread::spawn(move || accept_loop(listener, target, accept_shared));
        Ok(Proxy { port, shared })
    }

    /// Bytes forwarded so far, both directions together.
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::Relaxed)
    }

    /// Switches the mode; `Reset` resets every open connection at once.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
        if mode == Mode::Reset {
            let mut open = self.shared.open.lock().unwrap_or_else(|e| e.into_inner());
            for stream in open.drain(..) {
                abort_on_close(&stream);
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

fn mode(shared: &Shared) -> Mode {
    match shared.mode.load(Ordering::SeqCst) {
        1 => Mode::Delay,
        2 => Mode::Trickle,
        3 => Mode::Reset,
        _ => Mode::Pass,
    }
}

fn accept_loop(listener: TcpListener, target: u16, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        let _ = client.set_nonblocking(false);
        if mode(&shared) == Mode::Reset {
            abort_on_close(&client);
            continue;
        }
        let Ok(server) =
            TcpStream::connect_timeout(&([127, 0, 0, 1], target).into(), Duration::from_secs(2))
        else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        {
            let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
            open.retain(|s| s.peer_addr().is_ok());
            open.push(c3);
            open.push(s3);
        }
        let up = Arc::clone(&shared);
        std::thread::spawn(move || pump(client, server, &up));
        let down = Arc::clone(&shared);
        std::thread::spawn(move || pump(s2, c2, &down));
    }
}

/// Copies `from` to `to` under the current mode until either side ends.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let ok = match mode(shared) {
            Mode::Pass => to.write_all(&chunk[..n]).is_ok(),
            Mode::Delay => {
                std::thread::sleep(Duration::from_micros(
                    shared.delay_us.load(Ordering::SeqCst),
                ));
                to.write_all(&chunk[..n]).is_ok()
            }
            Mode::Trickle => {
                let single = n.min(512);
                let mut ok = true;
                for (i, byte) in chunk[..single].iter().enumerate() {
                    if i % 8 == 7 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if to.write_all(std::slice::from_ref(byte)).is_err() {
                        ok = false;
                        break;
                    }
                }
                ok && to.write_all(&chunk[single..n]).is_ok()
            }
            Mode::Reset => false,
        };
        if !ok {
            break;
        }
        shared.forwarded.fetch_add(n as u64, Ordering::Relaxed);
    }
    if mode(shared) == Mode::Reset {
        abort_on_close(&to);
        abort_on_close(&from);
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
