//! A remount of this client's own segment (the master restarted, or this client missed
//! `client_ttl`) while stream copies against the old mount are still queued: the remount
//! waits for them (the epoch fence's mount holds), so a queued get never delivers the new
//! mount's bytes with status 0 and a queued put never lands in what the new master placed
//! there. Host streams held by a blocker; a real `mooncake_master` SIGKILLed and restarted on
//! the same port. Every wait is bounded.

mod common;

use common::streams::{buf, on, Blocker};
use common::{local_client, pattern, wait_until, Master};
use mooncake_rs::client::Client;
use mooncake_rs::stream::{HostStream, StreamRef, Ticket, TICKET_PENDING};
use std::time::Duration;

const MIB: usize = 1 << 20;
const LIMIT: Option<Duration> = Some(Duration::from_secs(20));
/// Long enough for the restarted master to answer `NeedRemount` several times (pings every
/// second or faster; `client_ttl` 2 s).
const REMOUNT_WINDOW: Duration = Duration::from_secs(8);

/// Restarts `master` in place (SIGKILL, then a fresh one on the same port), then waits until
/// `client` either remounted (a put into its segment lands) or deferred its remount because
/// stream copies hold the old mount. Returns whether a put of `value` as `key` landed.
fn restart_and_probe(
    master: &mut Master,
    client: &Client,
    key: &str,
    value: &[u8],
) -> (Master, bool) {
    let port = master.port;
    master.kill();
    let restarted = Master::start_on(port, &[]);
    let here = on(&client.get_hostname());
    let mut landed = false;
    wait_until(REMOUNT_WINDOW, || {
        landed = client.put_from(key, value, &here).is_ok();
        landed || client.metrics().transfer.remounts_deferred > 0
    });
    (restarted, landed)
}

/// Waits until the remount went through (a put of `value` as `key` into the client's own
/// segment lands), then checks that the key reads back exactly `value`.
fn remounted_and_clean(client: &Client, key: &str, value: &[u8]) {
    let here = on(&client.get_hostname());
    assert!(
        wait_until(REMOUNT_WINDOW, || client
            .put_from(key, value, &here)
            .is_ok()),
        "the segment was never remounted once the stream let go"
    );
    let mut out = vec![0u8; value.len()];
    assert_eq!(client.get_into(key, &mut out), Ok(value.len() as u64));
    assert!(
        out == value,
        "a key written after the remount reads other bytes"
    );
}

#[test]
fn a_queued_on_stream_get_of_the_own_segment_survives_a_remount() {
    let mut master = Master::start(&[]);
    let client = local_client(&master.addr(), 4 * MIB as u64, 0);
    let value = pattern(MIB, 7);
    client
        .put_from("queued", &value, &on(&client.get_hostname()))
        .unwrap();
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let mut out = vec![0u8; MIB];
    // SAFETY: `out` outlives the waits below and nobody else touches it.
    let ticket: Ticket = unsafe {
        client.batch_get_into_on_stream_raw(&["queued"], vec![buf(&mut out)], false, {
            StreamRef::Host(&stream)
        })
    }
    .expect("on-stream get issued");
    assert_eq!(ticket.status(), TICKET_PENDING);
    assert_eq!(client.metrics().transfer.segment_holds, 1);

    let other = pattern(MIB, 9);
    let (_restarted, landed) = restart_and_probe(&mut master, &client, "after", &other);
    // Let the stream go before any assertion: `out` must outlive the queued copy.
    blocker.release();
    let status = ticket.wait(LIMIT);
    assert!(stream.synchronize(LIMIT));
    assert!(
        status != 0 || out == value,
        "status 0 with bytes that are not the value (remounted meanwhile: {landed})"
    );
    assert!(
        !landed,
        "the segment was remounted while a stream copy from it was queued"
    );
    assert_eq!(status, 0, "the old mount's bytes were still there");
    assert!(wait_until(Duration::from_secs(5), || client
        .metrics()
        .transfer
        .segment_holds
        == 0));
    remounted_and_clean(&client, "after", &other);
}

#[test]
fn a_queued_on_stream_put_into_the_own_segment_never_lands_in_the_next_mount() {
    let mut master = Master::start(&[]);
    let client = local_client(&master.addr(), 4 * MIB as u64, 0);
    let here = on(&client.get_hostname());
    let stream = HostStream::new().unwrap();
    let blocker = Blocker::block(&stream);
    let queued = pattern(MIB, 3);
    // SAFETY: `queued` outlives the waits below and is not changed.
    let ticket: Ticket = unsafe {
        client.batch_put_from_on_stream_raw(
            &["queued-put"],
            vec![vec![mooncake_rs::client::Buf::new(
                queued.as_ptr() as usize,
                queued.len() as u64,
            )]],
            &here,
            StreamRef::Host(&stream),
        )
    }
    .expect("on-stream put issued");
    assert_eq!(client.metrics().transfer.segment_holds, 1);

    let other = pattern(MIB, 11);
    let (_restarted, landed) = restart_and_probe(&mut master, &client, "after", &other);
    // Let the stream go before any assertion: `queued` must outlive the queued copy.
    blocker.release();
    // The master that granted the put is gone: the commit fails, nothing is readable.
    assert_ne!(ticket.wait(LIMIT), TICKET_PENDING);
    assert!(stream.synchronize(LIMIT));
    remounted_and_clean(&client, "after", &other);
    assert!(
        !landed,
        "the segment was remounted while a stream copy into it was queued"
    );
    let mut out = vec![0u8; MIB];
    assert!(client.get_into("queued-put", &mut out).is_err());
}
