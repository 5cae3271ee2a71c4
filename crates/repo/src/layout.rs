//! Object names inside a repository: each kind of object's name is built here, and every
//! name read back from a listing is parsed here, so the names live in exactly one place
//! (and in docs/repository-format.md, "Layout", whose patterns a test checks against these
//! functions).
//!
//! ```text
//! <stanza>/stanza.json                                  which cluster the stanza belongs to
//! <stanza>/upgrades/<n>.json                            the cluster it belongs to from stanza-upgrade n on
//! <stanza>/archive/<archive-id>/<first 16 of name>/<walname>   archived WAL (and .partial/.backup)
//! <stanza>/archive/<archive-id>/<first 16>/<segment>.map    its block-change map
//! <stanza>/archive/<archive-id>/<name>.history          timeline history files
//! <stanza>/backup/<label>/pack/<worker>-<seq>           pack objects holding file data
//! <stanza>/backup/<label>/resume/<worker>-<n>           resume checkpoints of a running backup
//! <stanza>/backup/<label>/manifest/<n>                  part n of its entries (format 4)
//! <stanza>/backup/<label>/manifest/<n>.copy             that part's copy, written just before it
//! <stanza>/backup/<label>/backup.manifest.copy          its copy, written just before it
//! <stanza>/backup/<label>/backup.manifest               the manifest, written last
//! <stanza>/lock/backup.lock                             held while a backup or expire runs
//! <stanza>/probe/create-only-<unique>                   stanza-create's and check's test object (removed)
//! <stanza>/expired/<unique>.json                        what one expire removed (kept)
//! <stanza>/annotations/<label>/<unique>.json            a pin or annotation change of a backup
//! <stanza>/keys/<id>.json                               encrypted stanzas: one wrapped master key each
//! <stanza>/keys/<id>-<generation>.grant                 encrypted stanzas: a newer master key for <id>
//! ```

/// The stanza record.
pub fn stanza_info(stanza: &str) -> String {
    format!("{stanza}/stanza.json")
}

/// Where the stanza's upgrade records are ([`stanza_upgrade`]).
pub fn stanza_upgrades_dir(stanza: &str) -> String {
    format!("{stanza}/upgrades")
}

/// The record of the stanza's `number`th cluster (2 for the first stanza-upgrade: the
/// stanza record holds the first).
pub fn stanza_upgrade(stanza: &str, number: u32) -> String {
    format!("{}/{number}.json", stanza_upgrades_dir(stanza))
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

/// The lock a running `wal-receive` of the stanza holds (one receiver at a time).
pub fn receiver_lock(stanza: &str) -> String {
    format!("{stanza}/lock/wal-receive.lock")
}

/// The short-lived object stanza-create and check write twice to see that the store
/// refuses the second create.
pub fn create_only_probe(stanza: &str, unique: &str) -> String {
    format!("{stanza}/probe/create-only-{unique}")
}

/// A name no other writer makes: this process's id and the time in nanoseconds,
/// `<pid>-<nanos>` (the `<unique>` of object names).
pub fn unique_name() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}

/// Where expire records are ([`expire_record`]).
pub fn expire_records_dir(stanza: &str) -> String {
    format!("{stanza}/expired")
}

/// The record of what one expire removed: backups and WAL (`expire_record` module).
pub fn expire_record(stanza: &str, unique: &str) -> String {
    format!("{}/{unique}.json", expire_records_dir(stanza))
}

/// Where the annotation records of backup `label` are ([`annotation_record`]).
pub fn annotation_records_dir(stanza: &str, label: &str) -> String {
    format!("{stanza}/annotations/{label}")
}

