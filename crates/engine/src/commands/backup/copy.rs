//! Copying the data directory's files: the plan (which entries and jobs the walk yields),
//! the worker pool that runs the jobs, and the one block copier.
//!
//! A file is carried by reference when its size and mtime say it is unchanged; otherwise
//! it goes through [`BlockCopier`], which checks page checksums, hashes each block, points
//! blocks equal to the prior backup's at the prior's storage, stores nothing for zero
//! blocks and compresses only changed blocks into frames. The whole-file path feeds it
//! every block in order; the WAL-tracked path feeds it only the blocks the WAL says
//! changed and tells it to carry the others from the prior backup unread.

use super::checkpoints::Checkpointer;
use super::copy_context::{CopyContext, Prior};
use crate::content::read_full_at;
use crate::walk::WalkedFile;
use crate::{pool, Error, Result};
use pgstrata_pg::data_dir;
use pgstrata_pg::lsn::Lsn;
use pgstrata_pg::page::{self, PageCheck};
use pgstrata_repo::chunk::Chunk;
use pgstrata_repo::manifest::{
    block_hash, BlockHashes, Chunks, FileEntry, MapDelta, MapRun, ThinVec, MAX_MAP_DEPTH,
};
use pgstrata_repo::pack::PackWriter;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

/// A file to copy, as the walk found it, with the prior backup's entry of it.
#[derive(Debug)]
pub(super) struct Job {
    pub file: WalkedFile,
    pub prior: Option<Box<FileEntry>>,
}

impl std::ops::Deref for Job {
    type Target = WalkedFile;
    fn deref(&self) -> &WalkedFile {
        &self.file
    }
}

/// Block size for a file's block map. Small blocks find small changes; large files get
/// larger blocks so their maps stay small (8 bytes per block). A file keeps
/// the block size of its prior backup so its blocks can be compared; it may differ between
/// backups of the same file only when there is no prior map.
pub fn block_size_for(size: u64, prior: Option<&FileEntry>) -> u32 {
    if let Some(p) = prior.filter(|p| p.block_size > 0) {
        return p.block_size;
    }
    match size {
        0..=0x400_0000 => 8192,            // up to 64 MiB
        0x400_0001..=0x1000_0000 => 16384, // up to 256 MiB
        _ => 32768,
    }
}

/// Result of copying files on a set of workers.
#[derive(Default)]
pub(super) struct CopyOutcome {
    pub stored: u64,
    pub packs: u64,
    pub pages_checked: u64,
    pub files_unchanged: u64,
    pub bytes_read: u64,
    /// Files whose changed blocks came from the WAL.
    pub files_tracked: u64,
    /// Changed files a WAL-tracked backup hashed instead, per reason.
    pub files_hashed: BTreeMap<String, u64>,
    /// Bytes whose frames an interrupted backup had stored (resume).
    pub resumed: u64,
    /// Files with new frames, extents inline, for the worker's next resume checkpoint
    /// (taken by the worker after each file; never absorbed).
    pub new_files: Vec<FileEntry>,
}

impl CopyOutcome {
    /// Add another worker's (or pass's) outcome to this one.
    pub(crate) fn absorb(&mut self, o: CopyOutcome) {
        crate::add_fields!(self += o; stored, packs, pages_checked, files_unchanged, bytes_read, files_tracked, resumed);
        for (reason, n) in o.files_hashed {
            *self.files_hashed.entry(reason).or_default() += n;
        }
    }
}

/// Copy the jobs of `groups` on `workers` threads of the pool, handing each file's entry
/// (`None`: it vanished) to `copied` with the number it came with; worker ids start at
/// `first_worker` so pack names of separate calls within one backup never collide.
/// `failed` is called when a worker fails (a feeder waiting for the copy to move on must
/// stop waiting). Blocks: call it from a blocking context.
pub(super) fn copy_files(
    ctx: &CopyContext,
    groups: impl Iterator<Item = Vec<(u64, Job)>>,
    workers: usize,
    first_worker: usize,
    copied: impl Fn(u64, Option<FileEntry>) -> Result<()> + Sync,
    failed: impl Fn() + Sync,
) -> Result<CopyOutcome> {
    let noted = |r: Result<()>| {
        if r.is_err() {
            failed();
        }
        r
    };
    let per_worker = pool::run(
        workers,
        groups,
        |i| {
            let writer = PackWriter::new(
                ctx.storage.clone(),
                ctx.runtime.clone(),
                &ctx.stanza,
                &ctx.label,
                first_worker + i,
                ctx.pack_size,
            );
            (writer, CopyOutcome::default(), Checkpointer::default())
        },
        |(writer, out, checkpoints), group| {
            noted((|| {
                for (n, job) in group {
                    copied(n, copy_file(ctx, job, writer, out)?)?;
                }
                if ctx.checkpoints {
                    for f in out.new_files.drain(..) {
                        checkpoints.add(f);
                    }
                    checkpoints.write_due(ctx, writer, false)?;
                }
                Ok(())
            })())
        },
        |(mut writer, mut out, mut checkpoints)| {
            noted((|| {
                writer.finish()?;
                if ctx.checkpoints {
                    // Everything is stored: the rest, in case the backup stops before its
                    // manifest is written (waiting for WAL, say).
                    for f in out.new_files.drain(..) {
                        checkpoints.add(f);
                    }
                    checkpoints.write_due(ctx, &mut writer, true)?;
                }
                Ok(())
            })())?;
            out.stored = writer.written;
            out.packs = writer.packs_written;
            Ok(out)
        },
    )?;
    let mut total = CopyOutcome::default();
    for o in per_worker {
        total.absorb(o);
    }
    Ok(total)
}

