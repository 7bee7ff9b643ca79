//! The initiating side of the TCP transport: a per-peer pool of idle persistent connections
//! and the blocking, pipelined exchange of wire requests (slices) on a connection.
//!
//! Connections carry `TCP_NODELAY`, a connect timeout and read/write timeouts (both
//! [`Settings::io_timeout`]). A connection that saw any error, a refusal or a timeout is
//! closed abortively (`SO_LINGER` 0: RST, whatever is still queued is discarded, so no stale
//! WRITE payload reaches the peer after the close), never pooled again.
//!
//! Pipelining: the slices given to [`ConnectionPool::execute`] go out back to back on one
//! connection (headers and WRITE payloads coalesced into vectored writes) and their answers
//! are read back in order; the server handles a connection's requests strictly one after
//! the other, so queued requests simply wait in the socket buffers. To rule out a deadlock
//! (both sides blocked in `send` because neither reads), at most [`PIPELINE_WINDOW`] bytes of
//! answers (status frames plus READ data) are outstanding at any time, far below what the
//! two socket buffers on the answer path hold; the server therefore never blocks on sending
//! for long and keeps consuming requests. A run whose requests all together are at most
//! [`ONE_SEND_REQUESTS`] bytes (up to 32 READs: a batch of small gets) has no answer window:
//! its requests go out in the first send call, into an idle connection's empty send buffer
//! (far larger than that), so the initiator never blocks sending while answers wait; it only
//! reads from then on, and the whole batch costs one round trip.
//!
//! Stale pooled connections: a peer closes connections that stay idle too long
//! (`MC_TRANSFER_IDLE_TIMEOUT_MS` on its side). A pooled connection is checked without
//! blocking before reuse (a queued EOF, reset or stray data discards it). If the peer closed
//! it after that check, the peer had read nothing of our requests (it closes gracefully only
//! between requests, with nothing of a next one received), so we see its orderly close: an
//! EOF, or `EPIPE` once its kernel resets our late data, before any answer byte. Exactly that
//! case, on a connection taken from the pool, is retried once on a fresh connection. A reset
//! (`ECONNRESET`) before any answer byte is retried likewise when every slice left is a READ
//! (a peer that closes an idle connection with our request unread resets it; a READ sent
//! twice changes nothing). A reset with a WRITE left, a timeout, or a failure after any
//! answer byte is never retried: the peer may have applied (part of) a WRITE, which must not
//! be applied twice.
//!
//! Failures: a refusal ends the connection (the server closes it), so the slices after a
//! refused one are sent again on another connection and the refused one alone fails. Any
//! other socket failure, a timeout or a malformed frame fails the slice it happened on and
//! every slice after it; socket failures are marked [`SliceError::unreachable`].

