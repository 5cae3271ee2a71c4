//! What an instant restore's serving process knows of each deferred file: which blocks
//! are local, fetching what is not (on demand or to hydrate), PostgreSQL's writes, making
//! both durable, and the hand-over once all is local.

use super::{State, Status, BLOCK};
use crate::{Error, Result};
use pgstrata_repo::chunk::Chunk;
use pgstrata_repo::manifest::Manifest;
use pgstrata_repo::pack::FrameReader;
use pgstrata_repo::Storage;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Everything the filesystem and the hydrating workers share.
pub(super) struct Served {
    pub dir: PathBuf,
    pub files: Vec<ServedFile>,
    storage: Storage,
    manifest: Manifest,
    runtime: tokio::runtime::Handle,
    bits: File,
    pub stats: Stats,
    /// Bytes a hydrating worker fetches at once, at most: [`HYDRATE_BYTES`], less under a
    /// rate limit (a tenth of a second of it), which an on-demand fetch would wait behind.
    batch_bytes: u64,
    /// Files read on demand lately, newest last: hydrated first.
    hot: Mutex<VecDeque<usize>>,
    /// The first failure (a damaged frame, a repository that cannot be read): the file
    /// and why, with the exit code `instant-status` gives.
    pub failed: Mutex<Option<(String, String, i32)>>,
    /// Once every block is local: files not yet handed over because PostgreSQL has them
    /// open through the mount.
    pub files_waiting: AtomicU64,
}

/// Extents of one file claimed for hydration (in its `fetching`), with their frames read.
struct Batch<'s> {
    file: usize,
    claimed: Vec<usize>,
    reader: FrameReader<'s>,
    loaded: Result<()>,
}

/// One deferred file.
pub(super) struct ServedFile {
    pub path: String,
    pub backing: File,
    extents: Vec<(u64, Chunk)>,
    bits_at: u64,
    st: Mutex<FileState>,
    cond: Condvar,
}

struct FileState {
    /// A bit per block: local.
    local: Vec<u64>,
    local_blocks: u64,
    /// Blocks as backed up (what hydration covers).
    blocks: u64,
    /// Extents being fetched.
    fetching: HashSet<usize>,
    /// Bits set since `local.bits` last had them.
    dirty: bool,
    /// The bits `local.bits` holds for this file (written only under this state's lock).
    durable: Vec<u64>,
    /// No block before this one is not local: where hydration looks from.
    scan_from: u64,
    /// Opens through the mount whose pages the kernel keeps, not yet released.
    opens: u32,
    /// The backing file has taken (or is taking) its link's place.
    handed_over: bool,
}

impl FileState {
    fn is_local(&self, b: u64) -> bool {
        b >= self.blocks || self.local[(b / 64) as usize] & (1 << (b % 64)) != 0
    }

    fn mark(&mut self, b: u64) {
        if b < self.blocks && !self.is_local(b) {
            self.local[(b / 64) as usize] |= 1 << (b % 64);
            self.local_blocks += 1;
            self.dirty = true;
        }
    }
}

pub(super) struct Stats {
    /// On-demand fetches under way: hydration starts no new batch meanwhile, so that
    /// PostgreSQL's reads have the disk, the cores and the rate limit first.
    pub on_demand_pending: AtomicU64,
    /// When PostgreSQL last read through the mount, in milliseconds from `since`.
    last_read_ms: AtomicU64,
    since: Instant,
    pub bytes_fetched: AtomicU64,
    pub on_demand: AtomicU64,
    pub on_demand_micros: AtomicU64,
    pub on_demand_max_micros: AtomicU64,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            on_demand_pending: AtomicU64::new(0),
            last_read_ms: AtomicU64::new(0),
            since: Instant::now(),
            bytes_fetched: AtomicU64::new(0),
            on_demand: AtomicU64::new(0),
            on_demand_micros: AtomicU64::new(0),
            on_demand_max_micros: AtomicU64::new(0),
        }
    }
}

