//! Reusable read buffers: each thread keeps the buffer of its last record read (up to
//! [`POOLED_MAX`] bytes) for its next one, so a read of a small record costs neither an
//! allocation nor the zeroing of a fresh one (both cost about as much as the CRC of a 64 KiB
//! record). A reused buffer still holds the previous record's bytes: a read fills every byte
//! it later looks at (`DiskStore::read` reads every block it checks and returns, or fails).
//!
//! Thread-safety: per thread, no locks; a buffer taken on one thread may be given back on
//! another. Memory: at most one pooled buffer per thread that reads, freed when it exits.

use super::AlignedBuf;
use crate::error::Result;
use std::cell::Cell;

/// The largest buffer a thread keeps (a 1 MiB record's payload, with a block to spare).
const POOLED_MAX: usize = (1 << 20) + super::BLOCK;

thread_local! {
    static SPARE: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
}

/// A buffer of at least `capacity` bytes: this thread's spare if it is large enough, else a
/// new (zeroed) one. Errors: as [`AlignedBuf::new`].
pub(super) fn take(capacity: usize) -> Result<AlignedBuf> {
    let spare = SPARE.try_with(Cell::take).ok().flatten();
    match spare {
        Some(buf) if buf.capacity() >= capacity => Ok(buf),
        Some(small) => {
            give_back(small);
            AlignedBuf::new(capacity)
        }
        None => AlignedBuf::new(capacity),
    }
}

/// Keeps `buf` as this thread's spare when it is small enough and larger than the spare
/// held (the other is freed).
pub(super) fn give_back(buf: AlignedBuf) {
    if buf.capacity() > POOLED_MAX {
        return;
    }
    let _ = SPARE.try_with(|spare| {
        let held = spare.take();
        let keep = match held {
            Some(held) if held.capacity() >= buf.capacity() => held,
            _ => buf,
        };
        spare.set(Some(keep));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_reuses_its_buffer_and_keeps_the_larger_one() {
        let first = take(8192).unwrap();
        let at = first.as_slice().as_ptr();
        give_back(first);
        // Large enough: the same memory again.
        let again = take(4096).unwrap();
        assert_eq!(again.as_slice().as_ptr(), at);
        // Too small for the next read: a new buffer, and the larger one is kept.
        let larger = take(3 * 8192).unwrap();
        assert!(larger.capacity() >= 3 * 8192);
        let larger_at = larger.as_slice().as_ptr();
        give_back(again);
        give_back(larger);
        assert_eq!(take(8192).unwrap().as_slice().as_ptr(), larger_at);
        // Beyond the cap: never kept.
        give_back(take(POOLED_MAX + 1).unwrap());
        assert!(SPARE.with(Cell::take).is_none());
    }
}
