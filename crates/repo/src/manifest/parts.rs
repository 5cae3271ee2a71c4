//! Format 4: a manifest's entries in parts.
//!
//! A manifest of format 3 or less is one object holding every entry, so whoever reads it
//! holds the whole object (about 77 bytes a file, stored) and whoever writes it builds it
//! whole. From format 4 the object `backup.manifest` holds the header and a list of
//! [`PartRef`]s, and the entries, in path order, are in parts of up to [`PART_ENTRIES`]
//! entries (`<label>/manifest/<n>`), each written with its copy before the manifest. A
//! reader holds one part at a time; the parts are what a writer can produce as it goes.
//!
//! A part is stored as a manifest is (`crate::checked`: `PGSTRMAN`, BLAKE3 of the body,
//! zstd JSON) and its
//! JSON is `{"entries":[...]}`. The manifest records each part's BLAKE3 and entry count,
//! so a part is checked against the manifest before any of its entries is read: a part
//! that fails (or is missing) is read from its copy, as a damaged manifest is, and a
//! part whose copy fails too makes the backup damaged. Because a part is checked by the
//! manifest's hash of it, the entries need not be checked again when it is read a second
//! time: what was read the first time is what is read.

use super::stream::read_entries;
use super::{read_with_copy, Entry, Manifest, Missing, PartRef, PART_ENTRIES};
use crate::checked;
use crate::{layout, Error, Result, Storage};
use bytes::Bytes;

/// A part being written: `{"entries":[...]}`, compressed as each entry comes.
struct PartBody {
    enc: checked::Encoder,
    entries: u32,
}

impl PartBody {
    fn new() -> PartBody {
        let mut enc = checked::Encoder::new(super::MAGIC);
        enc.raw(br#"{"entries":["#);
        PartBody { enc, entries: 0 }
    }

    fn add(&mut self, e: &Entry) {
        if self.entries > 0 {
            self.enc.raw(b",");
        }
        serde_json::to_writer(self.enc.writer(), e).expect("serialize into memory");
        self.entries += 1;
    }

    fn finish(mut self) -> (Bytes, u32) {
        self.enc.raw(b"]}");
        (Bytes::from(self.enc.finish()), self.entries)
    }
}

/// Writes a format 4 manifest's entries as parts while they are produced, so that a
/// writer never holds more than one part of them ([`PART_ENTRIES`] at most), and that
/// compressed: each entry is encoded as it is pushed.
///
/// Entries are pushed in path order (checked: a disorder is a bug of the caller, refused
/// before anything is written that says otherwise). A part is cut when it is full, and
/// can be cut earlier: a slot may be reserved for an entry that comes later (a backup's
/// `global/pg_control`, copied last), which gets a part of its own in its place in the
/// list, because parts may be written in any order and only the manifest, written last,
/// orders them. The writer hands each part it cuts back as an [`EncodedPart`], which
/// the caller stores when it likes ([`EncodedPart::store`]; the last one too, from
/// [`PartsWriter::cut`]) and records with
/// [`PartsWriter::stored`]; [`PartsWriter::finish`] puts the list and what the entries
/// reference in packs into the manifest's header.
pub struct PartsWriter {
    stanza: String,
    label: String,
    prior: Option<String>,
    per_part: usize,
    /// The part being filled, if any entry is in it.
    current: Option<PartBody>,
    /// One per part cut or reserved, in order; `None` until stored.
    parts: Vec<Option<PartRef>>,
    /// Slots reserved and not filled yet: their number and the path to come.
    reserved: Vec<(usize, String)>,
    previous: Option<String>,
    usage: super::PackUsage,
    files: u64,
    bytes: u64,
}

/// A part cut by a [`PartsWriter`], encoded as stored, not written yet.
pub struct EncodedPart {
    n: usize,
    entries: u32,
    body: Bytes,
    stanza: String,
    label: String,
    prior: Option<String>,
}

impl PartsWriter {
    /// A writer of the entries of backup `label` (whose prior backup is `prior`), at most
    /// `per_part` to a part.
    pub fn new(stanza: &str, label: &str, prior: Option<&str>, per_part: usize) -> PartsWriter {
        PartsWriter {
            stanza: stanza.to_string(),
            label: label.to_string(),
            prior: prior.map(str::to_string),
            per_part: per_part.clamp(1, PART_ENTRIES),
            current: None,
            parts: Vec::new(),
            reserved: Vec::new(),
            previous: None,
            usage: super::PackUsage::new(label),
            files: 0,
            bytes: 0,
        }
    }

    /// Files pushed so far, and their bytes.
    pub fn files(&self) -> (u64, u64) {
        (self.files, self.bytes)
    }

    /// Check that `path` comes after every path pushed or reserved so far.
    fn follows(&mut self, path: &str) -> Result<()> {
        if let Some(previous) = &self.previous {
            if previous.as_bytes() >= path.as_bytes() {
                return Err(Error::new(
                    crate::ErrorKind::Invalid,
                    format!(
                        "manifest of {}: entry {path:?} comes after {previous:?}: entries must be unique and in path order",
                        self.label
                    ),
                ));
            }
        }
        self.previous = Some(path.to_string());
        Ok(())
    }

    /// Add the next entry; a full part comes back to be stored.
    pub fn push(&mut self, e: &Entry) -> Result<Option<EncodedPart>> {
        self.follows(e.path())?;
        self.count(e);
        let part = self.current.get_or_insert_with(PartBody::new);
        part.add(e);
        Ok((part.entries as usize >= self.per_part)
            .then(|| self.cut())
            .flatten())
    }

