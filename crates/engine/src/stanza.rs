//! `stanza-create`: record which cluster a stanza belongs to.

use crate::db::{Db, ServerIdentity};
use crate::{Error, Result, Settings};
use pgstrata_pg::control::ControlData;
use pgstrata_repo::stanza::{ClusterIdentity, StanzaInfo};
use pgstrata_repo::{ErrorKind as RepoErrorKind, Storage, FORMAT_VERSION};
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
                return Err(Error::refused(format!(
                    "pg-path {} holds cluster {} but stanza '{}' belongs to cluster {sysid}",
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
    let control = &local.control;
    Ok(ClusterIdentity {
        system_identifier: control.system_identifier.to_string(),
        major_version: local.db.major(),
        catalog_version: control.catalog_version,
        control_version: control.control_version,
        wal_segment_size: control.wal_segment_size as u64,
        block_size: control.block_size,
    })
}

pub enum CreateOutcome {
    Created,
    AlreadyExists,
}

pub async fn stanza_create(s: &Settings) -> Result<CreateOutcome> {
    pgstrata_repo::layout::check_stanza_name(&s.stanza)
        .map_err(|e| Error::config(e.to_string()))?;
    let cluster = cluster_identity(s).await?;
    let storage = Storage::open_or_create(&s.repo)?;
    storage.check_create_only(&s.stanza).await?;
    if StanzaInfo::exists(&storage, &s.stanza).await? {
        return existing_stanza(s, &cluster).await;
    }
    let (storage, new_key) = crate::keys::prepare_new_stanza(s, storage).await?;
    let info = StanzaInfo {
        format_version: FORMAT_VERSION,
        stanza: s.stanza.clone(),
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        cluster: cluster.clone(),
    };
    match StanzaInfo::create(&storage, &info).await {
        Ok(()) => {
            log::info!(
                "stanza '{}' created for PostgreSQL {} cluster {}",
                s.stanza,
                cluster.major_version,
                cluster.system_identifier
            );
            Ok(CreateOutcome::Created)
        }
        Err(e) if e.kind == RepoErrorKind::AlreadyExists => {
            // Created meanwhile by another stanza-create: its key, not ours.
            if let Some(k) = new_key {
                storage
                    .delete(&pgstrata_repo::layout::key_file(&s.stanza, &k.id))
                    .await?;
            }
            existing_stanza(s, &cluster).await
        }
        Err(e) => Err(e.into()),
    }
}

/// stanza-create of a stanza that exists: nothing to do when it is this cluster's, with the
/// same encryption; refused otherwise.
async fn existing_stanza(s: &Settings, cluster: &ClusterIdentity) -> Result<CreateOutcome> {
    let (storage, existing) = crate::open_stanza(s).await?;
    crate::keys::check_cipher_type(s, &storage)?;
    if existing.cluster == *cluster {
        log::info!("stanza '{}' already exists for this cluster", s.stanza);
        Ok(CreateOutcome::AlreadyExists)
    } else {
        Err(Error::refused(format!(
            "stanza '{}' in repository {} belongs to another cluster (system {} PostgreSQL {}), not this one (system {} PostgreSQL {}); \
             use another stanza name or repository",
            s.stanza,
            storage.description(),
            existing.cluster.system_identifier,
            existing.cluster.major_version,
            cluster.system_identifier,
            cluster.major_version
        )))
    }
}
