//! P2P routing metadata: which owner client holds each key, and its size. In P2P (V3) mode
//! this is all the master keeps about objects; owners store the bytes themselves.
//!
//! An expired owner's keys become claims ([`super::route_claims`]): when it comes back it
//! reclaims them ([`MasterApi::p2p_reclaim_keys`](crate::master::MasterApi::p2p_reclaim_keys))
//! and gets back only those nobody routed meanwhile.
//!
//! Thread-safety: one `parking_lot::RwLock` (lookups share it), a leaf lock taken after the
//! client table, never together with object shards or segments.

use super::route_claims::ExpiredClaims;
use super::service::{check_key, MasterService};
use crate::error::{fail, ErrorCode, Result};
use crate::types::{ClientId, DeploymentMode, P2pOwner, P2pRoute};
use parking_lot::RwLock;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

#[derive(Default)]
struct Routes {
    owners: HashMap<ClientId, (P2pOwner, HashSet<String>)>,
    keys: HashMap<String, (ClientId, u64)>,
    claims: ExpiredClaims,
}

impl Routes {
    /// Routes `key` (checked) to the registered `client` unless another owner holds it; ends
    /// any claim on it.
    fn insert(&mut self, client: ClientId, key: String, size: u64) -> Result<()> {
        let Routes {
            owners,
            keys,
            claims,
        } = self;
        let Some((_, owned)) = owners.get_mut(&client) else {
            return fail(
                ErrorCode::ClientNotFound,
                format!("owner {client} is not registered"),
            );
        };
        match keys.get(&key) {
            Some((holder, _)) if *holder != client => fail(
                ErrorCode::ObjectAlreadyExists,
                format!("key {key} is held by owner {holder}"),
            ),
            _ => {
                claims.end(&key);
                owned.insert(key.clone());
                keys.insert(key, (client, size));
                Ok(())
            }
        }
    }
}

/// Key → owner routes and the registered owners.
#[derive(Default)]
pub(crate) struct RouteTable {
    inner: RwLock<Routes>,
}

impl RouteTable {
    /// Adds or replaces `owner` (its keys are kept).
    fn register(&self, owner: P2pOwner) {
        let mut routes = self.inner.write();
        let keys = routes
            .owners
            .remove(&owner.client)
            .map(|(_, keys)| keys)
            .unwrap_or_default();
        routes.owners.insert(owner.client, (owner, keys));
    }

    fn owners(&self) -> Vec<P2pOwner> {
        let routes = self.inner.read();
        routes.owners.values().map(|(o, _)| o.clone()).collect()
    }

    /// Routes `key` to `client`; ends any expired owner's claim on it (this is a newer write).
    /// `OBJECT_REPLICA_BUSY` before `grace_end` (checked under the lock, so no reclaim of an
    /// earlier master's owner can follow a route added here).
    fn add(&self, client: ClientId, key: String, size: u64, grace_end: Instant) -> Result<()> {
        check_key(&key)?;
        if size == 0 {
            return fail(ErrorCode::InvalidParams, format!("key {key}: size 0"));
        }
        let mut routes = self.inner.write();
        if Instant::now() < grace_end {
            return fail(
                ErrorCode::ObjectReplicaBusy,
                format!("key {key}: this master takes new routes only after its route grace"),
            );
        }
        routes.insert(client, key, size)
    }

    /// Routes `key` to `client`, an owner of an earlier master's life, if `vouched` (it was
    /// confirmed by that master after this one started) and before `grace_end` (checked under
    /// the lock: no new route precedes it). Already routed to `client` with `size` (a
    /// retried reclaim) is fine at any time.
    fn reclaim_foreign(
        &self,
        client: ClientId,
        key: String,
        size: u64,
        vouched: bool,
        grace_end: Instant,
    ) -> Result<()> {
        check_key(&key)?;
        let mut routes = self.inner.write();
        if routes.keys.get(&key) == Some(&(client, size)) {
            return Ok(());
        }
        if !vouched || Instant::now() >= grace_end {
            return fail(
                ErrorCode::ObjectNotFound,
                format!(
                    "key {key}: this master did not know owner {client} before it restarted, and \
                     the owner cannot vouch for its keys or the route grace is over"
                ),
            );
        }
        routes.insert(client, key, size)
    }

