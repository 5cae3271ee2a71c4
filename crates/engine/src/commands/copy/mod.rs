//! `copy`: copy backups and their WAL from one repository of a stanza to another.
//!
//! Ransomware deletes backups first. A second repository that receives copies (an object
//! store, possibly immutable) is the defence, and each repository keeps its own retention:
//! a backup expired in one stays restorable from the other.
//!
//! What crosses: for each backup the target lacks (or `--set`), every pack its manifest
//! references (its own and earlier backups' packs: every backup is logically full, so one
//! manifest names every pack it needs), its manifest parts and its manifest; then the WAL
//! archive from the oldest copied backup's start on, history files included. Only objects
//! the target lacks cross: the target is listed once, at the start.
//!
//! Every object is checked on the way against what the format records for it, before it
//! is written: each frame of a pack that a manifest references against its frame check
//! (`h`; map frames are also decoded and checked as restore loads them), each part against
//! the hash its manifest lists, the manifest against its own checksum, each WAL object by
//! decoding it against its BLAKE3, each block-change map against its BLAKE3. A damaged
//! object is an error naming it (exit 4), before the backup's manifest is written.
//!
//! The write order is a backup's: packs first, then each part's copy and the part, then the
//! manifest's copy and the manifest, all create-only. So a copy stopped at any point leaves
//! no backup in the target (the manifest makes a backup exist), only packs and parts no
//! manifest references, and a rerun skips what is already there (objects appear whole or
//! not at all on every backend) and writes the rest. The target's stanza lock is held
//! throughout: the target's expire must not take the packs of a backup being copied for
//! garbage.
//!
//! Packs cross as stored where both repositories hold the stanza in the clear or under the
//! same master keys: their frames are sealed one by one in an encrypted stanza and the
//! manifests record the check of each sealed frame. When the target has no stanza yet, copy
//! creates it from the source's record and key files (the source's passphrases then open
//! it; `key-add --repo=N` and `key-remove --repo=N` give it passphrases of its own).
//! Otherwise (a target created apart, with other master keys; a key-remove in the source
//! since; plain to encrypted or back) every frame is opened and sealed again for the
//! target, and each backup's manifest is rewritten to point at the re-sealed frames
//! (`reseal`). Objects sealed whole (manifests, parts, WAL, upgrade records) are opened
//! with the source's keys and sealed again under the target's newest generation either way.

use crate::progress::{human_bytes, Progress};
use crate::{open_stanza, Error, Result, Settings};
use bytes::Bytes;
use pgstrata_repo::changemap::ChangeMap;
use pgstrata_repo::chunk::{frame_check, Chunk};
use pgstrata_repo::manifest::{check_part, list_backups, Entry, FileEntry, Manifest};
use pgstrata_repo::{layout, wal_object, Storage};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

mod reseal;

/// What to copy.
#[derive(Debug, Clone, Default)]
pub struct CopyOptions {
    /// One backup (`--set`); every backup the target lacks when `None`.
    pub set: Option<String>,
}

/// What a copy did.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct CopyReport {
    pub stanza: String,
    /// The repositories' numbers.
    pub from_repo: u8,
    pub to_repo: u8,
    /// Whether copy created the stanza in the target (record and key files).
    pub stanza_created: bool,
    /// Labels of the backups copied (their manifests written), oldest first.
    pub backups_copied: Vec<String>,
    /// Objects written to the target, and their bytes as stored.
    pub objects_copied: u64,
    pub bytes_copied: u64,
    /// Objects the target already had.
    pub objects_skipped: u64,
    /// WAL files (segments, partial, backup and history files) written to the target.
    pub wal_copied: u64,
    /// Of `bytes_copied`, the bytes of WAL objects (and their block-change maps): the rest
    /// is the backups' own objects.
    pub wal_bytes_copied: u64,
    pub duration_ms: u64,
}

