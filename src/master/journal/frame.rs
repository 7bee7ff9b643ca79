//! The journal's bytes on disk: framed records in log files, and snapshots.
//!
//! A frame is `len: u32 | crc: u32 | lsn: u64 | payload`, little endian, where `len` counts
//! `lsn` and the payload (a bincode [`Record`], varint integers) and `crc` is the CRC-32 of the
//! same bytes. A snapshot file is `MAGIC | lsn: u64 | len: u64 | crc: u32 | body` (a bincode
//! [`JournalState`]; `crc` covers `lsn`, `len` and the body). A reader that meets a short frame, a length out of range, a checksum
//! mismatch or an undecodable payload stops there: everything before is whole, nothing after
//! is applied.

use super::record::{JournalState, Record};
use crate::error::{fail, ErrorCode, Result};
use bincode::Options;

/// Largest `len` of a frame (a record is far smaller; more is corruption).
const MAX_FRAME: usize = 16 << 20;
/// Bytes before a frame's payload that `len` does not count.
const FRAME_HEAD: usize = 8;
/// First bytes of a snapshot file (format version 2: with the SSD tier's disk copies).
const SNAPSHOT_MAGIC: &[u8; 8] = b"MCJSNAP2";

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
}

/// Appends the frame of `record` at `lsn` to `out`.
pub(crate) fn encode_frame(lsn: u64, record: &Record, out: &mut Vec<u8>) {
    let payload = codec().serialize(record).unwrap_or_default();
    let len = 8 + payload.len();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&lsn.to_le_bytes());
    crc.update(&payload);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&payload);
}

/// What a log file holds.
#[derive(Debug, Default)]
pub(crate) struct LogScan {
    /// Whole records, in file order, with their LSNs.
    pub records: Vec<(u64, Record)>,
    /// Bytes up to the end of the last whole record.
    pub valid_len: u64,
    /// Why the bytes after `valid_len` were not read (none: the file ends after a record).
    pub torn: Option<String>,
}

/// Reads every whole frame of `bytes`, stopping at the first that is not whole.
pub(crate) fn scan_log(bytes: &[u8]) -> LogScan {
    let mut scan = LogScan::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let Some(head) = rest.get(..FRAME_HEAD) else {
            scan.torn = Some(format!("{} bytes of a frame header", rest.len()));
            break;
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if !(8..=MAX_FRAME).contains(&len) {
            scan.torn = Some(format!("frame length {len} out of range"));
            break;
        }
        let Some(body) = rest.get(FRAME_HEAD..FRAME_HEAD + len) else {
            scan.torn = Some(format!("frame of {len} bytes cut after {}", rest.len()));
            break;
        };
        if crc32fast::hash(body) != crc {
            scan.torn = Some("frame checksum mismatch".to_string());
            break;
        }
        let lsn = u64::from_le_bytes(body[..8].try_into().unwrap_or_default());
        let decoded = codec()
            .with_limit(len as u64)
            .deserialize::<Record>(&body[8..]);
        let Ok(record) = decoded else {
            scan.torn = Some("frame payload does not decode".to_string());
            break;
        };
        scan.records.push((lsn, record));
        at += FRAME_HEAD + len;
        scan.valid_len = at as u64;
    }
    scan
}

/// The bytes of a snapshot of `state` as of `lsn`.
pub(crate) fn encode_snapshot(lsn: u64, state: &JournalState) -> Result<Vec<u8>> {
    let body = match codec().serialize(state) {
        Ok(body) => body,
        Err(error) => return fail(ErrorCode::InternalError, format!("snapshot: {error}")),
    };
    let mut out = Vec::with_capacity(body.len() + 28);
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&snapshot_crc(&out[8..24], &body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// The checksum of a snapshot: its `lsn` and `len` fields, then its body.
fn snapshot_crc(fields: &[u8], body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(fields);
    hasher.update(body);
    hasher.finalize()
}

/// Decodes a snapshot: `(lsn, state)`. Errors: `INTERNAL_ERROR` naming what is wrong (bad
/// magic, length, checksum or body): a snapshot is written whole and renamed into place, so a
/// bad one is corruption, never a torn write.
pub(crate) fn decode_snapshot(bytes: &[u8]) -> Result<(u64, JournalState)> {
    let bad = |what: &str| fail(ErrorCode::InternalError, format!("snapshot: {what}"));
    if bytes.starts_with(b"MCJSNAP1") {
        return bad("format version 1 (before the SSD tier); start from an empty journal_dir");
    }
    if bytes.len() < 28 || &bytes[..8] != SNAPSHOT_MAGIC {
        return bad("not a snapshot (magic)");
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    let (lsn, len) = (word(8), word(16));
    let crc = u32::from_le_bytes(bytes[24..28].try_into().unwrap_or_default());
    let body = &bytes[28..];
    if body.len() as u64 != len {
        return bad(&format!("body of {} bytes, header says {len}", body.len()));
    }
    if snapshot_crc(&bytes[8..24], body) != crc {
        return bad("checksum mismatch");
    }
    match codec().with_limit(len).deserialize::<JournalState>(body) {
        Ok(state) => Ok((lsn, state)),
        Err(error) => bad(&format!("body does not decode: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removals(n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for lsn in 1..=n {
            let key = format!("key-{lsn}");
            encode_frame(lsn, &Record::Remove { key }, &mut out);
        }
        out
    }

    #[test]
    fn whole_frames_read_back_in_order() {
        let bytes = removals(3);
        let scan = scan_log(&bytes);
        assert_eq!(scan.torn, None);
        assert_eq!(scan.valid_len, bytes.len() as u64);
        let lsns: Vec<u64> = scan.records.iter().map(|(lsn, _)| *lsn).collect();
        assert_eq!(lsns, vec![1, 2, 3]);
        assert_eq!(
            scan.records[1].1,
            Record::Remove {
                key: "key-2".into()
            }
        );
    }

    #[test]
    fn every_cut_and_every_flipped_byte_of_the_last_frame_is_caught() {
        let bytes = removals(3);
        let two = scan_log(&removals(2)).valid_len as usize;
        for cut in two..bytes.len() {
            let scan = scan_log(&bytes[..cut]);
            assert_eq!(scan.records.len(), 2, "cut at {cut}");
            assert_eq!(scan.valid_len as usize, two);
            assert_eq!(scan.torn.is_some(), cut > two, "cut at {cut}");
        }
        for flip in two..bytes.len() {
            let mut bad = bytes.clone();
            bad[flip] ^= 0x40;
            let scan = scan_log(&bad);
            assert_eq!(scan.records.len(), 2, "flip at {flip}");
            assert!(scan.torn.is_some(), "flip at {flip}");
        }
    }

    #[test]
    fn snapshots_round_trip_and_refuse_damage() {
        let mut state = JournalState::default();
        state.apply(Record::TokenCeiling(77));
        let bytes = encode_snapshot(9, &state).unwrap();
        assert_eq!(decode_snapshot(&bytes).unwrap(), (9, state));
        for at in [0, 9, 17, 25, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert_eq!(decode_snapshot(&bad), Err(ErrorCode::InternalError), "{at}");
        }
        assert!(decode_snapshot(&bytes[..bytes.len() - 1]).is_err());
    }
}
