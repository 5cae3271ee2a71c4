//! The WAL archive in the repository: storing and fetching WAL files (what `archive-push`
//! and `archive-get` do, directly or from their asynchronous workers), and what the
//! commands ask of it: which segments are archived, gaps and lag (check, info, verify),
//! the block-change maps of segments (track), waiting for WAL to arrive (backup, check).
//!
//! A push is idempotent: pushing a file that is already archived with the same content
//! succeeds (PostgreSQL retries after crashes and may push twice); a different file under an
//! existing name fails and leaves the stored copy alone, because overwriting could destroy
//! the WAL a backup needs. The write is create-only, so two pushers racing on one name
//! cannot both win.

use crate::{open_stanza, Error, Result, Settings};
use pgstrata_pg::lsn;
use pgstrata_pg::wal::SegmentChanges;
use pgstrata_repo::changemap::{ChangeMap, ForkBlocks};
use pgstrata_repo::{layout, wal_object, ErrorKind as RepoKind};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What archive-push did.
#[derive(Debug, PartialEq, Eq)]
pub enum PushOutcome {
    Stored { stored_bytes: usize },
    AlreadyArchived,
}

/// Store one WAL file (segment, .partial, .backup or .history).
pub async fn archive_push(s: &Settings, wal_path: &Path) -> Result<PushOutcome> {
    let name = checked_wal_name(wal_path)?;
    let (storage, stanza) = open_stanza(s).await?;
    push_opened(s, &storage, &stanza, &name, wal_path, compress_workers()).await
}

