//! The workers' side of restore: decide per file what it takes (keep, patch, write whole,
//! or, for a database left out of a selective restore, a sparse zeroed file),
//! fetch the frames and write them through the [`TargetTree`], then set mode, owner and
//! time on the open file.
//!
//! Each file's content is checked against the hashes recorded at backup time as it is
//! written; a mismatch stops the restore naming the file. Files are not fsynced one by one:
//! restore syncs the target filesystems once at the end, before it writes `pg_control`.

use super::pieces::{PieceCheck, PIECE_LEN};
use super::plan::RestoreJob;
use super::tree::{set_attributes, EntryKind, ParentCache, TargetTree};
use crate::content::{
    check_reader, extents_of, for_each_extent, read_buffer_len, read_full_at, ContentCheck,
};
use crate::owner::OwnerResolver;
use crate::{Error, Result};
use pgstrata_repo::chunk::Chunk;
use pgstrata_repo::manifest::{block_hash, FileEntry, Manifest};
use pgstrata_repo::pack::FrameReader;
use pgstrata_repo::Storage;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::Ordering;

/// What every worker shares.
pub(super) struct Shared<'a> {
    pub storage: &'a Storage,
    pub runtime: tokio::runtime::Handle,
    pub manifest: &'a Manifest,
    pub tree: &'a TargetTree,
    pub delta: bool,
    /// Databases left out of a selective restore: their files written as sparse zeroed
    /// files.
    pub selection: &'a super::selective::Selection,
    /// Running as root: give files to their recorded owners.
    pub chown: bool,
    /// An instant restore: large relation files are deferred (`crate::instant`).
    pub instant: Option<&'a crate::instant::Deferring>,
    pub counters: &'a crate::progress::Counters,
}

/// One worker's state.
pub(super) struct Worker<'a> {
    reader: FrameReader<'a>,
    resolver: OwnerResolver,
    cache: ParentCache,
    pub tally: super::RestoreCounts,
}

impl<'a> Worker<'a> {
    pub fn new(sh: &Shared<'a>) -> Worker<'a> {
        Worker {
            reader: FrameReader::new(sh.storage, sh.manifest),
            resolver: OwnerResolver::default(),
            cache: ParentCache::default(),
            tally: super::RestoreCounts::default(),
        }
    }

    pub fn finish(self) -> super::RestoreCounts {
        let mut t = self.tally;
        t.bytes_fetched = self.reader.fetched;
        t
    }
}

/// Run one job.
pub(super) fn run_job(sh: &Shared, w: &mut Worker, job: &RestoreJob) -> Result<()> {
    match job {
        RestoreJob::One(f) => restore_file(sh, w, f),
        RestoreJob::Group(files) => {
            // Decide every file first (a delta restore compares local blocks), then fetch
            // what all of them need with one merged read.
            let actions = files
                .iter()
                .map(|f| decide(sh, w, f))
                .collect::<Result<Vec<_>>>()?;
            let chunks = files
                .iter()
                .zip(&actions)
                .flat_map(|(f, a)| a.needed(f).map(move |c| (c, &*f.path)))
                .filter(|(c, _)| !c.is_zero());
            w.reader.pin();
            sh.runtime.block_on(w.reader.load_for_files(chunks))?;
            for (f, action) in files.iter().zip(actions) {
                restore_one(sh, w, f, action)?;
            }
            w.reader.unpin();
            Ok(())
        }
    }
}

/// Restore one file on its own, loading its map first when it is stored apart (held only
/// while the file is restored).
pub(super) fn restore_file(sh: &Shared, w: &mut Worker, f: &FileEntry) -> Result<()> {
    let loaded;
    let f = if f.map_unloaded() {
        loaded = sh
            .runtime
            .block_on(sh.manifest.load_map(w.reader.storage(), f))?;
        &loaded
    } else {
        f
    };
    let action = decide(sh, w, f)?;
    restore_one(sh, w, f, action)
}

/// What restoring one file takes, decided from the local file alone (nothing fetched yet).
enum Action {
    /// The local file already is the backed-up file.
    Keep,
    /// Write the whole file.
    Write,
    /// Write these extents (the blocks that differ) in place, then truncate to size and
    /// read back the pieces written to prove the file whole.
    Patch(Vec<(u64, Chunk)>, PieceCheck),
    /// A sparse zeroed file of the recorded size (selective restore): nothing read.
    Zero,
    /// Instant restore: a link to the file served on demand, its backing file sized.
    Defer,
}

impl Action {
    /// The extents this action reads from the repository.
    fn needed<'a>(&'a self, f: &'a FileEntry) -> Box<dyn Iterator<Item = &'a Chunk> + 'a> {
        match self {
            Action::Keep | Action::Zero | Action::Defer => Box::new(std::iter::empty()),
            Action::Write => Box::new(f.chunks.iter()),
            Action::Patch(extents, _) => Box::new(extents.iter().map(|(_, c)| c)),
        }
    }
}

