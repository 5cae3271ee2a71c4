//! The backup manifest: everything needed to restore one backup, and the object whose
//! existence makes a backup exist.
//!
//! It is written last, after every pack it references and after the WAL the backup needs
//! is archived, with a create-only write, so a backup is either complete or invisible.
//!
//! Stored form: a checked JSON object (`crate::checked`) with magic `"PGSTRMAN"` of
//! [`Manifest`]; each part of a format 4 manifest is one too.

use crate::chunk::Chunk;
use crate::codec::Compression;
use crate::json_text as text;
use crate::name::Name;
use crate::stanza::ClusterIdentity;
use crate::{checked, layout, Error, ErrorKind, Result, Storage, FORMAT_VERSION};
use pgstrata_pg::lsn::Lsn;
use serde::{Deserialize, Serialize};
pub use smallvec::SmallVec;
use std::collections::BTreeMap;
pub use thin_vec::ThinVec;

/// A file's extents: held in its entry when there is one (a small file's), allocated
/// apart when there are more.
pub type Chunks = SmallVec<[Chunk; 1]>;
/// A file's block hashes: held in its entry for files of up to two blocks (most files of a
/// cluster of many small tables).
pub type BlockHashes = SmallVec<[u64; 2]>;

mod map;
mod parts;
pub mod patch;
mod stream;
#[cfg(test)]
pub(crate) mod tests;
mod twins;
pub(crate) mod validate;
mod wire;

pub use map::{
    FileMap, MapDelta, MapFrame, MapRun, PackUsage, PackUse, INLINE_MAX_BLOCKS, MAX_MAP_DEPTH,
};
pub use parts::{check_part, decode_part, EncodedPart, PartsWriter};
pub use stream::StoredManifest;
pub use twins::DamagedTwin;
pub use validate::{check_annotation, is_backup_label};

const MAGIC: &[u8; 8] = b"PGSTRMAN";

// Names as given to `--type`.
crate::named! {
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum BackupType { Full = "full", Diff = "diff", Incr = "incr" }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub label: String,
    #[serde(rename = "type")]
    pub backup_type: BackupType,
    /// Label of the backup this one was compared against (none for a full backup).
    #[serde(default)]
    pub prior: Option<String>,
    pub stanza: String,
    pub cluster: ClusterIdentity,
    /// server_version_num of the server backed up.
    pub server_version_num: u32,
    pub start: WalPoint,
    pub stop: WalPoint,
    /// The backup_label text returned by pg_backup_stop; restore writes it as backup_label.
    pub backup_label: String,
    /// The tablespace_map text returned by pg_backup_stop, if any.
    #[serde(default)]
    pub tablespace_map: Option<String>,
    pub compression: Compression,
    pub frame_size: u32,
    pub data_checksums: bool,
    pub tablespaces: Vec<Tablespace>,
    /// The data directory's symbolic links (other than tablespaces'), which the backup
    /// followed: their entries hold what they pointed to. Restore makes them links again
    /// only when asked (`--link-all`, `--link-map`). Absent in manifests written before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<DataLink>,
    pub stats: Stats,
    /// Compression of the other backups whose packs this manifest's chunks reference
    /// (chunks with `b` set), by label.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pack_codecs: std::collections::BTreeMap<String, crate::codec::CompressType>,
    /// How changed blocks were found (incremental and differential backups; none for a
    /// full backup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track: Option<Tracking>,
    /// Why the maps were not used, when they were not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track_reason: Option<String>,
    /// Outcome of cross-checking the maps with PostgreSQL 17+ WAL summaries, when the
    /// server has them (summarize_wal = on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_check: Option<String>,
    /// Why every block was hashed instead of trusting size and mtime, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_reason: Option<String>,
    /// The cluster's databases when it was backed up, by OID: what selective restore
    /// (`--db-include`, `--db-exclude`) goes by. `None` in manifests written before they
    /// were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub databases: Option<Vec<Database>>,
    /// The operator's notes on this backup (`backup --annotation=key=value`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// What the backup references in packs: `[owner label, pack, stored bytes]` for every
    /// pack, as [`Manifest::pack_usage`] counts it from the entries (and checked against
    /// them when they are read). Stored so that the header alone tells it
    /// ([`Manifest::load_header`]); absent in manifests written before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packs_used: Option<Vec<(String, String, u64)>>,
    /// Format 4: where the entries are, the manifest's parts in order (see [`PartRef`]).
    /// Empty in a manifest before format 4, which holds its entries itself; such a
    /// manifest's `entries` are filled in from the parts when it is read whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartRef>,
    /// Last, so that a reader of the header stops before it (pgstrata writes fields in
    /// this order; manifests written before `packs_used` have `stats` and more after it).
    /// Stored empty in format 4, whose entries are in its parts.
    pub entries: Vec<Entry>,
}

