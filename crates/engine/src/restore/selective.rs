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
    /// The databases whose relation files are zeroed, by OID.
    pub excluded: Vec<Database>,
    /// Paths (manifest form) written as sparse zeroed files.
    pub zeroed: HashSet<String>,
    /// Bytes of those files: what is not fetched.
    pub zeroed_bytes: u64,
}

/// The selection `--db-include`/`--db-exclude` make on backup `m` (empty: everything).
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
    if let Some(d) = dbs.iter().find(|d| d.is_system() && exclude.contains(&d.name)) {
        return Err(Error::config(format!(
            "--db-exclude={}: system databases (OID below 16384: template0, template1, postgres) are always restored",
            d.name
        )));
    }
    let excluded: Vec<Database> = dbs
        .iter()
        .filter(|d| !d.is_system())
        .filter(|d| exclude.contains(&d.name) || (!include.is_empty() && !include.contains(&d.name)))
        .cloned()
        .collect();
    let oids: HashSet<u32> = excluded.iter().map(|d| d.oid).collect();
    let mut selection = Selection {
        excluded,
        ..Default::default()
    };
    for f in m.files() {
        if let Some((oid, name)) = database_file(&f.path) {
            if oids.contains(&oid) && !KEPT_WHOLE.contains(&name) {
                selection.zeroed.insert(f.path.clone());
                selection.zeroed_bytes += f.size;
            }
        }
    }
    Ok(selection)
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
