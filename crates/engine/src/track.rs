//! Learning which blocks changed from the WAL instead of reading the database.
//!
//! archive-push leaves a block-change map beside every segment. An incremental backup
//! combines the maps of the segments from the prior backup's start up to its own start (the
//! last, still being written, is decoded straight from `pg_wal` up to the start LSN) and then
//! reads only the listed blocks of each changed relation file. Blocks changed after the
//! start LSN need not be listed: replaying WAL from the start overwrites each of them with
//! a full-page image before anything else touches it.
//!
//! A record whose block headers straddle a segment's end is read by decoding that segment
//! together with the next one (from `pg_wal`, or fetched from the archive).
//!
//! Anything that could make the maps miss a change sends files back to block hashing:
//! a missing, damaged or undecodable map, WAL written at wal_level=minimal (a
//! parameter-change record), records of unknown resource managers, a timeline
//! switch (the whole backup), and per file: FSM and visibility-map forks (not reliably
//! WAL-logged as block references), forks
//! created or truncated in the window, dropped relation numbers, databases created by file
//! copy or dropped, and files the prior backup has no block map for.

use crate::{Error, Result};
use pgstrata_pg::data_dir::{self, Fork};
use pgstrata_pg::lsn::{self, Lsn};
use pgstrata_pg::wal::SegmentDecoder;
use pgstrata_repo::changemap::ChangeMap;
use pgstrata_repo::manifest::{FileEntry, Manifest, Tracking};
use pgstrata_repo::{layout, Storage};
use std::collections::{BTreeSet, HashMap, HashSet};

// Names as given to `--track`.
pgstrata_repo::named! {
    /// How a backup finds changed blocks (`--track`).
    pub enum Track {
        /// Block-change maps when they cover the window, else hashing (with a warning).
        Auto = "auto",
        /// Block-change maps, or fail.
        Wal = "wal",
        /// Read and hash every changed file.
        Hash = "hash",
    }
}

/// How a backup found what changed: decided at its start, recorded in its manifest, shown
/// by `info` (same JSON names in both).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct ChangeDetection {
    /// Why every block of every file was hashed (size and mtime not trusted), if it was.
    pub delta_reason: Option<String>,
    /// How an incremental found changed blocks (None for a full).
    pub track: Option<Tracking>,
    /// Why the block-change maps were not used although tracking was asked for.
    pub track_reason: Option<String>,
    /// What PostgreSQL 17+ WAL summaries said of the maps, when the server had them.
    pub summary_check: Option<String>,
}

impl ChangeDetection {
    pub(crate) fn of(m: &Manifest) -> ChangeDetection {
        ChangeDetection {
            delta_reason: m.delta_reason.clone(),
            track: m.track,
            track_reason: m.track_reason.clone(),
            summary_check: m.summary_check.clone(),
        }
    }
}

type ForkKey = (u32, u32, u32, u8);

/// Everything the WAL changed between two backups.
#[derive(Debug, Default)]
pub(crate) struct WalChanges {
    blocks: HashMap<ForkKey, BTreeSet<u32>>,
    /// Forks created or truncated, relations dropped, database directories copied/dropped:
    /// their files are hashed.
    wholesale: HashSet<ForkKey>,
    dropped: HashSet<(u32, u32, u32)>,
    databases: HashSet<(u32, u32)>,
    pub segments: usize,
}

impl WalChanges {
    /// Cross-check with PostgreSQL 17+ WAL summaries: everything they list is read too.
    /// Returns how many blocks they listed that the maps did not (0 when both agree).
    pub(crate) fn merge_summaries(
        &mut self,
        blocks: Vec<(u32, u32, u32, u8, u32)>,
        limited: Vec<ForkKey>,
    ) -> usize {
        let mut extra = 0;
        // FSM and visibility-map forks are read whole whatever the maps say.
        for (spc, db, rel, fork, blk) in blocks.into_iter().filter(|b| b.3 != 1 && b.3 != 2) {
            if self
                .blocks
                .entry((spc, db, rel, fork))
                .or_default()
                .insert(blk)
            {
                extra += 1;
            }
        }
        for key in limited {
            if self.wholesale.insert(key) {
                extra += 1;
            }
        }
        extra
    }

