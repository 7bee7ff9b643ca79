//! A blocking etcd v3 client for the HA layer ([`Etcd`]): the few operations leader election
//! and discovery need, each bounded by a timeout, over the `etcd-client` crate on a private
//! single-threaded tokio runtime.
//!
//! Errors: every failure (unreachable members, timeouts, refused requests) is
//! `ETCD_OPERATION_ERROR` with the cause as the thread's error message.
//!
//! Thread-safety: `Send + Sync`; calls are serialized on the runtime (they are rare: a few per
//! second per process).

use crate::error::{fail, ErrorCode, Result};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn,
    TxnOp,
};
use parking_lot::Mutex;
use std::future::Future;
use std::time::Duration;

/// A key's value and the revision that created it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: String,
    /// The key's create revision (etcd revisions start at 1).
    pub create_revision: u64,
}

/// See the module documentation.
pub struct Etcd {
    runtime: tokio::runtime::Runtime,
    endpoints: Vec<String>,
    client: Mutex<Option<Client>>,
    timeout: Duration,
    keeper: Mutex<Option<(i64, LeaseKeeper, LeaseKeepAliveStream)>>,
}

fn etcd_fail<T>(what: &str, error: impl std::fmt::Display) -> Result<T> {
    fail(
        ErrorCode::EtcdOperationError,
        format!("etcd {what}: {error}"),
    )
}

