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
//!
//! A file that changed in a few blocks, found by WAL tracking, gets a **delta map**
//! ([`MapDelta`]) instead: its new blocks' hashes and extents, and a reference to the map
//! it changes. Writing it needs neither the old map's bytes nor its reading (on a backup
//! host, the old map of a changed 1 GB segment crossed the line for every incremental, and
//! its new map was most of what the incremental stored). Readers follow the chain down to
//! a whole map and apply each delta on the way back ([`Manifest::load_maps_into`]). A chain
//! is at most [`MAX_MAP_DEPTH`] deltas long; the writer then stores a whole map again.

use super::{FileEntry, Manifest, ThinVec};
use crate::chunk::Chunk;
use crate::name::Name;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

const MAGIC: &[u8; 8] = b"PGSTRMAP";
const DELTA_MAGIC: &[u8; 8] = b"PGSTRMDL";

/// Deltas a chain may hold before a writer stores a whole map again: each is one more
/// frame a restore of the file reads.
pub const MAX_MAP_DEPTH: u8 = 8;

/// Files of at most this many blocks keep their extents and block hashes in the manifest.
pub const INLINE_MAX_BLOCKS: usize = 8;

/// A pack a file's map and extents use, and the stored bytes of the distinct frames of it
/// they reference. `backup` is relative to the manifest, as a chunk's is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackUse {
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Name>,
    #[serde(rename = "p")]
    pub pack: Name,
    #[serde(rename = "s")]
    pub stored: u64,
}

impl PackUse {
    pub fn owner<'a>(&'a self, manifest_label: &'a str) -> &'a str {
        self.backup.as_deref().unwrap_or(manifest_label)
    }

