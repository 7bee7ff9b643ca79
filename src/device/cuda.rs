//! The CUDA backend: the driver API through cudarc's `driver::sys` (dynamic loading). The
//! library and every symbol are probed before the first call (cudarc panics otherwise).
//!
//! Contexts: each device's primary context is retained at load time (and kept for the life
//! of the process); every driver call runs with the right one pushed on the calling thread
//! and popped afterwards, so the caller's own current context is left untouched.
//!
//! Submodule `stream`: [`super::StreamOps`] on the caller's `CUstream`s (feature group
//! `STREAM`, probed like the others).

mod stream;

use super::dl;
use super::{Backend, MemoryKind, Side, StreamOps};
use cudarc::driver::sys::{self, CUcontext, CUpointer_attribute, CUresult};
use std::ffi::c_void;

/// Needed for anything: init, contexts, classification, copies.
const CORE: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuPointerGetAttributes",
    "cuMemcpy",
];
/// Host registration (pinning segments and bounce buffers).
const REGISTER: &[&str] = &["cuMemHostRegister_v2", "cuMemHostUnregister"];
/// Device allocation (benchmarks and checks only).
const ALLOC: &[&str] = &["cuMemAlloc_v2", "cuMemFree_v2"];
/// Exporting device memory as a dma-buf for a NIC (GPUDirect; CUDA 11.7 and later).
const DMABUF: &[&str] = &[
    "cuMemGetAddressRange_v2",
    "cuMemGetHandleForAddressRange",
    "cuDeviceGetAttribute",
];
/// Ordering NIC writes into device memory before later device work (CUDA 11.3 and later).
const FLUSH: &[&str] = &["cuFlushGPUDirectRDMAWrites", "cuDeviceGetAttribute"];
/// `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST`: the device supports
/// `cuFlushGPUDirectRDMAWrites` (in `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS`).
const FLUSH_OPTION_HOST: i32 = 1;
/// The host page size the driver aligns dma-buf exports to.
const PAGE: u64 = 4096;
/// `CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`.
const REGISTER_FLAGS: u32 = 0x01 | 0x02;

/// A retained primary context. The driver's contexts are usable from any thread.
struct Context(CUcontext);
// SAFETY: a CUcontext is a handle the driver lets any thread push and pop.
unsafe impl Send for Context {}
// SAFETY: as above; we never mutate through it.
unsafe impl Sync for Context {}

struct Cuda {
    contexts: Vec<Context>,
    register: bool,
    alloc: bool,
    /// Whether every symbol of [`stream::STREAM`] resolved.
    stream: bool,
    dmabuf: bool,
    flush: bool,
}

fn check(result: CUresult, what: &str) -> Result<(), String> {
    if result == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} returned {result:?}"))
    }
}

/// Loads the CUDA backend, or says why not.
pub(super) fn load() -> Result<Box<dyn Backend>, String> {
    // SAFETY: only tries to open the candidate library names.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so not found".into());
    }
    // SAFETY: a library is present, so `culib` does not panic.
    let lib = unsafe { sys::culib() };
    dl::all_present(lib, CORE)?;
    // SAFETY: every symbol used below was probed.
    unsafe {
        check(sys::cuInit(0), "cuInit")?;
        let mut count = 0;
        check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
        if count <= 0 {
            return Err("no CUDA device".into());
        }
        let mut contexts = Vec::with_capacity(count as usize);
        for ordinal in 0..count {
            let mut device = 0;
            check(sys::cuDeviceGet(&mut device, ordinal), "cuDeviceGet")?;
            let mut context: CUcontext = std::ptr::null_mut();
            check(
                sys::cuDevicePrimaryCtxRetain(&mut context, device),
                "cuDevicePrimaryCtxRetain",
            )?;
            contexts.push(Context(context));
        }
        let register = feature(lib, REGISTER, "host registration");
        let alloc = feature(lib, ALLOC, "device allocation");
        let stream = feature(lib, stream::STREAM, "stream operations");
        let dmabuf = feature(lib, DMABUF, "dma-buf export (GPUDirect)");
        let flush = feature(lib, FLUSH, "GPUDirect RDMA write flush");
        Ok(Box::new(Cuda {
            contexts,
            register,
            alloc,
            stream,
            dmabuf,
            flush,
        }))
    }
}

