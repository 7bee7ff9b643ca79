//! Zero-copy calls on caller memory given as bare addresses (spec §4.3, §4.4, §4.8):
//! `register_buffer`, `unregister_buffer`, the `put_from` / `upsert_from` families,
//! `put_from_with_metadata`, `get_into`, `batch_get_into` and the multi-buffer calls.

use crate::config::{client_config, PyReplicateConfig};
use crate::convert::{self, invalid_all, INVALID, U64};
use crate::memory::{self, Access};
use crate::store::Store;
use mooncake_rs::client::{Buf, Client, WriteMode};
use mooncake_rs::error::Result;
use pyo3::prelude::*;

/// `register_buffer`'s answer on a dummy for memory its real client cannot map (upstream's).
const NOT_SHARED: i64 = -1;

/// `ptrs[i]`/`sizes[i]` as one buffer per key; `None` on a length mismatch.
pub fn single(ptrs: &[U64], sizes: &[U64], n: usize) -> Option<Vec<Vec<Buf>>> {
    (ptrs.len() == n && sizes.len() == n).then(|| {
        ptrs.iter()
            .zip(sizes)
            .map(|(p, s)| vec![Buf::new(p.usize(), s.0)])
            .collect()
    })
}

/// `all_ptrs[i][j]`/`all_sizes[i][j]` as key `i`'s buffers; `None` on any length mismatch.
pub fn multi(all_ptrs: &[Vec<U64>], all_sizes: &[Vec<U64>], n: usize) -> Option<Vec<Vec<Buf>>> {
    if all_ptrs.len() != n || all_sizes.len() != n {
        return None;
    }
    all_ptrs
        .iter()
        .zip(all_sizes)
        .map(|(ptrs, sizes)| {
            single(ptrs, sizes, ptrs.len()).map(|b| b.into_iter().flatten().collect())
        })
        .collect()
}

/// Checks the buffers, then writes them (zero-copy, no staging); one result per key.
fn write(
    client: &Client,
    keys: &[String],
    bufs: Vec<Vec<Buf>>,
    config: &mooncake_rs::types::ReplicateConfig,
    mode: WriteMode,
) -> Vec<Result<()>> {
    if let Err(e) = memory::check(client, &bufs, Access::Read) {
        return vec![Err(e); keys.len()];
    }
    // SAFETY: the ranges are registered, device or mapped readable memory (checked above);
    // the caller keeps them valid for the call (upstream's contract).
    unsafe { client.write_raw(keys, bufs, config, mode) }
}

/// Checks the buffers, then reads into them; one result per key (the object size).
pub fn read(
    client: &Client,
    keys: &[String],
    bufs: Vec<Vec<Buf>>,
    exact: bool,
) -> Vec<Result<u64>> {
    if let Err(e) = memory::check(client, &bufs, Access::Write) {
        return vec![Err(e); keys.len()];
    }
    // SAFETY: as `write`, for writable memory.
    unsafe { client.get_into_raw(keys, bufs, exact) }
}

impl Store {
    /// A zero-copy batch write: `bufs` `None` (shape mismatch) or a bad config is -600 for
    /// every key; `not_init` when not set up.
    fn write_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        bufs: Option<Vec<Vec<Buf>>>,
        config: Option<&PyReplicateConfig>,
        mode: WriteMode,
        not_init: Vec<i64>,
    ) -> Vec<i64> {
        let n = keys.len();
        let (Some(bufs), Ok(config)) = (bufs, client_config(config, n)) else {
            return if self.client().is_none() {
                not_init
            } else {
                invalid_all(n)
            };
        };
        self.run(py, not_init, |c| {
            convert::statuses(write(c, &keys, bufs, &config, mode))
        })
    }

    /// A multi-buffer batch write (key `i`'s object is the concatenation of its buffers):
    /// per key 0 or a negative code; `[]` when not set up (upstream's quirk).
    fn write_multi(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: &[Vec<U64>],
        all_sizes: &[Vec<U64>],
        config: Option<PyReplicateConfig>,
        mode: WriteMode,
    ) -> Vec<i64> {
        let bufs = multi(all_buffer_ptrs, all_sizes, keys.len());
        self.write_from(py, keys, bufs, config.as_ref(), mode, Vec::new())
    }

    /// One zero-copy write; size 0 stores nothing and returns 0.
    fn write_one(
        &self,
        py: Python<'_>,
        key: String,
        bufs: Vec<Buf>,
        config: Option<&PyReplicateConfig>,
        mode: WriteMode,
    ) -> i64 {
        if bufs.iter().all(|b| b.len == 0) {
            return if self.client().is_some() { 0 } else { INVALID };
        }
        self.write_from(py, vec![key], Some(vec![bufs]), config, mode, vec![INVALID])
            .pop()
            .unwrap_or(INVALID)
    }

    /// A batch read: `bufs` `None` (shape mismatch) is -600 for every key.
    fn read_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        bufs: Option<Vec<Vec<Buf>>>,
        exact: bool,
    ) -> Vec<i64> {
        let n = keys.len();
        let Some(bufs) = bufs else {
            return invalid_all(n);
        };
        self.run(py, invalid_all(n), |c| {
            convert::counts(read(c, &keys, bufs, exact))
        })
    }
}

