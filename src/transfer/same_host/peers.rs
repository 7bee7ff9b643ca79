//! [`PeerMaps`]: the client side of the same-host channel. Per peer endpoint, either a
//! verified mapping of its segment ([`MappedPeer`]) or a refusal remembered for a retry
//! interval; and [`copy_mapped`], the one copy a mapped request makes.

use super::control::ControlWord;
use super::handshake::{self, Hello, Status, Welcome, WELCOME_LEN};
use crate::error::{fail, ErrorCode, Result};
use crate::shm::{recv_with_fds, send_with_fds, PeerMapping};
use crate::transfer::copy::copy_bytes;
use crate::transfer::metrics::{bump, Metrics};
use crate::transfer::pool::{Slice, SliceError};
use crate::transfer::wire::Opcode;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
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
}

impl MappedPeer {
    /// Whether `[addr, addr+len)` (owner addresses) lies inside the mapped segment.
    fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && len <= self.len && addr - self.base <= self.len - len
    }

    /// The epoch the owner names now equals ours and no copy saw the connection closed.
    fn usable(&self) -> bool {
        !self.dead.load(Ordering::Relaxed)
            && self.control.word().load(Ordering::SeqCst) == self.epoch
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
        }
    }
}

enum Entry {
    Mapped(Arc<MappedPeer>),
    /// No mapping until `until`; `epoch`: only requests naming this epoch (the owner answered
    /// but exports another mount or none), `None`: every request (the owner was not
    /// reachable or did not speak the protocol).
    Refused {
        until: Instant,
        epoch: Option<u64>,
    },
}

/// The per-endpoint cache. Thread-safety: one mutex, held for a lookup and for a handshake
/// (bounded by the handshake timeout); share it freely.
pub(crate) struct PeerMaps {
    enabled: bool,
    retry: Duration,
    timeout: Duration,
    metrics: Arc<Metrics>,
    entries: Mutex<HashMap<String, Entry>>,
}

