//! Control requests (ours) on the TCP data port, which move no registered bytes: for upstream's
//! `TransferEngine` API in P2P-handshake mode, where no metadata service stands between peers.
//!
//! - **Segment query** (`get_first_buffer_address`, `send_probe`): a 24-byte header whose
//!   opcode is [`SEGMENT_QUERY`] (size and address 0). Reply (little-endian): status frame (8),
//!   region count `u32`, then per region `base u64, len u64`, the remotely accessible
//!   registered ranges in address order.
//! - **Notification** (`TransferNotify`): a header whose opcode is [`NOTIFY`] and whose size is
//!   the payload's, then the payload: name length `u32`, name, message (the rest), at most
//!   [`MAX_NOTIFY_BYTES`]. Reply: a status frame; the server keeps the message in its
//!   [`Inbox`].
//!
//! A Mooncake C++ server does not know these opcodes and refuses them as unknown. With a
//! cluster key they come after the connection's proof, like every other request.

use super::wire::{Status, HEADER_LEN, STATUS_LEN, V2_FLAG};
use crate::auth::{self, KeyRing};
use crate::error::{fail, last_error_message, ErrorCode, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Opcode of a segment query.
pub(crate) const SEGMENT_QUERY: u8 = 0x03;
/// Opcode of a notification.
pub(crate) const NOTIFY: u8 = 0x04;
/// Most payload bytes of one notification.
pub(crate) const MAX_NOTIFY_BYTES: u64 = 1 << 20;
/// Most notifications an [`Inbox`] keeps; more are refused until the application takes them.
const INBOX_CAPACITY: usize = 4096;
/// Most bytes (names and messages) an [`Inbox`] keeps; more are refused likewise.
const INBOX_MAX_BYTES: usize = 64 << 20;
/// Bytes of one encoded range.
const RANGE_LEN: usize = 16;
/// Most ranges a reply may carry (a bound on what a peer can make us allocate).
const MAX_RANGES: u32 = 1 << 16;

/// Whether raw header bytes open a segment query (any flags).
pub(crate) fn is_segment_query(raw: &[u8; HEADER_LEN]) -> bool {
    raw[16] & !V2_FLAG == SEGMENT_QUERY
}

/// Whether raw header bytes open a notification (any flags).
pub(crate) fn is_notify(raw: &[u8; HEADER_LEN]) -> bool {
    raw[16] & !V2_FLAG == NOTIFY
}

/// A notification's header and payload.
fn encode_notify(name: &str, message: &str) -> Vec<u8> {
    let payload_len = 4 + name.len() + message.len();
    let mut out = Vec::with_capacity(HEADER_LEN + payload_len);
    out.extend_from_slice(&(payload_len as u64).to_le_bytes());
    out.extend_from_slice(&[0u8; 8]);
    out.push(NOTIFY | V2_FLAG);
    out.extend_from_slice(&[0u8; 7]);
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// A notification's `(name, message)` from its payload; `None` when malformed (a name length
/// past the payload, or text that is not UTF-8).
pub(crate) fn decode_notify(payload: &[u8]) -> Option<(String, String)> {
    let (len, rest) = payload.split_first_chunk::<4>()?;
    let name_len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
    if name_len > rest.len() {
        return None;
    }
    let (name, message) = rest.split_at(name_len);
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).ok();
    Some((text(name)?, text(message)?))
}

/// Notifications peers sent to this process, oldest first: at most [`INBOX_CAPACITY`] of
/// them and [`INBOX_MAX_BYTES`] in all; beyond, new ones are refused (their senders get an
/// error) until [`Inbox::take`] empties it. Thread-safe.
#[derive(Default)]
pub(crate) struct Inbox {
    kept: parking_lot::Mutex<(std::collections::VecDeque<(String, String)>, usize)>,
}

impl Inbox {
    /// Keeps `(name, message)`; `false` (nothing kept, a warning logged) when the inbox is
    /// full or the notification is larger than [`MAX_NOTIFY_BYTES`].
    pub(crate) fn push(&self, name: String, message: String) -> bool {
        let size = name.len() + message.len();
        let mut kept = self.kept.lock();
        let (messages, bytes) = &mut *kept;
        let fits = size as u64 + 4 <= MAX_NOTIFY_BYTES
            && messages.len() < INBOX_CAPACITY
            && *bytes + size <= INBOX_MAX_BYTES;
        if !fits {
            tracing::warn!(
                kept = messages.len(),
                bytes = *bytes,
                "notification refused: the inbox is full (take them with get_notifies) or it is too large"
            );
            return false;
        }
        *bytes += size;
        messages.push_back((name, message));
        true
    }

    /// Every notification kept, oldest first; the inbox is empty after.
    pub(crate) fn take(&self) -> Vec<(String, String)> {
        let mut kept = self.kept.lock();
        kept.1 = 0;
        kept.0.drain(..).collect()
    }
}

/// The reply to a query: OK and `ranges` (`(base, len)`, at most [`MAX_RANGES`] of them).
pub(crate) fn encode_reply(ranges: &[(u64, u64)]) -> Vec<u8> {
    let ranges = &ranges[..ranges.len().min(MAX_RANGES as usize)];
    let mut out = Vec::with_capacity(STATUS_LEN + 4 + ranges.len() * RANGE_LEN);
    out.extend_from_slice(&Status::Ok.encode());
    out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for (base, len) in ranges {
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
    out
}

/// Sends a query on `stream` and reads the reply: the peer's ranges.
///
/// Errors: the I/O failure, a refusal (a peer that does not know the query) or a malformed
/// reply, as text.
pub(crate) fn exchange<S: Read + Write>(
    stream: &mut S,
) -> std::result::Result<Vec<(u64, u64)>, String> {
    let mut header = [0u8; HEADER_LEN];
    header[16] = SEGMENT_QUERY | V2_FLAG;
    stream
        .write_all(&header)
        .map_err(|e| format!("sending the segment query: {e}"))?;
    let mut status = [0u8; STATUS_LEN];
    read(stream, &mut status)?;
    match Status::decode(&status) {
        Some(Status::Ok) => {}
        Some(other) => return Err(format!("the peer refused the segment query ({other:?})")),
        None => return Err("the peer's reply is not a status frame".into()),
    }
    let mut count = [0u8; 4];
    read(stream, &mut count)?;
    let count = u32::from_le_bytes(count);
    if count > MAX_RANGES {
        return Err(format!("the peer announced {count} ranges"));
    }
    let mut table = vec![0u8; count as usize * RANGE_LEN];
    read(stream, &mut table)?;
    let word = |bytes: &[u8]| u64::from_le_bytes(bytes.try_into().unwrap_or_default());
    Ok(table
        .chunks_exact(RANGE_LEN)
        .map(|entry| (word(&entry[..8]), word(&entry[8..])))
        .collect())
}

fn read<S: Read>(stream: &mut S, buf: &mut [u8]) -> std::result::Result<(), String> {
    stream
        .read_exact(buf)
        .map_err(|e| format!("reading the segment query reply: {e}"))
}

/// A connection of its own to the data server at `peer` (proving `key` first when given);
/// every socket operation is bounded by `timeout`.
///
/// Errors: `TRANSFER_FAIL` naming the peer and the failure; `AUTH_FAILED` when the peer
/// refused the key.
fn connect(peer: SocketAddr, key: Option<&KeyRing>, timeout: Duration) -> Result<TcpStream> {
    let failed = |why: String| {
        fail(
            ErrorCode::TransferFail,
            format!("connection to {peer}: {why}"),
        )
    };
    let mut stream = match TcpStream::connect_timeout(&peer, timeout) {
        Ok(stream) => stream,
        Err(e) => return failed(e.to_string()),
    };
    let timeouts = stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)));
    if let Err(e) = timeouts {
        return failed(e.to_string());
    }
    if let Some(key) = key {
        if auth::client_blocking(&mut stream, key, auth::ROLE_DATA).is_err() {
            return fail(
                ErrorCode::AuthFailed,
                format!("connection to {peer}: {}", last_error_message()),
            );
        }
    }
    Ok(stream)
}

