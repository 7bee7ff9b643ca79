//! Upstream's client HTTP server (`mooncake_client --enable_http_server --http_port`, Python
//! `setup(..., enable_client_http_server=True, client_http_port=P)`), on port P of every
//! interface, with upstream's three routes:
//!
//! - `GET /health`: `{"status":"healthy","code":0}` with 200, else `not_initialized` (1) or
//!   `master_unreachable` (2) with 503 (the codes of `health_check`);
//! - `GET /metrics`: the client's counters (`Client::metrics`, the JSON of
//!   `mc_store_metrics_json`) as Prometheus text: every number and boolean, named
//!   `mooncake_client_` and its path (`location_cache.hits` →
//!   `mooncake_client_location_cache_hits`), then the process's cluster-key counters
//!   (`mooncake_auth_*`, as the master's);
//! - `GET /metrics/summary`: a few lines for people.
//!
//! Anything else is 404. Served on its own threads ([`HttpServer`]); the handlers only read
//! counters.

use super::metrics::ClientMetrics;
use super::{health, Client};
use crate::error::{fail, ErrorCode, Result};
use crate::rpc::{HttpRequest, HttpResponse, HttpServer};
use serde_json::Value;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;

/// A running client HTTP server; it holds a handle on its client and stops when dropped.
pub struct ClientHttpServer {
    _server: HttpServer,
}

impl ClientHttpServer {
    /// Serves `client`'s routes on `0.0.0.0:port` until dropped.
    ///
    /// Errors: `INVALID_PARAMS` for port 0; the listener's error when the port cannot be
    /// bound.
    pub fn start(client: &Client, port: u16) -> Result<ClientHttpServer> {
        if port == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "the client HTTP port must be 1..65535",
            );
        }
        let client = client.clone();
        let handler = move |request: &HttpRequest| respond(request, &client);
        let addr = SocketAddr::from(([0, 0, 0, 0], port));
        let server = HttpServer::start(addr, Arc::new(handler))?;
        Ok(ClientHttpServer { _server: server })
    }
}

/// The answer to `request`.
fn respond(request: &HttpRequest, client: &Client) -> HttpResponse {
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/health") => health_response(client.health_check()),
        ("GET", "/metrics") => HttpResponse::new(
            200,
            "text/plain; version=0.0.4",
            prometheus_text(&client.metrics()),
        ),
        ("GET", "/metrics/summary") => HttpResponse::text(200, summary(&client.metrics())),
        _ => HttpResponse::text(404, "not found\n"),
    }
}

/// `/health`'s answer for health code `code`.
fn health_response(code: i32) -> HttpResponse {
    let status = match code {
        health::HEALTHY => "healthy",
        health::NOT_INITIALIZED => "not_initialized",
        health::MASTER_UNREACHABLE => "master_unreachable",
        _ => "unknown",
    };
    let http = if code == health::HEALTHY { 200 } else { 503 };
    let body = format!("{{\"status\":\"{status}\",\"code\":{code}}}");
    HttpResponse::new(http, "application/json", body)
}

/// `metrics` in Prometheus' text format (untyped samples), then the process's cluster-key
/// handshake counters (its data port's, same-host and standalone sockets' refusals).
fn prometheus_text(metrics: &ClientMetrics) -> String {
    let mut text = String::new();
    match serde_json::to_value(metrics) {
        Ok(value) => flatten("mooncake_client", &value, &mut text),
        Err(e) => tracing::warn!("client metrics: {e}"),
    }
    text + &crate::auth::prometheus_text()
}

/// Appends a sample for each number and boolean under `value`, named `prefix` and its path.
fn flatten(prefix: &str, value: &Value, out: &mut String) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                flatten(&format!("{prefix}_{}", metric_name(name)), field, out);
            }
        }
        Value::Number(n) => {
            let _ = writeln!(out, "{prefix} {n}");
        }
        Value::Bool(b) => {
            let _ = writeln!(out, "{prefix} {}", u8::from(*b));
        }
        Value::Null | Value::String(_) | Value::Array(_) => {}
    }
}

/// `name` with every character Prometheus does not allow in a metric name made `_`.
fn metric_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `/metrics/summary`: the headline counters, one per line.
fn summary(m: &ClientMetrics) -> String {
    let cache = &m.location_cache;
    let mut text = format!(
        "objects written: {} ({} bytes)\nobjects read: {} ({} bytes)\nfailed operations: {}\n\
         master calls: {}\nlocation cache: {} entries, {} hits, {} misses\n",
        m.objects_written,
        m.bytes_written,
        m.objects_read,
        m.bytes_read,
        m.failed_ops,
        m.master_calls,
        cache.entries,
        cache.hits,
        cache.misses,
    );
    if let Some(ssd) = &m.ssd {
        let _ = writeln!(
            text,
            "ssd tier: {} objects, {} bytes, {} reads, {} corrupt, {} refused for space",
            ssd.objects, ssd.used_bytes, ssd.reads, ssd.corrupt, ssd.full
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_counters_become_prometheus_samples() {
        let value = serde_json::json!({
            "hits": 3,
            "location_cache": {"enabled": true, "misses": 2},
            "device_info": {"name": "none", "list": [1, 2]},
            "ssd": null,
            "odd-name": 1.5,
        });
        let mut text = String::new();
        flatten("mooncake_client", &value, &mut text);
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                "mooncake_client_hits 3",
                "mooncake_client_location_cache_enabled 1",
                "mooncake_client_location_cache_misses 2",
                "mooncake_client_odd_name 1.5",
            ]
        );
    }

    #[test]
    fn health_codes_map_to_upstreams_statuses() {
        let healthy = health_response(health::HEALTHY);
        assert_eq!(healthy.status, 200);
        assert_eq!(healthy.body, br#"{"status":"healthy","code":0}"#.to_vec());
        let down = health_response(health::MASTER_UNREACHABLE);
        assert_eq!(down.status, 503);
        assert_eq!(
            down.body,
            br#"{"status":"master_unreachable","code":2}"#.to_vec()
        );
        assert_eq!(health_response(health::NOT_INITIALIZED).status, 503);
    }
}