impl PeerMaps {
    /// A cache that maps peers only when `enabled` (`MC_SAME_HOST`), remembers a refusal for
    /// `retry` (`MC_SAME_HOST_RETRY_MS`) and gives a handshake `timeout` per socket call.
    pub(crate) fn new(
        enabled: bool,
        retry: Duration,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> PeerMaps {
        PeerMaps {
            enabled,
            retry,
            timeout,
            metrics,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The mapping through which a request to `[addr, addr+len)` of `endpoint`'s segment,
    /// mount `epoch`, is served; `None`: use the network. Requests naming no epoch (0) never
    /// take this path: only segment replicas, whose mount the owner can vouch for, do. A
    /// cached mapping of another epoch, or whose owner closed its connection or retired the
    /// mount, is dropped and a new handshake made (at most one per call).
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
        let mut entries = self.entries.lock();
        let now = Instant::now();
        match entries.get(endpoint) {
            Some(Entry::Mapped(peer)) if peer.epoch == epoch && peer.usable() => {
                return peer.covers(addr, len).then(|| Arc::clone(peer));
            }
            Some(Entry::Mapped(_)) => {
                bump(&self.metrics.same_host_mappings_dropped);
            }
            Some(Entry::Refused {
                until,
                epoch: refused,
            }) if now < *until && refused.map_or(true, |e| e == epoch) => {
                return None;
            }
            _ => {}
        }
        match self.handshake(endpoint, epoch) {
            Ok(peer) => {
                bump(&self.metrics.same_host_handshakes);
                let peer = Arc::new(peer);
                entries.insert(endpoint.to_string(), Entry::Mapped(Arc::clone(&peer)));
                peer.covers(addr, len).then_some(peer)
            }
            Err(other_epoch) => {
                bump(&self.metrics.same_host_refusals);
                tracing::debug!(endpoint, detail = %crate::error::last_error_message(), "same-host mapping refused; using TCP");
                entries.insert(
                    endpoint.to_string(),
                    Entry::Refused {
                        until: now + self.retry,
                        epoch: other_epoch,
                    },
                );
                None
            }
        }
    }

    /// Drops every mapping (at engine shutdown).
    pub(crate) fn clear(&self) {
        self.entries.lock().clear();
    }

    /// Connects to `endpoint`'s owner and maps its segment if it is the owner of mount
    /// `epoch`. Errors: `Err(Some(epoch))` when the owner answered that it exports another
    /// mount or none, `Err(None)` otherwise (detail recorded for the thread).
    fn handshake(
        &self,
        endpoint: &str,
        epoch: u64,
    ) -> std::result::Result<MappedPeer, Option<u64>> {
        let connection = connect(endpoint, self.timeout).map_err(|_| None)?;
        send_with_fds(&connection, &Hello { epoch }.encode(), &[])
            .or_else(|e| fail(ErrorCode::TransferFail, format!("same-host hello: {e}")))
            .map_err(|_| None)?;
        let mut bytes = [0u8; WELCOME_LEN];
        let (n, fds) = recv_with_fds(&connection, &mut bytes)
            .or_else(|e| fail(ErrorCode::TransferFail, format!("same-host welcome: {e}")))
            .map_err(|_| None)?;
        let Some(welcome) = Welcome::decode(&bytes[..n]) else {
            let _ = fail::<()>(
                ErrorCode::TransferFail,
                format!("{n} bytes are not a welcome"),
            );
            return Err(None);
        };
        let refused = |detail: String| {
            let _ = fail::<()>(ErrorCode::TransferFail, detail);
        };
        match welcome.status {
            Status::Granted if welcome.epoch == epoch && fds.len() == 2 => {}
            // The owner speaks the protocol: only this epoch is refused (a remount in progress
            // exports nothing for a moment; the next mount's epoch may be granted at once).
            Status::OtherEpoch | Status::NothingExported => {
                refused(format!(
                    "the owner's mount is {:#x} ({:?}), not {epoch:#x}",
                    welcome.epoch, welcome.status
                ));
                return Err(Some(epoch));
            }
            status => {
                refused(format!(
                    "{status:?} (epoch {:#x}) with {} descriptors",
                    welcome.epoch,
                    fds.len()
                ));
                return Err(None);
            }
        }
        let mapped = usize::try_from(welcome.len)
            .or_else(|_| fail(ErrorCode::TransferFail, "segment too large"))
            .and_then(|len| PeerMapping::map(fds[0].as_fd(), 0, len))
            .and_then(|segment| Ok((segment, ControlWord::map(fds[1].as_fd())?)));
        let (segment, control) = mapped.map_err(|_| None)?;
        prefault(&segment);
        if control.word().load(Ordering::SeqCst) != epoch {
            refused("the owner retired the mount during the handshake".into());
            return Err(None);
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

/// A connected socket to `endpoint`'s owner, with `timeout` on every call.
fn connect(endpoint: &str, timeout: Duration) -> Result<UnixStream> {
    let connected = handshake::socket_addr(endpoint)
        .and_then(|addr| UnixStream::connect_addr(&addr))
        .and_then(|stream| {
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

/// One copy between `slice.local` and the peer's `slice.remote` through `target`: refused
/// unless the owner's control word names the slice's epoch before the copy, and failed
/// `STALE_SEGMENT_EPOCH` if it no longer does after it (a read that overlapped a remount
/// returns no bytes of either mount as valid); failed `TRANSFER_FAIL` (unreachable) when
/// the owner closed the connection by the end of the copy. Returns the bytes copied.
///
/// # Safety
/// `target` comes from a [`MappedPeer`] that is alive for the whole call and covers
/// `[slice.remote, slice.remote + slice.len)`; the local range is valid for the operation.
pub(crate) unsafe fn copy_mapped(
    metrics: &Metrics,
    target: &MappedTarget,
    slice: &Slice,
) -> std::result::Result<u64, SliceError> {
    // SAFETY: the caller keeps the MappedPeer (and so these) alive.
    let (control, dead) = unsafe { (&*target.control, &*target.dead) };
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
    // SAFETY: the peer range is inside our mapping (never faults: the file is sealed against
    // shrinking); the local range is the caller's.
    let copied = unsafe {
        match slice.op {
            Opcode::Read => copy_bytes(slice.local, peer, slice.len),
            Opcode::Write => copy_bytes(peer, slice.local, slice.len),
        }
    };
    copied.map_err(SliceError::from)?;
    // Order the copy's loads and stores before the re-check (seqlock).
    std::sync::atomic::fence(Ordering::SeqCst);
    if control.load(Ordering::SeqCst) != target.epoch {
        return Err(stale("during the copy"));
    }
    if connection_closed(target.connection) {
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

/// Whether the owner closed (or shut down) the handshake connection `fd`.
fn connection_closed(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor the caller keeps open; zero timeout.
    let n = unsafe { libc::poll(&mut poll, 1, 0) };
    n > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}
