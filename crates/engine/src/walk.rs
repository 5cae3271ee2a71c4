//! Walking a data directory to find what a backup copies.
//!
//! Tablespaces are followed through their `pg_tblspc/<oid>` links, and only this server
//! version's `PG_<major>_<catversion>` directory inside each is copied (a tablespace
//! location may hold other versions' directories after pg_upgrade). An in-place tablespace
//! (`allow_in_place_tablespaces`, `CREATE TABLESPACE ... LOCATION ''`) is a directory in
//! `pg_tblspc` instead of a link: it is copied as a directory of the data directory, with no
//! location of its own (PostgreSQL leaves it out of `tablespace_map` too).
//!
//! Other symbolic links are followed and copied as what they point to (restore writes real
//! files and directories; `pg_wal` pointing elsewhere is recorded as the empty directory it
//! always is). A link that leads back to a directory containing it, or that cannot be
//! resolved because it is circular, would make the walk endless: it is refused, naming the
//! link. A link to nothing is left out with a warning, as a file deleted during the walk is.

use crate::owner::OwnerNames;
use crate::{Error, Result};
use pgstrata_pg::data_dir::{self, Disposition};
use pgstrata_repo::manifest::{DataLink, Owner, Tablespace};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub(crate) enum ItemKind {
    Dir,
    Link { target: String },
}

/// A directory or link the walk found.
#[derive(Debug, Clone)]
pub struct Item {
    /// Path as recorded in the manifest (relative to the data directory).
    pub rel: String,
    pub kind: ItemKind,
    pub owner: Owner,
}

/// A regular file the walk found: what a backup copies.
///
/// Files are most of what a walk finds, and a backup holds every one until it is copied:
/// they are kept apart from directories so that the copy plan takes them as they are, and
/// their absolute path is made when the file is opened, not stored.
#[derive(Debug, Clone)]
pub struct WalkedFile {
    /// Path as recorded in the manifest (relative to the data directory).
    pub rel: String,
    /// The directory walked, which `rel` is relative to (a standby's data directory for
    /// the files a backup from a standby reads there). Tablespace files are reached
    /// through their `pg_tblspc/<oid>` link.
    pub root: Arc<Path>,
    pub owner: Owner,
    pub mtime: i64,
    pub size: u64,
}

impl WalkedFile {
    pub fn abs(&self) -> PathBuf {
        self.root.join(&self.rel)
    }
}

/// What a walk found, collected: directories and links, files, and the tablespaces
/// with a location of their own. (A backup takes the walk as it goes, [`Walker`]; a
/// backup from a standby merges two walks collected.)
#[derive(Debug, Default)]
pub(crate) struct Walk {
    pub items: Vec<Item>,
    pub files: Vec<WalkedFile>,
    pub tablespaces: Vec<Tablespace>,
    pub links: Vec<DataLink>,
}

pub(crate) fn tablespace_version_dir(major: u32, catalog_version: u32) -> String {
    format!("PG_{major}_{catalog_version}")
}

/// Walk `pg_path` whole into lists.
pub fn walk(pg_path: &Path, major: u32, catalog_version: u32) -> Result<Walk> {
    let mut walker = Walker::new(pg_path, major, catalog_version)?;
    let mut w = Walk {
        tablespaces: std::mem::take(&mut walker.tablespaces),
        links: std::mem::take(&mut walker.links),
        ..Walk::default()
    };
    for found in walker {
        match found? {
            Walked::Item(i) => w.items.push(i),
            Walked::File(f) => w.files.push(f),
        }
    }
    w.files.shrink_to_fit();
    Ok(w)
}

/// The things of a collected walk in path order, as a [`Walker`] finds them.
pub(crate) fn in_order(w: Walk) -> impl Iterator<Item = Result<Walked>> {
    let mut items = w.items;
    let mut files = w.files;
    items.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));
    files.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));
    let mut items = items.into_iter().peekable();
    let mut files = files.into_iter().peekable();
    std::iter::from_fn(move || {
        let item_first = match (items.peek(), files.peek()) {
            (Some(i), Some(f)) => i.rel < f.rel,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let next = match item_first {
            true => Walked::Item(items.next()?),
            false => Walked::File(files.next()?),
        };
        Some(Ok(next))
    })
}

