//! Per-thread stripes: state that every request thread updates, spread over cache lines of
//! its own per stripe, so threads on different cores do not write (and pass between them)
//! one line per request.
//!
//! Thread-safety: a thread always maps to the same stripe ([`this_threads_stripe`]), threads
//! being dealt out round robin; with more threads than [`STRIPES`] some share a stripe, which
//! is still correct (the stripes are atomics or locks), only less spread.

use parking_lot::Mutex;
use std::ops::Range;
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

/// Ids a stripe takes from the shared counter at a time.
const ID_BLOCK: u64 = 256;

/// A block of ids alone on its cache lines.
#[derive(Default)]
#[repr(align(128))]
struct Block(Mutex<Range<u64>>);

/// A source of unique ids for the request path: each stripe takes [`ID_BLOCK`] ids at a time
/// from one shared counter, so the counter's line is written once per block, not once per id.
/// Every id is handed out once; ids are not handed out in increasing order across threads
/// (each is larger than every id of blocks taken before its own block).
pub(crate) struct IdBlocks {
    next: AtomicU64,
    stripes: [Block; STRIPES],
}

impl IdBlocks {
    /// Ids from `first` on.
    pub(crate) fn starting_at(first: u64) -> IdBlocks {
        IdBlocks {
            next: AtomicU64::new(first),
            stripes: Default::default(),
        }
    }

    /// A fresh id.
    pub(crate) fn next(&self) -> u64 {
        let mut block = self.stripes[this_threads_stripe()].0.lock();
        if block.is_empty() {
            let start = self.next.fetch_add(ID_BLOCK, Ordering::Relaxed);
            *block = start..start.wrapping_add(ID_BLOCK);
        }
        let id = block.start;
        block.start += 1;
        id
    }

    /// The first id no block has taken yet: every id handed out so far is below it.
    pub(crate) fn ceiling(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Hands out ids from `first` on, dropping the stripes' blocks (their unused ids are never
    /// handed out).
    pub(crate) fn restart_at(&self, first: u64) {
        let blocks: Vec<_> = self.stripes.iter().map(|block| block.0.lock()).collect();
        self.next.store(first, Ordering::Relaxed);
        for mut block in blocks {
            *block = first..first;
        }
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
    fn ids_are_unique_over_threads_and_start_where_told() {
        let ids = IdBlocks::starting_at(1000);
        let taken: Vec<Vec<u64>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..STRIPES + 3)
                .map(|_| scope.spawn(|| (0..700).map(|_| ids.next()).collect()))
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = taken.concat();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "an id was handed out twice");
        assert!(all[0] >= 1000);
        assert!(*all.last().unwrap() < ids.ceiling());
        ids.restart_at(50_000);
        assert_eq!(
            ids.next(),
            50_000,
            "a restart drops the blocks taken before it"
        );
        assert!(ids.ceiling() > 50_000);
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