/// Store one WAL file in every repository (`repos`: the same stanza in each), at once. It
/// is archived only when every repository has it: a failure in one fails the push, naming
/// that repository, after the others stored it (so PostgreSQL's retry completes the set).
pub async fn archive_push_all(repos: &[Settings], wal_path: &Path) -> Result<()> {
    if let [only] = repos {
        return archive_push(only, wal_path).await.map(|_| ());
    }
    let name = checked_wal_name(wal_path)?;
    // The repositories that open get the file; one that does not fails the push (after
    // the others stored it), naming it.
    let opened = futures::future::join_all(repos.iter().map(open_stanza)).await;
    let (mut open_repos, mut open_stanzas, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    for (s, o) in repos.iter().zip(opened) {
        match o {
            Ok(o) => {
                open_repos.push(s.clone());
                open_stanzas.push(o);
            }
            Err(e) => failures.push((
                s.clone(),
                Err(e.context(format!("repo{} ({})", s.repo_index, s.repo.path))),
            )),
        }
    }
    if !open_repos.is_empty() {
        push_prepared_all(
            &open_repos,
            &open_stanzas,
            &name,
            wal_path,
            compress_workers(),
        )
        .await?;
    }
    // Named already: reported as they are.
    failures
        .into_iter()
        .map(|(_, r)| r)
        .next()
        .unwrap_or(Ok(()))
}

/// The first error of per-repository `results`, naming its repository when there are
/// several.
pub(crate) fn first_failure(
    repos: &[Settings],
    results: impl Iterator<Item = Result<()>>,
) -> Result<()> {
    let mut failed: Option<Error> = None;
    for (s, r) in repos.iter().zip(results) {
        if let Err(e) = r {
            let e = if repos.len() > 1 {
                e.context(format!("repo{} ({})", s.repo_index, s.repo.path))
            } else {
                e
            };
            if failed.is_some() {
                log::error!("{e}");
            } else {
                failed = Some(e);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Fetch one WAL file from the first repository of `repos` (in order) that has it. A
/// repository that fails is passed over with a warning; "not found" (false) only when
/// none failed and none has it, because a failure taken for the end of the archive would
/// end recovery early.
pub async fn archive_get_any(repos: &[Settings], name: &str, dest: &Path) -> Result<bool> {
    let mut failed: Option<Error> = None;
    for s in repos {
        match archive_get(s, name, dest).await {
            Ok(true) => {
                if repos.len() > 1 {
                    log::info!("{name} came from repo{}", s.repo_index);
                }
                return Ok(true);
            }
            Ok(false) => {}
            Err(e) => {
                let e = e.context(format!("repo{} ({})", s.repo_index, s.repo.path));
                if repos.len() > 1 {
                    log::warn!("{e}; trying the next repository");
                }
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e.context(format!("{name} was found in no other repository"))),
        None => Ok(false),
    }
}

/// The file name of `wal_path`, if it is named like a WAL file archive-push stores.
pub(crate) fn checked_wal_name(wal_path: &Path) -> Result<String> {
    let name = wal_path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .ok_or_else(|| {
            Error::config(format!(
                "archive-push: '{}' is not a file name",
                wal_path.display()
            ))
        })?;
    if !valid_wal_name(&name) {
        return Err(Error::config(format!(
            "archive-push: '{name}' is not a WAL segment, .partial, .backup or .history file name"
        )));
    }
    Ok(name)
}

/// A WAL file read, checked, compressed, hashed and decoded once, ready to be stored in
/// every repository of its stanza (each seals it with its own key, if any).
pub(crate) struct PreparedWal {
    name: String,
    /// The WAL object without a map (version 1), until [`store_prepared_all`] hands it to
    /// [`store_prepared`].
    obj: bytes::Bytes,
    hash: [u8; 32],
    /// The decoded changes of a full segment, or why they could not be decoded.
    decoded: Option<Result<SegmentChanges>>,
    /// The segment's first pages, when it starts with the rest of a record.
    head: Option<Vec<u8>>,
}

/// Read, check, compress (with `workers` threads) and decode WAL file `name` at
/// `wal_path`, for the cluster of `stanza`.
pub(crate) async fn prepare_push(
    s: &Settings,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
    name: &str,
    wal_path: &Path,
    workers: u32,
) -> Result<PreparedWal> {
    let input = WalInput::File(wal_path.to_path_buf());
    prepare_read(s, stanza, name, input, workers).await
}

/// [`prepare_push`] of WAL file `name` received as `bytes` (wal-receive).
pub(crate) async fn prepare_bytes(
    s: &Settings,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
    name: &str,
    bytes: Vec<u8>,
    workers: u32,
) -> Result<PreparedWal> {
    prepare_read(s, stanza, name, WalInput::Bytes(bytes), workers).await
}

/// Where a WAL file to store comes from.
enum WalInput {
    /// A file (in pg_wal), read piece by piece.
    File(std::path::PathBuf),
    /// Bytes in memory (wal-receive).
    Bytes(Vec<u8>),
}

/// Check, compress (with `workers` threads) and decode WAL file `name` from `input`, in
/// one pass over its pieces ([`wal_object::encode_read`]): the 16 MiB segment is never held
/// whole (archive-push's memory is a few pieces and the compressed object).
async fn prepare_read(
    s: &Settings,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
    name: &str,
    input: WalInput,
    workers: u32,
) -> Result<PreparedWal> {
    let seg_size = stanza.cluster.wal_segment_size;
    let sysid = stanza.cluster.system_identifier.clone();
    let compression = s.compression;
    let major = stanza.cluster.major_version;
    let checked = lsn::is_segment_name(name) || name.ends_with(".partial");
    let decode = lsn::is_segment_name(name);
    let name_owned = name.to_string();
    // The read is blocking work: it goes to the blocking pool, off the scheduler that
    // drives the stores in flight (archive-async).
    let (obj, decoded, head) = tokio::task::spawn_blocking(move || -> Result<_> {
        let name = name_owned;
        let (mut reader, len, what): (Box<dyn std::io::Read>, u64, String) = match input {
            WalInput::File(path) => {
                let what = format!("archive-push: read {}", path.display());
                let file = std::fs::File::open(&path).map_err(|e| Error::io(&what, e))?;
                let len = file.metadata().map_err(|e| Error::io(&what, e))?.len();
                (Box::new(file), len, what)
            }
            WalInput::Bytes(bytes) => {
                let len = bytes.len() as u64;
                (Box::new(std::io::Cursor::new(bytes)), len, name.clone())
            }
        };
        if checked {
            check_segment_len(len, &name, seg_size)?;
        }
        // The block-change map of a full segment is decoded as its pieces are read, beside
        // their compression, so it adds little to archive_command's latency.
        let mut decoding = (decode && len == seg_size)
            .then(|| pgstrata_pg::wal::SegmentDecoder::new(major, 8192, None, u64::MAX))
            .map(|d| d.map_err(Error::from));
        let (mut first_page, mut head) = (Ok(()), None);
        let mut first = true;
        let obj = wal_object::encode_read(&mut reader, compression, workers, &mut |piece| {
            if std::mem::take(&mut first) {
                if checked {
                    first_page = check_segment_cluster(piece, &name, &sysid);
                }
                // The head of this segment, for completing a record cut at the previous
                // one's end.
                head = pgstrata_pg::wal::starts_with_continuation(piece)
                    .then(|| piece[..piece.len().min(CUT_RECORD_PAGES * 8192)].to_vec());
            }
            if let Some(Ok(decoder)) = &mut decoding {
                let fed =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decoder.feed(piece)));
                if let Err(why) = decoded_or_why(fed) {
                    decoding = Some(Err(why));
                }
            }
        })
        .map_err(|e| Error::io(&what, e))?;
        first_page?;
        let read = wal_object::parse_header(&obj, &name)?.raw_len();
        if read != len {
            return Err(Error::refused(format!(
                "{name} changed while it was read ({len} bytes, then {read}): nothing was stored"
            )));
        }
        let decoded = decoding.map(|d| {
            d.and_then(|decoder| {
                decoded_or_why(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || Ok(decoder.finish()),
                )))
            })
        });
        Ok((obj, decoded, head))
    })
    .await
    .expect("WAL read thread")?;
    let hash = wal_object::parse_header(&obj, name)?.hash;
    Ok(PreparedWal {
        name: name.to_string(),
        obj: obj.into(),
        hash,
        decoded,
        head,
    })
}

/// Store one WAL file into an opened stanza, with `workers` threads compressing it.
pub(crate) async fn push_opened(
    s: &Settings,
    storage: &pgstrata_repo::Storage,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
    name: &str,
    wal_path: &Path,
    workers: u32,
) -> Result<PushOutcome> {
    let mut prepared = prepare_push(s, stanza, name, wal_path, workers).await?;
    let obj = std::mem::take(&mut prepared.obj);
    store_prepared(s, storage, stanza, wal_path, &prepared, obj).await
}

/// Store a prepared WAL file, its object `obj` (`p.obj` or a share of it), and its
/// block-change map, into one repository's stanza. When `obj` is the only share, the map
/// goes into it in place ([`wal_object::with_map_owned`]): archive-push holds the
/// compressed segment once.
pub(crate) async fn store_prepared(
    s: &Settings,
    storage: &pgstrata_repo::Storage,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
    wal_path: &Path,
    p: &PreparedWal,
    obj: bytes::Bytes,
) -> Result<PushOutcome> {
    let name = &p.name;
    let key = layout::archive_object(&s.stanza, &stanza.cluster.archive_id(), name);
    let map = match &p.decoded {
        None => None,
        Some(Err(why)) => Some(unusable_map(name, why.to_string())),
        Some(Ok(changes)) => {
            // The previous segment's last record may have been cut inside its block headers:
            // read it whole now, while the previous segment is at hand, so that a backup
            // needs neither segment.
            let mut changes = changes.clone();
            let mut completes_previous = false;
            if let Some(head) = &p.head {
                if let Some((with, without)) = previous_cut_record(
                    storage,
                    &s.stanza,
                    &stanza.cluster,
                    name,
                    wal_path,
                    head.clone(),
                )
                .await
                {
                    changes.add_difference(&with, &without);
                    completes_previous = true;
                }
            }
            let mut m = change_map_of(name, changes);
            m.completes_previous = completes_previous;
            Some(m)
        }
    };
    // In a plain stanza the map rides in the segment's object: one object (one request to
    // an object store) a segment. An encrypted stanza seals objects whole, so there the map
    // stays an object of its own, which a backup reads without fetching the segment.
    let embed = storage.cipher().is_none();
    let obj = match &map {
        Some(m) if embed => wal_object::with_map_owned(obj.into(), &m.encode()).into(),
        _ => obj,
    };
    let stored_bytes = obj.len();
    let (outcome, map_inside) = match storage.put_new(&key, obj).await {
        Ok(()) => {
            log::info!("archived {name} ({stored_bytes} bytes stored)");
            (PushOutcome::Stored { stored_bytes }, embed)
        }
        Err(e) if e.kind == RepoKind::AlreadyExists => {
            // The header holds the stored file's hash: read just it, or in an encrypted
            // stanza the whole object, which opens only as a whole.
            let existing = match storage.cipher() {
                Some(_) => storage.get(&key).await?,
                None => {
                    storage
                        .get_range(&key, 0..wal_object::HEADER_LEN as u64)
                        .await?
                }
            };
            let header = wal_object::parse_header(&existing, &key)?;
            if header.hash == p.hash {
                log::info!("{name} is already in the archive with the same content");
                (PushOutcome::AlreadyArchived, header.map_len > 0)
            } else {
                return Err(Error::refused(format!(
                    "{name} is already in the archive with different content; the stored copy was kept. \
                     Two clusters may be archiving into stanza '{}'",
                    s.stanza
                )));
            }
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(map) = map {
        // A map of its own goes after its segment: a map never describes WAL that is not
        // archived. A retry after a crash between the two writes finds the segment (of
        // this writer, or of one from before maps rode inside) and writes the map.
        if !map_inside {
            let map_key = layout::change_map(&s.stanza, &stanza.cluster.archive_id(), name);
            match storage.put_new(&map_key, map.encode().into()).await {
                Ok(()) => {}
                Err(e) if e.kind == RepoKind::AlreadyExists => {}
                Err(e) => return Err(e.into()),
            }
        }
        if map.only_tail_cut() {
            log::info!("{name}: its last record's block references continue in the next segment; incrementals decode the two segments together");
        } else if let Err(why) = map.complete() {
            log::warn!("{name}: its block-change map cannot be relied on ({why}); incrementals will hash the files instead");
        }
    }
    Ok(outcome)
}

/// Store one WAL file into every opened repository (`opened`, in the order of `repos`),
/// reading, compressing and decoding it once.
pub(crate) async fn push_prepared_all(
    repos: &[Settings],
    opened: &[(pgstrata_repo::Storage, pgstrata_repo::stanza::StanzaInfo)],
    name: &str,
    wal_path: &Path,
    workers: u32,
) -> Result<()> {
    let prepared = prepare_push_all(repos, opened, name, wal_path, workers).await?;
    store_prepared_all(repos, opened, wal_path, prepared).await
}

/// [`prepare_push`] for every opened repository (`opened`, in the order of `repos`), which
/// must hold the same cluster: the file is read, compressed and decoded once, with the
/// first repository's settings.
pub(crate) async fn prepare_push_all(
    repos: &[Settings],
    opened: &[(pgstrata_repo::Storage, pgstrata_repo::stanza::StanzaInfo)],
    name: &str,
    wal_path: &Path,
    workers: u32,
) -> Result<PreparedWal> {
    let first = &opened[0].1.cluster;
    for (s, (_, stanza)) in repos.iter().zip(opened).skip(1) {
        if stanza.cluster.system_identifier != first.system_identifier {
            return Err(Error::refused(format!(
                "stanza '{}' belongs to cluster {} in repo{} but to cluster {} in repo{}: the repositories must hold the same cluster",
                s.stanza, first.system_identifier, repos[0].repo_index, stanza.cluster.system_identifier, s.repo_index
            )));
        }
    }
    prepare_push(&repos[0], &opened[0].1, name, wal_path, workers).await
}

/// Store a file [`prepare_push_all`] prepared into every opened repository at once. It is
/// stored only when every repository has it: the first failure is returned, naming its
/// repository, after the others stored it.
pub(crate) async fn store_prepared_all(
    repos: &[Settings],
    opened: &[(pgstrata_repo::Storage, pgstrata_repo::stanza::StanzaInfo)],
    wal_path: &Path,
    mut prepared: PreparedWal,
) -> Result<()> {
    let obj = std::mem::take(&mut prepared.obj);
    let prepared = &prepared;
    let results =
        futures::future::join_all(repos.iter().zip(opened).map(|(s, (storage, stanza))| {
            store_prepared(s, storage, stanza, wal_path, prepared, obj.clone())
        }))
        .await;
    first_failure(repos, results.into_iter().map(|r| r.map(|_| ())))
}

/// Threads compressing one WAL file: the host's cores, at most 4 (more gain little on one
/// 16 MiB segment).
fn compress_workers() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4) as u32)
}

/// Bytes of a WAL object's start read to find its block-change map in the same request: a
/// map of a segment of ordinary traffic takes a few hundred bytes (208-472 in `bench
/// remote_link`); a longer one costs a second read. Every byte past the map is waste on a
/// slow line: 4 KiB made an incremental over 100 Mbit/s move 1.21-1.30x what it stored.
const MAP_READ_AHEAD: u64 = 1024;

/// The stored block-change map of segment `name` (encoded, §6a) and what it was read from:
/// inside the segment's object in a plain stanza (archive-push writes it there), else the
/// `.map` object beside it (encrypted stanzas, and segments archived before maps rode
/// inside). Not found when the segment is not archived, or has no map.
pub(crate) async fn fetch_change_map(
    storage: &pgstrata_repo::Storage,
    stanza: &str,
    archive_id: &str,
    name: &str,
) -> (String, pgstrata_repo::Result<bytes::Bytes>) {
    let map_key = layout::change_map(stanza, archive_id, name);
    if storage.cipher().is_none() {
        let key = layout::archive_object(stanza, archive_id, name);
        let inside = async {
            let start = storage.get_prefix(&key, MAP_READ_AHEAD).await?;
            let header = wal_object::parse_header(&start, &key)?;
            let map = wal_object::HEADER_LEN..header.payload_start();
            Ok(match header.map_len {
                0 => None,
                _ if start.len() >= map.end => Some(start.slice(map)),
                _ => Some(
                    storage
                        .get_range(&key, map.start as u64..map.end as u64)
                        .await?,
                ),
            })
        };
        match inside.await {
            Ok(None) => {}
            Ok(Some(map)) => return (format!("{key} (its block-change map)"), Ok(map)),
            Err(e) => return (key, Err(e)),
        }
    }
    let stored = storage.get(&map_key).await;
    (map_key, stored)
}

/// Pages read at the end of the previous segment and at the start of the pushed one to
/// complete a record cut at the boundary. A longer cut record is left to the backup.
const CUT_RECORD_PAGES: usize = 4;

/// When the segment before `name` ends inside a record's block headers: the previous
/// segment's last pages decoded alone (`without`) and decoded on into `head` (the first
/// pages of `name`) up to the boundary (`with`, which reads the cut record whole). The
/// previous segment is normally still in pg_wal next to `name`: only its last pages are
/// read, with no request to the repository. Otherwise its map and archived copy are
/// fetched. `None` when there is nothing to complete or a piece is unavailable; a backup
/// then decodes the two segments itself.
async fn previous_cut_record(
    storage: &pgstrata_repo::Storage,
    stanza: &str,
    cluster: &pgstrata_repo::stanza::ClusterIdentity,
    name: &str,
    wal_path: &Path,
    head: Vec<u8>,
) -> Option<(SegmentChanges, SegmentChanges)> {
    let seg = cluster.wal_segment_size;
    let major = cluster.major_version;
    let (tli, segno) = lsn::parse_segment_name(name, seg)?;
    let prev = lsn::segment_name(tli, segno.checked_sub(1)?, seg);
    let archive_id = cluster.archive_id();
    let tail_len = (CUT_RECORD_PAGES * 8192).min(seg as usize);
    let tail = match read_tail(&wal_path.with_file_name(&prev), seg, tail_len) {
        Some(t) => t,
        None => {
            let (read_from, stored) = fetch_change_map(storage, stanza, &archive_id, &prev).await;
            let prev_map = ChangeMap::decode(&stored.ok()?, &read_from).ok()?;
            if !(prev_map.usable && prev_map.incomplete_tail) {
                return None;
            }
            let k = layout::archive_object(stanza, &archive_id, &prev);
            let whole = wal_object::decode(&storage.get(&k).await.ok()?, &k).ok()?;
            whole[whole.len().checked_sub(tail_len)?..].to_vec()
        }
    };
    // Decoding from a page boundary skips the continuation there and reads the records
    // starting after it, the cut one last.
    let tail_start = segno * seg - tail.len() as u64;
    let without = decode_caught(|| {
        pgstrata_pg::wal::decode_segment_until(&tail, major, 8192, Some(tail_start), u64::MAX)
    })?;
    if !without.incomplete_tail {
        return None;
    }
    let mut both = tail;
    both.extend_from_slice(&head);
    let with = decode_caught(|| {
        pgstrata_pg::wal::decode_segment_until(&both, major, 8192, Some(tail_start), segno * seg)
    })?;
    // Still cut: the record runs past `head`.
    (!with.incomplete_tail).then_some((with, without))
}

/// A decoding, with a failure or a panic of the decoder taken as "no result".
fn decode_caught<T>(decode: impl FnOnce() -> pgstrata_pg::Result<T>) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode))
        .ok()?
        .ok()
}

