//! Before any file is read: check that the server and `pg-path` are the stanza's cluster and
//! a primary that archives, pick the prior backup an incremental or differential compares
//! against, choose a unique label, then `pg_backup_start` and decide how changed blocks are
//! found (size and mtime, hashing, or the WAL's block-change maps).
//!
//! Everything that can refuse a backup refuses here, before `pg_backup_start`, whose
//! checkpoint can take minutes.

use super::{make_label, BackupOptions};
use crate::db::Db;
use crate::local_cluster::LocalCluster;
use crate::track::{ChangeDetection, Track, WalChanges};
use crate::{Error, Result, Settings};
use pgstrata_pg::control::ControlData;
use pgstrata_pg::lsn::{self, Lsn};
use pgstrata_repo::manifest::{list_backups, BackupType, Manifest, StoredManifest, Tracking};
use pgstrata_repo::stanza::StanzaInfo;
use pgstrata_repo::Named;
use pgstrata_repo::{layout, Storage};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A backup about to start: the cluster checked, the prior backup and the label chosen.
pub(super) struct Preflight {
    pub pg_path: PathBuf,
    pub control: ControlData,
    pub db: Db,
    pub backup_type: BackupType,
    /// The backup an incremental or differential compares with, opened for reading in
    /// order (its entries are read as the files are copied, never held together).
    pub prior: Option<std::sync::Arc<StoredManifest>>,
    pub label: String,
    pub start_time: chrono::DateTime<chrono::Utc>,
    /// `backup-standby`: the standby relation files are read from.
    pub standby: Option<super::standby::Standby>,
    /// A standby backup with no `pg-path`: the primary's non-relation files, read over
    /// its connection into `pg_path` (see `primary_sql`).
    pub primary_copy: Option<super::primary_sql::PrimaryCopy>,
}

impl Preflight {
    /// The data directory whose `pg_wal` holds the current segment: the primary's, or
    /// the standby's when the primary's is not on this host (it has replayed past the
    /// backup's start, so its copy of the segment reaches at least as far).
    pub fn wal_dir_root(&self) -> &Path {
        match (&self.primary_copy, &self.standby) {
            (Some(_), Some(standby)) => &standby.source.path,
            _ => &self.pg_path,
        }
    }
}

/// A started backup: where its WAL starts, and how it finds changed blocks.
pub(super) struct Started {
    pub start_lsn: Lsn,
    pub timeline: u32,
    pub start_wal: String,
    /// Blocks changed since the prior backup, from the WAL's block-change maps.
    pub wal: Option<WalChanges>,
    pub detection: ChangeDetection,
}

pub(super) async fn preflight(
    s: &Settings,
    opts: &BackupOptions,
    storage: &Storage,
    stanza: &StanzaInfo,
) -> Result<Preflight> {
    let (pg_path, control, db, primary_copy) = if s.pg_path.is_none() && s.standby.is_some() {
        let (control, db, copy) = check_primary_over_sql(s, stanza).await?;
        (copy.dir.clone(), control, db, Some(copy))
    } else {
        let (pg_path, control, db) = check_server(s, stanza).await?;
        (pg_path, control, db, None)
    };
    let standby = super::standby::connect(s, &control).await?;
    let (backup_type, prior) = choose_prior(s, storage, stanza, opts.backup_type).await?;
    let (label, start_time) = unique_label(s, storage, backup_type).await?;
    log::info!(
        "{} backup {label} of stanza '{}' starting ({} compression, process-max {}{})",
        backup_type.name(),
        s.stanza,
        s.compression.kind.name(),
        s.process_max,
        prior
            .as_ref()
            .map(|p| format!(", compared with {}", p.header().label))
            .unwrap_or_default()
    );
    let pf = Preflight {
        pg_path,
        control,
        db,
        backup_type,
        prior,
        label,
        start_time,
        standby,
        primary_copy,
    };
    if let (Some(p), Track::Wal, false) = (&pf.prior, opts.track, opts.delta) {
        refuse_untracked_window(s, storage, stanza, &pf, p.header()).await?;
    }
    Ok(pf)
}

/// `pg-path`, the server and the stanza must be one cluster, a primary that archives.
async fn check_server(s: &Settings, stanza: &StanzaInfo) -> Result<(PathBuf, ControlData, Db)> {
    let LocalCluster {
        pg_path,
        control,
        db,
        id,
    } = LocalCluster::connect(s, Some(stanza)).await?;
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
    Ok((pg_path, control, db))
}

