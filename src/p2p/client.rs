//! [`P2pClient`]: a client of a P2P (V3) deployment. It is a separate type from
//! [`crate::client::Client`] rather than a mode of it: the two share the transfer engine and
//! the master trait, but nothing of their storage model (mounted segments and master-placed
//! replicas vs. an own TieredBackend and owner-served keys), so one type with a mode flag
//! would branch in every operation.
//!
//! Roles: every P2pClient is an *accessor*; one with tiers is also an *owner*: it runs the
//! client RPC service ([`super::api::PeerApi`] over its DataManager), registers with the
//! master, pings it every second, and scans its record tables every scan interval.

use super::accessor::{Accessor, FaultInjection};
use super::api::{PeerApi, PeerInterface};
use super::config::{P2pSetupConfig, TransferDirection};
use super::counters::{bump, Counters, P2pCounters};
use super::owner::{DataManager, OwnerParts};
use super::routing::Router;
use super::tiered::TieredBackend;
use crate::error::{fail, ErrorCode, Result};
use crate::master::{MasterApi, MasterConfig, Workers};
use crate::node::{publish_endpoint, start_engine, LivenessHook, LocalBuffer, MasterLink};
use crate::rpc::{self, RpcServer};
use crate::transfer::{TransferEngine, TransferMetrics};
use crate::types::{ClientStatus, P2pOwner, PingResponse, Uuid};
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// The keys of one batch that live at one owner: (index, size, route was cached).
type OwnerGroup = (P2pOwner, Vec<(usize, u64, bool)>);

/// Per-request options of puts and gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// FORWARD or REVERSE; `None` uses the client's `p2p_transfer_direction_mode`.
    pub direction: Option<TransferDirection>,
    /// Puts only: the owner to write to (its segment name or RPC address). `None`: this
    /// client when it has tiers, else a random live owner.
    pub preferred_owner: Option<String>,
}

impl RequestOptions {
    /// Options with only a direction.
    pub fn direction(direction: TransferDirection) -> RequestOptions {
        RequestOptions {
            direction: Some(direction),
            preferred_owner: None,
        }
    }
}

/// A set-up P2P client. Cheap to clone; `Send + Sync`; every method takes `&self`. Buffers
/// are borrowed for the duration of a call only. After [`P2pClient::teardown`] operations
/// fail with `INVALID_PARAMS`.
#[derive(Clone)]
pub struct P2pClient {
    inner: Arc<Inner>,
}

struct Inner {
    master: Arc<dyn MasterApi>,
    /// The master connection and the liveness loop of an owner.
    link: MasterLink,
    engine: Arc<TransferEngine>,
    owner: Option<Arc<DataManager>>,
    me: Option<P2pOwner>,
    rpc: Option<RpcServer>,
    router: Router,
    accessor: Accessor,
    counters: Arc<Counters>,
    faults: Arc<FaultInjection>,
    direction: TransferDirection,
    workers: Workers,
    closed: AtomicBool,
    metadata: Option<crate::metadata::MetadataClient>,
}

