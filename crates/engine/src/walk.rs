//! Walking a data directory to find what a backup copies.
//!
//! Tablespaces are followed through their `pg_tblspc/<oid>` links, and only this server
//! version's `PG_<major>_<catversion>` directory inside each is copied (a tablespace
//! location may hold other versions' directories after pg_upgrade). Other symbolic links are
//! followed and copied as what they point to.

use crate::owner::OwnerNames;
use crate::{Error, Result};
use pgstrata_pg::layout::{self, Disposition};
use pgstrata_repo::manifest::{Owner, Tablespace};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub enum ItemKind {
    Dir,
    File { size: u64, mtime: i64 },
    Link { target: String },
}

#[derive(Debug, Clone)]
pub struct Item {
    /// Path as recorded in the manifest (relative to the data directory).
    pub rel: String,
    pub abs: PathBuf,
    pub kind: ItemKind,
    pub owner: Owner,
}

#[derive(Debug, Default)]
pub struct Walk {
    pub items: Vec<Item>,
    pub tablespaces: Vec<Tablespace>,
}

pub fn tablespace_version_dir(major: u32, catalog_version: u32) -> String {
    format!("PG_{major}_{catalog_version}")
}

pub fn walk(pg_path: &Path, major: u32, catalog_version: u32) -> Result<Walk> {
    let mut w = Walk::default();
    let mut names = OwnerNames::default();
    let md = std::fs::metadata(pg_path)
        .map_err(|e| Error::io(format!("read data directory {}", pg_path.display()), e))?;
    w.items.push(Item {
        rel: String::new(),
        abs: pg_path.to_path_buf(),
        kind: ItemKind::Dir,
        owner: names.owner_of(&md),
    });
    walk_dir(pg_path, "", &mut w, &mut names)?;

    // Tablespaces: pg_tblspc/<oid> links.
    let tblspc = pg_path.join("pg_tblspc");
    let version_dir = tablespace_version_dir(major, catalog_version);
    if let Ok(rd) = std::fs::read_dir(&tblspc) {
        for ent in rd {
            let ent = ent.map_err(|e| Error::io(format!("read {}", tblspc.display()), e))?;
            let name = ent.file_name().to_string_lossy().to_string();
            let Ok(oid) = name.parse::<u32>() else {
                continue;
            };
            let link = ent.path();
            let target = std::fs::read_link(&link)
                .map_err(|e| Error::io(format!("read link {}", link.display()), e))?;
            let lmd = std::fs::symlink_metadata(&link)
                .map_err(|e| Error::io(format!("stat {}", link.display()), e))?;
            w.tablespaces.push(Tablespace {
                oid,
                location: target.display().to_string(),
            });
            let rel = format!("pg_tblspc/{oid}");
            w.items.push(Item {
                rel: rel.clone(),
                abs: link.clone(),
                kind: ItemKind::Link {
                    target: target.display().to_string(),
                },
                owner: names.owner_of(&lmd),
            });
            let vdir = link.join(&version_dir);
            let vmd = match std::fs::metadata(&vdir) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(format!("stat {}", vdir.display()), e)),
            };
            let vrel = format!("{rel}/{version_dir}");
            w.items.push(Item {
                rel: vrel.clone(),
                abs: vdir.clone(),
                kind: ItemKind::Dir,
                owner: names.owner_of(&vmd),
            });
            walk_dir(&vdir, &vrel, &mut w, &mut names)?;
        }
    }
    w.tablespaces.sort_by_key(|t| t.oid);
    Ok(w)
}

fn join_rel(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

fn walk_dir(dir: &Path, rel: &str, w: &mut Walk, names: &mut OwnerNames) -> Result<()> {
    let mut entries = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            for ent in rd {
                match ent {
                    Ok(e) => entries.push(e),
                    // A directory dropped while we read it (DROP DATABASE): WAL replay redoes it.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => {
                        return Err(Error::io(format!("read directory {}", dir.display()), e))
                    }
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("read directory {}", dir.display()), e)),
    }
    let names_here: Vec<String> = entries
        .iter()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    // Relations with an _init fork are unlogged: their other forks are not copied.
    let unlogged: HashSet<u32> = if layout::in_relation_dir(&join_rel(rel, "x")) {
        names_here
            .iter()
            .filter_map(|n| layout::RelFile::parse(n))
            .filter(|r| r.fork == layout::Fork::Init)
            .map(|r| r.relnumber)
            .collect()
    } else {
        HashSet::new()
    };
    for (ent, name) in entries.into_iter().zip(names_here) {
        let child_rel = join_rel(rel, &name);
        if rel == "pg_tblspc" {
            continue; // handled by the tablespace pass
        }
        let abs = ent.path();
        // Follow links (other than tablespaces): copy what they point to.
        let md = match std::fs::metadata(&abs) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(format!("stat {}", abs.display()), e)),
        };
        let is_dir = md.is_dir();
        match layout::classify(&child_rel, is_dir) {
            Disposition::Skip => continue,
            Disposition::KeepEmpty => {
                w.items.push(Item {
                    rel: child_rel.clone(),
                    abs: abs.clone(),
                    kind: ItemKind::Dir,
                    owner: names.owner_of(&md),
                });
                // pg_wal/archive_status must exist for the server to start.
                if child_rel == "pg_wal" {
                    let st = abs.join("archive_status");
                    if let Ok(smd) = std::fs::metadata(&st) {
                        w.items.push(Item {
                            rel: "pg_wal/archive_status".into(),
                            abs: st,
                            kind: ItemKind::Dir,
                            owner: names.owner_of(&smd),
                        });
                    }
                }
                continue;
            }
            Disposition::Copy => {}
        }
        if is_dir {
            w.items.push(Item {
                rel: child_rel.clone(),
                abs: abs.clone(),
                kind: ItemKind::Dir,
                owner: names.owner_of(&md),
            });
            walk_dir(&abs, &child_rel, w, names)?;
        } else if md.is_file() {
            if let Some(r) = layout::relation_file(&child_rel) {
                if layout::unlogged_skip(&r, |n| unlogged.contains(&n)) {
                    continue;
                }
            } else if layout::in_relation_dir(&child_rel) && is_temp_relation(&name) {
                continue;
            }
            w.items.push(Item {
                rel: child_rel,
                abs,
                kind: ItemKind::File {
                    size: md.len(),
                    mtime: md.mtime(),
                },
                owner: names.owner_of(&md),
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
