//! The initiating side of the TCP transport: a per-peer pool of idle persistent connections
//! and the blocking exchange of one wire request (one slice) on a connection.
//!
//! Connections carry `TCP_NODELAY`, a connect timeout and read/write timeouts (both
//! [`Settings::io_timeout`]). A connection that saw any error is dropped, never pooled again.
//! A failure on a connection taken from the pool (the peer may have closed it while idle) is
//! retried once on a fresh connection; READ and WRITE are idempotent, and refusals and
//! timeouts are not retried.

use super::metrics::{bump, Metrics};
use super::settings::Settings;
use super::wire::{Opcode, SessionHeader, Status, HEADER_LEN, STATUS_LEN};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Most idle connections kept per peer; more are closed when returned.
const MAX_IDLE_PER_PEER: usize = 32;

/// One wire request as the initiator sees it: `len` bytes between `local` (this process)
/// and `remote` (an address in the peer process).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slice {
    /// Direction: READ fills `local`, WRITE sends from `local`.
    pub(crate) op: Opcode,
    /// Local memory; see [`ConnectionPool::execute`] for the validity contract.
    pub(crate) local: *mut u8,
    /// Number of bytes (> 0).
    pub(crate) len: usize,
    /// Target address in the peer process.
    pub(crate) remote: u64,
}

/// Why one exchange failed.
enum Failure {
    /// The socket failed (connect, send, receive, timeout, early close).
    Io(io::Error),
    /// The peer answered with a status other than OK.
    Refused(Status),
    /// The peer sent a frame without the status magic.
    Protocol,
}

impl Failure {
    /// Whether a fresh connection might succeed where a pooled one failed.
    fn retryable(&self) -> bool {
        match self {
            Failure::Io(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            Failure::Refused(_) | Failure::Protocol => false,
        }
    }

    fn describe(&self, peer: SocketAddr, slice: &Slice) -> String {
        let what = format!(
            "{:?} of {} bytes at {:#x} on {peer}",
            slice.op, slice.len, slice.remote
        );
        match self {
            Failure::Io(e) => format!("{what}: {e}"),
            Failure::Refused(Status::AddrRejected) => {
                format!("{what}: refused, address not in a remotely accessible registered buffer")
            }
            Failure::Refused(status) => format!("{what}: refused with {status:?}"),
            Failure::Protocol => format!("{what}: malformed status frame"),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Io(e)
    }
}

/// Idle connections per peer. Thread-safe; share by `Arc`.
pub(crate) struct ConnectionPool {
    idle: Mutex<HashMap<SocketAddr, Vec<TcpStream>>>,
    closed: AtomicBool,
    settings: Settings,
    metrics: Arc<Metrics>,
}

impl ConnectionPool {
    pub(crate) fn new(settings: Settings, metrics: Arc<Metrics>) -> ConnectionPool {
        ConnectionPool {
            idle: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            settings,
            metrics,
        }
    }

    /// Runs `slice` against `peer` on the calling thread, blocking until it finished.
    /// Errors carry a human-readable detail.
    ///
    /// # Safety
    /// `[slice.local, slice.local + slice.len)` must be valid for the operation (writable for
    /// READ, readable for WRITE) and not accessed by others until this returns.
    pub(crate) unsafe fn execute(&self, peer: SocketAddr, slice: &Slice) -> Result<(), String> {
        let (stream, reused) = match self.checkout(peer) {
            Ok(pair) => pair,
            Err(failure) => return Err(failure.describe(peer, slice)),
        };
        // SAFETY: forwarded from the caller.
        match unsafe { self.exchange_and_return(peer, stream, slice) } {
            Err(failure) if reused && failure.retryable() => {
                tracing::debug!("pooled connection to {peer} failed, retrying on a fresh one");
                let fresh = self.connect(peer).map_err(|f| f.describe(peer, slice))?;
                // SAFETY: as above; the failed attempt has finished with the memory.
                unsafe { self.exchange_and_return(peer, fresh, slice) }
                    .map_err(|f| f.describe(peer, slice))
            }
            other => other.map_err(|f| f.describe(peer, slice)),
        }
    }

    /// Closes every idle connection; later slices fail without touching the network.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.idle.lock().clear();
    }

    /// Exchanges one slice and pools the connection again if it succeeded.
    ///
    /// # Safety
    /// As [`ConnectionPool::execute`].
    unsafe fn exchange_and_return(
        &self,
        peer: SocketAddr,
        mut stream: TcpStream,
        slice: &Slice,
    ) -> Result<(), Failure> {
        // SAFETY: forwarded from the caller.
        unsafe { exchange(&mut stream, slice) }?;
        let mut idle = self.idle.lock();
        // Checked under the lock, so nothing is pooled after `close` cleared the map.
        if !self.closed.load(Ordering::SeqCst) {
            let list = idle.entry(peer).or_default();
            if list.len() < MAX_IDLE_PER_PEER {
                list.push(stream);
            }
        }
        Ok(())
    }

    /// An idle connection to `peer` (reused = true) or a new one.
    fn checkout(&self, peer: SocketAddr) -> Result<(TcpStream, bool), Failure> {
        self.ensure_open()?;
        if let Some(stream) = self.idle.lock().get_mut(&peer).and_then(Vec::pop) {
            return Ok((stream, true));
        }
        Ok((self.connect(peer)?, false))
    }

    fn ensure_open(&self) -> Result<(), Failure> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Failure::Io(io::Error::other(
                "transfer engine is shut down",
            )));
        }
        Ok(())
    }

    fn connect(&self, peer: SocketAddr) -> Result<TcpStream, Failure> {
        self.ensure_open()?;
        let timeout = self.settings.io_timeout;
        let stream = TcpStream::connect_timeout(&peer, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        bump(&self.metrics.connections_opened);
        Ok(stream)
    }
}

