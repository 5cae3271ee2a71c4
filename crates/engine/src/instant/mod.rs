//! Instant restore: PostgreSQL starts on a restored data directory whose large relation
//! files have not arrived yet, and each block is fetched the first time it is needed.
//!
//! `restore --instant` writes every file as a restore does, except relation files of at
//! least [`DEFER_MIN`] bytes under `base/`, `global/` and the tablespaces (*deferred*
//! files). For each of those it makes a sparse *backing file* of the recorded size in the
//! instant directory beside the data directory (a tablespace's: in its location,
//! [`tablespace_store`]), and puts at the file's place in the data directory a
//! symbolic link to `<instant dir>/mnt/<id>`. A background process (`serve`) mounts a
//! FUSE filesystem on `mnt/` that shows each backing file as `<id>` and:
//!
//! - serves a read of a block that is not local by fetching the frame that holds it (one
//!   ranged read of the repository, checked against the frame's check) before PostgreSQL
//!   sees a byte; a damaged frame is an I/O error for that read, never wrong bytes;
//! - writes what PostgreSQL writes into the backing file and marks the blocks local, so a
//!   written block is never fetched (a fetch writes only blocks still not local);
//! - hydrates every other block with `process-max` workers, files that were read lately
//!   first;
//! - once every block is local, renames each backing file over its link (the same inode:
//!   what PostgreSQL opens from then on is the ordinary file) as soon as nothing has it
//!   open through the mount: until then the kernel keeps the pages read through the mount
//!   ([`fs`]'s module docs say why both cannot be), and reads of them cost no round trip.
//!   A file still open is handed over at once all the same where the kernel allows it,
//!   its pages then revalidated before each read through those opens. It detaches the mount
//!   (lazily: open files are served until closed) and exits when the last one is; after
//!   the next PostgreSQL restart nothing of pgstrata is in the way.
//!
//! Why links to a flat filesystem rather than a filesystem over the whole data directory:
//! PostgreSQL opens, reads, writes, truncates, fsyncs and unlinks relation files, and
//! does everything else (directories, renames, temporary files, the WAL) elsewhere; a
//! FUSE filesystem of plain files by number serves exactly that, and the links go away
//! file by file as each becomes an ordinary file again.
//!
//! **Crash safety.** Which blocks are local is kept in `local.bits` (a bit per 8 kB
//! block of each deferred file). A block PostgreSQL wrote (or cut off) gets its bit
//! written at once, with the write: if this process is killed, the kernel still has the
//! bytes, and PostgreSQL's crash recovery, which starts at its last checkpoint, expects
//! to find every page that checkpoint wrote (with `fsync = off` too). A fetched block gets
//! its bit only after its bytes are durable (when PostgreSQL fsyncs the file, and every
//! [`PERSIST_EVERY`]), since nothing else would rewrite it; one whose bit was lost is
//! fetched again. After a power loss, a PostgreSQL write that was never fsynced may be
//! lost with its bit kept: the block then holds what it held before, and crash recovery
//! rewrites it from the WAL, as on any disk. `restore --instant --resume --pg-path=DIR`
//! starts the process again.
//!
//! The instant directory, `<parent>/.<data directory name>.pgstrata-instant/`:
//!
//! | name | what |
//! |---|---|
//! | `state.json` | the backup label and the deferred files ([`State`]) |
//! | `local.bits` | which blocks are local |
//! | `status.json` | progress, written every second ([`Status`]) |
//! | `pid` | the serving process |
//! | `store/<id>` | the backing files |
//! | `mnt/` | the FUSE mount point |

mod fs;
mod serve;
mod served;
mod status;

pub use serve::{serve, serve_with};
pub use status::{instant_status, render_status, Status};

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Relation files smaller than this are written at once: the time they take does not grow
/// with the database's size, and each deferred file costs a link and a lookup.
pub const DEFER_MIN: u64 = 1 << 20;

/// The block size of relation files (BLCKSZ): the unit of being local.
pub const BLOCK: u64 = 8192;

/// How often local blocks' bits are made durable when PostgreSQL fsyncs nothing.
pub const PERSIST_EVERY: Duration = Duration::from_secs(2);

/// The instant directory of data directory `pg_path`.
pub fn instant_dir(pg_path: &Path) -> Result<PathBuf> {
    let name = pg_path
        .file_name()
        .ok_or_else(|| Error::config(format!("{}: no directory name", pg_path.display())))?;
    let parent = pg_path.parent().unwrap_or(Path::new("/"));
    Ok(parent.join(format!(".{}.pgstrata-instant", name.to_string_lossy())))
}

