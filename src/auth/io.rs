//! Runs the handshake of [`protocol`](super::protocol) over a stream: blocking (std sockets)
//! or async (tokio), client or server side. Each side sends and reads fixed-length messages
//! only; the server counts and logs refusals ([`refusals`](super::refusals)).
//!
//! Timeouts: the async server gives a peer [`HANDSHAKE_TIMEOUT`]; blocking callers set their
//! socket's timeouts first (the handshake does not change them).

use super::admission::KeyId;
use super::keys::KeyRing;
use super::protocol::{starts_hello, ClientHandshake, Refusal, ServerHandshake, MAGIC_LEN};
use super::protocol::{CHALLENGE_LEN, HELLO_LEN, PROOF_LEN, VERDICT_LEN};
use super::refusals;
use crate::error::{fail, ErrorCode, Result};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a server waits for a peer to finish the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

fn lost(role: &str, err: std::io::Error) -> ErrorCode {
    refusals::client_failed();
    // Only the master and the metadata service may take TLS.
    let tls = match role == super::ROLE_METADATA || role.starts_with("mc-master") {
        true => ", or take TLS only (trust its certificate: --tls_ca_file / MC_TLS_CA_FILE)",
        false => "",
    };
    let msg = format_args!("the {role} server closed the connection during the cluster-key handshake ({err}); it may have no key set, or another{tls}");
    fail::<()>(ErrorCode::AuthFailed, msg).unwrap_err()
}

fn counted<T>(result: Result<T>) -> Result<T> {
    result.inspect_err(|_| refusals::client_failed())
}

/// Proves the cluster key to the `role` server at the other end of `stream` and checks its
/// proof, blocking.
///
/// Errors: `AUTH_FAILED` (the detail says why) when either side's proof fails, the server
/// holds no such key, or closes or stalls (per the stream's timeouts) during the handshake;
/// `INTERNAL_ERROR` when no nonce can be drawn.
pub fn client_blocking<S: Read + Write>(
    stream: &mut S,
    ring: &KeyRing,
    role: &'static str,
) -> Result<KeyId> {
    let (handshake, hello) = ClientHandshake::start(&ring.keys(), role)?;
    stream.write_all(&hello).map_err(|e| lost(role, e))?;
    stream.flush().map_err(|e| lost(role, e))?;
    let mut challenge = [0u8; CHALLENGE_LEN];
    stream
        .read_exact(&mut challenge)
        .map_err(|e| lost(role, e))?;
    let proof = counted(handshake.answer(&challenge))?;
    stream.write_all(&proof).map_err(|e| lost(role, e))?;
    stream.flush().map_err(|e| lost(role, e))?;
    let mut verdict = [0u8; VERDICT_LEN];
    stream.read_exact(&mut verdict).map_err(|e| lost(role, e))?;
    counted(ClientHandshake::verdict(&verdict)).map(|()| handshake.key_id())
}

/// The async form of [`client_blocking`] (same errors; a stall past [`HANDSHAKE_TIMEOUT`] is
/// `AUTH_FAILED`).
pub async fn client_async<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ring: &KeyRing,
    role: &'static str,
) -> Result<KeyId> {
    let run = async {
        let (handshake, hello) = ClientHandshake::start(&ring.keys(), role)?;
        stream.write_all(&hello).await.map_err(|e| lost(role, e))?;
        stream.flush().await.map_err(|e| lost(role, e))?;
        let mut challenge = [0u8; CHALLENGE_LEN];
        stream
            .read_exact(&mut challenge)
            .await
            .map_err(|e| lost(role, e))?;
        let proof = counted(handshake.answer(&challenge))?;
        stream.write_all(&proof).await.map_err(|e| lost(role, e))?;
        stream.flush().await.map_err(|e| lost(role, e))?;
        let mut verdict = [0u8; VERDICT_LEN];
        stream
            .read_exact(&mut verdict)
            .await
            .map_err(|e| lost(role, e))?;
        counted(ClientHandshake::verdict(&verdict)).map(|()| handshake.key_id())
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, run).await {
        Ok(result) => result,
        Err(_) => Err(lost(role, std::io::ErrorKind::TimedOut.into())),
    }
}

/// What a server side's step found.
enum Step {
    Accepted(KeyId),
    Refused(Refusal),
}

fn refuse<T>(role: &str, peer: Option<IpAddr>, reason: Refusal) -> Result<T> {
    refusals::refused(reason, role, peer);
    fail(
        ErrorCode::AuthFailed,
        format_args!("{role}: refused a connection ({})", reason.label()),
    )
}

fn finish(step: std::io::Result<Step>, role: &str, peer: Option<IpAddr>) -> Result<KeyId> {
    match step {
        Ok(Step::Accepted(id)) => {
            refusals::accepted();
            Ok(id)
        }
        Ok(Step::Refused(reason)) => refuse(role, peer, reason),
        Err(_) => refuse(role, peer, Refusal::Incomplete),
    }
}

