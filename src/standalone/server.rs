//! [`DummyServer`]: the real client's side. One thread accepts dummy connections on the
//! abstract socket (a dummy opens one per transfer it runs at once); one thread per
//! connection maps the blocks the dummy sends on it and runs its transfers with the real
//! client's engine, straight into / out of those mappings. Every offset and length a dummy
//! names is checked against the connection's mappings, and a transfer aimed at the real client
//! itself must land in remotely accessible memory (the mounted segment): a buggy or hostile
//! dummy gets `INVALID_PARAMS`, never a crash or a touch of other memory. A connection that
//! sends nothing for [`super::ttl`] or is closed is dropped with everything held for it; a
//! dummy's last one detaches the dummy.

use super::wire::{
    deadline_from_wire, parse_header, Kind, Reader, WireRequest, Writer, VERSION, WORKING,
};
use crate::auth::{self, KeyRing};
use crate::error::{fail, last_error_message, ErrorCode, Result};
use crate::shm::{recv_with_fds, PeerMapping};
use crate::transfer::{TransferEngine, TransferOp, TransferRequest};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The real client's counters for dummies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Dummies attached now (a dummy with several connections counts once).
    pub dummies: u64,
    /// Blocks mapped now, over all dummies.
    pub mappings: u64,
    /// Bytes of those mappings.
    pub mapped_bytes: u64,
    /// Dummy connections ended so far (closed, silent past the TTL, or protocol errors); a
    /// dummy's last one ends the dummy, and everything held for it is released.
    pub connections_dropped: u64,
    /// Transfer requests refused by the bounds checks so far.
    pub requests_refused: u64,
    /// Dummy connections open now (a dummy opens one per transfer it runs at once).
    pub connections: u64,
    /// Connections of processes of another user, closed unserved.
    pub other_user_refused: u64,
    /// Connections closed unserved because `MC_DUMMY_MAX_CONNECTIONS` were served already.
    pub connections_refused: u64,
    /// Connections dropped because a frame had not fully arrived one TTL after its first
    /// byte.
    pub frames_timed_out: u64,
    /// Maps refused by a mapping limit (`MC_DUMMY_MAX_MAPPINGS`, `MC_DUMMY_MAX_MAPPED_BYTES`,
    /// `MC_DUMMY_MAX_MAPPED_BYTES_TOTAL`).
    pub maps_refused: u64,
    /// Transfer requests failed because the dummy's block lost pages under them (a hole
    /// punched in its file that the kernel could not refill; see `shm::fault_guard`): the
    /// real client's copy ended on scratch pages instead of a SIGBUS.
    pub lost_page_requests: u64,
}

/// What a real client grants its dummies; [`Limits::from_env`] at start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Silence after which a connection is dropped, and the longest one frame may take once
    /// its first byte arrived (`MC_DUMMY_TTL_MS`).
    pub(crate) ttl: Duration,
    /// Dummy connections served at once over all dummies (`MC_DUMMY_MAX_CONNECTIONS`).
    pub(crate) connections: usize,
    /// Distinct blocks one dummy process may have mapped, over all its links and
    /// connections (`MC_DUMMY_MAX_MAPPINGS`).
    pub(crate) mappings_per_peer: usize,
    /// Bytes one dummy process may have mapped (`MC_DUMMY_MAX_MAPPED_BYTES`).
    pub(crate) bytes_per_peer: u64,
    /// Bytes mapped for all dummies together (`MC_DUMMY_MAX_MAPPED_BYTES_TOTAL`).
    pub(crate) bytes_total: u64,
}

impl Limits {
    /// The limits the environment sets (see `docs/configuration.md`).
    pub(crate) fn from_env() -> Limits {
        let size = |knob: &crate::env::Knob| usize::try_from(knob.get()).unwrap_or(usize::MAX);
        Limits {
            ttl: super::ttl(),
            connections: size(&crate::env::DUMMY_MAX_CONNECTIONS),
            mappings_per_peer: size(&crate::env::DUMMY_MAX_MAPPINGS),
            bytes_per_peer: crate::env::DUMMY_MAX_MAPPED_BYTES.get(),
            bytes_total: crate::env::DUMMY_MAX_MAPPED_BYTES_TOTAL.get(),
        }
    }
}