/// A primary whose data directory is not on this host (a standby backup without
/// pg-path): its identity from its connection and its `pg_control` read over it.
async fn check_primary_over_sql(
    s: &Settings,
    stanza: &StanzaInfo,
) -> Result<(ControlData, Db, super::primary_sql::PrimaryCopy)> {
    let db = Db::connect(s).await?;
    let id = db.identity().await?;
    let (_, control) = super::primary_sql::read_control(&db).await?;
    let sysid = &stanza.cluster.system_identifier;
    if control.system_identifier.to_string() != *sysid
        || id.system_identifier != control.system_identifier
    {
        return Err(Error::refused(format!(
            "the primary at {} is cluster {}, but stanza '{}' belongs to cluster {sysid}",
            db.target(),
            id.system_identifier,
            s.stanza
        )));
    }
    if id.in_recovery {
        return Err(Error::refused(format!(
            "the server at {} (pg-host) is a standby: pg-host names the primary; the standby is standby-host",
            db.target()
        )));
    }
    if id.archive_mode == "off" {
        return Err(Error::refused(
            "archive_mode is off on the primary: a backup needs its WAL archived",
        ));
    }
    let copy = super::primary_sql::PrimaryCopy::new(&control.system_identifier.to_string())?;
    Ok((control, db, copy))
}

fn same_directory(pg_path: &Path, server_dir: &str) -> Result<()> {
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

/// The prior backup an incremental (newest backup) or differential (newest full) is
/// compared against. Without one, the backup is full; so it is when that backup is of
/// the cluster the stanza had before a stanza-upgrade.
async fn choose_prior(
    s: &Settings,
    storage: &Storage,
    stanza: &StanzaInfo,
    asked: BackupType,
) -> Result<(BackupType, Option<std::sync::Arc<StoredManifest>>)> {
    if asked == BackupType::Full {
        return Ok((asked, None));
    }
    let labels = list_backups(storage, &s.stanza).await?;
    for l in labels.iter().rev() {
        // An incremental's prior is the newest backup, a differential's the newest full:
        // headers tell which, and only that manifest is read whole.
        if asked == BackupType::Diff {
            let header = Manifest::load_header(storage, &s.stanza, l).await?;
            if header.backup_type != BackupType::Full {
                continue;
            }
        }
        let m = Manifest::open_unread(storage, &s.stanza, l).await?;
        let cluster = &m.header().cluster;
        if *cluster != stanza.cluster {
            log::warn!(
                "the newest {} {l} is of cluster {} (before stanza-upgrade): taking a full backup instead of {}",
                if asked == BackupType::Diff { "full backup" } else { "backup" },
                cluster.archive_id(),
                asked.name()
            );
            return Ok((BackupType::Full, None));
        }
        return Ok((asked, Some(std::sync::Arc::new(m))));
    }
    log::warn!(
        "no prior backup exists: taking a full backup instead of {}",
        asked.name()
    );
    Ok((BackupType::Full, None))
}

/// A label is unique within the stanza: at most one backup starts per second.
async fn unique_label(
    s: &Settings,
    storage: &Storage,
    backup_type: BackupType,
) -> Result<(String, chrono::DateTime<chrono::Utc>)> {
    let existing = storage.list_dirs(&layout::backup_root(&s.stanza)).await?;
    let mut start_time = chrono::Utc::now();
    let mut label = make_label(start_time, backup_type);
    while existing.iter().any(|l| l.get(..15) == label.get(..15)) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        start_time = chrono::Utc::now();
        label = make_label(start_time, backup_type);
    }
    Ok((label, start_time))
}

/// `--track=wal` refuses before `pg_backup_start` when the maps already have a gap. The
/// check covers the WAL up to the start of the segment before the one being flushed, so
/// every byte it decodes is final on disk.
async fn refuse_untracked_window(
    s: &Settings,
    storage: &Storage,
    stanza: &StanzaInfo,
    pf: &Preflight,
    prior: &Manifest,
) -> Result<()> {
    let seg = stanza.cluster.wal_segment_size;
    let flushed_seg = pf.db.wal_flush_lsn().await?.segment(seg);
    let prior_seg = prior.start.lsn.segment(seg);
    if flushed_seg <= prior_seg + 1 {
        return Ok(());
    }
    let until = Lsn((flushed_seg - 1) * seg);
    let timeline = pf.db.timeline_of(until).await?;
    crate::track::wal_changes(
        storage,
        &s.stanza,
        &stanza.cluster,
        prior,
        until,
        timeline,
        pf.wal_dir_root(),
    )
    .await
    .map(|_| ())
    .map_err(wal_cannot_tell)
}