#[pymethods]
impl Store {
    /// Registers `[buffer_ptr, buffer_ptr + size)` for zero-copy calls. 0, or -600 (NULL,
    /// size 0, overlap with a registered range, memory not mapped in this process); on a
    /// dummy, -1 for memory outside the shared pool its real client maps (as upstream's
    /// `DummyClient`).
    fn register_buffer(&self, py: Python<'_>, buffer_ptr: U64, size: U64) -> i64 {
        let buf = Buf::new(buffer_ptr.usize(), size.0);
        self.run(py, INVALID, |c| {
            if c.is_dummy()
                && buf.addr != 0
                && buf.len != 0
                && !Client::in_shared_pool(buf.addr, buf.len)
            {
                return NOT_SHARED;
            }
            let checked = if buf.addr == 0 || buf.len == 0 {
                Ok(())
            } else {
                memory::check(c, &[vec![buf]], Access::Read)
            };
            convert::status(checked.and_then(|()| c.register_buffer(buf.addr, buf.len as usize)))
        })
    }

    /// Unregisters the range starting at `buffer_ptr`: 0, or -600 for an unknown address.
    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: U64) -> i64 {
        self.run(py, INVALID, |c| {
            convert::status(c.unregister_buffer(buffer_ptr.usize()))
        })
    }

    /// Zero-copy put of `size` bytes at `buffer_ptr`; size 0 stores nothing and returns 0.
    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: U64,
        size: U64,
        config: Option<PyReplicateConfig>,
    ) -> i64 {
        let bufs = vec![Buf::new(buffer_ptr.usize(), size.0)];
        self.write_one(py, key, bufs, config.as_ref(), WriteMode::Put)
    }

    /// Zero-copy upsert; size 0 writes nothing and returns 0.
    #[pyo3(signature = (key, buffer_ptr, size, config = None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: U64,
        size: U64,
        config: Option<PyReplicateConfig>,
    ) -> i64 {
        let bufs = vec![Buf::new(buffer_ptr.usize(), size.0)];
        self.write_one(py, key, bufs, config.as_ref(), WriteMode::Upsert)
    }

    /// Stores `metadata ++ data` from two caller buffers. Negative codes on failure
    /// (upstream's positive codes are not copied; spec §10.2); `size == 0` stores nothing.
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: U64,
        metadata_buffer_ptr: U64,
        size: U64,
        metadata_size: U64,
        config: Option<PyReplicateConfig>,
    ) -> i64 {
        if size.0 == 0 {
            return if self.client().is_some() { 0 } else { INVALID };
        }
        let bufs = vec![
            Buf::new(metadata_buffer_ptr.usize(), metadata_size.0),
            Buf::new(buffer_ptr.usize(), size.0),
        ];
        self.write_one(py, key, bufs, config.as_ref(), WriteMode::Put)
    }

    /// Zero-copy batch put: per key 0 or a negative code; all -600 on a length mismatch.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<U64>,
        sizes: Vec<U64>,
        config: Option<PyReplicateConfig>,
    ) -> Vec<i64> {
        let n = keys.len();
        let bufs = single(&buffer_ptrs, &sizes, n);
        self.write_from(
            py,
            keys,
            bufs,
            config.as_ref(),
            WriteMode::Put,
            invalid_all(n),
        )
    }

    /// Zero-copy batch upsert: per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<U64>,
        sizes: Vec<U64>,
        config: Option<PyReplicateConfig>,
    ) -> Vec<i64> {
        let n = keys.len();
        let bufs = single(&buffer_ptrs, &sizes, n);
        self.write_from(
            py,
            keys,
            bufs,
            config.as_ref(),
            WriteMode::Upsert,
            invalid_all(n),
        )
    }

    /// Key `i`'s object is the concatenation of its buffers. Per key 0 / negative; `[]` when
    /// not set up (upstream's quirk, kept).
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        config: Option<PyReplicateConfig>,
    ) -> Vec<i64> {
        self.write_multi(
            py,
            keys,
            &all_buffer_ptrs,
            &all_sizes,
            config,
            WriteMode::Put,
        )
    }

    /// `batch_put_from_multi_buffers` that overwrites (upstream's C++ client has it, its
    /// Python module does not bind it: private, for the batch tensor writers of
    /// `mooncake._tensor`). Per key 0 / negative; `[]` when not set up.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None))]
    fn _batch_upsert_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        config: Option<PyReplicateConfig>,
    ) -> Vec<i64> {
        self.write_multi(
            py,
            keys,
            &all_buffer_ptrs,
            &all_sizes,
            config,
            WriteMode::Upsert,
        )
    }

    /// Reads `key` into `[buffer_ptr, +size)`: the object size, or -600 (buffer smaller than
    /// the object), -704, -703, -707, -800.
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: U64, size: U64) -> i64 {
        let bufs = Some(vec![vec![Buf::new(buffer_ptr.usize(), size.0)]]);
        self.read_into(py, vec![key], bufs, false)
            .pop()
            .unwrap_or(INVALID)
    }

    /// Batch `get_into` with one master query: per key the object size or a negative code.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<U64>,
        sizes: Vec<U64>,
    ) -> Vec<i64> {
        let bufs = single(&buffer_ptrs, &sizes, keys.len());
        self.read_into(py, keys, bufs, false)
    }

    /// Each object scattered over its key's buffers in order (sizes adding up to the object
    /// size: less is -600, more -800). `prefer_alloc_in_same_node` is a locality hint with no
    /// effect here (replicas in this process are always read first).
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node = false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        prefer_alloc_in_same_node: bool,
    ) -> Vec<i64> {
        let _ = prefer_alloc_in_same_node;
        let bufs = multi(&all_buffer_ptrs, &all_sizes, keys.len());
        self.read_into(py, keys, bufs, true)
    }
}
