//! Anonymous host memory mappings for segments, the local buffer and transfer bounce
//! buffers: pre-faulted at creation so the first copy into them runs at memory speed, and
//! optionally registered ("pinned") with the device runtime for full-bandwidth device DMA.

use super::pin::HostRegistration;
use crate::error::{fail, ErrorCode, Result};

/// An owned, page-aligned, zero-filled anonymous mapping. Unregistered (if pinned), then
/// unmapped, on drop.
///
/// Thread-safety: the mapping itself is just an address range; concurrent access to its bytes
/// is coordinated by whoever hands out disjoint ranges of it.
pub struct MappedRegion {
    base: *mut u8,
    len: usize,
    pin: Option<HostRegistration>,
}

// SAFETY: the region is plain memory owned by this value; it has no thread affinity.
unsafe impl Send for MappedRegion {}
// SAFETY: shared access only exposes the address; byte access goes through raw pointers whose
// disjointness the allocator guarantees.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// Maps `len` bytes (> 0), asks for transparent huge pages and faults every page in.
    /// `INTERNAL_ERROR` when the kernel refuses the mapping.
    pub fn new(len: u64) -> Result<MappedRegion> {
        let len = match usize::try_from(len) {
            Ok(l) if l > 0 => l,
            _ => return fail(ErrorCode::InvalidParams, format!("cannot map {len} bytes")),
        };
        // SAFETY: anonymous private mapping with no address hint; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return fail(
                ErrorCode::InternalError,
                format!(
                    "mmap of {len} bytes failed: {}",
                    std::io::Error::last_os_error()
                ),
            );
        }
        let region = MappedRegion {
            base: base.cast(),
            len,
            pin: None,
        };
        region.prefault();
        Ok(region)
    }

    /// [`MappedRegion::new`], then registered with the device runtime when there is one (see
    /// [`HostRegistration::new`]: best effort, never fails the mapping). `what` names the
    /// memory in logs.
    pub fn pinned(len: u64, what: &str) -> Result<MappedRegion> {
        let mut region = MappedRegion::new(len)?;
        // SAFETY: our own mapping; `pin` is dropped before the unmapping in `Drop`.
        region.pin = unsafe { HostRegistration::new(region.addr(), region.len, what) };
        Ok(region)
    }

    /// Whether the region is registered with the device runtime.
    pub fn is_pinned(&self) -> bool {
        self.pin.is_some()
    }

    fn prefault(&self) {
        // SAFETY: the range is our own mapping. Both calls are advisory; failure only costs speed.
        unsafe {
            libc::madvise(self.base.cast(), self.len, libc::MADV_HUGEPAGE);
            const MADV_POPULATE_WRITE: libc::c_int = 23;
            if libc::madvise(self.base.cast(), self.len, MADV_POPULATE_WRITE) == 0 {
                return;
            }
        }
        let page = 4096;
        let mut offset = 0;
        while offset < self.len {
            // SAFETY: offset < len, inside our writable mapping.
            unsafe { self.base.add(offset).write_volatile(0) };
            offset += page;
        }
    }

    /// Base address.
    pub fn addr(&self) -> usize {
        self.base as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // Unregister before the pages go away.
        drop(self.pin.take());
        // SAFETY: unmapping exactly the mapping we created.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_zeroed_writable_and_aligned() {
        let region = MappedRegion::new(3 * 4096 + 5).unwrap();
        assert_eq!(region.addr() % 4096, 0);
        // SAFETY: inside the mapping.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(region.addr() as *mut u8, region.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[region.len() - 1] = 7;
        assert_eq!(bytes[region.len() - 1], 7);
        assert!(MappedRegion::new(0).is_err());
    }
}
