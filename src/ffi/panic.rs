//! The panic boundary: every exported function runs its body through [`ffi_boundary!`].
//!
//! A body returns `crate::Result<R>`; `Err(code)` becomes the C value for that code (the code
//! itself for integers, NULL for pointers). A panic is caught, recorded as the thread's last
//! error message, turned into `INTERNAL_ERROR` (-1) (NULL / 0 for non-integer returns), and the
//! store handle named in the macro, if any, is marked poisoned: every later call on it fails
//! with -1. The library is built with `panic = "unwind"` so the catch is effective.

use crate::error::{set_last_error_message, ErrorCode, Result};
use std::any::Any;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `$body` (a block evaluating to `crate::Result<R>`) inside the panic boundary.
/// `poison: ptr,` names the `*const/*mut mc_store` handle to poison on a panic;
/// `poison_handle: ptr,` any other `*const H` handle with `H: Poison`.
macro_rules! ffi_boundary {
    (poison_handle: $handle:expr, $body:block) => {
        $crate::ffi::panic::run_with($handle, || -> $crate::error::Result<_> { $body })
    };
    (poison: $store:expr, $body:block) => {
        $crate::ffi::panic::run(
            $store as *const $crate::ffi::store::mc_store,
            || -> $crate::error::Result<_> { $body },
        )
    };
    ($body:block) => {
        $crate::ffi::panic::run(::std::ptr::null(), || -> $crate::error::Result<_> { $body })
    };
}
pub(crate) use ffi_boundary;

/// How a C return type expresses an error code and a caught panic.
pub(crate) trait FfiReturn: Sized {
    /// The value returned for `Err(code)`.
    fn from_error(code: ErrorCode) -> Self;
    /// The value returned after a caught panic.
    fn panicked() -> Self {
        Self::from_error(ErrorCode::InternalError)
    }
}

impl FfiReturn for i32 {
    fn from_error(code: ErrorCode) -> Self {
        code.code()
    }
}

impl FfiReturn for i64 {
    fn from_error(code: ErrorCode) -> Self {
        i64::from(code.code())
    }
}

impl FfiReturn for usize {
    fn from_error(_: ErrorCode) -> Self {
        0
    }
}

impl FfiReturn for () {
    fn from_error(_: ErrorCode) -> Self {}
}

impl<T> FfiReturn for *mut T {
    fn from_error(_: ErrorCode) -> Self {
        std::ptr::null_mut()
    }
}

impl<T> FfiReturn for *const T {
    fn from_error(_: ErrorCode) -> Self {
        std::ptr::null()
    }
}

/// A static string for functions returning `const char *`: never NULL.
impl FfiReturn for StaticStr {
    fn from_error(_: ErrorCode) -> Self {
        StaticStr(c"UNKNOWN_ERROR".as_ptr())
    }
}

/// A `const char *` to static, NUL-terminated storage.
#[derive(Clone, Copy)]
pub(crate) struct StaticStr(pub(crate) *const c_char);

/// A handle that a caught panic marks unusable.
pub(crate) trait Poison {
    /// Marks the handle poisoned.
    fn poison(&self);
}

impl Poison for super::store::mc_store {
    fn poison(&self) {
        super::store::mc_store::poison(self);
    }
}

/// The body of [`ffi_boundary!`] for store handles; see [`run_with`].
pub(crate) fn run<R: FfiReturn>(
    store: *const super::store::mc_store,
    body: impl FnOnce() -> Result<R>,
) -> R {
    run_with(store, body)
}

/// The body of [`ffi_boundary!`]: runs `body`, maps its error, catches a panic and poisons
/// `store` (when not NULL).
pub(crate) fn run_with<R: FfiReturn, H: Poison>(
    store: *const H,
    body: impl FnOnce() -> Result<R>,
) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(code)) => R::from_error(code),
        Err(payload) => {
            let what = payload_text(&*payload);
            // Dropping a payload can itself panic; never let that escape.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            // SAFETY: the caller passed a live handle (or NULL); it outlives this call.
            if let Some(store) = unsafe { store.as_ref() } {
                store.poison();
            }
            tracing::error!("panic caught at the C boundary: {what}");
            set_last_error_message(format!(
                "INTERNAL_ERROR: panic caught at the C boundary: {what}"
            ));
            R::panicked()
        }
    }
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::{mc_store_free, mc_store_health_check, mc_store_new};
    use super::*;

    /// What an exported function whose body panics looks like (no such function is exported).
    fn panicking_store_call(store: *mut super::super::store::mc_store) -> i32 {
        ffi_boundary!(poison: store, {
            if !store.is_null() {
                panic!("test-triggered panic");
            }
            Ok(0)
        })
    }

    #[test]
    fn a_panic_becomes_minus_one_and_poisons_the_handle() {
        let store = mc_store_new();
        assert!(!store.is_null());
        assert_eq!(mc_store_health_check(store), 1);
        assert_eq!(panicking_store_call(store), -1);
        assert!(crate::error::last_error_message().contains("test-triggered panic"));
        // Every later call on the handle fails with -1 and says why.
        assert_eq!(mc_store_health_check(store), -1);
        assert!(crate::error::last_error_message().contains("poisoned"));
        // Freeing a poisoned handle is still fine.
        mc_store_free(store);
    }

    #[test]
    fn errors_and_panics_map_per_return_type() {
        let r: i64 = run(std::ptr::null(), || Err(ErrorCode::ObjectNotFound));
        assert_eq!(r, -704);
        let p: *mut u8 = run(std::ptr::null(), || -> Result<*mut u8> { panic!("x") });
        assert!(p.is_null());
        let n: usize = run(std::ptr::null(), || -> Result<usize> { panic!("x") });
        assert_eq!(n, 0);
        let s: StaticStr = run(std::ptr::null(), || -> Result<StaticStr> { panic!("x") });
        assert!(!s.0.is_null());
    }
}
