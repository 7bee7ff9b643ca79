//! [`Client`]: one set-up client (Mooncake's RealClient after `setup_real`), its resources and
//! its life cycle. The operations live in sibling modules as further `impl Client` blocks.

use super::counters::ClientCounters;
use super::location_cache::LocationCache;
use super::revocation_poll::RevocationPoll;
use super::session_table::Sessions;
use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use crate::master::{ForwardMaster, MasterApi, MasterConfig};
use crate::node::{
    publish_endpoint, start_dummy_engine, start_engine, DemotionSource, DiskReaders,
    DiskTierSettings, LivenessHook, LocalBuffer, MasterLink, OwnDiskTier, OwnSegment, SetupConfig,
    SEGMENT_FILE,
};
use crate::standalone::DummyLink;
use crate::stream::{StreamConfig, StreamEngine};
use crate::transfer::{MountHold, TransferEngine};
use crate::types::{BufferDescriptor, ClientId, ClientStatus, PingResponse, Segment, Uuid};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// `health_check` answers (Mooncake's `HealthCheckStatus`).
pub mod health {
    /// Set up, and the last master ping (if any) succeeded.
    pub const HEALTHY: i32 = 0;
    /// Not set up, or torn down.
    pub const NOT_INITIALIZED: i32 = 1;
    /// The last master ping failed.
    pub const MASTER_UNREACHABLE: i32 = 2;
}

/// A set-up client. Cheap to clone (an `Arc`); every method takes `&self` and is safe to call
/// from many threads at once. After [`Client::teardown`] every operation fails with
/// `INVALID_PARAMS`; memory that in-flight operations still use stays mapped until they end.
#[derive(Clone)]
pub struct Client {
    pub(super) core: Arc<ClientCore>,
}

/// The client's state, shared by its clones and its liveness thread.
pub(super) struct ClientCore {
    pub(super) id: ClientId,
    pub(super) hostname: String,
    /// The master for every call this client makes (counted, called directly).
    pub(super) master: Arc<dyn MasterApi>,
    /// Which master, and the liveness loop that keeps this client alive there.
    link: MasterLink,
    pub(super) engine: Arc<TransferEngine>,
    pub(super) segment: Option<OwnSegment>,
    /// The SSD tier this client owns (`ssd_offload_path`), if any.
    disk: Option<OwnDiskTier>,
    /// Reads LOCAL_DISK replicas (ours, or other owners').
    pub(super) disk_readers: DiskReaders,
    pub(super) local_buffer: Option<Arc<LocalBuffer>>,
    pub(super) sessions: Sessions,
    pub(super) streams: StreamEngine,
    pub(super) counters: ClientCounters,
    closed: AtomicBool,
    metadata: Option<crate::metadata::MetadataClient>,
    /// A dummy's link to its real client (see `dummy.rs`); `None` for a real client.
    pub(super) dummy: Option<Arc<DummyLink>>,
    /// Replica lists served without asking the master (`docs/location-cache.md`).
    pub(super) locations: Arc<LocationCache>,
    /// The cache's revocation poll, while the cache is on and the client open.
    revocation_poll: parking_lot::Mutex<Option<RevocationPoll>>,
}

impl Client {
    /// Sets up a client: connects to (or creates) the master, starts the transfer engine,
    /// mounts a `global_segment_size` segment and registers a `local_buffer_size` local buffer.
    /// A client of a remote master (with or without a segment) then pings it every second on
    /// a connection of its own (`MC_PING_TIMEOUT_MS`, see the `heartbeat` module); an embedded
    /// client is kept alive by its master and does not ping.
    /// Both are pre-faulted and, when a device runtime is present, pinned with it (best
    /// effort: a refusal is a warning and a metric, never an error; unpinned when the client
    /// is dropped; see [`crate::device::HostRegistration`]).
    ///
    /// Errors: `INVALID_PARAMS` for bad arguments (see [`SetupConfig::validate`]) or another
    /// cluster key file than the process's; `FILE_OPEN_FAIL` / `AUTH_FAILED` for a key file
    /// that cannot be loaded; `INTERNAL_ERROR` when no port could be bound; RPC errors /
    /// `INVALID_VERSION` / `AUTH_FAILED` from the master connection.
    pub fn setup(config: SetupConfig) -> Result<Client> {
        let embedded = MasterConfig {
            offload_at_put: crate::env::OFFLOAD_AT_PUT.flag(),
            promotion_on_hit: crate::env::PROMOTION_ON_HIT.flag(),
            ..MasterConfig::default()
        };
        Client::setup_with(config, embedded)
    }