/// Jobs in the order given, with their numbers, cut into the groups a worker takes at
/// once: consecutive files up to [`GROUP_FILES`] of them or [`GROUP_BYTES`] together (a
/// larger file alone).
///
/// Why: handing a job to a worker costs a wake-up on each side. A no-change incremental
/// of many files is mostly files carried in a microsecond each, and one hand-over per file
/// made the threads spend a quarter of their time switching (61,000 files: `perf`,
/// `finish_task_switch` and spin-lock release at the top).
///
/// Lazy: a group is made when a worker can take it, so the jobs are not held twice.
pub(super) fn groups(
    jobs: impl Iterator<Item = (u64, Job)>,
) -> impl Iterator<Item = Vec<(u64, Job)>> {
    let mut jobs = jobs.peekable();
    std::iter::from_fn(move || {
        let (n, first) = jobs.next()?;
        let mut bytes = first.size;
        let mut group = vec![(n, first)];
        while group.len() < GROUP_FILES {
            let Some((n, job)) = jobs.next_if(|(_, j)| bytes + j.size <= GROUP_BYTES) else {
                break;
            };
            bytes += job.size;
            group.push((n, job));
        }
        Some(group)
    })
}

const GROUP_FILES: usize = 64;
const GROUP_BYTES: u64 = 8 << 20;

/// Copy one file. Unchanged files (same size and mtime as in the prior backup, and not
/// modified within the second the prior backup started) are carried by reference without
/// reading them; files the WAL tracks are read only where it says they changed; others are
/// read whole. Returns `None` when the file vanished before it could be opened (a dropped
/// relation: WAL replay removes it anyway).
fn copy_file(
    ctx: &CopyContext,
    mut job: Job,
    writer: &mut PackWriter,
    out: &mut CopyOutcome,
) -> Result<Option<FileEntry>> {
    let (Some(p), Some(e)) = (ctx.prior.as_ref(), job.prior.take()) else {
        return copy_whole(ctx, &job, writer, out, None);
    };
    // mtime has one-second granularity here: a file written in the same second the
    // prior backup started may have changed after it was read without moving its mtime.
    let start_epoch = p.manifest.header().start.epoch;
    if !ctx.delta && e.size == job.size && e.mtime == job.mtime && job.mtime < start_epoch {
        return carry_unchanged(ctx, &job, writer, p, *e, out).map(Some);
    }
    let job = &job;
    if let Some(w) = &ctx.wal {
        // A changed file with a stored map: a delta map, without reading the old map.
        if e.map_unloaded() && e.map_depth < MAX_MAP_DEPTH {
            if let Ok(pages) = w.pages_for(&job.rel, ctx.relseg_size, &e) {
                match copy_tracked_delta(ctx, job, writer, out, p, &e, &pages)? {
                    Tracked::Copied(entry) => return Ok(entry),
                    Tracked::TooManyChanges => {}
                }
            }
        }
    }
    let e = p.loaded(ctx, &e)?;
    let e = e.as_ref();
    if let Some(w) = &ctx.wal {
        match w.pages_for(&job.rel, ctx.relseg_size, e) {
            Ok(pages) => return copy_tracked(ctx, job, writer, out, p, e, &pages),
            Err(why) => {
                log::debug!("{}: read and hashed: {}", job.rel, why.as_str());
                *out.files_hashed
                    .entry(why.as_str().to_string())
                    .or_default() += 1;
            }
        }
    }
    copy_whole(ctx, job, writer, out, Some((p, e)))
}

/// The prior backup's entry, pointing at the prior's storage, with the file's owner now.
/// An entry of a format 1 manifest, which held its map inline, gets its map stored apart
/// once, so the backups after this one carry a reference.
fn carry_unchanged(
    ctx: &CopyContext,
    job: &Job,
    writer: &mut PackWriter,
    prior: &Prior,
    mut entry: FileEntry,
    out: &mut CopyOutcome,
) -> Result<FileEntry> {
    ctx.counters.bytes.fetch_add(job.size, Ordering::Relaxed);
    ctx.counters.files.fetch_add(1, Ordering::Relaxed);
    out.files_unchanged += 1;
    let stored_apart = entry.map.is_some() || entry.inline_map();
    entry.owner = job.owner.clone();
    entry.rebase(prior.label(), &ctx.label);
    if !stored_apart {
        store_map(ctx, writer, &mut entry)?;
    }
    Ok(entry)
}

/// Open a job's file; `None` when it vanished.
fn open_job(job: &Job) -> Result<Option<File>> {
    match File::open(job.abs()) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("open {}", job.abs().display()), e)),
    }
}