/// Splits `h1:2379,h2:2379` or `h1:2379;h2:2379` into `http://` endpoints.
pub fn endpoints(list: &str) -> Vec<String> {
    list.split([',', ';'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.contains("://") {
            true => e.to_string(),
            false => format!("http://{e}"),
        })
        .collect()
}

impl Etcd {
    /// A client of the members `endpoints` (see [`endpoints`]) that connects at its first
    /// operation (and again after a failed connect); `timeout` bounds connecting and every
    /// operation. Errors: `INVALID_PARAMS` for an empty list, `ETCD_OPERATION_ERROR` when the
    /// runtime cannot be built.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Etcd> {
        if endpoints.is_empty() {
            return fail(ErrorCode::InvalidParams, "no etcd endpoints");
        }
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => return etcd_fail("runtime", error),
        };
        Ok(Etcd {
            runtime,
            endpoints: endpoints.to_vec(),
            client: Mutex::new(None),
            timeout,
            keeper: Mutex::new(None),
        })
    }

    /// [`Etcd::new`], then one operation: `ETCD_OPERATION_ERROR` when no member answers.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Etcd> {
        let etcd = Etcd::new(endpoints, timeout)?;
        etcd.get("mooncake-store/probe")?;
        Ok(etcd)
    }

    /// The connected client (connecting now if not yet).
    fn client(&self) -> Result<Client> {
        let mut client = self.client.lock();
        if let Some(client) = client.as_ref() {
            return Ok(client.clone());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            .with_timeout(self.timeout)
            .with_keep_alive(self.timeout, self.timeout);
        let connect = Client::connect(&self.endpoints, Some(options));
        let limit = self.timeout;
        // The timer is made inside the runtime (it needs its reactor).
        let connected = self
            .runtime
            .block_on(async { tokio::time::timeout(limit, connect).await });
        match connected {
            Ok(Ok(connected)) => {
                *client = Some(connected.clone());
                Ok(connected)
            }
            Ok(Err(error)) => etcd_fail("connect", error),
            Err(_) => etcd_fail("connect", "timed out"),
        }
    }

    fn run<T, E: std::fmt::Display>(
        &self,
        what: &str,
        future: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        let limit = self.timeout;
        match self
            .runtime
            .block_on(async { tokio::time::timeout(limit, future).await })
        {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => etcd_fail(what, error),
            Err(_) => etcd_fail(what, format!("no answer within {:?}", self.timeout)),
        }
    }

    /// The value of `key` and its create revision; `None` when absent.
    pub fn get(&self, key: &str) -> Result<Option<Versioned>> {
        let mut client = self.client()?;
        let answer = self.run("get", client.get(key, None))?;
        Ok(answer.kvs().first().map(|kv| Versioned {
            value: String::from_utf8_lossy(kv.value()).into_owned(),
            create_revision: kv.create_revision().max(0) as u64,
        }))
    }

    /// Sets `key` = `value` (no lease).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut client = self.client()?;
        self.run("put", client.put(key, value, None)).map(drop)
    }

    /// Deletes `key` (absent is fine).
    pub fn delete(&self, key: &str) -> Result<()> {
        let mut client = self.client()?;
        self.run("delete", client.delete(key, None)).map(drop)
    }

    /// A lease of `ttl` (whole seconds, at least 1); returns its id.
    pub fn grant(&self, ttl: Duration) -> Result<i64> {
        let mut client = self.client()?;
        let seconds = ttl.as_secs().max(1) as i64;
        Ok(self
            .run("lease grant", client.lease_grant(seconds, None))?
            .id())
    }

    /// Creates `key` = `value` under `lease` if it does not exist; returns the revision that
    /// created it, or `None` when it exists.
    pub fn create(&self, key: &str, value: &str, lease: i64) -> Result<Option<u64>> {
        let mut client = self.client()?;
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let answer = self.run("create", client.txn(txn))?;
        let revision = answer.header().map_or(0, |h| h.revision().max(0) as u64);
        Ok(answer.succeeded().then_some(revision))
    }

    /// Sets `key` = `value` if `guard` still exists with create revision `guard_revision`
    /// (the caller still leads). Returns whether it was set.
    pub fn put_if(&self, guard: &str, guard_revision: u64, key: &str, value: &str) -> Result<bool> {
        let mut client = self.client()?;
        let revision = i64::try_from(guard_revision).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when([Compare::create_revision(guard, CompareOp::Equal, revision)])
            .and_then([TxnOp::put(key, value, None)]);
        Ok(self.run("guarded put", client.txn(txn))?.succeeded())
    }

    /// Renews `lease` once; returns the ttl etcd granted (0: the lease is gone).
    pub fn keep_alive(&self, lease: i64) -> Result<i64> {
        let mut keeper = self.keeper.lock();
        if keeper.as_ref().is_none_or(|(id, _, _)| *id != lease) {
            let mut client = self.client()?;
            let (new_keeper, stream) = self.run("keep alive", client.lease_keep_alive(lease))?;
            *keeper = Some((lease, new_keeper, stream));
        }
        let Some((_, lease_keeper, stream)) = keeper.as_mut() else {
            return etcd_fail("keep alive", "no keeper");
        };
        let limit = self.timeout;
        let renewed = self.runtime.block_on(async {
            let renewal = async {
                lease_keeper.keep_alive().await?;
                stream.message().await
            };
            tokio::time::timeout(limit, renewal).await
        });
        match renewed {
            Ok(Ok(Some(answer))) => Ok(answer.ttl()),
            Ok(Ok(None)) => {
                *keeper = None;
                etcd_fail("keep alive", "stream closed")
            }
            Ok(Err(error)) => {
                *keeper = None;
                etcd_fail("keep alive", error)
            }
            Err(_) => {
                *keeper = None;
                etcd_fail("keep alive", "timed out")
            }
        }
    }

    /// Revokes `lease` (its keys disappear at once). Best effort for a step-down.
    pub fn revoke(&self, lease: i64) -> Result<()> {
        let mut client = self.client()?;
        self.keeper.lock().take();
        self.run("lease revoke", client.lease_revoke(lease))
            .map(drop)
    }
}

/// etcd as the store of Mooncake's transfer metadata (upstream's `etcd://` metadata server).
impl crate::metadata::MetadataBackend for Etcd {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(Etcd::get(self, key)?.map(|versioned| versioned.value.into_bytes()))
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        Etcd::put(self, key, value)
    }

    fn remove(&self, key: &str) -> Result<()> {
        self.delete(key)
    }
}
