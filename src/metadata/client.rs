//! The client side: publishing a segment's descriptors and resolving a segment name to the
//! address of its TCP data port, over Mooncake's HTTP metadata protocol.

use super::{RamEntry, RpcMetaEntry, SegmentDescriptor, TCP_PROTO_VERSION};
use crate::auth::{self, KeyRing};
use crate::env;
use crate::error::{fail, ErrorCode, Result};
use crate::rpc::http::{http_request_with, percent_encode};
use crate::rpc::net::Timeouts;
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the metadata documents live: a key-value store (the HTTP metadata service here, etcd
/// through `crate::ha`). Implementations are thread-safe; each call is one blocking request.
pub(crate) trait MetadataBackend: Send + Sync {
    /// The value of `key`, `None` if the store has none.
    ///
    /// Errors: the store's transport errors (`RPC_FAIL`, `RPC_TIMEOUT`, `AUTH_FAILED`,
    /// `ETCD_OPERATION_ERROR`).
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Stores `value` under `key`. Errors as `get`.
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Removes `key` (absent is fine). Errors as `get`.
    fn remove(&self, key: &str) -> Result<()>;
}

/// Mooncake's HTTP metadata service at a base URL such as `http://host:8080/metadata`, over
/// connections that first prove the cluster key when there is one.
struct HttpBackend {
    base_url: String,
    timeouts: Timeouts,
    cluster_key: Option<Arc<KeyRing>>,
}

impl MetadataBackend for HttpBackend {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let reply = self.send("GET", key, &[])?;
        match reply.status {
            200 => Ok(Some(reply.body)),
            404 => Ok(None),
            status => fail(
                ErrorCode::RpcFail,
                format_args!("GET {key}: status {status}"),
            ),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.expect_ok("PUT", key, value)
    }

    fn remove(&self, key: &str) -> Result<()> {
        self.expect_ok("DELETE", key, &[])
    }
}

impl HttpBackend {
    /// Sends a request that must answer 200 (or 404 for a `DELETE` of an absent key).
    fn expect_ok(&self, method: &str, key: &str, body: &[u8]) -> Result<()> {
        let status = self.send(method, key, body)?.status;
        if status == 200 || (method == "DELETE" && status == 404) {
            return Ok(());
        }
        fail(
            ErrorCode::RpcFail,
            format_args!("{method} {key}: status {status}"),
        )
    }

    fn send(&self, method: &str, key: &str, body: &[u8]) -> Result<crate::rpc::http::HttpReply> {
        let url = format!("{}?key={}", self.base_url, percent_encode(key));
        let door = self
            .cluster_key
            .as_deref()
            .map(|key| (key, auth::ROLE_METADATA));
        http_request_with(method, &url, body, self.timeouts, door)
    }
}

/// Publishes and reads segment documents under Mooncake's key layout in a
/// [`MetadataBackend`]. Stateless apart from its configuration; thread-safe.
pub(crate) struct MetadataClient {
    prefix: String,
    backend: Arc<dyn MetadataBackend>,
}

impl MetadataClient {
    /// A client of the HTTP metadata service at `base_url`, with keys prefixed by
    /// `MC_METADATA_CLUSTER_ID` when set and the `MC_RPC_*` timeouts.
    ///
    /// Errors: `INVALID_PARAMS` if `base_url` is not an `http://` or `https://` URL.
    pub(crate) fn new(base_url: &str) -> Result<MetadataClient> {
        let cluster_id = env::METADATA_CLUSTER_ID.get();
        MetadataClient::with_cluster_id(base_url, cluster_id.as_deref(), Timeouts::from_env())
    }

    /// As [`MetadataClient::new`], with an explicit cluster id (`None` or empty: none) and
    /// timeouts; the process's cluster key, if any ([`auth::process_key`]).
    ///
    /// Errors: as `new`; `AUTH_FAILED` when the process's key file cannot be loaded.
    pub(crate) fn with_cluster_id(
        base_url: &str,
        cluster_id: Option<&str>,
        timeouts: Timeouts,
    ) -> Result<MetadataClient> {
        MetadataClient::http(base_url, cluster_id, timeouts, auth::process_key()?)
    }

    /// An HTTP client proving `cluster_key` (or none). Errors as `new`.
    fn http(
        base_url: &str,
        cluster_id: Option<&str>,
        timeouts: Timeouts,
        cluster_key: Option<Arc<KeyRing>>,
    ) -> Result<MetadataClient> {
        let scheme = base_url.starts_with("http://") || base_url.starts_with("https://");
        if !scheme || base_url.contains('?') {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("bad metadata URL {base_url}"),
            );
        }
        let backend = HttpBackend {
            base_url: base_url.to_owned(),
            timeouts,
            cluster_key,
        };
        Ok(MetadataClient::on(Arc::new(backend), cluster_id))
    }

    /// A client of `backend`, with keys prefixed by `cluster_id` (`None` or empty: none).
    pub(crate) fn on(
        backend: Arc<dyn MetadataBackend>,
        cluster_id: Option<&str>,
    ) -> MetadataClient {
        let prefix = match cluster_id.map(|id| id.trim_matches('/')) {
            Some(id) if !id.is_empty() => format!("mooncake/{id}/"),
            _ => "mooncake/".to_owned(),
        };
        MetadataClient { prefix, backend }
    }

    /// A second client on the same backend and prefix.
    pub(crate) fn share(&self) -> MetadataClient {
        MetadataClient {
            prefix: self.prefix.clone(),
            backend: Arc::clone(&self.backend),
        }
    }

    /// An HTTP client proving `key` (or none) instead of the process's key.
    #[cfg(test)]
    pub(crate) fn keyed(base_url: &str, key: Option<Arc<KeyRing>>) -> Result<MetadataClient> {
        MetadataClient::http(base_url, None, Timeouts::default(), key)
    }

    /// The key of segment `name`'s descriptor (`mooncake/[cluster/]ram/<name>`).
    pub(crate) fn ram_key(&self, name: &str) -> String {
        format!("{}ram/{name}", self.prefix)
    }

    /// The key of segment `name`'s RPC endpoint (`mooncake/[cluster/]rpc_meta/<name>`).
    pub(crate) fn rpc_meta_key(&self, name: &str) -> String {
        format!("{}rpc_meta/{name}", self.prefix)
    }

    /// The value of `key`, `None` if the store has none. Errors: the backend's.
    pub(crate) fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.backend.get(key)
    }

    /// Stores `value` under `key`. Errors: the backend's.
    pub(crate) fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.backend.put(key, value)
    }

    /// Removes `key` (absent is fine). Errors: the backend's.
    pub(crate) fn remove(&self, key: &str) -> Result<()> {
        self.backend.remove(key)
    }

    /// Publishes segment `name`: its TCP descriptor under [`Self::ram_key`] and its RPC
    /// endpoint under [`Self::rpc_meta_key`]. Errors as [`MetadataClient::get`].
    pub(crate) fn publish_segment(&self, name: &str, segment: &SegmentDescriptor) -> Result<()> {
        let ram = RamEntry {
            name: name.to_owned(),
            protocol: "tcp".to_owned(),
            tcp_data_port: segment.tcp_data_port,
            tcp_proto_version: TCP_PROTO_VERSION,
            timestamp: timestamp(),
            buffers: segment.buffers.clone(),
        };
        let rpc_meta = RpcMetaEntry {
            ip_or_host_name: segment.host.clone(),
            rpc_port: segment.rpc_port,
        };
        self.put(&self.ram_key(name), &to_json(&ram)?)?;
        self.put(&self.rpc_meta_key(name), &to_json(&rpc_meta)?)
    }

    /// Removes both entries of segment `name`. Errors as [`MetadataClient::get`].
    pub(crate) fn remove_segment(&self, name: &str) -> Result<()> {
        self.remove(&self.ram_key(name))?;
        self.remove(&self.rpc_meta_key(name))
    }

    /// Reads and parses the JSON document at `key`.
    ///
    /// Errors: `SEGMENT_NOT_FOUND` if absent, `RPC_FAIL` if malformed, else as `get`.
    fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<T> {
        let Some(body) = self.get(key)? else {
            return fail(
                ErrorCode::SegmentNotFound,
                format_args!("no metadata at {key}"),
            );
        };
        serde_json::from_slice(&body)
            .or_else(|err| fail(ErrorCode::RpcFail, format_args!("metadata at {key}: {err}")))
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).or_else(|err| fail(ErrorCode::InternalError, err))
}

