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
//! Memory lifetime: a request is validated against the registry when its header arrives; the
//! bytes are then read or written without holding any lock. A caller that unregisters (and
//! frees) memory while a peer is mid-transfer into it must first make sure no peer is using
//! it (e.g. by unmounting the segment at the master); otherwise the server may touch freed
//! memory. Stalled peers keep their connection until they close it or the engine shuts down.

use super::gather::Cursor;
use super::metrics::{add, bump, Metrics};
use super::registry::Registry;
use super::wire::{Opcode, SessionHeader, Status, HEADER_LEN};
use crate::error::{fail, ErrorCode, Result};
use parking_lot::Mutex;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

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
    metrics: Arc<Metrics>,
}

/// A running data server. Thread-safe; stopping it is idempotent.
pub(crate) struct Server {
    runtime: Mutex<Option<Runtime>>,
    addr: SocketAddr,
}

impl Server {
    /// Starts serving on `listener` (already bound by the caller; ownership moves here).
    ///
    /// Errors: `TRANSFER_FAIL` when the runtime cannot be built or the listener cannot be
    /// switched to non-blocking mode.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
    ) -> Result<Server> {
        let setup = || -> io::Result<(Runtime, SocketAddr)> {
            let addr = listener.local_addr()?;
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
            let context = Arc::new(ServeContext { registry, metrics });
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
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, "cannot set TCP_NODELAY: {e}");
                }
                tokio::spawn(serve_connection(stream, peer, Arc::clone(&context)));
            }
            Err(e) => {
                tracing::warn!("transfer server accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Serves requests on one connection until the peer closes it or a request fails or is
/// refused.
async fn serve_connection(stream: TcpStream, peer: SocketAddr, context: Arc<ServeContext>) {
    let mut conn = BufReader::with_capacity(READ_AHEAD, stream);
    loop {
        let mut raw = [0u8; HEADER_LEN];
        if let Err(e) = conn.read_exact(&mut raw).await {
            if e.kind() != io::ErrorKind::UnexpectedEof {
                tracing::debug!(%peer, "transfer connection closed: {e}");
            }
            return;
        }
        let header = match admit(&context.registry, &raw) {
            Ok(header) => header,
            Err((v2, why)) => {
                reject(conn.get_mut(), peer, &context, v2, why).await;
                return;
            }
        };
        let served = match header.opcode {
            Opcode::Write => serve_write(&mut conn, header, &context.metrics).await,
            Opcode::Read => {
                let mut reads = vec![header];
                take_buffered_reads(&mut conn, &context.registry, &mut reads);
                serve_reads(conn.get_mut(), &reads, &context.metrics).await
            }
        };
        if let Err(e) = served {
            tracing::debug!(%peer, "transfer request failed: {e}");
            return;
        }
    }
}

/// Decodes a header and checks that it is a READ or WRITE of a non-empty range inside one
/// remotely accessible registered buffer. Refusals carry the v2 flag and the reason.
fn admit(
    registry: &Registry,
    raw: &[u8; HEADER_LEN],
) -> std::result::Result<SessionHeader, (bool, String)> {
    let header = SessionHeader::decode(raw).map_err(|(bad, v2)| (v2, bad.to_string()))?;
    let accessible = registry
        .within(header.addr, header.size)
        .filter(|region| region.remote_accessible && header.size > 0);
    if accessible.is_none() {
        let why = format!(
            "{:?} of {} bytes at {:#x} is not inside one remotely accessible registered buffer",
            header.opcode, header.size, header.addr
        );
        return Err((header.v2, why));
    }
    Ok(header)
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
            Ok(next) if next.opcode == Opcode::Read && bytes + next.size <= GATHER_MAX_BYTES => {
                bytes += next.size;
                reads.push(next);
                conn.consume(HEADER_LEN);
            }
            _ => return,
        }
    }
}

/// Applies the payload of one validated WRITE. It is counted as served once the payload is
/// applied, before the OK status is sent, so an initiator that saw its transfer complete also
/// sees the server's counters updated.
async fn serve_write(
    conn: &mut BufReader<TcpStream>,
    header: SessionHeader,
    metrics: &Metrics,
) -> io::Result<()> {
    // `admit` succeeded, so the range is inside registered memory and fits in usize.
    // SAFETY: [addr, addr+size) is registered memory, which the registering caller keeps
    // valid while registered (module docs state the unregister-during-transfer rule).
    let target = unsafe {
        std::slice::from_raw_parts_mut(header.addr as usize as *mut u8, header.size as usize)
    };
    conn.read_exact(target).await?;
    add(
        &metrics.served_writes,
        &metrics.served_write_bytes,
        header.size,
    );
    if header.v2 {
        conn.get_mut().write_all(&Status::Ok.encode()).await?;
    }
    Ok(())
}

/// Answers validated READs in order with one gathered write (status frames under v2, then
/// the data straight from registered memory). Each is counted as served before the data is
/// sent.
async fn serve_reads(
    stream: &mut TcpStream,
    reads: &[SessionHeader],
    metrics: &Metrics,
) -> io::Result<()> {
    let status = Status::Ok.encode();
    let mut parts: Vec<&[u8]> = Vec::with_capacity(reads.len() * 2);
    for header in reads {
        if header.v2 {
            parts.push(&status);
        }
        // SAFETY: as in `serve_write`, for reading; `admit` accepted the range.
        parts.push(unsafe {
            std::slice::from_raw_parts(header.addr as usize as *const u8, header.size as usize)
        });
        add(
            &metrics.served_reads,
            &metrics.served_read_bytes,
            header.size,
        );
    }
    let mut cursor = Cursor::default();
    while cursor.part < parts.len() {
        let n = stream
            .write_vectored(&cursor.unsent(&parts, parts.len()))
            .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        cursor.advance(n, parts.len(), |i| parts[i].len());
    }
    Ok(())
}

/// Counts and logs a refused request and, under v2, tells the peer before closing.
async fn reject(
    stream: &mut TcpStream,
    peer: SocketAddr,
    context: &ServeContext,
    v2: bool,
    why: String,
) {
    bump(&context.metrics.rejected_requests);
    tracing::warn!(%peer, "transfer request refused: {why}");
    if v2 {
        // The connection is closed right after; a failed send changes nothing.
        let _ = stream.write_all(&Status::AddrRejected.encode()).await;
    }
}