impl P2pClient {
    /// Mooncake's `setup_p2p_real_client`: connects to a P2P master, starts the transfer
    /// engine, builds the TieredBackend and — when it has tiers — starts the client RPC
    /// service on `client_rpc_port` and registers as an owner.
    ///
    /// Errors: `INVALID_PARAMS` for bad arguments or tier JSON (detail in
    /// `last_error_message`); `UNAVAILABLE_IN_CURRENT_MODE` when the master is not in P2P
    /// mode; RPC errors reaching the master; `RPC_FAIL` when the RPC port cannot be bound;
    /// `INTERNAL_ERROR` when memory cannot be mapped.
    pub fn setup_p2p(config: P2pSetupConfig) -> Result<P2pClient> {
        let settings = config.validate()?;
        let link = MasterLink::open(&settings.base.master_server_addr, MasterConfig::default())?;
        let master = Arc::clone(link.api());
        master.p2p_list_owners().or_else(|code| {
            fail(
                code,
                "the master does not run in P2P mode (--deployment_mode P2P)",
            )
        })?;
        let (hostname, engine, metadata) = start_engine(&settings.base, &settings.metadata)?;
        publish_endpoint(metadata.as_ref(), &hostname, &engine, None)?;
        let id = Uuid::random();
        let counters = Arc::new(Counters::default());
        let backend = TieredBackend::new(&settings.tiers, &engine, settings.shard_count)?;
        let staging = match settings.base.local_buffer_size {
            0 => None,
            size => Some(Arc::new(LocalBuffer::with_access(size, &engine, true)?)),
        };
        let (owner, rpc, me) = if backend.has_tiers() {
            let manager = Arc::new(DataManager::new(OwnerParts {
                backend,
                engine: Arc::clone(&engine),
                master: Arc::clone(&master),
                id,
                lease: settings.lease,
                shards: settings.shard_count,
                counters: Arc::clone(&counters),
                quarantine: settings.quarantine,
            }));
            let host = hostname
                .rsplit_once(':')
                .map_or(hostname.as_str(), |(h, _)| h);
            let service: Arc<dyn PeerApi> = manager.clone();
            let server = RpcServer::serve::<PeerInterface>(
                rpc_socket(host, config.client_rpc_port)?,
                service,
                settings.rpc_threads,
            )?;
            let me = P2pOwner {
                client: id,
                name: hostname.clone(),
                rpc_addr: format!("{host}:{}", server.local_addr().port()),
            };
            master.p2p_register_owner(me.clone())?;
            // The master's view, so a later re-registration can tell an expiry by this master
            // (it keeps our claims) from a restart.
            let sent_at = std::time::Instant::now();
            let answer = master.ping(id)?;
            let registration = manager.registration();
            registration.confirm(sent_at, answer.view_version, answer.client_ttl_ms);
            (Some(manager), Some(server), Some(me))
        } else {
            (None, None, None)
        };
        let faults = Arc::new(FaultInjection::default());
        let inner = Arc::new(Inner {
            router: Router::new(Arc::clone(&master)),
            accessor: Accessor::new(
                Arc::clone(&engine),
                staging,
                Arc::clone(&counters),
                Arc::clone(&faults),
                settings.quarantine,
                rpc::Timeouts::from_env().request,
            ),
            master,
            link,
            engine,
            owner,
            me,
            rpc,
            counters,
            faults,
            direction: config.p2p_transfer_direction_mode,
            workers: Workers::default(),
            closed: AtomicBool::new(false),
            metadata,
        });
        if let Some(owner) = &inner.owner {
            let scan = settings.scan_interval;
            inner.workers.spawn(
                "mc-p2p-scan",
                scan,
                Arc::downgrade(owner),
                DataManager::scan,
            );
            let hook: Weak<dyn LivenessHook> = Arc::downgrade(&inner) as Weak<Inner>;
            inner.link.start_liveness(id, hook);
        }
        tracing::info!(name = %inner.engine.local_name(), owner = inner.me.is_some(), "P2P client set up");
        Ok(P2pClient { inner })
    }

    /// This client's segment name (`host:port` of its data server).
    pub fn hostname(&self) -> String {
        self.inner.engine.local_name().to_string()
    }

    /// This client as the master lists it, when it is an owner.
    pub fn owner_info(&self) -> Option<P2pOwner> {
        self.inner.me.clone()
    }

    /// The live owners, from the master.
    pub fn owners(&self) -> Result<Vec<P2pOwner>> {
        self.inner.check_open()?;
        self.inner.master.p2p_list_owners()
    }

    /// Test hooks of the FORWARD path.
    pub fn faults(&self) -> &FaultInjection {
        &self.inner.faults
    }

    /// This client's counters (accessor side, and owner side with gauges when it has tiers).
    pub fn counters(&self) -> P2pCounters {
        let mut snapshot = self.inner.counters.snapshot();
        if let Some(owner) = &self.inner.owner {
            owner.fill_gauges(&mut snapshot);
        }
        snapshot
    }

    /// A snapshot of this client's transfer-engine counters (which route moved the bytes:
    /// `tcp_*`, `served_*`, `rdma_*`). Thread-safe; never fails.
    pub fn transfer_metrics(&self) -> TransferMetrics {
        self.inner.engine.metrics()
    }

