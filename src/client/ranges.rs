//! `get_into_ranges`: a buffer-major gather of byte ranges of many objects into a few large
//! buffers, with one master query for all keys and one engine batch for all fragments.

use super::core::Client;
use super::plan::{self, Buf, Fragment, ReadJob};
use super::read::Lookup;

/// Per buffer, per key, per fragment: bytes read or the error.
type RangeResults = Vec<Vec<Vec<Result<u64>>>>;
use crate::error::{fail, ErrorCode, Result};
use std::collections::{HashMap, HashSet};

/// Where each fragment of a `get_into_ranges` call goes: for buffer `i`, key `j`, fragment
/// `k`, copy object bytes `[src_offsets[i][j][k], + sizes[i][j][k])` of `keys[i][j]` to
/// `buffers[i] + dst_offsets[i][j][k]`.
pub struct RangeRequest<'a> {
    /// Keys per buffer.
    pub keys: &'a [Vec<String>],
    /// Destination offsets inside `buffers[i]`.
    pub dst_offsets: &'a [Vec<Vec<u64>>],
    /// Source offsets inside the object.
    pub src_offsets: &'a [Vec<Vec<u64>>],
    /// Fragment lengths.
    pub sizes: &'a [Vec<Vec<u64>>],
}

impl RangeRequest<'_> {
    /// Whether row `i` has one entry per key in every array.
    fn row_ok(&self, i: usize) -> bool {
        let m = self.keys[i].len();
        self.dst_offsets[i].len() == m && self.src_offsets[i].len() == m && self.sizes[i].len() == m
    }

    /// Whether entry `[i][j]` has one offset pair per fragment.
    fn entry_ok(&self, i: usize, j: usize) -> bool {
        let n = self.sizes[i][j].len();
        self.dst_offsets[i][j].len() == n && self.src_offsets[i][j].len() == n
    }

    /// The fragments `[i][j][k]` whose destination shares a byte with another fragment's,
    /// across all buffers (by address, so buffers that overlap each other count too).
    /// Fragments of a malformed row or entry, or past their buffer, are left out: they are
    /// refused anyway.
    fn overlapping(&self, buffers: &[Buf]) -> HashSet<(usize, usize, usize)> {
        let mut at = Vec::new();
        let mut ranges = Vec::new();
        for (i, buffer) in buffers.iter().enumerate().filter(|&(i, _)| self.row_ok(i)) {
            for j in (0..self.keys[i].len()).filter(|&j| self.entry_ok(i, j)) {
                for (k, (&dst, &len)) in self.dst_offsets[i][j]
                    .iter()
                    .zip(&self.sizes[i][j])
                    .enumerate()
                {
                    if dst.checked_add(len).is_some_and(|end| end <= buffer.len) {
                        at.push((i, j, k));
                        ranges.push((buffer.addr + dst as usize, len));
                    }
                }
            }
        }
        let marked = plan::overlapping(&ranges);
        at.into_iter()
            .zip(marked)
            .filter_map(|(at, overlaps)| overlaps.then_some(at))
            .collect()
    }
}

impl Client {
    /// Runs a [`RangeRequest`] into `buffers`. Returns, per `[i][j][k]`, the bytes copied or
    /// an error: `INVALID_PARAMS` (shape mismatch, a range past the buffer or the object, a
    /// destination overlapping another fragment's), the key's query error, `LEASE_EXPIRED`,
    /// `TRANSFER_FAIL`. The result has the shape of `sizes` (a shape mismatch at `[i]` or
    /// `[i][j]` gives one `INVALID_PARAMS` entry there).
    ///
    /// Overlapping destinations: every fragment whose destination shares a byte with
    /// another fragment's destination in the same call is refused (all of them, since which
    /// write would land last is undefined) and writes nothing; the other fragments run.
    /// Cost O(n log n) in the number of fragments.
    pub fn get_into_ranges(
        &self,
        buffers: &mut [&mut [u8]],
        request: &RangeRequest<'_>,
    ) -> Vec<Vec<Vec<Result<u64>>>> {
        let buffers: Vec<Buf> = buffers.iter_mut().map(|b| Buf::of_mut(b)).collect();
        // SAFETY: exclusive slices are writable host memory and never overlap.
        unsafe { self.get_into_ranges_raw(&buffers, request) }
    }

    /// [`Client::get_into_ranges`] with raw destination buffers that may be device memory.
    ///
    /// Overlapping destinations are refused as in [`Client::get_into_ranges`], compared by
    /// address across all buffers.
    ///
    /// # Safety
    /// Every [`Buf`] is writable memory (host or device) of its length for the whole call.
    pub unsafe fn get_into_ranges_raw(
        &self,
        buffers: &[Buf],
        request: &RangeRequest<'_>,
    ) -> Vec<Vec<Vec<Result<u64>>>> {
        // SAFETY: as this function's contract.
        let (results, stale) = unsafe { self.ranges_with(buffers, request, Lookup::Cache) };
        if stale.is_empty() {
            return results;
        }
        // A read failed with a cached answer: the whole request again, every key fresh.
        for key in &stale {
            self.core.locations.forget(key);
        }
        // SAFETY: as this function's contract.
        unsafe { self.ranges_with(buffers, request, Lookup::Master) }.0
    }

