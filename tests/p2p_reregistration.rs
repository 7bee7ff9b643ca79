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

/// The restart grace of a P2P master started with these tests' harness.
fn grace_flag() -> String {
    format!(
        "--p2p_route_grace_ms={}",
        mooncake_rs::p2p::MASTER_ROUTE_GRACE.as_millis()
    )
}

/// An owner held (SIGSTOP) through a P2P master's restart and its route grace cannot know what
/// the old master did with its keys before dying or what the new one did since: it must drop
/// them all, never serve or route them again.
#[test]
fn an_owner_that_lapsed_across_a_master_restart_drops_its_keys() {
    let mut master = Master::start(&["--deployment_mode=P2P"]);
    let old_owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let new_owner = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let writer = p2p_accessor(&master.addr(), TransferDirection::Reverse);
    let reader = p2p_accessor(&master.addr(), TransferDirection::Forward);
    let forward = RequestOptions::direction(TransferDirection::Forward);
    let old = pattern(4096, 1);
    for key in ["taken", "gone", "kept"] {
        writer.put(key, &old, &to(&old_owner)).unwrap();
    }
    assert_eq!(
        reader.get("taken", &forward).unwrap(),
        old,
        "cache the route"
    );

    old_owner.signal(libc::SIGSTOP);
    let port = master.port;
    master.kill();
    let _master = Master::start_on(port, &["--deployment_mode=P2P", &grace_flag()]);
    let new = pattern(4096, 2);
    // The new owner re-registers on its next ping; its commits wait out the grace.
    assert!(
        wait_until(Duration::from_secs(15), || writer
            .put("taken", &new, &to(&new_owner))
            .is_ok()),
        "the restarted master never accepted the new owner's put"
    );
    writer.put("gone", &new, &to(&new_owner)).unwrap();
    writer.remove("gone").unwrap();
    old_owner.signal(libc::SIGCONT);

    let peer = direct(&old_owner);
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(4) {
        for key in ["taken", "gone", "kept"] {
            let pinned = peer.pin_key(key.into());
            assert!(
                matches!(pinned, Err(ErrorCode::ObjectNotFound)),
                "{:?} after resuming: the lapsed owner serves its value of {key:?}: {pinned:?}",
                watch.elapsed()
            );
        }
        assert!(
            matches!(reader.get("gone", &forward), Err(ErrorCode::ObjectNotFound)),
            "{:?} after resuming: a removed key came back with a superseded value",
            watch.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(reader.get("taken", &forward).unwrap(), new);
    assert!(matches!(
        reader.get("kept", &forward),
        Err(ErrorCode::ObjectNotFound)
    ));
}

/// An owner still confirmed when its P2P master restarts reclaims its keys within the new
/// master's route grace, before any key can be routed anew: its values survive, and a put of
/// one of its keys elsewhere right after the restart is refused instead of superseding it
/// while the owner still serves it.
#[test]
fn an_owner_reclaims_its_keys_from_a_restarted_master_before_new_routes_are_taken() {
    let mut master = Master::start(&["--deployment_mode=P2P"]);
    let holder = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let other = P2pOwnerProcess::start(&master.addr(), &[], &[]);
    let writer = p2p_accessor(&master.addr(), TransferDirection::Reverse);
    let forward = RequestOptions::direction(TransferDirection::Forward);
    let old = pattern(4096, 3);
    writer.put("k", &old, &to(&holder)).unwrap();
    let port = master.port;
    master.kill();
    let _master = Master::start_on(port, &["--deployment_mode=P2P", &grace_flag()]);
    // `other` must have re-registered for its commit to be routed; until then the put fails.
    let deadline = Instant::now() + Duration::from_secs(10);
    let clash = loop {
        match writer.put("k", &pattern(4096, 4), &to(&other)) {
            Err(ErrorCode::ClientNotFound | ErrorCode::RpcFail) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            answer => break answer,
        }
    };
    assert_eq!(
        clash,
        Err(ErrorCode::ObjectAlreadyExists),
        "a put elsewhere of a key the holder still serves was routed after the restart"
    );
    // Under load the holder's re-registering ping can take long enough that it is briefly
    // unconfirmed (it then answers OBJECT_NOT_FOUND until its next ping); its value stays.
    assert!(
        wait_until(Duration::from_secs(5), || writer
            .get("k", &forward)
            .is_ok_and(|v| v == old)),
        "the holder's value did not survive the restart"
    );
    writer.put("fresh", &old, &to(&other)).unwrap();
    assert_eq!(writer.get("fresh", &forward).unwrap(), old);
}
