//! Copy between repositories that cannot share sealed frames: re-sealing.
//!
//! A pack's frames are sealed one by one, bound to the pack's name and the frame's offset,
//! and a manifest records each sealed frame's length and check. When the target cannot
//! open what the source sealed (other master keys, or one repository encrypted and the
//! other not), packs cannot cross as stored: every frame a copied backup references is
//! read and checked against its manifest, opened with the source's keys, sealed for the
//! target (its compressed bytes unchanged) into a new pack of the same owner, and the
//! backup's manifest is rewritten to point at the new frames. Files with maps get a new
//! whole map frame (a delta chain in the source becomes one map in the target).
//!
//! Only frames the target lacks cross. Where they are is learnt, per backup in both
//! repositories, by reading its manifest in each and pairing the extents file by file
//! (they were written one for one); a frame found nowhere is sealed again. The owner of a
//! frame stays its owner (its codec is the owner's, `pack_codecs`), so a backup that the
//! target does not hold but whose frames a copied one uses gets packs in its directory,
//! as a copy of stored packs does.
//!
//! New packs take worker numbers above any the owner's directory holds in the target, so
//! a rerun after a killed copy never meets the packs of the killed run (they are garbage
//! until an expire). A killed run may also leave manifest parts without a manifest: a
//! rerun removes them before it writes the backup's own (no manifest refers to them, and
//! the stanza lock is held).

use super::{checked_frame, Frame, Job};
use crate::{Error, Result};
use pgstrata_repo::chunk::Chunk;
use pgstrata_repo::manifest::{Entry, FileEntry, Manifest};
use pgstrata_repo::name::Name;
use pgstrata_repo::pack::{PackWriter, DEFAULT_PACK_SIZE};
use pgstrata_repo::{layout, Storage};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A stored frame: (owner label, pack, offset).
type FrameAt = (Name, Name, u64);

/// Where a source frame is in the target.
#[derive(Debug, Clone, Copy)]
struct Resealed {
    owner: Name,
    pack: Name,
    offset: u64,
    stored: u32,
    check: u64,
}

/// What a re-sealing copy knows of the target's frames.
#[derive(Default)]
pub(super) struct Translations {
    frames: HashMap<FrameAt, Resealed>,
    /// Backups whose two manifests were paired.
    learned: HashSet<String>,
    /// The next free worker number in each owner's pack directory of the target.
    next_worker: HashMap<String, usize>,
}

/// The frames to fetch from the source, by (owner, pack): offset → (stored length, check).
type Wanted = BTreeMap<(String, String), BTreeMap<u64, (u32, u64)>>;

impl Job {
    /// Copy backup `label` re-sealed: its frames the target lacks, sealed for it, then its
    /// WAL, then its manifest rewritten (parts, copy, manifest, create-only).
    pub(super) async fn reseal_backup(&mut self, label: &str) -> Result<()> {
        let (m, entries) = load_whole(&self.src, &self.stanza, label).await?;
        for known in self.backups_to_pair(label, &entries) {
            self.learn(&known).await?;
        }
        let mut t = self.reseal.take().expect("a re-sealing copy");
        let wanted = wanted_frames(label, &entries, &t.frames);
        let owners: BTreeSet<&str> = wanted
            .keys()
            .map(|(o, _)| o.as_str())
            .chain([label])
            .collect();
        let workers: BTreeMap<String, usize> = owners
            .into_iter()
            .map(|o| (o.to_string(), t.take_worker(&self.target, &self.stanza, o)))
            .collect();
        let sealer = Sealer {
            dst: self.dst.clone(),
            runtime: tokio::runtime::Handle::current(),
            stanza: self.stanza.clone(),
            workers,
            writers: BTreeMap::new(),
            translations: t,
            src_cipher: self.src.cipher().cloned(),
            opened: Vec::new(),
        };
        let fetched = self.fetch_and_seal(sealer, wanted).await;
        let compression = m.compression;
        let label_owned = label.to_string();
        let done = match fetched {
            Ok(sealer) => tokio::task::spawn_blocking(move || {
                sealer.rewrite(entries, &label_owned, compression)
            })
            .await
            .expect("re-sealing task"),
            Err(e) => return Err(e),
        };
        let (entries, t, written, packs) = done?;
        self.reseal = Some(t);
        self.report.objects_copied += packs;
        self.report.bytes_copied += written;
        self.copy_wal_for(&m).await?;
        self.remove_stale_parts(label).await?;
        let mut m = m;
        m.entries = entries;
        m.parts = Vec::new();
        if m.packs_used.is_some() {
            m.set_packs_used();
        }
        m.publish(&self.dst).await?;
        let written = 2 + 2 * m.parts.len() as u64;
        self.report.objects_copied += written;
        self.target.insert(layout::manifest(&self.stanza, label), 0);
        log::info!(
            "backup {label} copied to repository {} (re-sealed)",
            self.to_repo
        );
        self.report.backups_copied.push(label.to_string());
        Ok(())
    }

