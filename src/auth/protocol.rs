//! The handshake every connection opens with when a cluster key is set: pure encoding,
//! decoding and MACs, no I/O (the `io` module drives it over a stream; the fuzz target
//! `auth_handshake` feeds it arbitrary bytes).
//!
//! ```text
//! client → server  HELLO   "MCAUTH01" | key id (8) | client nonce (32)               48 bytes
//! server → client  CHALLENGE "MCAUTH01" | status (1) | 0 (7) | server nonce (32)
//!                          | server proof (32)                                       80 bytes
//! client → server  PROOF   client proof (32)                                          32 bytes
//! server → client  VERDICT "MCAUTHOK" or "MCAUTHNO"                                    8 bytes
//! ```
//!
//! proof = HMAC-SHA-256(key, "mooncake-auth-v1" | side | role | client nonce | server nonce),
//! side `S` for the server's, `C` for the client's; role names the service (each server
//! accepts only its own, so a handshake for one service proves nothing to another). Both
//! nonces are fresh from the OS's random source, so a recorded handshake replayed to a server
//! fails (its nonce differs) and a recorded challenge replayed to a client fails likewise. A
//! server that does not know the hello's key id answers status 1 and no proof.
//!
//! Every message has a fixed length, so a server reads exactly those bytes into a stack
//! buffer: nothing is allocated for a peer before it has proven the key. Proofs are compared in
//! constant time (`hmac`'s `verify_slice`).

use super::keys::{Key, Keys};
use crate::error::{fail, ErrorCode, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8; 8] = b"MCAUTH01";
const NONCE: usize = 32;
const PROOF: usize = 32;
/// Bytes of a hello.
pub const HELLO_LEN: usize = 8 + 8 + NONCE;
/// Bytes of a challenge.
pub const CHALLENGE_LEN: usize = 8 + 8 + NONCE + PROOF;
/// Bytes of a proof.
pub const PROOF_LEN: usize = PROOF;
/// Bytes of a verdict.
pub const VERDICT_LEN: usize = 8;
const ACCEPTED: &[u8; 8] = b"MCAUTHOK";
const REFUSED: &[u8; 8] = b"MCAUTHNO";
const STATUS_OK: u8 = 0;
const STATUS_UNKNOWN_KEY: u8 = 1;

/// Why a server refused a handshake (the `/metrics` label and the log's words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The peer's first bytes are not a hello (no key, or not a mooncake-rs client).
    NoHandshake,
    /// The hello names a key this server does not hold.
    UnknownKey,
    /// The proof does not match (another key, another service, or a replay).
    BadProof,
    /// The peer did not finish the handshake in time, or closed during it.
    Incomplete,
    /// The peer did not complete TLS with a TLS server (it spoke plain TCP, refused the
    /// server's certificate, or stalled).
    Tls,
}

impl Refusal {
    /// Every reason, in the order of the counters.
    pub const ALL: [Refusal; 5] = [
        Refusal::NoHandshake,
        Refusal::UnknownKey,
        Refusal::BadProof,
        Refusal::Incomplete,
        Refusal::Tls,
    ];

    /// The label of this reason.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoHandshake => "no_handshake",
            Refusal::UnknownKey => "unknown_key",
            Refusal::BadProof => "bad_proof",
            Refusal::Incomplete => "incomplete",
            Refusal::Tls => "tls_failed",
        }
    }
}

/// Fills `bytes` from the kernel's random source.
///
/// Errors: `INTERNAL_ERROR` if `getrandom(2)` fails (it does not once the system booted).
fn fresh_nonce() -> Result<[u8; NONCE]> {
    let mut nonce = [0u8; NONCE];
    let mut filled = 0;
    while filled < NONCE {
        let rest = &mut nonce[filled..];
        // SAFETY: `rest` is a live, writable slice of the given length.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return fail(ErrorCode::InternalError, format_args!("getrandom: {err}"));
        }
        filled += n as usize;
    }
    Ok(nonce)
}