/// A segment's decoding, or why it failed (an error, or a decoder panic: a bug, which must
/// not fail the push, or archiving would stall and pg_wal fill up; it becomes an unusable
/// map, and backups hash instead).
fn decoded_or_why<T>(r: std::thread::Result<pgstrata_pg::Result<T>>) -> Result<T> {
    match r {
        Ok(Ok(decoded)) => Ok(decoded),
        Ok(Err(e)) => Err(e.into()),
        Err(p) => Err(Error::new(crate::ErrorKind::Io, panic_reason(&*p))),
    }
}

/// What a caught panic says, for an unusable map's reason.
fn panic_reason(payload: &(dyn std::any::Any + Send)) -> String {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    format!("the WAL decoder failed (a bug; please report it): {msg}")
}

/// The last `len` bytes of the full-size segment file at `path`, if it is there.
fn read_tail(path: &Path, seg_size: u64, len: usize) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    if f.metadata().ok()?.len() != seg_size {
        return None;
    }
    f.seek(SeekFrom::Start(seg_size - len as u64)).ok()?;
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// The map of a segment that cannot be decoded: still written, so that a backup knows to
/// hash instead of guessing.
fn unusable_map(name: &str, reason: String) -> ChangeMap {
    ChangeMap {
        segment: name.to_string(),
        usable: false,
        reason: Some(reason),
        ..Default::default()
    }
}

