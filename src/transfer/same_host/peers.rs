//! [`PeerMaps`]: the client side of the same-host channel. Per peer endpoint, either a
//! verified mapping of its segment ([`MappedPeer`]) or a refusal remembered for a retry
//! interval; and [`copy_mapped`], the one copy a mapped request makes.

use super::control::ControlWord;
use super::handshake::{self, Hello, Status, Welcome, WELCOME_LEN};
use super::hangup::hung_up;
use super::locality;
use super::reaper::Reaper;
use crate::auth::{self, KeyRing};
use crate::error::{fail, ErrorCode, Result};
use crate::shm::{recv_with_fds, send_with_fds, PeerMapping};
use crate::transfer::copy::copy_bytes;
use crate::transfer::metrics::{bump, Metrics};
use crate::transfer::transport::Opcode;
use crate::transfer::transport::{Slice, SliceError};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A verified mapping of one mount of a peer's segment.
///
/// Ownership: owns the mappings and the handshake connection (whose closing by the owner —
/// death or retirement — makes the mapping unusable). Thread-safety: immutable but for the
/// `dead` flag; share by `Arc`.
pub(crate) struct MappedPeer {
    epoch: u64,
    /// The owner's address of the segment's first byte, and its length.
    base: u64,
    len: u64,
    segment: PeerMapping,
    control: ControlWord,
    connection: UnixStream,
    /// Set once a copy found the connection closed.
    dead: AtomicBool,
}

/// What one mapped job needs, by value (the engine keeps the [`MappedPeer`] alive by `Arc`
/// until the batch ends, which is what keeps these pointers valid).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MappedTarget {
    /// Our address of the peer's byte `base`.
    mapping: usize,
    base: u64,
    epoch: u64,
    control: *const AtomicU64,
    dead: *const AtomicBool,
    connection: RawFd,
    /// The mapping itself, to ask whether its files lost pages.
    peer: *const MappedPeer,
}

impl MappedPeer {
    /// Whether `[addr, addr+len)` (owner addresses) lies inside the mapped segment.
    fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }

    /// The epoch the owner names now equals ours, no copy saw the connection closed and
    /// neither file lost pages.
    fn usable(&self) -> bool {
        !self.dead.load(Ordering::Relaxed)
            && !self.lost_pages()
            && self.control.word().load(Ordering::SeqCst) == self.epoch
    }

    /// Whether the segment or the control file lost pages under our mappings (a hole the
    /// owner, or another holder, punched and the kernel could not refill; see
    /// `shm::fault_guard`): copies through them may have moved scratch bytes.
    fn lost_pages(&self) -> bool {
        self.segment.lost_pages() || self.control.lost_pages()
    }

    /// The handshake connection (the owner closes it when it dies or retires the mount).
    pub(super) fn connection(&self) -> RawFd {
        self.connection.as_raw_fd()
    }

    /// The job view of this mapping; valid while `self` is.
    pub(crate) fn target(&self) -> MappedTarget {
        MappedTarget {
            mapping: self.segment.addr(),
            base: self.base,
            epoch: self.epoch,
            control: self.control.word(),
            dead: &self.dead,
            connection: self.connection.as_raw_fd(),
            peer: self,
        }
    }
}

enum Entry {
    Mapped(Arc<MappedPeer>),
    /// No mapping until `until` for requests naming `epoch` (whatever the reason: the owner
    /// exports another mount or none, was not reachable, or did not speak the protocol).
    /// Requests naming another epoch — a restarted or remounted owner's — ask again at once.
    Refused {
        until: Instant,
        epoch: u64,
    },
    /// A handshake with the endpoint is in flight (outside the lock); wait on `settled`.
    Handshaking,
}

/// The per-endpoint entries, shared by the callers and the [`Reaper`]. Thread-safety: one
/// mutex, held only to read or change entries (never across a handshake).
pub(super) struct Cache {
    entries: Mutex<HashMap<String, Entry>>,
    /// Notified whenever a handshake's outcome replaces an [`Entry::Handshaking`].
    settled: Condvar,
    metrics: Arc<Metrics>,
}

