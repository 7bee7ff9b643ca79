//! [`GuardedRange`]: a mapping of another process's shared file that cannot kill this process
//! with SIGBUS.
//!
//! Sealing a file against shrinking does not stop a holder of it (its owner, or any process it
//! was passed to) from punching holes in it (`fallocate(PUNCH_HOLE)`, `madvise(MADV_REMOVE)`).
//! The next access of such a page allocates a fresh one, and where the kernel cannot account
//! it (strict overcommit, `vm.overcommit_memory=2`, at the commit limit) the access raises
//! SIGBUS in whichever process touched it: the real client copying into a dummy's block, a
//! client writing a peer's segment. So every mapping of a peer's file registers its range
//! here, and a SIGBUS handler (installed with the first registration) treats a fault inside a
//! registered range as a failed copy instead of a fatal signal:
//!
//! 1. the range is marked as having lost pages ([`GuardedRange::lost_pages`]), before anything
//!    else, so every copy that checks afterwards fails;
//! 2. the 2 MiB-aligned window around the address (clipped to the range) is mapped over with a
//!    scratch file allocated when the handler was installed, so the faulting instruction runs
//!    again on scratch bytes and the copy finishes without touching the peer's file.
//!
//! Every user of a mapping therefore checks `lost_pages` after each copy and reports the copy
//! failed: what it read may be scratch bytes, what it wrote may have gone to scratch. A range
//! that lost pages never becomes trustworthy again (its owner must map the file anew). Any
//! other SIGBUS — outside every registered range, or sent by a process — goes to the handler
//! installed before ours, or gets the default action (the process dies as it would have).
//!
//! Limits: a handler installed later by someone else that does not chain to ours bypasses the
//! guard; at most [`MAX_RANGES`] ranges are registered at once. The handler is async-signal-safe:
//! atomic loads and stores and one `mmap` call; it allocates nothing and takes no lock.

use crate::error::{fail, ErrorCode, Result};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

const SLOTS_PER_BLOCK: usize = 1024;
const BLOCKS: usize = 1024;
/// The most ranges registered at one time (a million; the dummy server and the same-host
/// client cap their mappings far below this).
pub(crate) const MAX_RANGES: usize = SLOTS_PER_BLOCK * BLOCKS;
/// The window mapped over with scratch per fault, and the scratch file's size.
const WINDOW: usize = 2 << 20;

/// One registered range: `start == 0` is a free slot. Written by registration and release
/// (the slot's owner), read by the signal handler without a lock: `generation` is odd while a
/// writer changes `start` and `end`, and moves on with every change, so the handler takes
/// the two from one registration only ([`Slot::range`]).
struct Slot {
    generation: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
    lost: AtomicBool,
}

