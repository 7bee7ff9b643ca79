//! A blocking etcd v3 client for the HA layer ([`Etcd`]): the few operations leader election
//! and discovery need, each bounded by a timeout, over the `etcd-client` crate on a private
//! single-threaded tokio runtime.
//!
//! Failover between members is ours: one `etcd-client` client per member, and the member in
//! use. A call whose member failed (unreachable, no answer in time, the connection broken)
//! goes on to the next member while its time lasts, each try but the last getting a share of
//! that time: an idempotent call after any such failure, the one that is not (`create`) only
//! when the member refused the connection, so the request never left. An answer of etcd's
//! own (a refused transaction, an unknown lease) is an answer, not a failed member. The next
//! call starts at the member that last answered. `etcd-client`'s own balanced channel over
//! every member kept sending calls to a dead member (`tcp connect error`) for seconds, long
//! enough to cost a leader its lease. No HTTP/2 keep-alive pings: the runtime runs only
//! during calls, each bounded by its timeout.
//!
//! Errors: every failure (unreachable members, timeouts, refused requests) is
//! `ETCD_OPERATION_ERROR` with the cause of the last attempt as the thread's error message.
//!
//! Thread-safety: `Send + Sync`; concurrent calls each block their own thread on the shared
//! runtime (they are rare: a few per second per process).

use crate::error::{fail, ErrorCode, Result};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn,
    TxnOp,
};
use parking_lot::Mutex;
use std::future::Future;
use std::time::{Duration, Instant};

/// The least time a try of a call gets on one member before the next member is tried.
const MIN_TRY: Duration = Duration::from_millis(100);

/// A key's value and the revision that created it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: String,
    /// The key's create revision (etcd revisions start at 1).
    pub create_revision: u64,
}

/// Which failures of a call may be sent again to the next member.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Any failure: the call is idempotent.
    Any,
    /// Only a refused connection: the request never reached a member.
    Unsent,
}

/// A lease renewal stream, bound to the member it was opened on.
struct Keeper {
    lease: i64,
    member: usize,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

/// The per-member clients (each made at its first use) and the member the next call starts at.
struct Members {
    clients: Vec<Option<Client>>,
    current: usize,
}

/// See the module documentation.
pub struct Etcd {
    runtime: tokio::runtime::Runtime,
    endpoints: Vec<String>,
    members: Mutex<Members>,
    timeout: Duration,
    keeper: Mutex<Option<Keeper>>,
}

fn etcd_fail<T>(what: &str, error: impl std::fmt::Display) -> Result<T> {
    fail(
        ErrorCode::EtcdOperationError,
        format!("etcd {what}: {error}"),
    )
}

/// Whether `error` says the member refused (or could not be routed to) the connection: the
/// request was never sent.
fn never_sent(error: &etcd_client::Error) -> bool {
    use std::io::ErrorKind;
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::AddrNotAvailable
            );
        }
        cause = error.source();
    }
    false
}

