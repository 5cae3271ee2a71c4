//! `backup`: an online backup of a running cluster.
//!
//! Order of work, and why:
//! 1. Check the server is the stanza's cluster, then `pg_backup_start`.
//! 2. Walk the data directory in path order and copy every file but `global/pg_control`
//!    as the walk goes, on `process-max` worker threads, each cutting files into frames,
//!    checking page checksums, hashing, compressing, and appending frames to its own pack
//!    objects; the manifest's entries are written as parts as they fill (`ordered`).
//! 3. Copy `global/pg_control` last, then `pg_backup_stop`.
//! 4. Wait until every WAL segment from the start to the stop LSN is in the archive: without
//!    them the backup cannot be made consistent.
//! 5. Only then write the manifest. A backup killed at any earlier point leaves packs and
//!    parts that no manifest references, which `info` ignores and a later backup does not
//!    need.

mod assemble;
mod checkpoints;
mod copy;
mod copy_context;
mod ordered;
mod preflight;
mod primary_sql;
mod standby;

pub use copy::block_size_for;

use crate::progress::{human_bytes, Progress};
use crate::track::{Track, WalChanges};
use crate::walk;
use crate::{open_stanza, Error, Result, Settings};
use assemble::{Copied, Stopped};
use copy::Job;
use copy_context::{CopyContext, Prior, Resumed};
use ordered::Parts;
use pgstrata_pg::lsn;
use pgstrata_repo::manifest::{
    BackupType, DataLink, Manifest, PartsWriter, Tablespace, PART_ENTRIES,
};
use pgstrata_repo::stanza::StanzaInfo;
use pgstrata_repo::Named;
use pgstrata_repo::Storage;
use preflight::{Preflight, Started};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct BackupOptions {
    pub backup_type: BackupType,
    /// Hash every block of every file instead of trusting size and mtime.
    pub delta: bool,
    /// How changed blocks are found in files whose size or mtime changed.
    pub track: Track,
    /// The operator's notes, recorded in the manifest and shown by `info`.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Reuse what an interrupted backup stored, and write checkpoints that let a later
    /// backup reuse what this one stores (`resume`).
    pub resume: bool,
    /// The caller holds the stanza lock: the backup host of a pg-remote backup, which
    /// takes it ([`with_backup_lock`]) around the job it asks of the database host.
    pub locked_by_caller: bool,
}

pub(crate) fn make_label(now: chrono::DateTime<chrono::Utc>, backup_type: BackupType) -> String {
    let suffix = match backup_type {
        BackupType::Full => "F",
        BackupType::Diff => "D",
        BackupType::Incr => "I",
    };
    format!("{}{suffix}", now.format("%Y%m%d-%H%M%S"))
}

pub async fn backup(s: &Settings, opts: &BackupOptions) -> Result<Manifest> {
    let (storage, stanza) = open_stanza(s).await?;
    let m = if opts.locked_by_caller {
        backup_locked(s, opts, &storage, &stanza).await?
    } else {
        crate::lock::with_lock(
            &storage,
            &s.stanza,
            &s.lock_path,
            "backup",
            backup_locked(s, opts, &storage, &stanza),
        )
        .await?
    };
    report_vanished(s, &storage, stanza.cluster.wal_segment_size).await;
    Ok(m)
}

/// After a backup, the backups that vanished from the repository (logged as errors by
/// `vanished`): the backup stands whatever is found, and a failure to look is a warning.
async fn report_vanished(s: &Settings, storage: &Storage, segment_size: u64) {
    let labels = match pgstrata_repo::manifest::list_backups(storage, &s.stanza).await {
        Ok(labels) => labels,
        Err(e) => return log::warn!("cannot list backups to look for vanished ones: {e}"),
    };
    let found = crate::vanished::Found {
        labels: &labels,
        wal: None,
        segment_size,
    };
    if let Err(e) = crate::vanished::check(s, storage, &found).await {
        log::warn!("cannot look for vanished backups: {e}");
    }
}

/// Run `work`, a backup of stanza `s.stanza` that another host does (pg-remote), holding
/// the stanza's lock here: the database host's agent may not remove a lock it did not
/// create, so a stale one is taken over here, where its holder ran.
pub async fn with_backup_lock<T>(
    s: &Settings,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let (storage, _) = open_stanza(s).await?;
    crate::lock::with_lock(&storage, &s.stanza, &s.lock_path, "backup", work).await
}

