//! The accessor's view of the deployment: key → owner routes from the master (cached,
//! invalidated on failure), the list of owners (for choosing where a put goes) and one RPC
//! client per owner. Thread-safe; lookups of cached routes share a read lock.

use super::api::{PeerInterface, RemotePeer};
use crate::error::{fail, ErrorCode, Result};
use crate::master::MasterApi;
use crate::rpc::{RpcClient, Timeouts};
use crate::types::{P2pOwner, P2pRoute};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;

/// Cached routes beyond this many are dropped wholesale (the cache is only an optimisation).
const MAX_CACHED_ROUTES: usize = 1 << 16;

/// The RPC client of one owner.
pub(crate) type Peer = RemotePeer<RpcClient<PeerInterface>>;

/// A route and whether it came from the cache (a cached route may be stale: retry once).
pub(crate) type Routed = Result<(P2pRoute, bool)>;

pub(crate) struct Router {
    master: Arc<dyn MasterApi>,
    routes: RwLock<HashMap<String, P2pRoute>>,
    owners: RwLock<Vec<P2pOwner>>,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    timeouts: Timeouts,
}

impl Router {
    pub(crate) fn new(master: Arc<dyn MasterApi>) -> Router {
        Router {
            master,
            routes: RwLock::default(),
            owners: RwLock::default(),
            peers: Mutex::default(),
            timeouts: Timeouts::from_env(),
        }
    }

    /// The route of each key: cached ones first, the rest in one master call.
    pub(crate) fn routes(&self, keys: &[&str]) -> Vec<Routed> {
        let mut out: Vec<Option<Routed>> = {
            let cache = self.routes.read();
            keys.iter()
                .map(|k| cache.get(*k).map(|r| Ok((r.clone(), true))))
                .collect()
        };
        let missing: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
        if !missing.is_empty() {
            let asked = missing.iter().map(|&i| keys[i].to_string()).collect();
            match self.master.p2p_get_routes(asked) {
                Ok(answers) => {
                    let mut cache = self.routes.write();
                    if cache.len() > MAX_CACHED_ROUTES {
                        cache.clear();
                    }
                    for (&i, answer) in missing.iter().zip(answers) {
                        if let Ok(route) = &answer {
                            cache.insert(keys[i].to_string(), route.clone());
                        }
                        out[i] = Some(answer.map(|r| (r, false)));
                    }
                }
                Err(code) => missing.iter().for_each(|&i| out[i] = Some(Err(code))),
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(ErrorCode::InternalError)))
            .collect()
    }

    /// Drops `key`'s cached route.
    pub(crate) fn invalidate(&self, key: &str) {
        self.routes.write().remove(key);
    }

    /// Remembers that `key` now lives at `owner` (after a successful put).
    pub(crate) fn remember(&self, key: &str, owner: &P2pOwner, size: u64) {
        let mut cache = self.routes.write();
        if cache.len() <= MAX_CACHED_ROUTES {
            let route = P2pRoute {
                owner: owner.clone(),
                size,
            };
            cache.insert(key.to_string(), route);
        }
    }

    /// Forgets the owner list (after a failure talking to an owner).
    pub(crate) fn forget_owners(&self) {
        self.owners.write().clear();
    }

    fn owner_list(&self) -> Result<Vec<P2pOwner>> {
        let cached = self.owners.read().clone();
        if !cached.is_empty() {
            return Ok(cached);
        }
        let fresh = self.master.p2p_list_owners()?;
        *self.owners.write() = fresh.clone();
        Ok(fresh)
    }

    /// Where a put goes: the owner named `preferred` (segment name or RPC address); else
    /// ourselves when we store data (`me`); else a random live owner.
    ///
    /// Errors: `SEGMENT_NOT_FOUND` when no (such) owner is registered; master errors.
    pub(crate) fn owner_for_put(
        &self,
        preferred: Option<&str>,
        me: Option<&P2pOwner>,
    ) -> Result<P2pOwner> {
        let matches = |o: &P2pOwner, name: &str| o.name == name || o.rpc_addr == name;
        match (preferred, me) {
            (Some(name), Some(me)) if matches(me, name) => return Ok(me.clone()),
            (None, Some(me)) => return Ok(me.clone()),
            _ => {}
        }
        let mut owners = self.owner_list()?;
        if let Some(name) = preferred {
            if !owners.iter().any(|o| matches(o, name)) {
                self.forget_owners();
                owners = self.owner_list()?;
            }
            owners.retain(|o| matches(o, name));
        }
        match owners.len() {
            0 => fail(
                ErrorCode::SegmentNotFound,
                format!("no P2P owner {}", preferred.unwrap_or("is registered")),
            ),
            n => Ok(owners.swap_remove(fastrand::usize(..n))),
        }
    }

    /// The RPC client of `owner` (created on first use; it reconnects by itself).
    pub(crate) fn peer(&self, owner: &P2pOwner) -> Arc<Peer> {
        let mut peers = self.peers.lock();
        let peer = peers.entry(owner.rpc_addr.clone()).or_insert_with(|| {
            Arc::new(RemotePeer(RpcClient::new(&owner.rpc_addr, self.timeouts)))
        });
        Arc::clone(peer)
    }
}
