//! The copying family (spec §4.2, §4.8): `put`, `put_parts`, `put_batch`, the upserts,
//! `get`, `get_batch`, `get_buffer`, `batch_get_buffer`. Puts go through the local buffer's
//! contract (-600 when it is absent or too small) but make no staging copy: the transfer
//! engine reads the held Python buffer directly.

use crate::buffer::PyBufferHandle;
use crate::config::{client_config, PyReplicateConfig};
use crate::convert::{self, INVALID};
use crate::pybuf::{hold_all, HeldBuffer};
use crate::store::Store;
use mooncake_rs::client::{Buf, WriteMode};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

impl Store {
    /// One copying write of `values[i]`'s buffers (laid end to end) under `keys[i]`: 0 or
    /// the first failing key's code.
    fn copying_write(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Vec<HeldBuffer>>,
        config: Option<&PyReplicateConfig>,
        mode: WriteMode,
    ) -> i64 {
        let config = match client_config(config, keys.len()) {
            Ok(c) => c,
            Err(e) => return convert::code(e),
        };
        let bufs: Vec<Vec<Buf>> = values
            .iter()
            .map(|parts| parts.iter().map(HeldBuffer::buf).collect())
            .collect();
        // SAFETY: every `Buf` is a held Python buffer, valid until `values` drops after the call.
        self.run(py, INVALID, |c| {
            convert::status(unsafe { c.copying_write_raw(&keys, bufs, &config, mode) })
        })
    }

    /// `put`/`upsert` of one value: an empty value is -600.
    fn write_value(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
        mode: WriteMode,
    ) -> PyResult<i64> {
        let held = HeldBuffer::get(value, false)?;
        if held.buf().len == 0 {
            return Ok(INVALID);
        }
        Ok(self.copying_write(py, vec![key], vec![vec![held]], config, mode))
    }

    /// `put_parts`/`upsert_parts`: parts must be 1-D bytes-like; a total of 0 bytes stores
    /// nothing and returns 0.
    fn write_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, PyTuple>,
        config: Option<&PyReplicateConfig>,
        mode: WriteMode,
    ) -> PyResult<i64> {
        let parts: Vec<Bound<'_, PyAny>> = parts.iter().collect();
        let held = hold_all(&parts, true)?;
        if held.iter().all(|h| h.buf().len == 0) {
            tracing::warn!(key, "put_parts: total size 0, nothing stored");
            return Ok(0);
        }
        Ok(self.copying_write(py, vec![key], vec![held], config, mode))
    }

    /// `put_batch`/`upsert_batch`: one int; -600 for a length mismatch or an empty value
    /// before anything is written; 0 for empty lists.
    fn write_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<&PyReplicateConfig>,
        mode: WriteMode,
    ) -> PyResult<i64> {
        if keys.len() != values.len() {
            return Ok(INVALID);
        }
        if keys.is_empty() {
            return Ok(0);
        }
        let held = hold_all(&values, false)?;
        if held.iter().any(|h| h.buf().len == 0) {
            return Ok(INVALID);
        }
        let values = held.into_iter().map(|h| vec![h]).collect();
        Ok(self.copying_write(py, keys, values, config, mode))
    }

    /// Reads `keys` into local-buffer allocations: one handle or `None` per key.
    fn buffers(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<PyBufferHandle>> {
        let n = keys.len();
        self.run(py, (0..n).map(|_| None).collect(), |c| {
            c.batch_get_buffer(&keys)
                .into_iter()
                .map(|r| r.ok().map(PyBufferHandle::new))
                .collect()
        })
    }
}

/// A handle's bytes as a new `bytes` (`b""` for a miss).
fn to_bytes<'py>(py: Python<'py>, handle: Option<&PyBufferHandle>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, handle.map_or(&[][..], PyBufferHandle::as_slice))
}

#[pymethods]
impl Store {
    /// Copying put: 0 (also when the key exists: the old value stays), -600 (no or too small
    /// local buffer, empty value or key, bad config), -200 (no space), other codes.
    #[pyo3(signature = (key, value, config = None))]
    fn put(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<PyReplicateConfig>,
    ) -> PyResult<i64> {
        self.write_value(py, key, value, config.as_ref(), WriteMode::Put)
    }

    /// Copying upsert (insert or overwrite); codes as `put`.
    #[pyo3(signature = (key, value, config = None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<PyReplicateConfig>,
    ) -> PyResult<i64> {
        self.write_value(py, key, value, config.as_ref(), WriteMode::Upsert)
    }

    /// Stores the concatenation of `parts` (each 1-D bytes-like, else `RuntimeError`);
    /// `config` is keyword-only. Total size 0 returns 0 and stores nothing.
    #[pyo3(signature = (key, *parts, config = None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyReplicateConfig>,
    ) -> PyResult<i64> {
        self.write_parts(py, key, parts, config.as_ref(), WriteMode::Put)
    }

    /// `put_parts` that overwrites.
    #[pyo3(signature = (key, *parts, config = None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyReplicateConfig>,
    ) -> PyResult<i64> {
        self.write_parts(py, key, parts, config.as_ref(), WriteMode::Upsert)
    }

    /// Copying batch put: one int (0, or the first failing key's code).
    #[pyo3(signature = (keys, values, config = None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyReplicateConfig>,
    ) -> PyResult<i64> {
        self.write_batch(py, keys, values, config.as_ref(), WriteMode::Put)
    }

    /// Copying batch upsert: one int.
    #[pyo3(signature = (keys, values, config = None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyReplicateConfig>,
    ) -> PyResult<i64> {
        self.write_batch(py, keys, values, config.as_ref(), WriteMode::Upsert)
    }

    /// The object's bytes; `b""` for a miss or any error (grants a read lease).
    fn get<'py>(&self, py: Python<'py>, key: String) -> Bound<'py, PyBytes> {
        let handle = self.buffers(py, vec![key]).pop().flatten();
        to_bytes(py, handle.as_ref())
    }

    /// One `bytes` per key (`b""` for misses); `[b""]` for `[]` or when not set up.
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        if keys.is_empty() || self.client().is_none() {
            return vec![PyBytes::new(py, b"")];
        }
        self.buffers(py, keys)
            .iter()
            .map(|h| to_bytes(py, h.as_ref()))
            .collect()
    }

    /// The object in a local-buffer allocation, without a second copy; `None` on a miss.
    fn get_buffer(&self, py: Python<'_>, key: String) -> Option<PyBufferHandle> {
        self.buffers(py, vec![key]).pop().flatten()
    }

    /// `get_buffer` for many keys with one master query; `None` entries for misses.
    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<PyBufferHandle>> {
        self.buffers(py, keys)
    }
}