/// `--track=wal` refused because the maps cannot be used (`why`, kept as the source): a
/// refusal, as a damaged map only costs incrementals their shortcut; a transient failure
/// to read them stays what it is, so the backup may be retried.
fn wal_cannot_tell(why: Error) -> Error {
    let what = "--track=wal: the WAL cannot tell what changed";
    if why.is_retryable() {
        return why.context(what);
    }
    Error {
        kind: crate::ErrorKind::Refused,
        message: what.to_string(),
        source: Some(Box::new(why)),
    }
}

/// `pg_backup_start`, then how changed blocks are found.
pub(super) async fn start(
    s: &Settings,
    opts: &BackupOptions,
    storage: &Storage,
    stanza: &StanzaInfo,
    pf: &Preflight,
) -> Result<Started> {
    let (start_lsn, timeline) = pf
        .db
        .backup_start(&format!("pgstrata {}", pf.label), s.start_fast)
        .await?;
    if let Some(standby) = &pf.standby {
        standby
            .wait_for_replay(start_lsn, timeline, s.archive_timeout)
            .await?;
    }
    let seg_size = pf.control.wal_segment_size as u64;
    let start_wal = lsn::segment_name(timeline, start_lsn.segment(seg_size), seg_size);
    let delta_reason = pf
        .prior
        .as_ref()
        .and_then(|p| delta_reason(opts, p.header(), timeline, pf.start_time));
    if let Some(r) = &delta_reason {
        log::info!("hashing every block of every file: {r}");
    }
    let mut started = Started {
        start_lsn,
        timeline,
        start_wal,
        wal: None,
        detection: ChangeDetection {
            delta_reason,
            ..ChangeDetection::default()
        },
    };
    let hash_every_block = started.detection.delta_reason.is_some();
    if let (Some(p), false, false) = (&pf.prior, hash_every_block, opts.track == Track::Hash) {
        changes_from_wal(s, opts, storage, stanza, pf, p.header(), &mut started).await?;
    }
    started.detection.track = pf.prior.as_ref().map(|_| match started.wal {
        Some(_) => Tracking::Wal,
        None => Tracking::Hash,
    });
    Ok(started)
}

/// Size and mtime are trusted only when nothing suggests they could lie.
fn delta_reason(
    opts: &BackupOptions,
    prior: &Manifest,
    timeline: u32,
    start_time: chrono::DateTime<chrono::Utc>,
) -> Option<String> {
    if opts.delta {
        Some("--delta was given".to_string())
    } else if prior.stop.timeline != timeline {
        Some(format!(
            "the timeline changed from {} to {timeline} since backup {}",
            prior.stop.timeline, prior.label
        ))
    } else if start_time.timestamp() < prior.start.epoch {
        Some(format!(
            "the clock is behind the start of backup {}: mtimes cannot be trusted",
            prior.label
        ))
    } else {
        None
    }
}

/// Which blocks changed, from the WAL, when the maps cover the window; cross-checked with
/// PostgreSQL's WAL summaries where there are some.
async fn changes_from_wal(
    s: &Settings,
    opts: &BackupOptions,
    storage: &Storage,
    stanza: &StanzaInfo,
    pf: &Preflight,
    prior: &Manifest,
    started: &mut Started,
) -> Result<()> {
    let (start_lsn, timeline) = (started.start_lsn, started.timeline);
    let changes = crate::track::wal_changes(
        storage,
        &s.stanza,
        &stanza.cluster,
        prior,
        start_lsn,
        timeline,
        pf.wal_dir_root(),
    )
    .await;
    let mut w = match changes {
        Ok(w) => w,
        Err(why) if opts.track == Track::Wal => return Err(wal_cannot_tell(why)),
        Err(why) => {
            log::warn!("hashing changed files instead of using the WAL: {why}");
            started.detection.track_reason = Some(why.to_string());
            return Ok(());
        }
    };
    log::info!(
        "changed blocks come from the block-change maps of {} WAL segment(s)",
        w.segments
    );
    // Summaries within the WAL the maps were built from (whole segments from the prior
    // backup's start segment) must list nothing the maps do not.
    let prior_start = prior.start.lsn;
    let seg = stanza.cluster.wal_segment_size;
    let from = Lsn(prior_start.segment(seg) * seg);
    if let Some((blocks, limited)) = pf.db.wal_summaries(timeline, from, start_lsn).await? {
        let extra = w.merge_summaries(blocks, limited);
        if extra > 0 {
            log::warn!("PostgreSQL's WAL summaries list {extra} block(s) or fork(s) the block-change maps do not; reading them too");
        }
        started.detection.summary_check = Some(if extra == 0 {
            "WAL summaries agree with the block-change maps".to_string()
        } else {
            format!("WAL summaries listed {extra} block(s) or fork(s) the maps did not; they were read too")
        });
    }
    started.wal = Some(w);
    Ok(())
}