/// One part of a format 4 manifest: a stored object of up to [`PART_ENTRIES`] entries
/// (`<label>/manifest/<n>`, written with its copy before the manifest), checked against
/// this reference before any of its entries is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRef {
    /// How many entries the part holds.
    pub entries: u32,
    /// BLAKE3 of the part object's body (its bytes 40..end, as its own bytes 8..40).
    #[serde(with = "text::hash32")]
    pub hash: [u8; 32],
}

/// Most entries in one part of a manifest: about 2.5 MB stored and 10 MB of JSON for
/// files of one to three blocks, which is what a reader of a part holds at once.
pub const PART_ENTRIES: usize = 32_768;

/// A database of the backed-up cluster. Its files are under `base/<oid>/` and
/// `pg_tblspc/<tablespace>/PG_<major>_<catalog_version>/<oid>/`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Database {
    pub name: String,
    pub oid: u32,
}

impl Database {
    /// PostgreSQL's own databases (template0, template1, postgres: OIDs below
    /// FirstNormalObjectId), which a selective restore always restores.
    pub fn is_system(&self) -> bool {
        self.oid < FIRST_NORMAL_OBJECT_ID
    }
}

/// PostgreSQL's FirstNormalObjectId: objects created by initdb have lower OIDs.
pub const FIRST_NORMAL_OBJECT_ID: u32 = 16384;

/// A point of the backup: when and where in the WAL it started or stopped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WalPoint {
    /// RFC 3339 time, UTC.
    pub time: String,
    /// Unix seconds of `time`.
    pub epoch: i64,
    /// Stored as PostgreSQL prints it (`0/5000028`).
    #[serde(with = "text::lsn")]
    pub lsn: Lsn,
    pub timeline: u32,
    pub wal: String,
}

/// How a diff/incr backup found the changed blocks of changed relation files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tracking {
    /// From the block-change maps archive-push leaves beside each WAL segment.
    Wal,
    /// By reading and hashing every changed file.
    Hash,
}

impl Tracking {
    /// The name stored in the manifest and shown by `info`.
    pub fn name(self) -> &'static str {
        match self {
            Tracking::Wal => "wal",
            Tracking::Hash => "hash",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Tablespace {
    pub oid: u32,
    /// Absolute path the pg_tblspc/<oid> link pointed to on the source.
    pub location: String,
}

/// A symbolic link at the top of the data directory (`pg_wal -> /fast/wal`, a log
/// directory, `postgresql.conf -> /etc/...`): its entry (directory or file) at `path` holds
/// what it pointed to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DataLink {
    /// A name in the data directory (no `/`).
    pub path: String,
    /// The link's target, as read from it (absolute, or relative to the data directory).
    pub target: String,
}

/// Ownership and permissions of a path. Names are preferred when restoring, ids are the
/// fallback when the name does not exist on the restore host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Owner {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub user: Option<Name>,
    #[serde(default)]
    pub group: Option<Name>,
}

/// One path of the backup. Every variant is boxed: a manifest holds one entry per path,
/// and with the data inline every slot of the entry list (and its growth by doubling)
/// would pay for the largest variant (72 bytes, not 16).
///
/// Stored as one JSON object with its `kind` (`dir`, `link`, `file`) and the variant's
/// fields; read by [`wire`], which takes `kind` first when it comes first (as written).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Entry {
    Dir(Box<DirEntry>),
    Link(Box<LinkEntry>),
    File(Box<FileEntry>),
}

impl Entry {
    pub fn dir(path: impl Into<String>, owner: Owner) -> Entry {
        Entry::Dir(Box::new(DirEntry {
            path: path.into(),
            owner,
        }))
    }