/// One thing a walk finds.
#[derive(Debug)]
pub(crate) enum Walked {
    Item(Item),
    File(WalkedFile),
}

#[cfg(test)]
impl Walked {
    pub fn rel(&self) -> &str {
        match self {
            Walked::Item(i) => &i.rel,
            Walked::File(f) => &f.rel,
        }
    }
}

/// A walk of a data directory as it goes, in the manifest's order (paths compared as
/// bytes): what a backup holds of the walk is the directories being listed, not every
/// file of the data directory (48 MB at 300,000 files when it was a list).
///
/// Each directory's names are read and sorted at once; a file is looked at (`stat`) when
/// its turn comes. Byte order is not the order of a plain depth-first walk: `a.b` comes
/// between `a` and `a/x` ('.' < '/'). So a directory `a` is two places among its
/// siblings: the directory itself at `a`, and its contents at `a/`.
pub(crate) struct Walker {
    root: Arc<Path>,
    names: OwnerNames,
    version_dir: String,
    /// The tablespaces with a location of their own (links in `pg_tblspc`).
    pub tablespaces: Vec<Tablespace>,
    /// The data directory's own symbolic links, at its top (followed, and recorded so
    /// that restore can make them links again).
    pub links: Vec<DataLink>,
    /// The data directory itself, found first.
    first: Option<Item>,
    /// The directories being listed, the data directory first.
    stack: Vec<Frame>,
}

/// A directory being listed: its children in order, consumed from the front.
struct Frame {
    dir: PathBuf,
    rel: String,
    /// (device, inode): a link back to a directory on the stack is a loop.
    id: (u64, u64),
    children: Children,
}

/// A directory's children in order, consumed from the front. The names are kept in one
/// buffer, a child being 8 bytes and its name's: a database directory holds most of a
/// data directory's files, and a name allocated apiece cost a backup ~150 bytes a file
/// (45 MB at 300,000 files).
#[derive(Default)]
struct Children {
    names: Vec<u8>,
    order: Vec<Child>,
    next: usize,
}

#[derive(Clone, Copy)]
struct Child {
    /// The name: `names[start..start + len]`.
    start: u32,
    len: u16,
    place: Place,
    /// What the directory entry said it is, while the listing is classified.
    kind: EntryKind,
}

/// The type a directory entry gives, where the file system gives it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    File,
    Dir,
    /// A symbolic link, to be followed.
    Link,
}

impl Children {
    /// A child whose name is already in the buffer.
    fn push_named(&mut self, start: u32, len: u16, place: Place) {
        self.order.push(Child {
            start,
            len,
            place,
            kind: EntryKind::Dir,
        });
    }

    /// A child with its name.
    fn push(&mut self, name: &std::ffi::OsStr, place: Place) -> Result<()> {
        let (start, len) = add_name(&mut self.names, name)?;
        self.push_named(start, len, place);
        Ok(())
    }

    fn name(&self, c: &Child) -> &std::ffi::OsStr {
        name_in(&self.names, c)
    }

    /// Compared as its path would be: the contents of `a` as `a/`.
    fn key(&self, c: &Child) -> impl Iterator<Item = u8> + '_ {
        use std::os::unix::ffi::OsStrExt;
        let slash: &[u8] = match c.place {
            Place::Itself | Place::Link => b"",
            _ => b"/",
        };
        self.name(c).as_bytes().iter().chain(slash).copied()
    }

    /// Put the children in path order.
    fn sort(mut self) -> Children {
        let mut order = std::mem::take(&mut self.order);
        order.sort_unstable_by(|a, b| self.key(a).cmp(self.key(b)));
        order.shrink_to_fit();
        self.order = order;
        self
    }

    /// The next child: its name and place.
    fn next(&mut self) -> Option<(&std::ffi::OsStr, Place)> {
        let c = *self.order.get(self.next)?;
        self.next += 1;
        Some((self.name(&c), c.place))
    }
}

