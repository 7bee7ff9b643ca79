//! [`DummyLink`]: a dummy's connections to its real client. It carries the dummy engine's
//! transfers ([`TransferDelegate`]), each on a connection of its own from a small pool (so a
//! transfer waiting on a slow peer holds up no other thread of the dummy), maps the dummy's
//! shared blocks at the real client on first use on each connection, stages caller memory
//! outside them through the connection's own shared staging block, pings idle connections,
//! and reconnects (re-sending its blocks) after the real client restarted.

use super::conns::{Conn, ConnPool, Lent};
use super::pool::{BlockGuard, SharedBlock, ShmPool};
use super::wire::{
    deadline_to_wire, parse_header, Kind, Reader, WireRequest, Writer, MAX_BODY, VERSION, WORKING,
};
use crate::auth::{self, KeyRing};
use crate::error::{fail, set_last_error_message, ErrorCode, Result};
use crate::transfer::copy::copy_bytes;
use crate::transfer::{TransferDelegate, TransferOp, TransferRequest};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Largest body of the pieces of one `Transfer` round: a call with more (about a million
/// requests) is sent in several rounds, each well inside the real client's [`MAX_BODY`].
const ROUND_BODY: usize = MAX_BODY / 2;

/// Bytes of the staging block (`MC_DUMMY_STAGING_BYTES`, default 8 MiB, at least 4 KiB).
fn staging_bytes() -> u64 {
    crate::env::DUMMY_STAGING_BYTES.get()
}

/// Most connections one link opens to its real client, i.e. transfers it runs at once
/// (`MC_DUMMY_CONNECTIONS`, default 4, 1..=64). Each has its own staging block
/// (`MC_DUMMY_STAGING_BYTES`) and its own mappings at the real client; they are opened on
/// demand, so a dummy that never runs two transfers at once keeps one.
fn max_connections() -> usize {
    crate::env::DUMMY_CONNECTIONS.get() as usize
}

/// Counters of one link (monotonic, except `connections`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Bytes moved straight into / out of shared blocks.
    pub zero_copy_bytes: u64,
    /// Bytes copied through staging blocks (caller memory outside shared blocks).
    pub staged_bytes: u64,
    /// Successful connects that replaced a connection lost to a failure.
    pub reconnects: u64,
    /// Blocks mapped at the real client (over all connections).
    pub blocks_mapped: u64,
    /// Connections open now (idle or running a call).
    pub connections: u64,
}

/// The dummy's side. Thread-safe: each call borrows a connection of its own ([`ConnPool`],
/// waiting when [`max_connections`] are busy). Dropping it (or [`DummyLink::close`]) stops
/// the pinger and closes the idle sockets (a call still running closes its own when it
/// ends); the real client then drops everything it held for this dummy.
pub struct DummyLink {
    inner: Arc<Inner>,
    pinger: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Inner {
    name: String,
    /// This link's id in its hellos: the real client counts the link's connections as one
    /// dummy.
    id: u64,
    ttl: Duration,
    /// The key each connection proves first, if any.
    cluster_key: Option<Arc<KeyRing>>,
    conns: ConnPool,
    master_address: String,
    real_name: String,
    healthy: AtomicBool,
    zero_copy_bytes: AtomicU64,
    staged_bytes: AtomicU64,
    blocks_mapped: AtomicU64,
}

impl DummyLink {
    /// Connects to the real client serving the abstract socket `name` (see
    /// [`super::socket_name`]), says hello and starts the pinger (every third of
    /// [`super::ttl`]).
    ///
    /// Errors: `INVALID_PARAMS` when nobody serves `name` or the real client refuses the
    /// dummy; `INTERNAL_ERROR` when the pinger thread cannot be made.
    pub fn connect(name: &str) -> Result<DummyLink> {
        Self::connect_with(name, super::ttl(), crate::auth::process_key()?)
    }

