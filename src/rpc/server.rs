//! The RPC server: serves any [`Interface`] (the master's, a P2P owner's) over the framed protocol of [`super::codec`].
//!
//! Each connection carries a sequence of request frames, each an `I::Request`, and gets
//! one `I::Response` frame per request, in order. A frame that does not decode closes the
//! connection (the client sees `RPC_FAIL`).
//!
//! Limits ([`ServerLimits`]): a request holding more items than `max_request_items` is answered
//! `INVALID_PARAMS` without being decoded further; a frame longer than `max_request_bytes`
//! closes the connection; so does a connection idle for `idle_timeout` or one that leaves a
//! frame unfinished for `read_timeout`; connections beyond `max_connections` are closed on
//! accept. Each is counted in [`RpcStats`]. With a cluster key
//! ([`ServerOptions::cluster_key`]), a connection is served only once its peer passed the
//! key's handshake (`auth`, role `I::NAME`); one that does not is closed before any of its
//! bytes is read as a request. With a TLS certificate ([`ServerOptions::tls`]) every
//! connection is TLS first (the key's handshake then runs inside it); one that does not
//! complete TLS within the handshake timeout is closed.
//!
//! The service traits are synchronous; each call runs inline on the shard thread that read its
//! request (see the `serve` module), as Mooncake's coro_rpc runs handlers on its I/O threads,
//! except the table scans named in [`ServerOptions::scan_methods`] (the master names its
//! `remove_all` and `remove_by_regex`, `crate::master::MASTER_SCAN_METHODS`): they run on a small pool of scan threads with a bounded
//! queue (a full queue answers `TASK_PENDING_LIMIT_EXCEEDED`), so a scan over millions of keys
//! holds only its own connection, never a shard's other connections (pings among them).
//! Calls that wait for an event, and calls that inline calls may wait for (the master's
//! standby methods, `crate::master::MASTER_WAIT_METHODS`: a standby's long poll for journal
//! records, and its reads that a removal waiting on a shard needs), likewise run on their own
//! [`WAIT_THREADS`] threads, named in [`ServerOptions::wait_methods`]: they never hold a shard
//! nor queue behind one. A connection that made such a call moves, after its answer, off the
//! shards to one side runtime (`<name>-side`): a shard whose inline call waits for that
//! connection's next request (a removal waiting for the standby's acknowledgement) can then
//! never hold it. Long polls that many clients keep open (the master's `disk_tasks`, one per
//! SSD tier owner) run on a third lane of [`POLL_THREADS`] threads
//! ([`ServerOptions::poll_methods`]), so they never take the wait threads from a standby.
//! Measured on loopback (release, 2 vCPUs, p50): `service_ready` 8.6 µs against 7.3 µs for a
//! raw 64-byte tokio echo and 6.1 µs for a blocking std echo; `block_in_place` on a
//! work-stealing runtime gave 16.8 µs and `spawn_blocking` 21 µs. A call that blocks holds only the connections of its own shard;
//! size the shard count for the calls that may block at once
//! ([`RpcServer::start_with_threads`], Mooncake's `--rpc_thread_num`).

