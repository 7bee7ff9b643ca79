//! The Ascend backend: `libascendcl.so` through `dlopen` (no CANN at build time). Every
//! entry point is resolved once at load time into a function pointer; host registration
//! and device allocation are optional features (absent symbols disable only them).
//!
//! ACL contexts are thread-local, so every call first makes the context created at load
//! time current on the calling thread (`aclrtSetCurrentContext`, cheap).
//!
//! Unverified on hardware: the layout of `aclrtPtrAttributes` (location id at byte 0,
//! location type at byte 4, `HOST = 0`, `DEVICE = 1`) follows the CANN documentation; a
//! failing lookup (ACL documents that it only knows ACL-allocated memory) means host memory.
//!
//! Submodule `stream`: [`super::StreamOps`] on the caller's `aclrtStream`s (optional: absent
//! symbols disable only them).

mod stream;

use super::dl;
use super::{Backend, MemoryKind, Side, StreamOps};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void};

type AclError = c_int;
type Init = unsafe extern "C" fn(*const c_char) -> AclError;
type SetDevice = unsafe extern "C" fn(i32) -> AclError;
type GetContext = unsafe extern "C" fn(*mut *mut c_void) -> AclError;
type SetContext = unsafe extern "C" fn(*mut c_void) -> AclError;
type PointerAttributes = unsafe extern "C" fn(*const c_void, *mut c_void) -> AclError;
type Memcpy = unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, c_int) -> AclError;
type HostRegister = unsafe extern "C" fn(*mut c_void, u64, c_int, *mut *mut c_void) -> AclError;
type HostUnregister = unsafe extern "C" fn(*mut c_void) -> AclError;
type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_int) -> AclError;
type Free = unsafe extern "C" fn(*mut c_void) -> AclError;

const CORE: &[&str] = &[
    "aclInit",
    "aclrtSetDevice",
    "aclrtGetCurrentContext",
    "aclrtSetCurrentContext",
    "aclrtPointerGetAttributes",
    "aclrtMemcpy",
];
const REGISTER: &[&str] = &["aclrtHostRegister", "aclrtHostUnregister"];
const ALLOC: &[&str] = &["aclrtMalloc", "aclrtFree"];
/// `aclInit` when already initialised by the application.
const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100002;
/// `aclrtMemcpyKind`.
const HOST_TO_DEVICE: c_int = 1;
const DEVICE_TO_HOST: c_int = 2;
const DEVICE_TO_DEVICE: c_int = 3;
/// `ACL_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;
/// `ACL_HOST_REGISTER_MAPPED`.
const REGISTER_MAPPED: c_int = 0;

/// The resolved entry points (looked up once at load; optional features are `None`).
struct Ascend {
    /// Keeps the entry points below valid.
    _lib: Library,
    context: usize,
    set_context: SetContext,
    pointer_attributes: PointerAttributes,
    memcpy: Memcpy,
    register: Option<(HostRegister, HostUnregister)>,
    alloc: Option<(Malloc, Free)>,
    streams: Option<stream::Streams>,
}

/// Looks up `name` with signature `F`.
///
/// # Safety
/// `F` is the symbol's real signature.
unsafe fn symbol<F: Copy>(lib: &Library, name: &str) -> Result<F, String> {
    // SAFETY: forwarded from the caller.
    unsafe { lib.get::<F>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| format!("symbol {name} is missing"))
}

/// Loads the Ascend backend, or says why not.
pub(super) fn load() -> Result<Box<dyn Backend>, String> {
    // SAFETY: loading a vendor library runs its initialisers; that is what we ask for.
    let lib = unsafe { Library::new("libascendcl.so") }
        .map_err(|_| "libascendcl.so not found".to_string())?;
    dl::all_present(&lib, CORE)?;
    // SAFETY: every signature below is the documented ACL prototype.
    unsafe {
        let register = match dl::all_present(&lib, REGISTER) {
            Ok(()) => Some((
                symbol::<HostRegister>(&lib, "aclrtHostRegister")?,
                symbol::<HostUnregister>(&lib, "aclrtHostUnregister")?,
            )),
            Err(e) => {
                tracing::info!("Ascend host registration disabled: {e}");
                None
            }
        };
        let alloc = match dl::all_present(&lib, ALLOC) {
            Ok(()) => Some((
                symbol::<Malloc>(&lib, "aclrtMalloc")?,
                symbol::<Free>(&lib, "aclrtFree")?,
            )),
            Err(_) => None,
        };
        let init = symbol::<Init>(&lib, "aclInit")?(std::ptr::null());
        if init != 0 && init != ACL_ERROR_REPEAT_INITIALIZE {
            return Err(format!("aclInit returned {init}"));
        }
        check(
            symbol::<SetDevice>(&lib, "aclrtSetDevice")?(0),
            "aclrtSetDevice",
        )?;
        let mut context = std::ptr::null_mut();
        check(
            symbol::<GetContext>(&lib, "aclrtGetCurrentContext")?(&mut context),
            "aclrtGetCurrentContext",
        )?;
        Ok(Box::new(Ascend {
            context: context as usize,
            set_context: symbol(&lib, "aclrtSetCurrentContext")?,
            pointer_attributes: symbol(&lib, "aclrtPointerGetAttributes")?,
            memcpy: symbol(&lib, "aclrtMemcpy")?,
            register,
            alloc,
            streams: stream::Streams::load(&lib),
            _lib: lib,
        }))
    }
}

