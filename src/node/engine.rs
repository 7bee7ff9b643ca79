//! Engine bootstrap of a process handle (a [`crate::client::Client`] or a P2P client): the
//! data listener on `local_hostname` (a given port, or a free one in the configured range),
//! the segment resolver of the metadata mode, the RDMA devices, and what the handle publishes
//! to an HTTP metadata service.
//!
//! Thread-safety: free functions; the engine they return is `Send + Sync`.

use super::config::{MetadataMode, SetupConfig};
use crate::env;
use crate::error::{fail, ErrorCode, Result};
use crate::metadata::{BufferEntry, MetadataClient, MetadataResolver, SegmentDescriptor};
use crate::standalone::DummyLink;
use crate::transfer::rdma::RdmaDevices;
use crate::transfer::{DirectResolver, EngineConfig, SegmentResolver, TransferEngine};
use crate::types::Segment;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;

/// A started engine: the handle's final segment name (`host:port` once a port was chosen),
/// the engine, and the HTTP metadata client when the metadata mode has one.
pub(crate) type StartedEngine = (String, Arc<TransferEngine>, Option<MetadataClient>);

/// Starts the transfer engine of a client set up with `config`: in embedded mode without a
/// listener; otherwise on the data port of `local_hostname` (see [`bind_endpoint`]), with the
/// segment resolver (and HTTP metadata client) of `metadata_mode`. Returns the final segment
/// name, the engine and the metadata client. Shared by `Client::setup` and the P2P client.
///
/// Errors: `INTERNAL_ERROR` when no port could be bound; `INVALID_PARAMS` for an unresolvable
/// host; `TRANSFER_FAIL` when the engine cannot start, or for `protocol = "rdma"` when
/// libibverbs, the device or its port is missing (the message names which); HTTP metadata
/// client errors.
pub(crate) fn start_engine(
    config: &SetupConfig,
    metadata_mode: &MetadataMode,
) -> Result<StartedEngine> {
    let (hostname, listener) = if config.is_embedded() {
        (config.local_hostname.trim().to_string(), None)
    } else {
        let (name, listener) = bind_endpoint(config.local_hostname.trim())?;
        (name, Some(listener))
    };
    let (resolver, metadata): (Arc<dyn SegmentResolver>, _) = match metadata_mode {
        MetadataMode::P2pHandshake => (Arc::new(DirectResolver), None),
        MetadataMode::Http(url) => (
            Arc::new(MetadataResolver::new(MetadataClient::new(url)?)),
            Some(MetadataClient::new(url)?),
        ),
    };
    let rdma = match config.uses_rdma() {
        true => Some(RdmaDevices::open(&config.device_name)?),
        false => None,
    };
    let engine = TransferEngine::new(EngineConfig {
        local_name: hostname.clone(),
        listener,
        resolver,
        memcpy_enabled: env::STORE_MEMCPY.flag(),
        rdma,
    })?;
    Ok((hostname, engine, metadata))
}

/// A dummy's engine: no listener, segment name `""`, every transfer handed to `link`.
pub(crate) fn start_dummy_engine(link: &Arc<DummyLink>) -> Result<StartedEngine> {
    let engine = TransferEngine::new(EngineConfig {
        local_name: String::new(),
        listener: None,
        resolver: Arc::new(DirectResolver),
        memcpy_enabled: false,
        rdma: None,
    })?;
    engine.set_delegate(Arc::clone(link) as Arc<dyn crate::transfer::TransferDelegate>)?;
    Ok((String::new(), engine, None))
}

/// What this client publishes to an HTTP metadata service: its host, data port and segment.
fn descriptor(hostname: &str, addr: SocketAddr, segment: Option<&Segment>) -> SegmentDescriptor {
    let host = hostname
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(hostname);
    SegmentDescriptor {
        host: host.to_string(),
        rpc_port: addr.port(),
        tcp_data_port: addr.port(),
        buffers: segment
            .map(|s| BufferEntry {
                name: "*".into(),
                addr: s.base,
                length: s.size,
            })
            .into_iter()
            .collect(),
    }
}

/// Binds the data listener for `local_hostname`: its own port when it has one, else a free
/// port in `[MC_STORE_CLIENT_MIN_PORT, MC_STORE_CLIENT_MAX_PORT]` (random start, up to
/// `MC_STORE_CLIENT_SETUP_RETRIES` tries). Returns the final `host:port` name.
fn bind_endpoint(local_hostname: &str) -> Result<(String, TcpListener)> {
    if let Some((host, port)) = local_hostname.rsplit_once(':') {
        if let Ok(port) = port.parse::<u16>() {
            let listener = bind(host, port)?;
            return Ok((local_hostname.to_string(), listener));
        }
    }
    let min = env::STORE_CLIENT_MIN_PORT.get() as u16;
    let max = env::STORE_CLIENT_MAX_PORT.get().max(min as u64) as u16;
    let retries = env::STORE_CLIENT_SETUP_RETRIES.get();
    for _ in 0..retries {
        let port = fastrand::u16(min..=max);
        if let Ok(listener) = bind(local_hostname, port) {
            return Ok((format!("{local_hostname}:{port}"), listener));
        }
    }
    fail(
        ErrorCode::InternalError,
        format!("no free port for {local_hostname} in [{min}, {max}] after {retries} tries"),
    )
}

fn bind(host: &str, port: u16) -> Result<TcpListener> {
    let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            return fail(
                ErrorCode::InvalidParams,
                format!("cannot resolve '{host}': {e}"),
            )
        }
    };
    let mut last = None;
    for addr in addrs
        .iter()
        .filter(|a| a.is_ipv4())
        .chain(addrs.iter().filter(|a| a.is_ipv6()))
    {
        match TcpListener::bind(addr) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    fail(
        ErrorCode::InternalError,
        format!(
            "cannot bind {host}:{port}: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        ),
    )
}

/// Publishes this handle's endpoint (its data port and, when it has one, `segment`) to the
/// HTTP metadata service under `hostname`; nothing without a metadata client or a listener.
///
/// Errors: the metadata client's (`RPC_FAIL` and friends when the service cannot be reached).
pub(crate) fn publish_endpoint(
    metadata: Option<&MetadataClient>,
    hostname: &str,
    engine: &TransferEngine,
    segment: Option<&Segment>,
) -> Result<()> {
    match (metadata, engine.listen_addr()) {
        (Some(meta), Some(addr)) => {
            meta.publish_segment(hostname, &descriptor(hostname, addr, segment))
        }
        _ => Ok(()),
    }
}