/// The map form of decoded changes.
pub(crate) fn change_map_of(name: &str, c: pgstrata_pg::wal::SegmentChanges) -> ChangeMap {
    ChangeMap {
        segment: name.to_string(),
        usable: true,
        reason: None,
        records: c.records,
        switched: c.switched,
        incomplete_tail: c.incomplete_tail,
        wal_level_minimal: c.wal_level_minimal,
        completes_previous: false,
        unknown_rmgrs: c.unknown_rmgrs.into_iter().collect(),
        blocks: c
            .blocks
            .into_iter()
            .map(|(f, b)| ForkBlocks {
                spc: f.spc,
                db: f.db,
                rel: f.rel,
                fork: f.fork,
                runs: ChangeMap::runs(b),
            })
            .collect(),
        created: c
            .created
            .into_iter()
            .map(|f| (f.spc, f.db, f.rel, f.fork))
            .collect(),
        truncated: c
            .truncated
            .into_iter()
            .map(|(f, n)| (f.spc, f.db, f.rel, f.fork, n))
            .collect(),
        dropped: c.dropped.into_iter().collect(),
        databases: c.databases.into_iter().collect(),
    }
}

pub(crate) fn valid_wal_name(name: &str) -> bool {
    if lsn::is_segment_name(name) {
        return true;
    }
    if let Some(base) = name.strip_suffix(".partial") {
        return lsn::is_segment_name(base);
    }
    if let Some(base) = name.strip_suffix(".history") {
        return base.len() == 8 && base.bytes().all(|b| b.is_ascii_hexdigit());
    }
    if let Some(base) = name.strip_suffix(".backup") {
        // 000000010000000000000002.00000028.backup
        return base.len() == 33 && lsn::is_segment_name(&base[..24]) && &base[24..25] == ".";
    }
    false
}

