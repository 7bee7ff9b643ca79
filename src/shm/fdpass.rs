//! Passing file descriptors between processes over a Unix socket (`SCM_RIGHTS`).
//!
//! On a stream socket the descriptors travel with the first byte of the message they were
//! sent with, and the kernel drops descriptors attached to bytes read by a plain `read`: a
//! socket that may carry descriptors must be read with [`recv_with_fds`] only.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message may carry (both directions).
pub(super) const MAX_FDS_PER_MESSAGE: usize = 16;

/// Room for the control message of [`MAX_FDS_PER_MESSAGE`] descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct ControlBuffer([u8; 128]);

fn control_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// Sends all of `bytes` on `socket`, with `fds` (at most [`MAX_FDS_PER_MESSAGE`]) attached to
/// the first byte. Blocks until sent (or the socket's send timeout). `bytes` must not be empty
/// when `fds` is not (descriptors need a byte to travel with).
///
/// Errors: `InvalidInput` for too many descriptors or descriptors without bytes; the socket's
/// error otherwise (`EPIPE` when the peer closed: no SIGPIPE is raised).
pub(crate) fn send_with_fds(
    socket: impl AsFd,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    if fds.len() > MAX_FDS_PER_MESSAGE || (bytes.is_empty() && !fds.is_empty()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors with {} bytes: at most {MAX_FDS_PER_MESSAGE}, and only with bytes",
                fds.len(),
                bytes.len()
            ),
        ));
    }
    let socket = socket.as_fd();
    let mut sent = send_once(socket, bytes, fds)?;
    while sent < bytes.len() {
        sent += send_once(socket, &bytes[sent..], &[])?;
    }
    Ok(())
}

/// One `sendmsg` (retried on EINTR); returns the bytes the kernel took.
fn send_once(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let mut control = ControlBuffer([0; 128]);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let space = control_space(fds.len());
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is aligned and at least `space` bytes (≤ 128 for 16 fds);
        // CMSG_FIRSTHDR returns its start, CMSG_DATA the payload inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len =
                libc::CMSG_LEN((fds.len() * std::mem::size_of::<RawFd>()) as u32) as _;
            let data = libc::CMSG_DATA(header).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `msg` is fully initialised above and its buffers are alive.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Receives up to `buf.len()` bytes from `socket` (one `recvmsg`, retried on EINTR) and the
/// descriptors that came with them (close-on-exec, owned by the caller). `Ok((0, _))` is the
/// peer's orderly close.
///
/// Errors: the socket's error; `InvalidData` when the sender attached more than
/// [`MAX_FDS_PER_MESSAGE`] descriptors (what did arrive is closed).
pub(crate) fn recv_with_fds(
    socket: impl AsFd,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let socket = socket.as_fd();
    let mut control = ControlBuffer([0; 128]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control_space(MAX_FDS_PER_MESSAGE) as _;
    let n = loop {
        // SAFETY: `msg` points at live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let fds = take_fds(&msg);
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        drop(fds);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the peer sent more than {MAX_FDS_PER_MESSAGE} descriptors in one message"),
        ));
    }
    Ok((n, fds))
}

/// Takes ownership of every descriptor in `msg`'s `SCM_RIGHTS` control messages.
fn take_fds(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    // SAFETY: walking the control buffer recvmsg filled, with the kernel's own lengths.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            header = libc::CMSG_NXTHDR(msg, header);
        }
    }
    fds
}

/// Checks that the process at the other end of the Unix socket `socket` runs as our effective
/// user (`SO_PEERCRED`). Abstract socket names carry no permissions: without this, a process of
/// another user could bind a name we connect to (or connect to a name we serve) and trade
/// memory with us.
///
/// Returns the peer's process id (as the kernel recorded it at connect time).
///
/// Errors: `PermissionDenied` naming both user ids; the `getsockopt` error otherwise.
pub(crate) fn check_peer_user(socket: impl AsFd) -> io::Result<libc::pid_t> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid out buffer of `len` bytes for SO_PEERCRED on a borrowed socket.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: geteuid has no preconditions.
    let ours = unsafe { libc::geteuid() };
    if cred.uid != ours {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the process at the other end (pid {}) runs as uid {}, we run as uid {ours}",
                cred.pid, cred.uid
            ),
        ));
    }
    Ok(cred.pid)
}
