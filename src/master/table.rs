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
const CHUNK: usize = 64;

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

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.chunks.iter().flat_map(|chunk| chunk.iter().flatten())
    }

    /// Every key and its metadata, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &ObjectMeta)> {
        self.entries().map(|e| (e.key.as_str(), &e.meta))
    }

    /// Every key and its metadata, mutable, in slot order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut ObjectMeta)> {
        let entries = self.chunks.iter_mut().flat_map(|c| c.iter_mut().flatten());
        entries.map(|e| (e.key.as_str(), &mut e.meta))
    }

    /// Every object's metadata, mutable.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut ObjectMeta> {
        self.iter_mut().map(|(_, meta)| meta)
    }
}