fn decide(sh: &Shared, w: &mut Worker, f: &FileEntry) -> Result<Action> {
    if sh.selection.is_zeroed(&f.path) {
        return Ok(Action::Zero);
    }
    if sh.instant.is_some()
        && crate::instant::defers(&f.path, f.size, f.chunks.iter().map(|c| c.raw))
    {
        return Ok(Action::Defer);
    }
    if !sh.delta {
        return Ok(Action::Write);
    }
    let local = sh.tree.open_existing(&f.path, false, &mut w.cache)?;
    action_for(f, local, &sh.tree.display_path(&f.path))
}

/// What restoring `f` over `local` (the file already in its place, if any) takes: a file
/// with a block map is compared block by block, any other as a whole.
fn action_for(f: &FileEntry, local: Option<File>, path: &Path) -> Result<Action> {
    let Some(mut fh) = local else {
        return Ok(Action::Write);
    };
    if f.block_size > 0 {
        delta_plan(f, &fh, path)
    } else {
        let len = fh
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
            .len();
        if len == f.size && check_reader(f, &mut fh, path).is_ok() {
            Ok(Action::Keep)
        } else {
            Ok(Action::Write)
        }
    }
}

/// Restore one file as decided, then set its mode, time and owner on the descriptor.
fn restore_one(sh: &Shared, w: &mut Worker, f: &FileEntry, action: Action) -> Result<()> {
    let path = sh.tree.display_path(&f.path);
    let fh = match action {
        Action::Keep => {
            w.tally.files_kept += 1;
            sh.tree
                .open_existing(&f.path, false, &mut w.cache)?
                .ok_or_else(|| changed_under_us(&path))?
        }
        Action::Patch(extents, check) => {
            w.tally.files_patched += 1;
            let fh = sh
                .tree
                .open_existing(&f.path, true, &mut w.cache)?
                .ok_or_else(|| changed_under_us(&path))?;
            w.tally.bytes_written += patch_file(sh, &mut w.reader, f, &fh, &path, &extents, check)?;
            fh
        }
        Action::Zero => {
            // Truncated to nothing first: a delta restore drops what was there too.
            let fh = sh.tree.create_file(&f.path, &mut w.cache)?;
            fh.set_len(f.size)
                .map_err(|e| Error::io(format!("extend {}", path.display()), e))?;
            w.tally.files_zeroed += 1;
            fh
        }
        Action::Defer => {
            let deferring = sh.instant.expect("deferred in an instant restore");
            // A tablespace's file is backed in its location: on its filesystem.
            let store = f
                .path
                .strip_prefix("pg_tblspc/")
                .and_then(|rest| rest.split('/').next()?.parse::<u32>().ok())
                .and_then(|oid| sh.tree.tablespace(oid))
                .map(|t| crate::instant::tablespace_store(&t.path, &deferring.pg_path));
            let (fh, target) = deferring.add(&f.path, f.size, store)?;
            sh.tree.create_symlink(&f.path, &target, &mut w.cache)?;
            w.tally.files_deferred += 1;
            w.tally.bytes_deferred += crate::content::stored_bytes(&f.chunks);
            fh
        }
        Action::Write => {
            let fh = write_file(sh, w, f, &f.path, &path)?;
            w.tally.files_written += 1;
            w.tally.bytes_written += f.size;
            fh
        }
    };
    set_file_attributes(sh, w, f, &fh, &path)?;
    count_restored(sh, f);
    Ok(())
}

