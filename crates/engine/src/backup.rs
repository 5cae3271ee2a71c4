//! `backup`: an online backup of a running cluster.
//!
//! Order of work, and why:
//! 1. Check the server is the stanza's cluster, then `pg_backup_start`.
//! 2. Walk the data directory and copy every file but `global/pg_control` on
//!    `process-max` worker threads, each cutting files into frames, checking page checksums,
//!    hashing, compressing, and appending frames to its own pack objects.
//! 3. Copy `global/pg_control` last, then `pg_backup_stop`.
//! 4. Wait until every WAL segment from the start to the stop LSN is in the archive: without
//!    them the backup cannot be made consistent.
//! 5. Only then write the manifest. A backup killed at any earlier point leaves packs that no
//!    manifest references, which `info` ignores and a later backup does not need.

use crate::db::Db;
use crate::progress::{human_bytes, Progress};
use crate::track::{Track, WalChanges};
use crate::walk::{self, ItemKind};
use crate::{open_stanza, Error, ErrorKind, Result, Settings};
use pgstrata_pg::control::ControlData;
use pgstrata_pg::layout;
use pgstrata_pg::lsn::{self, Lsn};
use pgstrata_pg::page::{self, PageCheck};
use pgstrata_repo::manifest::block_hash;
use pgstrata_repo::manifest::{
    list_backups, BackupType, Entry, FileEntry, Manifest, Stats, WalPoint,
};
use pgstrata_repo::pack::{Chunk, PackWriter};
use pgstrata_repo::{layout as repo_layout, Storage, FORMAT_VERSION};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct BackupOptions {
    pub backup_type: BackupType,
    /// Hash every block of every file instead of trusting size and mtime.
    pub delta: bool,
    /// How changed blocks are found in files whose size or mtime changed.
    pub track: Track,
}

/// What an incremental compares against: the prior backup's files by path.
struct Prior {
    label: String,
    start_epoch: i64,
    files: HashMap<String, FileEntry>,
}

/// Block size for a file's block map. Small blocks find small changes; large files get
/// larger blocks so their maps stay small (16 hex digits per block in the manifest). A file keeps
/// the block size of its prior backup so its blocks can be compared; it may differ between
/// backups of the same file only when there is no prior map.
pub fn block_size_for(size: u64, prior: Option<&FileEntry>) -> u32 {
    if let Some(p) = prior.filter(|p| p.block_size > 0) {
        return p.block_size;
    }
    match size {
        0..=0x400_0000 => 8192,            // up to 64 MiB
        0x400_0001..=0x1000_0000 => 16384, // up to 256 MiB
        _ => 32768,
    }
}

/// Everything a copy worker needs, shared read-only.
struct CopyContext {
    storage: Storage,
    runtime: tokio::runtime::Handle,
    stanza: String,
    label: String,
    compression: pgstrata_repo::codec::Compression,
    frame_size: usize,
    pack_size: usize,
    start_lsn: Lsn,
    data_checksums: bool,
    block_size: usize,
    relseg_size: u32,
    counters: Arc<crate::progress::Counters>,
    prior: Option<Prior>,
    delta: bool,
    /// Files at least this large get pack objects of their own (not shared with others).
    bundle_limit: u64,
    /// Blocks changed since the prior backup, learned from the WAL (None: hash files).
    wal: Option<WalChanges>,
}

struct Job {
    rel: String,
    abs: std::path::PathBuf,
    owner: pgstrata_repo::manifest::Owner,
    mtime: i64,
    size: u64,
}

/// Result of copying files on a set of workers.
#[derive(Default)]
struct CopyOutcome {
    files: Vec<FileEntry>,
    stored: u64,
    packs: u64,
    pages_checked: u64,
    files_unchanged: u64,
    bytes_read: u64,
    /// Files whose changed blocks came from the WAL.
    files_tracked: u64,
    /// Changed files a WAL-tracked backup hashed instead, per reason.
    files_hashed: std::collections::BTreeMap<String, u64>,
}

impl CopyOutcome {
    /// Add another worker's (or pass's) outcome to this one.
    fn absorb(&mut self, o: CopyOutcome) {
        self.files.extend(o.files);
        self.stored += o.stored;
        self.packs += o.packs;
        self.pages_checked += o.pages_checked;
        self.files_unchanged += o.files_unchanged;
        self.bytes_read += o.bytes_read;
        self.files_tracked += o.files_tracked;
        for (reason, n) in o.files_hashed {
            *self.files_hashed.entry(reason).or_default() += n;
        }
    }
}

