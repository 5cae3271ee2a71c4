//! File maps (format 2): a file's extents and block hashes stored once, in a frame of the
//! backup that wrote them, and referenced by every later manifest while the file is
//! unchanged.
//!
//! Why: in format 1 every manifest carried every file's extents and one block hash per
//! block, so each incremental wrote (and the next one parsed) a manifest whose size grew
//! with the database's bytes, whatever it changed: about 0.35 KB per MB of database. A
//! format 2 manifest holds per file only what describes it (path, size, mtime, owner,
//! content hash) plus, for a file of more than [`INLINE_MAX_BLOCKS`] blocks, a reference
//! to its map frame and the packs the map and its extents use. An unchanged file is
//! carried by copying that reference; only files that changed get a new map. Small files
//! keep their extents and hashes inline, where a reference would cost as much.
//!
//! The packs a file uses are listed in its entry so that `expire` and the backup's own
//! final check know every pack a manifest needs without reading a single map.
//!
//! Decoded map frame: `"PGSTRMAP"`, a u32 LE count N, N block hashes as u64 LE, then the
//! JSON array of the file's extents (the same objects as a format 1 entry's `chunks`),
//! whose `b` is relative to the backup that wrote the map frame.

use super::{FileEntry, Manifest};
use crate::pack::{Chunk, FrameReader};
use crate::{Error, Result, Storage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"PGSTRMAP";

/// Files of at most this many blocks keep their extents and block hashes in the manifest.
pub const INLINE_MAX_BLOCKS: usize = 8;

/// A pack a file's map and extents use, and the stored bytes of the distinct frames of it
/// they reference. `backup` is relative to the manifest, as a chunk's is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackUse {
    #[serde(
        rename = "b",
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::text::interned"
    )]
    pub backup: Option<Arc<str>>,
    #[serde(rename = "p", with = "super::text::interned_name")]
    pub pack: Arc<str>,
    #[serde(rename = "s")]
    pub stored: u64,
}

impl PackUse {
    pub fn owner<'a>(&'a self, manifest_label: &'a str) -> &'a str {
        self.backup.as_deref().unwrap_or(manifest_label)
    }

    /// The same use as seen from manifest `new_label`, read from manifest `from_label`.
    pub fn rebased(&self, from_label: &str, new_label: &str) -> PackUse {
        let owner = self.owner(from_label);
        PackUse {
            backup: (owner != new_label).then(|| super::intern(owner)),
            pack: self.pack.clone(),
            stored: self.stored,
        }
    }
}

/// A file's extents and block hashes, as a map frame holds them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileMap {
    pub chunks: Vec<Chunk>,
    pub block_hashes: Vec<u64>,
}

impl FileMap {
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(&self.chunks).expect("serialize extents");
        let mut out = Vec::with_capacity(12 + self.block_hashes.len() * 8 + json.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.block_hashes.len() as u32).to_le_bytes());
        for h in &self.block_hashes {
            out.extend_from_slice(&h.to_le_bytes());
        }
        out.extend_from_slice(&json);
        out
    }

    pub fn decode(bytes: &[u8], what: &str) -> Result<FileMap> {
        let bad = |why: &str| Error::corrupt(format!("{what}: not a file map ({why})"));
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err(bad("bad header"));
        }
        let n = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        let hashes_end = n
            .checked_mul(8)
            .and_then(|l| l.checked_add(12))
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| bad("block count past its end"))?;
        let block_hashes = bytes[12..hashes_end]
            .chunks_exact(8)
            .map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")))
            .collect();
        let chunks = serde_json::from_slice(&bytes[hashes_end..]).map_err(|e| {
            Error::with_source(
                crate::ErrorKind::Corrupt,
                format!("{what}: not a file map (extents)"),
                e,
            )
        })?;
        Ok(FileMap {
            chunks,
            block_hashes,
        })
    }
}

impl FileEntry {
    /// Whether the entry refers to a map frame that has not been loaded into it.
    pub fn map_unloaded(&self) -> bool {
        self.map.is_some() && self.chunks.is_empty() && self.size > 0
    }

    /// Whether a file of this size and block size keeps its map inline.
    pub fn inline_map(&self) -> bool {
        self.block_hashes.len() <= INLINE_MAX_BLOCKS
    }

    /// Take the extents and block hashes out of the entry (they are to be stored in a map
    /// frame), leaving the packs they use.
    pub fn take_map(&mut self) -> FileMap {
        FileMap {
            chunks: std::mem::take(&mut self.chunks),
            block_hashes: std::mem::take(&mut self.block_hashes),
        }
    }

    /// Refer to `map_ref`, the stored frame of `map` (extents relative to the manifest
    /// `label`), and record the packs both use.
    pub fn set_map(&mut self, map_ref: Chunk, map: &FileMap, label: &str) {
        let mut uses = pack_uses(map.chunks.iter().chain([&map_ref]), label);
        uses.sort_by(|a, b| (&a.backup, &a.pack).cmp(&(&b.backup, &b.pack)));
        self.packs = uses;
        self.map = Some(Box::new(map_ref));
    }

    /// The entry as manifest `new_label` refers to it when carried from `from_label`.
    pub fn rebase(&mut self, from_label: &str, new_label: &str) {
        for c in &mut self.chunks {
            *c = c.rebased(from_label, new_label);
        }
        if let Some(m) = &mut self.map {
            **m = m.rebased(from_label, new_label);
        }
        for p in &mut self.packs {
            *p = p.rebased(from_label, new_label);
        }
    }