impl Cache {
    /// Every cached mapping now, with its endpoint.
    pub(super) fn mapped(&self) -> Vec<(String, Arc<MappedPeer>)> {
        self.entries
            .lock()
            .iter()
            .filter_map(|(endpoint, entry)| match entry {
                Entry::Mapped(peer) => Some((endpoint.clone(), Arc::clone(peer))),
                _ => None,
            })
            .collect()
    }

    /// Marks `peer` dead (its owner hung up) and drops `endpoint`'s entry if it still is
    /// `peer` (counted in `same_host_mappings_dropped`); the pages are unmapped once the
    /// last transfer using them ends.
    pub(super) fn forget(&self, endpoint: &str, peer: &Arc<MappedPeer>) {
        peer.dead.store(true, Ordering::Relaxed);
        let mut entries = self.entries.lock();
        if matches!(entries.get(endpoint), Some(Entry::Mapped(cached)) if Arc::ptr_eq(cached, peer))
        {
            entries.remove(endpoint);
            bump(&self.metrics.same_host_mappings_dropped);
        }
    }
}

/// The per-endpoint cache of mappings, and its reaper. Thread-safety: every method takes
/// `&self`; share it freely. Drop stops the reaper.
pub(crate) struct PeerMaps {
    enabled: bool,
    retry: Duration,
    timeout: Duration,
    metrics: Arc<Metrics>,
    cache: Arc<Cache>,
    /// Drops mappings whose owner hung up (none when disabled or when it cannot start).
    reaper: Option<Reaper>,
    /// The key each handshake proves first, if any (owners with a key refuse others).
    cluster_key: Option<Arc<KeyRing>>,
}

impl PeerMaps {
    /// A cache that maps peers only when `enabled` (`MC_SAME_HOST`), remembers a refusal for
    /// `retry` (`MC_SAME_HOST_RETRY_MS`) and bounds a handshake by `timeout`
    /// (`MC_SAME_HOST_HANDSHAKE_MS`: its connect, each socket call, and a second caller's
    /// wait for it).
    pub(crate) fn new(
        enabled: bool,
        retry: Duration,
        timeout: Duration,
        metrics: Arc<Metrics>,
        cluster_key: Option<Arc<KeyRing>>,
    ) -> PeerMaps {
        let cache = Arc::new(Cache {
            entries: Mutex::new(HashMap::new()),
            settled: Condvar::new(),
            metrics: Arc::clone(&metrics),
        });
        let reaper = enabled
            .then(|| {
                Reaper::start(Arc::clone(&cache))
                    .map_err(|_| {
                        tracing::warn!(
                            detail = %crate::error::last_error_message(),
                            "mappings of gone same-host owners stay until their next use"
                        )
                    })
                    .ok()
            })
            .flatten();
        PeerMaps {
            enabled,
            retry,
            timeout,
            metrics,
            cache,
            reaper,
            cluster_key,
        }
    }

