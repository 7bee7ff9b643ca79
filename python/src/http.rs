//! The client HTTP server of `setup(..., enable_client_http_server=True, client_http_port=P)`
//! (spec §4.1): the library's [`ClientHttpServer`] (upstream's `/health`, `/metrics`,
//! `/metrics/summary` on `0.0.0.0:P`). A bind failure is a warning, as upstream.

use mooncake_rs::client::{Client, ClientHttpServer};

/// Starts serving `client` on `port`; `None` (and a warning) when it cannot.
pub fn start(port: u16, client: &Client) -> Option<ClientHttpServer> {
    match ClientHttpServer::start(client, port) {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::warn!(port, error = %e, detail = %mooncake_rs::error::last_error_message(), "client HTTP server not started");
            None
        }
    }
}