    /// The same use as seen from manifest `new_label`, read from manifest `from_label`.
    pub fn rebased(&self, from_label: &str, new_label: &str) -> PackUse {
        PackUse {
            backup: crate::chunk::rebased_owner(self.backup, from_label, new_label),
            pack: self.pack,
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
        hashes_then(MAGIC, &self.block_hashes, &json)
    }

    pub fn decode(bytes: &[u8], what: &str) -> Result<FileMap> {
        let bad = |why: &str| Error::corrupt(format!("{what}: not a file map ({why})"));
        let (block_hashes, rest) = hashes_after(bytes, MAGIC).map_err(bad)?;
        let chunks = serde_json::from_slice(rest).map_err(|e| {
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

/// Consecutive blocks a delta map replaces: blocks `first .. first + count`, and the
/// extents that hold their bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapRun {
    #[serde(rename = "i")]
    pub first: u32,
    #[serde(rename = "n")]
    pub count: u32,
    #[serde(rename = "c")]
    pub chunks: Vec<Chunk>,
}

/// A file's map as a change of another one (its `base`): the file is now `size` bytes,
/// the blocks of `runs` hold what their extents say and hash as `hashes` (in run order),
/// and every other block below the new size is the base's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDelta {
    pub size: u64,
    pub base: Chunk,
    pub runs: Vec<MapRun>,
    #[serde(skip)]
    pub hashes: Vec<u64>,
}

/// What a map frame holds.
#[derive(Debug)]
pub enum MapFrame {
    Whole(FileMap),
    Delta(MapDelta),
}

impl MapFrame {
    pub fn decode(bytes: &[u8], what: &str) -> Result<MapFrame> {
        if bytes.len() >= 8 && &bytes[..8] == DELTA_MAGIC {
            return MapDelta::decode(bytes, what).map(MapFrame::Delta);
        }
        FileMap::decode(bytes, what).map(MapFrame::Whole)
    }

    /// The same frame with every extent (and a delta's base) as seen from manifest
    /// `new_label`, read from a frame written by backup `owner`.
    pub(crate) fn rebased(self, owner: &str, new_label: &str) -> MapFrame {
        let rebase = |chunks: &mut Vec<Chunk>| {
            for c in chunks {
                *c = c.rebased(owner, new_label);
            }
        };
        match self {
            MapFrame::Whole(mut m) => {
                rebase(&mut m.chunks);
                MapFrame::Whole(m)
            }
            MapFrame::Delta(mut d) => {
                d.base = d.base.rebased(owner, new_label);
                for r in &mut d.runs {
                    rebase(&mut r.chunks);
                }
                MapFrame::Delta(d)
            }
        }
    }
}

impl MapDelta {
    /// Decoded delta frame: `"PGSTRMDL"`, a u32 LE count M, M block hashes as u64 LE (the
    /// runs' blocks in order), then the JSON object of `size`, `base` and `runs`.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("serialize a delta map");
        hashes_then(DELTA_MAGIC, &self.hashes, &json)
    }

    pub fn decode(bytes: &[u8], what: &str) -> Result<MapDelta> {
        let bad = |why: &str| Error::corrupt(format!("{what}: not a delta map ({why})"));
        let (hashes, rest) = hashes_after(bytes, DELTA_MAGIC).map_err(bad)?;
        let mut d: MapDelta = serde_json::from_slice(rest).map_err(|e| {
            Error::with_source(
                crate::ErrorKind::Corrupt,
                format!("{what}: not a delta map (runs)"),
                e,
            )
        })?;
        d.hashes = hashes;
        Ok(d)
    }

    /// Apply this delta to `base`, the map it changes (extents of both as seen from the
    /// same manifest), for a file of blocks of `block_size` bytes.
    pub fn apply(self, base: FileMap, block_size: u32, what: &str) -> Result<FileMap> {
        let bad = |why: String| Error::corrupt(format!("{what}: delta map: {why}"));
        let bs = block_size as u64;
        if bs == 0 {
            return Err(bad("a file without a block map".into()));
        }
        let blocks = self.size.div_ceil(bs);
        if blocks > u32::MAX as u64 {
            return Err(bad(format!("{} bytes is too large", self.size)));
        }
        let run_blocks: u64 = self.runs.iter().map(|r| r.count as u64).sum();
        if run_blocks != self.hashes.len() as u64 {
            return Err(bad(format!(
                "{} hashes for {run_blocks} blocks of runs",
                self.hashes.len()
            )));
        }
        let base_size: u64 = base.chunks.iter().map(|c| c.raw as u64).sum();
        let mut block_hashes = base.block_hashes;
        block_hashes.resize(blocks as usize, 0);
        let mut chunks = Vec::with_capacity(base.chunks.len() + self.runs.len() * 2);
        let mut base_at = BaseCursor::new(&base.chunks);
        let mut hashes = self.hashes.into_iter();
        // Blocks the base did not have must all be in runs.
        let mut covered_to = 0u64;
        for run in self.runs {
            let start = run.first as u64 * bs;
            let end = ((run.first as u64 + run.count as u64) * bs).min(self.size);
            if run.count == 0 || start < covered_to || start >= self.size {
                return Err(bad(format!(
                    "run at block {} out of order or place",
                    run.first
                )));
            }
            if start > base_size {
                return Err(bad(format!(
                    "blocks before {} are in neither map",
                    run.first
                )));
            }
            base_at.take(covered_to, start, &mut chunks);
            let raw: u64 = run.chunks.iter().map(|c| c.raw as u64).sum();
            if raw != end - start {
                return Err(bad(format!(
                    "run at block {} holds {raw} bytes, not {}",
                    run.first,
                    end - start
                )));
            }
            for (i, h) in (run.first as usize..).zip(hashes.by_ref().take(run.count as usize)) {
                block_hashes[i] = h;
            }
            chunks.extend(run.chunks);
            covered_to = end;
        }
        if covered_to < self.size {
            if self.size > base_size {
                return Err(bad(format!(
                    "bytes {base_size}..{} are in neither map",
                    self.size
                )));
            }
            base_at.take(covered_to, self.size, &mut chunks);
        }
        let mut merged: Vec<Chunk> = Vec::with_capacity(chunks.len());
        for c in chunks {
            if let Some(last) = merged.last_mut() {
                if last.try_merge(&c) {
                    continue;
                }
            }
            merged.push(c);
        }
        Ok(FileMap {
            chunks: merged,
            block_hashes,
        })
    }
}

/// Walks a map's extents by file offset, handing out the parts of them in a byte range.
struct BaseCursor<'c> {
    chunks: &'c [Chunk],
    /// Index of the extent holding `start`, and the file offset where it begins.
    i: usize,
    start: u64,
}

impl<'c> BaseCursor<'c> {
    fn new(chunks: &'c [Chunk]) -> Self {
        BaseCursor {
            chunks,
            i: 0,
            start: 0,
        }
    }

