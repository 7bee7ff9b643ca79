//! Data types shared by the master, the client and the wire: identifiers, replica
//! descriptors, segments and the replicate configuration. All are plain values
//! (`Clone + Send + Sync`), serialisable for the RPC layer.

use serde::{Deserialize, Serialize};
use std::fmt;

/// `master_server_addr` value that selects the in-process master.
pub const EMBEDDED_MASTER: &str = "embedded";
/// `metadata_server` value for decentralised endpoint discovery (segment name = data address).
pub const P2P_HANDSHAKE: &str = "P2PHANDSHAKE";

/// The version string the master returns from `service_ready`; clients require an exact match
/// (Mooncake's `MOONCAKE_STORE_VERSION`).
pub const STORE_VERSION: &str = "2.0.0";

/// Largest slice Mooncake moves in one piece (`kMaxSliceSize` = 16 MiB − 16).
pub const MAX_SLICE_SIZE: u64 = 16 * 1024 * 1024 - 16;

/// A 128-bit identifier (Mooncake's `UUID = pair<u64,u64>`), used for clients and segments.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Uuid {
    /// High 64 bits.
    pub hi: u64,
    /// Low 64 bits.
    pub lo: u64,
}

impl Uuid {
    /// A random identifier (not all-zero).
    pub fn random() -> Uuid {
        loop {
            let id = Uuid {
                hi: fastrand::u64(..),
                lo: fastrand::u64(..),
            };
            if id != Uuid::default() {
                return id;
            }
        }
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{:016x}", self.hi, self.lo)
    }
}

/// Identifies a client process (one `Client` instance) to the master.
pub type ClientId = Uuid;
/// Identifies one mounted segment.
pub type SegmentId = Uuid;

/// What a write does to the object's soft pin (Mooncake's `SoftPinAction`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SoftPinAction {
    /// Keep whatever pin state the object has (a new object is not pinned).
    #[default]
    Preserve = 0,
    /// Soft-pin the object for `soft_pin_ttl_ms` (or the master default) once readable.
    Enable = 1,
    /// Clear the soft pin.
    Disable = 2,
}

/// How to place an object's replicas (Mooncake's `ReplicateConfig`, the fields the client
/// layer uses).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicateConfig {
    /// Number of memory replicas wanted; best effort, each on a distinct segment name. 0 is
    /// rejected with `INVALID_PARAMS`.
    pub replica_num: u64,
    /// Soft pin action applied by the write.
    pub soft_pin_action: SoftPinAction,
    /// Soft pin duration; only valid with `SoftPinAction::Enable`.
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evicted; fixed at creation.
    pub with_hard_pin: bool,
    /// Segment names tried first, in order.
    pub preferred_segments: Vec<String>,
    /// Deprecated single preferred segment; when non-empty it replaces `preferred_segments`.
    pub preferred_segment: String,
    /// Rejected by every client put path (`INVALID_PARAMS`), as in Mooncake.
    pub prefer_alloc_in_same_node: bool,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
        }
    }
}

impl ReplicateConfig {
    /// The preferred segment names in the order placement tries them.
    pub fn preferred(&self) -> Vec<&str> {
        if self.preferred_segment.is_empty() {
            self.preferred_segments.iter().map(String::as_str).collect()
        } else {
            vec![self.preferred_segment.as_str()]
        }
    }
}

/// Where one replica's bytes live: `size` bytes at the absolute virtual address
/// `buffer_address` inside the process that owns segment `transport_endpoint`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDescriptor {
    /// Length in bytes.
    pub size: u64,
    /// Virtual address in the owner process.
    pub buffer_address: u64,
    /// Transport protocol of the owner ("tcp", "rdma", "local").
    pub protocol: String,
    /// The owner's segment name (its `local_hostname`).
    pub transport_endpoint: String,
    /// Epoch of the segment mount the range belongs to ([`Segment::epoch`]); the owner's
    /// transfer server refuses a request naming another epoch (`STALE_SEGMENT_EPOCH`).
    /// 0: not a segment range (no check).
    #[serde(default)]
    pub epoch: u64,
}

/// Replica life cycle (Mooncake's `ReplicaStatus`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaStatus {
    /// Not set.
    Undefined = 0,
    /// Allocated, not yet written.
    Initialized = 1,
    /// Being written.
    Processing = 2,
    /// Readable.
    Complete = 3,
    /// Removed.
    Removed = 4,
    /// Write failed.
    Failed = 5,
}

/// One replica of an object, as the master hands it out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDescriptor {
    /// Replica id, unique within the master's lifetime.
    pub id: u64,
    /// Location of the bytes.
    pub buffer: BufferDescriptor,
    /// State at the time of the answer.
    pub status: ReplicaStatus,
    /// For a LOCAL_DISK replica (Mooncake's `LocalDiskDescriptor`): which record of the
    /// owner's disk tier holds the bytes. `buffer.transport_endpoint` is then the owner's disk
    /// read service (`host:port`), `buffer.protocol` is [`LOCAL_DISK_PROTOCOL`],
    /// `buffer.size` the object size and `buffer.buffer_address` 0. `None`: a memory replica.
    #[serde(default)]
    pub disk: Option<DiskRecordRef>,
}

