//! The restore target as directory handles: every file operation of restore goes through
//! here, relative to an open directory, and never follows a symbolic link.
//!
//! Restore runs as root or as the cluster's owner, and writes into directories the cluster's
//! owner (or anyone who can write into the repository) may have prepared. Path-based calls
//! (`File::create`, `chmod`, `chown`) follow links: a `global/pg_control -> /etc/shadow`
//! link in a postgres-owned directory would turn a root `restore --delta` into a privilege
//! escalation. So:
//!
//! - the data directory and each tablespace location are opened once; a manifest path is
//!   resolved from the right one, one component at a time, with `O_NOFOLLOW | O_DIRECTORY`
//!   (manifest paths are validated before restore starts: relative, no `.`/`..`);
//! - a link, FIFO, device, directory or hard-linked file found where the backup has a file
//!   is removed and replaced; a link where the backup has a directory is removed and
//!   replaced by the directory;
//! - modes, owners and times are set on the open descriptor; a mode is at most what
//!   PostgreSQL itself gives (0700 directories and 0600 files, 0750 and 0640 where the
//!   backup recorded group access, as `initdb --allow-group-access` makes them): a
//!   manifest's modes are only checked against accidents in a plain stanza, and one
//!   forged to 0777 must not make the cluster writable by all or its files executable;
//! - the only links restore creates are `pg_tblspc/<oid>`.
//!
//! The directory handed over by the operator (`--pg-path`, a tablespace location) may itself
//! be reached through links: the operator chose it.

use crate::{Error, Result};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// An open directory and the path it was opened as (for messages).
pub(super) struct DirHandle {
    pub fd: OwnedFd,
    pub path: PathBuf,
}