/// The name of child `c` in a buffer of names.
fn name_in<'a>(names: &'a [u8], c: &Child) -> &'a std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(&names[c.start as usize..][..c.len as usize])
}

/// Append `name` to a buffer of names: where it starts and its length.
fn add_name(names: &mut Vec<u8>, name: &std::ffi::OsStr) -> Result<(u32, u16)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    let start = u32::try_from(names.len())
        .map_err(|_| Error::refused("a directory with over 4 GB of names: not walked"))?;
    let len = u16::try_from(bytes.len())
        .map_err(|_| Error::refused(format!("a name of {} bytes: not walked", bytes.len())))?;
    names.extend_from_slice(bytes);
    Ok((start, len))
}

/// What a child of a directory stands for at its place in the order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The file or directory itself.
    Itself,
    /// A tablespace's link in `pg_tblspc`, recorded as a link.
    Link,
    /// The directory's contents (at `name/`).
    Contents,
    /// `pg_tblspc`'s contents: the tablespaces.
    Tablespaces,
    /// A tablespace's contents: only this server version's directory.
    Tablespace,
    /// `pg_wal`'s contents: only `archive_status`, which must exist for the server to start.
    ArchiveStatus,
}

impl Walker {
    pub fn new(pg_path: &Path, major: u32, catalog_version: u32) -> Result<Walker> {
        let md = std::fs::metadata(pg_path)
            .map_err(|e| Error::io(format!("read data directory {}", pg_path.display()), e))?;
        let mut names = OwnerNames::default();
        let first = Item {
            rel: String::new(),
            kind: ItemKind::Dir,
            owner: names.owner_of(&md),
        };
        let mut w = Walker {
            root: Arc::from(pg_path),
            names,
            version_dir: tablespace_version_dir(major, catalog_version),
            tablespaces: Vec::new(),
            links: top_level_links(pg_path)?,
            first: Some(first),
            stack: Vec::new(),
        };
        for (name, kind) in list_tablespaces(&pg_path.join("pg_tblspc"))? {
            if let (Ok(oid), TablespaceKind::Link(location)) = (name.parse(), kind) {
                w.tablespaces.push(Tablespace { oid, location });
            }
        }
        w.tablespaces.sort_by_key(|t| t.oid);
        let children = w.list(pg_path, "")?;
        w.stack.push(Frame {
            dir: pg_path.to_path_buf(),
            rel: String::new(),
            id: dir_id(&md),
            children,
        });
        Ok(w)
    }

    /// The children of directory `dir` (`rel`), in order, with what is not copied left
    /// out. The directory's entries are classified where they were read: one list of 8
    /// bytes a child and one buffer of names is all a directory of a million files holds.
    fn list(&self, dir: &Path, rel: &str) -> Result<Children> {
        let Some(mut children) = read_names(dir)? else {
            return Ok(Children::default());
        };
        let Children { names, order, .. } = &mut children;
        // Relations with an _init fork are unlogged: their other forks are not copied.
        let unlogged: HashSet<u32> = if data_dir::in_relation_dir(&join_rel(rel, "x")) {
            order
                .iter()
                .filter_map(|c| data_dir::RelFile::parse(name_in(names, c).to_str()?))
                .filter(|r| r.fork == data_dir::Fork::Init)
                .map(|r| r.relnumber)
                .collect()
        } else {
            HashSet::new()
        };
        // A directory stands at two places (itself, and its contents): the second place is
        // added after the others, and the sort puts it where it belongs.
        let mut second = Vec::new();
        let mut kept = 0;
        for i in 0..order.len() {
            let c = order[i];
            let os_name = name_in(names, &c);
            let name = os_name.to_string_lossy();
            let child_rel = join_rel(rel, &name);
            let is_dir = match c.kind {
                EntryKind::Dir => true,
                EntryKind::File => false,
                // A link (other than a tablespace's): what it points to.
                EntryKind::Link => match stat_following(&dir.join(os_name))? {
                    Some(md) => md.is_dir(),
                    None => continue,
                },
            };
            let mut keep = |place, second_place: Option<Place>| {
                order[kept] = Child { place, ..c };
                kept += 1;
                second.extend(second_place.map(|place| Child { place, ..c }));
            };
            match data_dir::classify(&child_rel, is_dir) {
                Disposition::Skip => continue,
                Disposition::KeepEmpty => {
                    let status = (child_rel == "pg_wal").then_some(Place::ArchiveStatus);
                    keep(Place::Itself, status);
                    continue;
                }
                Disposition::Copy => {}
            }
            if is_dir {
                let contents = match child_rel.as_str() {
                    "pg_tblspc" => Place::Tablespaces,
                    _ => Place::Contents,
                };
                keep(Place::Itself, Some(contents));
                continue;
            }
            if let Some(r) = data_dir::relation_file(&child_rel) {
                if data_dir::unlogged_skip(&r, |n| unlogged.contains(&n)) {
                    continue;
                }
            } else if data_dir::in_relation_dir(&child_rel) && is_temp_relation(&name) {
                continue;
            }
            keep(Place::Itself, None);
        }
        order.truncate(kept);
        order.extend(second);
        Ok(children.sort())
    }