/// A change of backup `label`'s pin or annotations after it was taken (`annotate`).
pub fn annotation_record(stanza: &str, label: &str, unique: &str) -> String {
    format!("{}/{unique}.json", annotation_records_dir(stanza, label))
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

/// The directory of backup `label`: its packs, checkpoints, manifest and parts.
pub fn backup_dir(stanza: &str, label: &str) -> String {
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

/// Pack `name` (a [`pack_name`]) of backup `label`.
pub fn pack(stanza: &str, label: &str, name: &str) -> String {
    format!("{}/{name}", pack_dir(stanza, label))
}

/// The prefix of backup `label`'s packs.
pub fn pack_dir(stanza: &str, label: &str) -> String {
    format!("{}/pack", backup_dir(stanza, label))
}

/// The name of pack `seq` (from 0) of copy worker `worker`: `<worker>-<seq>`, so that
/// concurrent writers never make the same name.
pub fn pack_name(worker: usize, seq: usize) -> String {
    format!("{worker}-{seq}")
}

/// The (worker, sequence number) of a [`pack_name`]: two decimal integers of 1 to 10
/// digits; `None` for anything else.
pub fn parse_pack_name(name: &str) -> Option<(usize, usize)> {
    let (w, q) = name.split_once('-')?;
    let number = |n: &str| {
        ((1..=10).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
            .then(|| n.parse().ok())
            .flatten()
    };
    Some((number(w)?, number(q)?))
}

/// The prefix of backup `label`'s resume checkpoints.
pub fn resume_dir(stanza: &str, label: &str) -> String {
    format!("{}/resume", backup_dir(stanza, label))
}

/// Checkpoint `n` (from 0) of copy worker `worker` of backup `label`.
pub fn resume_checkpoint(stanza: &str, label: &str, worker: usize, n: usize) -> String {
    format!("{}/{worker}-{n}", resume_dir(stanza, label))
}

/// What an object under `<stanza>/backup/<label>/` is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupObject<'a> {
    /// `backup.manifest`.
    Manifest,
    /// `backup.manifest.copy`.
    ManifestCopy,
    /// Anything under `manifest/`: a part, a part's copy (format 4).
    Part(&'a str),
    /// Anything under `pack/`: the pack's name.
    Pack(&'a str),
    /// Anything under `resume/`: a checkpoint's name.
    ResumeCheckpoint(&'a str),
}

/// The label and kind of `key`, an object listed under [`backup_root`]`(stanza)`; `None`
/// for a name no writer makes there.
pub fn parse_backup_object<'k>(stanza: &str, key: &'k str) -> Option<(&'k str, BackupObject<'k>)> {
    let rest = key.strip_prefix(stanza)?.strip_prefix("/backup/")?;
    let (label, name) = rest.split_once('/')?;
    let object = match name {
        "backup.manifest" => BackupObject::Manifest,
        "backup.manifest.copy" => BackupObject::ManifestCopy,
        _ => {
            let (dir, name) = name.split_once('/')?;
            match dir {
                "manifest" => BackupObject::Part(name),
                "pack" => BackupObject::Pack(name),
                "resume" => BackupObject::ResumeCheckpoint(name),
                _ => return None,
            }
        }
    };
    Some((label, object))
}

/// What an object under [`archive_root`] is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveObject<'a> {
    /// A WAL file as PostgreSQL names it: a segment, `.partial`, `.backup` or `.history`.
    Wal(&'a str),
    /// The block-change map of `segment` ([`change_map`]).
    ChangeMap { segment: &'a str },
}

/// The WAL name (for [`archive_object`]) of a piece of segment `segment` that `wal-receive`
/// stored while receiving it: the segment's bytes `start..end`. Pieces are create-only
/// (immutable repositories take them); a reader chains them from byte 0. Not PostgreSQL's
/// `.partial` (archive-push stores those).
pub fn received_piece_name(segment: &str, start: u64, end: u64) -> String {
    format!("{segment}.{start:08X}-{end:08X}.receive.partial")
}

/// The (segment, start, end) of a [`received_piece_name`].
pub fn parse_received_piece(name: &str) -> Option<(&str, u64, u64)> {
    let rest = name.strip_suffix(".receive.partial")?;
    let (segment, range) = rest.split_once('.')?;
    let (start, end) = range.split_once('-')?;
    let hex = |v: &str| {
        (v.len() == 8)
            .then(|| u64::from_str_radix(v, 16).ok())
            .flatten()
    };
    let (start, end) = (hex(start)?, hex(end)?);
    (segment.len() == 24 && start < end).then_some((segment, start, end))
}

/// The kind of archive object `key` (an [`archive_object`] or a [`change_map`]).
pub fn parse_archive_object(key: &str) -> ArchiveObject<'_> {
    let name = key.rsplit('/').next().unwrap_or_default();
    match name.strip_suffix(".map") {
        Some(segment) => ArchiveObject::ChangeMap { segment },
        None => ArchiveObject::Wal(name),
    }
}

/// What an object under [`keys_dir`] is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeysObject<'a> {
    /// A [`key_file`]: `<id>.json`.
    KeyFile { id: &'a str },
    /// A [`key_grant`]: `<id>-<generation>.grant`; `generation` is `None` when the name
    /// holds no generation in canonical decimal (such a grant is not the one its name
    /// says, whatever it holds).
    Grant {
        id: &'a str,
        generation: Option<u32>,
    },
}

/// The kind of `key`, an object listed under [`keys_dir`]; `None` for other names.
pub fn parse_keys_object(key: &str) -> Option<KeysObject<'_>> {
    let name = key.rsplit('/').next()?;
    if let Some(id) = name.strip_suffix(".json") {
        return Some(KeysObject::KeyFile { id });
    }
    let stem = name.strip_suffix(".grant")?;
    let (id, generation) = stem.rsplit_once('-').unwrap_or((stem, ""));
    let canonical = !generation.starts_with('0') && generation.bytes().all(|b| b.is_ascii_digit());
    Some(KeysObject::Grant {
        id,
        generation: canonical.then(|| generation.parse().ok()).flatten(),
    })
}

/// Validate a stanza name: it becomes part of object names.
pub fn check_stanza_name(stanza: &str) -> crate::Result<()> {
    if stanza.is_empty()
        || stanza.len() > 64
        || !stanza
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(crate::Error::new(
            crate::ErrorKind::Invalid,
            format!("stanza name '{stanza}' is not allowed: use 1-64 letters, digits, '-' or '_'"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_are_the_names_made() {
        let (s, l) = ("main", "20261126-140000F");
        let backup = |key: String| {
            parse_backup_object(s, &key).map(|(l, o)| (l.to_string(), format!("{o:?}")))
        };
        assert_eq!(backup(manifest(s, l)), Some((l.into(), "Manifest".into())));
        assert_eq!(
            backup(manifest_copy(s, l)),
            Some((l.into(), "ManifestCopy".into()))
        );
        assert_eq!(
            backup(manifest_part_copy(s, l, 3)),
            Some((l.into(), "Part(\"3.copy\")".into()))
        );
        assert_eq!(
            backup(pack(s, l, &pack_name(2, 9))),
            Some((l.into(), "Pack(\"2-9\")".into()))
        );
        assert_eq!(
            backup(resume_checkpoint(s, l, 2, 0)),
            Some((l.into(), "ResumeCheckpoint(\"2-0\")".into()))
        );
        assert_eq!(backup(format!("{}/other", backup_dir(s, l))), None);
        assert_eq!(backup(manifest("other", l)), None);

        assert_eq!(parse_pack_name(&pack_name(12, 345)), Some((12, 345)));
        for bad in ["12", "-1", "1-", "+1-2", "1-2-3", "12345678901-0"] {
            assert_eq!(parse_pack_name(bad), None, "{bad}");
        }

        let seg = "000000010000000A0000002B";
        let a = "15-1";
        assert_eq!(
            parse_archive_object(&archive_object(s, a, seg)),
            ArchiveObject::Wal(seg)
        );
        assert_eq!(
            parse_archive_object(&change_map(s, a, seg)),
            ArchiveObject::ChangeMap { segment: seg }
        );

        let id = "3f9a0c1d2b4e5f60";
        assert_eq!(
            parse_keys_object(&key_file(s, id)),
            Some(KeysObject::KeyFile { id })
        );
        assert_eq!(
            parse_keys_object(&key_grant(s, id, 12)),
            Some(KeysObject::Grant {
                id,
                generation: Some(12)
            })
        );
        for odd in ["012", "+12", "x", ""] {
            let key = format!("{}/{id}-{odd}.grant", keys_dir(s));
            assert_eq!(
                parse_keys_object(&key),
                Some(KeysObject::Grant {
                    id,
                    generation: None
                }),
                "{key}"
            );
        }
        assert_eq!(
            parse_keys_object(&format!("{}/notes.txt", keys_dir(s))),
            None
        );
    }

    #[test]
    fn received_pieces_round_trip() {
        let seg = "000000010000000A0000002B";
        let name = received_piece_name(seg, 0x2000, 0x10000);
        assert_eq!(
            name,
            "000000010000000A0000002B.00002000-00010000.receive.partial"
        );
        assert_eq!(parse_received_piece(&name), Some((seg, 0x2000, 0x10000)));
        for bad in [
            "000000010000000A0000002B.receive.partial",
            "000000010000000A0000002B.00002000-00002000.receive.partial",
            "000000010000000A0000002B.2000-10000.receive.partial",
            "000000010000000A0000002B.partial",
        ] {
            assert_eq!(parse_received_piece(bad), None, "{bad}");
        }
    }

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
