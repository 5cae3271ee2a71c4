//! Validation of every decoded manifest, before anything acts on it.
//!
//! The manifest's BLAKE3 has no key: anyone who can write into the repository can write a
//! manifest with a valid checksum. Restore runs as root or as the cluster's owner and turns
//! each entry into a path, a link, a mode and an allocation, so a manifest is checked whole
//! as soon as it is decoded: paths that stay inside the data directory (or a tablespace,
//! through the tablespace mapping), links only where PostgreSQL has them, modes without
//! setuid, extents that add up, and every length bounded. A manifest that fails is refused
//! as damaged (exit 4) with the entry named; nothing has been written by then.

use super::{Entry, FileEntry, Manifest, Owner};
use crate::chunk::{Chunk, MAX_FRAME_LEN};
use crate::{layout, Error, Result};
use std::collections::HashMap;

/// Block sizes of a file's block map a writer may choose (`block_size_for` in the engine);
/// 0 means no block map.
pub(crate) const BLOCK_SIZES: [u32; 3] = [8192, 16384, 32768];
/// Most entries one manifest may hold.
pub(crate) const MAX_ENTRIES: usize = 100_000_000;
/// Most entries in one part of a manifest (format 4) a reader accepts.
pub(crate) const MAX_PART_ENTRIES: usize = 1 << 20;
/// Longest path (bytes), as Linux's PATH_MAX; each component at most `MAX_NAME_LEN`.
pub(crate) const MAX_PATH_LEN: usize = 4096;
pub(crate) const MAX_NAME_LEN: usize = 255;
/// Longest free text (backup_label, tablespace_map, reasons).
pub(crate) const MAX_TEXT_LEN: usize = 1 << 20;
/// Longest user or group name.
pub(crate) const MAX_OWNER_NAME_LEN: usize = 256;
/// The mode bits restore applies: permissions only, never setuid, setgid or sticky.
pub(crate) const PERMISSION_BITS: u32 = 0o777;

/// The error of manifest `what` failing a check.
fn damaged(what: &str, msg: impl std::fmt::Display) -> Error {
    Error::corrupt(format!(
        "{what}: {msg}: the manifest is damaged or was altered"
    ))
}

/// What is checked of a manifest read without its entries ([`Manifest::decode_header`]).
pub(super) fn validate_header(m: &Manifest, what: &str) -> Result<()> {
    check_header(m)
        .and_then(|()| check_databases_and_annotations(m))
        .map_err(|msg| damaged(what, msg))
}

/// What is checked of a format 4 manifest as stored, without its entries (they are in
/// its parts, checked as they are read): the header, and that it lists parts instead of
/// entries, and what they add up to.
pub(super) fn validate_parted(m: &Manifest, what: &str) -> Result<()> {
    validate_header(m, what)?;
    let fail = |msg: String| damaged(what, msg);
    if m.parts.is_empty() || !m.entries.is_empty() {
        return Err(fail("format 4 and not entries in parts".into()));
    }
    if m.packs_used.is_none() {
        return Err(fail("format 4 without packs_used".into()));
    }
    let mut total = 0usize;
    for (n, p) in m.parts.iter().enumerate() {
        if p.entries == 0 || p.entries as usize > MAX_PART_ENTRIES {
            return Err(fail(format!(
                "part {n} holds {} entries (1 to {MAX_PART_ENTRIES})",
                p.entries
            )));
        }
        total += p.entries as usize;
    }
    if total > MAX_ENTRIES {
        return Err(fail(format!("more than {MAX_ENTRIES} entries")));
    }
    Ok(())
}

/// Check `m` (decoded from `what`) and mask its modes to permission bits.
pub(super) fn validate(m: &mut Manifest, what: &str) -> Result<()> {
    let fail = |msg: String| damaged(what, msg);
    let mut entries = std::mem::take(&mut m.entries);
    let checked = EntryChecker::new(m, what).and_then(|mut checker| {
        for e in &mut entries {
            checker.check(e)?;
        }
        checker.finish()
    });
    m.entries = entries;
    checked?;
    if m.packs_used.is_some() && m.packs_used() != m.pack_usage() {
        return Err(fail("packs_used does not match the entries".into()));
    }
    Ok(())
}

