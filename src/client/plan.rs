//! Pure planning of data movement: how an object's bytes map onto caller memory.
//!
//! A [`Fragment`] is one contiguous piece of caller memory and the object offset it
//! corresponds to. Every put/get variant reduces to a list of fragments per key, and the
//! fragments of one key become one transfer request per replica.

use crate::error::{fail, ErrorCode, Result};
use crate::transfer::{TransferOp, TransferRequest};
use crate::types::{ReplicaDescriptor, WriteGrant, WriteToken};
use std::time::{Duration, Instant};

/// One piece of caller memory (`len` bytes at `local`) mapped to object bytes
/// `[offset, offset + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fragment {
    pub local: usize,
    pub len: u64,
    pub offset: u64,
}

/// A caller buffer as an address range: host memory or device memory (see
/// [`crate::device`]); Rust never dereferences it, only the transfer engine's copy
/// primitive and sockets (through bounce buffers for device memory) touch its bytes. No
/// ownership: the caller keeps it valid for the duration of the call that takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    /// First byte (0 only with `len` 0).
    pub addr: usize,
    /// Length in bytes.
    pub len: u64,
}

impl Buf {
    /// `len` bytes at `addr`.
    pub fn new(addr: usize, len: u64) -> Buf {
        Buf { addr, len }
    }

    pub(crate) fn of(bytes: &[u8]) -> Buf {
        Buf {
            addr: bytes.as_ptr() as usize,
            len: bytes.len() as u64,
        }
    }

    pub(crate) fn of_mut(bytes: &mut [u8]) -> Buf {
        Buf {
            addr: bytes.as_mut_ptr() as usize,
            len: bytes.len() as u64,
        }
    }
}

/// Total length of a buffer list; `INVALID_PARAMS` on overflow.
pub(crate) fn total_len(bufs: &[Buf]) -> Result<u64> {
    bufs.iter()
        .try_fold(0u64, |acc, b| match acc.checked_add(b.len) {
            Some(sum) => Ok(sum),
            None => fail(ErrorCode::InvalidParams, "buffer sizes overflow"),
        })
}

/// Checks that a read's buffers can take a `size`-byte object: `INVALID_PARAMS` when they
/// hold less; with `exact` (the multi-buffer gets), `TRANSFER_FAIL` when they hold more
/// (Mooncake's behaviour).
pub(crate) fn check_capacity(bufs: &[Buf], size: u64, exact: bool) -> Result<()> {
    let capacity = total_len(bufs)?;
    if capacity < size {
        return fail(
            ErrorCode::InvalidParams,
            format!("user buffer of {capacity} bytes is too small for {size} bytes"),
        );
    }
    if exact && capacity > size {
        return fail(
            ErrorCode::TransferFail,
            format!("buffers hold {capacity} bytes but the object has {size}"),
        );
    }
    Ok(())
}

/// Lays the buffers end to end over object bytes `[0, sum)`, skipping empty buffers.
pub(crate) fn contiguous(bufs: &[Buf]) -> Vec<Fragment> {
    let mut offset = 0;
    bufs.iter()
        .filter(|b| b.len > 0)
        .map(|b| {
            let fragment = Fragment {
                local: b.addr,
                len: b.len,
                offset,
            };
            offset += b.len;
            fragment
        })
        .collect()
}

/// Keeps only the first `size` object bytes of the fragments (a read of a `size`-byte object
/// into a larger buffer).
pub(crate) fn truncate(fragments: Vec<Fragment>, size: u64) -> Vec<Fragment> {
    fragments
        .into_iter()
        .filter(|f| f.offset < size)
        .map(|f| Fragment {
            len: f.len.min(size - f.offset),
            ..f
        })
        .collect()
}

/// Checks that every fragment lies inside an object of `size` bytes.
pub(crate) fn check_within(fragments: &[Fragment], size: u64) -> Result<()> {
    for f in fragments {
        match f.offset.checked_add(f.len) {
            Some(end) if end <= size => {}
            _ => {
                return fail(
                    ErrorCode::InvalidParams,
                    format!(
                        "range [{}, +{}) exceeds the object size {size}",
                        f.offset, f.len
                    ),
                )
            }
        }
    }
    Ok(())
}

/// Which destination ranges (`(addr, len)`) share a byte with another one: `true` at every
/// index that overlaps at least one other range. Empty ranges overlap nothing. Sorts by
/// start and sweeps once, O(n log n): a range starting before the furthest end seen so far
/// joins that run of ranges, and every range in a run of two or more overlaps one of them.
pub(crate) fn overlapping(ranges: &[(usize, u64)]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..ranges.len()).filter(|&i| ranges[i].1 > 0).collect();
    order.sort_unstable_by_key(|&i| ranges[i].0);
    let mut marked = vec![false; ranges.len()];
    let mut mark_run = |run: &[usize]| {
        if run.len() > 1 {
            run.iter().for_each(|&i| marked[i] = true);
        }
    };
    let (mut first, mut reach) = (0, 0u128);
    for (pos, &i) in order.iter().enumerate() {
        let (start, len) = (ranges[i].0 as u128, ranges[i].1 as u128);
        if start >= reach {
            mark_run(&order[first..pos]);
            first = pos;
        }
        reach = reach.max(start + len);
    }
    mark_run(&order[first..]);
    marked
}