/// One line (and the labels) for people.
pub fn render_text(r: &CopyReport) -> String {
    let labels = if r.backups_copied.is_empty() {
        String::new()
    } else {
        format!(" ({})", r.backups_copied.join(", "))
    };
    format!(
        "stanza '{}': repo{} to repo{}{}: {} backup(s) copied{labels}, {} object(s) ({}) copied, {} already there, {} WAL file(s) copied, in {:.1} s\n",
        r.stanza,
        r.from_repo,
        r.to_repo,
        if r.stanza_created { " (stanza created)" } else { "" },
        r.backups_copied.len(),
        r.objects_copied,
        human_bytes(r.bytes_copied),
        r.objects_skipped,
        r.wal_copied,
        r.duration_ms as f64 / 1000.0
    )
}

/// Copy backups and WAL of stanza `from.stanza` from repository `from` to repository `to`.
pub async fn copy(from: &Settings, to: &Settings, o: &CopyOptions) -> Result<CopyReport> {
    let started = Instant::now();
    if from.repo_index == to.repo_index {
        return Err(Error::config(format!(
            "copy: --from-repo and --repo both name repository {}",
            to.repo_index
        )));
    }
    let stanza = from.stanza.clone();
    let (src, src_info) = open_stanza(from).await?;
    let plain_target = to.storage()?;
    let stanza_created = !plain_target.exists(&layout::stanza_info(&stanza)).await?;
    if stanza_created {
        create_target_stanza(&src, &plain_target, &stanza).await?;
    }
    let (dst, mut dst_info) = open_stanza(to).await?;
    if dst_info.history.len() < src_info.history.len()
        && src_info.history.starts_with(&dst_info.history)
    {
        // The source had a stanza-upgrade the target lacks: its records, as stored.
        for n in dst_info.history.len() + 1..=src_info.history.len() {
            let key = layout::stanza_upgrade(&stanza, n as u32);
            match dst.put_new(&key, src.get(&key).await?).await {
                Err(e) if e.kind == pgstrata_repo::ErrorKind::AlreadyExists => {}
                r => r?,
            }
        }
        log::info!(
            "stanza '{stanza}' upgraded in repository {} as in repository {}",
            to.repo_index,
            from.repo_index
        );
        dst_info = open_stanza(to).await?.1;
    }
    if src_info.history != dst_info.history {
        return Err(Error::config(format!(
            "stanza '{stanza}' belongs to another cluster in repository {} ({}) than in repository {} ({}): nothing was copied",
            from.repo_index,
            src_info.cluster.archive_id(),
            to.repo_index,
            dst_info.cluster.archive_id()
        )));
    }
    let reseal = why_reseal(&src, &dst, from.repo_index, to.repo_index).map(|why| {
        log::info!(
            "{why}: every frame copied is sealed again for repository {}",
            to.repo_index
        );
        reseal::Translations::default()
    });
    let limit = crate::progress::repository_limit(&dst).or(crate::progress::repository_limit(&src));
    let mut job = Job {
        src,
        dst,
        stanza: stanza.clone(),
        to_repo: to.repo_index,
        target: HashMap::new(),
        copied: HashSet::new(),
        source_labels: Vec::new(),
        reseal,
        wal_from: None,
        archive: Vec::new(),
        cluster: src_info.cluster.clone(),
        prior_archives: src_info.history[..src_info.history.len() - 1]
            .iter()
            .map(|c| c.archive_id())
            .collect(),
        report: CopyReport {
            stanza: stanza.clone(),
            from_repo: from.repo_index,
            to_repo: to.repo_index,
            stanza_created,
            ..CopyReport::default()
        },
        progress: Progress::start("copy", 0, 0, limit),
        // At least four: one object at a time waits on each read, check, write and fsync
        // (and on an object store on each round trip) in turn.
        in_flight: (to.process_max.get().max(from.process_max.get()) * 2).max(4),
    };
    let dst = job.dst.clone();
    let archive_id = src_info.cluster.archive_id();
    let work = async {
        job.run(o, &archive_id).await?;
        Ok(job)
    };
    let job = crate::lock::with_lock(&dst, &stanza, &to.lock_path, "copy", work).await?;
    job.progress.finish();
    let mut report = job.report;
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// The target has no stanza: make it the source's, byte for byte (key files first, the
/// record last, which makes the stanza exist), so the source's passphrases open it.
async fn create_target_stanza(src: &Storage, dst: &Storage, stanza: &str) -> Result<()> {
    for key in src.list(&format!("{}/", layout::keys_dir(stanza))).await? {
        let bytes = src.get_unsealed(&key.key).await?;
        put_created(dst, &key.key, bytes).await?;
    }
    let record = layout::stanza_info(stanza);
    let bytes = src.get_unsealed(&record).await?;
    put_created(dst, &record, bytes).await?;
    log::info!(
        "stanza '{stanza}' created in {} as in {}",
        dst.description(),
        src.description()
    );
    Ok(())
}

/// Write `bytes` as stored; an object already there (a rerun) is fine.
async fn put_created(dst: &Storage, key: &str, bytes: Bytes) -> Result<()> {
    match dst.put_new_unsealed(key, bytes).await {
        Err(e) if e.kind == pgstrata_repo::ErrorKind::AlreadyExists => Ok(()),
        r => Ok(r?),
    }
}

/// Why packs cannot cross as stored (the target could not open what the source sealed),
/// so that every frame is sealed again for the target; None when both hold the stanza in
/// the clear or the target holds every master key generation of the source's.
fn why_reseal(src: &Storage, dst: &Storage, from: u8, to: u8) -> Option<String> {
    Some(match (src.cipher(), dst.cipher()) {
        (None, None) => return None,
        (Some(_), None) => format!("repository {from} is encrypted and repository {to} is not"),
        (None, Some(_)) => format!("repository {to} is encrypted and repository {from} is not"),
        (Some(s), Some(d)) => match s.generation_not_shared(d)? {
            Ok(1) => format!(
                "repositories {from} and {to} hold the stanza under different master keys (the stanzas were created apart)"
            ),
            Ok(g) => format!(
                "repositories {from} and {to} hold different master keys of generation {g} (a key-remove in each of them)"
            ),
            Err(g) => format!(
                "repository {from} seals with master key generation {g} (a key-remove there), which repository {to}'s keys do not hold"
            ),
        },
    })
}

/// One copy's repositories, what the target holds, and what was done.
struct Job {
    src: Storage,
    dst: Storage,
    stanza: String,
    to_repo: u8,
    /// The target's objects when the copy started (key → size), and those written since.
    target: HashMap<String, u64>,
    /// The objects this copy wrote.
    copied: HashSet<String>,
    /// The source's backups, oldest first.
    source_labels: Vec<String>,
    /// Where the frames the target holds re-sealed are, when packs cannot cross as stored.
    reseal: Option<reseal::Translations>,
    /// Where the WAL copied starts: the first copied backup's start segment.
    wal_from: Option<String>,
    /// The source's WAL archive objects (listed once, after the target).
    archive: Vec<pgstrata_repo::storage::ObjectInfo>,
    /// The stanza's cluster, whose archive is `archive`.
    cluster: pgstrata_repo::stanza::ClusterIdentity,
    /// The archives of the clusters before its stanza-upgrades: closed, copied whole.
    prior_archives: Vec<String>,
    report: CopyReport,
    progress: Progress,
    /// Objects read, checked and written at once: each is a round trip or two, and on an
    /// object store the latency, not the bytes, bounds one at a time.
    in_flight: usize,
}

/// What became of one object of a copy.
enum Moved {
    /// Written, with its length as stored.
    Written(String, u64),
    /// Already in the target (written meanwhile by another writer).
    There,
    /// Gone from the source meanwhile (WAL expired there).
    Gone,
}

/// The lowest WAL segment name: copying "from" it copies a whole archive.
const FIRST_SEGMENT: &str = "000000000000000000000000";

/// A stored frame of a pack, as manifests refer to it: offset, stored length, check.
type Frame = (u64, u32, u64);

impl Job {
    async fn run(&mut self, o: &CopyOptions, archive_id: &str) -> Result<()> {
        // Packs a killed copy staged and never published: every writer of backups holds
        // the stanza lock this copy holds, so none is a write in progress.
        let stale = self
            .dst
            .remove_stale_staging(&format!("{}/backup/", self.stanza), Duration::ZERO)?;
        if !stale.is_empty() {
            log::info!(
                "removed {} staging file(s) an interrupted copy or backup left",
                stale.len()
            );
        }
        self.target = self
            .dst
            .list(&format!("{}/", self.stanza))
            .await?
            .into_iter()
            .map(|i| (i.key, i.size))
            .collect();
        let labels = list_backups(&self.src, &self.stanza).await?;
        self.source_labels = labels.clone();
        let chosen: Vec<String> = match &o.set {
            Some(want) if !labels.contains(want) => {
                return Err(Error::config(format!(
                    "backup '{want}' does not exist in stanza '{}' of {}",
                    self.stanza,
                    self.src.description()
                )))
            }
            Some(want) => vec![want.clone()],
            None => labels
                .iter()
                .filter(|l| !self.has(&layout::manifest(&self.stanza, l)))
                .cloned()
                .collect(),
        };
        for prior in self.prior_archives.clone() {
            let root = format!("{}/", layout::archive_root(&self.stanza, &prior));
            let archive = self.src.list(&root).await?;
            self.copy_wal_objects(&archive, FIRST_SEGMENT, None).await?;
        }
        let root = format!("{}/", layout::archive_root(&self.stanza, archive_id));
        self.archive = self.src.list(&root).await?;
        if let Some(first) = chosen
            .iter()
            .find(|l| !self.has(&layout::manifest(&self.stanza, l)))
        {
            self.wal_from = self.wal_before(first).await?;
        }
        for label in &chosen {
            self.copy_backup(label).await?;
        }
        if self.wal_from.is_none() {
            // Nothing new: the WAL since the newest backup, which a target that was down
            // while archive-push stalled may lack.
            if let Some(newest) = labels.last() {
                let m = Manifest::load_header(&self.src, &self.stanza, newest).await?;
                self.wal_from = Some(self.start_in_archive(&m));
            }
        }
        if let Some(from) = self.wal_from.clone() {
            self.copy_wal(&from, None).await?;
        }
        Ok(())
    }

    /// The start segment of the newest backup the target has before `label`: the WAL
    /// copied starts there, so that the target's archive has no gap between the backups it
    /// had and those copied (one killed copy may have brought a backup and its WAL, and the
    /// next copies the backups after it). None when the target has none before it.
    async fn wal_before(&self, label: &str) -> Result<Option<String>> {
        let prefix = format!("{}/", layout::backup_root(&self.stanza));
        let before = self
            .target
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix)?.strip_suffix("/backup.manifest"))
            .filter(|l| *l < label)
            .max();
        let Some(before) = before else {
            return Ok(None);
        };
        let m = Manifest::load_header(&self.dst, &self.stanza, before).await?;
        Ok(Some(self.start_in_archive(&m)))
    }

    /// Backup `m`'s start segment, where the stanza's archive is copied from; the first
    /// segment when `m` is of a cluster before a stanza-upgrade (whose WAL names are in
    /// another archive and say nothing of this one's).
    fn start_in_archive(&self, m: &Manifest) -> String {
        match m.cluster == self.cluster {
            true => m.start.wal.clone(),
            false => FIRST_SEGMENT.to_string(),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.target.contains_key(key)
    }

    /// Copy backup `label` (manifest last).
    async fn copy_backup(&mut self, label: &str) -> Result<()> {
        let manifest_key = layout::manifest(&self.stanza, label);
        let stored = Manifest::open(&self.src, &self.stanza, label, &[]).await?;
        let m = stored.header().clone();
        if self.has(&manifest_key) {
            log::info!("backup {label} is already in repository {}", self.to_repo);
            self.report.objects_skipped += 1;
            return Ok(());
        }
        if self.reseal.is_some() {
            return self.reseal_backup(label).await;
        }
        let frames = self.frames_of(&m, &stored).await?;
        let bytes: u64 = frames
            .values()
            .flat_map(|f| f.iter().map(|(_, s, _)| *s as u64))
            .sum();
        self.progress.totals().add(bytes, frames.len() as u64);
        self.copy_packs(&frames).await?;
        self.copy_wal_for(&m).await?;
        for (n, part) in m.parts.iter().enumerate() {
            let key = layout::manifest_part(&self.stanza, label, n);
            let copy_key = layout::manifest_part_copy(&self.stanza, label, n);
            let plain = self.src.get(&key).await?;
            check_part(&plain, &key, part)?;
            self.put_twins(&copy_key, &key, plain).await?;
        }
        let plain = self.src.get(&manifest_key).await?;
        Manifest::check_stored(&plain, &manifest_key)?;
        let copy_key = layout::manifest_copy(&self.stanza, label);
        self.put_twins(&copy_key, &manifest_key, plain).await?;
        log::info!("backup {label} copied to repository {}", self.to_repo);
        self.report.backups_copied.push(label.to_string());
        Ok(())
    }

    /// As a backup does: the WAL backup `m` needs to become consistent is in the archive
    /// before its manifest, and from the oldest copied backup's start on, so that the
    /// target's archive has no gap at any point. (A backup of a cluster before a
    /// stanza-upgrade has its WAL in that cluster's archive, copied whole before the
    /// backups.)
    async fn copy_wal_for(&mut self, m: &Manifest) -> Result<()> {
        if m.cluster == self.cluster {
            let from = self
                .wal_from
                .get_or_insert_with(|| m.start.wal.clone())
                .clone();
            self.copy_wal(&from, Some(&m.stop.wal)).await?;
        }
        Ok(())
    }

    /// Every frame backup `m` references, by pack: its entries' extents and map frames,
    /// and the extents inside the map frames (loaded and checked from the source).
    async fn frames_of(
        &self,
        m: &Manifest,
        stored: &pgstrata_repo::manifest::StoredManifest,
    ) -> Result<BTreeMap<(String, String), Vec<Frame>>> {
        let mut frames: BTreeMap<(String, String), BTreeMap<u64, (u32, u64)>> = BTreeMap::new();
        let mut add = |c: &Chunk| {
            if let (Some(pack), Some(check)) = (&c.pack, c.check) {
                frames
                    .entry((c.owner(&m.label).to_string(), pack.to_string()))
                    .or_default()
                    .insert(c.offset, (c.stored, check));
            }
        };
        let mut with_maps: Vec<FileEntry> = Vec::new();
        stored
            .for_each_entry::<Error>(|e| {
                if let Entry::File(f) = e {
                    if f.map_unloaded() {
                        if let Some(map) = &f.map {
                            add(map);
                        }
                        with_maps.push(*f);
                    } else {
                        f.chunks.iter().for_each(&mut add);
                    }
                }
                Ok(())
            })
            .await?;
        for batch in with_maps.chunks_mut(1024) {
            let mut refs: Vec<&mut FileEntry> = batch.iter_mut().collect();
            m.load_maps_into(&self.src, &mut refs).await?;
            for f in batch.iter() {
                f.chunks.iter().for_each(&mut add);
            }
        }
        Ok(frames
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().map(|(o, (s, h))| (o, s, h)).collect()))
            .collect())
    }

    /// Copy the packs `frames` names as stored, `in_flight` at a time, each after checking
    /// every frame of it the backup references.
    async fn copy_packs(&mut self, frames: &BTreeMap<(String, String), Vec<Frame>>) -> Result<()> {
        use futures::{StreamExt, TryStreamExt};
        let mut todo = Vec::new();
        for ((owner, pack), frames) in frames {
            let key = layout::pack(&self.stanza, owner, pack);
            let stored: u64 = frames.iter().map(|(_, s, _)| *s as u64).sum();
            if self.has(&key) {
                self.report.objects_skipped += 1;
                self.progress.counters.add(stored, 1);
            } else {
                todo.push((key, frames.as_slice(), stored));
            }
        }
        let (src, dst, to_repo) = (&self.src, &self.dst, self.to_repo);
        let mut moved = futures::stream::iter(todo)
            .map(|(key, frames, stored)| async move {
                let m = transfer_pack(src, dst, key, frames.to_vec(), to_repo).await?;
                Ok::<_, Error>((m, stored))
            })
            .buffer_unordered(self.in_flight);
        let mut done = Vec::new();
        let mut staged = Vec::new();
        while let Some((m, stored)) = moved.try_next().await? {
            self.progress.counters.add(stored, 1);
            match m {
                Transferred::Moved(m) => done.push(m),
                Transferred::Staged(key, object) => staged.push((key, object)),
            }
        }
        drop(moved);
        // A local target: every pack written, one syncfs makes them all durable before
        // they appear (the manifest follows them).
        let (keys, objects): (Vec<_>, Vec<_>) = staged.into_iter().unzip();
        let lens: Vec<u64> = objects.iter().map(|o| o.len()).collect();
        let dst = self.dst.clone();
        let published = tokio::task::spawn_blocking(move || dst.publish_staged(objects))
            .await
            .expect("publish thread")?;
        for ((key, len), published) in keys.into_iter().zip(lens).zip(published) {
            done.push(if published {
                Moved::Written(key, len)
            } else {
                Moved::There
            });
        }
        for m in done {
            self.count(m);
        }
        Ok(())
    }

    fn count(&mut self, m: Moved) {
        match m {
            Moved::Written(key, len) => self.count_written(&key, len),
            Moved::There => self.report.objects_skipped += 1,
            Moved::Gone => {}
        }
    }

    fn count_written(&mut self, key: &str, len: u64) {
        self.report.objects_copied += 1;
        self.report.bytes_copied += len;
        self.target.insert(key.to_string(), len);
        self.copied.insert(key.to_string());
    }

    /// Write the twins `copy` then `key` of `plain` (sealed under `key`'s name in an
    /// encrypted stanza), skipping those there; a copy left by a stopped run stays.
    async fn put_twins(&mut self, copy: &str, key: &str, plain: Bytes) -> Result<()> {
        let len = plain.len() as u64;
        match (self.has(copy), self.has(key)) {
            (true, true) => self.report.objects_skipped += 2,
            (true, false) => {
                self.report.objects_skipped += 1;
                self.dst.put_new(key, plain).await?;
                self.count_written(key, len);
            }
            (false, _) => {
                self.dst.put_new_twice(copy, key, plain).await?;
                self.count_written(copy, len);
                self.count_written(key, len);
            }
        }
        Ok(())
    }

    /// Copy the source's WAL objects from segment `from` on (through `until` when given;
    /// any timeline) and every history file, each checked, opened and sealed again for the
    /// target.
    async fn copy_wal(&mut self, from: &str, until: Option<&str>) -> Result<()> {
        let archive = std::mem::take(&mut self.archive);
        let copied = self.copy_wal_objects(&archive, from, until).await;
        self.archive = archive;
        copied
    }

    async fn copy_wal_objects(
        &mut self,
        archive: &[pgstrata_repo::storage::ObjectInfo],
        from: &str,
        until: Option<&str>,
    ) -> Result<()> {
        use futures::{StreamExt, TryStreamExt};
        let mut todo = Vec::new();
        for obj in archive {
            let name = obj.key.rsplit('/').next().unwrap_or_default();
            let position = name.get(8..24).filter(|_| name.len() >= 24);
            let wanted = name.ends_with(".history")
                || (position.is_some()
                    && position >= from.get(8..24)
                    && until.is_none_or(|u| position <= u.get(8..24)));
            if !wanted {
                continue;
            }
            if self.has(&obj.key) {
                if !self.copied.contains(&obj.key) {
                    self.report.objects_skipped += 1;
                }
                continue;
            }
            todo.push(obj.key.as_str());
        }
        let (src, dst) = (&self.src, &self.dst);
        let mut moved = futures::stream::iter(todo)
            .map(|key| transfer_wal(src, dst, key))
            .buffer_unordered(self.in_flight);
        let mut done = Vec::new();
        while let Some(m) = moved.try_next().await? {
            if let Moved::Written(_, len) = &m {
                self.progress.counters.add(*len, 1);
            }
            done.push(m);
        }
        drop(moved);
        for m in done {
            if let Moved::Written(key, len) = &m {
                self.report.wal_bytes_copied += len;
                self.report.wal_copied += u64::from(!key.ends_with(".map"));
            }
            self.count(m);
        }
        Ok(())
    }
}

