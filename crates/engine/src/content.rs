//! What restore and verify share: the order and grouping of their work on files, a file's
//! extents and how to fetch them in bounded batches, the check of restored bytes against
//! the hashes recorded at backup time, positional reads that fill a buffer, and handing
//! written bytes to the disk early.

use crate::{Error, Result};
use pgstrata_repo::chunk::Chunk;
use pgstrata_repo::manifest::{block_hash, FileEntry};
use pgstrata_repo::name::Name;
use pgstrata_repo::pack::FrameReader;
use std::io::Read;
use std::path::Path;

/// Start writing `len` bytes of `file` at `offset` back to the disk, without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, as PostgreSQL's `checkpoint_flush_after`):
/// the disk works while more is fetched, and the fsync or `syncfs` that makes the bytes
/// durable finds little left to do. A hint: where the call fails nothing changes.
pub(crate) fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on an open descriptor; no memory is passed.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// Files of at most this size are read in groups, by the pack they are stored in.
pub(crate) const SMALL_FILE: u64 = 1 << 20;

/// Work on one file, or on small files stored next to each other in one pack, whose frames
/// are fetched with one ranged read (over an object store, one request instead of
/// hundreds) and held decoded until the group's last file is done.
#[derive(Debug)]
pub(crate) enum FileJob<T> {
    One(T),
    Group(Vec<T>),
}

/// The jobs for `files` (each item's entry given by `entry`), in the order to run them:
/// larger files alone, largest first so all workers stay busy to the end, then small files
/// grouped by the pack their first frame is in (frames of one file may continue in the
/// next pack, which the group's read covers too). Files whose extents are not loaded (a
/// map stored apart) go alone.
pub(crate) fn plan_file_jobs<T>(
    files: impl IntoIterator<Item = T>,
    entry: impl Fn(&T) -> &FileEntry,
) -> Vec<FileJob<T>> {
    // A group's frames stay decoded in memory until its last file is done: bound both
    // what one read fetches and what the worker holds. Decoded, not stored, bytes bound
    // memory: bundled frames of small, mostly empty files compress 20-fold or more.
    const GROUP_BYTES: u64 = 8 << 20;
    const GROUP_DECODED: u64 = 8 << 20;
    const GROUP_FILES: usize = 512;
    type Pack = (Option<Name>, Option<Name>);
    let files = files.into_iter();
    let mut alone = Vec::new();
    // Room for every file at once: grown by doubling, this list of a restore or verify of
    // 300,000 small files peaked at 76 MB (a copy and twice the room it needs).
    let mut small: Vec<(Pack, u64, T)> = Vec::with_capacity(files.size_hint().0);
    for item in files {
        let f = entry(&item);
        match f.chunks.iter().find(|c| !c.is_zero()) {
            Some(c) if f.size <= SMALL_FILE => {
                let (pack, offset) = ((c.backup, c.pack), c.offset);
                small.push((pack, offset, item));
            }
            _ => alone.push(item),
        }
    }
    small.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let mut groups: Vec<FileJob<T>> = Vec::new();
    let mut group: Vec<T> = Vec::new();
    let mut key: Option<Pack> = None;
    let (mut bytes, mut decoded) = (0u64, 0u64);
    let mut frames: std::collections::HashSet<(Pack, u64)> = Default::default();
    for (pack, _, item) in small {
        let k = Some(pack);
        if !group.is_empty()
            && (k != key
                || bytes >= GROUP_BYTES
                || decoded >= GROUP_DECODED
                || group.len() >= GROUP_FILES)
        {
            groups.push(FileJob::Group(std::mem::take(&mut group)));
            (bytes, decoded) = (0, 0);
            frames.clear();
        }
        key = k;
        for c in entry(&item).chunks.iter().filter(|c| !c.is_zero()) {
            if frames.insert(((c.backup, c.pack), c.offset)) {
                bytes += c.stored as u64;
                decoded += c.frame_len() as u64;
            }
        }
        group.push(item);
    }
    if !group.is_empty() {
        groups.push(FileJob::Group(group));
    }
    alone.sort_by_key(|item| std::cmp::Reverse(entry(item).size));
    let mut jobs: Vec<FileJob<T>> = alone.into_iter().map(FileJob::One).collect();
    jobs.extend(groups.into_iter().rev());
    jobs
}

