//! Reading file maps (docs/repository-format.md, "File maps"): a file's extents and block
//! hashes, stored as a map frame (or a chain of delta frames) in a pack, loaded into its
//! manifest entry.
//!
//! Apart from `manifest`, which defines maps and checks them, because loading reads frames
//! through [`FrameReader`], which reads with a manifest's codecs: `pack` depends on
//! `manifest`, and `manifest` stays free of `pack`.

use crate::chunk::Chunk;
use crate::manifest::validate::check_loaded_map;
use crate::manifest::{Entry, FileEntry, FileMap, Manifest, MapDelta, MapFrame, MAX_MAP_DEPTH};
use crate::pack::FrameReader;
use crate::{layout, Error, Result, Storage};

impl Manifest {
    /// Load every file's map frame into its entry, checking each as the manifest's own
    /// entries were checked.
    pub async fn load_maps(&mut self, storage: &Storage) -> Result<()> {
        let mut entries = std::mem::take(&mut self.entries);
        let mut files: Vec<&mut FileEntry> = entries
            .iter_mut()
            .filter_map(|e| match e {
                Entry::File(f) => Some(&mut **f),
                _ => None,
            })
            .collect();
        let loaded = self.load_maps_into(storage, &mut files).await;
        drop(files);
        self.entries = entries;
        loaded
    }

    /// Load the map frames of those of `files` (entries of this manifest, held apart
    /// from it as a reader of a [`crate::manifest::StoredManifest`] holds them) whose map is still
    /// to load, checked.
    pub async fn load_maps_into(
        &self,
        storage: &Storage,
        files: &mut [&mut FileEntry],
    ) -> Result<()> {
        let mut files: Vec<&mut FileEntry> = files
            .iter_mut()
            .filter(|f| f.map_unloaded())
            .map(|f| &mut **f)
            .collect();
        if files.is_empty() {
            return Ok(());
        }
        let refs: Vec<&FileEntry> = files.iter().map(|f| &**f).collect();
        let loaded = self.read_maps(storage, &refs).await?;
        let what = layout_key(self);
        for (f, map) in files.iter_mut().zip(loaded) {
            f.chunks = map.chunks.into();
            f.block_hashes = map.block_hashes.into();
            check_loaded_map(self, f, &what)?;
        }
        Ok(())
    }

    /// Load one file's map (the file must have one), checked.
    pub async fn load_map(&self, storage: &Storage, f: &FileEntry) -> Result<FileEntry> {
        let map = self
            .read_maps(storage, &[f])
            .await?
            .pop()
            .expect("one map read");
        let mut loaded = f.clone();
        loaded.chunks = map.chunks.into();
        loaded.block_hashes = map.block_hashes.into();
        check_loaded_map(self, &loaded, &layout_key(self))?;
        Ok(loaded)
    }

    /// The whole maps of `files` (entries of this manifest with maps), in order, with
    /// extents as this manifest sees them: each file's map frame is read, and each delta
    /// map's base after it, level by level, until every chain reaches a whole map; the
    /// deltas are then applied from the bottom up.
    async fn read_maps(&self, storage: &Storage, files: &[&FileEntry]) -> Result<Vec<FileMap>> {
        use futures::{StreamExt, TryStreamExt};
        const CONCURRENT_MAP_READS: usize = 16;
        let what = |f: &FileEntry| format!("{}: map of {}", self.label, f.path);
        let mut whole: Vec<Option<FileMap>> = vec![None; files.len()];
        let mut deltas: Vec<Vec<MapDelta>> = vec![Vec::new(); files.len()];
        // (position in `files`, the frame to read next, as this manifest refers to it)
        let mut pending: Vec<(usize, Chunk)> = files
            .iter()
            .enumerate()
            .map(|(k, f)| (k, (**f.map.as_ref().expect("files with maps")).clone()))
            .collect();
        while !pending.is_empty() {
            // Neighbouring maps often share a pack: one reader per group merges their reads.
            let read: Vec<Vec<(usize, MapFrame)>> = futures::stream::iter(pending.chunks(64))
                .map(|group| async move {
                    let mut reader = FrameReader::new(storage, self);
                    let refs: Vec<&Chunk> = group.iter().map(|(_, c)| c).collect();
                    reader.load(&refs, "file maps").await?;
                    group
                        .iter()
                        .map(|(k, c)| {
                            let frame = MapFrame::decode(reader.bytes(c)?, &what(files[*k]))?;
                            Ok((*k, frame.rebased(c.owner(&self.label), &self.label)))
                        })
                        .collect::<Result<Vec<_>>>()
                })
                .buffer_unordered(CONCURRENT_MAP_READS)
                .try_collect()
                .await?;
            pending = Vec::new();
            for (k, frame) in read.into_iter().flatten() {
                match frame {
                    MapFrame::Whole(m) => whole[k] = Some(m),
                    MapFrame::Delta(d) => {
                        if deltas[k].len() >= MAX_MAP_DEPTH as usize {
                            return Err(Error::corrupt(format!(
                                "{}: more than {MAX_MAP_DEPTH} delta maps in a chain",
                                what(files[k])
                            )));
                        }
                        pending.push((k, d.base.clone()));
                        deltas[k].push(d);
                    }
                }
            }
        }
        whole
            .into_iter()
            .zip(deltas)
            .zip(files)
            .map(|((m, chain), f)| {
                let mut m = m.expect("every chain ends in a whole map");
                for d in chain.into_iter().rev() {
                    m = d.apply(m, f.block_size, &what(f))?;
                }
                Ok(m)
            })
            .collect()
    }
}

fn layout_key(m: &Manifest) -> String {
    layout::manifest(&m.stanza, &m.label)
}
