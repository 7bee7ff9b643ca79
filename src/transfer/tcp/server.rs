//! The TCP data server: serves peers' READ and WRITE requests against this process's
//! remotely accessible registered memory, using Mooncake's v2 framing (v1 requests, without
//! the `0x80` flag, are served too, without status frames).
//!
//! Runs on a small multi-thread tokio runtime owned by the [`Server`]. Connections are
//! persistent: after each request the server waits for the next header. Headers (and the
//! start of WRITE payloads) are read through a small read-ahead buffer, so pipelined requests
//! cost one read call for many; READs whose headers are already buffered are answered
//! together with one gathered write. READ data goes straight from registered memory to the
//! socket; WRITE payloads beyond the read-ahead buffer go straight into registered memory.
//!
//! Memory lifetime: a request is validated against the registry when its header arrives
//! (range, and the segment epoch when the header names one: a stale epoch is refused with
//! [`Status::StaleEpoch`] before any byte is read or written); the bytes are then read or
//! written without holding any lock. A caller that unregisters (and frees) memory while a
//! peer is mid-transfer into it must first make sure no peer is using it (e.g. by
//! unmounting the segment at the master); otherwise the server may touch freed memory.
//!
//! Limits: the server holds at most `MC_TRANSFER_MAX_CONNECTIONS` connections, and at most
//! `MC_TRANSFER_MAX_CONNECTIONS_PER_PEER` from one peer IP address; a connection beyond
//! either is reset at once (RST), without reading from it, and counted in
//! `refused_connections`. A connection's slot is freed when its task ends.
//!
//! Cluster key: with one, a connection (a TCP transfer's or an RDMA handshake's) is served
//! only once its peer passed the key's handshake (`auth`, role `transfer-data`), holding its
//! slot meanwhile; one that does not is reset without any of its bytes being read as a request
//! (so no registered range, rkey or segment table reaches a peer without the key).
//!
//! Idle timeout: a connection with no request in flight (nothing of a next request has
//! arrived) is closed after `MC_TRANSFER_IDLE_TIMEOUT_MS`, gracefully (FIN), and counted in
//! `idle_closed`; since nothing of a request was read, nothing of one was applied, and the
//! initiator's pool sees the close before it reuses the connection, or at its first read
//! (see `pool`).
//!
//! Deadline: once a request's first byte is read, its header and (for a WRITE) its whole
//! payload must arrive within the engine's I/O timeout (`MC_TRANSFER_TIMEOUT_MS`). Before each chunk of payload
//! is applied the server checks that the deadline has not passed and that the initiator has
//! not reset the connection (its abortive close after a timeout); otherwise it applies
//! nothing more and closes the connection abortively. A stale WRITE therefore lands no later
//! than its deadline, and not at all once the initiator gave up and its reset arrived.
//! A READ answer the peer does not take (no send progress for `MC_TRANSFER_TIMEOUT_MS`)
//! expires the same way.
//!
//! Soundness: registered memory is touched only through raw addresses (`recv` into it,
//! `copy_nonoverlapping` from the read-ahead buffer into it, `sendmsg` from it); no Rust
//! reference to it is ever formed here, since other connections and local copies access it
//! concurrently.

mod device;

use super::control::{self, is_notify, is_segment_query, Inbox};
use super::socket::{recv_into, send_parts, set_abortive_close, RawPart};
use super::wire::{is_rdma_connect, Opcode, SessionHeader, Status, HEADER_LEN, STATUS_LEN};
use crate::auth::{self, Admission, KeyRing, Waited};
use crate::error::{fail, ErrorCode, Result};
use crate::transfer::gather::Cursor;
use crate::transfer::metrics::{add, bump, Metrics};
use crate::transfer::rdma::{RdmaTransport, REQUEST_LEN};
use crate::transfer::registry::Registry;
use crate::transfer::settings::Settings;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::time::Instant;

