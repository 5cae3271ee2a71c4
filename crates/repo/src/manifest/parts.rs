//! Format 4: a manifest's entries in parts.
//!
//! A manifest of format 3 or less is one object holding every entry, so whoever reads it
//! holds the whole object (about 77 bytes a file, stored) and whoever writes it builds it
//! whole. From format 4 the object `backup.manifest` holds the header and a list of
//! [`PartRef`]s, and the entries, in path order, are in parts of up to [`PART_ENTRIES`]
//! entries (`<label>/manifest/<n>`), each written with its copy before the manifest. A
//! reader holds one part at a time; the parts are what a writer can produce as it goes.
//!
//! A part is stored as a manifest is (`PGSTRMAN`, BLAKE3 of the body, zstd JSON) and its
//! JSON is `{"entries":[...]}`. The manifest records each part's BLAKE3 and entry count,
//! so a part is checked against the manifest before any of its entries is read: a part
//! that fails (or is missing) is read from its copy, as a damaged manifest is, and a
//! part whose copy fails too makes the backup damaged. Because a part is checked by the
//! manifest's hash of it, the entries need not be checked again when it is read a second
//! time: what was read the first time is what is read.

use super::stream::read_entries;
use super::{encode_checked, read_with_copy, Entry, Manifest, Missing, PartRef, PART_ENTRIES};
use crate::{layout, Error, Result, Storage};
use bytes::Bytes;

/// What a part's JSON holds.
#[derive(serde::Serialize)]
struct PartBody<'a> {
    entries: &'a [Entry],
}

impl Manifest {
    /// Write `entries` (this manifest's, in order) as parts of at most `per_part`, each
    /// after its copy, and record them in `parts`. Through a repository on another host,
    /// a part of a backup with a prior one crosses the line as a patch against the prior's
    /// part of the same number.
    pub(super) async fn write_parts(
        &mut self,
        storage: &Storage,
        entries: &[Entry],
        per_part: usize,
    ) -> Result<()> {
        self.parts.clear();
        for (n, chunk) in entries.chunks(per_part.clamp(1, PART_ENTRIES)).enumerate() {
            let part = Bytes::from(encode_checked(super::MAGIC, &PartBody { entries: chunk }));
            let (copy, key) = (
                layout::manifest_part_copy(&self.stanza, &self.label, n),
                layout::manifest_part(&self.stanza, &self.label, n),
            );
            let stored = match &self.prior {
                Some(prior) => {
                    let base = layout::manifest_part(&self.stanza, prior, n);
                    storage
                        .put_new_twice_against(&copy, &key, &base, part, super::patch::make)
                        .await?
                }
                None => storage
                    .put_new_twice(&copy, &key, part.clone())
                    .await
                    .map(|()| part)?,
            };
            self.parts.push(PartRef {
                entries: chunk.len() as u32,
                hash: stored[8..40]
                    .try_into()
                    .expect("a stored part has its hash"),
            });
        }
        Ok(())
    }

    /// Hand every entry in the parts of manifest `self` (a format 4 manifest's header)
    /// to `each`, in order, each part checked against its reference first. An error from
    /// `each` (of the caller's type) stops the reading and is returned. The next part is
    /// fetched while one is read: on an object store a fetch is a round trip.
    pub(super) async fn for_each_part_entry<E: From<Error>>(
        &self,
        storage: &Storage,
        mut each: impl FnMut(Entry) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let fetch = |n: usize| {
            let (storage, stanza, label) =
                (storage.clone(), self.stanza.clone(), self.label.clone());
            let r = self.parts[n].clone();
            FetchAhead(tokio::spawn(async move {
                fetch_part(&storage, &stanza, &label, n, &r).await
            }))
        };
        let mut next = (!self.parts.is_empty()).then(|| fetch(0));
        for (n, r) in self.parts.iter().enumerate() {
            let (obj, key) = next
                .take()
                .expect("the part was fetched ahead")
                .fetched()
                .await?;
            if n + 1 < self.parts.len() {
                next = Some(fetch(n + 1));
            }
            let mut count = 0u32;
            read_entries(&obj, &key, |e| {
                count = count.saturating_add(1);
                each(e)
            })?;
            if count != r.entries {
                return Err(Error::corrupt(format!(
                    "{key}: holds {count} entries where the manifest says {}: the manifest is damaged or was altered",
                    r.entries
                ))
                .into());
            }
        }
        Ok(())
    }
}

/// A part being fetched ahead; stopped when the reading stops first.
struct FetchAhead(tokio::task::JoinHandle<Result<(Bytes, String)>>);

impl FetchAhead {
    async fn fetched(mut self) -> Result<(Bytes, String)> {
        (&mut self.0).await.map_err(|e| {
            Error::new(
                crate::ErrorKind::Storage,
                format!("read a part of the manifest: {e}"),
            )
        })?
    }
}

impl Drop for FetchAhead {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Part `n` of backup `label`'s manifest, or its copy when it is damaged or missing,
/// checked against `r`: the stored object and the key it was read from.
async fn fetch_part(
    storage: &Storage,
    stanza: &str,
    label: &str,
    n: usize,
    r: &PartRef,
) -> Result<(Bytes, String)> {
    let missing = Missing {
        object: None,
        copy_is_damage: true,
    };
    let (key, copy_key) = (
        layout::manifest_part(stanza, label, n),
        layout::manifest_part_copy(stanza, label, n),
    );
    read_with_copy(storage, &key, &copy_key, label, missing, |obj, at| {
        check_part(obj, at, r).map(|()| (obj.clone(), at.to_string()))
    })
    .await
}

/// A part read from `key` must be a stored manifest object whose hash `r` records.
fn check_part(obj: &[u8], key: &str, r: &PartRef) -> Result<()> {
    Manifest::check_stored(obj, key)?;
    if obj[8..40] != r.hash {
        return Err(Error::corrupt(format!(
            "{key}: is not the part its manifest lists (another hash): the manifest is damaged or was altered"
        )));
    }
    Ok(())
}