/// Read a file block by block, front to back: each block hashed (the block map), and the
/// whole file too unless it is a relation file ([`whole_file_hash`]).
fn copy_whole(
    ctx: &CopyContext,
    job: &Job,
    writer: &mut PackWriter,
    out: &mut CopyOutcome,
    prior: Option<(&Prior, &FileEntry)>,
) -> Result<Option<FileEntry>> {
    let Some(f) = open_job(job)? else {
        return Ok(None);
    };
    let bs = block_size_for(job.size, prior.map(|(_, e)| e));
    let prior_blocks = prior
        .filter(|(_, e)| e.block_size == bs)
        .map(|(p, e)| PriorBlocks::new(e, p.label(), &ctx.label));
    let whole_hash = whole_file_hash(&job.rel);
    let mut copier =
        BlockCopier::new(ctx, job, &f, bs, prior_blocks, job.size, whole_hash, writer)?;
    // A whole number of blocks per read, so blocks never straddle two reads; no more than
    // the file needs (most files of a database are a block or two, and a frame-sized
    // buffer zeroed for each cost a backup of a million files more than the copying).
    let read_size = (ctx.frame_size / bs as usize).max(1) * bs as usize;
    let read_size = read_size.min(block_multiple(job.size, bs));
    let mut buf = vec![0u8; read_size];
    let mut offset = 0u64;
    loop {
        let n = read_full_at(&f, &mut buf, offset)
            .map_err(|e| Error::io(format!("read {}", job.abs().display()), e))?;
        ctx.after_read(n);
        if n == 0 {
            break;
        }
        copier.add(writer, out, &mut buf[..n], offset)?;
        offset += n as u64;
        if n < buf.len() {
            break;
        }
    }
    copier.finish(writer, out).map(Some)
}

/// Whether a file read whole gets a BLAKE3 of its content besides its block map. A relation
/// file does not: its block map (an XXH3-64 of each block) covers every byte, and restore,
/// delta restore and verify check it block by block, as they always did a WAL-tracked file.
/// The second hash over every byte was a sixth of a full backup's CPU (BLAKE3 at
/// 8 GB/s a core beside zstd). It guards against accidental damage no better than the
/// block map; against someone who can write the repository neither hash helps, since the
/// manifest that holds them has no key (encryption is what stops forgery:
/// repository-format.md §6, §15). Other files (`pg_control`, configuration, small files)
/// keep it: they are few and small.
fn whole_file_hash(rel: &str) -> bool {
    data_dir::relation_file(rel).is_none()
}

/// A WAL-tracked file opened, its size, and the blocks of `entry.block_size` to read: those
/// holding the `pages` the WAL names, and every block from its prior size on. `None` when
/// the file vanished.
fn tracked_blocks(
    ctx: &CopyContext,
    job: &Job,
    entry: &FileEntry,
    pages: &[u32],
) -> Result<Option<TrackedFile>> {
    let Some(f) = open_job(job)? else {
        return Ok(None);
    };
    let size = f
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", job.abs().display()), e))?
        .len();
    let bs = entry.block_size as u64;
    let page = ctx.page_size as u64;
    let nblocks = size.div_ceil(bs);
    let mut read: BTreeSet<u64> = pages
        .iter()
        .map(|p| *p as u64 * page / bs)
        .filter(|b| *b < nblocks)
        .collect();
    read.extend(entry.size.min(size) / bs..nblocks);
    Ok(Some(TrackedFile {
        f,
        size,
        bs,
        nblocks,
        read,
    }))
}

/// What [`tracked_blocks`] found.
struct TrackedFile {
    f: File,
    size: u64,
    /// The block size of the file's map.
    bs: u64,
    nblocks: u64,
    /// The blocks to read.
    read: BTreeSet<u64>,
}

impl TrackedFile {
    /// Offset and length of block `i` of a file now `end` bytes long (the last block may be
    /// short); `None` past the end.
    fn block(&self, i: u64, end: u64) -> Option<(u64, usize)> {
        let off = i * self.bs;
        (off < end).then(|| (off, (end - off).min(self.bs) as usize))
    }
}

/// Copy a relation file reading only the blocks the WAL says changed (`pages`, numbered
/// within this file), plus any block around a change of size; every other block points
/// where the prior backup stored it. The whole-file hash is left empty: without reading
/// every block it cannot be computed, and restore checks each block's hash instead.
fn copy_tracked(
    ctx: &CopyContext,
    job: &Job,
    writer: &mut PackWriter,
    out: &mut CopyOutcome,
    prior: &Prior,
    entry: &FileEntry,
    pages: &[u32],
) -> Result<Option<FileEntry>> {
    let Some(t) = tracked_blocks(ctx, job, entry, pages)? else {
        return Ok(None);
    };
    let prior_blocks = PriorBlocks::new(entry, prior.label(), &ctx.label);
    let mut copier = BlockCopier::new(
        ctx,
        job,
        &t.f,
        t.bs as u32,
        Some(prior_blocks),
        t.size,
        false,
        writer,
    )?;
    let mut buf = vec![0u8; t.bs as usize];
    let mut end = t.size;
    for i in 0..t.nblocks {
        let Some((off, len)) = t.block(i, end) else {
            break;
        };
        if !t.read.contains(&i) && copier.carry_prior(off, len as u32) {
            continue;
        }
        if !copier.read_block(writer, out, &mut buf[..len], off, &mut end)? {
            break;
        }
    }
    out.files_tracked += 1;
    copier.finish(writer, out).map(Some)
}