/// Publication time as `seconds.micros` since the Unix epoch (informational only).
fn timestamp() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:06}", now.as_secs(), now.subsec_micros())
}

/// Bounds of a [`MetadataResolver`]'s cache. Plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheLimits {
    /// Most cached segments (at least 1); caching another evicts the oldest answer.
    pub entries: usize,
    /// Age after which a cached address is looked up again.
    pub ttl: Duration,
}

impl CacheLimits {
    /// Reads `MC_METADATA_CACHE_ENTRIES` (default 4096) and `MC_METADATA_CACHE_TTL_MS`
    /// (default 60000). Values that are not positive integers fall back to the defaults,
    /// with a warning.
    pub(crate) fn from_env() -> CacheLimits {
        let entries = env::METADATA_CACHE_ENTRIES.get();
        CacheLimits {
            entries: usize::try_from(entries).unwrap_or(usize::MAX),
            ttl: Duration::from_millis(env::METADATA_CACHE_TTL_MS.get()),
        }
    }
}

/// A cached answer and when it was looked up.
struct Cached {
    addr: SocketAddr,
    at: Instant,
}

/// Resolves segment names to the socket address of their TCP data port (host from
/// `rpc_meta`, port from the descriptor), caching answers within [`CacheLimits`]: at most
/// `entries` segments (the oldest answer is evicted first), each for at most `ttl`.
/// Thread-safe. The transfer engine calls [`MetadataResolver::invalidate`] (through
/// [`SegmentResolver`](crate::transfer::SegmentResolver)) after a transfer to the segment
/// failed at the connection level, so the next resolve asks the metadata server again.
pub(crate) struct MetadataResolver {
    client: MetadataClient,
    limits: CacheLimits,
    cache: RwLock<HashMap<String, Cached>>,
}

