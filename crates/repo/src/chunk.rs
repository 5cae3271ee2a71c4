//! Extents: how a manifest describes a file's bytes, as runs of zeros or byte ranges of
//! stored frames (docs/repository-format.md, "Extents").
//!
//! Apart from `pack` (which writes and reads frames) and `manifest` (which lists extents),
//! because both need them: a frame's identity, its check and the extent that points into
//! it are what the two share, and neither has to import the other for them.

use crate::name::Name;
use serde::{Deserialize, Serialize};

/// Largest decoded or stored frame a reader accepts (a writer's frames are about
/// `DEFAULT_FRAME_SIZE`): lengths from a manifest size allocations.
pub(crate) const MAX_FRAME_LEN: u32 = 64 * 1024 * 1024;

/// One extent of a file: `raw` consecutive bytes of the file, found at byte `at` of a
/// decoded frame. A full backup's extents are whole frames (`at` 0, frame length = `raw`);
/// an incremental's extents may point into frames of earlier backups (`backup` set), and
/// several extents may share one frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Pack name within the backup that stored it; `None` for all-zero bytes.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<Name>,
    /// Label of the backup holding the pack when it is not the manifest's own backup.
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Name>,
    /// Byte offset of the frame in the pack.
    #[serde(rename = "o", default)]
    pub offset: u64,
    /// Stored (compressed) length of the frame.
    #[serde(rename = "s", default)]
    pub stored: u32,
    /// Bytes of the file this extent covers.
    #[serde(rename = "r")]
    pub raw: u32,
    /// XXH3-64 of the stored frame bytes ([`frame_check`], stored as 16 hex digits); none
    /// for zeros.
    #[serde(
        rename = "h",
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::json_text::frame_check"
    )]
    pub check: Option<u64>,
    /// Offset of the extent within the decoded frame.
    #[serde(rename = "a", default, skip_serializing_if = "is_zero")]
    pub at: u32,
    /// Decoded length of the frame, when it differs from `raw`.
    #[serde(rename = "f", default, skip_serializing_if = "is_zero")]
    pub frame: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Identity of a stored frame: (backup label, pack, offset).
pub(crate) type FrameKey = (String, String, u64);

impl Chunk {
    /// An extent of zeros, which costs no storage.
    pub fn zeros(len: u32) -> Chunk {
        Chunk {
            pack: None,
            backup: None,
            offset: 0,
            stored: 0,
            raw: len,
            check: None,
            at: 0,
            frame: 0,
        }
    }

    pub fn is_zero(&self) -> bool {
        self.pack.is_none()
    }

    /// Decoded length of the frame this extent reads from.
    pub fn frame_len(&self) -> u32 {
        if self.frame == 0 {
            self.raw
        } else {
            self.frame
        }
    }

    /// The label of the backup whose pack holds the frame, given the label of the manifest
    /// the chunk was read from.
    pub fn owner<'a>(&'a self, manifest_label: &'a str) -> &'a str {
        self.backup.as_deref().unwrap_or(manifest_label)
    }

    pub fn frame_key(&self, manifest_label: &str) -> Option<FrameKey> {
        self.pack.as_ref().map(|p| {
            (
                self.owner(manifest_label).to_string(),
                p.to_string(),
                self.offset,
            )
        })
    }

    /// The sub-extent `[skip, skip+len)` of this one.
    pub fn slice(&self, skip: u32, len: u32) -> Chunk {
        let mut c = self.clone();
        if c.pack.is_some() {
            c.frame = self.frame_len();
            c.at = self.at + skip;
        }
        c.raw = len;
        c
    }

    /// Extend this extent by `next` when `next` continues it in the same frame (or both are
    /// zeros). Returns false when they cannot be merged.
    pub fn try_merge(&mut self, next: &Chunk) -> bool {
        if self.is_zero() && next.is_zero() {
            // Extents stay well below u32::MAX bytes (zero runs of 1 GiB at most).
            if self.raw as u64 + next.raw as u64 > 1 << 30 {
                return false;
            }
            self.raw += next.raw;
            return true;
        }
        if self.pack.is_some()
            && self.pack == next.pack
            && self.backup == next.backup
            && self.offset == next.offset
            && self.at + self.raw == next.at
        {
            self.frame = self.frame_len();
            self.raw += next.raw;
            if self.at == 0 && self.raw == self.frame {
                self.frame = 0;
            }
            return true;
        }
        false
    }

    /// The same extent as seen from a manifest labelled `new_label`, when it was read from
    /// the manifest labelled `from_label`.
    pub fn rebased(&self, from_label: &str, new_label: &str) -> Chunk {
        let mut c = self.clone();
        if c.pack.is_some() {
            c.backup = rebased_owner(self.backup, from_label, new_label);
        }
        c
    }
}

/// The `b` of an extent or pack use whose `b` is `backup` in the manifest labelled
/// `from_label`, as the manifest labelled `new_label` writes it.
pub(crate) fn rebased_owner(
    backup: Option<Name>,
    from_label: &str,
    new_label: &str,
) -> Option<Name> {
    match backup {
        Some(b) => (b.as_str() != new_label).then_some(b),
        None => (from_label != new_label).then(|| Name::new(from_label)),
    }
}

/// Frame checksum used in chunks.
pub fn frame_check(stored: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(stored)
}
