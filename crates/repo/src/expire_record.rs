//! Expire records: what each expire removed, kept in the repository.
//!
//! Nothing in a repository otherwise tells a backup that expire removed from one an
//! attacker deleted (or one that never existed). Before it deletes anything, expire writes
//! one record, create-only, naming the backups it removes and the WAL segments it deletes;
//! `info`, `verify` and `backup` read them all to tell a backup or segment that was expired
//! from one that vanished. In an encrypted stanza a record is sealed under its own name, so
//! one an attacker forged, or copied from another name or stanza, fails to open and is
//! refused (reported, never believed). In a stanza without encryption records cannot be
//! authenticated: whoever can write to the repository can write one (docs: "Ransomware").

use crate::{layout, Result, Storage};
use serde::{Deserialize, Serialize};

/// One expire's removals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpireRecord {
    /// The record's own name (`<unique>` of its key): a record stored under another name
    /// is refused.
    pub name: String,
    pub stanza: String,
    /// When expire wrote it (RFC 3339, UTC).
    pub time: String,
    /// Labels of the backups removed.
    pub backups: Vec<String>,
    /// WAL removed, as ranges `[first, last]` of segment names on one timeline (both
    /// included), per archive id.
    pub wal: Vec<WalRange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalRange {
    pub archive_id: String,
    pub first: String,
    pub last: String,
}

impl WalRange {
    /// Whether segment `name` of `archive_id` is in the range (segment names of one
    /// timeline sort as their numbers).
    pub fn contains(&self, archive_id: &str, name: &str) -> bool {
        let segment = &name[..name.len().min(24)];
        self.archive_id == archive_id
            && segment.len() == 24
            && segment[..8] == self.first[..8]
            && (self.first.as_str()..=self.last.as_str()).contains(&segment)
    }
}

/// Every record of a stanza, and the names of those refused (forged, replayed under
/// another name, damaged).
#[derive(Debug, Default)]
pub struct ExpireRecords {
    pub records: Vec<ExpireRecord>,
    pub refused: Vec<String>,
}

impl ExpireRecords {
    pub fn expired_backup(&self, label: &str) -> bool {
        self.records
            .iter()
            .any(|r| r.backups.iter().any(|b| b == label))
    }

    pub fn expired_wal(&self, archive_id: &str, segment: &str) -> bool {
        self.records
            .iter()
            .flat_map(|r| &r.wal)
            .any(|w| w.contains(archive_id, segment))
    }
}

impl ExpireRecord {
    /// A record of `backups` and `wal` removed from `stanza` at `time`, with a new name.
    pub fn new(
        stanza: &str,
        time: String,
        backups: Vec<String>,
        wal: Vec<WalRange>,
    ) -> ExpireRecord {
        ExpireRecord {
            name: layout::unique_name(),
            stanza: stanza.to_string(),
            time,
            backups,
            wal,
        }
    }

    /// Store it (create-only; sealed under its name in an encrypted stanza).
    pub async fn write(&self, storage: &Storage) -> Result<()> {
        let key = layout::expire_record(&self.stanza, &self.name);
        let json = serde_json::to_vec(self).expect("an expire record serializes");
        storage.put_new(&key, json.into()).await
    }

    /// Every record of `stanza`. A record that fails to open or parse, or whose content
    /// names another record or stanza, is refused: named in `refused`, not believed.
    pub async fn load_all(storage: &Storage, stanza: &str) -> Result<ExpireRecords> {
        let (records, refused) = crate::records::load_records(
            storage,
            &layout::expire_records_dir(stanza),
            "expire record",
            |r: &ExpireRecord, key| {
                Some(r.name.as_str()) == crate::records::record_name(key) && r.stanza == stanza
            },
        )
        .await?;
        Ok(ExpireRecords { records, refused })
    }
}
