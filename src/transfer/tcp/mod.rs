//! The TCP transport (Mooncake's TCP v2 framing): `wire` (headers and status frames),
//! `server` (serving peers' requests into registered memory), `pool` (outgoing connections,
//! pipelined slices), `control` (requests that move no registered bytes: the segment query and
//! notifications) and `socket` (socket options and vectored I/O shared by both ends).

pub(crate) mod control;
pub(crate) mod pool;
pub(crate) mod server;
mod socket;
pub mod wire;

#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod server_tests;
