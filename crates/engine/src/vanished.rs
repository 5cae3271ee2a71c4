//! Backups and WAL that vanished: removed from the repository, but not by expire.
//!
//! An attacker who holds the repository's credentials deletes the newest backups first;
//! what is left looks like a repository that never had them. Two witnesses tell the
//! difference:
//!
//! - **Expire records** in the repository ([`pgstrata_repo::expire_record`]): expire
//!   writes one before it deletes anything, naming the backups and WAL it removes. In an
//!   encrypted stanza they are sealed under their names, so forged or replayed ones are
//!   refused.
//! - **This host's memory** (`state-path`): the backups and the newest WAL segment per
//!   archive this host saw in the repository the last time it looked (info, verify,
//!   backup). An attacker on the repository cannot reach it. A backup this host saw that
//!   is gone with no expire record naming it, or WAL older than the newest it saw that is
//!   gone the same way, has vanished.
//!
//! Without the state (a first look, or a `state-path` that cannot be made), the records
//! alone still catch one case: a backup directory that holds its manifest's copy but not
//! the manifest, which no writer leaves behind (the copy is written just before the
//! manifest, expire deletes the manifest just before the copy).
//!
//! Vanished backups and segments stay in the state, and so stay reported, until an expire
//! record names them (`expire --set=LABEL` of a vanished backup records it) or the state
//! file is removed.

use crate::wal_archive::ArchivedSegments;
use crate::{Result, Settings};
use pgstrata_pg::lsn;
use pgstrata_repo::expire_record::{ExpireRecord, ExpireRecords};
use pgstrata_repo::{layout, Storage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What vanished, by name.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Vanished {
    /// Labels of backups gone without an expire record.
    pub backups: Vec<String>,
    /// WAL segments gone without an expire record.
    pub wal: Vec<String>,
    /// Expire records refused (forged, stored under another name, damaged): not believed.
    pub refused_records: Vec<String>,
}

impl Vanished {
    pub fn is_empty(&self) -> bool {
        self.backups.is_empty() && self.wal.is_empty() && self.refused_records.is_empty()
    }

    /// The report's lines, one per finding.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .backups
            .iter()
            .map(|l| format!("backup {l} vanished: it is gone and no expire record names it"))
            .collect();
        if let (Some(first), Some(last)) = (self.wal.first(), self.wal.last()) {
            out.push(format!(
                "{} WAL segment(s) vanished ({first} .. {last}): gone and no expire record names them",
                self.wal.len()
            ));
        }
        out.extend(
            self.refused_records
                .iter()
                .map(|k| format!("expire record {k} refused: forged, replayed or damaged")),
        );
        out
    }
}

/// What a command found in the repository, to compare with the witnesses.
pub struct Found<'a> {
    /// Labels of the backups (those with a manifest).
    pub labels: &'a [String],
    /// The archive id and its archived WAL segments, when the command listed the archive
    /// (backup does not).
    pub wal: Option<(&'a str, &'a ArchivedSegments)>,
    pub segment_size: u64,
}

/// What this host saw of one stanza's repository, as kept in its state file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Seen {
    backups: BTreeSet<String>,
    /// The newest WAL segment name per archive id.
    newest_wal: BTreeMap<String, String>,
}

/// Compare what was `found` with the expire records and this host's state, report what
/// vanished, and remember what was found (with what vanished, so it stays reported).
pub async fn check(s: &Settings, storage: &Storage, found: &Found<'_>) -> Result<Vanished> {
    // A repository read as it was (repo-target-time) lacks, by design, what came later:
    // that vanished nothing, and this host's state of the present stays as it is.
    if storage.read_as_of().is_some() {
        return Ok(Vanished::default());
    }
    let records = ExpireRecord::load_all(storage, &s.stanza).await?;
    let state = state_file(s, storage);
    let seen = state.as_deref().map(read_state).unwrap_or_default();
    let mut v = Vanished {
        refused_records: records.refused.clone(),
        ..Vanished::default()
    };
    let present: BTreeSet<&str> = found.labels.iter().map(String::as_str).collect();
    let mut gone: BTreeSet<String> = seen
        .backups
        .iter()
        .filter(|l| !present.contains(l.as_str()) && !records.expired_backup(l))
        .cloned()
        .collect();
    gone.extend(copies_without_manifest(storage, &s.stanza, &present, &records).await?);
    v.backups = gone.into_iter().collect();
    if let Some((archive_id, segments)) = found.wal {
        if let Some(newest_seen) = seen.newest_wal.get(archive_id) {
            v.wal = vanished_wal(
                archive_id,
                segments,
                newest_seen,
                found.segment_size,
                &records,
            );
        }
    }
    for line in v.lines() {
        log::error!("{line}");
    }
    if let Some(path) = state {
        let mut now = Seen {
            backups: found.labels.iter().cloned().collect(),
            newest_wal: seen.newest_wal,
        };
        now.backups.extend(v.backups.iter().cloned());
        if let Some((archive_id, segments)) = found.wal {
            let newest = segments
                .iter()
                .filter_map(|(tli, segnos)| Some((*tli, *segnos.last()?)))
                .max();
            if let Some((tli, segno)) = newest {
                let newest = lsn::segment_name(tli, segno, found.segment_size);
                let entry = now.newest_wal.entry(archive_id.to_string()).or_default();
                if newest > *entry {
                    *entry = newest;
                }
            }
        }
        write_state(&path, &now);
    }
    Ok(v)
}