use super::codec::{self, DecodeError, HEADER_LEN, MAX_FRAME_LEN};
use super::interface::Interface;
use super::serve::Acceptor;
use super::server_stream::{MovableTcp, ServerStream};
use super::stats::RpcStats;
use crate::auth::{self, Admission, KeyRing, Waited};
use crate::error::{ErrorCode, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Worker threads of [`RpcServer::start`] (Mooncake's `--max_threads` default).
pub const DEFAULT_WORKER_THREADS: usize = 16;
/// Threads running the calls of [`ServerOptions::wait_methods`] (none without such methods):
/// that many such calls wait at once; more queue (up to [`WAIT_QUEUE`], then refused).
pub const WAIT_THREADS: usize = 4;
/// Waiting calls queued for a wait thread; more are refused `TASK_PENDING_LIMIT_EXCEEDED`.
const WAIT_QUEUE: usize = 16;
/// Threads running the calls of [`ServerOptions::poll_methods`] (none without such methods):
/// that many long polls wait at once; more queue (up to [`POLL_QUEUE`], then refused).
pub const POLL_THREADS: usize = 64;
/// Long polls queued for a poll thread; more are refused `TASK_PENDING_LIMIT_EXCEEDED`.
const POLL_QUEUE: usize = 1024;

/// Limits of an RPC server; see the module documentation. Plain value, `Copy`. The master
/// binary sets each from the flag named on its field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; more are closed on accept (`--rpc_max_connections`).
    pub max_connections: usize,
    /// A connection without a request for this long is closed (`--rpc_conn_timeout_seconds`).
    pub idle_timeout: Duration,
    /// A request must arrive whole within this long of its first byte (`--rpc_read_timeout_ms`).
    pub read_timeout: Duration,
    /// Longest request payload in bytes, at most [`MAX_FRAME_LEN`] (`--rpc_max_request_bytes`).
    pub max_request_bytes: usize,
    /// Most sequence elements and struct fields one request may hold (`--rpc_max_request_items`).
    pub max_request_items: usize,
    /// Threads running table scans, at least 1 (`--rpc_scan_threads`).
    pub scan_threads: usize,
    /// Scans waiting for a scan thread; more are refused (`--rpc_scan_queue`).
    pub scan_queue: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(300),
            read_timeout: Duration::from_secs(10),
            max_request_bytes: MAX_FRAME_LEN,
            max_request_items: 1 << 20,
            scan_threads: 1,
            scan_queue: 16,
        }
    }
}

/// How to serve an interface. Plain value.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Shard threads (at least 1): at most that many inline calls run at once.
    pub threads: usize,
    /// Limits on connections and requests.
    pub limits: ServerLimits,
    /// Methods run on the scan threads instead of inline.
    pub scan_methods: &'static [&'static str],
    /// Methods that may wait for an event, or that inline calls may wait for: run on the
    /// wait threads instead of inline.
    pub wait_methods: &'static [&'static str],
    /// Long polls many clients keep open at once (each waits a bounded time for work): run
    /// on their own poll threads, so they never queue ahead of the wait methods.
    pub poll_methods: &'static [&'static str],
    /// The cluster key every connection must prove before its first request is read (role
    /// `I::NAME`); `None`: the process's key, if any ([`auth::process_key`]).
    pub cluster_key: Option<Arc<KeyRing>>,
    /// TLS for every connection (before the key's handshake); `None`: plain TCP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// A running RPC server. Owns its threads (see [`Acceptor`]); thread-safe;
/// [`RpcServer::shutdown`] is idempotent and also runs on drop.
pub struct RpcServer {
    acceptor: Acceptor,
    stats: Arc<RpcStats>,
}

impl RpcServer {
    /// Binds `addr` (port 0 picks a free port) and serves `api` through interface `I` with
    /// `threads` shard threads (at least 1) named after `I::NAME`, default limits and no scan
    /// methods.
    ///
    /// Errors: `RPC_FAIL` if the address cannot be bound.
    pub fn serve<I: Interface>(
        addr: SocketAddr,
        api: Arc<I::Api>,
        threads: usize,
    ) -> Result<RpcServer> {
        let options = ServerOptions {
            threads,
            limits: ServerLimits::default(),
            scan_methods: &[],
            wait_methods: &[],
            poll_methods: &[],
            cluster_key: None,
            tls: None,
        };
        RpcServer::serve_with::<I>(addr, api, options)
    }

