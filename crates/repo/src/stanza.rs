//! The stanza record: which PostgreSQL cluster a stanza's backups and WAL belong to.
//! Written once by stanza-create; every command that touches the repository checks the
//! cluster it works on against it.

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
    pub cluster: ClusterIdentity,
}

impl StanzaInfo {
    pub async fn load(storage: &Storage, stanza: &str) -> Result<StanzaInfo> {
        let stored = StanzaInfo::fetch(storage, stanza).await?;
        StanzaInfo::decode(storage, stanza, stored)
    }

    /// The stanza record of `stanza` as stored (sealed, in an encrypted stanza): fetched
    /// before the stanza's key is open, beside the listing of its key files, so that a
    /// command on an object store waits one round trip for both.
    pub async fn fetch(storage: &Storage, stanza: &str) -> Result<bytes::Bytes> {
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
    pub fn decode(storage: &Storage, stanza: &str, stored: bytes::Bytes) -> Result<StanzaInfo> {
        let key = layout::stanza_info(stanza);
        let bytes = storage.open_stored(&key, stored)?;
        if storage.cipher().is_none() && crate::cipher::is_sealed(&bytes) {
            // Its key files are gone (an encrypted stanza is recognized by them).
            return Err(Error::corrupt(format!(
                "{key} is encrypted but stanza '{stanza}' has no key files under {}: without them its backups cannot be read",
                layout::keys_dir(stanza)
            )));
        }
        let info: StanzaInfo = serde_json::from_slice(&bytes).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("{key}: not a valid stanza record"),
                e,
            )
        })?;
        crate::error::check_format_version(&key, info.format_version, FORMAT_VERSION)?;
        Ok(info)
    }

    /// Whether the stanza has a record (stanza-create ran).
    pub async fn exists(storage: &Storage, stanza: &str) -> Result<bool> {
        storage.exists(&layout::stanza_info(stanza)).await
    }

    pub async fn create(storage: &Storage, info: &StanzaInfo) -> Result<()> {
        let key = layout::stanza_info(&info.stanza);
        let json = serde_json::to_vec_pretty(info).expect("serialize stanza info");
        storage.put_new(&key, json.into()).await
    }
}
