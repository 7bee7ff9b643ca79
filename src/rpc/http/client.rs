//! A minimal blocking HTTP/1.1 client: one request per connection (`Connection: close`),
//! `http://` and `https://host:port/path?query` URLs (HTTPS trusts the process's TLS
//! certificates, [`crate::auth::tls`]), bounded response size.

use super::{content_length, parse_header_line, MAX_BODY_BYTES, MAX_HEAD_BYTES};
use crate::auth::{self, KeyRing};
use crate::error::{fail, ErrorCode, Result};
use crate::rpc::codec::io_fail;
use crate::rpc::net::{Conn, Timeouts};
use std::io::{Read, Write};

/// A response: status and body. Plain value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// `GET url` with [`Timeouts::from_env`]. Errors as [`http_request`].
pub fn http_get(url: &str) -> Result<HttpReply> {
    http_request("GET", url, &[], Timeouts::from_env())
}

/// `PUT url` with `body`. Errors as [`http_request`].
pub fn http_put(url: &str, body: &[u8]) -> Result<HttpReply> {
    http_request("PUT", url, body, Timeouts::from_env())
}

/// `DELETE url`. Errors as [`http_request`].
pub fn http_delete(url: &str) -> Result<HttpReply> {
    http_request("DELETE", url, &[], Timeouts::from_env())
}

/// Sends one request and reads the whole response. Any status is `Ok`; the caller judges it.
///
/// Errors: `INVALID_PARAMS` for a URL that is not `http://authority/...` or
/// `https://authority/...`, or an `https://` one in a process that trusts no certificates
/// (its TLS error when they could not be loaded); `RPC_FAIL` when the
/// server cannot be reached or the response is malformed or larger than the limits;
/// `RPC_TIMEOUT` when a wait exceeds `timeouts`.
pub fn http_request(method: &str, url: &str, body: &[u8], timeouts: Timeouts) -> Result<HttpReply> {
    http_request_with(method, url, body, timeouts, None)
}

/// As [`http_request`]; with `door` = (key, role), the connection first proves the cluster
/// key to the server for `role` ([`auth::client_blocking`]).
///
/// Errors: as [`http_request`]; `AUTH_FAILED` when the handshake fails.
pub fn http_request_with(
    method: &str,
    url: &str,
    body: &[u8],
    timeouts: Timeouts,
    door: Option<(&KeyRing, &'static str)>,
) -> Result<HttpReply> {
    let (https, authority, target) = split_url(url)?;
    let host_port = match (authority.rsplit_once(':'), https) {
        (Some((_, port)), _) if !port.ends_with(']') => authority.to_owned(),
        (_, false) => format!("{authority}:80"),
        (_, true) => format!("{authority}:443"),
    };
    let tls = match https {
        false => None,
        true => match crate::auth::tls::process_client_config()? {
            Some(config) => Some(config),
            None => {
                let why = "needs trusted TLS certificates (MC_TLS_CA_FILE or --tls_ca_file)";
                return fail(ErrorCode::InvalidParams, format_args!("{url} {why}"));
            }
        },
    };
    let mut stream = Conn::open(&host_port, timeouts, tls.as_ref())?;
    if let Some((key, role)) = door {
        auth::client_blocking(&mut stream, key, role)?;
    }
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    if let Err(err) = stream.write_all(&request).and_then(|()| stream.flush()) {
        return io_fail(&format!("{method} {url}"), err);
    }
    let mut response = Vec::new();
    let limit = (MAX_HEAD_BYTES + MAX_BODY_BYTES + 1) as u64;
    if let Err(err) = stream.take(limit).read_to_end(&mut response) {
        return io_fail(&format!("{method} {url}"), err);
    }
    parse_response(&response)
        .or_else(|why| fail(ErrorCode::RpcFail, format_args!("{method} {url}: {why}")))
}

/// Splits `http[s]://authority/target` into whether it is HTTPS, the authority and the target
/// (at least "/").
fn split_url(url: &str) -> Result<(bool, &str, &str)> {
    let (https, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(rest), _) => (false, rest),
        (_, Some(rest)) => (true, rest),
        _ => {
            return fail(
                ErrorCode::InvalidParams,
                format_args!("not an http or https URL: {url}"),
            )
        }
    };
    let (authority, target) = match rest.find(['/', '?']) {
        Some(at) if rest[at..].starts_with('/') => (&rest[..at], &rest[at..]),
        Some(_) => return fail(ErrorCode::InvalidParams, format_args!("bad URL: {url}")),
        None => (rest, "/"),
    };
    if authority.is_empty() || target.bytes().any(|b| b.is_ascii_whitespace()) {
        return fail(ErrorCode::InvalidParams, format_args!("bad URL: {url}"));
    }
    Ok((https, authority, target))
}

