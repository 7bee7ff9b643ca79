//! [`SealedMemfd`]: an anonymous shared-memory file of fixed size that cannot shrink or grow.

use crate::error::{fail, ErrorCode, Result};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The seals every shared file carries before it is handed to another process.
pub(super) const REQUIRED_SEALS: libc::c_int =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A memfd of exactly `len` bytes (zero-filled), sealed so its size never changes: a peer
/// that maps it can never see SIGBUS because the owner truncated it.
///
/// Ownership: owns the descriptor (close-on-exec); the pages live as long as this value or any
/// mapping of it in any process. Thread-safety: the value is immutable; share it freely.
#[derive(Debug)]
pub struct SealedMemfd {
    fd: OwnedFd,
    len: usize,
}

impl SealedMemfd {
    /// Creates the file; `name` shows in `/proc/<pid>/maps` and `fd/` links (debugging only).
    ///
    /// Errors: `INVALID_PARAMS` for `len == 0` or a name with a NUL byte; `INTERNAL_ERROR` when
    /// the kernel refuses the file, its size or its seals (the message has the errno).
    pub fn create(name: &str, len: usize) -> Result<SealedMemfd> {
        if len == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "a shared memory file needs len > 0",
            );
        }
        let Ok(cname) = CString::new(name) else {
            return fail(
                ErrorCode::InvalidParams,
                format!("memfd name {name:?} has a NUL"),
            );
        };
        // SAFETY: a valid C string; flags are constants; the result is checked.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return os_fail("memfd_create");
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let Ok(size) = libc::off_t::try_from(len) else {
            return fail(
                ErrorCode::InvalidParams,
                format!("{len} bytes is too large a file"),
            );
        };
        // SAFETY: plain syscalls on our own descriptor; results checked.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), size) != 0 {
                return os_fail("ftruncate of a memfd");
            }
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, REQUIRED_SEALS) != 0 {
                return os_fail("sealing a memfd");
            }
        }
        Ok(SealedMemfd { fd, len })
    }

    /// The descriptor, to map it here or send it to a peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Its fixed size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: files have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `INTERNAL_ERROR` naming `what` and the current errno.
pub(super) fn os_fail<T>(what: &str) -> Result<T> {
    fail(
        ErrorCode::InternalError,
        format!("{what} failed: {}", std::io::Error::last_os_error()),
    )
}
