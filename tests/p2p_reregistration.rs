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

/// The owner's RPC service, called directly (as an accessor with a cached route would).
fn direct(owner: &P2pOwnerProcess) -> RemotePeer<RpcClient<PeerInterface>> {
    RemotePeer(RpcClient::new(&owner.rpc_addr, Timeouts::default()))
}

#[test]
fn a_value_is_visible_only_once_the_master_accepted_its_route() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let holder = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let other = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let client = p2p_accessor(&master.addr(), TransferDirection::Reverse);
    client.put("k", &pattern(4096, 1), &to(&holder)).unwrap();
    // `other` has no "k": it grants a PreWrite, but the master will refuse its route.
    let peer = direct(&other);
    let grant = peer.pre_write("k".into(), 4096).unwrap();
    master.signal(libc::SIGSTOP);
    let committing = {
        let peer = direct(&other);
        std::thread::spawn(move || peer.write_commit("k".into(), grant.write_operation_id))
    };
    // The commit now waits for the stopped master. The value must not be readable yet.
    let watch = Instant::now();
    let mut seen = Vec::new();
    while watch.elapsed() < Duration::from_millis(500) {
        seen.push(peer.pin_key("k".into()));
        std::thread::sleep(Duration::from_millis(20));
    }
    master.signal(libc::SIGCONT);
    assert_eq!(
        committing.join().unwrap(),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    assert!(
        seen.iter()
            .all(|pinned| matches!(pinned, Err(ErrorCode::ObjectNotFound))),
        "the owner served a value whose commit the master then refused: {:?}",
        seen.iter().find(|p| p.is_ok())
    );
}

#[test]
fn no_prewrite_of_a_key_while_its_route_is_being_withdrawn() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let client = p2p_accessor(&master.addr(), TransferDirection::Reverse);
    client.put("k", &pattern(4096, 1), &to(&owner)).unwrap();
    master.signal(libc::SIGSTOP);
    let removing = {
        let peer = direct(&owner);
        std::thread::spawn(move || peer.remove_data(vec!["k".into()]))
    };
    // The removal hid "k" and now waits for the stopped master to withdraw its route. A new
    // write of "k" here would be committed and routed, and then lose its route to the late
    // withdrawal: an unrouted value that readers with a cached route still get.
    let peer = direct(&owner);
    let hidden = wait_until(Duration::from_secs(5), || {
        matches!(peer.pin_key("k".into()), Err(ErrorCode::ObjectNotFound))
    });
    assert!(hidden, "the removal never hid the key");
    let during = peer.pre_write("k".into(), 4096);
    master.signal(libc::SIGCONT);
    let removed = removing.join().unwrap();
    assert_eq!(removed, Ok(vec![Ok(())]));
    assert!(
        matches!(during, Err(ErrorCode::ObjectReplicaBusy)),
        "a PreWrite was granted while the key's route was being withdrawn: {during:?}"
    );
}

/// A key written elsewhere and then removed while its first owner was expired has no route
/// when that owner comes back; the owner must not route its superseded value again (found by
/// the 30-minute chaos soak: stale P2P reads after a partition longer than the TTL).
#[test]
fn an_expired_owner_never_republishes_a_key_rewritten_and_removed_while_it_was_gone() {
    let master = Master::start(&["--deployment_mode=P2P"]);
    let old_owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let new_owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let client = p2p_accessor(&master.addr(), TransferDirection::Reverse);
    let old = pattern(4096, 1);
    client.put("rewritten", &old, &to(&old_owner)).unwrap();
    client.put("kept", &old, &to(&old_owner)).unwrap();

    old_owner.signal(libc::SIGSTOP);
    assert!(
        wait_until(Duration::from_secs(10), || !client
            .is_exist("kept")
            .unwrap_or(true)),
        "the master never expired the stopped owner"
    );
    client
        .put("rewritten", &pattern(4096, 2), &to(&new_owner))
        .unwrap();
    client.remove("rewritten").unwrap();
    old_owner.signal(libc::SIGCONT);

    let forward = RequestOptions::direction(TransferDirection::Forward);
    assert!(
        wait_until(Duration::from_secs(5), || client
            .get("kept", &forward)
            .is_ok_and(|v| v == old)),
        "the old owner's untouched key never came back"
    );
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(2) {
        let read = client.get("rewritten", &forward);
        assert!(
            matches!(read, Err(ErrorCode::ObjectNotFound)),
            "{:?} after the re-registration: a removed key came back with a value its newer, \
             removed write had superseded: {:?}",
            watch.elapsed(),
            read.map(|v| v == old)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        matches!(
            direct(&old_owner).pin_key("rewritten".into()),
            Err(ErrorCode::ObjectNotFound)
        ),
        "the old owner still holds the superseded value"
    );
}
