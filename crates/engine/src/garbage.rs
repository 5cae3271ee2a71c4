//! Garbage collection of a stanza's backup objects: what pack storage holds, and, for
//! `expire`, deleting what no kept manifest references. `info` measures with it and deletes
//! nothing.
//!
//! Storage is freed by reference: a pack object is deleted only when no kept manifest
//! points into it, so a kept backup is never broken, whatever it was compared against.
//! Packs that kept backups reference only in part stay whole; the bytes in them that
//! nothing references are reported as held.

use crate::Result;
use pgstrata_repo::layout::{self, BackupObject};
use pgstrata_repo::manifest::Manifest;
use pgstrata_repo::storage::ObjectInfo;
use pgstrata_repo::Storage;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Unreferenced data of a backup that has no manifest is deleted only once it is this old:
/// younger, it may belong to a backup still running on another host.
pub(crate) const ORPHAN_GRACE_SECS: i64 = 3600;

/// How the stanza's pack storage is used.
#[derive(Debug, Default)]
pub(crate) struct PackStorage {
    pub deleted: u64,
    pub freed: u64,
    pub held: u64,
    pub total: u64,
    /// Objects an immutable repository keeps until their retention has passed (packs,
    /// and what else of expired backups was to go), and the latest retain-until date.
    pub waiting: u64,
    pub waiting_until: Option<i64>,
}

/// Labels among `parsed` objects with a manifest's copy and no manifest that neither this
/// expire (`expired`) nor a recorded one removed: vanished backups. Without `expired`
/// (nothing is deleted) the records are not read.
async fn vanished_labels<'k>(
    storage: &Storage,
    stanza: &str,
    parsed: &[(&ObjectInfo, (&'k str, BackupObject<'k>))],
    manifest_objects: &HashSet<&str>,
    expired: Option<&BTreeSet<String>>,
) -> Result<HashSet<&'k str>> {
    let records = match expired {
        Some(_) => pgstrata_repo::expire_record::ExpireRecord::load_all(storage, stanza).await?,
        None => Default::default(),
    };
    Ok(parsed
        .iter()
        .filter(|(_, (label, kind))| {
            *kind == BackupObject::ManifestCopy
                && !manifest_objects.contains(label)
                && !expired.is_some_and(|e| e.contains(*label))
                && !records.expired_backup(label)
        })
        .map(|(_, (label, _))| *label)
        .collect())
}