/// The `aclrtMemcpyKind` of a copy between memory of these kinds (host to host counts as
/// device to host: callers never ask for it, and ACL rejects a mismatch).
fn copy_kind(dst: MemoryKind, src: MemoryKind) -> c_int {
    match (dst.device(), src.device()) {
        (Some(_), Some(_)) => DEVICE_TO_DEVICE,
        (Some(_), None) => HOST_TO_DEVICE,
        _ => DEVICE_TO_HOST,
    }
}

fn check(result: AclError, what: &str) -> Result<(), String> {
    if result == 0 {
        Ok(())
    } else {
        Err(format!("{what} returned {result}"))
    }
}

impl Ascend {
    /// Makes our context current on this thread.
    fn enter(&self) -> Result<(), String> {
        // SAFETY: resolved entry point; the context was created at load time.
        check(
            unsafe { (self.set_context)(self.context as *mut c_void) },
            "aclrtSetCurrentContext",
        )
    }
}

impl Backend for Ascend {
    fn name(&self) -> &'static str {
        "ascend"
    }

    fn classify(&self, addr: usize) -> MemoryKind {
        // Generously sized, zeroed: location {id, type}, page size, reserved words.
        let mut attributes = [0u32; 16];
        let looked_up = self.enter().and_then(|()| {
            // SAFETY: probed symbol; the output buffer is larger than the documented struct.
            check(
                unsafe {
                    (self.pointer_attributes)(addr as *const c_void, attributes.as_mut_ptr().cast())
                },
                "aclrtPointerGetAttributes",
            )
        });
        match looked_up {
            Ok(()) if attributes[1] == LOCATION_DEVICE => {
                MemoryKind::Device(i32::try_from(attributes[0]).unwrap_or(0))
            }
            Ok(()) => MemoryKind::PinnedHost,
            Err(_) => MemoryKind::Pageable,
        }
    }

    unsafe fn copy(&self, dst: Side, src: Side, len: usize) -> Result<(), String> {
        let kind = copy_kind(dst.kind, src.kind);
        self.enter()?;
        // SAFETY: probed symbol; the caller guarantees both ranges.
        check(
            unsafe {
                (self.memcpy)(
                    dst.addr as *mut c_void,
                    len,
                    src.addr as *const c_void,
                    len,
                    kind,
                )
            },
            "aclrtMemcpy",
        )
    }

    fn can_register(&self) -> bool {
        self.register.is_some()
    }

    unsafe fn register(&self, addr: usize, len: usize) -> Result<(), String> {
        let (register, _) = self.register.ok_or("host registration unavailable")?;
        self.enter()?;
        let mut device_ptr = std::ptr::null_mut();
        // SAFETY: probed symbol; the caller guarantees a mapped host range.
        check(
            unsafe {
                register(
                    addr as *mut c_void,
                    len as u64,
                    REGISTER_MAPPED,
                    &mut device_ptr,
                )
            },
            "aclrtHostRegister",
        )
    }

    unsafe fn unregister(&self, addr: usize) -> Result<(), String> {
        let (_, unregister) = self.register.ok_or("host registration unavailable")?;
        self.enter()?;
        // SAFETY: resolved entry point; `addr` is a registered base.
        check(
            unsafe { unregister(addr as *mut c_void) },
            "aclrtHostUnregister",
        )
    }

    fn alloc_device(&self, len: usize) -> Result<usize, String> {
        let (malloc, _) = self.alloc.ok_or("device allocation unavailable")?;
        self.enter()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: resolved entry point; policy 0 = ACL_MEM_MALLOC_HUGE_FIRST.
        check(unsafe { malloc(&mut ptr, len, 0) }, "aclrtMalloc")?;
        Ok(ptr as usize)
    }

    unsafe fn free_device(&self, addr: usize) -> Result<(), String> {
        let (_, free) = self.alloc.ok_or("device allocation unavailable")?;
        self.enter()?;
        // SAFETY: resolved entry point; `addr` came from `alloc_device`.
        check(unsafe { free(addr as *mut c_void) }, "aclrtFree")
    }

    fn stream_ops(&self) -> Option<&dyn StreamOps> {
        self.streams.is_some().then_some(self as &dyn StreamOps)
    }
}
