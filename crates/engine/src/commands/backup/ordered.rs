//! The copy of the data directory's files in the order the manifest lists them, writing
//! the manifest's parts as they fill: what a backup holds follows the files in flight,
//! not the files of the data directory or of the prior backup.
//!
//! How, and why:
//!
//! - **The walk in path order.** [`crate::walk::Walker`] finds the data directory's
//!   files and directories in the manifest's order as it goes. Every thing walked gets a
//!   number; directories and links go to the writer at once, files to the workers.
//! - **The prior backup read beside the walk.** An incremental needs the prior's entry of
//!   each file it copies. The prior's entries come in path order too, so a reader thread
//!   decodes them part by part into a bounded channel and the feeder takes the one whose
//!   path it reaches ([`PriorCursor`]): one entry in hand per file in flight, instead of
//!   the prior's whole list (73 MB at 300,000 files).
//! - **Results put back in order.** Workers finish files out of order; the writer thread
//!   holds what comes early and hands the entries on in order to the [`PartsWriter`]. The
//!   feeder hands out no group of files more than [`WINDOW`] things ahead of what was
//!   written, so what is held early is bounded. One large file holds the window while it
//!   is copied: the other workers go on with the files after it, up to the window.
//! - **`global/pg_control` copied last.** Its place is kept ([`PartsWriter::reserve`]):
//!   the part before it is cut there, it gets a part of its own once it is copied, and the
//!   parts after it are written as they fill.
//!
//! What the copy costs in time is the same as when the whole list was held and copied
//! largest first, except at the end: a large file late in the order finishes last.
//!
//! The parts are written while the backup runs, one stored while the next fills; without
//! the manifest, written last, they are not a backup (`expire` removes them).

use super::copy::{copy_files, groups, CopyOutcome, Job};
use super::copy_context::CopyContext;
use crate::progress::Counters;
use crate::walk::{ItemKind, Walked, WalkedFile};
use crate::{Error, ErrorKind, Result};
use pgstrata_repo::manifest::{EncodedPart, Entry, FileEntry, PartRef, PartsWriter};
use pgstrata_repo::Storage;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex};

/// Most things walked (files, directories) handed out beyond the last one written to the
/// manifest.
const WINDOW: u64 = 4096;

/// Prior entries decoded ahead of the feeder.
const PRIOR_AHEAD: usize = 1024;

/// The manifest's parts being written, one stored while the next fills.
pub(super) struct Parts {
    pub writer: PartsWriter,
    storage: Storage,
    runtime: tokio::runtime::Handle,
    in_flight: Option<tokio::task::JoinHandle<pgstrata_repo::Result<(usize, PartRef)>>>,
    /// Pages failing their checksum in the files written so far.
    pub page_errors: u64,
}

impl Parts {
    pub fn new(writer: PartsWriter, storage: Storage, runtime: tokio::runtime::Handle) -> Parts {
        Parts {
            writer,
            storage,
            runtime,
            in_flight: None,
            page_errors: 0,
        }
    }

    /// Store `part`, once the one before it is stored. Blocks: not from async code.
    fn store(&mut self, part: Option<EncodedPart>) -> Result<()> {
        let Some(part) = part else { return Ok(()) };
        self.wait()?;
        let storage = self.storage.clone();
        self.in_flight = Some(
            self.runtime
                .spawn(async move { part.store(&storage).await }),
        );
        Ok(())
    }

    fn wait(&mut self) -> Result<()> {
        if let Some(h) = self.in_flight.take() {
            let stored = self.runtime.block_on(h).map_err(|e| {
                Error::new(
                    ErrorKind::Repo(pgstrata_repo::ErrorKind::Storage),
                    format!("write a part of the manifest: {e}"),
                )
            })??;
            self.writer.stored(stored);
        }
        Ok(())
    }

    fn count(&mut self, e: &Entry) {
        if let Entry::File(f) = e {
            self.page_errors += f.bad_pages.len() as u64;
        }
    }

    fn push(&mut self, e: Entry) -> Result<()> {
        self.count(&e);
        let full = self.writer.push(&e)?;
        self.store(full)
    }

    fn reserve(&mut self, path: &str) -> Result<()> {
        let cut = self.writer.reserve(path)?;
        self.store(cut)
    }

    /// The entry whose place was kept, in its own part.
    pub fn fill(&mut self, e: Entry) -> Result<()> {
        self.count(&e);
        let part = self.writer.fill(e)?;
        self.store(Some(part))
    }

