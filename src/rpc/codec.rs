//! Framing and encoding of RPC messages.
//!
//! A frame is a `u32` little-endian payload length followed by the payload; the payload is the
//! bincode encoding (varint integers, little endian, no trailing bytes) of one message. Frames
//! longer than [`MAX_FRAME_LEN`] are refused on both sides, and a reader never allocates more
//! than it has actually received plus [`READ_CHUNK`], so a peer announcing a huge frame cannot
//! make us reserve memory it never sends.
//!
//! Every failure is `RPC_FAIL`, except a socket wait that ran past its timeout (`RPC_TIMEOUT`).
//! Nothing here panics on peer data. All functions are free functions over caller-owned
//! readers and writers; they hold no state.

use super::budget::{Budget, Seed};
use crate::error::{fail, ErrorCode, Result};
use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{self, Read};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest payload accepted or produced (64 MiB).
pub const MAX_FRAME_LEN: usize = 64 * 1024 * 1024;

/// Size of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Payloads up to this size are read into a buffer allocated at once; longer ones grow as
/// bytes arrive.
const READ_CHUNK: usize = 64 * 1024;

/// The one encoding both ends use. No bincode size limit: decoding reads from a payload
/// already bounded by [`MAX_FRAME_LEN`], and encoding checks the length afterwards (a limit
/// would make bincode measure every message in an extra pass).
fn options() -> impl Options + Copy {
    bincode::DefaultOptions::new()
}

/// Encodes `message` as one complete frame (header and payload), ready for a single write.
///
/// Errors: `RPC_FAIL` if the message cannot be encoded or exceeds [`MAX_FRAME_LEN`].
pub fn encode_frame<T: Serialize>(message: &T) -> Result<Vec<u8>> {
    let mut frame = vec![0u8; HEADER_LEN];
    if let Err(err) = options().serialize_into(&mut frame, message) {
        return fail(ErrorCode::RpcFail, format_args!("encode: {err}"));
    }
    let len = frame.len() - HEADER_LEN;
    let header = match u32::try_from(len) {
        Ok(header) if len <= MAX_FRAME_LEN => header,
        _ => return fail(ErrorCode::RpcFail, format_args!("encode: {len} byte frame")),
    };
    frame[..HEADER_LEN].copy_from_slice(&header.to_le_bytes());
    Ok(frame)
}

/// Why [`decode_bounded`] refused a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Malformed or trailing bytes.
    Malformed,
    /// More than the allowed elements and fields (see [`decode_bounded`]).
    OverLimit,
}

/// Decodes one payload as a `T`, as [`decode_payload`], but stops with
/// [`DecodeError::OverLimit`] before decoding the `max_items + 1`-th item (an element of a
/// sequence or map, or a field of a struct, tuple or variant): whatever a peer declares, the
/// decoded message holds at most the payload's bytes plus `max_items` elements.
pub fn decode_bounded<T: DeserializeOwned>(
    payload: &[u8],
    max_items: usize,
) -> std::result::Result<T, DecodeError> {
    let budget = Budget::new(max_items);
    let seed = Seed {
        inner: std::marker::PhantomData::<T>,
        budget: &budget,
    };
    match options().deserialize_seed(seed, payload) {
        Ok(message) => Ok(message),
        Err(_) if budget.exceeded() => Err(DecodeError::OverLimit),
        Err(_) => Err(DecodeError::Malformed),
    }
}

/// The frame answering `code` to the request in `payload`, for an interface whose requests
/// and responses are enums with the same variants in the same order and whose every response
/// variant holds a `Result<_, ErrorCode>` (every [`crate::rpc::Interface`]). Reads only the
/// request's variant index. `None` when that index cannot be read or names no response `R`.
pub fn error_frame<R: DeserializeOwned>(payload: &[u8], code: ErrorCode) -> Option<Vec<u8>> {
    let (variant,) = options()
        .allow_trailing_bytes()
        .deserialize::<(u32,)>(payload)
        .ok()?;
    // bincode writes `R::variant(Err(code))` as the variant index, the `Err` tag 1, the code.
    let frame = encode_frame(&(variant, 1u32, code)).ok()?;
    decode_payload::<R>(&frame[HEADER_LEN..]).ok()?;
    Some(frame)
}