    /// `pg_tblspc`'s children: each tablespace's link (or in-place directory) and its
    /// contents.
    fn list_tablespaces(&self, dir: &Path) -> Result<Children> {
        let mut children = Children::default();
        for (name, kind) in list_tablespaces(dir)? {
            let place = match kind {
                TablespaceKind::Link(_) => Place::Link,
                TablespaceKind::InPlace => Place::Itself,
            };
            let (start, len) = add_name(&mut children.names, name.as_ref())?;
            children.push_named(start, len, place);
            children.push_named(start, len, Place::Tablespace);
        }
        Ok(children.sort())
    }

    /// Go into directory `abs` (`rel`), whose children are `list`ed.
    fn enter(
        &mut self,
        abs: PathBuf,
        rel: String,
        list: impl FnOnce(&Walker, &Path, &str) -> Result<Children>,
    ) -> Result<()> {
        let md = match std::fs::metadata(&abs) {
            Ok(md) => md,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("stat {}", abs.display()), e)),
        };
        let id = dir_id(&md);
        if self.stack.iter().any(|f| f.id == id) {
            return Err(Error::refused(format!(
                "{}: symbolic link loop (it leads back to {}, a directory that contains it): remove or fix it before backing up",
                abs.display(),
                std::fs::canonicalize(&abs).unwrap_or_default().display()
            )));
        }
        let children = list(self, &abs, &rel)?;
        self.stack.push(Frame {
            dir: abs,
            rel,
            id,
            children,
        });
        Ok(())
    }

    /// What the child at `abs` (`child_rel` in the manifest) standing at `place` is, or
    /// `None` when it stands for nothing to record (a directory entered, a file gone).
    fn visit(&mut self, abs: PathBuf, child_rel: String, place: Place) -> Result<Option<Walked>> {
        match place {
            Place::Itself => {
                let Some(md) = stat_following(&abs)? else {
                    return Ok(None);
                };
                let owner = self.names.owner_of(&md);
                if md.is_dir() {
                    return Ok(Some(Walked::Item(Item {
                        rel: child_rel,
                        kind: ItemKind::Dir,
                        owner,
                    })));
                }
                if !md.is_file() {
                    return Ok(None);
                }
                Ok(Some(Walked::File(WalkedFile {
                    rel: child_rel,
                    root: self.root.clone(),
                    owner,
                    mtime: md.mtime(),
                    size: md.len(),
                })))
            }
            Place::Link => {
                let lmd = std::fs::symlink_metadata(&abs)
                    .map_err(|e| Error::io(format!("stat {}", abs.display()), e))?;
                let target = std::fs::read_link(&abs)
                    .map_err(|e| Error::io(format!("read link {}", abs.display()), e))?;
                Ok(Some(Walked::Item(Item {
                    rel: child_rel,
                    kind: ItemKind::Link {
                        target: target.display().to_string(),
                    },
                    owner: self.names.owner_of(&lmd),
                })))
            }
            Place::Contents => {
                self.enter(abs, child_rel, |w, d, r| w.list(d, r))?;
                Ok(None)
            }
            Place::Tablespaces => {
                self.enter(abs, child_rel, |w, d, _| w.list_tablespaces(d))?;
                Ok(None)
            }
            Place::Tablespace => {
                let version_dir = std::ffi::OsString::from(&self.version_dir);
                self.enter(abs, child_rel, |_, d, _| {
                    let mut children = Children::default();
                    if d.join(&version_dir).is_dir() {
                        children.push(&version_dir, Place::Itself)?;
                        children.push(&version_dir, Place::Contents)?;
                    }
                    Ok(children)
                })?;
                Ok(None)
            }
            Place::ArchiveStatus => {
                let st = abs.join("archive_status");
                Ok(std::fs::metadata(&st).ok().map(|smd| {
                    Walked::Item(Item {
                        rel: format!("{child_rel}/archive_status"),
                        kind: ItemKind::Dir,
                        owner: self.names.owner_of(&smd),
                    })
                }))
            }
        }
    }
}