/// Sends one v2 request and completes it.
///
/// # Safety
/// As [`ConnectionPool::execute`].
unsafe fn exchange(stream: &mut TcpStream, slice: &Slice) -> Result<(), Failure> {
    let header = SessionHeader {
        size: slice.len as u64,
        addr: slice.remote,
        opcode: slice.op,
        v2: true,
    }
    .encode();
    match slice.op {
        Opcode::Write => {
            // SAFETY: the caller guarantees `local` is readable for `len` bytes.
            let payload =
                unsafe { std::slice::from_raw_parts(slice.local as *const u8, slice.len) };
            send_prefixed(stream, &header, payload)?;
            let mut status = [0u8; STATUS_LEN];
            stream.read_exact(&mut status)?;
            check_status(&status)
        }
        Opcode::Read => {
            // SAFETY: the caller guarantees `local` is writable for `len` bytes.
            let target = unsafe { std::slice::from_raw_parts_mut(slice.local, slice.len) };
            stream.write_all(&header)?;
            receive_prefixed(stream, target)
        }
    }
}

fn check_status(frame: &[u8; STATUS_LEN]) -> Result<(), Failure> {
    match Status::decode(frame) {
        Some(Status::Ok) => Ok(()),
        Some(status) => Err(Failure::Refused(status)),
        None => Err(Failure::Protocol),
    }
}

/// Writes the header and the payload, coalescing them into one segment when possible.
fn send_prefixed(
    stream: &mut TcpStream,
    header: &[u8; HEADER_LEN],
    payload: &[u8],
) -> io::Result<()> {
    let mut sent = 0;
    while sent < HEADER_LEN {
        match stream.write_vectored(&[IoSlice::new(&header[sent..]), IoSlice::new(payload)]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    stream.write_all(&payload[sent - HEADER_LEN..])
}

/// Reads the status frame and, if it is OK, the payload into `target`, usually with a single
/// system call for small payloads.
fn receive_prefixed(stream: &mut TcpStream, target: &mut [u8]) -> Result<(), Failure> {
    let mut status = [0u8; STATUS_LEN];
    let got = loop {
        match stream.read_vectored(&mut [IoSliceMut::new(&mut status), IoSliceMut::new(target)]) {
            Ok(0) => return Err(Failure::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    };
    if got < STATUS_LEN {
        stream.read_exact(&mut status[got..])?;
    }
    check_status(&status)?;
    stream.read_exact(&mut target[got.saturating_sub(STATUS_LEN)..])?;
    Ok(())
}