/// Decodes one payload (without its header) as a `T`; the whole payload must be consumed.
///
/// Errors: `RPC_FAIL` on malformed or trailing bytes.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T> {
    options()
        .deserialize(payload)
        .or_else(|err| fail(ErrorCode::RpcFail, format_args!("decode: {err}")))
}

/// For the payload of an enum whose variants each hold a `Result<_, ErrorCode>` (every
/// `Response` an [`rpc_interface!`](crate::rpc::interface) declares): the error when that `Result` is `Err`, else `None`.
/// Reads only the first bytes, without decoding the answer (bincode writes a variant index,
/// then the `Result` tag, 0 = `Ok`, 1 = `Err`, then the content).
pub fn enum_result_error(payload: &[u8]) -> Option<ErrorCode> {
    let prefix = options().allow_trailing_bytes();
    match prefix.deserialize::<(u32, u32)>(payload) {
        Ok((_, 1)) => prefix
            .deserialize::<(u32, u32, ErrorCode)>(payload)
            .ok()
            .map(|(_, _, code)| code),
        _ => None,
    }
}

/// Validates a frame header against `max` bytes and returns the payload length.
fn payload_len(header: [u8; HEADER_LEN], max: usize) -> Result<usize> {
    let len = u32::from_le_bytes(header) as usize;
    if len > max {
        return fail(
            ErrorCode::RpcFail,
            format_args!("frame of {len} bytes exceeds the {max} byte limit"),
        );
    }
    Ok(len)
}

/// Maps a socket error to Mooncake's code: a timed-out wait is `RPC_TIMEOUT`, anything else
/// `RPC_FAIL`. Records `context` and the error as the thread's detail.
pub fn io_fail<T>(context: &str, err: io::Error) -> Result<T> {
    let code = match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ErrorCode::RpcTimeout,
        _ => ErrorCode::RpcFail,
    };
    fail(code, format_args!("{context}: {err}"))
}

/// Reads one frame's payload from a blocking reader.
///
/// Errors: see [`io_fail`]; end of stream is `RPC_FAIL`; an oversized header is `RPC_FAIL`.
pub fn read_frame<R: Read>(reader: &mut R) -> Result<Vec<u8>> {
    let mut header = [0u8; HEADER_LEN];
    if let Err(err) = reader.read_exact(&mut header) {
        return io_fail("read frame header", err);
    }
    let len = payload_len(header, MAX_FRAME_LEN)?;
    read_rest(reader, Vec::with_capacity(len.min(READ_CHUNK)), len)
}

/// Bytes [`read_answer`] asks for in its first read: an answer up to this long (header
/// included) that is already whole in the socket arrives with that one call.
const ANSWER_FIRST_READ: usize = 4096;

/// Reads the payload of the one frame a request/response server sends after a request (the
/// RPC client's answers). The first read asks for up to [`ANSWER_FIRST_READ`] bytes, so a
/// small answer costs one receive call where [`read_frame`] makes two (header, then
/// payload). Only for a peer that sends nothing unasked: bytes after the frame in that first
/// read are refused.
///
/// Errors: as [`read_frame`]; `RPC_FAIL` when bytes follow the frame.
pub fn read_answer<R: Read>(reader: &mut R) -> Result<Vec<u8>> {
    let mut first = [0u8; ANSWER_FIRST_READ];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match reader.read(&mut first[filled..]) {
            Ok(0) => return io_fail("read frame header", io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return io_fail("read frame header", err),
        }
    }
    let (header, early) = first[..filled].split_at(HEADER_LEN);
    let Ok(header) = <[u8; HEADER_LEN]>::try_from(header) else {
        return fail(ErrorCode::InternalError, "frame header split");
    };
    let len = payload_len(header, MAX_FRAME_LEN)?;
    if early.len() > len {
        return fail(
            ErrorCode::RpcFail,
            format_args!(
                "{} unasked bytes after a {len} byte answer",
                early.len() - len
            ),
        );
    }
    let mut payload = Vec::with_capacity(len.min(READ_CHUNK).max(early.len()));
    payload.extend_from_slice(early);
    read_rest(reader, payload, len).inspect_err(|_| {
        if is_tls_alert(&first[..filled]) {
            crate::error::set_last_error_message(
                "the server answered with a TLS alert: it takes TLS only (trust its certificate: --tls_ca_file / MC_TLS_CA_FILE)",
            );
        }
    })
}

