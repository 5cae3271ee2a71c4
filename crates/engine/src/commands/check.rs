//! `check`: is the stanza ready to take backups? Each problem is reported in plain words;
//! the command fails on the first one that makes backups impossible.

use crate::local_cluster::LocalCluster;
use crate::{open_stanza, Error, Result, Settings};

pub async fn check(s: &Settings) -> Result<()> {
    let (storage, stanza) = open_stanza(s).await?;
    storage.check_create_only(&s.stanza).await?;
    storage.check_object_lock(&s.stanza).await?;
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
    let seg_size = stanza.cluster.wal_segment_size;
    let range = crate::wal_archive::archive_range(
        &storage,
        &s.stanza,
        &stanza.cluster.archive_id(),
        seg_size,
    )
    .await?;
    let empty = crate::wal_archive::ArchivedSegments::new();
    let archived = range.as_ref().map_or(&empty, |r| &r.segments);
    for (a, b) in crate::wal_archive::archive_gaps(archived, None, seg_size) {
        log::warn!(
            "the archive has a gap: {a} .. {b} missing (dropped by archive-push-queue-max, or deleted); point-in-time recovery cannot cross it: take a full backup"
        );
    }
    if let Some(lag) = s
        .pg_path
        .as_deref()
        .and_then(|p| crate::wal_archive::archive_lag(p, archived, seg_size))
    {
        let age = lag.oldest_ready_age_secs.unwrap_or(0);
        if age > s.archive_lag_max.as_secs() {
            return Err(Error::refused(format!(
                "archiving is falling behind: {} WAL file(s) wait in pg_wal, the oldest for {age} s (archive-lag-max is {} s); see pg_stat_archiver and PostgreSQL's log",
                lag.ready,
                s.archive_lag_max.as_secs()
            )));
        }
    }
    check_receiver_slot(s, &db).await?;
    if id.in_recovery {
        log::info!("the server is a standby: skipping the WAL switch test");
        return Ok(());
    }
    let segment = db.switch_wal().await?;
    log::info!("switched WAL; waiting for {segment} to reach the archive");
    crate::wal_archive::wait_for_wal(
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

/// The state of `wal-receive`'s slot, when there is one: in use, or WAL piling up for a
/// receiver that is not running.
async fn check_receiver_slot(s: &Settings, db: &crate::db::Db) -> Result<()> {
    let slot = &s.wal_receive_slot;
    let held =
        |bytes: Option<i64>| crate::progress::human_bytes(bytes.map_or(0, |b| b.max(0) as u64));
    match db.slot_state(slot).await? {
        None => log::info!("no replication slot {slot}: wal-receive is not set up (it creates the slot when it first runs)"),
        Some((true, retained)) => log::info!(
            "replication slot {slot}: in use by wal-receive, the server keeps {} of WAL for it",
            held(retained)
        ),
        Some((false, retained)) => log::warn!(
            "replication slot {slot} is not in use: the server keeps {} of WAL for it, and more as it writes. Start wal-receive (systemctl start pgstrata-wal-receive@{}), or drop the slot if no receiver is meant to run (SELECT pg_drop_replication_slot('{slot}'))",
            held(retained),
            s.stanza
        ),
    }
    Ok(())
}
