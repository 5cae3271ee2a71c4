//! A backup from a standby whose primary's data directory is not on this host
//! (`backup-standby` with no `pg-path`; what `standby-remote` runs on the standby host).
//!
//! Every relation file comes from the standby; what the primary must still provide is
//! small: its configuration files, `pg_control`, the SLRUs (`pg_xact`, `pg_multixact`,
//! ...), `PG_VERSION` and `pg_filenode.map` files. They are read through the primary's
//! database connection (`pg_ls_dir`, `pg_stat_file`, `pg_read_binary_file`: pg-user must
//! be a superuser or be granted them) into a private directory on this host, keeping their
//! sizes and modification times, and that directory is then walked as the primary's data
//! directory would be. `pg_control` is read again just before it is copied, last, as ever.
//! Tablespace links and locations come from the standby (restore remaps them as usual).

use crate::db::Db;
use crate::error::pg_err;
use crate::{Error, Result};
use pgstrata_pg::control::ControlData;
use pgstrata_pg::data_dir::{self, Disposition};
use std::path::{Path, PathBuf};

/// The primary's non-relation files, copied here; removed on drop.
pub(crate) struct PrimaryCopy {
    pub dir: PathBuf,
}

impl Drop for PrimaryCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrimaryCopy {
    /// A new private directory for the copy.
    pub(crate) fn new(label_hint: &str) -> Result<PrimaryCopy> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!(
            "pgstrata-primary-{}-{label_hint}",
            std::process::id()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        Ok(PrimaryCopy { dir })
    }
}

/// The primary's `pg_control`, read over the connection.
pub(crate) async fn read_control(db: &Db) -> Result<(Vec<u8>, ControlData)> {
    let bytes = read_file(db, "global/pg_control", 8192)
        .await?
        .ok_or_else(|| Error::refused("the primary has no global/pg_control"))?;
    let control = ControlData::parse(&bytes)?;
    Ok((bytes, control))
}

/// Write `bytes` as `rel` under `dir`, with the primary's modification time.
fn write_file(dir: &Path, rel: &str, bytes: &[u8], mtime: i64) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(rel);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    std::io::Write::write_all(&mut f, bytes)
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.max(0) as u64);
    f.set_modified(when)
        .map_err(|e| Error::io(format!("set the time of {}", path.display()), e))
}

/// One file of the primary, whole (`None` if it vanished); `size` is a hint.
async fn read_file(db: &Db, rel: &str, size: i64) -> Result<Option<Vec<u8>>> {
    // Read in pieces: a bytea over 1 GB cannot be sent, and pieces bound memory.
    const PIECE: i64 = 64 << 20;
    let mut out = Vec::with_capacity(size.max(0) as usize);
    loop {
        let row = db
            .client()
            .query_one(
                "SELECT pg_read_binary_file($1, $2, $3, true)",
                &[&rel, &(out.len() as i64), &PIECE],
            )
            .await
            .map_err(pg_err(format!(
                "read {rel} from the primary (pg-user needs pg_read_binary_file)"
            )))?;
        let Some(piece): Option<Vec<u8>> = row.get(0) else {
            return Ok(if out.is_empty() { None } else { Some(out) });
        };
        let done = (piece.len() as i64) < PIECE;
        out.extend_from_slice(&piece);
        if done {
            return Ok(Some(out));
        }
    }
}

/// Copy the primary's non-relation files into `dir`, as its data directory would be
/// walked. Returns how many files and bytes were read.
pub(crate) async fn copy_non_relation_files(db: &Db, dir: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut pending = vec![String::new()];
    while let Some(rel_dir) = pending.pop() {
        let listed = if rel_dir.is_empty() {
            "."
        } else {
            rel_dir.as_str()
        };
        let rows = db
            .client()
            .query(
                "SELECT name, s.size, extract(epoch FROM s.modification)::bigint, s.isdir \
                 FROM pg_ls_dir($1, true, false) AS name, \
                 LATERAL pg_stat_file($1 || '/' || name, true) AS s \
                 WHERE s.size IS NOT NULL",
                &[&listed],
            )
            .await
            .map_err(pg_err(format!(
                "list {listed} on the primary (pg-user needs pg_ls_dir and pg_stat_file)"
            )))?;
        for row in rows {
            let name: String = row.get(0);
            let size: i64 = row.get(1);
            let mtime: i64 = row.get(2);
            let is_dir: bool = row.get(3);
            let rel = if rel_dir.is_empty() {
                name.clone()
            } else {
                format!("{rel_dir}/{name}")
            };
            if is_dir {
                match data_dir::classify(&rel, true) {
                    Disposition::Skip => continue,
                    disposition => {
                        let path = dir.join(&rel);
                        std::fs::create_dir_all(&path)
                            .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
                        // Tablespaces: the standby's links and relation files.
                        if disposition == Disposition::Copy && rel != "pg_tblspc" {
                            pending.push(rel);
                        }
                    }
                }
                continue;
            }
            if data_dir::classify(&rel, false) == Disposition::Skip
                || data_dir::relation_file(&rel).is_some()
            {
                continue;
            }
            if let Some(content) = read_file(db, &rel, size).await? {
                write_file(dir, &rel, &content, mtime)?;
                files += 1;
                bytes += content.len() as u64;
            }
        }
    }
    Ok((files, bytes))
}

/// Read `pg_control` again (just before it is copied, last).
pub(crate) async fn refresh_control(db: &Db, dir: &Path) -> Result<()> {
    let (bytes, _) = read_control(db).await?;
    let now = chrono::Utc::now().timestamp();
    write_file(dir, "global/pg_control", &bytes, now)
}
