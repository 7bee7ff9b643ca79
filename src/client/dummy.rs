//! [`Client::setup_dummy`]: a client that owns no segment and reaches the pool through a real
//! client on the same host (`mooncake_client`), over shared memory (see `crate::standalone`
//! and `docs/standalone.md`).

use super::core::Client;
use crate::error::{fail, ErrorCode, Result};
use crate::master::MasterConfig;
use crate::node::SetupConfig;
use crate::standalone::{port_of, socket_name, DummyLink, LinkStats, ServerStats, ShmPool};
use crate::types::P2P_HANDSHAKE;
use std::sync::Arc;

impl Client {
    /// Attaches to the real client whose segment name is `server_address` (`host:port`; it
    /// serves the abstract socket `@mooncake_client_<port>.sock`), with a `local_buffer_size`
    /// local buffer of shared memory. `mem_pool_size` is accepted and unused (as upstream);
    /// callers allocate shared memory with [`ShmPool`] (`alloc_from_mem_pool`). Metadata
    /// calls go straight to the master the real client names in its handshake; every
    /// transfer is carried out by the real client, into and out of this process's shared
    /// memory (caller memory outside it is staged through a shared block).
    ///
    /// Errors: `INVALID_PARAMS` for a bad address, no real client there, or one that refuses
    /// (e.g. it runs an in-process master); then as [`Client::setup`].
    pub fn setup_dummy(
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
    ) -> Result<Client> {
        let _ = mem_pool_size;
        let port = port_of(server_address)?;
        let link = Arc::new(DummyLink::connect(&socket_name(port))?);
        let config = SetupConfig {
            local_hostname: "dummy".into(),
            metadata_server: P2P_HANDSHAKE.into(),
            global_segment_size: 0,
            local_buffer_size,
            master_server_addr: link.master_address().to_string(),
            ..SetupConfig::default()
        };
        Client::assemble(config, MasterConfig::default(), Some(link))
    }

    /// Whether this client is a dummy.
    pub fn is_dummy(&self) -> bool {
        self.core.dummy.is_some()
    }

    /// Whether `[addr, addr + len)` lies inside one block of this process's shared-memory pool
    /// ([`ShmPool`]: `alloc_from_mem_pool`, the allocator, a dummy's local buffer), i.e.
    /// memory a dummy's real client can map. Reads no memory. Thread-safe.
    pub fn in_shared_pool(addr: usize, len: u64) -> bool {
        ShmPool::global().find(addr, len).is_some()
    }

    /// A new shared-memory block of `size` bytes a dummy's real client can map (upstream's
    /// `alloc_from_mem_pool`); its address. Freed with [`ShmPool::free`].
    /// Errors: `INVALID_PARAMS` on a real client (upstream answers 0) or for size 0;
    /// `INTERNAL_ERROR` when the OS refuses.
    pub fn alloc_from_mem_pool(&self, size: u64) -> Result<usize> {
        if self.core.dummy.is_none() {
            return fail(
                ErrorCode::InvalidParams,
                "alloc_from_mem_pool: only a dummy client has a shared-memory pool",
            );
        }
        ShmPool::global().alloc(size, "mem pool").map(|b| b.addr())
    }

    /// A dummy's link counters (`None` on a real client).
    pub fn dummy_stats(&self) -> Option<LinkStats> {
        self.core.dummy.as_ref().map(|l| l.stats())
    }

    /// A dummy's view of its real client's counters. Errors: `INVALID_PARAMS` on a real
    /// client; `TRANSFER_FAIL` when the real client is unreachable.
    pub fn real_client_stats(&self) -> Result<ServerStats> {
        match &self.core.dummy {
            Some(link) => link.server_stats(),
            None => fail(ErrorCode::InvalidParams, "not a dummy client"),
        }
    }
}

impl Client {
    /// Serves dummies of this host, telling them to reach the master at `master_address`, on
    /// `@mooncake_client_<port>.sock` for `service_port` (upstream's real client service
    /// port, `mooncake_client --port`, which dummies name in `setup_dummy(…, "host:port")`;
    /// 0: none) and for the port of this client's segment name (so a dummy may also name the
    /// segment). The server runs until the returned value is dropped.
    ///
    /// Errors: `INVALID_PARAMS` on a dummy or a client without a data port, or when a socket
    /// name is taken (another real client of this host serves it; the message names it);
    /// `INTERNAL_ERROR` when the acceptor thread cannot start.
    pub fn serve_dummies(
        &self,
        master_address: &str,
        service_port: u16,
    ) -> Result<crate::standalone::DummyServer> {
        if self.is_dummy() {
            return fail(ErrorCode::InvalidParams, "a dummy cannot serve dummies");
        }
        let own = socket_name(port_of(&self.core.hostname)?);
        let service = socket_name(service_port);
        let names: &[&str] = match service_port {
            0 => &[&own],
            _ => &[&service, &own],
        };
        crate::standalone::DummyServer::start(
            names,
            Arc::clone(&self.core.engine),
            &self.core.hostname,
            master_address,
        )
    }
}