/// Whether `error` says the member failed (unreachable, no answer in time, the connection
/// broken) rather than answered.
fn member_failed(error: &etcd_client::Error) -> bool {
    // gRPC status codes: CANCELLED 1, UNKNOWN 2, DEADLINE_EXCEEDED 4, UNAVAILABLE 14 (how
    // tonic reports a lost connection, an expired request timeout, an unreachable member).
    const MEMBER_FAILED: [i32; 4] = [1, 2, 4, 14];
    match error {
        etcd_client::Error::GRpcStatus(status) => MEMBER_FAILED.contains(&i32::from(status.code())),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
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
    /// A client of the members `endpoints` (see [`endpoints`]) that connects to a member at
    /// its first call there (and again after a failed connect); `timeout` bounds every call,
    /// its attempts on several members included. Errors: `INVALID_PARAMS` for an empty list,
    /// `ETCD_OPERATION_ERROR` when the runtime cannot be built.
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
            members: Mutex::new(Members {
                clients: vec![None; endpoints.len()],
                current: 0,
            }),
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

    /// The client of member `member` (made now if not yet; it connects at its first request).
    fn client(&self, member: usize) -> std::result::Result<Client, etcd_client::Error> {
        let mut members = self.members.lock();
        if let Some(client) = &members.clients[member] {
            return Ok(client.clone());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            .with_timeout(self.timeout);
        let endpoint = [self.endpoints[member].as_str()];
        let client = self
            .runtime
            .block_on(Client::connect(endpoint, Some(options)))?;
        members.clients[member] = Some(client.clone());
        Ok(client)
    }

    /// The member the next call starts at.
    fn current(&self) -> usize {
        self.members.lock().current
    }

    /// Records that `member` answered (the next call starts there) or failed (the next call
    /// starts at the member after it).
    fn settle(&self, member: usize, answered: bool) {
        let mut members = self.members.lock();
        members.current = match answered {
            true => member,
            false => (member + 1) % self.endpoints.len(),
        };
    }

    /// How long try `attempt` (from 0) of a call with `left` of its time may take: the last
    /// possible try all of it, the others a share (at least [`MIN_TRY`]), so that a member
    /// that does not answer leaves time for the next.
    fn try_time(&self, attempt: usize, left: Duration, resend: Resend) -> Duration {
        let tries_left = self.endpoints.len() - attempt;
        match (resend, tries_left) {
            (Resend::Unsent, _) | (_, 1) => left,
            _ => (left / tries_left as u32).max(MIN_TRY).min(left),
        }
    }

    /// Runs `call` on the current member, then on the next ones while `resend` allows and the
    /// call's time lasts (one try per member at most).
    fn call<T, F, C>(&self, what: &str, resend: Resend, call: C) -> Result<T>
    where
        C: Fn(Client) -> F,
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let first = self.current();
        let count = self.endpoints.len();
        let mut last = String::new();
        for attempt in 0..count {
            let member = (first + attempt) % count;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let limit = self.try_time(attempt, left, resend);
            let answer = self.client(member).map(&call).map(|future| {
                self.runtime
                    .block_on(async { tokio::time::timeout(limit, future).await })
            });
            let go_on = match answer {
                Ok(Ok(Ok(value))) => {
                    self.settle(member, true);
                    return Ok(value);
                }
                Ok(Ok(Err(error))) | Err(error) if !member_failed(&error) => {
                    // etcd's own answer: the member works.
                    self.settle(member, true);
                    return etcd_fail(what, error);
                }
                Ok(Ok(Err(error))) | Err(error) => {
                    last = error.to_string();
                    resend == Resend::Any || never_sent(&error)
                }
                Ok(Err(_)) => {
                    last = format!("no answer within {limit:?}");
                    resend == Resend::Any
                }
            };
            self.settle(member, false);
            if !go_on {
                break;
            }
        }
        etcd_fail(what, last)
    }

    /// The value of `key` and its create revision; `None` when absent.
    pub fn get(&self, key: &str) -> Result<Option<Versioned>> {
        let answer = self.call("get", Resend::Any, |mut client| async move {
            client.get(key, None).await
        })?;
        Ok(answer.kvs().first().map(|kv| Versioned {
            value: String::from_utf8_lossy(kv.value()).into_owned(),
            create_revision: kv.create_revision().max(0) as u64,
        }))
    }

    /// Sets `key` = `value` (no lease).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call("put", Resend::Any, |mut client| async move {
            client.put(key, value, None).await
        })
        .map(drop)
    }

    /// Deletes `key` (absent is fine).
    pub fn delete(&self, key: &str) -> Result<()> {
        self.call("delete", Resend::Any, |mut client| async move {
            client.delete(key, None).await
        })
        .map(drop)
    }

    /// A lease of `ttl` (whole seconds, at least 1); returns its id. A lease granted by an
    /// attempt whose answer was lost runs out unused.
    pub fn grant(&self, ttl: Duration) -> Result<i64> {
        let seconds = ttl.as_secs().max(1) as i64;
        let answer = self.call("lease grant", Resend::Any, |mut client| async move {
            client.lease_grant(seconds, None).await
        })?;
        Ok(answer.id())
    }

    /// Creates `key` = `value` under `lease` if it does not exist; returns the revision that
    /// created it, or `None` when it exists.
    pub fn create(&self, key: &str, value: &str, lease: i64) -> Result<Option<u64>> {
        let answer = self.call("create", Resend::Unsent, |mut client| async move {
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            client.txn(txn).await
        })?;
        let revision = answer.header().map_or(0, |h| h.revision().max(0) as u64);
        Ok(answer.succeeded().then_some(revision))
    }

    /// Sets `key` = `value` if `guard` still exists with create revision `guard_revision`
    /// (the caller still leads). Returns whether it was set.
    pub fn put_if(&self, guard: &str, guard_revision: u64, key: &str, value: &str) -> Result<bool> {
        let revision = i64::try_from(guard_revision).unwrap_or(i64::MAX);
        let answer = self.call("guarded put", Resend::Any, |mut client| async move {
            let txn = Txn::new()
                .when([Compare::create_revision(guard, CompareOp::Equal, revision)])
                .and_then([TxnOp::put(key, value, None)]);
            client.txn(txn).await
        })?;
        Ok(answer.succeeded())
    }

    /// Renews `lease` once; returns the ttl etcd granted (0: the lease is gone). The renewal
    /// stream stays open on the member that answered; a renewal whose member failed closes
    /// it and tries the next member while the call's time lasts (a stream is never used
    /// again after a renewal on it went unanswered: a late answer would be taken for the
    /// next renewal's).
    pub fn keep_alive(&self, lease: i64) -> Result<i64> {
        let deadline = Instant::now() + self.timeout;
        let mut keeper = self.keeper.lock();
        let count = self.endpoints.len();
        let mut last = String::new();
        for attempt in 0..count {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let limit = self.try_time(attempt, left, Resend::Any);
            let tried_until = Instant::now() + limit;
            let mut opened_now = false;
            if keeper.as_ref().is_none_or(|k| k.lease != lease) {
                *keeper = None;
                let member = self.current();
                let opened = self.client(member).map(|mut client| {
                    self.runtime.block_on(async {
                        tokio::time::timeout(limit, client.lease_keep_alive(lease)).await
                    })
                });
                let error = match opened {
                    Ok(Ok(Ok((lease_keeper, stream)))) => {
                        *keeper = Some(Keeper {
                            lease,
                            member,
                            keeper: lease_keeper,
                            stream,
                        });
                        opened_now = true;
                        None
                    }
                    Ok(Ok(Err(error))) | Err(error) => Some(error),
                    Ok(Err(_)) => {
                        last = format!("no answer within {limit:?}");
                        self.settle(member, false);
                        continue;
                    }
                };
                if let Some(error) = error {
                    if let etcd_client::Error::LeaseKeepAliveError(_) = error {
                        // The member answered: the lease is not (or no longer) there.
                        self.settle(member, true);
                        return Ok(0);
                    }
                    let failed = member_failed(&error);
                    self.settle(member, !failed);
                    if !failed {
                        return etcd_fail("keep alive", error);
                    }
                    last = error.to_string();
                    continue;
                }
            }
            let Some(open) = keeper.as_mut() else {
                continue;
            };
            let limit = tried_until.saturating_duration_since(Instant::now());
            let renewed = self.runtime.block_on(async {
                let renewal = async {
                    open.keeper.keep_alive().await?;
                    open.stream.message().await
                };
                tokio::time::timeout(limit, renewal).await
            });
            let member = open.member;
            let failed = match renewed {
                Ok(Ok(Some(answer))) => {
                    self.settle(member, true);
                    return Ok(answer.ttl());
                }
                Ok(Ok(None)) => {
                    last = "stream closed".to_string();
                    true
                }
                Ok(Err(error)) => {
                    last = error.to_string();
                    member_failed(&error)
                }
                // Right after opening the stream (itself a renewal) the try's time may just
                // have run out: not the member's failure.
                Err(_) => {
                    last = format!("no answer within {limit:?}");
                    !opened_now
                }
            };
            *keeper = None;
            self.settle(member, !failed);
            if !failed {
                break;
            }
        }
        etcd_fail("keep alive", last)
    }

    /// Revokes `lease` (its keys disappear at once). Best effort for a step-down.
    pub fn revoke(&self, lease: i64) -> Result<()> {
        self.keeper.lock().take();
        self.call("lease revoke", Resend::Any, |mut client| async move {
            client.lease_revoke(lease).await
        })
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