/// Give restored file `f` (open as `fh`, shown as `path`) its recorded mode, owner (when
/// restoring ownership) and modification time.
fn set_file_attributes(
    sh: &Shared,
    w: &mut Worker,
    f: &FileEntry,
    fh: &File,
    path: &Path,
) -> Result<()> {
    let owner = sh.chown.then(|| w.resolver.ids(&f.owner));
    set_attributes(
        fh.as_fd(),
        EntryKind::File,
        f.owner.mode,
        owner,
        Some(f.mtime),
        path,
    )
}

/// File `f` is restored: the progress counters take it.
fn count_restored(sh: &Shared, f: &FileEntry) {
    sh.counters.files.fetch_add(1, Ordering::Relaxed);
    sh.counters.bytes.fetch_add(f.size, Ordering::Relaxed);
}

fn changed_under_us(path: &Path) -> Error {
    Error::refused(format!(
        "{} changed while restore was writing it: is something else writing into the target?",
        path.display()
    ))
}

/// Write `pg_control` under a temporary name, then rename it into place once it is
/// durable: until then the directory cannot be started.
pub(super) fn write_control(sh: &Shared, w: &mut Worker, f: &FileEntry) -> Result<()> {
    let tmp = format!("{}.pgstrata-tmp", f.path);
    let path = sh.tree.display_path(&f.path);
    let fh = write_file(sh, w, f, &tmp, &path)?;
    set_file_attributes(sh, w, f, &fh, &path)?;
    fh.sync_all()
        .map_err(|e| Error::io(format!("sync {}", path.display()), e))?;
    drop(fh);
    sh.tree.rename_into_place(&tmp, &f.path, &mut w.cache)?;
    w.tally.files_written += 1;
    w.tally.bytes_written += f.size;
    count_restored(sh, f);
    Ok(())
}

/// Write a whole file from its extents at `rel` (its path, or a temporary name beside it),
/// checked; returns it open.
fn write_file(sh: &Shared, w: &mut Worker, f: &FileEntry, rel: &str, path: &Path) -> Result<File> {
    let fh = sh.tree.create_file(rel, &mut w.cache)?;
    // Sized to the file: a 1 MiB buffer for each of a million one-page files was most of
    // what writing them cost.
    let mut out = std::io::BufWriter::with_capacity(read_buffer_len(f.size), WriteBehind::new(fh));
    let mut check = ContentCheck::new(f);
    for_each_extent(
        &sh.runtime,
        &mut w.reader,
        &extents_of(f),
        &f.path,
        |_, data| {
            check.update(data);
            out.write_all(data)
                .map_err(|e| Error::io(format!("write {}", path.display()), e))
        },
    )?;
    let fh = out
        .into_inner()
        .map_err(|e| Error::io(format!("write {}", path.display()), e.into_error()))?
        .finish();
    check.finish()?;
    Ok(fh)
}

/// A file being written front to back whose bytes are handed to the disk as they come,
/// every [`WriteBehind::EVERY`] bytes and at the end (files of 1 MiB or more), without
/// waiting for them
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, as PostgreSQL's `checkpoint_flush_after`).
///
/// Why: restore makes everything durable with one `syncfs` at the end (`Tree::
/// sync_filesystems`). Without this the kernel starts writing back only when dirty pages
/// pass its background threshold (gigabytes on a large host), so the whole restore's data
/// went to disk after the last byte had arrived: 0.4 s of a 2.4 s restore over a
/// 100 Mbit/s line, and the tail of every large local restore. With it, writing to disk
/// overlaps fetching and decompressing, and the final `syncfs` finds little left to do.
/// A hint: where the call fails (not Linux, a filesystem without it) nothing changes.
struct WriteBehind {
    file: File,
    written: u64,
    /// Bytes before this offset have been handed to the disk.
    started: u64,
}

