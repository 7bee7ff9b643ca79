//! Socket operations the TCP transport needs beyond `std` and tokio: abortive close and
//! `recv` / `sendmsg` on raw addresses, so that registered memory (which other connections
//! and local copies touch concurrently) is never viewed as a Rust slice.

use crate::transfer::gather::{Cursor, MAX_IOV};
use std::io;
use std::os::fd::RawFd;

/// A byte range by address. Plain integers, so it may name memory that others write
/// concurrently and may be held across `.await` (it is `Send`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPart {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

/// Makes the next close of `fd` abortive (`SO_LINGER` on, 0 s): the kernel discards what
/// is still queued for sending and answers the peer with RST, so no queued payload is
/// delivered after the close. Call it right before dropping a connection that failed or
/// timed out.
///
/// Errors: the `setsockopt` failure (the connection then closes gracefully).
pub(crate) fn set_abortive_close(fd: RawFd) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` is a valid `struct linger` for the duration of the call and the
    // length passed is its size; a bad `fd` only makes the call fail.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether a connection kept idle can no longer carry a request: the peer closed it (EOF
/// queued), reset it, or sent something unasked for. One non-blocking `MSG_PEEK`; nothing is
/// consumed.
pub(crate) fn idle_connection_dead(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: `byte` is valid for a one-byte write for the duration of the call.
    let n = unsafe {
        libc::recv(
            fd,
            std::ptr::addr_of_mut!(byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        );
    }
    true
}

/// One non-blocking `recv` of at most `len` bytes straight into `addr`; `Ok(0)` when the
/// peer closed the connection.
///
/// # Safety
/// `[addr, addr + len)` must be valid for writes for the duration of the call. The kernel
/// writes it; no Rust reference to it is formed.
pub(crate) unsafe fn recv_into(fd: RawFd, addr: usize, len: usize) -> io::Result<usize> {
    // SAFETY: forwarded from the caller.
    let n = unsafe { libc::recv(fd, addr as *mut libc::c_void, len, libc::MSG_DONTWAIT) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// One non-blocking gathered send of `parts[cursor..]` (at most [`MAX_IOV`] parts), without
/// `SIGPIPE` (the library may live in a process that does not ignore it). Returns the bytes
/// sent.
///
/// # Safety
/// Every part from the cursor on must be valid for reads for the duration of the call. The
/// kernel reads them; no Rust reference to them is formed.
pub(crate) unsafe fn send_parts(fd: RawFd, parts: &[RawPart], cursor: Cursor) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = parts
        .get(cursor.part..)
        .unwrap_or_default()
        .iter()
        .take(MAX_IOV)
        .enumerate()
        .map(|(i, part)| {
            let skip = if i == 0 { cursor.offset } else { 0 };
            libc::iovec {
                iov_base: (part.addr + skip) as *mut libc::c_void,
                iov_len: part.len - skip,
            }
        })
        .collect();
    // SAFETY: an all-zero `msghdr` is valid (no name, no control data).
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iov.as_mut_ptr();
    message.msg_iovlen = iov.len() as _;
    // SAFETY: `iov` outlives the call; the parts are readable (forwarded from the caller).
    let n = unsafe { libc::sendmsg(fd, &message, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}