    /// Routes `key` to `client` again after its expiry, if `client` held it then with `size`
    /// bytes and nobody routed it since (or `client` already did so, a retried reclaim).
    fn reclaim(&self, client: ClientId, key: String, size: u64) -> Result<()> {
        check_key(&key)?;
        let mut routes = self.inner.write();
        if routes.keys.get(&key) == Some(&(client, size)) {
            return Ok(());
        }
        if !routes.claims.holds(client, &key, size) {
            return fail(
                ErrorCode::ObjectNotFound,
                format!(
                    "owner {client} no longer claims key {key}: it was written, removed or \
                     its claim aged out while the owner was expired"
                ),
            );
        }
        routes.insert(client, key, size)
    }

    /// Ends the reclaim of `client`: claims it did not reclaim are forgotten.
    fn end_reclaim(&self, client: ClientId) {
        self.inner.write().claims.forget_owner(client);
    }

    /// Withdraws `client`'s route of `key`. A claim `client` still has on `key` ends too (its
    /// value was removed), so a later reclaim cannot route it again.
    fn remove(&self, client: ClientId, key: &str) -> Result<()> {
        let mut routes = self.inner.write();
        if routes.claims.holds_any(client, key) {
            routes.claims.end(key);
        }
        match routes.keys.get(key) {
            Some((holder, _)) if *holder == client => {
                routes.keys.remove(key);
                if let Some((_, owned)) = routes.owners.get_mut(&client) {
                    owned.remove(key);
                }
                Ok(())
            }
            _ => fail(
                ErrorCode::ObjectNotFound,
                format!("owner {client} holds no key {key}"),
            ),
        }
    }

    fn route(&self, key: &str) -> Result<P2pRoute> {
        check_key(key)?;
        let routes = self.inner.read();
        let found = routes.keys.get(key).and_then(|(client, size)| {
            let (owner, _) = routes.owners.get(client)?;
            Some(P2pRoute {
                owner: owner.clone(),
                size: *size,
            })
        });
        match found {
            Some(route) => Ok(route),
            None => fail(ErrorCode::ObjectNotFound, format!("no route for key {key}")),
        }
    }

    /// Drops `client` and every key it holds, which become its claims as of `now`; returns
    /// how many keys went.
    pub(crate) fn drop_owner(&self, client: ClientId, now: Instant) -> usize {
        let mut routes = self.inner.write();
        let Routes {
            owners,
            keys,
            claims,
        } = &mut *routes;
        let Some((_, owned)) = owners.remove(&client) else {
            return 0;
        };
        let count = owned.len();
        let held = owned
            .into_iter()
            .filter_map(|key| keys.remove(&key).map(|(_, size)| (key, size)));
        claims.record(client, held, now);
        count
    }

    /// Forgets the claims of owners expired before `cutoff`; returns how many keys went.
    pub(crate) fn prune_claims(&self, cutoff: Instant) -> usize {
        self.inner.write().claims.prune(cutoff)
    }

    /// Number of routed keys.
    pub(crate) fn len(&self) -> usize {
        self.inner.read().keys.len()
    }

    /// Number of keys claimed by expired owners.
    pub(crate) fn claimed(&self) -> usize {
        self.inner.read().claims.len()
    }
}

/// `INVALID_PARAMS` unless there is one size per key.
fn check_lengths(keys: &[String], sizes: &[u64]) -> Result<()> {
    if keys.len() != sizes.len() {
        return fail(
            ErrorCode::InvalidParams,
            format!("{} keys but {} sizes", keys.len(), sizes.len()),
        );
    }
    Ok(())
}

