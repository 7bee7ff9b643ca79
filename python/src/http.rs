//! The client HTTP server of `setup(..., enable_client_http_server=True, client_http_port=P)`
//! (spec §4.1): `GET /health`, `/metrics` (Prometheus text) and `/metrics/summary` (JSON) on
//! `0.0.0.0:P`. A bind failure is a warning, as upstream.

use mooncake_rs::client::Client;
use mooncake_rs::rpc::{HttpRequest, HttpResponse, HttpServer};
use std::net::SocketAddr;
use std::sync::Arc;

/// The running server; stops when dropped. It is owned next to its client and dropped when
/// the store is closed (after the client's teardown).
pub struct ClientHttpServer {
    _server: HttpServer,
}

impl ClientHttpServer {
    /// Starts serving `client` on `port`; `None` (and a warning) when the port cannot be bound.
    pub fn start(port: u16, client: &Client) -> Option<ClientHttpServer> {
        let client = client.clone();
        let handler = move |request: &HttpRequest| respond(request, &client);
        match HttpServer::start(SocketAddr::from(([0, 0, 0, 0], port)), Arc::new(handler)) {
            Ok(server) => Some(ClientHttpServer { _server: server }),
            Err(e) => {
                tracing::warn!(port, error = %e, "client HTTP server not started");
                None
            }
        }
    }
}

fn respond(request: &HttpRequest, client: &Client) -> HttpResponse {
    let metrics = serde_json::to_value(client.metrics()).unwrap_or_default();
    match request.path.as_str() {
        "/health" => match client.health_check() {
            0 => HttpResponse::text(200, "OK\n"),
            h => HttpResponse::text(503, format!("unhealthy ({h})\n")),
        },
        "/metrics" => HttpResponse::text(200, prometheus(&metrics)),
        "/metrics/summary" => HttpResponse::new(200, "application/json", metrics.to_string()),
        _ => HttpResponse::text(404, "not found\n"),
    }
}

/// Every numeric field of the metrics object (nested objects flattened with `_`) as a
/// Prometheus gauge `mooncake_client_<path>`.
fn prometheus(metrics: &serde_json::Value) -> String {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    walk(&format!("{prefix}_{k}"), v, out);
                }
            }
            serde_json::Value::Number(n) => out.push_str(&format!("{prefix} {n}\n")),
            serde_json::Value::Bool(b) => out.push_str(&format!("{prefix} {}\n", u8::from(*b))),
            _ => {}
        }
    }
    let mut out = String::new();
    walk("mooncake_client", metrics, &mut out);
    out
}