/// Worker threads of the server runtime.
const SERVER_THREADS: usize = 2;
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);
/// Bytes read ahead of the request being served, so that pipelined headers (and small WRITE
/// payloads) arrive with one read call; larger payloads bypass the buffer.
const READ_AHEAD: usize = 16 << 10;
/// Most READ answers gathered into one vectored write.
const GATHER_MAX_READS: usize = 32;
/// Most data bytes gathered into one vectored write (a single READ may be larger).
const GATHER_MAX_BYTES: u64 = 1 << 20;
/// How long [`Server::shutdown`] waits for the runtime's threads to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// What every connection task needs. Shared by `Arc`.
struct ServeContext {
    registry: Arc<Registry>,
    /// Answers RDMA handshakes when the engine runs the RDMA transport.
    rdma: Option<Arc<RdmaTransport>>,
    metrics: Arc<Metrics>,
    /// How long a request may take to arrive once its first byte was read, and the most a
    /// READ answer may wait for send progress.
    io_timeout: Duration,
    /// How long a connection may wait for its next request.
    idle_timeout: Duration,
    /// Connection slots (see the module docs).
    slots: Slots,
    /// The key a connection proves before its first request is read, if any.
    cluster_key: Option<Arc<KeyRing>>,
    /// Where peers' notifications are kept.
    inbox: Arc<Inbox>,
}

/// The connections held, in total and per peer IP address, against their caps.
/// Thread-safe.
struct Slots {
    max_total: usize,
    max_per_peer: usize,
    /// Total held, and held per peer IP (only peers holding at least one).
    held: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl Slots {
    fn new(settings: &Settings) -> Slots {
        Slots {
            max_total: settings.max_connections,
            max_per_peer: settings.max_connections_per_peer,
            held: Mutex::new((0, HashMap::new())),
        }
    }
}

/// One held connection slot of `ip`; dropping it frees the slot.
struct Slot {
    context: Arc<ServeContext>,
    ip: IpAddr,
}

impl Slot {
    /// Takes a slot for a connection from `ip`, unless a cap is reached.
    fn take(context: &Arc<ServeContext>, ip: IpAddr) -> Option<Slot> {
        let slots = &context.slots;
        let mut held = slots.held.lock();
        let (total, per_peer) = &mut *held;
        let of_peer = per_peer.get(&ip).copied().unwrap_or(0);
        if *total >= slots.max_total || of_peer >= slots.max_per_peer {
            return None;
        }
        *total += 1;
        per_peer.insert(ip, of_peer + 1);
        Some(Slot {
            context: Arc::clone(context),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.context.slots.held.lock();
        let (total, per_peer) = &mut *held;
        *total = total.saturating_sub(1);
        if let Some(count) = per_peer.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                per_peer.remove(&self.ip);
            }
        }
    }
}

/// A running data server. Thread-safe; stopping it is idempotent.
pub(crate) struct Server {
    runtime: Mutex<Option<Runtime>>,
    addr: SocketAddr,
}

impl Server {
    /// Starts serving on `listener` (already bound by the caller; ownership moves here)
    /// with the limits and timeouts of `settings` (see the module docs).
    ///
    /// Errors: `TRANSFER_FAIL` when the runtime cannot be built or the listener cannot be
    /// switched to non-blocking mode.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        registry: Arc<Registry>,
        rdma: Option<Arc<RdmaTransport>>,
        metrics: Arc<Metrics>,
        settings: Settings,
        cluster_key: Option<Arc<KeyRing>>,
        inbox: Arc<Inbox>,
    ) -> Result<Server> {
        let setup = || -> io::Result<(Runtime, SocketAddr)> {
            let addr = listener.local_addr()?;
            crate::auth::warn_if_open(addr, "transfer data port", cluster_key.as_ref());
            listener.set_nonblocking(true)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(SERVER_THREADS)
                .thread_name("mc-transfer-server")
                .enable_all()
                .build()?;
            let listener = {
                let _guard = runtime.enter();
                TcpListener::from_std(listener)?
            };
            let context = Arc::new(ServeContext {
                registry,
                rdma,
                metrics,
                io_timeout: settings.io_timeout,
                idle_timeout: settings.idle_timeout,
                slots: Slots::new(&settings),
                cluster_key,
                inbox,
            });
            runtime.spawn(accept_loop(listener, context));
            Ok((runtime, addr))
        };
        match setup() {
            Ok((runtime, addr)) => {
                tracing::info!(%addr, "transfer server listening");
                Ok(Server {
                    runtime: Mutex::new(Some(runtime)),
                    addr,
                })
            }
            Err(e) => fail(
                ErrorCode::TransferFail,
                format_args!("cannot start the transfer server: {e}"),
            ),
        }
    }