    /// As [`RpcServer::serve`], with explicit options.
    ///
    /// Errors: `RPC_FAIL` if the address cannot be bound or a thread cannot be started;
    /// `AUTH_FAILED` when the process's cluster key file could not be loaded.
    pub fn serve_with<I: Interface>(
        addr: SocketAddr,
        api: Arc<I::Api>,
        options: ServerOptions,
    ) -> Result<RpcServer> {
        let cluster_key = match options.cluster_key {
            Some(key) => Some(key),
            None => auth::process_key()?,
        };
        auth::warn_if_open(addr, I::NAME, cluster_key.as_ref());
        let stats = Arc::new(RpcStats::default());
        let limits = &options.limits;
        let scan_lane = LaneSpec {
            kind: "scan",
            threads: limits.scan_threads.max(1),
            queue: limits.scan_queue,
        };
        let wait_lane = LaneSpec {
            kind: "wait",
            threads: if options.wait_methods.is_empty() {
                0
            } else {
                WAIT_THREADS
            },
            queue: WAIT_QUEUE,
        };
        let poll_lane = LaneSpec {
            kind: "poll",
            threads: if options.poll_methods.is_empty() {
                0
            } else {
                POLL_THREADS
            },
            queue: POLL_QUEUE,
        };
        let shared = Arc::new(Shared::<I> {
            side: OnceLock::new(),
            stats: Arc::clone(&stats),
            limits: options.limits,
            scan_methods: options.scan_methods,
            scans: Lane::<I>::start(I::NAME, scan_lane, Arc::clone(&api))?,
            wait_methods: options.wait_methods,
            waits: Lane::<I>::start(I::NAME, wait_lane, Arc::clone(&api))?,
            poll_methods: options.poll_methods,
            polls: Lane::<I>::start(I::NAME, poll_lane, Arc::clone(&api))?,
            api,
            connections: AtomicUsize::new(0),
            cluster_key,
            tls: options.tls,
        });
        let served = Arc::clone(&shared);
        let acceptor = Acceptor::start(I::NAME, addr, options.threads, move |stream, peer| {
            serve_connection::<I>(stream, peer, Arc::clone(&served))
        })?;
        if !options.wait_methods.is_empty() {
            let side = acceptor.extra_runtime(&format!("{}-side", I::NAME))?;
            let _ = shared.side.set(side);
        }
        Ok(RpcServer { acceptor, stats })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.acceptor.local_addr()
    }

    /// The server's counters (live; keep the `Arc` as long as needed).
    pub fn stats(&self) -> Arc<RpcStats> {
        Arc::clone(&self.stats)
    }

    /// Closes the listener and every connection; waits briefly for inline calls in progress.
    /// A scan or wait in progress finishes on its thread; its answer is dropped.
    pub fn shutdown(&self) {
        self.acceptor.shutdown();
    }
}

/// What every connection task of one server shares.
struct Shared<I: Interface> {
    /// The runtime connections move to after a wait method (set once the server listens;
    /// never without wait methods).
    side: OnceLock<Handle>,
    api: Arc<I::Api>,
    stats: Arc<RpcStats>,
    limits: ServerLimits,
    scan_methods: &'static [&'static str],
    scans: Lane<I>,
    wait_methods: &'static [&'static str],
    waits: Lane<I>,
    poll_methods: &'static [&'static str],
    polls: Lane<I>,
    connections: AtomicUsize,
    /// The key connections must prove first, if any.
    cluster_key: Option<Arc<KeyRing>>,
    /// TLS every connection opens with, if any.
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// One queued call: the request and where its encoded answer goes.
struct LaneJob<I: Interface> {
    request: I::Request,
    answer: oneshot::Sender<Option<Vec<u8>>>,
}

/// What a [`Lane`] is for and how big it is. Plain value.
#[derive(Clone, Copy)]
struct LaneSpec {
    /// `scan` or `wait`: names the threads and the log lines.
    kind: &'static str,
    threads: usize,
    queue: usize,
}

/// Threads running one kind of call off the shards, with a bounded queue. The threads end
/// when the queue's sender (owned by [`Shared`]) is dropped, after the call they are running.
struct Lane<I: Interface> {
    kind: &'static str,
    queue: mpsc::SyncSender<LaneJob<I>>,
    queue_len: usize,
}

impl<I: Interface> Lane<I> {
    fn start(name: &str, spec: LaneSpec, api: Arc<I::Api>) -> Result<Lane<I>> {
        let (queue, jobs) = mpsc::sync_channel::<LaneJob<I>>(spec.queue);
        let jobs = Arc::new(parking_lot::Mutex::new(jobs));
        for index in 0..spec.threads {
            let (jobs, api) = (Arc::clone(&jobs), Arc::clone(&api));
            let kind = spec.kind;
            std::thread::Builder::new()
                .name(format!("{name}-{kind}-{index}"))
                .spawn(move || run_lane::<I>(&jobs, &*api))
                .or_else(|err| {
                    crate::error::fail(
                        ErrorCode::RpcFail,
                        format_args!("{name} {kind} thread: {err}"),
                    )
                })?;
        }
        Ok(Lane {
            kind: spec.kind,
            queue,
            queue_len: spec.queue,
        })
    }
}

/// A lane's thread: runs queued jobs until the queue is closed.
fn run_lane<I: Interface>(jobs: &parking_lot::Mutex<mpsc::Receiver<LaneJob<I>>>, api: &I::Api) {
    loop {
        let next = jobs.lock().recv();
        let Ok(job) = next else {
            return;
        };
        let _ = job
            .answer
            .send(codec::encode_frame(&I::dispatch(job.request, api)).ok());
    }
}

