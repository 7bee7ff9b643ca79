//! The initiating side of the TCP transport: a per-peer pool of idle persistent connections
//! and the blocking, pipelined exchange of wire requests (slices) on a connection.
//!
//! Connections carry `TCP_NODELAY`, a connect timeout and read/write timeouts (both
//! [`Settings::io_timeout`]). A connection that saw any error is dropped, never pooled again.
//!
//! Pipelining: the slices given to [`ConnectionPool::execute`] go out back to back on one
//! connection (headers and WRITE payloads coalesced into vectored writes) and their answers
//! are read back in order; the server handles a connection's requests strictly one after
//! the other, so queued requests simply wait in the socket buffers. To rule out a deadlock
//! (both sides blocked in `send` because neither reads), at most [`PIPELINE_WINDOW`] bytes of
//! answers (status frames plus READ data) are outstanding at any time, far below what the
//! two socket buffers on the answer path hold; the server therefore never blocks on sending
//! for long and keeps consuming requests.
//!
//! Failures: a refusal ends the connection (the server closes it), so the slices after a
//! refused one are sent again on another connection and the refused one alone fails. A
//! socket failure before anything completed on a connection taken from the pool (the peer
//! may have closed it while idle) is retried once on a fresh connection; READ and WRITE are
//! idempotent. Any other socket failure, a timeout or a malformed frame fails the slice it
//! happened on and every slice after it.

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
/// Most answer bytes outstanding on one connection (see the module docs). The receive
/// buffer of a fresh loopback or LAN socket alone is twice this by default.
const PIPELINE_WINDOW: usize = 64 << 10;
/// Most buffers handed to one vectored write (the kernel limit is 1024).
const MAX_IOV: usize = 128;

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

impl Slice {
    /// The wire header of this slice (always protocol v2).
    fn header(&self) -> [u8; HEADER_LEN] {
        SessionHeader {
            size: self.len as u64,
            addr: self.remote,
            opcode: self.op,
            v2: true,
        }
        .encode()
    }

    /// Bytes the server sends back for this slice when it succeeds.
    fn answer_len(&self) -> usize {
        match self.op {
            Opcode::Read => STATUS_LEN + self.len,
            Opcode::Write => STATUS_LEN,
        }
    }
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
            Failure::Io(e) => !is_timeout(e),
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

/// Whether `e` is a socket timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` report `WouldBlock`).
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// How a pipelined run on one connection ended.
struct Run {
    /// Leading slices that completed.
    completed: usize,
    /// Why slice number `completed` did not (`None`: all completed).
    stop: Option<Failure>,
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

    /// Runs `slices` against `peer` on the calling thread, pipelined on one connection at a
    /// time (see the module docs), blocking until all finished. One result per slice, in
    /// order; errors carry a human-readable detail.
    ///
    /// # Safety
    /// For every slice, `[local, local + len)` must be valid for the operation (writable for
    /// READ, readable for WRITE) and not accessed by others until this returns; the ranges of
    /// READ slices must not overlap any other slice's range.
    pub(crate) unsafe fn execute(
        &self,
        peer: SocketAddr,
        slices: &[Slice],
    ) -> Vec<Result<(), String>> {
        let mut results = Vec::with_capacity(slices.len());
        let mut fresh_only = false;
        while results.len() < slices.len() {
            let rest = &slices[results.len()..];
            let connection = if fresh_only {
                self.connect(peer).map(|stream| (stream, false))
            } else {
                self.checkout(peer)
            };
            let (mut stream, reused) = match connection {
                Ok(pair) => pair,
                Err(failure) => {
                    fail_all(&mut results, rest, &failure, peer);
                    break;
                }
            };
            // SAFETY: forwarded from the caller; an earlier failed attempt has finished with
            // the memory.
            let Run { completed, stop } = unsafe { pipeline(&mut stream, rest) };
            results.extend((0..completed).map(|_| Ok(())));
            fresh_only = false;
            match stop {
                None => self.give_back(peer, stream),
                Some(refusal @ Failure::Refused(_)) => {
                    // The server closed the connection; the rest goes on another one.
                    results.push(Err(refusal.describe(peer, &rest[completed])));
                }
                Some(failure) if reused && completed == 0 && failure.retryable() => {
                    tracing::debug!("pooled connection to {peer} failed, retrying on a fresh one");
                    fresh_only = true;
                }
                Some(failure) => {
                    fail_all(&mut results, &rest[completed..], &failure, peer);
                    break;
                }
            }
        }
        results
    }

    /// Closes every idle connection; later slices fail without touching the network.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.idle.lock().clear();
    }