    pub fn link(path: impl Into<String>, target: impl Into<String>, owner: Owner) -> Entry {
        Entry::Link(Box::new(LinkEntry {
            path: path.into(),
            target: target.into(),
            owner,
        }))
    }

    pub fn path(&self) -> &str {
        match self {
            Entry::Dir(d) => &d.path,
            Entry::Link(l) => &l.path,
            Entry::File(f) => &f.path,
        }
    }

    pub fn owner(&self) -> &Owner {
        match self {
            Entry::Dir(d) => &d.owner,
            Entry::Link(l) => &l.owner,
            Entry::File(f) => &f.owner,
        }
    }

    pub fn owner_mut(&mut self) -> &mut Owner {
        match self {
            Entry::Dir(d) => &mut d.owner,
            Entry::Link(l) => &mut l.owner,
            Entry::File(f) => &mut f.owner,
        }
    }
}

/// A directory (the data directory itself has the path `""`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DirEntry {
    pub path: String,
    #[serde(flatten)]
    pub owner: Owner,
}

/// A symbolic link: a tablespace's `pg_tblspc/<oid>` (the only links a manifest holds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LinkEntry {
    pub path: String,
    pub target: String,
    #[serde(flatten)]
    pub owner: Owner,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "wire::FileWire")]
pub struct FileEntry {
    /// Path relative to the data directory, '/'-separated; tablespace files are under
    /// `pg_tblspc/<oid>/`. Boxed rather than a `String`: set once, and one word less in
    /// every entry.
    pub path: Box<str>,
    pub size: u64,
    /// Modification time, unix seconds.
    pub mtime: i64,
    #[serde(flatten)]
    pub owner: Owner,
    /// BLAKE3 of the content (stored as hex); none (stored as `""`) for a relation file,
    /// and for a file copied by WAL tracking without reading every block: then each
    /// block's hash in `block_hashes` is the check.
    #[serde(with = "text::content_hash")]
    pub hash: Option<[u8; 32]>,
    pub chunks: Chunks,
    /// Blocks whose page checksum failed while backing up (real corruption, not torn reads).
    /// A thin list (one pointer, no allocation while empty): almost every file has none.
    #[serde(default, skip_serializing_if = "ThinVec::is_empty")]
    pub bad_pages: ThinVec<u32>,
    /// Size of the blocks `block_hashes` describes (the last block may be shorter).
    #[serde(default)]
    pub block_size: u32,
    /// XXH3-64 of every block ([`block_hash`]), in order; stored as one string of 16 hex
    /// digits per block. The next backup compares blocks against these; delta restore
    /// compares local blocks.
    #[serde(
        default,
        skip_serializing_if = "BlockHashes::is_empty",
        with = "text::block_hashes"
    )]
    pub block_hashes: BlockHashes,
    /// Format 2: the frame holding the file's extents and block hashes ([`FileMap`]),
    /// when they are not inline; `chunks` and `block_hashes` are then empty as stored
    /// (and until the map is loaded).
    /// Boxed: most entries have none, and every entry is held in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<Box<Chunk>>,
    /// Format 2, with `map`: the packs the map and the file's extents use. Thin, as
    /// `bad_pages`: files without a map (most, with many small files) have none.
    #[serde(default, skip_serializing_if = "ThinVec::is_empty")]
    pub packs: ThinVec<PackUse>,
    /// Format 2, with `map`: how many delta maps ([`map::MapDelta`]) lead from `map` to
    /// a whole map (0: `map` is whole).
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub map_depth: u8,
}

fn is_zero_u8(v: &u8) -> bool {
    *v == 0
}

impl FileEntry {
    pub fn block_count(&self) -> usize {
        self.block_hashes.len()
    }

