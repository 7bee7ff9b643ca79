//! Device runtimes: which accelerator (if any) this process can reach, what kind of memory a
//! caller's pointer refers to, the one primitive that copies caller memory ([`memcpy_safe`])
//! and host-memory registration ("pinning") for full-bandwidth device DMA.
//!
//! Runtimes, chosen once per process by [`runtime`] (`MC_DEVICE_RUNTIME` = `auto` (default),
//! `cuda`, `ascend` or `none`):
//! - `cuda`: the CUDA driver API through cudarc's `driver::sys`, loaded at run time
//!   (`libcuda.so`); no toolkit is needed at build time. The library and every symbol are
//!   probed before the first call, because cudarc panics on a missing library or symbol.
//! - `ascend`: `libascendcl.so` through `dlopen` (pointer attributes, memcpy, host register,
//!   streams).
//! - host (no runtime): every pointer is host memory and copies are plain memcpys.
//!
//! An absent library means "host only" with one info log line; a missing optional symbol
//! disables only the feature that needs it (see [`DeviceInfo`]).
//!
//! Modules: `copy` ([`memcpy_safe`], the only copy of caller memory in the crate), `crew`
//! (the helper threads a large host copy is split across, `MC_COPY_THREADS`), `pin`
//! ([`HostRegistration`], the pin budget), `region` ([`MappedRegion`], pre-faulted host
//! mappings, optionally pinned), `stats` (counters), `cuda`, `ascend` (each with a `stream`
//! submodule implementing `StreamOps` on the runtime's own streams), `dl` (symbol probing).

mod ascend;
mod copy;
mod crew;
mod cuda;
mod dl;
mod pin;
mod region;
mod stats;

pub use copy::{memcpy_safe, CopyRoute};
pub use crew::threads as copy_threads;
pub use pin::HostRegistration;
pub use region::MappedRegion;
pub use stats::DeviceStats;

use std::sync::OnceLock;

/// What a caller's pointer refers to, as the device runtime sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory the runtime does not know (pageable, or no runtime at all).
    Pageable,
    /// Host memory pinned or registered with the runtime (host-readable).
    PinnedHost,
    /// Memory the host must not dereference: device memory (or managed/array memory) of the
    /// device with this ordinal.
    Device(i32),
}

impl MemoryKind {
    /// The device ordinal for device memory, `None` for host memory.
    pub fn device(self) -> Option<i32> {
        match self {
            MemoryKind::Device(ordinal) => Some(ordinal),
            _ => None,
        }
    }
}

/// A loaded device runtime. Implementations are thread-safe and never panic: every driver
/// symbol they call was probed when they were loaded.
pub(crate) trait Backend: Send + Sync {
    /// `"cuda"` or `"ascend"`.
    fn name(&self) -> &'static str;
    /// Classifies `addr` (unknown or failing lookups are [`MemoryKind::Pageable`]).
    fn classify(&self, addr: usize) -> MemoryKind;
    /// Copies `len` bytes with the driver (at least one side is [`MemoryKind::Device`]);
    /// returns when the destination holds the data (host side) or the copy is ordered
    /// before later work on the device.
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes (on host or device) and do not overlap.
    unsafe fn copy(&self, dst: Side, src: Side, len: usize) -> Result<(), String>;
    /// Whether host registration is available (its symbols resolved).
    fn can_register(&self) -> bool;
    /// Registers `[addr, addr+len)` as pinned, portable and device-mapped host memory.
    ///
    /// # Safety
    /// The range is mapped host memory that stays mapped until [`Backend::unregister`].
    unsafe fn register(&self, addr: usize, len: usize) -> Result<(), String>;
    /// Undoes [`Backend::register`] for the range starting at `addr`.
    ///
    /// # Safety
    /// `addr` is the base of a range registered by `register`.
    unsafe fn unregister(&self, addr: usize) -> Result<(), String>;
    /// Allocates `len` bytes of device memory on device 0 (benchmarks and checks).
    fn alloc_device(&self, _len: usize) -> Result<usize, String> {
        Err("device allocation unsupported".into())
    }
    /// Frees memory from [`Backend::alloc_device`].
    ///
    /// # Safety
    /// `addr` came from `alloc_device` and is no longer used.
    unsafe fn free_device(&self, _addr: usize) -> Result<(), String> {
        Err("device allocation unsupported".into())
    }
    /// Operations on this runtime's own streams, when every symbol they need resolved.
    fn stream_ops(&self) -> Option<&dyn StreamOps> {
        None
    }
    /// The device allocation holding `[addr, addr+len)` exported as a dma-buf, for a NIC to
    /// register it directly (GPUDirect), and the offset of `addr` in it.
    fn export_dmabuf(&self, _addr: usize, _len: usize) -> Result<DmaBuf, String> {
        Err("this device runtime exports no dma-buf".into())
    }
    /// Makes the writes a NIC has completed into memory of device `device` visible to work
    /// the device runs later (GPUDirect RDMA reads into device memory).
    fn flush_nic_writes(&self, _device: i32) -> Result<(), String> {
        Err("this device runtime cannot flush NIC writes".into())
    }
    /// Whether [`Backend::flush_nic_writes`] works on device `device`; `Err` says why not.
    /// GPUDirect is used only where it does.
    fn can_flush_nic_writes(&self, _device: i32) -> Result<(), String> {
        Err("this device runtime cannot flush NIC writes".into())
    }
}

