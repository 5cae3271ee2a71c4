//! The stanza record: which PostgreSQL cluster a stanza's backups and WAL belong to.
//! Written once by stanza-create; every command that touches the repository checks the
//! cluster it works on against it.
//!
//! `pg_upgrade` makes a new cluster (a new system identifier, a new major version), whose
//! WAL names start over. `stanza-upgrade` does not rewrite the record (objects are written
//! once; an immutable repository could not): it adds an upgrade record,
//! `upgrades/<n>.json`, naming the stanza's n-th cluster. The newest is the cluster the
//! stanza belongs to now; the older ones keep their backups and their WAL archive (each
//! cluster's own archive id), which restore as before.

use crate::{layout, Error, ErrorKind, Result, Storage, FORMAT_VERSION};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterIdentity {
    /// pg_control's system identifier, as a decimal string (it does not fit a JSON double).
    pub system_identifier: String,
    pub major_version: u32,
    pub catalog_version: u32,
    pub control_version: u32,
    pub wal_segment_size: u64,
    pub block_size: u32,
}

impl ClusterIdentity {
    /// Name of this cluster's WAL archive directory: WAL names restart with every new
    /// cluster (initdb, pg_upgrade), so the archive is kept per system identity.
    pub fn archive_id(&self) -> String {
        format!("{}-{}", self.major_version, self.system_identifier)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StanzaInfo {
    pub format_version: u32,
    pub stanza: String,
    pub created: String,
    /// The cluster the stanza belongs to now: the newest upgrade record's, or the stanza
    /// record's own when it was never upgraded (what `stanza.json` stores is always the
    /// first).
    pub cluster: ClusterIdentity,
    /// Every cluster the stanza has belonged to, oldest first; the last is `cluster`.
    #[serde(skip)]
    pub history: Vec<ClusterIdentity>,
}

/// One stanza-upgrade: from it on, the stanza belongs to `cluster`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StanzaUpgrade {
    pub format_version: u32,
    pub stanza: String,
    /// Which of the stanza's clusters this is: 2 for the first upgrade (the stanza record
    /// names the first). Also the record's name, which a reader checks.
    pub number: u32,
    /// When stanza-upgrade wrote it (RFC 3339).
    pub upgraded: String,
    pub cluster: ClusterIdentity,
}

/// A stanza's records as stored (sealed, in an encrypted stanza): the stanza record and
/// its upgrade records with their keys.
pub struct StoredStanza {
    record: bytes::Bytes,
    upgrades: Vec<(String, bytes::Bytes)>,
}

impl StanzaInfo {
    /// A new stanza's record, for `cluster`.
    pub fn new(stanza: &str, cluster: ClusterIdentity) -> StanzaInfo {
        StanzaInfo {
            format_version: FORMAT_VERSION,
            stanza: stanza.to_string(),
            created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            history: vec![cluster.clone()],
            cluster,
        }
    }

    pub async fn load(storage: &Storage, stanza: &str) -> Result<StanzaInfo> {
        let stored = StanzaInfo::fetch(storage, stanza).await?;
        StanzaInfo::decode(storage, stanza, stored)
    }

    /// The cluster whose WAL archive is `archive_id`, if the stanza ever belonged to it.
    pub fn cluster_of(&self, archive_id: &str) -> Option<&ClusterIdentity> {
        self.history.iter().find(|c| c.archive_id() == archive_id)
    }

    /// The cluster with system identifier `sysid`, if the stanza ever belonged to it.
    pub fn cluster_with_sysid(&self, sysid: &str) -> Option<&ClusterIdentity> {
        self.history.iter().find(|c| c.system_identifier == sysid)
    }