    /// The backups in both repositories whose pairing tells where the frames `entries`
    /// use are in the target: the owners of those frames, and the newest backup before
    /// `label` (which refers to the frames of backups the target may no longer hold).
    fn backups_to_pair(&self, label: &str, entries: &[Entry]) -> Vec<String> {
        let in_target = |l: &str| self.has(&layout::manifest(&self.stanza, l));
        let mut owners: BTreeSet<String> = BTreeSet::new();
        for f in files(entries) {
            for c in &f.chunks {
                if c.pack.is_some() && c.owner(label) != label {
                    owners.insert(c.owner(label).to_string());
                }
            }
        }
        let newest_before = self
            .source_labels
            .iter()
            .rfind(|l| l.as_str() < label && in_target(l))
            .cloned();
        owners
            .into_iter()
            .filter(|o| in_target(o) && self.source_labels.contains(o))
            .chain(newest_before)
            .filter(|l| {
                !self
                    .reseal
                    .as_ref()
                    .expect("re-sealing")
                    .learned
                    .contains(l)
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Pair backup `label`'s extents in the source and in the target, file by file, and
    /// remember where each source frame is in the target.
    async fn learn(&mut self, label: &str) -> Result<()> {
        let (from, to) = futures::try_join!(
            load_whole(&self.src, &self.stanza, label),
            load_whole(&self.dst, &self.stanza, label)
        )?;
        let there: HashMap<&str, &FileEntry> = files(&to.1).map(|f| (&*f.path, f)).collect();
        let owner = |c: &Chunk| Name::new(c.owner(label));
        let t = self.reseal.as_mut().expect("re-sealing");
        for f in files(&from.1) {
            let Some(g) = there.get(&*f.path) else {
                continue;
            };
            if f.chunks.len() != g.chunks.len() {
                continue;
            }
            for (a, b) in f.chunks.iter().zip(g.chunks.iter()) {
                if let (Some(pa), Some(pb), Some(check)) = (a.pack, b.pack, b.check) {
                    if a.raw == b.raw && a.at == b.at {
                        let r = Resealed {
                            owner: owner(b),
                            pack: pb,
                            offset: b.offset,
                            stored: b.stored,
                            check,
                        };
                        t.frames.insert((owner(a), pa, a.offset), r);
                    }
                }
            }
        }
        t.learned.insert(label.to_string());
        Ok(())
    }

    /// Read the packs holding `wanted` (`in_flight` at a time), check each frame wanted,
    /// and hand them to `sealer`, which seals them into the target's new packs.
    async fn fetch_and_seal(&mut self, sealer: Sealer, wanted: Wanted) -> Result<Sealer> {
        use futures::StreamExt;
        let bytes: u64 = wanted
            .values()
            .flat_map(|f| f.values().map(|(s, _)| *s as u64))
            .sum();
        self.progress.totals().add(bytes, wanted.len() as u64);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<FetchedPack>(2);
        let sealing = tokio::task::spawn_blocking(move || {
            let mut sealer = sealer;
            while let Some(p) = rx.blocking_recv() {
                sealer.seal_pack(p)?;
            }
            Ok::<_, Error>(sealer)
        });
        let (src, stanza, to_repo) = (&self.src, &self.stanza, self.to_repo);
        let mut reads = futures::stream::iter(wanted)
            .map(|((owner, pack), frames)| async move {
                let key = layout::pack(stanza, &owner, &pack);
                let bytes = src.get_unsealed_once(&key).await?;
                for (&offset, &(len, check)) in &frames {
                    checked_frame(&bytes, &key, (offset, len, check), to_repo)?;
                }
                Ok::<_, Error>(FetchedPack {
                    owner,
                    pack,
                    key,
                    bytes,
                    frames: frames.into_iter().map(|(o, (s, h))| (o, s, h)).collect(),
                })
            })
            .buffered(self.in_flight);
        let mut read_error = None;
        while let Some(p) = reads.next().await {
            match p {
                Ok(p) => {
                    let stored = p.frames.iter().map(|(_, s, _)| *s as u64).sum();
                    self.progress.counters.add(stored, 1);
                    if tx.send(p).await.is_err() {
                        break; // the sealer failed: its error is returned below
                    }
                }
                Err(e) => {
                    read_error = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let sealed = sealing.await.expect("re-sealing task");
        match read_error {
            Some(e) => Err(e),
            None => sealed,
        }
    }

    /// Remove the manifest parts (and copies) of `label` that a killed copy left in the
    /// target: no manifest refers to them, and the ones about to be written take their
    /// names.
    async fn remove_stale_parts(&mut self, label: &str) -> Result<()> {
        let dir = format!("{}/manifest/", layout::backup_dir(&self.stanza, label));
        let stale: Vec<String> = self
            .target
            .keys()
            .filter(|k| {
                k.starts_with(&dir) || k.starts_with(&layout::manifest_copy(&self.stanza, label))
            })
            .cloned()
            .collect();
        if !stale.is_empty() {
            log::info!(
                "removing {} manifest object(s) of backup {label} an interrupted copy left in repository {}",
                stale.len(),
                self.to_repo
            );
            self.dst.delete_many(&stale).await?;
            for k in &stale {
                self.target.remove(k);
            }
        }
        Ok(())
    }
}

impl Translations {
    /// A worker number for new packs of `owner` in the target: above every one its pack
    /// directory held when the copy started, and above those this copy took.
    fn take_worker(&mut self, target: &HashMap<String, u64>, stanza: &str, owner: &str) -> usize {
        let next = self
            .next_worker
            .entry(owner.to_string())
            .or_insert_with(|| {
                let dir = format!("{}/", layout::pack_dir(stanza, owner));
                target
                    .keys()
                    .filter_map(|k| layout::parse_pack_name(k.strip_prefix(&dir)?))
                    .map(|(worker, _)| worker + 1)
                    .max()
                    .unwrap_or(0)
            });
        *next += 1;
        *next - 1
    }
}

/// A source pack, read, with the frames of it to seal again (offset, length, check).
struct FetchedPack {
    owner: String,
    pack: String,
    key: String,
    bytes: bytes::Bytes,
    frames: Vec<Frame>,
}

/// Seals frames into the target's new packs (one writer per owner), on a blocking thread:
/// a pack writer blocks on its writes.
struct Sealer {
    dst: Storage,
    runtime: tokio::runtime::Handle,
    stanza: String,
    /// The worker number of each owner's new packs.
    workers: BTreeMap<String, usize>,
    writers: BTreeMap<String, PackWriter>,
    translations: Translations,
    /// The source's keys, when it is encrypted.
    src_cipher: Option<std::sync::Arc<pgstrata_repo::cipher::Cipher>>,
    /// A frame opened from the source.
    opened: Vec<u8>,
}

impl Sealer {
    fn writer(&mut self, owner: &str) -> &mut PackWriter {
        let (dst, runtime, stanza, worker) =
            (&self.dst, &self.runtime, &self.stanza, self.workers[owner]);
        self.writers.entry(owner.to_string()).or_insert_with(|| {
            PackWriter::new(
                dst.clone(),
                runtime.clone(),
                stanza,
                owner,
                worker,
                DEFAULT_PACK_SIZE,
            )
        })
    }

    /// Seal every wanted frame of pack `p` again into its owner's new pack.
    fn seal_pack(&mut self, p: FetchedPack) -> Result<()> {
        let (owner, pack) = (Name::new(&p.owner), Name::new(&p.pack));
        let src_cipher = self.src_cipher.clone();
        for &(offset, len, _) in &p.frames {
            let stored = &p.bytes[offset as usize..offset as usize + len as usize];
            let mut opened = std::mem::take(&mut self.opened);
            let compressed: &[u8] = match &src_cipher {
                Some(c) => {
                    c.open_frame_into(&p.key, offset, stored, &mut opened, &p.key)?;
                    &opened
                }
                None => stored,
            };
            let c = self.writer(&p.owner).add(compressed, compressed.len())?;
            self.opened = opened;
            let r = Resealed {
                owner,
                pack: c.pack.expect("a stored frame"),
                offset: c.offset,
                stored: c.stored,
                check: c.check.expect("a stored frame"),
            };
            self.translations.frames.insert((owner, pack, offset), r);
        }
        Ok(())
    }

    /// Point every extent of `entries` (backup `label`'s) at its frame in the target, give
    /// each file that had a map a new one (sealed into `label`'s new packs, compressed
    /// with `compression`), and finish every pack. Returns the entries, what is known of
    /// the target's frames, and the bytes and packs written.
    fn rewrite(
        mut self,
        mut entries: Vec<Entry>,
        label: &str,
        compression: pgstrata_repo::codec::Compression,
    ) -> Result<(Vec<Entry>, Translations, u64, u64)> {
        for e in &mut entries {
            let Entry::File(f) = e else { continue };
            for c in f.chunks.iter_mut() {
                *c = self.translated(c, label)?;
            }
            if f.map.is_some() {
                let map = f.take_map();
                let raw = map.encode();
                let map_ref = self
                    .writer(label)
                    .add(&compression.compress(&raw), raw.len())?;
                f.set_map(map_ref, &map);
            }
        }
        let (mut written, mut packs) = (0, 0);
        for w in self.writers.values_mut() {
            w.finish()?;
            written += w.written;
            packs += w.packs_written;
        }
        Ok((entries, self.translations, written, packs))
    }

    /// Extent `c` of backup `label`, pointing at its frame in the target.
    fn translated(&self, c: &Chunk, label: &str) -> Result<Chunk> {
        let Some(pack) = c.pack else {
            return Ok(c.clone());
        };
        let owner = c.owner(label);
        let Some(r) = self
            .translations
            .frames
            .get(&(Name::new(owner), pack, c.offset))
        else {
            return Err(Error::integrity(format!(
                "backup {label}: the frame at offset {} of pack {pack} of backup {owner} was neither found in the target nor sealed for it",
                c.offset
            )));
        };
        Ok(Chunk {
            pack: Some(r.pack),
            backup: (r.owner.as_str() != label).then_some(r.owner),
            offset: r.offset,
            stored: r.stored,
            check: Some(r.check),
            ..c.clone()
        })
    }
}

/// Backup `label`'s manifest in `storage`, checked, with every entry, and every file's map
/// loaded into it (extents as the manifest sees them).
async fn load_whole(
    storage: &Storage,
    stanza: &str,
    label: &str,
) -> Result<(Manifest, Vec<Entry>)> {
    let stored = Manifest::open(storage, stanza, label, &[]).await?;
    let mut entries = Vec::new();
    stored
        .for_each_entry::<Error>(|e| {
            entries.push(e);
            Ok(())
        })
        .await?;
    let m = stored.header().clone();
    let mut with_maps: Vec<&mut FileEntry> = entries
        .iter_mut()
        .filter_map(|e| match e {
            Entry::File(f) if f.map_unloaded() => Some(&mut **f),
            _ => None,
        })
        .collect();
    for batch in with_maps.chunks_mut(1024) {
        m.load_maps_into(storage, batch).await?;
    }
    Ok((m, entries))
}

fn files(entries: &[Entry]) -> impl Iterator<Item = &FileEntry> {
    entries.iter().filter_map(|e| match e {
        Entry::File(f) => Some(&**f),
        _ => None,
    })
}

/// The frames `entries` (backup `label`'s) use that `known` does not place in the target.
fn wanted_frames(label: &str, entries: &[Entry], known: &HashMap<FrameAt, Resealed>) -> Wanted {
    let mut wanted = Wanted::new();
    for f in files(entries) {
        for c in &f.chunks {
            let (Some(pack), Some(check)) = (c.pack, c.check) else {
                continue;
            };
            let owner = c.owner(label);
            if !known.contains_key(&(Name::new(owner), pack, c.offset)) {
                wanted
                    .entry((owner.to_string(), pack.to_string()))
                    .or_default()
                    .insert(c.offset, (c.stored, check));
            }
        }
    }
    wanted
}