/// The `p2p_*` methods of [`crate::master::MasterApi`], called by the trait implementation.
impl MasterService {
    /// `UNAVAILABLE_IN_CURRENT_MODE` unless the master runs in `mode`.
    pub(super) fn require_mode(&self, mode: DeploymentMode) -> Result<()> {
        if self.config.deployment_mode != mode {
            return fail(
                ErrorCode::UnavailableInCurrentMode,
                format!(
                    "this master runs in {:?} mode; the call needs {mode:?}",
                    self.config.deployment_mode
                ),
            );
        }
        Ok(())
    }

    pub(super) fn register_owner(&self, owner: P2pOwner) -> Result<()> {
        self.require_mode(DeploymentMode::P2p)?;
        if owner.name.is_empty() || owner.rpc_addr.is_empty() {
            return fail(
                ErrorCode::InvalidParams,
                "owner without endpoint or RPC address",
            );
        }
        // Liveness first, so the monitor cannot drop the owner between the two steps.
        self.clients.register(owner.client, Instant::now());
        self.routes.register(owner);
        Ok(())
    }

    pub(super) fn list_owners(&self) -> Result<Vec<P2pOwner>> {
        self.require_mode(DeploymentMode::P2p)?;
        Ok(self.routes.owners())
    }

    pub(super) fn add_routes(
        &self,
        client: ClientId,
        keys: Vec<String>,
        sizes: Vec<u64>,
    ) -> Result<Vec<Result<()>>> {
        self.require_mode(DeploymentMode::P2p)?;
        check_lengths(&keys, &sizes)?;
        if let Some(left) = self.route_grace_left() {
            return fail(
                ErrorCode::ObjectReplicaBusy,
                format!(
                    "this master started recently; it takes new routes in {left:?}, once owners of a previous master have reclaimed their keys or fenced themselves"
                ),
            );
        }
        let grace_end = self.route_grace_end();
        Ok(
            self.apply_routes(client, keys, sizes, |table, client, key, size| {
                table.add(client, key, size, grace_end)
            }),
        )
    }

    /// When this master's route grace ends.
    fn route_grace_end(&self) -> Instant {
        self.started_at + self.config.p2p_route_grace()
    }

    /// What is left of the P2P route grace ([`MasterConfig::p2p_route_grace`]), if any.
    ///
    /// [`MasterConfig::p2p_route_grace`]: crate::master::MasterConfig::p2p_route_grace
    fn route_grace_left(&self) -> Option<std::time::Duration> {
        self.config
            .p2p_route_grace()
            .checked_sub(self.started_at.elapsed())
            .filter(|left| !left.is_zero())
    }

    /// Applies `route` to each key and size, in order.
    fn apply_routes(
        &self,
        client: ClientId,
        keys: Vec<String>,
        sizes: Vec<u64>,
        route: impl Fn(&RouteTable, ClientId, String, u64) -> Result<()>,
    ) -> Vec<Result<()>> {
        keys.into_iter()
            .zip(sizes)
            .map(|(key, size)| route(&self.routes, client, key, size))
            .collect()
    }

    /// Routes again the keys an owner held when this master expired it (see
    /// [`super::route_claims`]); claims not reclaimed here are forgotten. An owner whose last
    /// known `view_version` is another master's (this one restarted and knows no claims; 0:
    /// the owner cannot vouch for any) gets its keys routed as new during the route grace,
    /// when no key is routed anew; after it, or unvouched, every key not already routed to it
    /// is refused (`OBJECT_NOT_FOUND`: a write and a removal may have come and gone
    /// meanwhile), and the owner drops them.
    pub(super) fn reclaim_routes(
        &self,
        client: ClientId,
        view_version: u64,
        keys: Vec<String>,
        sizes: Vec<u64>,
    ) -> Result<Vec<Result<()>>> {
        self.require_mode(DeploymentMode::P2p)?;
        check_lengths(&keys, &sizes)?;
        if view_version == self.view_version.load(std::sync::atomic::Ordering::Acquire) {
            let answers = self.apply_routes(client, keys, sizes, RouteTable::reclaim);
            self.routes.end_reclaim(client);
            return Ok(answers);
        }
        let (vouched, grace_end) = (view_version != 0, self.route_grace_end());
        Ok(
            self.apply_routes(client, keys, sizes, |table, client, key, size| {
                table.reclaim_foreign(client, key, size, vouched, grace_end)
            }),
        )
    }