/// Asks the data server at `peer` for its ranges. Errors as [`connect`], and `TRANSFER_FAIL`
/// for a refusal or a malformed reply.
pub(crate) fn query(
    peer: SocketAddr,
    key: Option<&KeyRing>,
    timeout: Duration,
) -> Result<Vec<(u64, u64)>> {
    let mut stream = connect(peer, key, timeout)?;
    exchange(&mut stream).or_else(|why| {
        fail(
            ErrorCode::TransferFail,
            format!("segment query to {peer}: {why}"),
        )
    })
}

/// Sends notification `(name, message)` to the data server at `peer` and waits for its
/// acknowledgement. Errors as [`connect`]; `INVALID_PARAMS` for a payload over
/// [`MAX_NOTIFY_BYTES`]; `TRANSFER_FAIL` when the peer refuses it.
pub(crate) fn notify(
    peer: SocketAddr,
    key: Option<&KeyRing>,
    timeout: Duration,
    name: &str,
    message: &str,
) -> Result<()> {
    if (4 + name.len() + message.len()) as u64 > MAX_NOTIFY_BYTES {
        return fail(
            ErrorCode::InvalidParams,
            format!("a notification of more than {MAX_NOTIFY_BYTES} bytes"),
        );
    }
    let mut stream = connect(peer, key, timeout)?;
    let sent = stream
        .write_all(&encode_notify(name, message))
        .map_err(|e| format!("sending: {e}"))
        .and_then(|()| {
            let mut status = [0u8; STATUS_LEN];
            read(&mut stream, &mut status)?;
            match Status::decode(&status) {
                Some(Status::Ok) => Ok(()),
                other => Err(format!("refused ({other:?})")),
            }
        });
    sent.or_else(|why| {
        fail(
            ErrorCode::TransferFail,
            format!("notification to {peer}: {why}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::test_support::CannedStream;

    #[test]
    fn a_reply_round_trips_and_the_request_is_a_bare_header() {
        let ranges = vec![(0x1000, 64), (0x7f00_0000_0000, 1 << 30)];
        let mut stream = CannedStream::new(encode_reply(&ranges));
        assert_eq!(exchange(&mut stream), Ok(ranges));
        assert_eq!(stream.sent.len(), HEADER_LEN);
        let raw: [u8; HEADER_LEN] = stream.sent[..].try_into().unwrap();
        assert!(is_segment_query(&raw));
        assert_eq!(&raw[..16], &[0u8; 16]);
    }

    #[test]
    fn refusals_short_and_oversized_replies_are_errors() {
        let mut refused = CannedStream::new(Status::AddrRejected.encode().to_vec());
        assert!(exchange(&mut refused).unwrap_err().contains("refused"));
        let mut short = encode_reply(&[(1, 2)]);
        short.truncate(short.len() - 1);
        assert!(exchange(&mut CannedStream::new(short)).is_err());
        let mut huge = Status::Ok.encode().to_vec();
        huge.extend_from_slice(&(MAX_RANGES + 1).to_le_bytes());
        assert!(exchange(&mut CannedStream::new(huge))
            .unwrap_err()
            .contains("announced"));
        assert!(exchange(&mut CannedStream::new(b"garbage!".to_vec())).is_err());
    }

    #[test]
    fn a_notification_round_trips_and_malformed_payloads_are_refused() {
        let encoded = encode_notify("prefill-3", "kv ready");
        let raw: [u8; HEADER_LEN] = encoded[..HEADER_LEN].try_into().unwrap();
        assert!(is_notify(&raw) && !is_segment_query(&raw));
        assert_eq!(
            u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize,
            encoded.len() - HEADER_LEN
        );
        assert_eq!(
            decode_notify(&encoded[HEADER_LEN..]),
            Some(("prefill-3".into(), "kv ready".into()))
        );
        assert_eq!(
            decode_notify(&[9, 0, 0, 0, b'a']),
            None,
            "name past the end"
        );
        assert_eq!(decode_notify(&[1, 0, 0, 0, 0xff]), None, "not UTF-8");
        assert_eq!(decode_notify(&[0, 0]), None, "short");
        let inbox = Inbox::default();
        for i in 0..INBOX_CAPACITY {
            assert!(inbox.push(i.to_string(), String::new()));
        }
        assert!(
            !inbox.push("one more".into(), String::new()),
            "full: refused"
        );
        let kept = inbox.take();
        assert_eq!(kept.len(), INBOX_CAPACITY);
        assert_eq!(kept[0].0, "0", "oldest first");
        assert!(inbox.push("after".into(), String::new()), "room again");
        let big = "x".repeat(MAX_NOTIFY_BYTES as usize / 2);
        let mut accepted = 0;
        while inbox.push(String::new(), big.clone()) {
            accepted += 1;
        }
        assert_eq!(
            accepted,
            INBOX_MAX_BYTES / big.len() - 1,
            "bounded in bytes"
        );
        assert!(!inbox.push(String::new(), "x".repeat(MAX_NOTIFY_BYTES as usize)));
    }
}