    /// [`Client::setup`], with `embedded_config` configuring the in-process master when
    /// `config` selects one (ignored otherwise). Errors as [`Client::setup`].
    pub(super) fn setup_with(config: SetupConfig, embedded_config: MasterConfig) -> Result<Client> {
        Client::assemble(config, embedded_config, None)
    }

    /// [`Client::setup_with`]; with `dummy` a dummy client: no listener, every transfer
    /// through the link, the local buffer in shared memory, the segment name `""`.
    pub(super) fn assemble(
        config: SetupConfig,
        embedded_config: MasterConfig,
        dummy: Option<Arc<DummyLink>>,
    ) -> Result<Client> {
        let metadata_mode = config.validate()?;
        config.use_cluster_key()?;
        let link = MasterLink::open(&config.master_server_addr, embedded_config)?;
        let counters = ClientCounters::default();
        // Every master call is counted on its way, called directly (the embedded master is
        // never encoded); the liveness pings have their own connection and are not counted.
        let calls = Arc::clone(&counters.master_calls);
        let master: Arc<dyn MasterApi> =
            Arc::new(ForwardMaster::new(link.api().clone(), move || {
                calls.fetch_add(1, Ordering::Relaxed);
            }));
        let (hostname, engine, metadata) = match &dummy {
            Some(link) => start_dummy_engine(link)?,
            None => start_engine(&config, &metadata_mode)?,
        };
        let id = Uuid::random();
        let local_buffer = match (config.local_buffer_size, &dummy) {
            (0, _) => None,
            (size, Some(_)) => Some(Arc::new(LocalBuffer::shared(size, &engine)?)),
            (size, None) => Some(Arc::new(LocalBuffer::new(size, &engine)?)),
        };
        let segment = match config.global_segment_size {
            0 => None,
            size => {
                // Mooncake answers a segment it cannot allocate with INVALID_PARAMS.
                let region = MappedRegion::shared_pinned(size, SEGMENT_FILE).or_else(|_| {
                    fail(ErrorCode::InvalidParams, crate::error::last_error_message())
                })?;
                engine.register(region.addr(), region.len(), true)?;
                let segment = Segment {
                    id: Uuid::random(),
                    name: hostname.clone(),
                    base: region.addr() as u64,
                    size,
                    protocol: if config.uses_rdma() { "rdma" } else { "tcp" }.into(),
                    epoch: 0,
                };
                Some(OwnSegment::new(segment, region))
            }
        };
        let disk = match (config.ssd_offload_path.as_str(), &dummy) {
            ("", _) | (_, Some(_)) => None,
            (dir, None) => {
                let host = hostname
                    .rsplit_once(':')
                    .map_or(hostname.as_str(), |(h, _)| h);
                Some(OwnDiskTier::open(&DiskTierSettings::from_env(dir), host)?)
            }
        };
        let disk_readers = DiskReaders::new(id, disk.as_ref());
        let own = segment.as_ref().map(OwnSegment::current);
        publish_endpoint(metadata.as_ref(), &hostname, &engine, own.as_ref())?;
        let streams = StreamEngine::start(StreamConfig::from_env(), &engine)?;
        let core = Arc::new(ClientCore {
            id,
            hostname,
            master,
            link,
            engine,
            segment,
            disk,
            disk_readers,
            local_buffer,
            sessions: Sessions::default(),
            streams,
            counters,
            closed: AtomicBool::new(false),
            metadata,
            dummy,
            locations: Arc::new(LocationCache::from_env()),
            revocation_poll: parking_lot::Mutex::new(None),
        });
        // The in-process master's own client cannot be dead while it runs: never expired (a
        // process stall would otherwise race its monitor against the mount).
        core.link.never_expire(core.id);
        if let Some(own) = &core.segment {
            let mounted = own
                .next_mount(&core.engine, false)
                .and_then(|segment| core.master.mount_segment(core.id, segment));
            if let Err(e) = mounted {
                core.shutdown();
                return Err(e);
            }
        }
        // Every client of a remote master pings, segment or not: the master expires clients
        // that stop pinging, and releases their pins. One without a segment registers first,
        // so its pings are answered Ok and prove that its pins are held (`check_pins_held`).
        if core.segment.is_none() && !core.link.is_embedded() {
            if let Err(e) = core.master.register_client(core.id) {
                core.shutdown();
                return Err(e);
            }
        }
        if let Some(disk) = &core.disk {
            let source: Weak<dyn DemotionSource> = Arc::downgrade(&core) as Weak<ClientCore>;
            if let Err(e) = disk.start(Arc::clone(&core.master), core.id, source) {
                core.shutdown();
                return Err(e);
            }
        }
        if core.locations.enabled() {
            *core.revocation_poll.lock() = Some(RevocationPoll::start(
                core.id,
                Arc::clone(core.link.api()),
                Arc::clone(&core.locations),
            ));
        }
        let hook: Weak<dyn LivenessHook> = Arc::downgrade(&core) as Weak<ClientCore>;
        core.link.start_liveness(core.id, hook);
        tracing::info!(name = %core.hostname, client = %core.id, embedded = core.link.is_embedded(), "client set up");
        Ok(Client { core })
    }

