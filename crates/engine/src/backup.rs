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
use crate::walk::{self, ItemKind};
use crate::{open_stanza, Error, ErrorKind, Result, Settings};
use pgstrata_pg::control::ControlData;
use pgstrata_pg::layout;
use pgstrata_pg::lsn::{self, Lsn};
use pgstrata_pg::page::{self, PageCheck};
use pgstrata_repo::manifest::{BackupType, Entry, FileEntry, Manifest, Stats, WalPoint};
use pgstrata_repo::pack::PackWriter;
use pgstrata_repo::{layout as repo_layout, Storage, FORMAT_VERSION};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct BackupOptions {
    pub backup_type: BackupType,
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
    if opts.backup_type != BackupType::Full {
        return Err(Error::config(format!(
            "backup type '{}' is not available in this version: only --type=full",
            opts.backup_type.name()
        )));
    }
    let started = Instant::now();
    let (storage, stanza) = open_stanza(s).await?;
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

    // A label is unique within the stanza; one second apart is enough.
    let existing = storage
        .list_dirs(&repo_layout::backup_root(&s.stanza))
        .await?;
    let mut start_time = chrono::Utc::now();
    let mut label = make_label(start_time, opts.backup_type);
    while existing.contains(&label) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        start_time = chrono::Utc::now();
        label = make_label(start_time, opts.backup_type);
    }
    log::info!(
        "backup {label} of stanza '{}' starting ({} compression, process-max {})",
        s.stanza,
        s.compression.kind.name(),
        s.process_max
    );

    let (start_lsn, timeline) = db
        .backup_start(&format!("pgstrata {label}"), s.start_fast)
        .await?;
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
    outcome.files.extend(last.files);
    outcome.stored += last.stored;
    outcome.packs += last.packs;

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
        backup_type: opts.backup_type,
        prior: None,
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
            packs: outcome.packs,
            pages_checked: outcome.pages_checked,
            page_errors,
            duration_ms: started.elapsed().as_millis() as u64,
        },
    };
    manifest.publish(&storage).await?;
    if page_errors > 0 {
        log::warn!("backup {label} found {page_errors} page(s) failing their checksum; they are listed by 'info --set={label} --output=json' (bad_pages) and were backed up as they are");
    }
    log::info!(
        "backup {label} complete: {} in {file_count} files, stored {} in {} packs, {:.1}s",
        human_bytes(db_size),
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
                    match copy_file(&ctx, &job, &mut writer, &mut out.pages_checked) {
                        Ok(Some(f)) => out.files.push(f),
                        Ok(None) => {}
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                }
                writer.flush()?;
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
            Ok(o) => {
                total.files.extend(o.files);
                total.stored += o.stored;
                total.packs += o.packs;
                total.pages_checked += o.pages_checked;
            }
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

/// Copy one file. Returns `None` when the file vanished before it could be opened (a
/// dropped relation: WAL replay removes it anyway).
fn copy_file(
    ctx: &CopyContext,
    job: &Job,
    writer: &mut PackWriter,
    pages_checked: &mut u64,
) -> Result<Option<FileEntry>> {
    let mut f = match std::fs::File::open(&job.abs) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", job.abs.display()), e)),
    };
    let relation = layout::relation_file(&job.rel);
    let check_pages = ctx.data_checksums && relation.is_some();
    let first_block = relation
        .as_ref()
        .map(|r| r.segno as u64 * ctx.relseg_size as u64)
        .unwrap_or(0);
    let mut hasher = blake3::Hasher::new();
    let mut chunks = Vec::new();
    let mut bad_pages = Vec::new();
    let mut buf = vec![0u8; ctx.frame_size];
    let mut offset = 0u64;
    loop {
        let n = read_full(&mut f, &mut buf)
            .map_err(|e| Error::io(format!("read {}", job.abs.display()), e))?;
        if n == 0 {
            break;
        }
        let data = &mut buf[..n];
        if check_pages {
            let bs = ctx.block_size;
            for (i, pg) in (0..n / bs).map(|i| (i, i * bs)) {
                let blkno = first_block + (offset / bs as u64) + i as u64;
                *pages_checked += 1;
                if let Some(bad) = check_page(
                    &f,
                    &mut data[pg..pg + bs],
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
        let chunk = if data.iter().all(|b| *b == 0) {
            pgstrata_repo::pack::Chunk {
                pack: None,
                backup: None,
                offset: 0,
                stored: 0,
                raw: n as u32,
                check: String::new(),
            }
        } else {
            let stored = ctx.compression.compress(data);
            writer.add(&stored, n)?
        };
        chunks.push(chunk);
        offset += n as u64;
        ctx.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if n < buf.len() {
            break;
        }
    }
    ctx.counters.files.fetch_add(1, Ordering::Relaxed);
    // Count bytes of files that shrank while copying so progress ends at 100 %.
    if offset < job.size {
        ctx.counters
            .bytes
            .fetch_add(job.size - offset, Ordering::Relaxed);
    }
    Ok(Some(FileEntry {
        path: job.rel.clone(),
        size: offset,
        mtime: job.mtime,
        owner: job.owner.clone(),
        hash: hasher.finalize().to_hex().to_string(),
        chunks,
        bad_pages,
    }))
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