/// A segment must have the segment size (a .partial one may be shorter).
fn check_segment_len(len: u64, name: &str, seg_size: u64) -> Result<()> {
    if !name.ends_with(".partial") && len != seg_size {
        return Err(Error::refused(format!(
            "{name} is {len} bytes but WAL segments of this cluster are {seg_size} bytes"
        )));
    }
    Ok(())
}

/// Refuse a segment whose first page (in `start`, the file's first bytes) names another
/// cluster than the stanza's.
fn check_segment_cluster(start: &[u8], name: &str, sysid: &str) -> Result<()> {
    if start.len() >= 40 {
        let info = u16::from_le_bytes([start[2], start[3]]);
        if info & 0x0002 != 0 {
            let seg_sysid = u64::from_le_bytes(start[24..32].try_into().unwrap());
            if seg_sysid.to_string() != sysid {
                return Err(Error::refused(format!(
                    "{name} was written by cluster {seg_sysid}, but this stanza belongs to cluster {sysid}: check --stanza (after pg_upgrade, run stanza-upgrade first)"
                )));
            }
        }
    }
    Ok(())
}

/// Fetch one WAL file into `dest`. Returns false when the archive does not have it.
pub async fn archive_get(s: &Settings, name: &str, dest: &Path) -> Result<bool> {
    let (storage, stanza) = open_stanza(s).await?;
    let archive = archive_to_get_from(s, &stanza)?;
    let key = layout::archive_object(&s.stanza, &archive, name);
    let obj = match storage.get(&key).await {
        Ok(o) => o,
        Err(e) if e.is_not_found() && lsn::is_segment_name(name) => {
            let pieces = received_pieces(&storage, &s.stanza, &archive, name).await?;
            let seg_size = stanza.cluster.wal_segment_size;
            return get_received_partial(&storage, name, pieces, seg_size, dest).await;
        }
        Err(e) if e.is_not_found() => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let dest_owned = dest.to_path_buf();
    tokio::task::spawn_blocking(move || write_verified_file(&obj, &key, &dest_owned))
        .await
        .expect("archive-get write thread")?;
    log::info!("restored {name} from the archive");
    Ok(true)
}

/// The pieces `wal-receive` stored of segment `segment` in archive `archive_id`: (start,
/// end, key), by start.
pub(crate) async fn received_pieces(
    storage: &pgstrata_repo::Storage,
    stanza: &str,
    archive_id: &str,
    segment: &str,
) -> Result<Vec<(u64, u64, String)>> {
    let key = layout::archive_object(stanza, archive_id, segment);
    let dir = key.rsplit_once('/').map_or("", |(d, _)| d);
    let mut pieces: Vec<(u64, u64, String)> = storage
        .list(&format!("{dir}/"))
        .await?
        .into_iter()
        .filter_map(|o| {
            let name = o.key.rsplit('/').next()?;
            let (of, start, end) = layout::parse_received_piece(name)?;
            (of == segment).then(|| (start, end, o.key.clone()))
        })
        .collect();
    pieces.sort();
    Ok(pieces)
}

/// Segment `segment` from its `pieces` ([`received_pieces`]), chained from byte 0 and
/// zero-filled to the segment's size, into `dest`: recovery replays what it holds and ends
/// at its end (the last commits streamed), as with a `pg_receivewal` partial file. False
/// when there is no piece from byte 0.
async fn get_received_partial(
    storage: &pgstrata_repo::Storage,
    segment: &str,
    pieces: Vec<(u64, u64, String)>,
    seg_size: u64,
    dest: &Path,
) -> Result<bool> {
    let mut raw: Vec<u8> = Vec::new();
    // From the end so far, the piece that covers it and goes furthest.
    while let Some((start, end, key)) = pieces
        .iter()
        .filter(|(s, e, _)| *s <= raw.len() as u64 && *e > raw.len() as u64)
        .max_by_key(|(_, e, _)| *e)
        .cloned()
    {
        let bytes = wal_object::decode(&storage.get(&key).await?, &key)?;
        if bytes.len() as u64 != end - start {
            return Err(Error::integrity(format!(
                "{key}: holds {} bytes, and its name says {}",
                bytes.len(),
                end - start
            )));
        }
        let from = raw.len() - start as usize;
        raw.extend_from_slice(bytes.get(from..).unwrap_or_default());
        if raw.len() as u64 >= seg_size {
            break;
        }
    }
    if raw.is_empty() {
        return Ok(false);
    }
    let received = raw.len();
    let dest = dest.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<()> {
        raw.resize(seg_size as usize, 0);
        let tmp = tmp_beside(&dest);
        std::fs::write(&tmp, &raw)
            .and_then(|()| std::fs::rename(&tmp, &dest))
            .map_err(|e| Error::io(format!("archive-get: write {}", dest.display()), e))
    })
    .await
    .expect("archive-get write thread")?;
    log::info!("restored {segment} from {received} bytes received by wal-receive, zero-filled");
    Ok(true)
}

