//! The copy crew: a large host ↔ host copy cut into pieces that helper threads copy
//! alongside the caller, so one copy is not bound by what one core can move.
//!
//! One core copies 5–8 GB/s on the build VM (tens of GB/s less than the memory channels of a
//! server socket), and every same-host byte of the store is one such copy: a put or get
//! between two processes of one host, a real client's copy into a dummy's shared memory, a
//! local replica. [`split_copy`] cuts a copy of at least two [`MIN_PIECE`]s into up to
//! [`threads`] pieces (`MC_COPY_THREADS`, the caller included), one per helper it can claim:
//! a helper is claimed for each queued piece and freed when that piece has landed, so a crew
//! busy with other callers' pieces is never oversubscribed (the copy then runs on fewer
//! threads, or whole on the caller's). The caller copies the first piece and, while any of
//! its pieces is still queued, takes queued pieces itself, so a slow helper wake-up never
//! leaves it idle. It returns only when every piece of its copy has landed: the pointers are
//! borrowed for the call and nothing touches them after it.
//!
//! Threads: `threads() - 1` helpers named `mc-copy-N`, started on the first split copy and
//! kept for the life of the process (blocked on their queue while idle). A process forked
//! after they started has none of them; its copies are not split (see [`Crew::pid`]).
//! Thread-safety: every function is callable from any thread at once; pieces of concurrent
//! copies share the queue.

use super::copy;
use crate::env;
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The smallest piece: a copy shorter than two of these is not split. 1 MiB takes a core
/// 130–200 µs, against the 30–60 µs it takes to wake a blocked helper on the build VM.
pub(super) const MIN_PIECE: usize = 1 << 20;

/// How long a caller whose pieces are all taken spins before it parks: helpers finish
/// their pieces within microseconds of the caller's own when the crew was idle.
const FINISH_SPIN: Duration = Duration::from_micros(50);

/// The threads one large copy is cut across, the caller included: `MC_COPY_THREADS` read
/// once, at most the CPUs of the process's affinity mask (at least 1).
pub fn threads() -> usize {
    static THREADS_NOW: OnceLock<usize> = OnceLock::new();
    *THREADS_NOW.get_or_init(|| {
        let cpus = process_cpus().map_or(1, |mask| {
            // SAFETY: counts the bits of a mask the kernel filled.
            unsafe { libc::CPU_COUNT(&mask) }.max(1) as usize
        });
        let asked = env::COPY_THREADS.get() as usize;
        asked.min(cpus).max(1)
    })
}

/// The CPUs the process may run on: the affinity mask of its main thread, not of the thread
/// that happens to make the first copy (a host application may pin its workers; the helpers
/// must not all land on one worker's CPUs). `None` when the kernel does not say.
fn process_cpus() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is an empty mask; the kernel fills at most its size.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: the mask is ours and its size is passed.
    let got = unsafe { libc::sched_getaffinity(pid, std::mem::size_of_val(&mask), &mut mask) };
    (got == 0).then_some(mask)
}

/// Moves the calling helper onto every CPU of the process (see [`process_cpus`]); a failure
/// leaves it where it was started, which is only slower.
fn spread_over_process_cpus() {
    if let Some(mask) = process_cpus() {
        // SAFETY: pid 0 is the calling thread; the mask is a filled cpu_set_t.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&mask), &mask) };
    }
}

/// How many pieces a copy of `len` bytes is cut into by a crew of `threads`: as many as
/// there are threads, but none shorter than [`MIN_PIECE`]; 1 means "not split".
fn pieces_of(len: usize, threads: usize) -> usize {
    (len / MIN_PIECE).clamp(1, threads.max(1))
}

/// Where piece `i` of `pieces` of a copy of `len` bytes to address `dst` starts and how long
/// it is. Inner boundaries fall on page boundaries of the destination, so no two threads
/// write one cache line; the pieces cover `0..len` once, in order. Needs
/// `pieces <= pieces_of(len, _)`, so every piece keeps most of its [`MIN_PIECE`].
fn piece_at(dst: usize, len: usize, pieces: usize, i: usize) -> (usize, usize) {
    let boundary = |k: usize| match k {
        0 => 0,
        k if k >= pieces => len,
        k => ((dst + k * (len / pieces)) & !4095) - dst,
    };
    let start = boundary(i);
    (start, boundary(i + 1) - start)
}

/// One piece of a caller's copy, queued for whichever thread takes it first.
struct Piece {
    dst: usize,
    src: usize,
    len: usize,
    copy: Arc<Completion>,
}

