//! [`StreamOps`] for Ascend: work on the caller's `aclrtStream` through ACL
//! (`../shared/spec/streams.md` §3).
//!
//! - copies: `aclrtMemcpyAsync`, the kind (host→device, device→host, device→device) from
//!   classifying both sides; host→host is refused (ACL has no asynchronous host copy);
//! - release marker: `aclrtLaunchHostFunc`;
//! - capture check: `aclmdlRICaptureGetInfo` when the library has it (otherwise, and where
//!   the device reports the feature unsupported, streams are never captured);
//! - gate: **a host function that polls the host word** (the documented fallback,
//!   streams.md §5). ACL's device-side wait, `aclrtValueWait`, needs device memory, and
//!   whether it accepts host memory mapped with `aclrtHostRegister` is undocumented. The
//!   poll blocks one ACL callback thread while the gate is closed, and gives up at the
//!   ticket's deadline (by which time the host has opened the gate anyway).
//! - device addresses: `aclrtHostGetDevicePointer` when present, else the host address
//!   itself (older CANN maps registered host memory at the same address; the address is
//!   only ever read by kernels — the gate poll uses the host word).
//!
//! Contexts: every call makes the backend's context (device 0's default context, created
//! at load) current and then restores the thread's previous context, so the caller's own
//! current context is left as it was. Streams must belong to that context (ACL refuses
//! others with an error, e.g. 107003). Thread-safety: the entry points are plain function
//! pointers; any thread may call. Errors name the ACL call and its return code.

use super::{check, copy_kind, symbol, AclError, Ascend, GetContext};
use crate::device::{dl, Backend, StreamOps};
use libloading::Library;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

type MemcpyAsync =
    unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int, *mut c_void) -> AclError;
type HostFunc = unsafe extern "C" fn(*mut c_void);
type LaunchHostFunc = unsafe extern "C" fn(*mut c_void, HostFunc, *mut c_void) -> AclError;
type CaptureGetInfo = unsafe extern "C" fn(*mut c_void, *mut c_int, *mut *mut c_void) -> AclError;
type HostGetDevicePointer = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, u32) -> AclError;

/// Symbols stream operations cannot do without; missing any one disables them.
const STREAM: &[&str] = &["aclrtMemcpyAsync", "aclrtLaunchHostFunc"];
/// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`: the device cannot capture at all.
const FEATURE_NOT_SUPPORTED: AclError = 207000;
/// Yields before the gate poll starts sleeping between loads.
const POLL_SPINS: u32 = 64;
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// The resolved stream entry points (`None`: optional and absent).
pub(super) struct Streams {
    get_context: GetContext,
    memcpy_async: MemcpyAsync,
    launch_host_func: LaunchHostFunc,
    capture_info: Option<CaptureGetInfo>,
    host_device_pointer: Option<HostGetDevicePointer>,
}

impl Streams {
    /// Resolves the entry points; `None` (one info log line) when a required one is missing.
    /// The library must stay loaded as long as the result lives.
    pub(super) fn load(lib: &Library) -> Option<Streams> {
        let optional = |name: &str| dl::all_present(lib, &[name]).is_ok();
        let resolved = dl::all_present(lib, STREAM).and_then(|()| {
            // SAFETY: the documented ACL prototypes; `aclrtGetCurrentContext` is in CORE.
            unsafe {
                Ok(Streams {
                    get_context: symbol(lib, "aclrtGetCurrentContext")?,
                    memcpy_async: symbol(lib, "aclrtMemcpyAsync")?,
                    launch_host_func: symbol(lib, "aclrtLaunchHostFunc")?,
                    capture_info: if optional("aclmdlRICaptureGetInfo") {
                        Some(symbol(lib, "aclmdlRICaptureGetInfo")?)
                    } else {
                        None
                    },
                    host_device_pointer: if optional("aclrtHostGetDevicePointer") {
                        Some(symbol(lib, "aclrtHostGetDevicePointer")?)
                    } else {
                        None
                    },
                })
            }
        });
        resolved
            .inspect_err(|e| tracing::info!("Ascend stream operations disabled: {e}"))
            .ok()
    }
}