    /// Put a loaded map into the entry: its extents rebased from the backup that wrote it
    /// to manifest `label`.
    pub(crate) fn attach_map(&mut self, map: FileMap, label: &str) {
        let owner = self
            .map
            .as_ref()
            .expect("attach_map of an entry without a map")
            .owner(label)
            .to_string();
        self.chunks = map
            .chunks
            .iter()
            .map(|c| c.rebased(&owner, label))
            .collect();
        self.block_hashes = map.block_hashes;
    }
}

/// Stored bytes of the distinct frames `chunks` reference, per pack.
fn pack_uses<'c>(chunks: impl Iterator<Item = &'c Chunk>, label: &str) -> Vec<PackUse> {
    let mut seen = HashSet::new();
    let mut per_pack: BTreeMap<(Option<Arc<str>>, Arc<str>), u64> = BTreeMap::new();
    for c in chunks {
        let Some(pack) = &c.pack else { continue };
        if seen.insert((c.owner(label).to_string(), pack.clone(), c.offset)) {
            *per_pack
                .entry((c.backup.clone(), pack.clone()))
                .or_default() += c.stored as u64;
        }
    }
    per_pack
        .into_iter()
        .map(|((backup, pack), stored)| PackUse {
            backup,
            pack,
            stored,
        })
        .collect()
}

impl Manifest {
    /// Stored bytes of the distinct frames this manifest references, per (owner label,
    /// pack): what its backup needs to exist, without reading any map.
    pub fn pack_usage(&self) -> BTreeMap<(String, String), u64> {
        let mut usage: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut inline_frames = HashSet::new();
        for f in self.files() {
            if f.map.is_some() {
                for p in &f.packs {
                    *usage
                        .entry((p.owner(&self.label).to_string(), p.pack.to_string()))
                        .or_default() += p.stored;
                }
                continue;
            }
            for c in &f.chunks {
                if let Some(k) = c.frame_key(&self.label) {
                    if inline_frames.insert(k.clone()) {
                        *usage.entry((k.0, k.1)).or_default() += c.stored as u64;
                    }
                }
            }
        }
        usage
    }

    /// Whether any file's map is still to be loaded.
    pub fn maps_unloaded(&self) -> bool {
        self.files().any(FileEntry::map_unloaded)
    }

    /// Load every file's map frame into its entry, checking each as the manifest's own
    /// entries were checked.
    pub async fn load_maps(&mut self, storage: &Storage) -> Result<()> {
        self.load_maps_of(storage, |_| true).await
    }

    /// Load the map frames of the files `wanted` picks, checked. Maps are fetched
    /// `CONCURRENT_MAP_READS` at a time.
    pub async fn load_maps_of(
        &mut self,
        storage: &Storage,
        wanted: impl Fn(&FileEntry) -> bool,
    ) -> Result<()> {
        use futures::{StreamExt, TryStreamExt};
        const CONCURRENT_MAP_READS: usize = 16;
        let wanted: Vec<usize> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, super::Entry::File(f) if f.map_unloaded() && wanted(f)))
            .map(|(i, _)| i)
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        // Neighbouring maps often share a pack: one reader per group merges their reads.
        let groups: Vec<&[usize]> = wanted.chunks(64).collect();
        let this = &*self;
        let loaded: Vec<Vec<(usize, FileMap)>> = futures::stream::iter(groups)
            .map(|group| async move {
                let mut reader = FrameReader::new(storage, this);
                let refs: Vec<&Chunk> = group
                    .iter()
                    .filter_map(|i| this.file_at(*i).map.as_deref())
                    .collect();
                reader.load(&refs, "file maps").await?;
                group
                    .iter()
                    .map(|i| {
                        let f = this.file_at(*i);
                        let map_ref = f.map.as_ref().expect("wanted maps only");
                        let what = format!("{}: map of {}", this.label, f.path);
                        FileMap::decode(reader.bytes(map_ref)?, &what).map(|m| (*i, m))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .buffer_unordered(CONCURRENT_MAP_READS)
            .try_collect()
            .await?;
        let label = self.label.clone();
        for (i, map) in loaded.into_iter().flatten() {
            let super::Entry::File(f) = &mut self.entries[i] else {
                unreachable!("wanted files only")
            };
            f.attach_map(map, &label);
        }
        let what = layout_key(self);
        super::validate::check_loaded_maps(self, &what)
    }

    /// Load one file's map (the file must have one), checked.
    pub async fn load_map(&self, reader: &mut FrameReader<'_>, f: &FileEntry) -> Result<FileEntry> {
        let map_ref = f.map.as_ref().expect("load_map of a file without a map");
        reader.load(&[map_ref], &f.path).await?;
        let what = format!("{}: map of {}", self.label, f.path);
        let map = FileMap::decode(reader.bytes(map_ref)?, &what);
        reader.clear();
        let mut loaded = f.clone();
        let map = map?;
        loaded.attach_map(map, &self.label);
        super::validate::check_loaded_map(self, &loaded, &layout_key(self))?;
        Ok(loaded)
    }

    fn file_at(&self, i: usize) -> &FileEntry {
        match &self.entries[i] {
            super::Entry::File(f) => f,
            _ => unreachable!("an index of a file entry"),
        }
    }
}

fn layout_key(m: &Manifest) -> String {
    crate::layout::manifest(&m.stanza, &m.label)
}
