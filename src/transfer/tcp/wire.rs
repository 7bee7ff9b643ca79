//! Mooncake's TCP transport framing (protocol v2, spec §5.3): the 24-byte `SessionHeader`
//! and the 8-byte status frame. Pure encoding and decoding; no I/O.
//!
//! Extension (ours, compatible with Mooncake peers): opcode flag [`EPOCH_FLAG`] says that
//! the 7 padding bytes carry the 56-bit little-endian segment epoch the initiator expects
//! the target range to have. A header without the flag (every Mooncake C++ initiator) has
//! zero padding and is served unchecked. A Mooncake C++ *server* does not know the flag and
//! refuses such a request, so initiators name an epoch only to peers that set one.

use std::fmt;

/// Size of an encoded [`SessionHeader`]: `{u64 size; u64 addr; u8 opcode}` plus 7 bytes of
/// padding (the raw C struct).
pub const HEADER_LEN: usize = 24;
/// Size of an encoded status frame.
pub const STATUS_LEN: usize = 8;
/// Opcode flag that marks protocol v2 (status frames on both READ and WRITE).
pub const V2_FLAG: u8 = 0x80;
/// Opcode flag (our extension) that marks a header carrying a segment epoch in bytes
/// 17..24.
pub const EPOCH_FLAG: u8 = 0x40;
/// Opcode (ours) of an RDMA handshake request: the initiator's queue-pair endpoint follows
/// the header (`size` bytes); see `rdma::handshake`. [`SessionHeader::decode`] refuses it,
/// so a server without RDMA answers it as an unknown opcode.
pub const RDMA_CONNECT: u8 = 0x02;
/// Largest epoch the header can carry (56 bits).
const EPOCH_MASK: u64 = (1 << 56) - 1;
/// High 32 bits of every status frame: "MCTV".
const STATUS_MAGIC: u64 = 0x4D43_5456;

pub use crate::transfer::transport::Opcode;

/// One request on the wire. `addr` is an absolute virtual address in the server process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionHeader {
    /// Number of payload bytes.
    pub size: u64,
    /// Target address in the server process.
    pub addr: u64,
    /// Request direction.
    pub opcode: Opcode,
    /// Whether the v2 flag is set (status frames are exchanged).
    pub v2: bool,
    /// The segment epoch the request names ([`EPOCH_FLAG`]); `None`: unchecked. Encoding
    /// keeps the low 56 bits only (callers pass at most
    /// [`MAX_EPOCH`](super::registry::MAX_EPOCH)).
    pub epoch: Option<u64>,
}

/// A header whose opcode is neither READ nor WRITE (with or without the v2 flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadOpcode(pub u8);

impl fmt::Display for BadOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown opcode {:#04x}", self.0)
    }
}

impl SessionHeader {
    /// The header bytes: little-endian size and addr, opcode with its flags, then the epoch
    /// (56-bit little-endian) or zero padding.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&self.size.to_le_bytes());
        out[8..16].copy_from_slice(&self.addr.to_le_bytes());
        out[16] = self.opcode as u8 | if self.v2 { V2_FLAG } else { 0 };
        if let Some(epoch) = self.epoch {
            out[16] |= EPOCH_FLAG;
            out[17..24].copy_from_slice(&(epoch & EPOCH_MASK).to_le_bytes()[..7]);
        }
        out
    }

    /// Parses header bytes; the padding is read as the epoch when [`EPOCH_FLAG`] is set and
    /// ignored otherwise. The v2 flag is reported in `v2` even when the opcode is unknown,
    /// so the server knows whether to answer with a status frame.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<SessionHeader, (BadOpcode, bool)> {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[0..8]);
        let size = u64::from_le_bytes(word);
        word.copy_from_slice(&bytes[8..16]);
        let addr = u64::from_le_bytes(word);
        let raw = bytes[16];
        let v2 = raw & V2_FLAG != 0;
        let opcode = match raw & !(V2_FLAG | EPOCH_FLAG) {
            0 => Opcode::Read,
            1 => Opcode::Write,
            _ => return Err((BadOpcode(raw), v2)),
        };
        let epoch = (raw & EPOCH_FLAG != 0).then(|| {
            let mut epoch = [0u8; 8];
            epoch[..7].copy_from_slice(&bytes[17..24]);
            u64::from_le_bytes(epoch)
        });
        Ok(SessionHeader {
            size,
            addr,
            opcode,
            v2,
            epoch,
        })
    }
}

/// Whether raw header bytes open an RDMA handshake ([`RDMA_CONNECT`], any flags).
pub fn is_rdma_connect(raw: &[u8; HEADER_LEN]) -> bool {
    raw[16] & !(V2_FLAG | EPOCH_FLAG) == RDMA_CONNECT
}

/// The code carried by a status frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The request was accepted (READ: data follows; WRITE: data was applied).
    Ok,
    /// The address range is not inside one remotely accessible registered buffer.
    AddrRejected,
    /// (Our extension.) The request named a segment epoch that is not the current epoch of
    /// the target range (the segment was remounted, or the process restarted); nothing was
    /// read or written.
    StaleEpoch,
    /// A well-formed frame with a code this implementation does not know.
    Other(u32),
}

