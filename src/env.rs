//! The process environment, read in one place: every `MC_*` / `MOONCAKE_*` variable the library
//! reads is defined here — a [`Knob`] for a number, a [`Var`] for text or a switch — with its
//! default, range and what a bad value becomes, and `docs/configuration.md` lists them all in
//! one table ([`KNOBS`] and [`VARS`] are the lists; a test checks the table names each one).
//! Other modules ask these definitions for values ([`Knob::get`], [`Var::get`], ...) and never
//! call `std::env` themselves (a second test scans `src/` for that). Also the size parser
//! Mooncake's flags and variables share.
//!
//! Thread-safety: the definitions are plain `const` data; reading the environment is safe from
//! any thread (nothing in the library writes it). Each call reads the variable anew: a module
//! that wants a value fixed for the life of the process caches it (as `spin::budget` does).
//! Errors: none; a value that does not parse or is out of range becomes what its definition
//! says, logged as a warning unless the definition is quiet (the lenient rules some of
//! Mooncake's variables have always had).

use crate::error::{fail, ErrorCode, Result};

/// What a [`Knob`] does with a value outside its `min..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outside {
    /// The value is clamped into the range.
    Clamp,
    /// The default is used instead.
    Default,
}

/// One numeric environment variable: its name, default, accepted range and what a bad value
/// becomes. Built with [`Knob::new`] (clamped, logged, plain numbers) and the `const`
/// modifiers [`Knob::strict`], [`Knob::quiet`], [`Knob::sizes`] and
/// [`Knob::zero_is_default`]. Plain `const` data, `Copy`.
///
/// Reading ([`Knob::read`]): unset → `default`; a value that does not parse → `default`; 0
/// → `default` when `zero_is_default`; a value outside `min..=max` → clamped into the range,
/// or `default` when [`Outside::Default`]. A bad value is logged as a warning when `logged`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Knob {
    /// The variable's name.
    pub(crate) name: &'static str,
    /// The value when unset or bad.
    pub(crate) default: u64,
    /// Smallest accepted value.
    pub(crate) min: u64,
    /// Largest accepted value.
    pub(crate) max: u64,
    /// What a value outside `min..=max` becomes.
    pub(crate) outside: Outside,
    /// Whether 0 stands for the default (checked before the range; never logged).
    pub(crate) zero_is_default: bool,
    /// Whether the value is a size in [`parse_size`]'s syntax (`64MiB`, `1.5k`) rather than a
    /// plain whole number.
    pub(crate) sizes: bool,
    /// Whether a bad value (unparsable, out of range) is logged as a warning.
    pub(crate) logged: bool,
}

impl Knob {
    /// A plain-number knob: out-of-range values clamped, bad values logged.
    pub(crate) const fn new(name: &'static str, default: u64, min: u64, max: u64) -> Knob {
        Knob {
            name,
            default,
            min,
            max,
            outside: Outside::Clamp,
            zero_is_default: false,
            sizes: false,
            logged: true,
        }
    }

    /// This knob with out-of-range values replaced by the default ([`Outside::Default`]).
    pub(crate) const fn strict(self) -> Knob {
        Knob {
            outside: Outside::Default,
            ..self
        }
    }

    /// This knob without warnings for bad values.
    pub(crate) const fn quiet(self) -> Knob {
        Knob {
            logged: false,
            ..self
        }
    }

    /// This knob reading sizes ([`parse_size`]) instead of plain numbers.
    pub(crate) const fn sizes(self) -> Knob {
        Knob {
            sizes: true,
            ..self
        }
    }

    /// This knob with 0 standing for the default.
    pub(crate) const fn zero_is_default(self) -> Knob {
        Knob {
            zero_is_default: true,
            ..self
        }
    }

    /// The value the environment gives this knob now (see [`Knob`]).
    pub(crate) fn get(&self) -> u64 {
        self.read(std::env::var(self.name).ok().as_deref())
    }

    /// The number the environment holds for this knob now, before the default, the range and
    /// `zero_is_default` apply: `None` when unset or unparsable (never logged). For the few
    /// callers whose fallback is not a constant (see `p2p::config`).
    pub(crate) fn parsed(&self) -> Option<u64> {
        std::env::var(self.name)
            .ok()
            .and_then(|text| self.parse(&text))
    }

    /// `text` as this knob's kind of number (surrounding blanks ignored), or `None`.
    pub(crate) fn parse(&self, text: &str) -> Option<u64> {
        match self.sizes {
            true => parse_size(text).ok(),
            false => text.trim().parse::<u64>().ok(),
        }
    }

    /// The value `text` (the variable's text, `None` when unset) gives this knob (see
    /// [`Knob`]); a bad value is logged when the knob is. Pure apart from the log line.
    pub(crate) fn read(&self, text: Option<&str>) -> u64 {
        let Some(text) = text else {
            return self.default;
        };
        let Some(value) = self.parse(text) else {
            if self.logged {
                tracing::warn!(
                    "{}={text:?} is not a number; using the default {}",
                    self.name,
                    self.default
                );
            }
            return self.default;
        };
        if value == 0 && self.zero_is_default {
            return self.default;
        }
        if (self.min..=self.max).contains(&value) {
            return value;
        }
        let used = match self.outside {
            Outside::Clamp => value.clamp(self.min, self.max),
            Outside::Default => self.default,
        };
        if self.logged {
            tracing::warn!("{}={value} is out of range; using {used}", self.name);
        }
        used
    }
}

/// One text environment variable (a name, a filter, a mode or an on/off switch): its name and
/// what "unset" means. Plain `const` data, `Copy`; interpreting the text is the reader's
/// business, except for switches ([`Var::flag`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Var {
    /// The variable's name.
    pub(crate) name: &'static str,
    /// The value that stands for "unset" ("" when unset has no value, e.g. "no cluster id"),
    /// as `docs/configuration.md` gives it. [`Var::flag`] falls back to it.
    pub(crate) default: &'static str,
}

