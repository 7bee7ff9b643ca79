//! [`ControlWord`]: the owner's current segment epoch in a one-page shared file that every
//! peer holding a mapping of the segment also maps.

use crate::error::Result;
use crate::shm::{PeerMapping, SealedMemfd};
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicU64;

/// Size of the control file (one page).
pub(super) const CONTROL_LEN: usize = 4096;

/// A mapping of a control file: an `AtomicU64` at offset 0 holding the epoch of the mount
/// peers may use now (0: none). Only the owner stores to it.
///
/// Ownership: owns its mapping (and, on the owner, the file). Thread-safety: the word is
/// atomic; share the value freely.
#[derive(Debug)]
pub(super) struct ControlWord {
    mapping: PeerMapping,
    file: Option<SealedMemfd>,
}

impl ControlWord {
    /// The owner's control file, holding 0. Errors: the memfd's or the mapping's.
    pub(super) fn create() -> Result<ControlWord> {
        let file = SealedMemfd::create("mooncake same-host control", CONTROL_LEN)?;
        let mapping = PeerMapping::map(file.fd(), 0, CONTROL_LEN)?;
        Ok(ControlWord {
            mapping,
            file: Some(file),
        })
    }

    /// A peer's mapping of an owner's control file. Errors: as [`PeerMapping::map`] (a file
    /// that is not sealed or shorter than a page is refused).
    pub(super) fn map(fd: BorrowedFd<'_>) -> Result<ControlWord> {
        Ok(ControlWord {
            mapping: PeerMapping::map(fd, 0, CONTROL_LEN)?,
            file: None,
        })
    }

    /// The file to send to peers (`None` on a peer's mapping).
    pub(super) fn file(&self) -> Option<&SealedMemfd> {
        self.file.as_ref()
    }

    /// Whether the control file lost pages under this mapping (its word may read scratch).
    pub(super) fn lost_pages(&self) -> bool {
        self.mapping.lost_pages()
    }

    /// The word. Valid as long as `self`.
    pub(super) fn word(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page-aligned, at least 8 bytes, lives as long as `self`, and
        // is only ever accessed atomically (by every process that maps it).
        unsafe { &*(self.mapping.addr() as *const AtomicU64) }
    }
}