    /// [`Self::connect`] with a TTL of `ttl` instead of [`super::ttl`] and `cluster_key`
    /// (each connection proves it before its hello) instead of the process's key.
    pub(super) fn connect_with(
        name: &str,
        ttl: Duration,
        cluster_key: Option<Arc<KeyRing>>,
    ) -> Result<DummyLink> {
        let id = fastrand::u64(..);
        let (first, master_address, real_name) = open(name, id, ttl, cluster_key.as_deref())?;
        let inner = Arc::new(Inner {
            name: name.to_string(),
            id,
            ttl,
            cluster_key,
            conns: ConnPool::new(first, max_connections()),
            master_address,
            real_name,
            healthy: AtomicBool::new(true),
            zero_copy_bytes: AtomicU64::new(0),
            staged_bytes: AtomicU64::new(0),
            blocks_mapped: AtomicU64::new(0),
        });
        let pinger_inner = Arc::clone(&inner);
        let pinger = std::thread::Builder::new()
            .name("mc-dummy-ping".into())
            .spawn(move || pinger_inner.ping_loop());
        let pinger = match pinger {
            Ok(handle) => handle,
            Err(e) => return fail(ErrorCode::InternalError, format!("no pinger thread: {e}")),
        };
        Ok(DummyLink {
            inner,
            pinger: Mutex::new(Some(pinger)),
        })
    }

    /// The master address the real client uses (the dummy talks to the master directly).
    pub fn master_address(&self) -> &str {
        &self.inner.master_address
    }

    /// The real client's segment name.
    pub fn real_client_name(&self) -> &str {
        &self.inner.real_name
    }

    /// Whether the last call or ping reached the real client.
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Acquire)
    }

    /// The counters.
    pub fn stats(&self) -> LinkStats {
        let i = &self.inner;
        LinkStats {
            zero_copy_bytes: i.zero_copy_bytes.load(Ordering::Relaxed),
            staged_bytes: i.staged_bytes.load(Ordering::Relaxed),
            reconnects: i.conns.reconnects(),
            blocks_mapped: i.blocks_mapped.load(Ordering::Relaxed),
            connections: i.conns.open_count() as u64,
        }
    }

    /// The real client's counters ([`super::ServerStats`]).
    /// Errors: `TRANSFER_FAIL` when the real client cannot be reached.
    pub fn server_stats(&self) -> Result<super::ServerStats> {
        let answer = self.inner.call(Kind::Stats, &Writer::default())?;
        let mut r = Reader::new(&answer);
        Ok(super::ServerStats {
            dummies: r.u64()?,
            mappings: r.u64()?,
            mapped_bytes: r.u64()?,
            connections_dropped: r.u64()?,
            requests_refused: r.u64()?,
            connections: r.u64()?,
            other_user_refused: r.u64()?,
            connections_refused: r.u64()?,
            frames_timed_out: r.u64()?,
            maps_refused: r.u64()?,
            lost_page_requests: r.u64()?,
        })
    }

    /// `INVALID_PARAMS` unless `[addr, addr + len)` lies in one shared block of this process
    /// (memory the real client can map), with a message saying so.
    pub fn check_shared(&self, addr: usize, len: u64) -> Result<()> {
        match ShmPool::global().find(addr, len) {
            Some(_) => Ok(()),
            None => fail(
                ErrorCode::InvalidParams,
                format!(
                    "[{addr:#x}, +{len}) is not inside shared memory of this dummy (allocate it \
                     with mc_shm_alloc / MooncakeHostMemAllocator / alloc_from_mem_pool)"
                ),
            ),
        }
    }

    /// Stops the pinger and closes the idle connections; a call still running closes its
    /// connection when it ends, and later calls fail (`TRANSFER_FAIL`). Idempotent.
    pub fn close(&self) {
        // Wakes the pinger; before the join, so a ping in flight ends its connection instead
        // of keeping it.
        self.inner.conns.close();
        if let Some(handle) = self.pinger.lock().take() {
            let _ = handle.join();
        }
        self.inner.healthy.store(false, Ordering::Release);
    }
}

impl Drop for DummyLink {
    fn drop(&mut self) {
        self.close();
    }
}