impl DirHandle {
    /// Open a directory the operator named (links in its path are followed).
    pub fn open(path: &Path) -> Result<DirHandle> {
        let fd = rustix::fs::open(path, dir_flags() - OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| io_err("open directory", path, e))?;
        Ok(DirHandle {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Open `name` inside this directory, refusing a link.
    pub fn child(&self, name: &str) -> Result<DirHandle> {
        let path = self.path.join(name);
        let fd = rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty()).map_err(|e| {
            if e == Errno::LOOP || e == Errno::NOTDIR {
                Error::refused(format!(
                    "{} is not a directory (a link or a file appeared where restore made a directory)",
                    path.display()
                ))
            } else {
                io_err("open directory", &path, e)
            }
        })?;
        Ok(DirHandle { fd, path })
    }

    /// fsync the directory, so the entries made in it survive a crash.
    pub fn sync(&self) -> Result<()> {
        rustix::fs::fsync(&self.fd).map_err(|e| io_err("sync directory", &self.path, e))
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

pub(super) fn io_err(what: &str, path: &Path, e: Errno) -> Error {
    Error::io(
        format!("{what} {}", path.display()),
        std::io::Error::from(e),
    )
}

/// Create the missing directories above target `p` (`--tablespace-map-all`'s root, a
/// linked file's directory), each 0755 whatever the process's umask (027): restore runs
/// as root, and the cluster's owner must reach the target through them.
pub(crate) fn make_passable_parents(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut missing: Vec<&Path> = p.ancestors().skip(1).take_while(|a| !a.exists()).collect();
    missing.reverse();
    for dir in missing {
        std::fs::create_dir(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    }
    Ok(())
}

/// Whether directory `p` is empty or absent (a target restore may write without
/// overwriting anything).
pub(crate) fn dir_is_empty(p: &Path) -> Result<bool> {
    match std::fs::read_dir(p) {
        Ok(mut rd) => Ok(rd.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io(format!("read {}", p.display()), e)),
    }
}

/// What is at a name, without following a link.
fn kind_at(dir: BorrowedFd<'_>, name: &str) -> std::result::Result<Option<FileType>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Remove `name` in `dir` whatever it is; a directory is removed with everything in it,
/// walking through handles (a link inside is removed, never followed).
pub(super) fn remove_at(dir: BorrowedFd<'_>, name: &str) -> std::result::Result<(), Errno> {
    match kind_at(dir, name)? {
        None => Ok(()),
        Some(FileType::Directory) => {
            let sub = rustix::fs::openat(dir, name, dir_flags(), Mode::empty())?;
            for child in list(sub.as_fd())? {
                remove_at(sub.as_fd(), &child)?;
            }
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
        }
        Some(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty()),
    }
}

/// The names in a directory (without `.` and `..`).
pub(super) fn list(dir: BorrowedFd<'_>) -> std::result::Result<Vec<String>, Errno> {
    let mut names = Vec::new();
    let mut d = rustix::fs::Dir::read_from(dir)?;
    while let Some(ent) = d.read() {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(names)
}

/// Is a regular file that only this name links to (a hard link to a file elsewhere would
/// let restore write through it).
fn is_own_regular_file(fd: BorrowedFd<'_>) -> std::result::Result<bool, Errno> {
    let st = rustix::fs::fstat(fd)?;
    Ok(FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_nlink == 1)
}

/// The data directory and the tablespace locations of one restore.
pub(super) struct TargetTree {
    pub root: DirHandle,
    /// Tablespace OID -> its location, opened.
    tablespaces: HashMap<u32, DirHandle>,
    /// A data directory link restored as a link (its name at the top of the data
    /// directory) -> its target directory, opened (`links`).
    linked: HashMap<String, DirHandle>,
}

/// A manifest path split into where to start and the components below it.
struct Resolved<'a> {
    base: BorrowedFd<'a>,
    base_path: &'a Path,
    dirs: Vec<&'a str>,
    name: &'a str,
}

impl TargetTree {
    pub fn new(root: DirHandle) -> TargetTree {
        TargetTree {
            root,
            tablespaces: HashMap::new(),
            linked: HashMap::new(),
        }
    }

    /// Write the entries under `name` into `target` (a directory link restored as a link).
    pub fn add_linked_dir(&mut self, name: &str, target: DirHandle) {
        self.linked.insert(name.to_string(), target);
    }

    pub fn linked_dir(&self, name: &str) -> Option<&DirHandle> {
        self.linked.get(name)
    }

    /// The content of regular file `rel` (not through a link), with its mode and owner;
    /// `None` when there is none.
    pub fn read_file(
        &self,
        rel: &str,
        cache: &mut ParentCache,
    ) -> Result<Option<(Vec<u8>, rustix::fs::Stat)>> {
        let parent = self.parent(rel, cache)?;
        let name = base_name(rel);
        let path = parent.path.join(name);
        match kind_at(parent.fd.as_fd(), name).map_err(|e| io_err("stat", &path, e))? {
            Some(FileType::RegularFile) => {}
            _ => return Ok(None),
        }
        let fd = rustix::fs::openat(
            &parent.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("open", &path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", &path, e))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut File::from(fd), &mut bytes)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        Ok(Some((bytes, st)))
    }

    pub fn add_tablespace(&mut self, oid: u32, location: DirHandle) {
        self.tablespaces.insert(oid, location);
    }

    pub fn tablespace(&self, oid: u32) -> Option<&DirHandle> {
        self.tablespaces.get(&oid)
    }

    /// Make everything written into the targets durable: one `syncfs` per filesystem the
    /// data directory and the tablespace locations live on.
    ///
    /// Why not an fsync per file and directory: on a rotational disk a thousand fsyncs,
    /// each waiting for its own flush, cost more than writing the data. One `syncfs` lets
    /// the kernel write back in its own order and waits once. It reports write-back errors
    /// of the filesystem since Linux 5.8, as fsync does for one file. It also flushes what
    /// other processes wrote to the same filesystem, which costs time, never correctness.
    /// This is PostgreSQL's own `recovery_init_sync_method = syncfs`.
    pub fn sync_filesystems(&self) -> Result<()> {
        let mut synced = Vec::new();
        let targets = self.tablespaces.values().chain(self.linked.values());
        for dir in std::iter::once(&self.root).chain(targets) {
            let dev = rustix::fs::fstat(&dir.fd)
                .map_err(|e| io_err("stat", &dir.path, e))?
                .st_dev;
            if !synced.contains(&dev) {
                rustix::fs::syncfs(&dir.fd)
                    .map_err(|e| io_err("sync filesystem of", &dir.path, e))?;
                synced.push(dev);
            }
        }
        Ok(())
    }

    /// Where a manifest path starts: files under `pg_tblspc/<oid>/` start at the
    /// tablespace's location, under a linked directory at its target, everything else at
    /// the data directory.
    fn resolve<'a>(&'a self, rel: &'a str) -> Resolved<'a> {
        let mut parts: Vec<&str> = rel.split('/').collect();
        let name = parts.pop().unwrap_or_default();
        if let Some(target) = parts.first().and_then(|top| self.linked.get(*top)) {
            return Resolved {
                base: target.fd.as_fd(),
                base_path: &target.path,
                dirs: parts.split_off(1),
                name,
            };
        }
        if parts.len() >= 2 && parts[0] == "pg_tblspc" {
            if let Some(ts) = parts[1]
                .parse()
                .ok()
                .and_then(|oid| self.tablespaces.get(&oid))
            {
                return Resolved {
                    base: ts.fd.as_fd(),
                    base_path: &ts.path,
                    dirs: parts.split_off(2),
                    name,
                };
            }
        }
        Resolved {
            base: self.root.fd.as_fd(),
            base_path: &self.root.path,
            dirs: parts,
            name,
        }
    }

    /// Where a manifest path goes on this host (for messages and the plan).
    pub fn display_path(&self, rel: &str) -> PathBuf {
        let r = self.resolve(rel);
        let mut p = r.base_path.to_path_buf();
        for d in &r.dirs {
            p.push(d);
        }
        if !r.name.is_empty() {
            p.push(r.name);
        }
        p
    }

    /// Open the directory holding `rel` (never through a link), reusing `cache` when the
    /// previous call asked for the same directory.
    pub fn parent<'c>(&self, rel: &str, cache: &'c mut ParentCache) -> Result<&'c DirHandle> {
        let dir_rel = rel.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        if cache.key.as_deref() != Some(dir_rel) || cache.dir.is_none() {
            let r = self.resolve(rel);
            let mut cur = DirHandle {
                fd: rustix::io::dup(r.base).map_err(|e| io_err("open", r.base_path, e))?,
                path: r.base_path.to_path_buf(),
            };
            for d in &r.dirs {
                cur = cur.child(d)?;
            }
            cache.key = Some(dir_rel.to_string());
            cache.dir = Some(cur);
        }
        Ok(cache.dir.as_ref().expect("set above"))
    }

    /// Make sure `rel` is a directory (replacing a link or file there). The parent exists:
    /// directories are made in manifest order, parents first.
    pub fn ensure_dir(&self, rel: &str, cache: &mut ParentCache) -> Result<()> {
        if rel.is_empty() {
            return Ok(());
        }
        let parent = self.parent(rel, cache)?;
        let name = base_name(rel);
        let path = parent.path.join(name);
        match kind_at(parent.fd.as_fd(), name).map_err(|e| io_err("stat", &path, e))? {
            Some(FileType::Directory) => return Ok(()),
            Some(_) => {
                remove_at(parent.fd.as_fd(), name).map_err(|e| io_err("remove", &path, e))?
            }
            None => {}
        }
        rustix::fs::mkdirat(&parent.fd, name, Mode::from_raw_mode(0o700))
            .map_err(|e| io_err("create directory", &path, e))
    }

    /// Make `rel` (`pg_tblspc/<oid>`, or a link of the data directory) a link to `dest`
    /// (replacing whatever is there).
    pub fn ensure_link(&self, rel: &str, dest: &Path, cache: &mut ParentCache) -> Result<()> {
        let parent = self.parent(rel, cache)?;
        let name = base_name(rel);
        let path = parent.path.join(name);
        if let Ok(current) = rustix::fs::readlinkat(&parent.fd, name, Vec::new()) {
            if current.as_bytes() == dest.as_os_str().as_encoded_bytes() {
                return Ok(());
            }
        }
        remove_at(parent.fd.as_fd(), name).map_err(|e| io_err("remove", &path, e))?;
        rustix::fs::symlinkat(dest, &parent.fd, name).map_err(|e| {
            Error::io(
                format!("link {} -> {}", path.display(), dest.display()),
                std::io::Error::from(e),
            )
        })
    }

    /// Set a link's owner without following it.
    pub fn chown_link(&self, rel: &str, ids: (u32, u32), cache: &mut ParentCache) -> Result<()> {
        let parent = self.parent(rel, cache)?;
        let name = base_name(rel);
        rustix::fs::chownat(
            &parent.fd,
            name,
            Some(rustix::fs::Uid::from_raw(ids.0)),
            Some(rustix::fs::Gid::from_raw(ids.1)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_err("chown", &parent.path.join(name), e))
    }

    /// Open the directory `rel` itself (to set its mode and owner, or fsync it).
    pub fn open_dir(&self, rel: &str, cache: &mut ParentCache) -> Result<DirHandle> {
        if rel.is_empty() {
            return DirHandle::open(&self.root.path).and_then(|d| {
                // Re-opened by path: make sure it is still the directory we hold.
                same_file(&d.fd, &self.root.fd, &d.path)?;
                Ok(d)
            });
        }
        self.parent(rel, cache)?.child(base_name(rel))
    }

    /// Create (or truncate) the file `rel` for writing: whatever is at that name and is not
    /// a regular file of its own is removed first.
    pub fn create_file(&self, rel: &str, cache: &mut ParentCache) -> Result<File> {
        let parent = self.parent(rel, cache)?;
        let name = base_name(rel);
        let path = parent.path.join(name);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for attempt in 0..2 {
            // NONBLOCK: opening a FIFO placed here must not hang (and is then replaced).
            let opened = rustix::fs::openat(
                &parent.fd,
                name,
                flags | OFlags::NONBLOCK,
                Mode::from_raw_mode(0o600),
            );
            let fd = match opened {
                Ok(fd) if is_own_regular_file(fd.as_fd()).unwrap_or(false) => fd,
                Ok(_) | Err(Errno::LOOP | Errno::ISDIR | Errno::NXIO | Errno::TXTBSY)
                    if attempt == 0 =>
                {
                    remove_at(parent.fd.as_fd(), name).map_err(|e| io_err("remove", &path, e))?;
                    continue;
                }
                Ok(_) => {
                    return Err(Error::refused(format!(
                        "{} keeps changing into something other than a file",
                        path.display()
                    )))
                }
                Err(e) => return Err(io_err("create", &path, e)),
            };
            // Truncate only now that the descriptor is known to be this name's own file.
            rustix::fs::ftruncate(&fd, 0).map_err(|e| io_err("truncate", &path, e))?;
            clear_nonblock(&fd).map_err(|e| io_err("open", &path, e))?;
            return Ok(File::from(fd));
        }
        unreachable!("the loop returns on its second attempt")
    }

    /// Put a symbolic link to `target` at `rel` (an instant restore's deferred file; the
    /// directory is new, so nothing is there).
    pub fn create_symlink(&self, rel: &str, target: &Path, cache: &mut ParentCache) -> Result<()> {
        let parent = self.parent(rel, cache)?;
        let name = base_name(rel);
        rustix::fs::symlinkat(target, &parent.fd, name)
            .map_err(|e| io_err("link", &parent.path.join(name), e))
    }

    /// Open an existing regular file of its own for reading (`write: false`) or for
    /// patching in place; `None` when there is none (nothing, a link, a directory, a
    /// hard-linked file...): the caller then writes the file whole, replacing what is there.
    pub fn open_existing(
        &self,
        rel: &str,
        write: bool,
        cache: &mut ParentCache,
    ) -> Result<Option<File>> {
        let parent = self.parent(rel, cache)?;
        let name = base_name(rel);
        let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
        let flags = access | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        match rustix::fs::openat(&parent.fd, name, flags, Mode::empty()) {
            Ok(fd) => {
                let path = parent.path.join(name);
                if !is_own_regular_file(fd.as_fd()).map_err(|e| io_err("stat", &path, e))? {
                    return Ok(None);
                }
                clear_nonblock(&fd).map_err(|e| io_err("open", &path, e))?;
                Ok(Some(File::from(fd)))
            }
            Err(Errno::NOENT | Errno::LOOP | Errno::ISDIR | Errno::NXIO) => Ok(None),
            Err(e) => Err(io_err("open", &parent.path.join(name), e)),
        }
    }

    /// Remove `rel` if it exists (never through a link).
    pub fn remove(&self, rel: &str, cache: &mut ParentCache) -> Result<()> {
        let parent = match self.parent(rel, cache) {
            Ok(p) => p,
            Err(_) => return Ok(()), // no parent directory: nothing to remove
        };
        let name = base_name(rel);
        remove_at(parent.fd.as_fd(), name).map_err(|e| io_err("remove", &parent.path.join(name), e))
    }

    /// Write a small file durably: a temporary name, fsync, rename over `rel`, fsync the
    /// directory. A crash leaves the old file or the new one, never a torn one.
    pub fn write_durably(
        &self,
        rel: &str,
        content: &[u8],
        finish: impl FnOnce(&File) -> Result<()>,
        cache: &mut ParentCache,
    ) -> Result<()> {
        use std::io::Write;
        let tmp_rel = format!("{rel}.pgstrata-tmp");
        let mut f = self.create_file(&tmp_rel, cache)?;
        let path = self.display_path(rel);
        f.write_all(content)
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        finish(&f)?;
        f.sync_all()
            .map_err(|e| Error::io(format!("sync {}", path.display()), e))?;
        self.rename_into_place(&tmp_rel, rel, cache)
    }

    /// Rename `from` to `to` (same directory) and fsync the directory.
    pub fn rename_into_place(&self, from: &str, to: &str, cache: &mut ParentCache) -> Result<()> {
        let parent = self.parent(to, cache)?;
        rustix::fs::renameat(&parent.fd, base_name(from), &parent.fd, base_name(to))
            .map_err(|e| io_err("rename into place", &parent.path.join(base_name(to)), e))?;
        parent.sync()
    }
}

/// What restore sets attributes on: a file or a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EntryKind {
    File,
    Dir,
}

impl EntryKind {
    /// The most a restored entry of this kind may have: PostgreSQL's modes with group
    /// access (the owner's bits and the group's read and search; nothing for others).
    fn mode_bits(self) -> u32 {
        match self {
            EntryKind::File => 0o640,
            EntryKind::Dir => 0o750,
        }
    }
}

/// `recorded` (a manifest's mode) as restore applies it to a `kind` at `path`: without
/// bits beyond [`EntryKind::mode_bits`], dropped with a debug message.
pub(super) fn restored_mode(kind: EntryKind, recorded: u32, path: &Path) -> u32 {
    let mode = recorded & kind.mode_bits();
    if mode != recorded {
        log::debug!(
            "{}: mode {recorded:04o} in the manifest is restored as {mode:04o} (never more than {:04o})",
            path.display(),
            kind.mode_bits()
        );
    }
    mode
}

/// Set mode (see [`restored_mode`]), owner (when given) and modification time on an open
/// file or directory.
pub(super) fn set_attributes(
    fd: BorrowedFd<'_>,
    kind: EntryKind,
    mode: u32,
    owner: Option<(u32, u32)>,
    mtime: Option<i64>,
    path: &Path,
) -> Result<()> {
    if let Some((u, g)) = owner {
        // chown before chmod: chown clears setuid/setgid bits (none are restored anyway).
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(u)),
            Some(rustix::fs::Gid::from_raw(g)),
        )
        .map_err(|e| io_err("chown", path, e))?;
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(restored_mode(kind, mode, path)))
        .map_err(|e| io_err("chmod", path, e))?;
    if let Some(t) = mtime {
        let ts = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: t.max(0),
                tv_nsec: rustix::fs::UTIME_OMIT,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: t.max(0),
                tv_nsec: 0,
            },
        };
        rustix::fs::futimens(fd, &ts).map_err(|e| io_err("set mtime of", path, e))?;
    }
    Ok(())
}

fn clear_nonblock(fd: &OwnedFd) -> std::result::Result<(), Errno> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags - OFlags::NONBLOCK)
}