impl WriteBehind {
    const EVERY: u64 = 8 << 20;
    const SMALL: u64 = 1 << 20;

    fn new(file: File) -> WriteBehind {
        WriteBehind {
            file,
            written: 0,
            started: 0,
        }
    }

    fn start_writeback(&mut self) {
        if self.written > self.started {
            crate::content::start_writeback(&self.file, self.started, self.written - self.started);
            self.started = self.written;
        }
    }

    /// The file, its last bytes handed to the disk unless it is small: tens of thousands
    /// of small files each sent to the disk alone would cost more than the final `syncfs`
    /// writing them together.
    fn finish(mut self) -> File {
        if self.written >= Self::SMALL {
            self.start_writeback();
        }
        self.file
    }
}

impl std::io::Write for WriteBehind {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= Self::EVERY {
            self.start_writeback();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Delta restore of a file with a block map: hash the local blocks and find the extents
/// holding blocks that differ. The file is taken in pieces of [`PIECE_LEN`]; a piece with no
/// differing block is hashed for the whole-file check ([`PieceCheck`]), so that a patched
/// file is proved whole by reading again only the pieces written, and a file kept as it is
/// matches its whole-file BLAKE3 too (the blocks' XXH3s alone are no cryptographic check).
fn delta_plan(f: &FileEntry, fh: &File, path: &Path) -> Result<Action> {
    let local_len = fh
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
        .len();
    let bs = f.block_size as u64;
    let mut differing: Vec<(u64, u64)> = Vec::new(); // (offset, len) runs
    let mut check = PieceCheck::new(f);
    // Read in parts small enough to stay in a core's cache while both hashes go over them.
    const READ_LEN: usize = 128 << 10;
    const _: () = assert!(PIECE_LEN.is_multiple_of(READ_LEN));
    let mut buf = vec![0u8; READ_LEN.min(f.size as usize)];
    for (piece, piece_at) in (0..f.size).step_by(PIECE_LEN).enumerate() {
        let piece_end = f.size.min(piece_at + PIECE_LEN as u64);
        let mut hasher = check.piece_hasher(f, piece);
        let mut piece_differs = false;
        for offset in (piece_at..piece_end).step_by(READ_LEN) {
            let want = (piece_end - offset).min(READ_LEN as u64) as usize;
            let have = local_len.saturating_sub(offset).min(want as u64) as usize;
            let n = read_full_at(fh, &mut buf[..have], offset)
                .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            for (i, block) in buf[..want].chunks(bs as usize).enumerate() {
                let block_off = offset + i as u64 * bs;
                let block_index = (block_off / bs) as usize;
                let local_ok = block_off + block.len() as u64 <= offset + n as u64;
                if !(local_ok && f.block_hash(block_index) == Some(block_hash(block))) {
                    piece_differs = true;
                    match differing.last_mut() {
                        Some((o, l)) if *o + *l == block_off => *l += block.len() as u64,
                        _ => differing.push((block_off, block.len() as u64)),
                    }
                }
            }
            if let (false, Some(hasher)) = (piece_differs, &mut hasher) {
                hasher.update(&buf[..want]);
            }
        }
        if !piece_differs {
            check.matched(piece, hasher);
        }
    }
    if differing.is_empty() {
        if !check.matches(f) {
            // Every block's XXH3 matches and the whole does not: written again, whole.
            return Ok(Action::Write);
        }
        if local_len == f.size {
            return Ok(Action::Keep);
        }
        // Longer than recorded: truncated by the patch.
    }
    Ok(Action::Patch(extents_covering(f, &differing), check))
}

/// The extents of `f` covering the byte runs `runs`, cut to them.
fn extents_covering(f: &FileEntry, runs: &[(u64, u64)]) -> Vec<(u64, Chunk)> {
    let mut starts = Vec::with_capacity(f.chunks.len());
    let mut pos = 0u64;
    for c in &f.chunks {
        starts.push(pos);
        pos += c.raw as u64;
    }
    let mut needed: Vec<(u64, Chunk)> = Vec::new();
    for (off, len) in runs {
        let end = off + len;
        let mut i = starts.partition_point(|s| *s <= *off) - 1;
        let mut cur = *off;
        while cur < end {
            let c = &f.chunks[i];
            let c_end = starts[i] + c.raw as u64;
            let take_end = c_end.min(end);
            needed.push((
                cur,
                c.slice((cur - starts[i]) as u32, (take_end - cur) as u32),
            ));
            cur = take_end;
            i += 1;
        }
    }
    needed
}

/// Write the differing extents in place, truncate, and prove the result is the backed-up
/// file, reading again only the pieces written. Returns the bytes written (at least 1: the
/// file was touched).
fn patch_file(
    sh: &Shared,
    reader: &mut FrameReader,
    f: &FileEntry,
    fh: &File,
    path: &Path,
    needed: &[(u64, Chunk)],
    mut check: PieceCheck,
) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut written = 0u64;
    for_each_extent(&sh.runtime, reader, needed, &f.path, |at, data| {
        written += data.len() as u64;
        fh.write_all_at(data, at)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    })?;
    fh.set_len(f.size)
        .map_err(|e| Error::io(format!("truncate {}", path.display()), e))?;
    check.read_changed(f, fh, path)?;
    check.finish(f)?;
    Ok(written.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(raw: u32, offset: u64) -> Chunk {
        serde_json::from_value(serde_json::json!({"p": "p", "o": offset, "s": 1, "r": raw}))
            .unwrap()
    }

    /// Block size of the delta tests: small, so a few blocks make a file.
    const BS: usize = 8;

    /// The manifest entry of a backed-up file: one extent per `extent` bytes (all-zero
    /// extents stored as zero extents, as backup stores them), a block map and its BLAKE3.
    fn backed_up(content: &[u8], extent: usize, block_size: usize) -> FileEntry {
        let chunks: Vec<serde_json::Value> = content
            .chunks(extent)
            .enumerate()
            .map(|(i, part)| {
                if part.iter().all(|b| *b == 0) {
                    serde_json::json!({"r": part.len()})
                } else {
                    serde_json::json!({"p": "p", "o": i * 100, "s": 1, "r": part.len()})
                }
            })
            .collect();
        let block_hashes: Vec<u64> = match block_size {
            0 => Vec::new(),
            bs => content.chunks(bs).map(block_hash).collect(),
        };
        let mut f: FileEntry = serde_json::from_value(serde_json::json!({
            "path": "base/1/2", "size": content.len(), "mtime": 0, "mode": 0o600, "uid": 0,
            "gid": 0, "hash": blake3::hash(content).to_hex().as_str(), "chunks": chunks,
            "block_size": block_size,
        }))
        .unwrap();
        f.block_hashes = block_hashes.into();
        f
    }

    /// What delta restore decides for `f` over a target holding `local` (None: no file).
    fn decide_over(f: &FileEntry, local: Option<&[u8]>) -> Action {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("2");
        let fh = local.map(|bytes| {
            std::fs::write(&path, bytes).unwrap();
            File::open(&path).unwrap()
        });
        action_for(f, fh, &path).unwrap()
    }

    /// The byte ranges (offset, length) of the file the action reads from the repository,
    /// adjacent ones joined: zero extents are written without a read.
    fn fetched(f: &FileEntry, action: &Action) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (at, len) in fetched_extents(f, action) {
            match runs.last_mut() {
                Some((o, l)) if *o + *l == at => *l += len,
                _ => runs.push((at, len)),
            }
        }
        runs
    }