    fn add(&mut self, m: ChangeMap) {
        for f in m.blocks {
            let e = self.blocks.entry((f.spc, f.db, f.rel, f.fork)).or_default();
            for (start, n) in f.runs {
                e.extend(start..start + n);
            }
        }
        self.wholesale.extend(m.created.iter().copied());
        self.wholesale
            .extend(m.truncated.iter().map(|t| (t.0, t.1, t.2, t.3)));
        self.dropped.extend(m.dropped);
        self.databases.extend(m.databases);
        self.segments += 1;
    }

    /// The pages (numbered within this segment file) of relation file `rel_path` that
    /// changed, or why the file must be read and hashed instead.
    pub(crate) fn pages_for(
        &self,
        rel_path: &str,
        relseg_size: u32,
        prior: &FileEntry,
    ) -> std::result::Result<Vec<u32>, HashReason> {
        if prior.block_size == 0 {
            return Err(HashReason::NoPriorBlockMap);
        }
        let rf = data_dir::relation_file(rel_path).ok_or(HashReason::NotRelation)?;
        let fork = match rf.fork {
            Fork::Main => 0,
            // FSM pages are not reliably WAL-logged, and visibility-map bits are cleared by
            // heap records that do not reference the map page: both are read whole (they
            // are tiny: one map page covers 256 MiB of heap).
            Fork::Fsm | Fork::Vm => return Err(HashReason::FsmOrVm),
            Fork::Init => 3,
        };
        let (spc, db) = location(rel_path).ok_or(HashReason::NotRelation)?;
        let key = (spc, db, rf.relnumber, fork);
        if self.wholesale.contains(&key) {
            return Err(HashReason::CreatedOrTruncated);
        }
        if self.dropped.contains(&(spc, db, rf.relnumber)) {
            return Err(HashReason::Dropped);
        }
        if self.databases.contains(&(spc, db)) {
            return Err(HashReason::DatabaseCopied);
        }
        let first = rf.segno * relseg_size;
        let last = first + relseg_size;
        Ok(self
            .blocks
            .get(&key)
            .map(|set| set.range(first..last).map(|b| b - first).collect())
            .unwrap_or_default())
    }
}

/// Why a changed file of a WAL-tracked backup was read and hashed instead of read block by
/// block (recorded per reason in the manifest's `stats.files_hashed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HashReason {
    NotRelation,
    FsmOrVm,
    CreatedOrTruncated,
    Dropped,
    DatabaseCopied,
    NoPriorBlockMap,
}

/// "24 free space or visibility map, 4 not a relation file", or "none": a manifest's
/// `files_hashed` for the log and `info`.
pub(crate) fn describe_hashed(files_hashed: &std::collections::BTreeMap<String, u64>) -> String {
    if files_hashed.is_empty() {
        return "none".to_string();
    }
    files_hashed
        .iter()
        .map(|(why, n)| format!("{n} {why}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl HashReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HashReason::NotRelation => "not a relation file",
            HashReason::FsmOrVm => "free space or visibility map",
            HashReason::CreatedOrTruncated => "created or truncated since the prior backup",
            HashReason::Dropped => "relation number dropped and reused",
            HashReason::DatabaseCopied => "database copied or dropped",
            HashReason::NoPriorBlockMap => "no block map in the prior backup",
        }
    }
}

/// (tablespace oid, database oid) of a relation file's directory.
fn location(rel_path: &str) -> Option<(u32, u32)> {
    let parts: Vec<&str> = rel_path.split('/').collect();
    match parts.as_slice() {
        ["base", db, _] => Some((1663, db.parse().ok()?)),
        ["global", _] => Some((1664, 0)),
        ["pg_tblspc", spc, _, db, _] => Some((spc.parse().ok()?, db.parse().ok()?)),
        _ => None,
    }
}

