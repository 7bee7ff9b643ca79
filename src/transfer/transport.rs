//! The vocabulary every transport shares: the direction of a request ([`Opcode`]), one
//! request between local memory and a peer's address ([`Slice`]) and why it failed
//! ([`SliceError`]). The TCP pool, RDMA and same-host transports all execute slices; the TCP
//! wire encodes the opcode in its header.

use crate::error::ErrorCode;

/// Direction of one wire request, as seen by the initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// The initiator pulls `size` bytes from `addr` in the server process.
    Read = 0,
    /// The initiator pushes `size` bytes to `addr` in the server process.
    Write = 1,
}

/// One wire request as the initiator sees it: `len` bytes between `local` (this process)
/// and `remote` (an address in the peer process).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slice {
    /// Direction: READ fills `local`, WRITE sends from `local`.
    pub(crate) op: Opcode,
    /// Local memory; see `ConnectionPool::execute` (`tcp/pool.rs`) for the validity contract.
    pub(crate) local: *mut u8,
    /// Number of bytes (> 0).
    pub(crate) len: usize,
    /// Target address in the peer process.
    pub(crate) remote: u64,
    /// The segment epoch the target range must have (0: unchecked).
    pub(crate) epoch: u64,
}

/// Why a slice (or a local job) failed: the code its request reports and a detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SliceError {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    /// The peer could not be reached or the connection failed (connect refused, reset,
    /// timed out, closed early), as opposed to a refusal: the peer's address may be stale.
    pub(crate) unreachable: bool,
}

impl From<String> for SliceError {
    /// A `TRANSFER_FAIL` with `message`, not [`unreachable`](SliceError::unreachable).
    fn from(message: String) -> SliceError {
        SliceError {
            code: ErrorCode::TransferFail,
            message,
            unreachable: false,
        }
    }
}
