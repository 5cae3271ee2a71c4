//! The copy of the data directory's files in the order the manifest lists them, writing
//! the manifest's parts as they fill: what a backup holds follows the files in flight,
//! not the files of the data directory or of the prior backup.
//!
//! How, and why:
//!
//! - **Large files first.** Files of at least [`super::copy::LARGE_FILE`] bytes are copied first,
//!   largest first, as before: a 1 GB segment taken last would leave the other workers
//!   idle at the end. They are few (at most the database's bytes over 16 MiB), so their
//!   entries are held until their place in the order comes. The other files follow in
//!   path order, numbered as they are handed out.
//! - **The prior backup read beside the walk.** An incremental needs the prior's entry of
//!   each file it copies. The prior's entries come in path order, as the files do, so a
//!   reader thread decodes them part by part into a bounded channel and the feeder takes
//!   the one whose path it reaches: one entry in hand per file in flight, instead of the
//!   prior's whole list (73 MB at 300,000 files). The large files' entries are picked out
//!   by a first reading.
//! - **Results put back in order.** Workers finish files out of order; the writer thread
//!   holds what comes early and hands entries on in order to the [`PartsWriter`], merged
//!   with the directories, links and large files. The feeder stays at most [`WINDOW`]
//!   files ahead of what was written, so what is held early is bounded.
//! - **`global/pg_control` copied last.** Its place is kept ([`PartsWriter::reserve`]):
//!   the part before it is cut there, it gets a part of its own once it is copied, and the
//!   parts after it are written as they fill.
//!
//! The parts are written while the backup runs, one stored while the next fills; without
//! the manifest, written last, they are not a backup (`expire` removes them).

use super::copy::{copy_files, groups, CopyContext, CopyOutcome, CopyPlan, Job};
use crate::walk::WalkedFile;
use crate::{Error, ErrorKind, Result};
use pgstrata_repo::manifest::{EncodedPart, Entry, FileEntry, PartRef, PartsWriter};
use pgstrata_repo::Storage;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex};

/// Most files handed out beyond the last one written to the manifest.
const WINDOW: u64 = 16_384;

/// Prior entries decoded ahead of the feeder.
const PRIOR_AHEAD: usize = 4096;

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
        let full = self.writer.push(e)?;
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
        let last = self.writer.last();
        self.store(last)?;
        self.wait()?;
        Ok((self.writer, self.page_errors))
    }
}

/// What the writer merges with the copied files: an entry as it is, or the place of one
/// copied later.
enum Other {
    Entry(Entry),
    Later(String),
}

impl Other {
    fn path(&self) -> &str {
        match self {
            Other::Entry(e) => e.path(),
            Other::Later(p) => p,
        }
    }
}

/// Copy every file of `plan` but `global/pg_control`, writing the manifest's entries (its
/// directories and links too) to `parts` in order, with the place of `global/pg_control`
/// kept. Blocks: call it from a blocking context.
pub(super) fn copy_in_order(
    ctx: &CopyContext,
    plan: CopyPlan,
    parts: &mut Parts,
    workers: usize,
) -> Result<CopyOutcome> {
    let CopyPlan {
        entries,
        large,
        small,
        control,
    } = plan;
    let mut large_prior = prior_entries_of(ctx, &large)?;
    let large_count = large.len() as u64;
    let large_jobs = large.into_iter().map(move |file| Job {
        prior: large_prior.remove(&file.rel),
        file,
    });
    let mut others: Vec<Other> = entries.into_iter().map(Other::Entry).collect();
    others.push(Other::Later(control.rel.clone()));
    others.sort_unstable_by(|a, b| a.path().cmp(b.path()));

    let small_count = small.len() as u64;
    let window = Window::default();
    let (prior_tx, prior_rx) = mpsc::sync_channel::<Box<FileEntry>>(PRIOR_AHEAD);
    let (done_tx, done_rx) = mpsc::channel::<(u64, Option<FileEntry>)>();
    std::thread::scope(|scope| {
        let reader = ctx.prior.as_ref().map(|p| {
            let window = &window;
            scope.spawn(move || {
                let read = ctx.runtime.block_on(p.manifest.for_each_entry(|e| match e {
                    Entry::File(f) => prior_tx.send(f).map_err(|_| stopped()),
                    _ => Ok(()),
                }));
                if read.as_ref().is_err_and(|e| !is_stopped(e)) {
                    window.fail();
                }
                read
            })
        });
        let writer = {
            let (window, parts) = (&window, &mut *parts);
            scope.spawn(move || {
                let written =
                    write_in_order(done_rx, others, large_count, small_count, parts, window);
                if written.is_err() {
                    window.fail();
                }
                written
            })
        };
        let small_jobs = with_prior(small, prior_rx);
        let throttled = large_jobs
            .chain(small_jobs)
            .zip(0u64..)
            .map_while(|(job, n)| {
                (n < large_count || window.wait_for(n - large_count)).then_some(job)
            });
        let copied = copy_files(
            ctx,
            groups(throttled),
            workers,
            0,
            |n, e| done_tx.send((n, e)).map_err(|_| stopped()),
            || window.fail(),
        );
        drop(done_tx);
        let written = writer.join().expect("manifest writer thread");
        // A reader stopped by the end of the walk (the prior has files after the last
        // one walked) is no failure.
        let read = reader
            .map(|r| r.join().expect("prior manifest reader thread"))
            .unwrap_or(Ok(()));
        // The first failure is the one to report: a reader or writer that failed stops
        // the copy, whose error is then only that it was stopped.
        match (read, written, copied) {
            (Err(e), _, _) if !is_stopped(&e) => Err(e),
            (_, Err(e), _) if !is_stopped(&e) => Err(e),
            (_, _, Err(e)) => Err(e),
            (_, Err(e), _) => Err(e),
            (_, Ok(()), Ok(outcome)) => Ok(outcome),
        }
    })
}

