//! The TCP data server: serves peers' READ and WRITE requests against this process's
//! remotely accessible registered memory, using Mooncake's v2 framing (v1 requests, without
//! the `0x80` flag, are served too, without status frames).
//!
//! Runs on a small multi-thread tokio runtime owned by the [`Server`]. Connections are
//! persistent: after each request the server waits for the next header. Payload bytes move
//! straight between the socket and the registered memory, with no intermediate buffer.
//!
//! Memory lifetime: a request is validated against the registry when its header arrives; the
//! bytes are then read or written without holding any lock. A caller that unregisters (and
//! frees) memory while a peer is mid-transfer into it must first make sure no peer is using
//! it (e.g. by unmounting the segment at the master); otherwise the server may touch freed
//! memory. Stalled peers keep their connection until they close it or the engine shuts down.

use super::metrics::{add, bump, Metrics};
use super::registry::Registry;
use super::wire::{Opcode, SessionHeader, Status, HEADER_LEN};
use crate::error::{fail, ErrorCode, Result};
use parking_lot::Mutex;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// Worker threads of the server runtime.
const SERVER_THREADS: usize = 2;
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);
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
async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, context: Arc<ServeContext>) {
    loop {
        let mut raw = [0u8; HEADER_LEN];
        if let Err(e) = stream.read_exact(&mut raw).await {
            if e.kind() != io::ErrorKind::UnexpectedEof {
                tracing::debug!(%peer, "transfer connection closed: {e}");
            }
            return;
        }
        let header = match SessionHeader::decode(&raw) {
            Ok(header) => header,
            Err((bad, v2)) => {
                reject(&mut stream, peer, &context, v2, bad.to_string()).await;
                return;
            }
        };
        let accessible = context
            .registry
            .within(header.addr, header.size)
            .filter(|region| region.remote_accessible && header.size > 0);
        if accessible.is_none() {
            let why = format!(
                "{:?} of {} bytes at {:#x} is not inside one remotely accessible registered buffer",
                header.opcode, header.size, header.addr
            );
            reject(&mut stream, peer, &context, header.v2, why).await;
            return;
        }
        if let Err(e) = serve_request(&mut stream, header, &context.metrics).await {
            tracing::debug!(%peer, "transfer request failed: {e}");
            return;
        }
    }
}

/// Moves the payload of one validated request. It is counted as served before its last
/// bytes reach the peer (READ: when accepted; WRITE: once the payload is applied), so an
/// initiator that saw its transfer complete also sees the server's counters updated.
async fn serve_request(
    stream: &mut TcpStream,
    header: SessionHeader,
    metrics: &Metrics,
) -> io::Result<()> {
    // `within` succeeded, so the range is inside registered memory and fits in usize.
    let ptr = header.addr as usize as *mut u8;
    let len = header.size as usize;
    match header.opcode {
        Opcode::Write => {
            // SAFETY: [ptr, ptr+len) is registered memory, which the registering caller keeps
            // valid while registered (module docs state the unregister-during-transfer rule).
            let target = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
            stream.read_exact(target).await?;
            add(
                &metrics.served_writes,
                &metrics.served_write_bytes,
                header.size,
            );
            if header.v2 {
                stream.write_all(&Status::Ok.encode()).await?;
            }
        }
        Opcode::Read => {
            // SAFETY: as above, for reading.
            let source = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            let status = Status::Ok.encode();
            let prefix: &[u8] = if header.v2 { &status } else { &[] };
            add(
                &metrics.served_reads,
                &metrics.served_read_bytes,
                header.size,
            );
            write_prefixed(stream, prefix, source).await?;
        }
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

/// Writes `prefix` then `data` with as few system calls as possible.
async fn write_prefixed(stream: &mut TcpStream, prefix: &[u8], data: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < prefix.len() {
        let n = stream
            .write_vectored(&[IoSlice::new(&prefix[sent..]), IoSlice::new(data)])
            .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += n;
    }
    stream.write_all(&data[sent - prefix.len()..]).await
}