    /// Hash of block `i`, if recorded.
    pub fn block_hash(&self, i: usize) -> Option<u64> {
        self.block_hashes.get(i).copied()
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The block hash used in manifests.
pub fn block_hash(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Bytes of all files backed up (the database size as restored).
    pub db_size: u64,
    /// Bytes of pack objects written by this backup (the manifest itself not counted).
    pub stored_size: u64,
    pub files: u64,
    /// Files carried from the prior backup by reference, without reading them.
    #[serde(default)]
    pub files_unchanged: u64,
    /// Bytes read from the data directory.
    #[serde(default)]
    pub bytes_read: u64,
    /// Files whose changed blocks came from the WAL (only those blocks were read).
    #[serde(default)]
    pub files_tracked: u64,
    /// In a WAL-tracked backup, changed files read and hashed instead, per reason.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub files_hashed: std::collections::BTreeMap<String, u64>,
    /// Bytes read whose blocks an interrupted backup had already stored: pointed at its
    /// frames instead of being compressed and stored again (resume).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumed: u64,
    pub packs: u64,
    pub pages_checked: u64,
    pub page_errors: u64,
    pub duration_ms: u64,
}

impl Manifest {
    /// The stored form. The JSON is compressed as it is written, never held whole.
    pub fn encode(&self) -> Vec<u8> {
        checked::encode(MAGIC, self)
    }

    /// Check the stored form's (a manifest's or a part's) magic and checksum.
    pub fn check_stored(obj: &[u8], what: &str) -> Result<()> {
        checked::body(obj, MAGIC, what, "manifest").map(|_| ())
    }

    /// The header of a stored manifest: everything but its entries, read without
    /// decompressing or parsing them (the checksum still covers the whole object). `None`
    /// when the header does not come whole before the entries (a manifest written before
    /// `packs_used`, or one a reader should decode whole to learn what is wrong with it).
    pub fn decode_header(obj: &[u8], what: &str) -> Result<Option<Manifest>> {
        Manifest::check_stored(obj, what)?;
        let mut de = json_of(obj, what)?;
        let mut header = serde_json::Map::new();
        // Stopping at "entries" leaves the object unfinished, so the parse always ends in
        // an error; whether the header was reached is what counts.
        let mut reached = false;
        let _ = serde::de::DeserializeSeed::deserialize(
            wire::HeaderSeed {
                header: &mut header,
                reached: &mut reached,
            },
            &mut de,
        );
        if !reached || !header.contains_key("stats") || !header.contains_key("packs_used") {
            return Ok(None);
        }
        header.insert("entries".into(), serde_json::Value::Array(Vec::new()));
        let Ok(m) = Manifest::deserialize(serde_json::Value::Object(header)) else {
            return Ok(None);
        };
        crate::error::check_format_version(what, m.format_version, FORMAT_VERSION)?;
        validate::validate_header(&m, what)?;
        Ok(Some(m))
    }

    /// Decode and check stored manifest `obj`, read from `what`. A manifest of format 4
    /// comes without its entries (they are in its parts, which [`Manifest::load`] reads).
    pub fn decode(obj: &[u8], what: &str) -> Result<Manifest> {
        Manifest::check_stored(obj, what)?;
        let mut de = json_of(obj, what)?;
        let mut m = Manifest::deserialize(&mut de)
            .and_then(|m| de.end().map(|()| m))
            .map_err(|e| {
                Error::with_source(ErrorKind::Corrupt, format!("{what}: invalid manifest"), e)
            })?;
        crate::error::check_format_version(what, m.format_version, FORMAT_VERSION)?;
        if m.format_version >= 4 {
            // The entries are in the parts (`Manifest::load` reads them).
            validate::validate_parted(&m, what)?;
            return Ok(m);
        }
        validate::validate(&mut m, what)?;
        // The list grew by doubling while it was parsed: up to twice the room it needs,
        // held as long as the manifest is.
        m.entries.shrink_to_fit();
        Ok(m)
    }

    /// Load backup `label`'s manifest; when it is damaged, its copy (with a warning). The
    /// error of a backup whose manifest and copy are both damaged has kind `Corrupt`.
    pub async fn load(storage: &Storage, stanza: &str, label: &str) -> Result<Manifest> {
        let mut m = Manifest::load_as(storage, stanza, label, |obj, key| {
            Manifest::decode_at(obj, key, stanza, label)
        })
        .await?;
        if !m.parts.is_empty() {
            let total = m.parts.iter().map(|p| p.entries as usize).sum();
            let mut entries = Vec::with_capacity(total);
            m.for_each_part_entry::<Error>(storage, |e| {
                entries.push(e);
                Ok(())
            })
            .await?;
            m.entries = entries;
            validate::validate(&mut m, &layout::manifest(stanza, label))?;
        }
        Ok(m)
    }

    /// The header of backup `label`'s manifest ([`Manifest::into_header`]) with
    /// `packs_used` set, read as [`Manifest::load`] reads the manifest. Manifests written
    /// before `packs_used` are decoded whole for it.
    pub async fn load_header(storage: &Storage, stanza: &str, label: &str) -> Result<Manifest> {
        Manifest::load_as(storage, stanza, label, |obj, key| {
            if let Some(header) = Manifest::decode_header(obj, key)? {
                Manifest::check_identity(&header, key, stanza, label)?;
                return Ok(header);
            }
            let mut m = Manifest::decode_at(obj, key, stanza, label)?;
            if m.packs_used.is_none() {
                m.set_packs_used();
            }
            Ok(m.into_header())
        })
        .await
    }

    /// What `decode` makes of the manifest of `label`, or of its copy when the manifest is
    /// damaged.
    async fn load_as<T>(
        storage: &Storage,
        stanza: &str,
        label: &str,
        decode: impl Fn(&bytes::Bytes, &str) -> Result<T>,
    ) -> Result<T> {
        let missing = Missing {
            object: Some(Error::new(
                ErrorKind::NotFound,
                format!("backup '{label}' does not exist in stanza '{stanza}'"),
            )),
            // Backups written before copies existed have none.
            copy_is_damage: false,
        };
        let (key, copy_key) = (
            layout::manifest(stanza, label),
            layout::manifest_copy(stanza, label),
        );
        read_with_copy(storage, &key, &copy_key, label, missing, decode).await
    }

    /// Decode the manifest stored at `key`, which must be backup `label` of `stanza`.
    fn decode_at(obj: &[u8], key: &str, stanza: &str, label: &str) -> Result<Manifest> {
        let m = Manifest::decode(obj, key)?;
        Manifest::check_identity(&m, key, stanza, label)?;
        Ok(m)
    }

    /// A manifest read from `key` must be that of backup `label` of `stanza`.
    fn check_identity(m: &Manifest, key: &str, stanza: &str, label: &str) -> Result<()> {
        if m.label != label || m.stanza != stanza {
            return Err(Error::corrupt(format!(
                "{key}: holds the manifest of backup '{}' of stanza '{}': the manifest is damaged or was altered",
                m.label, m.stanza
            )));
        }
        Ok(())
    }

    /// Write the manifest, making the backup visible: its parts (format 4, each after its
    /// copy, recorded in `parts`), then its copy, then the manifest itself, all
    /// create-only. A crash before the last write leaves parts or a copy without a
    /// manifest, which are not a backup (expire removes them). Through a repository on
    /// another host, the manifest and parts of a backup with a prior one cross the line as
    /// patches against the prior's (`patch`).
    pub async fn publish(&mut self, storage: &Storage) -> Result<()> {
        self.publish_with(storage, PART_ENTRIES).await
    }

    /// [`Manifest::publish`] with parts of at most `per_part` entries (format 4; before
    /// it, the manifest holds its entries).
    pub(crate) async fn publish_with(&mut self, storage: &Storage, per_part: usize) -> Result<()> {
        if self.format_version < 4 {
            return self.publish_object(storage).await;
        }
        let entries = std::mem::take(&mut self.entries);
        let written = match self.write_parts(storage, &entries, per_part).await {
            Ok(()) => self.publish_object(storage).await,
            Err(e) => Err(e),
        };
        self.entries = entries;
        written
    }

    /// Write the object `backup.manifest` (after its copy): for format 4, once its parts
    /// are written ([`PartsWriter`]).
    pub async fn publish_object(&self, storage: &Storage) -> Result<()> {
        let (copy, manifest) = (
            layout::manifest_copy(&self.stanza, &self.label),
            layout::manifest(&self.stanza, &self.label),
        );
        let data = bytes::Bytes::from(self.encode());
        match &self.prior {
            Some(prior) => {
                let base = layout::manifest(&self.stanza, prior);
                storage
                    .put_new_twice_against(&copy, &manifest, &base, data, patch::make)
                    .await
                    .map(drop)
            }
            None => storage.put_new_twice(&copy, &manifest, data).await,
        }
    }

    /// Codec of the frames stored by backup `owner` (this one or one it references).
    pub(crate) fn codec_of(&self, owner: &str) -> crate::codec::CompressType {
        if owner == self.label {
            self.compression.kind
        } else {
            self.pack_codecs
                .get(owner)
                .copied()
                .unwrap_or(self.compression.kind)
        }
    }

    /// Record [`Manifest::pack_usage`] in `packs_used` (a backup does, before it writes
    /// the manifest).
    pub fn set_packs_used(&mut self) {
        let usage = self.pack_usage();
        self.packs_used = Some(usage.into_iter().map(|((o, p), n)| (o, p, n)).collect());
    }

    /// What the backup references in packs, per (owner label, pack): from `packs_used`
    /// when it is there (a header has no entries to count), from the entries otherwise.
    pub fn packs_used(&self) -> BTreeMap<(String, String), u64> {
        match &self.packs_used {
            Some(list) => list
                .iter()
                .map(|(o, p, n)| ((o.clone(), p.clone()), *n))
                .collect(),
            None => self.pack_usage(),
        }
    }

    /// This manifest without its entries: what listing backups keeps of each.
    pub fn into_header(mut self) -> Manifest {
        self.entries = Vec::new();
        self
    }

    pub fn files(&self) -> impl Iterator<Item = &FileEntry> {
        self.entries.iter().filter_map(|e| match e {
            Entry::File(f) => Some(&**f),
            _ => None,
        })
    }
}

/// What [`read_with_copy`] makes of a missing object.
struct Missing {
    /// The error of the object missing; `None`: damage, its copy is read.
    object: Option<Error>,
    /// A missing copy is damage too; otherwise the object's own failure is reported.
    copy_is_damage: bool,
}

/// What `decode` makes of object `key` of backup `label`, or, when it is damaged (fails
/// `decode` as `Corrupt`, or authentication), of its copy `copy_key` (the same bytes,
/// sealed under `key`'s name in an encrypted stanza), with a warning naming both. When
/// both are damaged, the backup is: the error says so and names both failures. Any other
/// failure (storage, a newer format) is returned as it is.
async fn read_with_copy<T>(
    storage: &Storage,
    key: &str,
    copy_key: &str,
    label: &str,
    missing: Missing,
    decode: impl Fn(&bytes::Bytes, &str) -> Result<T>,
) -> Result<T> {
    let damage = match storage.get_cached(key).await {
        Ok(obj) => match decode(&obj, key) {
            Err(e) if e.kind == ErrorKind::Corrupt => e,
            other => return other,
        },
        Err(e) if e.is_not_found() => match missing.object {
            Some(error) => return Err(error),
            None => Error::corrupt(format!("{key} is missing")),
        },
        // A sealed object that fails authentication.
        Err(e) if e.kind == ErrorKind::Corrupt => e,
        Err(e) => return Err(e),
    };
    let copy = match storage.get_sealed_as(copy_key, key).await {
        Ok(obj) => decode(&obj, copy_key),
        Err(e) if e.is_not_found() && missing.copy_is_damage => {
            Err(Error::corrupt(format!("{copy_key} is missing")))
        }
        Err(e) if e.is_not_found() => return Err(damage),
        Err(e) => Err(e),
    };
    match copy {
        Ok(m) => {
            log::warn!("{damage}; reading its copy {copy_key}, which is intact");
            Ok(m)
        }
        Err(e) if e.kind == ErrorKind::Corrupt => Err(Error::corrupt(format!(
            "backup '{label}' is damaged: {damage}; and its copy: {e}"
        ))),
        Err(e) => Err(e),
    }
}

/// The JSON of stored manifest `obj` (its checksum already checked), to parse as it is
/// decompressed: the JSON text of a large manifest is never held whole.
fn json_of<'a>(
    obj: &'a [u8],
    what: &str,
) -> Result<serde_json::Deserializer<serde_json::de::IoRead<impl std::io::Read + 'a>>> {
    let json =
        crate::codec::zstd_bounded_reader(&obj[checked::HEADER_LEN..], MAX_MANIFEST_RATIO, what)?;
    Ok(serde_json::Deserializer::from_reader(
        std::io::BufReader::with_capacity(256 << 10, json),
    ))
}

