//! The owner-side client RPC service as one list ([`PeerApi`]): the methods an accessor calls
//! on the owner of a key. Generated with [`crate::rpc::interface`]: the wire enums, the
//! [`PeerInterface`] marker the generic RPC server and client use, and [`RemotePeer`].
//!
//! RPCs carry metadata and buffer descriptors only; bytes always move through transfer
//! engines. All methods are synchronous and thread-safe.

use super::counters::P2pCounters;
use crate::error::Result;
use crate::rpc::interface::rpc_interface;
use serde::{Deserialize, Serialize};

/// `len` bytes at `addr`, registered (remotely accessible) with the transfer engine of the
/// process whose segment name is `endpoint`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteBufferDesc {
    /// Segment name of the process holding the buffer.
    pub endpoint: String,
    /// Absolute address in that process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// PreWrite's answer: where to write, and the operation id WriteCommit / WriteRevoke need.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteGrant {
    /// The reserved buffer (exactly the value's length).
    pub buffer: RemoteBufferDesc,
    /// Identifies this write session.
    pub write_operation_id: u64,
    /// The record's lease, from when the owner created it.
    pub lease_ms: u64,
}

/// PinKey's answer: where to read, and the operation id UnPinKey needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadGrant {
    /// The pinned value (its length is the value size).
    pub buffer: RemoteBufferDesc,
    /// Identifies the pin record (shared by concurrent readers of the key).
    pub read_operation_id: u64,
    /// The pin's lease, from the owner's answer.
    pub lease_ms: u64,
}

/// One value a REVERSE write asks the owner to pull.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteWrite {
    /// Key to create.
    pub key: String,
    /// The accessor's buffer holding the value (its length is the value size).
    pub source: RemoteBufferDesc,
    /// See [`RemoteRead::valid_for_ms`].
    pub valid_for_ms: u64,
}

/// One value a REVERSE read asks the owner to push.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteRead {
    /// Key to read.
    pub key: String,
    /// The accessor's buffer to fill (at least the value size).
    pub target: RemoteBufferDesc,
    /// The accessor's RPC timeout: it stops waiting for the answer this long after it sent
    /// the request, and may then reuse its buffer once its quarantine has passed. The owner
    /// starts no transfer of the item later than `valid_for_ms` after it *read* the request
    /// (its own clock; the two clocks are never compared). Reading happens after sending, so
    /// the owner's limit may lie later than the accessor's by the time the request waited
    /// unread; the accessor's quarantine (default twice the transfer timeout, at least
    /// `valid_for_ms` + the transfer timeout) covers that wait up to one transfer timeout.
    pub valid_for_ms: u64,
}

rpc_interface! {
    /// The owner service interface ([`crate::rpc::Interface`] marker).
    interface PeerInterface = "mc-peer-rpc";
    /// What an owner client serves to accessors (Mooncake's ClientRpcService).
    ///
    /// Codes: `OBJECT_NOT_FOUND` (no such key), `OBJECT_ALREADY_EXISTS` (key committed),
    /// `OBJECT_REPLICA_BUSY` (another PreWrite of the key is pending), `NO_AVAILABLE_HANDLE`
    /// (no tier has room), `LEASE_EXPIRED` (the record expired or is gone),
    /// `STALE_WRITE_TOKEN` (the write_operation_id no longer names the key's current
    /// PreWrite; nothing changes), `INVALID_READ` (stale read id), `TRANSFER_FAIL`.
    trait PeerApi;
    request PeerRequest;
    response PeerResponse;
    /// A [`PeerApi`] that forwards every call through a [`crate::rpc::Call`] transport.
    remote RemotePeer;
    /// REVERSE put: the owner reserves space, pulls each value from the accessor's buffer
    /// with its own engine and commits it (one result per item).
    fn write_remote_data(items: Vec<RemoteWrite>) -> Result<Vec<Result<()>>>;
    /// REVERSE get: the owner pushes each value into the accessor's buffer; per item the
    /// value size.
    fn read_remote_data(items: Vec<RemoteRead>) -> Result<Vec<Result<u64>>>;
    /// FORWARD put, stage 1: reserve `size` bytes for `key` under a PendingWriteRecord.
    fn pre_write(key: String, size: u64) -> Result<WriteGrant>;
    /// FORWARD put, stage 3: make the written value visible (checks id and lease).
    fn write_commit(key: String, write_operation_id: u64) -> Result<()>;
    /// FORWARD put, failure: drop the pending record; its space is quarantined (the write
    /// may still land) before reuse.
    fn write_revoke(key: String, write_operation_id: u64) -> Result<()>;
    /// FORWARD get, stage 1: pin the value (create or renew the key's PinnedKeyRecord).
    fn pin_key(key: String) -> Result<ReadGrant>;
    /// FORWARD get, failure: release this reader's hold on the pin.
    fn un_pin_key(key: String, read_operation_id: u64) -> Result<()>;
    /// Removes committed keys at once for every reader (PinKey then answers
    /// `OBJECT_NOT_FOUND`) and their routes; their bytes go when the last reader's lease ends.
    fn remove_data(keys: Vec<String>) -> Result<Vec<Result<()>>>;
    /// The owner's counters.
    fn counters() -> Result<P2pCounters>;
}
