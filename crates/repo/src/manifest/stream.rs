//! A manifest read entry by entry, never held whole.
//!
//! Decoded, a manifest takes about 365 bytes a file (a 300,000-file backup: 110 MB); as
//! stored, compressed, about 77. A command that goes through the entries in order
//! (restore, verify) decodes them as it goes: from format 4 it fetches the manifest's
//! parts one at a time on every pass (`parts`), and before it holds the stored object.
//! Either way its memory follows what it has in hand, not the number of files.
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
    /// The stored object of a manifest before format 4; empty for format 4, whose parts
    /// are read from `storage` each time (`header.parts`).
    obj: Bytes,
    storage: Storage,
    /// Where it was read from (the manifest or its copy), for messages.
    key: String,
    layout: Vec<Entry>,
    kept: Vec<FileEntry>,
    files: u64,
    bytes: u64,
    /// Whether the entries were checked when it was opened; if not
    /// ([`Manifest::open_unread`]), every reading checks them as it goes.
    checked: bool,
}

/// The check of a stream of entries, and what it keeps.
struct Checked<'k> {
    checker: EntryChecker<'k>,
    keep: &'k [&'k str],
    layout: Vec<Entry>,
    kept: Vec<FileEntry>,
    files: u64,
    bytes: u64,
}

impl Checked<'_> {
    fn entry(&mut self, mut e: Entry) -> Result<()> {
        self.checker.check(&mut e)?;
        match e {
            Entry::File(f) => {
                (self.files, self.bytes) = (self.files + 1, self.bytes + f.size);
                if self.keep.contains(&&*f.path) {
                    self.kept.push(*f);
                }
            }
            other => self.layout.push(other),
        }
        Ok(())
    }

    fn finish(
        self,
        header: &Manifest,
        obj: Bytes,
        storage: &Storage,
        key: &str,
    ) -> Result<StoredManifest> {
        self.checker.finish()?;
        Ok(StoredManifest {
            header: header.clone(),
            obj,
            storage: storage.clone(),
            key: key.to_string(),
            layout: self.layout,
            kept: self.kept,
            files: self.files,
            bytes: self.bytes,
            checked: true,
        })
    }
}

/// A manifest as [`Manifest::load_as`] reads it for [`Manifest::open`]: checked whole,
/// or (format 4) its header, whose parts are checked next.
enum Opened {
    Checked(Box<StoredManifest>),
    Parted(Box<Manifest>, String),
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
        fn checked<'k>(
            header: &'k Manifest,
            key: &'k str,
            keep: &'k [&'k str],
        ) -> Result<Checked<'k>> {
            Ok(Checked {
                checker: EntryChecker::new(header, key)?,
                keep,
                layout: Vec::new(),
                kept: Vec::new(),
                files: 0,
                bytes: 0,
            })
        }
        let opened = Manifest::load_as(storage, stanza, label, |obj, key| {
            let header = match Manifest::decode_header(obj, key)? {
                Some(header) => header,
                None => Manifest::decode(obj, key)?.into_header(),
            };
            Manifest::check_identity(&header, key, stanza, label)?;
            if !header.parts.is_empty() {
                return Ok(Opened::Parted(Box::new(header), key.to_string()));
            }
            let mut check = checked(&header, key, keep)?;
            read_entries::<Error>(obj, key, |e| check.entry(e))?;
            let stored = check.finish(&header, obj.clone(), storage, key)?;
            Ok(Opened::Checked(Box::new(stored)))
        })
        .await?;
        match opened {
            Opened::Checked(stored) => Ok(*stored),
            Opened::Parted(header, key) => {
                let mut check = checked(&header, &key, keep)?;
                header
                    .for_each_part_entry::<Error>(storage, |e| check.entry(e))
                    .await?;
                check.finish(&header, Bytes::new(), storage, &key)
            }
        }
    }
}

impl Manifest {
    /// Backup `label`'s manifest for one reading in order, by a reader that can stop
    /// midway without harm (a backup reading its prior backup's entries as it walks):
    /// [`Manifest::open`] without its first reading. Of a format 4 manifest only the
    /// header is read here, and [`StoredManifest::for_each_entry`] checks each entry as
    /// it hands it over (a damaged entry is an error there, not here); `layout`, `kept`
    /// and `files` are empty. A manifest before format 4 is checked whole, as by `open`.
    pub async fn open_unread(
        storage: &Storage,
        stanza: &str,
        label: &str,
    ) -> Result<StoredManifest> {
        let header = Manifest::load_header(storage, stanza, label).await?;
        if header.parts.is_empty() {
            return Manifest::open(storage, stanza, label, &[]).await;
        }
        let key = crate::layout::manifest(stanza, label);
        Ok(StoredManifest {
            header,
            obj: Bytes::new(),
            storage: storage.clone(),
            key,
            layout: Vec::new(),
            kept: Vec::new(),
            files: 0,
            bytes: 0,
            checked: false,
        })
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
    /// from `each` (of the caller's type) stops the reading and is returned. A format 4
    /// manifest's parts are fetched again, one at a time, each checked by its hash.
    pub async fn for_each_entry<E: From<Error>>(
        &self,
        mut each: impl FnMut(Entry) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let masked = |mut e: Entry| {
            e.owner_mut().mode &= super::validate::PERMISSION_BITS;
            e
        };
        if self.header.parts.is_empty() {
            read_entries(&self.obj, &self.key, |e| each(masked(e)))
        } else if self.checked {
            self.header
                .for_each_part_entry(&self.storage, |e| each(masked(e)))
                .await
        } else {
            // Masks modes as it checks.
            let mut checker = EntryChecker::new(&self.header, &self.key)?;
            self.header
                .for_each_part_entry(&self.storage, |mut e| {
                    checker.check(&mut e)?;
                    each(e)
                })
                .await?;
            checker.finish()?;
            Ok(())
        }
    }
}

/// Hand every entry of stored manifest `obj` (read from `what`), in order, to `each`,
/// skipping every other field; an error from `each` stops the reading and is returned.
pub(super) fn read_entries<E: From<Error>>(
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
