//! The master's interface as one list: the [`MasterApi`] trait every master implements (the
//! in-process [`crate::master::MasterService`] and the RPC client), and the wire messages
//! [`MasterRequest`] / [`MasterResponse`] derived from the same list so the two can never
//! drift apart.
//!
//! All methods are synchronous and thread-safe (`&self`, `Send + Sync`). Keys are UTF-8
//! strings; an empty key is `INVALID_PARAMS`. Batch methods return one entry per input, in
//! order.

use crate::error::{ErrorCode, Result};
use crate::types::{
    ClientId, PingResponse, PinnedObject, QueryResult, ReplicaDescriptor, ReplicateConfig, Segment,
    SegmentId,
};
use serde::{Deserialize, Serialize};

macro_rules! master_api {
    ($( $(#[$doc:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*) => {
        /// The master's operations. See the module documentation for conventions.
        pub trait MasterApi: Send + Sync {
            $( $(#[$doc])* fn $name(&self, $($arg: $ty),*) -> $ret; )*
        }

        /// One call of [`MasterApi`], as sent over the wire.
        #[allow(non_camel_case_types, missing_docs)]
        #[derive(Clone, Debug, Serialize, Deserialize)]
        pub enum MasterRequest {
            $( $name { $($arg: $ty),* }, )*
        }

        /// The answer to a [`MasterRequest`] of the same name.
        #[allow(non_camel_case_types, missing_docs)]
        #[derive(Clone, Debug, Serialize, Deserialize)]
        pub enum MasterResponse {
            $( $name($ret), )*
        }

        impl MasterRequest {
            /// Runs the call against `api` and wraps the answer.
            pub fn dispatch(self, api: &dyn MasterApi) -> MasterResponse {
                match self {
                    $( MasterRequest::$name { $($arg),* } => MasterResponse::$name(api.$name($($arg),*)), )*
                }
            }

            /// The method name (for metrics and logs).
            pub fn name(&self) -> &'static str {
                match self { $( MasterRequest::$name { .. } => stringify!($name), )* }
            }
        }

        impl<C: MasterCall> MasterApi for RemoteMaster<C> {
            $(
                fn $name(&self, $($arg: $ty),*) -> $ret {
                    match self.0.call(MasterRequest::$name { $($arg),* })? {
                        MasterResponse::$name(answer) => answer,
                        other => {
                            tracing::error!(expected = stringify!($name), got = ?other, "mismatched master response");
                            Err(ErrorCode::RpcFail)
                        }
                    }
                }
            )*
        }
    };
}

/// Sends one request to a master and returns its answer; transport errors are `RPC_FAIL` /
/// `RPC_TIMEOUT`. Implemented by the RPC client.
pub trait MasterCall: Send + Sync {
    /// Performs one round trip.
    fn call(&self, request: MasterRequest) -> Result<MasterResponse>;
}

/// A [`MasterApi`] that forwards every call through a [`MasterCall`] transport.
pub struct RemoteMaster<C>(pub C);

master_api! {
    /// Version handshake: returns [`crate::types::STORE_VERSION`].
    fn service_ready() -> Result<String>;
    /// Liveness ping from a client that owns segments.
    fn ping(client: ClientId) -> Result<PingResponse>;
    /// Adds a segment owned by `client` (idempotent for the same id).
    fn mount_segment(client: ClientId, segment: Segment) -> Result<()>;
    /// Re-adds a client's segments after the master forgot them (empty of objects).
    fn remount_segments(client: ClientId, segments: Vec<Segment>) -> Result<()>;
    /// Removes a segment; objects whose replicas all lived there disappear (idempotent).
    fn unmount_segment(client: ClientId, segment: SegmentId) -> Result<()>;
    /// Starts writes of `keys[i]` with `sizes[i]` bytes: allocates PROCESSING replicas.
    /// Per key: descriptors to write, or `OBJECT_ALREADY_EXISTS` (complete or in-flight key),
    /// `NO_AVAILABLE_HANDLE` (no space), `INVALID_PARAMS`.
    fn batch_put_start(client: ClientId, keys: Vec<String>, sizes: Vec<u64>, config: ReplicateConfig) -> Result<Vec<Result<Vec<ReplicaDescriptor>>>>;
    /// Marks the keys' PROCESSING replicas COMPLETE (object readable, not leased).
    fn batch_put_end(client: ClientId, keys: Vec<String>) -> Result<Vec<Result<()>>>;
    /// Drops the keys' PROCESSING replicas and returns their space.
    fn batch_put_revoke(client: ClientId, keys: Vec<String>) -> Result<Vec<Result<()>>>;
    /// Insert-or-update: like `batch_put_start`, but an existing key is overwritten (in place
    /// when the size matches and nobody reads it, else reallocated). Finish with
    /// `batch_put_end` / `batch_put_revoke`.
    fn batch_upsert_start(client: ClientId, keys: Vec<String>, sizes: Vec<u64>, config: ReplicateConfig) -> Result<Vec<Result<Vec<ReplicaDescriptor>>>>;
    /// Readable replicas of each key; grants each a read lease.
    fn batch_get_replica_list(keys: Vec<String>) -> Result<Vec<Result<QueryResult>>>;
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
}
