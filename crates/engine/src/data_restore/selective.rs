//! Selective restore (`--db-include`, `--db-exclude`), as pgBackRest has it: the databases
//! left out still get every file, but their relation files are written as sparse zeroed
//! files of the recorded size, and nothing of them is fetched. The cluster's catalogs still
//! list them, so it starts; the operator drops them. Their `PG_VERSION` and
//! `pg_filenode.map` (a few hundred bytes) are restored as they are, so the directory
//! stays a valid database directory for `DROP DATABASE`.
//!
//! Databases are known by the names and OIDs the backup recorded (`Manifest::databases`);
//! a backup without them (older pgstrata) cannot be restored selectively. PostgreSQL's own
//! databases (OIDs below FirstNormalObjectId: template0, template1, postgres) are always
//! restored.

use crate::{Error, Result};
use pgstrata_repo::manifest::{Database, Manifest};
use std::collections::HashSet;

/// Files of an excluded database's directory that are restored anyway.
const KEPT_WHOLE: [&str; 2] = ["PG_VERSION", "pg_filenode.map"];

/// What a selective restore leaves out.
#[derive(Debug, Default)]
pub(crate) struct Selection {
    /// The databases whose relation files are zeroed.
    pub excluded: Vec<Database>,
    /// Their OIDs.
    oids: HashSet<u32>,
    /// Files written as sparse zeroed files, and their bytes (what is not fetched):
    /// counted by the restore plan as it reads the entries.
    pub zeroed_files: u64,
    pub zeroed_bytes: u64,
}

impl Selection {
    /// Whether the file at `path` (manifest form) is written as a sparse zeroed file.
    pub fn is_zeroed(&self, path: &str) -> bool {
        !self.oids.is_empty()
            && database_file(path)
                .is_some_and(|(oid, name)| self.oids.contains(&oid) && !KEPT_WHOLE.contains(&name))
    }
}

