//! [`Exporter`]: the owner side of the same-host channel. A thread accepts connections on the
//! owner's abstract Unix socket and answers their handshakes, all at once: each accepted
//! connection has its own deadline for its hello, and one that sends nothing delays no other.
//! Pending connections are counted per peer process (`SO_PEERCRED` pid), like held ones: a
//! process past [`MAX_PENDING_PER_PEER`] loses its own oldest, and when [`MAX_PENDING`] wait
//! the process with the most loses its oldest, so idle connections of one process never drop
//! another's hello on its way. At most [`ACCEPTS_PER_ROUND`] are accepted between two reads
//! of the hellos that arrived, so a connect flood does not starve them. A granted
//! connection is kept open (its closing tells the peer that the owner died or retired the
//! mount) until the next retirement, or until the peer closes it (noticed within
//! [`SWEEP_PERIOD`], or at the next grant). Held connections are counted per peer process
//! (`SO_PEERCRED` pid): a process past [`MAX_HELD_PER_PEER`] loses its own oldest, and when
//! [`MAX_HELD`] are held the process holding the most loses one, so a process that
//! hand-shakes in a loop never evicts another peer's connection.

use super::control::ControlWord;
use super::handshake::{self, Hello, Status, Welcome, HELLO_LEN};
use super::hangup::{hung_up, wait_ready};
use crate::auth::protocol::{self, Refusal, ServerHandshake};
use crate::auth::{self, KeyRing};
use crate::error::{fail, ErrorCode, Result};
use crate::shm::send_with_fds;
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most granted connections held at once; past it the process holding the most loses its
/// oldest (its peer then hand-shakes again on its next use).
const MAX_HELD: usize = 4096;

/// Most granted connections one peer process holds; past it its own oldest is closed.
const MAX_HELD_PER_PEER: usize = 64;

/// Most accepted connections whose hello has not arrived yet; past it the process with the
/// most loses its oldest.
const MAX_PENDING: usize = 256;

/// Most of those one peer process has; past it its own oldest is dropped.
const MAX_PENDING_PER_PEER: usize = 32;

/// Most connections accepted before the hellos that arrived are read again.
const ACCEPTS_PER_ROUND: usize = 64;

/// How often the accept thread, idle, closes the granted connections whose peer hung up.
const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// The mount peers may map now.
struct Exported {
    base: u64,
    len: u64,
    epoch: u64,
    file: OwnedFd,
}

/// What the accept thread and the owner's remounts share.
struct State {
    current: Option<Exported>,
    /// Granted connections, oldest first, open until the next retirement or until their
    /// peer closed them (those are closed by the next sweep or grant).
    held: Vec<Held>,
}

/// A granted connection and the process at its other end.
struct Held {
    stream: UnixStream,
    pid: libc::pid_t,
}

/// An accepted connection whose hello is still arriving.
struct Pending {
    stream: UnixStream,
    pid: libc::pid_t,
    deadline: Instant,
    /// The cluster-key handshake still to finish before the hello is read (with a key).
    auth: Option<AuthStep>,
    hello: Vec<u8>,
}

/// Where a pending connection's cluster-key handshake is (driven by the poll loop).
enum AuthStep {
    /// Reading the peer's hello (the bytes so far).
    Hello(Vec<u8>),
    /// The challenge was sent; reading the peer's proof (the bytes so far).
    Proof(Box<ServerHandshake>, Vec<u8>),
}

struct Shared {
    control: ControlWord,
    state: Mutex<State>,
    stopping: AtomicBool,
    timeout: Duration,
    /// The key a peer proves before its hello is read, if any.
    cluster_key: Option<Arc<KeyRing>>,
}