/// How lately PostgreSQL must have read through the mount for hydration to leave the
/// cores to it ([`Served::hydrate`]).
const READING_LATELY_MS: u64 = 50;

impl Stats {
    /// PostgreSQL reads through the mount (a block not yet in the kernel's page cache).
    pub fn note_read(&self) {
        let now = self.since.elapsed().as_millis() as u64;
        self.last_read_ms.store(now.max(1), Ordering::Relaxed);
    }

    /// Whether PostgreSQL read through the mount within the last [`READING_LATELY_MS`].
    fn reading_lately(&self) -> bool {
        let last = self.last_read_ms.load(Ordering::Relaxed);
        last > 0
            && (self.since.elapsed().as_millis() as u64).saturating_sub(last) < READING_LATELY_MS
    }
}

/// An on-demand fetch under way, counted in [`Stats::on_demand_pending`] while it lives.
struct OnDemand<'s>(&'s Stats);

impl<'s> OnDemand<'s> {
    fn begin(stats: &'s Stats) -> OnDemand<'s> {
        stats.on_demand_pending.fetch_add(1, Ordering::SeqCst);
        OnDemand(stats)
    }
}

impl Drop for OnDemand<'_> {
    fn drop(&mut self) {
        self.0.on_demand_pending.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Served {
    pub(super) fn open(
        dir: &Path,
        state: &State,
        storage: Storage,
        manifest: Manifest,
        runtime: tokio::runtime::Handle,
        mut entries: HashMap<String, Vec<(u64, Chunk)>>,
    ) -> Result<Served> {
        let bits_path = dir.join("local.bits");
        let bits = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&bits_path)
            .map_err(|e| Error::io(format!("open {}", bits_path.display()), e))?;
        let offsets = state.bit_offsets();
        let mut files = Vec::with_capacity(state.files.len());
        for (f, at) in state.files.iter().zip(offsets) {
            let backing_path = f.backing(dir);
            let backing = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&backing_path)
                .map_err(|e| Error::io(format!("open {}", backing_path.display()), e))?;
            let words = f.blocks().div_ceil(64) as usize;
            let mut raw = vec![0u8; words * 8];
            bits.read_exact_at(&mut raw, at)
                .map_err(|e| Error::io(format!("read {}", bits_path.display()), e))?;
            let local: Vec<u64> = raw
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                .collect();
            let local_blocks = local.iter().map(|w| w.count_ones() as u64).sum();
            let extents = entries.remove(&f.path).ok_or_else(|| {
                Error::integrity(format!(
                    "{} is not in backup {}'s manifest",
                    f.path, state.label
                ))
            })?;
            files.push(ServedFile {
                path: f.path.clone(),
                backing,
                extents,
                bits_at: at,
                st: Mutex::new(FileState {
                    durable: local.clone(),
                    local,
                    local_blocks,
                    blocks: f.blocks(),
                    fetching: HashSet::new(),
                    dirty: false,
                    scan_from: 0,
                    opens: 0,
                    handed_over: false,
                }),
                cond: Condvar::new(),
            });
        }
        let batch_bytes = storage
            .rate_limit()
            .map_or(HYDRATE_BYTES, |r| (r / 10).min(HYDRATE_BYTES));
        Ok(Served {
            batch_bytes,
            dir: dir.to_path_buf(),
            files,
            storage,
            manifest,
            runtime,
            bits,
            stats: Stats::default(),
            hot: Mutex::new(VecDeque::new()),
            failed: Mutex::new(None),
            files_waiting: AtomicU64::new(0),
        })
    }

