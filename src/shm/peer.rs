//! [`PeerMapping`]: this process's mapping of a shared file another process sent it.

use super::fault_guard::GuardedRange;
use super::memfd::{os_fail, REQUIRED_SEALS};
use crate::error::{fail, ErrorCode, Result};
use std::os::fd::{AsRawFd, BorrowedFd};

/// A read-write `MAP_SHARED` mapping of `len` bytes at `offset` of a sealed shared file,
/// guarded against SIGBUS (see `fault_guard`): a copy that touched it must check
/// [`PeerMapping::lost_pages`] afterwards and fail if it is set.
///
/// Ownership: owns the mapping (unmapped on drop) and its guard registration (released
/// first); the descriptor it was made from may be closed right after [`PeerMapping::map`]. The
/// bytes are shared with the file's owner and every other mapper: whoever hands out ranges of
/// it coordinates access. Thread-safety: the value only exposes the address range; it is
/// `Send` and `Sync`.
#[derive(Debug)]
pub(crate) struct PeerMapping {
    base: *mut u8,
    len: usize,
    /// `Some` until drop, which releases it before unmapping.
    guard: Option<GuardedRange>,
}

// SAFETY: the mapping is plain memory owned by this value; it has no thread affinity.
unsafe impl Send for PeerMapping {}
// SAFETY: shared access only exposes the address; byte access goes through raw pointers whose
// coordination is the users' (see the type's doc).
unsafe impl Sync for PeerMapping {}

impl PeerMapping {
    /// Maps `len` bytes of `fd` from `offset` (page-aligned). The file must carry the shrink
    /// seal and reach `offset + len`, so no access to the mapping can fault for truncation; a
    /// hole punched in it later is recovered by the guard.
    ///
    /// Errors: `INVALID_PARAMS` for `len == 0`, an unaligned offset, a file that is not sealed
    /// against shrinking (or not a memfd at all) or is too short; `INTERNAL_ERROR` when the
    /// kernel refuses the mapping or the guard cannot register it.
    pub(crate) fn map(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<PeerMapping> {
        if len == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "cannot map 0 bytes of a peer's file",
            );
        }
        if !offset.is_multiple_of(page_size()) {
            return fail(
                ErrorCode::InvalidParams,
                format!("offset {offset} of a peer's file is not page-aligned"),
            );
        }
        // SAFETY: F_GET_SEALS on a descriptor we borrow; the result is checked.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "a peer's file is not sealed against shrinking (seals {seals:#x}, need \
                     {REQUIRED_SEALS:#x}): mapping it could fault"
                ),
            );
        }
        // Only ordinary shared memory: pages of a hugetlb file (also sealable) can be missing at
        // access time, which is a SIGBUS, not an allocation.
        // SAFETY: `statfs` is plain data; fstatfs fills it or fails (checked).
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a borrowed, open descriptor and a valid out pointer.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } != 0 {
            return os_fail("fstatfs of a peer's file");
        }
        if fs.f_type != libc::TMPFS_MAGIC {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "a peer's file is not ordinary shared memory (file system {:#x}): mapping it \
                     could fault",
                    fs.f_type
                ),
            );
        }
        let file_len = file_size(fd)?;
        let Some(end) = offset.checked_add(len as u64) else {
            return fail(ErrorCode::InvalidParams, "offset + len overflows");
        };
        if end > file_len {
            return fail(
                ErrorCode::InvalidParams,
                format!("a peer's file has {file_len} bytes, the mapping needs {end}"),
            );
        }
        let Ok(off) = libc::off_t::try_from(offset) else {
            return fail(
                ErrorCode::InvalidParams,
                format!("offset {offset} too large"),
            );
        };
        // SAFETY: a shared mapping of a sealed file long enough for it; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if base == libc::MAP_FAILED {
            return os_fail("mmap of a peer's file");
        }
        match GuardedRange::register(base as usize, len) {
            Ok(guard) => Ok(PeerMapping {
                base: base.cast(),
                len,
                guard: Some(guard),
            }),
            Err(code) => {
                // SAFETY: unmapping the mapping just made, which nobody else has seen.
                unsafe { libc::munmap(base, len) };
                Err(code)
            }
        }
    }

    /// Whether some of the file's pages were found gone (a hole punched in it, the kernel
    /// unable to refill it): every copy through the mapping since may have moved scratch
    /// bytes instead of the file's, and every later one will. Check it after each copy.
    pub(crate) fn lost_pages(&self) -> bool {
        self.guard.as_ref().is_some_and(GuardedRange::lost_pages)
    }

    /// Base address of the mapping in this process.
    pub(crate) fn addr(&self) -> usize {
        self.base as usize
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // Released first: once unmapped, the addresses may hold someone else's mapping.
        drop(self.guard.take());
        // SAFETY: unmapping exactly the mapping we created.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).unwrap_or(4096).max(1)
}

/// The size of the file behind `fd`.
fn file_size(fd: BorrowedFd<'_>) -> Result<u64> {
    // SAFETY: `stat` is plain data; fstat fills it or fails (checked).
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a borrowed, open descriptor and a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return os_fail("fstat of a peer's file");
    }
    Ok(u64::try_from(stat.st_size).unwrap_or(0))
}