async fn backup_locked(
    s: &Settings,
    opts: &BackupOptions,
    storage: &Storage,
    stanza: &StanzaInfo,
) -> Result<Manifest> {
    let started_at = Instant::now();
    let pf = preflight::preflight(s, opts, storage, stanza).await?;
    let mut started = preflight::start(s, opts, storage, stanza, &pf).await?;
    log::info!(
        "backup start LSN {}, WAL {}",
        started.start_lsn,
        started.start_wal
    );
    let wal = started.wal.take();
    let wal_tracked = wal.is_some();
    let copied = copy_data_directory(s, opts, storage, &pf, &started, wal).await?;
    if wal_tracked {
        log::info!(
            "WAL tracking: {} changed file(s) read block by block; read and hashed instead: {}",
            copied.outcome.files_tracked,
            crate::track::describe_hashed(&copied.outcome.files_hashed)
        );
    }
    let stopped = stop(s, storage, stanza, &pf, &started).await?;
    let mut manifest =
        assemble::build_manifest(s, stanza, &pf, started, copied, stopped, started_at)?;
    manifest.annotations = opts.annotations.clone();
    assemble::publish(storage, &mut manifest).await?;
    if opts.resume {
        checkpoints::remove_checkpoints(storage, &s.stanza, &manifest.label).await;
    }
    let (st, label) = (&manifest.stats, &manifest.label);
    if st.page_errors > 0 {
        log::warn!("backup {label} found {} page(s) failing their checksum; they are listed by 'info --set={label} --output=json' (bad_pages) and were backed up as they are", st.page_errors);
    }
    log::info!(
        "{} backup {label} complete: {} in {} files ({} unchanged, {} read), new data stored {} in {} packs, {:.1}s",
        manifest.backup_type.name(),
        human_bytes(st.db_size),
        st.files,
        st.files_unchanged,
        human_bytes(st.bytes_read),
        human_bytes(st.stored_size),
        st.packs,
        started_at.elapsed().as_secs_f64()
    );
    Ok(manifest)
}

/// Walk the data directory and copy its files, `global/pg_control` last (it must not be
/// older than any file copied before it). `wal`: the blocks the WAL says changed.
async fn copy_data_directory(
    s: &Settings,
    opts: &BackupOptions,
    storage: &Storage,
    pf: &Preflight,
    started: &Started,
    wal: Option<WalChanges>,
) -> Result<Copied> {
    if let Some(copy) = &pf.primary_copy {
        let (files, bytes) = primary_sql::copy_non_relation_files(&pf.db, &copy.dir).await?;
        log::info!(
            "read {files} non-relation file(s), {} from the primary at {} over its connection",
            human_bytes(bytes),
            pf.db.target()
        );
    }
    let (walk, tablespaces, links) = walk_source(pf).await?;
    // The prior backup's size until the walk finds more.
    let estimate = pf.prior.as_ref().map(|p| p.header().stats.clone());
    let limit = match s.pg_read_rate_limit {
        Some(read) => Some(("read", read)),
        None => crate::progress::repository_limit(storage),
    };
    let progress = Progress::start(
        "backup",
        estimate.as_ref().map_or(0, |st| st.db_size),
        estimate.as_ref().map_or(0, |st| st.files),
        limit,
    );
    let prior = pf.prior.clone().map(Prior::new);
    let resume = interrupted_backup(s, opts, storage, pf).await?;
    let resumed_from = resume.as_ref().map(|r| (r.label.clone(), r.compression));
    let runtime = tokio::runtime::Handle::current();
    let ctx = CopyContext {
        storage: storage.clone(),
        runtime: runtime.clone(),
        stanza: s.stanza.clone(),
        label: pf.label.clone(),
        compression: s.compression,
        frame_size: s.frame_size,
        pack_size: s.pack_size,
        start_lsn: started.start_lsn,
        data_checksums: pf.control.data_checksums,
        page_size: pf.control.block_size as usize,
        relseg_size: pf.control.relseg_size,
        counters: progress.counters.clone(),
        prior,
        delta: started.detection.delta_reason.is_some(),
        bundle_limit: s.bundle_limit,
        wal,
        resume,
        checkpoints: opts.resume,
        read_rate: s
            .pg_read_rate_limit
            .map(|r| pgstrata_repo::rate::RateLimiter::shared("data directory", r)),
    };
    let workers = s.process_max.get();
    let prior_label = pf.prior.as_ref().map(|p| p.header().label.as_str());
    let writer = PartsWriter::new(&s.stanza, &pf.label, prior_label, PART_ENTRIES);
    let mut parts = Parts::new(writer, storage.clone(), runtime);
    let ctx = std::sync::Arc::new(ctx);
    let (c, totals) = (ctx.clone(), progress.totals());
    let (mut outcome, control, parts) = tokio::task::spawn_blocking(move || {
        ordered::copy_in_order(&c, walk, &mut parts, workers, &totals)
            .map(|(outcome, control)| (outcome, control, parts))
    })
    .await
    .expect("copy threads")?;
    let (control_outcome, parts) = copy_control_last(pf, ctx, control, parts, workers).await?;
    outcome.absorb(control_outcome);
    progress.finish();
    let (parts, page_errors) = parts;
    Ok(Copied {
        parts,
        page_errors,
        tablespaces,
        links,
        outcome,
        resumed_from,
    })
}

