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
use pgstrata_pg::layout::{self, Disposition};
use pgstrata_repo::manifest::{Owner, Tablespace};
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

#[derive(Debug, Default)]
pub(crate) struct Walk {
    pub items: Vec<Item>,
    pub files: Vec<WalkedFile>,
    pub tablespaces: Vec<Tablespace>,
}

pub(crate) fn tablespace_version_dir(major: u32, catalog_version: u32) -> String {
    format!("PG_{major}_{catalog_version}")
}

pub fn walk(pg_path: &Path, major: u32, catalog_version: u32) -> Result<Walk> {
    let mut w = Walk::default();
    let md = std::fs::metadata(pg_path)
        .map_err(|e| Error::io(format!("read data directory {}", pg_path.display()), e))?;
    let mut shared = WalkShared {
        root: Arc::from(pg_path),
        names: OwnerNames::default(),
    };
    w.items.push(Item {
        rel: String::new(),
        kind: ItemKind::Dir,
        owner: shared.names.owner_of(&md),
    });
    let root = dir_id(&md);
    walk_dir(pg_path, "", &mut w, &mut shared, &mut vec![root])?;

    // Tablespaces: pg_tblspc/<oid> links, or in-place directories.
    let tblspc = pg_path.join("pg_tblspc");
    let version_dir = tablespace_version_dir(major, catalog_version);
    if let Ok(rd) = std::fs::read_dir(&tblspc) {
        for ent in rd {
            let ent = ent.map_err(|e| Error::io(format!("read {}", tblspc.display()), e))?;
            let name = ent.file_name().to_string_lossy().to_string();
            let Ok(oid) = name.parse::<u32>() else {
                continue;
            };
            let path = ent.path();
            let lmd = std::fs::symlink_metadata(&path)
                .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
            let rel = format!("pg_tblspc/{oid}");
            let kind = if lmd.file_type().is_symlink() {
                let target = std::fs::read_link(&path)
                    .map_err(|e| Error::io(format!("read link {}", path.display()), e))?;
                let target = target.display().to_string();
                w.tablespaces.push(Tablespace {
                    oid,
                    location: target.clone(),
                });
                ItemKind::Link { target }
            } else if lmd.is_dir() {
                ItemKind::Dir
            } else {
                log::warn!("{}: neither a tablespace link nor an in-place tablespace directory: not backed up", path.display());
                continue;
            };
            w.items.push(Item {
                rel: rel.clone(),
                kind,
                owner: shared.names.owner_of(&lmd),
            });
            let vdir = path.join(&version_dir);
            let vmd = match std::fs::metadata(&vdir) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("stat {}", vdir.display()), e)),
            };
            let vrel = format!("{rel}/{version_dir}");
            w.items.push(Item {
                rel: vrel.clone(),
                kind: ItemKind::Dir,
                owner: shared.names.owner_of(&vmd),
            });
            let mut ancestors = vec![root, dir_id(&vmd)];
            walk_dir(&vdir, &vrel, &mut w, &mut shared, &mut ancestors)?;
        }
    }
    w.tablespaces.sort_by_key(|t| t.oid);
    // Held until the files are copied: not the doubling's spare room with it.
    w.files.shrink_to_fit();
    Ok(w)
}

fn join_rel(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
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

/// The names in `dir`; `None` when it was dropped while being read (DROP DATABASE: WAL
/// replay redoes it). Names only: a database directory can hold a million files, and each
/// `DirEntry` holds more than its name.
fn read_names(dir: &Path) -> Result<Option<Vec<std::ffi::OsString>>> {
    let failed = |e| Error::io(format!("read directory {}", dir.display()), e);
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(failed(e)),
    };
    let mut names = Vec::new();
    for ent in rd {
        match ent {
            Ok(e) => names.push(e.file_name()),
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(Some(names))
}

/// What every level of a walk shares.
struct WalkShared {
    /// The directory walked.
    root: Arc<Path>,
    names: OwnerNames,
}

/// Walk `dir` (`rel` in the manifest). `ancestors` holds the directories from the walk's
/// root down to `dir`: a link back to one of them is a loop.
fn walk_dir(
    dir: &Path,
    rel: &str,
    w: &mut Walk,
    shared: &mut WalkShared,
    ancestors: &mut Vec<(u64, u64)>,
) -> Result<()> {
    let Some(names_here) = read_names(dir)? else {
        return Ok(());
    };
    // Room for this directory's files at once: a database directory of a million files
    // would otherwise leave the list with up to twice the room it needs (doubling).
    w.files.reserve(names_here.len());
    // Relations with an _init fork are unlogged: their other forks are not copied.
    let unlogged: HashSet<u32> = if layout::in_relation_dir(&join_rel(rel, "x")) {
        names_here
            .iter()
            .filter_map(|n| layout::RelFile::parse(n.to_str()?))
            .filter(|r| r.fork == layout::Fork::Init)
            .map(|r| r.relnumber)
            .collect()
    } else {
        HashSet::new()
    };
    for os_name in names_here {
        let name = os_name.to_string_lossy();
        let child_rel = join_rel(rel, &name);
        if rel == "pg_tblspc" {
            continue; // handled by the tablespace pass
        }
        let abs = dir.join(&os_name);
        // Follow links (other than tablespaces): copy what they point to.
        let Some(md) = stat_following(&abs)? else {
            continue;
        };
        let is_dir = md.is_dir();
        match layout::classify(&child_rel, is_dir) {
            Disposition::Skip => continue,
            Disposition::KeepEmpty => {
                w.items.push(Item {
                    rel: child_rel.clone(),
                    kind: ItemKind::Dir,
                    owner: shared.names.owner_of(&md),
                });
                // pg_wal/archive_status must exist for the server to start.
                if child_rel == "pg_wal" {
                    let st = abs.join("archive_status");
                    if let Ok(smd) = std::fs::metadata(&st) {
                        w.items.push(Item {
                            rel: "pg_wal/archive_status".into(),
                            kind: ItemKind::Dir,
                            owner: shared.names.owner_of(&smd),
                        });
                    }
                }
                continue;
            }
            Disposition::Copy => {}
        }
        if is_dir {
            if ancestors.contains(&dir_id(&md)) {
                return Err(Error::refused(format!(
                    "{}: symbolic link loop (it leads back to {}, a directory that contains it): remove or fix it before backing up",
                    abs.display(),
                    std::fs::canonicalize(&abs).unwrap_or_default().display()
                )));
            }
            w.items.push(Item {
                rel: child_rel.clone(),
                kind: ItemKind::Dir,
                owner: shared.names.owner_of(&md),
            });
            ancestors.push(dir_id(&md));
            walk_dir(&abs, &child_rel, w, shared, ancestors)?;
            ancestors.pop();
        } else if md.is_file() {
            if let Some(r) = layout::relation_file(&child_rel) {
                if layout::unlogged_skip(&r, |n| unlogged.contains(&n)) {
                    continue;
                }
            } else if layout::in_relation_dir(&child_rel) && is_temp_relation(&name) {
                continue;
            }
            w.files.push(WalkedFile {
                rel: child_rel,
                root: shared.root.clone(),
                owner: shared.names.owner_of(&md),
                mtime: md.mtime(),
                size: md.len(),
            });
        }
    }
    Ok(())
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