    /// The address the server listens on.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection and waits (bounded) for the server threads.
    /// Safe to call more than once and from inside another tokio runtime.
    pub(crate) fn shutdown(&self) {
        let Some(runtime) = self.runtime.lock().take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Blocking inside an async context is not allowed; the threads stop on their own.
            runtime.shutdown_background();
        } else {
            runtime.shutdown_timeout(SHUTDOWN_WAIT);
        }
        tracing::info!(addr = %self.addr, "transfer server stopped");
    }
}

async fn accept_loop(listener: TcpListener, context: Arc<ServeContext>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Some(slot) = Slot::take(&context, peer.ip()) else {
                    refuse_connection(stream, peer, &context.metrics);
                    continue;
                };
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, "cannot set TCP_NODELAY: {e}");
                }
                tokio::spawn(serve_connection(stream, peer, slot));
            }
            Err(e) => {
                tracing::warn!("transfer server accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Resets a connection over a cap at once, without reading from it, and counts it.
fn refuse_connection(stream: TcpStream, peer: SocketAddr, metrics: &Metrics) {
    bump(&metrics.refused_connections);
    tracing::debug!(%peer, "transfer connection refused: connection cap reached");
    if let Err(e) = set_abortive_close(stream.as_raw_fd()) {
        tracing::debug!(%peer, "cannot make the close abortive: {e}");
    }
}

/// Serves requests on one connection (holding `slot` until it ends) until the peer closes
/// it, it stays idle too long (closed gracefully), or a request fails, is refused or misses
/// its deadline (closed abortively).
async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, slot: Slot) {
    let context = &*slot.context;
    let mut admission = None;
    if let Some(key) = &context.cluster_key {
        match auth::server_async(&mut stream, key, auth::ROLE_DATA, Some(peer.ip())).await {
            Ok(id) => admission = Some(Admission::new(Arc::clone(key), id, auth::ROLE_DATA)),
            Err(_) => {
                if let Err(e) = set_abortive_close(stream.as_raw_fd()) {
                    tracing::debug!(%peer, "cannot make the close abortive: {e}");
                }
                return;
            }
        }
    }
    let mut conn = BufReader::with_capacity(READ_AHEAD, stream);
    match serve_requests(&mut conn, context, admission.as_mut()).await {
        Stop::Closed | Stop::Retired => return,
        Stop::Idle => {
            bump(&context.metrics.idle_closed);
            tracing::debug!(%peer, "idle transfer connection closed");
            return;
        }
        Stop::Refused => {}
        Stop::Expired => {
            bump(&context.metrics.expired_requests);
            tracing::debug!(%peer, "transfer request missed its deadline; connection reset");
        }
        Stop::Remounted => {
            bump(&context.metrics.stale_epoch_rejections);
            tracing::debug!(%peer, "segment remounted during a request; connection reset");
        }
        Stop::Failed(e) => tracing::debug!(%peer, "transfer connection failed: {e}"),
    }
    if let Err(e) = set_abortive_close(conn.get_ref().as_raw_fd()) {
        tracing::debug!(%peer, "cannot make the close abortive: {e}");
    }
}

/// Why a connection stopped being served.
enum Stop {
    /// The peer closed it between requests.
    Closed,
    /// The cluster key it was admitted with was retired (closed between requests, with
    /// nothing of a next one read, as an idle close).
    Retired,
    /// No request arrived within the idle timeout.
    Idle,
    /// A request was refused (and the peer told under v2).
    Refused,
    /// A request's header or payload did not arrive by its deadline.
    Expired,
    /// The segment a request named was remounted (new epoch) while it was being served: no
    /// further byte of it is read or written.
    Remounted,
    /// A socket error or an early close inside a request.
    Failed(io::Error),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Stop {
        Stop::Failed(e)
    }
}

/// Serves requests in order until one ends the connection (or its key is retired).
async fn serve_requests(
    conn: &mut BufReader<TcpStream>,
    context: &ServeContext,
    mut admission: Option<&mut Admission>,
) -> Stop {
    loop {
        let admission = admission.as_deref_mut();
        let served = async {
            let (raw, deadline) = next_header(conn, context, admission).await?;
            if is_rdma_connect(&raw) {
                return Err(serve_rdma_handshake(conn, context, deadline).await);
            }
            if is_segment_query(&raw) {
                let reply = control::encode_reply(&context.registry.remote_ranges());
                return before(deadline, conn.get_mut().write_all(&reply)).await;
            }
            if is_notify(&raw) {
                return serve_notify(conn, context, &raw, deadline).await;
            }
            let header = match admit(&context.registry, &raw) {
                Ok((header, false)) => header,
                Ok((header, true)) => return device::serve(conn, header, deadline, context).await,
                Err(refusal) => {
                    reject(conn.get_mut(), context, refusal).await;
                    return Err(Stop::Refused);
                }
            };
            match header.opcode {
                Opcode::Write => serve_write(conn, header, deadline, context).await,
                Opcode::Read => {
                    let mut reads = vec![header];
                    take_buffered_reads(conn, &context.registry, &mut reads);
                    serve_reads(conn.get_ref(), &reads, context).await
                }
            }
        };
        if let Err(stop) = served.await {
            return stop;
        }
    }
}

/// Takes a notification (the header was read): reads its payload, keeps it in the inbox and
/// acknowledges it. An oversized or malformed one is refused and ends the connection.
async fn serve_notify(
    conn: &mut BufReader<TcpStream>,
    context: &ServeContext,
    raw: &[u8; HEADER_LEN],
    deadline: Instant,
) -> std::result::Result<(), Stop> {
    let size = u64::from_le_bytes(raw[..8].try_into().unwrap_or_default());
    let refuse = |why: String| Refusal {
        v2: true,
        status: Status::AddrRejected,
        why,
    };
    if size > control::MAX_NOTIFY_BYTES {
        let why = format!("a notification of {size} bytes");
        reject(conn.get_mut(), context, refuse(why)).await;
        return Err(Stop::Refused);
    }
    let mut payload = vec![0u8; size as usize];
    before(deadline, conn.read_exact(&mut payload)).await?;
    let Some((name, message)) = control::decode_notify(&payload) else {
        let why = "a malformed notification".to_string();
        reject(conn.get_mut(), context, refuse(why)).await;
        return Err(Stop::Refused);
    };
    if !context.inbox.push(name, message) {
        let why = "the notification inbox is full".to_string();
        reject(conn.get_mut(), context, refuse(why)).await;
        return Err(Stop::Refused);
    }
    before(deadline, conn.get_mut().write_all(&Status::Ok.encode())).await
}

/// Answers an RDMA handshake (the header was read): reads the initiator's endpoint, connects
/// a QP to it, replies with ours and the region table, then holds the QP until the
/// initiator closes the connection (no idle timeout: the QP is in use without traffic here).
/// Without the RDMA transport the request is refused like an unknown opcode.
async fn serve_rdma_handshake(
    conn: &mut BufReader<TcpStream>,
    context: &ServeContext,
    deadline: Instant,
) -> Stop {
    let Some(rdma) = &context.rdma else {
        let refusal = Refusal {
            v2: true,
            status: Status::AddrRejected,
            why: "RDMA handshake, but this process does not run the RDMA transport".into(),
        };
        reject(conn.get_mut(), context, refusal).await;
        return Stop::Refused;
    };
    let mut theirs = [0u8; REQUEST_LEN];
    if let Err(stop) = before(deadline, conn.read_exact(&mut theirs)).await {
        return stop;
    }
    // Creating and connecting the QP makes blocking verbs calls (and waits while a remount
    // re-registers a segment): off the runtime, so the other connections keep being served.
    let rdma = Arc::clone(rdma);
    let accepted = tokio::task::spawn_blocking(move || {
        rdma.accept(&theirs)
            .map_err(|_| crate::error::last_error_message())
    })
    .await
    .unwrap_or_else(|e| Err(format!("RDMA handshake task failed: {e}")));
    let (_qp, reply) = match accepted {
        Ok(accepted) => accepted,
        Err(why) => {
            let refusal = Refusal {
                v2: true,
                status: Status::AddrRejected,
                why,
            };
            reject(conn.get_mut(), context, refusal).await;
            return Stop::Refused;
        }
    };
    if let Err(stop) = before(deadline, conn.get_mut().write_all(&reply)).await {
        return stop;
    }
    let mut sink = [0u8; 64];
    loop {
        match conn.read(&mut sink).await {
            Ok(0) => return Stop::Closed,
            Ok(_) => continue,
            Err(e) => return Stop::Failed(e),
        }
    }
}

/// `future`, unless `deadline` passes first ([`Stop::Expired`]).
async fn before<T>(
    deadline: Instant,
    future: impl Future<Output = io::Result<T>>,
) -> std::result::Result<T, Stop> {
    match tokio::time::timeout_at(deadline, future).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Stop::Expired),
    }
}