    /// The stanza's records as stored, fetched before the stanza's key is open (beside the
    /// listing of its key files, so that a command on an object store waits one round
    /// trip for all).
    pub async fn fetch(storage: &Storage, stanza: &str) -> Result<StoredStanza> {
        let (record, upgrades) = tokio::join!(
            StanzaInfo::fetch_record(storage, stanza),
            StanzaInfo::fetch_upgrades(storage, stanza)
        );
        Ok(StoredStanza {
            record: record?,
            upgrades: upgrades?,
        })
    }

    async fn fetch_upgrades(
        storage: &Storage,
        stanza: &str,
    ) -> Result<Vec<(String, bytes::Bytes)>> {
        let prefix = format!("{}/", layout::stanza_upgrades_dir(stanza));
        let mut out = Vec::new();
        for o in storage.list(&prefix).await? {
            let bytes = storage.get_unsealed(&o.key).await?;
            out.push((o.key, bytes));
        }
        Ok(out)
    }

    async fn fetch_record(storage: &Storage, stanza: &str) -> Result<bytes::Bytes> {
        let key = layout::stanza_info(stanza);
        storage.get_unsealed(&key).await.map_err(|e| {
            if e.is_not_found() {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "stanza '{stanza}' does not exist in repository {} (run stanza-create first, or check the stanza name)",
                        storage.description()
                    ),
                )
            } else {
                e
            }
        })
    }

    /// [`StanzaInfo::load`] of a record [`StanzaInfo::fetch`] returned, opened with
    /// `storage`'s key when the stanza is encrypted.
    pub fn decode(storage: &Storage, stanza: &str, stored: StoredStanza) -> Result<StanzaInfo> {
        let key = layout::stanza_info(stanza);
        let bytes = storage.open_stored(&key, stored.record)?;
        if storage.cipher().is_none() && crate::cipher::is_sealed(&bytes) {
            // Its key files are gone (an encrypted stanza is recognized by them).
            return Err(Error::corrupt(format!(
                "{key} is encrypted but stanza '{stanza}' has no key files under {}: without them its backups cannot be read",
                layout::keys_dir(stanza)
            )));
        }
        let mut info: StanzaInfo = serde_json::from_slice(&bytes).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("{key}: not a valid stanza record"),
                e,
            )
        })?;
        crate::error::check_format_version(&key, info.format_version, FORMAT_VERSION)?;
        info.history = vec![info.cluster.clone()];
        let mut upgrades = stored
            .upgrades
            .into_iter()
            .map(|(key, bytes)| decode_upgrade(storage, stanza, &key, bytes))
            .collect::<Result<Vec<_>>>()?;
        upgrades.sort_by_key(|u| u.number);
        for u in upgrades {
            let expected = info.history.len() as u32 + 1;
            if u.number != expected {
                return Err(Error::corrupt(format!(
                    "{}: stanza '{stanza}' has no upgrade record {expected} but has {}: the stanza's cluster history has a gap",
                    layout::stanza_upgrades_dir(stanza),
                    u.number
                )));
            }
            info.history.push(u.cluster);
        }
        info.cluster = info.history.last().expect("the record's cluster").clone();
        Ok(info)
    }

    /// Record that the stanza now belongs to `cluster` (stanza-upgrade): its next upgrade
    /// record, create-only (two upgrades at once: one fails with `AlreadyExists`).
    pub async fn upgrade(
        &self,
        storage: &Storage,
        cluster: &ClusterIdentity,
    ) -> Result<StanzaUpgrade> {
        let record = StanzaUpgrade {
            format_version: FORMAT_VERSION,
            stanza: self.stanza.clone(),
            number: self.history.len() as u32 + 1,
            upgraded: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            cluster: cluster.clone(),
        };
        let key = layout::stanza_upgrade(&self.stanza, record.number);
        let json = serde_json::to_vec_pretty(&record).expect("serialize upgrade record");
        storage.put_new(&key, json.into()).await?;
        Ok(record)
    }

    /// Whether the stanza has a record (stanza-create ran).
    pub async fn exists(storage: &Storage, stanza: &str) -> Result<bool> {
        storage.exists(&layout::stanza_info(stanza)).await
    }

    /// Write the record of a new stanza ([`StanzaInfo::new`]), create-only.
    pub async fn create(storage: &Storage, info: &StanzaInfo) -> Result<()> {
        debug_assert!(info.history.len() <= 1, "a new stanza has one cluster");
        let key = layout::stanza_info(&info.stanza);
        let json = serde_json::to_vec_pretty(info).expect("serialize stanza info");
        storage.put_new(&key, json.into()).await
    }
}