    fn count(&mut self, e: &Entry) {
        if let Entry::File(f) = e {
            self.usage.add(f);
            (self.files, self.bytes) = (self.files + 1, self.bytes + f.size);
        }
    }

    /// End the current part here (if it holds any entry) and hand it back.
    pub fn cut(&mut self) -> Option<EncodedPart> {
        let part = self.current.take()?;
        self.parts.push(None);
        Some(self.encode(self.parts.len() - 1, part))
    }

    fn encode(&self, n: usize, part: PartBody) -> EncodedPart {
        let (body, entries) = part.finish();
        EncodedPart {
            n,
            entries,
            body,
            stanza: self.stanza.clone(),
            label: self.label.clone(),
            prior: self.prior.clone(),
        }
    }

    /// Keep the place of the entry at `path`, to come later ([`PartsWriter::fill`]): the
    /// current part is cut (and handed back) and the entry gets a part of its own.
    pub fn reserve(&mut self, path: &str) -> Result<Option<EncodedPart>> {
        self.follows(path)?;
        let cut = self.cut();
        self.parts.push(None);
        self.reserved.push((self.parts.len() - 1, path.to_string()));
        Ok(cut)
    }

    /// The entry a slot was reserved for, as its part.
    pub fn fill(&mut self, e: Entry) -> Result<EncodedPart> {
        let Some(i) = self.reserved.iter().position(|(_, p)| p == e.path()) else {
            return Err(Error::new(
                crate::ErrorKind::Invalid,
                format!(
                    "manifest of {}: no place was kept for entry {:?}",
                    self.label,
                    e.path()
                ),
            ));
        };
        let (n, _) = self.reserved.swap_remove(i);
        self.count(&e);
        let mut part = PartBody::new();
        part.add(&e);
        Ok(self.encode(n, part))
    }

    /// Record a part stored by [`EncodedPart::store`].
    pub fn stored(&mut self, (n, r): (usize, PartRef)) {
        self.parts[n] = Some(r);
    }

    /// Put the parts and `packs_used` into `header`, once every part is stored.
    pub fn finish(self, header: &mut Manifest) -> Result<()> {
        let unfinished = |what: String| {
            Error::new(
                crate::ErrorKind::Invalid,
                format!("manifest of {}: {what}", self.label),
            )
        };
        if let Some((_, path)) = self.reserved.first() {
            return Err(unfinished(format!("the entry {path:?} never came")));
        }
        if self.current.is_some() {
            return Err(unfinished("its last part was not stored".into()));
        }
        header.parts = self
            .parts
            .into_iter()
            .enumerate()
            .map(|(n, r)| r.ok_or_else(|| unfinished(format!("part {n} was not stored"))))
            .collect::<Result<_>>()?;
        header.packs_used = Some(
            self.usage
                .finish()
                .into_iter()
                .map(|((o, p), n)| (o, p, n))
                .collect(),
        );
        Ok(())
    }
}

impl EncodedPart {
    /// Write the part after its copy. Through a repository on another host, a part of a
    /// backup with a prior one crosses the line as a patch against the prior's part of the
    /// same number. Returns what [`PartsWriter::stored`] records.
    pub async fn store(self, storage: &Storage) -> Result<(usize, PartRef)> {
        let (copy, key) = (
            layout::manifest_part_copy(&self.stanza, &self.label, self.n),
            layout::manifest_part(&self.stanza, &self.label, self.n),
        );
        let part = self.body;
        let stored = match &self.prior {
            Some(prior) => {
                let base = layout::manifest_part(&self.stanza, prior, self.n);
                storage
                    .put_new_twice_against(&copy, &key, &base, part, super::patch::make)
                    .await?
            }
            None => storage
                .put_new_twice(&copy, &key, part.clone())
                .await
                .map(|()| part)?,
        };
        let r = PartRef {
            entries: self.entries,
            hash: stored[8..40]
                .try_into()
                .expect("a stored part has its hash"),
        };
        Ok((self.n, r))
    }
}

impl Manifest {
    /// Write `entries` (this manifest's, in order) as parts of at most `per_part`, each
    /// after its copy, and record them in `parts`. `packs_used` stays as the caller set
    /// it: a manifest is published as it is given.
    pub(super) async fn write_parts(
        &mut self,
        storage: &Storage,
        entries: &[Entry],
        per_part: usize,
    ) -> Result<()> {
        let mut writer =
            PartsWriter::new(&self.stanza, &self.label, self.prior.as_deref(), per_part);
        for e in entries {
            if let Some(part) = writer.push(e)? {
                writer.stored(part.store(storage).await?);
            }
        }
        if let Some(part) = writer.cut() {
            writer.stored(part.store(storage).await?);
        }
        let packs_used = self.packs_used.take();
        let finished = writer.finish(self);
        self.packs_used = packs_used;
        finished
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

/// The entries of part `obj` (read from `key`), its stored form checked (`repo-get`
/// shows them; readers of a backup use `for_each_part_entry`, which also checks the
/// part against its manifest).
pub fn decode_part(obj: &[u8], key: &str) -> Result<Vec<Entry>> {
    Manifest::check_stored(obj, key)?;
    let mut entries = Vec::new();
    super::stream::read_entries::<Error>(obj, key, |e| {
        entries.push(e);
        Ok(())
    })?;
    Ok(entries)
}

/// A part read from `key` must be a stored manifest object whose hash `r` records.
pub fn check_part(obj: &[u8], key: &str, r: &PartRef) -> Result<()> {
    Manifest::check_stored(obj, key)?;
    if checked::checksum(obj) != r.hash {
        return Err(Error::corrupt(format!(
            "{key}: is not the part its manifest lists (another hash): the manifest is damaged or was altered"
        )));
    }
    Ok(())
}