    /// Mooncake's `initAll(protocol, device_name, mount_segment_size)`: an embedded client
    /// named `localhost` with a 1 GiB local buffer.
    pub fn init_all(protocol: &str, device_name: &str, mount_segment_size: u64) -> Result<Client> {
        Client::setup(SetupConfig {
            local_hostname: "localhost".into(),
            metadata_server: crate::types::P2P_HANDSHAKE.into(),
            global_segment_size: mount_segment_size,
            local_buffer_size: 1 << 30,
            protocol: protocol.into(),
            device_name: device_name.into(),
            master_server_addr: crate::types::EMBEDDED_MASTER.into(),
            ..SetupConfig::default()
        })
    }

    /// Unmounts the segment (its objects disappear cluster-wide), stops the heartbeat and the
    /// transfer engine. Idempotent; always succeeds.
    pub fn teardown(&self) {
        self.core.shutdown();
    }

    /// 0 healthy, 1 torn down, 2 the last master ping failed (a dummy: or the last call or
    /// ping to its real client).
    pub fn health_check(&self) -> i32 {
        let link_down = self.core.dummy.as_ref().is_some_and(|l| !l.is_healthy());
        if self.core.closed.load(Ordering::Acquire) {
            health::NOT_INITIALIZED
        } else if self.core.link.is_reachable() && !link_down {
            health::HEALTHY
        } else {
            health::MASTER_UNREACHABLE
        }
    }

    /// This client's segment name (`host:port` once a port was chosen).
    pub fn get_hostname(&self) -> String {
        self.core.hostname.clone()
    }

    /// This client's identity at the master.
    pub fn id(&self) -> ClientId {
        self.core.id
    }

    /// Registers caller memory `[addr, addr + len)` for zero-copy use (not remotely
    /// accessible). `INVALID_PARAMS` on NULL, zero length or overlap with a registered range.
    pub fn register_buffer(&self, addr: usize, len: usize) -> Result<()> {
        self.core.check_open()?;
        if addr == 0 || len == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "register_buffer: NULL buffer or zero size",
            );
        }
        if let Some(link) = &self.core.dummy {
            link.check_shared(addr, len as u64)?;
        }
        self.core.engine.register(addr, len, false)
    }

    /// The registered range (`register_buffer` region, local buffer or mounted segment)
    /// containing byte `addr`, as `(base, len)`; `None` when no registered range holds it.
    /// Bindings that take bare addresses (the Python module) use it to learn a buffer's
    /// capacity and to tell registered memory from arbitrary pointers. Thread-safe.
    pub fn registered_region(&self, addr: usize) -> Option<(usize, u64)> {
        self.core
            .engine
            .region_containing(addr)
            .map(|r| (r.base, r.len as u64))
    }

    /// Undoes [`Client::register_buffer`]; `INVALID_PARAMS` for an unknown address.
    pub fn unregister_buffer(&self, addr: usize) -> Result<()> {
        self.core.check_open()?;
        self.core.engine.unregister(addr)
    }
}

