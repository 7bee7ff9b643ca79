//! Pinned bounce buffers for device memory on the TCP path: a device pointer cannot go to a
//! socket, so a WRITE slice is first copied device → bounce and sent from there, and a READ
//! slice is received into a bounce and then copied bounce → device. One copy each way,
//! counted in `device_staging_*`.
//!
//! Bounces are [`STAGE_CHUNK`]-byte pre-faulted mappings registered with the device runtime,
//! created on first need (one per concurrently staged slice) and reused for the life of the
//! engine; the engine splits device requests into slices of at most [`STAGE_CHUNK`] bytes.

use super::metrics::{add, Metrics};
use crate::device::{memcpy_safe, MappedRegion};
use parking_lot::Mutex;
use std::sync::Arc;

/// Size of one bounce buffer, and the largest slice of a device request sent over TCP.
pub(crate) const STAGE_CHUNK: usize = 4 << 20;
/// Most idle bounces kept; more are unmapped when returned.
const MAX_IDLE: usize = 64;

/// The pool of idle bounces. Thread-safe; share by `Arc`.
pub(crate) struct Staging {
    idle: Mutex<Vec<MappedRegion>>,
    metrics: Arc<Metrics>,
}

/// A bounce taken from the pool; goes back on drop.
pub(crate) struct Bounce<'a> {
    region: Option<MappedRegion>,
    pool: &'a Staging,
}

impl Staging {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Staging {
        Staging {
            idle: Mutex::new(Vec::new()),
            metrics,
        }
    }

    /// An idle bounce, or a new pinned one.
    pub(crate) fn take(&self) -> Result<Bounce<'_>, String> {
        let reused = self.idle.lock().pop();
        let region = match reused {
            Some(region) => region,
            None => MappedRegion::pinned(STAGE_CHUNK as u64, "transfer bounce buffer")
                .map_err(|e| format!("cannot map a bounce buffer: {e}"))?,
        };
        Ok(Bounce {
            region: Some(region),
            pool: self,
        })
    }

    /// Copies `len` bytes between caller (device) memory and a bounce, counted.
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes and do not overlap.
    pub(crate) unsafe fn copy(
        &self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<(), String> {
        // SAFETY: forwarded from the caller.
        unsafe { memcpy_safe(dst, src, len) }?;
        add(
            &self.metrics.device_staging_copies,
            &self.metrics.device_staging_bytes,
            len as u64,
        );
        Ok(())
    }
}

impl Bounce<'_> {
    /// First byte of the bounce ([`STAGE_CHUNK`] bytes, host memory).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.region
            .as_ref()
            .map_or(std::ptr::null_mut(), |r| r.addr() as *mut u8)
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            let mut idle = self.pool.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(region);
            }
        }
    }
}
