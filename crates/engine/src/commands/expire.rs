//! `expire`: retention, and freeing what no kept backup needs.
//!
//! Expiring a backup deletes its manifest, which makes it disappear at once. Storage is then
//! freed by reference: a pack object is deleted only when no kept manifest points into it,
//! so expire never breaks a kept backup, whatever it was compared against. Packs that kept
//! backups reference only in part stay whole; the bytes in them that nothing references are
//! reported as held (and by `info`).
//!
//! Retention (pgBackRest's names): `repo-retention-full` keeps that many full backups (or,
//! with `repo-retention-full-type=time`, the full backups of that many days plus the newest
//! one older, so every point in the window stays restorable); backups older than the oldest
//! kept full go too. `repo-retention-diff` keeps that many differential backups. A backup
//! compared against an expired one is expired with it, as its users expect from pgBackRest,
//! although its data would still restore. `--set` expires exactly one backup.
//!
//! WAL: segments older than the oldest kept backup's start are deleted. With
//! `repo-retention-archive=N`, continuous WAL (for point-in-time recovery) is kept from the
//! lowest start segment among the N newest kept backups (a newer backup may sit on a timeline
//! that branched off lower); older kept backups keep just the WAL that makes them consistent.
//! Timeline history files are never deleted.

use crate::garbage::{collect_garbage, ORPHAN_GRACE_SECS};
use crate::lock::with_lock;
use crate::progress::human_bytes;
use crate::{open_stanza, Error, Result, Settings};
use pgstrata_pg::lsn;
use pgstrata_repo::annotation::Annotations;
use pgstrata_repo::expire_record::{ExpireRecord, WalRange};
use pgstrata_repo::layout::{self, ArchiveObject};
use pgstrata_repo::manifest::{scan_headers, BackupType, Manifest};
use pgstrata_repo::Storage;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

// Names as configured (`repo-retention-full-type`).
pgstrata_repo::named! {
    pub enum RetentionType { Count = "count", Time = "time" }
}

