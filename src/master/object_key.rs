//! [`ObjectKey`]: an object's key as the table stores it, inline when short.
//!
//! The object table holds one copy of each key; most KV-cache keys of a pool are short, and a
//! heap string would cost a pointer, a length, a capacity and an allocator chunk of its own.
//! Plain value; `Send + Sync`.

/// Keys up to this many bytes are stored inline.
const INLINE: usize = 30;

/// A key: inline up to [`INLINE`] bytes (32 bytes in all), boxed beyond. Made only by
/// [`ObjectKey::new`] and [`ObjectKey::from_string`] (its representation is private: the
/// inline bytes are always a whole `&str`'s).
pub(crate) struct ObjectKey(Repr);

enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl ObjectKey {
    /// The key `key`, copied.
    pub(crate) fn new(key: &str) -> ObjectKey {
        match key.len() {
            len @ 0..=INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..len].copy_from_slice(key.as_bytes());
                ObjectKey(Repr::Inline {
                    len: len as u8,
                    bytes,
                })
            }
            _ => ObjectKey(Repr::Heap(key.into())),
        }
    }

    /// The key `key`, reusing its buffer when it is stored on the heap.
    pub(crate) fn from_string(key: String) -> ObjectKey {
        match key.len() {
            0..=INLINE => ObjectKey::new(&key),
            _ => ObjectKey(Repr::Heap(key.into_boxed_str())),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { len, bytes } => {
                let bytes = &bytes[..usize::from(*len)];
                // SAFETY: the bytes were copied, whole, from a `&str` by `new`.
                unsafe { std::str::from_utf8_unchecked(bytes) }
            }
            Repr::Heap(key) => key,
        }
    }
}

impl std::fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_every_length_read_back() {
        assert_eq!(std::mem::size_of::<ObjectKey>(), 32);
        for len in 0..=70 {
            let key: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            assert_eq!(ObjectKey::new(&key).as_str(), key);
            assert_eq!(ObjectKey::from_string(key.clone()).as_str(), key);
            let inline = matches!(ObjectKey::new(&key).0, Repr::Inline { .. });
            assert_eq!(inline, len <= INLINE, "{len}");
        }
        // Multi-byte characters stay whole.
        let key = "ключ-é-🔑";
        assert_eq!(ObjectKey::new(key).as_str(), key);
    }
}
