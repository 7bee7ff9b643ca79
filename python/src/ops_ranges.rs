//! Ranged reads and sessions (spec §4.5, §4.6): `get_into_ranges`, get sessions
//! (`batch_get_session_start`, `batch_get_into_multi_buffer_ranges`,
//! `batch_get_session_end`) and put sessions (`batch_put_session_start`,
//! `batch_put_from_multi_buffer_ranges`, `batch_put_session_end`,
//! `batch_put_session_revoke`). Session state lives in the client; nothing here keeps any.

use crate::config::{client_config, PyReplicateConfig};
use crate::convert::{self, invalid_all, u64s, INVALID, U64};
use crate::memory::{self, Access};
use crate::store::Store;
use mooncake_rs::client::{Buf, Client, RangeRequest};
use mooncake_rs::error::{ErrorCode, Result};
use pyo3::prelude::*;

/// Key `i`'s buffers from `all_ptrs[i]`/`all_sizes[i]`, and whether their lengths match (a
/// mismatched key gets no buffers and -600). `None` when the outer lengths differ from `n`.
pub fn per_key_buffers(
    all_ptrs: &[Vec<U64>],
    all_sizes: &[Vec<U64>],
    n: usize,
) -> Option<KeyBuffers> {
    if all_ptrs.len() != n || all_sizes.len() != n {
        return None;
    }
    let ok: Vec<bool> = all_ptrs
        .iter()
        .zip(all_sizes)
        .map(|(p, s)| p.len() == s.len())
        .collect();
    let bufs = all_ptrs
        .iter()
        .zip(all_sizes)
        .zip(&ok)
        .map(|((ptrs, sizes), ok)| match ok {
            true => ptrs
                .iter()
                .zip(sizes)
                .map(|(p, s)| Buf::new(p.usize(), s.0))
                .collect(),
            false => Vec::new(),
        })
        .collect();
    Some((bufs, ok))
}

/// Each key's buffers and whether its lists matched (see [`per_key_buffers`]).
pub type KeyBuffers = (Vec<Vec<Buf>>, Vec<bool>);

/// The buffers and offsets of a session ranged call: [`per_key_buffers`] (`None` also when
/// `all_offsets` has another outer length) and the offsets as plain integers.
pub fn session_shapes(
    all_ptrs: &[Vec<U64>],
    all_sizes: &[Vec<U64>],
    all_offsets: &[Vec<U64>],
    n: usize,
) -> (Option<KeyBuffers>, Vec<Vec<u64>>) {
    let offsets: Vec<Vec<u64>> = all_offsets.iter().map(|v| u64s(v)).collect();
    let shapes = per_key_buffers(all_ptrs, all_sizes, n).filter(|_| offsets.len() == n);
    (shapes, offsets)
}

/// `results` with -600 for the keys whose shapes were wrong.
fn masked(results: Vec<Result<u64>>, ok: &[bool]) -> Vec<i64> {
    results
        .into_iter()
        .zip(ok)
        .map(|(r, ok)| if *ok { convert::count(r) } else { INVALID })
        .collect()
}

/// A registered buffer's capacity from `addr` to its region's end (0 when unregistered).
fn capacity(client: &Client, addr: usize) -> u64 {
    client
        .registered_region(addr)
        .map_or(0, |(base, len)| len - (addr - base) as u64)
}

impl Store {
    /// A session ranged call: `io` runs on the checked buffers; -600 for every key on an
    /// outer shape mismatch, for a mismatched key, and `[]` when not set up.
    fn session_io(
        &self,
        py: Python<'_>,
        n: usize,
        shapes: Option<KeyBuffers>,
        access: Access,
        io: impl FnOnce(&Client, Vec<Vec<Buf>>) -> Vec<Result<u64>> + Send,
    ) -> Vec<i64> {
        if self.client().is_none() {
            return Vec::new();
        }
        let Some((bufs, ok)) = shapes else {
            return invalid_all(n);
        };
        self.run(py, Vec::new(), |c| match memory::check(c, &bufs, access) {
            Ok(()) => masked(io(c, bufs), &ok),
            Err(e) => vec![convert::code(e); n],
        })
    }
}