/// Upgrade record `key`, opened and checked: it names this stanza and its own number.
fn decode_upgrade(
    storage: &Storage,
    stanza: &str,
    key: &str,
    stored: bytes::Bytes,
) -> Result<StanzaUpgrade> {
    let bytes = storage.open_stored(key, stored)?;
    let u: StanzaUpgrade = serde_json::from_slice(&bytes).map_err(|e| {
        Error::with_source(
            ErrorKind::Corrupt,
            format!("{key}: not a valid upgrade record"),
            e,
        )
    })?;
    crate::error::check_format_version(key, u.format_version, FORMAT_VERSION)?;
    if u.stanza != stanza || layout::stanza_upgrade(stanza, u.number) != key {
        return Err(Error::corrupt(format!(
            "{key}: an upgrade record of stanza '{}' number {} stored under another name",
            u.stanza, u.number
        )));
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(sysid: &str, major: u32) -> ClusterIdentity {
        ClusterIdentity {
            system_identifier: sysid.into(),
            major_version: major,
            catalog_version: 1,
            control_version: 1,
            wal_segment_size: 16 << 20,
            block_size: 8192,
        }
    }

    /// Upgrades stack in order; a gap in the numbers, or a record stored under another
    /// number or stanza, is refused rather than guessed at.
    #[tokio::test]
    async fn upgrade_records_make_the_history_and_a_gap_or_misnamed_one_is_refused() {
        let storage = Storage::in_memory();
        StanzaInfo::create(&storage, &StanzaInfo::new("main", cluster("1", 15)))
            .await
            .unwrap();
        let info = StanzaInfo::load(&storage, "main").await.unwrap();
        assert_eq!(info.history, [cluster("1", 15)]);
        let second = info.upgrade(&storage, &cluster("2", 17)).await.unwrap();
        assert_eq!(second.number, 2);
        // A second upgrade from the same state loses the race: create-only.
        let raced = info.upgrade(&storage, &cluster("9", 17)).await.unwrap_err();
        assert_eq!(raced.kind, ErrorKind::AlreadyExists);
        let info = StanzaInfo::load(&storage, "main").await.unwrap();
        info.upgrade(&storage, &cluster("3", 18)).await.unwrap();
        let info = StanzaInfo::load(&storage, "main").await.unwrap();
        assert_eq!(info.cluster, cluster("3", 18));
        assert_eq!(info.history.len(), 3);
        assert_eq!(info.cluster_of("17-2"), Some(&cluster("2", 17)));
        assert_eq!(info.cluster_with_sysid("1"), Some(&cluster("1", 15)));

        // Record 2 stored as record 5: misnamed; and without 2, 3 follows a gap.
        let two = storage
            .get(&layout::stanza_upgrade("main", 2))
            .await
            .unwrap();
        storage
            .delete(&layout::stanza_upgrade("main", 2))
            .await
            .unwrap();
        storage
            .put_new(&layout::stanza_upgrade("main", 5), two.clone())
            .await
            .unwrap();
        let e = StanzaInfo::load(&storage, "main").await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(e.to_string().contains("another name"), "{e}");
        storage
            .delete(&layout::stanza_upgrade("main", 5))
            .await
            .unwrap();
        let e = StanzaInfo::load(&storage, "main").await.unwrap_err();
        assert!(e.to_string().contains("has no upgrade record 2"), "{e}");
    }
}