/// Most files in a window of [`with_streamed_jobs`], and most extents and block hashes
/// its entries may hold inline (entries of manifests before format 2 hold a large file's
/// whole map). A window of 2,048 still makes groups of [`plan_file_jobs`]'s 512 files;
/// at 8,192 the windows and the channel feeding them (about 300 bytes an entry) were a
/// tenth of a restore's memory.
const WINDOW_FILES: usize = 2048;
const WINDOW_ITEMS: usize = 1 << 18;
/// Entries read ahead of the window being cut into jobs.
const READ_AHEAD: usize = 1024;

/// Run `work` with jobs ([`plan_file_jobs`]) for the files `read` sends, a window at a
/// time, so that what is held follows the files in flight, not the number of files.
///
/// `read` runs on a thread of its own (reading a manifest as a stream,
/// [`pgstrata_repo::manifest::StoredManifest::for_each_entry`]) and sends into a bounded
/// channel; when the jobs are dropped (the workers stopped on an error) its sends fail,
/// and it should stop. The feeder takes a window of files, gives it to `prepare` (restore
/// loads the maps of small files stored apart) and cuts it into jobs. Files of one pack lie
/// next to each other in path order, as the backup wrote them, so a window groups small
/// files almost as well as the whole list would. A window `prepare` fails on comes as an
/// error job, for the worker that takes it to stop with.
///
/// Returns what `work` returns, once `read` has returned too: a reading that ended early
/// would leave files out of what looks complete.
pub(crate) fn with_streamed_jobs<T: Send, R>(
    read: impl FnOnce(std::sync::mpsc::SyncSender<T>) -> Result<()> + Send,
    entry: impl Fn(&T) -> &FileEntry,
    mut prepare: impl FnMut(&mut [T]) -> Result<()>,
    work: impl FnOnce(&mut dyn Iterator<Item = Result<FileJob<T>>>) -> Result<R>,
) -> Result<R> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<T>(READ_AHEAD);
    std::thread::scope(|scope| {
        let reader = scope.spawn(move || read(tx));
        let mut ready = std::collections::VecDeque::new();
        let mut jobs = std::iter::from_fn(move || {
            if ready.is_empty() {
                let mut window = Vec::new();
                let mut items = 0;
                while window.len() < WINDOW_FILES && items < WINDOW_ITEMS {
                    let Ok(item) = rx.recv() else { break };
                    let f = entry(&item);
                    items += f.chunks.len() + f.block_hashes.len();
                    window.push(item);
                }
                if let Err(e) = prepare(&mut window) {
                    return Some(Err(e));
                }
                ready.extend(plan_file_jobs(window, &entry));
            }
            ready.pop_front().map(Ok)
        });
        let done = work(&mut jobs);
        // The receiver goes first: a reader blocked on a full channel then fails its send.
        drop(jobs);
        let read = reader.join().expect("manifest reader thread");
        let done = done?;
        read?;
        Ok(done)
    })
}

/// Bytes of the repository the frames of `chunks` hold, each frame once (the extents of
/// one frame follow each other): what reading them all reads.
pub(crate) fn stored_bytes<'c>(chunks: impl IntoIterator<Item = &'c Chunk>) -> u64 {
    let mut last: Option<&Chunk> = None;
    let mut bytes = 0;
    for c in chunks.into_iter().filter(|c| !c.is_zero()) {
        if !last.is_some_and(|p| same_frame(p, c)) {
            bytes += c.stored as u64;
        }
        last = Some(c);
    }
    bytes
}

