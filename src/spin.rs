//! Time helpers: [`deadline`] (an `Instant` that never overflows) and bounded busy-waiting
//! for a socket to become readable, before a blocking wait on it.
//!
//! A thread that blocks for an answer lets its CPU go idle, and waking an idle CPU (a deep
//! C-state on bare metal, a halted vCPU in a virtual machine) costs tens of microseconds per
//! wake-up. On the 2-core build VM a loopback round trip took about 12 µs while both ends were
//! awake and 60–70 µs while they slept, so a master query (one round trip) cost 70–80 µs.
//! A caller expecting a quick answer therefore first polls its socket for up to [`budget`]
//! (`MC_RPC_SPIN_US`, default 100 µs; 0 turns spinning off) and only then blocks as before.
//! Callers that spin ([`before_read`]): the RPC client (master calls and P2P peer calls), the
//! TCP transfer client (once per pipelined send, before it reads the answers) and a dummy
//! client's link to its real client. No server spins waiting for its next request: a server
//! thread doing so would take a CPU from the processes it waits on, and on a 2-core machine
//! that cost more than it saved (measured; `docs/benchmarks.md`, sixth session). (A real
//! client transferring for a dummy is a TCP client then, and spins as one.) A wait may so
//! last up to the budget longer than a socket's read timeout.
//!
//! The spinning thread has nothing else to do while its answer is out, so the cost is its own
//! CPU time, at most the budget per wait — as long as a CPU is free for the thread that
//! answers. At most one thread fewer than the process's CPUs (at least one) spins at a time
//! ([`SpinSlots`]); a thread that finds every slot taken blocks at once. Without that cap, 64
//! threads of one process waiting for the master on a 2-core machine spent both cores
//! polling, and the master they waited on (in that process, or beside it) got what was left
//! (`mc_bench --load`, `docs/benchmarks.md`). Spinning never changes what is read, only when
//! the thread looks: [`until_readable`] reads nothing and leaves the socket as it was.
//! Thread-safety: free functions, callable from any thread.

use crate::env::RPC_SPIN_US;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The default of `MC_RPC_SPIN_US`, in microseconds: above a loopback wake-up of an idle CPU
/// (25–60 µs measured on the build VM), far below any timeout.
pub const DEFAULT_SPIN_US: u64 = RPC_SPIN_US.default;

/// The most `MC_RPC_SPIN_US` may ask for (1 ms): past it a wait is a wait, not a wake-up.
pub const MAX_SPIN_US: u64 = RPC_SPIN_US.max;

/// The process's spin budget: `MC_RPC_SPIN_US` read once (missing: [`DEFAULT_SPIN_US`];
/// unparsable or above [`MAX_SPIN_US`]: the default, logged as a warning; 0: no spinning).
pub fn budget() -> Duration {
    static BUDGET: OnceLock<Duration> = OnceLock::new();
    *BUDGET.get_or_init(|| Duration::from_micros(RPC_SPIN_US.get()))
}

/// How many threads may spin at once, and how many do. Thread-safe (atomics).
pub(crate) struct SpinSlots {
    limit: usize,
    taken: AtomicUsize,
}

/// A slot held while its thread spins; given back when dropped.
pub(crate) struct SpinSlot<'a>(&'a SpinSlots);

impl SpinSlots {
    /// Room for `limit` spinning threads (at least one).
    pub(crate) const fn new(limit: usize) -> SpinSlots {
        SpinSlots {
            limit: if limit == 0 { 1 } else { limit },
            taken: AtomicUsize::new(0),
        }
    }

    /// The process's slots: one fewer than its CPUs, at least one.
    pub(crate) fn process() -> &'static SpinSlots {
        static SLOTS: OnceLock<SpinSlots> = OnceLock::new();
        SLOTS.get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            SpinSlots::new(cpus.saturating_sub(1))
        })
    }

    /// A slot, or `None` when `limit` threads spin already.
    pub(crate) fn take(&self) -> Option<SpinSlot<'_>> {
        let before = self.taken.fetch_add(1, Ordering::AcqRel);
        if before < self.limit {
            return Some(SpinSlot(self));
        }
        self.taken.fetch_sub(1, Ordering::AcqRel);
        None
    }
}