impl Slot {
    /// Sets the range (`start` 0: free), bracketed by two generation steps.
    fn set(&self, start: usize, end: usize) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.end.store(end, Ordering::SeqCst);
        self.start.store(start, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The registered range, read consistently: `None` for a free slot or one a writer is
    /// changing now (no copy can be using such a range: its mapping is being made or
    /// dropped). Async-signal-safe: atomic loads only, no waiting.
    fn range(&self) -> Option<(usize, usize)> {
        let before = self.generation.load(Ordering::SeqCst);
        if before % 2 == 1 {
            return None;
        }
        let start = self.start.load(Ordering::SeqCst);
        let end = self.end.load(Ordering::SeqCst);
        let stable = self.generation.load(Ordering::SeqCst) == before;
        (stable && start != 0).then_some((start, end))
    }
}

type Block = [Slot; SLOTS_PER_BLOCK];

/// Blocks of slots, allocated on demand and never freed (24 KiB each, leaked on purpose: the
/// handler may read any of them at any time).
static BLOCK_TABLE: [AtomicPtr<Block>; BLOCKS] = [const { AtomicPtr::new(null_mut()) }; BLOCKS];
/// How many leading entries of [`BLOCK_TABLE`] are allocated.
static BLOCKS_IN_USE: AtomicUsize = AtomicUsize::new(0);
/// The scratch file mapped over faulting windows (-1 until the handler is installed).
static SCRATCH_FD: AtomicI32 = AtomicI32::new(-1);
/// The SIGBUS action before ours, to pass on faults that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// Our SIGBUS action, to put back after a previous handler that may have replaced it.
static OURS: OnceLock<libc::sigaction> = OnceLock::new();
/// Whether the handler is in place (or why not).
static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

struct FreeSlots {
    /// Slots below this index have been handed out at least once.
    next: usize,
    /// Released slots, reused first.
    free: Vec<usize>,
}

static FREE_SLOTS: Mutex<FreeSlots> = Mutex::new(FreeSlots {
    next: 0,
    free: Vec::new(),
});

/// A registered range of a mapping of a peer's file.
///
/// Ownership: owns its registration (released on drop, which must come before the range is
/// unmapped). Thread-safety: `Send` and `Sync`; `lost_pages` may be read from any thread.
#[derive(Debug)]
pub(crate) struct GuardedRange {
    index: usize,
}

impl GuardedRange {
    /// Registers `[base, base + len)` (`base` page-aligned, as `mmap` returns it), installing
    /// the handler on first use.
    ///
    /// Errors: `INTERNAL_ERROR` when the handler or its scratch file cannot be set up (no
    /// memory for 2 MiB of scratch, `sigaction` refused) or [`MAX_RANGES`] are registered.
    pub(crate) fn register(base: usize, len: usize) -> Result<GuardedRange> {
        if let Err(why) = INSTALLED.get_or_init(install) {
            return fail(
                ErrorCode::InternalError,
                format!("the SIGBUS guard for peer mappings is not in place: {why}"),
            );
        }
        let end = base.saturating_add(len).next_multiple_of(page_size());
        let index = {
            let mut slots = FREE_SLOTS.lock().unwrap_or_else(|p| p.into_inner());
            match slots.free.pop() {
                Some(index) => index,
                None if slots.next < MAX_RANGES => {
                    let index = slots.next;
                    if index.is_multiple_of(SLOTS_PER_BLOCK) {
                        let block: &'static Block =
                            Box::leak(Box::new(std::array::from_fn(|_| Slot {
                                generation: AtomicU64::new(0),
                                start: AtomicUsize::new(0),
                                end: AtomicUsize::new(0),
                                lost: AtomicBool::new(false),
                            })));
                        let b = index / SLOTS_PER_BLOCK;
                        BLOCK_TABLE[b].store((block as *const Block).cast_mut(), Ordering::Release);
                        BLOCKS_IN_USE.store(b + 1, Ordering::Release);
                    }
                    slots.next += 1;
                    index
                }
                None => {
                    return fail(
                        ErrorCode::InternalError,
                        format!("more than {MAX_RANGES} mappings of peers' files at once"),
                    )
                }
            }
        };
        let slot = slot(index);
        slot.lost.store(false, Ordering::SeqCst);
        slot.set(base, end);
        Ok(GuardedRange { index })
    }

    /// Whether a fault inside the range was recovered: some of the peer's pages are gone, and
    /// every copy that touched the range since may have moved scratch bytes. Read it after a
    /// copy (it is set before the window is replaced).
    pub(crate) fn lost_pages(&self) -> bool {
        slot(self.index).lost.load(Ordering::SeqCst)
    }
}

impl Drop for GuardedRange {
    fn drop(&mut self) {
        slot(self.index).set(0, 0);
        let mut slots = FREE_SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        slots.free.push(self.index);
    }
}

fn slot(index: usize) -> &'static Slot {
    let block = BLOCK_TABLE[index / SLOTS_PER_BLOCK].load(Ordering::Acquire);
    // SAFETY: a registered index's block was stored before the index was handed out and is
    // never freed.
    unsafe { &(*block)[index % SLOTS_PER_BLOCK] }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096).max(1)
}

/// Creates the scratch file (its pages allocated now, so mapping it never needs memory) and
/// installs the handler, remembering the action before it.
fn install() -> std::result::Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: a constant name and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"mooncake-sigbus-scratch".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os("memfd_create of the scratch file"));
    }
    // SAFETY: our fresh descriptor; results checked. The descriptor stays open for the
    // process's life (the handler maps it).
    unsafe {
        if libc::fallocate(fd, 0, 0, WINDOW as libc::off_t) != 0 {
            let err = os("allocating the scratch file");
            libc::close(fd);
            return Err(err);
        }
    }
    SCRATCH_FD.store(fd, Ordering::Release);
    // SAFETY: sigaction structs are plain data; the calls are checked.
    unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, null_mut(), &mut previous) != 0 {
            return Err(os("reading the SIGBUS action"));
        }
        let _ = PREVIOUS.set(previous);
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_sigbus
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut ours.sa_mask);
        let ours = OURS.get_or_init(|| ours);
        if libc::sigaction(libc::SIGBUS, ours, null_mut()) != 0 {
            return Err(os("installing the SIGBUS handler"));
        }
    }
    Ok(())
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A positive code is a fault the kernel raised (BUS_ADRERR and kin); others were sent.
    if code > 0 && recover(addr) {
        return;
    }
    pass_on(sig, code, info, context);
}

