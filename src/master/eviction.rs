//! Eviction policy (spec §4.6), as pure functions: how many objects to evict and which ones.
//! The service collects candidates, calls [`choose`], and removes what it returns.

use std::time::{Duration, Instant};

/// Longest wait between eviction scans while rounds free nothing.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// When the next eviction scan is due. A round that frees nothing while nothing changed
/// doubles the wait (from `base` up to [`MAX_BACKOFF`]); a change or a productive round makes
/// the next tick scan again. Plain data; the service keeps it under a mutex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    next: Instant,
    delay: Duration,
    /// What the last fruitless round saw: (objects, bytes used, pins held).
    seen: Option<(u64, u64, u64)>,
}

impl Backoff {
    /// Due at once.
    pub(crate) fn new(now: Instant) -> Backoff {
        Backoff {
            next: now,
            delay: Duration::ZERO,
            seen: None,
        }
    }

    /// Whether a scan should run at `now`, given the table's current `state`; a state other
    /// than the one the last fruitless round saw resets the back-off.
    pub(crate) fn due(&mut self, now: Instant, state: (u64, u64, u64)) -> bool {
        if self.seen.is_some_and(|seen| seen != state) {
            *self = Backoff::new(now);
        }
        now >= self.next
    }

    /// Records a round's outcome: `freed` objects, in table `state`, on a `base` period.
    pub(crate) fn record(
        &mut self,
        now: Instant,
        freed: u64,
        state: (u64, u64, u64),
        base: Duration,
    ) {
        if freed > 0 {
            *self = Backoff::new(now);
            return;
        }
        self.delay = (self.delay * 2).clamp(base, MAX_BACKOFF);
        self.next = now + self.delay;
        self.seen = Some(state);
    }
}

/// An object that may be evicted: complete, not hard-pinned, unleased, unpinned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub key: String,
    pub object_id: u64,
    pub last_access: Instant,
    pub soft_pinned: bool,
}

/// Numbers of objects a round aims for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Targets {
    /// First-pass goal: `ceil(count · target)`.
    pub ideal: usize,
    /// Minimum, reached in the second pass if needed: `ceil(count · lower_bound)`.
    pub lower_bound: usize,
}

fn fraction_of(count: usize, fraction: f64) -> usize {
    let fraction = if fraction.is_nan() {
        0.0
    } else {
        fraction.clamp(0.0, 1.0)
    };
    // `as` saturates; the value is within [0, count].
    (count as f64 * fraction).ceil() as usize
}

/// Targets for `count` evictable objects at `used_ratio`:
/// `target = max(ratio, used − hwm + ratio)`, `lower_bound = max(target/2, used − hwm)`.
pub(crate) fn targets(count: usize, used_ratio: f64, hwm: f64, ratio: f64) -> Targets {
    let target = ratio.max(used_ratio - hwm + ratio);
    let lower_bound = (target * 0.5).max(used_ratio - hwm);
    Targets {
        ideal: fraction_of(count, target),
        lower_bound: fraction_of(count, lower_bound),
    }
}

/// Chooses the victims, least recently accessed first: up to `ideal` objects that are not
/// soft-pinned; then, if fewer than `lower_bound` were chosen, soft-pinned ones until
/// `lower_bound` (callers leave soft-pinned objects out when they may not be evicted).
pub(crate) fn choose(mut candidates: Vec<Candidate>, targets: Targets) -> Vec<Candidate> {
    candidates.sort_by_key(|c| (c.soft_pinned, c.last_access));
    let ordinary = candidates.iter().filter(|c| !c.soft_pinned).count();
    let take = targets.ideal.min(ordinary).max(targets.lower_bound);
    candidates.truncate(take);
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn candidate(key: &str, age_ms: u64, soft_pinned: bool, base: Instant) -> Candidate {
        Candidate {
            key: key.to_string(),
            object_id: 0,
            last_access: base + Duration::from_millis(1000 - age_ms),
            soft_pinned,
        }
    }

    #[test]
    fn fruitless_rounds_back_off_until_something_changes() {
        let now = Instant::now();
        let base = Duration::from_millis(10);
        let state = (5, 100, 5);
        let mut backoff = Backoff::new(now);
        assert!(backoff.due(now, state));
        let mut at = now;
        for _ in 0..10 {
            backoff.record(at, 0, state, base);
            at += Duration::from_millis(1);
            assert!(!backoff.due(at, state));
            at = backoff.next;
        }
        assert_eq!(backoff.delay, MAX_BACKOFF);
        assert!(backoff.due(now, (5, 100, 4)), "an unpin resets it");
        backoff.record(now, 0, state, base);
        backoff.record(now, 3, state, base);
        assert!(backoff.due(now, state), "a productive round resets it");
    }

    #[test]
    fn targets_follow_the_formula() {
        assert_eq!(
            targets(100, 0.5, 0.9, 0.05),
            Targets {
                ideal: 5,
                lower_bound: 3
            }
        );
        // 0.95 used, hwm 0.9: target 0.1, lower bound 0.05.
        let t = targets(100, 0.95, 0.9, 0.05);
        assert_eq!((t.ideal, t.lower_bound), (10, 5));
        assert_eq!(
            targets(0, 1.0, 0.9, 0.05),
            Targets {
                ideal: 0,
                lower_bound: 0
            }
        );
        assert_eq!(targets(10, 0.5, 0.9, f64::NAN).ideal, 0);
        assert_eq!(targets(3, 1.0, 0.0, 1.0).ideal, 3);
    }

    #[test]
    fn oldest_first_and_soft_pinned_only_to_reach_the_lower_bound() {
        let base = Instant::now();
        let all = vec![
            candidate("new", 10, false, base),
            candidate("old", 900, false, base),
            candidate("soft-old", 999, true, base),
            candidate("mid", 500, false, base),
        ];
        let keys = |v: Vec<Candidate>| v.into_iter().map(|c| c.key).collect::<Vec<_>>();
        let two = Targets {
            ideal: 2,
            lower_bound: 1,
        };
        assert_eq!(keys(choose(all.clone(), two)), ["old", "mid"]);
        let four = Targets {
            ideal: 4,
            lower_bound: 2,
        };
        assert_eq!(keys(choose(all.clone(), four)), ["old", "mid", "new"]);
        let need_four = Targets {
            ideal: 4,
            lower_bound: 4,
        };
        assert_eq!(
            keys(choose(all, need_four)),
            ["old", "mid", "new", "soft-old"]
        );
    }
}
