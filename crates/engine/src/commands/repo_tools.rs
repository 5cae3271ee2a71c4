//! `repo-ls` and `repo-get`: look inside a stanza's part of the repository, for support
//! work, with the same storage, keys and checks every command uses.
//!
//! Both stay inside the stanza (`<stanza>` or below): a path is a repository key as
//! docs/repository-format.md names objects, never a file system path. `repo-get` writes
//! what the object holds, opened and checked as a reader of it would: a WAL object as the
//! segment PostgreSQL wrote (its BLAKE3 checked), a manifest as JSON (its checksum
//! checked, a copy opened under its original's name), any other sealed object opened
//! (its GCM tag checked). Key files and packs are written as stored: a key file is in the
//! clear, and a pack's frames are sealed one by one (restore reads them).

use crate::{open_stanza, Error, Result, Settings};
use bytes::Bytes;
use pgstrata_repo::changemap::ChangeMap;
use pgstrata_repo::layout::{self, ArchiveObject, BackupObject};
use pgstrata_repo::manifest::Manifest;
use pgstrata_repo::wal_object;
use serde::Serialize;

/// One line of `repo-ls`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Listed {
    /// The object's key, or a directory's (ending in `/`), relative to the repository.
    pub name: String,
    /// `object` or `dir`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Bytes as stored (objects), or of everything below (directories).
    pub size: u64,
    /// Last modified, RFC 3339 (objects; directories: the newest below).
    pub modified: String,
}

/// The checked key `path` names inside stanza `stanza` (default: the stanza itself).
fn key_in_stanza(stanza: &str, path: Option<&str>) -> Result<String> {
    let path = path.unwrap_or(stanza).trim_end_matches('/');
    let inside = path == stanza || path.starts_with(&format!("{stanza}/"));
    let clean = path
        .split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..");
    if !inside || !clean {
        return Err(Error::config(format!(
            "'{path}' is not a repository path inside stanza '{stanza}': give a key such as {stanza}/backup or {}",
            layout::stanza_info(stanza)
        )));
    }
    Ok(path.to_string())
}

/// The objects at or below `path` (recursively), or its immediate objects and directories.
pub async fn repo_ls(s: &Settings, path: Option<&str>, recurse: bool) -> Result<Vec<Listed>> {
    let key = key_in_stanza(&s.stanza, path)?;
    let storage = s.storage()?;
    let prefix = format!("{key}/");
    let mut objects = storage.list(&prefix).await?;
    // The path may name one object rather than a directory.
    if objects.is_empty() {
        if let Some(one) = storage.list(&key).await?.into_iter().find(|o| o.key == key) {
            objects.push(one);
        }
    }
    let time = |t: i64| {
        chrono::DateTime::from_timestamp(t, 0)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default()
    };
    let mut listed: std::collections::BTreeMap<String, (bool, u64, i64)> = Default::default();
    for o in &objects {
        let below = o.key.strip_prefix(&prefix).unwrap_or(&o.key);
        let (name, is_dir) = match below.split_once('/') {
            Some((dir, _)) if !recurse => (format!("{prefix}{dir}/"), true),
            _ => (o.key.clone(), false),
        };
        let e = listed.entry(name).or_insert((is_dir, 0, 0));
        e.1 += o.size;
        e.2 = e.2.max(o.modified);
    }
    Ok(listed
        .into_iter()
        .map(|(name, (is_dir, size, modified))| Listed {
            name,
            kind: if is_dir { "dir" } else { "object" },
            size,
            modified: time(modified),
        })
        .collect())
}

/// Text for people: size, time, name, a line each.
pub fn render_ls(listed: &[Listed]) -> String {
    listed
        .iter()
        .map(|l| format!("{:>14}  {}  {}\n", l.size, l.modified, l.name))
        .collect()
}

/// What object `path` holds, opened and checked (see the module doc).
pub async fn repo_get(s: &Settings, path: &str) -> Result<Bytes> {
    let key = key_in_stanza(&s.stanza, Some(path))?;
    let (storage, _) = open_stanza(s).await?;
    let as_stored = key.starts_with(&format!("{}/", layout::keys_dir(&s.stanza)))
        || matches!(
            layout::parse_backup_object(&s.stanza, &key),
            Some((_, BackupObject::Pack(_)))
        );
    if as_stored {
        return Ok(storage.get_unsealed(&key).await?);
    }
    // A copy is sealed under its original's name.
    let original = layout::copied_from(&key).unwrap_or(&key);
    let plain = storage.open_stored(original, storage.get_unsealed(&key).await?)?;
    if layout::is_manifest_object(original) {
        Manifest::check_stored(&plain, &key)?;
        if original.ends_with("/backup.manifest") {
            let m = Manifest::decode(&plain, &key)?;
            let json = serde_json::to_vec_pretty(&m).expect("serialize manifest");
            return Ok(Bytes::from(json));
        }
        if matches!(
            layout::parse_backup_object(&s.stanza, original),
            Some((_, BackupObject::Part(_)))
        ) {
            let entries = pgstrata_repo::manifest::decode_part(&plain, &key)?;
            let json = serde_json::json!({ "entries": entries });
            return Ok(Bytes::from(
                serde_json::to_vec_pretty(&json).expect("serialize part"),
            ));
        }
        return Ok(plain);
    }
    if key.starts_with(&format!("{}/archive/", s.stanza)) {
        return Ok(match layout::parse_archive_object(&key) {
            ArchiveObject::Wal(_) => Bytes::from(wal_object::decode(&plain, &key)?),
            ArchiveObject::ChangeMap { .. } => {
                ChangeMap::decode(&plain, &key)?;
                plain
            }
        });
    }
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::key_in_stanza;

    #[test]
    fn paths_stay_inside_the_stanza() {
        assert_eq!(key_in_stanza("main", None).unwrap(), "main");
        assert_eq!(
            key_in_stanza("main", Some("main/backup/")).unwrap(),
            "main/backup"
        );
        for outside in [
            "other/backup",
            "mainly",
            "main/../other",
            "/main",
            "main//backup",
            "main/./x",
        ] {
            let err = key_in_stanza("main", Some(outside)).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{outside}");
        }
    }
}