impl Iterator for Walker {
    type Item = Result<Walked>;

    fn next(&mut self) -> Option<Result<Walked>> {
        if let Some(first) = self.first.take() {
            return Some(Ok(Walked::Item(first)));
        }
        loop {
            let frame = self.stack.last_mut()?;
            let Some((name, place)) = frame.children.next() else {
                self.stack.pop();
                continue;
            };
            let abs = frame.dir.join(name);
            let child_rel = join_rel(&frame.rel, &name.to_string_lossy());
            match self.visit(abs, child_rel, place) {
                Ok(Some(found)) => return Some(Ok(found)),
                Ok(None) => continue,
                Err(e) => {
                    // Nothing after an error: the walk is over.
                    self.stack.clear();
                    return Some(Err(e));
                }
            }
        }
    }
}

enum TablespaceKind {
    Link(String),
    InPlace,
}

/// The tablespaces in `pg_tblspc`: links (with their location) and in-place directories,
/// by name (an OID). Anything else there is left out with a warning.
fn list_tablespaces(tblspc: &Path) -> Result<Vec<(String, TablespaceKind)>> {
    let Ok(rd) = std::fs::read_dir(tblspc) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| Error::io(format!("read {}", tblspc.display()), e))?;
        let name = ent.file_name().to_string_lossy().to_string();
        if name.parse::<u32>().is_err() {
            continue;
        }
        let path = ent.path();
        let lmd = std::fs::symlink_metadata(&path)
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        if lmd.file_type().is_symlink() {
            let target = std::fs::read_link(&path)
                .map_err(|e| Error::io(format!("read link {}", path.display()), e))?;
            found.push((name, TablespaceKind::Link(target.display().to_string())));
        } else if lmd.is_dir() {
            found.push((name, TablespaceKind::InPlace));
        } else {
            log::warn!(
                "{}: neither a tablespace link nor an in-place tablespace directory: not backed up",
                path.display()
            );
        }
    }
    Ok(found)
}

