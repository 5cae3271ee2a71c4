//! After the copy and `pg_backup_stop`: build the manifest from what was copied and write
//! it, which makes the backup visible.
//!
//! Just before writing it, the backup checks that its prior backup's manifest and every
//! pack of another backup its files point into still exist. The stanza lock keeps expire
//! away, but a lock can be lost (taken over as stale, removed by hand); a manifest that
//! points at deleted packs would be a backup that cannot be restored, found out only when
//! it is needed.

use super::copy::CopyOutcome;
use super::preflight::{Preflight, Started};
use crate::{Error, Result, Settings};
use futures::StreamExt;
use pgstrata_pg::lsn::Lsn;
use pgstrata_repo::manifest::{Manifest, PartsWriter, Stats, WalPoint};
use pgstrata_repo::stanza::StanzaInfo;
use pgstrata_repo::{layout, Storage, FORMAT_VERSION};
use std::collections::{BTreeMap, BTreeSet};

/// What `pg_backup_stop` returned, and the WAL point it names.
pub(super) struct Stopped {
    pub point: WalPoint,
    pub backup_label: String,
    pub tablespace_map: Option<String>,
    pub databases: Vec<pgstrata_repo::manifest::Database>,
}

/// A WAL point at `time`.
pub(super) fn wal_point(
    time: chrono::DateTime<chrono::Utc>,
    lsn: Lsn,
    timeline: u32,
    wal: String,
) -> WalPoint {
    WalPoint {
        time: time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        epoch: time.timestamp(),
        lsn,
        timeline,
        wal,
    }
}

/// Everything the manifest is built from.
pub(super) struct Copied {
    /// The manifest's entries, written as parts ([`super::ordered`]).
    pub parts: PartsWriter,
    /// Pages failing their checksum in the files copied.
    pub page_errors: u64,
    pub tablespaces: Vec<pgstrata_repo::manifest::Tablespace>,
    /// The data directory's own links ([`crate::walk::Walker::links`]).
    pub links: Vec<pgstrata_repo::manifest::DataLink>,
    pub outcome: CopyOutcome,
    /// The interrupted backup whose frames were offered (resume), and their codec.
    pub resumed_from: Option<(String, pgstrata_repo::codec::CompressType)>,
}

/// Build the manifest: its header, with the parts already written.
pub(super) fn build_manifest(
    s: &Settings,
    stanza: &StanzaInfo,
    pf: &Preflight,
    started: Started,
    copied: Copied,
    stopped: Stopped,
    started_at: std::time::Instant,
) -> Result<Manifest> {
    let outcome = copied.outcome;
    let (file_count, db_size) = copied.parts.files();
    let prior = pf.prior.as_ref().map(|p| p.header());
    let mut manifest = Manifest {
        format_version: FORMAT_VERSION,
        label: pf.label.clone(),
        backup_type: pf.backup_type,
        prior: prior.map(|p| p.label.clone()),
        stanza: s.stanza.clone(),
        cluster: stanza.cluster.clone(),
        server_version_num: pf.db.version_num,
        start: wal_point(
            pf.start_time,
            started.start_lsn,
            started.timeline,
            started.start_wal,
        ),
        stop: stopped.point,
        backup_label: stopped.backup_label,
        tablespace_map: stopped.tablespace_map,
        compression: s.compression,
        frame_size: s.frame_size as u32,
        data_checksums: pf.control.data_checksums,
        tablespaces: copied.tablespaces,
        links: copied.links,
        entries: Vec::new(),
        stats: Stats {
            db_size,
            stored_size: outcome.stored,
            files: file_count,
            files_unchanged: outcome.files_unchanged,
            bytes_read: outcome.bytes_read,
            files_tracked: outcome.files_tracked,
            files_hashed: outcome.files_hashed,
            resumed: outcome.resumed,
            packs: outcome.packs,
            pages_checked: outcome.pages_checked,
            page_errors: copied.page_errors,
            duration_ms: started_at.elapsed().as_millis() as u64,
        },
        delta_reason: started.detection.delta_reason,
        databases: Some(stopped.databases),
        annotations: Default::default(),
        pack_codecs: BTreeMap::new(),
        track: started.detection.track,
        track_reason: started.detection.track_reason,
        summary_check: started.detection.summary_check,
        packs_used: None,
        parts: Vec::new(),
    };
    copied.parts.finish(&mut manifest)?;
    // Codecs of the backups whose frames this one references, and only those.
    let referenced: BTreeSet<String> = referenced_packs(&manifest)
        .into_iter()
        .map(|(owner, _)| owner)
        .collect();
    if let Some(p) = prior {
        manifest.pack_codecs.extend(p.pack_codecs.clone());
        manifest
            .pack_codecs
            .insert(p.label.clone(), p.compression.kind);
    }
    if let Some((label, codec)) = copied.resumed_from {
        manifest.pack_codecs.insert(label, codec);
    }
    manifest.pack_codecs.retain(|l, _| referenced.contains(l));
    Ok(manifest)
}