/// Whether an optional feature's symbols are all there (logged once when not).
fn feature(lib: &libloading::Library, names: &[&str], what: &str) -> bool {
    match dl::all_present(lib, names) {
        Ok(()) => true,
        Err(e) => {
            tracing::info!("CUDA {what} disabled: {e}");
            false
        }
    }
}

impl Cuda {
    /// Runs `f` with `device`'s primary context current on this thread.
    fn with_context<T>(
        &self,
        device: i32,
        f: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        let context = usize::try_from(device)
            .ok()
            .and_then(|d| self.contexts.get(d))
            .ok_or_else(|| format!("no CUDA device {device}"))?;
        // SAFETY: the context was retained at load time and is never released.
        unsafe { with_pushed(context.0, f) }
    }
}

/// Runs `f` with `context` pushed on this thread, and pops it afterwards (also when `f`
/// fails), so the thread's own current context is left as it was.
///
/// # Safety
/// `context` is a live context.
unsafe fn with_pushed<T>(
    context: CUcontext,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    // SAFETY: probed symbol (CORE); the caller guarantees a live context.
    check(
        unsafe { sys::cuCtxPushCurrent_v2(context) },
        "cuCtxPushCurrent",
    )?;
    let out = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    out
}

impl Backend for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn classify(&self, addr: usize) -> MemoryKind {
        let mut memory_type: u32 = 0;
        let mut ordinal: i32 = 0;
        let mut attributes = [
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        let mut data: [*mut c_void; 2] = [
            (&mut memory_type as *mut u32).cast(),
            (&mut ordinal as *mut i32).cast(),
        ];
        let looked_up = self.with_context(0, || {
            // SAFETY: probed symbol; two attributes with matching output slots. Unknown
            // pointers succeed with type 0.
            check(
                unsafe {
                    sys::cuPointerGetAttributes(
                        2,
                        attributes.as_mut_ptr(),
                        data.as_mut_ptr(),
                        addr as u64,
                    )
                },
                "cuPointerGetAttributes",
            )
        });
        match (looked_up, memory_type) {
            (Err(e), _) => {
                tracing::debug!(addr, error = %e, "pointer lookup failed; treated as host");
                MemoryKind::Pageable
            }
            (Ok(()), 0) => MemoryKind::Pageable,
            (Ok(()), 1) => MemoryKind::PinnedHost,
            // DEVICE (2), ARRAY (3), UNIFIED (4): only the driver may touch it.
            (Ok(()), _) => MemoryKind::Device(ordinal.max(0)),
        }
    }

    unsafe fn copy(&self, dst: Side, src: Side, len: usize) -> Result<(), String> {
        let device = dst.kind.device().or(src.kind.device()).unwrap_or(0);
        self.with_context(device, || {
            // SAFETY: probed symbol; the caller guarantees both ranges (UVA addresses).
            check(
                unsafe { sys::cuMemcpy(dst.addr as u64, src.addr as u64, len) },
                "cuMemcpy",
            )
        })
    }

    fn can_register(&self) -> bool {
        self.register
    }

    unsafe fn register(&self, addr: usize, len: usize) -> Result<(), String> {
        if !self.register {
            return Err("host registration unavailable".into());
        }
        self.with_context(0, || {
            // SAFETY: probed symbol; the caller guarantees a mapped host range.
            check(
                unsafe { sys::cuMemHostRegister_v2(addr as *mut c_void, len, REGISTER_FLAGS) },
                "cuMemHostRegister",
            )
        })
    }

    unsafe fn unregister(&self, addr: usize) -> Result<(), String> {
        if !self.register {
            return Err("host registration unavailable".into());
        }
        self.with_context(0, || {
            // SAFETY: probed symbol; `addr` is a registered base.
            check(
                unsafe { sys::cuMemHostUnregister(addr as *mut c_void) },
                "cuMemHostUnregister",
            )
        })
    }

    fn alloc_device(&self, len: usize) -> Result<usize, String> {
        if !self.alloc {
            return Err("device allocation unavailable".into());
        }
        self.with_context(0, || {
            let mut ptr = 0u64;
            // SAFETY: probed symbol.
            check(unsafe { sys::cuMemAlloc_v2(&mut ptr, len) }, "cuMemAlloc")?;
            Ok(ptr as usize)
        })
    }