/// Copy pack `key` as stored, after checking each of `frames` in it (and, in an encrypted
/// stanza, opening it with the target's keys).
/// A pack taken from the source: written, or (a local target) staged for
/// [`Storage::publish_staged`].
enum Transferred {
    Moved(Moved),
    Staged(String, pgstrata_repo::storage::StagedObject),
}

/// Read pack `key`, check every frame `frames` lists (and, into an encrypted target, that
/// it opens), and write it as stored: to a staging file where the target is a local
/// directory, else create-only.
async fn transfer_pack(
    src: &Storage,
    dst: &Storage,
    key: String,
    frames: Vec<Frame>,
    to_repo: u8,
) -> Result<Transferred> {
    let bytes = src.get_unsealed_once(&key).await?;
    let checker = dst.clone();
    // Checking (and staging) on a thread of its own: the packs in flight use every core.
    let (key, bytes, staged) = tokio::task::spawn_blocking(move || -> Result<_> {
        let mut opened = Vec::new();
        for &(offset, len, check) in &frames {
            let frame = checked_frame(&bytes, &key, (offset, len, check), to_repo)?;
            if let Some(cipher) = checker.cipher() {
                cipher.open_frame_into(&key, offset, frame, &mut opened, &key)?;
            }
        }
        let staged = checker.stage_new(&key, &bytes)?;
        Ok((key, bytes, staged))
    })
    .await
    .expect("pack check thread")?;
    match staged {
        Some(object) => Ok(Transferred::Staged(key, object)),
        None => put_as_stored(dst, &key, bytes)
            .await
            .map(Transferred::Moved),
    }
}