    /// The counters of the owner whose segment name or RPC address is `owner`.
    ///
    /// Errors: `SEGMENT_NOT_FOUND` for an unknown owner; RPC errors.
    pub fn owner_counters(&self, owner: &str) -> Result<P2pCounters> {
        self.inner.check_open()?;
        let owner = self.inner.router.owner_for_put(Some(owner), None)?;
        self.inner.router.peer(&owner).counters()
    }

    /// Stores `value` as `key`. Errors: `OBJECT_ALREADY_EXISTS`, `OBJECT_REPLICA_BUSY` (a
    /// concurrent put of the key), `NO_AVAILABLE_HANDLE`, `LEASE_EXPIRED` (FORWARD commit
    /// after the lease), `TRANSFER_FAIL`, RPC errors, `INVALID_PARAMS`.
    pub fn put(&self, key: &str, value: &[u8], options: &RequestOptions) -> Result<()> {
        self.batch_put(&[key], &[value], options)
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// Stores `values[i]` as `keys[i]` on one owner; one result per key, in order.
    pub fn batch_put(
        &self,
        keys: &[&str],
        values: &[&[u8]],
        options: &RequestOptions,
    ) -> Vec<Result<()>> {
        let inner = &self.inner;
        if let Err(code) = inner.check_batch(keys.len(), values.len()) {
            return vec![Err(code); keys.len()];
        }
        let preferred = options.preferred_owner.as_deref();
        let owner = match inner.router.owner_for_put(preferred, inner.me.as_ref()) {
            Ok(owner) => owner,
            Err(code) => return vec![Err(code); keys.len()],
        };
        let results = match (&inner.owner, Some(&owner) == inner.me.as_ref()) {
            (Some(local), true) => keys
                .iter()
                .zip(values)
                .map(|(key, value)| {
                    bump(&inner.counters.local_ops);
                    local.put_local(key, value)
                })
                .collect(),
            _ => {
                let peer = inner.router.peer(&owner);
                let results = match options.direction.unwrap_or(inner.direction) {
                    TransferDirection::Forward => inner.accessor.forward_put(&*peer, keys, values),
                    TransferDirection::Reverse => inner.accessor.reverse_put(&*peer, keys, values),
                };
                if results
                    .iter()
                    .any(|r| matches!(r, Err(ErrorCode::RpcFail | ErrorCode::RpcTimeout)))
                {
                    inner.router.forget_owners();
                }
                results
            }
        };
        for ((key, value), result) in keys.iter().zip(values).zip(&results) {
            if result.is_ok() {
                inner.router.remember(key, &owner, value.len() as u64);
            }
        }
        results
    }

    /// Reads `key` into `buffer`; returns the value size. Errors: `OBJECT_NOT_FOUND`,
    /// `INVALID_PARAMS` (buffer too small), `LEASE_EXPIRED` (FORWARD read outlived its pin),
    /// `TRANSFER_FAIL`, RPC errors.
    pub fn get_into(&self, key: &str, buffer: &mut [u8], options: &RequestOptions) -> Result<u64> {
        self.batch_get_into(&[key], &mut [buffer], options)
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// Reads `key` into a new vector.
    pub fn get(&self, key: &str, options: &RequestOptions) -> Result<Vec<u8>> {
        self.batch_get(&[key], options)
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))
    }

    /// Reads each key into a new vector sized from its route.
    pub fn batch_get(&self, keys: &[&str], options: &RequestOptions) -> Vec<Result<Vec<u8>>> {
        let sizes: Vec<Result<u64>> = self
            .inner
            .router
            .routes(keys)
            .into_iter()
            .map(|r| r.map(|(route, _)| route.size))
            .collect();
        let mut values: Vec<Vec<u8>> = sizes
            .iter()
            .map(|s| vec![0u8; *s.as_ref().unwrap_or(&0) as usize])
            .collect();
        let mut views: Vec<&mut [u8]> = values.iter_mut().map(|v| v.as_mut_slice()).collect();
        let read = self.batch_get_into(keys, &mut views, options);
        read.into_iter()
            .zip(values)
            .zip(sizes)
            .map(|((outcome, mut value), size)| {
                size?;
                value.truncate(outcome? as usize);
                Ok(value)
            })
            .collect()
    }

