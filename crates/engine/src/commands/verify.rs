//! `verify`: prove that backups would restore, without restoring them.
//!
//! Every file of every backup (or of `--set`) is read back the way restore reads it: each
//! frame is fetched with a ranged read, its stored-bytes checksum is checked and it is
//! decoded, and the file's content is checked against the hashes recorded at backup time
//! (the file's BLAKE3, or each block's XXH3 for files copied by WAL tracking). Nothing is
//! written. A file entry identical to one already checked (same frames, same recorded hashes:
//! an unchanged file carried from an earlier backup by reference) is not read twice; it
//! shares that entry's verdict.
//!
//! WAL: every archived segment is fetched and its checksum checked, and every block-change
//! map too. A backup is invalid when a segment it needs to become consistent (its start
//! segment to its stop segment) is missing or damaged. Holes in the archive after the oldest
//! backup's start are gaps, and fail verify (exit 4) like damage: point-in-time recovery
//! cannot cross them. A damaged map is reported but fails nothing: incrementals fall back
//! to hashing.
//!
//! verify takes no lock and changes nothing; it reads the whole repository once per distinct
//! file entry, so it costs about as much as restoring each distinct backup. Backups are
//! taken one at a time, oldest first, each manifest read as a stream as restore reads it
//! (held as stored, checked entry by entry, then its files checked a window at a time),
//! plus the key of every distinct entry checked so far, with the reasons of those that
//! failed. It also checks that `packs_used` matches the entries, which opening a manifest
//! as a stream does not. With `--set`, the other backups' headers alone are read (for the
//! oldest start, where gaps count). Its progress (`progress`) counts the distinct entries'
//! bytes; each entry joins the total as verify reads it from its manifest, and the WAL
//! check before them is not counted.

use crate::content::{extents_of, for_each_extent, with_streamed_jobs, ContentCheck, FileJob};
use crate::progress::{Counters, Progress};
use crate::wal_archive::ArchivedSegments;
use crate::{open_stanza, Error, Result, Settings};
use futures::StreamExt;
use pgstrata_pg::lsn;
use pgstrata_repo::changemap::ChangeMap;
use pgstrata_repo::chunk::Chunk;
use pgstrata_repo::layout::{self, ArchiveObject};
use pgstrata_repo::manifest::{
    list_backups, Entry, FileEntry, Manifest, PackUsage, StoredManifest,
};
use pgstrata_repo::pack::FrameReader;
use pgstrata_repo::{wal_object, Storage};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub use crate::reports::{BackupVerdict, VerifyReport, WalVerdict};

fn hex_or_none(v: &Option<impl std::fmt::Debug>) -> String {
    format!("{v:x?}")
}

/// A file entry's identity for "already checked": the BLAKE3 of what it reads and what it
/// is checked against. 32 bytes, not the text: verify holds one for every file of every
/// backup (2.4 M for eight backups of 300,000 files).
type EntryKey = [u8; 32];

/// [`EntryKey`] of `f` in `m`, the text written into `text` (reused across calls).
fn entry_key(m: &Manifest, f: &FileEntry, text: &mut String) -> EntryKey {
    use std::fmt::Write;
    text.clear();
    if let (Some(map), true) = (&f.map, f.map_unloaded()) {
        // A stored map is written once and referenced unchanged: its frame names the
        // extents and hashes it holds.
        let (owner, pack, offset) = map.frame_key(&m.label).expect("a stored map");
        let _ = write!(
            text,
            "{}|{}|map {owner}/{pack}@{offset}:{}",
            f.size,
            hex_or_none(&f.hash),
            hex_or_none(&map.check)
        );
        return *blake3::hash(text.as_bytes()).as_bytes();
    }
    let _ = write!(
        text,
        "{}|{}|{}|{:x?}",
        f.size,
        hex_or_none(&f.hash),
        f.block_size,
        f.block_hashes
    );
    for c in &f.chunks {
        let _ = match (c.pack, c.owner(&m.label)) {
            (Some(pack), owner) => write!(
                text,
                "|{owner}/{}@{}+{}:{}:{}:{}",
                pack.as_str(),
                c.offset,
                c.stored,
                c.at,
                c.raw,
                hex_or_none(&c.check)
            ),
            (None, _) => write!(text, "|0x{}", c.raw),
        };
    }
    *blake3::hash(text.as_bytes()).as_bytes()
}