    /// Make blocks `first..=last` of file `i` local (fetching what is not), for a read or
    /// a partial write by PostgreSQL (`on_demand`) or for hydration.
    pub fn ensure_local(&self, i: usize, first: u64, last: u64, on_demand: bool) -> Result<()> {
        let f = &self.files[i];
        let started = Instant::now();
        let mut fetched_any = false;
        let mut b = first;
        while b <= last {
            let mut st = f.st.lock().expect("file state");
            if st.is_local(b) {
                b += 1;
                continue;
            }
            let e = f.extent_of(b);
            if st.fetching.contains(&e) {
                drop(f.cond.wait_while(st, |s| s.fetching.contains(&e)));
                continue;
            }
            st.fetching.insert(e);
            drop(st);
            let _pending = on_demand.then(|| OnDemand::begin(&self.stats));
            self.fetch_and_store(i, vec![e])?;
            fetched_any = true;
        }
        if on_demand && fetched_any {
            let us = started.elapsed().as_micros() as u64;
            self.stats.on_demand.fetch_add(1, Ordering::Relaxed);
            self.stats.on_demand_micros.fetch_add(us, Ordering::Relaxed);
            self.stats
                .on_demand_max_micros
                .fetch_max(us, Ordering::Relaxed);
            let mut hot = self.hot.lock().expect("hot files");
            hot.retain(|&h| h != i);
            hot.push_back(i);
        }
        Ok(())
    }

    /// Fetch extents `claimed` of file `i` (the caller put them in `fetching`: neighbours,
    /// read together, one ranged read for each run of neighbouring frames) and write each
    /// block of them that is still not local ([`Served::load`], [`Served::store`]).
    fn fetch_and_store(&self, i: usize, claimed: Vec<usize>) -> Result<()> {
        self.store(self.load(i, claimed))
    }

