//! On-disk format of one SSD-tier record (one file per object): pure encoding and decoding,
//! no I/O. Plain functions over byte slices; thread-safe.
//!
//! Bytes `0..BLOCK` are the header block, the payload starts at `BLOCK`, and the file is
//! zero-padded to a whole number of blocks. Header, little-endian: magic `MCDREC01`, format
//! version `u32`, key length `u32`, generation `u64`, payload length `u64`, payload CRC32C
//! `u32`, the key (UTF-8), then the CRC32C `u32` of all preceding header bytes; the rest of the
//! block is zero.

use crate::error::{fail, ErrorCode, Result};

/// Header block length, payload padding unit and O_DIRECT alignment.
pub(crate) const BLOCK: usize = 4096;
const MAGIC: &[u8; 8] = b"MCDREC01";
const VERSION: u32 = 1;
/// Magic, version, key length, generation, payload length, payload CRC.
const FIXED: usize = 8 + 4 + 4 + 8 + 8 + 4;
/// Longest key (UTF-8 bytes) a header holds.
pub(crate) const MAX_KEY_LEN: usize = BLOCK - FIXED - 4;

/// A decoded header. Plain value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The object's key.
    pub key: String,
    /// The generation the record was written with.
    pub generation: u64,
    /// Payload bytes (before padding).
    pub len: u64,
    /// CRC32C of the payload's `len` bytes.
    pub payload_crc: u32,
}

/// `len` rounded up to a whole number of blocks (saturating for absurd lengths read from
/// disk, which then never match a real file length).
pub(crate) fn round_up(len: u64) -> u64 {
    len.div_ceil(BLOCK as u64).saturating_mul(BLOCK as u64)
}

/// Length of the file holding a `len`-byte payload: header block plus padded payload.
pub(crate) fn file_len(len: u64) -> u64 {
    round_up(len).saturating_add(BLOCK as u64)
}

/// The header block of a record.
///
/// Errors: `INVALID_KEY` when `key` is longer than [`MAX_KEY_LEN`] bytes.
pub(crate) fn encode_header(
    key: &str,
    generation: u64,
    len: u64,
    payload_crc: u32,
) -> Result<[u8; BLOCK]> {
    if key.len() > MAX_KEY_LEN {
        return fail(
            ErrorCode::InvalidKey,
            format_args!("key of {} bytes exceeds {MAX_KEY_LEN}", key.len()),
        );
    }
    let mut block = [0u8; BLOCK];
    let key_len = (key.len() as u32).to_le_bytes();
    let fields: [&[u8]; 7] = [
        MAGIC,
        &VERSION.to_le_bytes(),
        &key_len,
        &generation.to_le_bytes(),
        &len.to_le_bytes(),
        &payload_crc.to_le_bytes(),
        key.as_bytes(),
    ];
    let mut at = 0;
    for field in fields {
        block[at..at + field.len()].copy_from_slice(field);
        at += field.len();
    }
    let crc = crc32c::crc32c(&block[..at]);
    block[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    Ok(block)
}

/// Decodes the header block at the start of `block` (at least [`BLOCK`] bytes).
///
/// Errors: `CHECKSUM_MISMATCH` when the block is short, or its magic, version, key length,
/// header CRC or key encoding is wrong.
pub(crate) fn decode_header(block: &[u8]) -> Result<Header> {
    if block.len() < BLOCK {
        return corrupt("short header block");
    }
    if &block[..8] != MAGIC {
        return corrupt("bad magic");
    }
    if u32_at(block, 8) != VERSION {
        return corrupt(format_args!("unknown version {}", u32_at(block, 8)));
    }
    let key_len = u32_at(block, 12) as usize;
    if key_len > MAX_KEY_LEN {
        return corrupt(format_args!("key length {key_len}"));
    }
    let end = FIXED + key_len;
    if crc32c::crc32c(&block[..end]) != u32_at(block, end) {
        return corrupt("header CRC mismatch");
    }
    let Ok(key) = std::str::from_utf8(&block[FIXED..end]) else {
        return corrupt("key is not UTF-8");
    };
    Ok(Header {
        key: key.to_owned(),
        generation: u64_at(block, 16),
        len: u64_at(block, 24),
        payload_crc: u32_at(block, 32),
    })
}

fn corrupt<T>(what: impl std::fmt::Display) -> Result<T> {
    fail(
        ErrorCode::ChecksumMismatch,
        format_args!("disk record header: {what}"),
    )
}

/// Little-endian `u32` at `at`; the caller checked the bounds.
fn u32_at(block: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&block[at..at + 4]);
    u32::from_le_bytes(bytes)
}

/// Little-endian `u64` at `at`; the caller checked the bounds.
fn u64_at(block: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&block[at..at + 8]);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode::ChecksumMismatch;

    #[test]
    fn header_round_trips() {
        let block = encode_header("layer/7", 42, 12345, 0xdead_beef).unwrap();
        let header = decode_header(&block).unwrap();
        let fields = (
            header.key.as_str(),
            header.generation,
            header.len,
            header.payload_crc,
        );
        assert_eq!(fields, ("layer/7", 42, 12345, 0xdead_beef));
        let longest = "k".repeat(MAX_KEY_LEN);
        let block = encode_header(&longest, 1, 0, 0).unwrap();
        assert_eq!(decode_header(&block).unwrap().key, longest);
        let key = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(encode_header(&key, 1, 0, 0), Err(ErrorCode::InvalidKey));
    }

    #[test]
    fn decode_rejects_any_flipped_header_byte() {
        let block = encode_header("key", 3, 4096, 7).unwrap();
        // Every byte of the fixed part, the key and the CRC is covered.
        for at in 0..FIXED + 3 + 4 {
            let mut bad = block;
            bad[at] ^= 0x01;
            assert_eq!(decode_header(&bad), Err(ChecksumMismatch), "byte {at}");
        }
        assert_eq!(decode_header(&block[..BLOCK - 1]), Err(ChecksumMismatch));
        assert_eq!(decode_header(&[0u8; BLOCK]), Err(ChecksumMismatch));
    }

    #[test]
    fn file_lengths() {
        let lens = [0, 1, 4096, 4097, u64::MAX].map(file_len);
        assert_eq!(lens, [4096, 8192, 8192, 12288, u64::MAX]);
    }
}
