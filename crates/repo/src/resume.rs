//! Resume checkpoints: what an interrupted backup had already stored, so that the next
//! backup of the stanza can point at those frames instead of compressing and uploading the
//! same blocks again (pgBackRest's `resume`).
//!
//! Why checkpoints: a backup's manifest is written last, so a backup killed at hour 9 of
//! 10 leaves packs that nothing describes. While it runs, each copy worker therefore writes,
//! whenever one of its packs has been stored, a checkpoint object listing the files whose
//! new frames all lie in packs already stored: their extents and block hashes, exactly as
//! the manifest will hold them. Checkpoints are write-once objects like everything else
//! (`layout::resume_checkpoint`: `<stanza>/backup/<label>/resume/<worker>-<n>`), sealed under their names in an
//! encrypted stanza, and never needed for a restore.
//!
//! The next backup reads the checkpoints of the newest interrupted backup (one without a
//! manifest, newer than every complete backup), keeps the files whose packs are all there
//! and long enough, and offers each file's blocks as a second source after the prior
//! backup: a block whose hash equals the checkpoint's is stored as a reference to the
//! interrupted backup's frame. Every block is still read and hashed, so nothing changed
//! since is reused; only compression and upload are saved. `expire` keeps an interrupted
//! backup's packs while it is the newest one (it can still be resumed), and removes its
//! unreferenced packs and its checkpoints once a newer backup is complete.
//!
//! Stored form: a checked JSON object (`crate::checked`) with magic `"PGSTRRES"` of
//! [`Checkpoint`].

use crate::codec::CompressType;
use crate::manifest::{validate, FileEntry};
use crate::{checked, Error, ErrorKind, Result, FORMAT_VERSION};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"PGSTRRES";

/// Files whose new frames one worker of a running backup has stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub format_version: u32,
    pub stanza: String,
    /// The backup that wrote the checkpoint and owns the packs its extents without `b`
    /// point into.
    pub label: String,
    /// Codec of that backup's frames.
    pub compression: CompressType,
    /// Each with its extents and block hashes inline (never a `map`); extents with `b` are
    /// of other backups and are not offered for reuse.
    pub files: Vec<FileEntry>,
}

/// How much larger than its compressed body a checkpoint's JSON may be.
const MAX_RATIO: u64 = 256;

impl Checkpoint {
    /// The stored form; the JSON is compressed as it is written, never held whole.
    pub fn encode(&self) -> Vec<u8> {
        checked::encode(MAGIC, self)
    }

    /// Decode the checkpoint stored at `key`, which must belong to backup `label` of
    /// `stanza` (a cluster with pages of `page_size` bytes), checking every file as a
    /// manifest's inline entries are checked.
    pub fn decode(
        obj: &[u8],
        key: &str,
        stanza: &str,
        label: &str,
        page_size: u32,
    ) -> Result<Checkpoint> {
        let damaged = |why: String| {
            Error::corrupt(format!(
                "{key}: {why}: the checkpoint is damaged or was altered"
            ))
        };
        let body = checked::body(obj, MAGIC, key, "resume checkpoint")?;
        let json = crate::codec::zstd_bounded(body, MAX_RATIO, key)?;
        let c: Checkpoint = serde_json::from_slice(&json).map_err(|e| {
            Error::with_source(ErrorKind::Corrupt, format!("{key}: invalid checkpoint"), e)
        })?;
        crate::error::check_format_version(key, c.format_version, FORMAT_VERSION)?;
        if c.stanza != stanza || c.label != label {
            return Err(damaged(format!(
                "holds a checkpoint of backup '{}' of stanza '{}'",
                c.label, c.stanza
            )));
        }
        for f in &c.files {
            validate::check_path(&f.path)
                .and_then(|()| match f.map.is_some() || !f.packs.is_empty() {
                    true => Err(validate::not_allowed(
                        "a map reference (checkpoints hold maps inline)",
                    )),
                    false => Ok(()),
                })
                .and_then(|()| validate::check_file_content(label, page_size, f))
                .map_err(|why| damaged(format!("file {:?}: {why}", f.path)))?;
        }
        Ok(c)
    }
}

/// Whether directory `label` is an interrupted backup that a backup may still resume: a
/// backup label without a manifest that sorts after `newest_with_manifest`, the greatest
/// label that has one. Backup (which resumes the greatest such label) and expire (which
/// keeps such a backup's data) go by this one rule.
pub fn resumable(label: &str, has_manifest: bool, newest_with_manifest: &str) -> bool {
    !has_manifest && label > newest_with_manifest && crate::manifest::is_backup_label(label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Chunk;
    use crate::manifest::Owner;

    fn checkpoint() -> Checkpoint {
        let frame = Chunk {
            pack: Some("0-3".into()),
            backup: None,
            offset: 4096,
            stored: 900,
            raw: 16384,
            check: Some(0x0123_4567_89ab_cdef),
            at: 0,
            frame: 0,
        };
        Checkpoint {
            format_version: FORMAT_VERSION,
            stanza: "main".into(),
            label: "20261125-140000F".into(),
            compression: CompressType::Zst,
            files: vec![FileEntry {
                path: "base/5/16384".into(),
                size: 16384,
                mtime: 1_795_000_000,
                owner: Owner {
                    mode: 0o600,
                    uid: 101,
                    gid: 104,
                    user: Some("postgres".into()),
                    group: None,
                },
                hash: Some([7; 32]),
                chunks: smallvec::smallvec![frame],
                bad_pages: Default::default(),
                block_size: 8192,
                block_hashes: smallvec::smallvec![1, 2],
                map: None,
                packs: Default::default(),
                map_depth: 0,
            }],
        }
    }

    fn decode(c: &Checkpoint) -> Result<Checkpoint> {
        Checkpoint::decode(&c.encode(), "k", "main", "20261125-140000F", 8192)
    }

    #[test]
    fn a_checkpoint_round_trips() {
        let c = checkpoint();
        let back = decode(&c).unwrap();
        assert_eq!(back.files.len(), 1);
        assert_eq!(back.files[0].chunks, c.files[0].chunks);
        assert_eq!(back.files[0].block_hashes.as_slice(), [1, 2]);
    }

    #[test]
    fn damaged_or_foreign_checkpoints_are_refused() {
        let mut bytes = checkpoint().encode();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let e = Checkpoint::decode(&bytes, "k", "main", "20261125-140000F", 8192).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(e.to_string().contains("checksum"), "{e}");

        let e = Checkpoint::decode(
            &checkpoint().encode(),
            "k",
            "main",
            "20261125-150000F",
            8192,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("of backup '20261125-140000F'"),
            "{e}"
        );

        let mut c = checkpoint();
        c.files[0].block_hashes.pop();
        let e = decode(&c).unwrap_err();
        assert!(
            e.to_string().contains("not one for each of 2 blocks"),
            "{e}"
        );

        let mut c = checkpoint();
        c.files[0].path = "../etc/passwd".into();
        assert_eq!(decode(&c).unwrap_err().kind, ErrorKind::Corrupt);
    }
}
