//! Host memory mappings for segments, the local buffer and transfer bounce buffers:
//! anonymous, or backed by a sealed memfd another process of the host can map
//! ([`MappedRegion::shared`]); pre-faulted at creation so the first copy into them runs at
//! memory speed, and optionally registered ("pinned") with the device runtime for
//! full-bandwidth device DMA.

use super::pin::HostRegistration;
use crate::error::{fail, ErrorCode, Result};
use crate::shm::SealedMemfd;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// An owned, page-aligned, zero-filled mapping. Unregistered (if pinned), then unmapped, on
/// drop; the memfd of a shared region is closed then too (a peer's mapping of it stays valid
/// until the peer unmaps it).
///
/// Thread-safety: the mapping itself is just an address range; concurrent access to its bytes
/// is coordinated by whoever hands out disjoint ranges of it.
pub struct MappedRegion {
    base: *mut u8,
    len: usize,
    pin: Option<HostRegistration>,
    file: Option<SealedMemfd>,
    /// False once [`MappedRegion::rehome`] mapped a successor over the range: the successor
    /// unmaps it then.
    owns_range: AtomicBool,
}

// SAFETY: the region is plain memory owned by this value; it has no thread affinity.
unsafe impl Send for MappedRegion {}
// SAFETY: shared access only exposes the address; byte access goes through raw pointers whose
// disjointness the allocator guarantees.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// Maps `len` bytes (> 0) of anonymous private memory, asks for transparent huge pages and
    /// faults every page in. `INVALID_PARAMS` for a zero or oversized `len`,
    /// `INTERNAL_ERROR` when the kernel refuses the mapping or cannot provide its pages.
    pub fn new(len: u64) -> Result<MappedRegion> {
        let len = checked_len(len)?;
        Self::map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, None)
    }

    /// Like [`MappedRegion::new`], but the pages are a sealed memfd (named `what` in
    /// `/proc/<pid>/maps`) that [`MappedRegion::shared_file`] hands to other processes of the
    /// host. Errors: as [`MappedRegion::new`], and [`SealedMemfd::create`]'s.
    pub fn shared(len: u64, what: &str) -> Result<MappedRegion> {
        let len = checked_len(len)?;
        let file = SealedMemfd::create(what, len)?;
        Self::map(len, libc::MAP_SHARED, Some(file))
    }

    fn map(len: usize, flags: libc::c_int, file: Option<SealedMemfd>) -> Result<MappedRegion> {
        let fd = file.as_ref().map_or(-1, |f| f.fd().as_raw_fd());
        // SAFETY: a new mapping with no address hint, of our own memfd (sized `len` and sealed)
        // or anonymous; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags | libc::MAP_NORESERVE,
                fd,
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
            file,
            owns_range: AtomicBool::new(true),
        };
        region.prefault()?;
        Ok(region)
    }

    /// [`MappedRegion::new`], then registered with the device runtime when there is one (see
    /// [`HostRegistration::new`]: best effort, never fails the mapping). `what` names the
    /// memory in logs.
    pub fn pinned(len: u64, what: &str) -> Result<MappedRegion> {
        MappedRegion::new(len)?.pin(what)
    }

    /// [`MappedRegion::shared`], then registered like [`MappedRegion::pinned`].
    pub fn shared_pinned(len: u64, what: &str) -> Result<MappedRegion> {
        MappedRegion::shared(len, what)?.pin(what)
    }

    /// Replaces the pages of a [`MappedRegion::shared`] region by a fresh memfd mapped over
    /// the same addresses (`MAP_FIXED`), pre-faulted and pinned again if it was pinned. The
    /// fresh file is zero-filled, or with `keep_contents` a copy of the region's bytes (made
    /// before the replacement: bytes written meanwhile may be lost; for a while the old and
    /// new pages both take memory). Mappings other processes made of the previous file keep the previous pages,
    /// which nothing in this process reads or writes any more; they are freed when the last
    /// such mapping goes. `&mut self`: no access through this region may run meanwhile
    /// (accesses by address from elsewhere see either the old or the new pages, never a
    /// hole: the replacement is one `mmap`).
    ///
    /// Errors: `INVALID_PARAMS` for an anonymous region; [`SealedMemfd::create`]'s and
    /// `INTERNAL_ERROR` when the kernel refuses the mapping: the region then keeps its
    /// previous file and pages; `INTERNAL_ERROR` when the kernel cannot provide the fresh
    /// pages (the region then maps the fresh file, not all of it populated).
    pub fn renew_shared(&mut self, what: &str, keep_contents: bool) -> Result<()> {
        if self.file.is_none() {
            return fail(
                ErrorCode::InvalidParams,
                "only a shared region can get a fresh file",
            );
        }
        let file = SealedMemfd::create(what, self.len)?;
        if keep_contents {
            self.copy_into(&file)?;
        }
        let was_pinned = self.pin.is_some();
        drop(self.pin.take());
        // SAFETY: replaces exactly our own mapping [base, base+len) with a same-sized shared
        // mapping of our sealed memfd; checked for MAP_FAILED (the old mapping then stays).
        let base = unsafe {
            libc::mmap(
                self.base.cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
                file.fd().as_raw_fd(),
                0,
            )
        };
        let remapped = base != libc::MAP_FAILED;
        let error = std::io::Error::last_os_error();
        let prefaulted = if remapped {
            self.file = Some(file);
            self.prefault()
        } else {
            Ok(())
        };
        if was_pinned {
            // SAFETY: our own mapping; `pin` is dropped before the unmapping in `Drop`.
            self.pin = unsafe { HostRegistration::new(self.addr(), self.len, what) };
        }
        if !remapped {
            return fail(
                ErrorCode::InternalError,
                format!(
                    "mmap of a fresh file over {} bytes failed: {error}",
                    self.len
                ),
            );
        }
        prefaulted
    }

    fn pin(mut self, what: &str) -> Result<MappedRegion> {
        // SAFETY: our own mapping; `pin` is dropped before the unmapping in `Drop`.
        self.pin = unsafe { HostRegistration::new(self.addr(), self.len, what) };
        Ok(self)
    }

    /// The memfd behind a [`MappedRegion::shared`] region (`None` for anonymous memory): send
    /// its descriptor to a process that should map these pages.
    pub fn shared_file(&self) -> Option<&SealedMemfd> {
        self.file.as_ref()
    }

    /// Moves a shared region to a fresh sealed memfd (named `what`) at the same addresses:
    /// copies the bytes here into the new file, then maps it over this range (`MAP_FIXED`, one
    /// atomic replacement of the mapping), so pointers into the range stay valid and keep
    /// their contents while other processes' mappings of the old file no longer reach this
    /// process. Returns the successor, which owns the range from now on; `self` keeps only
    /// the old file (dropping it unmaps nothing here).
    ///
    /// Bytes written into the range by this process between the copy and the remap are lost:
    /// call it while nobody here writes the range. Errors: `INVALID_PARAMS` for an anonymous
    /// or pinned region, or one already re-homed; `INTERNAL_ERROR` when the kernel refuses
    /// the file, the copy or the mapping (the range is then unchanged).
    pub fn rehome(&self, what: &str) -> Result<MappedRegion> {
        if self.file.is_none() || self.pin.is_some() || !self.owns_range.load(Ordering::Acquire) {
            return fail(
                ErrorCode::InvalidParams,
                "only an unpinned shared region that owns its range can be re-homed",
            );
        }
        let file = SealedMemfd::create(what, self.len)?;
        self.copy_into(&file)?;
        let fd = file.fd().as_raw_fd();
        // SAFETY: replaces exactly our own mapping `[base, base + len)` with the new file of
        // the same length; checked below.
        let base = unsafe {
            libc::mmap(
                self.base.cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
                fd,
                0,
            )
        };
        if base != self.base.cast() {
            return fail(
                ErrorCode::InternalError,
                format!(
                    "mapping a fresh memfd over {:#x} failed: {}",
                    self.addr(),
                    std::io::Error::last_os_error()
                ),
            );
        }
        self.owns_range.store(false, Ordering::Release);
        Ok(MappedRegion {
            base: self.base,
            len: self.len,
            pin: None,
            file: Some(file),
            owns_range: AtomicBool::new(true),
        })
    }

    /// Copies the region's bytes into `file` (as long as the region).
    fn copy_into(&self, file: &SealedMemfd) -> Result<()> {
        let fd = file.fd().as_raw_fd();
        let mut done = 0usize;
        while done < self.len {
            // SAFETY: reads `[base + done, base + len)`, our own mapping, into our own file.
            let wrote = unsafe {
                libc::pwrite(
                    fd,
                    self.base.add(done).cast(),
                    self.len - done,
                    done as libc::off_t,
                )
            };
            if wrote <= 0 {
                return fail(
                    ErrorCode::InternalError,
                    format!(
                        "copying {} bytes into a fresh memfd failed: {}",
                        self.len,
                        std::io::Error::last_os_error()
                    ),
                );
            }
            done += wrote as usize;
        }
        Ok(())
    }

    /// Whether the region is registered with the device runtime.
    pub fn is_pinned(&self) -> bool {
        self.pin.is_some()
    }

    /// Faults every page in: `MADV_POPULATE_WRITE` where the kernel has it (5.14+), else each
    /// page is touched. Errors: `INTERNAL_ERROR` when the kernel says it cannot provide the
    /// pages (`ENOMEM` under strict overcommit or a memory limit, `EFAULT`, `EHWPOISON`):
    /// touching them instead would get the process killed or a `SIGBUS`.
    fn prefault(&self) -> Result<()> {
        // SAFETY: the range is our own mapping. The huge-page hint is advisory.
        let populated = unsafe {
            libc::madvise(self.base.cast(), self.len, libc::MADV_HUGEPAGE);
            const MADV_POPULATE_WRITE: libc::c_int = 23;
            libc::madvise(self.base.cast(), self.len, MADV_POPULATE_WRITE)
        };
        if populated == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        // EINVAL (an older kernel), EPERM/ENOSYS (a sandbox): unsupported, touch instead.
        if matches!(
            error.raw_os_error(),
            Some(libc::ENOMEM | libc::EFAULT | libc::EHWPOISON)
        ) {
            return fail(
                ErrorCode::InternalError,
                format!(
                    "the kernel cannot provide the {} bytes of a mapping: {error}",
                    self.len
                ),
            );
        }
        let page = 4096;
        let mut offset = 0;
        while offset < self.len {
            // SAFETY: offset < len, inside our writable mapping.
            unsafe { self.base.add(offset).write_volatile(0) };
            offset += page;
        }
        Ok(())
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

/// `len` as a mapping length: non-zero and addressable.
fn checked_len(len: u64) -> Result<usize> {
    match usize::try_from(len) {
        Ok(l) if l > 0 => Ok(l),
        _ => fail(ErrorCode::InvalidParams, format!("cannot map {len} bytes")),
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // Unregister before the pages go away.
        drop(self.pin.take());
        if self.owns_range.load(Ordering::Acquire) {
            // SAFETY: unmapping exactly the mapping we created (or took over in `rehome`).
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
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

    #[test]
    fn a_shared_region_is_seen_by_a_mapping_of_its_file() {
        assert!(MappedRegion::new(1 << 16).unwrap().shared_file().is_none());
        let region = MappedRegion::shared_pinned(1 << 16, "region-test").unwrap();
        let file = region.shared_file().expect("a memfd");
        assert_eq!(file.len(), 1 << 16);
        let peer = crate::shm::PeerMapping::map(file.fd(), 0, 1 << 16).unwrap();
        // SAFETY: both are live mappings of 64 KiB; the test is their only user.
        unsafe {
            (region.addr() as *mut u8).add(5000).write(42);
            assert_eq!((peer.addr() as *const u8).add(5000).read(), 42);
        }
        assert!(MappedRegion::shared(0, "x").is_err());
    }

    /// A pinned shared region of 64 KiB, its address, and a second mapping of its file (as a
    /// peer process would hold); byte 100 is 7.
    fn renewable_with_a_peer(what: &str) -> (MappedRegion, usize, crate::shm::PeerMapping) {
        let region = MappedRegion::shared_pinned(1 << 16, what).unwrap();
        let addr = region.addr();
        let peer = region
            .shared_file()
            .map(|f| crate::shm::PeerMapping::map(f.fd(), 0, 1 << 16).unwrap());
        // SAFETY: live mappings of 64 KiB; the test is their only user.
        unsafe { (addr as *mut u8).add(100).write(7) };
        (region, addr, peer.expect("a memfd"))
    }

    #[test]
    fn a_renewed_region_keeps_its_address_and_leaves_old_mappings_on_old_pages() {
        let (mut region, addr, old) = renewable_with_a_peer("renew-test");
        region.renew_shared("renew-test", false).unwrap();
        assert_eq!(region.addr(), addr);
        // SAFETY: as above.
        unsafe {
            assert_eq!((addr as *const u8).add(100).read(), 0, "fresh pages");
            (old.addr() as *mut u8).add(100).write(9);
            assert_eq!(
                (addr as *const u8).add(100).read(),
                0,
                "old mapping is elsewhere"
            );
            (addr as *mut u8).add(200).write(5);
        }
        let new = crate::shm::PeerMapping::map(region.shared_file().unwrap().fd(), 0, 1 << 16);
        // SAFETY: as above.
        assert_eq!(
            unsafe { (new.unwrap().addr() as *const u8).add(200).read() },
            5
        );
        assert!(MappedRegion::new(4096)
            .unwrap()
            .renew_shared("x", false)
            .is_err());
    }

    #[test]
    fn a_region_renewed_with_its_contents_keeps_them_and_leaves_old_mappings_behind() {
        let (mut region, addr, old) = renewable_with_a_peer("renew-keep-test");
        region.renew_shared("renew-keep-test", true).unwrap();
        // SAFETY: as above.
        unsafe {
            assert_eq!((addr as *const u8).add(100).read(), 7, "contents kept");
            (old.addr() as *mut u8).add(100).write(9);
            assert_eq!(
                (addr as *const u8).add(100).read(),
                7,
                "old mapping is elsewhere"
            );
        }
    }

    #[test]
    fn a_rehomed_region_keeps_its_bytes_and_leaves_the_old_file_behind() {
        let region = MappedRegion::shared(1 << 16, "rehome-test").unwrap();
        let old = region.shared_file().expect("a memfd");
        let peer = crate::shm::PeerMapping::map(old.fd(), 0, 1 << 16).unwrap();
        // SAFETY: both are live mappings of 64 KiB; the test is their only user.
        unsafe { (region.addr() as *mut u8).add(100).write(7) };
        let successor = region.rehome("rehome-test").unwrap();
        assert_eq!(successor.addr(), region.addr());
        assert_eq!(successor.len(), region.len());
        // SAFETY: as above; `successor` owns the range now.
        unsafe {
            assert_eq!((successor.addr() as *const u8).add(100).read(), 7);
            // A late write through the old file does not reach the range any more.
            (peer.addr() as *mut u8).add(100).write(9);
            assert_eq!((successor.addr() as *const u8).add(100).read(), 7);
        }
        assert!(
            region.rehome("twice").is_err(),
            "the old region owns nothing"
        );
        assert!(MappedRegion::new(4096).unwrap().rehome("anon").is_err());
        // Dropping the old region leaves the successor's mapping in place.
        drop(region);
        // SAFETY: as above.
        unsafe { (successor.addr() as *mut u8).add(200).write(1) };
    }
}