#[derive(Debug, Clone)]
pub struct ExpireOptions {
    pub set: Option<String>,
    pub retention_full: Option<u32>,
    pub retention_full_type: RetentionType,
    pub retention_diff: Option<u32>,
    pub retention_archive: Option<u32>,
    /// Seconds (`repo-retention-window`): keep what restores to any point this recent.
    pub retention_window: Option<u64>,
    /// Say what would be removed and why, and change nothing (`--dry-run`).
    pub dry_run: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct ExpireReport {
    /// Nothing was changed: the report says what an expire would remove now.
    pub dry_run: bool,
    pub expired: Vec<String>,
    /// For each backup in `expired`, the rule that expires it.
    pub reasons: BTreeMap<String, String>,
    pub packs_deleted: u64,
    pub bytes_freed: u64,
    pub wal_deleted: u64,
    /// The WAL segments deleted (`wal_deleted` counts maps and history files too), as runs
    /// of consecutive segments of one timeline.
    pub wal_ranges: Vec<WalRange>,
    /// Bytes in packs that kept backups reference only in part.
    pub bytes_held: u64,
    /// Staging files of interrupted writes removed (local repositories).
    #[serde(skip)]
    pub(crate) staging_removed: u64,
    /// Objects of expired backups and WAL an immutable repository keeps until their
    /// retention has passed (a later expire deletes them), and the latest retain-until date
    /// among them (unix seconds).
    pub objects_waiting: u64,
    pub waiting_until: Option<i64>,
}

pub async fn expire(s: &Settings, o: &ExpireOptions) -> Result<ExpireReport> {
    let (storage, stanza) = open_stanza(s).await?;
    if o.dry_run {
        // It changes nothing, so it takes no lock (and works on a repository read as of a
        // time): what it shows is what an expire started now would do.
        return run(s, o, &storage, &stanza).await;
    }
    let storage2 = storage.clone();
    with_lock(&storage2, &s.stanza, &s.lock_path, "expire", async {
        run(s, o, &storage, &stanza).await
    })
    .await
}

/// The report for people: what was removed (or, in a dry run, would be), and why.
pub fn render_text(r: &ExpireReport) -> String {
    let (verb, delete) = match r.dry_run {
        true => ("would expire", "would delete"),
        false => ("expired", "deleted"),
    };
    let mut out = format!(
        "{verb} {} backup(s){}; {delete} {} pack(s) ({} bytes) and {} WAL file(s); {} bytes held in partly referenced packs\n",
        r.expired.len(),
        if r.expired.is_empty() { String::new() } else { format!(" ({})", r.expired.join(", ")) },
        r.packs_deleted,
        r.bytes_freed,
        r.wal_deleted,
        r.bytes_held
    );
    if r.dry_run {
        for (label, why) in &r.reasons {
            out.push_str(&format!("  backup {label}: {why}\n"));
        }
        for w in &r.wal_ranges {
            let range = match w.first == w.last {
                true => w.first.clone(),
                false => format!("{} to {}", w.first, w.last),
            };
            out.push_str(&format!("  WAL {}: {range}\n", w.archive_id));
        }
        out.push_str("nothing was changed (--dry-run)\n");
    }
    if let Some(until) = r.waiting_until {
        out.push_str(&format!(
            "{} object(s) wait for their retention (the repository's object lock) until {} at the latest: a later expire deletes them\n",
            r.objects_waiting,
            chrono::DateTime::from_timestamp(until, 0).unwrap_or_default().to_rfc3339()
        ));
    }
    out
}

/// Expire (or, with `dry_run`, say what would go) under the caller's lock.
async fn run(
    s: &Settings,
    o: &ExpireOptions,
    storage: &Storage,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
) -> Result<ExpireReport> {
    // Each backup's header, with the packs it uses: no manifest is read whole.
    let scan = scan_headers(storage, &s.stanza).await?;
    let headers: Vec<&Manifest> = scan.headers.iter().collect();
    let mut damaged: Vec<&str> = scan.damaged.iter().map(|d| d.label.as_str()).collect();
    // A vanished backup (what is left of it) may be named by --set: its record then says
    // it is gone on purpose, and it is reported no more.
    let vanished = match &o.set {
        Some(_) => vanished_backups(s, storage, &scan, stanza.cluster.wal_segment_size).await?,
        None => Vec::new(),
    };
    damaged.extend(vanished.iter().map(String::as_str));
    let notes = Annotations::load_all(storage, &s.stanza).await?;
    let pinned: BTreeSet<String> = headers
        .iter()
        .filter(|m| notes.pinned(&m.label))
        .map(|m| m.label.clone())
        .collect();
    let Chosen {
        reasons,
        window_kept,
    } = choose(&headers, &damaged, &pinned, o)?;
    let doomed: BTreeSet<String> = reasons.keys().cloned().collect();
    // Backups expired before whose manifests are still there (an immutable repository
    // keeps them until their retention has passed): deleted with these.
    let remains = pgstrata_repo::manifest::expired_remains(storage, &s.stanza).await?;
    for d in scan.damaged.iter().filter(|d| !doomed.contains(&d.label)) {
        log::warn!(
            "backup {} is damaged and is kept with its packs ({}); expire it with --set={}",
            d.label,
            d.error,
            d.label
        );
    }
    let kept: Vec<&Manifest> = headers
        .iter()
        .copied()
        .filter(|m| !doomed.contains(&m.label))
        .collect();
    // The window needs continuous WAL from its oldest backup on, whatever
    // repo-retention-archive says.
    let retention_archive = match o.retention_window {
        Some(_) => o.retention_archive.map(|n| n.max(window_kept as u32)),
        None => o.retention_archive,
    };
    let (wal, ranges) = doomed_wal_by_cluster(storage, stanza, &kept, retention_archive).await?;
    let mut report = ExpireReport {
        dry_run: o.dry_run,
        expired: doomed.iter().cloned().collect(),
        reasons,
        wal_ranges: ranges,
        ..Default::default()
    };
    // The record first: whatever is deleted after it is known to have been expired.
    if !o.dry_run && (!doomed.is_empty() || !wal.is_empty()) {
        let record = ExpireRecord::new(
            &s.stanza,
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            doomed.iter().cloned().collect(),
            report.wal_ranges.clone(),
        );
        record.write(storage).await?;
    }
    let mut gone = doomed;
    gone.extend(remains);
    let wal_keys: Vec<String> = wal.into_iter().map(|(key, _)| key).collect();
    match o.dry_run {
        true => {
            let usage = collect_garbage(storage, &s.stanza, &kept, Some(&gone), false).await?;
            report.packs_deleted = usage.deleted;
            report.bytes_freed = usage.freed;
            report.bytes_held = usage.held;
            report.wal_deleted = wal_keys.len() as u64;
        }
        false => delete(storage, &s.stanza, &kept, &gone, &wal_keys, &mut report).await?,
    }
    Ok(report)
}

/// Delete the backups `gone` (their manifests first: the backups no longer exist; then
/// their copies; their parts and packs go with the garbage) and the WAL `wal_keys`.
async fn delete(
    storage: &Storage,
    stanza: &str,
    kept: &[&Manifest],
    gone: &BTreeSet<String>,
    wal_keys: &[String],
    report: &mut ExpireReport,
) -> Result<()> {
    let manifests: Vec<String> = gone.iter().map(|l| layout::manifest(stanza, l)).collect();
    let copies: Vec<String> = gone
        .iter()
        .map(|l| layout::manifest_copy(stanza, l))
        .collect();
    let mut waiting = storage.delete_retained(&manifests).await?;
    waiting.add(storage.delete_retained(&copies).await?);
    let mut notes = Vec::new();
    for label in gone {
        let dir = format!("{}/", layout::annotation_records_dir(stanza, label));
        notes.extend(storage.list(&dir).await?.into_iter().map(|o| o.key));
    }
    waiting.add(storage.delete_retained(&notes).await?);
    for label in gone {
        log::info!(
            "expired backup {label}{}",
            report
                .reasons
                .get(label)
                .map(|why| format!(": {why}"))
                .unwrap_or_default()
        );
    }
    let usage = collect_garbage(storage, stanza, kept, Some(gone), true).await?;
    report.packs_deleted = usage.deleted;
    report.bytes_freed = usage.freed;
    report.bytes_held = usage.held;
    let wal_deletion = storage.delete_retained(wal_keys).await?;
    report.wal_deleted = wal_deletion.deleted;
    waiting.add(wal_deletion);
    report.objects_waiting = waiting.waiting.len() as u64 + usage.waiting;
    report.waiting_until = waiting.waiting_until.max(usage.waiting_until);
    report.staging_removed = remove_staging(storage, stanza)?;
    log::info!(
        "expire: {} backup(s) expired, {} pack(s) deleted ({} freed), {} WAL file(s) deleted, {} held in partly referenced packs",
        report.expired.len(),
        report.packs_deleted,
        human_bytes(report.bytes_freed),
        report.wal_deleted,
        human_bytes(report.bytes_held)
    );
    if let Some(until) = report.waiting_until {
        log::info!(
            "expire: {} object(s) of expired backups and WAL are kept by the repository's object lock until {} at the latest; a later expire deletes them",
            report.objects_waiting,
            chrono::DateTime::from_timestamp(until, 0).unwrap_or_default().to_rfc3339()
        );
    }
    Ok(())
}

/// The backups that vanished (`vanished`), for `expire --set` of one of them.
async fn vanished_backups(
    s: &Settings,
    storage: &Storage,
    scan: &pgstrata_repo::manifest::Backups,
    segment_size: u64,
) -> Result<Vec<String>> {
    let mut labels: Vec<String> = scan.headers.iter().map(|m| m.label.clone()).collect();
    labels.extend(scan.damaged.iter().map(|d| d.label.clone()));
    let found = crate::vanished::Found {
        labels: &labels,
        wal: None,
        segment_size,
    };
    Ok(crate::vanished::check(s, storage, &found).await?.backups)
}

/// What retention chose.
struct Chosen {
    /// The labels to expire, each with the rule that expires it.
    reasons: BTreeMap<String, String>,
    /// With `repo-retention-window`: how many of the newest backups it keeps.
    window_kept: usize,
}

/// The labels to expire, each with the rule that expires it. A damaged or vanished backup
/// (`damaged`) goes only when `--set` names it.
fn choose(
    manifests: &[&Manifest],
    damaged: &[&str],
    pinned: &BTreeSet<String>,
    o: &ExpireOptions,
) -> Result<Chosen> {
    let mut doomed = BTreeMap::new();
    if let Some(set) = o.set.as_ref().filter(|set| pinned.contains(*set)) {
        return Err(Error::config(format!(
            "backup '{set}' is pinned (annotate --pin): expire keeps it; unpin it first with --set={set} --unpin annotate"
        )));
    }
    if let Some(set) = &o.set {
        if !manifests.iter().any(|m| &m.label == set) && !damaged.contains(&set.as_str()) {
            let mut all: Vec<&str> = manifests.iter().map(|m| m.label.as_str()).collect();
            all.extend(damaged);
            all.sort();
            return Err(Error::config(format!(
                "backup '{set}' does not exist (backups: {})",
                all.join(", ")
            )));
        }
        doomed.insert(set.clone(), "named by --set".to_string());
        return Ok(Chosen {
            reasons: doomed,
            window_kept: 0,
        });
    }
    if o.retention_full.is_none() && o.retention_diff.is_none() && o.retention_window.is_none() {
        return Err(Error::config(
            "nothing to expire by: set repo-retention-full (and optionally repo-retention-diff) or repo-retention-window, or give --set=LABEL",
        ));
    }
    by_full(manifests, o, &mut doomed);
    by_diff(manifests, o, &mut doomed);
    // The window keeps the newest backup that ended before it began and every one after;
    // alone, it expires the rest; with other rules, it only keeps what they would expire.
    let window_kept = match o.retention_window {
        None => 0,
        Some(secs) => {
            let cutoff = chrono::Utc::now().timestamp() - secs as i64;
            let anchor = manifests.iter().rposition(|m| m.stop.epoch < cutoff);
            let kept = manifests.len() - anchor.unwrap_or(0);
            if o.retention_full.is_none() && o.retention_diff.is_none() {
                let why = format!(
                    "older than the newest backup that ended before the window began (repo-retention-window={})",
                    fmt_secs(secs)
                );
                for m in &manifests[..manifests.len() - kept] {
                    doomed.insert(m.label.clone(), why.clone());
                }
            }
            kept
        }
    };
    // What the window keeps, and what is pinned.
    let protected: BTreeSet<&str> = manifests[manifests.len() - window_kept..]
        .iter()
        .map(|m| m.label.as_str())
        .chain(pinned.iter().map(String::as_str))
        .collect();
    doomed.retain(|label, _| !protected.contains(label.as_str()));
    // Backups compared against an expired backup follow it (unless the window keeps them:
    // every backup restores on its own).
    loop {
        let more: Vec<(String, String)> = manifests
            .iter()
            .filter(|m| !doomed.contains_key(&m.label) && !protected.contains(m.label.as_str()))
            .filter_map(|m| {
                let prior = m.prior.as_ref().filter(|p| doomed.contains_key(*p))?;
                Some((
                    m.label.clone(),
                    format!("compared against {prior}, which expires"),
                ))
            })
            .collect();
        if more.is_empty() {
            break;
        }
        doomed.extend(more);
    }
    Ok(Chosen {
        reasons: doomed,
        window_kept,
    })
}

/// `repo-retention-full`: the backups older than the oldest full kept.
fn by_full(manifests: &[&Manifest], o: &ExpireOptions, doomed: &mut BTreeMap<String, String>) {
    let Some(n) = o.retention_full else { return };
    let fulls: Vec<&Manifest> = manifests
        .iter()
        .copied()
        .filter(|m| m.backup_type == BackupType::Full)
        .collect();
    let (oldest_kept, why) = match o.retention_full_type {
        RetentionType::Count => (
            fulls.len().checked_sub(n.max(1) as usize).map(|i| fulls[i]),
            format!(
                "older than the oldest of the {} newest full backups (repo-retention-full={n})",
                n.max(1)
            ),
        ),
        RetentionType::Time => {
            let cutoff = chrono::Utc::now().timestamp() - n as i64 * 86400;
            // The newest full that ended before the cutoff still serves the window's start.
            let older: Vec<&&Manifest> = fulls.iter().filter(|m| m.stop.epoch < cutoff).collect();
            (
                older.last().map(|m| **m),
                format!("older than the newest full backup that ended before the last {n} day(s) (repo-retention-full={n}, repo-retention-full-type=time)"),
            )
        }
    };
    if let Some(keep_from) = oldest_kept {
        for m in manifests.iter().filter(|m| m.label < keep_from.label) {
            doomed.insert(m.label.clone(), why.clone());
        }
    }
}

/// `repo-retention-diff`: the differential backups beyond the newest N (among those
/// `repo-retention-full` keeps).
fn by_diff(manifests: &[&Manifest], o: &ExpireOptions, doomed: &mut BTreeMap<String, String>) {
    let Some(n) = o.retention_diff else { return };
    let diffs: Vec<&Manifest> = manifests
        .iter()
        .copied()
        .filter(|m| m.backup_type == BackupType::Diff && !doomed.contains_key(&m.label))
        .collect();
    let why = format!(
        "older than the {} newest differential backups (repo-retention-diff={n})",
        n.max(1)
    );
    for m in diffs
        .iter()
        .take(diffs.len().saturating_sub(n.max(1) as usize))
    {
        doomed.insert(m.label.clone(), why.clone());
    }
}

/// Seconds as the option is written (`14d`, `36h`, `90m`, `30s`).
fn fmt_secs(secs: u64) -> String {
    match secs {
        s if s % 86400 == 0 => format!("{}d", s / 86400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Remove staging files that writers killed mid-write left (local repositories), once they
/// are as old as orphaned packs must be: younger, a write may still be running elsewhere.
fn remove_staging(storage: &Storage, stanza: &str) -> Result<u64> {
    let grace = std::time::Duration::from_secs(ORPHAN_GRACE_SECS as u64);
    let removed = storage.remove_stale_staging(stanza, grace)?;
    for key in &removed {
        log::info!("removed {key}: the staging file of a write that was interrupted");
    }
    Ok(removed.len() as u64)
}

async fn doomed_wal(
    storage: &Storage,
    stanza: &str,
    cluster: &pgstrata_repo::stanza::ClusterIdentity,
    kept: &[&Manifest],
    retention_archive: Option<u32>,
) -> Result<Vec<(String, String)>> {
    let seg = cluster.wal_segment_size;
    let seg_of = |name: &str| lsn::parse_segment_name(name, seg).map(|(_, s)| s);
    let kept_ranges: Vec<(u64, u64)> = kept
        .iter()
        .filter_map(|m| Some((seg_of(&m.start.wal)?, seg_of(&m.stop.wal)?)))
        .collect();
    if kept_ranges.len() != kept.len() {
        return Err(Error::integrity(
            "a kept backup names an invalid WAL segment; no WAL was expired".to_string(),
        ));
    }
    let objects = storage
        .list(&layout::archive_root(stanza, &cluster.archive_id()))
        .await?;
    let doomed = objects
        .into_iter()
        .filter_map(|obj| {
            let name = match layout::parse_archive_object(&obj.key) {
                ArchiveObject::Wal(name) | ArchiveObject::ChangeMap { segment: name } => name,
            };
            let expires = seg_of(name)
                .is_some_and(|segno| wal_expires(segno, &kept_ranges, retention_archive));
            let name = name.to_string();
            expires.then_some((obj.key, name))
        })
        .collect();
    Ok(doomed)
}

/// The WAL objects expire deletes, with their ranges for the expire record. Each cluster
/// the stanza belonged to has its own archive, whose WAL names start over: each is
/// expired by its own backups. One before a stanza-upgrade without backups left is needed
/// by nothing; the current one keeps all its WAL until it has backups.
async fn doomed_wal_by_cluster(
    storage: &Storage,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
    kept: &[&Manifest],
    retention_archive: Option<u32>,
) -> Result<(Vec<(String, String)>, Vec<WalRange>)> {
    let (mut wal, mut ranges) = (Vec::new(), Vec::new());
    for cluster in &stanza.history {
        let current = *cluster == stanza.cluster;
        let kept: Vec<&Manifest> = kept
            .iter()
            .copied()
            .filter(|m| m.cluster == *cluster)
            .collect();
        let doomed_here = match (current, kept.is_empty()) {
            (false, true) => all_wal(storage, &stanza.stanza, cluster).await?,
            (false, false) => doomed_wal(storage, &stanza.stanza, cluster, &kept, None).await?,
            (true, _) => {
                doomed_wal(storage, &stanza.stanza, cluster, &kept, retention_archive).await?
            }
        };
        let names = doomed_here.iter().map(|(_, name)| name.as_str());
        ranges.extend(wal_ranges(
            &cluster.archive_id(),
            cluster.wal_segment_size,
            names,
        ));
        wal.extend(doomed_here);
    }
    Ok((wal, ranges))
}

/// Every WAL object of `cluster`'s archive but its timeline history files: the archive of
/// a cluster before a stanza-upgrade whose last backup expired.
async fn all_wal(
    storage: &Storage,
    stanza: &str,
    cluster: &pgstrata_repo::stanza::ClusterIdentity,
) -> Result<Vec<(String, String)>> {
    let objects = storage
        .list(&layout::archive_root(stanza, &cluster.archive_id()))
        .await?;
    Ok(objects
        .into_iter()
        .filter_map(|obj| {
            let name = match layout::parse_archive_object(&obj.key) {
                ArchiveObject::Wal(name) | ArchiveObject::ChangeMap { segment: name } => name,
            };
            let name = name.to_string();
            (!name.ends_with(".history")).then_some((obj.key, name))
        })
        .collect())
}

/// The segments of WAL file `names` (a map, .partial or .backup file counts as its
/// segment), as ranges of consecutive segments of one timeline, for the expire record.
fn wal_ranges<'a>(
    archive_id: &str,
    segment_size: u64,
    names: impl Iterator<Item = &'a str>,
) -> Vec<WalRange> {
    let segments: BTreeSet<(u32, u64)> = names
        .filter_map(|n| lsn::parse_segment_name(n.get(..24)?, segment_size))
        .collect();
    let name = |(tli, segno): (u32, u64)| lsn::segment_name(tli, segno, segment_size);
    let mut ranges: Vec<((u32, u64), (u32, u64))> = Vec::new();
    for s in segments {
        match ranges.last_mut() {
            Some((_, last)) if last.0 == s.0 && last.1 + 1 == s.1 => *last = s,
            _ => ranges.push((s, s)),
        }
    }
    ranges
        .into_iter()
        .map(|(first, last)| WalRange {
            archive_id: archive_id.to_string(),
            first: name(first),
            last: name(last),
        })
        .collect()
}

/// Whether archived WAL of segment number `segno` (a segment, its change map, a .partial or
/// a .backup file, on any timeline) may be deleted, given the kept backups' (start, stop)
/// segment numbers oldest first. Timeline history files are never passed here: they are
/// always kept.
///
/// Continuous WAL is kept from the lowest start segment among the `retention_archive`
/// newest backups (all of them by default), not from the oldest backup's: after a
/// point-in-time restore a newer backup can sit on a timeline that branched off at a lower
/// segment number, and its WAL must stay. Older backups keep the segments that make them
/// consistent. Segment numbers are compared across timelines, which may keep segments of
/// an abandoned timeline longer than needed, never less.
fn wal_expires(segno: u64, kept: &[(u64, u64)], retention_archive: Option<u32>) -> bool {
    if kept.is_empty() {
        return false; // without backups, WAL is all there is: keep it
    }
    let n = retention_archive
        .map(|n| n.max(1) as usize)
        .unwrap_or(kept.len())
        .min(kept.len());
    let continuous_from = kept[kept.len() - n..]
        .iter()
        .map(|(start, _)| *start)
        .min()
        .unwrap_or(0);
    segno < continuous_from && !kept.iter().any(|(a, b)| segno >= *a && segno <= *b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer killed between writing a local object's staging file and renaming it
    /// leaves `<key>#<n>`; expire removes such files once they are an hour old, and only
    /// them.
    #[tokio::test]
    async fn expire_removes_staging_files_older_than_an_hour() {
        use pgstrata_repo::stanza::{ClusterIdentity, StanzaInfo};
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::local(dir.path()).unwrap();
        let cluster = ClusterIdentity {
            system_identifier: "1".into(),
            major_version: 15,
            catalog_version: 1,
            control_version: 1,
            wal_segment_size: 16 << 20,
            block_size: 8192,
        };
        let info = StanzaInfo::new("st", cluster);
        StanzaInfo::create(&storage, &info).await.unwrap();
        let pack = dir.path().join("st/backup/20260101-000000F/pack");
        std::fs::create_dir_all(&pack).unwrap();
        let plant = |name: &str, age_secs: u64| {
            let f = std::fs::File::create(dir.path().join("st").join(name)).unwrap();
            f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(age_secs))
                .unwrap();
        };
        let pack_dir = "backup/20260101-000000F/pack";
        plant(&format!("{pack_dir}/0-0#1"), 2 * 3600); // left by a killed writer
        plant(&format!("{pack_dir}/0-1#7"), 60); // may be a write in progress
        plant("not#staging", 2 * 3600); // not a staging name: left alone
        let s = Settings::for_repository(
            "st",
            pgstrata_repo::storage::RepoConfig {
                path: dir.path().display().to_string(),
                retries: 1,
                ..Default::default()
            },
            dir.path().join("locks"),
        );
        let o = ExpireOptions {
            set: None,
            retention_full: Some(1),
            retention_full_type: RetentionType::Count,
            retention_diff: None,
            retention_archive: None,
            retention_window: None,
            dry_run: false,
        };
        let report = expire(&s, &o).await.unwrap();
        assert_eq!(report.staging_removed, 1);
        assert!(!pack.join("0-0#1").exists(), "the old staging file is gone");
        assert!(pack.join("0-1#7").exists(), "a young one stays");
        assert!(dir.path().join("st/not#staging").exists());
    }

    #[test]
    fn wal_before_the_oldest_backup_expires_and_consistency_wal_of_old_backups_stays() {
        let kept = [(10, 11), (20, 22), (30, 30)];
        assert!(wal_expires(9, &kept, None));
        assert!(!wal_expires(10, &kept, None));
        assert!(!wal_expires(15, &kept, None));
        // Only the newest backup gets continuous WAL: the older ones keep their own.
        assert!(!wal_expires(11, &kept, Some(1)));
        assert!(wal_expires(12, &kept, Some(1)));
        assert!(!wal_expires(21, &kept, Some(1)));
        assert!(wal_expires(25, &kept, Some(1)));
        assert!(!wal_expires(30, &kept, Some(1)));
        assert!(!wal_expires(31, &kept, Some(1)));
        assert!(
            !wal_expires(0, &[], Some(1)),
            "without backups nothing expires"
        );
    }

    #[test]
    fn a_newer_backup_on_a_timeline_that_branched_lower_keeps_its_wal() {
        // Backups A (segment 5) and B (10) on timeline 1; a point-in-time restore of A to
        // segment 6 starts timeline 2, whose backup C starts at segment 7. Keeping continuous
        // WAL for the two newest (B and C) must keep C's WAL from segment 7 on.
        let kept = [(5, 5), (10, 10), (7, 7)];
        for segno in 7..12 {
            assert!(!wal_expires(segno, &kept, Some(2)), "segment {segno}");
        }
        assert!(!wal_expires(5, &kept, Some(2)), "A stays consistent");
        assert!(wal_expires(6, &kept, Some(2)));
    }
}
