//! The `intruder` fault of a keyed run (`--cluster-key`): a connection without the key sends
//! valid requests straight to the master's RPC port (a forced `remove_all`, which would empty
//! the pool) and to an owner's data port (a read of its segment's first bytes). A keyed
//! server must close each such connection without an answer byte, and the master must count
//! its refusal in `/metrics`; anything else is a problem of the run.

use crate::cluster::{http_get, metric};
use mooncake_rs::master::MasterRequest;
use mooncake_rs::rpc::codec::encode_frame;
use mooncake_rs::transfer::wire::{Opcode, SessionHeader};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The master's refused handshakes so far (`None`: its `/metrics` did not answer).
fn refused(metrics_port: u16) -> Option<u64> {
    let text = http_get(metrics_port, "/metrics")?;
    let refusals = [
        "no_handshake",
        "unknown_key",
        "bad_proof",
        "incomplete",
        "tls_failed",
    ];
    let count = |reason: &str| {
        let name = format!("mooncake_auth_handshakes_total{{result=\"{reason}\"}}");
        metric(&text, &name).unwrap_or(0)
    };
    Some(refusals.iter().map(|reason| count(reason)).sum())
}

/// Sends `bytes` on a fresh connection to 127.0.0.1:`port`; the bytes that came back before
/// the server closed (at most 2 s). Errors: nothing listens (faults come one at a time: the
/// target must be up).
fn answer_to(port: u16, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("intruder: nothing listens on port {port}: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    Ok(answer)
}

/// Runs the intrusion against the master (`master_port`, `/metrics` on `metrics_port`) and
/// the owner data port `owner_port`; the fault's target label, or what got through.
pub fn inject(master_port: u16, metrics_port: u16, owner_port: u16) -> Result<String, String> {
    let before = refused(metrics_port).ok_or("intruder: the master's /metrics did not answer")?;
    let remove_all = MasterRequest::remove_all { force: true };
    let frame = encode_frame(&remove_all).map_err(|e| format!("intruder: encode: {e}"))?;
    let answer = answer_to(master_port, &frame)?;
    if !answer.is_empty() {
        return Err(format!(
            "intruder: the keyed master answered a remove_all without the key ({} bytes)",
            answer.len()
        ));
    }
    let read = SessionHeader {
        size: 64,
        addr: 0,
        opcode: Opcode::Read,
        v2: true,
        epoch: None,
    };
    let answer = answer_to(owner_port, &read.encode())?;
    if !answer.is_empty() {
        return Err(format!(
            "intruder: the keyed owner on port {owner_port} answered a read without the key ({} bytes)",
            answer.len()
        ));
    }
    // The refusal is counted (faults come one at a time: the master was not restarted).
    let limit = Instant::now() + Duration::from_secs(5);
    let counted = || refused(metrics_port).is_some_and(|now| now > before);
    while !counted() {
        if Instant::now() > limit {
            return Err("intruder: the master did not count its refusal".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(format!("master and owner port {owner_port}"))
}