    pub(super) fn remove_routes(
        &self,
        client: ClientId,
        keys: Vec<String>,
    ) -> Result<Vec<Result<()>>> {
        self.require_mode(DeploymentMode::P2p)?;
        Ok(keys
            .iter()
            .map(|key| self.routes.remove(client, key))
            .collect())
    }

    pub(super) fn routes_of(&self, keys: Vec<String>) -> Result<Vec<Result<P2pRoute>>> {
        self.require_mode(DeploymentMode::P2p)?;
        Ok(keys.iter().map(|key| self.routes.route(key)).collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorCode;
    use crate::master::{MasterApi, MasterConfig, MasterService};
    use crate::types::{DeploymentMode, P2pOwner, Segment, Uuid};
    use std::time::Duration;

    fn owner(port: u16) -> P2pOwner {
        P2pOwner {
            client: Uuid::random(),
            name: format!("127.0.0.1:{port}"),
            rpc_addr: format!("127.0.0.1:{}", port + 1),
        }
    }

    #[test]
    fn routes_follow_owners_and_expire_with_them() {
        let master = MasterService::new(MasterConfig {
            deployment_mode: DeploymentMode::P2p,
            client_ttl_ms: Some(150),
            ..MasterConfig::default()
        });
        let (a, b) = (owner(1000), owner(2000));
        master.p2p_register_owner(a.clone()).unwrap();
        master.p2p_register_owner(b.clone()).unwrap();
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let added = master
            .p2p_add_keys(a.client, keys(&["x", "y", ""]), vec![10, 20, 1])
            .unwrap();
        assert_eq!(added[..2], [Ok(()), Ok(())]);
        assert_eq!(added[2], Err(ErrorCode::InvalidParams));
        let clash = master
            .p2p_add_keys(b.client, keys(&["x"]), vec![5])
            .unwrap();
        assert_eq!(clash, vec![Err(ErrorCode::ObjectAlreadyExists)]);
        let stranger = master.p2p_add_keys(Uuid::random(), keys(&["z"]), vec![5]);
        assert_eq!(stranger.unwrap(), vec![Err(ErrorCode::ClientNotFound)]);
        let routes = master.p2p_get_routes(keys(&["x", "q"])).unwrap();
        assert_eq!(routes[0].as_ref().unwrap().owner, a);
        assert_eq!(routes[0].as_ref().unwrap().size, 10);
        assert_eq!(routes[1], Err(ErrorCode::ObjectNotFound));
        assert_eq!(
            master.p2p_remove_keys(b.client, keys(&["y"])).unwrap(),
            vec![Err(ErrorCode::ObjectNotFound)]
        );
        assert_eq!(master.metrics().p2p_keys, 2);
        // Only b pings: a expires with its keys.
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(40));
            master.ping(b.client).unwrap();
        }
        assert_eq!(master.p2p_list_owners().unwrap(), vec![b]);
        assert_eq!(master.metrics().p2p_keys, 0);
        // A P2P master never mounts segments.
        let segment = Segment {
            id: Uuid::random(),
            name: "s".into(),
            base: 4096,
            size: 1 << 20,
            protocol: "tcp".into(),
            epoch: 1,
        };
        assert_eq!(
            master.mount_segment(a.client, segment),
            Err(ErrorCode::UnavailableInCurrentMode)
        );
        let centralized = MasterService::new(MasterConfig::default());
        assert_eq!(
            centralized.p2p_list_owners(),
            Err(ErrorCode::UnavailableInCurrentMode)
        );
    }

