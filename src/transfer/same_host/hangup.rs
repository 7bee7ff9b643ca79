//! Noticing that the other end of a same-host connection hung up, without reading from it:
//! [`hung_up`] asks once, [`wait_for_hangups`] waits for any of several connections (or a
//! wake-up); and [`wait_ready`], the owner's bounded wait for a connection to accept or a
//! handshake's next bytes.

use std::os::fd::RawFd;
use std::time::Duration;

/// The poll events that mean the other end closed or shut down the connection.
const HANGUP: libc::c_short = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;

/// Whether the other end of the connection `fd` (open, kept open by the caller) closed it.
/// Also used by a dummy's link for its idle connections to the real client.
pub(crate) fn hung_up(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor the caller keeps open; zero timeout.
    let n = unsafe { libc::poll(&mut poll, 1, 0) };
    n > 0 && poll.revents & HANGUP != 0
}

/// Waits at most `timeout` until one of `fds` (kept open by the caller: a listener with a
/// connection to accept, or a connection with bytes to read or a hang-up) is ready. Returns,
/// per descriptor, whether it is. All false on a timeout or a failed poll; a failed poll costs
/// a 10 ms pause first, so a caller's loop never spins.
pub(super) fn wait_ready(fds: &[RawFd], timeout: Duration) -> Vec<bool> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    let timeout_ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `polls` holds valid pollfds of descriptors the caller keeps open.
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    polls.iter().map(|p| n > 0 && p.revents != 0).collect()
}

/// Waits at most `timeout` until one of `connections` (kept open by the caller) hangs up or
/// `wake` (an eventfd) becomes readable; drains `wake`. Returns, per connection, whether it
/// hung up (all false on a wake-up, a timeout or a failed poll).
pub(super) fn wait_for_hangups(connections: &[RawFd], wake: RawFd, timeout: Duration) -> Vec<bool> {
    let mut polls: Vec<libc::pollfd> = std::iter::once((wake, libc::POLLIN))
        .chain(connections.iter().map(|&fd| (fd, libc::POLLRDHUP)))
        .map(|(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    let timeout_ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `polls` holds valid pollfds of descriptors the caller keeps open.
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout_ms) };
    if n <= 0 {
        return vec![false; connections.len()];
    }
    if polls[0].revents & libc::POLLIN != 0 {
        let mut count = 0u64;
        // SAFETY: an 8-byte read from an eventfd into a u64 we own.
        unsafe { libc::read(wake, (&mut count as *mut u64).cast(), 8) };
    }
    polls[1..]
        .iter()
        .map(|poll| poll.revents & HANGUP != 0)
        .collect()
}