/// Whether extents `a` and `b` are cut from one frame.
fn same_frame(a: &Chunk, b: &Chunk) -> bool {
    (&a.backup, &a.pack, a.offset) == (&b.backup, &b.pack, b.offset)
}

/// A file's extents with the file offset each one starts at.
pub(crate) fn extents_of(f: &FileEntry) -> Vec<(u64, Chunk)> {
    let mut offset = 0u64;
    f.chunks
        .iter()
        .map(|c| {
            let at = offset;
            offset += c.raw as u64;
            (at, c.clone())
        })
        .collect()
}

/// What all-zero extents are written from: in the zero-filled data segment, so it costs
/// no allocation per file (a restore of a million files called this a million times).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Fetch the frames of `extents` in batches of bounded size and hand each extent's bytes
/// (zeros for all-zero extents) to `sink` in order.
///
/// The next batch is fetched (on a second reader, from a scoped thread) while the current
/// one goes to `sink`, so a slow link and the disk work at the same time. A pinned reader
/// (a group of small files loaded at once) already holds what the extents need: it is read
/// batch by batch in place.
pub(crate) fn for_each_extent(
    runtime: &tokio::runtime::Handle,
    reader: &mut FrameReader,
    extents: &[(u64, Chunk)],
    file: &str,
    mut sink: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    // Two batches are held at once, as stored: the reader decodes a frame when its first
    // extent is written and keeps two decoded. A batch is at most 4 MiB of stored bytes
    // (what one read fetches) and 4 MiB of decoded frames (frames of mostly empty pages
    // compress 20-fold and more: the decoded bound keeps the reads, and so the requests
    // to an object store, as they were when batches were held decoded, which made two
    // workers' batches most of a restore's memory).
    const BATCH: u64 = 4 * 1024 * 1024;
    const BATCH_DECODED: u64 = 4 * 1024 * 1024;
    let mut batches: Vec<(usize, usize, Vec<&Chunk>)> = Vec::new();
    let mut i = 0;
    while i < extents.len() {
        let mut j = i;
        let (mut stored, mut decoded) = (0u64, 0u64);
        let mut batch: Vec<&Chunk> = Vec::new();
        while j < extents.len() && ((stored < BATCH && decoded < BATCH_DECODED) || batch.is_empty())
        {
            let c = &extents[j].1;
            if !c.is_zero() {
                // Extents of one frame follow each other: count each frame once.
                if !batch.last().is_some_and(|p| same_frame(p, c)) {
                    stored += c.stored as u64;
                    decoded += c.frame_len() as u64;
                }
                batch.push(c);
            }
            j += 1;
        }
        batches.push((i, j, batch));
        i = j;
    }
    let mut write = |reader: &mut FrameReader, from: usize, to: usize| -> Result<()> {
        for (offset, c) in &extents[from..to] {
            if c.is_zero() {
                let mut done = 0u64;
                while done < c.raw as u64 {
                    let n = (c.raw as u64 - done).min(ZEROS.len() as u64) as usize;
                    sink(offset + done, &ZEROS[..n])?;
                    done += n as u64;
                }
            } else {
                sink(
                    *offset,
                    reader.bytes(c).map_err(|e| Error::from(e).context(file))?,
                )?;
            }
        }
        Ok(())
    };
    if reader.is_pinned() || batches.len() < 2 {
        for (from, to, batch) in &batches {
            runtime.block_on(reader.load(batch, file))?;
            write(reader, *from, *to)?;
            reader.clear();
        }
        return Ok(());
    }
    let mut spare = reader.sibling();
    let (mut current, mut next): (&mut FrameReader, &mut FrameReader) = (&mut *reader, &mut spare);
    runtime.block_on(current.load(&batches[0].2, file))?;
    for k in 0..batches.len() {
        let (from, to, _) = &batches[k];
        let ahead = batches.get(k + 1).map(|b| &b.2);
        let (written, fetched) = std::thread::scope(|scope| {
            let fetching = ahead.map(|batch| {
                let next = &mut *next;
                scope.spawn(move || runtime.block_on(next.load(batch, file)))
            });
            let written = write(current, *from, *to);
            let fetched = fetching
                .map(|h| h.join().expect("prefetch thread"))
                .unwrap_or(Ok(()));
            (written, fetched)
        });
        written?;
        fetched?;
        current.clear();
        std::mem::swap(&mut current, &mut next);
    }
    reader.absorb_counts(&spare);
    Ok(())
}