#[derive(Default)]
struct Counters {
    mappings: AtomicU64,
    mapped_bytes: AtomicU64,
    connections_dropped: AtomicU64,
    requests_refused: AtomicU64,
    connections: AtomicU64,
    other_user_refused: AtomicU64,
    connections_refused: AtomicU64,
    frames_timed_out: AtomicU64,
    maps_refused: AtomicU64,
    lost_page_requests: AtomicU64,
}

/// A dummy link: the process at the other end as the kernel names it (`SO_PEERCRED`, not what
/// the dummy says) and the id of its link (one per [`super::DummyLink`]), shared by all the
/// link's connections.
type LinkKey = (libc::pid_t, u64);

/// What one attached dummy link holds: connections open, the blocks mapped over all of them
/// (block id → how many of its connections map it), and the bytes of those mappings (a block
/// mapped on two connections is mapped, and counted, twice).
#[derive(Default)]
struct LinkHolds {
    connections: usize,
    blocks: HashMap<u64, usize>,
    bytes: u64,
}

struct Shared {
    engine: Arc<TransferEngine>,
    own_name: String,
    master_address: String,
    limits: Limits,
    stop: AtomicBool,
    counters: Counters,
    /// The attached dummies: their connections and mapped blocks.
    links: Mutex<HashMap<LinkKey, LinkHolds>>,
    /// The dummy connections being served: a handle on each one's socket and its thread.
    served: Mutex<Vec<Served>>,
    /// The key a dummy connection proves before its hello is read, if any.
    cluster_key: Option<Arc<KeyRing>>,
}

/// One dummy connection: a duplicate of its socket (to end it at shutdown) and its thread.
struct Served {
    socket: UnixStream,
    thread: std::thread::JoinHandle<()>,
}

/// Serves dummies until dropped (or [`DummyServer::shutdown`]). Thread-safe.
pub struct DummyServer {
    shared: Arc<Shared>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl DummyServer {
    /// Listens on the abstract sockets `names` (one or more, repeats ignored; a dummy may
    /// attach on any) and
    /// serves dummies with `engine` (whose segment name is `own_name`); dummies are told to
    /// reach the master at `master_address`.
    ///
    /// Errors: `INVALID_PARAMS` when no name is given or one is taken (another real client on
    /// that port); `INTERNAL_ERROR` when the thread cannot start.
    pub fn start(
        names: &[&str],
        engine: Arc<TransferEngine>,
        own_name: &str,
        master_address: &str,
    ) -> Result<DummyServer> {
        let limits = Limits::from_env();
        let key = crate::auth::process_key()?;
        Self::start_with(names, engine, own_name, master_address, limits, key)
    }

    /// [`Self::start`] with a dummy TTL of `ttl` instead of [`super::ttl`].
    #[cfg(test)]
    pub(super) fn start_with_ttl(
        name: &str,
        engine: Arc<TransferEngine>,
        own_name: &str,
        master_address: &str,
        ttl: Duration,
    ) -> Result<DummyServer> {
        let limits = Limits {
            ttl,
            ..Limits::from_env()
        };
        Self::start_with(&[name], engine, own_name, master_address, limits, None)
    }

    /// [`Self::start`] with `limits` instead of the environment's and `cluster_key` (every
    /// dummy connection proves it first) instead of the process's key.
    pub(super) fn start_with(
        names: &[&str],
        engine: Arc<TransferEngine>,
        own_name: &str,
        master_address: &str,
        limits: Limits,
        cluster_key: Option<Arc<KeyRing>>,
    ) -> Result<DummyServer> {
        if names.is_empty() {
            return fail(
                ErrorCode::InvalidParams,
                "no socket name to serve dummies on",
            );
        }
        let mut listeners = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                continue;
            }
            let listener = SocketAddr::from_abstract_name(name.as_bytes())
                .and_then(|addr| UnixListener::bind_addr(&addr));
            match listener {
                Ok(listener) => listeners.push(listener),
                Err(e) => {
                    return fail(
                        ErrorCode::InvalidParams,
                        format!("cannot serve dummies on @{name}: {e}"),
                    )
                }
            }
        }
        let shared = Arc::new(Shared {
            engine,
            own_name: own_name.to_string(),
            master_address: master_address.to_string(),
            limits,
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            links: Mutex::new(HashMap::new()),
            served: Mutex::new(Vec::new()),
            cluster_key,
        });
        let accept_shared = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("mc-dummy-accept".into())
            .spawn(move || accept_loop(&accept_shared, &listeners));
        match acceptor {
            Ok(handle) => Ok(DummyServer {
                shared,
                acceptor: Some(handle),
            }),
            Err(e) => fail(ErrorCode::InternalError, format!("no acceptor thread: {e}")),
        }
    }

    /// The counters now.
    pub fn stats(&self) -> ServerStats {
        self.shared.stats()
    }

    /// Stops accepting and ends every connected dummy: shuts its socket down (the dummy sees
    /// its connection end at once: `TRANSFER_FAIL`, health 2), waits for its thread (which
    /// first finishes a transfer it is running, bounded by the engine's timeouts) and
    /// releases its mappings. Returns with no thread or socket of the server left.
    /// Idempotent.
    pub fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(handle) = self.acceptor.take() {
            let _ = handle.join();
        }
        let served = std::mem::take(&mut *self.shared.served.lock());
        for dummy in &served {
            let _ = dummy.socket.shutdown(Shutdown::Both);
        }
        for dummy in served {
            let _ = dummy.thread.join();
        }
    }
}

