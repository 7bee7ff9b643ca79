//! The frames between a dummy and its real client. Every frame is `u32 body length (LE)`,
//! `u8 kind`, body; integers are little-endian. The dummy sends one request and waits for its
//! answer; a [`Kind::Map`] request carries the block's descriptor (`SCM_RIGHTS`). Answers are
//! `i32 code`, `u32 message length`, message (UTF-8), then the request kind's payload.

use crate::error::{fail, ErrorCode, Result};
use std::time::{Duration, Instant};

/// Protocol version in [`Kind::Hello`]; the real client refuses any other.
pub(super) const VERSION: u32 = 4;
/// Kind of an empty answer frame the real client sends every third of the TTL while a
/// request still runs; the request's answer (kind 0) follows. Keeps a long transfer from
/// being taken for a hung real client.
pub(super) const WORKING: u8 = 0xfe;
/// Largest frame body either side accepts (a batch of many requests fits easily).
pub(super) const MAX_BODY: usize = 64 << 20;

/// Request kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// `u32 version`, `u32 pid` (what the dummy says; the real client keys the link by the
    /// kernel's pid), `u64 link id`. Answer: `str master address`, `str segment name`.
    Hello = 1,
    /// `u64 block id`, `u64 len`, one descriptor attached. Answer: empty.
    Map = 2,
    /// `u64 block id`. Answer: empty.
    Unmap = 3,
    /// `u32 count`, then per request `u8 op (0 read, 1 write)`, `u64 block`, `u64 offset`,
    /// `u64 len`, `u64 remote addr`, `u64 epoch`, `u64 ms left to send (u64::MAX none)`,
    /// `str endpoint`. Answer: `u32 count`, one `i32` code per request.
    Transfer = 4,
    /// Empty. Answer: empty.
    Ping = 5,
    /// Empty. Answer: [`super::ServerStats`] as ten `u64`s, in field order.
    Stats = 6,
}

impl Kind {
    pub(super) fn from_u8(value: u8) -> Option<Kind> {
        [
            Kind::Hello,
            Kind::Map,
            Kind::Unmap,
            Kind::Transfer,
            Kind::Ping,
            Kind::Stats,
        ]
        .into_iter()
        .find(|kind| *kind as u8 == value)
    }
}