impl Piece {
    /// Copies the piece, frees the helper claimed for it and counts it done (waking the
    /// caller after the last one).
    fn run(self) {
        // Unit tests: a piece that lands late makes a caller returning early fail its test.
        #[cfg(test)]
        std::thread::sleep(Duration::from_millis(3));
        // SAFETY: the caller of `split_copy` guaranteed both ranges for the whole copy and
        // waits until this piece is counted done before it returns.
        unsafe { copy::copy_piece(self.dst as *mut u8, self.src as *const u8, self.len) };
        FREE_HELPERS.fetch_add(1, Ordering::Release);
        self.copy.piece_done();
    }
}

/// How many pieces of one copy have not landed yet, and the thread waiting for them.
struct Completion {
    remaining: AtomicUsize,
    caller: Thread,
}

impl Completion {
    fn piece_done(&self) {
        // Release: the piece's bytes are visible to the caller that sees the count fall.
        if self.remaining.fetch_sub(1, Ordering::Release) == 1 {
            self.caller.unpark();
        }
    }

    fn done(&self) -> bool {
        self.remaining.load(Ordering::Acquire) == 0
    }
}

/// The helpers and their queue.
struct Crew {
    queue: Sender<Piece>,
    taken: Receiver<Piece>,
    /// The process that started the helpers: in a forked child they do not exist, and a
    /// piece queued there would never run.
    pid: u32,
}

/// Helpers of the crew not claimed by a queued or running piece.
static FREE_HELPERS: AtomicUsize = AtomicUsize::new(0);

/// Claims up to `want` free helpers and returns how many it got (0 when all are busy).
fn claim_helpers(want: usize) -> usize {
    let mut free = FREE_HELPERS.load(Ordering::Acquire);
    loop {
        let got = want.min(free);
        if got == 0 {
            return 0;
        }
        match FREE_HELPERS.compare_exchange_weak(
            free,
            free - got,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return got,
            Err(now) => free = now,
        }
    }
}

/// The process that began starting the crew (0: not begun).
static STARTER: AtomicU32 = AtomicU32::new(0);

/// The process's crew, started on first use; `None` when there is nothing to split across
/// (one thread, or no helper could be started).
fn crew() -> Option<&'static Crew> {
    static CREW: OnceLock<Option<Crew>> = OnceLock::new();
    let me = std::process::id();
    if let Some(ready) = CREW.get() {
        return ready.as_ref().filter(|c| c.pid == me);
    }
    // A child forked while its parent was starting the crew would wait forever for the
    // parent's half-done start: only the process that began it may wait for it.
    match STARTER.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(starter) if starter == me => {}
        Err(_) => return None,
    }
    CREW.get_or_init(|| {
        let (queue, taken) = crossbeam_channel::unbounded::<Piece>();
        let mut helpers = 0;
        for n in 1..threads() {
            let rx = taken.clone();
            let started = std::thread::Builder::new()
                .name(format!("mc-copy-{n}"))
                .spawn(move || {
                    spread_over_process_cpus();
                    while let Ok(piece) = rx.recv() {
                        piece.run();
                    }
                });
            match started {
                Ok(_) => {
                    helpers += 1;
                    FREE_HELPERS.fetch_add(1, Ordering::Release);
                }
                Err(e) => {
                    tracing::warn!(
                        "copy helper {n} did not start ({e}); large copies use {helpers} helpers"
                    );
                    break;
                }
            }
        }
        (helpers > 0).then(|| Crew {
            queue,
            taken,
            pid: me,
        })
    })
    .as_ref()
    .filter(|c| c.pid == me)
}

/// Copies `len` bytes from `src` to `dst` (host memory both) split across the crew, and
/// returns true; returns false without copying anything when the copy is too short to
/// split or there is no crew (the caller then copies it whole).
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes of host memory until the call
/// returns; the ranges do not overlap.
pub(super) unsafe fn split_copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
    if len < 2 * MIN_PIECE || threads() < 2 {
        return false;
    }
    let Some(crew) = crew() else {
        return false;
    };
    let pieces = claim_helpers(pieces_of(len, threads()) - 1) + 1;
    if pieces < 2 {
        return false;
    }
    let completion = Arc::new(Completion {
        remaining: AtomicUsize::new(pieces - 1),
        caller: std::thread::current(),
    });
    for i in 1..pieces {
        let (offset, piece_len) = piece_at(dst as usize, len, pieces, i);
        let piece = Piece {
            dst: dst as usize + offset,
            src: src as usize + offset,
            len: piece_len,
            copy: Arc::clone(&completion),
        };
        if let Err(unsent) = crew.queue.send(piece) {
            // Cannot happen while `crew` holds the receiver; copy it here all the same.
            unsent.0.run();
        }
    }
    let (_, first) = piece_at(dst as usize, len, pieces, 0);
    // SAFETY: the first piece, within the caller's ranges.
    unsafe { copy::copy_piece(dst, src, first) };
    wait_for(crew, &completion);
    true
}