    /// [`Client::get_into_ranges_raw`] with answers looked up as `lookup` says; also returns
    /// the keys of cells that failed with an answer of the location cache.
    ///
    /// # Safety
    /// As [`Client::get_into_ranges_raw`].
    unsafe fn ranges_with(
        &self,
        buffers: &[Buf],
        request: &RangeRequest<'_>,
        lookup: Lookup,
    ) -> (RangeResults, Vec<String>) {
        let core = &self.core;
        let n = request.keys.len();
        let top_ok = buffers.len() == n
            && request.dst_offsets.len() == n
            && request.src_offsets.len() == n
            && request.sizes.len() == n;
        let bad = || vec![Err(ErrorCode::InvalidParams)];
        if let Err(e) = core.check_open() {
            let refused = request
                .keys
                .iter()
                .map(|row| row.iter().map(|_| vec![Err(e)]).collect())
                .collect();
            return (refused, Vec::new());
        }
        if !top_ok {
            let _ = fail::<()>(
                ErrorCode::InvalidParams,
                "get_into_ranges: top-level lengths differ",
            );
            let refused = request
                .keys
                .iter()
                .map(|row| row.iter().map(|_| bad()).collect())
                .collect();
            return (refused, Vec::new());
        }
        let mut unique: Vec<&str> = Vec::new();
        let mut slot: HashMap<&str, usize> = HashMap::new();
        for key in request.keys.iter().flatten() {
            slot.entry(key.as_str()).or_insert_with(|| {
                unique.push(key.as_str());
                unique.len() - 1
            });
        }
        let overlapping = request.overlapping(buffers);
        let answers = core.query_with(&unique, lookup);
        let mut results: Vec<Vec<Vec<Result<u64>>>> = Vec::with_capacity(n);
        let mut jobs = Vec::new();
        let mut job_at = Vec::new();
        for (i, buffer) in buffers.iter().enumerate() {
            if !request.row_ok(i) {
                results.push(request.keys[i].iter().map(|_| bad()).collect());
                continue;
            }
            let (base, capacity) = (buffer.addr, buffer.len);
            let mut row = Vec::with_capacity(request.keys[i].len());
            for (j, key) in request.keys[i].iter().enumerate() {
                if !request.entry_ok(i, j) {
                    row.push(bad());
                    continue;
                }
                let leased = &answers[slot[key.as_str()]];
                let mut fragments = Vec::new();
                let mut cell = Vec::with_capacity(request.sizes[i][j].len());
                for k in 0..request.sizes[i][j].len() {
                    let (dst, src, len) = (
                        request.dst_offsets[i][j][k],
                        request.src_offsets[i][j][k],
                        request.sizes[i][j][k],
                    );
                    let outcome = leased.as_ref().map_err(|e| *e).and_then(|l| {
                        let fits = |off: u64, limit: u64| {
                            off.checked_add(len).is_some_and(|end| end <= limit)
                        };
                        if !fits(dst, capacity) || !fits(src, l.query.size) {
                            return fail(
                                ErrorCode::InvalidParams,
                                format!("fragment [{i}][{j}][{k}] is out of range"),
                            );
                        }
                        if overlapping.contains(&(i, j, k)) {
                            return fail(
                                ErrorCode::InvalidParams,
                                format!(
                                    "fragment [{i}][{j}][{k}]'s destination overlaps another \
                                     fragment's: overlapping fragments are refused"
                                ),
                            );
                        }
                        Ok(len)
                    });
                    if outcome.is_ok() && len > 0 {
                        fragments.push(Fragment {
                            local: base + dst as usize,
                            len,
                            offset: src,
                        });
                    }
                    cell.push(outcome);
                }
                if let (Ok(l), false) = (leased, fragments.is_empty()) {
                    jobs.push(ReadJob {
                        replicas: core.ordered(&l.query),
                        fragments,
                    });
                    job_at.push((i, j, slot[key.as_str()]));
                }
                row.push(cell);
            }
            results.push(row);
        }
        let outcomes = core.read_jobs(&jobs);
        for (&(i, j, s), outcome) in job_at.iter().zip(outcomes) {
            let expired = answers[s].as_ref().is_ok_and(|l| l.expired());
            let failure: Option<ErrorCode> = match outcome {
                Err(e) => Some(e),
                Ok(()) if expired => Some(ErrorCode::LeaseExpired),
                Ok(()) => None,
            };
            if let Some(e) = failure {
                for cell in results[i][j].iter_mut().filter(|c| c.is_ok()) {
                    *cell = Err(e);
                }
            }
        }
        let mut stale: Vec<String> = Vec::new();
        for (i, row) in results.iter().enumerate() {
            for (j, cell) in row.iter().enumerate() {
                let Some(key) = request.keys[i].get(j) else {
                    continue;
                };
                let cached = slot
                    .get(key.as_str())
                    .is_some_and(|&s| answers[s].as_ref().is_ok_and(|l| l.cached));
                if cached && cell.iter().any(|c| c.is_err()) && !stale.contains(key) {
                    stale.push(key.clone());
                }
            }
        }
        (results, stale)
    }
}