impl Drop for SpinSlot<'_> {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Polls `fd` without blocking, with a CPU pause between polls, until it is readable, hung
/// up or in error (true) or `budget` has passed (false; at once for a zero budget, and when
/// the process's [`SpinSlots`] are all taken). The caller then reads (or blocks) as it would
/// have without the spin. An interrupted poll ends the spin early (true: the read that
/// follows sees the socket as it is).
pub fn until_readable(fd: BorrowedFd<'_>, budget: Duration) -> bool {
    until_readable_in(SpinSlots::process(), fd, budget)
}

/// [`until_readable`] holding a slot of `slots` while it spins.
pub(crate) fn until_readable_in(slots: &SpinSlots, fd: BorrowedFd<'_>, budget: Duration) -> bool {
    if budget.is_zero() {
        return false;
    }
    let Some(_slot) = slots.take() else {
        return false;
    };
    let start = Instant::now();
    loop {
        let mut poll = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of a descriptor borrowed for the call; zero timeout.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        if ready != 0 {
            // Readable, hung up, in error, or the poll failed: the read says which.
            return true;
        }
        if start.elapsed() >= budget {
            return false;
        }
        std::hint::spin_loop();
    }
}

/// What a client calls right before the blocking read of an answer it expects soon:
/// [`until_readable`] with the process's [`budget`].
pub fn before_read(socket: &impl AsFd) {
    until_readable(socket.as_fd(), budget());
}

/// Longest span a deadline may lie ahead (keeps `Instant` arithmetic from overflowing).
const MAX_SPAN: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `from + span`, with `span` capped at a century so absurd configured values never panic.
pub(crate) fn deadline(from: Instant, span: Duration) -> Instant {
    from.checked_add(span.min(MAX_SPAN)).unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// Slots of the test's own: the process's are shared with every other test's RPCs, which
    /// may hold the only one while a case here expects to spin.
    fn own() -> SpinSlots {
        SpinSlots::new(1)
    }

    #[test]
    fn the_budget_is_read_as_microseconds_with_a_default_and_a_cap() {
        let budget_from = |value| Duration::from_micros(RPC_SPIN_US.read(value));
        assert_eq!(budget_from(None), Duration::from_micros(DEFAULT_SPIN_US));
        assert_eq!(budget_from(Some(" 250 ")), Duration::from_micros(250));
        assert_eq!(
            budget_from(Some("1000")),
            Duration::from_micros(MAX_SPIN_US)
        );
        assert_eq!(budget_from(Some("0")), Duration::ZERO);
        assert_eq!(
            budget_from(Some("soon")),
            Duration::from_micros(DEFAULT_SPIN_US)
        );
        assert_eq!(
            budget_from(Some("1001")),
            Duration::from_micros(DEFAULT_SPIN_US)
        );
    }

    #[test]
    fn a_readable_socket_ends_the_spin_at_once_and_keeps_its_bytes() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        a.write_all(b"x").unwrap();
        let start = Instant::now();
        assert!(until_readable_in(&own(), b.as_fd(), Duration::from_secs(5)));
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        let mut byte = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &b, &mut byte).unwrap(), 1);
        assert_eq!(&byte, b"x");
    }

    #[test]
    fn a_silent_socket_is_given_up_after_the_budget_and_a_zero_budget_never_polls() {
        let (_a, b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        assert!(!until_readable_in(
            &own(),
            b.as_fd(),
            Duration::from_millis(30)
        ));
        assert!(start.elapsed() >= Duration::from_millis(30));
        // A zero budget returns false even for a readable socket: it does not look.
        let (mut c, d) = UnixStream::pair().unwrap();
        c.write_all(b"x").unwrap();
        assert!(!until_readable_in(&own(), d.as_fd(), Duration::ZERO));
    }

    #[test]
    fn no_more_threads_spin_than_there_are_slots() {
        let slots = SpinSlots::new(1);
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"x").unwrap();
        let held = slots.take().expect("a free slot");
        assert!(slots.take().is_none(), "the only slot is taken");
        // Every slot taken: no spin, not even on a readable socket.
        let start = Instant::now();
        assert!(!until_readable_in(
            &slots,
            b.as_fd(),
            Duration::from_secs(5)
        ));
        assert!(start.elapsed() < Duration::from_secs(4));
        drop(held);
        assert!(until_readable_in(&slots, b.as_fd(), Duration::from_secs(5)));
        assert!(slots.take().is_some(), "the spin gave its slot back");
        assert_eq!(SpinSlots::new(0).limit, 1);
        assert!(SpinSlots::process().limit >= 1);
    }

    #[test]
    fn a_hung_up_socket_ends_the_spin() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(until_readable_in(&own(), b.as_fd(), Duration::from_secs(5)));
    }
}
