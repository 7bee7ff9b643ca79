//! Host registration ("pinning") of long-lived host memory — mounted segments, the local
//! buffer, transfer bounce buffers — so device copies to and from it run at full DMA speed.
//!
//! Registration is best effort: without a runtime that can register, over the budget
//! `MC_STORE_PIN_MEMORY_MAX_BYTES` (bytes; default unlimited), or when the runtime refuses,
//! the memory simply stays pageable (a warning for refusals, and counters either way).

use super::runtime;
use super::stats::{self, STATS};
use std::sync::atomic::Ordering;

/// A registered host range; unregisters it when dropped. Drop it before the memory is
/// unmapped. `Send + Sync` (only holds the address).
#[derive(Debug)]
pub struct HostRegistration {
    addr: usize,
    len: usize,
}

impl HostRegistration {
    /// Registers `[addr, addr+len)` (portable + device-mapped) with the process's runtime.
    /// `None` when not registered (no runtime, no registration symbols, over the budget, or
    /// refused — the latter logs a warning); never fails the caller. `what` names the
    /// memory in logs.
    ///
    /// # Safety
    /// The range is mapped host memory that stays mapped until the returned value is dropped.
    pub unsafe fn new(addr: usize, len: usize, what: &str) -> Option<HostRegistration> {
        let backend = runtime().backend().filter(|b| b.can_register());
        let Some(backend) = backend else {
            stats::bump(&STATS.host_register_skipped);
            return None;
        };
        if !reserve(len as u64) {
            stats::bump(&STATS.host_register_skipped);
            tracing::warn!(
                what,
                len,
                "not pinning: MC_STORE_PIN_MEMORY_MAX_BYTES would be exceeded"
            );
            return None;
        }
        // SAFETY: forwarded from the caller.
        match unsafe { backend.register(addr, len) } {
            Ok(()) => {
                stats::bump(&STATS.host_registrations);
                Some(HostRegistration { addr, len })
            }
            Err(e) => {
                STATS
                    .host_registered_bytes
                    .fetch_sub(len as u64, Ordering::Relaxed);
                stats::bump(&STATS.host_register_failures);
                tracing::warn!(what, len, error = %e, "host registration failed; device copies to this memory run at pageable speed");
                None
            }
        }
    }

    /// First registered byte.
    pub fn addr(&self) -> usize {
        self.addr
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Some(backend) = runtime().backend() {
            // SAFETY: `addr` is the base of a range we registered and is still mapped.
            if let Err(e) = unsafe { backend.unregister(self.addr) } {
                tracing::warn!(addr = self.addr, error = %e, "host unregistration failed");
            }
        }
        STATS
            .host_registered_bytes
            .fetch_sub(self.len as u64, Ordering::Relaxed);
    }
}

/// Adds `len` to the registered total if the budget allows it.
fn reserve(len: u64) -> bool {
    let limit = crate::env::STORE_PIN_MEMORY_MAX_BYTES.get();
    STATS
        .host_registered_bytes
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            now.checked_add(len).filter(|total| *total <= limit)
        })
        .is_ok()
}
