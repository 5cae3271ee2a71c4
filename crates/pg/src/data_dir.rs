//! The data directory: what a backup copies, and how relation files are named.
//!
//! The exclusion list follows what pg_basebackup skips (src/backend/backup/basebackup.c):
//! runtime state that PostgreSQL rebuilds at startup, WAL (which comes from the archive),
//! and the data forks of unlogged relations (recreated from their `_init` fork).

/// Directories whose contents are never copied; the directory itself is kept (empty).
pub(crate) const EMPTY_DIRS: &[&str] = &[
    "pg_wal",
    "pg_dynshmem",
    "pg_notify",
    "pg_replslot",
    "pg_serial",
    "pg_snapshots",
    "pg_stat_tmp",
    "pg_subtrans",
];

/// Files at the top of the data directory that are never copied.
pub(crate) const SKIP_TOP_FILES: &[&str] = &[
    "postmaster.pid",
    "postmaster.opts",
    "backup_label",
    "backup_label.old",
    "tablespace_map",
    "tablespace_map.old",
    "recovery.signal",
    "standby.signal",
    "recovery.done",
    "pg_internal.init",
    "current_logfiles",
];

/// What to do with one path found while walking the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    Copy,
    /// Keep the directory, skip everything under it.
    KeepEmpty,
    Skip,
}

/// Decide about `rel_path` (relative to the data directory, '/'-separated).
/// `is_dir` tells whether it is a directory. Unlogged relations are handled separately by
/// [`unlogged_skip`], because that needs to know which `_init` forks exist.
pub fn classify(rel_path: &str, is_dir: bool) -> Disposition {
    let name = rel_path.rsplit('/').next().unwrap_or(rel_path);
    if is_dir {
        if EMPTY_DIRS.contains(&rel_path) {
            return Disposition::KeepEmpty;
        }
        if name.starts_with("pgsql_tmp") {
            return Disposition::Skip;
        }
        return Disposition::Copy;
    }
    if !rel_path.contains('/') && SKIP_TOP_FILES.contains(&rel_path) {
        return Disposition::Skip;
    }
    if name.starts_with("pgsql_tmp")
        || name == "pg_internal.init"
        || name.ends_with(".tmp") && rel_path.starts_with("pg_stat")
    {
        return Disposition::Skip;
    }
    Disposition::Copy
}

/// A relation file name parsed: `<relnumber>[_<fork>][.<segno>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelFile {
    pub relnumber: u32,
    pub fork: Fork,
    pub segno: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fork {
    Main,
    Fsm,
    Vm,
    Init,
}

impl RelFile {
    pub fn parse(name: &str) -> Option<RelFile> {
        let (base, segno) = match name.split_once('.') {
            Some((b, s)) => (b, s.parse::<u32>().ok()?),
            None => (name, 0),
        };
        let (num, fork) = match base.split_once('_') {
            Some((n, "fsm")) => (n, Fork::Fsm),
            Some((n, "vm")) => (n, Fork::Vm),
            Some((n, "init")) => (n, Fork::Init),
            Some(_) => return None,
            None => (base, Fork::Main),
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(RelFile {
            relnumber: num.parse().ok()?,
            fork,
            segno,
        })
    }
}

/// True when `rel_path` lies in a database directory (`base/<db>/`, `global/`, or a
/// tablespace's `<db>/`) and so holds relation files made of pages.
pub fn in_relation_dir(rel_path: &str) -> bool {
    let parts: Vec<&str> = rel_path.split('/').collect();
    match parts.as_slice() {
        ["base", db, _] => db.bytes().all(|b| b.is_ascii_digit()),
        ["global", _] => true,
        ["pg_tblspc", _, _, db, _] => db.bytes().all(|b| b.is_ascii_digit()),
        _ => false,
    }
}

/// A page-structured relation file: in a relation directory and named like one.
pub fn relation_file(rel_path: &str) -> Option<RelFile> {
    if !in_relation_dir(rel_path) {
        return None;
    }
    RelFile::parse(rel_path.rsplit('/').next()?)
}

/// Whether a relation file belongs to an unlogged relation's data (skipped by backups):
/// true for main/fsm/vm forks when `has_init_fork(relnumber)` says the relation has an
/// `_init` fork in the same directory.
pub fn unlogged_skip(rel: &RelFile, has_init_fork: impl Fn(u32) -> bool) -> bool {
    rel.fork != Fork::Init && has_init_fork(rel.relnumber)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(classify("pg_wal", true), Disposition::KeepEmpty);
        assert_eq!(classify("postmaster.pid", false), Disposition::Skip);
        assert_eq!(classify("base/1/1234", false), Disposition::Copy);
        assert_eq!(classify("base/pgsql_tmp", true), Disposition::Skip);
        assert_eq!(classify("base/5/pgsql_tmp123.0", false), Disposition::Skip);
        assert_eq!(classify("postgresql.conf", false), Disposition::Copy);
    }

    #[test]
    fn relation_names() {
        assert_eq!(
            relation_file("base/5/16384_vm.2"),
            Some(RelFile {
                relnumber: 16384,
                fork: Fork::Vm,
                segno: 2
            })
        );
        assert_eq!(relation_file("base/5/PG_VERSION"), None);
        assert_eq!(
            relation_file("pg_tblspc/16400/PG_15_202209061/5/16401")
                .unwrap()
                .relnumber,
            16401
        );
        assert_eq!(relation_file("pg_xact/0000"), None);
        assert!(relation_file("global/pg_control").is_none());
    }
}