    /// Read the frames of a claimed batch.
    fn load(&self, file: usize, claimed: Vec<usize>) -> Batch<'_> {
        let f = &self.files[file];
        let chunks: Vec<&Chunk> = claimed
            .iter()
            .map(|&e| &f.extents[e].1)
            .filter(|c| !c.is_zero())
            .collect();
        let mut reader = FrameReader::new(&self.storage, &self.manifest);
        let loaded = self
            .runtime
            .block_on(reader.load(&chunks, &f.path))
            .map_err(Error::from);
        Batch {
            file,
            claimed,
            reader,
            loaded,
        }
    }

    /// Write what a loaded batch holds that is still not local. Each extent is let go (no
    /// longer being fetched) as soon as its blocks are written: a read waiting for one
    /// waits for it alone, not for the batch. A failure is recorded ([`Served::fail`]) and
    /// returned; the extents not written are let go too.
    fn store(&self, batch: Batch<'_>) -> Result<()> {
        let Batch {
            file,
            claimed,
            mut reader,
            loaded: mut result,
        } = batch;
        let f = &self.files[file];
        for e in claimed {
            let written = match &result {
                Ok(()) => self.write_extent(f, &mut reader, e),
                Err(_) => Ok(Vec::new()),
            };
            let mut st = f.st.lock().expect("file state");
            match written {
                Ok(runs) => runs
                    .into_iter()
                    .flat_map(|r| r.blocks)
                    .for_each(|b| st.mark(b)),
                Err(err) => result = Err(err),
            }
            st.fetching.remove(&e);
            f.cond.notify_all();
        }
        if let Err(err) = &result {
            self.fail(&f.path, err);
        }
        result
    }

    /// Write the blocks of extent `e` of `f` (its frame loaded in `reader`; checked) that
    /// are not local, without the file's lock: while an extent is being fetched nothing
    /// else changes its blocks (reads of them, PostgreSQL's writes to them and truncation
    /// wait for it). Returns the runs written, for the caller to mark.
    fn write_extent(&self, f: &ServedFile, reader: &mut FrameReader, e: usize) -> Result<Vec<Run>> {
        let (_, c) = &f.extents[e];
        let zeros;
        let data: &[u8] = if c.is_zero() {
            zeros = vec![0; c.raw as usize];
            &zeros
        } else {
            self.stats
                .bytes_fetched
                .fetch_add(c.stored as u64, Ordering::Relaxed);
            reader
                .bytes(c)
                .map_err(|e| Error::from(e).context(&f.path))?
        };
        let runs = f.runs_not_local(&f.st.lock().expect("file state"), e, data.len());
        for run in &runs {
            f.backing
                .write_all_at(&data[run.bytes.clone()], run.blocks.start * BLOCK)
                .map_err(|e| Error::io(format!("write {}", f.path), e))?;
        }
        if let (Some(a), Some(z)) = (runs.first(), runs.last()) {
            let (start, end) = (a.blocks.start * BLOCK, z.blocks.end * BLOCK);
            crate::content::start_writeback(&f.backing, start, end - start);
        }
        Ok(runs)
    }

    /// PostgreSQL wrote `data` at `offset` of file `i`: blocks it covers only in part are
    /// made local first, then the bytes are written and every block they touch is local.
    pub fn write(&self, i: usize, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        if data.is_empty() {
            return Ok(());
        }
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        if !offset.is_multiple_of(BLOCK) {
            self.ensure_local(i, first, first, true)?;
        }
        if !end.is_multiple_of(BLOCK) {
            self.ensure_local(i, last, last, true)?;
        }
        let f = &self.files[i];
        // A block of an extent being fetched is written once the fetch has stored it:
        // its bytes are written without the lock, and this write must come after them.
        let st = f.st.lock().expect("file state");
        let mut st = f
            .cond
            .wait_while(st, |st| (first..=last).any(|b| f.is_fetching(st, b)))
            .expect("file state");
        f.backing
            .write_all_at(data, offset)
            .map_err(|e| Error::io(format!("write {}", f.path), e))?;
        for b in first..=last {
            st.mark(b);
        }
        self.record_written(f, &mut st, first..last + 1)
    }

    /// Write to `local.bits` at once (without waiting for the periodic write) that blocks
    /// `blocks` of `f` are PostgreSQL's: after this process is killed, its writes are in
    /// the backing file (the kernel has them), and a block whose bit was lost would be
    /// fetched again over a write PostgreSQL expects to find. Before, such a bit waited
    /// for PostgreSQL's fsync or the next periodic write: with `fsync = off`, or killed
    /// within that interval of a checkpoint, pages the checkpoint wrote were fetched again
    /// on resume and crash recovery, which starts at that checkpoint, lost their changes
    /// (an index without the entries of heap tuples). No fsync here: a write PostgreSQL
    /// never fsynced is rewritten from the WAL after a power loss, whatever the backing
    /// file holds. Fetched blocks still get their bits only once their bytes are durable
    /// ([`Served::sync_and_persist`]): nothing would rewrite them.
    fn record_written(
        &self,
        f: &ServedFile,
        st: &mut FileState,
        blocks: std::ops::Range<u64>,
    ) -> Result<()> {
        let blocks = blocks.start..blocks.end.min(st.blocks);
        if blocks.is_empty() {
            return Ok(());
        }
        let mut new = false;
        for b in blocks.clone() {
            let (w, bit) = ((b / 64) as usize, 1 << (b % 64));
            new |= st.durable[w] & bit == 0;
            st.durable[w] |= bit;
        }
        // Blocks written again (most of PostgreSQL's writes) cost no write here.
        if !new {
            return Ok(());
        }
        let words = (blocks.start / 64) as usize..=((blocks.end - 1) / 64) as usize;
        let raw: Vec<u8> = st.durable[words.clone()]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        self.bits
            .write_all_at(&raw, f.bits_at + *words.start() as u64 * 8)
            .map_err(|e| Error::io("write local.bits", e))
    }

    /// The file was cut (or grown) to `size`: blocks past it have nothing to fetch.
    pub fn truncate(&self, i: usize, size: u64) -> Result<()> {
        // A block cut in part keeps what is left of it: fetched first (rare: PostgreSQL
        // cuts at block boundaries), so that no fetch writes it whole again later.
        if !size.is_multiple_of(BLOCK) {
            self.ensure_local(i, size / BLOCK, size / BLOCK, true)?;
        }
        let f = &self.files[i];
        // Not while a fetch is writing blocks (it might write past the new end).
        let st = f.st.lock().expect("file state");
        let mut st = f
            .cond
            .wait_while(st, |st| !st.fetching.is_empty())
            .expect("file state");
        f.backing
            .set_len(size)
            .map_err(|e| Error::io(format!("truncate {}", f.path), e))?;
        let cut = size.div_ceil(BLOCK)..st.blocks;
        for b in cut.clone() {
            st.mark(b);
        }
        self.record_written(f, &mut st, cut)
    }

    /// PostgreSQL allocated `length` bytes at `offset` of file `i` (plain `fallocate`):
    /// the backing file is allocated so, growing with zeros where it is shorter and never
    /// shrinking (after the hand-over it may have grown through its ordinary name).
    pub fn allocate(&self, i: usize, offset: u64, length: u64) -> Result<()> {
        let f = &self.files[i];
        nix::fcntl::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&f.backing),
            nix::fcntl::FallocateFlags::empty(),
            offset as i64,
            length as i64,
        )
        .map_err(|e| Error::io(format!("allocate {}", f.path), e.into()))?;
        Ok(())
    }

    /// Make file `i`'s bytes durable, then its bits (PostgreSQL's fsync).
    pub fn sync_file(&self, i: usize) -> Result<()> {
        self.sync_and_persist(i)?;
        self.bits
            .sync_data()
            .map_err(|e| Error::io("fsync local.bits", e))
    }

    /// Make file `i`'s bytes durable, then write to `local.bits` every bit that was set
    /// before they were: the bits are taken first, so that a block fetched meanwhile (its
    /// bytes maybe not durable yet) waits for the next time.
    fn sync_and_persist(&self, i: usize) -> Result<()> {
        let f = &self.files[i];
        let taken = {
            let mut st = f.st.lock().expect("file state");
            std::mem::take(&mut st.dirty).then(|| st.local.clone())
        };
        if let Err(e) = f.backing.sync_data() {
            if taken.is_some() {
                f.st.lock().expect("file state").dirty = true;
            }
            return Err(Error::io(format!("fsync {}", f.path), e));
        }
        let Some(taken) = taken else { return Ok(()) };
        let mut st = f.st.lock().expect("file state");
        for (d, w) in st.durable.iter_mut().zip(&taken) {
            *d |= w;
        }
        let raw: Vec<u8> = st.durable.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.bits
            .write_all_at(&raw, f.bits_at)
            .map_err(|e| Error::io("write local.bits", e))
    }

    /// Every file's bytes durable, then every bit.
    pub(super) fn persist_all(&self) -> Result<()> {
        for i in 0..self.files.len() {
            if self.files[i].st.lock().expect("file state").dirty {
                self.sync_and_persist(i)?;
            }
        }
        self.bits
            .sync_data()
            .map_err(|e| Error::io("fsync local.bits", e))
    }

    pub(super) fn fail(&self, path: &str, e: &Error) {
        let code = if e.is_damage() { 4 } else { 3 };
        log::error!("instant restore: {path}: {e}");
        let mut failed = self.failed.lock().expect("failure");
        failed.get_or_insert_with(|| (path.to_string(), e.to_string(), code));
    }

    /// Blocks local and in all.
    pub(super) fn counts(&self) -> (u64, u64) {
        self.files.iter().fold((0, 0), |(l, t), f| {
            let st = f.st.lock().expect("file state");
            (l + st.local_blocks, t + st.blocks)
        })
    }

    /// The next extents to hydrate, claimed (in `fetching`): in a file read lately, else
    /// the first file not local, from its first block not local on. A file another worker
    /// is fetching from is taken only when no other is left: two writers of one file
    /// queue on its inode lock (ext4 serializes buffered writes to a file), and the kernel
    /// spun on that lock for a quarter of a 20 GB hydration's time. `own`: the file of the
    /// batch the caller holds, which it goes on with.
    fn next_work(&self, from: &mut usize, own: Option<usize>) -> Option<(usize, Vec<usize>)> {
        let hot: Vec<usize> = self
            .hot
            .lock()
            .expect("hot")
            .iter()
            .rev()
            .copied()
            .collect();
        for shared in [false, true] {
            for i in hot.iter().copied().chain(*from..self.files.len()) {
                let f = &self.files[i];
                let mut st = f.st.lock().expect("file state");
                if st.local_blocks == st.blocks {
                    if i == *from {
                        *from += 1;
                    }
                    continue;
                }
                if !shared && !st.fetching.is_empty() && own != Some(i) {
                    continue;
                }
                let claimed = f.claim(&mut st, self.batch_bytes);
                if !claimed.is_empty() {
                    return Some((i, claimed));
                }
            }
        }
        None
    }

    /// A hydrating worker: fetch what is not local until nothing is left, a batch of
    /// neighbouring extents at a time, reading the next batch while writing one (as
    /// restore does: the repository's latency and the writes overlap). New work waits
    /// while an on-demand fetch is under way, and, for every worker but the first
    /// (`worker` 0), while PostgreSQL reads through the mount; a batch already claimed
    /// never waits (a read may be waiting for it).
    pub(super) fn hydrate(&self, worker: usize) {
        let mut from = 0;
        let mut current: Option<Batch<'_>> = None;
        loop {
            if self.failed.lock().expect("failure").is_some() {
                if let Some(batch) = current {
                    self.release(batch);
                }
                return;
            }
            // The first worker goes on while PostgreSQL reads through the mount; the others
            // wait, leaving it the cores (on 2 cores, hydrating at full speed beside
            // pgbench cut its transactions to a fifth while its blocks came in through the
            // mount; one worker hydrates about as fast where the disk bounds it).
            let pending = self.stats.on_demand_pending.load(Ordering::SeqCst) > 0
                || (worker > 0 && self.stats.reading_lately());
            let next = if pending {
                None
            } else {
                self.next_work(&mut from, current.as_ref().map(|b| b.file))
            };
            let Some(batch) = current.take() else {
                match next {
                    Some((i, claimed)) => current = Some(self.load(i, claimed)),
                    None if pending => std::thread::sleep(std::time::Duration::from_millis(1)),
                    None => return,
                }
                continue;
            };
            let (stored, loaded) = std::thread::scope(|scope| {
                let loading = next.map(|(i, claimed)| scope.spawn(move || self.load(i, claimed)));
                let stored = self.store(batch);
                (stored, loading.map(|h| h.join().expect("hydration read")))
            });
            current = loaded;
            if stored.is_err() {
                if let Some(batch) = current {
                    self.release(batch);
                }
                return;
            }
        }
    }

    /// Let go of a claimed batch without writing it (hydration stopped at a failure).
    fn release(&self, batch: Batch<'_>) {
        let f = &self.files[batch.file];
        let mut st = f.st.lock().expect("file state");
        for e in &batch.claimed {
            st.fetching.remove(e);
        }
        f.cond.notify_all();
    }

    pub(super) fn status(&self, started: Instant, state: &str) -> Status {
        let (local, total) = self.counts();
        let elapsed = started.elapsed().as_secs_f64().max(0.001);
        let fetched = self.stats.bytes_fetched.load(Ordering::Relaxed);
        let rate = fetched as f64 / elapsed;
        let left = total.saturating_sub(local) * BLOCK;
        let n = self.stats.on_demand.load(Ordering::Relaxed);
        let failed = self.failed.lock().expect("failure").clone();
        Status {
            state: if failed.is_some() { "failed" } else { state }.to_string(),
            pid: std::process::id(),
            files_total: self.files.len() as u64,
            files_local: self
                .files
                .iter()
                .filter(|f| {
                    let st = f.st.lock().expect("file state");
                    st.local_blocks == st.blocks
                })
                .count() as u64,
            bytes_total: total * BLOCK,
            bytes_local: local * BLOCK,
            bytes_fetched: fetched,
            fetch_rate_bytes: rate as u64,
            eta_seconds: (rate > 0.0).then(|| (left as f64 / rate).ceil() as u64),
            on_demand_fetches: n,
            on_demand_latency_ms: if n > 0 {
                self.stats.on_demand_micros.load(Ordering::Relaxed) as f64 / n as f64 / 1000.0
            } else {
                0.0
            },
            on_demand_max_latency_ms: self.stats.on_demand_max_micros.load(Ordering::Relaxed)
                as f64
                / 1000.0,
            files_open_through_mount: self.files_waiting.load(Ordering::SeqCst),
            failed_file: failed.as_ref().map(|f| f.0.clone()),
            error: failed.as_ref().map(|f| f.1.clone()),
            exit_code: failed.as_ref().map(|f| f.2),
            updated: chrono::Utc::now().timestamp(),
        }
    }

    /// PostgreSQL opens file `i` through the mount: whether the kernel may keep its pages.
    /// Until the hand-over it may (the mount is the only way to the file), and the open is
    /// counted until [`Served::closed`]; after it, not (the file is also written by its
    /// ordinary name).
    pub fn opened(&self, i: usize) -> bool {
        let mut st = self.files[i].st.lock().expect("file state");
        if st.handed_over {
            return false;
        }
        st.opens += 1;
        true
    }

    /// The kernel released an open of file `i` that [`Served::opened`] counted.
    pub fn closed(&self, i: usize) {
        let mut st = self.files[i].st.lock().expect("file state");
        st.opens = st.opens.saturating_sub(1);
    }

    pub fn is_handed_over(&self, i: usize) -> bool {
        self.files[i].st.lock().expect("file state").handed_over
    }

    /// Every block is local: each file that nothing has open through the mount takes its
    /// link's place, durably (the backing file renamed over the link: the same inode).
    /// `forget(i, pages)` drops what the kernel keeps of file `i` for the mount: its
    /// attributes before (an open through the mount racing the rename must see the size
    /// as it is), its pages after (no open that could read them is left, and an open from
    /// now on is direct I/O: the window between is kept short, since an open in it stays
    /// direct I/O for its life). A file still open through the mount waits for a later
    /// call, unless `open_too`: until it is released, reads of it are served from the
    /// pages the kernel keeps, which a write through the ordinary name would leave stale
    /// unless the kernel revalidates them before each read (`fs`'s module docs). Returns
    /// how many files wait.
    pub(super) fn hand_over(
        &self,
        state: &State,
        open_too: bool,
        forget: impl Fn(usize, bool),
    ) -> Result<usize> {
        let mut waiting = 0;
        let mut moved = false;
        for (i, (f, meta)) in self.files.iter().zip(&state.files).enumerate() {
            {
                let mut st = f.st.lock().expect("file state");
                if st.handed_over {
                    continue;
                }
                if st.opens > 0 && !open_too {
                    waiting += 1;
                    continue;
                }
                // From here an open through the mount is direct I/O.
                st.handed_over = true;
            }
            forget(i, false);
            let link = state.pg_path.join(&f.path);
            let ours = self.dir.join("mnt").join(meta.id.to_string());
            let backing = meta.backing(&self.dir);
            match std::fs::read_link(&link) {
                Ok(to) if to == ours => {
                    std::fs::rename(&backing, &link).map_err(|e| {
                        Error::io(
                            format!("rename {} over {}", backing.display(), link.display()),
                            e,
                        )
                    })?;
                }
                // Dropped by PostgreSQL meanwhile (its link removed): nothing to put back.
                _ => {
                    let _ = std::fs::remove_file(&backing);
                }
            }
            forget(i, true);
            moved = true;
        }
        // Tablespaces' files, on their own filesystems.
        let stores: std::collections::BTreeSet<&PathBuf> = state
            .files
            .iter()
            .filter_map(|f| f.store.as_ref())
            .collect();
        if moved {
            sync_dir_fs(&state.pg_path)?;
            for store in &stores {
                sync_dir_fs(store)?;
            }
        }
        if waiting == 0 {
            // Their store directories are empty now.
            for store in stores {
                let _ = std::fs::remove_dir(store);
            }
        }
        Ok(waiting)
    }
}