/// Marks the registered range holding `addr` as having lost pages and maps scratch over the
/// window around `addr`. False if no range holds it or the mapping failed.
fn recover(addr: usize) -> bool {
    let scratch = SCRATCH_FD.load(Ordering::Acquire);
    if scratch < 0 {
        return false;
    }
    let in_use = BLOCKS_IN_USE.load(Ordering::Acquire);
    for entry in &BLOCK_TABLE[..in_use] {
        let block = entry.load(Ordering::Acquire);
        if block.is_null() {
            continue;
        }
        // SAFETY: blocks are never freed.
        for slot in unsafe { &*block } {
            let Some((start, end)) = slot.range() else {
                continue;
            };
            if addr < start || addr >= end {
                continue;
            }
            slot.lost.store(true, Ordering::SeqCst);
            let window = addr & !(WINDOW - 1);
            let (lo, hi) = (window.max(start), window.saturating_add(WINDOW).min(end));
            // SAFETY: [lo, hi) lies inside the one registration `range` read whole, a live
            // mapping of a peer's file that this process made: ranges are released before
            // they are unmapped, and the faulting copy keeps its mapping (so the
            // registration) alive until it returns. Replacing it with scratch pages is the
            // recovery.
            let mapped = unsafe {
                libc::mmap(
                    lo as *mut libc::c_void,
                    hi - lo,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    scratch,
                    0,
                )
            };
            return mapped != libc::MAP_FAILED;
        }
    }
    false
}

/// Hands a SIGBUS that is not ours on as the action before ours would have taken it:
/// - a signal sent by a process (`code <= 0`): ignored if that action ignored it, the
///   process ended if it was the default; a handler runs, and ours is put back afterwards
///   (Rust's own handler, for one, resets the action to the default when the address is not
///   its guard page, which would leave every later punched-hole fault unguarded);
/// - a fault outside every registered range: a handler runs (it may recover, e.g. the stack
///   guard); with none, the default action is restored and the instruction, run again,
///   ends the process as it would have.
fn pass_on(
    sig: libc::c_int,
    code: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let sent = code <= 0;
    let handler = PREVIOUS.get().map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    match (handler, PREVIOUS.get()) {
        (libc::SIG_IGN, _) if sent => {}
        (libc::SIG_DFL | libc::SIG_IGN, _) | (_, None) => {
            // SAFETY: restoring the default action and re-raising are async-signal-safe.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &default, null_mut());
                if sent {
                    libc::raise(libc::SIGBUS);
                }
            }
        }
        (_, Some(previous)) => {
            // SAFETY: the previous action's handler has the signature its flags say.
            unsafe {
                if previous.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(handler);
                    f(sig, info, context);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                    f(sig);
                }
            }
            if let (true, Some(ours)) = (sent, OURS.get()) {
                // SAFETY: sigaction is async-signal-safe; `ours` is the action installed.
                unsafe { libc::sigaction(libc::SIGBUS, ours, null_mut()) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handler's read of a slot never pairs one registration's start with another's
    /// end, while the slot is released and registered again (by another thread) meanwhile.
    #[test]
    fn a_slot_is_read_whole_while_it_is_reused() {
        let slot: &'static Slot = Box::leak(Box::new(Slot {
            generation: AtomicU64::new(0),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            lost: AtomicBool::new(false),
        }));
        let ranges = [(0x1000, 0x9000), (0x5000_0000, 0x5000_2000)];
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut turns = 0u64;
                while !stop.load(Ordering::Relaxed) && turns < 50_000_000 {
                    let (start, end) = ranges[(turns % 2) as usize];
                    slot.set(start, end);
                    slot.set(0, 0);
                    turns += 1;
                }
            })
        };
        let started = std::time::Instant::now();
        let mut seen = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            if let Some(range) = slot.range() {
                assert!(ranges.contains(&range), "a torn range {range:x?}");
                seen += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(seen > 0, "no registration was ever read");
    }
}