/// Parses a complete response read until the server closed.
fn parse_response(raw: &[u8]) -> std::result::Result<HttpReply, &'static str> {
    let head_end = raw
        .windows(4)
        .take(MAX_HEAD_BYTES)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete response head")?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| "response head not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let status = match (parts.next(), parts.next()) {
        (Some(version), Some(code)) if version.starts_with("HTTP/1.") => code.parse().ok(),
        _ => None,
    }
    .ok_or("malformed status line")?;
    let headers = lines
        .map(parse_header_line)
        .collect::<Option<Vec<_>>>()
        .ok_or("malformed response header")?;
    let mut body = raw[head_end + 4..].to_vec();
    if body.len() > MAX_BODY_BYTES {
        return Err("response body too large");
    }
    if headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-length"))
    {
        let length = content_length(&headers).map_err(|()| "malformed Content-Length")?;
        if body.len() < length {
            return Err("response body shorter than Content-Length");
        }
        body.truncate(length);
    }
    Ok(HttpReply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::http::{HttpHandler, HttpRequest, HttpResponse, HttpServer};
    use std::net::SocketAddr;
    use std::sync::Arc;

    #[test]
    fn urls_are_split_or_refused() {
        assert_eq!(
            split_url("http://h:1/m?key=a").unwrap(),
            (false, "h:1", "/m?key=a")
        );
        assert_eq!(split_url("http://h:1").unwrap(), (false, "h:1", "/"));
        assert_eq!(split_url("https://h/").unwrap(), (true, "h", "/"));
        for bad in [
            "ftp://h/",
            "h:1/x",
            "http:///x",
            "http://h?x",
            "http://h/a b",
        ] {
            assert_eq!(
                split_url(bad).unwrap_err(),
                ErrorCode::InvalidParams,
                "{bad}"
            );
        }
    }

    #[test]
    fn responses_are_parsed_or_refused() {
        let ok = parse_response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nabcdef");
        assert_eq!(
            ok,
            Ok(HttpReply {
                status: 404,
                body: b"abc".to_vec()
            })
        );
        let no_length = parse_response(b"HTTP/1.0 200 OK\r\n\r\nrest");
        assert_eq!(no_length.unwrap().body, b"rest");
        for bad in [
            &b""[..],
            b"HTTP/1.1 200",
            b"SMTP 200 OK\r\n\r\n",
            b"HTTP/1.1 x OK\r\n\r\n",
        ] {
            assert!(parse_response(bad).is_err());
        }
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc").is_err());
    }

    #[test]
    fn talks_to_the_server() {
        let handler: HttpHandler = Arc::new(|request: &HttpRequest| {
            let text = format!(
                "{} {} {}",
                request.method,
                request.query,
                request.body.len()
            );
            HttpResponse::text(200, text)
        });
        let server = HttpServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), handler).unwrap();
        let url = format!("http://{}/x?q=1", server.local_addr());
        assert_eq!(http_get(&url).unwrap().body, b"GET q=1 0");
        assert_eq!(http_put(&url, b"abcd").unwrap().body, b"PUT q=1 4");
        assert_eq!(
            http_delete(&url).unwrap(),
            HttpReply {
                status: 200,
                body: b"DELETE q=1 0".to_vec()
            }
        );
        server.shutdown();
        assert_eq!(http_get(&url).unwrap_err(), ErrorCode::RpcFail);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes parse or are refused without a panic; a parsed body is never longer
            /// than what followed the head.
            #[test]
            fn responses_never_panic(raw in prop::collection::vec(any::<u8>(), 0..512)) {
                if let Ok(reply) = parse_response(&raw) {
                    prop_assert!(reply.body.len() <= raw.len());
                }
            }

            #[test]
            fn content_length_bounds_the_body(
                status in 100u16..600,
                body in prop::collection::vec(any::<u8>(), 0..64),
                extra in prop::collection::vec(any::<u8>(), 0..16),
            ) {
                let mut raw = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                raw.extend_from_slice(&body);
                raw.extend_from_slice(&extra);
                let reply = parse_response(&raw).unwrap();
                prop_assert_eq!(reply.status, status);
                prop_assert_eq!(reply.body, body);
            }

            #[test]
            fn urls_never_panic(url in "(http://)?\\PC{0,30}") {
                let _ = split_url(&url);
            }
        }
    }
}
