//! The checker: reads every worker's journal and the fault driver's windows and decides,
//! with no help from the store, whether every successful read returned a write the store
//! promised could be there, and whether every call returned within its limit.
//!
//! A read of `key` over `[rb, re]` that returned version `v` (its bytes already checked by the
//! worker) is a violation when
//! - `v` was never written to `key`, or its write began after `re` (bytes from the future);
//! - the write of `v` returned success at `e` and some later upsert of `key` that began after
//!   `e` returned success before `rb` (superseded), or a removal of `key` that began after
//!   `e` succeeded before `rb` (removed; `remove_all` skips leased objects, so its success
//!   proves nothing about one key). A put's success does not
//!   supersede: a put of an existing key returns 0 without writing (Mooncake's `Put`).
//!
//! A write that failed or never returned (its worker was killed) may have committed at any
//! time after it began, so it supersedes nothing and is never superseded: the checks stay
//! sound whatever the store did with it. The exception: a write that failed with one of the
//! [`DEFINITIVE`] codes is known not to have committed, so a read returning its version is a
//! violation whenever it happened (also while the write was still in flight). The
//! copying batch writes (`put_batch`, `upsert_batch`) return one code for the whole batch,
//! so their failures stay possibly committed. A P2P put (`p2p_put_*`, `p2p_batch_put_*`)
//! never overwrites (`OBJECT_ALREADY_EXISTS` for an existing key), so its success
//! supersedes like an upsert's.
//!
//! Every call must return within its documented limit ([`call_limit_ns`]): the sum of the
//! client timeouts of the stages on its path.

use crate::journal::Event;
use mooncake_rs::ErrorCode;
use std::collections::HashMap;
use std::fmt::Write as _;

/// One journaled event with the journal (worker incarnation) it came from.
#[derive(Clone, Debug)]
pub struct Tagged {
    pub source: String,
    pub event: Event,
}

/// A fault window: `kind` applied to `target` over `[start, end]`.
#[derive(Clone, Debug)]
pub struct FaultWindow {
    pub kind: &'static str,
    pub target: String,
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug)]
struct Write {
    op: String,
    begin: u64,
    /// Return time and code, if it returned.
    end: Option<(u64, i32)>,
}

/// Failure codes of a write that guarantee it did not commit: each is an answer from the
/// master (or a P2P owner) that refused or discarded the write before making it visible, or
/// a local failure after which the writer revokes instead of committing. Not here:
/// `RPC_FAIL` / `RPC_TIMEOUT` (the end may have been applied and its answer lost),
/// `INTERNAL_ERROR`, and a write that never returned.
pub const DEFINITIVE: &[ErrorCode] = &[
    ErrorCode::SegmentNotFound,
    ErrorCode::ClientNotFound,
    ErrorCode::NoAvailableHandle,
    ErrorCode::InvalidParams,
    ErrorCode::IllegalClient,
    ErrorCode::InvalidWrite,
    ErrorCode::InvalidReplica,
    ErrorCode::ObjectNotFound,
    ErrorCode::ObjectAlreadyExists,
    ErrorCode::ObjectHasLease,
    ErrorCode::LeaseExpired,
    ErrorCode::ObjectReplicaBusy,
    ErrorCode::TransferFail,
    ErrorCode::TaskPendingLimitExceeded,
    ErrorCode::Cancelled,
    ErrorCode::StaleWriteToken,
];

/// Whether a write by `op` that failed with `rc` certainly did not commit.
fn definitive(op: &str, rc: i32) -> bool {
    !matches!(op, "put_batch" | "upsert_batch") && DEFINITIVE.iter().any(|c| c.code() == rc)
}

/// Whether the success of a write by `op` proves its bytes replaced any older version.
fn supersedes(op: &str) -> bool {
    op.starts_with("upsert") || op.starts_with("p2p_put") || op.starts_with("p2p_batch_put")
}

/// The client timeouts every worker runs with (milliseconds).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub rpc_ms: u64,
    pub connect_ms: u64,
    pub transfer_ms: u64,
}