/// What `restore --instant` left for the serving process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub label: String,
    pub pg_path: PathBuf,
    pub files: Vec<DeferredFile>,
}

/// One deferred file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeferredFile {
    /// Its name in `store/` and `mnt/`.
    pub id: u32,
    /// Its path in the manifest (relative to the data directory).
    pub path: String,
    /// Its size as backed up.
    pub size: u64,
    /// The directory of its backing file when not the instant directory's `store/`: a
    /// tablespace's file is backed in its location (on its filesystem, so that the
    /// backing file can take the link's place).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<PathBuf>,
}

impl DeferredFile {
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(BLOCK)
    }

    /// Its backing file, for the instant directory `dir`.
    pub fn backing(&self, dir: &Path) -> PathBuf {
        self.store
            .clone()
            .unwrap_or_else(|| dir.join("store"))
            .join(self.id.to_string())
    }
}

/// The directory a tablespace's deferred files are backed in: in its location, beside the
/// version directory PostgreSQL uses, named after the data directory.
pub fn tablespace_store(location: &Path, pg_path: &Path) -> PathBuf {
    let name = pg_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    location.join(format!(".{name}.pgstrata-instant-store"))
}

impl State {
    pub fn read(dir: &Path) -> Result<State> {
        let path = dir.join("state.json");
        let text = std::fs::read(&path).map_err(|e| {
            Error::io(
                format!(
                    "read {} (is this data directory an instant restore's?)",
                    path.display()
                ),
                e,
            )
        })?;
        serde_json::from_slice(&text)
            .map_err(|e| Error::integrity(format!("{}: {e}", path.display())))
    }

    /// Where file `i`'s bits start in `local.bits` (a whole number of u64 words each).
    pub fn bit_offsets(&self) -> Vec<u64> {
        let mut at = 0;
        self.files
            .iter()
            .map(|f| {
                let here = at;
                at += f.blocks().div_ceil(64) * 8;
                here
            })
            .collect()
    }
}

/// Whether restore defers `f` (a relation file big enough, in the data directory itself,
/// whose extents are whole blocks).
pub fn defers(path: &str, size: u64, extents: impl Iterator<Item = u32>) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = path.split('/').collect();
    let relation = match parts.as_slice() {
        ["base", db, file] => digits(db) && is_relation_file(file),
        ["global", file] => is_relation_file(file),
        ["pg_tblspc", oid, version, db, file] => {
            digits(oid) && version.starts_with("PG_") && digits(db) && is_relation_file(file)
        }
        _ => false,
    };
    if !relation || size < DEFER_MIN {
        return false;
    }
    let raws: Vec<u32> = extents.collect();
    raws.iter()
        .take(raws.len().saturating_sub(1))
        .all(|r| (*r as u64).is_multiple_of(BLOCK))
}

/// `16384`, `16384.1`, `16384_fsm`, `16384_vm.2`: a relation fork's segment file.
fn is_relation_file(name: &str) -> bool {
    let (base, seg) = name.split_once('.').unwrap_or((name, "0"));
    let (num, fork) = base.split_once('_').unwrap_or((base, "main"));
    !num.is_empty()
        && num.bytes().all(|b| b.is_ascii_digit())
        && matches!(fork, "main" | "fsm" | "vm" | "init")
        && !seg.is_empty()
        && seg.bytes().all(|b| b.is_ascii_digit())
}

/// The deferred files of a restore being written (shared by its workers).
pub struct Deferring {
    pub dir: PathBuf,
    pub pg_path: PathBuf,
    next_id: AtomicU32,
    files: Mutex<Vec<DeferredFile>>,
}