/// `BufferDescriptor::protocol` of a LOCAL_DISK replica.
pub const LOCAL_DISK_PROTOCOL: &str = "local_disk";

/// Which record of which disk tier holds a LOCAL_DISK replica: the owner serves only the
/// record of exactly this key and generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskRecordRef {
    /// The key.
    pub key: String,
    /// The client owning the disk tier.
    pub owner: ClientId,
    /// The object generation (the write token of its committed write).
    pub generation: u64,
}

/// One object held in a client's disk tier, as its owner reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskObject {
    /// The key.
    pub key: String,
    /// The object generation the record holds.
    pub generation: u64,
    /// Value length in bytes.
    pub size: u64,
}

/// A client's disk tier as it mounts it at the master.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskMount {
    /// Identity of the tier's directory (kept in the directory, the same across restarts).
    pub disk: Uuid,
    /// `host:port` of the owner's disk read service.
    pub endpoint: String,
    /// Record bytes the tier may hold.
    pub capacity: u64,
    /// Record bytes it holds now.
    pub used: u64,
}

/// One page of the report of a disk tier mount (`MasterApi::mount_disk`): the owner sends what
/// it holds in pages, the first starting the mount and the last ending it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskMountPage {
    /// This page starts a mount (a new one replaces any mount in progress).
    pub first: bool,
    /// The mount a page that is not first continues: the number the first page's answer
    /// gave (a page of a mount since replaced is refused, so it never applies to another).
    pub mount: u64,
    /// The owner's mount attempt, counting up from 1 in each client: a first page of an
    /// attempt not above the last one the master saw from this client on this tier is
    /// refused (a page answered after its owner gave up on it never replaces a later mount).
    pub attempt: u64,
    /// This page ends it: the master then forgets the copies on the tier no page confirmed.
    pub last: bool,
    /// Records the owner holds.
    pub held: Vec<DiskObject>,
}

/// The master's answer to one page of a disk tier mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskMountAnswer {
    /// The mount's number (the next pages carry it).
    pub mount: u64,
    /// Per object of the page, whether the owner keeps it (`false`: delete the record).
    pub kept: Vec<bool>,
}

/// Work the master hands to the owner of a disk tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskTask {
    /// Copy the complete memory replica `replica` of `key` (generation `generation`, `size`
    /// bytes, in the owner's own segment) into a disk record, then report
    /// [`DiskReport::Demoted`] with `task`. The master keeps the memory range allocated until
    /// the report (or until it gives the task up, after which it refuses the report).
    Demote {
        /// Names the task in the report.
        task: u64,
        /// The key.
        key: String,
        /// The object generation.
        generation: u64,
        /// The memory replica to copy.
        replica: BufferDescriptor,
    },
    /// Load the record of `key` at `generation` into `replica`, a new range of the owner's
    /// own segment (`size` bytes), then report [`DiskReport::Demoted`] with `task` (`written`:
    /// the range holds the verified value). The master keeps the range allocated until the
    /// report, and lists it as a replica only after it.
    Promote {
        /// Names the task in the report.
        task: u64,
        /// The key.
        key: String,
        /// The object generation (the record's).
        generation: u64,
        /// The new memory replica to fill.
        replica: BufferDescriptor,
    },
    /// Delete the record of `key` at `generation` (or older), if held.
    Delete {
        /// The key.
        key: String,
        /// The generation that is gone.
        generation: u64,
    },
}

/// What the owner of a disk tier tells the master.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskReport {
    /// Task `task` (a [`DiskTask::Demote`] or [`DiskTask::Promote`] of `key` at
    /// `generation`) ended: `written` when its record is durable (a demotion) or its range
    /// holds the value (a promotion).
    Demoted {
        /// The task's number.
        task: u64,
        /// The task's key.
        key: String,
        /// The task's generation.
        generation: u64,
        /// Whether the task's work is done.
        written: bool,
    },
    /// The record of `key` at `generation` is unreadable (checksum mismatch, missing file,
    /// I/O error) and was dropped: the master forgets that replica.
    Lost {
        /// The key.
        key: String,
        /// The generation whose record was lost.
        generation: u64,
    },
}

/// Answer to a replica query (`GetReplicaList`): the readable replicas and the read lease
/// just granted (the lease runs `lease_ttl_ms` from the moment the client sent the request).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryResult {
    /// Object size in bytes.
    pub size: u64,
    /// COMPLETE replicas whose segment is mounted.
    pub replicas: Vec<ReplicaDescriptor>,
    /// Lease length granted with this answer.
    pub lease_ttl_ms: u64,
    /// How long, from before the request was sent, the asking client may serve this answer
    /// from its location cache (`batch_get_locations` only; 0: it may not cache it). Never
    /// more than `lease_ttl_ms`.
    pub cache_ttl_ms: u64,
}

/// A location cache serves hits only while its last successful revocation poll was sent
/// this recently (ms): a client cut off from its master stops serving cached answers that
/// soon, and a restarted master waits a little longer than that before acknowledging writes.
pub const LOCATION_CACHE_FRESH_MS: u64 = 300;

