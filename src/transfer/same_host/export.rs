//! [`Exporter`]: the owner side of the same-host channel. A thread accepts connections on the
//! owner's abstract Unix socket and answers each handshake; a granted connection is kept open
//! (its closing tells the peer that the owner died or retired the mount) until the next
//! retirement, or until the peer closes it (noticed within [`SWEEP_PERIOD`], or at the next
//! grant).

use super::control::ControlWord;
use super::handshake::{self, Hello, Status, Welcome, HELLO_LEN};
use super::hangup::{hung_up, wait_readable};
use crate::error::{fail, ErrorCode, Result};
use crate::shm::send_with_fds;
use parking_lot::Mutex;
use std::io::Read;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Most granted connections held at once; past it the oldest is closed (its peer then
/// handshakes again on its next use).
const MAX_HELD: usize = 4096;

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
    /// Granted connections, open until the next retirement or until their peer closed them
    /// (those are closed by the next sweep or grant).
    held: Vec<UnixStream>,
}

struct Shared {
    control: ControlWord,
    state: Mutex<State>,
    stopping: AtomicBool,
    timeout: Duration,
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
    /// Listens for segment `endpoint`'s peers; handshakes time out after `timeout`.
    ///
    /// Errors: `INTERNAL_ERROR` when the name is in use (another process of this network
    /// namespace serves that endpoint) or too long, or the control file or the thread cannot
    /// be created.
    pub(crate) fn start(endpoint: &str, timeout: Duration) -> Result<Exporter> {
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
        for stream in state.held.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
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
    // nothing; accepted streams are blocking (accept4 does not pass the flag on).
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::warn!(error = %e, "same-host listener stays blocking: a connection gone before its accept stalls the thread until the next one");
    }
    loop {
        let ready = wait_readable(listener.as_raw_fd(), SWEEP_PERIOD);
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        close_hung_up(&mut shared.state.lock().held);
        if !ready {
            continue;
        }
        match listener.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Ok((stream, _)) => {
                if let Err(e) = answer(shared, stream) {
                    tracing::debug!(error = %e, "same-host handshake failed");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "same-host accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Closes the connections whose peer went away (dropped its mapping, or died), so the owner
/// holds one per live mapping, not one per handshake ever granted.
fn close_hung_up(held: &mut Vec<UnixStream>) {
    held.retain(|stream| !hung_up(stream.as_raw_fd()));
}

/// Reads one hello from `stream` and answers it; a granted stream is kept in `held`.
fn answer(shared: &Shared, mut stream: UnixStream) -> std::io::Result<()> {
    crate::shm::check_peer_user(&stream)?;
    stream.set_read_timeout(Some(shared.timeout))?;
    stream.set_write_timeout(Some(shared.timeout))?;
    let mut bytes = [0u8; HELLO_LEN];
    stream.read_exact(&mut bytes)?;
    let Some(hello) = Hello::decode(&bytes) else {
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
        if state.held.len() >= MAX_HELD {
            state.held.remove(0);
        }
        state.held.push(stream);
    }
    Ok(())
}
