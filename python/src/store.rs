//! `MooncakeDistributedStore` (spec §4): the class, its life cycle (`setup` in both forms,
//! `close`, garbage collection, interpreter exit), health and hostname. The data methods live
//! in the `ops_*` modules, one `#[pymethods]` block each.
//!
//! Every method works before `setup` and after `close` and returns upstream's "not
//! initialised" value (spec §0.3) instead of crashing. Every store call runs with the GIL
//! released; the class is safe to use from many threads at once and is subclassable.

use crate::convert::{self, INVALID};
use crate::setup_args;
use mooncake_rs::client::Client;
use mooncake_rs::client::ClientHttpServer;
use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Health values (spec §4.1 `health_check`).
const HEALTH_NOT_INITIALIZED: i32 = 1;

/// A set-up client and the optional client HTTP server that reports on it.
struct Live {
    client: Client,
    _http: Option<ClientHttpServer>,
}

/// Every client set up through this module and not yet closed: the interpreter-exit hook
/// tears them down (segments unmounted) even if their Python objects are never collected.
static LIVE: Mutex<Vec<Client>> = Mutex::new(Vec::new());

fn forget(client: &Client) {
    LIVE.lock().retain(|c| c.id() != client.id());
}

/// `atexit` hook: tears down every client still alive. Idempotent.
#[pyfunction]
pub fn _teardown_all(py: Python<'_>) {
    let clients = std::mem::take(&mut *LIVE.lock());
    py.detach(|| clients.iter().for_each(Client::teardown));
}

/// The Python store object. Owns at most one client at a time; `setup` replaces it,
/// `close` and garbage collection tear it down. `Sync`: all state is behind a lock that is
/// held only to clone or swap the client, never during a store call.
#[pyclass(subclass, module = "mooncake.store", name = "MooncakeDistributedStore")]
pub struct Store {
    live: RwLock<Option<Live>>,
}

impl Store {
    /// The current client (a cheap clone), if set up.
    pub fn client(&self) -> Option<Client> {
        self.live.read().as_ref().map(|l| l.client.clone())
    }

    /// Runs `f` on the client with the GIL released, or returns `not_init` when the store is
    /// not set up.
    pub fn run<R: Send>(
        &self,
        py: Python<'_>,
        not_init: R,
        f: impl FnOnce(&Client) -> R + Send,
    ) -> R {
        match self.client() {
            Some(client) => py.detach(|| f(&client)),
            None => not_init,
        }
    }

    /// Makes `client` (set up without an HTTP server) this store's client; returns 0.
    fn adopt(&self, py: Python<'_>, client: Client) -> i64 {
        self.replace(
            py,
            Some(Live {
                client,
                _http: None,
            }),
        );
        0
    }

    /// Swaps in `next` and tears the previous client down (with the GIL released).
    fn replace(&self, py: Python<'_>, next: Option<Live>) {
        if let Some(live) = &next {
            LIVE.lock().push(live.client.clone());
        }
        let previous = std::mem::replace(&mut *self.live.write(), next);
        if let Some(old) = previous {
            forget(&old.client);
            py.detach(move || {
                old.client.teardown();
                drop(old);
            });
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(old) = self.live.get_mut().take() {
            forget(&old.client);
            // Collected objects may be dropped with the GIL held: release it while the
            // client's threads stop, so other Python threads keep running.
            Python::attach(|py| py.detach(move || old.client.teardown()));
        }
    }
}

#[pymethods]
impl Store {
    /// A store with no client: does no I/O; `health_check()` is 1 until `setup`.
    #[new]
    fn new() -> Self {
        mooncake_rs::init_logging();
        Store {
            live: RwLock::new(None),
        }
    }

    /// `setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
    /// protocol, rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False,
    /// ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
    /// client_http_port=9300)` or `setup(config: dict)`. Returns 0 or a negative code; raises
    /// `TypeError` for arguments of the wrong type or name. Always replaces (tears down) the
    /// client this object held, also when the new setup fails.
    #[pyo3(signature = (*args, **kwargs))]
    fn setup(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<i64> {
        let request = setup_args::parse(args, kwargs)?;
        self.replace(py, None);
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("setup: {}", mooncake_rs::error::last_error_message());
                return Ok(convert::code(e));
            }
        };
        let made = py.detach(|| {
            let client = Client::setup(request.config)?;
            let http = request
                .http_port
                .and_then(|port| crate::http::start(port, &client));
            Ok(Live {
                client,
                _http: http,
            })
        });
        Ok(match made {
            Ok(live) => {
                self.replace(py, Some(live));
                0
            }
            Err(e) => {
                tracing::warn!("setup failed: {}", mooncake_rs::error::last_error_message());
                convert::code(e)
            }
        })
    }