    /// Store the last part and wait until every part is stored.
    pub fn finish(mut self) -> Result<(PartsWriter, u64)> {
        let last = self.writer.cut();
        self.store(last)?;
        self.wait()?;
        Ok((self.writer, self.page_errors))
    }
}

/// What the writer gets for each thing walked, by its number.
enum Slot {
    /// An entry: a directory or link as walked, a file as copied.
    Entry(Entry),
    /// The place of the entry at this path, copied later (`global/pg_control`).
    Later(String),
    /// A file that vanished before it was copied.
    Nothing,
}

/// Where the feeder takes each file's entry in the prior backup from: the prior's file
/// entries in path order, read by a thread of their own, taken as the walk's paths meet
/// them.
struct PriorCursor {
    entries: mpsc::Receiver<Box<FileEntry>>,
    next: Option<Box<FileEntry>>,
}

impl PriorCursor {
    fn new(entries: mpsc::Receiver<Box<FileEntry>>) -> PriorCursor {
        let next = entries.recv().ok();
        PriorCursor { entries, next }
    }

    /// The prior's entry at `path`, if it has one; paths come in order.
    fn take(&mut self, path: &str) -> Option<Box<FileEntry>> {
        while self
            .next
            .as_ref()
            .is_some_and(|p| p.path.as_bytes() < path.as_bytes())
        {
            self.next = self.entries.recv().ok();
        }
        if self.next.as_ref().is_some_and(|p| *p.path == *path) {
            let taken = self.next.take();
            self.next = self.entries.recv().ok();
            return taken;
        }
        None
    }
}

/// Copy every file `walk` finds but `global/pg_control`, writing the manifest's entries
/// (the directories and links too) to `parts` in order, with the place of
/// `global/pg_control` kept; `pg_control` is returned, to copy last. The bytes and files
/// walked are added to `totals` (the progress) as they are found, past what they were.
/// Blocks: call it from a blocking context.
pub(super) fn copy_in_order(
    ctx: &CopyContext,
    walk: impl Iterator<Item = Result<Walked>>,
    parts: &mut Parts,
    workers: usize,
    totals: &Counters,
) -> Result<(CopyOutcome, WalkedFile)> {
    let window = Window::default();
    let (prior_tx, prior_rx) = mpsc::sync_channel::<Box<FileEntry>>(PRIOR_AHEAD);
    let (done_tx, done_rx) = mpsc::channel::<(u64, Slot)>();
    let mut control: Option<WalkedFile> = None;
    let mut walk_error: Option<Error> = None;
    std::thread::scope(|scope| {
        let reader = spawn_prior_reader(scope, ctx, prior_tx, &window);
        let writer = {
            let (window, parts) = (&window, &mut *parts);
            scope.spawn(move || {
                let written = write_in_order(done_rx, parts, window);
                if written.is_err() {
                    window.fail();
                }
                written
            })
        };
        let mut prior = PriorCursor::new(prior_rx);
        let (mut bytes, mut files) = (0u64, 0u64);
        let (done, control_found, walk_failed, window) =
            (&done_tx, &mut control, &mut walk_error, &window);
        let mut walk = walk.zip(0u64..);
        // Files become jobs; directories, links and the place of pg_control go to the
        // writer straight away. Nothing more is walked once something failed.
        let jobs = std::iter::from_fn(move || loop {
            if window.failed.load(Ordering::SeqCst) {
                return None;
            }
            let (found, n) = walk.next()?;
            let slot = match found {
                Err(e) => {
                    *walk_failed = Some(e);
                    window.fail();
                    return None;
                }
                Ok(Walked::Item(i)) => Slot::Entry(match i.kind {
                    ItemKind::Dir => Entry::dir(i.rel, i.owner),
                    ItemKind::Link { target } => Entry::link(i.rel, target, i.owner),
                }),
                Ok(Walked::File(f)) => {
                    (bytes, files) = (bytes + f.size, files + 1);
                    totals.bytes.fetch_max(bytes, Ordering::Relaxed);
                    totals.files.fetch_max(files, Ordering::Relaxed);
                    if f.rel != "global/pg_control" {
                        let prior = prior.take(&f.rel);
                        return Some((n, Job { file: f, prior }));
                    }
                    let slot = Slot::Later(f.rel.clone());
                    *control_found = Some(f);
                    slot
                }
            };
            if done.send((n, slot)).is_err() {
                window.fail();
                return None;
            }
        });
        // The window is kept group by group, never while a group is being made: the
        // writer may be waiting for the first file of the group in hand.
        let groups = groups(jobs).map_while(|g| window.wait_for(g[0].0).then_some(g));
        let copied = copy_files(
            ctx,
            groups,
            workers,
            0,
            |n, e| {
                let slot = e.map_or(Slot::Nothing, |f| Slot::Entry(Entry::File(Box::new(f))));
                done_tx.send((n, slot)).map_err(|_| stopped())
            },
            || window.fail(),
        );
        drop(done_tx);
        let written = writer.join().expect("manifest writer thread");
        // A reader stopped by the end of the walk (the prior has files after the last
        // one walked) is no failure.
        let read = reader
            .map(|r| r.join().expect("prior manifest reader thread"))
            .unwrap_or(Ok(()));
        first_failure(walk_error.take(), read, written, copied)
    })
    .and_then(|outcome| {
        let control = control.ok_or_else(|| {
            Error::refused("the data directory has no global/pg_control".to_string())
        })?;
        Ok((outcome, control))
    })
}