/// What [`copy_tracked_delta`] did. (A return value, moved once: its size does not matter.)
#[allow(clippy::large_enum_variant)]
enum Tracked {
    /// Copied (`None`: the file vanished).
    Copied(Option<FileEntry>),
    /// More than a quarter of the file's blocks changed: a whole map is smaller than a
    /// delta over the old one, and the file is copied as before.
    TooManyChanges,
}

/// [`copy_tracked`] for a file whose prior map is stored apart, without reading that map:
/// only the changed blocks are read and stored, and the file gets a delta map
/// (`pgstrata_repo::manifest::MapDelta`) over the prior one. Blocks are not compared with
/// the prior's hashes (a block the WAL says changed rarely did not), and no resume
/// checkpoint lists the file (what it stores is small by construction).
fn copy_tracked_delta(
    ctx: &CopyContext,
    job: &Job,
    writer: &mut PackWriter,
    out: &mut CopyOutcome,
    prior: &Prior,
    entry: &FileEntry,
    pages: &[u32],
) -> Result<Tracked> {
    let Some(t) = tracked_blocks(ctx, job, entry, pages)? else {
        return Ok(Tracked::Copied(None));
    };
    if t.read.len() as u64 * 4 > t.nblocks {
        return Ok(Tracked::TooManyChanges);
    }
    let mut copier = BlockCopier::new(ctx, job, &t.f, t.bs as u32, None, t.size, false, writer)?;
    copier.merge_as_copied = false;
    let mut runs: Vec<(u32, u32)> = Vec::new();
    let mut buf = vec![0u8; t.bs as usize];
    let mut end = t.size;
    for &i in &t.read {
        let Some((off, len)) = t.block(i, end) else {
            break;
        };
        if !copier.read_block(writer, out, &mut buf[..len], off, &mut end)? {
            break;
        }
        match runs.last_mut() {
            Some((first, count)) if (*first + *count) as u64 == i => *count += 1,
            _ => runs.push((i as u32, 1)),
        }
    }
    out.files_tracked += 1;
    copier
        .finish_delta(writer, prior, entry, &runs, end)
        .map(|e| Tracked::Copied(Some(e)))
}

/// One file being copied: the one place where blocks are checked, hashed, compared with the
/// prior backup and stored.
struct BlockCopier<'a> {
    ctx: &'a CopyContext,
    job: &'a Job,
    file: &'a File,
    block_size: u32,
    prior: Option<PriorBlocks<'a>>,
    /// The interrupted backup's frames of this file (resume), tried after the prior's.
    resumed: Option<PriorBlocks<'a>>,
    /// Page number (within its relation) of the file's first page, when pages are checked.
    first_page: Option<u64>,
    /// The whole file's BLAKE3, when every byte passes through here.
    whole: Option<blake3::Hasher>,
    own_pack: bool,
    /// One extent per block as blocks arrive, merged from time to time (`compact`).
    extents: Vec<Chunk>,
    /// `extents[..compacted]` are merged.
    compacted: usize,
    /// Merge extents as blocks arrive (`compact`); off for a delta map, whose runs of
    /// blocks must keep their own extents.
    merge_as_copied: bool,
    hashes: BlockHashes,
    new: NewData,
    bad_pages: ThinVec<u32>,
    /// Bytes of the file covered so far, and those counted in the progress.
    end: u64,
    counted: u64,
}