pub fn make_label(now: chrono::DateTime<chrono::Utc>, backup_type: BackupType) -> String {
    let suffix = match backup_type {
        BackupType::Full => "F",
        BackupType::Diff => "D",
        BackupType::Incr => "I",
    };
    format!("{}{suffix}", now.format("%Y%m%d-%H%M%S"))
}

pub async fn backup(s: &Settings, opts: &BackupOptions) -> Result<Manifest> {
    let (storage, stanza) = open_stanza(s).await?;
    crate::lock::with_lock(
        &storage,
        &s.stanza,
        "backup",
        backup_locked(s, opts, &storage, &stanza),
    )
    .await
}

async fn backup_locked(
    s: &Settings,
    opts: &BackupOptions,
    storage: &Storage,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
) -> Result<Manifest> {
    let started = Instant::now();
    let storage = storage.clone();
    let pg_path = s.pg_path()?.to_path_buf();
    let control = ControlData::read(&pg_path)?;
    let stanza_sysid = &stanza.cluster.system_identifier;
    if control.system_identifier.to_string() != *stanza_sysid {
        return Err(Error::refused(format!(
            "pg-path {} holds cluster {} but stanza '{}' belongs to cluster {stanza_sysid}",
            pg_path.display(),
            control.system_identifier,
            s.stanza
        )));
    }
    let db = Db::connect(s).await?;
    let id = db.identity().await?;
    if id.system_identifier != control.system_identifier {
        return Err(Error::refused(format!(
            "the server at {} is cluster {} but pg-path {} holds cluster {}",
            db.target(),
            id.system_identifier,
            pg_path.display(),
            control.system_identifier
        )));
    }
    if id.in_recovery {
        return Err(Error::refused(
            "the server is a standby: backups are taken from the primary",
        ));
    }
    if id.archive_mode == "off" {
        return Err(Error::refused(
            "archive_mode is off: a backup needs its WAL archived (set archive_mode = on and archive_command = 'pgstrata archive-push --stanza=... %p')",
        ));
    }
    same_directory(&pg_path, &id.data_directory)?;
    let major = control.major_version()?;

    // The prior backup an incremental (newest backup) or differential (newest full) is
    // compared against. Without one, the backup is full.
    let mut backup_type = opts.backup_type;
    let mut prior_manifest = None;
    if backup_type != BackupType::Full {
        let labels = list_backups(&storage, &s.stanza).await?;
        for l in labels.iter().rev() {
            let m = Manifest::load(&storage, &s.stanza, l).await?;
            if backup_type == BackupType::Incr || m.backup_type == BackupType::Full {
                prior_manifest = Some(m);
                break;
            }
        }
        if prior_manifest.is_none() {
            log::warn!(
                "no prior backup exists: taking a full backup instead of {}",
                backup_type.name()
            );
            backup_type = BackupType::Full;
        }
    }

    // A label is unique within the stanza: at most one backup starts per second.
    let existing = storage
        .list_dirs(&repo_layout::backup_root(&s.stanza))
        .await?;
    let mut start_time = chrono::Utc::now();
    let mut label = make_label(start_time, backup_type);
    while existing.iter().any(|l| l.get(..15) == label.get(..15)) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        start_time = chrono::Utc::now();
        label = make_label(start_time, backup_type);
    }
    log::info!(
        "{} backup {label} of stanza '{}' starting ({} compression, process-max {}{})",
        backup_type.name(),
        s.stanza,
        s.compression.kind.name(),
        s.process_max,
        prior_manifest
            .as_ref()
            .map(|p| format!(", compared with {}", p.label))
            .unwrap_or_default()
    );

    // --track=wal refuses before pg_backup_start (whose checkpoint can take minutes) when
    // the maps already have a gap. The check covers the WAL up to the start of the segment
    // before the one being flushed, so every byte it decodes is final on disk.
    if let (Some(p), Track::Wal, false) = (&prior_manifest, opts.track, opts.delta) {
        let seg = stanza.cluster.wal_segment_size;
        let flushed_seg = db.wal_flush_lsn().await?.segment(seg);
        let prior_seg = p.start.lsn.parse::<Lsn>()?.segment(seg);
        if flushed_seg > prior_seg + 1 {
            let until = Lsn((flushed_seg - 1) * seg);
            let timeline = db.timeline_of(until).await?;
            crate::track::wal_changes(
                &storage,
                &s.stanza,
                &stanza.cluster,
                p,
                until,
                timeline,
                &pg_path,
            )
            .await
            .map_err(|why| {
                Error::refused(format!(
                    "--track=wal: the WAL cannot tell what changed: {why}"
                ))
            })?;
        }
    }
    let (start_lsn, timeline) = db
        .backup_start(&format!("pgstrata {label}"), s.start_fast)
        .await?;

    // Size and mtime are trusted only when nothing suggests they could lie.
    let mut delta_reason =
        (opts.delta && prior_manifest.is_some()).then(|| "--delta was given".to_string());
    if let (Some(p), None) = (&prior_manifest, &delta_reason) {
        if p.stop.timeline != timeline {
            delta_reason = Some(format!(
                "the timeline changed from {} to {timeline} since backup {}",
                p.stop.timeline, p.label
            ));
        } else if start_time.timestamp() < p.start.epoch {
            delta_reason = Some(format!(
                "the clock is behind the start of backup {}: mtimes cannot be trusted",
                p.label
            ));
        }
    }
    if let (Some(r), Some(_)) = (&delta_reason, &prior_manifest) {
        log::info!("hashing every block of every file: {r}");
    }
    // Codecs of the backups whose frames this one may reference.
    let mut pack_codecs = std::collections::BTreeMap::new();
    if let Some(p) = &prior_manifest {
        pack_codecs.extend(p.pack_codecs.clone());
        pack_codecs.insert(p.label.clone(), p.compression.kind);
    }
    // Which blocks changed, from the WAL, when the maps cover the window.
    let mut track_reason = None;
    let mut summary_check = None;
    let mut wal = None;
    if let (Some(p), None, false) = (&prior_manifest, &delta_reason, opts.track == Track::Hash) {
        match crate::track::wal_changes(
            &storage,
            &s.stanza,
            &stanza.cluster,
            p,
            start_lsn,
            timeline,
            &pg_path,
        )
        .await
        {
            Ok(mut w) => {
                log::info!(
                    "changed blocks come from the block-change maps of {} WAL segment(s)",
                    w.segments
                );
                // Summaries within the WAL the maps were built from (whole segments from the
                // prior backup's start segment) must list nothing the maps do not.
                let prior_start: Lsn = p.start.lsn.parse()?;
                let seg = stanza.cluster.wal_segment_size;
                let from = Lsn(prior_start.segment(seg) * seg);
                if let Some((blocks, limited)) = db.wal_summaries(timeline, from, start_lsn).await?
                {
                    let extra = w.merge_summaries(blocks, limited);
                    if extra > 0 {
                        log::warn!("PostgreSQL's WAL summaries list {extra} block(s) or fork(s) the block-change maps do not; reading them too");
                    }
                    summary_check = Some(if extra == 0 {
                        "WAL summaries agree with the block-change maps".to_string()
                    } else {
                        format!("WAL summaries listed {extra} block(s) or fork(s) the maps did not; they were read too")
                    });
                }
                wal = Some(w);
            }
            Err(why) if opts.track == Track::Wal => {
                return Err(Error::refused(format!(
                    "--track=wal: the WAL cannot tell what changed: {why}"
                )));
            }
            Err(why) => {
                log::warn!("hashing changed files instead of using the WAL: {why}");
                track_reason = Some(why);
            }
        }
    }
    let track = match (&prior_manifest, &wal) {
        (None, _) => None,
        (Some(_), Some(_)) => Some("wal".to_string()),
        (Some(_), None) => Some("hash".to_string()),
    };
    let prior = prior_manifest.as_ref().map(|p| Prior {
        label: p.label.clone(),
        start_epoch: p.start.epoch,
        files: p.files().map(|f| (f.path.clone(), f.clone())).collect(),
    });
    let seg_size = control.wal_segment_size as u64;
    let start_wal = lsn::segment_name(timeline, start_lsn.segment(seg_size), seg_size);
    log::info!("backup start LSN {start_lsn}, WAL {start_wal}");

    let tree = {
        let p = pg_path.clone();
        let catver = control.catalog_version;
        tokio::task::spawn_blocking(move || walk::walk(&p, major, catver))
            .await
            .expect("walk thread")?
    };
    let mut jobs = Vec::new();
    let mut entries = Vec::new();
    let mut control_job = None;
    for item in tree.items {
        match item.kind {
            ItemKind::Dir => entries.push(Entry::Dir {
                path: item.rel,
                owner: item.owner,
            }),
            ItemKind::Link { target } => entries.push(Entry::Link {
                path: item.rel,
                target,
                owner: item.owner,
            }),
            ItemKind::File { size, mtime } => {
                let job = Job {
                    rel: item.rel,
                    abs: item.abs,
                    owner: item.owner,
                    mtime,
                    size,
                };
                if job.rel == "global/pg_control" {
                    control_job = Some(job);
                } else {
                    jobs.push(job);
                }
            }
        }
    }
    let control_job = control_job
        .ok_or_else(|| Error::refused(format!("{} has no global/pg_control", pg_path.display())))?;
    let total_bytes: u64 = jobs.iter().map(|j| j.size).sum::<u64>() + control_job.size;
    let total_files = jobs.len() as u64 + 1;
    let progress = Progress::start("backup", total_bytes, total_files);
    let ctx = Arc::new(CopyContext {
        storage: storage.clone(),
        runtime: tokio::runtime::Handle::current(),
        stanza: s.stanza.clone(),
        label: label.clone(),
        compression: s.compression,
        frame_size: s.frame_size,
        pack_size: s.pack_size,
        start_lsn,
        data_checksums: control.data_checksums,
        block_size: control.block_size as usize,
        relseg_size: control.relseg_size,
        counters: progress.counters.clone(),
        prior,
        delta: delta_reason.is_some(),
        bundle_limit: s.bundle_limit,
        wal,
    });
    // Largest files first keeps all workers busy until the end.
    jobs.sort_by_key(|j| std::cmp::Reverse(j.size));
    let workers = s.process_max.max(1);
    let mut outcome = {
        let ctx = ctx.clone();
        tokio::task::spawn_blocking(move || copy_files(ctx, jobs, workers, 0))
            .await
            .expect("copy threads")?
    };
    // pg_control last: it must not be older than any file copied before it.
    let last = {
        let ctx = ctx.clone();
        tokio::task::spawn_blocking(move || copy_files(ctx, vec![control_job], 1, workers))
            .await
            .expect("copy thread")?
    };
    progress.finish();
    outcome.absorb(last);
    if ctx.wal.is_some() {
        log::info!(
            "WAL tracking: {} changed file(s) read block by block; read and hashed instead: {}",
            outcome.files_tracked,
            crate::track::describe_hashed(&outcome.files_hashed)
        );
    }

    let (stop_lsn, backup_label, tablespace_map) = db.backup_stop().await?;
    let stop_time = chrono::Utc::now();
    let stop_timeline = db.timeline_of(stop_lsn).await.unwrap_or(timeline);
    let stop_wal = lsn::segment_name(stop_timeline, stop_lsn.segment(seg_size), seg_size);
    log::info!("backup stop LSN {stop_lsn}, WAL {stop_wal}; waiting for WAL {start_wal}..{stop_wal} to be archived");
    let needed = lsn::segments_between(timeline, start_lsn, stop_lsn, seg_size);
    wait_for_wal(
        &storage,
        &s.stanza,
        &stanza.cluster.archive_id(),
        &needed,
        s.archive_timeout,
    )
    .await?;

    let page_errors: u64 = outcome.files.iter().map(|f| f.bad_pages.len() as u64).sum();
    let db_size: u64 = outcome.files.iter().map(|f| f.size).sum();
    let file_count = outcome.files.len() as u64;
    entries.extend(outcome.files.into_iter().map(Entry::File));
    entries.sort_by(|a, b| a.path().cmp(b.path()));
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        label: label.clone(),
        backup_type,
        prior: prior_manifest.as_ref().map(|p| p.label.clone()),
        stanza: s.stanza.clone(),
        cluster: stanza.cluster.clone(),
        server_version_num: db.version_num,
        start: WalPoint {
            time: start_time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            epoch: start_time.timestamp(),
            lsn: start_lsn.to_string(),
            timeline,
            wal: start_wal,
        },
        stop: WalPoint {
            time: stop_time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            epoch: stop_time.timestamp(),
            lsn: stop_lsn.to_string(),
            timeline: stop_timeline,
            wal: stop_wal,
        },
        backup_label,
        tablespace_map,
        compression: s.compression,
        frame_size: s.frame_size as u32,
        data_checksums: control.data_checksums,
        tablespaces: tree.tablespaces,
        entries,
        stats: Stats {
            db_size,
            stored_size: outcome.stored,
            files: file_count,
            files_unchanged: outcome.files_unchanged,
            bytes_read: outcome.bytes_read,
            files_tracked: outcome.files_tracked,
            files_hashed: outcome.files_hashed,
            packs: outcome.packs,
            pages_checked: outcome.pages_checked,
            page_errors,
            duration_ms: started.elapsed().as_millis() as u64,
        },
        delta_reason,
        pack_codecs,
        track,
        track_reason,
        summary_check,
    };
    // Keep only the codecs of backups actually referenced.
    let mut manifest = manifest;
    let referenced: std::collections::BTreeSet<String> = manifest
        .files()
        .flat_map(|f| f.chunks.iter().filter_map(|c| c.backup.clone()))
        .collect();
    manifest.pack_codecs.retain(|l, _| referenced.contains(l));
    manifest.publish(&storage).await?;
    if page_errors > 0 {
        log::warn!("backup {label} found {page_errors} page(s) failing their checksum; they are listed by 'info --set={label} --output=json' (bad_pages) and were backed up as they are");
    }
    log::info!(
        "{} backup {label} complete: {} in {file_count} files ({} unchanged, {} read), new data stored {} in {} packs, {:.1}s",
        backup_type.name(),
        human_bytes(db_size),
        outcome.files_unchanged,
        human_bytes(outcome.bytes_read),
        human_bytes(outcome.stored),
        outcome.packs,
        started.elapsed().as_secs_f64()
    );
    Ok(manifest)
}