impl Drop for DummyServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    fn stats(&self) -> ServerStats {
        let c = &self.counters;
        ServerStats {
            dummies: self.links.lock().len() as u64,
            mappings: c.mappings.load(Ordering::Relaxed),
            mapped_bytes: c.mapped_bytes.load(Ordering::Relaxed),
            connections_dropped: c.connections_dropped.load(Ordering::Relaxed),
            requests_refused: c.requests_refused.load(Ordering::Relaxed),
            connections: c.connections.load(Ordering::Relaxed),
            other_user_refused: c.other_user_refused.load(Ordering::Relaxed),
            connections_refused: c.connections_refused.load(Ordering::Relaxed),
            frames_timed_out: c.frames_timed_out.load(Ordering::Relaxed),
            maps_refused: c.maps_refused.load(Ordering::Relaxed),
            lost_page_requests: c.lost_page_requests.load(Ordering::Relaxed),
        }
    }

    /// Counts one more connection of `link`.
    fn attach(&self, link: LinkKey) {
        let mut links = self.links.lock();
        let holds = links.entry(link).or_default();
        if holds.connections == 0 {
            tracing::info!(pid = link.0, "dummy attached");
        }
        holds.connections += 1;
    }

    /// Counts one connection of `link`, which mapped `blocks` (id, bytes), less; its last
    /// one detaches the dummy.
    fn detach(&self, link: LinkKey, blocks: impl Iterator<Item = (u64, u64)>) {
        let mut links = self.links.lock();
        let Some(holds) = links.get_mut(&link) else {
            return;
        };
        for (block, len) in blocks {
            holds.release(block, len);
        }
        debug_assert!(holds.connections > 0);
        holds.connections = holds.connections.saturating_sub(1);
        if holds.connections == 0 {
            links.remove(&link);
            tracing::info!(pid = link.0, "dummy detached");
        }
    }

    /// Counts block `block` of `len` bytes mapped on one more connection of `link`, within
    /// the [`Limits`]: the distinct blocks and the bytes of the link's process (all its links
    /// together), and the bytes of all dummies. Errors: `INVALID_PARAMS` naming the limit
    /// (nothing counted; `maps_refused`).
    fn reserve_mapping(&self, link: LinkKey, block: u64, len: u64) -> Result<()> {
        let mut links = self.links.lock();
        let limits = &self.limits;
        let of_process = links.iter().filter(|(key, _)| key.0 == link.0);
        let (blocks, bytes) = of_process.fold((0, 0u64), |(n, b), (_, h)| {
            (n + h.blocks.len(), b + h.bytes)
        });
        let total: u64 = links.values().map(|h| h.bytes).sum();
        let new_block = !links
            .get(&link)
            .is_some_and(|h| h.blocks.contains_key(&block));
        let refusal = if new_block && blocks >= limits.mappings_per_peer {
            Some(format!(
                "this dummy process already has {blocks} blocks mapped (MC_DUMMY_MAX_MAPPINGS)"
            ))
        } else if bytes.saturating_add(len) > limits.bytes_per_peer {
            Some(format!(
                "{len} more bytes would map {} bytes for this dummy process, over \
                 MC_DUMMY_MAX_MAPPED_BYTES ({})",
                bytes.saturating_add(len),
                limits.bytes_per_peer
            ))
        } else if total.saturating_add(len) > limits.bytes_total {
            Some(format!(
                "{len} more bytes would map {} bytes for all dummies, over \
                 MC_DUMMY_MAX_MAPPED_BYTES_TOTAL ({})",
                total.saturating_add(len),
                limits.bytes_total
            ))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.counters.maps_refused.fetch_add(1, Ordering::Relaxed);
            return fail(ErrorCode::InvalidParams, refusal);
        }
        let holds = links.entry(link).or_default();
        *holds.blocks.entry(block).or_insert(0) += 1;
        holds.bytes += len;
        Ok(())
    }

    /// Counts block `block` of `len` bytes unmapped on one connection of `link`.
    fn release_mapping(&self, link: LinkKey, block: u64, len: u64) {
        if let Some(holds) = self.links.lock().get_mut(&link) {
            holds.release(block, len);
        }
    }
}