impl<'a> BlockCopier<'a> {
    /// Start copying `job`'s file (`size` bytes expected). Files at least `bundle-limit`
    /// large get packs of their own.
    #[allow(clippy::too_many_arguments)]
    fn new(
        ctx: &'a CopyContext,
        job: &'a Job,
        file: &'a File,
        block_size: u32,
        prior: Option<PriorBlocks<'a>>,
        size: u64,
        whole_hash: bool,
        writer: &mut PackWriter,
    ) -> Result<BlockCopier<'a>> {
        let own_pack = size >= ctx.bundle_limit;
        if own_pack {
            writer.flush()?;
        }
        let first_page = data_dir::relation_file(&job.rel)
            .filter(|_| ctx.data_checksums)
            .map(|r| r.segno as u64 * ctx.relseg_size as u64);
        Ok(BlockCopier {
            ctx,
            job,
            file,
            block_size,
            prior,
            resumed: ctx.resume.as_ref().and_then(|r| {
                let e = r
                    .files
                    .get(&job.rel)
                    .filter(|e| e.block_size == block_size)?;
                Some(PriorBlocks::new(e, &r.label, &ctx.label))
            }),
            first_page,
            whole: whole_hash.then(blake3::Hasher::new),
            own_pack,
            extents: Vec::new(),
            compacted: 0,
            merge_as_copied: true,
            hashes: BlockHashes::with_capacity(size.div_ceil(block_size as u64) as usize),
            new: NewData {
                buf: Vec::with_capacity(ctx.frame_size.min(block_multiple(size, block_size))),
                pending: Vec::new(),
            },
            bad_pages: ThinVec::new(),
            end: 0,
            counted: 0,
        })
    }

    /// Carry the block of `len` bytes at `offset` from the prior backup without reading it.
    /// False when the prior backup has no hash or no single extent for it.
    fn carry_prior(&mut self, offset: u64, len: u32) -> bool {
        let index = (offset / self.block_size as u64) as usize;
        let Some(p) = &self.prior else {
            return false;
        };
        let Some((h, c)) = p.entry.block_hash(index).zip(p.locate(offset, len)) else {
            return false;
        };
        self.hashes.push(h);
        self.extents.push(c);
        self.end = offset + len as u64;
        self.compact();
        true
    }

    /// Merge the extents up to the first one still waiting for its frame (a placeholder of
    /// zeros that must not merge). Without this a large file would hold an extent of about
    /// 100 bytes per block until it is done: 35 MB per worker for a 1 GB segment.
    fn compact(&mut self) {
        if !self.merge_as_copied {
            return;
        }
        let upto = self.new.pending.first().map_or(self.extents.len(), |p| p.0);
        if upto < self.compacted + 256 {
            return;
        }
        let mut w = self.compacted;
        for r in self.compacted..upto {
            if w > 0 {
                let (merged, rest) = self.extents.split_at_mut(r);
                if merged[w - 1].try_merge(&rest[0]) {
                    continue;
                }
            }
            self.extents.swap(w, r);
            w += 1;
        }
        let removed = upto - w;
        if removed > 0 {
            self.extents.drain(w..upto);
            for p in &mut self.new.pending {
                p.0 -= removed;
            }
        }
        self.compacted = w;
    }

    /// Blocks read from the file at `offset`: a whole number of blocks, or the file's last.
    /// Read the block at `offset` of the file into `buf` (as long as the block, or as what
    /// is left of it before `end`) and [`add`](Self::add) it. A file that shrank while we
    /// read it ends at the short read (WAL replay redoes it): `end` moves there. False when
    /// nothing was left to read at `offset`.
    fn read_block(
        &mut self,
        writer: &mut PackWriter,
        out: &mut CopyOutcome,
        buf: &mut [u8],
        offset: u64,
        end: &mut u64,
    ) -> Result<bool> {
        let n = read_full_at(self.file, buf, offset)
            .map_err(|e| Error::io(format!("read {}", self.job.abs().display()), e))?;
        self.ctx.after_read(n);
        if n < buf.len() {
            *end = offset + n as u64;
            if n == 0 {
                return Ok(false);
            }
        }
        self.add(writer, out, &mut buf[..n], offset)?;
        Ok(true)
    }

    fn add(
        &mut self,
        writer: &mut PackWriter,
        out: &mut CopyOutcome,
        data: &mut [u8],
        offset: u64,
    ) -> Result<()> {
        if let Some(first_page) = self.first_page {
            self.check_pages(out, data, offset, first_page);
        }
        if let Some(h) = &mut self.whole {
            h.update(data);
        }
        let bs = self.block_size as usize;
        // Each block: its hash, and where it is stored already (all zeros, unchanged since
        // the prior backup, or stored by the interrupted one), or `None`: new.
        let known: Vec<Option<Chunk>> = data
            .chunks(bs)
            .enumerate()
            .map(|(i, block)| {
                let h = block_hash(block);
                self.hashes.push(h);
                self.stored_already(out, block, offset + (i * bs) as u64, h)
            })
            .collect();
        // What a full backup reads most: a frame's worth of new blocks and nothing pending.
        // They are one frame as they are, compressed from the read buffer: copying them into
        // the frame buffer first moved every byte once more.
        if self.new.buf.is_empty()
            && data.len() >= self.ctx.frame_size
            && known.iter().all(Option::is_none)
        {
            let frame = writer.add(&self.ctx.compression.compress(data), data.len())?;
            for (i, block) in data.chunks(bs).enumerate() {
                self.extents
                    .push(frame.slice((i * bs) as u32, block.len() as u32));
            }
        } else {
            for (block, known) in data.chunks(bs).zip(known) {
                if let Some(c) = known {
                    self.extents.push(c);
                    continue;
                }
                let len = block.len() as u32;
                let at = self.new.buf.len() as u32;
                self.new.pending.push((self.extents.len(), at, len));
                self.new.buf.extend_from_slice(block);
                self.extents.push(Chunk::zeros(len)); // placeholder until the frame is written
                if self.new.buf.len() >= self.ctx.frame_size {
                    self.new.flush(self.ctx, writer, &mut self.extents)?;
                }
            }
        }
        let n = data.len() as u64;
        out.bytes_read += n;
        self.ctx.counters.bytes.fetch_add(n, Ordering::Relaxed);
        self.counted += n;
        self.end = offset + n;
        self.compact();
        Ok(())
    }

    /// Where the block of `block_offset` (hash `h`) is stored already: all zeros, unchanged
    /// since the prior backup, or stored by the interrupted backup (in its own packs only).
    /// `None`: it is new.
    fn stored_already(
        &self,
        out: &mut CopyOutcome,
        block: &[u8],
        block_offset: u64,
        h: u64,
    ) -> Option<Chunk> {
        let len = block.len() as u32;
        if block.iter().all(|b| *b == 0) {
            return Some(Chunk::zeros(len));
        }
        let index = (block_offset / self.block_size as u64) as usize;
        if let Some(c) = self
            .prior
            .as_ref()
            .filter(|p| p.entry.block_hash(index) == Some(h))
            .and_then(|p| p.locate(block_offset, len))
        {
            return Some(c);
        }
        let r = self.resumed.as_ref()?;
        if r.entry.block_hash(index) != Some(h) {
            return None;
        }
        let c = r.locate_own(block_offset, len)?;
        out.resumed += len as u64;
        Some(c)
    }

    fn check_pages(&mut self, out: &mut CopyOutcome, data: &mut [u8], offset: u64, first: u64) {
        let ps = self.ctx.page_size;
        for at in (0..data.len() / ps).map(|i| i * ps) {
            let blkno = first + (offset + at as u64) / ps as u64;
            out.pages_checked += 1;
            let page = &mut data[at..at + ps];
            if let Some(bad) = check_page(
                self.file,
                page,
                blkno,
                offset + at as u64,
                self.ctx.start_lsn,
            ) {
                log::warn!(
                    "page checksum mismatch in {} block {blkno}: {bad}",
                    self.job.rel
                );
                self.bad_pages.push(blkno as u32);
            }
        }
    }

    /// Store what is pending and count the file as copied.
    fn flush_all(&mut self, writer: &mut PackWriter) -> Result<()> {
        self.new.flush(self.ctx, writer, &mut self.extents)?;
        if self.own_pack {
            writer.flush()?;
        }
        let counters = &self.ctx.counters;
        counters.files.fetch_add(1, Ordering::Relaxed);
        // Bytes not read (carried from the prior backup, or a file that shrank while being
        // copied) count too, so progress ends at 100 %.
        let uncounted = self.job.size.saturating_sub(self.counted);
        counters.bytes.fetch_add(uncounted, Ordering::Relaxed);
        Ok(())
    }

    /// Finish a file copied for a delta map: `runs` (first block, count) are the blocks
    /// added, in order, and the file is `size` bytes. Stores the delta map after the
    /// file's frames and describes the file by it.
    fn finish_delta(
        mut self,
        writer: &mut PackWriter,
        prior: &Prior,
        entry: &FileEntry,
        runs: &[(u32, u32)],
        size: u64,
    ) -> Result<FileEntry> {
        self.flush_all(writer)?;
        debug_assert_eq!(
            self.extents.len(),
            self.hashes.len(),
            "one extent per block"
        );
        let mut extents = self.extents.into_iter();
        let runs = runs
            .iter()
            .map(|&(first, count)| MapRun {
                first,
                count,
                chunks: merged(extents.by_ref().take(count as usize)).into_vec(),
            })
            .collect();
        let mut base_entry = entry.clone();
        base_entry.rebase(prior.label(), &self.ctx.label);
        let delta = MapDelta {
            size,
            base: *base_entry.map.take().expect("a delta over a stored map"),
            runs,
            hashes: self.hashes.into_vec(),
        };
        let raw = delta.encode();
        let map_ref = writer.add(&self.ctx.compression.compress(&raw), raw.len())?;
        let mut new = FileEntry {
            path: self.job.rel.as_str().into(),
            size,
            mtime: self.job.mtime,
            owner: self.job.owner.clone(),
            hash: None,
            chunks: Chunks::new(),
            bad_pages: self.bad_pages,
            block_size: self.block_size,
            block_hashes: BlockHashes::new(),
            map: None,
            packs: ThinVec::new(),
            map_depth: 0,
        };
        new.set_delta_map(map_ref, &delta, base_entry.packs, entry.map_depth + 1);
        Ok(new)
    }

    /// Store what is pending and describe the file as copied.
    fn finish(mut self, writer: &mut PackWriter, out: &mut CopyOutcome) -> Result<FileEntry> {
        self.flush_all(writer)?;
        let chunks = merged(self.extents.into_iter());
        let mut entry = FileEntry {
            path: self.job.rel.as_str().into(),
            size: self.end,
            mtime: self.job.mtime,
            owner: self.job.owner.clone(),
            hash: self.whole.map(|h| *h.finalize().as_bytes()),
            chunks,
            bad_pages: self.bad_pages,
            block_size: self.block_size,
            block_hashes: self.hashes,
            map: None,
            packs: ThinVec::new(),
            map_depth: 0,
        };
        let new_frames = entry
            .chunks
            .iter()
            .any(|c| c.pack.is_some() && c.backup.is_none());
        if self.ctx.checkpoints && new_frames && entry.size >= super::checkpoints::MIN_FILE_SIZE {
            out.new_files.push(entry.clone());
        }
        if !entry.inline_map() {
            store_map(self.ctx, writer, &mut entry)?;
        }
        Ok(entry)
    }
}