/// What to verify, and whether to repair.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// One backup (`--set`); all when `None`.
    pub set: Option<String>,
    /// Rewrite each damaged manifest object whose twin is intact from that twin
    /// (`--repair`), under the stanza lock.
    pub repair: bool,
}

pub async fn verify(s: &Settings, o: &VerifyOptions) -> Result<VerifyReport> {
    let set = o.set.as_deref();
    let (storage, stanza) = open_stanza(s).await?;
    refuse_repair_if_immutable(&storage, o)?;
    let labels = list_backups(&storage, &s.stanza).await?;
    if let Some(want) = set {
        if !labels.iter().any(|l| l == want) {
            return Err(Error::config(format!(
                "backup '{want}' does not exist in stanza '{}'",
                s.stanza
            )));
        }
    }
    let archive_id = stanza.cluster.archive_id();
    let seg_size = stanza.cluster.wal_segment_size;
    let archives = verify_archives(&storage, &stanza).await?;

    // One backup at a time, oldest first, each manifest alone in memory: its new file
    // entries are added to the progress total when it is reached.
    let limit = crate::progress::repository_limit(&storage);
    let progress = Progress::start("verify", 0, 0, limit);
    let mut seen = Seen::default();
    let mut backups = Vec::new();
    let mut damaged_objects = Vec::new();
    let mut oldest_start: HashMap<String, u64> = HashMap::new();
    for label in &labels {
        let selected = set.is_none_or(|w| w == label);
        if selected {
            damaged_objects.extend(damaged_twins(&storage, &s.stanza, label).await?);
        }
        let Some((m, stored)) =
            open_backup(&storage, &s.stanza, label, selected, &mut backups).await?
        else {
            continue;
        };
        let its_archive = m.cluster.archive_id();
        if let Some((_, segno)) = lsn::parse_segment_name(&m.start.wal, m.cluster.wal_segment_size)
        {
            let oldest = oldest_start.entry(its_archive.clone()).or_insert(segno);
            *oldest = (*oldest).min(segno);
        }
        let Some(stored) = stored else { continue };
        let mut v = BackupVerdict {
            label: m.label.clone(),
            ok: true,
            files: 0,
            files_read: 0,
            bytes_read: 0,
            errors: needed_wal_errors(&m, &archives),
        };
        check_backup(s, &storage, &m, &stored, &mut seen, &progress, &mut v).await?;
        v.ok = v.errors.is_empty();
        if v.ok {
            log::info!(
                "backup {}: ok ({} files, {} read back)",
                m.label,
                v.files,
                v.files_read
            );
        } else {
            log::error!("backup {}: {} problem(s)", m.label, v.errors.len());
        }
        backups.push(v);
    }
    let (wal, segments) = merge_archives(&stanza, archives, &oldest_start);
    let found = crate::vanished::Found {
        labels: &labels,
        wal: Some((&archive_id, &segments)),
        segment_size: seg_size,
    };
    let vanished = crate::vanished::check(s, &storage, &found).await?;
    progress.finish();
    backups.sort_by(|a, b| a.label.cmp(&b.label));
    // A gap is a failure even when every backup is consistent: point-in-time recovery
    // cannot cross it, and monitoring watches the exit code.
    let repaired = if o.repair && damaged_objects.iter().any(|d| d.twin_intact) {
        repair(s, &storage, &mut damaged_objects).await?
    } else {
        Vec::new()
    };
    // So is a damaged twin whose other half is intact: the backup restores today, but the
    // next damage loses it.
    let ok = backups.iter().all(|b| b.ok)
        && damaged_objects.is_empty()
        && vanished.is_empty()
        && wal.damaged.is_empty()
        && wal.gaps.is_empty();
    Ok(VerifyReport {
        stanza: s.stanza.clone(),
        repository: storage.description().to_string(),
        ok,
        backups,
        damaged_objects,
        vanished,
        repaired,
        wal,
    })
}

