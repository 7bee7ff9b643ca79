//! Pure planning of data movement: how an object's bytes map onto caller memory.
//!
//! A [`Fragment`] is one contiguous piece of caller memory and the object offset it
//! corresponds to. Every put/get variant reduces to a list of fragments per key, and the
//! fragments of one key become one transfer request per replica.

use crate::error::{fail, ErrorCode, Result};
use crate::transfer::{TransferOp, TransferRequest};
use crate::types::ReplicaDescriptor;

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

/// Transfer requests moving `fragments` to (`Write`) or from (`Read`) one replica.
pub(crate) fn requests<'a>(
    op: TransferOp,
    fragments: &[Fragment],
    replica: &'a ReplicaDescriptor,
) -> Vec<TransferRequest<'a>> {
    fragments
        .iter()
        .map(|f| TransferRequest {
            op,
            local_addr: f.local,
            len: f.len,
            endpoint: &replica.buffer.transport_endpoint,
            remote_addr: replica.buffer.buffer_address + f.offset,
            epoch: 0,
        })
        .collect()
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
}