impl Ascend {
    /// The stream entry points (present whenever [`Backend::stream_ops`] handed out `self`).
    fn streams(&self) -> Result<&Streams, String> {
        self.streams
            .as_ref()
            .ok_or_else(|| "Ascend stream operations unavailable".to_string())
    }

    /// Runs `f` with our context current, then restores the thread's previous one.
    fn in_context<T>(
        &self,
        streams: &Streams,
        f: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        let mut previous = std::ptr::null_mut();
        // SAFETY: resolved entry point; fails (leaving NULL) when no context is current.
        let _ = unsafe { (streams.get_context)(&mut previous) };
        self.enter()?;
        let out = f();
        if !previous.is_null() && previous as usize != self.context {
            // SAFETY: resolved entry point; `previous` was current on this thread just now.
            let _ = unsafe { (self.set_context)(previous) };
        }
        out
    }
}

impl StreamOps for Ascend {
    /// `aclmdlRICaptureGetInfo`: ACTIVE is `true`, INVALIDATED an error, anything else (and
    /// a library without the symbol, or a device without capture) `false`.
    fn is_capturing(&self, stream: usize) -> Result<bool, String> {
        let streams = self.streams()?;
        let Some(capture_info) = streams.capture_info else {
            return Ok(false);
        };
        self.in_context(streams, || {
            let mut status: c_int = 0;
            let mut model = std::ptr::null_mut();
            // SAFETY: resolved entry point; both out-slots are valid.
            let rc = unsafe { capture_info(stream as *mut c_void, &mut status, &mut model) };
            if rc == FEATURE_NOT_SUPPORTED {
                return Ok(false);
            }
            check(rc, "aclmdlRICaptureGetInfo")?;
            super::super::capture_state(i64::from(status), "aclmdlRICaptureGetInfo")
        })
    }

    /// `aclrtHostGetDevicePointer(host, &dev, 0)` (a NULL result is an error: the memory is
    /// not registered), or `host_addr` itself without that symbol.
    fn device_address(&self, host_addr: usize) -> Result<usize, String> {
        let streams = self.streams()?;
        let Some(device_pointer) = streams.host_device_pointer else {
            return Ok(host_addr);
        };
        self.in_context(streams, || {
            let mut device = std::ptr::null_mut();
            // SAFETY: resolved entry point; ACL only looks the address up.
            check(
                unsafe { device_pointer(host_addr as *mut c_void, &mut device, 0) },
                "aclrtHostGetDevicePointer",
            )?;
            match device as usize {
                0 => Err("aclrtHostGetDevicePointer: the memory is not registered".into()),
                addr => Ok(addr),
            }
        })
    }

    /// Enqueues (`aclrtLaunchHostFunc`) a host function that polls the host word until it
    /// equals `value` or `timeout` has passed. Its argument is a heap allocation the function
    /// frees itself (or this call, when the launch fails).
    unsafe fn enqueue_wait(
        &self,
        stream: usize,
        host_addr: usize,
        _device_addr: usize,
        value: u32,
        timeout: Duration,
    ) -> Result<(), String> {
        let poll = Box::into_raw(Box::new(GatePoll {
            word: host_addr,
            value,
            deadline: Instant::now() + timeout,
        }));
        // SAFETY: forwarded from the caller (the word stays mapped until the stream passed).
        let launched = unsafe { self.enqueue_host_fn(stream, poll_gate, poll.cast()) };
        if launched.is_err() {
            // SAFETY: not launched, so `poll_gate` never runs; we still own the allocation.
            drop(unsafe { Box::from_raw(poll) });
        }
        launched
    }