    /// The mapping through which a request to `[addr, addr+len)` of `endpoint`'s segment,
    /// mount `epoch`, is served; `None`: use the network. Requests naming no epoch (0) never
    /// take this path: only segment replicas, whose mount the owner can vouch for, do. A
    /// request naming another epoch than a cached mapping its owner still serves uses the
    /// network and leaves the mapping alone; a cached mapping whose owner closed its
    /// connection or retired the mount is dropped and a new handshake made (at most one per
    /// call).
    ///
    /// The handshake runs outside the cache lock, one per endpoint at a time: a caller that
    /// finds one in flight waits for it at most the handshake timeout and then uses the
    /// network, so a peer that never answers delays only requests to that peer, each by at
    /// most the timeout.
    pub(crate) fn lookup(
        &self,
        endpoint: &str,
        epoch: u64,
        addr: u64,
        len: u64,
    ) -> Option<Arc<MappedPeer>> {
        if !self.enabled || epoch == 0 {
            return None;
        }
        let mut entries = self.cache.entries.lock();
        // Read the clock only when there is a handshake to wait for (not on a hit).
        let mut waited_until = None;
        loop {
            match entries.get(endpoint) {
                Some(Entry::Mapped(peer)) if peer.epoch == epoch && peer.usable() => {
                    return peer.covers(addr, len).then(|| Arc::clone(peer));
                }
                // The owner still serves the cached mount: the request names a stale one. The
                // network refuses it (`STALE_SEGMENT_EPOCH`); the mapping stays.
                Some(Entry::Mapped(peer)) if peer.usable() => return None,
                Some(Entry::Mapped(_)) => {
                    bump(&self.metrics.same_host_mappings_dropped);
                    break;
                }
                Some(Entry::Refused {
                    until,
                    epoch: refused,
                }) if Instant::now() < *until && *refused == epoch => {
                    return None;
                }
                Some(Entry::Handshaking) => {
                    let until = *waited_until.get_or_insert_with(|| Instant::now() + self.timeout);
                    if self
                        .cache
                        .settled
                        .wait_until(&mut entries, until)
                        .timed_out()
                    {
                        return None;
                    }
                }
                _ => break,
            }
        }
        entries.insert(endpoint.to_string(), Entry::Handshaking);
        drop(entries);
        let outcome = self.handshake(endpoint, epoch);
        let mut entries = self.cache.entries.lock();
        let found = match outcome {
            Ok(peer) => {
                bump(&self.metrics.same_host_handshakes);
                let peer = Arc::new(peer);
                entries.insert(endpoint.to_string(), Entry::Mapped(Arc::clone(&peer)));
                if let Some(reaper) = &self.reaper {
                    reaper.nudge();
                }
                peer.covers(addr, len).then_some(peer)
            }
            Err(()) => {
                bump(&self.metrics.same_host_refusals);
                tracing::debug!(endpoint, detail = %crate::error::last_error_message(), "same-host mapping refused; using TCP");
                entries.insert(
                    endpoint.to_string(),
                    Entry::Refused {
                        until: Instant::now() + self.retry,
                        epoch,
                    },
                );
                None
            }
        };
        drop(entries);
        self.cache.settled.notify_all();
        found
    }

    /// Drops every mapping (at engine shutdown).
    pub(crate) fn clear(&self) {
        self.cache.entries.lock().clear();
    }

    /// Connects to `endpoint`'s owner and maps its segment if it is the owner of mount
    /// `epoch`. Errors: `Err(())` for every refusal (detail recorded for the thread).
    fn handshake(&self, endpoint: &str, epoch: u64) -> std::result::Result<MappedPeer, ()> {
        if !locality::is_local(endpoint) {
            let _ = fail::<()>(
                ErrorCode::TransferFail,
                format!("{endpoint:?} is not an address of this host: not asked"),
            );
            return Err(());
        }
        let connection = connect(endpoint, self.timeout).map_err(|_| ())?;
        if let Some(key) = &self.cluster_key {
            auth::client_blocking(&mut &connection, key, auth::ROLE_SAME_HOST).map_err(|_| ())?;
        }
        send_with_fds(&connection, &Hello { epoch }.encode(), &[])
            .or_else(|e| fail(ErrorCode::TransferFail, format!("same-host hello: {e}")))
            .map_err(|_| ())?;
        let mut bytes = [0u8; WELCOME_LEN];
        let (n, fds) = recv_with_fds(&connection, &mut bytes)
            .or_else(|e| fail(ErrorCode::TransferFail, format!("same-host welcome: {e}")))
            .map_err(|_| ())?;
        let Some(welcome) = Welcome::decode(&bytes[..n]) else {
            let _ = fail::<()>(
                ErrorCode::TransferFail,
                format!("{n} bytes are not a welcome"),
            );
            return Err(());
        };
        let refused = |detail: String| {
            let _ = fail::<()>(ErrorCode::TransferFail, detail);
        };
        match welcome.status {
            Status::Granted if welcome.epoch == epoch && fds.len() == 2 => {}
            // A remount in progress exports nothing for a moment; the next mount's epoch may
            // be granted at once.
            Status::OtherEpoch | Status::NothingExported => {
                refused(format!(
                    "the owner's mount is {:#x} ({:?}), not {epoch:#x}",
                    welcome.epoch, welcome.status
                ));
                return Err(());
            }
            status => {
                refused(format!(
                    "{status:?} (epoch {:#x}) with {} descriptors",
                    welcome.epoch,
                    fds.len()
                ));
                return Err(());
            }
        }
        let mapped = usize::try_from(welcome.len)
            .or_else(|_| fail(ErrorCode::TransferFail, "segment too large"))
            .and_then(|len| PeerMapping::map(fds[0].as_fd(), 0, len))
            .and_then(|segment| Ok((segment, ControlWord::map(fds[1].as_fd())?)));
        let (segment, control) = mapped.map_err(|_| ())?;
        prefault(&segment);
        if control.word().load(Ordering::SeqCst) != epoch {
            refused("the owner retired the mount during the handshake".into());
            return Err(());
        }
        Ok(MappedPeer {
            epoch,
            base: welcome.base,
            len: welcome.len,
            segment,
            control,
            connection,
            dead: AtomicBool::new(false),
        })
    }
}