impl Deferring {
    /// Prepare the instant directory of `pg_path` (empty or absent), on the data
    /// directory's filesystem (backing files are renamed over their links at the end).
    pub fn prepare(pg_path: &Path) -> Result<Deferring> {
        use std::os::unix::fs::MetadataExt;
        let dir = instant_dir(pg_path)?;
        if dir.exists() {
            return Err(Error::refused(format!(
                "{} exists: an instant restore of {} is under way or was interrupted (resume it with restore --instant --resume, or remove that directory and the data directory to start again)",
                dir.display(),
                pg_path.display()
            )));
        }
        let parent = dir.parent().expect("a parent");
        let dev = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.dev())
                .map_err(|e| Error::io(format!("stat {}", p.display()), e))
        };
        if dev(parent)? != dev(pg_path)? {
            return Err(Error::config(format!(
                "restore --instant keeps its files in {}, which must be on the filesystem of {} (its backing files become the data directory's files): the data directory is a mount point",
                parent.display(),
                pg_path.display()
            )));
        }
        for sub in ["store", "mnt"] {
            pgstrata_repo::private_dir::create(&dir.join(sub), "the instant restore directory")?;
        }
        Ok(Deferring {
            dir,
            pg_path: pg_path.to_path_buf(),
            next_id: AtomicU32::new(0),
            files: Mutex::new(Vec::new()),
        })
    }

    /// Create the backing file of `path` (`size` bytes, sparse), in `store` when given
    /// (a tablespace's: [`tablespace_store`]), and return it with the link target to put at
    /// the file's place.
    pub fn add(
        &self,
        path: &str,
        size: u64,
        store: Option<PathBuf>,
    ) -> Result<(std::fs::File, PathBuf)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(dir) = &store {
            pgstrata_repo::private_dir::create(dir, "the instant restore directory")?;
        }
        let deferred = DeferredFile {
            id,
            path: path.to_string(),
            size,
            store,
        };
        let backing = deferred.backing(&self.dir);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&backing)
            .map_err(|e| Error::io(format!("create {}", backing.display()), e))?;
        file.set_len(size)
            .map_err(|e| Error::io(format!("extend {}", backing.display()), e))?;
        self.files.lock().expect("deferred files").push(deferred);
        Ok((file, self.dir.join("mnt").join(id.to_string())))
    }

    /// Write `state.json` and an empty `local.bits` (durably: the restore's last steps
    /// follow).
    pub fn finish(&self, label: &str, pg_path: &Path) -> Result<State> {
        let mut files = std::mem::take(&mut *self.files.lock().expect("deferred files"));
        files.sort_by_key(|f| f.id);
        let state = State {
            label: label.to_string(),
            pg_path: pg_path.to_path_buf(),
            files,
        };
        let bits: u64 = state
            .files
            .iter()
            .map(|f| f.blocks().div_ceil(64) * 8)
            .sum();
        let write = |name: &str, f: &dyn Fn(&std::fs::File) -> std::io::Result<()>| {
            let path = self.dir.join(name);
            std::fs::File::create(&path)
                .and_then(|fh| f(&fh).and_then(|()| fh.sync_all()))
                .map_err(|e| Error::io(format!("write {}", path.display()), e))
        };
        write("local.bits", &|fh| fh.set_len(bits))?;
        let json = serde_json::to_vec_pretty(&state).expect("state serializes");
        write("state.json", &|mut fh| {
            std::io::Write::write_all(&mut fh, &json)
        })?;
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_large_relation_files_of_whole_blocks_are_deferred() {
        let blocks = |n: u32| std::iter::repeat_n(8192 * 128, n as usize);
        assert!(defers("base/5/16384", 4 << 20, blocks(4)));
        assert!(defers("base/5/16384.1", 4 << 20, blocks(4)));
        assert!(defers("base/5/16384_fsm", 4 << 20, blocks(4)));
        assert!(defers("global/1260", 4 << 20, blocks(4)));
        assert!(!defers("base/5/16384", 64 << 10, blocks(1)), "small");
        assert!(!defers("base/5/pg_filenode.map", 4 << 20, blocks(4)));
        assert!(!defers("base/5/PG_VERSION", 4 << 20, blocks(4)));
        assert!(defers(
            "pg_tblspc/16400/PG_16_1/5/16384",
            4 << 20,
            blocks(4)
        ));
        assert!(!defers(
            "pg_tblspc/16400/PG_16_1/5/pg_filenode.map",
            4 << 20,
            blocks(4)
        ));
        assert!(!defers("pg_tblspc/16400/PG_16_1/5", 4 << 20, blocks(4)));
        assert!(!defers(
            "pg_wal/000000010000000000000001",
            16 << 20,
            blocks(4)
        ));
        assert!(!defers(
            "base/5/16384",
            4 << 20,
            [4096u32, 8192].into_iter()
        ));
        assert!(defers("base/5/16384", 4 << 20, [8192u32, 4096].into_iter()));
    }
}
