//! The P2P (V3) operations of a worker, on the soak's second cluster (a `mooncake_master
//! --deployment_mode P2P` and its `mooncake_client --deployment_mode P2P` owners) through the
//! worker's [`P2pClient`] accessor, on their own key space (`p/N`): puts and gets in both
//! directions (FORWARD: the accessor's engine moves the bytes; REVERSE: the owner's), batch
//! puts and gets, and removes. Values are self-describing ([`crate::value`]) and journaled
//! like the pool's; a P2P put never overwrites (`OBJECT_ALREADY_EXISTS` for a key that
//! exists), so its success supersedes any older version of the key (see the checker).

use crate::journal::{now_ns, Event};
use crate::value;
use crate::worker::Worker;
use mooncake_rs::p2p::{RequestOptions, TransferDirection};

/// The key prefix of the P2P cluster's key space.
pub const P2P_PREFIX: &str = "p";

fn direction_of(op: &str) -> TransferDirection {
    if op.ends_with("_fwd") {
        TransferDirection::Forward
    } else {
        TransferDirection::Reverse
    }
}

impl Worker {
    /// `p2p_put_fwd` / `p2p_put_rev` (one key) and `p2p_batch_put_fwd` / `_rev` (1–4 keys)
    /// to a random live owner.
    pub(crate) fn p2p_put(&mut self, op: &str) -> std::io::Result<()> {
        let count = if op.contains("batch") {
            self.rng.usize(1..=4)
        } else {
            1
        };
        let keys = self.distinct_keys_in(P2P_PREFIX, count);
        let mut versions = Vec::with_capacity(keys.len());
        let mut values = Vec::with_capacity(keys.len());
        for key in &keys {
            let version = self.version();
            let len = self.length().min(self.args.max_value);
            values.push(value::build(key, version, len));
            versions.push(version);
            self.begin(op, key, version)?;
        }
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let value_refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let results = self.p2p.batch_put(
            &key_refs,
            &value_refs,
            &RequestOptions::direction(direction_of(op)),
        );
        for ((key, version), result) in keys.iter().zip(&versions).zip(results) {
            self.end(key, *version, result.err().map_or(0, |code| code.code()))?;
        }
        Ok(())
    }

    /// `p2p_get_fwd` / `p2p_get_rev` (one key) and `p2p_batch_get_fwd` / `_rev` (1–4 keys)
    /// into fresh zeroed buffers of the largest value size; every byte checked.
    pub(crate) fn p2p_get(&mut self, op: &str) -> std::io::Result<()> {
        let count = if op.contains("batch") {
            self.rng.usize(1..=4)
        } else {
            1
        };
        let keys = self.distinct_keys_in(P2P_PREFIX, count);
        let size = self.args.max_value.max(value::HEADER_LEN);
        let mut outs: Vec<Vec<u8>> = keys.iter().map(|_| vec![0u8; size]).collect();
        let begin = now_ns();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut views: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        let results = self.p2p.batch_get_into(
            &key_refs,
            &mut views,
            &RequestOptions::direction(direction_of(op)),
        );
        for ((key, result), out) in keys.iter().zip(results).zip(&outs) {
            let bytes = result.map(|n| &out[..(n as usize).min(out.len())]);
            self.record_whole(op, begin, key, bytes)?;
        }
        Ok(())
    }

    /// `p2p_remove`: one key at its owner.
    pub(crate) fn p2p_remove(&mut self) -> std::io::Result<()> {
        let key = self
            .distinct_keys_in(P2P_PREFIX, 1)
            .pop()
            .unwrap_or_default();
        let begin = now_ns();
        let result = self.p2p.remove(&key);
        self.journal.record(&Event::Remove {
            begin,
            end: now_ns(),
            op: "p2p_remove".into(),
            key,
            rc: result.err().map_or(0, |code| code.code()),
        })
    }
}