/// Fills the page tables of a new mapping once, so the first copies into it do not take a
/// fault per page on first touch. Advisory: failure only costs speed.
fn prefault(mapping: &PeerMapping) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: advice on our own mapping of a sealed file long enough for it.
    unsafe {
        libc::madvise(
            mapping.addr() as *mut libc::c_void,
            mapping.len(),
            libc::MADV_HUGEPAGE,
        );
        libc::madvise(
            mapping.addr() as *mut libc::c_void,
            mapping.len(),
            MADV_POPULATE_WRITE,
        );
    }
}

/// A connected socket to `endpoint`'s owner, with `timeout` on every call. The connect does
/// not wait: a full listen queue (an owner that stopped accepting) is a refusal at once.
fn connect(endpoint: &str, timeout: Duration) -> Result<UnixStream> {
    let connected = connect_now(&handshake::socket_name(endpoint)).and_then(|stream| {
        crate::shm::check_peer_user(&stream)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(stream)
    });
    connected.or_else(|e| {
        fail(
            ErrorCode::TransferFail,
            format!("same-host connect to {endpoint:?}: {e}"),
        )
    })
}

/// A blocking stream connected to the abstract Unix socket `name`, by a non-blocking connect
/// (which on a Unix socket either completes or fails `EAGAIN` when the listen queue is full).
fn connect_now(name: &str) -> std::io::Result<UnixStream> {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // Abstract: sun_path[0] stays NUL, the name follows (no terminator).
    if name.len() + 1 > addr.sun_path.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "socket name too long",
        ));
    }
    for (slot, byte) in addr.sun_path[1..].iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    let addr_len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: plain socket creation; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own from here on.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: a valid address of `addr_len` bytes for a socket we own.
    let rc = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            addr_len as libc::socklen_t,
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EAGAIN) {
            std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "the owner's listen queue is full (it does not accept)",
            )
        } else {
            err
        });
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The most bytes a mapped copy moves between two checks of its deadline and of the owner's
/// control word.
pub(crate) const CHUNK: usize = 2 << 20;