/// Extents in file order, each merged into the one before it where it continues it.
fn merged(extents: impl Iterator<Item = Chunk>) -> Chunks {
    let mut chunks = Chunks::new();
    for e in extents {
        if let Some(last) = chunks.last_mut() {
            if last.try_merge(&e) {
                continue;
            }
        }
        chunks.push(e);
    }
    // Kept in the manifest until the backup ends: room for what it holds (a one-extent
    // file's extent in the entry itself).
    chunks.shrink_to_fit();
    chunks
}

/// Store a file's extents and block hashes apart, in a frame after the file's own
/// (format 2 `FileMap`), and make the entry refer to it.
fn store_map(ctx: &CopyContext, writer: &mut PackWriter, entry: &mut FileEntry) -> Result<()> {
    let map = entry.take_map();
    let raw = map.encode();
    let map_ref = writer.add(&ctx.compression.compress(&raw), raw.len())?;
    entry.set_map(map_ref, &map);
    Ok(())
}

/// Where the prior backup stored each block of one file.
struct PriorBlocks<'a> {
    entry: &'a FileEntry,
    /// File offset at which each extent starts.
    starts: Vec<u64>,
    prior_label: &'a str,
    label: &'a str,
}

impl<'a> PriorBlocks<'a> {
    fn new(entry: &'a FileEntry, prior_label: &'a str, label: &'a str) -> PriorBlocks<'a> {
        let mut starts = Vec::with_capacity(entry.chunks.len());
        let mut off = 0u64;
        for c in &entry.chunks {
            starts.push(off);
            off += c.raw as u64;
        }
        PriorBlocks {
            entry,
            starts,
            prior_label,
            label,
        }
    }

    /// The prior extent for `[offset, offset+len)`, if one extent holds all of it, as seen
    /// from the new backup.
    fn locate(&self, offset: u64, len: u32) -> Option<Chunk> {
        self.locate_where(offset, len, |_| true)
    }

    /// As `locate`, but only an extent stored by the entry's own backup.
    fn locate_own(&self, offset: u64, len: u32) -> Option<Chunk> {
        self.locate_where(offset, len, |c| c.backup.is_none() && c.pack.is_some())
    }

    fn locate_where(
        &self,
        offset: u64,
        len: u32,
        wanted: impl Fn(&Chunk) -> bool,
    ) -> Option<Chunk> {
        let i = self
            .starts
            .partition_point(|s| *s <= offset)
            .checked_sub(1)?;
        let c = &self.entry.chunks[i];
        if !wanted(c) {
            return None;
        }
        let skip = offset - self.starts[i];
        if skip + len as u64 > c.raw as u64 {
            return None;
        }
        Some(
            c.slice(skip as u32, len)
                .rebased(self.prior_label, self.label),
        )
    }
}

/// Changed blocks of one file waiting to fill a frame.
struct NewData {
    buf: Vec<u8>,
    /// (index into the extent list, offset in buf, length)
    pending: Vec<(usize, u32, u32)>,
}

impl NewData {
    fn flush(
        &mut self,
        ctx: &CopyContext,
        writer: &mut PackWriter,
        extents: &mut [Chunk],
    ) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let stored = ctx.compression.compress(&self.buf);
        let frame = writer.add(&stored, self.buf.len())?;
        for (idx, at, len) in self.pending.drain(..) {
            extents[idx] = frame.slice(at, len);
        }
        self.buf.clear();
        Ok(())
    }
}