impl LinkHolds {
    /// One connection less maps `block` of `len` bytes.
    fn release(&mut self, block: u64, len: u64) {
        self.bytes = self.bytes.saturating_sub(len);
        if let Some(count) = self.blocks.get_mut(&block) {
            *count -= 1;
            if *count == 0 {
                self.blocks.remove(&block);
            }
        } else {
            debug_assert!(false, "block {block} released but not reserved");
        }
    }
}

/// Accepts until stopped, polling the listener every 200 ms for the stop flag (and to reap
/// the threads of dummies that are gone).
fn accept_loop(shared: &Arc<Shared>, listeners: &[UnixListener]) {
    let mut polls: Vec<libc::pollfd> = listeners
        .iter()
        .map(|listener| libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !shared.stop.load(Ordering::Acquire) {
        reap_ended(shared);
        // SAFETY: `polls` holds `polls.len()` valid pollfds of listeners alive for the loop.
        let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 200) };
        if ready <= 0 {
            continue;
        }
        for (listener, poll) in listeners.iter().zip(&mut polls) {
            if std::mem::take(&mut poll.revents) != 0 {
                if let Ok((stream, _)) = listener.accept() {
                    admit(shared, stream);
                }
            }
        }
    }
}

/// Serves a dummy's new connection `stream` on a thread of its own, unless it is another
/// user's or `MC_DUMMY_MAX_CONNECTIONS` are served already (counted, closed unserved).
fn admit(shared: &Arc<Shared>, stream: UnixStream) {
    let peer = match crate::shm::check_peer_user(&stream) {
        Ok(pid) => pid,
        Err(e) => {
            tracing::warn!(error = %e, "a dummy of another user: refused");
            shared
                .counters
                .other_user_refused
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    // Each served connection costs two threads and two descriptors.
    let served = shared.served.lock().len();
    if served >= shared.limits.connections {
        tracing::warn!(
            served,
            "dummy connection refused: MC_DUMMY_MAX_CONNECTIONS reached"
        );
        shared
            .counters
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    let socket = match stream.try_clone() {
        Ok(socket) => socket,
        Err(e) => {
            tracing::warn!(error = %e, "cannot duplicate a dummy's socket: refused");
            return;
        }
    };
    let dummy_shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("mc-dummy".into())
        .spawn(move || serve(&dummy_shared, stream, peer));
    match spawned {
        Ok(thread) => shared.served.lock().push(Served { socket, thread }),
        Err(e) => tracing::warn!(error = %e, "no thread for a dummy: refused"),
    }
}

/// Joins the threads of dummies that are gone and closes their socket duplicates.
fn reap_ended(shared: &Shared) {
    let ended: Vec<Served> = {
        let mut served = shared.served.lock();
        let (ended, live) = std::mem::take(&mut *served)
            .into_iter()
            .partition(|dummy| dummy.thread.is_finished());
        *served = live;
        ended
    };
    for dummy in ended {
        let _ = dummy.thread.join();
    }
}

/// What the real client holds for one dummy connection; released (unmapped, counted) on
/// drop. Each connection of a dummy maps its blocks on its own; the [`Limits`] bound what a
/// dummy process maps over all its links and connections.
struct DummyState<'a> {
    shared: &'a Shared,
    /// The dummy, once its hello was accepted.
    link: Option<LinkKey>,
    mappings: HashMap<u64, PeerMapping>,
}

impl Drop for DummyState<'_> {
    fn drop(&mut self) {
        let c = &self.shared.counters;
        let held: Vec<(u64, u64)> = (self.mappings.iter())
            .map(|(id, mapping)| (*id, mapping.len() as u64))
            .collect();
        for (_, mapping) in self.mappings.drain() {
            c.mappings.fetch_sub(1, Ordering::Relaxed);
            c.mapped_bytes
                .fetch_sub(mapping.len() as u64, Ordering::Relaxed);
        }
        c.connections.fetch_sub(1, Ordering::Relaxed);
        c.connections_dropped.fetch_add(1, Ordering::Relaxed);
        if let Some(link) = self.link {
            self.shared.detach(link, held.into_iter());
        }
    }
}

/// Serves one dummy connection until it closes, falls silent past the TTL, or breaks the
/// protocol.
fn serve(shared: &Shared, stream: UnixStream, peer: libc::pid_t) {
    if stream.set_read_timeout(Some(shared.limits.ttl)).is_err()
        || stream.set_write_timeout(Some(shared.limits.ttl)).is_err()
    {
        return;
    }
    if let Some(key) = &shared.cluster_key {
        if auth::server_blocking(&mut &stream, key, auth::ROLE_STANDALONE, None).is_err() {
            return;
        }
    }
    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
    let heartbeat = Heartbeat::default();
    std::thread::scope(|scope| {
        let beating = std::thread::Builder::new()
            .name("mc-dummy-heartbeat".into())
            .spawn_scoped(scope, || heartbeat.run(&stream, shared.limits.ttl / 3));
        if let Err(error) = beating {
            tracing::warn!(%error, "no heartbeat thread: long requests may time out");
        }
        // Stopped also when serving panics, or the scope would wait for it forever while
        // it tells the dummy a dead request is still running.
        let _stop = StopOnDrop(&heartbeat);
        serve_requests(shared, &stream, peer, &heartbeat);
    });
}

/// Stops its heartbeat when dropped.
struct StopOnDrop<'a>(&'a Heartbeat);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Longest a request is reported as still running: a real client whose request runs longer
/// is taken as wedged, its heartbeats stop, and the dummy gives up after its TTL.
const MAX_REPORTED_RUN: Duration = Duration::from_secs(600);