/// Returns once every piece of `completion` has landed, copying queued pieces meanwhile.
fn wait_for(crew: &Crew, completion: &Completion) {
    while !completion.done() {
        match crew.taken.try_recv() {
            Ok(piece) => piece.run(),
            Err(_) => break,
        }
    }
    let spin_until = Instant::now() + FINISH_SPIN;
    while !completion.done() {
        if Instant::now() < spin_until {
            std::hint::spin_loop();
        } else {
            // A stale wake-up token only makes one turn of the loop return early.
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_cut_into_whole_pieces_no_shorter_than_the_minimum() {
        assert_eq!(pieces_of(MIN_PIECE * 2 - 1, 4), 1);
        assert_eq!(pieces_of(MIN_PIECE * 2, 4), 2);
        assert_eq!(pieces_of(MIN_PIECE * 64, 4), 4);
        assert_eq!(pieces_of(MIN_PIECE * 64, 1), 1);
        assert_eq!(pieces_of(0, 0), 1);
    }

    #[test]
    fn pieces_cover_the_copy_once_in_order_and_split_on_destination_pages() {
        for dst in [0x10_0000usize, 0x10_0001, 0x7f00_0000_0fff] {
            for len in [
                2 * MIN_PIECE,
                2 * MIN_PIECE + 1,
                5 * MIN_PIECE + 12_345,
                64 << 20,
            ] {
                for pieces in 1..=pieces_of(len, 16) {
                    let mut next = 0;
                    for i in 0..pieces {
                        let (start, n) = piece_at(dst, len, pieces, i);
                        assert_eq!(start, next, "dst {dst:#x} len {len} piece {i}/{pieces}");
                        assert!(n >= MIN_PIECE / 2, "piece {i}/{pieces} of {len}: {n}");
                        if i > 0 {
                            assert_eq!((dst + start) % 4096, 0, "boundary on a page");
                        }
                        next = start + n;
                    }
                    assert_eq!(next, len, "dst {dst:#x} len {len} in {pieces}");
                }
            }
        }
    }

    #[test]
    fn a_split_copy_lands_every_byte_and_only_those() {
        // Odd length, unaligned ends: the last piece takes the rest. Other tests of this
        // process may hold the helpers for a moment (the copy is then not split), so try a
        // bounded number of times until one copy is split.
        let len = 5 * MIN_PIECE + 12_345;
        let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut splits = 0;
        for _ in 0..500 {
            let mut dst = vec![0xEEu8; len + 2];
            if unsafe { split_copy(dst[1..].as_mut_ptr(), src.as_ptr(), len) } {
                assert!(dst[1..=len] == src[..], "the split copy's bytes");
                assert_eq!((dst[0], dst[len + 1]), (0xEE, 0xEE), "bytes outside it");
                splits += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            splits,
            usize::from(threads() > 1),
            "splits when the crew has helpers"
        );
    }

    #[test]
    fn concurrent_split_copies_each_get_their_own_bytes_and_free_their_helpers() {
        let len = 4 * MIN_PIECE;
        // 4 threads × 8 copies at once, every copy checked. Other tests of this process may
        // hold the helpers meanwhile (on 2 CPUs there is one), so a whole attempt can run
        // unsplit: attempts repeat, bounded in count and time, until one copy was split.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut splits = 0;
        for _attempt in 0..50 {
            let workers: Vec<_> = (0..4u8)
                .map(|t| {
                    std::thread::spawn(move || {
                        let mut splits = 0;
                        for round in 0..8u8 {
                            let src = vec![t.wrapping_mul(16).wrapping_add(round); len];
                            let mut dst = vec![0u8; len];
                            if unsafe { split_copy(dst.as_mut_ptr(), src.as_ptr(), len) } {
                                assert!(dst == src, "thread {t} round {round}");
                                splits += 1;
                            }
                        }
                        splits
                    })
                })
                .collect();
            splits += workers
                .into_iter()
                .map(|w| w.join().unwrap())
                .sum::<usize>();
            if splits > 0 || threads() < 2 || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if threads() < 2 {
            assert_eq!(splits, 0);
            return;
        }
        assert!(splits > 0, "no copy of 32 was split in any attempt");
        // Every claim is given back (other tests may hold a helper for a moment).
        let deadline = Instant::now() + Duration::from_secs(5);
        while FREE_HELPERS.load(Ordering::Acquire) != threads() - 1 {
            assert!(Instant::now() < deadline, "claims leaked");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