/// Check one page; a page that fails is re-read once (it may have been torn by a
/// concurrent write). Pages changed after the backup started are replayed from WAL, so
/// their checksum does not matter. Returns a description of real corruption.
fn check_page(
    f: &File,
    page_buf: &mut [u8],
    blkno: u64,
    file_offset: u64,
    start_lsn: Lsn,
) -> Option<String> {
    let blkno32 = blkno as u32;
    match page::verify(page_buf, blkno32) {
        PageCheck::Valid | PageCheck::Zero => return None,
        PageCheck::Mismatch { .. } if page::page_lsn(page_buf) >= start_lsn.0 => return None,
        PageCheck::Mismatch { .. } => {}
    }
    let mut again = vec![0u8; page_buf.len()];
    if f.read_exact_at(&mut again, file_offset).is_ok() {
        let ok = match page::verify(&again, blkno32) {
            PageCheck::Valid | PageCheck::Zero => true,
            PageCheck::Mismatch { .. } => page::page_lsn(&again) >= start_lsn.0,
        };
        if ok {
            page_buf.copy_from_slice(&again);
            return None;
        }
    }
    match page::verify(page_buf, blkno32) {
        PageCheck::Mismatch { stored, computed } => Some(format!(
            "stored checksum {stored:#06x}, computed {computed:#06x}"
        )),
        _ => None,
    }
}

