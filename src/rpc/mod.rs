//! The generic wire: framing and encoding of RPCs, the tokio servers and the blocking clients,
//! and a small HTTP server and client. It knows no caller: the master (`master/remote.rs`) and
//! the P2P owner declare their interfaces with [`interface`] and serve them through
//! [`RpcServer`]. It imports neither `master` nor `transfer`.
//!
//! - [`codec`]: `u32` LE length + bincode payload frames, with a size guard.
//! - [`interface`]: one list per RPC interface ([`Interface`], [`Call`]); the master's and
//!   the P2P owner's interfaces are declared with it.
//! - [`server::RpcServer`]: serves any [`Interface`]; [`stats::RpcStats`] counts calls.
//! - [`client::RpcClient`]: the blocking [`Call`] transport of any interface.
//! - [`http`]: a small HTTP/1.1 server and blocking client.
//! - [`net`]: client timeouts (`MC_RPC_*`) and connecting.
//! - `serve`: the accept loop and private runtime both servers run on.

mod budget;
pub mod client;
pub mod codec;
pub mod http;
pub mod interface;
pub mod net;
mod serve;
pub mod server;
mod server_stream;
pub mod stats;

#[cfg(test)]
mod test_interface;

pub use client::{Resolve, RpcClient};
pub use http::{HttpHandler, HttpRequest, HttpResponse, HttpServer};
pub use interface::{Call, Interface};
pub use net::Timeouts;
pub use server::RpcServer;
pub use stats::RpcStats;
