//! `info`: what a stanza holds.

use crate::archive::archive_range;
use crate::progress::human_bytes;
use crate::track::ChangeDetection;
use crate::{open_stanza, Result, Settings};
use pgstrata_repo::manifest::{scan_headers, Manifest, Tracking};
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
    /// The operator's notes (`backup --annotation`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The databases backed up (name, OID); absent for backups that did not record them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub databases: Option<Vec<pgstrata_repo::manifest::Database>>,
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
    pub archive_lag: Option<crate::archive::ArchiveLag>,
    /// Bytes of all objects in the stanza (packs, manifests, WAL).
    pub repo_size: u64,
    /// Bytes in packs that kept backups reference only in part (freed when those go).
    pub(crate) held_size: u64,
    pub(crate) backups: Vec<BackupInfo>,
    /// Backups whose manifest and its copy are both damaged: they cannot be restored.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) damaged: Vec<DamagedBackup>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DamagedBackup {
    pub label: String,
    pub error: String,
}

pub(crate) fn summarize(m: &Manifest) -> BackupInfo {
    BackupInfo {
        label: m.label.clone(),
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
        databases: m.databases.clone(),
    }
}

pub async fn info(s: &Settings, set: Option<&str>) -> Result<StanzaReport> {
    let (storage, stanza) = open_stanza(s).await?;
    // Each backup's header (with what it uses in packs): no manifest is read whole.
    let scan = scan_headers(&storage, &s.stanza).await?;
    let damaged: Vec<DamagedBackup> = scan
        .damaged
        .iter()
        .filter(|d| set.is_none_or(|want| want == d.label))
        .map(|d| DamagedBackup {
            label: d.label.clone(),
            error: d.error.to_string(),
        })
        .collect();
    let headers: Vec<&Manifest> = scan.headers.iter().collect();
    let usage = crate::expire::collect_garbage(&storage, &s.stanza, &headers, None).await?;
    let seg_size = stanza.cluster.wal_segment_size;
    let oldest_start = scan
        .headers
        .iter()
        .filter_map(|m| {
            pgstrata_pg::lsn::parse_segment_name(&m.start.wal, seg_size).map(|(_, n)| n)
        })
        .min();
    let mut backups = Vec::new();
    for header in scan
        .headers
        .iter()
        .filter(|m| set.is_none_or(|w| w == m.label))
    {
        backups.push(if header.stats.page_errors > 0 {
            // Which pages failed is in the file entries.
            summarize(&Manifest::load(&storage, &s.stanza, &header.label).await?)
        } else {
            summarize(header)
        });
    }
    let repo_size: u64 = storage.list(&s.stanza).await?.iter().map(|o| o.size).sum();
    if let Some(want) = set {
        if backups.is_empty() && damaged.is_empty() {
            return Err(crate::Error::config(format!(
                "backup '{want}' does not exist in stanza '{}'",
                s.stanza
            )));
        }
    }
    let range = archive_range(&storage, &s.stanza, &stanza.cluster.archive_id(), seg_size).await?;
    let empty = crate::archive::ArchivedSegments::new();
    let archived = range.as_ref().map_or(&empty, |r| &r.segments);
    let archive_gaps = crate::archive::archive_gaps(archived, oldest_start, seg_size);
    let archive_lag = s
        .pg_path
        .as_deref()
        .and_then(|p| crate::archive::archive_lag(p, archived, seg_size));
    Ok(StanzaReport {
        stanza: s.stanza.clone(),
        repository: storage.description().to_string(),
        system_identifier: stanza.cluster.system_identifier.clone(),
        pg_version: stanza.cluster.major_version,
        archive_min: range.as_ref().map(|r| r.min.clone()),
        archive_max: range.as_ref().map(|r| r.max.clone()),
        archive_max_time: range.map(|r| r.max_modified),
        archive_gaps,
        archive_lag,
        repo_size,
        held_size: usage.held,
        backups,
        damaged,
    })
}

pub fn render_text(r: &StanzaReport) -> String {
    let mut out = format!(
        "stanza: {}\n    PostgreSQL {}, system identifier {}\n",
        r.stanza, r.pg_version, r.system_identifier
    );
    match (&r.archive_min, &r.archive_max) {
        (Some(a), Some(b)) => out.push_str(&format!("    wal archive min/max: {a} / {b}\n")),
        _ => out.push_str("    wal archive: empty\n"),
    }
    for (a, b) in &r.archive_gaps {
        out.push_str(&format!(
            "    wal archive GAP: {a} .. {b} missing (point-in-time recovery cannot cross it)\n"
        ));
    }
    if let Some(l) = &r.archive_lag {
        out.push_str(&format!(
            "    wal waiting to be archived: {} ready file(s), {} not in this repository{}\n",
            l.ready,
            l.ready_not_in_repo,
            l.oldest_ready_age_secs
                .map(|a| format!(", oldest ready for {a} s"))
                .unwrap_or_default()
        ));
    }
    out.push_str(&format!(
        "    repository size: {}, held in partly referenced packs: {}\n",
        human_bytes(r.repo_size),
        human_bytes(r.held_size)
    ));
    if r.backups.is_empty() && r.damaged.is_empty() {
        out.push_str("    no backups\n");
    }
    for d in &r.damaged {
        out.push_str(&format!(
            "\n    damaged backup: {} (cannot be restored)\n        {}\n",
            d.label, d.error
        ));
    }
    for b in &r.backups {
        out.push_str(&format!(
            "\n    {} backup: {}\n        timestamp start/stop: {} / {}\n        lsn start/stop: {} / {} (timeline {})\n        wal start/stop: {} / {}\n        database size: {}, new data stored: {}, files: {}\n",
            b.backup_type,
            b.label,
            b.start_time,
            b.stop_time,
            b.start_lsn,
            b.stop_lsn,
            b.timeline,
            b.wal_start,
            b.wal_stop,
            human_bytes(b.database_size),
            human_bytes(b.stored_size),
            b.files
        ));
        for (k, v) in &b.annotations {
            // Escaped: a value is one line, whatever the operator typed.
            out.push_str(&format!("        annotation: {k}={}\n", v.escape_debug()));
        }
        if let Some(p) = &b.prior {
            out.push_str(&format!(
                "        compared with: {p}; {} files unchanged, {} read\n",
                b.files_unchanged,
                human_bytes(b.bytes_read)
            ));
        }
        let d = &b.detection;
        if let Some(t) = d.track {
            out.push_str(&format!(
                "        changed blocks found by: {}{}{}\n",
                t.name(),
                if t == Tracking::Wal {
                    format!(
                        " ({} files read block by block{})",
                        b.files_tracked,
                        if b.files_hashed.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; files hashed: {}",
                                crate::track::describe_hashed(&b.files_hashed)
                            )
                        }
                    )
                } else {
                    String::new()
                },
                d.track_reason
                    .as_ref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            ));
        }
        if let Some(c) = &d.summary_check {
            out.push_str(&format!("        cross-check: {c}\n"));
        }
        if let Some(r) = &d.delta_reason {
            out.push_str(&format!("        every block hashed: {r}\n"));
        }
        if b.page_errors > 0 {
            out.push_str(&format!(
                "        page checksum errors: {}\n",
                b.page_errors
            ));
            for bp in &b.bad_pages {
                out.push_str(&format!("            {} blocks {:?}\n", bp.path, bp.blocks));
            }
        }
    }
    out
}
