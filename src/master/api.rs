//! The master's interface as one list: the [`MasterApi`] trait every master implements (the
//! in-process [`crate::master::MasterService`] and the RPC client), and the wire messages
//! [`MasterRequest`] / [`MasterResponse`] derived from the same list so the two can never
//! drift apart (see [`crate::rpc::interface`]).
//!
//! All methods are synchronous and thread-safe (`&self`, `Send + Sync`). Keys are UTF-8
//! strings; an empty key is `INVALID_PARAMS`. Batch methods return one entry per input, in
//! order. The `p2p_*` methods serve the P2P (V3) deployment, where the master keeps routing
//! metadata only (key → owner client, size); a master in the other mode answers them with
//! `UNAVAILABLE_IN_CURRENT_MODE`, as a P2P master answers the segment methods.

use super::journal::JournalFile;
use crate::error::Result;
use crate::rpc::interface::rpc_interface;
use crate::types::{
    ClientId, DiskMount, DiskMountAnswer, DiskMountPage, DiskReport, DiskTask, P2pOwner, P2pRoute,
    PingResponse, PinnedObject, QueryResult, ReplicateConfig, RevocationBatch, Segment, SegmentId,
    WriteGrant, WriteToken,
};

rpc_interface! {
    /// The master interface ([`crate::rpc::Interface`] marker).
    interface MasterInterface = "mc-master-rpc", tls = true;
    /// The master's operations. See the module documentation for conventions.
    trait MasterApi;
    request MasterRequest;
    response MasterResponse;
    /// A [`MasterApi`] that forwards every call through a [`crate::rpc::Call`] transport.
    remote RemoteMaster;
    /// A [`MasterApi`] that calls another one directly, after a hook (counting, tracing).
    forward ForwardMaster;
    /// Version handshake: returns [`crate::types::STORE_VERSION`].
    fn service_ready() -> Result<String>;
    /// Liveness ping from a client (with or without segments): its status, the master's
    /// client TTL and the client's registration number.
    fn ping(client: ClientId) -> Result<PingResponse>;
    /// Adds a segment owned by `client` (idempotent for the same id).
    fn mount_segment(client: ClientId, segment: Segment) -> Result<()>;
    /// Re-adds a client's segments after the master forgot them (empty of objects).
    fn remount_segments(client: ClientId, segments: Vec<Segment>) -> Result<()>;
    /// Removes a segment; objects whose replicas all lived there disappear (idempotent).
    fn unmount_segment(client: ClientId, segment: SegmentId) -> Result<()>;
    /// Starts writes of `keys[i]` with `sizes[i]` bytes: allocates PROCESSING replicas.
    /// Per key: the grant (write token, descriptors to write, write ttl), or
    /// `OBJECT_ALREADY_EXISTS` (complete or in-flight key), `NO_AVAILABLE_HANDLE` (no space),
    /// `INVALID_PARAMS`.
    fn batch_put_start(client: ClientId, keys: Vec<String>, sizes: Vec<u64>, config: ReplicateConfig) -> Result<Vec<Result<WriteGrant>>>;
    /// Marks the PROCESSING replicas of write `tokens[i]` of `keys[i]` COMPLETE (object
    /// readable, not leased); idempotent once complete. Per key: `STALE_WRITE_TOKEN` when the
    /// token is not the key's latest write (superseded or reclaimed: nothing changes),
    /// `OBJECT_NOT_FOUND`, `ILLEGAL_CLIENT`.
    fn batch_put_end(client: ClientId, keys: Vec<String>, tokens: Vec<WriteToken>) -> Result<Vec<Result<()>>>;
    /// Drops the PROCESSING replicas of write `tokens[i]` of `keys[i]` and erases the key;
    /// the space is reused only after `write_quarantine_ms`. Per key: `STALE_WRITE_TOKEN`
    /// (nothing changes), `OBJECT_NOT_FOUND`, `ILLEGAL_CLIENT`, `INVALID_WRITE` (complete).
    fn batch_put_revoke(client: ClientId, keys: Vec<String>, tokens: Vec<WriteToken>) -> Result<Vec<Result<()>>>;
    /// Insert-or-update: like `batch_put_start`, but an existing key is overwritten (in place
    /// when the size matches and nobody reads it, else reallocated). Finish with
    /// `batch_put_end` / `batch_put_revoke`.
    fn batch_upsert_start(client: ClientId, keys: Vec<String>, sizes: Vec<u64>, config: ReplicateConfig) -> Result<Vec<Result<WriteGrant>>>;
    /// Readable replicas of each key; grants each a read lease.
    fn batch_get_replica_list(keys: Vec<String>) -> Result<Vec<Result<QueryResult>>>;
    /// As `batch_get_replica_list`, for a client with a location cache: while `client` keeps
    /// its `cache_revocations` poll open, each answer also makes it a holder of a cached lease
    /// (`cache_ttl_ms`, from before the request was sent), revoked before any write of the
    /// key is acknowledged (`docs/location-cache.md`); otherwise `cache_ttl_ms` is 0.
    fn batch_get_locations(client: ClientId, keys: Vec<String>) -> Result<Vec<Result<QueryResult>>>;
    /// A location cache's long poll: acknowledges every revocation up to `acked` of master
    /// life `incarnation` (another life's acknowledgement is ignored), then answers the
    /// revocations not delivered yet, waiting up to 100 ms for one.
    fn cache_revocations(client: ClientId, incarnation: u64, acked: u64) -> Result<RevocationBatch>;
    /// Waits up to 100 ms until the revocations of `keys` (every revocation issued so far
    /// when empty) are acknowledged or past their holders' leases, and the master's start
    /// grace is over: `true` when they are (a write or removal may be acknowledged), `false`
    /// when still pending (call again).
    fn await_revocations(keys: Vec<String>) -> Result<bool>;
    /// Whether each key has a readable replica; grants a lease to those that do.
    fn batch_exist_key(keys: Vec<String>) -> Result<Vec<Result<bool>>>;
    /// Removes keys (`OBJECT_HAS_LEASE` under lease unless `force`).
    fn batch_remove(keys: Vec<String>, force: bool) -> Result<Vec<Result<()>>>;
    /// Removes complete, unleased (unless `force`) objects whose key contains a match of
    /// `pattern`; returns how many.
    fn remove_by_regex(pattern: String, force: bool) -> Result<u64>;
    /// Removes every complete, unleased (unless `force`) object; returns how many.
    fn remove_all(force: bool) -> Result<u64>;
    /// Pins each key for `client`: its replicas stay allocated until unpinned.
    fn batch_pin(client: ClientId, keys: Vec<String>) -> Result<Vec<Result<PinnedObject>>>;
    /// Releases pins taken by `client`; unknown ids are ignored.
    fn unpin(client: ClientId, pin_ids: Vec<u64>) -> Result<()>;
    /// P2P: registers (or re-registers) an owner client and its endpoints; starts its
    /// liveness timer (kept alive by `ping`). An owner not pinging for `client_ttl` is dropped
    /// with all its keys.
    fn p2p_register_owner(owner: P2pOwner) -> Result<()>;
    /// P2P: the live owners.
    fn p2p_list_owners() -> Result<Vec<P2pOwner>>;
    /// P2P: records that `client` holds `keys[i]` (`sizes[i]` bytes). Per key:
    /// `OBJECT_ALREADY_EXISTS` when another owner holds it (idempotent for the same owner),
    /// `CLIENT_NOT_FOUND` for an unregistered owner, `INVALID_PARAMS` for bad arguments.
    fn p2p_add_keys(client: ClientId, keys: Vec<String>, sizes: Vec<u64>) -> Result<Vec<Result<()>>>;
    /// P2P: after re-registering, an owner the master expired routes again the keys it still
    /// holds; `view_version` is the master view it last saw confirmed. Per key: `OBJECT_NOT_FOUND`
    /// when the key was written, taken or removed since the expiry (or the claim aged out), so
    /// the owner must drop its value; otherwise as [`MasterApi::p2p_add_keys`], which a
    /// restarted master (another `view_version`) applies instead.
    fn p2p_reclaim_keys(client: ClientId, view_version: u64, keys: Vec<String>, sizes: Vec<u64>) -> Result<Vec<Result<()>>>;
    /// P2P: forgets keys held by `client`. Per key: `OBJECT_NOT_FOUND` when it holds no such key.
    fn p2p_remove_keys(client: ClientId, keys: Vec<String>) -> Result<Vec<Result<()>>>;
    /// P2P: the owner and size of each key, or `OBJECT_NOT_FOUND`.
    fn p2p_get_routes(keys: Vec<String>) -> Result<Vec<Result<P2pRoute>>>;
    /// Registers a client that mounts no segment (a mount registers the others): from now on
    /// its pings are answered `Ok`, and it is expired, with its pins, when they stop for
    /// `client_ttl`. Idempotent; waits while an expiry of the client is being retired.
    fn register_client(client: ClientId) -> Result<()>;
    /// The segments a master restarted from its journal recovered for `client` and still
    /// waits for (empty for a master without a journal). A segment whose `epoch` is the one
    /// the client still holds, with the same memory, can be re-attached with
    /// [`MasterApi::reattach_segment`] instead of mounted afresh. `UNAVAILABLE_IN_CURRENT_MODE`
    /// in P2P mode.
    fn recovered_segments(client: ClientId) -> Result<Vec<Segment>>;
    /// Re-attaches a recovered segment that `client` held under `previous_epoch` and mounts
    /// again, same memory and contents, as `segment` (same id, range, name and protocol,
    /// a fresh epoch): its objects become readable under the new epoch. `false` when the
    /// master has no such segment waiting (then nothing changed: mount it afresh).
    fn reattach_segment(client: ClientId, previous_epoch: u64, segment: Segment) -> Result<bool>;
    /// For a standby master copying this master's journal: the journal's files and their
    /// lengths; `acked_lsn` is how far the standby's copy is durable (the master then keeps
    /// freed ranges until the standby holds their removals). A long poll: answers once a
    /// record after `acked_lsn` is durable, or after at most 100 ms. `UNAVAILABLE_IN_CURRENT_MODE`
    /// without a journal.
    fn journal_files(follower: ClientId, acked_lsn: u64) -> Result<Vec<JournalFile>>;
    /// Up to `max_bytes` (at most 4 MiB) of journal file `name` from `offset`.
    /// `FILE_NOT_FOUND` once compaction deleted it; `INVALID_PARAMS` for other names.
    fn journal_read(name: String, offset: u64, max_bytes: u64) -> Result<Vec<u8>>;
    /// SSD tier: mounts `client`'s disk tier, reporting what it holds in pages (the first
    /// page starts the mount, the last ends it: the master then forgets the copies on the tier
    /// no page confirmed). Answers the mount's number and, per object of the page, whether
    /// the owner keeps it (`false`: delete the record: the master neither lists it nor has a
    /// reader holding it). `CLIENT_NOT_FOUND` for a client the master does not know (it
    /// remounts its segment first), and for a page that is not first when this client is not
    /// mounting that tier; `TRY_AGAIN` for a page of a mount since replaced (start again).
    /// `docs/ssd-tier.md`.
    fn mount_disk(
        client: ClientId,
        mount: DiskMount,
        page: DiskMountPage,
    ) -> Result<DiskMountAnswer>;
    /// SSD tier: `client` closes its tier (a clean teardown): its objects wait, unreadable,
    /// for a restart on the directory (`reattach_grace_ms`), as after an expiry. Idempotent.
    fn unmount_disk(client: ClientId) -> Result<()>;
    /// SSD tier: the work queued for `client`'s tier; a long poll (at most 100 ms when none
    /// is queued). `CLIENT_NOT_FOUND` when the tier is not mounted (mount it again).
    fn disk_tasks(client: ClientId) -> Result<Vec<DiskTask>>;
    /// SSD tier: what `client` did. Per report whether the master accepts it; a refused
    /// demotion's record must be deleted.
    fn disk_report(client: ClientId, reports: Vec<DiskReport>) -> Result<Vec<bool>>;
    /// A location cache's renewal of hot keys it serves from its cache, ahead of their
    /// expiry: as `batch_get_locations`, except that while the mounted segments are above
    /// the eviction high watermark every key answers `TRY_AGAIN` and nothing is granted (no
    /// read lease, no cached lease): renewals never extend a lease under memory pressure
    /// (a get that misses is still answered and leased as any get). Last in this list:
    /// a method's place is its number on the wire, so new methods go at the end.
    fn renew_locations(client: ClientId, keys: Vec<String>) -> Result<Vec<Result<QueryResult>>>;
}
