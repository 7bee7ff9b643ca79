//! The segment query (ours) over the TCP data port: a peer asks which ranges this process
//! serves, for upstream's `TransferEngine.get_first_buffer_address` in P2P-handshake mode
//! (where no metadata service holds the segment descriptor).
//!
//! Request: a 24-byte header whose opcode is [`SEGMENT_QUERY`] (size and address 0). Reply
//! (little-endian): status frame (8), region count `u32`, then per region `base u64, len u64`,
//! the remotely accessible registered ranges in address order. A Mooncake C++ server does not
//! know the opcode and refuses it as unknown. With a cluster key the query comes after the
//! connection's proof, like every other request.

use super::wire::{Status, HEADER_LEN, STATUS_LEN, V2_FLAG};
use crate::auth::{self, KeyRing};
use crate::error::{fail, last_error_message, ErrorCode, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Opcode of a segment query.
pub(crate) const SEGMENT_QUERY: u8 = 0x03;
/// Bytes of one encoded range.
const RANGE_LEN: usize = 16;
/// Most ranges a reply may carry (a bound on what a peer can make us allocate).
const MAX_RANGES: u32 = 1 << 16;

/// Whether raw header bytes open a segment query (any flags).
pub(crate) fn is_segment_query(raw: &[u8; HEADER_LEN]) -> bool {
    raw[16] & !V2_FLAG == SEGMENT_QUERY
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
    let word = |bytes: &[u8]| {
        let mut word = [0u8; 8];
        word.copy_from_slice(bytes);
        u64::from_le_bytes(word)
    };
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

/// Asks the data server at `peer` for its ranges on a connection of its own (proving `key`
/// first when given); every socket operation is bounded by `timeout`.
///
/// Errors: `TRANSFER_FAIL` naming the peer and the failure; `AUTH_FAILED` when the peer
/// refused the key.
pub(crate) fn query(
    peer: SocketAddr,
    key: Option<&KeyRing>,
    timeout: Duration,
) -> Result<Vec<(u64, u64)>> {
    let failed = |why: String| {
        fail(
            ErrorCode::TransferFail,
            format!("segment query to {peer}: {why}"),
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
                format!("segment query to {peer}: {}", last_error_message()),
            );
        }
    }
    exchange(&mut stream).or_else(failed)
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
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(&stream.sent);
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
}