    fn fetched_extents(f: &FileEntry, action: &Action) -> Vec<(u64, u64)> {
        let starts = f.chunks.iter().scan(0u64, |pos, c| {
            let at = *pos;
            *pos += c.raw as u64;
            Some(at)
        });
        match action {
            Action::Keep | Action::Zero | Action::Defer => Vec::new(),
            Action::Write => starts
                .zip(&f.chunks)
                .filter(|(_, c)| !c.is_zero())
                .map(|(at, c)| (at, c.raw as u64))
                .collect(),
            Action::Patch(extents, _) => extents
                .iter()
                .filter(|(_, c)| !c.is_zero())
                .map(|(at, c)| (*at, c.raw as u64))
                .collect(),
        }
    }

    /// The target file after the action, done as `restore_one` does it: patched extents
    /// written in place with the backup's bytes, then cut to the backup's size.
    fn after(backup: &[u8], local: Option<&[u8]>, action: &Action) -> Vec<u8> {
        match action {
            Action::Keep => local.expect("kept a file that is there").to_vec(),
            Action::Zero => vec![0; backup.len()],
            Action::Write | Action::Defer => backup.to_vec(),
            Action::Patch(extents, _) => {
                let mut out = local.expect("patched a file that is there").to_vec();
                for (at, c) in extents {
                    let (start, end) = (*at as usize, (*at + c.raw as u64) as usize);
                    if out.len() < end {
                        out.resize(end, 0);
                    }
                    out[start..end].copy_from_slice(&backup[start..end]);
                }
                out.resize(backup.len(), 0);
                out
            }
        }
    }