/// Where a connection is served.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// On the shard it was accepted on.
    Shard,
    /// On the side runtime (it made a wait call).
    Side,
}

/// Why [`serve_requests`] returned.
enum Next {
    /// The connection is done (closed, timed out, failed).
    Close,
    /// It made a wait call on a shard: move it to the side runtime, with the bytes already
    /// read past that call.
    MoveToSide(Vec<u8>),
}

async fn serve_connection<I: Interface>(tcp: TcpStream, peer: SocketAddr, shared: Arc<Shared<I>>) {
    let limits = shared.limits;
    if shared.connections.fetch_add(1, Ordering::Relaxed) >= limits.max_connections {
        shared.connections.fetch_sub(1, Ordering::Relaxed);
        shared.stats.record_refused_connection();
        tracing::warn!(%peer, limit = limits.max_connections, "refusing an RPC connection: too many");
        return;
    }
    let slot = Slot(Arc::clone(&shared));
    let mut stream = match &shared.tls {
        None => ServerStream::Plain(tcp),
        Some(config) => {
            match auth::tls::accept(MovableTcp::new(tcp), config, I::NAME, peer).await {
                Some(session) => ServerStream::Tls(Box::new(session)),
                None => return,
            }
        }
    };
    let mut admission = None;
    if let Some(key) = &shared.cluster_key {
        match auth::server_async(&mut stream, key, I::NAME, Some(peer.ip())).await {
            Ok(id) => admission = Some(Admission::new(Arc::clone(key), id, I::NAME)),
            Err(_) => return,
        }
    }
    let served = Served {
        peer,
        placement: Placement::Shard,
    };
    if let Next::MoveToSide(read) =
        serve_requests::<I>(&mut stream, Vec::new(), served, &shared, admission.as_mut()).await
    {
        match (shared.side.get(), stream.detach()) {
            (Some(side), Ok(stream)) => {
                // A tokio socket is tied to its runtime: the side runtime adopts it.
                side.spawn(async move {
                    match stream.attach() {
                        Ok(mut stream) => {
                            let shared = &slot.0;
                            let served = Served {
                                peer,
                                placement: Placement::Side,
                            };
                            let admission = admission.as_mut();
                            serve_requests::<I>(&mut stream, read, served, shared, admission).await;
                        }
                        Err(err) => tracing::debug!(%peer, "adopt a moved connection: {err}"),
                    }
                    drop(slot);
                });
            }
            (_, Err(err)) => tracing::debug!(%peer, "cannot move a connection: {err}"),
            (None, Ok(_)) => {}
        }
    }
}

/// Counts a connection for as long as it lives, wherever it is served (dropped when its task
/// ends, also by a panic in a call).
struct Slot<I: Interface>(Arc<Shared<I>>);