    /// Standalone (dummy) mode: attaches to the `mooncake_client` real client at
    /// `server_address` (`host:port`, on this host; see docs/standalone.md). Returns 0, or -1
    /// (upstream's failure value) with the reason logged. Always replaces (tears down) the
    /// client this object held. `mem_pool_size` is unused, as upstream.
    #[pyo3(signature = (mem_pool_size, local_buffer_size, server_address))]
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: convert::U64,
        local_buffer_size: convert::U64,
        server_address: String,
    ) -> i64 {
        self.replace(py, None);
        let (pool, local) = (mem_pool_size.0, local_buffer_size.0);
        let made = py.detach(|| Client::setup_dummy(pool, local, &server_address));
        match made {
            Ok(client) => self.adopt(py, client),
            Err(_) => {
                tracing::warn!(
                    server_address,
                    "setup_dummy failed: {}",
                    mooncake_rs::error::last_error_message()
                );
                -1
            }
        }
    }

    /// Legacy `init_all(protocol, device_name, mount_segment_size)`: -600 when a client is
    /// set up; otherwise sets up a client of an in-process master named `localhost` with a
    /// 1 GiB local buffer.
    fn init_all(
        &self,
        py: Python<'_>,
        protocol: String,
        device_name: String,
        mount_segment_size: convert::U64,
    ) -> i64 {
        if self.client().is_some() {
            return INVALID;
        }
        match py.detach(|| Client::init_all(&protocol, &device_name, mount_segment_size.0)) {
            Ok(client) => self.adopt(py, client),
            Err(e) => convert::code(e),
        }
    }

    /// Tears the client down (its segment is unmounted: objects stored only there vanish
    /// cluster-wide). Returns 0, also when not set up. `BufferHandle`s stay valid.
    fn close(&self, py: Python<'_>) -> i64 {
        self.replace(py, None);
        0
    }

    /// 0 healthy, 1 not set up (or closed), 2 the last master ping failed.
    fn health_check(&self) -> i32 {
        self.client()
            .map_or(HEALTH_NOT_INITIALIZED, |c| c.health_check())
    }

    /// This client's segment name (`host:port`); `""` when not set up.
    fn get_hostname(&self) -> String {
        self.client().map(|c| c.get_hostname()).unwrap_or_default()
    }

    /// Internal: whether this object holds a dummy client (the CUDA tensor reads serve only
    /// dummies, as upstream's).
    fn _is_dummy(&self) -> bool {
        self.client().is_some_and(|c| c.is_dummy())
    }

    /// Internal: whether this object holds a client (real or dummy), for the Python-level
    /// calls that answer -600 before anything else when it does not, as upstream's.
    fn _is_set_up(&self) -> bool {
        self.client().is_some()
    }

    /// mooncake-rs extension: the client's counters (bytes per path, zero-copy counts,
    /// master calls, ...) as a JSON object string; `"{}"` when not set up.
    fn metrics_json(&self) -> String {
        self.client()
            .and_then(|c| serde_json::to_string(&c.metrics()).ok())
            .unwrap_or_else(|| "{}".into())
    }

    /// Always 0: mooncake-rs reads disk replicas through the owner's data path (docs/ssd-tier.md),
    /// never through upstream's peer offload RPC, which is what this counts upstream.
    fn get_offload_rpc_read_count(&self) -> u64 {
        0
    }

    /// Dummy mode: the address of a new shared-memory block of `size` bytes (0 on failure);
    /// a real client (or none): 0, as upstream.
    fn alloc_from_mem_pool(&self, py: Python<'_>, size: convert::U64) -> u64 {
        let Some(client) = self.client() else {
            return 0;
        };
        py.detach(|| client.alloc_from_mem_pool(size.0))
            .map_or(0, |addr| addr as u64)
    }
}