    /// Ten blocks of 8 bytes, none all zero, in extents of four blocks.
    fn ten_blocks() -> Vec<u8> {
        (0..80u8).map(|b| b + 1).collect()
    }

    /// Delta restore of `backup` (extents of `extent` bytes, blocks of `bs`) over a target
    /// holding `local`: checks the result is the backup and returns the ranges fetched.
    fn fetched_to_restore(
        backup: &[u8],
        extent: usize,
        bs: usize,
        local: &[u8],
    ) -> Vec<(u64, u64)> {
        fetched_to_restore_entry(&backed_up(backup, extent, bs), backup, local)
    }

    #[test]
    fn a_target_file_equal_to_the_backup_is_kept_without_a_read() {
        let backup = ten_blocks();
        let f = backed_up(&backup, 4 * BS, BS);
        assert!(matches!(decide_over(&f, Some(&backup)), Action::Keep));
    }

    #[test]
    fn only_the_differing_block_is_fetched() {
        let backup = ten_blocks();
        let mut local = backup.clone();
        local[5 * BS + 3] ^= 0xff; // block 5, inside the second extent
        let fetched = fetched_to_restore(&backup, 4 * BS, BS, &local);
        assert_eq!(fetched, vec![(5 * BS as u64, BS as u64)]);
    }

    #[test]
    fn adjacent_differing_blocks_across_extents_are_fetched_as_one_run() {
        let backup = ten_blocks();
        let mut local = backup.clone();
        local[3 * BS] ^= 1; // last block of the first extent
        local[4 * BS] ^= 1; // first block of the second
        let fetched = fetched_to_restore(&backup, 4 * BS, BS, &local);
        assert_eq!(fetched, vec![(3 * BS as u64, 2 * BS as u64)]);
    }

    #[test]
    fn a_shorter_target_fetches_only_its_missing_tail() {
        let backup = ten_blocks();
        // Cut inside block 7: blocks 7, 8 and 9 are missing or short.
        let fetched = fetched_to_restore(&backup, 4 * BS, BS, &backup[..7 * BS + 2]);
        assert_eq!(fetched, vec![(7 * BS as u64, 3 * BS as u64)]);
    }

    #[test]
    fn a_longer_target_is_cut_to_size_without_a_read() {
        let backup = ten_blocks();
        let mut local = backup.clone();
        local.extend_from_slice(&[7; 3 * BS]);
        assert_eq!(fetched_to_restore(&backup, 4 * BS, BS, &local), vec![]);
    }

    #[test]
    fn differing_blocks_of_all_zero_extents_are_written_without_a_read() {
        // Blocks 4..8 are zeros, stored as a zero extent; the target has data there.
        let mut backup = ten_blocks();
        backup[4 * BS..8 * BS].fill(0);
        assert!(backed_up(&backup, 4 * BS, BS).chunks[1].is_zero());
        let mut local = backup.clone();
        local[4 * BS..6 * BS].fill(9);
        local[9 * BS] ^= 1;
        let fetched = fetched_to_restore(&backup, 4 * BS, BS, &local);
        assert_eq!(fetched, vec![(9 * BS as u64, BS as u64)]);
    }