/// Builds a frame body.
#[derive(Default)]
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u32` length, then the bytes.
    pub(super) fn str(&mut self, v: &str) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v.as_bytes());
        self
    }

    /// The frame: header then body.
    pub(super) fn frame(&self, kind: u8) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + self.0.len());
        out.extend_from_slice(&(self.0.len() as u32).to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&self.0);
        out
    }
}

/// Reads a frame body; every getter fails with `INVALID_PARAMS` past its end (a malformed
/// frame from a buggy peer is an error, never a panic).
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return fail(ErrorCode::InvalidParams, "truncated standalone frame");
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    pub(super) fn i32(&mut self) -> Result<i32> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(i32::from_le_bytes(b))
    }
    pub(super) fn u64(&mut self) -> Result<u64> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    pub(super) fn str(&mut self) -> Result<&'a str> {
        let len = self.u32()? as usize;
        match std::str::from_utf8(self.take(len)?) {
            Ok(s) => Ok(s),
            Err(_) => fail(
                ErrorCode::InvalidParams,
                "standalone frame: string not UTF-8",
            ),
        }
    }
}

/// Splits a frame header into `(kind byte, body length)`; `INVALID_PARAMS` for a body over
/// [`MAX_BODY`].
pub(super) fn parse_header(header: [u8; 5]) -> Result<(u8, usize)> {
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_BODY {
        return fail(
            ErrorCode::InvalidParams,
            format!("standalone frame of {len} bytes is over {MAX_BODY}"),
        );
    }
    Ok((header[4], len))
}

/// One request of a [`Kind::Transfer`] frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WireRequest {
    pub(super) write: bool,
    pub(super) block: u64,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) remote_addr: u64,
    pub(super) epoch: u64,
    /// The writer's send-by instant as host-wide `CLOCK_MONOTONIC` nanoseconds
    /// ([`deadline_to_wire`]); `u64::MAX`: none. An instant, not a duration: a frame that sat
    /// in the socket while the real client was stopped must not get a fresh deadline when it
    /// is finally read.
    pub(super) send_by_monotonic_ns: u64,
    pub(super) endpoint: String,
}

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every process of the host.
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// `by` (an instant of this process) as a host-wide instant for [`WireRequest`]; `u64::MAX`
/// for `None`.
pub(super) fn deadline_to_wire(by: Option<Instant>) -> u64 {
    match by {
        None => u64::MAX,
        Some(by) => {
            let left = by.saturating_duration_since(Instant::now()).as_nanos();
            monotonic_ns()
                .saturating_add(u64::try_from(left).unwrap_or(u64::MAX))
                .min(u64::MAX - 1)
        }
    }
}

/// A [`WireRequest`] deadline as an instant of this process: `None` for `u64::MAX`; a deadline
/// already passed is "now" (nothing of the request may start).
pub(super) fn deadline_from_wire(ns: u64) -> Option<Instant> {
    (ns != u64::MAX)
        .then(|| Instant::now() + Duration::from_nanos(ns.saturating_sub(monotonic_ns())))
}

impl WireRequest {
    /// Bytes [`Self::encode`] writes for a request naming `endpoint`.
    pub(super) fn encoded_len(endpoint: &str) -> usize {
        1 + 6 * 8 + 4 + endpoint.len()
    }

    pub(super) fn encode(&self, w: &mut Writer) {
        w.u8(u8::from(self.write))
            .u64(self.block)
            .u64(self.offset)
            .u64(self.len)
            .u64(self.remote_addr)
            .u64(self.epoch)
            .u64(self.send_by_monotonic_ns)
            .str(&self.endpoint);
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<WireRequest> {
        Ok(WireRequest {
            write: match r.u8()? {
                0 => false,
                1 => true,
                op => return fail(ErrorCode::InvalidParams, format!("transfer op {op}")),
            },
            block: r.u64()?,
            offset: r.u64()?,
            len: r.u64()?,
            remote_addr: r.u64()?,
            epoch: r.u64()?,
            send_by_monotonic_ns: r.u64()?,
            endpoint: r.str()?.to_string(),
        })
    }
}

/// Decodes `data` as the frames a real client and a dummy exchange, with the decoders both
/// sides use: frame headers, then each request kind's body (hello, map, unmap, every
/// transfer request) and an answer's code and message. For the fuzz crate: never panics, never
/// allocates more than the input announces within [`MAX_BODY`].
pub(super) fn fuzz_frames(mut data: &[u8]) {
    while data.len() >= 5 {
        let Ok(header) = <[u8; 5]>::try_from(&data[..5]) else {
            return;
        };
        data = &data[5..];
        let Ok((kind, len)) = parse_header(header) else {
            return;
        };
        let body = &data[..len.min(data.len())];
        data = &data[body.len()..];
        let mut r = Reader::new(body);
        let _ = match Kind::from_u8(kind) {
            Some(Kind::Hello) => r.u32().and(r.u32()).and(r.u64()).map(drop),
            Some(Kind::Map) => r.u64().and(r.u64()).map(drop),
            Some(Kind::Unmap) => r.u64().map(drop),
            Some(Kind::Transfer) => r.u32().and_then(|count| {
                (0..count).try_for_each(|_| WireRequest::decode(&mut r).map(drop))
            }),
            Some(Kind::Ping | Kind::Stats) | None => Ok(()),
        };
        let mut answer = Reader::new(body);
        let _ = answer.i32().and_then(|_| answer.str().map(drop));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_a_truncated_one_is_an_error() {
        let request = WireRequest {
            write: true,
            block: 7,
            offset: 4096,
            len: 100,
            remote_addr: 0xdead_0000,
            epoch: 3,
            send_by_monotonic_ns: u64::MAX,
            endpoint: "127.0.0.1:1234".into(),
        };
        let mut w = Writer::default();
        request.encode(&mut w);
        assert_eq!(WireRequest::decode(&mut Reader::new(&w.0)), Ok(request));
        for cut in 0..w.0.len() {
            assert_eq!(
                WireRequest::decode(&mut Reader::new(&w.0[..cut])),
                Err(ErrorCode::InvalidParams),
                "cut at {cut}"
            );
        }
    }
}