/// The selection `--db-include`/`--db-exclude` make on backup `m` (its header; empty:
/// everything).
pub(crate) fn select(m: &Manifest, include: &[String], exclude: &[String]) -> Result<Selection> {
    if include.is_empty() && exclude.is_empty() {
        return Ok(Selection::default());
    }
    let Some(dbs) = &m.databases else {
        return Err(Error::config(format!(
            "backup {} does not record its databases (it was taken by an older pgstrata): --db-include and --db-exclude need a backup taken since",
            m.label
        )));
    };
    let names = || {
        dbs.iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (option, list) in [("db-include", include), ("db-exclude", exclude)] {
        for name in list {
            if !dbs.iter().any(|d| &d.name == name) {
                return Err(Error::config(format!(
                    "--{option}={name}: backup {} has no database '{name}' (it has: {})",
                    m.label,
                    names()
                )));
            }
        }
    }
    if let Some(name) = include.iter().find(|n| exclude.contains(n)) {
        return Err(Error::config(format!(
            "database '{name}' is given to both --db-include and --db-exclude"
        )));
    }
    if let Some(d) = dbs
        .iter()
        .find(|d| d.is_system() && exclude.contains(&d.name))
    {
        return Err(Error::config(format!(
            "--db-exclude={}: system databases (OID below 16384: template0, template1, postgres) are always restored",
            d.name
        )));
    }
    let excluded: Vec<Database> = dbs
        .iter()
        .filter(|d| !d.is_system())
        .filter(|d| {
            exclude.contains(&d.name) || (!include.is_empty() && !include.contains(&d.name))
        })
        .cloned()
        .collect();
    Ok(Selection {
        oids: excluded.iter().map(|d| d.oid).collect(),
        excluded,
        ..Default::default()
    })
}

/// The database OID and file name of a file directly in a database directory:
/// `base/<oid>/<name>` or `pg_tblspc/<tablespace>/<version dir>/<oid>/<name>`.
fn database_file(path: &str) -> Option<(u32, &str)> {
    let parts: Vec<&str> = path.split('/').collect();
    let (oid, name) = match parts.as_slice() {
        ["base", oid, name] => (oid, name),
        ["pg_tblspc", _, _, oid, name] => (oid, name),
        _ => return None,
    };
    Some((oid.parse().ok()?, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest with databases postgres (5), app (16390) and big (16391), each with a
    /// relation file, PG_VERSION and pg_filenode.map; `big` also in a tablespace.
    fn manifest(with_databases: bool) -> Manifest {
        let file = |path: &str| {
            serde_json::json!({"kind": "file", "path": path, "size": 8192, "mtime": 0,
                "mode": 0o600, "uid": 0, "gid": 0, "hash": "", "chunks": []})
        };
        let mut paths = vec![];
        for oid in [5, 16390, 16391] {
            for name in ["1259", "PG_VERSION", "pg_filenode.map"] {
                paths.push(format!("base/{oid}/{name}"));
            }
        }
        paths.push("pg_tblspc/16500/PG_15_202209061/16391/16400".into());
        paths.push("global/1262".into());
        let mut m = serde_json::json!({
            "format_version": 1, "label": "20250302-091500F", "type": "full", "stanza": "main",
            "cluster": {"system_identifier": "1", "major_version": 15, "catalog_version": 202209061,
                "control_version": 1300, "wal_segment_size": 16777216, "block_size": 8192},
            "server_version_num": 150000,
            "start": {"time": "", "epoch": 0, "lsn": "0/1", "timeline": 1, "wal": ""},
            "stop": {"time": "", "epoch": 0, "lsn": "0/1", "timeline": 1, "wal": ""},
            "backup_label": "", "compression": {"type": "none", "level": 0}, "frame_size": 1,
            "data_checksums": true, "tablespaces": [], "stats": {"db_size": 0, "stored_size": 0,
                "files": 0, "packs": 0, "pages_checked": 0, "page_errors": 0, "duration_ms": 0},
            "entries": paths.iter().map(|p| file(p)).collect::<Vec<_>>(),
        });
        if with_databases {
            m["databases"] = serde_json::json!([
                {"name": "template1", "oid": 1}, {"name": "postgres", "oid": 5},
                {"name": "app", "oid": 16390}, {"name": "big", "oid": 16391}]);
        }
        serde_json::from_value(m).unwrap()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn zeroed(include: &[&str], exclude: &[&str]) -> Vec<String> {
        let m = manifest(true);
        let s = select(&m, &strings(include), &strings(exclude)).unwrap();
        let mut z: Vec<String> = m
            .files()
            .filter(|f| s.is_zeroed(&f.path))
            .map(|f| f.path.to_string())
            .collect();
        z.sort();
        z
    }

    #[test]
    fn include_zeroes_the_relation_files_of_every_other_user_database() {
        let expect = vec![
            "base/16391/1259".to_string(),
            "pg_tblspc/16500/PG_15_202209061/16391/16400".to_string(),
        ];
        assert_eq!(zeroed(&["app"], &[]), expect);
        assert_eq!(zeroed(&[], &["big"]), expect);
        assert_eq!(zeroed(&["app", "postgres"], &[]), expect);
        assert!(zeroed(&[], &[]).is_empty());
    }

    #[test]
    fn unknown_system_and_unrecorded_databases_are_clear_errors() {
        let m = manifest(true);
        let e = select(&m, &strings(&["nope"]), &[]).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Config);
        assert!(
            e.message.contains("no database 'nope'")
                && e.message.contains("template1, postgres, app, big"),
            "{e}"
        );
        let e = select(&m, &[], &strings(&["postgres"])).unwrap_err();
        assert!(e.message.contains("always restored"), "{e}");
        let e = select(&m, &strings(&["app"]), &strings(&["app"])).unwrap_err();
        assert!(e.message.contains("both"), "{e}");
        let e = select(&manifest(false), &strings(&["app"]), &[]).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Config);
        assert!(e.message.contains("does not record its databases"), "{e}");
    }

    #[test]
    fn files_of_database_directories_are_found_in_base_and_tablespaces() {
        assert_eq!(database_file("base/16390/16401"), Some((16390, "16401")));
        assert_eq!(
            database_file("pg_tblspc/16500/PG_15_202209061/16390/16402.1"),
            Some((16390, "16402.1"))
        );
        assert_eq!(database_file("global/1262"), None);
        assert_eq!(database_file("base/pgsql_tmp/x"), None);
        assert_eq!(database_file("base/16390"), None);
    }
}