    /// Reads `keys[i]` into `buffers[i]`; per key the value size. Keys are grouped by owner,
    /// one group per owner; a key whose cached route failed is looked up again once.
    pub fn batch_get_into(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
        options: &RequestOptions,
    ) -> Vec<Result<u64>> {
        let inner = &self.inner;
        if let Err(code) = inner.check_batch(keys.len(), buffers.len()) {
            return vec![Err(code); keys.len()];
        }
        let direction = options.direction.unwrap_or(inner.direction);
        let all: Vec<usize> = (0..keys.len()).collect();
        let (mut results, retry) = inner.get_pass(keys, buffers, &all, direction);
        for &i in &retry {
            inner.router.invalidate(keys[i]);
        }
        if !retry.is_empty() {
            let (again, _) = inner.get_pass(keys, buffers, &retry, direction);
            for i in retry {
                results[i] = again[i];
            }
        }
        results
    }

    /// Whether `key` exists (asks the master).
    pub fn is_exist(&self, key: &str) -> Result<bool> {
        self.inner.check_open()?;
        match self
            .inner
            .master
            .p2p_get_routes(vec![key.to_string()])?
            .pop()
        {
            Some(Ok(_)) => Ok(true),
            Some(Err(ErrorCode::ObjectNotFound)) => Ok(false),
            Some(Err(code)) => Err(code),
            None => Err(ErrorCode::RpcFail),
        }
    }

    /// Size of `key` (from its route).
    pub fn get_size(&self, key: &str) -> Result<u64> {
        self.inner.check_open()?;
        let route = self.inner.router.routes(&[key]).pop();
        route
            .unwrap_or(Err(ErrorCode::InternalError))
            .map(|(r, _)| r.size)
    }

    /// Removes `key` at its owner (its bytes go when the last pin ends) and its route.
    pub fn remove(&self, key: &str) -> Result<()> {
        let inner = &self.inner;
        inner.check_open()?;
        inner.router.invalidate(key);
        let (route, _) = inner
            .router
            .routes(&[key])
            .pop()
            .unwrap_or(Err(ErrorCode::InternalError))?;
        inner.router.invalidate(key);
        let answers = match (&inner.owner, Some(&route.owner) == inner.me.as_ref()) {
            (Some(local), true) => local.remove_data(vec![key.to_string()]),
            _ => inner
                .router
                .peer(&route.owner)
                .remove_data(vec![key.to_string()]),
        };
        answers?.pop().unwrap_or(Err(ErrorCode::RpcFail))
    }

    /// Stops the background threads and the RPC service, withdraws this owner's routes from
    /// the master and stops the transfer engine. Idempotent.
    pub fn teardown(&self) {
        self.inner.shutdown();
    }
}