fn stopped() -> Error {
    Error::new(ErrorKind::Io, "stopped: another part of the backup failed")
}

fn is_stopped(e: &Error) -> bool {
    e.kind == ErrorKind::Io && e.message == stopped().message
}

/// The prior backup's entries of `files` (a first reading of its manifest), by path.
fn prior_entries_of(
    ctx: &CopyContext,
    files: &[WalkedFile],
) -> Result<HashMap<String, Box<FileEntry>>> {
    let mut found = HashMap::new();
    let Some(p) = ctx.prior.as_ref().filter(|_| !files.is_empty()) else {
        return Ok(found);
    };
    let mut paths: Vec<&str> = files.iter().map(|f| f.rel.as_str()).collect();
    paths.sort_unstable();
    ctx.runtime
        .block_on(p.manifest.for_each_entry::<Error>(|e| {
            if let Entry::File(f) = e {
                if paths.binary_search(&&*f.path).is_ok() {
                    found.insert(f.path.to_string(), f);
                }
            }
            Ok(())
        }))?;
    Ok(found)
}

/// The jobs of `files` (in path order), each with the prior backup's entry of its file
/// taken from `prior` (the prior's file entries, in path order) as the paths meet.
fn with_prior(
    files: Vec<WalkedFile>,
    prior: mpsc::Receiver<Box<FileEntry>>,
) -> impl Iterator<Item = Job> {
    let mut next = prior.recv().ok();
    files.into_iter().map(move |file| {
        while next
            .as_ref()
            .is_some_and(|p| p.path.as_bytes() < file.rel.as_bytes())
        {
            next = prior.recv().ok();
        }
        let prior_entry = match next.as_ref() {
            Some(p) if *p.path == *file.rel => {
                let taken = next.take();
                next = prior.recv().ok();
                taken
            }
            _ => None,
        };
        Job {
            file,
            prior: prior_entry,
        }
    })
}

/// How far the writer is: files written, of those copied in order. The feeder waits on
/// it to stay within [`WINDOW`]; a failure anywhere releases it.
#[derive(Default)]
struct Window {
    written: Mutex<u64>,
    moved: Condvar,
    failed: AtomicBool,
}

impl Window {
    /// Wait until file `n` (of those copied in order) is within the window; false once
    /// something failed.
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

/// Take the copied files' entries from `done` (numbered: the `large` first, any order,
/// then the `small` in path order) and write every entry to `parts` in path order.
fn write_in_order(
    done: mpsc::Receiver<(u64, Option<FileEntry>)>,
    others: Vec<Other>,
    large: u64,
    small: u64,
    parts: &mut Parts,
    window: &Window,
) -> Result<()> {
    let mut others = others;
    let mut large_entries: Vec<Entry> = Vec::new();
    let mut large_done = 0u64;
    let mut early: BTreeMap<u64, Option<FileEntry>> = BTreeMap::new();
    let mut next = 0u64;
    let mut merged: Option<std::iter::Peekable<std::vec::IntoIter<Other>>> = None;
    let merge = |others: &mut Vec<Other>, large_entries: &mut Vec<Entry>| {
        others.extend(large_entries.drain(..).map(Other::Entry));
        others.sort_unstable_by(|a, b| a.path().cmp(b.path()));
        std::mem::take(others).into_iter().peekable()
    };
    if large == 0 {
        merged = Some(merge(&mut others, &mut large_entries));
    }
    for (n, entry) in done.iter() {
        if n < large {
            large_done += 1;
            large_entries.extend(entry.map(|f| Entry::File(Box::new(f))));
            if large_done == large {
                merged = Some(merge(&mut others, &mut large_entries));
            }
        } else {
            early.insert(n - large, entry);
        }
        let Some(o) = merged.as_mut() else { continue };
        while let Some(entry) = early.remove(&next) {
            if let Some(f) = entry {
                write_others(o, Some(&f.path), parts)?;
                parts.push(Entry::File(Box::new(f)))?;
            }
            next += 1;
            if next.is_multiple_of(256) {
                window.advance(next);
            }
        }
        window.advance(next);
    }
    if large_done != large || next != small {
        return Err(stopped());
    }
    let mut o = merged.expect("every large file was copied");
    write_others(&mut o, None, parts)
}

/// Write the entries of `others` that come before `path` (all of them: `None`).
fn write_others(
    others: &mut std::iter::Peekable<std::vec::IntoIter<Other>>,
    path: Option<&str>,
    parts: &mut Parts,
) -> Result<()> {
    while let Some(o) = others.next_if(|o| path.is_none_or(|p| o.path() < p)) {
        match o {
            Other::Entry(e) => parts.push(e)?,
            Other::Later(p) => parts.reserve(&p)?,
        }
    }
    Ok(())
}
