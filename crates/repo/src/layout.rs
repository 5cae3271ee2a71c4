//! Object names inside a repository. One function per kind of object, so the names live in
//! exactly one place (and in docs/repository-format.md).
//!
//! ```text
//! <stanza>/stanza.json                                  which cluster the stanza belongs to
//! <stanza>/archive/<archive-id>/<first 16 of name>/<walname>   archived WAL (and .partial/.backup)
//! <stanza>/archive/<archive-id>/<first 16>/<segment>.map    its block-change map
//! <stanza>/archive/<archive-id>/<name>.history          timeline history files
//! <stanza>/backup/<label>/pack/<worker>-<seq>           pack objects holding file data
//! <stanza>/backup/<label>/manifest/<n>                  part n of its entries (format 4)
//! <stanza>/backup/<label>/manifest/<n>.copy             that part's copy, written just before it
//! <stanza>/backup/<label>/backup.manifest.copy          its copy, written just before it
//! <stanza>/backup/<label>/backup.manifest               the manifest, written last
//! <stanza>/lock/backup.lock                             held while a backup or expire runs
//! <stanza>/probe/create-only-<unique>                   stanza-create's and check's test object (removed)
//! <stanza>/keys/<id>.json                               encrypted stanzas: one wrapped master key each
//! ```

pub(crate) fn stanza_info(stanza: &str) -> String {
    format!("{stanza}/stanza.json")
}

pub fn archive_root(stanza: &str, archive_id: &str) -> String {
    format!("{stanza}/archive/{archive_id}")
}

/// Where an archived WAL file (segment, .partial, .backup or .history) is stored.
pub fn archive_object(stanza: &str, archive_id: &str, wal_name: &str) -> String {
    if wal_name.len() >= 24 && wal_name[..24].bytes().all(|b| b.is_ascii_hexdigit()) {
        format!(
            "{}/{}/{}",
            archive_root(stanza, archive_id),
            &wal_name[..16],
            wal_name
        )
    } else {
        format!("{}/{}", archive_root(stanza, archive_id), wal_name)
    }
}

/// The lock object held by a backup or expire of the stanza.
pub fn lock(stanza: &str) -> String {
    format!("{stanza}/lock/backup.lock")
}

/// The short-lived object stanza-create and check write twice to see that the store
/// refuses the second create.
pub(crate) fn create_only_probe(stanza: &str, unique: &str) -> String {
    format!("{stanza}/probe/create-only-{unique}")
}

/// Where an encrypted stanza's key files are.
pub fn keys_dir(stanza: &str) -> String {
    format!("{stanza}/keys")
}

/// One key file of an encrypted stanza.
pub fn key_file(stanza: &str, id: &str) -> String {
    format!("{}/{id}.json", keys_dir(stanza))
}

/// A grant of master key generation `generation` to key file `id` (§15).
pub fn key_grant(stanza: &str, id: &str, generation: u32) -> String {
    format!("{}/{id}-{generation}.grant", keys_dir(stanza))
}

/// The block-change map of an archived segment, beside it.
pub fn change_map(stanza: &str, archive_id: &str, segment: &str) -> String {
    format!("{}.map", archive_object(stanza, archive_id, segment))
}

pub fn backup_root(stanza: &str) -> String {
    format!("{stanza}/backup")
}

pub(crate) fn backup_dir(stanza: &str, label: &str) -> String {
    format!("{stanza}/backup/{label}")
}

pub fn manifest(stanza: &str, label: &str) -> String {
    format!("{}/backup.manifest", backup_dir(stanza, label))
}

/// The manifest's second copy, written just before it and read when it is damaged.
pub fn manifest_copy(stanza: &str, label: &str) -> String {
    format!("{}/backup.manifest.copy", backup_dir(stanza, label))
}

/// Part `n` (from 0) of the entries of backup `label`'s manifest (format 4).
pub fn manifest_part(stanza: &str, label: &str, n: usize) -> String {
    format!("{}/manifest/{n}", backup_dir(stanza, label))
}

/// The copy of part `n`, written just before it and read when it is damaged.
pub fn manifest_part_copy(stanza: &str, label: &str, n: usize) -> String {
    format!("{}.copy", manifest_part(stanza, label, n))
}

/// The manifest or part that `key` is the copy of (a copy is sealed under its original's
/// name), or `None` when `key` is no such copy.
pub fn copied_from(key: &str) -> Option<&str> {
    key.strip_suffix(".copy").filter(|k| is_manifest_object(k))
}

/// Whether `key` names a manifest or a part of one (not a copy): what a manifest patch
/// may rebuild.
pub fn is_manifest_object(key: &str) -> bool {
    key.ends_with("/backup.manifest")
        || key.rsplit_once("/manifest/").is_some_and(|(_, n)| {
            !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit())
        })
}

pub fn pack(stanza: &str, label: &str, name: &str) -> String {
    format!("{}/{name}", pack_dir(stanza, label))
}

/// The prefix of backup `label`'s packs.
pub fn pack_dir(stanza: &str, label: &str) -> String {
    format!("{}/pack", backup_dir(stanza, label))
}

/// Validate a stanza name: it becomes part of object names.
pub fn check_stanza_name(stanza: &str) -> Result<(), String> {
    if stanza.is_empty()
        || stanza.len() > 64
        || !stanza
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "stanza name '{stanza}' is not allowed: use 1-64 letters, digits, '-' or '_'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_manifests_and_their_parts_are_manifest_objects() {
        let label = "20261126-140000F";
        assert!(is_manifest_object(&manifest("main", label)));
        assert!(is_manifest_object(&manifest_part("main", label, 0)));
        assert!(is_manifest_object(&manifest_part("main", label, 12345)));
        for other in [
            manifest_copy("main", label),
            manifest_part_copy("main", label, 3),
            pack("main", label, "0-1"),
            format!("{}/manifest/", backup_dir("main", label)),
            format!("{}/manifest/1x", backup_dir("main", label)),
            stanza_info("main"),
        ] {
            assert!(!is_manifest_object(&other), "{other}");
        }
    }
}