/// Transfer requests moving `fragments` to (`Write`) or from (`Read`) one replica, one per
/// fragment, in order (an iterator: callers gather the requests of a whole batch into one
/// list without a list per key).
pub(crate) fn requests<'a>(
    op: TransferOp,
    fragments: &'a [Fragment],
    replica: &'a ReplicaDescriptor,
) -> impl Iterator<Item = TransferRequest<'a>> + 'a {
    fragments.iter().map(move |f| TransferRequest {
        op,
        local_addr: f.local,
        len: f.len,
        endpoint: &replica.buffer.transport_endpoint,
        remote_addr: replica.buffer.buffer_address + f.offset,
        epoch: replica.buffer.epoch,
        send_by: None,
    })
}

/// One key to read: which replicas (best first) and where its bytes go.
pub(crate) struct ReadJob<'a> {
    pub replicas: Vec<&'a ReplicaDescriptor>,
    pub fragments: Vec<Fragment>,
}

/// Spreads a batch answer over `n` keys (a whole-batch error or a short answer fails all).
pub(crate) fn per_key<T: Clone>(answer: Result<Vec<Result<T>>>, n: usize) -> Vec<Result<T>> {
    match answer {
        Ok(list) if list.len() == n => list,
        Ok(_) => vec![
            fail(
                ErrorCode::RpcFail,
                "master answered with the wrong number of entries"
            );
            n
        ],
        Err(e) => vec![Err(e); n],
    }
}

/// One key's write into all its replicas: the source fragments (object offsets), the
/// replicas, and the instant after which no slice may start (the grant's end).
pub(crate) struct ReplicaWrite {
    /// Index of the key in the caller's batch.
    pub(crate) key: usize,
    pub(crate) replicas: Vec<ReplicaDescriptor>,
    pub(crate) fragments: Vec<Fragment>,
    pub(crate) send_by: Option<Instant>,
}

/// A write the master granted, as its writer keeps it: the token its end or revoke presents,
/// and the local deadline after which no transfer into its replicas may start (the master
/// may have reclaimed and reused them by then). Plain value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrantedWrite {
    pub(crate) token: WriteToken,
    deadline: Instant,
}

impl GrantedWrite {
    /// `grant`, asked for at `asked_at` (before the request was sent, so the local deadline
    /// is never later than the master's).
    pub(crate) fn new(grant: &WriteGrant, asked_at: Instant) -> GrantedWrite {
        let ttl = Duration::from_millis(grant.write_ttl_ms);
        GrantedWrite {
            token: grant.token,
            deadline: crate::spin::deadline(asked_at, ttl),
        }
    }

    /// The instant after which no slice into the replicas may start
    /// ([`crate::transfer::TransferRequest::send_by`]).
    pub(crate) fn send_by(&self) -> Option<Instant> {
        Some(self.deadline)
    }

    /// Whether transfers into the replicas may still start. Errors: `STALE_WRITE_TOKEN` once
    /// the write outlived the master's `put_start_release_timeout`.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if Instant::now() >= self.deadline {
            return fail(
                ErrorCode::StaleWriteToken,
                format!(
                    "write {} outlived put_start_release_timeout; its space may be reused",
                    self.token.0
                ),
            );
        }
        Ok(())
    }
}

/// Checks that every granted replica has exactly the object's size: a replica of another
/// size is never written (a larger write would overrun into neighbouring objects). Errors:
/// `INVALID_REPLICA`.
pub(crate) fn check_replicas(replicas: &[ReplicaDescriptor], size: u64) -> Result<()> {
    match replicas.iter().find(|r| r.buffer.size != size) {
        Some(bad) => fail(
            ErrorCode::InvalidReplica,
            format!(
                "replica of {} bytes for a {size}-byte object",
                bad.buffer.size
            ),
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_layout_and_truncation() {
        let bufs = [
            Buf { addr: 100, len: 10 },
            Buf { addr: 500, len: 0 },
            Buf { addr: 200, len: 5 },
        ];
        assert_eq!(total_len(&bufs).unwrap(), 15);
        let frags = contiguous(&bufs);
        assert_eq!(
            frags,
            vec![
                Fragment {
                    local: 100,
                    len: 10,
                    offset: 0
                },
                Fragment {
                    local: 200,
                    len: 5,
                    offset: 10
                }
            ]
        );
        assert_eq!(
            truncate(frags.clone(), 12),
            vec![
                Fragment {
                    local: 100,
                    len: 10,
                    offset: 0
                },
                Fragment {
                    local: 200,
                    len: 2,
                    offset: 10
                }
            ]
        );
        assert!(check_within(&frags, 15).is_ok());
        assert_eq!(check_within(&frags, 14), Err(ErrorCode::InvalidParams));
        let overflow = [
            Buf {
                addr: 1,
                len: u64::MAX,
            },
            Buf { addr: 2, len: 1 },
        ];
        assert_eq!(total_len(&overflow), Err(ErrorCode::InvalidParams));
    }

    #[test]
    fn overlap_marks_every_range_sharing_a_byte() {
        // [0,10) holds [5,6) and [8,12); [12,14) only touches; [20,20) is empty inside
        // [15,25); [15,25) and [24,30) share byte 24; the top of the address space is fine.
        let ranges = [
            (8, 4),
            (0, 10),
            (12, 2),
            (5, 1),
            (20, 0),
            (15, 10),
            (24, 6),
            (usize::MAX - 1, 2),
        ];
        assert_eq!(
            overlapping(&ranges),
            vec![true, true, false, true, false, true, true, false]
        );
        assert_eq!(overlapping(&[(7, 3), (7, 3)]), vec![true, true]);
        assert_eq!(overlapping(&[(0, 4), (4, 4)]), vec![false, false]);
        assert!(overlapping(&[]).is_empty());
    }
}