/// `--repair` on an immutable repository: refused before anything is read.
fn refuse_repair_if_immutable(storage: &Storage, o: &VerifyOptions) -> Result<()> {
    match (o.repair, storage.object_lock()) {
        (true, Some(lock)) => Err(Error::config(format!(
            "verify --repair rewrites damaged objects in place, and repository {} is immutable \
             (repo-s3-object-lock={}): a damaged object's intact twin keeps serving reads there; \
             to restore the redundancy, copy the backup to another repository (pgstrata copy)",
            storage.description(),
            pgstrata_repo::Named::name(lock.mode)
        ))),
        _ => Ok(()),
    }
}

/// `--repair`: under the stanza lock (expire must not remove a backup while one of its
/// objects is rewritten), rewrite every damaged object whose twin is intact from the twin
/// and take it out of `damaged`; returns the keys repaired. One that fails to be rewritten
/// stays in `damaged`, its failure logged.
async fn repair(
    s: &Settings,
    storage: &Storage,
    damaged: &mut Vec<pgstrata_repo::manifest::DamagedTwin>,
) -> Result<Vec<String>> {
    let candidates = std::mem::take(damaged);
    let work = async {
        let mut repaired = Vec::new();
        let mut left = Vec::new();
        for d in candidates {
            if !d.twin_intact {
                left.push(d);
                continue;
            }
            match d.repair(storage).await {
                Ok(()) => {
                    log::warn!("{}: rewritten from its intact twin {}", d.key, d.twin);
                    repaired.push(d.key);
                }
                Err(e) => {
                    log::error!("{}: not repaired: {e}", d.key);
                    left.push(d);
                }
            }
        }
        Ok((repaired, left))
    };
    let (repaired, left) =
        crate::lock::with_lock(storage, &s.stanza, &s.lock_path, "verify --repair", work).await?;
    *damaged = left;
    Ok(repaired)
}

/// The twins of backup `label`'s manifest objects that are damaged or missing, logged.
async fn damaged_twins(
    storage: &Storage,
    stanza: &str,
    label: &str,
) -> Result<Vec<pgstrata_repo::manifest::DamagedTwin>> {
    let damaged = Manifest::check_twins(storage, stanza, label).await?;
    for d in &damaged {
        log::error!("{}", describe_damaged_twin(d));
    }
    Ok(damaged)
}

/// One line on a damaged twin: what, why, and whether its twin still serves reads.
fn describe_damaged_twin(d: &pgstrata_repo::manifest::DamagedTwin) -> String {
    if d.twin_intact {
        format!(
            "{} is damaged ({}); its twin {} is intact and serves reads: the backup has lost its redundancy",
            d.key, d.why, d.twin
        )
    } else {
        format!(
            "{} is damaged ({}); its twin {} is damaged too",
            d.key, d.why, d.twin
        )
    }
}

/// Every entry checked so far, and why those that failed did: a verdict per distinct
/// entry of every backup, so the failures (few) are kept apart from the keys.
#[derive(Default)]
struct Seen {
    checked: HashSet<EntryKey>,
    failed: HashMap<EntryKey, String>,
}

