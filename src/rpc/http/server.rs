//! The HTTP/1.1 server: parses requests, calls one synchronous handler, writes its answer.
//!
//! Connections are kept alive (HTTP/1.1) unless the client sends `Connection: close` or
//! speaks HTTP/1.0. Malformed requests get 400, oversized heads 431, oversized bodies 413,
//! chunked bodies 501; the connection is then closed. A connection idle for
//! [`IDLE_TIMEOUT`] while a request is incomplete is closed.

use super::{
    content_length, parse_header_line, reason_phrase, HttpRequest, HttpResponse, MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
};
use crate::auth::{self, KeyRing};
use crate::error::Result;
use crate::rpc::serve::Acceptor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};

/// The route handler: called on a server thread for each request; must not block for long
/// (it holds the connections of its thread meanwhile).
pub type HttpHandler = Arc<dyn Fn(&HttpRequest) -> HttpResponse + Send + Sync>;

/// Longest wait for the rest of a started request, or for the next request on a kept-alive
/// connection.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Most input discarded, and longest wait, when closing a connection.
const LINGER_BYTES: u64 = 1024 * 1024;
const LINGER_TIME: Duration = Duration::from_millis(500);

/// Threads serving connections.
const THREADS: usize = 2;

/// A running HTTP server. Thread-safe; `shutdown` is idempotent and also runs on drop.
pub struct HttpServer {
    acceptor: Acceptor,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and answers every request with `handler`.
    ///
    /// Errors: `RPC_FAIL` if the address cannot be bound.
    pub fn start(addr: SocketAddr, handler: HttpHandler) -> Result<HttpServer> {
        HttpServer::start_with(addr, handler, "http", None, None)
    }

    /// As [`HttpServer::start`], for the service `role`: with `tls`, each connection is HTTPS
    /// ([`auth::tls::accept`]); with `key`, each connection must then pass the cluster key's
    /// handshake for `role` ([`auth::server_async`]). A peer that fails either is closed
    /// before a byte of HTTP is read, and counted and logged by [`auth`].
    ///
    /// Errors: `RPC_FAIL` if the address cannot be bound.
    pub fn start_with(
        addr: SocketAddr,
        handler: HttpHandler,
        role: &'static str,
        key: Option<Arc<KeyRing>>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<HttpServer> {
        let acceptor = Acceptor::start("mc-http", addr, THREADS, move |tcp, peer| {
            let (handler, key, tls) = (Arc::clone(&handler), key.clone(), tls.clone());
            async move {
                let door = key.as_deref().map(|key| (key, role));
                match tls {
                    None => admit(tcp, peer, door, handler).await,
                    Some(config) => {
                        if let Some(session) = auth::tls::accept(tcp, &config, role, peer).await {
                            admit(session, peer, door, handler).await
                        }
                    }
                }
            }
        })?;
        Ok(HttpServer { acceptor })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.acceptor.local_addr()
    }

    /// Closes the listener and every connection.
    pub fn shutdown(&self) {
        self.acceptor.shutdown();
    }
}

/// What reading one request gave.
enum Incoming {
    /// A complete request, and whether the connection stays open after the answer.
    Request(HttpRequest, bool),
    /// The peer closed the connection between requests.
    Closed,
    /// A request we refuse; the connection is closed after this answer.
    Reject(HttpResponse),
}

/// Serves `stream` once its peer passed the key's handshake (when there is a `door`).
async fn admit<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    door: Option<(&KeyRing, &'static str)>,
    handler: HttpHandler,
) {
    if let Some((key, role)) = door {
        let admitted = auth::server_async(&mut stream, key, role, Some(peer.ip())).await;
        if admitted.is_err() {
            return;
        }
    }
    // Behind the key a connection carries one request, so a key retired later opens nothing
    // more (our clients send `Connection: close` anyway).
    serve_connection(stream, peer, handler, door.is_some()).await
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    peer: SocketAddr,
    handler: HttpHandler,
    one_request: bool,
) {
    let (reader, mut writer) = tokio::io::split(stream);
    let mut reader = BufReader::new(reader);
    loop {
        let (response, keep_alive) =
            match tokio::time::timeout(IDLE_TIMEOUT, read_request(&mut reader)).await {
                Ok(Ok(Incoming::Request(request, keep_alive))) => {
                    (handler(&request), keep_alive && !one_request)
                }
                Ok(Ok(Incoming::Reject(response))) => (response, false),
                Ok(Ok(Incoming::Closed)) | Err(_) => break,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, "HTTP connection: {err}");
                    break;
                }
            };
        let rendered = render(&response, keep_alive);
        let written = async {
            writer.write_all(&rendered).await?;
            writer.flush().await
        };
        if let Err(err) = written.await {
            tracing::debug!(%peer, "HTTP write: {err}");
            break;
        }
        if !keep_alive {
            linger(&mut reader, &mut writer).await;
            break;
        }
    }
}

/// Closes our side, then reads and discards what the client still sends for a moment, so
/// that closing with unread input does not reset the connection before the client has read
/// our answer.
async fn linger<R, W>(reader: &mut R, writer: &mut W)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let _ = writer.shutdown().await;
    let (mut rest, mut sink) = (reader.take(LINGER_BYTES), tokio::io::sink());
    let _ = tokio::time::timeout(LINGER_TIME, tokio::io::copy(&mut rest, &mut sink)).await;
}