/// The owner's listener. Thread-safety: every method takes `&self`; share it freely. Drop
/// (or [`Exporter::stop`]) closes the listener and every granted connection and joins the
/// thread.
pub(crate) struct Exporter {
    shared: Arc<Shared>,
    addr: std::os::unix::net::SocketAddr,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Exporter {
    /// Listens for segment `endpoint`'s peers; handshakes time out after `timeout`; with
    /// `cluster_key`, a peer proves it (the `auth` handshake, role `same-host`) before its
    /// hello is read, on top of the same-user check.
    ///
    /// Errors: `INTERNAL_ERROR` when the name is in use (another process of this network
    /// namespace serves that endpoint) or too long, or the control file or the thread cannot
    /// be created.
    pub(crate) fn start(
        endpoint: &str,
        timeout: Duration,
        cluster_key: Option<Arc<KeyRing>>,
    ) -> Result<Exporter> {
        let bound = handshake::socket_addr(endpoint).and_then(|a| {
            let listener = UnixListener::bind_addr(&a)?;
            Ok((a, listener))
        });
        let (addr, listener) = match bound {
            Ok(bound) => bound,
            Err(e) => {
                return fail(
                    ErrorCode::InternalError,
                    format!("same-host socket for {endpoint:?}: {e}"),
                )
            }
        };
        let shared = Arc::new(Shared {
            control: ControlWord::create()?,
            state: Mutex::new(State {
                current: None,
                held: Vec::new(),
            }),
            stopping: AtomicBool::new(false),
            timeout,
            cluster_key,
        });
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("mc-same-host".into())
            .spawn(move || accept_loop(&serving, &listener));
        match thread {
            Ok(thread) => Ok(Exporter {
                shared,
                addr,
                thread: Mutex::new(Some(thread)),
            }),
            Err(e) => fail(
                ErrorCode::InternalError,
                format!("cannot start the same-host thread: {e}"),
            ),
        }
    }

    /// Exports the mount `epoch` of the segment `[base, base+len)`, whose pages are `file`
    /// (duplicated here; the caller keeps its own). Call after the transfer engine enforces
    /// `epoch` and before the master hands out descriptors naming it.
    ///
    /// Errors: `INTERNAL_ERROR` when the descriptor cannot be duplicated (nothing exported).
    pub(crate) fn publish(
        &self,
        base: u64,
        len: u64,
        epoch: u64,
        file: BorrowedFd<'_>,
    ) -> Result<()> {
        let file = match file.try_clone_to_owned() {
            Ok(file) => file,
            Err(e) => {
                return fail(
                    ErrorCode::InternalError,
                    format!("cannot duplicate the segment memfd: {e}"),
                )
            }
        };
        let mut state = self.shared.state.lock();
        state.current = Some(Exported {
            base,
            len,
            epoch,
            file,
        });
        self.shared.control.word().store(epoch, Ordering::SeqCst);
        Ok(())
    }

    /// Withdraws the current mount: from now on a peer's copy that has not finished fails
    /// `STALE_SEGMENT_EPOCH` (the control word is 0), new handshakes are refused until the
    /// next [`Exporter::publish`], and every granted connection is closed. Call before the
    /// remount replaces the segment's pages.
    pub(crate) fn retire(&self) {
        let mut state = self.shared.state.lock();
        self.shared.control.word().store(0, Ordering::SeqCst);
        state.current = None;
        for held in state.held.drain(..) {
            let _ = held.stream.shutdown(Shutdown::Both);
        }
    }

    /// Stops listening and closes every connection; peers fall back to TCP. Idempotent.
    pub(crate) fn stop(&self) {
        let Some(thread) = self.thread.lock().take() else {
            return;
        };
        self.retire();
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept call; it sees `stopping` and ends.
        let _ = UnixStream::connect_addr(&self.addr);
        let _ = thread.join();
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(shared: &Shared, listener: &UnixListener) {
    // Non-blocking, so a connection that went away between the wake-up and the accept costs
    // nothing; accepted streams are made non-blocking while their hello arrives.
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::warn!(error = %e, "same-host listener stays blocking: a connection gone before its accept stalls the thread until the next one");
    }
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        let now = Instant::now();
        pending.retain(|p| p.deadline > now);
        let wait = pending
            .iter()
            .map(|p| p.deadline.saturating_duration_since(now))
            .min()
            .map_or(SWEEP_PERIOD, |d| d.min(SWEEP_PERIOD));
        let fds: Vec<_> = std::iter::once(listener.as_raw_fd())
            .chain(pending.iter().map(|p| p.stream.as_raw_fd()))
            .collect();
        let ready = wait_ready(&fds, wait);
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        close_hung_up(&mut shared.state.lock().held);
        // Hellos first (their descriptors are in `ready` by position), then new connections.
        let mut index = 0;
        pending.retain_mut(|p| {
            index += 1;
            !ready[index] || read_hello(shared, p)
        });
        if ready[0] {
            accept_all(shared, listener, &mut pending);
        }
    }
}

/// Accepts up to [`ACCEPTS_PER_ROUND`] connections waiting on `listener` into `pending`
/// (other users' are closed at once), making room per process ([`room_for`]).
fn accept_all(shared: &Shared, listener: &UnixListener, pending: &mut Vec<Pending>) {
    for _ in 0..ACCEPTS_PER_ROUND {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::warn!(error = %e, "same-host accept failed");
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        };
        let pid = match crate::shm::check_peer_user(&stream) {
            Ok(pid) => pid,
            Err(e) => {
                tracing::debug!(error = %e, "same-host handshake refused");
                continue;
            }
        };
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::debug!(error = %e, "same-host handshake dropped");
            continue;
        }
        let pids: Vec<libc::pid_t> = pending.iter().map(|p| p.pid).collect();
        if let Some(victim) = room_for(&pids, pid, MAX_PENDING_PER_PEER, MAX_PENDING) {
            pending.remove(victim);
        }
        pending.push(Pending {
            stream,
            pid,
            deadline: Instant::now() + shared.timeout,
            auth: shared
                .cluster_key
                .as_ref()
                .map(|_| AuthStep::Hello(Vec::new())),
            hello: Vec::with_capacity(HELLO_LEN),
        });
    }
}

