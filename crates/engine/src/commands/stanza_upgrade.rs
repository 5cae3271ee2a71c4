//! `stanza-upgrade`: after `pg_upgrade`, make the stanza the new cluster's.
//!
//! `pg_upgrade` makes a new cluster: a new system identifier and major version, and WAL
//! whose names start over. Until the stanza knows it, archive-push and backup refuse the
//! new cluster (its WAL would land in the old cluster's archive, under names that are
//! already there). stanza-upgrade adds the stanza's next upgrade record (§5a of the
//! format): from then on the new cluster archives under its own archive id, and the next
//! backup is full. The old cluster's backups and WAL stay and restore as before, with the
//! old major's binaries; retention counts them with the new ones.
//!
//! It reads only `pg_control` at pg-path, so it runs with the new cluster stopped (before
//! its first start, as the upgrade guide says) or running.

use crate::{open_stanza, Error, Result, Settings};
use pgstrata_pg::control::ControlData;
use pgstrata_repo::ErrorKind as RepoErrorKind;

/// What stanza-upgrade did.
pub enum UpgradeOutcome {
    /// The stanza now belongs to the cluster at pg-path (`from` and `to` archive ids).
    Upgraded { from: String, to: String },
    /// It already did (an upgrade ran before): nothing was written.
    AlreadyCurrent,
}

pub async fn stanza_upgrade(s: &Settings) -> Result<UpgradeOutcome> {
    let pg_path = s.pg_path()?;
    let control = ControlData::read(pg_path)?;
    let cluster = crate::local_cluster::identity_of(&control, control.major_version()?);
    let (storage, info) = open_stanza(s).await?;
    if info.cluster == cluster {
        log::info!(
            "stanza '{}' already belongs to the cluster at {} (archive id {}): nothing to upgrade",
            s.stanza,
            pg_path.display(),
            cluster.archive_id()
        );
        return Ok(UpgradeOutcome::AlreadyCurrent);
    }
    if let Some(n) = info
        .history
        .iter()
        .position(|c| c.system_identifier == cluster.system_identifier)
    {
        return Err(Error::refused(format!(
            "pg-path {} holds cluster {} (PostgreSQL {}), which stanza '{}' belonged to before (its cluster {} of {}); it belongs to cluster {} (PostgreSQL {}) now: check pg-path, which must name the upgraded cluster",
            pg_path.display(),
            cluster.system_identifier,
            cluster.major_version,
            s.stanza,
            n + 1,
            info.history.len(),
            info.cluster.system_identifier,
            info.cluster.major_version
        )));
    }
    if cluster.major_version < info.cluster.major_version {
        return Err(Error::refused(format!(
            "pg-path {} is PostgreSQL {} but stanza '{}' belongs to a PostgreSQL {} cluster: stanza-upgrade moves a stanza to a newer major (or the same, re-initialized), never an older one",
            pg_path.display(),
            cluster.major_version,
            s.stanza,
            info.cluster.major_version
        )));
    }
    match info.upgrade(&storage, &cluster).await {
        Ok(record) => {
            log::info!(
                "stanza '{}' upgraded: PostgreSQL {} cluster {} -> PostgreSQL {} cluster {} (archive id {}, record {}); its next backup is full",
                s.stanza,
                info.cluster.major_version,
                info.cluster.system_identifier,
                cluster.major_version,
                cluster.system_identifier,
                cluster.archive_id(),
                record.number
            );
            Ok(UpgradeOutcome::Upgraded {
                from: info.cluster.archive_id(),
                to: cluster.archive_id(),
            })
        }
        Err(e) if e.kind == RepoErrorKind::AlreadyExists => {
            // Another stanza-upgrade wrote that record meanwhile: fine if it was for this cluster.
            let (_, now) = open_stanza(s).await?;
            if now.cluster == cluster {
                Ok(UpgradeOutcome::AlreadyCurrent)
            } else {
                Err(Error::refused(format!(
                    "stanza '{}' was upgraded meanwhile to cluster {}, not the one at {}: nothing was written",
                    s.stanza,
                    now.cluster.archive_id(),
                    pg_path.display()
                )))
            }
        }
        Err(e) => Err(e.into()),
    }
}
