//! The cluster key file and the keys it holds.
//!
//! Format: one key per line, as hex (at least 32 hex digits, 16 bytes; `openssl rand -hex 32`
//! makes one); blank lines and lines starting with `#` are ignored. The first key is the one
//! this process connects with; every listed key (at most [`MAX_KEYS`]) is accepted from
//! peers, which is how a key is rotated without a failed call (README, "Cluster key").
//!
//! A [`KeyRing`] re-reads its file when the file changes (checked at most once a second, on
//! use), so a rotation needs no restart; a file that becomes unreadable or invalid leaves the
//! keys it last held in force (logged). Thread-safety: `KeyRing` is `Send + Sync`; its keys
//! are an immutable snapshot behind a mutex held only to swap it.

use crate::error::{fail, ErrorCode, Result};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keys a file may list (the one in use and the one being rotated in or out).
pub const MAX_KEYS: usize = 2;
/// Shortest key accepted, in bytes.
const MIN_KEY_BYTES: usize = 16;
/// Longest key accepted, in bytes.
const MAX_KEY_BYTES: usize = 128;
/// How often a ring looks at its file for a change.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// One key and its public identifier.
#[derive(Clone)]
pub struct Key {
    secret: Vec<u8>,
    /// The first 8 bytes of SHA-256 over the key: names it in a handshake without revealing it.
    pub id: [u8; 8],
}

impl Key {
    /// A key from its bytes.
    ///
    /// Errors: `INVALID_PARAMS` when shorter than 16 or longer than 128 bytes.
    pub fn new(secret: Vec<u8>) -> Result<Key> {
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&secret.len()) {
            return fail(
                ErrorCode::InvalidParams,
                format_args!(
                    "a cluster key has {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, not {}",
                    secret.len()
                ),
            );
        }
        let digest = Sha256::digest(&secret);
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        Ok(Key { secret, id })
    }

    pub(super) fn secret(&self) -> &[u8] {
        &self.secret
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key(id {})", hex(&self.id))
    }
}

/// The keys in force: the first connects, all are accepted. Never empty.
#[derive(Clone, Debug)]
pub struct Keys(Vec<Key>);

impl Keys {
    /// Keys from a file's text (format in the module documentation).
    ///
    /// Errors: `INVALID_PARAMS` naming the line for a malformed key, no key, or more than
    /// [`MAX_KEYS`].
    pub fn parse(text: &str) -> Result<Keys> {
        let mut keys = Vec::new();
        let lines = text
            .lines()
            .enumerate()
            .map(|(n, line)| (n + 1, line.trim()));
        for (number, line) in lines.filter(|(_, l)| !l.is_empty() && !l.starts_with('#')) {
            let Some(secret) = unhex(line) else {
                let msg = format_args!("cluster key file, line {number}: not a hex key");
                return fail(ErrorCode::InvalidParams, msg);
            };
            keys.push(Key::new(secret)?);
        }
        match keys.len() {
            0 => fail(
                ErrorCode::InvalidParams,
                "the cluster key file lists no key",
            ),
            n if n > MAX_KEYS => fail(
                ErrorCode::InvalidParams,
                format_args!("the cluster key file lists {n} keys, at most {MAX_KEYS}"),
            ),
            _ => Ok(Keys(keys)),
        }
    }

    /// Keys given directly (tests and tools); the first connects.
    ///
    /// Errors: `INVALID_PARAMS` for none or more than [`MAX_KEYS`].
    pub fn from_keys(keys: Vec<Key>) -> Result<Keys> {
        match keys.len() {
            1..=MAX_KEYS => Ok(Keys(keys)),
            n => fail(
                ErrorCode::InvalidParams,
                format_args!("{n} keys: 1 to {MAX_KEYS}"),
            ),
        }
    }

    /// The key this side connects with.
    pub fn primary(&self) -> &Key {
        &self.0[0]
    }

    /// The accepted key named `id`.
    pub fn by_id(&self, id: &[u8; 8]) -> Option<&Key> {
        self.0.iter().find(|key| &key.id == id)
    }
}

/// What a ring last saw of its file (a change of any part means re-read it).
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    len: u64,
    modified_ns: i128,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    let modified_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
    Some(FileStamp {
        inode: meta.ino(),
        len: meta.len(),
        modified_ns,
    })
}

struct Loaded {
    keys: Arc<Keys>,
    stamp: Option<FileStamp>,
    checked: Instant,
}

/// The keys of one key file, kept current (see the module documentation).
pub struct KeyRing {
    path: Option<PathBuf>,
    loaded: Mutex<Loaded>,
    /// The primary key's id (as a `u64`), for [`KeyRing::connects_with`] without the lock.
    primary: AtomicU64,
    /// When the file is next looked at, in nanoseconds after `born` (lock-free check).
    next_look_ns: AtomicU64,
    born: Instant,
}

impl KeyRing {
    /// Reads `path` now.
    ///
    /// Errors: `FILE_OPEN_FAIL` when it cannot be read; `INVALID_PARAMS` when malformed (see
    /// [`Keys::parse`]).
    pub fn load(path: &Path) -> Result<Arc<KeyRing>> {
        let before = stamp(path);
        let keys = read_keys(path)?;
        warn_if_exposed(path);
        Ok(KeyRing::new(Some(path.to_path_buf()), keys, before))
    }

    /// A ring of fixed keys, with no file behind it (tests and tools).
    pub fn fixed(keys: Keys) -> Arc<KeyRing> {
        KeyRing::new(None, keys, None)
    }