/// Waits up to the idle timeout for the next request's first byte ([`Stop::Idle`]; with a
/// cluster key, [`Stop::Retired`] once the connection's key is retired and nothing of a
/// next request was read), then reads its 24-byte header by the deadline it starts (first byte + I/O timeout), which is
/// returned with it.
async fn next_header(
    conn: &mut BufReader<TcpStream>,
    context: &ServeContext,
    mut admission: Option<&mut Admission>,
) -> std::result::Result<([u8; HEADER_LEN], Instant), Stop> {
    if conn.buffer().is_empty() && admission.as_deref_mut().is_some_and(Admission::retired) {
        return Err(Stop::Retired);
    }
    let filled = match auth::wait_admitted(conn.fill_buf(), context.idle_timeout, admission).await {
        Waited::Ready(filled) => filled,
        Waited::Idle => return Err(Stop::Idle),
        Waited::Retired => return Err(Stop::Retired),
    };
    if filled?.is_empty() {
        return Err(Stop::Closed);
    }
    let deadline = Instant::now() + context.io_timeout;
    let mut raw = [0u8; HEADER_LEN];
    before(deadline, conn.read_exact(&mut raw)).await?;
    Ok((raw, deadline))
}

/// Why a header was refused: whether to answer with a status frame, which one, and why.
struct Refusal {
    v2: bool,
    status: Status,
    why: String,
}

