//! [`Stamp`]: an instant in 8 bytes, for the object table's per-object times (a `std`
//! `Instant` takes 16 and `Option<Instant>` 16; `Option<Stamp>` takes 8).
//!
//! A stamp is the signed number of nanoseconds from a process-wide base instant (taken at
//! first use), never 0 (the niche that makes `Option<Stamp>` free): it converts back to the
//! same `Instant` for anything within ±292 years of the base (the master caps its deadlines
//! at 100 years). Plain value; ordered as the instants are.

use once_cell::sync::Lazy;
use std::num::NonZeroI64;
use std::time::{Duration, Instant};

static BASE: Lazy<Instant> = Lazy::new(Instant::now);

/// See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp(NonZeroI64);

impl Stamp {
    /// The stamp of `at`.
    pub(crate) fn of(at: Instant) -> Stamp {
        let base = *BASE;
        let nanos = |span: Duration| i64::try_from(span.as_nanos()).unwrap_or(i64::MAX - 1);
        // Stored shifted away from 0: n >= 0 is kept as n + 1, n < 0 as n.
        let stored = match at.checked_duration_since(base) {
            Some(after) => nanos(after) + 1,
            None => -nanos(base.duration_since(at)),
        };
        Stamp(NonZeroI64::new(stored).unwrap_or(NonZeroI64::MIN))
    }

    /// The instant this stamp was made of.
    pub(crate) fn instant(self) -> Instant {
        let base = *BASE;
        // Never out of range for a stamp made of an instant: `unwrap_or` is never taken.
        match self.0.get() {
            after @ 1.. => base.checked_add(Duration::from_nanos(after as u64 - 1)),
            before => base.checked_sub(Duration::from_nanos(before.unsigned_abs())),
        }
        .unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_round_trip_exactly_and_keep_their_order() {
        let now = Instant::now();
        let mut instants = vec![now, now + Duration::from_nanos(1)];
        for ms in [0, 1, 7, 1000, 86_400_000] {
            instants.push(now + Duration::from_millis(ms));
            instants.extend(now.checked_sub(Duration::from_millis(ms)));
        }
        instants.push(now + Duration::from_secs(100 * 365 * 24 * 3600));
        for &a in &instants {
            assert_eq!(Stamp::of(a).instant(), a);
            for &b in &instants {
                assert_eq!(Stamp::of(a).cmp(&Stamp::of(b)), a.cmp(&b));
            }
        }
        assert_eq!(std::mem::size_of::<Option<Stamp>>(), 8);
    }
}