/// Tells a dummy that its request is still running: at every wake (each `period`) while one
/// has run for at least half a `period` (and at most [`MAX_REPORTED_RUN`]), an empty
/// [`WORKING`] frame; so the first comes within 1.5 periods of the start and the next every
/// period. Writes to the connection only under its lock, which the answer's write also
/// holds, so frames never interleave. Thread-safe.
#[derive(Default)]
struct Heartbeat {
    state: Mutex<Beat>,
    wake: parking_lot::Condvar,
}

#[derive(Default)]
struct Beat {
    /// When the request being served started; `None` between requests.
    busy_since: Option<Instant>,
    stopped: bool,
}

impl Heartbeat {
    fn run(&self, stream: &UnixStream, period: Duration) {
        let mut beat = self.state.lock();
        while !beat.stopped {
            self.wake.wait_for(&mut beat, period);
            let long = beat
                .busy_since
                .is_some_and(|since| (period / 2..MAX_REPORTED_RUN).contains(&since.elapsed()));
            if long && !beat.stopped && send(stream, &Writer::default().frame(WORKING)).is_err() {
                break;
            }
        }
    }

    /// A request starts.
    fn busy(&self) {
        self.state.lock().busy_since = Some(Instant::now());
    }

    /// The request ended: writes its answer (no heartbeat after it). Errors: the write's.
    fn answer(&self, stream: &UnixStream, frame: &[u8]) -> std::io::Result<()> {
        let mut beat = self.state.lock();
        beat.busy_since = None;
        send(stream, frame)
    }

    fn stop(&self) {
        self.state.lock().stopped = true;
        self.wake.notify_all();
    }
}

/// Writes all of `frame` without raising `SIGPIPE` when the dummy is gone (the server may run
/// in a process that does not ignore it).
fn send(stream: &UnixStream, frame: &[u8]) -> std::io::Result<()> {
    crate::shm::send_with_fds(stream, frame, &[])
}