/// Backups whose directory holds the manifest's copy but no manifest, that no expire
/// record names.
async fn copies_without_manifest(
    storage: &Storage,
    stanza: &str,
    present: &BTreeSet<&str>,
    records: &ExpireRecords,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for dir in storage.list_dirs(&layout::backup_root(stanza)).await? {
        if present.contains(dir.as_str()) || records.expired_backup(&dir) {
            continue;
        }
        if storage.exists(&layout::manifest_copy(stanza, &dir)).await? {
            out.push(dir);
        }
    }
    Ok(out)
}

/// Segments after the newest present one of `newest_seen`'s timeline, up to and with
/// `newest_seen`, that no expire record names: what vanished from the archive's end.
fn vanished_wal(
    archive_id: &str,
    segments: &ArchivedSegments,
    newest_seen: &str,
    segment_size: u64,
    records: &ExpireRecords,
) -> Vec<String> {
    let Some((tli, last)) = lsn::parse_segment_name(newest_seen, segment_size) else {
        return Vec::new();
    };
    let on_timeline = segments.get(&tli);
    if on_timeline.is_some_and(|s| s.contains(&last)) {
        return Vec::new();
    }
    let newest_present = on_timeline.and_then(|s| s.range(..last).next_back().copied());
    let first = newest_present.map_or(last, |n| n + 1);
    (first..=last)
        .map(|segno| lsn::segment_name(tli, segno, segment_size))
        .filter(|name| !records.expired_wal(archive_id, name))
        .collect()
}

/// This host's state file for `s`'s stanza in `storage`'s repository, its directory made
/// (0700) when missing; `None`, with a warning, when there is no usable one.
fn state_file(s: &Settings, storage: &Storage) -> Option<PathBuf> {
    let dir = s.state_path.as_deref()?;
    if let Err(e) = pgstrata_repo::private_dir::create(dir, "state-path") {
        log::warn!(
            "{e}: vanished backups are told by the repository's expire records alone (set state-path to a directory this user can keep)"
        );
        return None;
    }
    Some(state_file_in(dir, s, storage))
}

/// The state file of `s`'s stanza in `storage`'s repository, in `dir`.
fn state_file_in(dir: &Path, s: &Settings, storage: &Storage) -> PathBuf {
    let repo = blake3::hash(storage.description().as_bytes()).to_hex();
    dir.join(format!("{}-{}.json", s.stanza, &repo[..16]))
}

/// Forget what this host saw of `s`'s stanza in `storage`'s repository (the stanza was
/// deleted: a stanza created again under its name starts afresh).
pub(crate) fn forget(s: &Settings, storage: &Storage) {
    let Some(dir) = s.state_path.as_deref() else {
        return;
    };
    let file = state_file_in(dir, s, storage);
    match std::fs::remove_file(&file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            log::warn!("{}: {e}", file.display())
        }
        _ => {}
    }
}

fn read_state(path: &Path) -> Seen {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            log::warn!("{}: unreadable ({e}); starting afresh", path.display());
            Seen::default()
        }),
        Err(_) => Seen::default(),
    }
}

/// Write the state whole (a temporary file renamed into place); a failure is a warning.
fn write_state(path: &Path, seen: &Seen) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let json = serde_json::to_vec_pretty(seen).expect("the state serializes");
    if let Err(e) = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        log::warn!("cannot keep {}: {e}", path.display());
    }
}