/// Combine the maps covering `prior`'s start to `start_lsn` on `timeline`. Err says why
/// they cannot be used, with its kind: the maps cannot tell (`Refused`), a map or segment
/// is damaged (damage), the repository or a file could not be read.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn wal_changes(
    storage: &Storage,
    stanza: &str,
    cluster: &pgstrata_repo::stanza::ClusterIdentity,
    prior: &Manifest,
    start_lsn: Lsn,
    timeline: u32,
    pg_path: &std::path::Path,
) -> Result<WalChanges> {
    if prior.start.timeline != timeline {
        return Err(Error::refused(format!(
            "the timeline changed from {} to {timeline} since backup {}",
            prior.start.timeline, prior.label
        )));
    }
    let seg_size = cluster.wal_segment_size;
    let (_, first) = lsn::parse_segment_name(&prior.start.wal, seg_size).ok_or_else(|| {
        Error::integrity(format!(
            "backup {} has an invalid start segment",
            prior.label
        ))
    })?;
    let current = start_lsn.segment(seg_size);
    // The maps of the window are fetched up to 16 ahead (on an object store each is a
    // round trip) and used in segment order.
    use futures::StreamExt;
    let archive_id = cluster.archive_id();
    let maps = futures::stream::iter(first..=current)
        .map(|segno| {
            let name = lsn::segment_name(timeline, segno, seg_size);
            let archive_id = &archive_id;
            async move {
                let (key, fetched) =
                    crate::wal_archive::fetch_change_map(storage, stanza, archive_id, &name).await;
                (segno, name, key, fetched)
            }
        })
        .buffered(16)
        .peekable();
    let mut maps = std::pin::pin!(maps);
    let window = Window {
        storage,
        stanza,
        archive_id: &archive_id,
        cluster,
        pg_path,
        timeline,
        current,
        start_lsn,
    };
    let mut out = WalChanges::default();
    while let Some((segno, name, key, fetched)) = maps.next().await {
        let map = window.map_of(segno, &name, &key, fetched)?;
        // A record whose block headers straddle the segment end is in neither segment's
        // map on its own: decode this segment together with the next to read it whole.
        // archive-push of the next segment usually read the cut record whole already: its
        // map says so, and the loop adds that map next (unless the next segment is the
        // current one, which is decoded from pg_wal without the cut record).
        let cut = map.only_tail_cut();
        let next_completes =
            cut && segno + 1 < current
                && match maps.as_mut().peek().await {
                    Some((_, _, next_key, Ok(obj))) => ChangeMap::decode(obj, next_key)
                        .is_ok_and(|m| m.usable && m.completes_previous),
                    _ => false,
                };
        let map = if next_completes {
            ChangeMap {
                incomplete_tail: false,
                ..map
            }
        } else if cut && segno < current {
            window.decode_with_next(segno, &name).await?
        } else {
            map
        };
        map.complete().map_err(|why| {
            Error::refused(format!(
                "the block-change map of {name} cannot be relied on: {why}"
            ))
        })?;
        out.add(map);
    }
    Ok(out)
}

/// The WAL between the prior backup's start segment and `start_lsn` (in segment
/// `current`), and where to find it.
struct Window<'a> {
    storage: &'a Storage,
    stanza: &'a str,
    archive_id: &'a str,
    cluster: &'a pgstrata_repo::stanza::ClusterIdentity,
    pg_path: &'a std::path::Path,
    timeline: u32,
    current: u64,
    start_lsn: Lsn,
}