impl<I: Interface> Drop for Slot<I> {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Which connection a [`serve_requests`] serves, and where.
#[derive(Clone, Copy)]
struct Served {
    peer: SocketAddr,
    placement: Placement,
}

/// Serves the requests of `stream` (after the bytes `read` already read from it) until it
/// closes, its cluster key (`admission`) is retired (checked between requests, with nothing
/// of the next one read) or, on a shard, until it made a wait call.
async fn serve_requests<I: Interface>(
    stream: &mut ServerStream,
    read: Vec<u8>,
    Served { peer, placement }: Served,
    shared: &Shared<I>,
    mut admission: Option<&mut Admission>,
) -> Next {
    let limits = shared.limits;
    // One buffered reader over the stream; answers are written to the stream under it.
    let mut reader = BufReader::new(read.as_slice().chain(stream));
    loop {
        let nothing_read = reader.buffer().is_empty() && reader.get_ref().get_ref().0.is_empty();
        if nothing_read && admission.as_deref_mut().is_some_and(Admission::retired) {
            return Next::Close;
        }
        let next = reader.fill_buf();
        match auth::wait_admitted(next, limits.idle_timeout, admission.as_deref_mut()).await {
            Waited::Ready(Ok(_)) => {}
            Waited::Ready(Err(err)) => {
                tracing::debug!(%peer, "closing RPC connection: {err}");
                return Next::Close;
            }
            Waited::Idle => {
                shared.stats.record_timed_out_connection();
                tracing::debug!(%peer, "closing an idle RPC connection");
                return Next::Close;
            }
            Waited::Retired => return Next::Close,
        }
        let frame = codec::read_frame_limited(&mut reader, limits.max_request_bytes);
        let payload = match tokio::time::timeout(limits.read_timeout, frame).await {
            Ok(Ok(Some(payload))) => payload,
            Ok(Ok(None)) => return Next::Close,
            Ok(Err(code)) => {
                tracing::debug!(%peer, "closing RPC connection: {code}");
                return Next::Close;
            }
            Err(_) => {
                shared.stats.record_timed_out_connection();
                tracing::warn!(%peer, timeout = ?limits.read_timeout, "closing an RPC connection stalled inside a request");
                return Next::Close;
            }
        };
        let Some((answer, waited)) = answer::<I>(&payload, shared, peer).await else {
            tracing::warn!(%peer, "closing RPC connection after an unanswerable request");
            return Next::Close;
        };
        let writer = reader.get_mut().get_mut().1;
        let written = async {
            writer.write_all(&answer).await?;
            writer.flush().await
        };
        if let Err(err) = written.await {
            tracing::debug!(%peer, "closing RPC connection: {err}");
            return Next::Close;
        }
        if waited && placement == Placement::Shard && shared.side.get().is_some() {
            let mut rest = reader.buffer().to_vec();
            let (unread, _) = reader.into_inner().into_inner();
            rest.extend_from_slice(unread);
            return Next::MoveToSide(rest);
        }
    }
}

/// Decodes, runs and encodes one request, and says whether it was a wait method; `None`
/// when the request does not decode or the answer cannot be encoded (the connection is then
/// closed).
async fn answer<I: Interface>(
    payload: &[u8],
    shared: &Shared<I>,
    peer: SocketAddr,
) -> Option<(Vec<u8>, bool)> {
    let started = Instant::now();
    let stats = &shared.stats;
    let request = match codec::decode_bounded::<I::Request>(
        payload,
        shared.limits.max_request_items,
    ) {
        Ok(request) => request,
        Err(DecodeError::OverLimit) => {
            stats.record_refused_request();
            tracing::warn!(%peer, limit = shared.limits.max_request_items, "refusing a request holding too many items: INVALID_PARAMS");
            let frame = codec::error_frame::<I::Response>(payload, ErrorCode::InvalidParams);
            return frame.map(|frame| (frame, false));
        }
        Err(DecodeError::Malformed) => {
            stats.record_bad_request();
            return None;
        }
    };
    let method = I::method(&request);
    let lane = if shared.scan_methods.contains(&method) {
        Some(&shared.scans)
    } else if shared.wait_methods.contains(&method) {
        Some(&shared.waits)
    } else if shared.poll_methods.contains(&method) {
        Some(&shared.polls)
    } else {
        None
    };
    let frame = match lane {
        Some(lane) => off_shard::<I>(lane, request, payload, shared, peer).await,
        None => codec::encode_frame(&I::dispatch(request, &*shared.api)).ok(),
    };
    let failed = frame
        .as_ref()
        .is_none_or(|frame| codec::enum_result_error(&frame[HEADER_LEN..]).is_some());
    stats.record(method, started.elapsed(), failed);
    let waited = shared.wait_methods.contains(&method);
    frame.map(|frame| (frame, waited))
}

/// Runs `request` on a thread of `lane` and waits for its answer without holding the shard;
/// a full queue answers `TASK_PENDING_LIMIT_EXCEEDED`.
async fn off_shard<I: Interface>(
    lane: &Lane<I>,
    request: I::Request,
    payload: &[u8],
    shared: &Shared<I>,
    peer: SocketAddr,
) -> Option<Vec<u8>> {
    let (answer, answered) = oneshot::channel();
    match lane.queue.try_send(LaneJob { request, answer }) {
        Ok(()) => answered.await.ok().flatten(),
        Err(_) => {
            shared.stats.record_refused_request();
            tracing::warn!(%peer, kind = lane.kind, queue = lane.queue_len, "queue full: TASK_PENDING_LIMIT_EXCEEDED");
            codec::error_frame::<I::Response>(payload, ErrorCode::TaskPendingLimitExceeded)
        }
    }
}