/// Connects, proves `cluster_key` (if any) and says hello as link `id`; returns the connection (nothing mapped, no staging
/// block yet) and the real client's master address and segment name.
fn open(
    name: &str,
    id: u64,
    ttl: Duration,
    cluster_key: Option<&KeyRing>,
) -> Result<(Conn, String, String)> {
    let refused = |what: String| {
        fail::<(Conn, String, String)>(
            ErrorCode::InvalidParams,
            format!("cannot attach to the real client at @{name}: {what}"),
        )
    };
    let addr = match SocketAddr::from_abstract_name(name.as_bytes()) {
        Ok(addr) => addr,
        Err(e) => return refused(e.to_string()),
    };
    let mut stream = match UnixStream::connect_addr(&addr) {
        Ok(stream) => stream,
        Err(e) => return refused(e.to_string()),
    };
    if let Err(e) = crate::shm::check_peer_user(&stream) {
        return refused(e.to_string());
    }
    if let Err(e) = stream
        .set_read_timeout(Some(ttl))
        .and_then(|_| stream.set_write_timeout(Some(ttl)))
    {
        return refused(e.to_string());
    }
    if let Some(key) = cluster_key {
        if let Err(e) = auth::client_blocking(&mut stream, key, auth::ROLE_STANDALONE) {
            return refused(format!("{e}: {}", crate::error::last_error_message()));
        }
    }
    let mut hello = Writer::default();
    hello.u32(VERSION).u32(std::process::id()).u64(id);
    let answer = match exchange(&mut stream, Kind::Hello, &hello, None) {
        Ok(answer) => answer,
        Err(e) => return refused(format!("{e}: {}", crate::error::last_error_message())),
    };
    let mut r = Reader::new(&answer);
    let master = r.str()?.to_string();
    let real = r.str()?.to_string();
    let conn = Conn::new(stream, ShmPool::global().freed_since(0).1);
    Ok((conn, master, real))
}

