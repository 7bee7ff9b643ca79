//! [`Shard`]: one shard of the object table, key → [`ObjectMeta`], laid out for tens of
//! millions of objects.
//!
//! Layout: the entries (key and metadata together) live in fixed chunks of [`CHUNK`] slots
//! that never move; a hash index of 4-byte slot numbers finds them. A `HashMap<String, _>`
//! would keep the whole entry in its buckets, a third to a half of which are empty after each
//! doubling, and the key in a heap string of its own: at 1 M objects that was 850 bytes per
//! object here; this layout costs one entry plus about 8 bytes. A removed entry's slot is
//! reused by the next insert; chunks are kept (the table does not shrink, as a `HashMap`
//! does not).
//!
//! Ownership: the shard owns its entries. Thread-safety: none of its own (the object table
//! holds each shard behind a mutex).

use super::object_key::ObjectKey;
use super::objects::ObjectMeta;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// Slots per chunk: small, so that a thousand shards hold little unused space.
const CHUNK: usize = 32;

struct Entry {
    key: ObjectKey,
    meta: ObjectMeta,
}

/// One shard: see the module documentation.
pub(crate) struct Shard<S = std::collections::hash_map::RandomState> {
    hasher: S,
    /// Slot numbers, hashed by their entry's key.
    index: HashTable<u32>,
    chunks: Vec<Box<[Option<Entry>]>>,
    /// Empty slots below `slots_used`, reused first.
    free: Vec<u32>,
    /// Slots handed out so far (the first free one past them is `slots_used`).
    slots_used: u32,
}

fn slot(chunks: &[Box<[Option<Entry>]>], at: u32) -> Option<&Entry> {
    let at = at as usize;
    chunks.get(at / CHUNK)?.get(at % CHUNK)?.as_ref()
}

fn slot_mut(chunks: &mut [Box<[Option<Entry>]>], at: u32) -> &mut Option<Entry> {
    let at = at as usize;
    &mut chunks[at / CHUNK][at % CHUNK]
}