impl MetadataResolver {
    /// A resolver asking through `client`, with the cache limits from the environment
    /// ([`CacheLimits::from_env`]).
    pub(crate) fn new(client: MetadataClient) -> MetadataResolver {
        MetadataResolver::with_cache_limits(client, CacheLimits::from_env())
    }

    /// A resolver asking through `client`, caching within `limits` (`entries` 0 counts as
    /// 1).
    pub(crate) fn with_cache_limits(
        client: MetadataClient,
        limits: CacheLimits,
    ) -> MetadataResolver {
        MetadataResolver {
            client,
            limits: CacheLimits {
                entries: limits.entries.max(1),
                ..limits
            },
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// Number of cached segments (at most the `entries` limit; tests look inside).
    #[cfg(test)]
    pub(crate) fn cached_len(&self) -> usize {
        self.cache.read().len()
    }

    /// The data address of `segment_name`: cached if looked up less than `ttl` ago, else
    /// asked of the metadata server (and cached).
    ///
    /// Errors: `SEGMENT_NOT_FOUND` if either entry is missing or the host does not resolve;
    /// `RPC_FAIL` / `RPC_TIMEOUT` if the metadata server fails or an entry is malformed.
    pub(crate) fn resolve(&self, segment_name: &str) -> Result<SocketAddr> {
        if let Some(cached) = self.cache.read().get(segment_name) {
            if cached.at.elapsed() < self.limits.ttl {
                return Ok(cached.addr);
            }
        }
        let addr = self.look_up(segment_name)?;
        self.remember(segment_name, addr);
        Ok(addr)
    }

    /// Forgets the cached address of `segment_name`.
    pub(crate) fn invalidate(&self, segment_name: &str) {
        self.cache.write().remove(segment_name);
    }

    /// Asks the metadata server for the data address of `segment_name`. Errors as
    /// [`MetadataResolver::resolve`].
    fn look_up(&self, segment_name: &str) -> Result<SocketAddr> {
        let meta: RpcMetaEntry = self
            .client
            .get_json(&self.client.rpc_meta_key(segment_name))?;
        let ram: RamEntry = self.client.get_json(&self.client.ram_key(segment_name))?;
        let resolved = (meta.ip_or_host_name.as_str(), ram.tcp_data_port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next());
        match resolved {
            Some(addr) => Ok(addr),
            None => fail(
                ErrorCode::SegmentNotFound,
                format_args!(
                    "{segment_name}: host {} does not resolve",
                    meta.ip_or_host_name
                ),
            ),
        }
    }

    /// Caches `addr` for `segment_name`, first evicting the oldest answer when the cache is
    /// full (a linear scan, only on a miss, which already cost two HTTP requests).
    fn remember(&self, segment_name: &str, addr: SocketAddr) {
        let mut cache = self.cache.write();
        if !cache.contains_key(segment_name) && cache.len() >= self.limits.entries {
            let oldest = cache
                .iter()
                .min_by_key(|(_, cached)| cached.at)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                cache.remove(&oldest);
            }
        }
        let at = Instant::now();
        cache.insert(segment_name.to_owned(), Cached { addr, at });
    }
}

impl crate::transfer::SegmentResolver for MetadataResolver {
    fn resolve(&self, segment_name: &str) -> Result<SocketAddr> {
        MetadataResolver::resolve(self, segment_name)
    }

