//! The RDMA handshake over the TCP data port: the initiator sends a 24-byte header whose
//! opcode is [`RDMA_CONNECT`](crate::transfer::wire::RDMA_CONNECT), its QP [`Endpoint`]
//! and the index of the server device it asks for (`u32`; the server uses that index modulo
//! its device count); the server answers with a status frame, its own endpoint (a QP on that
//! device) and the table of its remotely accessible regions (address, length, rkey on that
//! device, segment epoch). The TCP connection then stays open for the life of the QP pair:
//! when either side closes it (or its process dies), the other side's QP is dropped.
//!
//! Reply layout (little-endian): status frame (8), endpoint (26), region count `u32`, then
//! per region `base u64, len u64, rkey u32, epoch u64` (28 bytes).

use super::qp::{Endpoint, ENDPOINT_LEN};
use crate::transfer::wire::{Status, HEADER_LEN, RDMA_CONNECT, STATUS_LEN, V2_FLAG};
use std::io::{Read, Write};

/// Bytes of a request's payload (after the header): endpoint, then the device index.
pub(crate) const REQUEST_LEN: usize = ENDPOINT_LEN + 4;
/// Bytes of one encoded [`RemoteRegion`].
const REGION_LEN: usize = 28;
/// Most regions a reply may carry (a sanity bound on what a peer can make us allocate).
const MAX_REGIONS: u32 = 1 << 16;

/// One remotely accessible region of the peer, as its handshake reply described it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RemoteRegion {
    pub(crate) base: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u32,
    pub(crate) epoch: u64,
}

impl RemoteRegion {
    /// Whether `[addr, addr+len)` lies inside this region.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base.saturating_add(self.len))
    }
}

/// The header that opens a handshake.
pub(crate) fn request_header() -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[0..8].copy_from_slice(&(REQUEST_LEN as u64).to_le_bytes());
    header[16] = RDMA_CONNECT | V2_FLAG;
    header
}

/// A request's payload: the initiator's endpoint and the server device index it asks for.
pub(crate) fn decode_request(payload: &[u8; REQUEST_LEN]) -> (Endpoint, u32) {
    let mut endpoint = [0u8; ENDPOINT_LEN];
    endpoint.copy_from_slice(&payload[..ENDPOINT_LEN]);
    let mut device = [0u8; 4];
    device.copy_from_slice(&payload[ENDPOINT_LEN..]);
    (Endpoint::decode(&endpoint), u32::from_le_bytes(device))
}

/// The server's answer: OK, its endpoint and its regions.
pub(crate) fn encode_reply(endpoint: &Endpoint, regions: &[RemoteRegion]) -> Vec<u8> {
    let mut out = Vec::with_capacity(STATUS_LEN + ENDPOINT_LEN + 4 + regions.len() * REGION_LEN);
    out.extend_from_slice(&Status::Ok.encode());
    out.extend_from_slice(&endpoint.encode());
    out.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    for region in regions {
        out.extend_from_slice(&region.base.to_le_bytes());
        out.extend_from_slice(&region.len.to_le_bytes());
        out.extend_from_slice(&region.rkey.to_le_bytes());
        out.extend_from_slice(&region.epoch.to_le_bytes());
    }
    out
}