fn mac(
    key: &Key,
    side: u8,
    role: &str,
    client: &[u8; NONCE],
    server: &[u8; NONCE],
) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.secret()).expect("HMAC takes any key length");
    mac.update(b"mooncake-auth-v1");
    mac.update(&[side]);
    mac.update(&(role.len() as u32).to_le_bytes());
    mac.update(role.as_bytes());
    mac.update(client);
    mac.update(server);
    mac
}

/// Bytes a server reads first: the start of a hello's magic. Anything else is refused at
/// once ([`starts_hello`]), so a peer without a key is closed without waiting for a whole
/// hello (every request of our protocols is at least this long; as an RPC frame's length
/// these bytes would be over a gigabyte, which no server accepts).
pub const MAGIC_LEN: usize = 4;

/// Whether `first` (a connection's first [`MAGIC_LEN`] bytes) can start a hello.
pub fn starts_hello(first: &[u8; MAGIC_LEN]) -> bool {
    first[..] == MAGIC[..MAGIC_LEN]
}

/// A client's handshake in progress.
pub struct ClientHandshake {
    key: Key,
    role: &'static str,
    nonce: [u8; NONCE],
}

impl ClientHandshake {
    /// Starts a handshake for the service `role` with the primary key of `keys`; returns it
    /// and the hello to send.
    ///
    /// Errors: `INTERNAL_ERROR` when no random nonce can be drawn.
    pub fn start(keys: &Keys, role: &'static str) -> Result<(ClientHandshake, [u8; HELLO_LEN])> {
        let key = keys.primary().clone();
        let nonce = fresh_nonce()?;
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(MAGIC);
        hello[8..16].copy_from_slice(&key.id);
        hello[16..].copy_from_slice(&nonce);
        Ok((ClientHandshake { key, role, nonce }, hello))
    }

    /// The identifier of the key this handshake proves.
    pub fn key_id(&self) -> [u8; 8] {
        self.key.id
    }

    /// Checks the server's challenge and returns the proof to send.
    ///
    /// Errors: `AUTH_FAILED` naming why: not a challenge (the server has no key, or is not
    /// this service), an unknown key, or a server proof that does not match (the server
    /// holds another key or serves another role).
    pub fn answer(&self, challenge: &[u8; CHALLENGE_LEN]) -> Result<[u8; PROOF_LEN]> {
        if &challenge[..8] != MAGIC {
            return fail(
                ErrorCode::AuthFailed,
                "the server did not answer the cluster-key handshake (it has no key set, or is not this service)",
            );
        }
        if challenge[8] == STATUS_UNKNOWN_KEY {
            return fail(
                ErrorCode::AuthFailed,
                "the server does not hold this cluster key",
            );
        }
        let server_nonce: &[u8; NONCE] = challenge[16..16 + NONCE].try_into().expect("length");
        let proof = &challenge[16 + NONCE..];
        let expected = mac(&self.key, b'S', self.role, &self.nonce, server_nonce);
        if challenge[8] != STATUS_OK || expected.verify_slice(proof).is_err() {
            return fail(
                ErrorCode::AuthFailed,
                format_args!(
                    "the server's proof does not match: another cluster key, or not a {} service",
                    self.role
                ),
            );
        }
        let ours = mac(&self.key, b'C', self.role, &self.nonce, server_nonce);
        Ok(ours.finalize().into_bytes().into())
    }

    /// Reads the server's verdict.
    ///
    /// Errors: `AUTH_FAILED` when the server refused the proof or sent something else.
    pub fn verdict(verdict: &[u8; VERDICT_LEN]) -> Result<()> {
        match verdict {
            v if v == ACCEPTED => Ok(()),
            v if v == REFUSED => fail(
                ErrorCode::AuthFailed,
                "the server refused our proof of the cluster key",
            ),
            _ => fail(
                ErrorCode::AuthFailed,
                "the server sent no verdict on the cluster-key handshake",
            ),
        }
    }
}

/// A server's refusal of a hello: why, and for an unknown key the challenge that says so.
pub type Refused = (Refusal, Option<[u8; CHALLENGE_LEN]>);