impl Var {
    /// The variable's text now; `None` when unset or not valid Unicode (as `std::env::var`).
    pub(crate) fn get(&self) -> Option<String> {
        std::env::var(self.name).ok()
    }

    /// The variable as a switch: `1/true/yes/on` → true, `0/false/no/off` → false (any case,
    /// blanks ignored); unset or anything else: the default's meaning.
    pub(crate) fn flag(&self) -> bool {
        self.get()
            .as_deref()
            .and_then(switch)
            .or_else(|| switch(self.default))
            .unwrap_or(false)
    }
}

/// `text` as a switch (see [`Var::flag`]), `None` when it is none of the accepted words.
fn switch(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Upper bound of the transfer engine's timeouts: a week (keeps every `Instant + timeout` far
/// from overflow).
const WEEK_MS: u64 = 7 * 24 * 3600 * 1000;
/// Upper bound of the data server's two connection caps (far above any sane fd limit).
const MAX_CONNECTIONS: u64 = 1 << 20;

// ---- logging --------------------------------------------------------------------------------

/// `MC_LOG`: the log filter, in `tracing-subscriber`'s `EnvFilter` syntax (`debug`,
/// `mooncake_rs::transfer=trace,warn`). Unset or not a valid filter: the program's own default
/// (`warn` for `init_logging`; the binaries' glog flags), and `warn` if that is invalid too.
/// Read once, when logging is installed (`process.rs`).
pub(crate) const LOG: Var = Var {
    name: "MC_LOG",
    default: "",
};

// ---- RPC and the master ---------------------------------------------------------------------

/// `MC_RPC_CONNECT_TIMEOUT_MS`: milliseconds to establish one RPC or HTTP client connection
/// (master, P2P peers, HTTP metadata). Default 3000; 0, unparsable or above `u64::MAX`: the
/// default (logged). Read by each `rpc::Timeouts::from_env`.
pub(crate) const RPC_CONNECT_TIMEOUT_MS: Knob =
    Knob::new("MC_RPC_CONNECT_TIMEOUT_MS", 3000, 1, u64::MAX).strict();
/// `MC_RPC_TIMEOUT_MS`: milliseconds each wait for the peer may take while sending an RPC or
/// HTTP request or receiving its answer. Default 30000; 0 or unparsable: the default (logged).
pub(crate) const RPC_TIMEOUT_MS: Knob =
    Knob::new("MC_RPC_TIMEOUT_MS", 30_000, 1, u64::MAX).strict();
/// `MC_RPC_SPIN_US`: microseconds a client awaiting a quick answer polls its socket awake
/// before it blocks (`spin.rs`). Default 100, 0..=1000 (0: never spin); unparsable or above
/// 1000: the default (logged). Read once per process.
pub(crate) const RPC_SPIN_US: Knob = Knob::new("MC_RPC_SPIN_US", 100, 0, 1000).strict();
/// `MC_PING_TIMEOUT_MS`: milliseconds that bound connecting and each answer of the heartbeat
/// pings to a remote master (`node/master_link.rs`). Default 2000 — well below the master's
/// default `client_ttl` (10 s) even with the retry (2 × 2 s + the 1 s interval); 0 or
/// unparsable: the default (logged). Keep `2 × it + 1 s` below the master's `--client_ttl`.
pub(crate) const PING_TIMEOUT_MS: Knob =
    Knob::new("MC_PING_TIMEOUT_MS", 2000, 1, u64::MAX).strict();

// ---- HTTP metadata --------------------------------------------------------------------------

/// `MC_METADATA_CLUSTER_ID`: a prefix for every key this process stores in the HTTP metadata
/// service (Mooncake's cluster id). Unset or empty: none.
pub(crate) const METADATA_CLUSTER_ID: Var = Var {
    name: "MC_METADATA_CLUSTER_ID",
    default: "",
};
/// `MC_STORE_CLUSTER_ID`: the cluster a client's `etcd://` master address names (the key
/// `mooncake-store/<id>/master_view`, as upstream). Unset or empty: `mooncake_cluster`.
pub(crate) const STORE_CLUSTER_ID: Var = Var {
    name: "MC_STORE_CLUSTER_ID",
    default: "mooncake_cluster",
};
/// `MC_METADATA_CACHE_ENTRIES`: segment addresses the HTTP metadata resolver caches (the oldest
/// is evicted first). Default 4096; 0 or unparsable: the default (logged).
pub(crate) const METADATA_CACHE_ENTRIES: Knob =
    Knob::new("MC_METADATA_CACHE_ENTRIES", 4096, 1, u64::MAX).strict();
/// `MC_METADATA_CACHE_TTL_MS`: milliseconds after which a cached segment address is looked up
/// again. Default 60000; 0 or unparsable: the default (logged).
pub(crate) const METADATA_CACHE_TTL_MS: Knob =
    Knob::new("MC_METADATA_CACHE_TTL_MS", 60_000, 1, u64::MAX).strict();

// ---- a handle's transfer engine (node/engine.rs) --------------------------------------------

/// `MC_STORE_MEMCPY`: a switch; on (the default), transfers to this process's own segments are
/// local copies; `0`/`false`/`no`/`off` sends them over TCP too. Unrecognised: the default.
pub(crate) const STORE_MEMCPY: Var = Var {
    name: "MC_STORE_MEMCPY",
    default: "1",
};
/// `MC_STORE_CLIENT_MIN_PORT`: lowest data port tried when `local_hostname` has no port.
/// Default 12300, at most 65535 (silently); unparsable: the default (silently).
pub(crate) const STORE_CLIENT_MIN_PORT: Knob =
    Knob::new("MC_STORE_CLIENT_MIN_PORT", 12_300, 0, 65_535).quiet();
/// `MC_STORE_CLIENT_MAX_PORT`: highest data port tried. Default 14300, at most 65535; the
/// caller raises it to `MC_STORE_CLIENT_MIN_PORT` (silently); unparsable: the default.
pub(crate) const STORE_CLIENT_MAX_PORT: Knob =
    Knob::new("MC_STORE_CLIENT_MAX_PORT", 14_300, 0, 65_535).quiet();
/// `MC_MIN_RPC_PORT`: lowest port a `mooncake.engine.TransferEngine` listens on (upstream's
/// name). Default 15000, at most 65535 (silently); unparsable: the default (silently).
pub(crate) const MIN_RPC_PORT: Knob = Knob::new("MC_MIN_RPC_PORT", 15_000, 1, 65_535).quiet();
/// `MC_MAX_RPC_PORT`: highest such port. Default 17000, at most 65535; the caller raises it to
/// `MC_MIN_RPC_PORT` (silently); unparsable: the default.
pub(crate) const MAX_RPC_PORT: Knob = Knob::new("MC_MAX_RPC_PORT", 17_000, 1, 65_535).quiet();
/// `MC_TRANSFER_TIMEOUT`: seconds before a `TransferEngine` batch is reported timed out
/// (upstream's name and bounds, plus one nanosecond per byte). Default 30, at least 5.
pub(crate) const TE_TRANSFER_TIMEOUT_S: Knob =
    Knob::new("MC_TRANSFER_TIMEOUT", 30, 5, WEEK_MS / 1000);
/// `MC_FORCE_TCP`: a switch; on, a `TransferEngine` initialised with `protocol="rdma"` uses TCP.
pub(crate) const FORCE_TCP: Var = Var {
    name: "MC_FORCE_TCP",
    default: "0",
};
/// `MC_FORCE_HCA`: a switch; on, a `TransferEngine` initialised with `protocol="rdma"` fails
/// when no RDMA device opens, instead of falling back to TCP.
pub(crate) const FORCE_HCA: Var = Var {
    name: "MC_FORCE_HCA",
    default: "0",
};
/// `MC_STORE_CLIENT_SETUP_RETRIES`: random ports tried before setup fails. Default 20, at
/// least 1 (silently); unparsable: the default.
pub(crate) const STORE_CLIENT_SETUP_RETRIES: Knob =
    Knob::new("MC_STORE_CLIENT_SETUP_RETRIES", 20, 1, u64::MAX).quiet();

// ---- transfer engine (transfer/settings.rs): read once per engine; clamped, logged ----------

/// `MC_TRANSFER_TIMEOUT_MS`: the transfer I/O timeout in milliseconds (Mooncake's 60 s hard
/// batch timeout): connect and per-operation socket timeout, a server's deadline of one
/// request, RDMA handshake I/O and each slice's completion wait. Default 60000, 1..=a week.
/// The P2P quarantine's default is twice it (`p2p::config`, read there without the upper
/// clamp and silently, as before).
pub(crate) const TRANSFER_TIMEOUT_MS: Knob =
    Knob::new("MC_TRANSFER_TIMEOUT_MS", 60_000, 1, WEEK_MS);
/// `MC_TCP_LANES_PER_PEER`: most parts (connections, or RDMA queue pairs) one request is split
/// across (Mooncake's name and default). Default 4, 1..=16.
pub(crate) const TCP_LANES_PER_PEER: Knob = Knob::new("MC_TCP_LANES_PER_PEER", 4, 1, 16);
/// `MC_TRANSFER_MAX_CONNECTIONS`: connections the data server holds at once; more are reset.
/// Default 1024, 1..=2^20.
pub(crate) const TRANSFER_MAX_CONNECTIONS: Knob =
    Knob::new("MC_TRANSFER_MAX_CONNECTIONS", 1024, 1, MAX_CONNECTIONS);
/// `MC_TRANSFER_MAX_CONNECTIONS_PER_PEER`: connections the data server holds at once from one
/// peer IP address. One client process uses up to `MC_TCP_LANES_PER_PEER` connections per
/// concurrent request and pools at most 32 idle ones per peer, so 256 leaves room for several
/// busy processes behind one address. Default 256, 1..=2^20.
pub(crate) const TRANSFER_MAX_CONNECTIONS_PER_PEER: Knob = Knob::new(
    "MC_TRANSFER_MAX_CONNECTIONS_PER_PEER",
    256,
    1,
    MAX_CONNECTIONS,
);
/// `MC_TRANSFER_IDLE_TIMEOUT_MS`: milliseconds the data server keeps a connection with no
/// request in flight. Default 300000 (5 minutes), 1..=a week.
pub(crate) const TRANSFER_IDLE_TIMEOUT_MS: Knob =
    Knob::new("MC_TRANSFER_IDLE_TIMEOUT_MS", 300_000, 1, WEEK_MS);
/// `MC_SAME_HOST`: 1 maps same-host peers' segments (and serves ours to them), 0 uses TCP.
/// Default 1, 0..=1.
pub(crate) const SAME_HOST: Knob = Knob::new("MC_SAME_HOST", 1, 0, 1);
/// `MC_SAME_HOST_RETRY_MS`: milliseconds a refused same-host handshake is remembered before the
/// peer is asked again. Default 5000, 0..=a week.
pub(crate) const SAME_HOST_RETRY_MS: Knob = Knob::new("MC_SAME_HOST_RETRY_MS", 5_000, 0, WEEK_MS);
/// `MC_SAME_HOST_HANDSHAKE_MS`: milliseconds that bound one same-host handshake — its connect
/// (a full listen queue is a refusal at once), each socket read and write on both ends, and
/// how long a second caller waits for a handshake to the same peer already in flight before
/// it uses TCP. Default 2000, 1..=a week.
pub(crate) const SAME_HOST_HANDSHAKE_MS: Knob =
    Knob::new("MC_SAME_HOST_HANDSHAKE_MS", 2_000, 1, WEEK_MS);

// ---- RDMA (transfer/rdma/): out-of-range or unparsable values are the default, silently ----

/// `MC_SLICE_SIZE`: bytes per RDMA work request (Mooncake's name and default). Default 65536,
/// 4096..=1 GiB.
pub(crate) const SLICE_SIZE: Knob = Knob::new("MC_SLICE_SIZE", 64 << 10, 4096, 1 << 30)
    .strict()
    .quiet();
/// `MC_MAX_WR`: work requests outstanding on one queue pair (Mooncake's name and default).
/// Default 256, 1..=4096.
pub(crate) const MAX_WR: Knob = Knob::new("MC_MAX_WR", 256, 1, 4096).strict().quiet();
/// `MC_CQ_DEPTH`: entries asked for each queue pair's completion queue (the provider may round
/// it up); smaller than `MC_MAX_WR` lets the CQ overrun. 1..=65536; the default, 0, stands for
/// `MC_MAX_WR`'s value (the reader substitutes it).
pub(crate) const CQ_DEPTH: Knob = Knob::new("MC_CQ_DEPTH", 0, 1, 65_536).strict().quiet();
/// `MC_IB_TIMEOUT`: the local ACK timeout exponent (4.096 µs × 2^n). Default 14, 1..=31.
pub(crate) const IB_TIMEOUT: Knob = Knob::new("MC_IB_TIMEOUT", 14, 1, 31).strict().quiet();
/// `MC_IB_RETRY_CNT`: transport retries before a work request fails. Default 7, 0..=7.
pub(crate) const IB_RETRY_CNT: Knob = Knob::new("MC_IB_RETRY_CNT", 7, 0, 7).strict().quiet();
/// `MC_GID_INDEX` (Mooncake's name): the GID table entry of port 1 used for RoCE addressing,
/// 0..=255. Unset: the first IPv4-mapped entry on an Ethernet port, else 0. A value that is
/// not a GID index fails opening the device (the reader's error).
pub(crate) const GID_INDEX: Var = Var {
    name: "MC_GID_INDEX",
    default: "",
};
/// `MC_RDMA_COMPLETION`: how a queue pair's runner waits for completions: `poll` (the default)
/// or `event` (any case; anything else: `poll`).
pub(crate) const RDMA_COMPLETION: Var = Var {
    name: "MC_RDMA_COMPLETION",
    default: "poll",
};

// ---- on-stream engine (stream/engine.rs): sizes syntax; clamped and unparsable silently -----

/// `MC_STREAM_TICKETS`: gate/status slots, i.e. on-stream tickets alive at once. Default 1024,
/// 1..=2^20.
pub(crate) const STREAM_TICKETS: Knob = Knob::new("MC_STREAM_TICKETS", 1024, 1, 1 << 20)
    .quiet()
    .sizes();
/// `MC_STREAM_STAGING_BYTES`: pinned staging bytes for remote replicas. Default 64 MiB.
pub(crate) const STREAM_STAGING_BYTES: Knob =
    Knob::new("MC_STREAM_STAGING_BYTES", 64 << 20, 0, u64::MAX)
        .quiet()
        .sizes();
/// `MC_STREAM_WORKERS`: fetch/commit worker threads. Default 2, 1..=64.
pub(crate) const STREAM_WORKERS: Knob = Knob::new("MC_STREAM_WORKERS", 2, 1, 64).quiet().sizes();
/// `MC_STREAM_TIMEOUT_MS`: milliseconds a gate may stay closed. Default 30000, at least 1.
pub(crate) const STREAM_TIMEOUT_MS: Knob = Knob::new("MC_STREAM_TIMEOUT_MS", 30_000, 1, u64::MAX)
    .quiet()
    .sizes();
/// `MC_STREAM_STUCK_FETCHES`: most fetch threads detached past their deadline at once (0: an
/// overdue fetch keeps its worker). Default 16, 0..=1024.
pub(crate) const STREAM_STUCK_FETCHES: Knob = Knob::new("MC_STREAM_STUCK_FETCHES", 16, 0, 1024)
    .quiet()
    .sizes();
/// `MC_STREAM_TEARDOWN_MS`: milliseconds teardown waits for streams, workers and the last
/// unpins. Default 5000.
pub(crate) const STREAM_TEARDOWN_MS: Knob = Knob::new("MC_STREAM_TEARDOWN_MS", 5_000, 0, u64::MAX)
    .quiet()
    .sizes();

// ---- devices (device/) ----------------------------------------------------------------------

/// `MC_DEVICE_RUNTIME`: the device runtime to load: `auto` (the default, also unset or empty:
/// CUDA, then Ascend), `cuda`, `ascend` or `none` (any case). Read once per process.
pub(crate) const DEVICE_RUNTIME: Var = Var {
    name: "MC_DEVICE_RUNTIME",
    default: "auto",
};
/// `MC_COPY_THREADS`: threads one large host ↔ host copy is cut across, the caller included
/// (1: no splitting); the reader caps it at the CPUs this process may run on. Default 4,
/// 1..=16. Read once per process.
pub(crate) const COPY_THREADS: Knob = Knob::new("MC_COPY_THREADS", 4, 1, 16);
/// `MC_STORE_PIN_MEMORY_MAX_BYTES`: budget, in bytes (a plain number), of host memory
/// registered ("pinned") with the device runtime. Default unlimited (`u64::MAX`); unparsable:
/// unlimited, silently. Read at each registration.
pub(crate) const STORE_PIN_MEMORY_MAX_BYTES: Knob =
    Knob::new("MC_STORE_PIN_MEMORY_MAX_BYTES", u64::MAX, 0, u64::MAX).quiet();

// ---- dummy clients (standalone/): clamped and unparsable silently ---------------------------

/// `MC_DUMMY_TTL_MS`: milliseconds a dummy or its real client may stay silent before the other
/// side gives it up (upstream's `DEFAULT_CLIENT_LIVE_TTL_SEC`). Default 10000, at least 100.
pub(crate) const DUMMY_TTL_MS: Knob = Knob::new("MC_DUMMY_TTL_MS", 10_000, 100, u64::MAX).quiet();
/// `MC_DUMMY_STAGING_BYTES`: bytes (a plain number) of a dummy connection's staging block for
/// memory outside shared blocks. Default 8 MiB, at least 4 KiB.
pub(crate) const DUMMY_STAGING_BYTES: Knob =
    Knob::new("MC_DUMMY_STAGING_BYTES", 8 << 20, 4096, u64::MAX).quiet();
/// `MC_DUMMY_MAX_MAPPINGS`: most distinct blocks one dummy process (by its kernel pid, over all
/// its links) may have mapped at its real client at once. Default 4096.
pub(crate) const DUMMY_MAX_MAPPINGS: Knob =
    Knob::new("MC_DUMMY_MAX_MAPPINGS", 4096, 0, u64::MAX).quiet();
/// `MC_DUMMY_MAX_CONNECTIONS`: most dummy connections a real client serves at once, over all
/// dummies (each costs two threads and two descriptors); more are closed unserved. Default
/// 256.
pub(crate) const DUMMY_MAX_CONNECTIONS: Knob =
    Knob::new("MC_DUMMY_MAX_CONNECTIONS", 256, 1, 65_536).quiet();
/// `MC_DUMMY_MAX_MAPPED_BYTES`: most bytes of shared blocks one dummy process may have mapped
/// at its real client (a size: "1 TiB", …). Default 1 TiB.
pub(crate) const DUMMY_MAX_MAPPED_BYTES: Knob =
    Knob::new("MC_DUMMY_MAX_MAPPED_BYTES", 1 << 40, 0, u64::MAX)
        .quiet()
        .sizes();
/// `MC_DUMMY_MAX_MAPPED_BYTES_TOTAL`: most bytes of shared blocks a real client maps for all
/// its dummies together (a size). Default 8 TiB, well inside the 128 TiB of user address space.
pub(crate) const DUMMY_MAX_MAPPED_BYTES_TOTAL: Knob =
    Knob::new("MC_DUMMY_MAX_MAPPED_BYTES_TOTAL", 8 << 40, 0, u64::MAX)
        .quiet()
        .sizes();
/// `MC_DUMMY_CONNECTIONS`: most connections one dummy opens to its real client, i.e.
/// transfers it runs at once. Default 4, 1..=64.
pub(crate) const DUMMY_CONNECTIONS: Knob = Knob::new("MC_DUMMY_CONNECTIONS", 4, 1, 64).quiet();

// ---- P2P (p2p/) -----------------------------------------------------------------------------

/// `MC_RDMA_MR_QUARANTINE_MS`: milliseconds the RDMA registrations of a remounted segment's
/// previous mount are kept (pinning its orphaned pages) so that no rkey a stale writer may hold
/// is reissued. Default 120000 (the master's default `--write_quarantine_ms`); 0: dropped at
/// once (tests only: the guarantee is gone).
pub(crate) const RDMA_MR_QUARANTINE_MS: Knob =
    Knob::new("MC_RDMA_MR_QUARANTINE_MS", 120_000, 0, u64::MAX);
/// `MC_P2P_QUARANTINE_MS`: milliseconds that P2P space a failed, expired or revoked transfer
/// may still touch is held before reuse (0 allowed; below the peers' transfer timeout the
/// guarantee is gone). Unset or unparsable: twice `MC_TRANSFER_TIMEOUT_MS` (120000 with that
/// one's default) — so its reader uses [`Knob::parsed`] and `default` only documents it.
pub(crate) const P2P_QUARANTINE_MS: Knob =
    Knob::new("MC_P2P_QUARANTINE_MS", 120_000, 0, u64::MAX).quiet();
/// `MC_P2P_DEBUG_TRANSFER_DELAY_MS`: test hook: milliseconds an owner sleeps at the start of a
/// REVERSE transfer stage. Default 0 (none); unparsable: 0, silently.
pub(crate) const P2P_DEBUG_TRANSFER_DELAY_MS: Knob =
    Knob::new("MC_P2P_DEBUG_TRANSFER_DELAY_MS", 0, 0, u64::MAX).quiet();
/// `MOONCAKE_DM_LOCK_SHARD_COUNT` (Mooncake's name): lock shards of a P2P owner's record
/// tables. Default 1024; unparsable or 0: the default; above 65536: 65536 (all silently).
pub(crate) const DM_LOCK_SHARD_COUNT: Knob =
    Knob::new("MOONCAKE_DM_LOCK_SHARD_COUNT", 1024, 1, 1 << 16)
        .quiet()
        .zero_is_default();

// ---- the SSD tier (node/disk_tier.rs) -------------------------------------------------------

/// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`: the SSD tier's directory when a setup turns the tier
/// on (`enable_ssd_offload`) without naming one (`ssd_offload_path`). Unset or empty: none
/// (such a setup fails naming both).
pub(crate) const OFFLOAD_FILE_STORAGE_PATH: Var = Var {
    name: "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    default: "",
};
/// `MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`: record bytes the SSD tier may hold (size
/// syntax). Default 0: no limit but the filesystem's free space (minus a 64 MiB reserve);
/// unparsable: the default (logged).
pub(crate) const OFFLOAD_TOTAL_SIZE_LIMIT_BYTES: Knob =
    Knob::new("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", 0, 0, u64::MAX).sizes();

/// `MC_OFFLOAD_AT_PUT`: a switch for the in-process master (`master_server_addr`
/// `embedded`): off (the default), objects go to the SSD tier when evicted; on, every write
/// is also copied to its owner's tier as soon as it ends (write-through, the
/// `mooncake_master` flags `--enable_offload` without `--offload_on_evict`).
pub(crate) const OFFLOAD_AT_PUT: Var = Var {
    name: "MC_OFFLOAD_AT_PUT",
    default: "0",
};

/// `MC_LOCATION_CACHE`: a switch: on (the default), a client serves replica lists it
/// fetched from its location cache while their cached lease runs and its revocation poll is
/// fresh (`docs/location-cache.md`); off, every get asks the master.
pub(crate) const LOCATION_CACHE: Var = Var {
    name: "MC_LOCATION_CACHE",
    default: "1",
};

/// `MC_LOCATION_CACHE_ENTRIES`: most keys one client's location cache holds (least
/// recently used go first). Default 65536, at least 16.
pub(crate) const LOCATION_CACHE_ENTRIES: Knob =
    Knob::new("MC_LOCATION_CACHE_ENTRIES", 65_536, 16, u64::MAX).strict();

/// `MC_LOCATION_CACHE_BYTES`: most bytes (keys and replica descriptors, estimated) one
/// client's location cache holds. Default 64 MiB, at least 64 KiB.
pub(crate) const LOCATION_CACHE_BYTES: Knob =
    Knob::new("MC_LOCATION_CACHE_BYTES", 64 << 20, 64 << 10, u64::MAX)
        .strict()
        .sizes();

/// `MC_PROMOTION_ON_HIT`: a switch for the in-process master: on, an object on disk only is
/// loaded back into its owner's segment once two reads found it there (the
/// `mooncake_master` flag `--promotion_on_hit`). Default off.
pub(crate) const PROMOTION_ON_HIT: Var = Var {
    name: "MC_PROMOTION_ON_HIT",
    default: "0",
};

// ---- the cluster key (auth/) ------------------------------------------------------------

/// `MC_CLUSTER_KEY_FILE`: the cluster key file of a process that names none in its setup or
/// flags (format in `auth/keys.rs`). Unset or empty: no key, connections open as upstream's.
pub(crate) const CLUSTER_KEY_FILE: Var = Var {
    name: "MC_CLUSTER_KEY_FILE",
    default: "",
};

/// `MC_TLS_CA_FILE`: the certificates (PEM) a process trusts for TLS to the master and to
/// `https://` metadata URLs, when its flags name none (`auth/tls.rs`). Unset or empty: master
/// connections are plain.
pub(crate) const TLS_CA_FILE: Var = Var {
    name: "MC_TLS_CA_FILE",
    default: "",
};

/// `MC_TLS_SERVER_NAME`: the name a TLS server's certificate must hold, when it is not the
/// host the client dials.
pub(crate) const TLS_SERVER_NAME: Var = Var {
    name: "MC_TLS_SERVER_NAME",
    default: "",
};

/// Every numeric variable defined here (`docs/configuration.md` has a row for each).
#[cfg_attr(not(test), allow(dead_code))] // read by the tests
pub(crate) const KNOBS: &[&Knob] = &[
    &RPC_CONNECT_TIMEOUT_MS,
    &RPC_TIMEOUT_MS,
    &RPC_SPIN_US,
    &PING_TIMEOUT_MS,
    &METADATA_CACHE_ENTRIES,
    &METADATA_CACHE_TTL_MS,
    &LOCATION_CACHE_ENTRIES,
    &LOCATION_CACHE_BYTES,
    &STORE_CLIENT_MIN_PORT,
    &STORE_CLIENT_MAX_PORT,
    &STORE_CLIENT_SETUP_RETRIES,
    &MIN_RPC_PORT,
    &MAX_RPC_PORT,
    &TE_TRANSFER_TIMEOUT_S,
    &TRANSFER_TIMEOUT_MS,
    &TCP_LANES_PER_PEER,
    &TRANSFER_MAX_CONNECTIONS,
    &TRANSFER_MAX_CONNECTIONS_PER_PEER,
    &TRANSFER_IDLE_TIMEOUT_MS,
    &SAME_HOST,
    &SAME_HOST_RETRY_MS,
    &SAME_HOST_HANDSHAKE_MS,
    &SLICE_SIZE,
    &MAX_WR,
    &CQ_DEPTH,
    &IB_TIMEOUT,
    &IB_RETRY_CNT,
    &STREAM_TICKETS,
    &STREAM_STAGING_BYTES,
    &STREAM_WORKERS,
    &STREAM_TIMEOUT_MS,
    &STREAM_STUCK_FETCHES,
    &STREAM_TEARDOWN_MS,
    &COPY_THREADS,
    &STORE_PIN_MEMORY_MAX_BYTES,
    &DUMMY_TTL_MS,
    &DUMMY_STAGING_BYTES,
    &DUMMY_MAX_MAPPINGS,
    &DUMMY_MAX_CONNECTIONS,
    &DUMMY_MAX_MAPPED_BYTES,
    &DUMMY_MAX_MAPPED_BYTES_TOTAL,
    &DUMMY_CONNECTIONS,
    &RDMA_MR_QUARANTINE_MS,
    &P2P_QUARANTINE_MS,
    &P2P_DEBUG_TRANSFER_DELAY_MS,
    &DM_LOCK_SHARD_COUNT,
    &OFFLOAD_TOTAL_SIZE_LIMIT_BYTES,
];

/// Every text or switch variable defined here (`docs/configuration.md` has a row for each).
#[cfg_attr(not(test), allow(dead_code))] // read by the tests
pub(crate) const VARS: &[&Var] = &[
    &FORCE_TCP,
    &FORCE_HCA,
    &LOG,
    &METADATA_CLUSTER_ID,
    &STORE_CLUSTER_ID,
    &STORE_MEMCPY,
    &GID_INDEX,
    &RDMA_COMPLETION,
    &DEVICE_RUNTIME,
    &OFFLOAD_FILE_STORAGE_PATH,
    &OFFLOAD_AT_PUT,
    &LOCATION_CACHE,
    &PROMOTION_ON_HIT,
    &CLUSTER_KEY_FILE,
    &TLS_CA_FILE,
    &TLS_SERVER_NAME,
];

/// Parses Mooncake's human-readable sizes: a plain byte count or a number with a
/// `K/KB/KiB/M/MB/MiB/G/GB/GiB/T/TB/TiB` suffix (binary multiples, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return fail(
                ErrorCode::InvalidParams,
                format!("unknown size unit '{other}'"),
            )
        }
    };
    let out_of_range = || {
        fail(
            ErrorCode::InvalidParams,
            format!("size '{text}' out of range"),
        )
    };
    // A whole number is scaled exactly; only a fraction goes through a double (a u64 above
    // 2^53 does not survive one).
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).map_or_else(out_of_range, Ok);
    }
    let value: f64 = match number.parse() {
        Ok(v) => v,
        Err(_) => return fail(ErrorCode::InvalidParams, format!("bad size '{text}'")),
    };
    let bytes = value * multiplier as f64;
    // u64::MAX as f64 is 2^64, itself out of range.
    if !(0.0..u64::MAX as f64).contains(&bytes) {
        return out_of_range();
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};

    #[test]
    fn sizes_parse_like_mooncake() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("4 GB").unwrap(), 4 << 30);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("12 parsecs"), Err(ErrorCode::InvalidParams));
        assert_eq!(parse_size(""), Err(ErrorCode::InvalidParams));
    }

    #[test]
    fn a_knob_reads_by_its_rule() {
        let clamp = Knob::new("T", 10, 2, 20);
        assert_eq!(clamp.read(None), 10);
        assert_eq!(clamp.read(Some(" 7 ")), 7);
        assert_eq!(clamp.read(Some("99")), 20);
        assert_eq!(clamp.read(Some("0")), 2);
        assert_eq!(clamp.read(Some("-3")), 10);
        assert_eq!(clamp.read(Some("1k")), 10, "plain numbers only");
        let strict = clamp.strict();
        assert_eq!(strict.read(Some("99")), 10);
        assert_eq!(strict.read(Some("0")), 10);
        assert_eq!(strict.read(Some("20")), 20);
        assert_eq!(clamp.quiet().read(Some("99")), 20);
        let sizes = Knob::new("T", 10, 1, u64::MAX).sizes();
        assert_eq!(sizes.read(Some("1k")), 1024);
        assert_eq!(sizes.read(Some("1.5 MiB")), 3 << 19);
        assert_eq!(sizes.read(Some("lots")), 10);
        let zero = clamp.zero_is_default();
        assert_eq!(zero.read(Some("0")), 10);
        assert_eq!(zero.read(Some("1")), 2);
        assert_eq!(clamp.parse(" 0 "), Some(0));
        assert_eq!(clamp.parse("x"), None);
    }

    #[test]
    fn the_definitions_keep_their_readers_rules() {
        // Each row: a definition, a value, what it reads as (the rules of the call sites that
        // read these variables before they were defined here).
        let cases: &[(&Knob, Option<&str>, u64)] = &[
            (&DM_LOCK_SHARD_COUNT, None, 1024),
            (&DM_LOCK_SHARD_COUNT, Some("0"), 1024),
            (&DM_LOCK_SHARD_COUNT, Some(" 8 "), 8),
            (&DM_LOCK_SHARD_COUNT, Some("70000"), 65_536),
            (&DM_LOCK_SHARD_COUNT, Some("x"), 1024),
            (&CQ_DEPTH, None, 0),
            (&CQ_DEPTH, Some("0"), 0),
            (&CQ_DEPTH, Some("70000"), 0),
            (&CQ_DEPTH, Some("128"), 128),
            (&MAX_WR, Some("5000"), 256),
            (&IB_RETRY_CNT, Some("0"), 0),
            (&SLICE_SIZE, Some("1024"), 64 << 10),
            (&STORE_CLIENT_MIN_PORT, Some("70000"), 65_535),
            (&STORE_CLIENT_SETUP_RETRIES, Some("0"), 1),
            (&DUMMY_TTL_MS, Some("5"), 100),
            (&DUMMY_CONNECTIONS, Some("0"), 1),
            (&DUMMY_CONNECTIONS, Some("100"), 64),
            (&DUMMY_MAX_MAPPINGS, Some("0"), 0),
            (&STREAM_STAGING_BYTES, Some("16MiB"), 16 << 20),
            (&STREAM_TICKETS, Some("0"), 1),
            (&STREAM_STUCK_FETCHES, Some("5000"), 1024),
            (&STORE_PIN_MEMORY_MAX_BYTES, None, u64::MAX),
            (&STORE_PIN_MEMORY_MAX_BYTES, Some("1 GiB"), u64::MAX),
            (&PING_TIMEOUT_MS, Some("0"), 2000),
            (&RPC_TIMEOUT_MS, Some("soon"), 30_000),
            (&METADATA_CACHE_ENTRIES, Some("0"), 4096),
            (&RPC_SPIN_US, Some("1001"), 100),
        ];
        for (knob, text, want) in cases {
            assert_eq!(knob.read(*text), *want, "{}={text:?}", knob.name);
        }
    }

    #[test]
    fn switches_read_like_mooncake() {
        for (text, want) in [("1", true), (" ON ", true), ("yes", true), ("True", true)] {
            assert_eq!(switch(text), Some(want));
        }
        for text in ["0", "off", "No", "FALSE"] {
            assert_eq!(switch(text), Some(false));
        }
        assert_eq!(switch("maybe"), None);
        // Unset: the default's meaning (this name is set nowhere).
        let unset = |default| Var {
            name: "MC_ENV_RS_TEST_NEVER_SET",
            default,
        };
        assert!(unset("1").flag());
        assert!(!unset("").flag());
    }

    #[test]
    fn the_definitions_are_sane() {
        let mut names = HashSet::new();
        for name in all_names() {
            assert!(names.insert(name), "{name} is defined twice");
            assert!(name.starts_with("MC_") || name.starts_with("MOONCAKE_"));
        }
        for knob in KNOBS {
            assert!(knob.min <= knob.max, "{}", knob.name);
            // MC_CQ_DEPTH's default 0 stands for MC_MAX_WR's value.
            if knob.name != CQ_DEPTH.name {
                assert!(
                    (knob.min..=knob.max).contains(&knob.default),
                    "{}'s default is out of its range",
                    knob.name
                );
            }
        }
    }

    fn all_names() -> impl Iterator<Item = &'static str> {
        KNOBS
            .iter()
            .map(|knob| knob.name)
            .chain(VARS.iter().map(|var| var.name))
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The variable names quoted (`"MC_…"`, `"MOONCAKE_…"`) on the code lines of `line`.
    fn quoted_names(line: &str) -> Vec<&str> {
        let mut names = Vec::new();
        for prefix in ["\"MC_", "\"MOONCAKE_"] {
            let mut rest = line;
            while let Some(at) = rest.find(prefix) {
                let tail = &rest[at + 1..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(tail.len());
                names.push(&tail[..end]);
                rest = &tail[end..];
            }
        }
        names
    }

    #[test]
    fn every_definition_has_a_row_in_docs_configuration_md() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let docs = read(Path::new(path));
        let rows: HashSet<&str> = docs
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        let defined: HashSet<&str> = all_names().collect();
        for name in &defined {
            assert!(
                rows.contains(name),
                "docs/configuration.md has no row `| `{name}` |`"
            );
        }
        for row in &rows {
            if row.starts_with("MC_") || row.starts_with("MOONCAKE_") {
                assert!(
                    defined.contains(row),
                    "docs/configuration.md lists {row}, which env.rs does not define"
                );
            }
        }
        // Every name this file spells out is in KNOBS or VARS (a definition left out of the
        // lists would escape the check above).
        let source = read(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/env.rs"
        )));
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for name in quoted_names(line) {
                assert!(
                    defined.contains(name),
                    "{name} is defined but not in KNOBS or VARS"
                );
            }
        }
    }

    /// Calls that read the process environment.
    const READS: [&str; 5] = [
        "env::var",
        "var_os(",
        "getenv(",
        "from_default_env(",
        "try_from_env(",
    ];

    /// `1`-based numbers and text of the lines of `source` outside test code that read the
    /// environment or quote a variable's name. Test code: an inline module under
    /// `#[cfg(test)]` (up to its closing brace at the attribute's indentation; rustfmt's
    /// layout); other `#[cfg(test)]` items are scanned like code. Comment lines are skipped.
    fn stray_reads(source: &str) -> Vec<(usize, String)> {
        let lines: Vec<&str> = source.lines().collect();
        let mut found = Vec::new();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            if line.trim() == "#[cfg(test)]" {
                let mut item = i + 1;
                while lines
                    .get(item)
                    .is_some_and(|l| l.trim_start().starts_with("#["))
                {
                    item += 1;
                }
                let text = lines.get(item).map_or("", |l| l.trim());
                if module_name(text).is_some() && text.ends_with('{') {
                    let close = format!("{}}}", &line[..line.len() - line.trim_start().len()]);
                    i = item;
                    while i < lines.len() && lines[i] != close {
                        i += 1;
                    }
                    i += 1;
                    continue;
                }
            }
            let code = line.trim_start();
            let reads = READS.iter().any(|call| code.contains(call));
            if !code.starts_with("//") && (reads || !quoted_names(code).is_empty()) {
                found.push((i + 1, code.to_string()));
            }
            i += 1;
        }
        found
    }

    /// The name of the module `line` declares (`mod x;`, `pub(crate) mod x {`), if it does.
    fn module_name(line: &str) -> Option<&str> {
        let rest = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "));
        let rest = rest.unwrap_or(line).strip_prefix("mod ")?;
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
        Some(&rest[..end])
    }

    /// Every `.rs` file under `dir`.
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                out.push(path);
            }
        }
    }

    /// The files of the modules declared `#[cfg(test)] mod x;` (and every module below one).
    fn test_only_files(files: &[(PathBuf, String)]) -> HashSet<PathBuf> {
        let mut test_only = HashSet::new();
        loop {
            let before = test_only.len();
            for (path, source) in files {
                let whole = test_only.contains(path);
                let lines: Vec<&str> = source.lines().collect();
                for (at, line) in lines.iter().enumerate() {
                    let Some(name) =
                        module_name(line.trim()).filter(|_| line.trim().ends_with(';'))
                    else {
                        continue;
                    };
                    let annotated = lines[..at]
                        .iter()
                        .rev()
                        .take_while(|l| l.trim_start().starts_with("#["))
                        .any(|l| l.trim() == "#[cfg(test)]");
                    if !(whole || annotated) {
                        continue;
                    }
                    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
                    let dir = match file {
                        "mod.rs" | "lib.rs" | "main.rs" => path.parent().unwrap().to_path_buf(),
                        _ => path.with_extension(""),
                    };
                    test_only.insert(dir.join(format!("{name}.rs")));
                    test_only.insert(dir.join(name).join("mod.rs"));
                }
            }
            if test_only.len() == before {
                return test_only;
            }
        }
    }

    #[test]
    fn the_scan_finds_reads_outside_tests_only() {
        let source = "use std::env;\n\
            fn a() -> Option<String> { env::var(\"X\").ok() }\n\
            /// Reads `MC_THING` (\"MC_THING\" in a comment).\n\
            const B: &str = \"MC_THING\";\n\
            #[cfg(test)]\n\
            fn helper() { let _ = std::env::var_os(\"Y\"); }\n\
            #[cfg(test)]\n\
            mod tests {\n    fn t() { std::env::set_var(\"MC_THING\", \"1\"); }\n}\n\
            fn c() {}\n";
        let lines: Vec<usize> = stray_reads(source).into_iter().map(|(n, _)| n).collect();
        assert_eq!(lines, [2, 4, 6]);
        assert_eq!(
            module_name("pub(crate) mod test_support;"),
            Some("test_support")
        );
        assert_eq!(module_name("mod tests {"), Some("tests"));
        assert_eq!(module_name("model();"), None);
    }

    #[test]
    fn only_env_rs_reads_the_environment() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let src = root.join("src");
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        paths.sort();
        let files: Vec<(PathBuf, String)> = paths
            .into_iter()
            .filter(|p| !p.starts_with(src.join("bin")) && *p != src.join("env.rs"))
            .map(|p| {
                let source = read(&p);
                (p, source)
            })
            .collect();
        let test_only = test_only_files(&files);
        assert!(test_only.contains(&src.join("transfer/rdma/tests.rs")));
        let mut stray = Vec::new();
        for (path, source) in files.iter().filter(|(p, _)| !test_only.contains(p)) {
            for (line, text) in stray_reads(source) {
                let file = path.strip_prefix(root).unwrap_or(path).display();
                stray.push(format!("{file}:{line}: {text}"));
            }
        }
        assert!(
            stray.is_empty(),
            "only src/env.rs reads the environment (define the variable there and use its \
             Knob/Var):\n{}",
            stray.join("\n")
        );
    }
}