/// How much larger than its compressed body a manifest's JSON may be. Real manifests
/// compress about 3 to 40 times (hex digests, varied paths).
const MAX_MANIFEST_RATIO: u64 = 256;

/// Labels of all complete backups of a stanza (those with a manifest), oldest first.
/// Labels sort by time by construction.
///
/// On an immutable repository (and one read as of a time) an expired backup's manifest may
/// stay until its retention has passed: the expire records say which backups are gone, and
/// they are left out. Elsewhere expire deletes the manifest right after writing its record.
pub async fn list_backups(storage: &Storage, stanza: &str) -> Result<Vec<String>> {
    let mut labels = list_manifested(storage, stanza).await?;
    if storage.object_lock().is_some() || storage.read_as_of().is_some() {
        let records = crate::expire_record::ExpireRecord::load_all(storage, stanza).await?;
        labels.retain(|label| !records.expired_backup(label));
    }
    Ok(labels)
}

/// Backups an expire removed whose manifest is still there: kept by an immutable
/// repository until their retention has passed, or left by an expire that was interrupted
/// between its record and its deletes. Oldest first.
pub async fn expired_remains(storage: &Storage, stanza: &str) -> Result<Vec<String>> {
    let mut labels = list_manifested(storage, stanza).await?;
    let records = crate::expire_record::ExpireRecord::load_all(storage, stanza).await?;
    labels.retain(|label| records.expired_backup(label));
    Ok(labels)
}