/// A server's handshake in progress.
pub struct ServerHandshake {
    key: Key,
    role: &'static str,
    client_nonce: [u8; NONCE],
    server_nonce: [u8; NONCE],
}

impl ServerHandshake {
    /// Answers a client's hello for the service `role`: the handshake and the challenge to
    /// send, or the refusal and, for an unknown key, the challenge that says so (send it, then
    /// close).
    pub fn respond(
        keys: &Keys,
        role: &'static str,
        hello: &[u8; HELLO_LEN],
    ) -> std::result::Result<(ServerHandshake, [u8; CHALLENGE_LEN]), Refused> {
        let mut challenge = [0u8; CHALLENGE_LEN];
        challenge[..8].copy_from_slice(MAGIC);
        if &hello[..8] != MAGIC {
            return Err((Refusal::NoHandshake, None));
        }
        let id: &[u8; 8] = hello[8..16].try_into().expect("length");
        let Some(key) = keys.by_id(id) else {
            challenge[8] = STATUS_UNKNOWN_KEY;
            return Err((Refusal::UnknownKey, Some(challenge)));
        };
        let Ok(server_nonce) = fresh_nonce() else {
            return Err((Refusal::Incomplete, None));
        };
        let client_nonce: [u8; NONCE] = hello[16..].try_into().expect("length");
        let proof = mac(key, b'S', role, &client_nonce, &server_nonce);
        challenge[16..16 + NONCE].copy_from_slice(&server_nonce);
        challenge[16 + NONCE..].copy_from_slice(&proof.finalize().into_bytes());
        let handshake = ServerHandshake {
            key: key.clone(),
            role,
            client_nonce,
            server_nonce,
        };
        Ok((handshake, challenge))
    }

    /// The identifier of the key the client named (and, once accepted, proved).
    pub fn key_id(&self) -> [u8; 8] {
        self.key.id
    }

    /// Checks the client's proof; returns the verdict to send and whether it accepts.
    pub fn check(&self, proof: &[u8; PROOF_LEN]) -> ([u8; VERDICT_LEN], bool) {
        let expected = mac(
            &self.key,
            b'C',
            self.role,
            &self.client_nonce,
            &self.server_nonce,
        );
        match expected.verify_slice(proof) {
            Ok(()) => (*ACCEPTED, true),
            Err(_) => (*REFUSED, false),
        }
    }
}