impl ClientCore {
    /// `INVALID_PARAMS` once torn down.
    pub(super) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return fail(ErrorCode::InvalidParams, "client is not set up (torn down)");
        }
        Ok(())
    }

    /// Holds the mount of our own segment that `buffer` (a replica in it) names, for a copy
    /// queued on a stream; see [`TransferEngine::hold_mount`]. Errors: `STALE_SEGMENT_EPOCH`
    /// when the replica belongs to an earlier mount or the segment is being remounted.
    pub(super) fn hold_mount(&self, buffer: &BufferDescriptor) -> Result<MountHold> {
        let (addr, len) = (buffer.buffer_address, buffer.size);
        match self
            .engine
            .hold_mount(addr as usize, len as usize, buffer.epoch)
        {
            Some(hold) => Ok(hold),
            None => fail(
                ErrorCode::StaleSegmentEpoch,
                format!(
                    "{addr:#x}+{len} of our segment's mount {:#x} is not the current mount, \
                     or a remount of it is waiting",
                    buffer.epoch
                ),
            ),
        }
    }

    /// Whether the pins this client asked for at `pinned_at` (or later) are certainly still
    /// held by the master now: call after a copy that relied on them, before reporting it.
    /// Errors: `LEASE_EXPIRED` when the master may have expired this client (and released
    /// its pins) since (`node/standing.rs`).
    pub(super) fn check_pins_held(&self, pinned_at: Instant) -> Result<()> {
        self.link.standing().check_since(pinned_at)
    }

    /// The SSD tier's counters, if this client owns one.
    pub(super) fn disk_stats(&self) -> Option<crate::storage::DiskStats> {
        self.disk.as_ref().map(OwnDiskTier::stats)
    }

    /// Whether the mounted segment is registered with the device runtime (device streams
    /// may then copy straight from it).
    pub(super) fn segment_is_pinned(&self) -> bool {
        self.segment.as_ref().is_some_and(OwnSegment::is_pinned)
    }

    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.link.stop_liveness();
        if let Some(mut poll) = self.revocation_poll.lock().take() {
            poll.stop();
        }
        self.locations.clear();
        if let Some(disk) = &self.disk {
            disk.shutdown();
        }
        self.streams.shutdown();
        if let Some(own) = &self.segment {
            if let Err(e) = self.master.unmount_segment(self.id, own.id()) {
                tracing::warn!(error = %e, "unmount at teardown failed");
            }
        }
        if let Some(meta) = &self.metadata {
            if let Err(e) = meta.remove_segment(&self.hostname) {
                tracing::warn!(error = %e, "could not remove our metadata entries");
            }
        }
        self.engine.shutdown();
        if let Some(link) = &self.dummy {
            link.close();
        }
        self.link.shutdown();
        tracing::info!(name = %self.hostname, "client torn down");
    }
}

impl ClientCore {
    /// Checks that `replica` names our segment and is `len` bytes. Errors: `INVALID_PARAMS`.
    fn check_own_replica(&self, replica: &BufferDescriptor, len: usize) -> Result<()> {
        if replica.transport_endpoint != self.hostname || replica.size != len as u64 {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "replica at {} is not in our segment",
                    replica.transport_endpoint
                ),
            );
        }
        Ok(())
    }
}