/// A device allocation exported as a dma-buf ([`Runtime::export_dmabuf`]): the descriptor
/// (closed on drop) and where the requested range starts in it.
#[derive(Debug)]
pub struct DmaBuf {
    /// The dma-buf.
    pub fd: std::os::fd::OwnedFd,
    /// Offset of the requested address in the exported allocation.
    pub offset: u64,
}

/// A stream's capture status as both runtimes report it (1 active, 2 invalidated, anything
/// else not capturing) turned into [`StreamOps::is_capturing`]'s answer; `call` names the
/// query in the error.
pub(crate) fn capture_state(status: i64, call: &str) -> Result<bool, String> {
    match status {
        1 => Ok(true),
        2 => Err(format!("{call}: the stream's capture was invalidated")),
        _ => Ok(false),
    }
}

/// Work enqueued on a runtime's own stream (`CUstream`, `aclrtStream`) by the on-stream API
/// (`crate::stream`). Every `enqueue_*` returns without waiting for the device; the work runs
/// in stream order. Streams are raw handles owned by the caller; the caller's current
/// context is left as it was. Implementations never panic.
pub(crate) trait StreamOps: Send + Sync {
    /// Whether `stream` is being captured into a graph (work enqueued now would only be
    /// recorded, not run).
    fn is_capturing(&self, stream: usize) -> Result<bool, String>;
    /// The address under which the device sees the pinned, device-mapped host memory at
    /// `host_addr` (registered through [`Backend::register`]).
    fn device_address(&self, host_addr: usize) -> Result<usize, String>;
    /// Later work on `stream` waits until the 32-bit word at `host_addr` (device address
    /// `device_addr`) equals `value`. Runtimes whose wait is a host function give up after
    /// `timeout` (the host opens every gate before its deadline anyway).
    ///
    /// # Safety
    /// The word stays mapped until the stream has passed the wait.
    unsafe fn enqueue_wait(
        &self,
        stream: usize,
        host_addr: usize,
        device_addr: usize,
        value: u32,
        timeout: std::time::Duration,
    ) -> Result<(), String>;
    /// Enqueues an asynchronous copy of `len` bytes. One side is device memory, the other
    /// pinned host memory (a pageable side could block the caller, see streams.md §1.4).
    ///
    /// # Safety
    /// Both ranges stay valid until the stream has passed the copy.
    unsafe fn enqueue_copy(
        &self,
        stream: usize,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<(), String>;
    /// Enqueues `f(arg)`, run on a runtime thread once earlier work on `stream` is done.
    /// `f` must not block and must not call the runtime.
    ///
    /// # Safety
    /// `arg` stays valid until `f` has run.
    unsafe fn enqueue_host_fn(
        &self,
        stream: usize,
        f: unsafe extern "C" fn(*mut std::ffi::c_void),
        arg: *mut std::ffi::c_void,
    ) -> Result<(), String>;
    /// Called once on each of our worker threads before it uses the runtime (CUDA: relaxed
    /// capture mode, so a caller's capture elsewhere cannot fail our calls).
    fn prepare_thread(&self) {}
}

/// One side of a driver copy: its address and what it is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Side {
    pub(crate) addr: usize,
    pub(crate) kind: MemoryKind,
}

/// Device memory allocated through the runtime (for benchmarks and device checks); freed on
/// drop. Never dereference [`DeviceAlloc::addr`] on the host.
#[derive(Debug)]
pub struct DeviceAlloc {
    addr: usize,
    len: usize,
}

impl DeviceAlloc {
    /// Allocates `len` bytes on device 0. Errors: no runtime, no allocation symbols, or the
    /// driver's refusal.
    pub fn new(len: usize) -> Result<DeviceAlloc, String> {
        let backend = runtime().backend().ok_or("no device runtime")?;
        let addr = backend.alloc_device(len)?;
        Ok(DeviceAlloc { addr, len })
    }

    /// The device address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if let Some(backend) = runtime().backend() {
            // SAFETY: allocated by this backend, dropped once.
            let _ = unsafe { backend.free_device(self.addr) };
        }
    }
}