async fn read_request<R: AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<Incoming> {
    let reject = |status: u16, why: &str| Ok(Incoming::Reject(HttpResponse::text(status, why)));
    let mut head = Vec::new();
    let mut lines = Vec::new();
    loop {
        let start = head.len();
        let limit = (MAX_HEAD_BYTES - start) as u64;
        if (&mut *reader)
            .take(limit)
            .read_until(b'\n', &mut head)
            .await?
            == 0
        {
            return match start {
                0 => Ok(Incoming::Closed),
                _ => reject(400, "incomplete request head"),
            };
        }
        if !head.ends_with(b"\n") {
            return reject(431, "request head too large");
        }
        let Ok(line) = std::str::from_utf8(&head[start..]) else {
            return reject(400, "request head is not UTF-8");
        };
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        lines.push(line.to_owned());
    }
    let Some((request_line, header_lines)) = lines.split_first() else {
        return reject(400, "empty request");
    };
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return reject(400, "malformed request line");
    };
    if method.is_empty() || !target.starts_with('/') || !version.starts_with("HTTP/1.") {
        return reject(400, "malformed request line");
    }
    let Some(headers) = header_lines
        .iter()
        .map(|line| parse_header_line(line))
        .collect::<Option<Vec<_>>>()
    else {
        return reject(400, "malformed header");
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut request = HttpRequest {
        method: method.to_owned(),
        path: path.to_owned(),
        query: query.to_owned(),
        headers,
        body: Vec::new(),
    };
    if request.header("transfer-encoding").is_some() {
        return reject(501, "only Content-Length bodies are supported");
    }
    let Ok(length) = content_length(&request.headers) else {
        return reject(400, "malformed Content-Length");
    };
    if length > MAX_BODY_BYTES {
        return reject(413, "body too large");
    }
    request.body.reserve_exact(length);
    if (&mut *reader)
        .take(length as u64)
        .read_to_end(&mut request.body)
        .await?
        < length
    {
        return reject(400, "incomplete body");
    }
    let close = request
        .header("connection")
        .is_some_and(|value| value.eq_ignore_ascii_case("close"));
    Ok(Incoming::Request(request, !close && version != "HTTP/1.0"))
}

fn render(response: &HttpResponse, keep_alive: bool) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        response.status,
        reason_phrase(response.status),
        response.content_type,
        response.body.len(),
        if keep_alive { "keep-alive" } else { "close" },
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(&response.body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn echo_server() -> HttpServer {
        let handler: HttpHandler = Arc::new(|request: &HttpRequest| match request.path.as_str() {
            "/echo" if request.method == "PUT" => {
                HttpResponse::new(200, "application/octet-stream", request.body.clone())
            }
            "/echo" => HttpResponse::text(405, "method not allowed"),
            "/query" => HttpResponse::text(200, request.query_param("key").unwrap_or_default()),
            _ => HttpResponse::text(404, "not found"),
        });
        HttpServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), handler).unwrap()
    }

    /// Sends raw bytes, returns everything the server sends until it closes.
    fn exchange(server: &HttpServer, raw: &[u8]) -> String {
        let mut stream = std::net::TcpStream::connect(server.local_addr()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(raw).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn routes_keep_alive_and_close() {
        let server = echo_server();
        let two = b"PUT /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
                    GET /query?key=a%2Fb HTTP/1.1\r\nConnection: close\r\n\r\n";
        let answer = exchange(&server, two);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(
            answer.contains("Connection: keep-alive\r\n\r\nhello"),
            "{answer}"
        );
        assert!(answer.ends_with("Connection: close\r\n\r\na/b"), "{answer}");
        let missing = exchange(&server, b"GET /nope HTTP/1.0\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404 Not Found"), "{missing}");
        let wrong = exchange(&server, b"DELETE /echo HTTP/1.0\r\n\r\n");
        assert!(
            wrong.starts_with("HTTP/1.1 405 Method Not Allowed"),
            "{wrong}"
        );
    }

    #[test]
    fn malformed_and_oversized_requests_are_refused() {
        let server = echo_server();
        let status = |raw: &[u8]| {
            exchange(&server, raw)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        };
        assert_eq!(status(b"GARBAGE\r\n\r\n"), "HTTP/1.1 400 Bad Request");
        assert_eq!(
            status(b"GET nopath HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 400 Bad Request"
        );
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nbad header\r\n\r\n"),
            "HTTP/1.1 400 Bad Request"
        );
        assert_eq!(
            status(b"PUT /echo HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            "HTTP/1.1 400 Bad Request"
        );
        assert_eq!(
            status(b"PUT /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort"),
            "HTTP/1.1 400 Bad Request"
        );
        let huge = format!(
            "PUT /echo HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        assert_eq!(status(huge.as_bytes()), "HTTP/1.1 413 Payload Too Large");
        let long_head = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(
            status(long_head.as_bytes()),
            "HTTP/1.1 431 Request Header Fields Too Large"
        );
        assert_eq!(
            status(b"PUT /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            "HTTP/1.1 501 Not Implemented"
        );
        assert_eq!(exchange(&server, b""), "");
        // Still serving after all that.
        assert_eq!(
            status(b"GET /query?key=x HTTP/1.0\r\n\r\n"),
            "HTTP/1.1 200 OK"
        );
        server.shutdown();
        server.shutdown();
        assert!(std::net::TcpStream::connect(server.local_addr()).is_err());
    }
}
