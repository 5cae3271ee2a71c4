//! The local cluster: the data directory at `pg-path` and the server the connection
//! settings reach, proven to be one and the same (what backup, check and stanza-create
//! start from).

use crate::db::{Db, ServerIdentity};
use crate::{Error, Result, Settings};
use pgstrata_pg::control::ControlData;
use pgstrata_repo::stanza::{ClusterIdentity, StanzaInfo};
use std::path::PathBuf;

/// The cluster at `pg-path` and the server the connection settings reach, proven to be one
/// and the same.
pub(crate) struct LocalCluster {
    pub pg_path: PathBuf,
    pub control: ControlData,
    pub db: Db,
    pub id: ServerIdentity,
}

impl LocalCluster {
    /// Read pg_control, and with `stanza` check it is the stanza's cluster before
    /// connecting; then connect and check the server is that cluster, of that major.
    pub(crate) async fn connect(s: &Settings, stanza: Option<&StanzaInfo>) -> Result<LocalCluster> {
        let pg_path = s.pg_path()?.to_path_buf();
        let control = ControlData::read(&pg_path)?;
        if let Some(stanza) = stanza {
            let sysid = &stanza.cluster.system_identifier;
            if control.system_identifier.to_string() != *sysid {
                let hint = if stanza
                    .cluster_with_sysid(&control.system_identifier.to_string())
                    .is_some()
                {
                    " (a cluster the stanza belonged to before a stanza-upgrade)"
                } else {
                    " (after pg_upgrade, run stanza-upgrade first)"
                };
                return Err(Error::refused(format!(
                    "pg-path {} holds cluster {} but stanza '{}' belongs to cluster {sysid}{hint}",
                    pg_path.display(),
                    control.system_identifier,
                    s.stanza
                )));
            }
        }
        let db = Db::connect(s).await?;
        let id = db.identity().await?;
        if id.system_identifier != control.system_identifier {
            return Err(Error::refused(format!(
                "pg-path {} holds cluster {} but the server at {} is cluster {}: pg-path and the connection settings point at different clusters",
                pg_path.display(),
                control.system_identifier,
                db.target(),
                id.system_identifier
            )));
        }
        let major = control.major_version()?;
        if major != db.major() {
            return Err(Error::refused(format!(
                "pg-path {} is PostgreSQL {major} but the server is {}",
                pg_path.display(),
                db.major()
            )));
        }
        Ok(LocalCluster {
            pg_path,
            control,
            db,
            id,
        })
    }
}

/// Read the cluster's identity from pg_control and confirm it over the connection.
pub(crate) async fn cluster_identity(s: &Settings) -> Result<ClusterIdentity> {
    let local = LocalCluster::connect(s, None).await?;
    Ok(identity_of(&local.control, local.db.major()))
}

/// The identity of the cluster whose pg_control is `control`, of major `major`.
pub(crate) fn identity_of(control: &ControlData, major: u32) -> ClusterIdentity {
    ClusterIdentity {
        system_identifier: control.system_identifier.to_string(),
        major_version: major,
        catalog_version: control.catalog_version,
        control_version: control.control_version,
        wal_segment_size: control.wal_segment_size as u64,
        block_size: control.block_size,
    }
}
