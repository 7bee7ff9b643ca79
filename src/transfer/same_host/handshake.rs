//! The handshake of the same-host channel: where an owner listens, and the two fixed-size
//! messages. The client sends [`Hello`] (the epoch its replica descriptor names); the owner
//! answers [`Welcome`] (its current mount), with its segment and control memfds attached
//! (`SCM_RIGHTS`) only when the epochs are equal.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;

/// First bytes of both messages (protocol version 1).
const MAGIC: [u8; 8] = *b"MCSHM\x00\x01\x00";
/// Size of a [`Hello`] on the wire.
pub(super) const HELLO_LEN: usize = 16;
/// Size of a [`Welcome`] on the wire.
pub(super) const WELCOME_LEN: usize = 40;

/// The abstract Unix socket name the owner of segment `endpoint` listens on. Abstract names
/// live in the network namespace, so a peer in another namespace is simply not found (and
/// the client falls back to TCP). Errors: the name is too long for a socket address.
pub(super) fn socket_addr(endpoint: &str) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(socket_name(endpoint))
}

/// The abstract name (without the leading NUL) of [`socket_addr`].
pub(super) fn socket_name(endpoint: &str) -> String {
    format!("mooncake-rs/same-host/{endpoint}")
}

/// A client's request: map the segment whose current mount has `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) epoch: u64,
}

/// How the owner answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    /// The epochs match; two descriptors (segment, control) come with the answer.
    Granted = 0,
    /// The owner's current mount has another epoch (its `epoch` field).
    OtherEpoch = 1,
    /// The owner exports no segment (none mounted yet, or being remounted).
    NothingExported = 2,
}

/// The owner's answer: its current mount (`epoch` 0 when none), the owner's address of the
/// segment's first byte and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Welcome {
    pub(super) status: Status,
    pub(super) epoch: u64,
    pub(super) base: u64,
    pub(super) len: u64,
}

impl Hello {
    pub(super) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..].copy_from_slice(&self.epoch.to_le_bytes());
        out
    }

    /// `None` for anything but a version-1 hello.
    pub(super) fn decode(bytes: &[u8]) -> Option<Hello> {
        (bytes.len() == HELLO_LEN && bytes[..8] == MAGIC).then(|| Hello {
            epoch: word(bytes, 8),
        })
    }
}

impl Welcome {
    pub(super) fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut out = [0u8; WELCOME_LEN];
        out[..8].copy_from_slice(&MAGIC);
        let fields = [self.status as u64, self.epoch, self.base, self.len];
        for (i, field) in fields.iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&field.to_le_bytes());
        }
        out
    }

    /// `None` for anything but a complete version-1 welcome.
    pub(super) fn decode(bytes: &[u8]) -> Option<Welcome> {
        if bytes.len() != WELCOME_LEN || bytes[..8] != MAGIC {
            return None;
        }
        let status = match word(bytes, 8) {
            0 => Status::Granted,
            1 => Status::OtherEpoch,
            2 => Status::NothingExported,
            _ => return None,
        };
        Some(Welcome {
            status,
            epoch: word(bytes, 16),
            base: word(bytes, 24),
            len: word(bytes, 32),
        })
    }
}

/// The little-endian u64 at `at` (the caller checked the length).
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes `data` as a hello and as a welcome (each from its first bytes), and re-encodes what
/// decodes: it must give the same bytes. For the fuzz crate.
pub(crate) fn fuzz(data: &[u8]) {
    if let Some(hello) = Hello::decode(&data[..HELLO_LEN.min(data.len())]) {
        assert_eq!(hello.encode()[..], data[..HELLO_LEN]);
    }
    if let Some(welcome) = Welcome::decode(&data[..WELCOME_LEN.min(data.len())]) {
        assert_eq!(welcome.encode()[..], data[..WELCOME_LEN]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let hello = Hello { epoch: 0xabc };
        assert_eq!(Hello::decode(&hello.encode()), Some(hello));
        let welcome = Welcome {
            status: Status::OtherEpoch,
            epoch: 7,
            base: 0x7f00_0000_0000,
            len: 1 << 30,
        };
        assert_eq!(Welcome::decode(&welcome.encode()), Some(welcome));
        assert_eq!(Hello::decode(&[0u8; HELLO_LEN]), None);
        assert_eq!(Welcome::decode(&welcome.encode()[..39]), None);
        let mut bad = welcome.encode();
        bad[8] = 9;
        assert_eq!(Welcome::decode(&bad), None);
        assert!(socket_addr("127.0.0.1:1234").is_ok());
        assert!(socket_addr(&"x".repeat(200)).is_err());
    }
}
