//! Standalone store + dummy clients on one host.
//!
//! A real client (`mooncake_client`) owns the segment and serves *dummies*: processes of the
//! same host that own no segment. A dummy's shared memory (its local buffer, its staging area
//! and every block of the process-wide [`ShmPool`]) is sealed memfd memory whose descriptors it
//! passes to the real client over an abstract Unix socket ([`socket_name`]). The dummy is an
//! ordinary [`crate::client::Client`] without a segment whose transfer engine hands every
//! transfer to its [`DummyLink`] ([`crate::transfer::TransferDelegate`]); the real client runs
//! it with its own engine straight into / out of its mapping of the dummy's memory
//! ([`DummyServer`]). Design and protocol: `docs/standalone.md`.
//!
//! Modules, one job each: `wire` (the frames), `pool` (the process-wide shared-memory
//! allocator), `conns` (a dummy's pool of connections), `link` (the dummy's side), `server`
//! (the real client's side).

mod conns;
mod link;
mod pool;
mod server;
mod wire;

pub use link::{DummyLink, LinkStats};
pub use pool::{BlockGuard, SharedBlock, ShmPool};
pub use server::{DummyServer, ServerStats};

/// The abstract Unix socket name (without the leading NUL) a real client whose segment name
/// ends in `:port` serves dummies on: `mooncake_client_<port>.sock`, as upstream.
pub fn socket_name(port: u16) -> String {
    format!("mooncake_client_{port}.sock")
}

/// How long a peer may stay silent before the other side gives it up:
/// `MC_DUMMY_TTL_MS` (default 10 000 ms, upstream's `DEFAULT_CLIENT_LIVE_TTL_SEC`; at least
/// 100 ms). The real client drops a dummy connection that sent nothing for this long; a
/// dummy pings its quiet connections every third of it and waits at most this long for any
/// answer.
pub fn ttl() -> std::time::Duration {
    std::time::Duration::from_millis(crate::env::DUMMY_TTL_MS.get())
}

/// The `port` of a `host:port` address; `INVALID_PARAMS` without one.
pub(crate) fn port_of(address: &str) -> crate::Result<u16> {
    match address
        .trim()
        .rsplit_once(':')
        .map(|(_, p)| p.parse::<u16>())
    {
        Some(Ok(port)) if port != 0 => Ok(port),
        _ => crate::error::fail(
            crate::ErrorCode::InvalidParams,
            format!("server address {address:?} is not host:port"),
        ),
    }
}

#[cfg(test)]
mod tests;

/// The fuzz crate's entry to the dummy protocol's decoders (see `wire::fuzz_frames`). Not an
/// API.
#[doc(hidden)]
pub fn fuzz_frames(data: &[u8]) {
    wire::fuzz_frames(data)
}
