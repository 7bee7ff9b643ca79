//! Existence, size and removal (spec §4.7): `is_exist`, `batch_is_exist`, `get_size`,
//! `remove`, `remove_by_regex`, `remove_all`, `batch_remove`.

use crate::convert::{self, invalid_all, INVALID};
use crate::store::Store;
use mooncake_rs::error::Result;
use pyo3::prelude::*;

/// 1 exists, 0 absent (or not yet readable), or the error's code.
fn existence(result: Result<bool>) -> i64 {
    match result {
        Ok(found) => i64::from(found),
        Err(mooncake_rs::error::ErrorCode::ObjectNotFound) => 0,
        Err(e) => convert::code(e),
    }
}

#[pymethods]
impl Store {
    /// 1 if `key` has a readable replica, 0 if not, or a negative code. Grants a read lease.
    fn is_exist(&self, py: Python<'_>, key: String) -> i64 {
        self.run(py, INVALID, |c| existence(c.is_exist(&key)))
    }

    /// `is_exist` for many keys with one master call; `[]` for `[]`.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let n = keys.len();
        self.run(py, invalid_all(n), |c| {
            c.batch_is_exist(&keys).into_iter().map(existence).collect()
        })
    }

    /// The object's size in bytes, or -704 when missing. Grants a read lease.
    fn get_size(&self, py: Python<'_>, key: String) -> i64 {
        self.run(py, INVALID, |c| convert::count(c.get_size(&key)))
    }

    /// Removes `key`: 0, -704 missing, -706 read lease active (unless `force`), -703 not
    /// complete.
    #[pyo3(signature = (key, force = false))]
    fn remove(&self, py: Python<'_>, key: String, force: bool) -> i64 {
        self.run(py, INVALID, |c| convert::status(c.remove(&key, force)))
    }

    /// Removes the objects whose key matches `regex_pattern` (substring search; anchor with
    /// `^...$`) and that are removable: the number removed, or -600 for an invalid pattern.
    #[pyo3(signature = (regex_pattern, force = false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: String, force: bool) -> i64 {
        self.run(py, INVALID, |c| {
            convert::count(c.remove_by_regex(&regex_pattern, force))
        })
    }

    /// Removes every removable object: the number removed.
    #[pyo3(signature = (force = false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        self.run(py, INVALID, |c| convert::count(c.remove_all(force)))
    }

    /// `remove` for many keys: per key 0 or a code (a repeated key: -704 after the first).
    #[pyo3(signature = (keys, force = false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i64> {
        let n = keys.len();
        self.run(py, invalid_all(n), |c| {
            convert::statuses(c.batch_remove(&keys, force))
        })
    }
}
