//! Objects of a repository on another host, kept on this host so they need not cross the
//! line again.
//!
//! A backup through `pg-remote` runs on the database host and reads the prior backup's
//! manifest from the backup host; the next one reads the manifest this one wrote. Both
//! are already here once: the cache keeps the last few manifests (and their parts) this
//! host read or wrote, each with the BLAKE3 of the object's stored bytes (entries are
//! named by the repository and the key). A read asks the holder for the
//! object *unless* its bytes still hash the same (`get` with `unless_hash`), so a hit
//! moves a hash, not the object, and a stale or foreign entry (another repository, a
//! stanza made again) is simply fetched. What is kept is the object as `Storage::get`
//! returns it (opened, in an encrypted stanza): the cache is as private as the data
//! directory beside it (a 0700 directory, 0600 files).
//!
//! Where: `$XDG_CACHE_HOME/pgstrata`, else `$HOME/.cache/pgstrata`. A host where neither
//! can be made works as before, without the cache. Entry layout: `PGSTRCA1`, the BLAKE3 of
//! the stored object (32 bytes), the BLAKE3 of the kept bytes (32, checked on every read: a
//! damaged entry is a miss), the kept bytes. The newest [`KEEP`] entries are kept.

use bytes::Bytes;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

const ENTRY_MAGIC: &[u8; 8] = b"PGSTRCA1";

/// Entries kept: a few stanzas' last manifests, and the parts of their entries (format 4:
/// one for every 32,768 files; `KEEP_BYTES` bounds them first).
const KEEP: usize = 256;

/// Bytes kept, at most (the newest entry is kept whatever its size): manifests of very
/// large clusters are tens of megabytes, and this is the database host's disk.
const KEEP_BYTES: u64 = 256 << 20;

/// An object kept on this host.
pub struct Cached {
    /// BLAKE3 of the object's bytes as stored in the repository.
    pub stored_hash: [u8; 32],
    /// The object as read (opened, in an encrypted stanza).
    pub bytes: Bytes,
}

#[derive(Debug)]
pub struct ObjectCache {
    dir: PathBuf,
}

impl ObjectCache {
    /// The cache of this OS user, made when missing; `None` (logged) when it cannot be.
    pub fn open_default() -> Option<ObjectCache> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        ObjectCache::open(base.join("pgstrata"))
    }

    /// The cache in `dir`, made (0700) when missing; `None` (logged) when it cannot be,
    /// and (with a warning) when it is not this user's alone ([`crate::private_dir`]):
    /// whoever else can write it could plant entries, such as a manifest telling restore
    /// what to write. Refusing the command would gain nothing: without the cache every
    /// object is read from the repository.
    pub fn open(dir: PathBuf) -> Option<ObjectCache> {
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            log::debug!(
                "no object cache: cannot make {}: {e}; objects cross the line every time",
                dir.display()
            );
            return None;
        }
        if let Err(why) = crate::private_dir::check(&dir, "object cache", false) {
            log::warn!("{why}; the object cache is off until then");
            return None;
        }
        Some(ObjectCache { dir })
    }

    fn entry(&self, key: &str) -> PathBuf {
        self.dir
            .join(blake3::hash(key.as_bytes()).to_hex().as_str())
    }

    /// The entry of object `key`, if there is an intact one.
    pub fn get(&self, key: &str) -> Option<Cached> {
        let raw = std::fs::read(self.entry(key)).ok()?;
        if raw.len() < 72 || &raw[..8] != ENTRY_MAGIC {
            return None;
        }
        if blake3::hash(&raw[72..]).as_bytes() != &raw[40..72] {
            log::warn!("object cache entry of {key} is damaged; reading the object again");
            return None;
        }
        Some(Cached {
            stored_hash: raw[8..40].try_into().expect("32 bytes"),
            bytes: Bytes::from(raw).slice(72..),
        })
    }

    /// Keep `bytes` as object `key`, stored as bytes hashing to `stored_hash`. Best
    /// effort: a failure is logged and the next read fetches the object.
    pub fn put(&self, key: &str, stored_hash: [u8; 32], bytes: &[u8]) {
        if let Err(e) = self.write(key, stored_hash, bytes) {
            log::debug!("object cache: keep {key}: {e}");
        }
        self.prune();
    }

    fn write(&self, key: &str, stored_hash: [u8; 32], bytes: &[u8]) -> std::io::Result<()> {
        let path = self.entry(key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(ENTRY_MAGIC)?;
        f.write_all(&stored_hash)?;
        f.write_all(blake3::hash(bytes).as_bytes())?;
        f.write_all(bytes)?;
        drop(f);
        std::fs::rename(&tmp, &path)
    }

    /// Keep the newest [`KEEP`] entries within [`KEEP_BYTES`]; remove the others.
    fn prune(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.0));
        let mut total = 0;
        for (i, (_, len, path)) in entries.into_iter().enumerate() {
            total += len;
            if i >= KEEP || (i > 0 && total > KEEP_BYTES) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// BLAKE3 of an object's stored bytes.
pub fn stored_hash(stored: &[u8]) -> [u8; 32] {
    *blake3::hash(stored).as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache directory another user owns or others can write to is not used: they could
    /// plant an entry (a manifest telling restore what to write) or read the kept objects.
    #[test]
    fn a_cache_directory_others_own_or_can_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ObjectCache::open(open.clone()).is_none(), "mode 0777");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(ObjectCache::open(open.clone()).is_none(), "mode 0770");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(ObjectCache::open(open).is_some(), "mode 0700 is fine");
        if nix::unistd::geteuid().is_root() {
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            assert!(ObjectCache::open(theirs).is_none(), "owned by nobody");
        }
    }

    #[test]
    fn entries_read_back_damaged_ones_are_misses_and_only_the_newest_stay() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ObjectCache::open(dir.path().join("c")).unwrap();
        assert!(cache.get("s/backup/a/backup.manifest").is_none());
        cache.put("s/backup/a/backup.manifest", [7; 32], b"manifest a");
        let hit = cache.get("s/backup/a/backup.manifest").unwrap();
        assert_eq!(hit.stored_hash, [7; 32]);
        assert_eq!(&hit.bytes[..], b"manifest a");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("c"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);

        // A flipped byte in the kept bytes: a miss, not wrong bytes.
        let path = cache.entry("s/backup/a/backup.manifest");
        let mut raw = std::fs::read(&path).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        std::fs::write(&path, raw).unwrap();
        assert!(cache.get("s/backup/a/backup.manifest").is_none());

        for i in 0..KEEP + 5 {
            cache.put(&format!("s/backup/{i}/backup.manifest"), [1; 32], b"m");
        }
        let kept = std::fs::read_dir(dir.path().join("c")).unwrap().count();
        assert_eq!(kept, KEEP);
        // Past the byte bound only the newest stays.
        let big = vec![0u8; (KEEP_BYTES / 2 + 1) as usize];
        cache.put("s/backup/x/backup.manifest", [2; 32], &big);
        cache.put("s/backup/y/backup.manifest", [3; 32], &big);
        assert!(cache.get("s/backup/y/backup.manifest").is_some());
        assert!(cache.get("s/backup/x/backup.manifest").is_none());
    }
}