/// Sends one request (with `fd` attached) and reads its answer, waiting up to the TTL for it
/// or for each heartbeat ([`WORKING`]) of a request still running; the answer's payload after
/// the code and message. Errors: `TRANSFER_FAIL` for an I/O failure (the connection is then
/// unusable); the real client's code (message recorded) when it refused the request.
fn exchange(
    stream: &mut UnixStream,
    kind: Kind,
    body: &Writer,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<Vec<u8>> {
    let io_fail = |what: &str, e: std::io::Error| {
        fail::<Vec<u8>>(
            ErrorCode::TransferFail,
            format!("real client connection: {what}: {e}"),
        )
    };
    let frame = body.frame(kind as u8);
    let fds: Vec<_> = fd.into_iter().collect();
    if let Err(e) = crate::shm::send_with_fds(stream.as_fd(), &frame, &fds) {
        return io_fail("send", e);
    }
    crate::spin::before_read(stream);
    // Each heartbeat of a request still running restarts the wait (the read timeout).
    let len = loop {
        let mut header = [0u8; 5];
        if let Err(e) = stream.read_exact(&mut header) {
            return io_fail("receive", e);
        }
        match parse_header(header)? {
            (WORKING, 0) => continue,
            (_, len) => break len,
        }
    };
    let mut answer = vec![0u8; len];
    if let Err(e) = stream.read_exact(&mut answer) {
        return io_fail("receive", e);
    }
    let mut r = Reader::new(&answer);
    let code = r.i32()?;
    let message = r.str()?.to_string();
    let consumed = 8 + message.len();
    if code != 0 {
        let code = ErrorCode::from_i32(code).unwrap_or(ErrorCode::InternalError);
        return fail(code, format!("real client: {message}"));
    }
    Ok(answer.split_off(consumed))
}

/// [`exchange`] on a pool connection, noting on it that the real client answered (a refusal
/// is an answer too; an I/O failure is not).
fn exchange_on(
    c: &mut Conn,
    kind: Kind,
    body: &Writer,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<Vec<u8>> {
    let result = exchange(&mut c.stream, kind, body, fd);
    if !matches!(result, Err(ErrorCode::TransferFail)) {
        c.answered();
    }
    result
}

/// One piece of a request sent in one round: its wire form and where its bytes sit here.
struct Piece {
    request: usize,
    wire: WireRequest,
    side: Side,
}

/// Where a piece's bytes sit on the dummy's side.
enum Side {
    /// In the caller's memory at `local`, inside the shared block the wire form names.
    Shared { local: usize },
    /// Copied through the connection's staging block.
    Staged(Staged),
}

struct Staged {
    local: *mut u8,
    stage: *mut u8,
    len: usize,
    read: bool,
}

impl Inner {
    /// One request/answer on a connection of its own.
    fn call(&self, kind: Kind, body: &Writer) -> Result<Vec<u8>> {
        let mut conn = self.lend()?;
        let result = exchange_on(&mut conn, kind, body, None);
        self.give_back(conn, &result);
        result
    }

    /// A connection for one call ([`ConnPool::lend`]), opening one when needed. Errors:
    /// `TRANSFER_FAIL` when the link is closed or the real client cannot be reached (the link
    /// is then unhealthy).
    fn lend(&self) -> Result<Lent<'_>> {
        let lent = self.conns.lend(|| {
            match open(&self.name, self.id, self.ttl, self.cluster_key.as_deref()) {
                Ok((conn, _, _)) => Ok(conn),
                Err(e) => {
                    let message = crate::error::last_error_message();
                    fail(ErrorCode::TransferFail, format!("{e}: {message}"))
                }
            }
        });
        if lent.is_err() {
            self.healthy.store(false, Ordering::Release);
        }
        lent
    }

    /// Returns `conn` after a call that ended with `result`: an I/O failure
    /// (`TRANSFER_FAIL`: the connection is unusable) closes it and makes the link unhealthy;
    /// an answer makes it healthy.
    fn give_back<T>(&self, conn: Lent<'_>, result: &Result<T>) {
        let failed = matches!(result, Err(ErrorCode::TransferFail));
        self.healthy.store(!failed, Ordering::Release);
        conn.give_back(failed);
    }

    /// Every third of the TTL: when no connection is open (the real client restarted), opens
    /// one; then pings, one at a time, each idle connection that got no answer for that long
    /// (a busy one is kept alive by its calls), after unmapping at the real client the blocks
    /// freed since its last call. A connection the real client closed is dropped without
    /// touching health. So health reflects the real client while the dummy is idle, and no
    /// connection keeps freed blocks mapped for long.
    fn ping_loop(&self) {
        let period = self.ttl / 3;
        loop {
            if self.conns.closed_within(period) {
                return;
            }
            if self.conns.open_count() == 0 {
                let _ = self.call(Kind::Ping, &Writer::default());
            }
            for _ in 0..self.conns.capacity() {
                let Some(mut conn) = self.conns.lend_quiet(period) else {
                    break;
                };
                if conn.hung_up() {
                    conn.give_back(true);
                    continue;
                }
                let result = self
                    .unmap_freed(&mut conn)
                    .and_then(|()| exchange_on(&mut conn, Kind::Ping, &Writer::default(), None));
                self.give_back(conn, &result);
            }
        }
    }

    /// Unmaps at the real client the blocks freed here since this connection's last call.
    /// A refusal (the real client has no such mapping) counts as done; an I/O failure
    /// (`TRANSFER_FAIL`) ends the walk (the connection is then closed).
    fn unmap_freed(&self, c: &mut Conn) -> Result<()> {
        let (freed, next) = ShmPool::global().freed_since(c.freed_cursor);
        c.freed_cursor = next;
        for id in freed {
            if c.mapped.remove(&id) {
                let mut w = Writer::default();
                w.u64(id);
                match exchange_on(c, Kind::Unmap, &w, None) {
                    Err(ErrorCode::TransferFail) => return Err(ErrorCode::TransferFail),
                    Err(code) => tracing::debug!(id, %code, "unmap refused: not mapped there"),
                    Ok(_) => {}
                }
            }
        }
        Ok(())
    }

    /// Maps `block` at the real client unless it is mapped on this connection.
    fn ensure_mapped(&self, c: &mut Conn, block: &SharedBlock) -> Result<()> {
        if c.mapped.contains(&block.id()) {
            return Ok(());
        }
        let Some(fd) = block.fd() else {
            return fail(ErrorCode::InternalError, "a shared block without its memfd");
        };
        let mut w = Writer::default();
        w.u64(block.id()).u64(block.len() as u64);
        exchange_on(c, Kind::Map, &w, Some(fd))?;
        c.mapped.insert(block.id());
        self.blocks_mapped.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sends one round of pieces, copies staged reads out, and records per-request errors.
    ///
    /// # Safety
    /// Every staged piece's `local` range is valid for its operation.
    unsafe fn round(
        &self,
        c: &mut Conn,
        pieces: &mut Vec<Piece>,
        results: &mut [Result<()>],
    ) -> Result<()> {
        if pieces.is_empty() {
            return Ok(());
        }
        let mut w = Writer::default();
        w.u32(pieces.len() as u32);
        for piece in pieces.iter() {
            piece.wire.encode(&mut w);
        }
        let answer = exchange_on(c, Kind::Transfer, &w, None)?;
        let mut r = Reader::new(&answer);
        let count = r.u32()? as usize;
        if count != pieces.len() {
            return fail(
                ErrorCode::TransferFail,
                format!("real client answered {count} of {} requests", pieces.len()),
            );
        }
        let message = r.str()?.to_string();
        for piece in pieces.drain(..) {
            let code = r.i32()?;
            if code != 0 {
                set_last_error_message(format!("real client: {message}"));
                if results[piece.request].is_ok() {
                    results[piece.request] =
                        Err(ErrorCode::from_i32(code).unwrap_or(ErrorCode::TransferFail));
                }
                continue;
            }
            match piece.side {
                Side::Staged(s) => {
                    if s.read {
                        // SAFETY: the caller guarantees `local`; `stage` is in our block.
                        if let Err(e) = unsafe { copy_bytes(s.local, s.stage, s.len) } {
                            set_last_error_message(format!("staging copy: {e}"));
                            results[piece.request] = Err(ErrorCode::TransferFail);
                            continue;
                        }
                    }
                    self.staged_bytes.fetch_add(s.len as u64, Ordering::Relaxed);
                }
                Side::Shared { local } => {
                    // A read whose block was re-homed meanwhile (another call on it was
                    // abandoned) may have landed in the old file, which nothing here maps.
                    let block = ShmPool::global().find(local, piece.wire.len);
                    if !piece.wire.write && block.map(|(b, _)| b.id()) != Some(piece.wire.block) {
                        set_last_error_message(format!(
                            "shared block {} was re-homed during the call (another call on it \
                             was abandoned): the bytes read are not trusted",
                            piece.wire.block
                        ));
                        results[piece.request] = Err(ErrorCode::TransferFail);
                        continue;
                    }
                    self.zero_copy_bytes
                        .fetch_add(piece.wire.len, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// After a call whose answer never came (timeout, broken connection): the real client
    /// may still run its requests later, so no memory they name may be reused. Every pool
    /// block in `named` is re-homed ([`ShmPool::rehome`]: same addresses and bytes here, a
    /// new file and id); the connection's staging block goes with the connection, which the
    /// caller then closes ([`Inner::give_back`]). A block that cannot be re-homed is reported in
    /// the last error message (it stays reachable by the stalled request).
    fn abandon(named: &HashSet<u64>) {
        for &id in named {
            if let Err(e) = ShmPool::global().rehome(id) {
                let message = crate::error::last_error_message();
                set_last_error_message(format!(
                    "an abandoned transfer may still reach shared block {id}: {e}: {message}"
                ));
            }
        }
    }

    /// [`TransferDelegate::transfer`] on a live connection; the ids of the pool blocks it
    /// names (other than staging) go into `named`.
    ///
    /// # Safety
    /// As [`TransferDelegate::transfer`].
    unsafe fn run(
        &self,
        c: &mut Conn,
        requests: &[TransferRequest<'_>],
        results: &mut [Result<()>],
        named: &mut HashSet<u64>,
    ) -> Result<()> {
        self.unmap_freed(c)?;
        let staging = match &c.staging {
            Some(guard) => guard.block()?,
            None => {
                let guard = BlockGuard::new(staging_bytes(), "dummy staging")?;
                c.staging.insert(guard).block()?
            }
        };
        let capacity = staging.len();
        let mut pieces = Vec::new();
        let mut used = 0usize;
        // Bytes the pieces of this round encode to: a round is sent before its frame would
        // pass ROUND_BODY (the real client refuses frames over MAX_BODY).
        let mut body = 0usize;
        for (index, request) in requests.iter().enumerate() {
            if request.len == 0 {
                continue;
            }
            let send_by_monotonic_ns = deadline_to_wire(request.send_by);
            let wire = |block: u64, offset: u64, len: u64, at: u64| WireRequest {
                write: request.op == TransferOp::Write,
                block,
                offset,
                len,
                remote_addr: request.remote_addr.wrapping_add(at),
                epoch: request.epoch,
                send_by_monotonic_ns,
                endpoint: request.endpoint.to_string(),
            };
            let piece_len = WireRequest::encoded_len(request.endpoint);
            if let Some((block, offset)) = ShmPool::global().find(request.local_addr, request.len) {
                self.ensure_mapped(c, &block)?;
                named.insert(block.id());
                if body + piece_len > ROUND_BODY {
                    // SAFETY: forwarded from the caller.
                    unsafe { self.round(c, &mut pieces, results) }?;
                    (used, body) = (0, 0);
                }
                body += piece_len;
                pieces.push(Piece {
                    request: index,
                    wire: wire(block.id(), offset, request.len, 0),
                    side: Side::Shared {
                        local: request.local_addr,
                    },
                });
                continue;
            }
            self.ensure_mapped(c, &staging)?;
            let mut at = 0u64;
            while at < request.len {
                if used == capacity || body + piece_len > ROUND_BODY {
                    // SAFETY: forwarded from the caller.
                    unsafe { self.round(c, &mut pieces, results) }?;
                    (used, body) = (0, 0);
                }
                body += piece_len;
                let len = (request.len - at).min((capacity - used) as u64) as usize;
                let local = (request.local_addr as *mut u8).wrapping_add(at as usize);
                let stage = (staging.addr() as *mut u8).wrapping_add(used);
                let read = request.op == TransferOp::Read;
                if !read {
                    // SAFETY: the caller guarantees the source; `stage..+len` is in our block.
                    if let Err(e) = unsafe { copy_bytes(stage, local, len) } {
                        set_last_error_message(format!("staging copy: {e}"));
                        results[index] = Err(ErrorCode::TransferFail);
                        break;
                    }
                }
                pieces.push(Piece {
                    request: index,
                    wire: wire(staging.id(), used as u64, len as u64, at),
                    side: Side::Staged(Staged {
                        local,
                        stage,
                        len,
                        read,
                    }),
                });
                used += len;
                at += len as u64;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.round(c, &mut pieces, results) }
    }
}

impl TransferDelegate for DummyLink {
    unsafe fn transfer(&self, requests: &[TransferRequest<'_>]) -> Vec<Result<()>> {
        let inner = &self.inner;
        let mut results: Vec<Result<()>> = vec![Ok(()); requests.len()];
        let outcome = inner.lend().and_then(|mut conn| {
            let mut named = HashSet::new();
            // SAFETY: forwarded from the caller.
            let outcome = unsafe { inner.run(&mut conn, requests, &mut results, &mut named) };
            if matches!(outcome, Err(ErrorCode::TransferFail)) {
                Inner::abandon(&named);
            }
            inner.give_back(conn, &outcome);
            outcome
        });
        if let Err(code) = outcome {
            for (result, request) in results.iter_mut().zip(requests) {
                if result.is_ok() && request.len > 0 {
                    *result = Err(code);
                }
            }
        }
        results
    }
}
