//! A small HTTP/1.1 server and blocking client (no framework): enough for Mooncake's metadata
//! service and plain-text admin endpoints.
//!
//! Requests and responses carry a `Content-Length` body; chunked bodies are refused. Header
//! blocks are limited to [`MAX_HEAD_BYTES`], bodies to [`MAX_BODY_BYTES`].

mod client;
mod server;

pub use client::{http_delete, http_get, http_put, http_request, http_request_with, HttpReply};
pub use server::{HttpHandler, HttpServer};

/// Largest request line plus headers accepted (and response head read).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Largest body accepted or read.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// One parsed request, as handed to a handler. Plain value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpRequest {
    /// Method as sent, e.g. `"GET"`.
    pub method: String,
    /// Path without the query, still percent-encoded, e.g. `"/metadata"`.
    pub path: String,
    /// Raw query string after `?` (empty if none).
    pub query: String,
    /// Header names (as sent) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header_value(&self.headers, name)
    }

    /// The first value of query parameter `name`, percent-decoded (`+` is a space); `None`
    /// if absent or not valid UTF-8 after decoding.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key)? == name)
                .then(|| percent_decode(value))
                .flatten()
        })
    }
}

/// A handler's answer. Plain value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code, e.g. 200.
    pub status: u16,
    /// `Content-Type` header value.
    pub content_type: String,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// A response with the given content type.
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> HttpResponse {
        HttpResponse {
            status,
            content_type: content_type.to_owned(),
            body: body.into(),
        }
    }

    /// A `text/plain` response.
    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> HttpResponse {
        HttpResponse::new(status, "text/plain; charset=utf-8", body)
    }
}

/// The reason phrase of the status codes we send.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for one query value or
/// path segment).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes and `+` (space); `None` on a malformed escape or invalid UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut input = text.bytes();
    while let Some(byte) = input.next() {
        bytes.push(match byte {
            b'+' => b' ',
            b'%' => {
                let hex = [input.next()?, input.next()?];
                u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?
            }
            other => other,
        });
    }
    String::from_utf8(bytes).ok()
}

/// Splits one header line ("Name: value", without the line end).
fn parse_header_line(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once(':')?;
    let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic());
    valid.then(|| (name.to_owned(), value.trim().to_owned()))
}

fn header_value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

/// The `Content-Length` of a header list: `Ok(0)` if absent, `Err` if malformed.
fn content_length(headers: &[(String, String)]) -> std::result::Result<usize, ()> {
    header_value(headers, "content-length").map_or(Ok(0), |v| v.parse().map_err(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_round_trips() {
        let key = "mooncake/ram/host:1234 a+b&c=d/é";
        let encoded = percent_encode(key);
        assert!(encoded
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
        assert_eq!(percent_decode(&encoded).as_deref(), Some(key));
        assert_eq!(percent_decode("a+b%2f").as_deref(), Some("a b/"));
        for bad in ["%", "%4", "%zz", "%ff"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn query_parameters_and_headers_are_found() {
        let request = HttpRequest {
            query: "x=1&key=mooncake%2Fram%2Fa&flag".into(),
            headers: vec![("Content-Length".into(), "3".into())],
            ..HttpRequest::default()
        };
        assert_eq!(
            request.query_param("key").as_deref(),
            Some("mooncake/ram/a")
        );
        assert_eq!(request.query_param("flag").as_deref(), Some(""));
        assert_eq!(request.query_param("missing"), None);
        assert_eq!(request.header("content-length"), Some("3"));
        assert_eq!(content_length(&request.headers), Ok(3));
        assert_eq!(
            parse_header_line("Host: a:1 "),
            Some(("Host".into(), "a:1".into()))
        );
        assert_eq!(parse_header_line("no colon"), None);
        assert_eq!(parse_header_line("bad name: x"), None);
    }
}