/// Reads what arrived of `pending`'s hello; answers it once complete. Returns whether the
/// connection is still waiting for the rest of its hello.
fn read_hello(shared: &Shared, pending: &mut Pending) -> bool {
    if let Some(step) = pending.auth.take() {
        return match advance_auth(shared, &mut pending.stream, step) {
            Ok(next) => {
                pending.auth = next;
                true
            }
            Err(reason) => {
                auth::refusals::refused(reason, auth::ROLE_SAME_HOST, None);
                false
            }
        };
    }
    let mut bytes = [0u8; HELLO_LEN];
    let want = HELLO_LEN - pending.hello.len();
    match pending.stream.read(&mut bytes[..want]) {
        Ok(0) => false,
        Ok(n) => {
            pending.hello.extend_from_slice(&bytes[..n]);
            if pending.hello.len() < HELLO_LEN {
                return true;
            }
            let stream = match pending.stream.try_clone() {
                Ok(stream) => stream,
                Err(_) => return false,
            };
            if let Err(e) = answer(shared, stream, &pending.hello, pending.pid) {
                tracing::debug!(error = %e, "same-host handshake failed");
            }
            false
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
        Err(_) => false,
    }
}

/// Reads what arrived of a pending connection's cluster-key handshake and answers each
/// complete message: the next step, `None` once the peer proved the key (its hello comes
/// next), or why it was refused (the connection is then dropped).
fn advance_auth(
    shared: &Shared,
    stream: &mut UnixStream,
    step: AuthStep,
) -> std::result::Result<Option<AuthStep>, Refusal> {
    let Some(key) = &shared.cluster_key else {
        return Err(Refusal::Incomplete);
    };
    match step {
        AuthStep::Hello(mut got) => {
            if !fill(stream, &mut got, protocol::HELLO_LEN)? {
                let started = got
                    .get(..protocol::MAGIC_LEN)
                    .map(<[u8; protocol::MAGIC_LEN]>::try_from);
                if let Some(Ok(first)) = started {
                    if !protocol::starts_hello(&first) {
                        return Err(Refusal::NoHandshake);
                    }
                }
                return Ok(Some(AuthStep::Hello(got)));
            }
            let hello = <[u8; protocol::HELLO_LEN]>::try_from(got.as_slice())
                .map_err(|_| Refusal::Incomplete)?;
            match ServerHandshake::respond(&key.keys(), auth::ROLE_SAME_HOST, &hello) {
                Ok((handshake, challenge)) => {
                    stream
                        .write_all(&challenge)
                        .map_err(|_| Refusal::Incomplete)?;
                    Ok(Some(AuthStep::Proof(Box::new(handshake), Vec::new())))
                }
                Err((reason, answer)) => {
                    if let Some(answer) = answer {
                        let _ = stream.write_all(&answer);
                    }
                    Err(reason)
                }
            }
        }
        AuthStep::Proof(handshake, mut got) => {
            if !fill(stream, &mut got, protocol::PROOF_LEN)? {
                return Ok(Some(AuthStep::Proof(handshake, got)));
            }
            let proof = <[u8; protocol::PROOF_LEN]>::try_from(got.as_slice())
                .map_err(|_| Refusal::Incomplete)?;
            let (verdict, accepted) = handshake.check(&proof);
            let sent = stream.write_all(&verdict);
            match (accepted, sent) {
                (true, Ok(())) => {
                    auth::refusals::accepted();
                    Ok(None)
                }
                (true, Err(_)) => Err(Refusal::Incomplete),
                (false, _) => Err(Refusal::BadProof),
            }
        }
    }
}

/// Reads (without blocking) what arrived, up to `want` bytes in all, into `got`; whether
/// `got` is complete. A peer that closed is `Incomplete`.
fn fill(
    stream: &mut UnixStream,
    got: &mut Vec<u8>,
    want: usize,
) -> std::result::Result<bool, Refusal> {
    let mut bytes = [0u8; protocol::CHALLENGE_LEN];
    while got.len() < want {
        match stream.read(&mut bytes[..want - got.len()]) {
            Ok(0) => return Err(Refusal::Incomplete),
            Ok(n) => got.extend_from_slice(&bytes[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Refusal::Incomplete),
        }
    }
    Ok(true)
}

/// Closes the connections whose peer went away (dropped its mapping, or died), so the owner
/// holds one per live mapping, not one per handshake ever granted.
fn close_hung_up(held: &mut Vec<Held>) {
    held.retain(|h| !hung_up(h.stream.as_raw_fd()));
}

/// Which entry of `pids` (the processes of a list of connections, oldest first) to drop so
/// that one more of `pid` fits: past `per_peer` of its own, that process's oldest; with
/// `total` in the list, the oldest of the process with the most. `None`: it fits.
fn room_for(
    pids: &[libc::pid_t],
    pid: libc::pid_t,
    per_peer: usize,
    total: usize,
) -> Option<usize> {
    let mut counts: std::collections::HashMap<libc::pid_t, usize> = Default::default();
    for &p in pids {
        *counts.entry(p).or_default() += 1;
    }
    let victim = if counts.get(&pid).copied().unwrap_or(0) >= per_peer {
        pid
    } else if pids.len() >= total {
        counts.iter().max_by_key(|(_, &n)| n).map(|(&p, _)| p)?
    } else {
        return None;
    };
    pids.iter().position(|&p| p == victim)
}

/// Answers the hello `bytes` that arrived on `stream` (from process `pid`); a granted stream
/// is kept in `held`.
fn answer(
    shared: &Shared,
    stream: UnixStream,
    bytes: &[u8],
    pid: libc::pid_t,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(shared.timeout))?;
    let Some(hello) = Hello::decode(bytes) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a same-host hello",
        ));
    };
    let mut state = shared.state.lock();
    let Some(current) = &state.current else {
        let welcome = Welcome {
            status: Status::NothingExported,
            epoch: 0,
            base: 0,
            len: 0,
        };
        return send_with_fds(&stream, &welcome.encode(), &[]);
    };
    let granted = current.epoch == hello.epoch;
    let welcome = Welcome {
        status: if granted {
            Status::Granted
        } else {
            Status::OtherEpoch
        },
        epoch: current.epoch,
        base: current.base,
        len: current.len,
    };
    let Some(control) = shared.control.file() else {
        return Err(std::io::Error::other(
            "the owner's control word has no file",
        ));
    };
    let fds = if granted {
        vec![current.file.as_fd(), control.fd()]
    } else {
        Vec::new()
    };
    send_with_fds(&stream, &welcome.encode(), &fds)?;
    if granted {
        close_hung_up(&mut state.held);
        let pids: Vec<libc::pid_t> = state.held.iter().map(|h| h.pid).collect();
        if let Some(victim) = room_for(&pids, pid, MAX_HELD_PER_PEER, MAX_HELD) {
            state.held.remove(victim);
        }
        state.held.push(Held { stream, pid });
    }
    Ok(())
}
