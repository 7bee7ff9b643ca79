//! Per-thread stripes: state that every request thread updates, spread over cache lines of
//! its own per stripe, so threads on different cores do not write (and pass between them)
//! one line per request.
//!
//! Thread-safety: a thread always maps to the same stripe ([`this_threads_stripe`]), threads
//! being dealt out round robin; with more threads than [`STRIPES`] some share a stripe, which
//! is still correct (the stripes are atomics or locks), only less spread.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Number of stripes.
pub(crate) const STRIPES: usize = 16;

/// The stripe of the calling thread, in `0..STRIPES`.
pub(crate) fn this_threads_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.try_with(|stripe| *stripe).unwrap_or(0)
}

/// A counter alone on its cache lines.
#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

/// A monotonic event counter for the request path: an increment writes only the calling
/// thread's stripe; a read sums the stripes. A read is a snapshot that may miss increments
/// made while it runs (as a load of one atomic counter would), never counts one twice.
#[derive(Default)]
pub(crate) struct StripedCounter {
    stripes: [Padded; STRIPES],
}

impl StripedCounter {
    /// Adds `n`.
    pub(crate) fn add(&self, n: u64) {
        self.stripes[this_threads_stripe()]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The sum of every increment so far (wrapping, as one `u64` counter would).
    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| stripe.0.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_striped_counter_sums_the_increments_of_many_threads() {
        let counter = StripedCounter::default();
        std::thread::scope(|scope| {
            for thread in 0..(STRIPES + 3) as u64 {
                let counter = &counter;
                scope.spawn(move || {
                    for _ in 0..1000 {
                        counter.add(thread + 1);
                    }
                });
            }
        });
        let threads = (STRIPES + 3) as u64;
        assert_eq!(counter.get(), 1000 * threads * (threads + 1) / 2);
    }

    #[test]
    fn a_thread_keeps_its_stripe() {
        let first = this_threads_stripe();
        assert!(first < STRIPES);
        assert_eq!(this_threads_stripe(), first);
        let other = std::thread::spawn(this_threads_stripe).join().unwrap();
        assert!(other < STRIPES);
    }
}