/// Whether `bytes` are exactly one TLS alert record (what a TLS server sends a client that
/// spoke plain TCP, before it closes).
fn is_tls_alert(bytes: &[u8]) -> bool {
    match bytes {
        [0x15, 0x03, minor, high, low, body @ ..] => {
            *minor <= 0x04 && usize::from(u16::from_be_bytes([*high, *low])) == body.len()
        }
        _ => false,
    }
}

/// Completes a `len`-byte payload of which `payload` holds the first bytes, from `reader`.
fn read_rest<R: Read>(reader: &mut R, mut payload: Vec<u8>, len: usize) -> Result<Vec<u8>> {
    let missing = len.saturating_sub(payload.len());
    match reader.take(missing as u64).read_to_end(&mut payload) {
        Ok(n) if n == missing => Ok(payload),
        Ok(_) => fail(
            ErrorCode::RpcFail,
            format_args!(
                "connection closed after {} of {len} payload bytes",
                payload.len()
            ),
        ),
        Err(err) => io_fail("read frame payload", err),
    }
}

/// Reads one frame's payload from an async reader; `Ok(None)` when the peer closed the stream
/// cleanly before the first header byte.
///
/// Errors: `RPC_FAIL` on I/O errors, a stream cut inside a frame, or an oversized header.
pub async fn read_frame_async<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Vec<u8>>> {
    read_frame_limited(reader, MAX_FRAME_LEN).await
}