fn same_file(a: &OwnedFd, b: &OwnedFd, path: &Path) -> Result<()> {
    let (sa, sb) = (
        rustix::fs::fstat(a).map_err(|e| io_err("stat", path, e))?,
        rustix::fs::fstat(b).map_err(|e| io_err("stat", path, e))?,
    );
    if (sa.st_dev, sa.st_ino) != (sb.st_dev, sb.st_ino) {
        return Err(Error::refused(format!(
            "{} was replaced while restoring into it",
            path.display()
        )));
    }
    Ok(())
}

fn base_name(rel: &str) -> &str {
    rel.rsplit_once('/').map(|(_, n)| n).unwrap_or(rel)
}

/// The directory handle a worker used last: files of one directory usually come together.
#[derive(Default)]
pub(super) struct ParentCache {
    key: Option<String>,
    dir: Option<DirHandle>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// PostgreSQL's own modes pass unchanged; anything more loses the extra bits.
    #[test]
    fn restored_modes_are_at_most_postgresql_s_own() {
        let p = Path::new("x");
        for (kind, recorded, restored) in [
            (EntryKind::File, 0o600, 0o600),
            (EntryKind::File, 0o640, 0o640),
            (EntryKind::File, 0o400, 0o400),
            (EntryKind::File, 0o777, 0o640),
            (EntryKind::File, 0o755, 0o640),
            (EntryKind::File, 0o606, 0o600),
            (EntryKind::File, 0o7777, 0o640),
            (EntryKind::Dir, 0o700, 0o700),
            (EntryKind::Dir, 0o750, 0o750),
            (EntryKind::Dir, 0o777, 0o750),
            (EntryKind::Dir, 0o3777, 0o750),
            (EntryKind::Dir, 0o705, 0o700),
        ] {
            assert_eq!(
                restored_mode(kind, recorded, p),
                restored,
                "{kind:?} {recorded:o}"
            );
        }
    }