    /// Append the extents of bytes `from..to` (`from` never below an earlier `to`).
    fn take(&mut self, from: u64, to: u64, out: &mut Vec<Chunk>) {
        while from < to && self.i < self.chunks.len() {
            let c = &self.chunks[self.i];
            let end = self.start + c.raw as u64;
            if end <= from {
                self.i += 1;
                self.start = end;
                continue;
            }
            if self.start >= to {
                return;
            }
            let lo = from.max(self.start);
            let hi = to.min(end);
            out.push(c.slice((lo - self.start) as u32, (hi - lo) as u32));
            if hi < end {
                return;
            }
            self.i += 1;
            self.start = end;
        }
    }
}

/// `magic`, the count of `hashes` as u32 LE, the hashes as u64 LE, then `rest`: the
/// decoded form of both kinds of map frame ([`hashes_after`] reads it back).
fn hashes_then(magic: &[u8; 8], hashes: &[u64], rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + hashes.len() * 8 + rest.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
    for h in hashes {
        out.extend_from_slice(&h.to_le_bytes());
    }
    out.extend_from_slice(rest);
    out
}

/// The block hashes after an 8-byte `magic` and their u32 LE count, and the bytes after;
/// or why there are none.
fn hashes_after<'b>(
    bytes: &'b [u8],
    magic: &[u8; 8],
) -> std::result::Result<(Vec<u64>, &'b [u8]), &'static str> {
    if bytes.len() < 12 || &bytes[..8] != magic {
        return Err("bad header");
    }
    let n = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let end = n
        .checked_mul(8)
        .and_then(|l| l.checked_add(12))
        .filter(|e| *e <= bytes.len())
        .ok_or("block count past its end")?;
    let hashes = bytes[12..end]
        .chunks_exact(8)
        .map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")))
        .collect();
    Ok((hashes, &bytes[end..]))
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
            chunks: std::mem::take(&mut self.chunks).into_vec(),
            block_hashes: std::mem::take(&mut self.block_hashes).into_vec(),
        }
    }

    /// Refer to `map_ref`, the stored frame of `map` (extents relative to this entry's
    /// manifest), and record the packs both use.
    pub fn set_map(&mut self, map_ref: Chunk, map: &FileMap) {
        self.packs = pack_uses(map.chunks.iter().chain([&map_ref])).into();
        self.map = Some(Box::new(map_ref));
        self.map_depth = 0;
    }

    /// Refer to `map_ref`, the stored frame of `delta` (extents relative to this entry's
    /// manifest), the `depth`th delta over the map of an entry that used `base_packs` (as
    /// this manifest sees them). The packs listed are the base's and the delta's: some of
    /// the base's extents may be replaced, but its map frames are still read.
    pub fn set_delta_map(
        &mut self,
        map_ref: Chunk,
        delta: &MapDelta,
        base_packs: ThinVec<PackUse>,
        depth: u8,
    ) {
        let new = pack_uses(delta.runs.iter().flat_map(|r| &r.chunks).chain([&map_ref]));
        let mut uses: BTreeMap<(Option<Name>, Name), u64> = BTreeMap::new();
        for p in base_packs.into_iter().chain(new) {
            *uses.entry((p.backup, p.pack)).or_default() += p.stored;
        }
        self.packs = uses
            .into_iter()
            .map(|((backup, pack), stored)| PackUse {
                backup,
                pack,
                stored,
            })
            .collect();
        self.map = Some(Box::new(map_ref));
        self.map_depth = depth;
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
}