/// As [`read_frame_async`], refusing payloads longer than `max` bytes (at most
/// [`MAX_FRAME_LEN`]) before reading them.
pub async fn read_frame_limited<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Option<Vec<u8>>> {
    let mut header = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match reader.read(&mut header[filled..]).await {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => {
                return fail(
                    ErrorCode::RpcFail,
                    "connection closed inside a frame header",
                )
            }
            Ok(n) => filled += n,
            Err(err) => return io_fail("read frame header", err),
        }
    }
    let len = payload_len(header, max.min(MAX_FRAME_LEN))?;
    let mut payload = Vec::with_capacity(len.min(READ_CHUNK));
    match reader.take(len as u64).read_to_end(&mut payload).await {
        Ok(n) if n == len => Ok(Some(payload)),
        Ok(n) => fail(
            ErrorCode::RpcFail,
            format_args!("connection closed after {n} of {len} payload bytes"),
        ),
        Err(err) => io_fail("read frame payload", err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::test_interface::{TestRequest, TestResponse};
    use crate::types::{ReplicateConfig, Uuid};

    /// A plain client reading a TLS server's alert is told the server takes TLS; a frame
    /// that merely starts with the same bytes is read as a frame.
    #[test]
    fn a_tls_alert_is_named_as_such() {
        let alert = [0x15u8, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];
        let mut reader = std::io::Cursor::new(alert.to_vec());
        assert_eq!(read_answer(&mut reader).unwrap_err(), ErrorCode::RpcFail);
        assert!(crate::error::last_error_message().contains("takes TLS only"));
        assert!(!is_tls_alert(&alert[..6]));
        let mut frame = vec![0x15u8, 0x03, 0x03, 0x00];
        frame.extend(std::iter::repeat_n(7u8, 0x0003_0315));
        let mut reader = std::io::Cursor::new(frame);
        assert_eq!(read_answer(&mut reader).unwrap().len(), 0x0003_0315);
    }

    fn sample_request() -> TestRequest {
        TestRequest::batch_put_start {
            client: Uuid { hi: 1, lo: 2 },
            keys: vec!["a".into(), "key/β".into()],
            sizes: vec![3, 1 << 40],
            config: ReplicateConfig::default(),
        }
    }

    #[test]
    fn frames_round_trip_through_sync_and_async_readers() {
        let frame = encode_frame(&sample_request()).unwrap();
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - HEADER_LEN);

        let payload = read_frame(&mut &frame[..]).unwrap();
        let decoded: TestRequest = decode_payload(&payload).unwrap();
        assert_eq!(format!("{decoded:?}"), format!("{:?}", sample_request()));

        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut twice = frame.clone();
        twice.extend_from_slice(&frame);
        let mut reader = &twice[..];
        rt.block_on(async {
            for _ in 0..2 {
                let payload = read_frame_async(&mut reader).await.unwrap().unwrap();
                assert_eq!(payload, frame[HEADER_LEN..]);
            }
            assert_eq!(read_frame_async(&mut reader).await.unwrap(), None);
        });
    }

    #[test]
    fn results_inside_responses_round_trip() {
        let response = TestResponse::batch_remove(Ok(vec![Ok(()), Err(ErrorCode::ObjectHasLease)]));
        let frame = encode_frame(&response).unwrap();
        let decoded: TestResponse = decode_payload(&frame[HEADER_LEN..]).unwrap();
        assert_eq!(format!("{decoded:?}"), format!("{response:?}"));
    }

    #[test]
    fn the_outcome_of_an_encoded_response_is_read_from_its_prefix() {
        let outcome = |response: &TestResponse| {
            enum_result_error(&encode_frame(response).unwrap()[HEADER_LEN..])
        };
        assert_eq!(
            outcome(&TestResponse::service_ready(Ok("2.0.0".into()))),
            None
        );
        assert_eq!(
            outcome(&TestResponse::batch_remove(Ok(vec![Err(
                ErrorCode::ObjectHasLease
            )]))),
            None
        );
        for &code in ErrorCode::ALL {
            assert_eq!(outcome(&TestResponse::unpin(Err(code))), Some(code));
            assert_eq!(outcome(&TestResponse::remove_all(Err(code))), Some(code));
        }
        assert_eq!(enum_result_error(&[]), None);
    }

    #[test]
    fn garbage_payloads_are_rejected_without_panicking() {
        let valid = encode_frame(&sample_request()).unwrap();
        let payload = &valid[HEADER_LEN..];
        // Every truncation, a trailing byte, and pseudo-random noise.
        for cut in 0..payload.len() {
            assert_eq!(
                decode_payload::<TestRequest>(&payload[..cut]).unwrap_err(),
                ErrorCode::RpcFail
            );
        }
        let mut trailing = payload.to_vec();
        trailing.push(0);
        assert!(decode_payload::<TestRequest>(&trailing).is_err());
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..2000 {
            let noise: Vec<u8> = (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect();
            let _ = decode_payload::<TestRequest>(&noise);
            let _ = decode_payload::<TestResponse>(&noise);
        }
        // A length prefix claiming a huge string inside a small payload.
        let huge_string = [7u8, 0xfc, 0xff, 0xff, 0xff, 0x7f];
        assert!(decode_payload::<TestRequest>(&huge_string).is_err());
    }

    #[test]
    fn oversized_and_truncated_frames_are_rejected() {
        let oversized = ((MAX_FRAME_LEN + 1) as u32).to_le_bytes();
        assert_eq!(
            read_frame(&mut &oversized[..]).unwrap_err(),
            ErrorCode::RpcFail
        );
        // A peer announcing the maximum but sending only a few bytes: no 64 MiB allocation,
        // just an error at end of stream.
        let mut short = (MAX_FRAME_LEN as u32).to_le_bytes().to_vec();
        short.extend_from_slice(b"abc");
        assert_eq!(read_frame(&mut &short[..]).unwrap_err(), ErrorCode::RpcFail);
        assert_eq!(
            read_frame(&mut &[1u8, 0][..]).unwrap_err(),
            ErrorCode::RpcFail
        );

        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(read_frame_async(&mut &oversized[..]).await.is_err());
            assert!(read_frame_async(&mut &short[..]).await.is_err());
            assert!(read_frame_async(&mut &[1u8, 0][..]).await.is_err());
        });
    }

    /// A reader over `bytes` that hands out at most `most` bytes per call and counts calls.
    struct CountingReader<'a> {
        bytes: &'a [u8],
        most: usize,
        calls: usize,
    }

    impl Read for CountingReader<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.calls += 1;
            let mut part = &self.bytes[..self.most.min(self.bytes.len())];
            let n = Read::read(&mut part, buf)?;
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    /// The master's answer to a 32-key replica query is about 1.6 KB; the RPC client reads
    /// such an answer, already whole in the socket, with one receive call (one syscall).
    #[test]
    fn a_small_answer_is_read_with_one_read_call() {
        let answer = encode_frame(&TestResponse::service_ready(Ok("x".repeat(1635)))).unwrap();
        let mut socket = CountingReader {
            bytes: &answer,
            most: usize::MAX,
            calls: 0,
        };
        let payload = read_answer(&mut socket).unwrap();
        assert_eq!(payload, answer[HEADER_LEN..]);
        assert_eq!(socket.calls, 1, "read calls for one small answer");

        // Whatever the pieces the answer arrives in, the payload is the same.
        for most in [1, 3, 4, 5, 700, 4095, 4096] {
            let mut socket = CountingReader {
                bytes: &answer,
                most,
                calls: 0,
            };
            assert_eq!(read_answer(&mut socket).unwrap(), answer[HEADER_LEN..]);
        }
        // A large answer: the rest after the first read.
        let large = encode_frame(&TestResponse::service_ready(Ok("y".repeat(100_000)))).unwrap();
        assert_eq!(read_answer(&mut &large[..]).unwrap(), large[HEADER_LEN..]);
        // Unasked bytes after the answer, a cut answer, a cut header, an oversized header.
        let mut extra = answer.clone();
        extra.push(0);
        assert_eq!(
            read_answer(&mut &extra[..]).unwrap_err(),
            ErrorCode::RpcFail
        );
        let cut = &answer[..answer.len() - 1];
        assert_eq!(read_answer(&mut &cut[..]).unwrap_err(), ErrorCode::RpcFail);
        assert_eq!(
            read_answer(&mut &answer[..3]).unwrap_err(),
            ErrorCode::RpcFail
        );
        let oversized = ((MAX_FRAME_LEN + 1) as u32).to_le_bytes();
        assert_eq!(
            read_answer(&mut &oversized[..]).unwrap_err(),
            ErrorCode::RpcFail
        );
    }

    #[test]
    fn oversized_messages_are_not_encoded() {
        let big = TestRequest::remove_by_regex {
            pattern: "x".repeat(MAX_FRAME_LEN + 1),
            force: false,
        };
        assert_eq!(encode_frame(&big).unwrap_err(), ErrorCode::RpcFail);
    }

    #[test]
    fn socket_timeouts_map_to_rpc_timeout() {
        let timed_out = io::Error::from(io::ErrorKind::WouldBlock);
        assert_eq!(io_fail::<()>("x", timed_out), Err(ErrorCode::RpcTimeout));
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(io_fail::<()>("x", reset), Err(ErrorCode::RpcFail));
    }
}
