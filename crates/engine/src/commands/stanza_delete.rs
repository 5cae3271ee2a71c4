//! `stanza-delete`: remove a stanza and everything it holds from one repository.
//!
//! The one command that deletes backups outside retention, so it asks for `--force`, and
//! refuses while the cluster runs on this host (`postmaster.pid` in `pg-path`): its
//! archive_command would go on writing WAL into a stanza being removed, and a new
//! stanza-create would then find objects of the old one. It holds the stanza lock, so no
//! backup, expire or copy runs meanwhile. The record goes first (the stanza then no
//! longer exists: archive-push and backup fail instead of writing into it), then the
//! manifests (the backups disappear whole), then the rest, key files last. An immutable
//! repository refuses: Object Lock exists to make exactly this impossible.
//!
//! Through an append-only agent (`repo-remote`) the deletes are refused by the backup
//! host, as every delete is: run it there.

use crate::lock::with_lock;
use crate::{Error, Result, Settings};
use pgstrata_repo::layout;
use serde::Serialize;

#[derive(Debug, Default, Serialize)]
pub struct DeleteReport {
    pub stanza: String,
    pub objects_deleted: u64,
    pub bytes_deleted: u64,
}

pub async fn stanza_delete(s: &Settings, force: bool) -> Result<DeleteReport> {
    let stanza = &s.stanza;
    if !force {
        return Err(Error::config(format!(
            "stanza-delete removes every backup and all WAL of stanza '{stanza}' from repository {}: give --force to do it",
            s.repo_index
        )));
    }
    if let Some(pg) = s.pg_path.as_deref() {
        if pg.join("postmaster.pid").exists() {
            return Err(Error::refused(format!(
                "stanza '{stanza}': the cluster at {} is running (postmaster.pid): stop it first, or its archive_command goes on writing into the stanza being deleted",
                pg.display()
            )));
        }
    }
    let storage = s.storage()?;
    if storage.object_lock().is_some() {
        return Err(Error::refused(format!(
            "stanza '{stanza}' is in an immutable repository (repo-s3-object-lock): its objects cannot be deleted before their retention has passed; expire removes backups as retention allows"
        )));
    }
    if !storage.exists(&layout::stanza_info(stanza)).await? {
        return Err(Error::config(format!(
            "stanza '{stanza}' does not exist in {}: nothing was deleted",
            storage.description()
        )));
    }
    let work = async {
        let objects = storage.list(&format!("{stanza}/")).await?;
        let lock = layout::lock(stanza);
        let keys = format!("{}/", layout::keys_dir(stanza));
        let rank = |key: &str| match key {
            k if k == layout::stanza_info(stanza) => 0,
            k if k.ends_with("/backup.manifest") => 1,
            k if k.starts_with(&keys) => 3,
            _ => 2,
        };
        let mut report = DeleteReport {
            stanza: stanza.clone(),
            ..Default::default()
        };
        for step in 0..=3 {
            let batch: Vec<String> = objects
                .iter()
                .filter(|o| o.key != lock && rank(&o.key) == step)
                .map(|o| o.key.clone())
                .collect();
            storage.delete_many(&batch).await?;
            report.objects_deleted += batch.len() as u64;
        }
        report.bytes_deleted = objects
            .iter()
            .filter(|o| o.key != lock)
            .map(|o| o.size)
            .sum();
        Ok(report)
    };
    let report = with_lock(&storage, stanza, &s.lock_path, "stanza-delete", work).await?;
    crate::vanished::forget(s, &storage);
    log::info!(
        "stanza '{stanza}' deleted from {}: {} object(s)",
        storage.description(),
        report.objects_deleted
    );
    Ok(report)
}

pub fn render_text(r: &DeleteReport) -> String {
    format!(
        "stanza '{}' deleted: {} object(s), {} bytes\n",
        r.stanza, r.objects_deleted, r.bytes_deleted
    )
}