/// The archive archive-get serves: the one of the cluster that asks. After a
/// stanza-upgrade the stanza has several, whose WAL names overlap (each cluster's start
/// over), so a cluster restored from a backup taken before the upgrade must be given its
/// own cluster's WAL. PostgreSQL runs restore_command in the data directory, whose
/// pg_control names the cluster; without one there (run by hand), pg-path's; without
/// either, the stanza's current cluster.
fn archive_to_get_from(s: &Settings, stanza: &pgstrata_repo::stanza::StanzaInfo) -> Result<String> {
    if stanza.history.len() < 2 {
        return Ok(stanza.cluster.archive_id());
    }
    let asking = [Some(Path::new(".")), s.pg_path.as_deref()]
        .into_iter()
        .flatten()
        .find_map(|dir| {
            pgstrata_pg::control::ControlData::read(dir)
                .ok()
                .map(|c| (dir, c))
        });
    let Some((dir, control)) = asking else {
        return Ok(stanza.cluster.archive_id());
    };
    let sysid = control.system_identifier.to_string();
    match stanza.cluster_with_sysid(&sysid) {
        Some(cluster) => Ok(cluster.archive_id()),
        None => Err(Error::refused(format!(
            "archive-get: the cluster at {} ({sysid}) is none of stanza '{}''s clusters ({}): its WAL is not in this stanza",
            std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()).display(),
            s.stanza,
            stanza.history.iter().map(|c| c.archive_id()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Decode stored WAL object `obj` (named `key` in messages) into `dest` for PostgreSQL,
/// through a temporary file beside it: see [`write_verified`].
pub(crate) fn write_verified_file(obj: &[u8], key: &str, dest: &Path) -> Result<()> {
    let tmp = tmp_beside(dest);
    let name = match layout::parse_archive_object(key) {
        layout::ArchiveObject::Wal(name) => name,
        layout::ArchiveObject::ChangeMap { .. } => key,
    };
    write_verified(obj, key, &tmp, dest, &format!("archive-get {name}"))
}

/// The temporary name a file for PostgreSQL at `dest` is written under before it is renamed
/// into place.
fn tmp_beside(dest: &Path) -> std::path::PathBuf {
    dest.with_file_name(format!(
        ".{}.pgstrata.tmp",
        dest.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    ))
}

/// Decode stored WAL object `obj` (stored as `key`) into `dest`, through `tmp`, which is
/// renamed to `dest` only once the whole file matched its hash: PostgreSQL never sees a
/// partial or wrong file. There is no fsync: PostgreSQL reads the file at once and, after a
/// crash, asks for it again (pgBackRest does not sync it either).
fn write_verified(obj: &[u8], key: &str, tmp: &Path, dest: &Path, what: &str) -> Result<()> {
    let written = std::fs::File::create(tmp)
        .map_err(|e| Error::io(format!("{what}: create {}", tmp.display()), e))
        .and_then(|mut f| {
            // Damage exits as damage (4), a failed write as a failure (3).
            wal_object::decode_to(obj, key, &mut f).map_err(|e| Error::from(e).context(what))
        })
        .and_then(|()| {
            std::fs::rename(tmp, dest)
                .map_err(|e| Error::io(format!("{what}: rename into {}", dest.display()), e))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    written
}

/// Archived segment numbers per timeline.
pub(crate) type ArchivedSegments = BTreeMap<u32, BTreeSet<u64>>;

/// Holes in the archive, `[first missing, last missing]`, per timeline, from segment
/// `from` (the oldest backup's start; else the timeline's first archived segment) to the
/// timeline's last archived segment. Point-in-time recovery cannot cross one.
pub(crate) fn archive_gaps(
    segments: &ArchivedSegments,
    from: Option<u64>,
    seg_size: u64,
) -> Vec<(String, String)> {
    let mut gaps = Vec::new();
    for (tli, segs) in segments {
        let (Some(&lo), Some(&hi)) = (segs.first(), segs.last()) else {
            continue;
        };
        let mut missing_from: Option<u64> = None;
        for segno in from.map_or(lo, |o| o.max(lo))..=hi {
            match (segs.contains(&segno), missing_from) {
                (false, None) => missing_from = Some(segno),
                (true, Some(first)) => {
                    gaps.push((
                        lsn::segment_name(*tli, first, seg_size),
                        lsn::segment_name(*tli, segno - 1, seg_size),
                    ));
                    missing_from = None;
                }
                _ => {}
            }
        }
    }
    gaps
}

/// WAL waiting in pg_wal to be archived, as `info` and `check` report it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArchiveLag {
    /// Files PostgreSQL has marked ready (`archive_status/*.ready`).
    pub ready: usize,
    /// Of the ready segments, those this repository does not hold yet.
    pub ready_not_in_repo: usize,
    /// Seconds since the oldest ready file was marked ready.
    pub oldest_ready_age_secs: Option<u64>,
}

/// The archive lag of the cluster in `pg_path` against `archived` (this repository's
/// segments), or `None` when pg_wal cannot be read here (info on another host).
pub(crate) fn archive_lag(
    pg_path: &Path,
    archived: &ArchivedSegments,
    seg_size: u64,
) -> Option<ArchiveLag> {
    let status = pg_path.join("pg_wal").join("archive_status");
    let now = std::time::SystemTime::now();
    let mut lag = ArchiveLag {
        ready: 0,
        ready_not_in_repo: 0,
        oldest_ready_age_secs: None,
    };
    for e in std::fs::read_dir(status).ok()?.flatten() {
        let file = e.file_name().to_string_lossy().to_string();
        let Some(name) = file.strip_suffix(".ready") else {
            continue;
        };
        lag.ready += 1;
        if let Some((tli, segno)) = lsn::parse_segment_name(name, seg_size) {
            if !archived.get(&tli).is_some_and(|s| s.contains(&segno)) {
                lag.ready_not_in_repo += 1;
            }
        }
        let age = e
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| now.duration_since(t).ok())
            .map_or(0, |d| d.as_secs());
        lag.oldest_ready_age_secs = Some(lag.oldest_ready_age_secs.map_or(age, |a| a.max(age)));
    }
    Some(lag)
}

/// The archived segments' extent, for info: lowest and highest names, and when the highest
/// was stored, and every segment archived.
/// The newest segment `wal-receive` stored pieces of (`<segment>.<start>-<end>.receive.partial`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct WalReceiving {
    pub segment: String,
    /// Bytes of it received and stored.
    pub stored_bytes: u64,
    /// Unix seconds of the last write (the storage's clock).
    pub written: i64,
}

/// What a running `wal-receive` last told of its position: `<state-path>/<stanza>-wal-receive.json`
/// on its host, written with each status update it sends the server.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ReceiverStatus {
    /// The server it streams from.
    pub server: String,
    pub timeline: u32,
    /// WAL received, and stored in every repository, through these positions.
    pub received: String,
    pub flushed: String,
    /// Where the server's WAL ended when it last said, and how far `flushed` is behind.
    pub server_end: String,
    pub lag_bytes: u64,
    /// Unix seconds of this status.
    pub updated: i64,
}

impl ReceiverStatus {
    fn path(s: &Settings) -> Option<std::path::PathBuf> {
        Some(
            s.state_path
                .as_deref()?
                .join(format!("{}-wal-receive.json", s.stanza)),
        )
    }

    /// Keep it in state-path (a temporary file renamed into place).
    pub(crate) fn write(&self, s: &Settings) -> std::result::Result<(), String> {
        let Some(path) = Self::path(s) else {
            return Ok(());
        };
        let dir = path.parent().expect("in state-path");
        let written = pgstrata_repo::private_dir::create(dir, "state-path")
            .map_err(|e| e.to_string())
            .and_then(|()| {
                let tmp = path.with_extension("json.tmp");
                let json = serde_json::to_vec_pretty(self).expect("the status serializes");
                std::fs::write(&tmp, json)
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|e| e.to_string())
            });
        written.map_err(|e| format!("cannot keep its status in {}: {e}", path.display()))
    }

    /// The status this host's receiver of `s`'s stanza last wrote, if any.
    pub(crate) fn read(s: &Settings) -> Option<ReceiverStatus> {
        serde_json::from_slice(&std::fs::read(Self::path(s)?).ok()?).ok()
    }
}

pub(crate) struct ArchiveRange {
    pub min: String,
    pub max: String,
    /// Unix seconds the storage gives as the highest segment's last modification.
    pub max_modified: i64,
    pub segments: ArchivedSegments,
    /// The segment wal-receive is receiving, when it stored part of one.
    pub receiving: Option<WalReceiving>,
}

pub(crate) async fn archive_range(
    storage: &pgstrata_repo::Storage,
    stanza: &str,
    archive_id: &str,
    seg_size: u64,
) -> Result<Option<ArchiveRange>> {
    let root = layout::archive_root(stanza, archive_id);
    let mut range: Option<ArchiveRange> = None;
    let mut receiving: Option<WalReceiving> = None;
    for o in storage.list(&root).await? {
        let layout::ArchiveObject::Wal(name) = layout::parse_archive_object(&o.key) else {
            continue;
        };
        if let Some((segment, _, end)) = layout::parse_received_piece(name) {
            match &mut receiving {
                Some(r) if r.segment.as_str() > segment => {}
                Some(r) if r.segment == segment => {
                    r.stored_bytes = r.stored_bytes.max(end);
                    r.written = r.written.max(o.modified);
                }
                _ => {
                    receiving = Some(WalReceiving {
                        segment: segment.to_string(),
                        stored_bytes: end,
                        written: o.modified,
                    })
                }
            }
            continue;
        }
        if !lsn::is_segment_name(name) {
            continue;
        }
        let r = range.get_or_insert_with(|| ArchiveRange {
            min: name.to_string(),
            max: name.to_string(),
            max_modified: o.modified,
            segments: ArchivedSegments::new(),
            receiving: None,
        });
        if let Some((tli, segno)) = lsn::parse_segment_name(name, seg_size) {
            r.segments.entry(tli).or_default().insert(segno);
        }
        if name < r.min.as_str() {
            r.min = name.to_string();
        }
        if name > r.max.as_str() {
            r.max = name.to_string();
            r.max_modified = o.modified;
        }
    }
    if let Some(r) = range.as_mut() {
        r.receiving = receiving;
    }
    Ok(range)
}

/// Poll the archive until every segment is there.
pub(crate) async fn wait_for_wal(
    storage: &pgstrata_repo::Storage,
    stanza: &str,
    archive_id: &str,
    segments: &[String],
    timeout: std::time::Duration,
) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    for seg in segments {
        let key = layout::archive_object(stanza, archive_id, seg);
        loop {
            if storage.exists(&key).await? {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::new(
                    crate::ErrorKind::Timeout,
                    format!(
                        "WAL segment {seg} did not reach the archive within {}s: check that archive_command runs 'pgstrata archive-push --stanza={stanza} %p' and look in the PostgreSQL log for archiver errors",
                        timeout.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_decoder_panic_becomes_an_unusable_map() {
        let caught = std::thread::scope(|scope| {
            scope
                .spawn(|| -> pgstrata_pg::Result<()> { panic!("index out of bounds") })
                .join()
                .map_err(|p| panic_reason(&*p))
        });
        let why = caught.unwrap_err();
        let map = unusable_map("000000010000000000000002", why);
        assert!(!map.usable);
        let reason = map.complete().unwrap_err().to_string();
        assert!(
            reason.contains("WAL decoder failed") && reason.contains("index out of bounds"),
            "{reason}"
        );
        assert!(decode_caught(|| -> pgstrata_pg::Result<()> { panic!("x") }).is_none());
    }

    #[test]
    fn names() {
        assert!(valid_wal_name("000000010000000000000002"));
        assert!(valid_wal_name("000000010000000000000002.partial"));
        assert!(valid_wal_name("00000002.history"));
        assert!(valid_wal_name("000000010000000000000002.00000028.backup"));
        assert!(!valid_wal_name("pg_control"));
        assert!(!valid_wal_name("00000001000000000000000"));
    }
}