/// The fuzz crate's entry (`auth_handshake`): each message decoder on arbitrary bytes (a
/// hello, then a proof, a challenge, a verdict, and the bytes as a key file). Not an API.
#[doc(hidden)]
pub fn fuzz(data: &[u8]) {
    let Ok(keys) = Key::new(vec![7; 32]).and_then(|key| Keys::from_keys(vec![key])) else {
        return;
    };
    let mut stream = data.iter().copied().chain(std::iter::repeat(0));
    let mut take = |n: usize| stream.by_ref().take(n).collect::<Vec<u8>>();
    let hello: [u8; HELLO_LEN] = take(HELLO_LEN).try_into().unwrap_or([0; HELLO_LEN]);
    let first: [u8; MAGIC_LEN] = hello[..MAGIC_LEN].try_into().unwrap_or([0; MAGIC_LEN]);
    let _ = starts_hello(&first);
    let proof: [u8; PROOF_LEN] = take(PROOF_LEN).try_into().unwrap_or([0; PROOF_LEN]);
    if let Ok((server, _)) = ServerHandshake::respond(&keys, "fuzz", &hello) {
        let _ = server.check(&proof);
    }
    let challenge: [u8; CHALLENGE_LEN] =
        take(CHALLENGE_LEN).try_into().unwrap_or([0; CHALLENGE_LEN]);
    if let Ok((client, _)) = ClientHandshake::start(&keys, "fuzz") {
        let _ = client.answer(&challenge);
    }
    let verdict: [u8; VERDICT_LEN] = take(VERDICT_LEN).try_into().unwrap_or([0; VERDICT_LEN]);
    let _ = ClientHandshake::verdict(&verdict);
    let _ = Keys::parse(&String::from_utf8_lossy(data));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(byte: u8) -> Keys {
        Keys::from_keys(vec![Key::new(vec![byte; 32]).unwrap()]).unwrap()
    }

    /// Runs a whole handshake in memory; returns the client's error, if any, and whether
    /// the server accepted.
    fn run(
        client_keys: &Keys,
        server_keys: &Keys,
        client_role: &'static str,
    ) -> (Result<()>, bool) {
        let (client, hello) = ClientHandshake::start(client_keys, client_role).unwrap();
        let (server, challenge) = match ServerHandshake::respond(server_keys, "master", &hello) {
            Ok(pair) => pair,
            Err((_, Some(challenge))) => return (client.answer(&challenge).map(|_| ()), false),
            Err((_, None)) => return (Err(ErrorCode::AuthFailed), false),
        };
        let proof = match client.answer(&challenge) {
            Ok(proof) => proof,
            Err(e) => return (Err(e), server.check(&[0; PROOF_LEN]).1),
        };
        let (verdict, accepted) = server.check(&proof);
        (ClientHandshake::verdict(&verdict), accepted)
    }

    #[test]
    fn the_same_key_and_role_pass_and_anything_else_fails_on_both_sides() {
        assert_eq!(run(&keys(1), &keys(1), "master"), (Ok(()), true));
        assert_eq!(
            run(&keys(1), &keys(2), "master"),
            (Err(ErrorCode::AuthFailed), false)
        );
        assert_eq!(
            run(&keys(1), &keys(1), "tcp-data"),
            (Err(ErrorCode::AuthFailed), false)
        );
        // Rotation: a server holding both keys accepts either.
        let both = Keys::from_keys(vec![
            Key::new(vec![2; 32]).unwrap(),
            Key::new(vec![1; 32]).unwrap(),
        ])
        .unwrap();
        assert_eq!(run(&keys(1), &both, "master"), (Ok(()), true));
        assert_eq!(run(&keys(2), &both, "master"), (Ok(()), true));
    }

    #[test]
    fn a_replayed_proof_or_challenge_fails() {
        let k = keys(7);
        let (client, hello) = ClientHandshake::start(&k, "master").unwrap();
        let (server, challenge) = ServerHandshake::respond(&k, "master", &hello).ok().unwrap();
        let proof = client.answer(&challenge).unwrap();
        assert!(server.check(&proof).1);
        // The same hello and proof against a new connection: the server's nonce is new.
        let (replayed, _) = ServerHandshake::respond(&k, "master", &hello).ok().unwrap();
        assert!(!replayed.check(&proof).1);
        // The recorded challenge against a new client: its nonce is new.
        let (fresh, _) = ClientHandshake::start(&k, "master").unwrap();
        assert_eq!(fresh.answer(&challenge), Err(ErrorCode::AuthFailed));
    }

    #[test]
    fn the_fuzz_entry_takes_any_bytes() {
        for len in [0, 1, 4, HELLO_LEN, 200, 4096] {
            fuzz(&vec![0xa5; len]);
        }
        fuzz(b"MCAUTH01\x01\x02");
    }

    #[test]
    fn garbage_is_refused_without_a_panic() {
        let k = keys(3);
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(b"GET / HT");
        assert!(matches!(
            ServerHandshake::respond(&k, "master", &hello),
            Err((Refusal::NoHandshake, None))
        ));
        let (client, _) = ClientHandshake::start(&k, "master").unwrap();
        assert_eq!(
            client.answer(&[0xff; CHALLENGE_LEN]),
            Err(ErrorCode::AuthFailed)
        );
        assert_eq!(
            ClientHandshake::verdict(b"HTTP/1.1"),
            Err(ErrorCode::AuthFailed)
        );
        assert_eq!(
            ClientHandshake::verdict(REFUSED),
            Err(ErrorCode::AuthFailed)
        );
    }
}