/// Backup `label`'s header, with its manifest opened for reading when it is `selected`.
/// The selected backups' manifests are read as a stream, checked entry by entry first
/// (never decoded whole); the others' headers alone. None for a backup to pass over: one
/// expired meanwhile, or one whose manifest and its copy are damaged (it cannot be
/// restored: a failed verdict in `backups` when selected; the others are still checked).
async fn open_backup(
    storage: &Storage,
    stanza: &str,
    label: &str,
    selected: bool,
    backups: &mut Vec<BackupVerdict>,
) -> Result<Option<(Manifest, Option<Arc<StoredManifest>>)>> {
    let opened = if selected {
        Manifest::open(storage, stanza, label, &[])
            .await
            .map(|m| (m.header().clone(), Some(Arc::new(m))))
    } else {
        Manifest::load_header(storage, stanza, label)
            .await
            .map(|h| (h, None))
    };
    match opened {
        Ok(opened) => Ok(Some(opened)),
        Err(e) if e.is_not_found() => {
            log::warn!("backup {label} was expired while verify ran");
            Ok(None)
        }
        Err(e) if e.kind == pgstrata_repo::ErrorKind::Corrupt => {
            if selected {
                log::error!("backup {label}: {e}");
                backups.push(BackupVerdict {
                    label: label.to_string(),
                    ok: false,
                    files: 0,
                    files_read: 0,
                    bytes_read: 0,
                    errors: vec![e.to_string()],
                });
            }
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// What is wrong with the WAL backup `m` needs to become consistent: segments not
/// archived, or damaged.
fn needed_wal_errors(
    m: &Manifest,
    archives: &HashMap<String, (WalVerdict, ArchivedSegments)>,
) -> Vec<String> {
    let Some((wal, segments)) = archives.get(&m.cluster.archive_id()) else {
        return vec![format!(
            "it is a backup of cluster {}, which the stanza never belonged to: its WAL is not here",
            m.cluster.archive_id()
        )];
    };
    let seg_size = m.cluster.wal_segment_size;
    let archived = |name: &str| {
        lsn::parse_segment_name(name, seg_size)
            .is_some_and(|(tli, segno)| segments.get(&tli).is_some_and(|s| s.contains(&segno)))
    };
    let mut errors = vec![];
    for name in lsn::segments_between(m.start.timeline, m.start.lsn, m.stop.lsn, seg_size) {
        if !archived(&name) {
            errors.push(format!(
                "WAL segment {name}, needed to make the backup consistent, is not archived"
            ));
        } else if wal.damaged.contains(&name) {
            errors.push(format!(
                "WAL segment {name}, needed to make the backup consistent, is damaged"
            ));
        }
    }
    errors
}

/// Check the files of backup `m` (read from `stored`) into verdict `v`: read back the
/// entries not `seen` before, compare what the manifest says it uses in packs with its
/// entries, and name the paths of its entries that failed (here or before).
async fn check_backup(
    s: &Settings,
    storage: &Storage,
    m: &Manifest,
    stored: &Arc<StoredManifest>,
    seen: &mut Seen,
    progress: &Progress,
    v: &mut BackupVerdict,
) -> Result<()> {
    let workers = s.process_max.get();
    let read = check_files(
        storage,
        stored,
        std::mem::take(&mut seen.checked),
        workers,
        progress.counters.clone(),
        progress.totals(),
    )
    .await?;
    seen.checked = read.checked;
    (v.files, v.files_read, v.bytes_read) = (read.files, read.files_read, read.bytes_read);
    seen.failed.extend(read.failed);
    if m.packs_used.is_some() && m.packs_used() != read.pack_usage {
        v.errors.push(format!(
            "{}: packs_used does not match the entries: the manifest is damaged or was altered",
            pgstrata_repo::layout::manifest(&s.stanza, &m.label)
        ));
    }
    if !seen.failed.is_empty() {
        // The entries again, for the paths of those that failed (here or before).
        let mut text = String::new();
        stored
            .for_each_entry::<Error>(|e| {
                if let Entry::File(f) = e {
                    if let Some(why) = seen.failed.get(&entry_key(m, &f, &mut text)) {
                        v.errors.push(if why.contains(&*f.path) {
                            why.clone()
                        } else {
                            format!("{}: {why}", f.path)
                        });
                    }
                }
                Ok(())
            })
            .await?;
    }
    Ok(())
}

/// What [`check_files`] found in one backup.
struct Checked {
    /// Every entry checked so far (given, and returned with this backup's added).
    checked: HashSet<EntryKey>,
    /// What failed here, by key, and why.
    failed: Vec<(EntryKey, String)>,
    files: u64,
    files_read: u64,
    bytes_read: u64,
    /// What the entries reference in packs ([`PackUsage`]).
    pack_usage: std::collections::BTreeMap<(String, String), u64>,
}

/// Read back the files of backup `m` whose entries are not in `checked`, on `workers`
/// threads of the pool, as the manifest is read ([`with_streamed_jobs`]); each joins
/// `totals` as it is read from the manifest and `counters` as it is checked. A
/// damaged file is a verdict, not an error: the pool goes on with the others. Small files
/// stored side by side are read as restore reads them, a group at a time with one read.
async fn check_files(
    storage: &Storage,
    m: &Arc<StoredManifest>,
    checked: HashSet<EntryKey>,
    workers: usize,
    counters: Arc<Counters>,
    totals: Arc<Counters>,
) -> Result<Checked> {
    let runtime = tokio::runtime::Handle::current();
    let (storage, m) = (storage.clone(), m.clone());
    tokio::task::spawn_blocking(move || {
        let header = m.header();
        let mut out = Checked {
            checked,
            failed: Vec::new(),
            files: 0,
            files_read: 0,
            bytes_read: 0,
            pack_usage: Default::default(),
        };
        let mut usage = PackUsage::new(&header.label);
        let read = |files: std::sync::mpsc::SyncSender<(EntryKey, Box<FileEntry>)>| {
            let mut text = String::new();
            runtime.block_on(m.for_each_entry::<Error>(|e| {
                let Entry::File(f) = e else { return Ok(()) };
                usage.add(&f);
                out.files += 1;
                let key = entry_key(header, &f, &mut text);
                if !out.checked.insert(key) {
                    return Ok(());
                }
                (out.files_read, out.bytes_read) = (out.files_read + 1, out.bytes_read + f.size);
                totals.add(f.size, 1);
                files
                    .send((key, f))
                    .map_err(|_| Error::new(crate::ErrorKind::Io, "verify stopped"))
            }))
        };
        let check = |reader: &mut FrameReader,
                     failed: &mut Vec<_>,
                     (key, f): (EntryKey, Box<FileEntry>)| {
            let verdict = check_file(&runtime, header, reader, &f);
            reader.clear(); // kept while a group is pinned
            counters.add(f.size, 1);
            if let Err(e) = verdict {
                failed.push((key, e.to_string()));
            }
        };
        let per_worker = with_streamed_jobs(
            read,
            |(_, f)| f,
            |_| Ok(()),
            |jobs| {
                crate::pool::run(
                    workers,
                    jobs,
                    |_| (FrameReader::new(&storage, header), Vec::new()),
                    |(reader, failed), job| {
                        match job? {
                            FileJob::One(file) => check(reader, failed, file),
                            FileJob::Group(files) => {
                                let chunks: Vec<&Chunk> = files
                                    .iter()
                                    .flat_map(|(_, f)| &f.chunks)
                                    .filter(|c| !c.is_zero())
                                    .collect();
                                reader.pin();
                                let first = &files[0].1.path;
                                // A failed read (a damaged frame stops it there) is not the
                                // verdict: each file's own check loads what is still
                                // missing, and fails for the file whose frame is damaged.
                                let _ = runtime.block_on(reader.load(&chunks, first));
                                for file in files {
                                    check(reader, failed, file);
                                }
                                reader.unpin();
                            }
                        }
                        Ok(())
                    },
                    |(_, failed)| Ok(failed),
                )
            },
        )?;
        out.failed = per_worker.into_iter().flatten().collect();
        out.pack_usage = usage.finish();
        Ok(out)
    })
    .await
    .expect("verify threads")
}

fn check_file(
    runtime: &tokio::runtime::Handle,
    m: &Manifest,
    reader: &mut FrameReader,
    f: &FileEntry,
) -> Result<()> {
    let loaded;
    let f = if f.map_unloaded() {
        loaded = runtime.block_on(m.load_map(reader.storage(), f))?;
        &loaded
    } else {
        f
    };
    let extents = extents_of(f);
    let covered: u64 = f.chunks.iter().map(|c| c.raw as u64).sum();
    if covered != f.size {
        return Err(Error::integrity(format!(
            "{}: its extents cover {covered} bytes but the file has {}",
            f.path, f.size
        )));
    }
    let mut check = ContentCheck::new(f);
    for_each_extent(runtime, reader, &extents, &f.path, |_, data| {
        check.update(data);
        Ok(())
    })?;
    check.finish()
}

/// Check every archived WAL object and change map. Also returns the archived full segments
/// (the caller finds the holes after the oldest backup's start in them).
/// Every archive of the stanza checked, by archive id: each cluster it belonged to has
/// one (stanza-upgrade), which that cluster's backups need.
async fn verify_archives(
    storage: &Storage,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
) -> Result<HashMap<String, (WalVerdict, ArchivedSegments)>> {
    let mut archives = HashMap::new();
    for c in &stanza.history {
        let id = c.archive_id();
        let checked = verify_archive(storage, &stanza.stanza, &id, c.wal_segment_size).await?;
        archives.insert(id, checked);
    }
    Ok(archives)
}

/// One verdict of `archives`: the current archive's (with its segments, returned), with
/// the earlier clusters' findings named `<archive-id>/<name>`. Gaps are looked for from
/// each archive's oldest backup start on (`oldest_start`, by archive id).
fn merge_archives(
    stanza: &pgstrata_repo::stanza::StanzaInfo,
    mut archives: HashMap<String, (WalVerdict, ArchivedSegments)>,
    oldest_start: &HashMap<String, u64>,
) -> (WalVerdict, ArchivedSegments) {
    let current = stanza.cluster.archive_id();
    let seg_size = stanza.cluster.wal_segment_size;
    let (mut wal, segments) = archives.remove(&current).expect("the current archive");
    wal.gaps =
        crate::wal_archive::archive_gaps(&segments, oldest_start.get(&current).copied(), seg_size);
    for c in &stanza.history[..stanza.history.len() - 1] {
        let id = c.archive_id();
        let (prior, segments) = archives.remove(&id).expect("each archive checked");
        let oldest = oldest_start.get(&id).copied();
        let gaps = crate::wal_archive::archive_gaps(&segments, oldest, c.wal_segment_size);
        let named = |n: String| format!("{id}/{n}");
        wal.segments += prior.segments;
        wal.maps += prior.maps;
        wal.damaged.extend(prior.damaged.into_iter().map(named));
        wal.maps_damaged
            .extend(prior.maps_damaged.into_iter().map(named));
        wal.gaps
            .extend(gaps.into_iter().map(|(a, b)| (named(a), named(b))));
    }
    (wal, segments)
}

async fn verify_archive(
    storage: &Storage,
    stanza: &str,
    archive_id: &str,
    seg_size: u64,
) -> Result<(WalVerdict, ArchivedSegments)> {
    let objects = storage
        .list(&layout::archive_root(stanza, archive_id))
        .await?;
    let mut out = WalVerdict::default();
    let checks = futures::stream::iter(objects)
        .map(|o| async move {
            let bytes = storage.get(&o.key).await;
            tokio::task::spawn_blocking(move || check_archive_object(&o.key, bytes))
                .await
                .expect("WAL check thread")
        })
        .buffer_unordered(8);
    let results: Vec<ObjectCheck> = checks.collect().await;
    let mut segments = ArchivedSegments::new();
    for checked in results {
        let (segment, map) = match &checked {
            ObjectCheck::Map { segment, map } => (segment, Some(map)),
            ObjectCheck::Wal { name, map, .. } => (name, map.as_ref()),
        };
        if let Some(map) = map {
            out.maps += 1;
            if let Err(why) = map {
                log::warn!("block-change map of {segment} is damaged ({why}): incrementals will hash instead");
                out.maps_damaged.push(segment.clone());
            }
        }
        let ObjectCheck::Wal { name, wal, .. } = checked else {
            continue;
        };
        if lsn::is_segment_name(&name) {
            out.segments += 1;
            if let Some((tli, segno)) = lsn::parse_segment_name(&name, seg_size) {
                segments.entry(tli).or_default().insert(segno);
            }
        }
        if let Err(why) = wal {
            log::error!("archived WAL {name} is damaged: {why}");
            out.damaged.push(name);
        }
    }
    out.damaged.sort();
    out.maps_damaged.sort();
    Ok((out, segments))
}

/// Whether one check passed, and why not (the repository's error, with its kind).
type Verdict = pgstrata_repo::Result<()>;

/// What checking one object of the archive found.
enum ObjectCheck {
    /// A `.map` object: the segment it belongs to, and whether the map decodes.
    Map { segment: String, map: Verdict },
    /// A WAL object, and the block-change map inside it when it holds one. The two are
    /// judged apart: a damaged map costs incrementals their shortcut, not the WAL.
    Wal {
        name: String,
        wal: Verdict,
        map: Option<Verdict>,
    },
}

/// Check the archive object at `key`, read as `bytes`.
fn check_archive_object(key: &str, bytes: pgstrata_repo::Result<bytes::Bytes>) -> ObjectCheck {
    let decode_map = |b: &[u8]| ChangeMap::decode(b, key).map(|_| ());
    let name = match layout::parse_archive_object(key) {
        ArchiveObject::Wal(name) => name.to_string(),
        ArchiveObject::ChangeMap { segment } => {
            return ObjectCheck::Map {
                segment: segment.to_string(),
                map: bytes.and_then(|b| decode_map(&b)),
            }
        }
    };
    let bytes = match bytes {
        Ok(b) => b,
        Err(why) => {
            return ObjectCheck::Wal {
                name,
                wal: Err(why),
                map: None,
            }
        }
    };
    // No map, or a header too bad to find one in: decoding reports the latter.
    let map = match wal_object::embedded_map(&bytes, key) {
        Ok(Some(map)) => Some(decode_map(map)),
        _ => None,
    };
    // Length and hash checked as it is decoded, a piece at a time: eight whole segments at
    // once were most of verify's memory.
    let wal = wal_object::decode_to(&bytes, key, &mut std::io::sink());
    ObjectCheck::Wal { name, wal, map }
}

/// The report as text, for people.
pub fn render_text(r: &VerifyReport) -> String {
    let mut out = format!(
        "stanza: {}\n    status: {}\n",
        r.stanza,
        if r.ok { "ok" } else { "PROBLEMS FOUND" }
    );
    for b in &r.backups {
        out.push_str(&format!(
            "\n    backup {}: {}\n        {} files, {} read back ({})\n",
            b.label,
            if b.ok { "ok" } else { "INVALID" },
            b.files,
            b.files_read,
            crate::progress::human_bytes(b.bytes_read)
        ));
        for e in &b.errors {
            out.push_str(&format!("        error: {e}\n"));
        }
    }
    for line in r.vanished.lines() {
        out.push_str(&format!("\n    VANISHED: {line}\n"));
    }
    for key in &r.repaired {
        out.push_str(&format!(
            "\n    repaired: {key} (rewritten from its intact twin)\n"
        ));
    }
    if !r.damaged_objects.is_empty() {
        out.push_str(&format!(
            "\n    manifest objects: {} damaged\n",
            r.damaged_objects.len()
        ));
        for d in &r.damaged_objects {
            out.push_str(&format!("        damaged: {}\n", describe_damaged_twin(d)));
        }
    }
    out.push_str(&format!(
        "\n    wal archive: {} segments checked, {} damaged; {} block-change maps checked, {} damaged\n",
        r.wal.segments,
        r.wal.damaged.len(),
        r.wal.maps,
        r.wal.maps_damaged.len()
    ));
    for d in &r.wal.damaged {
        out.push_str(&format!("        damaged: {d}\n"));
    }
    for (a, b) in &r.wal.gaps {
        out.push_str(&format!(
            "        gap: {a} .. {b} missing (point-in-time recovery cannot cross it)\n"
        ));
    }
    for d in &r.wal.maps_damaged {
        out.push_str(&format!(
            "        damaged map: {d} (incrementals hash instead)\n"
        ));
    }
    out
}