fn rpc_socket(host: &str, port: u16) -> Result<SocketAddr> {
    match (host, port).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(addr)) => Ok(addr),
        _ => fail(
            ErrorCode::InvalidParams,
            format!("cannot resolve {host} for the client RPC service"),
        ),
    }
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return fail(ErrorCode::InvalidParams, "P2P client is torn down");
        }
        Ok(())
    }

    fn check_batch(&self, keys: usize, values: usize) -> Result<()> {
        self.check_open()?;
        if keys != values {
            return fail(
                ErrorCode::InvalidParams,
                format!("{keys} keys but {values} buffers"),
            );
        }
        Ok(())
    }

    /// One pass of a batch get over the keys at `indices`; returns a result for every key
    /// (untouched ones `INTERNAL_ERROR`) and the indices worth a retry with a fresh route.
    fn get_pass(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
        indices: &[usize],
        direction: TransferDirection,
    ) -> (Vec<Result<u64>>, Vec<usize>) {
        let mut results = vec![Err(ErrorCode::InternalError); keys.len()];
        let asked: Vec<&str> = indices.iter().map(|&i| keys[i]).collect();
        let mut groups: HashMap<String, OwnerGroup> = HashMap::new();
        for (&i, routed) in indices.iter().zip(self.router.routes(&asked)) {
            match routed {
                Ok((route, cached)) => {
                    let entry = groups
                        .entry(route.owner.rpc_addr.clone())
                        .or_insert_with(|| (route.owner.clone(), Vec::new()));
                    entry.1.push((i, route.size, cached));
                }
                Err(code) => results[i] = Err(code),
            }
        }
        let mut slots: Vec<Option<&mut [u8]>> =
            buffers.iter_mut().map(|b| Some(&mut **b)).collect();
        let mut retry = Vec::new();
        for (owner, members) in groups.into_values() {
            let group_keys: Vec<&str> = members.iter().map(|m| keys[m.0]).collect();
            let mut views: Vec<&mut [u8]> =
                members.iter().filter_map(|m| slots[m.0].take()).collect();
            if views.len() != members.len() {
                continue;
            }
            let outcomes = match (&self.owner, Some(&owner) == self.me.as_ref()) {
                (Some(local), true) => group_keys
                    .iter()
                    .zip(views.iter_mut())
                    .map(|(key, view)| {
                        bump(&self.counters.local_ops);
                        local.get_local(key, view)
                    })
                    .collect(),
                _ => {
                    let peer = self.router.peer(&owner);
                    match direction {
                        TransferDirection::Forward => {
                            self.accessor.forward_get(&*peer, &group_keys, &mut views)
                        }
                        TransferDirection::Reverse => {
                            let sizes: Vec<u64> = members.iter().map(|m| m.1).collect();
                            self.accessor
                                .reverse_get(&*peer, &group_keys, &sizes, &mut views)
                        }
                    }
                }
            };
            for ((i, _, cached), outcome) in members.into_iter().zip(outcomes) {
                let stale = matches!(
                    outcome,
                    Err(ErrorCode::ObjectNotFound | ErrorCode::RpcFail | ErrorCode::RpcTimeout)
                );
                if stale {
                    self.router.invalidate(keys[i]);
                    if cached {
                        retry.push(i);
                    }
                }
                results[i] = outcome;
            }
        }
        (results, retry)
    }

    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.workers.stop();
        self.link.stop_liveness();
        if let Some(rpc) = &self.rpc {
            rpc.shutdown();
        }
        if let (Some(me), Some(owner)) = (&self.me, &self.owner) {
            let keys: Vec<String> = owner.keys().into_iter().map(|(k, _)| k).collect();
            if !keys.is_empty() {
                if let Err(code) = self.master.p2p_remove_keys(me.client, keys) {
                    tracing::warn!(%code, "could not withdraw our routes at teardown");
                }
            }
        }
        if let Some(meta) = &self.metadata {
            if let Err(code) = meta.remove_segment(self.engine.local_name()) {
                tracing::warn!(%code, "could not remove our metadata entries");
            }
        }
        self.engine.shutdown();
        tracing::info!(name = %self.engine.local_name(), "P2P client torn down");
    }
}

impl LivenessHook for Inner {
    /// An owner's answer: re-registers with a master that forgot us, reclaiming our keys and
    /// dropping those it refused (written, taken or removed while we were gone), and confirms
    /// our standing ([`super::registration`]) only once the master knows all our keys.
    fn on_answer(&self, sent_at: Instant, answer: &PingResponse) -> Result<()> {
        let (Some(me), Some(owner)) = (&self.me, &self.owner) else {
            return Ok(());
        };
        let registration = owner.registration();
        let answered_at = Instant::now();
        if answer.status == ClientStatus::NeedRemount {
            tracing::warn!("master forgot this owner; registering again with its keys");
            registration.forgotten();
            self.master.p2p_register_owner(me.clone())?;
        }
        if registration.must_republish() {
            // Another master's view, and the old one's client TTL ran out since it last
            // confirmed us: it may have expired us and routed our keys elsewhere (and removed
            // them) before it died, which this one cannot know. View 0 says so: it keeps only
            // what it already routes to us.
            let mut view = registration.view();
            if view != answer.view_version && !registration.vouches_at(answered_at) {
                view = 0;
            }
            let dropped = owner.reclaim(view)?;
            if dropped > 0 {
                tracing::warn!(dropped, "dropped keys the master no longer routes to us");
            }
            registration.republished();
        }
        registration.confirm(sent_at, answer.view_version, answer.client_ttl_ms);
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}