/// What the copy walks, in path order, and the tablespaces found: the data directory's
/// walk as it goes, or (from a standby) the primary's and the standby's merged, whole.
async fn walk_source(pf: &Preflight) -> Result<(WalkSource, Vec<Tablespace>, Vec<DataLink>)> {
    let (major, catver) = (pf.control.major_version()?, pf.control.catalog_version);
    Ok(match &pf.standby {
        None => {
            let mut walker = walk::Walker::new(&pf.pg_path, major, catver)?;
            let tablespaces = std::mem::take(&mut walker.tablespaces);
            let links = std::mem::take(&mut walker.links);
            (Box::new(walker), tablespaces, links)
        }
        Some(sb) => {
            let (p, sp) = (pf.pg_path.clone(), sb.source.path.clone());
            let over_sql = pf.primary_copy.is_some();
            let mut merged = tokio::task::spawn_blocking(move || -> Result<walk::Walk> {
                let primary = walk::walk(&p, major, catver)?;
                let standby = walk::walk(&sp, major, catver)?;
                Ok(standby::merge_walks(primary, standby, over_sql))
            })
            .await
            .expect("walk thread")?;
            let tablespaces = std::mem::take(&mut merged.tablespaces);
            let links = std::mem::take(&mut merged.links);
            (Box::new(walk::in_order(merged)), tablespaces, links)
        }
    })
}

/// The walk the copy reads, in path order.
type WalkSource = Box<dyn Iterator<Item = Result<walk::Walked>> + Send>;

/// With `--resume`, the interrupted backup whose stored frames this one may reuse.
async fn interrupted_backup(
    s: &Settings,
    opts: &BackupOptions,
    storage: &Storage,
    pf: &Preflight,
) -> Result<Option<Resumed>> {
    if !opts.resume {
        return Ok(None);
    }
    let complete = pgstrata_repo::manifest::list_backups(storage, &s.stanza).await?;
    let resume = checkpoints::find(storage, &s.stanza, &complete, pf.control.block_size).await?;
    if let Some(r) = &resume {
        log::info!(
            "resuming: backup {} was interrupted; the frames it stored for {} file(s) are reused where their blocks still match",
            r.label,
            r.files.len()
        );
    }
    Ok(resume)
}

/// Copy `global/pg_control` last (from a primary read over SQL, as the primary has it
/// now), and finish the manifest's parts: the parts written and the page errors found.
async fn copy_control_last(
    pf: &Preflight,
    ctx: std::sync::Arc<CopyContext>,
    mut control: walk::WalkedFile,
    mut parts: Parts,
    workers: usize,
) -> Result<(copy::CopyOutcome, (PartsWriter, u64))> {
    if let Some(copy) = &pf.primary_copy {
        primary_sql::refresh_control(&pf.db, &copy.dir).await?;
        let md = std::fs::metadata(control.abs())
            .map_err(|e| Error::io(format!("stat {}", control.abs().display()), e))?;
        control.size = md.len();
        control.mtime = std::os::unix::fs::MetadataExt::mtime(&md);
    }
    tokio::task::spawn_blocking(move || {
        let copied = std::sync::Mutex::new(None);
        let job = Job {
            file: control,
            prior: None,
        };
        let outcome = copy::copy_files(
            &ctx,
            copy::groups(std::iter::once((0, job))),
            1,
            workers,
            |_, e| {
                *copied.lock().unwrap() = e;
                Ok(())
            },
            || {},
        )?;
        let entry = copied.into_inner().unwrap().ok_or_else(|| {
            Error::refused("global/pg_control vanished during the backup".to_string())
        })?;
        parts.fill(pgstrata_repo::manifest::Entry::File(Box::new(entry)))?;
        Ok::<_, Error>((outcome, parts.finish()?))
    })
    .await
    .expect("copy threads")
}

/// `pg_backup_stop`, then wait until the WAL from the start to the stop is archived:
/// without it the backup cannot be made consistent.
async fn stop(
    s: &Settings,
    storage: &Storage,
    stanza: &StanzaInfo,
    pf: &Preflight,
    started: &Started,
) -> Result<Stopped> {
    // Listed before the stop, after the copy: a database created during the backup has
    // its directory copied and is listed.
    let databases = pf.db.databases().await?;
    let (stop_lsn, backup_label, tablespace_map) = pf.db.backup_stop().await?;
    let stop_time = chrono::Utc::now();
    let stop_timeline = pf
        .db
        .timeline_of(stop_lsn)
        .await
        .unwrap_or(started.timeline);
    let seg_size = pf.control.wal_segment_size as u64;
    let stop_wal = lsn::segment_name(stop_timeline, stop_lsn.segment(seg_size), seg_size);
    log::info!(
        "backup stop LSN {stop_lsn}, WAL {stop_wal}; waiting for WAL {}..{stop_wal} to be archived",
        started.start_wal
    );
    let needed = lsn::segments_between(started.timeline, started.start_lsn, stop_lsn, seg_size);
    crate::wal_archive::wait_for_wal(
        storage,
        &s.stanza,
        &stanza.cluster.archive_id(),
        &needed,
        s.archive_timeout,
    )
    .await?;
    Ok(Stopped {
        point: assemble::wal_point(stop_time, stop_lsn, stop_timeline, stop_wal),
        backup_label,
        tablespace_map,
        databases,
    })
}
