//! Reading entries without serde's buffering.
//!
//! `Entry` is an internally tagged enum and a file entry's owner is flattened into it:
//! derived, both make serde read every entry into a buffer of its own values first (the
//! tag may come anywhere; a flattened struct takes what the others leave) and then read
//! that buffer again. For a manifest of 300,000 files that buffering was about a third of
//! its decoding. Here an entry whose first key is `kind` (as pgstrata writes them) is read
//! straight into its variant, and a file entry is read through [`FileWire`], the same
//! fields with the owner's spelled out. An entry with `kind` elsewhere is still read (as
//! a JSON value first): the stored form is JSON, and key order is not part of it.

use super::{BlockHashes, Chunks, DirEntry, Entry, FileEntry, LinkEntry, Owner};
use super::{PackUse, ThinVec};
use crate::json_text as text;
use crate::name::Name;
use serde::de::{self, value::MapAccessDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Dir,
    Link,
    File,
}

impl Kind {
    /// The entry of this kind that `d` holds (the object's other fields).
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<Entry, D::Error> {
        Ok(match self {
            Kind::Dir => Entry::Dir(Box::new(DirEntry::deserialize(d)?)),
            Kind::Link => Entry::Link(Box::new(LinkEntry::deserialize(d)?)),
            Kind::File => Entry::File(Box::new(FileEntry::deserialize(d)?)),
        })
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        d.deserialize_map(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a manifest entry (an object with a kind)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
        let first: Option<String> = map.next_key()?;
        let Some(first) = first else {
            return Err(de::Error::missing_field("kind"));
        };
        if first == "kind" {
            let kind: Kind = map.next_value()?;
            return kind.read(MapAccessDeserializer::new(map));
        }
        // `kind` comes later: read the whole object, then its variant from it.
        let mut object = serde_json::Map::new();
        object.insert(first, map.next_value()?);
        while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
            object.insert(key, value);
        }
        let kind = object
            .remove("kind")
            .ok_or_else(|| de::Error::missing_field("kind"))?;
        let kind = Kind::deserialize(kind).map_err(de::Error::custom)?;
        kind.read(serde_json::Value::Object(object))
            .map_err(de::Error::custom)
    }
}

/// A [`FileEntry`] as stored: its fields with the owner's among them (see `FileEntry`
/// for what each is).
#[derive(Deserialize)]
pub(super) struct FileWire {
    path: Box<str>,
    size: u64,
    mtime: i64,
    mode: u32,
    uid: u32,
    gid: u32,
    #[serde(default)]
    user: Option<Name>,
    #[serde(default)]
    group: Option<Name>,
    #[serde(with = "text::content_hash")]
    hash: Option<[u8; 32]>,
    chunks: Chunks,
    #[serde(default)]
    bad_pages: ThinVec<u32>,
    #[serde(default)]
    block_size: u32,
    #[serde(default, with = "text::block_hashes")]
    block_hashes: BlockHashes,
    #[serde(default)]
    map: Option<Box<crate::chunk::Chunk>>,
    #[serde(default)]
    packs: ThinVec<PackUse>,
    #[serde(default)]
    map_depth: u8,
}

impl From<FileWire> for FileEntry {
    fn from(w: FileWire) -> FileEntry {
        FileEntry {
            path: w.path,
            size: w.size,
            mtime: w.mtime,
            owner: Owner {
                mode: w.mode,
                uid: w.uid,
                gid: w.gid,
                user: w.user,
                group: w.group,
            },
            hash: w.hash,
            chunks: w.chunks,
            bad_pages: w.bad_pages,
            block_size: w.block_size,
            block_hashes: w.block_hashes,
            map: w.map,
            packs: w.packs,
            map_depth: w.map_depth,
        }
    }
}

/// Reads a manifest's fields up to its `entries` (which pgstrata writes last) into
/// `header`, and stops there: `reached` tells that it got there. The stop is an error to
/// the JSON parser (the object is left unfinished), which the caller expects.
pub(super) struct HeaderSeed<'a> {
    pub header: &'a mut serde_json::Map<String, serde_json::Value>,
    pub reached: &'a mut bool,
}

impl<'de> de::DeserializeSeed<'de> for HeaderSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a manifest")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == "entries" {
                *self.reached = true;
                return Err(de::Error::custom("stopped at the entries"));
            }
            let value: serde_json::Value = map.next_value()?;
            self.header.insert(key, value);
        }
        Ok(())
    }
}

/// Reads a manifest's `entries` one at a time, handing each to `each`, and skips every
/// other field: a manifest read as a stream ([`super::StoredManifest`]). When `each`
/// fails, the parse stops and its error waits in `failed` (the parser's own error only
/// says that it stopped).
pub(super) struct EntriesSeed<'a, F, E> {
    pub each: &'a mut F,
    pub failed: &'a mut Option<E>,
    /// Whether the manifest had its `entries`.
    pub found: &'a mut bool,
}

impl<'de, F: FnMut(Entry) -> Result<(), E>, E> de::DeserializeSeed<'de> for EntriesSeed<'_, F, E> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(Entry) -> Result<(), E>, E> Visitor<'de> for EntriesSeed<'_, F, E> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a manifest")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key != "entries" {
                map.next_value::<de::IgnoredAny>()?;
                continue;
            }
            *self.found = true;
            map.next_value_seed(EachEntry {
                each: &mut *self.each,
                failed: &mut *self.failed,
            })?;
        }
        Ok(())
    }
}

/// The `entries` array of [`EntriesSeed`].
struct EachEntry<'a, F, E> {
    each: &'a mut F,
    failed: &'a mut Option<E>,
}

impl<'de, F: FnMut(Entry) -> Result<(), E>, E> de::DeserializeSeed<'de> for EachEntry<'_, F, E> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(Entry) -> Result<(), E>, E> Visitor<'de> for EachEntry<'_, F, E> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of entries")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<Entry>()? {
            if let Err(e) = (self.each)(e) {
                *self.failed = Some(e);
                return Err(de::Error::custom("stopped"));
            }
        }
        Ok(())
    }
}
