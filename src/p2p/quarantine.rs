//! Quarantine before reuse: memory that a transfer which already failed, timed out or lost
//! its lease may still touch is *held* — not returned to its allocator — until a deadline.
//!
//! One mechanism for every such range of the P2P paths: the owner's space of an expired or
//! revoked PreWrite (the accessor's write may still be in flight, up to the transfer
//! timeout), the owner's values that were removed while readers held their pin (until the
//! last reader's lease ends), and the accessor's REVERSE staging slots whose item failed (the
//! owner's push may still land).
//!
//! Ownership: a held item (an RAII allocation) is dropped — its range freed — by
//! [`Quarantine::release_due`] once its deadline has passed, or with the quarantine. Nothing
//! is ever freed early. Thread-safe: one `parking_lot::Mutex`, a leaf lock held only to push
//! or pop; items are dropped after it is released.

use parking_lot::Mutex;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Instant;

/// An item and the instant before which it must not be freed.
struct Held<T> {
    until: Reverse<Instant>,
    /// Never read: kept only so that its drop (the free) waits for `until`.
    _item: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        self.until == other.until
    }
}
impl<T> Eq for Held<T> {}
impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Held<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.until.cmp(&other.until)
    }
}

/// Items held until their deadlines, earliest first. Thread-safe.
pub(crate) struct Quarantine<T> {
    held: Mutex<BinaryHeap<Held<T>>>,
}

impl<T> Default for Quarantine<T> {
    fn default() -> Self {
        Quarantine {
            held: Mutex::new(BinaryHeap::new()),
        }
    }
}

impl<T> Quarantine<T> {
    /// Keeps `item` alive until at least `until`.
    pub(crate) fn hold(&self, item: T, until: Instant) {
        self.held.lock().push(Held {
            until: Reverse(until),
            _item: item,
        });
    }

    /// Drops (frees) every item whose deadline is at or before `now`; returns how many.
    pub(crate) fn release_due(&self, now: Instant) -> usize {
        let mut due = Vec::new();
        {
            let mut held = self.held.lock();
            while held.peek().is_some_and(|h| h.until.0 <= now) {
                due.extend(held.pop());
            }
        }
        due.len()
    }

    /// Items held now (due ones not yet released included).
    pub(crate) fn len(&self) -> usize {
        self.held.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn items_are_freed_only_after_their_deadlines() {
        let quarantine = Quarantine::default();
        let now = Instant::now();
        let ms = Duration::from_millis;
        let (late, early) = (Arc::new(1), Arc::new(2));
        quarantine.hold(Arc::clone(&late), now + ms(20));
        quarantine.hold(Arc::clone(&early), now + ms(10));
        assert_eq!(quarantine.release_due(now + ms(9)), 0);
        assert_eq!(quarantine.release_due(now + ms(10)), 1);
        assert_eq!(
            (Arc::strong_count(&early), Arc::strong_count(&late)),
            (1, 2)
        );
        assert_eq!(quarantine.len(), 1);
        assert_eq!(quarantine.release_due(now + ms(30)), 1);
        assert_eq!(Arc::strong_count(&late), 1);
        assert_eq!(quarantine.len(), 0);
    }
}
