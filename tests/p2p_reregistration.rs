//! P2P owners that the master expired (SIGSTOP past `client_ttl`) and that come back: while
//! they were gone another owner may have taken a key they still hold, so they must not serve
//! their old value of it (found by the chaos soak: readers with a cached route read the old
//! version after a newer put had succeeded).

mod common;

use common::{p2p_accessor, pattern, wait_until, Master, P2pOwnerProcess};
use mooncake_rs::error::ErrorCode;
use mooncake_rs::p2p::{PeerApi, PeerInterface, RemotePeer, RequestOptions, TransferDirection};
use mooncake_rs::rpc::{RpcClient, Timeouts};
use std::time::{Duration, Instant};

fn to(owner: &P2pOwnerProcess) -> RequestOptions {
    RequestOptions {
        direction: Some(TransferDirection::Reverse),
        preferred_owner: Some(owner.name.clone()),
    }
}

#[test]
fn an_expired_owner_never_serves_a_key_taken_over_while_it_was_gone() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let old_owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let new_owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let client = p2p_accessor(&master.addr(), TransferDirection::Reverse);
    let old = pattern(4096, 1);
    client.put("taken", &old, &to(&old_owner)).unwrap();
    client.put("kept", &old, &to(&old_owner)).unwrap();

    old_owner.signal(libc::SIGSTOP);
    // The harness's client_ttl is 2 s: the master drops the stopped owner and its routes.
    assert!(
        wait_until(Duration::from_secs(10), || !client
            .is_exist("taken")
            .unwrap_or(true)),
        "the master never expired the stopped owner"
    );
    let new = pattern(4096, 2);
    client.put("taken", &new, &to(&new_owner)).unwrap();
    old_owner.signal(libc::SIGCONT);

    // From the moment it runs again, the old owner must never hand out its old value of the
    // key another owner now holds: not before its next ping, not after re-registering.
    let direct = RemotePeer(RpcClient::<PeerInterface>::new(
        &old_owner.rpc_addr,
        Timeouts::default(),
    ));
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(3) {
        let pinned = direct.pin_key("taken".into());
        assert!(
            matches!(pinned, Err(ErrorCode::ObjectNotFound)),
            "{:?} after resuming: the expired owner still serves its old value of a key \
             another owner took over: {pinned:?}",
            watch.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        client
            .get(
                "taken",
                &RequestOptions::direction(TransferDirection::Forward)
            )
            .unwrap(),
        new
    );
    // A key nobody took over comes back with the old owner's re-registration.
    assert!(
        wait_until(Duration::from_secs(5), || client
            .get(
                "kept",
                &RequestOptions::direction(TransferDirection::Forward)
            )
            .is_ok_and(|v| v == old)),
        "the old owner's untouched key never came back"
    );
}