#[pymethods]
impl Store {
    /// Buffer-major gather: for buffer `i`, key `j`, fragment `k` copy object bytes
    /// `[src, src + size)` of `all_keys[i][j]` to `buffer_ptrs[i] + dst`. Each buffer must be
    /// registered memory (its capacity runs to the end of its region). Returns the
    /// fragments' byte counts or codes in the same nesting (spec §4.5 for the exact shape).
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<U64>,
        all_keys: Vec<Vec<String>>,
        all_dst_offsets: Vec<Vec<Vec<U64>>>,
        all_src_offsets: Vec<Vec<Vec<U64>>>,
        all_sizes: Vec<Vec<Vec<U64>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let nested = |v: &Vec<Vec<Vec<U64>>>| -> Vec<Vec<Vec<u64>>> {
            v.iter()
                .map(|row| row.iter().map(|e| u64s(e)).collect())
                .collect()
        };
        let (dst, src, sizes) = (
            nested(&all_dst_offsets),
            nested(&all_src_offsets),
            nested(&all_sizes),
        );
        let shape_only = || -> Vec<Vec<Vec<i64>>> {
            (0..buffer_ptrs.len())
                .map(|i| match all_keys.get(i) {
                    Some(row) => (0..row.len())
                        .map(|j| {
                            vec![INVALID; dst.get(i).and_then(|r| r.get(j)).map_or(1, Vec::len)]
                        })
                        .collect(),
                    None => vec![vec![INVALID]],
                })
                .collect()
        };
        let n = buffer_ptrs.len();
        let top_ok = [all_keys.len(), dst.len(), src.len(), sizes.len()]
            .iter()
            .all(|&len| len == n);
        let Some(client) = self.client().filter(|_| top_ok) else {
            return shape_only();
        };
        py.detach(|| {
            let buffers: Vec<Buf> = buffer_ptrs
                .iter()
                .map(|p| {
                    Buf::new(
                        p.usize(),
                        if p.0 == 0 {
                            0
                        } else {
                            capacity(&client, p.usize())
                        },
                    )
                })
                .collect();
            let request = RangeRequest {
                keys: &all_keys,
                dst_offsets: &dst,
                src_offsets: &src,
                sizes: &sizes,
            };
            // SAFETY: every destination range lies inside a registered region (capacity 0
            // otherwise, so nothing is written there); the caller keeps it valid.
            let results = unsafe { client.get_into_ranges_raw(&buffers, &request) };
            results
                .into_iter()
                .map(|row| row.into_iter().map(convert::counts).collect())
                .collect()
        })
    }

    /// Starts get sessions (one master call; the objects stay pinned until the session
    /// ends). Per key 0 or a code; `[]` when not set up.
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        self.run(py, Vec::new(), |c| {
            convert::statuses(c.batch_get_session_start(&keys))
        })
    }

    /// Ranged reads inside get sessions, no master call: buffer `j` of key `i` receives object
    /// bytes `[all_src_offsets[i][j], + all_sizes[i][j])`. Per key the bytes read or a code.
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        all_src_offsets: Vec<Vec<U64>>,
    ) -> Vec<i64> {
        let n = keys.len();
        let (shapes, src) = session_shapes(&all_buffer_ptrs, &all_sizes, &all_src_offsets, n);
        // SAFETY: `session_io` checked the destinations are writable memory.
        self.session_io(py, n, shapes, Access::Write, |c, bufs| unsafe {
            c.batch_get_into_multi_buffer_ranges_raw(&keys, bufs, &src)
        })
    }

    /// Ends get sessions (unpins). Always 0; -1 when not set up.
    fn batch_get_session_end(&self, py: Python<'_>, keys: Vec<String>) -> i64 {
        self.run(py, -1, |c| convert::status(c.batch_get_session_end(&keys)))
    }

    /// Reserves objects of `sizes` bytes for later ranged writes. Per key 0 or a code (an
    /// existing key is -705 here); `[]` when not set up.
    #[pyo3(signature = (keys, sizes, config = None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        sizes: Vec<U64>,
        config: Option<PyReplicateConfig>,
    ) -> Vec<i64> {
        let n = keys.len();
        let config = client_config(config.as_ref(), n);
        let sizes = u64s(&sizes);
        self.run(py, Vec::new(), |c| match config {
            Ok(config) => convert::statuses(c.batch_put_session_start(&keys, &sizes, &config)),
            Err(e) => vec![convert::code(e); n],
        })
    }

    /// Ranged writes inside put sessions: buffer `j` of key `i` goes to object offset
    /// `all_dst_offsets[i][j]` on every replica. Per key the logical bytes written or a code.
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        all_dst_offsets: Vec<Vec<U64>>,
    ) -> Vec<i64> {
        let n = keys.len();
        let (shapes, dst) = session_shapes(&all_buffer_ptrs, &all_sizes, &all_dst_offsets, n);
        // SAFETY: `session_io` checked the sources are readable memory.
        self.session_io(py, n, shapes, Access::Read, |c, bufs| unsafe {
            c.batch_put_from_multi_buffer_ranges_raw(&keys, bufs, &dst)
        })
    }

    /// Seals and commits put sessions: per key 0, -600 (no session) or the master's error
    /// (the session is then kept); `[]` when not set up.
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        self.run(py, Vec::new(), |c| {
            convert::statuses(c.batch_put_session_end(&keys))
        })
    }

    /// Seals and revokes put sessions: per key 0 (also when the master no longer knows the
    /// key), -600 (no session) or another error; `[]` when not set up.
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        self.run(py, Vec::new(), |c| {
            c.batch_put_session_revoke(&keys)
                .into_iter()
                .map(|r| match r {
                    Err(ErrorCode::ObjectNotFound) => 0,
                    r => convert::status(r),
                })
                .collect()
        })
    }
}