impl Status {
    /// The 8-byte little-endian frame `(MAGIC << 32) | code`.
    pub fn encode(self) -> [u8; STATUS_LEN] {
        let code = match self {
            Status::Ok => 0,
            Status::AddrRejected => 1,
            Status::StaleEpoch => 2,
            Status::Other(code) => code,
        };
        ((STATUS_MAGIC << 32) | u64::from(code)).to_le_bytes()
    }

    /// Parses a frame; `None` when the magic is missing (a protocol error).
    pub fn decode(bytes: &[u8; STATUS_LEN]) -> Option<Status> {
        let word = u64::from_le_bytes(*bytes);
        if word >> 32 != STATUS_MAGIC {
            return None;
        }
        Some(match word as u32 {
            0 => Status::Ok,
            1 => Status::AddrRejected,
            2 => Status::StaleEpoch,
            code => Status::Other(code),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_the_c_struct() {
        let h = SessionHeader {
            size: 0x0102_0304_0506_0708,
            addr: 0x1122_3344_5566_7788,
            opcode: Opcode::Write,
            v2: true,
            epoch: None,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&bytes[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(bytes[16], 0x81);
        assert_eq!(&bytes[17..], &[0u8; 7]);
        assert_eq!(SessionHeader::decode(&bytes), Ok(h));
        let v1_read = SessionHeader {
            v2: false,
            opcode: Opcode::Read,
            ..h
        };
        assert_eq!(v1_read.encode()[16], 0);
        let mut bad = bytes;
        bad[16] = 0x85;
        assert_eq!(SessionHeader::decode(&bad), Err((BadOpcode(0x85), true)));
    }

    #[test]
    fn status_frames_round_trip_and_need_the_magic() {
        assert_eq!(
            u64::from_le_bytes(Status::Ok.encode()),
            0x4D43_5456_0000_0000
        );
        assert_eq!(
            u64::from_le_bytes(Status::AddrRejected.encode()),
            0x4D43_5456_0000_0001
        );
        for s in [
            Status::Ok,
            Status::AddrRejected,
            Status::StaleEpoch,
            Status::Other(7),
        ] {
            assert_eq!(Status::decode(&s.encode()), Some(s));
        }
        assert_eq!(Status::decode(&1u64.to_le_bytes()), None);
    }

    #[test]
    fn epoch_travels_in_the_padding_behind_its_flag() {
        let h = SessionHeader {
            size: 4096,
            addr: 0x7f00_0000_1000,
            opcode: Opcode::Read,
            v2: true,
            epoch: Some(0x00AB_CDEF_0123_4567),
        };
        let bytes = h.encode();
        assert_eq!(bytes[16], 0xC0);
        assert_eq!(&bytes[17..], &[0x67, 0x45, 0x23, 0x01, 0xEF, 0xCD, 0xAB]);
        assert_eq!(SessionHeader::decode(&bytes), Ok(h));
        // Without the flag the padding is ignored (a Mooncake peer's header).
        let mut plain = bytes;
        plain[16] = 0x81;
        let decoded = SessionHeader::decode(&plain).unwrap();
        assert_eq!((decoded.epoch, decoded.opcode), (None, Opcode::Write));
        // The flag with a zero epoch is an epoch (0), not "unchecked".
        let zero = SessionHeader {
            epoch: Some(0),
            ..h
        }
        .encode();
        assert_eq!(SessionHeader::decode(&zero).unwrap().epoch, Some(0));
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn opcode() -> impl Strategy<Value = Opcode> {
            prop_oneof![Just(Opcode::Read), Just(Opcode::Write)]
        }

        proptest! {
            #[test]
            fn headers_round_trip(
                size in any::<u64>(),
                addr in any::<u64>(),
                opcode in opcode(),
                v2 in any::<bool>(),
                epoch in prop::option::of(0..=EPOCH_MASK),
            ) {
                let header = SessionHeader { size, addr, opcode, v2, epoch };
                prop_assert_eq!(SessionHeader::decode(&header.encode()), Ok(header));
            }

            /// Any 24 bytes decode without a panic; a decoded header encodes back to the same
            /// bytes except for padding that carries no epoch.
            #[test]
            fn any_header_bytes_decode_consistently(bytes in any::<[u8; HEADER_LEN]>()) {
                match SessionHeader::decode(&bytes) {
                    Ok(header) => {
                        let encoded = header.encode();
                        let kept = if header.epoch.is_some() { HEADER_LEN } else { 17 };
                        prop_assert_eq!(&encoded[..kept], &bytes[..kept]);
                    }
                    Err((BadOpcode(raw), v2)) => {
                        prop_assert_eq!(raw, bytes[16]);
                        prop_assert_eq!(v2, bytes[16] & V2_FLAG != 0);
                        prop_assert!(raw & !(V2_FLAG | EPOCH_FLAG) > 1);
                    }
                }
            }

            #[test]
            fn status_frames_round_trip(code in any::<u32>()) {
                let status = match code {
                    0 => Status::Ok,
                    1 => Status::AddrRejected,
                    2 => Status::StaleEpoch,
                    other => Status::Other(other),
                };
                prop_assert_eq!(Status::decode(&status.encode()), Some(status));
            }

            #[test]
            fn any_status_bytes_decode_consistently(bytes in any::<[u8; STATUS_LEN]>()) {
                match Status::decode(&bytes) {
                    Some(status) => prop_assert_eq!(status.encode(), bytes),
                    None => prop_assert_ne!(u64::from_le_bytes(bytes) >> 32, STATUS_MAGIC),
                }
            }
        }
    }
}
