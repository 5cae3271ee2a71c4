//! What `info` and `verify` report: the data their text renderings (in the commands) and
//! their Prometheus exposition (`commands/metrics.rs`) are made from.

use crate::track::ChangeDetection;
use crate::wal_archive::{ArchiveLag, ReceiverStatus, WalReceiving};
use pgstrata_repo::manifest::Manifest;
use pgstrata_repo::Named;
use serde::Serialize;

#[derive(Debug, Default, Serialize)]
pub(crate) struct BackupInfo {
    pub label: String,
    #[serde(rename = "type")]
    pub backup_type: String,
    pub prior: Option<String>,
    pub start_time: String,
    pub stop_time: String,
    /// Unix seconds of start_time and stop_time (for metrics).
    #[serde(skip)]
    pub start_epoch: i64,
    #[serde(skip)]
    pub stop_epoch: i64,
    pub start_lsn: String,
    pub stop_lsn: String,
    pub timeline: u32,
    pub wal_start: String,
    pub wal_stop: String,
    pub database_size: u64,
    /// Bytes this backup stored (its new data); the rest it references from earlier backups.
    pub stored_size: u64,
    pub files: u64,
    /// Files carried from the prior backup without being read.
    pub files_unchanged: u64,
    /// Bytes read from the data directory.
    pub bytes_read: u64,
    #[serde(flatten)]
    pub detection: ChangeDetection,
    /// Files whose changed blocks came from the WAL.
    pub files_tracked: u64,
    /// WAL-tracked backups: changed files hashed instead, per reason.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files_hashed: std::collections::BTreeMap<String, u64>,
    pub page_errors: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_pages: Vec<BadPages>,
    /// The operator's notes (`backup --annotation`, then `annotate`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Pinned (`annotate --pin`): retention never expires it.
    pub pinned: bool,
    /// The databases backed up (name, OID); absent for backups that did not record them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub databases: Option<Vec<pgstrata_repo::manifest::Database>>,
    /// Bytes read from the data directory, and stored, per second of the backup's run
    /// (what rate limits hold it to); absent for a backup shorter than a second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_rate: Option<u64>,
    /// The PostgreSQL major of the cluster backed up (before a stanza-upgrade, an older one).
    pub pg_version: u32,
    /// The WAL archive its recovery reads.
    pub archive_id: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct BadPages {
    pub path: String,
    pub blocks: Vec<u32>,
}

#[derive(Debug, Serialize)]
pub struct StanzaReport {
    pub stanza: String,
    /// Where the repository is (its path or URL, no credentials), for metrics' labels.
    #[serde(skip)]
    pub(crate) repository: String,
    pub system_identifier: String,
    pub pg_version: u32,
    pub archive_min: Option<String>,
    pub archive_max: Option<String>,
    /// Unix seconds the newest archived segment (archive_max) was stored.
    #[serde(skip)]
    pub(crate) archive_max_time: Option<i64>,
    /// Holes in the archive after the oldest backup's start, `[first, last]` missing
    /// (WAL dropped by archive-push-queue-max, or deleted): recovery cannot cross them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub archive_gaps: Vec<(String, String)>,
    /// WAL waiting in pg_wal to be archived, when pg-path is readable here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive_lag: Option<ArchiveLag>,
    /// The segment `wal-receive` is receiving, when it has stored part of one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wal_receiving: Option<WalReceiving>,
    /// What this host's `wal-receive` of the stanza last said of its position.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wal_receiver: Option<ReceiverStatus>,
    /// Bytes of all objects in the stanza (packs, manifests, WAL).
    pub repo_size: u64,
    /// Bytes in packs that kept backups reference only in part (freed when those go).
    pub(crate) held_size: u64,
    pub(crate) backups: Vec<BackupInfo>,
    /// Backups whose manifest and its copy are both damaged: they cannot be restored.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) damaged: Vec<DamagedBackup>,
    /// Backups and WAL gone without an expire record (`vanished`).
    #[serde(skip_serializing_if = "crate::vanished::Vanished::is_empty")]
    pub vanished: crate::vanished::Vanished,
    /// An immutable repository's object lock: `compliance, 35 days`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immutable: Option<String>,
    /// The time the repository was read as of (`repo-target-time`), RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<String>,
    /// The clusters the stanza belonged to before its stanza-upgrades, oldest first, with
    /// their WAL archives (their backups restore as before, with their major's binaries).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prior_clusters: Vec<PriorCluster>,
}

/// A cluster a stanza belonged to before a stanza-upgrade.
#[derive(Debug, Serialize)]
pub struct PriorCluster {
    pub system_identifier: String,
    pub pg_version: u32,
    pub archive_id: String,
    pub archive_min: Option<String>,
    pub archive_max: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DamagedBackup {
    pub label: String,
    pub error: String,
}

/// `bytes` over backup `m`'s run, per second; `None` for a run under a second.
fn per_second(bytes: u64, m: &Manifest) -> Option<u64> {
    let secs = m.stop.epoch - m.start.epoch;
    (secs > 0).then(|| bytes / secs as u64)
}

pub(crate) fn summarize(m: &Manifest) -> BackupInfo {
    BackupInfo {
        label: m.label.clone(),
        pg_version: m.cluster.major_version,
        archive_id: m.cluster.archive_id(),
        read_rate: per_second(m.stats.bytes_read, m),
        store_rate: per_second(m.stats.stored_size, m),
        backup_type: m.backup_type.name().to_string(),
        prior: m.prior.clone(),
        start_time: m.start.time.clone(),
        stop_time: m.stop.time.clone(),
        start_epoch: m.start.epoch,
        stop_epoch: m.stop.epoch,
        start_lsn: m.start.lsn.to_string(),
        stop_lsn: m.stop.lsn.to_string(),
        timeline: m.start.timeline,
        wal_start: m.start.wal.clone(),
        wal_stop: m.stop.wal.clone(),
        database_size: m.stats.db_size,
        stored_size: m.stats.stored_size,
        files: m.stats.files,
        files_unchanged: m.stats.files_unchanged,
        bytes_read: m.stats.bytes_read,
        detection: ChangeDetection::of(m),
        files_tracked: m.stats.files_tracked,
        files_hashed: m.stats.files_hashed.clone(),
        page_errors: m.stats.page_errors,
        bad_pages: m
            .files()
            .filter(|f| !f.bad_pages.is_empty())
            .map(|f| BadPages {
                path: f.path.to_string(),
                blocks: f.bad_pages.to_vec(),
            })
            .collect(),
        annotations: m.annotations.clone(),
        pinned: false,
        databases: m.databases.clone(),
    }
}

#[derive(Debug, Serialize)]
pub struct VerifyReport {
    pub stanza: String,
    /// Where the repository is (its path or URL, no credentials), for metrics' labels.
    #[serde(skip)]
    pub repository: String,
    /// No backup is invalid, no twinned object is damaged, no archived WAL object is
    /// damaged and the archive has no gap.
    pub ok: bool,
    pub backups: Vec<BackupVerdict>,
    /// Manifests, parts and their copies that are missing or fail their check, including
    /// those whose twin is intact (the backup restores, but has lost its redundancy).
    pub damaged_objects: Vec<pgstrata_repo::manifest::DamagedTwin>,
    /// Backups and WAL gone without an expire record: a failure.
    pub vanished: crate::vanished::Vanished,
    /// With `--repair`: the damaged objects rewritten from their intact twins (no longer
    /// in `damaged_objects`).
    pub repaired: Vec<String>,
    pub wal: WalVerdict,
}

#[derive(Debug, Serialize)]
pub struct BackupVerdict {
    pub label: String,
    pub ok: bool,
    pub files: u64,
    /// Files read back here; the others are identical to entries checked before.
    pub files_read: u64,
    /// Bytes of file content checked by reading it back.
    pub bytes_read: u64,
    pub errors: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct WalVerdict {
    /// Archived segments (full segments, not .partial) whose checksum was checked.
    pub segments: u64,
    /// Archived WAL objects (segments, .partial, .backup, .history) that fail their checksum.
    pub damaged: Vec<String>,
    /// Holes in the archive, `[first missing, last missing]`, after the oldest backup's start.
    pub gaps: Vec<(String, String)>,
    /// Block-change maps checked, and those that fail their checksum.
    pub maps: u64,
    pub(crate) maps_damaged: Vec<String>,
}
