//! The wire: framing and encoding of master RPCs, the tokio servers and the blocking clients.
//! No other module knows the byte layout of anything sent over a socket.
//!
//! - [`codec`]: `u32` LE length + bincode payload frames, with a size guard.
//! - [`interface`]: one list per RPC interface ([`Interface`], [`Call`]); the master's and
//!   the P2P owner's interfaces are declared with it.
//! - [`server::RpcServer`]: serves any [`Interface`] (an `Arc<dyn MasterApi>` by default); [`stats::RpcStats`] counts calls.
//! - [`client::RpcClient`]: the blocking [`Call`] transport of any interface;
//!   [`client::RpcMasterClient`] is the master's; [`client::connect_master`] gives a ready `Arc<dyn MasterApi>`.
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
pub mod stats;

#[cfg(test)]
mod tests;

pub use client::{connect_master, RemoteMasterApi, RpcClient, RpcMasterClient};
pub use http::{HttpHandler, HttpRequest, HttpResponse, HttpServer};
pub use interface::{Call, Interface};
pub use net::Timeouts;
pub use server::RpcServer;
pub use stats::RpcStats;