/// Decodes a header and checks that it is a READ or WRITE of a non-empty range inside one
/// remotely accessible registered buffer and, when it names a segment epoch, that this is
/// the buffer's current epoch (a flagged epoch must match exactly, even when the buffer has
/// none: such a request was meant for another mount). Returns the header and whether the
/// buffer is device memory.
fn admit(
    registry: &Registry,
    raw: &[u8; HEADER_LEN],
) -> std::result::Result<(SessionHeader, bool), Refusal> {
    let header = SessionHeader::decode(raw).map_err(|(bad, v2)| Refusal {
        v2,
        status: Status::AddrRejected,
        why: bad.to_string(),
    })?;
    // Only a refusal formats text: admitting is on every request's path.
    let what = || {
        format!(
            "{:?} of {} bytes at {:#x}",
            header.opcode, header.size, header.addr
        )
    };
    let region = registry
        .within(header.addr, header.size)
        .filter(|region| region.remote_accessible && header.size > 0)
        .ok_or_else(|| Refusal {
            v2: header.v2,
            status: Status::AddrRejected,
            why: format!(
                "{} is not inside one remotely accessible registered buffer",
                what()
            ),
        })?;
    match header.epoch {
        Some(epoch) if epoch != region.epoch => Err(Refusal {
            v2: header.v2,
            status: Status::StaleEpoch,
            why: format!(
                "{} names segment epoch {epoch:#x}, the buffer's is {:#x}",
                what(),
                region.epoch
            ),
        }),
        _ => Ok((header, region.on_device)),
    }
}