impl Window<'_> {
    /// The map of segment `segno` (`name`, as `fetched` from `key`). The segment
    /// holding the start LSN is still being written, and the archiver may lag behind:
    /// segments without a map are decoded straight from pg_wal, where PostgreSQL keeps them
    /// until they are archived.
    fn map_of(
        &self,
        segno: u64,
        name: &str,
        key: &str,
        fetched: pgstrata_repo::Result<bytes::Bytes>,
    ) -> Result<ChangeMap> {
        let seg_size = self.cluster.wal_segment_size;
        let current = self.current;
        let until = if segno == current {
            self.start_lsn.0
        } else {
            u64::MAX
        };
        let path = self.pg_path.join("pg_wal").join(name);
        let in_pg_wal = path.exists();
        match fetched {
            // The current segment's archived map covers WAL past the start LSN too: extra
            // blocks, never missing ones, so it serves when pg_wal no longer has the file.
            Ok(obj) if segno < current || !in_pg_wal => Ok(ChangeMap::decode(&obj, key)?),
            Err(e) if !in_pg_wal && e.is_not_found() => Err(Error::refused(format!(
                "segment {name} has no block-change map and is no longer in pg_wal"
            ))),
            Err(e) if !in_pg_wal => {
                Err(Error::from(e)
                    .context(format!("the block-change map of {name} cannot be read")))
            }
            _ => {
                // Of the current segment, only the pages up to `until`: every record of
                // the window ends there (it is a record's start), and the rest of the
                // segment is 16 MB a backup need not hold.
                let wanted = match segno == current {
                    true => (until - segno * seg_size).div_ceil(8192).max(1) * 8192,
                    false => seg_size,
                };
                let mut decoder = SegmentDecoder::new(
                    self.cluster.major_version,
                    8192,
                    Some(segno * seg_size),
                    until,
                )?;
                feed_file(&mut decoder, &path, wanted)
                    .map_err(|e| e.context(format!("cannot decode {name} from pg_wal")))?;
                let decoded = decoder.finish();
                let mut map = crate::wal_archive::change_map_of(name, decoded);
                if segno == current {
                    // Every record of the window ends before `until`, which lies in this
                    // segment: a record cut at its end is past the window.
                    map.incomplete_tail = false;
                }
                Ok(map)
            }
        }
    }

    /// The map of segment `segno` (`name`) decoded together with the next segment, so that
    /// the record cut at its end is read whole.
    async fn decode_with_next(&self, segno: u64, name: &str) -> Result<ChangeMap> {
        let seg_size = self.cluster.wal_segment_size;
        let next = lsn::segment_name(self.timeline, segno + 1, seg_size);
        log::info!("{name}: its last record continues in {next}; decoding the two together");
        let (storage, stanza, archive_id, pg_path) =
            (self.storage, self.stanza, self.archive_id, self.pg_path);
        // Only records starting in this segment: the next one's are its own map's. The
        // two are fed one after the other, so only one is held at a time.
        let mut decoder = SegmentDecoder::new(
            self.cluster.major_version,
            8192,
            Some(segno * seg_size),
            (segno + 1) * seg_size,
        )?;
        for segment in [name, next.as_str()] {
            let bytes = segment_bytes(storage, stanza, archive_id, segment, pg_path).await?;
            if bytes.is_empty() {
                return Err(Error::integrity(format!("segment {segment} is empty")));
            }
            if !decoder
                .feed(&bytes)
                .map_err(|e| Error::from(e).context(format!("cannot decode {name} with {next}")))?
            {
                break;
            }
        }
        let decoded = decoder.finish();
        let mut joined = crate::wal_archive::change_map_of(name, decoded);
        joined.incomplete_tail = false;
        Ok(joined)
    }
}

/// The bytes of WAL segment `name`: from `pg_wal` while PostgreSQL still has it, else from
/// the archive.
async fn segment_bytes(
    storage: &Storage,
    stanza: &str,
    archive_id: &str,
    name: &str,
    pg_path: &std::path::Path,
) -> Result<Vec<u8>> {
    let path = pg_path.join("pg_wal").join(name);
    match std::fs::read(&path) {
        Ok(bytes) => return Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
    }
    let key = layout::archive_object(stanza, archive_id, name);
    let obj = storage.get(&key).await.map_err(|e| {
        Error::from(e).context(format!(
            "segment {name} is neither in pg_wal nor readable from the archive"
        ))
    })?;
    Ok(
        tokio::task::spawn_blocking(move || pgstrata_repo::wal_object::decode(&obj, &key))
            .await
            .expect("decode thread")?,
    )
}

/// Feed `decoder` the first `len` bytes of file `path` (fewer if it is shorter), a
/// megabyte at a time, until it has what it wants: the memory of a buffer, not of a segment.
fn feed_file(decoder: &mut SegmentDecoder, path: &std::path::Path, len: u64) -> Result<()> {
    use std::io::Read;
    const CHUNK: usize = 1 << 20;
    let cannot_read = |e| Error::io(format!("cannot read {}", path.display()), e);
    let mut file = std::fs::File::open(path).map_err(cannot_read)?.take(len);
    let mut buf = vec![0u8; CHUNK];
    let mut first = true;
    loop {
        // Fill the buffer (a read may return less than asked), so that it holds whole
        // pages unless the file ends in the middle of one.
        let mut filled = 0;
        while filled < CHUNK {
            match file.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(cannot_read(e)),
            }
        }
        if filled == 0 && first {
            // Decoding nothing would claim that nothing changed.
            return Err(Error::integrity(format!("{} is empty", path.display())));
        }
        first = false;
        if filled == 0 || !decoder.feed(&buf[..filled])? {
            return Ok(());
        }
        if filled < CHUNK {
            return Ok(());
        }
    }
}