/// Labels of the backups that have a manifest, whatever expire records say.
async fn list_manifested(storage: &Storage, stanza: &str) -> Result<Vec<String>> {
    use futures::{StreamExt, TryStreamExt};
    // One existence check per backup directory, overlapped: on an object store each is a
    // round trip, and info/expire/backup all start with this listing.
    let dirs = storage.list_dirs(&layout::backup_root(stanza)).await?;
    let checked: Vec<(String, bool)> = futures::stream::iter(dirs)
        .map(|dir| async move {
            let found = storage.exists(&layout::manifest(stanza, &dir)).await?;
            Ok::<_, Error>((dir, found))
        })
        .buffered(16)
        .try_collect()
        .await?;
    let mut labels: Vec<String> = checked
        .into_iter()
        .filter_map(|(dir, found)| found.then_some(dir))
        .collect();
    labels.sort();
    Ok(labels)
}

/// How many manifests [`scan_headers`] reads at once: each is held as stored (compressed;
/// about 74 bytes a file) while its header is read, or decoded whole when it was written
/// before `packs_used` (about 240 bytes a file).
const MANIFESTS_AT_ONCE: usize = 2;

/// The backups of a stanza: the headers of those whose manifest (or its copy) reads, and
/// those whose manifest and copy are both damaged.
#[derive(Debug)]
pub struct Backups {
    /// Oldest first: headers ([`Manifest::into_header`]), never something to restore from.
    pub headers: Vec<Manifest>,
    /// Oldest first.
    pub damaged: Vec<Damaged>,
}

