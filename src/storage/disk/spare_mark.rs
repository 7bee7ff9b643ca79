//! The mark that makes a record file *spare* without writing its blocks: an extended
//! attribute `user.mooncake.spare` naming the record the file held (its generation and the
//! CRC32C of its key, 12 bytes little-endian). A file whose header is that record is spare;
//! a file whose header is another record was reused after the mark was set (the mark is
//! removed after each reuse, but that removal is not synced, so a crash may leave it).
//!
//! Setting or removing an attribute changes only the inode, which the kernel writes back
//! later: a removal costs no synchronous disk write, where zeroing the header block costs one
//! per removed record. Filesystems without user attributes (`ENOTSUP`) get the zeroed header
//! instead (see `DiskStore::recycle`). Neither is synced: a crash may bring a removed record
//! back, and the master, which no longer lists it, has its owner delete it again.
//!
//! Plain functions over paths; thread-safe. Errors are the OS errors of the calls.

use std::ffi::{CStr, CString};
use std::io::{self, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const NAME: &CStr = c"user.mooncake.spare";
const VALUE_LEN: usize = 12;

/// The attribute's value for the record (`key`, `generation`).
fn value(key: &str, generation: u64) -> [u8; VALUE_LEN] {
    let mut value = [0u8; VALUE_LEN];
    value[..8].copy_from_slice(&generation.to_le_bytes());
    value[8..].copy_from_slice(&crc32c::crc32c(key.as_bytes()).to_le_bytes());
    value
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| ErrorKind::InvalidInput.into())
}

/// Marks the file at `path`, which holds (`key`, `generation`), spare.
///
/// Errors: `ENOTSUP` where the filesystem has no user attributes; any other OS error.
pub(super) fn mark(path: &Path, key: &str, generation: u64) -> io::Result<()> {
    let (path, value) = (c_path(path)?, value(key, generation));
    // SAFETY: both pointers are live for the call; the lengths are theirs.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            NAME.as_ptr(),
            value.as_ptr().cast(),
            VALUE_LEN,
            0,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Removes the mark of the file at `path` (none, or no attributes on this filesystem, is
/// fine).
///
/// Errors: other OS errors.
pub(super) fn unmark(path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    // SAFETY: both pointers are live NUL-terminated strings.
    if unsafe { libc::removexattr(path.as_ptr(), NAME.as_ptr()) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(()),
        _ => Err(err),
    }
}

/// Whether the file at `path`, whose header is the record (`key`, `generation`), is marked
/// spare for that record (no mark, a mark for another record, or no attributes: false).
///
/// Errors: OS errors other than those.
pub(super) fn is_marked(path: &Path, key: &str, generation: u64) -> io::Result<bool> {
    let path = c_path(path)?;
    let mut found = [0u8; VALUE_LEN + 1];
    // SAFETY: both names are live NUL-terminated strings; `found` has the length given.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            NAME.as_ptr(),
            found.as_mut_ptr().cast(),
            found.len(),
        )
    };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) | Some(libc::ERANGE) => Ok(false),
            _ => Err(err),
        };
    }
    Ok(found[..n as usize] == value(key, generation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TempDir;

    #[test]
    fn a_mark_names_one_record_and_comes_off() {
        let dir = TempDir::new("spare-mark");
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        assert!(!is_marked(&path, "k", 3).unwrap());
        if let Err(e) = mark(&path, "k", 3) {
            // Without user attributes the store zeroes headers instead.
            assert_eq!(e.raw_os_error(), Some(libc::ENOTSUP));
            return;
        }
        assert!(is_marked(&path, "k", 3).unwrap());
        assert!(!is_marked(&path, "k", 4).unwrap());
        assert!(!is_marked(&path, "j", 3).unwrap());
        unmark(&path).unwrap();
        assert!(!is_marked(&path, "k", 3).unwrap());
        unmark(&path).unwrap();
        assert!(mark(&dir.path().join("missing"), "k", 3).is_err());
    }
}