/// `size` rounded up to whole blocks of `block_size`, at least one block (a file may grow
/// while it is read: one more read finds its end).
fn block_multiple(size: u64, block_size: u32) -> usize {
    let blocks = size.div_ceil(block_size as u64).max(1) as usize;
    blocks.saturating_mul(block_size as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgstrata_repo::manifest::Owner;

    fn owner() -> Owner {
        Owner {
            mode: 0o600,
            uid: 1,
            gid: 1,
            user: None,
            group: None,
        }
    }

    #[test]
    fn relation_files_are_checked_by_their_block_maps_alone() {
        for rel in [
            "base/5/16384",
            "base/5/16384.2",
            "base/5/16384_fsm",
            "global/1262",
        ] {
            assert!(!whole_file_hash(rel), "{rel}");
        }
        for rel in [
            "global/pg_control",
            "postgresql.conf",
            "base/5/PG_VERSION",
            "pg_xact/0000",
        ] {
            assert!(whole_file_hash(rel), "{rel}");
        }
    }

    #[test]
    fn small_files_are_handed_over_in_groups_and_large_ones_alone() {
        let job = |i: usize, size: u64| Job {
            file: WalkedFile {
                rel: format!("base/1/{i}"),
                root: std::path::Path::new("/x").into(),
                owner: owner(),
                mtime: 0,
                size,
            },
            prior: None,
        };
        let mut jobs = vec![job(0, 100 << 20)];
        jobs.extend((1..=100).map(|i| job(i, 1024)));
        jobs.push(job(101, 5 << 20));
        jobs.push(job(102, 5 << 20));
        let groups: Vec<Vec<(u64, Job)>> = groups((0u64..).zip(jobs)).collect();
        let lens: Vec<usize> = groups.iter().map(Vec::len).collect();
        assert_eq!(lens, [1, 64, 37, 1]);
        // In the order given, numbered in that order.
        let order: Vec<(u64, &str)> = groups
            .iter()
            .flatten()
            .map(|(n, j)| (*n, j.rel.as_str()))
            .collect();
        let expected: Vec<(u64, String)> = (0..=102).map(|i| (i, format!("base/1/{i}"))).collect();
        let expected: Vec<(u64, &str)> = expected.iter().map(|(n, p)| (*n, p.as_str())).collect();
        assert_eq!(order, expected);
    }

    fn frame(pack: &str, backup: Option<&str>, offset: u64, raw: u32) -> Chunk {
        Chunk {
            pack: Some(pack.into()),
            backup: backup.map(Into::into),
            offset,
            stored: 100,
            raw,
            check: Some(0),
            at: 0,
            frame: 0,
        }
    }

    fn file(chunks: Vec<Chunk>) -> FileEntry {
        let size = chunks.iter().map(|c| c.raw as u64).sum();
        FileEntry {
            path: "base/1/1259".into(),
            size,
            mtime: 0,
            owner: owner(),
            hash: None,
            chunks: chunks.into(),
            bad_pages: ThinVec::new(),
            block_size: 8192,
            block_hashes: BlockHashes::new(),
            map: None,
            packs: ThinVec::new(),
            map_depth: 0,
        }
    }

    #[test]
    fn prior_blocks_are_found_inside_extents_and_seen_from_the_new_backup() {
        // The prior backup "P" stored 16 KiB in one of its own frames, then 8 KiB of zeros,
        // then 8 KiB that P itself carried from an older backup "O".
        let entry = file(vec![
            frame("0-0", None, 0, 16384),
            Chunk::zeros(8192),
            frame("1-0", Some("O"), 4096, 8192),
        ]);
        let prior = PriorBlocks::new(&entry, "P", "N");
        let second = prior.locate(8192, 8192).unwrap();
        assert_eq!(second.pack.as_deref(), Some("0-0"));
        assert_eq!(
            second.backup.as_deref(),
            Some("P"),
            "P's own frame, seen from N"
        );
        assert_eq!(
            (second.at, second.raw, second.frame_len()),
            (8192, 8192, 16384)
        );
        let first = prior.locate(0, 8192).unwrap();
        assert_eq!((first.at, first.raw), (0, 8192));
        assert!(prior.locate(16384, 8192).unwrap().is_zero());
        let older = prior.locate(24576, 8192).unwrap();
        assert_eq!(
            older.backup.as_deref(),
            Some("O"),
            "still the older backup's"
        );
        assert_eq!(older.offset, 4096);
        // A last block shorter than the block size is inside the extent too.
        assert_eq!(prior.locate(24576, 100).unwrap().raw, 100);
        // Straddling two extents, or past the end: not one extent, so read it.
        assert!(prior.locate(12288, 8192).is_none());
        assert!(prior.locate(32768, 8192).is_none());
        // A frame of the backup being taken needs no label.
        let own = PriorBlocks::new(&entry, "P", "O");
        assert_eq!(own.locate(24576, 8192).unwrap().backup, None);
    }

    #[test]
    fn block_size_follows_the_prior_backup_else_the_file_size() {
        assert_eq!(block_size_for(1 << 20, None), 8192);
        assert_eq!(block_size_for(100 << 20, None), 16384);
        assert_eq!(block_size_for(1 << 30, None), 32768);
        let mut prior = file(vec![Chunk::zeros(8192)]);
        prior.block_size = 16384;
        assert_eq!(block_size_for(1 << 20, Some(&prior)), 16384);
    }
}