fn join_rel(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// The symbolic links at the top of the data directory, with their targets as read (those
/// to nothing included: the walk leaves them out, and restore then has no entry to make
/// a link of). Deeper links are followed as the walk finds them, and restored as what they
/// point to.
fn top_level_links(pg_path: &Path) -> Result<Vec<DataLink>> {
    let mut links = Vec::new();
    let entries = std::fs::read_dir(pg_path)
        .map_err(|e| Error::io(format!("read data directory {}", pg_path.display()), e))?;
    for e in entries {
        let e =
            e.map_err(|e| Error::io(format!("read data directory {}", pg_path.display()), e))?;
        if !e.file_type().is_ok_and(|t| t.is_symlink()) || e.file_name() == "pg_tblspc" {
            continue;
        }
        let (Ok(target), Some(name)) = (
            std::fs::read_link(e.path()),
            e.file_name().to_str().map(str::to_string),
        ) else {
            continue;
        };
        if let Some(target) = target.to_str() {
            links.push(DataLink {
                path: name,
                target: target.to_string(),
            });
        }
    }
    links.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(links)
}

/// (device, inode) of a directory: what "the same directory" means when links lead to it.
fn dir_id(md: &std::fs::Metadata) -> (u64, u64) {
    (md.dev(), md.ino())
}

/// What a directory entry is, following links. `None`: it vanished, or is a link to
/// nothing (warned about).
fn stat_following(abs: &Path) -> Result<Option<std::fs::Metadata>> {
    match std::fs::metadata(abs) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Ok(target) = std::fs::read_link(abs) {
                log::warn!(
                    "{}: symbolic link to {}, which does not exist: not backed up",
                    abs.display(),
                    target.display()
                );
            }
            Ok(None)
        }
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => Err(Error::refused(format!(
            "{}: circular symbolic link (it leads to itself): remove or fix it before backing up",
            abs.display()
        ))),
        Err(e) => Err(Error::io(format!("stat {}", abs.display()), e)),
    }
}

/// The entries of `dir`, in the order read, each with the type its directory entry
/// gives (classified by [`Walker::list`]); `None` when the directory was dropped while
/// being read (DROP DATABASE: WAL replay redoes it). Names only: a database directory can
/// hold a million files, and each `DirEntry` holds more than its name.
fn read_names(dir: &Path) -> Result<Option<Children>> {
    let failed = |e| Error::io(format!("read directory {}", dir.display()), e);
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(failed(e)),
    };
    let mut found = Children::default();
    for ent in rd {
        let ent = match ent {
            Ok(e) => e,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(failed(e)),
        };
        let kind = match ent.file_type() {
            Ok(t) if t.is_symlink() => EntryKind::Link,
            Ok(t) if t.is_dir() => EntryKind::Dir,
            Ok(_) => EntryKind::File,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(failed(e)),
        };
        let (start, len) = add_name(&mut found.names, &ent.file_name())?;
        found.order.push(Child {
            start,
            len,
            place: Place::Itself,
            kind,
        });
    }
    found.names.shrink_to_fit();
    Ok(Some(found))
}

