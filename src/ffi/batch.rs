//! Batch plumbing shared by every batch function: the results contract and the unpacking of
//! key-major nested buffer arrays (`bufs[i][j]`, `sizes[i][j]`, `buf_counts[i]`).

use super::check;
use super::store::mc_store;
use crate::client::{Buf, Client};
use crate::error::{ErrorCode, Result};
use std::ffi::c_int;

/// A per-key Rust result as it is written into a C results slot.
pub(crate) trait Slot<R>: Copy {
    fn ok(value: R) -> Self;
    fn err(code: ErrorCode) -> Self;
}

impl Slot<()> for c_int {
    fn ok(_: ()) -> Self {
        0
    }
    fn err(code: ErrorCode) -> Self {
        code.code()
    }
}

impl Slot<bool> for c_int {
    fn ok(value: bool) -> Self {
        c_int::from(value)
    }
    fn err(code: ErrorCode) -> Self {
        code.code()
    }
}

impl Slot<u64> for i64 {
    fn ok(value: u64) -> Self {
        i64::try_from(value).unwrap_or(i64::MAX)
    }
    fn err(code: ErrorCode) -> Self {
        i64::from(code.code())
    }
}

/// Runs a batch with the results contract of the C API:
/// - `results` NULL with `count > 0` → -600, nothing written;
/// - the store unusable or an argument error inside `op` → that code, every slot set to it;
/// - otherwise 0 and one slot per key.
///
/// `op` gets the client and unpacks the remaining arguments itself (so an argument error is a
/// batch-level error).
pub(crate) fn run<S, R>(
    store: *const mc_store,
    count: usize,
    results: *mut S,
    op: impl FnOnce(&Client) -> Result<Vec<Result<R>>>,
) -> Result<c_int>
where
    S: Slot<R>,
{
    let slots = check::array_mut(results, count, "results")?;
    let answers = match mc_store::client(store).and_then(|client| op(&client)) {
        Ok(answers) if answers.len() == count => answers,
        Ok(_) => return Err(ErrorCode::InternalError),
        Err(code) => {
            check::fill(slots, S::err(code));
            return Err(code);
        }
    };
    for (slot, answer) in slots.iter_mut().zip(answers) {
        *slot = match answer {
            Ok(value) => S::ok(value),
            Err(code) => S::err(code),
        };
    }
    Ok(0)
}

/// Key-major nested arrays: for key `i`, `buf_counts[i]` entries of `outer[i]`.
pub(crate) fn nested<'a, P>(
    outer: *const *const P,
    buf_counts: &[usize],
    what: &str,
) -> Result<Vec<&'a [P]>> {
    check::array(outer, buf_counts.len(), what)?
        .iter()
        .zip(buf_counts)
        .enumerate()
        .map(|(i, (&row, &n))| check::array(row, n, &format!("{what}[{i}]")))
        .collect()
}

/// `(pointer, size)` pairs per key from `bufs[i][j]` / `sizes[i][j]` / `buf_counts[i]`.
pub(crate) fn multi_buffers<P: Copy>(
    bufs: *const *const P,
    sizes: *const *const usize,
    buf_counts: *const usize,
    count: usize,
) -> Result<Vec<Vec<(P, usize)>>> {
    let counts = check::array(buf_counts, count, "buf_counts")?;
    let bufs = nested(bufs, counts, "bufs")?;
    let sizes = nested(sizes, counts, "sizes")?;
    Ok(bufs
        .iter()
        .zip(sizes)
        .map(|(b, s)| b.iter().copied().zip(s.iter().copied()).collect())
        .collect())
}

/// Source address ranges (host or device memory, never dereferenced here) from
/// `(pointer, size)` pairs.
pub(crate) fn sources<P>(lists: &[Vec<(*const P, usize)>]) -> Result<Vec<Vec<Buf>>> {
    lists
        .iter()
        .map(|list| {
            list.iter()
                .map(|&(p, n)| check::region(p, n, "bufs[i][j]"))
                .collect()
        })
        .collect()
}

/// Destination address ranges (host or device memory, never dereferenced here) from
/// `(pointer, size)` pairs, after checking that no two overlap.
pub(crate) fn destinations<P>(lists: &[Vec<(*mut P, usize)>]) -> Result<Vec<Vec<Buf>>> {
    let spans: Vec<(usize, usize)> = lists
        .iter()
        .flatten()
        .map(|&(p, n)| (p as usize, n))
        .collect();
    check::disjoint(&spans, "destination buffers")?;
    lists
        .iter()
        .map(|list| {
            list.iter()
                .map(|&(p, n)| check::region(p.cast_const(), n, "bufs[i][j]"))
                .collect()
        })
        .collect()
}

/// Pairs of `bufs[i]` / `sizes[i]` for flat (one buffer per key) batches.
pub(crate) fn flat_buffers<P: Copy>(
    bufs: *const P,
    sizes: *const usize,
    count: usize,
) -> Result<Vec<Vec<(P, usize)>>> {
    let bufs = check::array(bufs, count, "bufs")?;
    let sizes = check::array(sizes, count, "sizes")?;
    Ok(bufs
        .iter()
        .zip(sizes)
        .map(|(&b, &s)| vec![(b, s)])
        .collect())
}