    /// `aclrtMemcpyAsync(dst, len, src, len, kind, stream)`.
    unsafe fn enqueue_copy(
        &self,
        stream: usize,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<(), String> {
        let streams = self.streams()?;
        let (dst_kind, src_kind) = (self.classify(dst), self.classify(src));
        if dst_kind.device().is_none() && src_kind.device().is_none() {
            return Err("aclrtMemcpyAsync: host-to-host copies are not asynchronous".into());
        }
        let kind = copy_kind(dst_kind, src_kind);
        self.in_context(streams, || {
            // SAFETY: resolved entry point; the caller keeps both ranges valid until the
            // stream passed the copy.
            check(
                unsafe {
                    (streams.memcpy_async)(
                        dst as *mut c_void,
                        len,
                        src as *const c_void,
                        len,
                        kind,
                        stream as *mut c_void,
                    )
                },
                "aclrtMemcpyAsync",
            )
        })
    }

    /// `aclrtLaunchHostFunc(stream, f, arg)`: `f` runs on an ACL thread.
    unsafe fn enqueue_host_fn(
        &self,
        stream: usize,
        f: unsafe extern "C" fn(*mut c_void),
        arg: *mut c_void,
    ) -> Result<(), String> {
        let streams = self.streams()?;
        self.in_context(streams, || {
            // SAFETY: resolved entry point; the caller keeps `arg` valid until `f` ran.
            check(
                unsafe { (streams.launch_host_func)(stream as *mut c_void, f, arg) },
                "aclrtLaunchHostFunc",
            )
        })
    }
}

/// What the gate poll needs; owned by the poll function once launched.
struct GatePoll {
    /// Host address of the 4-byte-aligned gate word (mapped until the stream passed).
    word: usize,
    value: u32,
    deadline: Instant,
}

impl GatePoll {
    /// Waits (Acquire loads, so the staging bytes written before the gate opened are
    /// visible to the copies after it) until the word equals the value or the deadline.
    fn run(&self) {
        // SAFETY: an aligned u32 inside the gate slab, written by the host only atomically;
        // the slab outlives every ticket whose stream still waits.
        let word = unsafe { &*(self.word as *const AtomicU32) };
        let mut spins = 0;
        while word.load(Ordering::Acquire) != self.value && Instant::now() < self.deadline {
            if spins < POLL_SPINS {
                spins += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
    }
}

/// The gate's host function: runs the poll, then frees its argument.
unsafe extern "C" fn poll_gate(arg: *mut c_void) {
    if arg.is_null() {
        return;
    }
    // SAFETY: `arg` came from `Box::into_raw` in `enqueue_wait`; ACL runs this once.
    let poll = unsafe { Box::from_raw(arg.cast::<GatePoll>()) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| poll.run()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{self, Receiver};
    use std::sync::Arc;

    /// Launches `poll_gate` the way ACL would, on another thread; the receiver gets a message
    /// when it returned.
    fn launch(word: &Arc<AtomicU32>, value: u32, timeout: Duration) -> Receiver<()> {
        let arg = Box::into_raw(Box::new(GatePoll {
            word: word.as_ptr() as usize,
            value,
            deadline: Instant::now() + timeout,
        })) as usize;
        let keep = word.clone();
        let (done, returned) = mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: a fresh allocation handed over once, as `enqueue_wait` does; `keep`
            // holds the word until the poll returned.
            unsafe { poll_gate(arg as *mut c_void) };
            drop(keep);
            let _ = done.send(());
        });
        returned
    }

    #[test]
    fn the_poll_returns_once_the_word_holds_the_value() {
        let word = Arc::new(AtomicU32::new(0));
        let returned = launch(&word, 7, Duration::from_secs(3600));
        word.store(3, Ordering::Release); // another generation: still closed
        word.store(7, Ordering::Release);
        assert!(returned.recv_timeout(Duration::from_secs(30)).is_ok());
    }

    #[test]
    fn the_poll_gives_up_at_its_deadline() {
        let word = Arc::new(AtomicU32::new(0));
        let returned = launch(&word, 1, Duration::from_millis(20));
        assert!(returned.recv_timeout(Duration::from_secs(30)).is_ok());
        assert_eq!(word.load(Ordering::Acquire), 0);
    }
}