/// The process's device runtime (or none). Thread-safe; lives for the whole process.
pub struct Runtime {
    backend: Option<Box<dyn Backend>>,
}

/// What the process's runtime offers, for metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// `"cuda"`, `"ascend"` or `"none"`.
    pub runtime: &'static str,
    /// Whether host memory can be registered (pinned) with the runtime.
    pub host_register: bool,
}

impl Runtime {
    /// Loads the runtime `MC_DEVICE_RUNTIME` asks for (default `auto`: CUDA, then Ascend).
    fn load() -> Runtime {
        let wanted = crate::env::DEVICE_RUNTIME.get().unwrap_or_default();
        let wanted = wanted.trim().to_ascii_lowercase();
        let mut reasons = Vec::new();
        let mut attempt = |name: &str, loader: fn() -> Result<Box<dyn Backend>, String>| {
            if !(wanted.is_empty() || wanted == "auto" || wanted == name) {
                return None;
            }
            match loader() {
                Ok(backend) => Some(backend),
                Err(why) => {
                    reasons.push(format!("{name}: {why}"));
                    None
                }
            }
        };
        let backend = if wanted == "none" {
            None
        } else {
            attempt("cuda", cuda::load).or_else(|| attempt("ascend", ascend::load))
        };
        match &backend {
            Some(b) => tracing::info!(
                runtime = b.name(),
                host_register = b.can_register(),
                "device runtime loaded"
            ),
            None => tracing::info!(
                "no device runtime ({}); host-only copies",
                if reasons.is_empty() {
                    format!("{}=none", crate::env::DEVICE_RUNTIME.name)
                } else {
                    reasons.join("; ")
                }
            ),
        }
        Runtime { backend }
    }

    /// What this runtime offers.
    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            runtime: self.backend.as_ref().map_or("none", |b| b.name()),
            host_register: self.backend.as_ref().is_some_and(|b| b.can_register()),
        }
    }

    /// Classifies `addr`; always [`MemoryKind::Pageable`] without a runtime.
    pub fn classify(&self, addr: usize) -> MemoryKind {
        match &self.backend {
            Some(b) if addr != 0 => b.classify(addr),
            _ => MemoryKind::Pageable,
        }
    }

    /// Whether `addr` is memory the host must not dereference.
    pub fn is_device(&self, addr: usize) -> bool {
        self.classify(addr).device().is_some()
    }

    /// The device allocation holding `[addr, addr+len)` as a dma-buf ([`DmaBuf`]).
    ///
    /// Errors: a message saying why not (no runtime, a runtime or driver without dma-buf
    /// export, memory that is not device memory).
    pub fn export_dmabuf(&self, addr: usize, len: usize) -> Result<DmaBuf, String> {
        match &self.backend {
            Some(b) => b.export_dmabuf(addr, len),
            None => Err("no device runtime".into()),
        }
    }

    /// See [`Backend::flush_nic_writes`]. Errors: no runtime, or the driver refused.
    pub fn flush_nic_writes(&self, device: i32) -> Result<(), String> {
        match &self.backend {
            Some(b) => b.flush_nic_writes(device),
            None => Err("no device runtime".into()),
        }
    }

    /// See [`Backend::can_flush_nic_writes`].
    pub fn can_flush_nic_writes(&self, device: i32) -> Result<(), String> {
        match &self.backend {
            Some(b) => b.can_flush_nic_writes(device),
            None => Err("no device runtime".into()),
        }
    }

    /// Returns once the device work ordered before now that may write `[addr, ..)` (device
    /// memory) has finished, as a synchronous driver copy from it would (the staged path's
    /// copy gave a NIC reading the memory that ordering): a one-byte synchronous copy out of
    /// `addr`. Errors: no runtime, or the driver refused.
    pub fn wait_for_writers(&self, addr: usize) -> Result<(), String> {
        let Some(backend) = &self.backend else {
            return Err("no device runtime".into());
        };
        let mut byte = 0u8;
        let dst = Side {
            addr: &mut byte as *mut u8 as usize,
            kind: MemoryKind::Pageable,
        };
        let src = Side {
            addr,
            kind: self.classify(addr),
        };
        // SAFETY: one byte of device memory the caller names, into a byte of ours.
        unsafe { backend.copy(dst, src, 1) }
    }

    pub(crate) fn backend(&self) -> Option<&dyn Backend> {
        self.backend.as_deref()
    }

    /// The stream operations of the runtime named `name` (`"cuda"` / `"ascend"`), when that
    /// runtime is loaded and supports them.
    pub(crate) fn stream_ops(&self, name: &str) -> Option<&dyn StreamOps> {
        self.backend()
            .filter(|b| b.name() == name)
            .and_then(|b| b.stream_ops())
    }
}

/// The process-wide runtime, loaded on first use (one info log line says which).
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(Runtime::load)
}