/// Stored bytes of the distinct frames `chunks` reference, per pack, ordered by (backup,
/// pack).
fn pack_uses<'c>(chunks: impl Iterator<Item = &'c Chunk>) -> Vec<PackUse> {
    let mut seen = HashSet::new();
    let mut per_pack: BTreeMap<(Option<Name>, Name), u64> = BTreeMap::new();
    for c in chunks {
        let Some(pack) = &c.pack else { continue };
        // (`b`, pack, offset) names the frame: `b` absent is the manifest's own backup.
        if seen.insert((c.backup, *pack, c.offset)) {
            *per_pack.entry((c.backup, *pack)).or_default() += c.stored as u64;
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

/// Stored bytes of the distinct frames the file entries of one manifest reference, per
/// (owner label, pack), counted one entry at a time ([`Manifest::pack_usage`], or a reader
/// of a [`super::StoredManifest`]).
pub struct PackUsage {
    label: String,
    own: Name,
    usage: BTreeMap<(String, String), u64>,
    /// Per (owner, pack) by interned names, the byte ranges of the frames counted, merged:
    /// frames are disjoint, so a frame is counted once when its range is not yet covered.
    /// A manifest of a million small files references about as many frames, nearly all
    /// of them in runs that follow one another in their packs: a set of frames cost ~40
    /// bytes a file, the ranges cost a few per pack.
    inline_frames: HashMap<(Option<Name>, Name), FrameRanges>,
}

/// Disjoint byte ranges (start to end) of a pack, touching ones merged.
#[derive(Default)]
struct FrameRanges(BTreeMap<u64, u64>);

impl FrameRanges {
    /// Cover `start..end`: whether any of it was not covered yet. (A frame is either
    /// covered whole, by being counted before, or not at all.)
    fn cover(&mut self, start: u64, end: u64) -> bool {
        if let Some((_, &e)) = self.0.range(..=start).next_back() {
            if e >= end {
                return false;
            }
        }
        let (mut lo, mut hi) = (start, end);
        while let Some((&s, &e)) = self.0.range(..=hi).next_back() {
            if e < lo {
                break;
            }
            self.0.remove(&s);
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.0.insert(lo, hi);
        true
    }

    fn bytes(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }
}

impl PackUsage {
    /// For the entries of backup `label`'s manifest.
    pub fn new(label: &str) -> PackUsage {
        PackUsage {
            label: label.to_string(),
            own: Name::new(label),
            usage: BTreeMap::new(),
            inline_frames: HashMap::new(),
        }
    }

    /// Count the frames `f` references (each distinct frame once).
    pub fn add(&mut self, f: &FileEntry) {
        if f.map.is_some() {
            for p in &f.packs {
                *self
                    .usage
                    .entry((p.owner(&self.label).to_string(), p.pack.to_string()))
                    .or_default() += p.stored;
            }
            return;
        }
        for c in &f.chunks {
            let Some(pack) = c.pack else { continue };
            // An extent naming this manifest's own label is the same frame as one naming
            // none.
            let backup = c.backup.filter(|b| *b != self.own);
            self.inline_frames
                .entry((backup, pack))
                .or_default()
                .cover(c.offset, c.offset + c.stored as u64);
        }
    }

    pub fn finish(self) -> BTreeMap<(String, String), u64> {
        let mut usage = self.usage;
        for ((backup, pack), ranges) in self.inline_frames {
            let owner = backup.map_or(self.label.as_str(), |b| b.as_str());
            *usage
                .entry((owner.to_string(), pack.as_str().to_string()))
                .or_default() += ranges.bytes();
        }
        usage
    }
}

impl Manifest {
    /// Stored bytes of the distinct frames this manifest references, per (owner label,
    /// pack): what its backup needs to exist, without reading any map.
    pub fn pack_usage(&self) -> BTreeMap<(String, String), u64> {
        let mut usage = PackUsage::new(&self.label);
        for f in self.files() {
            usage.add(f);
        }
        usage.finish()
    }

    /// Whether any file's map is still to be loaded.
    pub fn maps_unloaded(&self) -> bool {
        self.files().any(FileEntry::map_unloaded)
    }
}

#[cfg(test)]
mod tests {
    use super::FrameRanges;

    #[test]
    fn frames_are_counted_once_in_whatever_order_they_come() {
        let mut r = FrameRanges::default();
        // Frames of 10 bytes at 0, 10, ..., 90, referenced out of order and some twice.
        let order = [3, 1, 3, 0, 9, 2, 2, 7, 5, 4, 8, 6, 0, 9];
        let counted: usize = order
            .iter()
            .filter(|&&i| r.cover(i * 10, i * 10 + 10))
            .count();
        assert_eq!(counted, 10);
        assert_eq!(r.bytes(), 100);
        assert_eq!(r.0.len(), 1, "touching frames are one range");
        // A frame apart from the others stays its own range.
        assert!(r.cover(200, 205));
        assert!(!r.cover(200, 205));
        assert_eq!((r.bytes(), r.0.len()), (105, 2));
    }
}
