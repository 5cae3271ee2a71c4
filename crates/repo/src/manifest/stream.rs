//! A manifest read entry by entry, never held whole.
//!
//! Decoded, a manifest takes about 365 bytes a file (a 300,000-file backup: 110 MB); as
//! stored, compressed, about 77. A command that goes through the entries in order
//! (restore) holds the stored object and decodes it as it goes: its memory follows what it
//! has in hand, not the number of files.
//!
//! [`Manifest::open`] checks the object's BLAKE3, reads the header, and reads every entry
//! once through [`EntryChecker`] (the checks of a whole decode, but `packs_used`'s) before
//! it returns: a manifest that fails is refused, and its copy read instead, exactly as
//! [`Manifest::load`] does, before anything acts on it. [`StoredManifest::for_each_entry`]
//! then reads the entries again, as often as the caller needs.

use super::validate::EntryChecker;
use super::{wire, Entry, FileEntry, Manifest};
use crate::{Error, ErrorKind, Result, Storage};
use bytes::Bytes;

/// A checked manifest, as stored, with its header decoded and what the check kept of its
/// entries: the directories and links (few), the files asked for, and counts.
#[derive(Debug, Clone)]
pub struct StoredManifest {
    header: Manifest,
    obj: Bytes,
    /// Where it was read from (the manifest or its copy), for messages.
    key: String,
    layout: Vec<Entry>,
    kept: Vec<FileEntry>,
    files: u64,
    bytes: u64,
}

impl Manifest {
    /// Backup `label`'s manifest (or, when it is damaged, its copy), checked entry by
    /// entry, for reading as a stream. The check keeps the directories and links, and the
    /// file entries at the paths in `keep` ([`StoredManifest::kept`]). Manifests written
    /// before `packs_used` are decoded whole once, for their header.
    pub async fn open(
        storage: &Storage,
        stanza: &str,
        label: &str,
        keep: &[&str],
    ) -> Result<StoredManifest> {
        Manifest::load_as(storage, stanza, label, |obj, key| {
            let header = match Manifest::decode_header(obj, key)? {
                Some(header) => header,
                None => Manifest::decode(obj, key)?.into_header(),
            };
            Manifest::check_identity(&header, key, stanza, label)?;
            let mut checker = EntryChecker::new(&header, key)?;
            let (mut layout, mut kept, mut files, mut bytes) = (Vec::new(), Vec::new(), 0, 0);
            read_entries::<Error>(obj, key, |mut e| {
                checker.check(&mut e)?;
                match e {
                    Entry::File(f) => {
                        (files, bytes) = (files + 1, bytes + f.size);
                        if keep.contains(&&*f.path) {
                            kept.push(*f);
                        }
                    }
                    other => layout.push(other),
                }
                Ok(())
            })?;
            checker.finish()?;
            Ok(StoredManifest {
                header,
                obj: obj.clone(),
                key: key.to_string(),
                layout,
                kept,
                files,
                bytes,
            })
        })
        .await
    }
}

impl StoredManifest {
    /// Everything but the entries (`entries` is empty).
    pub fn header(&self) -> &Manifest {
        &self.header
    }

    /// The directories and links, in order (the data directory first, parents before
    /// their children).
    pub fn layout(&self) -> &[Entry] {
        &self.layout
    }

    /// The file entries [`Manifest::open`] was asked to keep, in manifest order (modes
    /// masked to permission bits).
    pub fn kept(&self) -> &[FileEntry] {
        &self.kept
    }

    /// How many files the manifest lists, and their bytes.
    pub fn files(&self) -> (u64, u64) {
        (self.files, self.bytes)
    }

    /// Hand every entry, in order (sorted by path, the data directory first), to `each`,
    /// with its mode masked to permission bits as a checked manifest has it. An error
    /// from `each` (of the caller's type) stops the reading and is returned.
    pub fn for_each_entry<E: From<Error>>(
        &self,
        mut each: impl FnMut(Entry) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        read_entries(&self.obj, &self.key, |mut e| {
            e.owner_mut().mode &= super::validate::PERMISSION_BITS;
            each(e)
        })
    }
}

/// Hand every entry of stored manifest `obj` (read from `what`), in order, to `each`,
/// skipping every other field; an error from `each` stops the reading and is returned.
fn read_entries<E: From<Error>>(
    obj: &[u8],
    what: &str,
    mut each: impl FnMut(Entry) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut de = super::json_of(obj, what)?;
    let (mut failed, mut found) = (None, false);
    let parsed = serde::de::DeserializeSeed::deserialize(
        wire::EntriesSeed {
            each: &mut each,
            failed: &mut failed,
            found: &mut found,
        },
        &mut de,
    )
    .and_then(|()| de.end());
    if let Some(e) = failed {
        return Err(e);
    }
    parsed.map_err(|e| {
        Error::with_source(ErrorKind::Corrupt, format!("{what}: invalid manifest"), e)
    })?;
    if !found {
        return Err(Error::corrupt(format!("{what}: invalid manifest: it has no entries")).into());
    }
    Ok(())
}