    /// Pools a connection whose requests all completed.
    fn give_back(&self, peer: SocketAddr, stream: TcpStream) {
        let mut idle = self.idle.lock();
        // Checked under the lock, so nothing is pooled after `close` cleared the map.
        if !self.closed.load(Ordering::SeqCst) {
            let list = idle.entry(peer).or_default();
            if list.len() < MAX_IDLE_PER_PEER {
                list.push(stream);
            }
        }
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

/// Appends `failure` as the result of every slice in `slices`.
fn fail_all(
    results: &mut Vec<Result<(), String>>,
    slices: &[Slice],
    failure: &Failure,
    peer: SocketAddr,
) {
    results.extend(slices.iter().map(|s| Err(failure.describe(peer, s))));
}

/// Sends `slices` on `stream` and reads their answers, keeping at most [`PIPELINE_WINDOW`]
/// answer bytes outstanding (at least one request is always in flight). Stops at the first
/// slice that fails.
///
/// # Safety
/// As [`ConnectionPool::execute`].
unsafe fn pipeline(stream: &mut TcpStream, slices: &[Slice]) -> Run {
    // Requests handed to the socket, answers we may wait for, and answers read.
    let (mut sent, mut awaited, mut completed) = (0, 0, 0);
    // Answer bytes of the requests in `completed..sent`.
    let mut outstanding = 0;
    let mut send_error: Option<io::Error> = None;
    while completed < slices.len() {
        // Refill once half the window drained, so a long group costs few send calls.
        if send_error.is_none() && (sent == completed || outstanding <= PIPELINE_WINDOW / 2) {
            let mut end = sent;
            while let Some(slice) = slices.get(end) {
                if end > completed && outstanding + slice.answer_len() > PIPELINE_WINDOW {
                    break;
                }
                outstanding += slice.answer_len();
                end += 1;
            }
            if end > sent {
                // SAFETY: forwarded from the caller.
                match unsafe { send_requests(stream, &slices[sent..end]) } {
                    Ok(()) => awaited = end,
                    Err((e, whole)) => {
                        // The answer to a partly sent request may still be a refusal, unless
                        // the peer is merely slow (then waiting for it would only time out).
                        let partial = usize::from(!is_timeout(&e));
                        awaited = (sent + whole + partial).min(end);
                        send_error = Some(e);
                    }
                }
                sent = end;
            }
        }
        if completed == awaited {
            let e = send_error.unwrap_or_else(|| io::Error::other("nothing left to receive"));
            return Run {
                completed,
                stop: Some(Failure::Io(e)),
            };
        }
        let slice = &slices[completed];
        // SAFETY: forwarded from the caller.
        match unsafe { receive_answer(stream, slice) } {
            Ok(()) => {
                outstanding -= slice.answer_len();
                completed += 1;
            }
            Err(failure) => {
                // A lost connection after a failed send is best explained by the send error.
                let stop = match (failure, send_error) {
                    (Failure::Io(_), Some(e)) => Failure::Io(e),
                    (failure, _) => failure,
                };
                return Run {
                    completed,
                    stop: Some(stop),
                };
            }
        }
    }
    Run {
        completed,
        stop: None,
    }
}

/// Writes the requests' headers and WRITE payloads back to back with vectored writes. On
/// failure also says how many leading requests went out completely.
///
/// # Safety
/// The local range of every WRITE slice must be readable.
unsafe fn send_requests(stream: &mut TcpStream, slices: &[Slice]) -> Result<(), (io::Error, usize)> {
    let headers: Vec<[u8; HEADER_LEN]> = slices.iter().map(Slice::header).collect();
    let mut parts: Vec<&[u8]> = Vec::with_capacity(slices.len() * 2);
    // Number of `parts` up to and including each request's last part.
    let mut ends = Vec::with_capacity(slices.len());
    for (slice, header) in slices.iter().zip(&headers) {
        parts.push(header);
        if slice.op == Opcode::Write {
            // SAFETY: the caller guarantees `local` is readable for `len` bytes.
            parts.push(unsafe { std::slice::from_raw_parts(slice.local as *const u8, slice.len) });
        }
        ends.push(parts.len());
    }
    // Position: the first unsent byte is `parts[part][offset]`.
    let (mut part, mut offset) = (0, 0);
    let whole = |part: usize| ends.partition_point(|&end| end <= part);
    let mut io = Vec::with_capacity(parts.len().min(MAX_IOV));
    while part < parts.len() {
        io.clear();
        io.push(IoSlice::new(&parts[part][offset..]));
        io.extend(parts[part + 1..].iter().take(MAX_IOV - 1).map(|p| IoSlice::new(p)));
        match stream.write_vectored(&io) {
            Ok(0) => return Err((io::ErrorKind::WriteZero.into(), whole(part))),
            Ok(mut n) => {
                while n > 0 && part < parts.len() {
                    let left = parts[part].len() - offset;
                    if n < left {
                        offset += n;
                        n = 0;
                    } else {
                        n -= left;
                        part += 1;
                        offset = 0;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((e, whole(part))),
        }
    }
    Ok(())
}

/// Reads the answer to one sent request: the status frame and, for an accepted READ, the
/// data straight into the slice's local memory.
///
/// # Safety
/// The local range of a READ slice must be writable.
unsafe fn receive_answer(stream: &mut TcpStream, slice: &Slice) -> Result<(), Failure> {
    match slice.op {
        Opcode::Write => {
            let mut status = [0u8; STATUS_LEN];
            stream.read_exact(&mut status)?;
            check_status(&status)
        }
        Opcode::Read => {
            // SAFETY: the caller guarantees `local` is writable for `len` bytes.
            let target = unsafe { std::slice::from_raw_parts_mut(slice.local, slice.len) };
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