/// One copy between `slice.local` and the peer's `slice.remote` through `target`, in chunks
/// of [`CHUNK`] bytes: refused unless the owner's control word names the slice's epoch
/// before the copy, and failed `STALE_SEGMENT_EPOCH` if it no longer does before a later
/// chunk or after the last (a read that overlapped a remount returns no bytes of either
/// mount as valid); failed `STALE_WRITE_TOKEN` (`late_sends_refused`) when `send_by` (the
/// executor checked it before the first chunk) has passed before a later chunk, leaving the
/// range partly written — the caller's write then fails and is never committed; failed
/// `TRANSFER_FAIL` (unreachable) when the owner closed the connection by the end of the
/// copy; failed `TRANSFER_FAIL` (`lost_page_copies`) when the segment or the control file lost
/// pages before or during the copy. Returns the bytes copied.
///
/// # Safety
/// `target` comes from a [`MappedPeer`] that is alive for the whole call and covers
/// `[slice.remote, slice.remote + slice.len)`; the local range is valid for the operation.
pub(crate) unsafe fn copy_mapped(
    metrics: &Metrics,
    target: &MappedTarget,
    slice: &Slice,
    send_by: Option<Instant>,
) -> std::result::Result<u64, SliceError> {
    // SAFETY: the caller keeps the MappedPeer (and so these) alive.
    let (control, dead, peer_map) = unsafe { (&*target.control, &*target.dead, &*target.peer) };
    let lost = || {
        bump(&metrics.lost_page_copies);
        dead.store(true, Ordering::Relaxed);
        SliceError {
            code: ErrorCode::TransferFail,
            message: format!(
                "{:?} of {} bytes at {:#x}: the peer's segment lost pages under our mapping (a \
                 hole punched in its file the kernel could not refill)",
                slice.op, slice.len, slice.remote
            ),
            unreachable: false,
        }
    };
    if peer_map.lost_pages() {
        return Err(lost());
    }
    let stale = |when: &str| {
        bump(&metrics.stale_epoch_rejections);
        bump(&metrics.same_host_stale);
        SliceError {
            code: ErrorCode::StaleSegmentEpoch,
            message: format!(
                "{:?} of {} bytes at {:#x}: the owner retired segment epoch {:#x} {when}",
                slice.op, slice.len, slice.remote, target.epoch
            ),
            unreachable: false,
        }
    };
    if control.load(Ordering::SeqCst) != target.epoch {
        return Err(stale("before the copy"));
    }
    // In range: the caller guarantees `covers`.
    let peer = (target.mapping + (slice.remote - target.base) as usize) as *mut u8;
    let mut done = 0;
    while done < slice.len {
        if done > 0 {
            if send_by.is_some_and(|by| Instant::now() >= by) {
                bump(&metrics.late_sends_refused);
                return Err(SliceError {
                    code: ErrorCode::StaleWriteToken,
                    message: format!(
                        "{:?} of {} bytes at {:#x} stopped after {done} bytes: its writer's \
                         grant ended",
                        slice.op, slice.len, slice.remote
                    ),
                    unreachable: false,
                });
            }
            if control.load(Ordering::SeqCst) != target.epoch {
                return Err(stale("during the copy"));
            }
        }
        let n = CHUNK.min(slice.len - done);
        // SAFETY: the peer range is inside our mapping (never faults: the file is sealed
        // against shrinking); the local range is the caller's; `done + n <= len`.
        let copied = unsafe {
            let (local, remote) = (slice.local.add(done), peer.add(done));
            match slice.op {
                Opcode::Read => copy_bytes(local, remote, n),
                Opcode::Write => copy_bytes(remote, local, n),
            }
        };
        copied.map_err(SliceError::from)?;
        done += n;
    }
    // Order the copy's loads and stores before the re-check (seqlock).
    std::sync::atomic::fence(Ordering::SeqCst);
    if control.load(Ordering::SeqCst) != target.epoch {
        return Err(stale("during the copy"));
    }
    // A fault in either file during the copy was recovered on scratch pages: fail it.
    if peer_map.lost_pages() {
        return Err(lost());
    }
    if hung_up(target.connection) {
        dead.store(true, Ordering::Relaxed);
        return Err(SliceError {
            code: ErrorCode::TransferFail,
            message: format!(
                "{:?} of {} bytes at {:#x}: the segment's owner is gone",
                slice.op, slice.len, slice.remote
            ),
            unreachable: true,
        });
    }
    Ok(slice.len as u64)
}
