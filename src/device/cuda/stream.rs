//! [`StreamOps`] for CUDA: work on the caller's `CUstream` through the driver API
//! (`../shared/spec/streams.md` §1).
//!
//! - gate: `cuStreamWaitValue32_v2(EQ)` on the gate word's device address (the v2 stream
//!   memory operations are on by default from driver 11.7);
//! - copies: `cuMemcpyAsync` with UVA addresses (one side device memory, the other pinned);
//! - release marker: `cuLaunchHostFunc`;
//! - capture check: `cuStreamIsCapturing`;
//! - our worker threads switch to relaxed capture mode (`cuThreadExchangeStreamCaptureMode`),
//!   so a caller's global-mode capture elsewhere cannot make their driver calls fail.
//!
//! Contexts: every call runs with the *stream's* context pushed (`cuStreamGetCtx`) and popped
//! afterwards; the special handles `CU_STREAM_LEGACY` (0x1) and `CU_STREAM_PER_THREAD` (0x2)
//! (and 0, which never reaches here) belong to whatever context is current, so they get
//! device 0's primary context. Thread-safety: stateless apart from the retained contexts;
//! any thread may call. Errors name the driver call and its `CUresult`; nothing panics,
//! because every symbol below is in [`STREAM`], probed at load time.

use super::{check, sys, with_pushed, Cuda};
use crate::device::StreamOps;
use cudarc::driver::sys::{CUcontext, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus};
use std::ffi::c_void;
use std::time::Duration;

/// The symbols stream operations need; missing any one disables them (one info log line).
pub(super) const STREAM: &[&str] = &[
    "cuStreamIsCapturing",
    "cuMemHostGetDevicePointer_v2",
    "cuStreamWaitValue32_v2",
    "cuMemcpyAsync",
    "cuLaunchHostFunc",
    "cuStreamGetCtx",
    "cuThreadExchangeStreamCaptureMode",
];
/// `CU_STREAM_WAIT_VALUE_EQ`.
const WAIT_VALUE_EQ: u32 = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: u32 = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as u32;

impl Cuda {
    /// Runs `f` with `stream`'s context pushed on this thread.
    fn with_stream_context<T>(
        &self,
        stream: usize,
        f: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        if stream <= 2 {
            return self.with_context(0, f);
        }
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: probed symbol; `stream` is a caller's live stream handle.
        check(
            unsafe { sys::cuStreamGetCtx(stream as CUstream, &mut context) },
            "cuStreamGetCtx",
        )?;
        // SAFETY: the stream's own context lives at least as long as the stream.
        unsafe { with_pushed(context, f) }
    }
}

impl StreamOps for Cuda {
    /// `cuStreamIsCapturing`: ACTIVE is `true`, NONE `false`, INVALIDATED an error (the
    /// caller's capture already failed; enqueueing would only add to the confusion).
    fn is_capturing(&self, stream: usize) -> Result<bool, String> {
        self.with_stream_context(stream, || {
            // Read as a plain integer: an unexpected value must not become an invalid enum.
            let mut status: u32 = 0;
            // SAFETY: probed symbol; the out-slot is a 4-byte enum-sized integer.
            check(
                unsafe {
                    sys::cuStreamIsCapturing(
                        stream as CUstream,
                        (&mut status as *mut u32).cast::<CUstreamCaptureStatus>(),
                    )
                },
                "cuStreamIsCapturing",
            )?;
            super::super::capture_state(i64::from(status), "cuStreamIsCapturing")
        })
    }

    /// `cuMemHostGetDevicePointer_v2(&dptr, host, 0)` under device 0's primary context (the
    /// memory was registered portable and device-mapped under it).
    fn device_address(&self, host_addr: usize) -> Result<usize, String> {
        self.with_context(0, || {
            let mut device_ptr = 0u64;
            // SAFETY: probed symbol; the driver only looks the address up.
            check(
                unsafe {
                    sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host_addr as *mut c_void, 0)
                },
                "cuMemHostGetDevicePointer_v2",
            )?;
            usize::try_from(device_ptr)
                .map_err(|_| format!("device address {device_ptr:#x} does not fit a usize"))
        })
    }

    /// `cuStreamWaitValue32_v2(stream, device_addr, value, EQ)`. The device polls the word
    /// itself, so `host_addr` and `timeout` are not used.
    unsafe fn enqueue_wait(
        &self,
        stream: usize,
        _host_addr: usize,
        device_addr: usize,
        value: u32,
        _timeout: Duration,
    ) -> Result<(), String> {
        self.with_stream_context(stream, || {
            // SAFETY: probed symbol; the caller keeps the word mapped until the stream passed.
            check(
                unsafe {
                    sys::cuStreamWaitValue32_v2(
                        stream as CUstream,
                        device_addr as u64,
                        value,
                        WAIT_VALUE_EQ,
                    )
                },
                "cuStreamWaitValue32_v2",
            )
        })
    }

    /// `cuMemcpyAsync(dst, src, len, stream)` (UVA: the direction follows from the
    /// addresses).
    unsafe fn enqueue_copy(
        &self,
        stream: usize,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<(), String> {
        self.with_stream_context(stream, || {
            // SAFETY: probed symbol; the caller keeps both ranges valid until the stream passed.
            check(
                unsafe { sys::cuMemcpyAsync(dst as u64, src as u64, len, stream as CUstream) },
                "cuMemcpyAsync",
            )
        })
    }

    /// `cuLaunchHostFunc(stream, f, arg)`: `f` runs on a driver thread.
    unsafe fn enqueue_host_fn(
        &self,
        stream: usize,
        f: unsafe extern "C" fn(*mut c_void),
        arg: *mut c_void,
    ) -> Result<(), String> {
        self.with_stream_context(stream, || {
            // SAFETY: probed symbol; the caller keeps `arg` valid until `f` ran.
            check(
                unsafe { sys::cuLaunchHostFunc(stream as CUstream, Some(f), arg) },
                "cuLaunchHostFunc",
            )
        })
    }

    /// Switches this thread to `CU_STREAM_CAPTURE_MODE_RELAXED` (a failure is logged: the
    /// thread then keeps the default mode, which only matters while someone captures).
    fn prepare_thread(&self) {
        let relaxed = self.with_context(0, || {
            let mut mode = CAPTURE_MODE_RELAXED;
            // SAFETY: probed symbol; the driver writes the previous mode back into the slot,
            // read as a plain integer.
            check(
                unsafe {
                    sys::cuThreadExchangeStreamCaptureMode(
                        (&mut mode as *mut u32).cast::<CUstreamCaptureMode>(),
                    )
                },
                "cuThreadExchangeStreamCaptureMode",
            )
        });
        if let Err(e) = relaxed {
            tracing::warn!(error = %e, "worker thread keeps the default stream capture mode");
        }
    }
}