/// Temporary relations are named `t<backend>_<relnumber>`; they die with their session.
fn is_temp_relation(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('t') else {
        return false;
    };
    let Some((backend, relfile)) = rest.split_once('_') else {
        return false;
    };
    !backend.is_empty()
        && backend.bytes().all(|b| b.is_ascii_digit())
        && relfile.bytes().next().is_some_and(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A minimal data directory: pg_control, one relation, an empty pg_tblspc.
    fn data_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for dir in ["global", "base/1", "pg_tblspc"] {
            std::fs::create_dir_all(d.path().join(dir)).unwrap();
        }
        std::fs::write(d.path().join("global/pg_control"), [0u8; 8192]).unwrap();
        std::fs::write(d.path().join("base/1/1259"), [1u8; 8192]).unwrap();
        d
    }

    fn rels(w: &Walk) -> Vec<&str> {
        let files = w.files.iter().map(|f| f.rel.as_str());
        w.items
            .iter()
            .map(|i| i.rel.as_str())
            .chain(files)
            .collect()
    }

    /// The walk comes in the manifest's order, paths compared as bytes: `a.b` between
    /// `a` and `a/x`, a relation's segments and forks together.
    #[test]
    fn the_walk_comes_in_path_order() {
        let d = data_dir();
        for dir in ["a", "a/x", "a-b"] {
            std::fs::create_dir_all(d.path().join(dir)).unwrap();
        }
        for file in [
            "a.b",
            "a/x/1",
            "a/y",
            "base/1/1259.1",
            "base/1/1259_fsm",
            "base/1/12",
        ] {
            std::fs::write(d.path().join(file), b"x").unwrap();
        }
        let w = Walker::new(d.path(), 15, 202209061).unwrap();
        let found: Vec<String> = w.map(|f| f.unwrap().rel().to_string()).collect();
        let mut sorted = found.clone();
        sorted.sort();
        assert_eq!(found, sorted);
        for want in [
            "",
            "a",
            "a-b",
            "a.b",
            "a/x",
            "a/x/1",
            "a/y",
            "base/1/1259.1",
            "global/pg_control",
        ] {
            assert!(found.iter().any(|f| f == want), "{want} in {found:?}");
        }
    }

    #[test]
    fn a_link_back_to_a_containing_directory_is_refused_naming_it() {
        let d = data_dir();
        symlink("..", d.path().join("base/1/up")).unwrap();
        let e = walk(d.path(), 15, 202209061).unwrap_err();
        assert!(e.message.contains("symbolic link loop"), "{}", e.message);
        assert!(e.message.contains("base/1/up"), "{}", e.message);
    }

    #[test]
    fn a_circular_link_is_refused_naming_it() {
        let d = data_dir();
        symlink("b", d.path().join("base/a")).unwrap();
        symlink("a", d.path().join("base/b")).unwrap();
        let e = walk(d.path(), 15, 202209061).unwrap_err();
        assert!(
            e.message.contains("circular symbolic link"),
            "{}",
            e.message
        );
        assert!(e.message.contains("base/a") || e.message.contains("base/b"));
    }

    #[test]
    fn links_to_files_and_directories_are_copied_as_what_they_point_to() {
        let d = data_dir();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("extra.conf"), "x = 1\n").unwrap();
        symlink(
            outside.path().join("extra.conf"),
            d.path().join("extra.conf"),
        )
        .unwrap();
        symlink(outside.path(), d.path().join("conf.d")).unwrap();
        // Two links to one directory are no loop.
        symlink(outside.path(), d.path().join("base/1/again")).unwrap();
        symlink("/nonexistent/pgstrata", d.path().join("gone")).unwrap();
        let w = walk(d.path(), 15, 202209061).unwrap();
        let kind = |rel: &str| {
            w.items
                .iter()
                .find(|i| i.rel == rel)
                .map(|i| i.kind.clone())
        };
        let file = |rel: &str| w.files.iter().find(|f| f.rel == rel);
        let extra = file("extra.conf").expect("extra.conf");
        assert_eq!(extra.size, 6);
        assert_eq!(extra.abs(), d.path().join("extra.conf"));
        assert!(matches!(kind("conf.d"), Some(ItemKind::Dir)));
        assert!(file("conf.d/extra.conf").is_some());
        assert!(file("base/1/again/extra.conf").is_some());
        assert!(
            kind("gone").is_none() && file("gone").is_none(),
            "a link to nothing is left out"
        );
    }

    #[test]
    fn in_place_and_linked_tablespaces_are_both_walked() {
        let d = data_dir();
        let vdir = tablespace_version_dir(15, 202209061);
        let inplace = d.path().join("pg_tblspc/16400").join(&vdir).join("5");
        std::fs::create_dir_all(&inplace).unwrap();
        std::fs::write(inplace.join("16401"), [2u8; 8192]).unwrap();
        let location = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(location.path().join(&vdir).join("5")).unwrap();
        std::fs::write(location.path().join(&vdir).join("5/16501"), [3u8; 8192]).unwrap();
        symlink(location.path(), d.path().join("pg_tblspc/16500")).unwrap();
        let w = walk(d.path(), 15, 202209061).unwrap();
        let names = rels(&w);
        for want in [
            "pg_tblspc/16400".to_string(),
            format!("pg_tblspc/16400/{vdir}/5/16401"),
            "pg_tblspc/16500".to_string(),
            format!("pg_tblspc/16500/{vdir}/5/16501"),
        ] {
            assert!(names.contains(&want.as_str()), "{want} in {names:?}");
        }
        let item = |rel: &str| w.items.iter().find(|i| i.rel == rel).unwrap();
        assert!(matches!(item("pg_tblspc/16400").kind, ItemKind::Dir));
        assert!(matches!(
            item("pg_tblspc/16500").kind,
            ItemKind::Link { .. }
        ));
        // Only the linked one has a location elsewhere.
        assert_eq!(w.tablespaces.len(), 1);
        assert_eq!(w.tablespaces[0].oid, 16500);
    }
}