/// Sends the request (asking for the server's device `device`) and reads the reply on
/// `stream` (whose timeouts bound every read).
///
/// Errors: the I/O failure, a refusal (the peer has no RDMA), or a malformed reply, as text.
pub(crate) fn exchange<S: Read + Write>(
    stream: &mut S,
    ours: &Endpoint,
    device: u32,
) -> Result<(Endpoint, Vec<RemoteRegion>), String> {
    let mut request = request_header().to_vec();
    request.extend_from_slice(&ours.encode());
    request.extend_from_slice(&device.to_le_bytes());
    stream
        .write_all(&request)
        .map_err(|e| format!("sending the RDMA handshake: {e}"))?;
    let mut status = [0u8; STATUS_LEN];
    read(stream, &mut status)?;
    match Status::decode(&status) {
        Some(Status::Ok) => {}
        Some(other) => {
            return Err(format!(
                "the peer refused the RDMA handshake ({other:?}): it does not serve RDMA"
            ))
        }
        None => return Err("the peer's handshake reply is not a status frame".into()),
    }
    let mut endpoint = [0u8; ENDPOINT_LEN];
    read(stream, &mut endpoint)?;
    let mut count = [0u8; 4];
    read(stream, &mut count)?;
    let count = u32::from_le_bytes(count);
    if count > MAX_REGIONS {
        return Err(format!("the peer announced {count} regions"));
    }
    let mut table = vec![0u8; count as usize * REGION_LEN];
    read(stream, &mut table)?;
    let regions = table
        .chunks_exact(REGION_LEN)
        .map(|entry| {
            let u64_at = |at: usize| {
                let mut word = [0u8; 8];
                word.copy_from_slice(&entry[at..at + 8]);
                u64::from_le_bytes(word)
            };
            let mut rkey = [0u8; 4];
            rkey.copy_from_slice(&entry[16..20]);
            RemoteRegion {
                base: u64_at(0),
                len: u64_at(8),
                rkey: u32::from_le_bytes(rkey),
                epoch: u64_at(20),
            }
        })
        .collect();
    Ok((Endpoint::decode(&endpoint), regions))
}

/// Runs the initiator's side of a handshake against a peer that answers `data` (whatever it
/// is), and decodes `data` as a request payload. For the fuzz crate: never panics, and never
/// allocates a region table longer than the bytes that came.
pub(crate) fn fuzz(data: &[u8]) {
    struct Answers<'a>(&'a [u8]);
    impl Read for Answers<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }
    impl Write for Answers<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let ours = Endpoint::decode(&[0u8; ENDPOINT_LEN]);
    if let Ok((_, regions)) = exchange(&mut Answers(data), &ours, 0) {
        assert!(regions.len() * REGION_LEN <= data.len());
    }
    if let Ok(payload) = <&[u8; REQUEST_LEN]>::try_from(&data[..REQUEST_LEN.min(data.len())]) {
        let _ = decode_request(payload);
    }
}

fn read<S: Read>(stream: &mut S, buf: &mut [u8]) -> Result<(), String> {
    stream
        .read_exact(buf)
        .map_err(|e| format!("reading the RDMA handshake reply: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::transfer::test_support::CannedStream;

    #[test]
    fn the_reply_round_trips_and_a_refusal_is_named() {
        let theirs = Endpoint {
            qpn: 17,
            psn: 0xabcdef,
            lid: 3,
            gid: [9; 16],
        };
        let regions = vec![
            RemoteRegion {
                base: 0x7f00_0000_0000,
                len: 1 << 30,
                rkey: 0x1234,
                epoch: 5,
            },
            RemoteRegion {
                base: 4096,
                len: 4096,
                rkey: 1,
                epoch: 0,
            },
        ];
        let mut canned = CannedStream::new(encode_reply(&theirs, &regions));
        let ours = Endpoint {
            qpn: 5,
            ..Endpoint::default()
        };
        assert_eq!(
            exchange(&mut canned, &ours, 3),
            Ok((theirs, regions.clone()))
        );
        assert_eq!(canned.sent.len(), HEADER_LEN + REQUEST_LEN);
        assert_eq!(canned.sent[16], RDMA_CONNECT | V2_FLAG);
        let mut payload = [0u8; REQUEST_LEN];
        payload.copy_from_slice(&canned.sent[HEADER_LEN..]);
        assert_eq!(decode_request(&payload), (ours, 3));
        assert!(regions[0].contains(0x7f00_0000_0000, 1 << 30));
        assert!(!regions[0].contains(0x7f00_0000_0000 + 1, 1 << 30));
        assert!(!regions[1].contains(u64::MAX, 2));
        let mut refused = CannedStream::new(Status::AddrRejected.encode().to_vec());
        let problem = exchange(&mut refused, &ours, 0).unwrap_err();
        assert!(problem.contains("does not serve RDMA"), "{problem}");
    }
}
