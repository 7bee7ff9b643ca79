//! Mooncake's HTTP metadata service: the key-value store the master mounts on
//! `--http_metadata_server_port` ([`store`]) and the client side that publishes and resolves
//! transfer-engine segments through it, or through another key-value store behind
//! [`MetadataBackend`] (etcd, `crate::ha::etcd`) ([`client`]).
//!
//! Keys follow Mooncake's transfer metadata layout: `mooncake/[<cluster_id>/]ram/<segment>`
//! holds the segment descriptor JSON and `mooncake/[<cluster_id>/]rpc_meta/<segment>` the
//! owner's `{ip_or_host_name, rpc_port}`.

pub(crate) mod client;
pub(crate) mod store;
#[cfg(test)]
mod tests;

pub(crate) use client::{MetadataBackend, MetadataClient, MetadataResolver};
pub(crate) use store::{metadata_handler, MetadataStore};

use serde::{Deserialize, Serialize};

/// One registered buffer of a segment, as published (`buffers[i]` of the descriptor).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BufferEntry {
    /// Location name (Mooncake's `name`, e.g. `"cpu:0"` or `"*"`).
    pub name: String,
    /// Absolute virtual address in the owner process.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
}

/// What a segment owner publishes about its TCP transport: where its RPC and data ports are
/// and which buffers remote peers may address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SegmentDescriptor {
    /// Host name or IP address peers connect to (`ip_or_host_name` of `rpc_meta`).
    pub host: String,
    /// The owner's RPC port (`rpc_port` of `rpc_meta`).
    pub rpc_port: u16,
    /// The TCP transport's data port (`tcp_data_port` of the descriptor).
    pub tcp_data_port: u16,
    /// Remotely accessible buffers.
    pub buffers: Vec<BufferEntry>,
}

/// The `ram/<segment>` JSON document (Mooncake's TCP segment descriptor).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct RamEntry {
    name: String,
    protocol: String,
    tcp_data_port: u16,
    #[serde(default)]
    tcp_proto_version: u32,
    #[serde(default)]
    timestamp: String,
    #[serde(default)]
    buffers: Vec<BufferEntry>,
}

/// The `rpc_meta/<segment>` JSON document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct RpcMetaEntry {
    ip_or_host_name: String,
    rpc_port: u16,
}

/// The TCP protocol version we speak (status frames after writes, see the TCP transport).
const TCP_PROTO_VERSION: u32 = 2;
