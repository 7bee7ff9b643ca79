//! Argument and result conversions shared by every method: pybind11's rules for unsigned
//! integers (spec §0.2: out of range is `TypeError`, not pyo3's `OverflowError`) and
//! Mooncake's integer return conventions (spec §0.1).

use mooncake_rs::error::{ErrorCode, Result};
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;

/// An unsigned 64-bit argument (`size_t`, `uint64_t`, addresses): a Python `int` in
/// `[0, 2**64)`, or anything with `__index__` (numpy integers, `bool`). Floats, strings,
/// `None`, negative and too-large values raise `TypeError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct U64(pub u64);

impl<'a, 'py> FromPyObject<'a, 'py> for U64 {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<u64>() {
            Ok(v) => Ok(U64(v)),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Err(PyTypeError::new_err(
                "integer is out of range for an unsigned 64-bit argument (0 <= value < 2**64)",
            )),
            Err(e) => Err(e),
        }
    }
}

impl U64 {
    /// The value as an address or length on this 64-bit platform.
    pub fn usize(self) -> usize {
        self.0 as usize
    }
}

/// Unwraps a list of [`U64`]s.
pub fn u64s(values: &[U64]) -> Vec<u64> {
    values.iter().map(|v| v.0).collect()
}

/// Mooncake's code for an error (a negative `int`).
pub fn code(e: ErrorCode) -> i64 {
    i64::from(e.code())
}

/// `0` or the error's code.
pub fn status(result: Result<()>) -> i64 {
    match result {
        Ok(()) => 0,
        Err(e) => code(e),
    }
}

/// A byte count (saturated to `i64`) or the error's code.
pub fn count(result: Result<u64>) -> i64 {
    match result {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(e) => code(e),
    }
}

/// [`status`] for every key.
pub fn statuses(results: Vec<Result<()>>) -> Vec<i64> {
    results.into_iter().map(status).collect()
}

/// [`count`] for every key.
pub fn counts(results: Vec<Result<u64>>) -> Vec<i64> {
    results.into_iter().map(count).collect()
}

/// `INVALID_PARAMS` (-600): Mooncake's answer for bad arguments and for a store that is not
/// set up.
pub const INVALID: i64 = -600;

/// `[INVALID; n]`: the answer of per-key batch calls to bad arguments.
pub fn invalid_all(n: usize) -> Vec<i64> {
    vec![INVALID; n]
}