use super::socket::{idle_connection_dead, set_abortive_close};
use super::wire::{SessionHeader, Status, HEADER_LEN, STATUS_LEN};
use crate::auth::{self, KeyId, KeyRing};
use crate::error::ErrorCode;
use crate::transfer::gather::Cursor;
use crate::transfer::metrics::{bump, Metrics};
use crate::transfer::settings::Settings;
use crate::transfer::transport::{Opcode, Slice, SliceError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Most idle connections kept per peer; more are closed when returned.
const MAX_IDLE_PER_PEER: usize = 32;
/// Most answer bytes outstanding on one connection (see the module docs). The receive
/// buffer of a fresh loopback or LAN socket alone is twice this by default.
const PIPELINE_WINDOW: usize = 64 << 10;
/// Request bytes (headers plus WRITE payloads) of a pipelined run small enough to go out in
/// its first send call whatever its answers weigh (see the module docs): 32 READ headers.
const ONE_SEND_REQUESTS: usize = 32 * HEADER_LEN;

impl Slice {
    /// The wire header of this slice (always protocol v2).
    fn header(&self) -> [u8; HEADER_LEN] {
        SessionHeader {
            size: self.len as u64,
            addr: self.remote,
            opcode: self.op,
            v2: true,
            epoch: (self.epoch != 0).then_some(self.epoch),
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
    /// The connection's cluster-key handshake failed.
    Auth,
}

impl Failure {
    /// Whether this is the peer's orderly close of an idle connection (an EOF, or `EPIPE`
    /// after it), which a fresh connection may retry if no answer byte arrived (module docs).
    fn closed_while_idle(&self) -> bool {
        match self {
            Failure::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe
            ),
            Failure::Refused(_) | Failure::Protocol | Failure::Auth => false,
        }
    }

    /// Whether the peer reset the connection (`ECONNRESET`): after an idle close that raced
    /// our request, or after it took (part of) a request; only READs may be retried then.
    fn reset(&self) -> bool {
        matches!(self, Failure::Io(e) if e.kind() == io::ErrorKind::ConnectionReset)
    }

    /// The slice's error: `STALE_SEGMENT_EPOCH` for a stale-epoch refusal, `TRANSFER_FAIL`
    /// otherwise.
    fn describe(&self, peer: SocketAddr, slice: &Slice) -> SliceError {
        let what = format!(
            "{:?} of {} bytes at {:#x} on {peer}",
            slice.op, slice.len, slice.remote
        );
        let (code, message) = match self {
            Failure::Io(e) => (ErrorCode::TransferFail, format!("{what}: {e}")),
            Failure::Refused(Status::AddrRejected) => (
                ErrorCode::TransferFail,
                format!("{what}: refused, address not in a remotely accessible registered buffer"),
            ),
            Failure::Refused(Status::StaleEpoch) => (
                ErrorCode::StaleSegmentEpoch,
                format!(
                    "{what}: refused, segment epoch {:#x} is not the current one",
                    slice.epoch
                ),
            ),
            Failure::Refused(status) => (
                ErrorCode::TransferFail,
                format!("{what}: refused with {status:?}"),
            ),
            Failure::Protocol => (
                ErrorCode::TransferFail,
                format!("{what}: malformed status frame"),
            ),
            Failure::Auth => (
                ErrorCode::AuthFailed,
                format!("{what}: {}", crate::error::last_error_message()),
            ),
        };
        SliceError {
            code,
            message,
            unreachable: matches!(self, Failure::Io(_)),
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
    /// Whether any answer byte arrived.
    answered: bool,
    /// Why slice number `completed` did not (`None`: all completed).
    stop: Option<Failure>,
}

/// A connection and the cluster key it proved (none without a key).
type Proven = (TcpStream, Option<KeyId>);

/// Idle connections per peer. Thread-safe; share by `Arc`.
pub(crate) struct ConnectionPool {
    /// Idle connections and the key each proved.
    idle: Mutex<HashMap<SocketAddr, Vec<Proven>>>,
    closed: AtomicBool,
    settings: Settings,
    metrics: Arc<Metrics>,
    /// The key each new connection proves first, if any.
    cluster_key: Option<Arc<KeyRing>>,
}

impl ConnectionPool {
    pub(crate) fn new(
        settings: Settings,
        metrics: Arc<Metrics>,
        cluster_key: Option<Arc<KeyRing>>,
    ) -> ConnectionPool {
        ConnectionPool {
            idle: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            settings,
            metrics,
            cluster_key,
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
    ) -> Vec<Result<(), SliceError>> {
        let mut results = Vec::with_capacity(slices.len());
        let mut fresh_only = false;
        while results.len() < slices.len() {
            let rest = &slices[results.len()..];
            let connection = if fresh_only {
                self.connect(peer).map(|stream| (stream, false))
            } else {
                self.checkout(peer)
            };
            let ((mut stream, proven), reused) = match connection {
                Ok(pair) => pair,
                Err(failure) => {
                    fail_all(&mut results, rest, &failure, peer);
                    break;
                }
            };
            // SAFETY: forwarded from the caller; an earlier failed attempt has finished with
            // the memory.
            let Run {
                completed,
                answered,
                stop,
            } = unsafe { pipeline(&mut stream, rest) };
            results.extend((0..completed).map(|_| Ok(())));
            fresh_only = false;
            let Some(stop) = stop else {
                self.give_back(peer, (stream, proven));
                continue;
            };
            close_abortively(stream);
            match stop {
                refusal @ Failure::Refused(_) => {
                    // The server closed the connection; the rest goes on another one.
                    results.push(Err(refusal.describe(peer, &rest[completed])));
                }
                failure
                    if reused
                        && !answered
                        && (failure.closed_while_idle()
                            || (failure.reset() && rest.iter().all(|s| s.op == Opcode::Read))) =>
                {
                    tracing::debug!("pooled connection to {peer} failed, retrying on a fresh one");
                    fresh_only = true;
                }
                failure => {
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
    fn give_back(&self, peer: SocketAddr, stream: Proven) {
        let mut idle = self.idle.lock();
        // Checked under the lock, so nothing is pooled after `close` cleared the map.
        if !self.closed.load(Ordering::SeqCst) {
            let list = idle.entry(peer).or_default();
            if list.len() < MAX_IDLE_PER_PEER {
                list.push(stream);
            }
        }
    }

    /// An idle connection to `peer` that still looks usable (reused = true), or a new one.
    /// Idle connections the peer closed are dropped on the way, and those proven with a key
    /// this process no longer connects with (a rotation: the peer closes them once that key
    /// is retired).
    fn checkout(&self, peer: SocketAddr) -> Result<(Proven, bool), Failure> {
        self.ensure_open()?;
        while let Some((stream, proven)) = self.take_idle(peer) {
            let current = match (&self.cluster_key, &proven) {
                (Some(key), Some(id)) => key.connects_with(id),
                _ => true,
            };
            if !current {
                tracing::debug!(
                    "pooled connection to {peer} proved a key no longer in use; dropped"
                );
            } else if idle_connection_dead(stream.as_raw_fd()) {
                tracing::debug!("pooled connection to {peer} was closed by the peer; dropped");
            } else {
                return Ok(((stream, proven), true));
            }
        }
        Ok((self.connect(peer)?, false))
    }

    /// The most recently pooled idle connection to `peer`, taken out of the pool.
    fn take_idle(&self, peer: SocketAddr) -> Option<Proven> {
        self.idle.lock().get_mut(&peer).and_then(Vec::pop)
    }

    fn ensure_open(&self) -> Result<(), Failure> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Failure::Io(io::Error::other(
                "transfer engine is shut down",
            )));
        }
        Ok(())
    }

    fn connect(&self, peer: SocketAddr) -> Result<Proven, Failure> {
        self.ensure_open()?;
        let timeout = self.settings.io_timeout;
        let mut stream = TcpStream::connect_timeout(&peer, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let proven = match &self.cluster_key {
            Some(key) => Some(
                auth::client_blocking(&mut stream, key, auth::ROLE_DATA)
                    .map_err(|_| Failure::Auth)?,
            ),
            None => None,
        };
        bump(&self.metrics.connections_opened);
        Ok((stream, proven))
    }
}

/// Closes a connection that failed, was refused or timed out, abortively (see the module
/// docs). If that cannot be arranged it closes gracefully.
fn close_abortively(stream: TcpStream) {
    if let Err(e) = set_abortive_close(stream.as_raw_fd()) {
        tracing::debug!("cannot make the close abortive: {e}");
    }
}

/// Appends `failure` as the result of every slice in `slices`.
fn fail_all(
    results: &mut Vec<Result<(), SliceError>>,
    slices: &[Slice],
    failure: &Failure,
    peer: SocketAddr,
) {
    results.extend(slices.iter().map(|s| Err(failure.describe(peer, s))));
}

/// Sends `slices` on `stream` and reads their answers, keeping at most [`PIPELINE_WINDOW`]
/// answer bytes outstanding (at least one request is always in flight; no limit when all
/// requests fit in [`ONE_SEND_REQUESTS`]). Stops at the first slice that fails.
///
/// # Safety
/// As [`ConnectionPool::execute`].
unsafe fn pipeline(stream: &mut TcpStream, slices: &[Slice]) -> Run {
    let headers: Vec<[u8; HEADER_LEN]> = slices.iter().map(Slice::header).collect();
    let mut statuses = vec![[0u8; STATUS_LEN]; slices.len()];
    // SAFETY: forwarded from the caller.
    let mut requests = unsafe { Outgoing::new(slices, &headers) };
    // SAFETY: forwarded from the caller.
    let mut answers = unsafe { Incoming::new(slices, &mut statuses) };
    // Requests whose answers we may wait for, and answers read.
    let (mut awaited, mut completed) = (0, 0);
    // Answer bytes of the requests in `completed..awaited`.
    let mut outstanding = 0;
    let mut send_error: Option<io::Error> = None;
    let request_bytes: usize = slices
        .iter()
        .map(|s| HEADER_LEN + if s.op == Opcode::Write { s.len } else { 0 })
        .sum();
    let window = if request_bytes <= ONE_SEND_REQUESTS {
        usize::MAX
    } else {
        PIPELINE_WINDOW
    };
    let stop = |completed, answers: &Incoming<'_>, failure| Run {
        completed,
        answered: answers.received_any(),
        stop: Some(failure),
    };
    while completed < slices.len() {
        // Refill once half the window drained, so a long group costs few send calls.
        if send_error.is_none() && (awaited == completed || outstanding <= window / 2) {
            let mut end = awaited;
            while let Some(slice) = slices.get(end) {
                if end > completed && outstanding.saturating_add(slice.answer_len()) > window {
                    break;
                }
                outstanding += slice.answer_len();
                end += 1;
            }
            if end > awaited {
                match requests.send(stream, end) {
                    Ok(()) => {
                        awaited = end;
                        // Their answers are awaited awake, once per send (see `spin`).
                        crate::spin::before_read(stream);
                    }
                    Err(e) => {
                        // The answer to a partly sent request may still be a refusal, unless
                        // the peer is merely slow (then waiting for it would only time out).
                        let partial = usize::from(!is_timeout(&e));
                        awaited = (requests.whole() + partial).min(end);
                        send_error = Some(e);
                    }
                }
            }
        }
        if completed == awaited {
            let e = send_error.unwrap_or_else(|| io::Error::other("nothing left to receive"));
            return stop(completed, &answers, Failure::Io(e));
        }
        if let Err(e) = answers.receive(stream, awaited) {
            // A lost connection after a failed send is best explained by the send error.
            return stop(completed, &answers, Failure::Io(send_error.unwrap_or(e)));
        }
        while completed < awaited {
            let Some(frame) = answers.status(completed) else {
                break;
            };
            if let Err(failure) = check_status(&frame) {
                return stop(completed, &answers, failure);
            }
            if !answers.complete(completed) {
                break;
            }
            outstanding -= slices[completed].answer_len();
            completed += 1;
        }
    }
    Run {
        completed,
        answered: true,
        stop: None,
    }
}

/// The request bytes of a pipelined group (headers, WRITE payloads) and how far they went.
struct Outgoing<'a> {
    parts: Vec<&'a [u8]>,
    /// Number of `parts` up to and including each request's last part.
    ends: Vec<usize>,
    cursor: Cursor,
}

impl<'a> Outgoing<'a> {
    /// # Safety
    /// The local range of every WRITE slice must be readable for `'a`.
    unsafe fn new(slices: &[Slice], headers: &'a [[u8; HEADER_LEN]]) -> Outgoing<'a> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(slices.len() * 2);
        let mut ends = Vec::with_capacity(slices.len());
        for (slice, header) in slices.iter().zip(headers) {
            parts.push(header);
            if slice.op == Opcode::Write {
                // SAFETY: the caller guarantees `local` is readable for `len` bytes.
                parts.push(unsafe { std::slice::from_raw_parts(slice.local, slice.len) });
            }
            ends.push(parts.len());
        }
        Outgoing {
            parts,
            ends,
            cursor: Cursor::default(),
        }
    }

    /// Sends everything up to the end of request `upto - 1` (`upto` ≥ 1), blocking.
    fn send(&mut self, stream: &mut TcpStream, upto: usize) -> io::Result<()> {
        let end = self.ends[upto - 1];
        while self.cursor.part < end {
            match stream.write_vectored(&self.cursor.unsent(&self.parts, end)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.cursor.advance(n, end, |i| self.parts[i].len()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// How many leading requests went out completely.
    fn whole(&self) -> usize {
        self.ends.partition_point(|&end| end <= self.cursor.part)
    }
}

/// Where the answers of a pipelined group land (status frames, READ data straight into the
/// slices' memory) and how far they arrived.
struct Incoming<'a> {
    parts: Vec<&'a mut [u8]>,
    /// Index in `parts` of each request's status frame; its other part follows.
    starts: Vec<usize>,
    cursor: Cursor,
}

impl<'a> Incoming<'a> {
    /// # Safety
    /// The local range of every READ slice must be writable for `'a`, and not overlap
    /// another slice's range.
    unsafe fn new(slices: &[Slice], statuses: &'a mut [[u8; STATUS_LEN]]) -> Incoming<'a> {
        let mut parts: Vec<&mut [u8]> = Vec::with_capacity(slices.len() * 2);
        let mut starts = Vec::with_capacity(slices.len() + 1);
        for (slice, status) in slices.iter().zip(statuses) {
            starts.push(parts.len());
            parts.push(status);
            if slice.op == Opcode::Read {
                // SAFETY: the caller guarantees `local` is writable for `len` bytes and not
                // aliased.
                parts.push(unsafe { std::slice::from_raw_parts_mut(slice.local, slice.len) });
            }
        }
        starts.push(parts.len());
        Incoming {
            parts,
            starts,
            cursor: Cursor::default(),
        }
    }

    /// One blocking vectored read of answer bytes, up to the end of request `upto - 1`
    /// (`upto` ≥ 1, that request not complete yet). The peer closing is an error.
    fn receive(&mut self, stream: &mut TcpStream, upto: usize) -> io::Result<()> {
        let end = self.starts[upto];
        loop {
            let mut io = self.cursor.unfilled(&mut self.parts, end);
            match stream.read_vectored(&mut io) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    drop(io);
                    self.cursor.advance(n, end, |i| self.parts[i].len());
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The status frame of `request`, once it arrived completely.
    fn status(&self, request: usize) -> Option<[u8; STATUS_LEN]> {
        let at = self.starts[request];
        (self.cursor.part > at)
            .then(|| <[u8; STATUS_LEN]>::try_from(&*self.parts[at]).ok())
            .flatten()
    }

    /// Whether any answer byte arrived.
    fn received_any(&self) -> bool {
        self.cursor.part > 0 || self.cursor.offset > 0
    }

    /// Whether the whole answer of `request` arrived.
    fn complete(&self, request: usize) -> bool {
        self.cursor.part >= self.starts[request + 1]
    }
}

fn check_status(frame: &[u8; STATUS_LEN]) -> Result<(), Failure> {
    match Status::decode(frame) {
        Some(Status::Ok) => Ok(()),
        Some(status) => Err(Failure::Refused(status)),
        None => Err(Failure::Protocol),
    }
}