/// Appends to `reads` the READ requests whose headers already wait in the read-ahead buffer
/// right behind the current one and that will be accepted, within [`GATHER_MAX_READS`] and
/// [`GATHER_MAX_BYTES`]. Stops at anything else (a WRITE, a refusal, a partial header), which
/// is served on its own afterwards, so answers and side effects keep the request order.
fn take_buffered_reads(
    conn: &mut BufReader<TcpStream>,
    registry: &Registry,
    reads: &mut Vec<SessionHeader>,
) {
    let mut bytes: u64 = reads.iter().map(|h| h.size).sum();
    while reads.len() < GATHER_MAX_READS {
        let Some(raw) = conn
            .buffer()
            .get(..HEADER_LEN)
            .and_then(|b| <&[u8; HEADER_LEN]>::try_from(b).ok())
        else {
            return;
        };
        match admit(registry, raw) {
            Ok((next, false))
                if next.opcode == Opcode::Read && bytes + next.size <= GATHER_MAX_BYTES =>
            {
                bytes += next.size;
                reads.push(next);
                conn.consume(HEADER_LEN);
            }
            _ => return,
        }
    }
}

/// Applies the payload of one validated WRITE by `deadline`, chunk by chunk: what the
/// read-ahead buffer holds is copied, small remainders are read ahead, large ones are
/// received straight into registered memory. It is counted as served once the payload is
/// applied, before the OK status is sent, so an initiator that saw its transfer complete
/// also sees the server's counters updated.
async fn serve_write(
    conn: &mut BufReader<TcpStream>,
    header: SessionHeader,
    deadline: Instant,
    context: &ServeContext,
) -> std::result::Result<(), Stop> {
    // `admit` succeeded, so the range is inside registered memory and fits in usize.
    let (target, size) = (header.addr as usize, header.size as usize);
    let mut done = 0;
    while done < size {
        let left = size - done;
        if conn.buffer().is_empty() {
            if left >= READ_AHEAD {
                let at = Fenced {
                    registry: &context.registry,
                    addr: target + done,
                    len: left,
                    epoch: header.epoch,
                };
                done += receive(conn.get_ref(), at, deadline).await?;
                continue;
            }
            if before(deadline, conn.fill_buf()).await?.is_empty() {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
        }
        may_apply(conn.get_ref(), deadline)?;
        let chunk = conn.buffer().len().min(left);
        let source = conn.buffer().as_ptr();
        // SAFETY: [target, target+size) is registered memory, which the registering caller
        // keeps valid while registered (module docs); the read-ahead buffer is ours and
        // holds `chunk` bytes; the two do not overlap.
        let copy = || unsafe {
            std::ptr::copy_nonoverlapping(source, (target + done) as *mut u8, chunk);
        };
        let at = (target + done) as u64;
        context
            .registry
            .fenced(at, chunk as u64, header.epoch, copy)
            .map_err(|_| Stop::Remounted)?;
        conn.consume(chunk);
        done += chunk;
    }
    acknowledge_write(conn, &header, context).await
}

/// Counts a WRITE whose payload was applied as served, then (under v2) sends its OK status
/// within the I/O timeout: an initiator that saw its transfer complete also sees the counters
/// updated.
async fn acknowledge_write(
    conn: &mut BufReader<TcpStream>,
    header: &SessionHeader,
    context: &ServeContext,
) -> std::result::Result<(), Stop> {
    let metrics = &context.metrics;
    add(
        &metrics.served_writes,
        &metrics.served_write_bytes,
        header.size,
    );
    if header.v2 {
        let status = Status::Ok.encode();
        let sent = conn.get_mut().write_all(&status);
        before(Instant::now() + context.io_timeout, sent).await?;
    }
    Ok(())
}

/// Whether payload may still be applied: the deadline has not passed and the initiator has
/// not reset the connection (data it sent before its abortive close may still be queued
/// here; the pending error says it gave up).
fn may_apply(stream: &TcpStream, deadline: Instant) -> std::result::Result<(), Stop> {
    if Instant::now() >= deadline {
        return Err(Stop::Expired);
    }
    match stream.take_error()? {
        Some(e) => Err(Stop::Failed(e)),
        None => Ok(()),
    }
}

/// A range of registered memory a request accesses, with the epoch the request named: every
/// access runs under the registry's epoch fence.
struct Fenced<'a> {
    registry: &'a Registry,
    addr: usize,
    len: usize,
    epoch: Option<u64>,
}