fn same_directory(pg_path: &std::path::Path, server_dir: &str) -> Result<()> {
    let a = std::fs::canonicalize(pg_path)
        .map_err(|e| Error::io(format!("pg-path {}", pg_path.display()), e))?;
    match std::fs::canonicalize(server_dir) {
        Ok(b) if a == b => Ok(()),
        Ok(b) => Err(Error::refused(format!(
            "pg-path {} is not the server's data directory {}",
            a.display(),
            b.display()
        ))),
        // The server's directory is not visible from here (other host): trust pg_control's check.
        Err(_) => Ok(()),
    }
}

/// Poll the archive until every segment is there.
pub async fn wait_for_wal(
    storage: &Storage,
    stanza: &str,
    archive_id: &str,
    segments: &[String],
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    for seg in segments {
        let key = repo_layout::archive_object(stanza, archive_id, seg);
        loop {
            if storage.exists(&key).await? {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "WAL segment {seg} did not reach the archive within {}s: check that archive_command runs 'pgstrata archive-push --stanza={stanza} %p' and look in the PostgreSQL log for archiver errors",
                        timeout.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Copy `jobs` on `workers` threads; worker ids start at `first_worker` so pack names of
/// separate calls within one backup never collide.
fn copy_files(
    ctx: Arc<CopyContext>,
    jobs: Vec<Job>,
    workers: usize,
    first_worker: usize,
) -> Result<CopyOutcome> {
    let queue = Arc::new(Mutex::new(jobs.into_iter().rev().collect::<Vec<_>>()));
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let (ctx, queue, failed) = (ctx.clone(), queue.clone(), failed.clone());
            std::thread::spawn(move || -> Result<CopyOutcome> {
                let mut writer = PackWriter::new(
                    ctx.storage.clone(),
                    ctx.runtime.clone(),
                    &ctx.stanza,
                    &ctx.label,
                    first_worker + w,
                    ctx.pack_size,
                );
                let mut out = CopyOutcome::default();
                loop {
                    if failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let Some(job) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    match copy_file(&ctx, &job, &mut writer, &mut out) {
                        Ok(Some(f)) => out.files.push(f),
                        Ok(None) => {}
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                }
                writer.finish()?;
                out.stored = writer.written;
                out.packs = writer.packs_written;
                Ok(out)
            })
        })
        .collect();
    let mut total = CopyOutcome::default();
    let mut first_err = None;
    for h in handles {
        match h.join().expect("copy worker panicked") {
            Ok(o) => total.absorb(o),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// Read up to buf.len() bytes, stopping early only at end of file.
fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Where the prior backup stored each block of one file.
struct PriorBlocks<'a> {
    entry: &'a FileEntry,
    /// File offset at which each extent starts.
    starts: Vec<u64>,
    prior_label: &'a str,
    label: &'a str,
}

impl<'a> PriorBlocks<'a> {
    fn new(entry: &'a FileEntry, prior_label: &'a str, label: &'a str) -> PriorBlocks<'a> {
        let mut starts = Vec::with_capacity(entry.chunks.len());
        let mut off = 0u64;
        for c in &entry.chunks {
            starts.push(off);
            off += c.raw as u64;
        }
        PriorBlocks {
            entry,
            starts,
            prior_label,
            label,
        }
    }

    /// The prior extent for `[offset, offset+len)`, if one extent holds all of it.
    fn locate(&self, offset: u64, len: u32) -> Option<Chunk> {
        let i = self
            .starts
            .partition_point(|s| *s <= offset)
            .checked_sub(1)?;
        let c = &self.entry.chunks[i];
        let skip = offset - self.starts[i];
        if skip + len as u64 > c.raw as u64 {
            return None;
        }
        Some(
            c.slice(skip as u32, len)
                .rebased(self.prior_label, self.label),
        )
    }
}

/// Changed blocks of one file waiting to fill a frame.
struct NewData {
    buf: Vec<u8>,
    /// (index into the extent list, offset in buf, length)
    pending: Vec<(usize, u32, u32)>,
}

impl NewData {
    fn flush(
        &mut self,
        ctx: &CopyContext,
        writer: &mut PackWriter,
        extents: &mut [Chunk],
    ) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let stored = ctx.compression.compress(&self.buf);
        let frame = writer.add(&stored, self.buf.len())?;
        for (idx, at, len) in self.pending.drain(..) {
            extents[idx] = frame.slice(at, len);
        }
        self.buf.clear();
        Ok(())
    }
}

/// Copy one file. Unchanged files (same size and mtime as in the prior backup, and not
/// modified within the second the prior backup started) are carried by reference without
/// reading them. Other files are read block by block: blocks whose hash matches the prior
/// backup's point at the prior's storage, zero blocks cost nothing, and only changed blocks
/// are compressed and stored. Returns `None` when the file vanished before it could be
/// opened (a dropped relation: WAL replay removes it anyway).
fn copy_file(
    ctx: &CopyContext,
    job: &Job,
    writer: &mut PackWriter,
    out: &mut CopyOutcome,
) -> Result<Option<FileEntry>> {
    let prior = ctx
        .prior
        .as_ref()
        .and_then(|p| p.files.get(&job.rel).map(|e| (p, e)));
    if let (Some((p, e)), false) = (prior, ctx.delta) {
        // mtime has one-second granularity here: a file written in the same second the prior
        // backup started may have changed after it was read without moving its mtime.
        if e.size == job.size && e.mtime == job.mtime && job.mtime < p.start_epoch {
            let mut entry = e.clone();
            entry.owner = job.owner.clone();
            entry.chunks = e
                .chunks
                .iter()
                .map(|c| c.rebased(&p.label, &ctx.label))
                .collect();
            ctx.counters.bytes.fetch_add(job.size, Ordering::Relaxed);
            ctx.counters.files.fetch_add(1, Ordering::Relaxed);
            out.files_unchanged += 1;
            return Ok(Some(entry));
        }
    }
    if let (Some(w), Some((p, e))) = (&ctx.wal, prior) {
        match w.pages_for(&job.rel, ctx.relseg_size, e) {
            Ok(pages) => return copy_file_tracked(ctx, job, writer, out, p, e, &pages),
            Err(why) => {
                log::debug!("{}: read and hashed: {}", job.rel, why.as_str());
                *out.files_hashed
                    .entry(why.as_str().to_string())
                    .or_default() += 1;
            }
        }
    }
    let mut f = match std::fs::File::open(&job.abs) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", job.abs.display()), e)),
    };
    let prior_entry = prior.map(|(_, e)| e);
    let bs = block_size_for(job.size, prior_entry);
    let prior_blocks = prior
        .filter(|(_, e)| e.block_size == bs)
        .map(|(p, e)| PriorBlocks::new(e, &p.label, &ctx.label));
    let own_pack = job.size >= ctx.bundle_limit;
    if own_pack {
        writer.flush()?;
    }
    let relation = layout::relation_file(&job.rel);
    let check_pages = ctx.data_checksums && relation.is_some();
    let first_block = relation
        .as_ref()
        .map(|r| r.segno as u64 * ctx.relseg_size as u64)
        .unwrap_or(0);
    let mut hasher = blake3::Hasher::new();
    let mut extents: Vec<Chunk> = Vec::new();
    let mut hashes = String::with_capacity((job.size / bs as u64 + 1) as usize * 16);
    let mut new = NewData {
        buf: Vec::with_capacity(ctx.frame_size),
        pending: Vec::new(),
    };
    let mut bad_pages = Vec::new();
    // A whole number of blocks per read, so blocks never straddle two reads.
    let read_size = (ctx.frame_size / bs as usize).max(1) * bs as usize;
    let mut buf = vec![0u8; read_size];
    let mut offset = 0u64;
    loop {
        let n = read_full(&mut f, &mut buf)
            .map_err(|e| Error::io(format!("read {}", job.abs.display()), e))?;
        if n == 0 {
            break;
        }
        let data = &mut buf[..n];
        if check_pages {
            let ps = ctx.block_size;
            for (i, pg) in (0..n / ps).map(|i| (i, i * ps)) {
                let blkno = first_block + (offset / ps as u64) + i as u64;
                out.pages_checked += 1;
                if let Some(bad) = check_page(
                    &f,
                    &mut data[pg..pg + ps],
                    blkno,
                    offset + pg as u64,
                    ctx.start_lsn,
                ) {
                    log::warn!("page checksum mismatch in {} block {blkno}: {bad}", job.rel);
                    bad_pages.push(blkno as u32);
                }
            }
        }
        hasher.update(data);
        for (i, block) in data.chunks(bs as usize).enumerate() {
            let block_offset = offset + (i * bs as usize) as u64;
            let index = (block_offset / bs as u64) as usize;
            let h = block_hash(block);
            let _ = write!(hashes, "{h:016x}");
            let len = block.len() as u32;
            if block.iter().all(|b| *b == 0) {
                extents.push(Chunk::zeros(len));
                continue;
            }
            let unchanged = prior_blocks
                .as_ref()
                .filter(|p| p.entry.block_hash(index) == Some(h))
                .and_then(|p| p.locate(block_offset, len));
            match unchanged {
                Some(c) => extents.push(c),
                None => {
                    new.pending.push((extents.len(), new.buf.len() as u32, len));
                    new.buf.extend_from_slice(block);
                    extents.push(Chunk::zeros(len)); // placeholder until the frame is written
                    if new.buf.len() >= ctx.frame_size {
                        new.flush(ctx, writer, &mut extents)?;
                    }
                }
            }
        }
        offset += n as u64;
        out.bytes_read += n as u64;
        ctx.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if n < buf.len() {
            break;
        }
    }
    new.flush(ctx, writer, &mut extents)?;
    if own_pack {
        writer.flush()?;
    }
    ctx.counters.files.fetch_add(1, Ordering::Relaxed);
    // Count bytes of files that shrank while copying so progress ends at 100 %.
    if offset < job.size {
        ctx.counters
            .bytes
            .fetch_add(job.size - offset, Ordering::Relaxed);
    }
    let mut chunks: Vec<Chunk> = Vec::with_capacity(extents.len() / 4 + 1);
    for e in extents {
        if let Some(last) = chunks.last_mut() {
            if last.try_merge(&e) {
                continue;
            }
        }
        chunks.push(e);
    }
    Ok(Some(FileEntry {
        path: job.rel.clone(),
        size: offset,
        mtime: job.mtime,
        owner: job.owner.clone(),
        hash: hasher.finalize().to_hex().to_string(),
        chunks,
        bad_pages,
        block_size: bs,
        block_hashes: hashes,
    }))
}

/// Copy a relation file reading only the blocks the WAL says changed (`pages`, numbered
/// within this file), plus any block around a change of size; every other block points
/// where the prior backup stored it. The whole-file hash is left empty: without reading
/// every block it cannot be computed, and restore checks each block's hash instead.
fn copy_file_tracked(
    ctx: &CopyContext,
    job: &Job,
    writer: &mut PackWriter,
    out: &mut CopyOutcome,
    prior: &Prior,
    entry: &FileEntry,
    pages: &[u32],
) -> Result<Option<FileEntry>> {
    let f = match std::fs::File::open(&job.abs) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", job.abs.display()), e)),
    };
    let size = f
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", job.abs.display()), e))?
        .len();
    let bs = entry.block_size as u64;
    let page = ctx.block_size as u64;
    let nblocks = size.div_ceil(bs);
    let mut read: std::collections::BTreeSet<u64> =
        pages.iter().map(|p| *p as u64 * page / bs).collect();
    read.extend(entry.size.min(size) / bs..nblocks);
    let prior_blocks = PriorBlocks::new(entry, &prior.label, &ctx.label);
    let own_pack = size >= ctx.bundle_limit;
    if own_pack {
        writer.flush()?;
    }
    let relation = layout::relation_file(&job.rel);
    let first_page = relation
        .as_ref()
        .map(|r| r.segno as u64 * ctx.relseg_size as u64)
        .unwrap_or(0);
    let mut extents: Vec<Chunk> = Vec::new();
    let mut hashes = String::with_capacity(nblocks as usize * 16);
    let mut new = NewData {
        buf: Vec::with_capacity(ctx.frame_size),
        pending: Vec::new(),
    };
    let mut bad_pages = Vec::new();
    let mut buf = vec![0u8; bs as usize];
    let mut end = size;
    for i in 0..nblocks {
        let off = i * bs;
        if off >= end {
            break;
        }
        let len = (end - off).min(bs) as u32;
        if !read.contains(&i) {
            let reuse = entry
                .block_hash(i as usize)
                .zip(prior_blocks.locate(off, len));
            if let Some((h, c)) = reuse {
                let _ = write!(hashes, "{h:016x}");
                extents.push(c);
                continue;
            }
        }
        let data = &mut buf[..len as usize];
        let n = read_full_at(&f, data, off)
            .map_err(|e| Error::io(format!("read {}", job.abs.display()), e))?;
        if n < len as usize {
            end = off + n as u64; // the file shrank while we read it: WAL replay redoes it
            if n == 0 {
                break;
            }
        }
        let data = &mut buf[..n];
        out.bytes_read += n as u64;
        if ctx.data_checksums {
            for p in 0..(n / page as usize) {
                let blkno = first_page + (off / page) + p as u64;
                out.pages_checked += 1;
                let at = p * page as usize;
                if let Some(bad) = check_page(
                    &f,
                    &mut data[at..at + page as usize],
                    blkno,
                    off + at as u64,
                    ctx.start_lsn,
                ) {
                    log::warn!("page checksum mismatch in {} block {blkno}: {bad}", job.rel);
                    bad_pages.push(blkno as u32);
                }
            }
        }
        let h = block_hash(data);
        let _ = write!(hashes, "{h:016x}");
        if data.iter().all(|b| *b == 0) {
            extents.push(Chunk::zeros(n as u32));
            continue;
        }
        let unchanged = (entry.block_hash(i as usize) == Some(h))
            .then(|| prior_blocks.locate(off, n as u32))
            .flatten();
        match unchanged {
            Some(c) => extents.push(c),
            None => {
                new.pending
                    .push((extents.len(), new.buf.len() as u32, n as u32));
                new.buf.extend_from_slice(data);
                extents.push(Chunk::zeros(n as u32));
                if new.buf.len() >= ctx.frame_size {
                    new.flush(ctx, writer, &mut extents)?;
                }
            }
        }
    }
    new.flush(ctx, writer, &mut extents)?;
    if own_pack {
        writer.flush()?;
    }
    ctx.counters.bytes.fetch_add(job.size, Ordering::Relaxed);
    ctx.counters.files.fetch_add(1, Ordering::Relaxed);
    let mut chunks: Vec<Chunk> = Vec::with_capacity(extents.len() / 4 + 1);
    for e in extents {
        if let Some(last) = chunks.last_mut() {
            if last.try_merge(&e) {
                continue;
            }
        }
        chunks.push(e);
    }
    out.files_tracked += 1;
    Ok(Some(FileEntry {
        path: job.rel.clone(),
        size: end,
        mtime: job.mtime,
        owner: job.owner.clone(),
        hash: String::new(),
        chunks,
        bad_pages,
        block_size: bs as u32,
        block_hashes: hashes,
    }))
}

fn read_full_at(f: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Check one page; a page that fails is re-read once (it may have been torn by a
/// concurrent write). Pages changed after the backup started are replayed from WAL, so
/// their checksum does not matter. Returns a description of real corruption.
fn check_page(
    f: &std::fs::File,
    page_buf: &mut [u8],
    blkno: u64,
    file_offset: u64,
    start_lsn: Lsn,
) -> Option<String> {
    let blkno32 = blkno as u32;
    match page::verify(page_buf, blkno32) {
        PageCheck::Valid | PageCheck::Zero => return None,
        PageCheck::Mismatch { .. } if page::page_lsn(page_buf) >= start_lsn.0 => return None,
        PageCheck::Mismatch { .. } => {}
    }
    let mut again = vec![0u8; page_buf.len()];
    if f.read_exact_at(&mut again, file_offset).is_ok() {
        let ok = match page::verify(&again, blkno32) {
            PageCheck::Valid | PageCheck::Zero => true,
            PageCheck::Mismatch { .. } => page::page_lsn(&again) >= start_lsn.0,
        };
        if ok {
            page_buf.copy_from_slice(&again);
            return None;
        }
    }
    match page::verify(page_buf, blkno32) {
        PageCheck::Mismatch { stored, computed } => Some(format!(
            "stored checksum {stored:#06x}, computed {computed:#06x}"
        )),
        _ => None,
    }
}