/// A location-cache revocation: the holder must stop serving `key` from its cache, then
/// acknowledge `seq` (and every earlier one) in its next `cache_revocations` poll.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Per-holder sequence number, from 1.
    pub seq: u64,
    /// The key whose cached answer is revoked.
    pub key: String,
}

/// The answer to a `cache_revocations` poll.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationBatch {
    /// The master's life these sequence numbers belong to (random per start): a client
    /// seeing another one drops its whole cache and acknowledges from 0.
    pub incarnation: u64,
    /// Revocations not delivered before, in `seq` order (empty after the poll's wait).
    pub revocations: Vec<Revocation>,
}

/// A pinned object: its replicas stay allocated and unchanged until `unpin(pin_id)` or the
/// pinning client's death, whatever removal or eviction happens meanwhile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedObject {
    /// Handle to release the pin with.
    pub pin_id: u64,
    /// Object size and replicas, as `QueryResult`.
    pub query: QueryResult,
    /// When the pinning client asked for the pin (set by the client, never on the wire): a
    /// read of the pinned replicas counts only while the client can show that its master has
    /// not expired it since (see `Client::read_pinned`).
    #[serde(skip)]
    pub pinned_at: Option<std::time::Instant>,
    /// The client that asked for the pin (set by the client, never on the wire).
    #[serde(skip)]
    pub pinned_by: Option<ClientId>,
}

/// A segment a client contributes to the pool: `size` bytes at `base` in the owner process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Identifier chosen by the client.
    pub id: SegmentId,
    /// Segment name: the owner's `local_hostname` (also the transport endpoint).
    pub name: String,
    /// Base virtual address in the owner process.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
    /// Transport protocol ("tcp" …).
    pub protocol: String,
    /// This mount's epoch, chosen by the owner: a fresh random value in `1..=MAX_EPOCH` for
    /// every mount and remount, so descriptors of an earlier mount (or of an earlier process
    /// under the same name) are refused by the owner's transfer server.
    #[serde(default)]
    pub epoch: u64,
}

/// Largest segment epoch: epochs travel in the 7 spare bytes of the TCP session header.
pub const MAX_EPOCH: u64 = (1 << 56) - 1;

/// A fresh segment epoch: random, in `1..=MAX_EPOCH`.
pub fn fresh_epoch() -> u64 {
    fastrand::u64(1..=MAX_EPOCH)
}

/// Names one write of one key: the write generation the master assigned when the write
/// started (unique over the master's life; the counter starts at a random value, so a token
/// of an earlier master instance does not name a write of this one). Every finish of the
/// write (`put_end`, `put_revoke`) presents it and acts only on that write; a token of a
/// superseded or reclaimed write is `STALE_WRITE_TOKEN` and changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WriteToken(pub u64);

/// The answer to a write start (`PutStart` / `UpsertStart`) for one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteGrant {
    /// Presented by the write's end or revoke.
    pub token: WriteToken,
    /// The PROCESSING replicas to write.
    pub replicas: Vec<ReplicaDescriptor>,
    /// How long, from the start, the replicas are reserved for this writer
    /// (`put_start_release_timeout`): a writer must not start transferring into them later,
    /// since the master may have reclaimed and reused the space by then.
    pub write_ttl_ms: u64,
    /// Location caches held the key's previous value (or may have: a master just started):
    /// the writer must `await_revocations` for the key before ending the write.
    pub revoking: bool,
}

/// What the master says to a ping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientStatus {
    /// The master knows the client and its segments.
    Ok,
    /// The master does not know the client (restarted, or expired it): remount segments.
    NeedRemount,
}

/// Answer to `ping`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingResponse {
    /// Master's view version (changes when the master restarts).
    pub view_version: u64,
    /// Whether the client must remount.
    pub status: ClientStatus,
    /// The master's client TTL in ms: it expires a client (and releases its pins) no sooner
    /// than this after the last ping it received.
    pub client_ttl_ms: u64,
    /// The number of the client's current registration at this master (`Ok` answers; 0
    /// otherwise): it changes only when the client was expired and registered again, so two
    /// answers of one view with the same number prove that it was not expired in between.
    pub registration: u64,
}

/// Deployment mode of a master and its clients (Mooncake's `--deployment_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeploymentMode {
    /// The master places replicas inside clients' mounted segments.
    #[default]
    Centralized,
    /// P2P (V3): the master only routes keys to owner clients, which store and serve them.
    P2p,
}

/// A P2P owner client as the master knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct P2pOwner {
    /// The owner's identity (its liveness pings use it).
    pub client: ClientId,
    /// The owner's transfer-engine segment name (`host:port` of its data server).
    pub name: String,
    /// `host:port` of the owner's client RPC service (`client_rpc_port`).
    pub rpc_addr: String,
}

/// Where a key lives in a P2P deployment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct P2pRoute {
    /// The client holding the key.
    pub owner: P2pOwner,
    /// Value size in bytes.
    pub size: u64,
}