    #[test]
    fn a_missing_target_file_is_written_whole() {
        let mut backup = ten_blocks();
        backup[4 * BS..8 * BS].fill(0);
        let f = backed_up(&backup, 4 * BS, BS);
        let action = decide_over(&f, None);
        assert!(matches!(action, Action::Write));
        let whole = vec![(0, 4 * BS as u64), (8 * BS as u64, 2 * BS as u64)];
        assert_eq!(fetched(&f, &action), whole);
    }

    #[test]
    fn a_differing_block_past_the_first_read_buffer_is_found() {
        // delta_plan reads 1 MiB at a time: the file spans two reads.
        let bs = 8192;
        let backup: Vec<u8> = (0..(1 << 20) + 3 * bs)
            .map(|i| (i % 251) as u8 + 1)
            .collect();
        let mut local = backup.clone();
        let block = (1 << 20) / bs + 1;
        local[block * bs] ^= 1;
        let fetched = fetched_to_restore(&backup, 64 * bs, bs, &local);
        assert_eq!(fetched, vec![((block * bs) as u64, bs as u64)]);
    }

    /// Matching block XXH3s are not enough to keep a file that has a whole-file BLAKE3:
    /// when the whole does not match (here the recorded hash is of other bytes, as an
    /// XXH3 collision would leave it), the file is written again, whole. A file without
    /// one (WAL-tracked) is kept on its blocks alone.
    #[test]
    fn a_file_whose_blocks_match_and_whole_does_not_is_written_whole() {
        let backup = ten_blocks();
        let mut f = backed_up(&backup, 4 * BS, BS);
        f.hash = Some(*blake3::hash(b"other bytes").as_bytes());
        assert!(matches!(decide_over(&f, Some(&backup)), Action::Write));
        f.hash = None;
        assert!(matches!(decide_over(&f, Some(&backup)), Action::Keep));
        let mut local = backup.clone();
        local[2 * BS] ^= 1;
        assert_eq!(
            fetched_to_restore_entry(&f, &backup, &local),
            vec![(2 * BS as u64, BS as u64)]
        );
    }

    /// [`fetched_to_restore`] of an entry made by the caller. A patched file is then proved
    /// whole as `patch_file` proves it (the pieces written read again).
    fn fetched_to_restore_entry(f: &FileEntry, backup: &[u8], local: &[u8]) -> Vec<(u64, u64)> {
        let mut action = decide_over(f, Some(local));
        let restored = after(backup, Some(local), &action);
        assert_eq!(restored, backup, "restored file");
        if let Action::Patch(_, check) = &mut action {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("2");
            std::fs::write(&path, &restored).unwrap();
            check
                .read_changed(f, &File::open(&path).unwrap(), &path)
                .unwrap();
            check.finish(f).unwrap();
        }
        fetched(f, &action)
    }

    #[test]
    fn a_file_without_a_block_map_is_kept_or_written_whole() {
        let backup = ten_blocks();
        let f = backed_up(&backup, 4 * BS, 0);
        assert!(matches!(decide_over(&f, Some(&backup)), Action::Keep));
        let mut local = backup.clone();
        local[0] ^= 1;
        assert!(matches!(decide_over(&f, Some(&local)), Action::Write));
    }

    #[test]
    fn differing_runs_are_cut_out_of_the_extents_covering_them() {
        let f: FileEntry = serde_json::from_value(serde_json::json!({
            "path": "base/1/2", "size": 96, "mtime": 0, "mode": 0o600, "uid": 0, "gid": 0,
            "hash": "", "chunks": [chunk(32, 0), chunk(32, 100), chunk(32, 200)],
            "block_size": 8,
        }))
        .unwrap();
        // One run inside the first extent, one across the second and third.
        let needed = extents_covering(&f, &[(8, 8), (56, 16)]);
        let got: Vec<(u64, u64, u32, u32)> = needed
            .iter()
            .map(|(at, c)| (*at, c.offset, c.at, c.raw))
            .collect();
        assert_eq!(got, vec![(8, 0, 8, 8), (56, 100, 24, 8), (64, 200, 0, 8)]);
    }
}