    unsafe fn free_device(&self, addr: usize) -> Result<(), String> {
        if !self.alloc {
            return Err("device allocation unavailable".into());
        }
        self.with_context(0, || {
            // SAFETY: probed symbol; `addr` came from `alloc_device`.
            check(unsafe { sys::cuMemFree_v2(addr as u64) }, "cuMemFree")
        })
    }

    fn stream_ops(&self) -> Option<&dyn StreamOps> {
        self.stream.then_some(self as &dyn StreamOps)
    }

    /// Exports the allocation holding `addr`, widened to whole host pages (the driver
    /// exports page-aligned ranges only), after checking that it holds `[addr, addr+len)`.
    /// An allocation that does not start on a page boundary may be refused by the driver.
    fn export_dmabuf(&self, addr: usize, len: usize) -> Result<super::DmaBuf, String> {
        use std::os::fd::{FromRawFd, OwnedFd};
        if !self.dmabuf {
            return Err("this CUDA driver exports no dma-buf".into());
        }
        let MemoryKind::Device(device) = self.classify(addr) else {
            return Err(format!("{addr:#x} is not device memory"));
        };
        if device_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
        )? == 0
        {
            return Err(format!("CUDA device {device} does not support dma-buf"));
        }
        self.with_context(device, || {
            let (mut base, mut size) = (0u64, 0usize);
            // SAFETY: probed symbol; out parameters we own.
            check(
                unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr as u64) },
                "cuMemGetAddressRange",
            )?;
            if (addr as u64 - base).saturating_add(len as u64) > size as u64 {
                return Err(format!(
                    "[{addr:#x}, +{len}) is not inside one device allocation"
                ));
            }
            let start = base & !(PAGE - 1);
            let end = (base + size as u64).div_ceil(PAGE) * PAGE;
            let offset = addr as u64 - start;
            let mut fd: std::ffi::c_int = -1;
            // SAFETY: probed symbol; `fd` receives a new descriptor we then own.
            check(
                unsafe {
                    sys::cuMemGetHandleForAddressRange(
                        (&mut fd as *mut std::ffi::c_int).cast(),
                        start,
                        (end - start) as usize,
                        sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                        0,
                    )
                },
                "cuMemGetHandleForAddressRange",
            )?;
            if fd < 0 {
                return Err("cuMemGetHandleForAddressRange gave no descriptor".into());
            }
            // SAFETY: a fresh descriptor the driver handed us.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok(super::DmaBuf { fd, offset })
        })
    }

    fn flush_nic_writes(&self, device: i32) -> Result<(), String> {
        self.can_flush_nic_writes(device)?;
        self.with_context(device, || {
            // SAFETY: probed symbol; the device's primary context is current.
            check(
                unsafe {
                    sys::cuFlushGPUDirectRDMAWrites(
                        sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                        sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
                    )
                },
                "cuFlushGPUDirectRDMAWrites",
            )
        })
    }

    fn can_flush_nic_writes(&self, device: i32) -> Result<(), String> {
        if !self.flush {
            return Err("this CUDA driver has no cuFlushGPUDirectRDMAWrites (CUDA 11.3+)".into());
        }
        let options = device_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
        )?;
        match options & FLUSH_OPTION_HOST {
            0 => Err(format!(
                "CUDA device {device} cannot flush GPUDirect RDMA writes (flush options {options})"
            )),
            _ => Ok(()),
        }
    }
}

/// Attribute `attribute` of CUDA device `device` (ordinal). The caller has probed
/// `cuDeviceGetAttribute` (part of [`DMABUF`] and [`FLUSH`]).
fn device_attribute(device: i32, attribute: sys::CUdevice_attribute) -> Result<i32, String> {
    let (mut handle, mut value) = (0, 0);
    // SAFETY: probed symbols (CORE, and the caller's feature); out parameters we own.
    unsafe {
        check(sys::cuDeviceGet(&mut handle, device), "cuDeviceGet")?;
        check(
            sys::cuDeviceGetAttribute(&mut value, attribute, handle),
            "cuDeviceGetAttribute",
        )?;
    }
    Ok(value)
}
