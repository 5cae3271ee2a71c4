//! `check`: is the stanza ready to take backups? Each problem is reported in plain words;
//! the command fails on the first one that makes backups impossible.

use crate::stanza::LocalCluster;
use crate::{open_stanza, Error, Result, Settings};

pub async fn check(s: &Settings) -> Result<()> {
    let (storage, stanza) = open_stanza(s).await?;
    storage.check_create_only(&s.stanza).await?;
    let LocalCluster { db, id, .. } = LocalCluster::connect(s, Some(&stanza)).await?;
    if id.wal_level == "minimal" {
        return Err(Error::refused(
            "wal_level is minimal: set wal_level = replica (or logical) for backups and archiving",
        ));
    }
    if id.archive_mode == "off" {
        return Err(Error::refused(
            "archive_mode is off: set archive_mode = on and restart PostgreSQL",
        ));
    }
    if !id.archive_command.contains("archive-push") {
        return Err(Error::refused(format!(
            "archive_command is '{}': it should be 'pgstrata --stanza={} archive-push %p'",
            id.archive_command, s.stanza
        )));
    }
    if !id.archive_command.contains(&s.stanza) {
        log::warn!(
            "archive_command '{}' does not mention stanza '{}'",
            id.archive_command,
            s.stanza
        );
    }
    if id.in_recovery {
        log::info!("the server is a standby: skipping the WAL switch test");
        return Ok(());
    }
    let segment = db.switch_wal().await?;
    log::info!("switched WAL; waiting for {segment} to reach the archive");
    crate::backup::wait_for_wal(
        &storage,
        &s.stanza,
        &stanza.cluster.archive_id(),
        std::slice::from_ref(&segment),
        s.archive_timeout,
    )
    .await?;
    log::info!(
        "check passed: {segment} was archived to stanza '{}'",
        s.stanza
    );
    Ok(())
}