/// Blocks of an extent that are not local, and where their bytes are in its data.
struct Run {
    blocks: std::ops::Range<u64>,
    bytes: std::ops::Range<usize>,
}

/// Extents a hydrating worker fetches at once, at most: neighbouring frames of one pack
/// are one ranged read, as a normal restore reads them.
const HYDRATE_EXTENTS: usize = 64;
/// Bytes (as restored) a hydrating worker fetches at once, at most.
const HYDRATE_BYTES: u64 = 8 << 20;

impl ServedFile {
    /// Claim for hydration (put in `fetching`) the first extent with a block not local
    /// that nobody fetches, and the extents after it, up to a batch: a run that stops at
    /// an extent being fetched; extents all local are passed over.
    fn claim(&self, st: &mut FileState, batch_bytes: u64) -> Vec<usize> {
        while st.scan_from < st.blocks && st.is_local(st.scan_from) {
            st.scan_from += 1;
        }
        let Some(b) =
            (st.scan_from..st.blocks).find(|&b| !st.is_local(b) && !self.is_fetching(st, b))
        else {
            return Vec::new();
        };
        let mut claimed = Vec::new();
        let mut bytes = 0;
        for e in self.extent_of(b)..self.extents.len() {
            if claimed.len() >= HYDRATE_EXTENTS || bytes >= batch_bytes {
                break;
            }
            if st.fetching.contains(&e) {
                break;
            }
            let (at, c) = &self.extents[e];
            if (at / BLOCK..(at + c.raw as u64).div_ceil(BLOCK)).all(|b| st.is_local(b)) {
                continue;
            }
            st.fetching.insert(e);
            claimed.push(e);
            bytes += c.raw as u64;
        }
        claimed
    }