/// Frame `(offset, len, check)` of pack `key` (stored as `bytes`), checked.
fn checked_frame<'b>(
    bytes: &'b [u8],
    key: &str,
    (offset, len, check): Frame,
    to_repo: u8,
) -> Result<&'b [u8]> {
    let frame = usize::try_from(offset)
        .ok()
        .and_then(|o| bytes.get(o..o.checked_add(len as usize)?));
    frame.filter(|f| frame_check(f) == check).ok_or_else(|| {
        Error::integrity(format!(
            "{key}: the frame at offset {offset} ({len} bytes) does not match its check {check:016x} (or lies beyond the pack's {} bytes): the source object is damaged; no manifest was written to repository {to_repo}, so the backup is not there",
            bytes.len()
        ))
    })
}

/// Write `bytes` as stored to `key`; one written meanwhile (an archive-push to the target,
/// or another copy) is there already.
async fn put_as_stored(dst: &Storage, key: &str, bytes: Bytes) -> Result<Moved> {
    let len = bytes.len() as u64;
    moved(dst.put_new_unsealed(key, bytes).await, key, len)
}

/// What a create-only write of `len` bytes to `key` did: an object already there (another
/// writer's) is no failure.
fn moved(written: pgstrata_repo::Result<()>, key: &str, len: u64) -> Result<Moved> {
    match written {
        Err(e) if e.kind == pgstrata_repo::ErrorKind::AlreadyExists => Ok(Moved::There),
        r => r
            .map(|()| Moved::Written(key.to_string(), len))
            .map_err(Error::from),
    }
}

/// Copy WAL object `key` (a WAL file or a block-change map), decoded and checked against
/// its BLAKE3 on the way, sealed again for the target.
async fn transfer_wal(src: &Storage, dst: &Storage, key: &str) -> Result<Moved> {
    let plain = match src.get_unsealed_once(key).await {
        Err(e) if e.is_not_found() => return Ok(Moved::Gone), // expired meanwhile
        r => src.open_stored(key, r?)?,
    };
    if key.ends_with(".map") {
        ChangeMap::decode(&plain, key)?;
    } else {
        wal_object::decode(&plain, key)?;
    }
    let len = plain.len() as u64;
    moved(dst.put_new(key, plain).await, key, len)
}