impl<S: BuildHasher> Shard<S> {
    /// An empty shard hashing with `hasher`.
    pub(crate) fn with_hasher(hasher: S) -> Self {
        Shard {
            hasher,
            index: HashTable::new(),
            chunks: Vec::new(),
            free: Vec::new(),
            slots_used: 0,
        }
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    fn find(&self, key: &str) -> Option<u32> {
        let chunks = &self.chunks;
        let eq = |&at: &u32| slot(chunks, at).is_some_and(|e| e.key.as_str() == key);
        self.index.find(self.hash(key), eq).copied()
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&ObjectMeta> {
        let at = self.find(key)?;
        slot(&self.chunks, at).map(|e| &e.meta)
    }

    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut ObjectMeta> {
        let at = self.find(key)?;
        slot_mut(&mut self.chunks, at).as_mut().map(|e| &mut e.meta)
    }

    /// Sets `key`'s metadata; returns what it replaced.
    pub(crate) fn insert(&mut self, key: String, meta: ObjectMeta) -> Option<ObjectMeta> {
        if let Some(at) = self.find(&key) {
            let old = slot_mut(&mut self.chunks, at).as_mut().map(|e| &mut e.meta);
            return old.map(|old| std::mem::replace(old, meta));
        }
        let at = self.free.pop().unwrap_or_else(|| {
            let at = self.slots_used;
            self.slots_used += 1;
            if at as usize == self.chunks.len() * CHUNK {
                self.chunks.push((0..CHUNK).map(|_| None).collect());
            }
            at
        });
        let hash = self.hash(&key);
        *slot_mut(&mut self.chunks, at) = Some(Entry {
            key: ObjectKey::from_string(key),
            meta,
        });
        let (hasher, chunks) = (&self.hasher, &self.chunks);
        let rehash = |&at: &u32| slot(chunks, at).map_or(0, |e| hasher.hash_one(e.key.as_str()));
        self.index.insert_unique(hash, at, rehash);
        None
    }

    /// Takes `key` out; returns its metadata.
    pub(crate) fn remove(&mut self, key: &str) -> Option<ObjectMeta> {
        let hash = self.hash(key);
        let chunks = &self.chunks;
        let eq = |&at: &u32| slot(chunks, at).is_some_and(|e| e.key.as_str() == key);
        let (at, _) = self.index.find_entry(hash, eq).ok()?.remove();
        self.free.push(at);
        slot_mut(&mut self.chunks, at).take().map(|e| e.meta)
    }

    /// Slots handed out so far: a scan in slices visits `0..slots()` (an entry keeps its
    /// slot while it lives; one inserted during a scan may land before or after its cursor).
    pub(crate) fn slots(&self) -> u32 {
        self.slots_used
    }

    /// The keys and metadata in slots `range` (clamped to [`Self::slots`]), mutable.
    pub(crate) fn slice_mut(
        &mut self,
        range: std::ops::Range<u32>,
    ) -> impl Iterator<Item = (&str, &mut ObjectMeta)> {
        let end = range.end.min(self.slots_used) as usize;
        let start = (range.start as usize).min(end);
        let first_chunk = start / CHUNK;
        let chunks = self.chunks.get_mut(first_chunk..).unwrap_or_default();
        let slots = chunks.iter_mut().flat_map(|c| c.iter_mut());
        let slots = slots.skip(start - first_chunk * CHUNK).take(end - start);
        slots.flatten().map(|e| (e.key.as_str(), &mut e.meta))
    }

    /// The keys and metadata in slots `range` (clamped to [`Self::slots`]).
    pub(crate) fn slice(
        &self,
        range: std::ops::Range<u32>,
    ) -> impl Iterator<Item = (&str, &ObjectMeta)> {
        let end = range.end.min(self.slots_used);
        (range.start..end)
            .filter_map(|at| slot(&self.chunks, at).map(|e| (e.key.as_str(), &e.meta)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::objects::Replicas;
    use std::collections::HashMap;
    use std::hash::{BuildHasherDefault, Hasher};
    use std::time::Instant;

    /// Every key hashes alike: every lookup walks collisions.
    #[derive(Default)]
    struct Colliding;

    impl Hasher for Colliding {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _: &[u8]) {}
    }

    fn meta(value: u64) -> ObjectMeta {
        let now = Instant::now();
        ObjectMeta::restored(value, value, Replicas::new(), false, (None, None), now)
    }

    /// Keys of 0 to 60 bytes (inline and boxed), some multi-byte.
    fn key_pool(rng: &mut fastrand::Rng) -> Vec<String> {
        (0..300)
            .map(|i| {
                let len = rng.usize(0..=60);
                let body: String = (0..len).map(|_| rng.alphanumeric()).collect();
                match i % 7 {
                    0 => format!("é{body}"),
                    _ => body,
                }
            })
            .collect()
    }

    /// Random inserts, replacements, removals and lookups, checked against a `HashMap`
    /// after every step, and the whole contents (by iteration) every 100 steps.
    fn matches_a_map<S: BuildHasher>(shard: &mut Shard<S>, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let keys = key_pool(&mut rng);
        let mut model: HashMap<String, u64> = HashMap::new();
        for step in 0..20_000u64 {
            let key = &keys[rng.usize(..keys.len())];
            match rng.u8(..10) {
                0..=3 => {
                    let old = shard.insert(key.clone(), meta(step)).map(|m| m.size);
                    assert_eq!(old, model.insert(key.clone(), step), "insert {key:?}");
                }
                4..=6 => {
                    let old = shard.remove(key).map(|m| m.size);
                    assert_eq!(old, model.remove(key), "remove {key:?}");
                }
                7 => {
                    if let Some(m) = shard.get_mut(key) {
                        m.size += 1;
                        *model.get_mut(key).unwrap() += 1;
                    }
                }
                _ => {}
            }
            assert_eq!(shard.get(key).map(|m| m.size), model.get(key).copied());
            assert_eq!(shard.len(), model.len());
            if step % 100 == 0 {
                let mut seen: Vec<_> = shard
                    .slice(0..shard.slots())
                    .map(|(k, m)| (k.to_string(), m.size))
                    .collect();
                let mut expected: Vec<_> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
                seen.sort();
                expected.sort();
                assert_eq!(seen, expected, "step {step}");
                // Slices of any width visit every entry once.
                let width = rng.u32(1..20);
                let mut sliced: Vec<_> = (0..shard.slots())
                    .step_by(width as usize)
                    .flat_map(|at| {
                        shard
                            .slice(at..at + width)
                            .map(|(k, m)| (k.to_string(), m.size))
                    })
                    .collect();
                sliced.sort();
                assert_eq!(sliced, expected, "slices of {width}");
                let mut mutable: Vec<_> = (0..shard.slots())
                    .step_by(width as usize)
                    .flat_map(|at| {
                        let slice = shard.slice_mut(at..at + width);
                        slice
                            .map(|(k, m)| (k.to_string(), m.size))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                mutable.sort();
                assert_eq!(mutable, expected, "mutable slices of {width}");
            }
        }
        // Slots are reused: the chunks never hold more than the most keys ever present.
        assert!(shard.chunks.len() * CHUNK <= keys.len() + CHUNK);
    }

    #[test]
    fn a_shard_behaves_as_a_map() {
        for seed in 0..4 {
            let mut shard = Shard::with_hasher(std::collections::hash_map::RandomState::new());
            matches_a_map(&mut shard, seed);
        }
    }

    #[test]
    fn a_shard_behaves_as_a_map_when_every_hash_collides() {
        let mut shard = Shard::with_hasher(BuildHasherDefault::<Colliding>::default());
        matches_a_map(&mut shard, 99);
    }
}