    /// An owner whose ping lands while the monitor is still retiring it (between forgetting
    /// its liveness and dropping its routes) re-registers and republishes its keys; the
    /// republished routes must survive the rest of the retirement, or the master would count
    /// the owner alive while routing none of its keys (the chaos soak's P2P violations).
    #[test]
    fn an_owner_reregistering_during_its_expiry_keeps_its_republished_routes() {
        let master = std::sync::Arc::new(MasterService::new(MasterConfig {
            deployment_mode: DeploymentMode::P2p,
            client_ttl_ms: Some(3_600_000),
            ..MasterConfig::default()
        }));
        let a = owner(3000);
        master.p2p_register_owner(a.clone()).unwrap();
        let keys = vec!["k".to_string()];
        master
            .p2p_add_keys(a.client, keys.clone(), vec![8])
            .unwrap();
        // The monitor's first step, as if a's lease had run out.
        let far = std::time::Instant::now() + Duration::from_secs(7_200);
        let expired = master.clients.expire(far, Duration::from_secs(3_600));
        assert_eq!(expired, vec![a.client]);
        assert_eq!(
            master.ping(a.client).unwrap().status,
            crate::types::ClientStatus::NeedRemount
        );
        // The owner answers NeedRemount at once: re-register, republish.
        let owner_side = {
            let (master, a, keys) = (master.clone(), a.clone(), keys.clone());
            std::thread::spawn(move || {
                master.p2p_register_owner(a.clone()).unwrap();
                master.p2p_add_keys(a.client, keys, vec![8]).unwrap()
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        // The monitor's second step.
        master.retire_client(a.client);
        let republished = owner_side.join().unwrap();
        assert_eq!(republished, vec![Ok(())]);
        assert_eq!(
            master.ping(a.client).unwrap().status,
            crate::types::ClientStatus::Ok
        );
        let routes = master.p2p_get_routes(keys).unwrap();
        assert_eq!(
            routes[0].as_ref().map(|r| r.owner.clone()),
            Ok(a),
            "the owner is alive but the master routes none of its keys"
        );
    }

    /// Within its route grace a master takes no new routes but routes as new the keys owners
    /// of a previous master reclaim.
    #[test]
    fn a_fresh_master_takes_reclaims_and_no_new_routes_within_its_grace() {
        let master = MasterService::new(MasterConfig {
            deployment_mode: DeploymentMode::P2p,
            p2p_route_grace_ms: 60_000,
            ..MasterConfig::default()
        });
        let a = owner(6000);
        master.p2p_register_owner(a.clone()).unwrap();
        let keys = vec!["k".to_string()];
        assert_eq!(
            master.p2p_add_keys(a.client, keys.clone(), vec![8]),
            Err(ErrorCode::ObjectReplicaBusy)
        );
        let view = master.ping(a.client).unwrap().view_version;
        let reclaimed = master.p2p_reclaim_keys(a.client, view ^ 1, keys.clone(), vec![8]);
        assert_eq!(reclaimed, Ok(vec![Ok(())]));
        let routes = master.p2p_get_routes(keys.clone()).unwrap();
        assert_eq!(routes[0].as_ref().map(|r| r.owner.clone()), Ok(a.clone()));
        // An owner that cannot vouch for its keys (view 0) keeps only what is routed to it
        // already (its earlier reclaim's answer was lost).
        let unvouched =
            master.p2p_reclaim_keys(a.client, 0, vec!["k".into(), "other".into()], vec![8, 8]);
        assert_eq!(unvouched, Ok(vec![Ok(()), Err(ErrorCode::ObjectNotFound)]));
    }

    /// The grace's end is decided under the route lock: once a new route was taken, no reclaim
    /// of an earlier master's owner follows, and a retried one keeps what it got.
    #[test]
    fn after_the_grace_reclaims_of_an_earlier_masters_owners_are_refused() {
        let master = MasterService::new(MasterConfig {
            deployment_mode: DeploymentMode::P2p,
            p2p_route_grace_ms: 1000,
            ..MasterConfig::default()
        });
        let (a, b) = (owner(7000), owner(8000));
        master.p2p_register_owner(a.clone()).unwrap();
        master.p2p_register_owner(b.clone()).unwrap();
        let view = master.ping(a.client).unwrap().view_version;
        let early = master.p2p_reclaim_keys(a.client, view ^ 1, vec!["early".into()], vec![4]);
        assert_eq!(early, Ok(vec![Ok(())]));
        std::thread::sleep(Duration::from_millis(1100));
        let new = master.p2p_add_keys(b.client, vec!["late".into()], vec![4]);
        assert_eq!(new, Ok(vec![Ok(())]));
        master
            .p2p_remove_keys(b.client, vec!["late".into()])
            .unwrap();
        let late = master.p2p_reclaim_keys(
            a.client,
            view ^ 1,
            vec!["early".into(), "late".into()],
            vec![4, 4],
        );
        assert_eq!(late, Ok(vec![Ok(()), Err(ErrorCode::ObjectNotFound)]));
    }

    /// An expired owner gets back, on reclaim, exactly the keys nobody routed while it was
    /// gone; a retried reclaim answers the same; a restarted master (another view) takes them
    /// all as new routes.
    #[test]
    fn a_reclaim_returns_only_the_keys_untouched_since_the_expiry() {
        let master = MasterService::new(MasterConfig {
            deployment_mode: DeploymentMode::P2p,
            client_ttl_ms: Some(3_600_000),
            ..MasterConfig::default()
        });
        let (a, b) = (owner(4000), owner(5000));
        master.p2p_register_owner(a.clone()).unwrap();
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let held = keys(&["kept", "taken", "rewritten", "resized", "dropped"]);
        master
            .p2p_add_keys(a.client, held.clone(), vec![8; 5])
            .unwrap();
        let view = master.ping(a.client).unwrap().view_version;
        let far = std::time::Instant::now() + Duration::from_secs(7_200);
        assert_eq!(
            master.clients.expire(far, Duration::from_secs(3_600)),
            vec![a.client]
        );
        master.retire_client(a.client);
        assert_eq!(master.metrics().p2p_claimed_keys, 5);
        // While a is gone: b takes one key, writes and removes another.
        master.p2p_register_owner(b.clone()).unwrap();
        let on_b = keys(&["taken", "rewritten"]);
        master.p2p_add_keys(b.client, on_b, vec![8, 8]).unwrap();
        master
            .p2p_remove_keys(b.client, keys(&["rewritten"]))
            .unwrap();
        master.p2p_register_owner(a.clone()).unwrap();
        // a's removal of a key it still claims ends the claim ("kept" is reclaimed below).
        assert_eq!(
            master
                .p2p_remove_keys(a.client, keys(&["dropped"]))
                .unwrap(),
            vec![Err(ErrorCode::ObjectNotFound)]
        );
        let sizes = vec![8, 8, 8, 9, 8];
        let expect = [
            Ok(()),
            Err(ErrorCode::ObjectNotFound),
            Err(ErrorCode::ObjectNotFound),
            Err(ErrorCode::ObjectNotFound),
            Err(ErrorCode::ObjectNotFound),
        ];
        for attempt in 0..2 {
            let answers = master
                .p2p_reclaim_keys(a.client, view, held.clone(), sizes.clone())
                .unwrap();
            assert_eq!(answers, expect, "attempt {attempt}");
        }
        assert_eq!(master.metrics().p2p_claimed_keys, 0);
        let routes = master.p2p_get_routes(held.clone()).unwrap();
        assert_eq!(routes[0].as_ref().map(|r| r.owner.clone()), Ok(a.clone()));
        assert_eq!(routes[1].as_ref().map(|r| r.owner.clone()), Ok(b.clone()));
        assert_eq!(routes[2], Err(ErrorCode::ObjectNotFound));
        assert_eq!(routes[3], Err(ErrorCode::ObjectNotFound));
        // Another view: this master is not the one a last saw and knows none of its claims;
        // without a route grace (or after it) they are refused.
        let restarted = master
            .p2p_reclaim_keys(a.client, view ^ 1, keys(&["resized"]), vec![9])
            .unwrap();
        assert_eq!(restarted, vec![Err(ErrorCode::ObjectNotFound)]);
        let bad = master.p2p_reclaim_keys(a.client, view, keys(&["x"]), vec![]);
        assert_eq!(bad, Err(ErrorCode::InvalidParams));
    }
}