/// The documented bound of one call of `op`: per RPC on its path a connect and a request
/// timeout, per transfer round a connect and a transfer timeout. Stages: a write asks
/// (PutStart), moves the bytes, then ends or revokes; a read asks for replicas, moves the
/// bytes and may release a pin; a session read adds its start and end, a multi-buffer read
/// its size query; a P2P put may list owners, reserve, move and commit or revoke (the
/// owner's own master call runs inside the accessor's commit timeout); a P2P read looks up
/// the route, pins, moves and unpins, and retries once with a fresh route; a remove is one
/// RPC (a P2P remove two: route, remove). On-stream calls run the same stages as their
/// synchronous twins.
pub fn call_limit_ns(op: &str, t: Timeouts) -> u64 {
    let (rpcs, transfers) = match op {
        "remove" | "batch_remove" | "remove_all" => (1, 0),
        "p2p_remove" => (2, 0),
        "session_get" | "get_multi" => (4, 1),
        op if op.starts_with("p2p_put") || op.starts_with("p2p_batch_put") => (4, 1),
        op if op.starts_with("p2p_") => (6, 2),
        // Writes and the other reads.
        _ => (3, 1),
    };
    let rpc = t.connect_ms + t.rpc_ms;
    let transfer = t.connect_ms + t.transfer_ms;
    (rpcs * rpc + transfers * transfer) * 1_000_000
}

impl Write {
    fn committed_at(&self) -> Option<u64> {
        match self.end {
            Some((at, 0)) => Some(at),
            _ => None,
        }
    }

    /// The code it failed with, when that proves it never committed.
    fn definitely_failed(&self) -> Option<i32> {
        match self.end {
            Some((_, rc)) if rc != 0 && definitive(&self.op, rc) => Some(rc),
            _ => None,
        }
    }
}

/// Intervals `[begin, end]` of successful calls, answering "did one begin after `t` and end
/// before `u`?" in O(log n).
#[derive(Default)]
struct Spans {
    /// Sorted by begin.
    spans: Vec<(u64, u64)>,
    /// `suffix_min[i]`: index of the earliest-ending span among `spans[i..]`.
    suffix_min: Vec<usize>,
}

impl Spans {
    fn new(mut spans: Vec<(u64, u64)>) -> Spans {
        spans.sort_unstable();
        let mut suffix_min = vec![0; spans.len()];
        for i in (0..spans.len()).rev() {
            suffix_min[i] = match suffix_min.get(i + 1) {
                Some(&next) if spans[next].1 < spans[i].1 => next,
                _ => i,
            };
        }
        Spans { spans, suffix_min }
    }

    /// A span that began after `after` and ended before `before`.
    fn between(&self, after: u64, before: u64) -> Option<(u64, u64)> {
        let first = self.spans.partition_point(|&(b, _)| b <= after);
        let best = self.spans[*self.suffix_min.get(first)?];
        (best.1 < before).then_some(best)
    }
}

/// One violation, printable with its context.
#[derive(Debug)]
pub struct Violation {
    pub key: String,
    pub op: String,
    pub what: String,
    pub begin: u64,
    pub end: u64,
}

/// Per operation: calls, successes, failures, violations, and calls that overlapped each
/// fault kind.
#[derive(Default, Debug, Clone)]
pub struct OpCounts {
    pub calls: u64,
    pub ok: u64,
    pub failed: u64,
    pub violations: u64,
    /// The longest call, and the documented limit of one.
    pub worst_ns: u64,
    pub limit_ns: u64,
    pub during: HashMap<&'static str, u64>,
}

/// Everything the checker found.
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub ops: HashMap<String, OpCounts>,
    pub longest_call_ns: u64,
    /// The formatted key histories and interleavings of the first violations.
    pub details: String,
}

/// The facts the rules need, indexed.
struct History<'a> {
    writes: HashMap<(&'a str, u64), Write>,
    committed: HashMap<&'a str, Spans>,
    removals: HashMap<&'a str, Spans>,
}