/// Measure pack storage, given the kept backups' headers (what each uses in packs is in
/// its header: `packs_used`); with `expired` (labels whose manifests were just deleted),
/// also delete the packs no kept manifest references (unless `delete` is false: then only
/// count them, as `expire --dry-run` does). Packs of a label that never had a
/// manifest (an interrupted backup, or one still running elsewhere) go only after a grace
/// period, and not while that backup can still be resumed (it is newer than every backup
/// with a manifest). Resume checkpoints go once their backup is complete, or can no longer
/// be resumed and is past the grace period.
pub(crate) async fn collect_garbage(
    storage: &Storage,
    stanza: &str,
    kept: &[&Manifest],
    expired: Option<&BTreeSet<String>>,
    delete: bool,
) -> Result<PackStorage> {
    // Referenced bytes per pack: the most any one kept backup references in it (each
    // manifest lists its packs' use without its maps being read; frames that different
    // backups reference apart are not added up, so what is shown held may be more).
    let mut referenced: HashMap<(String, String), u64> = HashMap::new();
    for m in kept {
        for (pack, used) in m.packs_used() {
            let most = referenced.entry(pack).or_default();
            *most = (*most).max(used);
        }
    }
    let with_manifest: HashSet<&str> = kept.iter().map(|m| m.label.as_str()).collect();
    let now = chrono::Utc::now().timestamp();
    let mut usage = PackStorage::default();
    let objects = storage.list(&layout::backup_root(stanza)).await?;
    let parsed: Vec<_> = objects
        .iter()
        .filter_map(|o| Some((o, layout::parse_backup_object(stanza, &o.key)?)))
        .collect();
    // Labels whose manifest exists, readable or not: a damaged backup keeps its packs. An
    // expired backup's manifest counts as gone even while an immutable repository keeps it
    // (its expire record hides it).
    let is_expired = |label: &str| expired.is_some_and(|e| e.contains(label));
    let manifest_objects: HashSet<&str> = parsed
        .iter()
        .filter_map(|(_, (label, kind))| (*kind == BackupObject::Manifest).then_some(*label))
        .filter(|label| !is_expired(label))
        .collect();
    // An interrupted backup newer than every backup with a manifest can still be resumed
    // by the next backup: its packs and checkpoints stay whatever their age.
    let newest_with_manifest = manifest_objects.iter().max().copied().unwrap_or("");
    // A label with its manifest's copy but no manifest, that no expire (this run or a
    // recorded one) removed, has vanished (see `vanished`): what is left of it is evidence
    // and may restore it, so nothing of it is deleted until `expire --set` names it.
    let vanished = vanished_labels(storage, stanza, &parsed, &manifest_objects, expired).await?;
    let resumable = |label: &str| {
        pgstrata_repo::resume::resumable(
            label,
            manifest_objects.contains(label),
            newest_with_manifest,
        )
    };
    // Deleted together at the end: on an immutable repository, as their retention allows.
    let mut doomed: Vec<String> = Vec::new();
    let mut doomed_packs: Vec<(&str, u64)> = Vec::new();
    for &(obj, (label, kind)) in &parsed {
        let pack = match kind {
            BackupObject::Manifest => continue,
            BackupObject::ResumeCheckpoint(_) => {
                // Checkpoints serve only a resume: garbage once the backup is complete, or
                // once it can no longer be resumed and is past the grace period.
                let stale = manifest_objects.contains(label)
                    || (!resumable(label) && now - obj.modified >= ORPHAN_GRACE_SECS);
                if expired.is_some() && stale {
                    doomed.push(obj.key.clone());
                }
                continue;
            }
            BackupObject::ManifestCopy | BackupObject::Part(_) => {
                // A copy or a part (format 4) without its manifest: a backup stopped before
                // its last write, or expired (the manifest goes first).
                let stray = !manifest_objects.contains(label)
                    && !vanished.contains(label)
                    && (is_expired(label) || now - obj.modified >= ORPHAN_GRACE_SECS);
                if expired.is_some() && stray {
                    doomed.push(obj.key.clone());
                }
                continue;
            }
            BackupObject::Pack(pack) => pack,
        };
        usage.total += obj.size;
        match referenced.get(&(label.to_string(), pack.to_string())) {
            Some(used) => usage.held += obj.size.saturating_sub(*used),
            None => {
                let young_orphan = !with_manifest.contains(label)
                    && !is_expired(label)
                    && (now - obj.modified < ORPHAN_GRACE_SECS || resumable(label));
                let damaged = manifest_objects.contains(label) && !with_manifest.contains(label);
                if expired.is_some() && !young_orphan && !damaged && !vanished.contains(label) {
                    doomed_packs.push((&obj.key, obj.size));
                } else {
                    usage.held += obj.size;
                }
            }
        }
    }
    delete_doomed(storage, &doomed, &doomed_packs, delete, &mut usage).await?;
    Ok(usage)
}

/// Delete the `doomed` objects and packs (with their sizes) and count what that freed; on
/// an immutable repository, what waits for its retention stays held. Without `delete`,
/// only count what deleting them would free.
async fn delete_doomed(
    storage: &Storage,
    doomed: &[String],
    doomed_packs: &[(&str, u64)],
    delete: bool,
    usage: &mut PackStorage,
) -> Result<()> {
    if !delete {
        usage.deleted = doomed_packs.len() as u64;
        usage.freed = doomed_packs.iter().map(|(_, size)| size).sum();
        return Ok(());
    }
    let others = storage.delete_retained(doomed).await?;
    let keys: Vec<String> = doomed_packs.iter().map(|(k, _)| k.to_string()).collect();
    let packs = storage.delete_retained(&keys).await?;
    let waiting: HashSet<&str> = packs.waiting.iter().map(String::as_str).collect();
    for (key, size) in doomed_packs {
        match waiting.contains(key) {
            true => usage.held += size,
            false => usage.freed += size,
        }
    }
    usage.deleted = packs.deleted;
    usage.waiting = (others.waiting.len() + packs.waiting.len()) as u64;
    usage.waiting_until = others.waiting_until.max(packs.waiting_until);
    Ok(())
}
