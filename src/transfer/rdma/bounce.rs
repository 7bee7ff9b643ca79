//! Registered bounce buffers for caller memory the NIC cannot use directly (unregistered
//! host memory, device memory): a WRITE copies caller → bounce and posts from it; a READ
//! lands in a bounce and is copied out. One counted copy each way.

use super::device::{RdmaDevice, Registration};
use crate::device::MappedRegion;
use parking_lot::Mutex;
use std::sync::Arc;

/// Bytes of one bounce buffer (a request larger than this goes through it in chunks).
pub(crate) const BOUNCE_LEN: usize = 4 << 20;
/// Most idle bounces kept; more are deregistered and unmapped when returned.
const MAX_IDLE: usize = 16;

/// A pinned mapping and its registration; the registration is dropped first.
struct Buffer {
    registration: Registration,
    region: MappedRegion,
}

/// The pool. Thread-safe.
pub(crate) struct Bounces {
    device: Arc<RdmaDevice>,
    idle: Mutex<Vec<Buffer>>,
}

/// A bounce taken from the pool; goes back on drop.
pub(crate) struct Bounce<'a> {
    buffer: Option<Buffer>,
    pool: &'a Bounces,
}

impl Bounces {
    pub(crate) fn new(device: Arc<RdmaDevice>) -> Bounces {
        Bounces {
            device,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle bounce, or a newly mapped and registered one.
    pub(crate) fn take(&self) -> Result<Bounce<'_>, String> {
        let reused = self.idle.lock().pop();
        let buffer = match reused {
            Some(buffer) => buffer,
            None => {
                let region = MappedRegion::pinned(BOUNCE_LEN as u64, "RDMA bounce buffer")
                    .map_err(|e| format!("cannot map an RDMA bounce buffer: {e}"))?;
                let registration = self
                    .device
                    .register(region.addr(), BOUNCE_LEN, false)
                    .map_err(|_| crate::error::last_error_message())?;
                Buffer {
                    registration,
                    region,
                }
            }
        };
        Ok(Bounce {
            buffer: Some(buffer),
            pool: self,
        })
    }
}

impl Bounce<'_> {
    /// First byte ([`BOUNCE_LEN`] bytes of registered host memory).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.buffer
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.region.addr() as *mut u8)
    }

    /// Its local key.
    pub(crate) fn lkey(&self) -> u32 {
        self.buffer.as_ref().map_or(0, |b| b.registration.lkey())
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            let mut idle = self.pool.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(buffer);
            }
        }
    }
}