/// Serves the requests of one connection until it ends or the server stops.
fn serve_requests(shared: &Shared, stream: &UnixStream, peer: libc::pid_t, heartbeat: &Heartbeat) {
    let mut state = DummyState {
        shared,
        link: None,
        mappings: HashMap::new(),
    };
    while !shared.stop.load(Ordering::Acquire) {
        let greeted = state.link.is_some();
        let (kind, body, fds) = match read_frame(stream, shared.limits.ttl) {
            Ok(frame) => frame,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    tracing::warn!(error = %e, "dummy connection dropped");
                    let c = &shared.counters;
                    c.frames_timed_out.fetch_add(1, Ordering::Relaxed);
                }
                break;
            }
        };
        heartbeat.busy();
        let mut payload = Writer::default();
        let outcome = match Kind::from_u8(kind) {
            Some(Kind::Hello) if greeted => fail(ErrorCode::InvalidParams, "hello twice"),
            Some(Kind::Hello) => hello(shared, peer, &body, &mut payload).map(|link| {
                shared.attach(link);
                state.link = Some(link);
            }),
            Some(_) if !greeted => fail(ErrorCode::InvalidParams, "hello first"),
            Some(Kind::Map) => state.map(&body, fds),
            Some(Kind::Unmap) => state.unmap(&body),
            Some(Kind::Transfer) => state.transfer(&body, &mut payload),
            Some(Kind::Ping) => Ok(()),
            Some(Kind::Stats) => {
                let s = shared.stats();
                payload
                    .u64(s.dummies)
                    .u64(s.mappings)
                    .u64(s.mapped_bytes)
                    .u64(s.connections_dropped)
                    .u64(s.requests_refused)
                    .u64(s.connections)
                    .u64(s.other_user_refused)
                    .u64(s.connections_refused)
                    .u64(s.frames_timed_out)
                    .u64(s.maps_refused)
                    .u64(s.lost_page_requests);
                Ok(())
            }
            None => fail(ErrorCode::InvalidParams, format!("unknown request {kind}")),
        };
        let mut answer = Writer::default();
        match outcome {
            Ok(()) => answer.i32(0).str(""),
            Err(code) => answer.i32(code.code()).str(&last_error_message()),
        };
        answer.0.extend_from_slice(&payload.0);
        if heartbeat.answer(stream, &answer.frame(0)).is_err() {
            break;
        }
    }
}

/// Most descriptors a frame may carry (a `Map` request carries one). A dummy sending more, on
/// any chunk of a frame, is dropped at once (the descriptors closed), so it cannot fill the
/// real client's descriptor table by spreading a long frame over many messages.
const MAX_FDS_PER_FRAME: usize = 1;

/// Reads one frame and the descriptors that came with it, waiting up to `ttl` for its first
/// byte and then up to `ttl` for all the rest (a dummy trickling a frame byte by byte holds a
/// thread and the body buffer for one TTL, not forever). Errors end the dummy: `TimedOut`
/// for a frame begun and not finished within its `ttl`.
fn read_frame(stream: &UnixStream, ttl: Duration) -> std::io::Result<(u8, Vec<u8>, Vec<OwnedFd>)> {
    stream.set_read_timeout(Some(ttl))?;
    let mut frame = FrameRead {
        stream,
        ttl,
        deadline: None,
        fds: Vec::new(),
    };
    let mut header = [0u8; 5];
    frame.read_full(&mut header)?;
    let (kind, len) = parse_header(header).map_err(|_| std::io::ErrorKind::InvalidData)?;
    let mut body = vec![0u8; len];
    frame.read_full(&mut body)?;
    Ok((kind, body, frame.fds))
}

/// One frame being read: its deadline once its first byte came, and its descriptors.
struct FrameRead<'a> {
    stream: &'a UnixStream,
    ttl: Duration,
    deadline: Option<Instant>,
    fds: Vec<OwnedFd>,
}

impl FrameRead<'_> {
    fn read_full(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            if let Some(deadline) = self.deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(frame_timed_out(self.ttl));
                }
                self.stream.set_read_timeout(Some(left))?;
            }
            let (n, more) = match recv_with_fds(self.stream.as_fd(), &mut buf[got..]) {
                Ok(received) => received,
                Err(e) if self.deadline.is_some() && e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(frame_timed_out(self.ttl))
                }
                Err(e) => return Err(e),
            };
            self.fds.extend(more);
            if self.fds.len() > MAX_FDS_PER_FRAME {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("more than {MAX_FDS_PER_FRAME} descriptor in one frame"),
                ));
            }
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.deadline
                .get_or_insert_with(|| crate::spin::deadline(Instant::now(), self.ttl));
            got += n;
        }
        Ok(())
    }
}