impl<'a> History<'a> {
    fn new(events: &'a [Tagged]) -> History<'a> {
        let mut writes: HashMap<(&str, u64), Write> = HashMap::new();
        let mut removals: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for tagged in events {
            match &tagged.event {
                Event::WriteBegin {
                    at,
                    op,
                    key,
                    version,
                } => {
                    let write = Write {
                        op: op.clone(),
                        begin: *at,
                        end: None,
                    };
                    writes.insert((key, *version), write);
                }
                Event::WriteEnd {
                    at,
                    key,
                    version,
                    rc,
                } => {
                    if let Some(write) = writes.get_mut(&(key.as_str(), *version)) {
                        write.end = Some((*at, *rc));
                    }
                }
                // remove_all skips objects with a lease, so its success proves nothing
                // about one key.
                Event::Remove { key, .. } if key == "*" => {}
                Event::Remove {
                    begin,
                    end,
                    key,
                    rc: 0,
                    ..
                } => removals.entry(key).or_default().push((*begin, *end)),
                _ => {}
            }
        }
        let mut committed: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for ((key, _), write) in &writes {
            // A successful put of a key that exists returns 0 without writing (Mooncake's
            // `Put`), so only an upsert's (or a P2P put's) success proves its bytes replaced
            // the old ones.
            if !supersedes(&write.op) {
                continue;
            }
            if let Some(end) = write.committed_at() {
                committed.entry(key).or_default().push((write.begin, end));
            }
        }
        History {
            writes,
            committed: committed
                .into_iter()
                .map(|(k, v)| (k, Spans::new(v)))
                .collect(),
            removals: removals
                .into_iter()
                .map(|(k, v)| (k, Spans::new(v)))
                .collect(),
        }
    }

    /// Why a read of `key` over `[rb, re]` may not return `version`, if it may not.
    fn forbids(&self, key: &str, version: u64, rb: u64, re: u64) -> Option<String> {
        let Some(write) = self.writes.get(&(key, version)) else {
            return Some(format!(
                "version {version:#x} was never written to this key"
            ));
        };
        if write.begin > re {
            return Some(format!(
                "version {version:#x} was read before its write began"
            ));
        }
        if let Some(rc) = write.definitely_failed() {
            return Some(format!(
                "version {version:#x} was read, but its {} failed with {rc} ({}): never committed",
                write.op,
                ErrorCode::from_i32(rc).map_or("?", ErrorCode::name)
            ));
        }
        let done = write.committed_at()?;
        let later = |spans: Option<&Spans>| spans.and_then(|s| s.between(done, rb));
        if let Some((b, e)) = later(self.committed.get(key)) {
            return Some(format!(
                "version {version:#x} (committed at {done}) after a later write [{b}, {e}] had committed"
            ));
        }
        if let Some((b, e)) = later(self.removals.get(key)) {
            return Some(format!(
                "version {version:#x} (committed at {done}) after a removal [{b}, {e}] had succeeded"
            ));
        }
        None
    }
}

/// One call's interval and outcome, for counting.
struct Call<'a> {
    key: &'a str,
    op: &'a str,
    begin: u64,
    end: u64,
    ok: bool,
}

/// Every call in the journals (writes that never returned are not calls that ended).
fn calls<'a>(events: &'a [Tagged], history: &'a History<'a>) -> Vec<Call<'a>> {
    let mut calls = Vec::new();
    for ((key, _), write) in &history.writes {
        if let Some((end, rc)) = write.end {
            calls.push(Call {
                key,
                op: &write.op,
                begin: write.begin,
                end,
                ok: rc == 0,
            });
        }
    }
    for tagged in events {
        match &tagged.event {
            Event::Remove {
                begin,
                end,
                op,
                key,
                rc,
            }
            | Event::Read {
                begin,
                end,
                op,
                key,
                rc,
                ..
            } => calls.push(Call {
                key,
                op,
                begin: *begin,
                end: *end,
                ok: *rc == 0,
            }),
            Event::Corrupt {
                begin,
                end,
                op,
                key,
                ..
            } => calls.push(Call {
                key,
                op,
                begin: *begin,
                end: *end,
                ok: true,
            }),
            _ => {}
        }
    }
    calls
}

/// Checks `events` (all journals) against the rules above, with calls longer than their
/// [`call_limit_ns`] under `timeouts` also violations. `faults` must be sorted by start and
/// not overlap (the driver injects one at a time).
pub fn check(events: &[Tagged], faults: &[FaultWindow], timeouts: Timeouts) -> Verdict {
    let history = History::new(events);
    let calls = calls(events, &history);
    let mut violations = Vec::new();
    for tagged in events {
        match &tagged.event {
            Event::Corrupt {
                begin,
                end,
                op,
                key,
                detail,
            } => violations.push(Violation {
                key: key.clone(),
                op: op.clone(),
                what: format!("wrong bytes: {detail}"),
                begin: *begin,
                end: *end,
            }),
            Event::Read {
                begin,
                end,
                op,
                key,
                version,
                rc: 0,
            } => {
                if let Some(what) = history.forbids(key, *version, *begin, *end) {
                    violations.push(Violation {
                        key: key.clone(),
                        op: op.clone(),
                        what,
                        begin: *begin,
                        end: *end,
                    });
                }
            }
            _ => {}
        }
    }
    let mut longest = 0;
    let mut ops: HashMap<String, OpCounts> = HashMap::new();
    for call in &calls {
        let took = call.end.saturating_sub(call.begin);
        longest = longest.max(took);
        let call_limit_ns = call_limit_ns(call.op, timeouts);
        if took > call_limit_ns {
            violations.push(Violation {
                key: call.key.into(),
                op: call.op.into(),
                what: format!(
                    "took {} ms, past the {} ms limit",
                    took / 1_000_000,
                    call_limit_ns / 1_000_000
                ),
                begin: call.begin,
                end: call.end,
            });
        }
        let counts = ops.entry(call.op.to_string()).or_default();
        counts.calls += 1;
        counts.worst_ns = counts.worst_ns.max(took);
        counts.limit_ns = call_limit_ns;
        if call.ok {
            counts.ok += 1;
        } else {
            counts.failed += 1;
        }
        let first = faults.partition_point(|f| f.end < call.begin);
        for fault in faults[first..].iter().take_while(|f| f.start <= call.end) {
            *counts.during.entry(fault.kind).or_default() += 1;
        }
    }
    for violation in &violations {
        if let Some(counts) = ops.get_mut(violation.op.as_str()) {
            counts.violations += 1;
        }
    }
    let details = describe(events, faults, &violations);
    Verdict {
        violations,
        ops,
        longest_call_ns: longest,
        details,
    }
}

