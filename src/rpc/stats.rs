//! Per-method counters of the RPC server, rendered in the Prometheus text format.
//!
//! [`RpcStats`] is shared (`Arc`) between the server's connection tasks and whoever exports
//! metrics; recording is lock-free after a method's first call (a read lock and atomic adds).

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds of the latency histogram buckets, in microseconds (`+Inf` is implicit).
const BUCKET_BOUNDS_US: [u64; 8] = [50, 100, 250, 1_000, 5_000, 25_000, 100_000, 1_000_000];

/// Counters of one method.
#[derive(Default)]
struct MethodStats {
    calls: AtomicU64,
    errors: AtomicU64,
    latency_sum_us: AtomicU64,
    /// Calls per bucket (not cumulative); the last slot is `+Inf`.
    buckets: [AtomicU64; BUCKET_BOUNDS_US.len() + 1],
}

/// Counters of an RPC server: per method, calls, calls answered with an error, and the
/// handling latency (decode to encoded answer); plus frames that could not be decoded.
#[derive(Default)]
pub struct RpcStats {
    methods: RwLock<BTreeMap<&'static str, Arc<MethodStats>>>,
    bad_requests: AtomicU64,
    refused_requests: AtomicU64,
    refused_connections: AtomicU64,
    timed_out_connections: AtomicU64,
}

impl RpcStats {
    /// Records one call of `method` that took `latency`; `failed` when the answer was an error.
    pub fn record(&self, method: &'static str, latency: Duration, failed: bool) {
        let stats = self.method(method);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        stats.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        stats.latency_sum_us.fetch_add(us, Ordering::Relaxed);
        let bucket = BUCKET_BOUNDS_US.iter().position(|&bound| us <= bound);
        stats.buckets[bucket.unwrap_or(BUCKET_BOUNDS_US.len())].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a request frame that could not be decoded.
    pub fn record_bad_request(&self) {
        self.bad_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a request refused for exceeding a limit.
    pub fn record_refused_request(&self) {
        self.refused_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a connection closed on accept because the server was at its connection cap.
    pub fn record_refused_connection(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a connection closed for idling or stalling inside a request.
    pub fn record_timed_out_connection(&self) {
        self.timed_out_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections closed on accept at the connection cap so far.
    pub fn refused_connections(&self) -> u64 {
        self.refused_connections.load(Ordering::Relaxed)
    }

    /// Connections closed by the idle or read timeout so far.
    pub fn timed_out_connections(&self) -> u64 {
        self.timed_out_connections.load(Ordering::Relaxed)
    }

    /// Request frames refused for exceeding a limit (answered `INVALID_PARAMS` when the
    /// method could be read, else the connection was closed) so far.
    pub fn refused_requests(&self) -> u64 {
        self.refused_requests.load(Ordering::Relaxed)
    }

    /// Calls of `method` so far.
    pub fn calls(&self, method: &str) -> u64 {
        self.read(method, |stats| stats.calls.load(Ordering::Relaxed))
    }

    /// Calls of `method` answered with an error so far.
    pub fn errors(&self, method: &str) -> u64 {
        self.read(method, |stats| stats.errors.load(Ordering::Relaxed))
    }

    /// Request frames that could not be decoded so far.
    pub fn bad_requests(&self) -> u64 {
        self.bad_requests.load(Ordering::Relaxed)
    }

    fn read(&self, method: &str, field: impl Fn(&MethodStats) -> u64) -> u64 {
        self.methods
            .read()
            .get(method)
            .map_or(0, |stats| field(stats))
    }

    fn method(&self, method: &'static str) -> Arc<MethodStats> {
        if let Some(stats) = self.methods.read().get(method) {
            return Arc::clone(stats);
        }
        Arc::clone(self.methods.write().entry(method).or_default())
    }

    /// The counters as Prometheus text: `mooncake_master_rpc_calls_total`,
    /// `mooncake_master_rpc_errors_total`, the histogram
    /// `mooncake_master_rpc_latency_seconds` (all labelled `method`) and
    /// `mooncake_master_rpc_{bad_requests,refused_requests,refused_connections,timed_out_connections}_total`.
    pub fn prometheus_text(&self) -> String {
        let methods = self.methods.read();
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, field: fn(&MethodStats) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (method, stats) in methods.iter() {
                let _ = writeln!(out, "{name}{{method=\"{method}\"}} {}", field(stats));
            }
        };
        counter(
            &mut out,
            "mooncake_master_rpc_calls_total",
            "Master RPC calls handled.",
            |s| s.calls.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mooncake_master_rpc_errors_total",
            "Master RPC calls answered with an error code.",
            |s| s.errors.load(Ordering::Relaxed),
        );
        let name = "mooncake_master_rpc_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time to handle a master RPC.\n# TYPE {name} histogram"
        );
        for (method, stats) in methods.iter() {
            let mut cumulative = 0;
            for (slot, count) in stats.buckets.iter().enumerate() {
                cumulative += count.load(Ordering::Relaxed);
                let le = BUCKET_BOUNDS_US
                    .get(slot)
                    .map_or("+Inf".to_owned(), |&us| format!("{}", us as f64 / 1e6));
                let _ = writeln!(
                    out,
                    "{name}_bucket{{method=\"{method}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let sum = stats.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{{method=\"{method}\"}} {sum}");
            let _ = writeln!(out, "{name}_count{{method=\"{method}\"}} {cumulative}");
        }
        for (name, help, value) in [
            (
                "bad_requests_total",
                "Request frames that could not be decoded.",
                self.bad_requests(),
            ),
            (
                "refused_requests_total",
                "Requests refused for exceeding a limit (items, scan queue).",
                self.refused_requests(),
            ),
            (
                "refused_connections_total",
                "Connections closed on accept at the connection cap.",
                self.refused_connections(),
            ),
            (
                "timed_out_connections_total",
                "Connections closed by the idle or read timeout.",
                self.timed_out_connections(),
            ),
        ] {
            let name = format!("mooncake_master_rpc_{name}");
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders_prometheus_text() {
        let stats = RpcStats::default();
        stats.record("ping", Duration::from_micros(30), false);
        stats.record("ping", Duration::from_micros(300), true);
        stats.record("unpin", Duration::from_secs(3), false);
        stats.record_bad_request();
        assert_eq!((stats.calls("ping"), stats.errors("ping")), (2, 1));
        assert_eq!((stats.calls("none"), stats.bad_requests()), (0, 1));

        let text = stats.prometheus_text();
        for line in [
            "mooncake_master_rpc_calls_total{method=\"ping\"} 2",
            "mooncake_master_rpc_errors_total{method=\"ping\"} 1",
            "mooncake_master_rpc_latency_seconds_bucket{method=\"ping\",le=\"0.00005\"} 1",
            "mooncake_master_rpc_latency_seconds_bucket{method=\"ping\",le=\"0.001\"} 2",
            "mooncake_master_rpc_latency_seconds_bucket{method=\"unpin\",le=\"1\"} 0",
            "mooncake_master_rpc_latency_seconds_bucket{method=\"unpin\",le=\"+Inf\"} 1",
            "mooncake_master_rpc_latency_seconds_sum{method=\"ping\"} 0.00033",
            "mooncake_master_rpc_latency_seconds_count{method=\"ping\"} 2",
            "mooncake_master_rpc_bad_requests_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }
}