    fn tree() -> (tempfile::TempDir, TargetTree) {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("pg")).unwrap();
        let tree = TargetTree::new(DirHandle::open(&t.path().join("pg")).unwrap());
        (t, tree)
    }

    /// `rel` holds something restore must not write through: it is not offered for reading
    /// or patching, and creating the file replaces it.
    fn assert_replaced(tree: &TargetTree, rel: &str, content: &[u8]) {
        let mut cache = ParentCache::default();
        assert!(tree
            .open_existing(rel, false, &mut cache)
            .unwrap()
            .is_none());
        tree.create_file(rel, &mut cache)
            .unwrap()
            .write_all(content)
            .unwrap();
    }

    #[test]
    fn a_link_where_a_file_goes_is_replaced_not_followed() {
        let (t, tree) = tree();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::fs::create_dir(t.path().join("pg/global")).unwrap();
        std::os::unix::fs::symlink(&victim, t.path().join("pg/global/pg_control")).unwrap();
        assert_replaced(&tree, "global/pg_control", b"restored");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let md = std::fs::symlink_metadata(t.path().join("pg/global/pg_control")).unwrap();
        assert!(md.is_file());
        assert_eq!(
            std::fs::read(t.path().join("pg/global/pg_control")).unwrap(),
            b"restored"
        );
    }

    #[test]
    fn a_hard_linked_file_is_replaced_not_truncated() {
        let (t, tree) = tree();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::fs::hard_link(&victim, t.path().join("pg/PG_VERSION")).unwrap();
        assert_replaced(&tree, "PG_VERSION", b"17\n");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(t.path().join("pg/PG_VERSION")).unwrap(),
            "17\n"
        );
    }

    #[test]
    fn a_link_where_a_directory_goes_is_replaced_and_never_walked() {
        let (t, tree) = tree();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, t.path().join("pg/base")).unwrap();
        let mut cache = ParentCache::default();
        // Resolving through the link is refused...
        assert!(tree.create_file("base/1", &mut cache).is_err());
        // ...and making the directory replaces it.
        let mut cache = ParentCache::default();
        tree.ensure_dir("base", &mut cache).unwrap();
        tree.create_file("base/1", &mut cache).unwrap();
        assert!(std::fs::symlink_metadata(t.path().join("pg/base"))
            .unwrap()
            .is_dir());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn a_fifo_where_a_file_goes_does_not_hang_and_is_replaced() {
        let (t, tree) = tree();
        let fifo = t.path().join("pg/postgresql.conf");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_replaced(&tree, "postgresql.conf", b"x");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().is_file());
    }

    #[test]
    fn removal_never_follows_links_inside() {
        let (t, tree) = tree();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::fs::create_dir(t.path().join("pg/junk")).unwrap();
        std::os::unix::fs::symlink(&outside, t.path().join("pg/junk/link")).unwrap();
        tree.remove("junk", &mut ParentCache::default()).unwrap();
        assert!(!t.path().join("pg/junk").exists());
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn durable_writes_replace_whole_files() {
        let (t, tree) = tree();
        let mut cache = ParentCache::default();
        std::fs::write(t.path().join("pg/backup_label"), "old").unwrap();
        tree.write_durably("backup_label", b"new", |_| Ok(()), &mut cache)
            .unwrap();
        let mut s = String::new();
        File::open(t.path().join("pg/backup_label"))
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "new");
        assert!(!t.path().join("pg/backup_label.pgstrata-tmp").exists());
    }
}