/// Checks restored bytes against the backup: the file's BLAKE3, or, for files without one
/// (relation files, and files copied by WAL tracking), each block's XXH3 from the block map.
pub(crate) struct ContentCheck<'a> {
    f: &'a FileEntry,
    blake: blake3::Hasher,
    pending: Vec<u8>,
    block: usize,
    bad_block: Option<usize>,
}

impl<'a> ContentCheck<'a> {
    pub(crate) fn new(f: &'a FileEntry) -> ContentCheck<'a> {
        ContentCheck {
            f,
            blake: blake3::Hasher::new(),
            pending: Vec::new(),
            block: 0,
            bad_block: None,
        }
    }

    pub(crate) fn update(&mut self, mut data: &[u8]) {
        if self.f.hash.is_some() {
            self.blake.update(data);
            return;
        }
        let bs = self.f.block_size.max(1) as usize;
        while !data.is_empty() {
            // Whole blocks are checked where they are, not copied aside first.
            if self.pending.is_empty() && data.len() >= bs {
                let (block, rest) = data.split_at(bs);
                self.check(block_hash(block));
                data = rest;
                continue;
            }
            let take = (bs - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() == bs {
                self.check_block();
            }
        }
    }

    /// Check the block gathered in `pending`.
    fn check_block(&mut self) {
        let h = block_hash(&self.pending);
        self.pending.clear();
        self.check(h);
    }

    /// Check the next block, `h` the hash of its bytes.
    fn check(&mut self, h: u64) {
        if self.f.block_hash(self.block) != Some(h) && self.bad_block.is_none() {
            self.bad_block = Some(self.block);
        }
        self.block += 1;
    }

    pub(crate) fn finish(mut self) -> Result<()> {
        let ok = if self.f.hash.is_none() {
            if !self.pending.is_empty() {
                self.check_block();
            }
            self.bad_block.is_none() && self.block == self.f.block_count()
        } else {
            Some(*self.blake.finalize().as_bytes()) == self.f.hash
        };
        if ok {
            Ok(())
        } else {
            Err(Error::integrity(format!(
                "{} does not match the hashes recorded at backup time: the repository is damaged",
                self.f.path
            )))
        }
    }
}

/// A read buffer for checking a file of `size` bytes: up to 1 MiB, no more than the file
/// (most files of a cluster of many tables are a page or two).
pub(crate) fn read_buffer_len(size: u64) -> usize {
    (size as usize).clamp(8 << 10, 1 << 20)
}

pub(crate) fn check_reader(f: &FileEntry, r: &mut impl Read, path: &Path) -> Result<()> {
    let mut check = ContentCheck::new(f);
    let mut buf = vec![0u8; read_buffer_len(f.size)];
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        check.update(&buf[..n]);
    }
    check.finish()
}

/// Read up to `buf.len()` bytes at `offset`, stopping early only at end of file.
pub(crate) fn read_full_at(
    fh: &std::fs::File,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match fh.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small file bundled at `offset` of pack `pack`.
    fn small_file(i: usize, pack: usize, offset: u64) -> Box<FileEntry> {
        serde_json::from_value(serde_json::json!({
            "path": format!("base/5/{i}"), "size": 100, "mtime": 0, "mode": 0o600,
            "uid": 0, "gid": 0, "hash": "",
            "chunks": [{"p": format!("0-{pack}"), "o": offset, "s": 100, "r": 100}],
        }))
        .unwrap()
    }

    /// A file without a whole hash is checked block by block, however its bytes arrive:
    /// whole blocks checked in place, pieces of blocks gathered first.
    #[test]
    fn a_file_without_a_whole_hash_is_checked_by_every_block() {
        let bs = 1024;
        let content: Vec<u8> = (0..bs * 3 + 500).map(|i| (i * 7 % 251) as u8).collect();
        let map: String = content
            .chunks(bs)
            .map(|b| format!("{:016x}", block_hash(b)))
            .collect();
        let f: FileEntry = serde_json::from_value(serde_json::json!({
            "path": "base/5/16384", "size": content.len(), "mtime": 0, "mode": 0o600,
            "uid": 0, "gid": 0, "hash": "", "chunks": [], "block_size": bs,
            "block_hashes": map,
        }))
        .unwrap();
        let check_in = |data: &[u8], piece: usize| {
            let mut c = ContentCheck::new(&f);
            data.chunks(piece).for_each(|p| c.update(p));
            c.finish()
        };
        for piece in [1, 100, bs - 1, bs, bs + 1, 3000, content.len()] {
            assert!(check_in(&content, piece).is_ok(), "pieces of {piece}");
            let mut changed = content.clone();
            changed[bs * 2 + 9] ^= 1;
            assert!(check_in(&changed, piece).is_err(), "pieces of {piece}");
            assert!(
                check_in(&content[..bs * 3], piece).is_err(),
                "short, {piece}"
            );
        }
    }

    /// Every file sent comes out in exactly one job, over several windows, each group of
    /// one pack; the work's error comes first, and a work that stops early does not leave
    /// the reader blocked.
    #[test]
    fn streamed_jobs_hold_every_file_once_over_many_windows() {
        let n = 3 * WINDOW_FILES + 17;
        let send_all = |files: std::sync::mpsc::SyncSender<Box<FileEntry>>| {
            for i in 0..n {
                files
                    .send(small_file(i, i / 1000, (i % 1000) as u64 * 100))
                    .map_err(|_| Error::new(crate::ErrorKind::Io, "stopped"))?;
            }
            Ok(())
        };
        let mut windows = 0;
        let seen = with_streamed_jobs(
            send_all,
            |f| f,
            |w| {
                windows += 1;
                assert!(w.len() <= WINDOW_FILES);
                Ok(())
            },
            |jobs| {
                let mut seen = Vec::new();
                for job in jobs {
                    match job? {
                        FileJob::Group(g) => {
                            let pack = g[0].chunks[0].pack;
                            assert!(g.iter().all(|f| f.chunks[0].pack == pack));
                            seen.extend(g.iter().map(|f| f.path.to_string()));
                        }
                        FileJob::One(f) => panic!("a small file alone: {}", f.path),
                    }
                }
                Ok(seen)
            },
        )
        .unwrap();
        assert_eq!(
            windows, 5,
            "four windows of files and the empty one at the end"
        );
        let mut seen = seen;
        seen.sort();
        let mut want: Vec<String> = (0..n).map(|i| format!("base/5/{i}")).collect();
        want.sort();
        assert_eq!(seen, want);

        // The work stops after one job: its error is returned and the reader, blocked on
        // a full channel, is released.
        let err = with_streamed_jobs(
            send_all,
            |f| f,
            |_| Ok(()),
            |jobs| {
                jobs.next();
                Err::<(), _>(Error::new(crate::ErrorKind::Io, "worker failed"))
            },
        )
        .unwrap_err();
        assert!(err.message.contains("worker failed"), "{err}");

        // A reading that fails after some files fails the whole, though the work is done.
        let err = with_streamed_jobs(
            |files: std::sync::mpsc::SyncSender<Box<FileEntry>>| {
                files.send(small_file(0, 0, 0)).unwrap();
                Err(Error::new(crate::ErrorKind::Io, "manifest unreadable"))
            },
            |f| f,
            |_| Ok(()),
            |jobs| Ok(jobs.count()),
        )
        .unwrap_err();
        assert!(err.message.contains("manifest unreadable"), "{err}");
    }
}