    fn invalidate(&self, segment_name: &str) {
        MetadataResolver::invalidate(self, segment_name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{metadata_handler, BufferEntry, MetadataStore};
    use crate::rpc::http::HttpServer;
    use std::sync::Arc;

    fn server() -> (HttpServer, Arc<MetadataStore>, String) {
        let store = Arc::new(MetadataStore::default());
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = HttpServer::start(addr, metadata_handler(Arc::clone(&store))).unwrap();
        let url = format!("http://{}/metadata", server.local_addr());
        (server, store, url)
    }

    fn descriptor(port: u16) -> SegmentDescriptor {
        SegmentDescriptor {
            host: "127.0.0.1".into(),
            rpc_port: 15001,
            tcp_data_port: port,
            buffers: vec![BufferEntry {
                name: "cpu:0".into(),
                addr: 0x7f00_0000_0000,
                length: 1 << 20,
            }],
        }
    }

    #[test]
    fn publishes_mooncake_documents_under_the_cluster_prefix() {
        let (_server, store, url) = server();
        let client =
            MetadataClient::with_cluster_id(&url, Some("c1"), Timeouts::default()).unwrap();
        client
            .publish_segment("node:1", &descriptor(15002))
            .unwrap();

        let ram: serde_json::Value =
            serde_json::from_slice(&store.get("mooncake/c1/ram/node:1").unwrap()).unwrap();
        assert_eq!(ram["name"], "node:1");
        assert_eq!(ram["protocol"], "tcp");
        assert_eq!(ram["tcp_data_port"], 15002);
        assert_eq!(ram["tcp_proto_version"], 2);
        assert!(ram["timestamp"].is_string());
        assert_eq!(ram["buffers"][0]["addr"], 0x7f00_0000_0000u64);
        assert_eq!(ram["buffers"][0]["length"], 1 << 20);
        let meta: serde_json::Value =
            serde_json::from_slice(&store.get("mooncake/c1/rpc_meta/node:1").unwrap()).unwrap();
        assert_eq!(
            meta,
            serde_json::json!({"ip_or_host_name": "127.0.0.1", "rpc_port": 15001})
        );

        client.remove_segment("node:1").unwrap();
        client.remove_segment("node:1").unwrap();
        assert!(store.is_empty());
        let plain = MetadataClient::with_cluster_id(&url, None, Timeouts::default()).unwrap();
        assert_eq!(plain.ram_key("a"), "mooncake/ram/a");
        assert!(MetadataClient::new("ftp://x").is_err());
    }

    /// A keyed metadata service answers only clients that prove its key: one without a key,
    /// or with another, gets no answer (and writes nothing); plain HTTP gets the connection
    /// closed before a byte of its request is read.
    #[test]
    fn a_keyed_service_answers_only_clients_with_its_key() {
        use crate::auth::{self, test_ring};
        use std::io::{Read, Write};
        let store = Arc::new(MetadataStore::default());
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let handler = metadata_handler(Arc::clone(&store));
        let role = auth::ROLE_METADATA;
        let server = HttpServer::start_with(addr, handler, role, Some(test_ring(7)), None).unwrap();
        let url = format!("http://{}/metadata", server.local_addr());
        let client = |key| MetadataClient::keyed(&url, key).unwrap();
        let refused_before = auth::counters().refused_total();

        client(Some(test_ring(7)))
            .publish_segment("seg", &descriptor(16001))
            .unwrap();
        assert!(store.get("mooncake/ram/seg").is_some());
        let wrong = client(Some(test_ring(8)));
        assert_eq!(
            wrong.publish_segment("evil", &descriptor(1)).unwrap_err(),
            ErrorCode::AuthFailed
        );
        assert_eq!(
            wrong.get(&wrong.ram_key("seg")).unwrap_err(),
            ErrorCode::AuthFailed
        );
        let open = client(None);
        assert!(open.publish_segment("evil", &descriptor(1)).is_err());
        assert!(open.get(&open.ram_key("seg")).is_err());
        let mut raw = std::net::TcpStream::connect(server.local_addr()).unwrap();
        raw.write_all(b"DELETE /metadata?key=mooncake%2Fram%2Fseg HTTP/1.1\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        let _ = raw.read_to_end(&mut answer);
        assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
        // Behind the key a connection carries one request (keep-alive or not), so a key
        // retired later opens nothing more on it.
        let mut keyed = std::net::TcpStream::connect(server.local_addr()).unwrap();
        keyed
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        auth::client_blocking(&mut keyed, &test_ring(7), role).unwrap();
        let get =
            b"GET /metadata?key=mooncake%2Fram%2Fseg HTTP/1.1\r\nConnection: keep-alive\r\n\r\n";
        keyed.write_all(get).unwrap();
        let mut answer = Vec::new();
        keyed.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("Connection: close"), "{answer}");

        assert!(store.get("mooncake/ram/seg").is_some());
        assert!(store.get("mooncake/ram/evil").is_none());
        assert!(auth::counters().refused_total() >= refused_before + 4);
        let resolver = MetadataResolver::new(client(Some(test_ring(7))));
        assert_eq!(resolver.resolve("seg").unwrap().port(), 16001);
    }

    #[test]
    fn resolves_caches_and_invalidates() {
        let (_server, store, url) = server();
        let client = MetadataClient::with_cluster_id(&url, None, Timeouts::default()).unwrap();
        client.publish_segment("seg", &descriptor(16001)).unwrap();
        let resolver = MetadataResolver::new(
            MetadataClient::with_cluster_id(&url, None, Timeouts::default()).unwrap(),
        );
        let expected = SocketAddr::from(([127, 0, 0, 1], 16001));
        assert_eq!(resolver.resolve("seg").unwrap(), expected);

        // Cached: a republished port is not seen until invalidated.
        client.publish_segment("seg", &descriptor(16002)).unwrap();
        assert_eq!(resolver.resolve("seg").unwrap(), expected);
        resolver.invalidate("seg");
        assert_eq!(resolver.resolve("seg").unwrap().port(), 16002);

        assert_eq!(
            resolver.resolve("absent").unwrap_err(),
            ErrorCode::SegmentNotFound
        );
        store.put("mooncake/rpc_meta/junk", b"not json".to_vec());
        store.put("mooncake/ram/junk", b"{}".to_vec());
        assert_eq!(resolver.resolve("junk").unwrap_err(), ErrorCode::RpcFail);
    }

    /// The cache holds at most its cap (the oldest answers go first) and refreshes an
    /// answer older than its TTL.
    #[test]
    fn cache_is_bounded_and_refreshed() {
        let (_server, _store, url) = server();
        let client = MetadataClient::with_cluster_id(&url, None, Timeouts::default()).unwrap();
        for i in 0..10 {
            client
                .publish_segment(&format!("seg{i}"), &descriptor(17000 + i))
                .unwrap();
        }
        let limits = CacheLimits {
            entries: 3,
            ttl: Duration::from_secs(3600),
        };
        let resolver = MetadataResolver::with_cache_limits(
            MetadataClient::with_cluster_id(&url, None, Timeouts::default()).unwrap(),
            limits,
        );
        for i in 0..10 {
            assert_eq!(
                resolver.resolve(&format!("seg{i}")).unwrap().port(),
                17000 + i
            );
            assert!(
                resolver.cached_len() <= 3,
                "{} cached",
                resolver.cached_len()
            );
        }
        // seg7..seg9 are cached (a re-publication is not seen), seg6 was evicted.
        client.publish_segment("seg9", &descriptor(18009)).unwrap();
        client.publish_segment("seg6", &descriptor(18006)).unwrap();
        assert_eq!(resolver.resolve("seg9").unwrap().port(), 17009);
        assert_eq!(resolver.resolve("seg6").unwrap().port(), 18006);

        let fresh = MetadataResolver::with_cache_limits(
            MetadataClient::with_cluster_id(&url, None, Timeouts::default()).unwrap(),
            CacheLimits {
                entries: 3,
                ttl: Duration::from_millis(100),
            },
        );
        assert_eq!(fresh.resolve("seg0").unwrap().port(), 17000);
        client.publish_segment("seg0", &descriptor(18000)).unwrap();
        let start = std::time::Instant::now();
        while fresh.resolve("seg0").unwrap().port() != 18000 {
            assert!(start.elapsed() < Duration::from_secs(3), "never refreshed");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(start.elapsed() >= Duration::from_millis(50));
    }
}
