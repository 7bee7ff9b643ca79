//! Shared memory between processes of one host: sealed memfd files ([`SealedMemfd`]), mappings
//! of a peer's file ([`PeerMapping`]) and passing file descriptors over a Unix socket
//! ([`send_with_fds`], [`recv_with_fds`]) only between processes of one user
//! ([`check_peer_user`]).
//!
//! The safety rule every user relies on: a mapping of another process's memory must never
//! raise SIGBUS, so every file shared here is sealed against shrinking (`F_SEAL_SHRINK`) before
//! it leaves its owner, and a receiver maps only a file that carries that seal and is at least
//! as long as the mapping ([`PeerMapping::map`] checks both). A hole punched in such a file
//! (which no seal but `F_SEAL_WRITE` prevents) can still fault where the kernel cannot refill
//! it: `fault_guard` turns that fault into lost pages the mapping's users check
//! ([`PeerMapping::lost_pages`]) and report as a failed copy.

mod fault_guard;
mod fdpass;
mod memfd;
mod peer;

pub(crate) use fdpass::{check_peer_user, recv_with_fds, send_with_fds};
pub(crate) use memfd::SealedMemfd;
pub(crate) use peer::PeerMapping;

#[cfg(test)]
mod tests;