/// Receives at most `at.len` (> 0) payload bytes straight into registered memory at
/// `at.addr` by `deadline`; returns how many arrived. [`Stop::Remounted`] once the segment
/// has a new epoch.
async fn receive(
    stream: &TcpStream,
    at: Fenced<'_>,
    deadline: Instant,
) -> std::result::Result<usize, Stop> {
    let fd = stream.as_raw_fd();
    let (addr, len) = (at.addr, at.len);
    loop {
        before(deadline, stream.readable()).await?;
        may_apply(stream, deadline)?;
        // SAFETY: [addr, addr+len) lies inside a range `admit` accepted (see `serve_write`).
        let received = at.registry.fenced(addr as u64, len as u64, at.epoch, || {
            stream.try_io(Interest::READABLE, || unsafe { recv_into(fd, addr, len) })
        });
        match received.map_err(|_| Stop::Remounted)? {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Answers validated READs in order with gathered sends (status frames under v2, then the
/// data straight from registered memory); each send must make progress within the I/O
/// timeout ([`Stop::Expired`]). Each is counted as served before the data is sent.
async fn serve_reads(
    stream: &TcpStream,
    reads: &[SessionHeader],
    context: &ServeContext,
) -> std::result::Result<(), Stop> {
    let metrics = &context.metrics;
    let status = Status::Ok.encode();
    let mut parts: Vec<RawPart> = Vec::with_capacity(reads.len() * 2);
    for header in reads {
        if header.v2 {
            parts.push(RawPart {
                addr: status.as_ptr() as usize,
                len: STATUS_LEN,
            });
        }
        // `admit` accepted the range: registered memory that fits in usize.
        parts.push(RawPart {
            addr: header.addr as usize,
            len: header.size as usize,
        });
        add(
            &metrics.served_reads,
            &metrics.served_read_bytes,
            header.size,
        );
    }
    // Every send re-checks the epochs under the fence: after a remount not one more byte of
    // the earlier mount's memory is sent.
    let ranges: Vec<(u64, u64, Option<u64>)> =
        reads.iter().map(|h| (h.addr, h.size, h.epoch)).collect();
    let fd = stream.as_raw_fd();
    let mut cursor = Cursor::default();
    while cursor.part < parts.len() {
        before(Instant::now() + context.io_timeout, stream.writable()).await?;
        // SAFETY: the parts are `status` (alive until we return) and ranges `admit`
        // accepted, which the registering caller keeps valid (module docs).
        let sent = context.registry.fenced_ranges(&ranges, || {
            stream.try_io(Interest::WRITABLE, || unsafe {
                send_parts(fd, &parts, cursor)
            })
        });
        match sent.map_err(|_| Stop::Remounted)? {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
            Ok(n) => cursor.advance(n, parts.len(), |i| parts[i].len),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Counts and logs a refused request and, under v2, tells the peer (the caller then closes
/// the connection abortively, so a refused WRITE's payload is never read).
async fn reject(stream: &mut TcpStream, context: &ServeContext, refusal: Refusal) {
    bump(&context.metrics.rejected_requests);
    if refusal.status == Status::StaleEpoch {
        bump(&context.metrics.stale_epoch_rejections);
    }
    let peer = stream.peer_addr().ok();
    tracing::warn!(?peer, "transfer request refused: {}", refusal.why);
    if refusal.v2 {
        // The connection is closed right after; a failed send changes nothing.
        let _ = stream.write_all(&refusal.status.encode()).await;
    }
}
