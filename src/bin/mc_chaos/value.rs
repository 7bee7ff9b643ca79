//! Self-describing values: every byte of a value is a function of (key, version, length), so
//! a reader can tell, from the bytes alone, which write of which key it got and whether any
//! byte is wrong. Independent of the store: nothing here calls it.
//!
//! Layout (little endian u64 words): `MAGIC`, FNV-1a hash of the key, version, length, then
//! body words `mix(key_hash, version, word_index)`; a final partial word holds the low bytes
//! of its `mix`. Length is at least [`HEADER_LEN`].

/// Bytes of the header (magic, key hash, version, length).
pub const HEADER_LEN: usize = 32;
const MAGIC: u64 = 0x3153_4F41_4843_434D; // "MCCHAOS1"

/// FNV-1a of `key`.
pub fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// splitmix64 of the three inputs: the expected body word `index`.
fn mix(key_hash: u64, version: u64, index: u64) -> u64 {
    let mut z = key_hash ^ version.rotate_left(17) ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The expected byte at `offset` of the value (key_hash, version, len).
fn expected_word(key_hash: u64, version: u64, len: u64, index: u64) -> u64 {
    match index {
        0 => MAGIC,
        1 => key_hash,
        2 => version,
        3 => len,
        i => mix(key_hash, version, i),
    }
}

/// Writes the value of (`key`, `version`) into `out` (its whole length).
pub fn fill(out: &mut [u8], key: &str, version: u64) {
    let hash = key_hash(key);
    let len = out.len() as u64;
    for (index, chunk) in out.chunks_mut(8).enumerate() {
        let word = expected_word(hash, version, len, index as u64).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// A freshly built value of `len` bytes.
pub fn build(key: &str, version: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len.max(HEADER_LEN)];
    fill(&mut out, key, version);
    out
}

/// The (version, length) a header names, if it is a header of `key`'s values.
pub fn read_header(header: &[u8], key: &str) -> Result<(u64, u64), String> {
    if header.len() < HEADER_LEN {
        return Err(format!("{} header bytes", header.len()));
    }
    let word = |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    if word(0) != MAGIC {
        return Err(format!("no magic (first word {:#018x})", word(0)));
    }
    if word(1) != key_hash(key) {
        return Err(format!("key hash {:#018x}: another key's bytes", word(1)));
    }
    Ok((word(2), word(3)))
}

/// Checks that `bytes` are exactly bytes `[offset, offset + bytes.len())` of the value
/// (`key`, `version`, `len`); the error names the first wrong byte.
pub fn check_range(
    bytes: &[u8],
    offset: u64,
    key: &str,
    version: u64,
    len: u64,
) -> Result<(), String> {
    if offset + bytes.len() as u64 > len {
        return Err(format!("range {offset}+{} past length {len}", bytes.len()));
    }
    let hash = key_hash(key);
    for (i, &byte) in bytes.iter().enumerate() {
        let at = offset + i as u64;
        let word = expected_word(hash, version, len, at / 8).to_le_bytes();
        if word[(at % 8) as usize] != byte {
            return Err(format!(
                "byte {at} is {byte:#04x}, expected {:#04x} (torn or garbage)",
                word[(at % 8) as usize]
            ));
        }
    }
    Ok(())
}

/// Checks a whole value read for `key` of `size` bytes (as the store reported); returns its
/// version.
pub fn check_whole(bytes: &[u8], key: &str) -> Result<u64, String> {
    let (version, len) = read_header(bytes, key)?;
    if len != bytes.len() as u64 {
        return Err(format!("header says {len} bytes, read {}", bytes.len()));
    }
    check_range(bytes, 0, key, version, len)?;
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_describe_themselves() {
        for len in [32usize, 33, 39, 40, 4097] {
            let value = build("k/1", 77, len);
            assert_eq!(check_whole(&value, "k/1"), Ok(77));
            assert!(check_whole(&value, "k/2").is_err());
            let mut torn = value.clone();
            torn[len - 1] ^= 1;
            assert!(check_whole(&torn, "k/1").is_err());
            // The head of one version (its version word included) and the tail of another.
            if len > HEADER_LEN {
                let other = build("k/1", 78, len);
                let cut = 24.max(len / 2);
                let mut spliced = value.clone();
                spliced[cut..].copy_from_slice(&other[cut..]);
                assert!(check_whole(&spliced, "k/1").is_err());
            }
            assert!(check_whole(&value[..len - 1], "k/1").is_err());
            assert!(check_range(&value[5..20], 5, "k/1", 77, len as u64).is_ok());
        }
    }
}