/// With a prior backup, a thread that reads its manifest's file entries in order into
/// `prior_tx` (for [`PriorCursor`]); a failed read fails the `window`.
fn spawn_prior_reader<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    ctx: &'env CopyContext,
    prior_tx: mpsc::SyncSender<Box<FileEntry>>,
    window: &'env Window,
) -> Option<std::thread::ScopedJoinHandle<'scope, Result<()>>> {
    let Some(p) = ctx.prior.as_ref() else {
        drop(prior_tx);
        return None;
    };
    Some(scope.spawn(move || {
        let read = ctx.runtime.block_on(p.manifest.for_each_entry(|e| match e {
            Entry::File(f) => prior_tx.send(f).map_err(|_| stopped()),
            _ => Ok(()),
        }));
        if read.as_ref().is_err_and(|e| !is_stopped(e)) {
            window.fail();
        }
        read
    }))
}

/// The outcome of the copy, or the first failure, which is the one to report: a walk,
/// reader or writer that failed stops the copy, whose error is then only that it was
/// stopped.
fn first_failure(
    walk_error: Option<Error>,
    read: Result<()>,
    written: Result<()>,
    copied: Result<CopyOutcome>,
) -> Result<CopyOutcome> {
    if let Some(e) = walk_error {
        return Err(e);
    }
    match (read, written, copied) {
        (Err(e), _, _) if !is_stopped(&e) => Err(e),
        (_, Err(e), _) if !is_stopped(&e) => Err(e),
        (_, _, Err(e)) => Err(e),
        (_, Err(e), _) => Err(e),
        (_, Ok(()), Ok(outcome)) => Ok(outcome),
    }
}

fn stopped() -> Error {
    Error::new(ErrorKind::Io, "stopped: another part of the backup failed")
}

fn is_stopped(e: &Error) -> bool {
    e.kind == ErrorKind::Io && e.message == stopped().message
}

/// How far the writer is: the number of things walked it has written. The feeder waits
/// on it to stay within [`WINDOW`]; a failure anywhere releases it.
#[derive(Default)]
struct Window {
    written: Mutex<u64>,
    moved: Condvar,
    failed: AtomicBool,
}

impl Window {
    /// Wait until thing `n` is within the window; false once something failed.
    fn wait_for(&self, n: u64) -> bool {
        let mut written = self.written.lock().unwrap();
        while n >= *written + WINDOW {
            if self.failed.load(Ordering::SeqCst) {
                return false;
            }
            written = self.moved.wait(written).unwrap();
        }
        !self.failed.load(Ordering::SeqCst)
    }

    fn advance(&self, written: u64) {
        *self.written.lock().unwrap() = written;
        self.moved.notify_all();
    }

    fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        // Under the lock: a feeder between its check and its wait is woken too.
        let _held = self.written.lock().unwrap();
        self.moved.notify_all();
    }
}

/// Take the slots from `done` (numbered in walk order, coming in any order) and write
/// them to `parts` in order.
fn write_in_order(
    done: mpsc::Receiver<(u64, Slot)>,
    parts: &mut Parts,
    window: &Window,
) -> Result<()> {
    let mut early: BTreeMap<u64, Slot> = BTreeMap::new();
    let mut next = 0u64;
    for (n, slot) in done.iter() {
        early.insert(n, slot);
        let before = next;
        while let Some(slot) = early.remove(&next) {
            match slot {
                Slot::Entry(e) => parts.push(e)?,
                Slot::Later(path) => parts.reserve(&path)?,
                Slot::Nothing => {}
            }
            next += 1;
            if next.is_multiple_of(256) {
                window.advance(next);
            }
        }
        if next != before {
            window.advance(next);
        }
    }
    if !early.is_empty() {
        return Err(stopped());
    }
    Ok(())
}
