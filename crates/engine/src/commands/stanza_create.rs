//! `stanza-create`: record which cluster a stanza belongs to.

use crate::local_cluster::cluster_identity;
use crate::{open_stanza, Error, Result, Settings};
use pgstrata_repo::stanza::{ClusterIdentity, StanzaInfo};
use pgstrata_repo::ErrorKind as RepoErrorKind;

pub enum CreateOutcome {
    Created,
    AlreadyExists,
}

pub async fn stanza_create(s: &Settings) -> Result<CreateOutcome> {
    pgstrata_repo::layout::check_stanza_name(&s.stanza)
        .map_err(|e| Error::config(e.to_string()))?;
    let cluster = cluster_identity(s).await?;
    let storage = s.storage_or_create()?;
    storage.check_create_only(&s.stanza).await?;
    storage.check_object_lock(&s.stanza).await?;
    if StanzaInfo::exists(&storage, &s.stanza).await? {
        return existing_stanza(s, &cluster).await;
    }
    let (storage, new_key) = crate::encryption::prepare_new_stanza(s, storage).await?;
    let info = StanzaInfo::new(&s.stanza, cluster.clone());
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
    let (storage, existing) = open_stanza(s).await?;
    crate::encryption::check_cipher_type(s, &storage)?;
    if existing.cluster == *cluster {
        log::info!("stanza '{}' already exists for this cluster", s.stanza);
        Ok(CreateOutcome::AlreadyExists)
    } else {
        Err(Error::refused(format!(
            "stanza '{}' in repository {} belongs to another cluster (system {} PostgreSQL {}), not this one (system {} PostgreSQL {}); \
             use another stanza name or repository (after pg_upgrade: stanza-upgrade)",
            s.stanza,
            storage.description(),
            existing.cluster.system_identifier,
            existing.cluster.major_version,
            cluster.system_identifier,
            cluster.major_version
        )))
    }
}
