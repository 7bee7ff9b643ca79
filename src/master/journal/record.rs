//! What the master journals, and the state those records fold into.
//!
//! The journal keeps what must survive a restart: the mounted segments (with their epochs),
//! committed objects and where their replicas are (memory ranges, or a record in a client's
//! SSD tier), removals, and the write-token ceiling.
//! Not journaled: writes in flight (a restart loses them), read leases and pins (the owners'
//! new epochs fence their holders), clients' liveness (they re-register at their next ping).
//!
//! [`JournalState`] is plain data, folded by replay and by compaction; records apply in LSN
//! order, and a replica counts only while its segment is mounted under an epoch the replica
//! was written in (a remount with fresh memory ends the replicas of the earlier mount; a
//! re-attach that kept the memory carries them over).

use crate::types::{ClientId, Segment, SegmentId, Uuid};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Where one replica of a committed object lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReplicaRecord {
    pub id: u64,
    pub segment: SegmentId,
    /// The segment mount the bytes were written under.
    pub epoch: u64,
    /// Offset inside the segment.
    pub offset: u64,
    /// Allocated (rounded) length.
    pub size: u64,
}

/// A committed object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ObjectRecord {
    /// Generation (the write token of the write that committed it).
    pub id: u64,
    /// Length in bytes.
    pub size: u64,
    pub hard_pinned: bool,
    /// Soft pin length still to run when committed (restarted from the recovery on).
    pub soft_pin_ms: Option<u64>,
    pub replicas: Vec<ReplicaRecord>,
}

/// Where a committed object's only copy is when it is on disk: a record of a client's SSD
/// tier (the tier's directory identity, stable across owner restarts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DiskCopy {
    /// The tier.
    pub tier: Uuid,
    /// The object generation the record was written for.
    pub generation: u64,
}

/// One journal record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Record {
    /// `client` mounted `segment` (a first mount, or a remount under a new epoch). With
    /// `adopted_from`, the owner re-attached the same memory it had mounted under that epoch:
    /// replicas written under it stay.
    Mount {
        client: ClientId,
        segment: Segment,
        adopted_from: Option<u64>,
    },
    /// The segment is gone (unmounted, its owner expired, or it never re-attached).
    Unmount { segment: SegmentId },
    /// `key` is readable as `object` (replacing any earlier value).
    Commit { key: String, object: ObjectRecord },
    /// `key` is gone (removed, evicted, or being rewritten).
    Remove { key: String },
    /// No write token at or above this value was handed out by the journaling master.
    TokenCeiling(u64),
    /// `key` is readable as `object`, whose only copy is the SSD tier record `disk` (a
    /// demotion; `object.replicas` is empty). Last, so older records keep their encoding.
    DiskCommit {
        key: String,
        object: ObjectRecord,
        disk: DiskCopy,
    },
}

/// A mounted segment as the journal knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SegmentState {
    pub client: ClientId,
    pub segment: Segment,
    /// Epochs whose replicas are still valid: the current one and those it adopted.
    pub epochs: Vec<u64>,
}

/// The fold of a journal: what a restarted master starts from. Plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JournalState {
    pub segments: HashMap<SegmentId, SegmentState>,
    pub objects: HashMap<String, ObjectRecord>,
    pub token_ceiling: u64,
    /// The objects of `objects` whose copy is on disk, and where.
    pub disk: HashMap<String, DiskCopy>,
}

impl JournalState {
    /// Applies one record.
    pub(crate) fn apply(&mut self, record: Record) {
        match record {
            Record::Mount {
                client,
                segment,
                adopted_from,
            } => {
                let mut epochs = match self.segments.remove(&segment.id) {
                    Some(old) if adopted_from.is_some_and(|e| old.epochs.contains(&e)) => {
                        old.epochs
                    }
                    _ => Vec::new(),
                };
                epochs.push(segment.epoch);
                self.segments.insert(
                    segment.id,
                    SegmentState {
                        client,
                        segment,
                        epochs,
                    },
                );
            }
            Record::Unmount { segment } => {
                self.segments.remove(&segment);
            }
            Record::Commit { key, object } => {
                self.disk.remove(&key);
                self.objects.insert(key, object);
            }
            Record::DiskCommit { key, object, disk } => {
                self.disk.insert(key.clone(), disk);
                self.objects.insert(key, object);
            }
            Record::Remove { key } => {
                self.objects.remove(&key);
                self.disk.remove(&key);
            }
            Record::TokenCeiling(ceiling) => {
                self.token_ceiling = self.token_ceiling.max(ceiling);
            }
        }
    }