/// Checks that the peer on `stream` holds the cluster key for the service `role` (and proves
/// this side does), blocking. On `Err` the caller closes the connection without reading
/// anything else from it.
///
/// Errors: `AUTH_FAILED` for any refusal (counted, logged at most once a minute per `peer`).
pub fn server_blocking<S: Read + Write>(
    stream: &mut S,
    ring: &KeyRing,
    role: &'static str,
    peer: Option<IpAddr>,
) -> Result<KeyId> {
    let mut run = || -> std::io::Result<Step> {
        let mut hello = [0u8; HELLO_LEN];
        let (magic, rest) = hello.split_at_mut(MAGIC_LEN);
        stream.read_exact(magic)?;
        if !starts_hello(&(&*magic).try_into().expect("length")) {
            return Ok(Step::Refused(Refusal::NoHandshake));
        }
        stream.read_exact(rest)?;
        let (handshake, challenge) = match ServerHandshake::respond(&ring.keys(), role, &hello) {
            Ok(pair) => pair,
            Err((reason, answer)) => {
                if let Some(answer) = answer {
                    stream.write_all(&answer)?;
                    stream.flush()?;
                }
                return Ok(Step::Refused(reason));
            }
        };
        stream.write_all(&challenge)?;
        stream.flush()?;
        let mut proof = [0u8; PROOF_LEN];
        stream.read_exact(&mut proof)?;
        let (verdict, accepted) = handshake.check(&proof);
        stream.write_all(&verdict)?;
        stream.flush()?;
        Ok(if accepted {
            Step::Accepted(handshake.key_id())
        } else {
            Step::Refused(Refusal::BadProof)
        })
    };
    finish(run(), role, peer)
}

/// The async form of [`server_blocking`]; a peer that does not finish within
/// [`HANDSHAKE_TIMEOUT`] is refused (`incomplete`).
pub async fn server_async<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    ring: &KeyRing,
    role: &'static str,
    peer: Option<IpAddr>,
) -> Result<KeyId> {
    let run = async {
        let mut hello = [0u8; HELLO_LEN];
        let (magic, rest) = hello.split_at_mut(MAGIC_LEN);
        stream.read_exact(magic).await?;
        if !starts_hello(&(&*magic).try_into().expect("length")) {
            return Ok(Step::Refused(Refusal::NoHandshake));
        }
        stream.read_exact(rest).await?;
        let responded = ServerHandshake::respond(&ring.keys(), role, &hello);
        let (handshake, challenge) = match responded {
            Ok(pair) => pair,
            Err((reason, answer)) => {
                if let Some(answer) = answer {
                    stream.write_all(&answer).await?;
                    stream.flush().await?;
                }
                return Ok(Step::Refused(reason));
            }
        };
        stream.write_all(&challenge).await?;
        stream.flush().await?;
        let mut proof = [0u8; PROOF_LEN];
        stream.read_exact(&mut proof).await?;
        let (verdict, accepted) = handshake.check(&proof);
        stream.write_all(&verdict).await?;
        stream.flush().await?;
        Ok(if accepted {
            Step::Accepted(handshake.key_id())
        } else {
            Step::Refused(Refusal::BadProof)
        })
    };
    let step = tokio::time::timeout(HANDSHAKE_TIMEOUT, run).await;
    finish(
        step.unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
        role,
        peer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;

    use crate::auth::test_ring as ring;

    /// One blocking server handshake on a real socket against `client`; returns both results.
    fn pair(
        server_ring: Arc<KeyRing>,
        client: impl FnOnce(&mut TcpStream) -> Result<()>,
    ) -> (Result<()>, Result<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, peer) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            server_blocking(&mut stream, &server_ring, "master", Some(peer.ip())).map(drop)
        });
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let client = client(&mut stream);
        drop(stream);
        (client, server.join().unwrap())
    }

    #[test]
    fn sockets_carry_the_handshake_and_refusals_are_counted() {
        let before = refusals::counters();
        let ok = pair(ring(1), |s| {
            client_blocking(s, &ring(1), "master").map(drop)
        });
        assert_eq!(ok, (Ok(()), Ok(())));
        let wrong = pair(ring(1), |s| {
            client_blocking(s, &ring(2), "master").map(drop)
        });
        assert_eq!(
            wrong,
            (Err(ErrorCode::AuthFailed), Err(ErrorCode::AuthFailed))
        );
        // A client without a key sends a request frame: refused before it is read as one.
        let keyless = pair(ring(1), |s| {
            s.write_all(&[4, 0, 0, 0, 1, 2, 3, 4]).unwrap(); // a short request frame
            let mut answer = [0u8; 1];
            assert_eq!(
                s.read(&mut answer).unwrap_or(0),
                0,
                "closed without an answer"
            );
            Ok(())
        });
        assert_eq!(keyless.1, Err(ErrorCode::AuthFailed));
        let silent = pair(ring(1), |_| Ok(()));
        assert_eq!(silent.1, Err(ErrorCode::AuthFailed));
        let after = refusals::counters();
        assert!(after.accepted > before.accepted);
        for reason in [
            Refusal::UnknownKey,
            Refusal::NoHandshake,
            Refusal::Incomplete,
        ] {
            assert!(
                after.refused_for(reason) > before.refused_for(reason),
                "{reason:?}"
            );
        }
        assert!(after.client_failed > before.client_failed);
    }

    #[test]
    fn the_async_sides_interoperate_with_the_blocking_ones() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            server_blocking(&mut stream, &ring(4), "master", None).map(drop)
        });
        let client = runtime.block_on(async {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            client_async(&mut stream, &ring(4), "master")
                .await
                .map(drop)
        });
        assert_eq!((client, server.join().unwrap()), (Ok(()), Ok(())));
        let result = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let client = std::thread::spawn(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                client_blocking(&mut stream, &ring(5), "master").map(drop)
            });
            let (mut stream, _) = listener.accept().await.unwrap();
            let served = server_async(&mut stream, &ring(5), "master", None)
                .await
                .map(drop);
            drop(stream);
            (client.join().unwrap(), served)
        });
        assert_eq!(result, (Ok(()), Ok(())));
    }
}
