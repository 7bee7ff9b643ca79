//! The deadline of an on-stream get: a peer that stops answering (SIGSTOP) makes the
//! housekeeper open the gate with TRANSFER_TIMEOUT, the stream goes on, and the staging the
//! stuck transfer still holds stays quarantined until that transfer is terminal. One test in
//! its own binary, because it sets process-wide timeouts.

mod common;

use common::streams::{buf, on};
use common::{local_client, pattern, wait_until, PeerClient};
use mooncake_rs::stream::{HostStream, StreamRef};
use mooncake_rs::ErrorCode;
use std::time::Duration;

const MIB: usize = 1 << 20;

#[test]
fn a_stuck_peer_times_the_ticket_out_and_staging_stays_quarantined_until_the_transfer_ends() {
    std::env::set_var("MC_STREAM_TIMEOUT_MS", "300");
    std::env::set_var("MC_TRANSFER_TIMEOUT_MS", "3000");
    let master = common::Master::start(&[]);
    let peer = PeerClient::start(&master.addr(), "32 MB");
    let reader = local_client(&master.addr(), 8 * MIB as u64, 0);
    reader
        .put_from("slow", &pattern(4 * MIB, 3), &on(&peer.name))
        .unwrap();
    peer.signal(libc::SIGSTOP);
    let stream = HostStream::new().unwrap();
    let mut out = vec![0u8; 4 * MIB];
    // SAFETY: `out` outlives the waits below.
    let ticket = unsafe {
        reader.batch_get_into_on_stream_raw(
            &["slow"],
            vec![buf(&mut out)],
            false,
            StreamRef::Host(&stream),
        )
    }
    .unwrap();
    assert_eq!(
        ticket.wait(Some(Duration::from_secs(20))),
        ErrorCode::TransferTimeout.code()
    );
    assert!(
        stream.synchronize(Some(Duration::from_secs(20))),
        "the stream went on"
    );
    assert!(
        out.iter().all(|&b| b == 0),
        "a host stream skips the copy after a failure"
    );
    let m = reader.metrics().stream;
    assert_eq!((m.timed_out, m.pins_held, m.tickets_outstanding), (1, 0, 0));
    assert!(
        m.staging_bytes_in_use >= 4 * MIB as u64,
        "the stuck transfer still owns its staging"
    );
    // The transfer ends at its socket timeout; only then does the staging come back.
    assert!(wait_until(Duration::from_secs(20), || {
        reader.metrics().stream.staging_bytes_in_use == 0
    }));
    peer.signal(libc::SIGCONT);
}