/// (backup label, pack name) of every pack of another backup the manifest's files (and
/// their maps) point into.
fn referenced_packs(m: &Manifest) -> BTreeSet<(String, String)> {
    m.packs_used()
        .into_keys()
        .filter(|(owner, _)| *owner != m.label)
        .collect()
}

/// Above this many packs of one backup, [`missing_packs`] lists them instead of asking for
/// each: a listing answers for a thousand objects a request.
const LIST_PACKS_OVER: usize = 4;

/// The first of backup `owner`'s `packs` that does not exist, if any.
async fn missing_packs(
    storage: &Storage,
    stanza: &str,
    owner: &str,
    packs: Vec<String>,
) -> Result<Option<String>> {
    if packs.len() > LIST_PACKS_OVER {
        let dir = format!("{}/", layout::pack_dir(stanza, owner));
        let found: BTreeSet<String> = storage
            .list(&layout::pack_dir(stanza, owner))
            .await?
            .into_iter()
            .filter_map(|o| o.key.strip_prefix(&dir).map(str::to_string))
            .collect();
        return Ok(packs.into_iter().find(|p| !found.contains(p)));
    }
    for pack in packs {
        if !storage.exists(&layout::pack(stanza, owner, &pack)).await? {
            return Ok(Some(pack));
        }
    }
    Ok(None)
}

/// Write the manifest (its parts are written), once the prior backup and every pack of another backup it
/// references are known to still exist.
pub(super) async fn publish(storage: &Storage, m: &mut Manifest) -> Result<()> {
    let refuse = |what: String| {
        Error::refused(format!(
            "backup {} not written: {what} was deleted while the backup ran (did an expire run without the stanza lock?); run the backup again",
            m.label
        ))
    };
    if let Some(prior) = &m.prior {
        if !storage.exists(&layout::manifest(&m.stanza, prior)).await? {
            return Err(refuse(format!("its prior backup {prior}")));
        }
    }
    let mut by_owner: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (owner, pack) in referenced_packs(m) {
        by_owner.entry(owner).or_default().push(pack);
    }
    let stanza = m.stanza.clone();
    let stanza = &stanza;
    let mut checks = futures::stream::iter(by_owner)
        .map(|(owner, packs)| async move {
            let missing = missing_packs(storage, stanza, &owner, packs).await?;
            Ok::<_, Error>(missing.map(|pack| layout::pack(stanza, &owner, &pack)))
        })
        .buffer_unordered(16);
    while let Some(checked) = checks.next().await {
        if let Some(key) = checked? {
            return Err(refuse(format!("pack {key}, which it references,")));
        }
    }
    drop(checks);
    Ok(m.publish_object(storage).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pack deleted under a running backup is found both when the packs of its backup
    /// are asked for one by one and when they are listed (many of them).
    #[tokio::test]
    async fn a_missing_pack_is_found_whether_listed_or_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::local(dir.path()).unwrap();
        let names = |n: usize| (0..n).map(|k| format!("0-{k}")).collect::<Vec<_>>();
        for name in names(8) {
            let key = layout::pack("st", "L", &name);
            storage.put_new(&key, "x".into()).await.unwrap();
        }
        // Another backup's pack, whose key the listing of "L" must not take for L's.
        let other = layout::pack("st", "L2", "0-9");
        storage.put_new(&other, "x".into()).await.unwrap();
        let listed = names(LIST_PACKS_OVER + 3);
        let asked = names(LIST_PACKS_OVER - 1);
        for packs in [&listed, &asked] {
            let missing = missing_packs(&storage, "st", "L", packs.clone()).await;
            assert_eq!(missing.unwrap(), None);
        }
        let mut with_other = listed.clone();
        with_other.push("0-9".into());
        let missing = missing_packs(&storage, "st", "L", with_other).await;
        assert_eq!(missing.unwrap().as_deref(), Some("0-9"));
        storage
            .delete(&layout::pack("st", "L", "0-2"))
            .await
            .unwrap();
        for packs in [&listed, &asked] {
            let missing = missing_packs(&storage, "st", "L", packs.clone()).await;
            assert_eq!(missing.unwrap().as_deref(), Some("0-2"));
        }
    }
}
