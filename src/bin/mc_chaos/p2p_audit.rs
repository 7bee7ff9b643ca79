//! The P2P cluster's end-of-run accounting: the master's routes must match what the owners
//! hold. For every key of the P2P key space, the owner the master routes it to must hold it
//! and no other owner may; an unrouted key must be held by no owner (an owner holding one
//! wastes its space, and would serve it to a reader with an old route). The master's
//! `p2p_keys` gauge must equal the routed keys.
//!
//! Asks each owner directly (`PinKey`, then `UnPinKey`), as an accessor with a cached route
//! would. Owners that re-registered late may still be reclaiming, so the comparison is
//! repeated until it holds or [`SETTLE`] has passed.

use crate::cluster::{http_get, metric, wait_until};
use mooncake_rs::error::ErrorCode;
use mooncake_rs::master::{MasterApi, MasterInterface, RemoteMaster};
use mooncake_rs::p2p::{PeerApi, PeerInterface, RemotePeer};
use mooncake_rs::rpc::{RpcClient, Timeouts};
use std::time::Duration;

/// How long the routes and the owners may take to agree after the workers ended.
const SETTLE: Duration = Duration::from_secs(30);

/// What the audit measured, for the report.
#[derive(Default)]
pub struct P2pAccounting {
    /// Keys the master routes.
    pub routed: u64,
    /// (key, owner) pairs the owners hold.
    pub held: u64,
    /// The P2P master's `p2p_keys` gauge.
    pub master_keys: Option<u64>,
    /// The P2P master's `p2p_claimed_keys` gauge.
    pub claimed_keys: Option<u64>,
}

/// One comparison: the accounting and the mismatches found.
fn compare(
    master: &RemoteMaster<RpcClient<MasterInterface>>,
    metrics_port: u16,
    keys: &[String],
) -> (P2pAccounting, Vec<String>) {
    let mut accounting = P2pAccounting::default();
    let mut mismatches = Vec::new();
    let owners = match master.p2p_list_owners() {
        Ok(owners) => owners,
        Err(code) => return (accounting, vec![format!("p2p_list_owners: {code:?}")]),
    };
    let routes = match master.p2p_get_routes(keys.to_vec()) {
        Ok(routes) => routes,
        Err(code) => return (accounting, vec![format!("p2p_get_routes: {code:?}")]),
    };
    let peers: Vec<(String, RemotePeer<RpcClient<PeerInterface>>)> = owners
        .iter()
        .map(|owner| {
            let client = RpcClient::new(&owner.rpc_addr, Timeouts::default());
            (owner.name.clone(), RemotePeer(client))
        })
        .collect();
    for (key, route) in keys.iter().zip(&routes) {
        let mut holders = Vec::new();
        for (name, peer) in &peers {
            match peer.pin_key(key.clone()) {
                Ok(grant) => {
                    holders.push(name.clone());
                    let _ = peer.un_pin_key(key.clone(), grant.read_operation_id);
                }
                Err(ErrorCode::ObjectNotFound) => {}
                Err(code) => mismatches.push(format!("owner {name}: PinKey {key}: {code:?}")),
            }
        }
        accounting.held += holders.len() as u64;
        match route {
            Ok(route) => {
                accounting.routed += 1;
                if holders != [route.owner.name.clone()] {
                    mismatches.push(format!(
                        "{key} is routed to {} but held by {holders:?}",
                        route.owner.name
                    ));
                }
            }
            Err(ErrorCode::ObjectNotFound) if !holders.is_empty() => {
                mismatches.push(format!("{key} has no route but is held by {holders:?}"))
            }
            Err(ErrorCode::ObjectNotFound) => {}
            Err(code) => mismatches.push(format!("route of {key}: {code:?}")),
        }
    }
    let text = http_get(metrics_port, "/metrics").unwrap_or_default();
    accounting.master_keys = metric(&text, "mooncake_master_p2p_keys");
    accounting.claimed_keys = metric(&text, "mooncake_master_p2p_claimed_keys");
    if accounting.master_keys != Some(accounting.routed) {
        mismatches.push(format!(
            "the P2P master counts {:?} routed keys, {} keys have a route",
            accounting.master_keys, accounting.routed
        ));
    }
    (accounting, mismatches)
}

/// Compares the P2P master at `master_addr` (metrics on `metrics_port`) with its owners over
/// `keys`, until they agree or [`SETTLE`] has passed; what still disagrees goes to `problems`.
pub fn audit(
    master_addr: &str,
    metrics_port: u16,
    keys: &[String],
    problems: &mut Vec<String>,
) -> P2pAccounting {
    let master = RemoteMaster(RpcClient::<MasterInterface>::new(
        master_addr,
        Timeouts::default(),
    ));
    let mut last = (P2pAccounting::default(), Vec::new());
    let agreed = wait_until(SETTLE, || {
        last = compare(&master, metrics_port, keys);
        last.1.is_empty()
    });
    if !agreed {
        problems.extend(last.1.into_iter().map(|m| format!("P2P accounting: {m}")));
    }
    last.0
}
