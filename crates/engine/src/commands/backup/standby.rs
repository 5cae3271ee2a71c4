//! Backups from a standby (`backup-standby`): the primary does not pay the reading.
//!
//! `pg_backup_start` and `pg_backup_stop` still run on the primary: the backup's start
//! checkpoint, `backup_label` and stop LSN are the primary's, and so is the WAL that makes
//! the copy consistent. Before copying, pgstrata waits until the standby has replayed past
//! the start LSN and has made a restartpoint there (`CHECKPOINT` on the standby: replayed
//! changes reach its files only at restartpoints); from then on every relation file on the
//! standby holds at least what the primary's held at the start, and anything newer is replayed from the WAL at restore,
//! exactly as for pages the primary changes while it is copied (full-page writes are on
//! during a backup, and the standby's pages come from the primary's WAL). Every relation
//! file (`base/`, `global/`, tablespaces) is read from the standby, and only what the
//! standby cannot provide from the primary: configuration files, `pg_control` (copied last
//! as ever), and the other small non-relation files.
//!
//! The standby must be this primary's: same system identifier, streaming from it now,
//! on the same timeline. One that falls behind by more than `archive-timeout` fails the
//! backup with how far it got.

use crate::db::Db;
use crate::walk::{Walk, WalkedFile};
use crate::{Error, ErrorKind, Result, Settings, StandbySource};
use pgstrata_pg::control::ControlData;
use pgstrata_pg::data_dir;
use pgstrata_pg::lsn::Lsn;
use std::time::{Duration, Instant};

/// A standby checked to replicate the primary, with its connection.
pub(crate) struct Standby {
    pub source: StandbySource,
    db: Db,
}

/// Connect to the standby `s.standby` names and check it replicates the primary whose
/// `pg_control` is `primary`.
pub(crate) async fn connect(s: &Settings, primary: &ControlData) -> Result<Option<Standby>> {
    let Some(source) = s.standby.clone() else {
        return Ok(None);
    };
    let control = ControlData::read(&source.path)?;
    if control.system_identifier != primary.system_identifier {
        return Err(Error::refused(format!(
            "standby-path {} holds cluster {}, not the primary's cluster {}",
            source.path.display(),
            control.system_identifier,
            primary.system_identifier
        )));
    }
    let mut via = s.clone();
    via.pg_host = Some(source.host.clone());
    via.pg_port = source.port;
    via.pg_path = Some(source.path.clone());
    let db = Db::connect(&via).await?;
    let id = db.identity().await?;
    if id.system_identifier != primary.system_identifier {
        return Err(Error::refused(format!(
            "the standby at {} is cluster {}, not the primary's cluster {}",
            db.target(),
            id.system_identifier,
            primary.system_identifier
        )));
    }
    if !id.in_recovery {
        return Err(Error::refused(format!(
            "backup-standby: the server at {} is not a standby (it is not in recovery)",
            db.target()
        )));
    }
    let standby = Standby { source, db };
    standby.receiver().await?;
    Ok(Some(standby))
}

impl Standby {
    /// The WAL receiver's state: it must be streaming. Returns its timeline.
    async fn receiver(&self) -> Result<u32> {
        let row = self
            .db
            .client()
            .query_opt("SELECT status, received_tli FROM pg_stat_wal_receiver", &[])
            .await
            .map_err(crate::error::pg_err("query the standby's WAL receiver"))?;
        match row {
            Some(r) if r.get::<_, Option<String>>(0).as_deref() == Some("streaming") => {
                Ok(r.get::<_, Option<i32>>(1).unwrap_or(0) as u32)
            }
            Some(r) => Err(Error::refused(format!(
                "backup-standby: the standby at {} is not streaming from the primary (its WAL receiver is {})",
                self.db.target(),
                r.get::<_, Option<String>>(0).unwrap_or_else(|| "stopped".into())
            ))),
            None => Err(Error::refused(format!(
                "backup-standby: the standby at {} is not streaming from the primary (no WAL receiver: is primary_conninfo set?)",
                self.db.target()
            ))),
        }
    }

    /// Wait until the standby has replayed past `start_lsn` on `timeline`.
    pub(crate) async fn wait_for_replay(
        &self,
        start_lsn: Lsn,
        timeline: u32,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let started = Instant::now();
        loop {
            let tli = self.receiver().await?;
            if tli != 0 && tli != timeline {
                return Err(Error::refused(format!(
                    "backup-standby: the standby at {} streams timeline {tli}, the primary is on timeline {timeline}",
                    self.db.target()
                )));
            }
            let row = self
                .db
                .client()
                .query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
                .await
                .map_err(crate::error::pg_err("query the standby's replay position"))?;
            let replayed: Option<String> = row.get(0);
            let replayed = crate::db::server_lsn(replayed.as_deref().unwrap_or("0/0"))?;
            if replayed >= start_lsn {
                // Replayed is not written: the standby's files hold what its last
                // restartpoint flushed. A restartpoint at (or after) the primary's start
                // checkpoint makes every change up to the start durable in its files.
                let redo = self.restartpoint().await?;
                if redo >= start_lsn {
                    log::info!(
                        "standby at {} replayed to {replayed} and made a restartpoint at {redo}, past the backup's start {start_lsn} (waited {:.1}s): reading relation files from {}",
                        self.db.target(),
                        started.elapsed().as_secs_f64(),
                        self.source.path.display()
                    );
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "backup-standby: the standby at {} has replayed only to {replayed} (and restarted at an earlier point), behind the backup's start {start_lsn}, after {}s (archive-timeout): is it lagging or disconnected?",
                        self.db.target(),
                        timeout.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Standby {
    /// Ask the standby for a restartpoint (`CHECKPOINT` on a standby) and return the redo
    /// point of its newest one.
    async fn restartpoint(&self) -> Result<Lsn> {
        self.db
            .client()
            .batch_execute("CHECKPOINT")
            .await
            .map_err(crate::error::pg_err(
                "CHECKPOINT on the standby (pg-user needs to be a superuser or have pg_checkpoint)",
            ))?;
        let row = self
            .db
            .client()
            .query_one("SELECT redo_lsn::text FROM pg_control_checkpoint()", &[])
            .await
            .map_err(crate::error::pg_err("read the standby's restartpoint"))?;
        crate::db::server_lsn(row.get(0))
    }
}

/// What a backup from a standby copies: the primary's walk, with every relation file
/// taken from the standby's walk instead (relation files only the primary has were
/// created after the point the standby replayed, and the WAL creates them at restore).
/// `tablespaces_from_standby`: the primary's side was read over its connection and has
/// no tablespace links; the standby's links, directories and locations stand for them.
pub(crate) fn merge_walks(primary: Walk, standby: Walk, tablespaces_from_standby: bool) -> Walk {
    let is_relation = |f: &WalkedFile| data_dir::relation_file(&f.rel).is_some();
    let in_tablespace = |rel: &str| rel.starts_with("pg_tblspc/");
    let mut files: Vec<WalkedFile> = primary
        .files
        .into_iter()
        .filter(|f| !(is_relation(f) || (tablespaces_from_standby && in_tablespace(&f.rel))))
        .collect();
    files.extend(standby.files.into_iter().filter(is_relation));
    let mut items = primary.items;
    if tablespaces_from_standby {
        items.retain(|i| !in_tablespace(&i.rel));
        items.extend(standby.items.into_iter().filter(|i| in_tablespace(&i.rel)));
    }
    Walk {
        items,
        files,
        links: primary.links,
        tablespaces: if tablespaces_from_standby {
            standby.tablespaces
        } else {
            primary.tablespaces
        },
    }
}