    /// Drops replicas whose mount is gone and objects left without any (objects on disk
    /// stay), and writes every surviving replica under its segment's current epoch (so each
    /// segment needs only that one epoch afterwards). What snapshots store and recovery
    /// starts from.
    pub(crate) fn settle(&mut self) {
        let segments = &self.segments;
        let disk = &self.disk;
        self.objects.retain(|key, object| {
            object.replicas.retain_mut(|replica| {
                let Some(state) = segments.get(&replica.segment) else {
                    return false;
                };
                if !state.epochs.contains(&replica.epoch) {
                    return false;
                }
                replica.epoch = state.segment.epoch;
                true
            });
            !object.replicas.is_empty() || disk.contains_key(key)
        });
        for state in self.segments.values_mut() {
            state.epochs = vec![state.segment.epoch];
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::types::Uuid;

    /// A 1 MiB segment `id` mounted under `epoch`.
    pub(in crate::master::journal) fn segment(id: SegmentId, epoch: u64) -> Segment {
        Segment {
            id,
            name: "owner:1".into(),
            base: 1 << 30,
            size: 1 << 20,
            protocol: "tcp".into(),
            epoch,
        }
    }

    /// Object `id`: one replica of 128 bytes at offset `64 * id` of `segment`.
    pub(in crate::master::journal) fn object(
        id: u64,
        segment: SegmentId,
        epoch: u64,
    ) -> ObjectRecord {
        ObjectRecord {
            id,
            size: 100,
            hard_pinned: false,
            soft_pin_ms: None,
            replicas: vec![ReplicaRecord {
                id,
                segment,
                epoch,
                offset: 64 * id,
                size: 128,
            }],
        }
    }

    #[test]
    fn replicas_survive_adoption_and_die_with_fresh_memory() {
        let (client, seg) = (Uuid::random(), Uuid::random());
        let mut state = JournalState::default();
        let mount = |epoch, adopted_from| Record::Mount {
            client,
            segment: segment(seg, epoch),
            adopted_from,
        };
        state.apply(mount(1, None));
        let commit = |key: &str, id| Record::Commit {
            key: key.into(),
            object: object(id, seg, 1),
        };
        state.apply(commit("a", 1));
        state.apply(commit("b", 2));
        state.apply(Record::Remove { key: "b".into() });
        state.apply(mount(2, Some(1)));
        let mut adopted = state.clone();
        adopted.settle();
        assert_eq!(adopted.objects.len(), 1);
        assert_eq!(adopted.objects["a"].replicas[0].epoch, 2, "carried over");
        state.apply(mount(3, Some(9)));
        state.settle();
        assert!(
            state.objects.is_empty(),
            "a mount with fresh memory ends them"
        );
        assert_eq!(state.segments[&seg].epochs, vec![3]);
    }

    #[test]
    fn an_unmount_ends_its_replicas_and_the_token_ceiling_only_rises() {
        let (client, seg) = (Uuid::random(), Uuid::random());
        let mut state = JournalState::default();
        state.apply(Record::Mount {
            client,
            segment: segment(seg, 5),
            adopted_from: None,
        });
        state.apply(Record::Commit {
            key: "k".into(),
            object: object(1, seg, 5),
        });
        state.apply(Record::TokenCeiling(100));
        state.apply(Record::TokenCeiling(50));
        state.apply(Record::Unmount { segment: seg });
        state.settle();
        assert!(state.objects.is_empty());
        assert_eq!(state.token_ceiling, 100);
    }

    #[test]
    fn a_demoted_object_outlives_its_segment_until_rewritten_or_removed() {
        let (client, seg, tier) = (Uuid::random(), Uuid::random(), Uuid::random());
        let mut state = JournalState::default();
        state.apply(Record::Mount {
            client,
            segment: segment(seg, 5),
            adopted_from: None,
        });
        for key in ["a", "b"] {
            state.apply(Record::Commit {
                key: key.into(),
                object: object(1, seg, 5),
            });
            let mut on_disk = object(1, seg, 5);
            on_disk.replicas.clear();
            state.apply(Record::DiskCommit {
                key: key.into(),
                object: on_disk,
                disk: DiskCopy {
                    tier,
                    generation: 9,
                },
            });
        }
        state.apply(Record::Unmount { segment: seg });
        state.settle();
        assert_eq!(state.objects.len(), 2, "disk copies need no segment");
        assert_eq!(
            state.disk["a"],
            DiskCopy {
                tier,
                generation: 9
            }
        );
        // A rewrite in memory ends the disk copy; a removal ends both.
        state.apply(Record::Commit {
            key: "a".into(),
            object: object(2, seg, 5),
        });
        state.apply(Record::Remove { key: "b".into() });
        assert!(state.disk.is_empty());
        state.settle();
        assert!(state.objects.is_empty(), "the rewrite's segment is gone");
    }
}