    fn new(path: Option<PathBuf>, keys: Keys, stamp: Option<FileStamp>) -> Arc<KeyRing> {
        let born = Instant::now();
        let primary = AtomicU64::new(u64::from_ne_bytes(keys.primary().id));
        let next_look = if path.is_some() {
            RELOAD_CHECK
        } else {
            Duration::MAX
        };
        Arc::new(KeyRing {
            path,
            loaded: Mutex::new(Loaded {
                keys: Arc::new(keys),
                stamp,
                checked: born,
            }),
            primary,
            next_look_ns: AtomicU64::new(saturating_ns(next_look)),
            born,
        })
    }

    /// The keys in force now (the file re-read first when it changed since the last look,
    /// at most once a second).
    pub fn keys(&self) -> Arc<Keys> {
        let mut loaded = self.loaded.lock();
        let Some(path) = &self.path else {
            return loaded.keys.clone();
        };
        if loaded.checked.elapsed() < RELOAD_CHECK {
            return loaded.keys.clone();
        }
        loaded.checked = Instant::now();
        let next_look = loaded.checked.duration_since(self.born) + RELOAD_CHECK;
        self.next_look_ns
            .store(saturating_ns(next_look), Ordering::Relaxed);
        let now = stamp(path);
        if now.is_some() && now != loaded.stamp {
            match read_keys(path) {
                Ok(keys) => {
                    tracing::info!(path = %path.display(), "cluster key file changed: {} key(s) in force", keys.0.len());
                    self.primary
                        .store(u64::from_ne_bytes(keys.primary().id), Ordering::Relaxed);
                    loaded.keys = Arc::new(keys);
                    loaded.stamp = now;
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), "cluster key file changed but is not usable ({e}); the keys read before stay in force");
                    loaded.stamp = now;
                }
            }
        }
        loaded.keys.clone()
    }
}

impl KeyRing {
    /// Whether `id` is the key this process connects with now (a pooled connection proven
    /// with another is not reused: see [`super::admission`]). Lock-free but once a second,
    /// when the file is due for a look.
    pub fn connects_with(&self, id: &[u8; 8]) -> bool {
        let now = saturating_ns(self.born.elapsed());
        if now >= self.next_look_ns.load(Ordering::Relaxed) {
            self.keys();
        }
        self.primary.load(Ordering::Relaxed) == u64::from_ne_bytes(*id)
    }

    /// Makes the next [`KeyRing::keys`] look at the file at once (tests).
    #[cfg(test)]
    pub(crate) fn expire_reload_check(&self) {
        self.loaded.lock().checked -= RELOAD_CHECK;
        self.next_look_ns.store(0, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyRing({:?})", self.path)
    }
}

/// `d` in nanoseconds, `u64::MAX` past it.
fn saturating_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn read_keys(path: &Path) -> Result<Keys> {
    let text = std::fs::read_to_string(path).or_else(|e| {
        let msg = format_args!("cluster key file {}: {e}", path.display());
        fail(ErrorCode::FileOpenFail, msg)
    })?;
    Keys::parse(&text)
}

/// Logs a warning when others than the owner may read the key file.
fn warn_if_exposed(path: &Path) {
    let mode = std::fs::metadata(path).map(|m| m.mode()).unwrap_or(0);
    if mode & 0o077 != 0 {
        tracing::warn!(path = %path.display(), mode = format_args!("{:o}", mode & 0o777), "the cluster key file is readable by others than its owner (chmod 600 it)");
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let pairs = text.as_bytes().chunks(2);
    pairs
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Lower-case hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::TempDir;

    const A: &str = "00112233445566778899aabbccddeeff";
    const B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    #[test]
    fn parses_keys_and_refuses_malformed_files() {
        let keys = Keys::parse(&format!("# cluster key\n\n{A}\n  {B}  \n")).unwrap();
        assert_eq!(keys.primary().secret(), unhex(A).unwrap());
        let b = Key::new(unhex(B).unwrap()).unwrap();
        assert_eq!(keys.by_id(&b.id).unwrap().secret(), b.secret());
        assert!(keys.by_id(&[0; 8]).is_none());
        assert_ne!(keys.primary().id, b.id);
        for bad in [
            "",
            "# only\n",
            "abc",
            "00112233",
            "zz112233445566778899aabbccddeeff",
        ] {
            let err = Keys::parse(bad).unwrap_err();
            assert_eq!(err, ErrorCode::InvalidParams, "{bad:?}");
        }
        let three = format!("{A}\n{B}\n{A}\n");
        assert!(Keys::parse(&three).is_err());
        assert!(Key::new(vec![1; 200]).is_err());
        assert!(Keys::from_keys(Vec::new()).is_err());
    }

    #[test]
    fn a_ring_follows_its_file_and_keeps_the_last_good_keys() {
        let dir = TempDir::new("keyring");
        let path = dir.path().join("cluster.key");
        std::fs::write(&path, format!("{A}\n")).unwrap();
        let ring = KeyRing::load(&path).unwrap();
        let a = ring.keys().primary().id;
        std::fs::write(&path, format!("{B}\n{A}\n")).unwrap();
        ring.loaded.lock().checked -= RELOAD_CHECK;
        let keys = ring.keys();
        assert_ne!(keys.primary().id, a);
        assert!(keys.by_id(&a).is_some());
        std::fs::write(&path, "not a key at all\n").unwrap();
        ring.loaded.lock().checked -= RELOAD_CHECK;
        assert_eq!(ring.keys().primary().id, keys.primary().id);
        assert!(KeyRing::load(&dir.path().join("missing")).is_err());
        assert!(KeyRing::load(&path).is_err());
    }
}