fn frame_timed_out(ttl: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "a frame was not complete {} ms after its first byte",
            ttl.as_millis()
        ),
    )
}

/// Checks a hello and answers it; returns the dummy it names. Errors: `INVALID_VERSION` for
/// another protocol version, `INVALID_PARAMS` for a truncated hello or a real client the
/// dummy cannot use.
fn hello(shared: &Shared, peer: libc::pid_t, body: &[u8], payload: &mut Writer) -> Result<LinkKey> {
    let mut r = Reader::new(body);
    let version = r.u32()?;
    // What the dummy says its pid is; the link is keyed by the kernel's (`peer`).
    let said = r.u32()?;
    if version != VERSION {
        return fail(
            ErrorCode::InvalidVersion,
            format!("dummy protocol {version}, this real client speaks {VERSION}"),
        );
    }
    let link = r.u64()?;
    if crate::types::EMBEDDED_MASTER == shared.master_address || shared.master_address.is_empty() {
        return fail(
            ErrorCode::InvalidParams,
            "this real client runs an in-process master: dummies cannot reach it",
        );
    }
    tracing::debug!(pid = peer, said, link, "dummy connection attached");
    payload.str(&shared.master_address).str(&shared.own_name);
    Ok((peer, link))
}

impl DummyState<'_> {
    fn map(&mut self, body: &[u8], mut fds: Vec<OwnedFd>) -> Result<()> {
        let mut r = Reader::new(body);
        let (id, len) = (r.u64()?, r.u64()?);
        if fds.len() != 1 {
            return fail(
                ErrorCode::InvalidParams,
                format!("a map request needs one descriptor, got {}", fds.len()),
            );
        }
        if self.mappings.contains_key(&id) {
            return fail(
                ErrorCode::InvalidParams,
                format!("block {id} already mapped"),
            );
        }
        let Ok(len) = usize::try_from(len) else {
            return fail(ErrorCode::InvalidParams, "block too large");
        };
        let Some(link) = self.link else {
            return fail(ErrorCode::InvalidParams, "hello first");
        };
        self.shared.reserve_mapping(link, id, len as u64)?;
        let fd = fds.remove(0);
        let mapping = match PeerMapping::map(fd.as_fd(), 0, len) {
            Ok(mapping) => mapping,
            Err(e) => {
                self.shared.release_mapping(link, id, len as u64);
                return Err(e);
            }
        };
        let c = &self.shared.counters;
        c.mappings.fetch_add(1, Ordering::Relaxed);
        c.mapped_bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.mappings.insert(id, mapping);
        Ok(())
    }

    fn unmap(&mut self, body: &[u8]) -> Result<()> {
        let id = Reader::new(body).u64()?;
        match self.mappings.remove(&id) {
            Some(mapping) => {
                if let Some(link) = self.link {
                    self.shared.release_mapping(link, id, mapping.len() as u64);
                }
                let c = &self.shared.counters;
                c.mappings.fetch_sub(1, Ordering::Relaxed);
                c.mapped_bytes
                    .fetch_sub(mapping.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            None => fail(
                ErrorCode::InvalidParams,
                format!("block {id} is not mapped"),
            ),
        }
    }

    /// The address in this process of `[offset, offset + len)` of block `block`, after the
    /// bounds check; and, for requests aimed at this real client, the check that the target
    /// is remotely accessible memory.
    fn resolve(&self, request: &WireRequest) -> Result<usize> {
        let Some(mapping) = self.mappings.get(&request.block) else {
            return fail(
                ErrorCode::InvalidParams,
                format!("block {} is not mapped", request.block),
            );
        };
        if mapping.lost_pages() {
            return fail(ErrorCode::TransferFail, lost_pages(request.block));
        }
        let inside = request
            .offset
            .checked_add(request.len)
            .is_some_and(|end| end <= mapping.len() as u64);
        if !inside {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "[{}, +{}) is outside block {} ({} bytes)",
                    request.offset,
                    request.len,
                    request.block,
                    mapping.len()
                ),
            );
        }
        if request.endpoint == self.shared.own_name {
            let target = usize::try_from(request.remote_addr)
                .ok()
                .and_then(|addr| self.shared.engine.region_containing(addr));
            if !target.is_some_and(|r| r.remote_accessible) {
                return fail(
                    ErrorCode::InvalidParams,
                    format!(
                        "{:#x} is not in this real client's segment",
                        request.remote_addr
                    ),
                );
            }
        }
        Ok(mapping.addr() + request.offset as usize)
    }

    fn transfer(&mut self, body: &[u8], payload: &mut Writer) -> Result<()> {
        let mut r = Reader::new(body);
        let count = r.u32()? as usize;
        let mut wire = Vec::with_capacity(count.min(1 << 16));
        for _ in 0..count {
            wire.push(WireRequest::decode(&mut r)?);
        }
        let mut codes = vec![0i32; count];
        let mut message = String::new();
        let mut local = vec![0usize; count];
        for (i, request) in wire.iter().enumerate() {
            match self.resolve(request) {
                Ok(addr) => local[i] = addr,
                Err(code) => {
                    codes[i] = code.code();
                    message = last_error_message();
                }
            }
        }
        if refuse_overlapping_reads(&wire, &local, &mut codes) {
            message = "a read overlaps another request's local range".into();
        }
        let refused = codes.iter().filter(|c| **c != 0).count() as u64;
        self.shared
            .counters
            .requests_refused
            .fetch_add(refused, Ordering::Relaxed);
        let runnable: Vec<usize> = (0..count).filter(|i| codes[*i] == 0).collect();
        let requests: Vec<TransferRequest<'_>> = runnable
            .iter()
            .map(|&i| {
                let w = &wire[i];
                TransferRequest {
                    op: if w.write {
                        TransferOp::Write
                    } else {
                        TransferOp::Read
                    },
                    local_addr: local[i],
                    len: w.len,
                    endpoint: &w.endpoint,
                    remote_addr: w.remote_addr,
                    epoch: w.epoch,
                    send_by: deadline_from_wire(w.send_by_monotonic_ns),
                }
            })
            .collect();
        // SAFETY: every local range lies inside a live mapping of this dummy (checked above;
        // the mappings outlive the call), and no read overlaps another request's range.
        let results = unsafe { self.shared.engine.transfer(&requests) };
        for (&i, result) in runnable.iter().zip(results) {
            if let Err(code) = result {
                codes[i] = code.code();
                message = last_error_message();
            }
            // After the copy: a fault in the block during it moved scratch bytes (see
            // `shm::fault_guard`), whatever the engine reported.
            if self
                .mappings
                .get(&wire[i].block)
                .is_some_and(|m| m.lost_pages())
            {
                codes[i] = ErrorCode::TransferFail.code();
                message = lost_pages(wire[i].block);
                self.shared
                    .counters
                    .lost_page_requests
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        payload.u32(count as u32).str(&message);
        for code in codes {
            payload.i32(code);
        }
        Ok(())
    }
}

/// Why a transfer on block `block` failed after its file lost pages.
fn lost_pages(block: u64) -> String {
    format!(
        "block {block} lost pages (a hole punched in its file the kernel could not refill); \
         unmap it and map a fresh file"
    )
}

/// Marks `INVALID_PARAMS` on every resolved request whose local range overlaps another's
/// when either is a read (the engine needs disjoint read destinations). True if any.
fn refuse_overlapping_reads(wire: &[WireRequest], local: &[usize], codes: &mut [i32]) -> bool {
    let mut ranges: Vec<(usize, usize, usize)> = (0..wire.len())
        .filter(|&i| codes[i] == 0 && wire[i].len > 0)
        .map(|i| (local[i], local[i] + wire[i].len as usize, i))
        .collect();
    ranges.sort_unstable();
    let mut refused = false;
    let mut group: Vec<usize> = Vec::new();
    let mut group_end = 0usize;
    let mut flush = |group: &mut Vec<usize>, codes: &mut [i32]| {
        if group.len() > 1 && group.iter().any(|&i| !wire[i].write) {
            for &i in group.iter() {
                codes[i] = ErrorCode::InvalidParams.code();
            }
            refused = true;
        }
        group.clear();
    };
    for (start, end, i) in ranges {
        if !group.is_empty() && start >= group_end {
            flush(&mut group, codes);
        }
        if group.is_empty() {
            group_end = end;
        }
        group_end = group_end.max(end);
        group.push(i);
    }
    flush(&mut group, codes);
    refused
}
