//! The same-host channel: a client reads and writes a peer's segment through a mapping of the
//! peer's segment memfd instead of loopback TCP, when the peer proves over a Unix socket that
//! it is the owner of the mount the replica descriptor names (see `docs/same-host.md`).
//!
//! Modules, one job each: `handshake` (socket names and the two handshake messages),
//! `control` (the owner's shared epoch word), `export` (the owner side: the listener that
//! hands out the segment and control files), `peers` (the client side: the per-peer cache of
//! mappings and the mapped copy), `reaper` (the client's thread that drops mappings of owners
//! that hung up), `hangup` (noticing a closed connection without reading it), `locality`
//! (whether an endpoint's address is one of this host's).
//!
//! Authority stays with the owner: every mount of its segment is a fresh memfd (mapped over
//! the same addresses on the owner), so a peer's mapping of an earlier mount can only touch
//! pages nobody reads any more; and the owner's control word names the current epoch, which
//! a peer checks before and after each copy, so a copy overlapping a remount fails
//! `STALE_SEGMENT_EPOCH`.

mod control;
mod export;
mod handshake;
mod hangup;
mod locality;
mod peers;
mod reaper;

pub(crate) use export::Exporter;
pub(crate) use handshake::fuzz as fuzz_handshake;
pub(crate) use hangup::hung_up;
pub(crate) use peers::{copy_mapped, MappedPeer, MappedTarget, PeerMaps};

#[cfg(test)]
mod tests;