/// The checks of [`validate`] one entry at a time, in the manifest's order, for a reader
/// that never holds the entries together ([`super::StoredManifest`]). What it keeps is
/// the kind of every directory and link (a file has no children): memory follows the
/// directories, not the files.
///
/// Whether `packs_used` matches the entries is not checked here: it needs every frame the
/// entries reference, and only `expire` and `info` go by it (a whole decode checks it, and
/// verify counts it as it reads, [`super::PackUsage`]).
pub(super) struct EntryChecker<'m> {
    m: &'m Manifest,
    what: &'m str,
    version_dir: String,
    /// Directories and links seen so far, by path.
    kinds: HashMap<Box<str>, Kind>,
    previous: String,
    count: usize,
}

impl<'m> EntryChecker<'m> {
    /// A checker of the entries of `m` (its header, which is checked here).
    pub fn new(m: &'m Manifest, what: &'m str) -> Result<EntryChecker<'m>> {
        validate_header(m, what)?;
        check_tablespaces(m).map_err(|msg| damaged(what, msg))?;
        check_links(m).map_err(|msg| damaged(what, msg))?;
        Ok(EntryChecker {
            m,
            what,
            version_dir: format!(
                "PG_{}_{}",
                m.cluster.major_version, m.cluster.catalog_version
            ),
            kinds: HashMap::new(),
            previous: String::new(),
            count: 0,
        })
    }

    /// Check the next entry, and mask its mode to permission bits.
    pub fn check(&mut self, e: &mut Entry) -> Result<()> {
        let path = e.path();
        let previous = (self.count > 0).then_some(self.previous.as_str());
        check_entry(
            self.m,
            e,
            self.count,
            previous,
            &self.kinds,
            &self.version_dir,
        )
        .map_err(|r| damaged(self.what, format!("entry {path:?}: {r}")))?;
        self.count += 1;
        if self.count > MAX_ENTRIES {
            return Err(damaged(
                self.what,
                format!("more than {MAX_ENTRIES} entries"),
            ));
        }
        let kind = Kind::of(e);
        if kind != Kind::File {
            self.kinds.insert(path.into(), kind);
        }
        self.previous.clear();
        self.previous.push_str(path);
        e.owner_mut().mode &= PERMISSION_BITS;
        Ok(())
    }

    /// What is checked once every entry has been: there were some, and every tablespace
    /// has its link.
    pub fn finish(self) -> Result<()> {
        if self.count == 0 {
            return Err(damaged(
                self.what,
                "no entries (the data directory itself is missing)",
            ));
        }
        for t in &self.m.tablespaces {
            if self.kinds.get(format!("pg_tblspc/{}", t.oid).as_str()) != Some(&Kind::Link) {
                return Err(damaged(
                    self.what,
                    format!("tablespace {} has no link entry pg_tblspc/{}", t.oid, t.oid),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    Link,
    File,
}

impl Kind {
    fn of(e: &Entry) -> Kind {
        match e {
            Entry::Dir { .. } => Kind::Dir,
            Entry::Link { .. } => Kind::Link,
            Entry::File(_) => Kind::File,
        }
    }
}

/// A check's outcome: `Err` of kind `Invalid` saying what is not allowed (the caller names
/// what it was checking, e.g. [`damaged`]).
type Check = Result<()>;

/// What a check found not allowed.
pub(crate) fn not_allowed(why: impl Into<String>) -> Error {
    Error::new(crate::ErrorKind::Invalid, why)
}

/// Longest database name (PostgreSQL's NAMEDATALEN - 1).
pub(crate) const MAX_DATABASE_NAME_LEN: usize = 63;
/// Most databases, and most annotations, one manifest may hold.
pub(crate) const MAX_DATABASES: usize = 1_000_000;
pub(crate) const MAX_ANNOTATIONS: usize = 1000;
/// Longest annotation key and value.
pub(crate) const MAX_ANNOTATION_KEY_LEN: usize = 256;
pub(crate) const MAX_ANNOTATION_VALUE_LEN: usize = 64 << 10;

/// An annotation as the manifest may hold it (and `backup --annotation` may give it).
pub fn check_annotation(key: &str, value: &str) -> Check {
    if key.is_empty() || key.len() > MAX_ANNOTATION_KEY_LEN || key.contains(['\0', '=']) {
        return Err(not_allowed(format!(
            "annotation key {key:?} is not 1 to {MAX_ANNOTATION_KEY_LEN} bytes without NUL or '='"
        )));
    }
    if value.len() > MAX_ANNOTATION_VALUE_LEN || value.contains('\0') {
        return Err(not_allowed(format!(
            "annotation {key:?}: the value is longer than {MAX_ANNOTATION_VALUE_LEN} bytes or holds NUL"
        )));
    }
    Ok(())
}

fn check_databases_and_annotations(m: &Manifest) -> Check {
    if let Some(dbs) = &m.databases {
        if dbs.len() > MAX_DATABASES {
            return Err(not_allowed(format!(
                "{} databases (at most {MAX_DATABASES})",
                dbs.len()
            )));
        }
        let mut oids = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for d in dbs {
            if d.name.is_empty() || d.name.len() > MAX_DATABASE_NAME_LEN || d.name.contains('\0') {
                return Err(not_allowed(format!(
                    "database name {:?} is not 1 to {MAX_DATABASE_NAME_LEN} bytes without NUL",
                    d.name
                )));
            }
            if !oids.insert(d.oid) || !names.insert(d.name.as_str()) {
                return Err(not_allowed(format!(
                    "database {:?} (OID {}) is listed twice",
                    d.name, d.oid
                )));
            }
        }
    }
    if m.annotations.len() > MAX_ANNOTATIONS {
        return Err(not_allowed(format!(
            "{} annotations (at most {MAX_ANNOTATIONS})",
            m.annotations.len()
        )));
    }
    for (k, v) in &m.annotations {
        check_annotation(k, v)?;
    }
    Ok(())
}

fn check_header(m: &Manifest) -> Check {
    if m.format_version == 0 {
        return Err(not_allowed("format_version 0"));
    }
    if m.format_version < 4 && !m.parts.is_empty() {
        return Err(not_allowed(format!(
            "parts in a format {} manifest",
            m.format_version
        )));
    }
    if !is_backup_label(&m.label) {
        return Err(not_allowed(format!(
            "label {:?} is not a backup label",
            m.label
        )));
    }
    if let Some(p) = &m.prior {
        if !is_backup_label(p) || p == &m.label {
            return Err(not_allowed(format!(
                "prior {p:?} is not another backup's label"
            )));
        }
    }
    layout::check_stanza_name(&m.stanza)?;
    for label in m.pack_codecs.keys() {
        if !is_backup_label(label) || label == &m.label {
            return Err(not_allowed(format!(
                "pack_codecs names {label:?}, not another backup's label"
            )));
        }
    }
    let c = &m.cluster;
    if !c.wal_segment_size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&c.wal_segment_size) {
        return Err(not_allowed(format!(
            "wal_segment_size {} is not a power of two from 1 MiB to 1 GiB",
            c.wal_segment_size
        )));
    }
    if !c.block_size.is_power_of_two() || !(1024..=32768).contains(&c.block_size) {
        return Err(not_allowed(format!(
            "cluster block_size {} is not a power of two from 1 KiB to 32 KiB",
            c.block_size
        )));
    }
    if m.frame_size == 0 || m.frame_size > MAX_FRAME_LEN {
        return Err(not_allowed(format!(
            "frame_size {} is not within 1..={MAX_FRAME_LEN}",
            m.frame_size
        )));
    }
    for (name, p) in [("start", &m.start), ("stop", &m.stop)] {
        if p.wal.len() != 24 || !p.wal.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(not_allowed(format!(
                "{name}.wal {:?} is not a segment name",
                p.wal
            )));
        }
        if p.time.len() > 64 {
            return Err(not_allowed(format!(
                "{name}.time is {} bytes long",
                p.time.len()
            )));
        }
    }
    let texts = [
        ("backup_label", Some(&m.backup_label)),
        ("tablespace_map", m.tablespace_map.as_ref()),
        ("track_reason", m.track_reason.as_ref()),
        ("summary_check", m.summary_check.as_ref()),
        ("delta_reason", m.delta_reason.as_ref()),
    ];
    for (name, text) in texts {
        if let Some(t) = text {
            if t.len() > MAX_TEXT_LEN || t.contains('\0') {
                return Err(not_allowed(format!(
                    "{name} is {} bytes long or holds a NUL byte (at most {MAX_TEXT_LEN})",
                    t.len()
                )));
            }
        }
    }
    Ok(())
}

fn check_tablespaces(m: &Manifest) -> Check {
    let mut seen = std::collections::HashSet::new();
    for t in &m.tablespaces {
        if !seen.insert(t.oid) {
            return Err(not_allowed(format!("tablespace {} is listed twice", t.oid)));
        }
        check_absolute(&t.location).map_err(|r| {
            not_allowed(format!(
                "tablespace {} location {:?}: {r}",
                t.oid, t.location
            ))
        })?;
    }
    Ok(())
}

/// The data directory's links: each a name at its top (not `pg_tblspc`, whose links are
/// the tablespaces'), once, with a target.
fn check_links(m: &Manifest) -> Check {
    let mut seen = std::collections::HashSet::new();
    for l in &m.links {
        let name_ok = !l.path.is_empty()
            && !l.path.contains('/')
            && !l.path.contains('\0')
            && l.path != "."
            && l.path != ".."
            && l.path != "pg_tblspc";
        if !name_ok {
            return Err(not_allowed(format!(
                "link {:?}: not a name in the data directory",
                l.path
            )));
        }
        if !seen.insert(&l.path) {
            return Err(not_allowed(format!("link {} is listed twice", l.path)));
        }
        if l.target.is_empty() || l.target.len() > MAX_PATH_LEN || l.target.contains('\0') {
            return Err(not_allowed(format!(
                "link {}: target {:?}",
                l.path, l.target
            )));
        }
    }
    Ok(())
}

/// An absolute path a link may point at.
fn check_absolute(target: &str) -> Check {
    if !target.starts_with('/') {
        return Err(not_allowed("not an absolute path"));
    }
    if target.len() > MAX_PATH_LEN || target.contains('\0') {
        return Err(not_allowed(format!(
            "longer than {MAX_PATH_LEN} bytes or holds a NUL byte"
        )));
    }
    Ok(())
}

fn check_entry(
    m: &Manifest,
    e: &Entry,
    index: usize,
    previous: Option<&str>,
    kinds: &HashMap<Box<str>, Kind>,
    version_dir: &str,
) -> Check {
    let path = e.path();
    if index == 0 {
        if !(path.is_empty() && matches!(e, Entry::Dir { .. })) {
            return Err(not_allowed(
                "the first entry must be the data directory itself (dir \"\")",
            ));
        }
    } else {
        check_path(path)?;
        if previous.is_some_and(|p| p >= path) {
            return Err(not_allowed(
                "entries are not sorted by path, or the path is listed twice",
            ));
        }
        // Sorted order puts every parent before its children.
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        match kinds.get(parent) {
            Some(Kind::Dir) => {}
            // Only a tablespace link has children, and only this version's directory,
            // which restore maps to the tablespace location.
            Some(Kind::Link) if path.ends_with(&format!("/{version_dir}")) => {
                if !matches!(e, Entry::Dir { .. }) {
                    return Err(not_allowed(format!(
                        "{version_dir} in a tablespace must be a directory"
                    )));
                }
            }
            Some(Kind::Link) => {
                return Err(not_allowed(format!(
                    "lies under the link {parent:?}: only {parent}/{version_dir} may"
                )))
            }
            // Files are not kept: a path under a file finds no directory either.
            Some(Kind::File) | None => {
                return Err(not_allowed(format!(
                    "its directory {parent:?} is not a directory of the manifest"
                )))
            }
        }
    }
    match e {
        Entry::Dir(d) => check_owner(&d.owner, false),
        Entry::Link(l) => {
            let (target, owner) = (&l.target, &l.owner);
            let oid = path
                .strip_prefix("pg_tblspc/")
                .and_then(|o| o.parse::<u32>().ok().filter(|n| n.to_string() == o))
                .ok_or_else(|| {
                    not_allowed("a link may only be a tablespace link pg_tblspc/<oid>")
                })?;
            let t =
                m.tablespaces.iter().find(|t| t.oid == oid).ok_or_else(|| {
                    not_allowed(format!("no tablespace with OID {oid} is listed"))
                })?;
            check_absolute(target)
                .map_err(|r| not_allowed(format!("link target {target:?}: {r}")))?;
            if *target != t.location {
                return Err(not_allowed(format!(
                    "link target {target:?} differs from tablespace location {:?}",
                    t.location
                )));
            }
            check_owner(owner, false)
        }
        Entry::File(f) => {
            check_owner(&f.owner, true)?;
            check_file(m, f)
        }
    }
}

/// Relative, `/`-separated, no empty, `.` or `..` component, no NUL, bounded.
pub(crate) fn check_path(path: &str) -> Check {
    if path.len() > MAX_PATH_LEN {
        return Err(not_allowed(format!(
            "path longer than {MAX_PATH_LEN} bytes"
        )));
    }
    if path.contains('\0') {
        return Err(not_allowed("path holds a NUL byte"));
    }
    if path.starts_with('/') {
        return Err(not_allowed("path is absolute"));
    }
    for c in path.split('/') {
        match c {
            "" => return Err(not_allowed("path has an empty component")),
            "." | ".." => return Err(not_allowed(format!("path has a '{c}' component"))),
            _ if c.len() > MAX_NAME_LEN => {
                return Err(not_allowed(format!(
                    "path component longer than {MAX_NAME_LEN} bytes"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_owner(o: &Owner, is_file: bool) -> Check {
    if o.mode & !0o7777 != 0 {
        return Err(not_allowed(format!(
            "mode {:o} has bits beyond 7777",
            o.mode
        )));
    }
    // A data directory never holds setuid programs; a setgid directory can be inherited
    // from its parent, and restore applies permission bits only anyway.
    if o.mode & 0o4000 != 0 || (is_file && o.mode & 0o2000 != 0) {
        return Err(not_allowed(format!(
            "mode {:o} has setuid or setgid",
            o.mode
        )));
    }
    for name in [&o.user, &o.group].into_iter().flatten() {
        if name.is_empty() || name.len() > MAX_OWNER_NAME_LEN || name.contains('\0') {
            return Err(not_allowed(format!(
                "owner name {name:?} is empty, too long or holds a NUL"
            )));
        }
    }
    Ok(())
}

fn check_file(m: &Manifest, f: &FileEntry) -> Check {
    let Some(map) = &f.map else {
        if !f.packs.is_empty() || f.map_depth != 0 {
            return Err(not_allowed("packs or map_depth without a map"));
        }
        return check_file_content(&m.label, m.cluster.block_size, f);
    };
    if m.format_version < 2 {
        return Err(not_allowed("a map in a format 1 manifest"));
    }
    if !f.chunks.is_empty() || !f.block_hashes.is_empty() {
        return Err(not_allowed("both a map and inline extents or block hashes"));
    }
    if !BLOCK_SIZES.contains(&f.block_size) {
        return Err(not_allowed(format!(
            "block_size {} is not one of {BLOCK_SIZES:?}",
            f.block_size
        )));
    }
    if f.map_depth > 0 && m.format_version < 3 {
        return Err(not_allowed("a delta map in a format 2 manifest"));
    }
    if f.map_depth > super::MAX_MAP_DEPTH {
        return Err(not_allowed(format!(
            "map_depth {} is more than {}",
            f.map_depth,
            super::MAX_MAP_DEPTH
        )));
    }
    check_chunk(&m.label, map).map_err(|r| not_allowed(format!("map: {r}")))?;
    if map.is_zero() || map.at != 0 || map.frame != 0 {
        return Err(not_allowed("map is not a whole stored frame"));
    }
    let mut seen = std::collections::HashSet::new();
    for p in &f.packs {
        if !is_pack_name(&p.pack) {
            return Err(not_allowed(format!(
                "packs: pack name {:?} is not <worker>-<seq>",
                p.pack
            )));
        }
        if let Some(b) = &p.backup {
            if !is_backup_label(b) || **b == m.label {
                return Err(not_allowed(format!(
                    "packs: b {b:?} is not another backup's label"
                )));
            }
        }
        if !seen.insert((&p.backup, &p.pack)) {
            return Err(not_allowed(format!(
                "packs: pack {:?} is listed twice",
                p.pack
            )));
        }
    }
    if !seen.contains(&(&map.backup, map.pack.as_ref().expect("stored"))) {
        return Err(not_allowed("packs does not list the map's own pack"));
    }
    Ok(())
}

/// Every decoded manifest entry whose map has been loaded (`Manifest::load_maps`): checked as
/// an inline entry is, and its extents only in the packs its entry lists.
pub(crate) fn check_loaded_map(m: &Manifest, f: &FileEntry, what: &str) -> Result<()> {
    let listed: std::collections::HashSet<(&str, &str)> = f
        .packs
        .iter()
        .map(|p| (p.owner(&m.label), &*p.pack))
        .collect();
    check_file_content(&m.label, m.cluster.block_size, f)
        .and_then(|()| {
            match f.chunks.iter().find(|c| {
                c.pack
                    .as_deref()
                    .is_some_and(|p| !listed.contains(&(c.owner(&m.label), p)))
            }) {
                Some(c) => Err(not_allowed(format!(
                    "an extent in pack {:?} of {}, which its entry does not list",
                    c.pack.as_deref().unwrap_or_default(),
                    c.owner(&m.label)
                ))),
                None => Ok(()),
            }
        })
        .map_err(|r| {
            Error::corrupt(format!(
                "{what}: entry {:?}: its map: {r}: the repository is damaged or was altered",
                f.path
            ))
        })
}

/// The extents and block hashes of a file, inline or loaded from its map, as manifest (or
/// resume checkpoint) `label` of a cluster with pages of `page_size` bytes holds them.
pub(crate) fn check_file_content(label: &str, page_size: u32, f: &FileEntry) -> Check {
    if f.block_size == 0 {
        if !f.block_hashes.is_empty() {
            return Err(not_allowed("block_hashes without a block_size"));
        }
    } else {
        if !BLOCK_SIZES.contains(&f.block_size) {
            return Err(not_allowed(format!(
                "block_size {} is not one of {BLOCK_SIZES:?}",
                f.block_size
            )));
        }
        let blocks = f.size.div_ceil(f.block_size as u64);
        if f.block_hashes.len() as u64 != blocks {
            return Err(not_allowed(format!(
                "block_hashes holds {} hashes, not one for each of {blocks} blocks",
                f.block_hashes.len()
            )));
        }
    }
    let pages = f.size.div_ceil(page_size.max(1) as u64);
    if f.bad_pages.len() as u64 > pages {
        return Err(not_allowed(format!(
            "{} bad pages in a file of {pages} pages",
            f.bad_pages.len()
        )));
    }
    let mut covered: u64 = 0;
    for (i, c) in f.chunks.iter().enumerate() {
        check_chunk(label, c).map_err(|r| not_allowed(format!("extent {i}: {r}")))?;
        covered += c.raw as u64;
        if covered > f.size {
            return Err(not_allowed(format!(
                "extents cover more than its size {}",
                f.size
            )));
        }
    }
    if covered != f.size {
        return Err(not_allowed(format!(
            "extents cover {covered} bytes, not its size {}",
            f.size
        )));
    }
    Ok(())
}

fn check_chunk(label: &str, c: &Chunk) -> Check {
    if c.raw == 0 {
        return Err(not_allowed("covers no bytes"));
    }
    let Some(pack) = &c.pack else {
        let stray = c.backup.is_some()
            || c.check.is_some()
            || c.offset != 0
            || c.stored != 0
            || c.at != 0
            || c.frame != 0;
        return match stray {
            true => Err(not_allowed("a zero extent with frame fields")),
            false if c.raw > 1 << 30 => {
                Err(not_allowed(format!("a zero extent of {} bytes", c.raw)))
            }
            false => Ok(()),
        };
    };
    if !is_pack_name(pack) {
        return Err(not_allowed(format!(
            "pack name {pack:?} is not <worker>-<seq>"
        )));
    }
    if let Some(b) = &c.backup {
        if !is_backup_label(b) || b.as_str() == label {
            return Err(not_allowed(format!(
                "b {b:?} is not another backup's label"
            )));
        }
    }
    if c.check.is_none() {
        return Err(not_allowed("h is not 16 lowercase hex digits"));
    }
    if c.stored == 0 || c.stored > MAX_FRAME_LEN || c.frame_len() > MAX_FRAME_LEN {
        return Err(not_allowed(format!(
            "stored length {} or frame length {} is not within 1..={MAX_FRAME_LEN}",
            c.stored,
            c.frame_len()
        )));
    }
    if c.offset.checked_add(c.stored as u64).is_none() {
        return Err(not_allowed(format!("offset {} overflows", c.offset)));
    }
    if c.at as u64 + c.raw as u64 > c.frame_len() as u64 {
        return Err(not_allowed(format!(
            "bytes {}..{} lie outside its {}-byte frame",
            c.at,
            c.at as u64 + c.raw as u64,
            c.frame_len()
        )));
    }
    Ok(())
}

/// `YYYYMMDD-HHMMSS` then `F`, `D` or `I`.
pub fn is_backup_label(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 16
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'-'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && matches!(b[15], b'F' | b'D' | b'I')
}

/// `<worker>-<seq>`, two decimal integers ([`layout::parse_pack_name`]).
fn is_pack_name(s: &str) -> bool {
    layout::parse_pack_name(s).is_some()
}