/// The first violations, each with its key's whole history and the faults around it.
fn describe(events: &[Tagged], faults: &[FaultWindow], violations: &[Violation]) -> String {
    let mut details = String::new();
    for violation in violations.iter().take(5) {
        let _ = writeln!(
            details,
            "VIOLATION key {}: {} {} (call over [{}, {}])",
            violation.key, violation.op, violation.what, violation.begin, violation.end
        );
        let _ = writeln!(details, "  history of {} (time-ordered):", violation.key);
        let mut history: Vec<(u64, String)> = events
            .iter()
            .filter_map(|t| {
                let (at, key) = match &t.event {
                    Event::WriteBegin { at, key, .. } | Event::WriteEnd { at, key, .. } => {
                        (*at, key)
                    }
                    Event::Read { begin, key, .. }
                    | Event::Corrupt { begin, key, .. }
                    | Event::Remove { begin, key, .. } => (*begin, key),
                    Event::Traffic { .. } => return None,
                };
                (key == &violation.key || key == "*")
                    .then(|| (at, format!("{} {:?}", t.source, t.event)))
            })
            .collect();
        history.sort();
        for (_, line) in history {
            let _ = writeln!(details, "    {line}");
        }
        let margin = 10_000_000_000;
        let _ = writeln!(details, "  faults within 10 s:");
        for fault in faults {
            if fault.start <= violation.end + margin && fault.end + margin >= violation.begin {
                let _ = writeln!(
                    details,
                    "    {} {} [{}, {}]",
                    fault.kind, fault.target, fault.start, fault.end
                );
            }
        }
    }
    details
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(event: Event) -> Tagged {
        Tagged {
            source: "t".into(),
            event,
        }
    }

    const NO_LIMIT: Timeouts = Timeouts {
        rpc_ms: u64::MAX / 64_000_000,
        connect_ms: 0,
        transfer_ms: 0,
    };

    fn write(key: &str, version: u64, begin: u64, end: u64, rc: i32) -> [Tagged; 2] {
        write_by("upsert", key, version, (begin, end), rc)
    }

    fn write_by(
        op: &str,
        key: &str,
        version: u64,
        (begin, end): (u64, u64),
        rc: i32,
    ) -> [Tagged; 2] {
        [
            tagged(Event::WriteBegin {
                at: begin,
                op: op.into(),
                key: key.into(),
                version,
            }),
            tagged(Event::WriteEnd {
                at: end,
                key: key.into(),
                version,
                rc,
            }),
        ]
    }

    fn read(key: &str, version: u64, begin: u64, end: u64) -> Tagged {
        tagged(Event::Read {
            begin,
            end,
            op: "get".into(),
            key: key.into(),
            version,
            rc: 0,
        })
    }

    #[test]
    fn stale_phantom_and_removed_reads_are_violations() {
        let mut events: Vec<Tagged> = Vec::new();
        events.extend(write("a", 1, 10, 20, 0));
        events.extend(write("a", 2, 30, 40, 0));
        events.push(read("a", 2, 50, 60)); // fine
        events.push(read("a", 1, 35, 45)); // fine: overlaps the second write
        assert!(check(&events, &[], NO_LIMIT).violations.is_empty());
        events.push(read("a", 1, 50, 60)); // stale
        events.push(read("a", 9, 50, 60)); // never written
        events.push(read("b", 1, 50, 60)); // another key's version
        let verdict = check(&events, &[], NO_LIMIT);
        assert_eq!(verdict.violations.len(), 3, "{:?}", verdict.violations);
        let mut removed: Vec<Tagged> = write("c", 5, 10, 20, 0).into();
        removed.push(tagged(Event::Remove {
            begin: 25,
            end: 26,
            op: "remove_all".into(),
            key: "*".into(),
            rc: 0,
        }));
        removed.push(read("c", 5, 30, 31));
        assert!(check(&removed, &[], NO_LIMIT).violations.is_empty());
        removed.push(tagged(Event::Remove {
            begin: 32,
            end: 33,
            op: "remove".into(),
            key: "c".into(),
            rc: 0,
        }));
        removed.push(read("c", 5, 34, 35));
        assert_eq!(check(&removed, &[], NO_LIMIT).violations.len(), 1);
        // A failed or unfinished write may commit late: no constraint.
        let mut late: Vec<Tagged> = write("d", 1, 10, 20, -1).into();
        late.extend(write("d", 2, 30, 40, 0));
        late.push(read("d", 1, 50, 60));
        assert!(check(&late, &[], NO_LIMIT).violations.is_empty());
        // A put's success may be a no-op on an existing key: it supersedes nothing.
        let mut noop: Vec<Tagged> = write("e", 1, 10, 20, 0).into();
        noop.push(tagged(Event::WriteBegin {
            at: 30,
            op: "put".into(),
            key: "e".into(),
            version: 2,
        }));
        noop.push(tagged(Event::WriteEnd {
            at: 40,
            key: "e".into(),
            version: 2,
            rc: 0,
        }));
        noop.push(read("e", 1, 50, 60));
        assert!(check(&noop, &[], NO_LIMIT).violations.is_empty());
        // Slow calls: with every timeout 0 each call of 10 ns is past its limit.
        let instant = Timeouts {
            rpc_ms: 0,
            connect_ms: 0,
            transfer_ms: 0,
        };
        assert_eq!(check(&late, &[], instant).violations.len(), 3);
    }

    #[test]
    fn a_definitively_failed_write_is_never_read() {
        let stale_token = ErrorCode::StaleWriteToken.code();
        // Its bytes read back, even while it is in flight: a violation.
        let mut events: Vec<Tagged> = write("a", 1, 10, 20, stale_token).into();
        events.push(read("a", 1, 15, 16));
        let verdict = check(&events, &[], NO_LIMIT);
        assert_eq!(verdict.violations.len(), 1, "{:?}", verdict.violations);
        assert!(verdict.violations[0].what.contains("STALE_WRITE_TOKEN"));
        // RPC_FAIL may hide a commit whose answer was lost: no constraint.
        let mut events: Vec<Tagged> = write("b", 1, 10, 20, ErrorCode::RpcFail.code()).into();
        events.push(read("b", 1, 30, 31));
        assert!(check(&events, &[], NO_LIMIT).violations.is_empty());
        // A copying batch reports one code for every key: no constraint either.
        let no_handle = ErrorCode::NoAvailableHandle.code();
        let mut events: Vec<Tagged> = write_by("put_batch", "c", 1, (10, 20), no_handle).into();
        events.push(read("c", 1, 30, 31));
        assert!(check(&events, &[], NO_LIMIT).violations.is_empty());
        let mut events: Vec<Tagged> = write_by("put_multi", "c", 1, (10, 20), no_handle).into();
        events.push(read("c", 1, 30, 31));
        assert_eq!(check(&events, &[], NO_LIMIT).violations.len(), 1);
    }

    #[test]
    fn a_p2p_put_supersedes_and_limits_follow_the_stages() {
        let mut events: Vec<Tagged> = write_by("p2p_put_rev", "p/1", 1, (10, 20), 0).into();
        events.extend(write_by("p2p_batch_put_fwd", "p/1", 2, (30, 40), 0));
        events.push(read("p/1", 1, 35, 45)); // overlaps the second put: fine
        assert!(check(&events, &[], NO_LIMIT).violations.is_empty());
        events.push(read("p/1", 1, 50, 60)); // after it: stale
        assert_eq!(check(&events, &[], NO_LIMIT).violations.len(), 1);
        let t = Timeouts {
            rpc_ms: 5,
            connect_ms: 1,
            transfer_ms: 2,
        };
        assert_eq!(call_limit_ns("remove", t), 6_000_000);
        assert_eq!(call_limit_ns("put", t), 21_000_000);
        assert_eq!(call_limit_ns("p2p_get_fwd", t), 42_000_000);
        assert_eq!(call_limit_ns("p2p_batch_put_rev", t), 27_000_000);
    }
}
