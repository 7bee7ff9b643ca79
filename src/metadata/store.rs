//! The server side: an in-memory key-value map and the `/metadata` route over it.

use crate::rpc::http::{HttpHandler, HttpRequest, HttpResponse};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

/// Thread-safe in-memory map from key to value bytes. Values are copied in and out.
#[derive(Default)]
pub(crate) struct MetadataStore {
    entries: RwLock<HashMap<String, Vec<u8>>>,
}

impl MetadataStore {
    /// The value of `key`, if any.
    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.entries.read().get(key).cloned()
    }

    /// Sets `key` to `value`, replacing any previous value.
    pub(crate) fn put(&self, key: &str, value: Vec<u8>) {
        self.entries.write().insert(key.to_owned(), value);
    }

    /// Removes `key`; whether it existed.
    pub(crate) fn remove(&self, key: &str) -> bool {
        self.entries.write().remove(key).is_some()
    }

    /// Whether the store is empty (tests look inside).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.read().is_empty()
    }
}

/// The HTTP route of Mooncake's metadata server over `store`:
/// `GET /metadata?key=K` → 200 with the value (`application/json`) or 404;
/// `PUT /metadata?key=K` with a body → 200; `DELETE /metadata?key=K` → 200 or 404.
/// A missing `key` is 400, another method 405, another path 404.
pub(crate) fn metadata_handler(store: Arc<MetadataStore>) -> HttpHandler {
    Arc::new(move |request: &HttpRequest| handle(&store, request))
}

fn handle(store: &MetadataStore, request: &HttpRequest) -> HttpResponse {
    if request.path != "/metadata" {
        return HttpResponse::text(404, "not found");
    }
    let Some(key) = request.query_param("key").filter(|key| !key.is_empty()) else {
        return HttpResponse::text(400, "missing key");
    };
    match request.method.as_str() {
        "GET" => match store.get(&key) {
            Some(value) => HttpResponse::new(200, "application/json", value),
            None => HttpResponse::text(404, "metadata not found"),
        },
        "PUT" => {
            store.put(&key, request.body.clone());
            HttpResponse::text(200, "metadata updated")
        }
        "DELETE" => match store.remove(&key) {
            true => HttpResponse::text(200, "metadata deleted"),
            false => HttpResponse::text(404, "metadata not found"),
        },
        _ => HttpResponse::text(405, "method not allowed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::http::percent_encode;
    use crate::rpc::http::{http_delete, http_get, http_put, HttpServer};
    use std::net::SocketAddr;

    #[test]
    fn put_get_delete_over_http() {
        let store = Arc::new(MetadataStore::default());
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = HttpServer::start(addr, metadata_handler(Arc::clone(&store))).unwrap();
        let base = format!("http://{}/metadata", server.local_addr());
        let url = format!("{base}?key={}", percent_encode("mooncake/ram/h:1"));

        assert_eq!(http_get(&url).unwrap().status, 404);
        assert_eq!(http_put(&url, br#"{"a":1}"#).unwrap().status, 200);
        assert_eq!(
            store.get("mooncake/ram/h:1").as_deref(),
            Some(&br#"{"a":1}"#[..])
        );
        let got = http_get(&url).unwrap();
        assert_eq!((got.status, got.body), (200, br#"{"a":1}"#.to_vec()));
        assert_eq!(http_delete(&url).unwrap().status, 200);
        assert_eq!(http_delete(&url).unwrap().status, 404);
        assert!(store.is_empty());

        assert_eq!(http_get(&base).unwrap().status, 400);
        assert_eq!(http_get(&format!("{base}?key=")).unwrap().status, 400);
        let other = format!("http://{}/other?key=a", server.local_addr());
        assert_eq!(http_get(&other).unwrap().status, 404);
        let post =
            crate::rpc::http::http_request("POST", &url, b"", crate::rpc::Timeouts::default());
        assert_eq!(post.unwrap().status, 405);
    }
}