impl DemotionSource for ClientCore {
    fn copy_replica(&self, replica: &BufferDescriptor, into: &mut [u8]) -> Result<()> {
        self.check_own_replica(replica, into.len())?;
        // The mount stays current (its range unreused by a remount) while held; the master
        // keeps the range allocated until the demotion is reported.
        let _mount = self.hold_mount(replica)?;
        let from = replica.buffer_address as usize as *const u8;
        // SAFETY: `hold_mount` checked that the range lies in our current segment mount,
        // which is mapped for the life of the core; `into` is a distinct buffer of its size.
        unsafe { crate::transfer::copy::copy_or_fail(into.as_mut_ptr(), from, into.len()) }
    }

    fn fill_replica(&self, replica: &BufferDescriptor, from: &[u8]) -> Result<()> {
        self.check_own_replica(replica, from.len())?;
        // The master lists the range as a replica only after our report: nobody reads it.
        let _mount = self.hold_mount(replica)?;
        let into = replica.buffer_address as usize as *mut u8;
        // SAFETY: `hold_mount` checked that the range lies in our current segment mount,
        // which is mapped for the life of the core; `from` is a distinct buffer of its size.
        unsafe { crate::transfer::copy::copy_or_fail(into, from.as_ptr(), from.len()) }
    }
}

impl LivenessHook for ClientCore {
    /// `NeedRemount` (the master restarted or expired us) remounts the segment under a new
    /// epoch: with its contents when a master restarted from its journal recovered our
    /// current mount (a re-attach: its objects stay), else empty; a client without a segment
    /// registers again. Pins taken before are no longer trusted either way
    /// (`check_pins_held`).
    fn on_answer(&self, _sent_at: Instant, answer: &PingResponse) -> Result<()> {
        if answer.status != ClientStatus::NeedRemount {
            return Ok(());
        }
        // Our segment gets a new epoch (or the master forgot us): nothing cached stands.
        self.locations.clear();
        let Some(own) = &self.segment else {
            return self.master.register_client(self.id);
        };
        let held = own.current();
        // A master without a journal (or of an older version) recovers nothing.
        let recovered = self.master.recovered_segments(self.id).unwrap_or_default();
        let reattach = held.epoch != 0
            && recovered
                .iter()
                .any(|r| r.id == held.id && r.epoch == held.epoch);
        let segment = own.next_mount(&self.engine, reattach)?;
        if reattach
            && self
                .master
                .reattach_segment(self.id, held.epoch, segment.clone())?
        {
            tracing::warn!(segment = %segment.name, epoch = segment.epoch, "master restarted from its journal; re-attached our segment with its objects (new epoch)");
            return Ok(());
        }
        tracing::warn!(segment = %segment.name, epoch = segment.epoch, "master lost our segment; remounting it (empty, new epoch)");
        self.master.remount_segments(self.id, vec![segment])
    }
}

impl Drop for ClientCore {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::types::ReplicateConfig;
    use std::time::Duration;

    /// An embedded client with a `segment`-byte segment whose master runs `master`.
    pub(in crate::client) fn embedded_with(master: MasterConfig, segment: u64) -> Client {
        Client::setup_with(
            SetupConfig {
                local_hostname: "liveness-test".into(),
                global_segment_size: segment,
                local_buffer_size: 0,
                master_server_addr: crate::types::EMBEDDED_MASTER.into(),
                ..SetupConfig::default()
            },
            master,
        )
        .expect("embedded setup")
    }

    #[test]
    fn an_embedded_client_is_never_expired_by_its_own_master() {
        let ttl = Duration::from_millis(200);
        let client = embedded_with(
            MasterConfig {
                client_ttl_ms: Some(ttl.as_millis() as u64),
                ..MasterConfig::default()
            },
            1 << 20,
        );
        client
            .put_from("kept", b"embedded bytes", &ReplicateConfig::default())
            .unwrap();
        // A process stall: nothing pings (the heartbeat, if any, is stopped) for 5 ttls.
        client.core.link.stop_liveness();
        let master = client.core.link.embedded_service().unwrap().clone();
        let expired =
            crate::test_util::wait_until(ttl * 5, || master.metrics().clients_expired > 0);
        assert!(!expired, "the embedded master expired its own client");
        let mut out = [0u8; 14];
        assert_eq!(client.get_into("kept", &mut out), Ok(14));
        assert_eq!(&out, b"embedded bytes");
    }
}