    /// The runs of blocks of extent `e` (whose bytes are `len` long) that are not local.
    /// A block PostgreSQL wrote meanwhile stays as it wrote it.
    fn runs_not_local(&self, st: &FileState, e: usize, len: usize) -> Vec<Run> {
        let first = self.extents[e].0 / BLOCK;
        let n = len.div_ceil(BLOCK as usize) as u64;
        let mut runs = Vec::new();
        let mut k = 0;
        while k < n {
            if st.is_local(first + k) {
                k += 1;
                continue;
            }
            let run = k;
            while k < n && !st.is_local(first + k) {
                k += 1;
            }
            runs.push(Run {
                blocks: first + run..first + k,
                bytes: (run * BLOCK) as usize..((k * BLOCK) as usize).min(len),
            });
        }
        runs
    }

    /// Whether block `b` is in an extent being fetched.
    fn is_fetching(&self, st: &FileState, b: u64) -> bool {
        b < st.blocks && st.fetching.contains(&self.extent_of(b))
    }

    /// The extent holding block `b` (extents are whole blocks, in order).
    pub fn extent_of(&self, b: u64) -> usize {
        let at = b * BLOCK;
        self.extents
            .partition_point(|(off, _)| *off <= at)
            .saturating_sub(1)
    }
}

fn sync_dir_fs(dir: &Path) -> Result<()> {
    let fd = File::open(dir).map_err(|e| Error::io(format!("open {}", dir.display()), e))?;
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&fd))
        .map_err(|e| Error::io(format!("syncfs {}", dir.display()), e.into()))
}