/// A backup whose manifest exists but cannot be read.
#[derive(Debug)]
pub struct Damaged {
    pub label: String,
    pub error: Error,
}

/// The header of every backup of a stanza ([`Manifest::load_header`]: neither the entries
/// of a manifest nor all its JSON are read), damaged ones apart: what `info` and `expire`
/// need. Any other failure (storage, a manifest of a newer format) fails the scan.
pub async fn scan_headers(storage: &Storage, stanza: &str) -> Result<Backups> {
    use futures::{StreamExt, TryStreamExt};
    let labels = list_backups(storage, stanza).await?;
    let loaded: Vec<(String, Result<Manifest>)> = futures::stream::iter(labels)
        .map(|label| async move {
            match Manifest::load_header(storage, stanza, &label).await {
                Err(e) if e.kind != ErrorKind::Corrupt => Err(e),
                header => Ok((label, header)),
            }
        })
        .buffered(MANIFESTS_AT_ONCE)
        .try_collect()
        .await?;
    let mut out = Backups {
        headers: Vec::new(),
        damaged: Vec::new(),
    };
    for (label, header) in loaded {
        match header {
            Ok(header) => out.headers.push(header),
            Err(error) => out.damaged.push(Damaged { label, error }),
        }
    }
    Ok(out)
}
