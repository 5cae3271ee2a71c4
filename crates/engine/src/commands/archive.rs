//! `archive-push` and `archive-get`, PostgreSQL's archive_command and restore_command.
//! Without `archive-async`, archive-push stores the file at once ([`archive_push_all`]);
//! storing and fetching WAL is [`crate::wal_archive`]'s. This module is what the commands
//! add to it: asynchronous archive-push (`archive-async`) and archive-get prefetch
//! (`archive-get-queue-max`), a spool directory on the database host and a background
//! worker that PostgreSQL's own calls start on demand.
//!
//! PostgreSQL runs archive_command and restore_command for one WAL file at a time and waits
//! for each. With an object store tens of milliseconds away, a call costs several round
//! trips, so a busy primary's archive falls behind (pg_wal fills, the primary stops) and a
//! restore replays at the pace of one fetch after another. Both directions are solved by
//! working ahead of PostgreSQL, in parallel, and answering its calls from local state.
//!
//! ## Push
//!
//! With `archive-async`, the call PostgreSQL makes (the *foreground*) does not push. It
//! makes sure a worker runs and waits for the worker's acknowledgement of its file. The
//! worker pushes every file PostgreSQL has marked ready (`pg_wal/archive_status/*.ready`),
//! `process-max` at a time (compressing the next ones meanwhile, as many at once as there
//! are cores), and for each writes `<spool>/<stanza>/out/<file>.ok` (fsynced, then its
//! directory) once every repository holds the file, or `<file>.error` with the
//! reason. The acknowledgement records the file's size and modification time: the
//! foreground trusts it only if they match the file in pg_wal, so an acknowledgement left
//! from another file of the same name (a cluster re-created at the same path) is not taken
//! for this one. On `.error` the foreground fails with the reason and removes it, so
//! PostgreSQL's retry pushes again. Acknowledgements whose `.ready` is gone (PostgreSQL
//! renamed it `.done`) are removed by the worker.
//!
//! The worker holds an `flock` on `<spool>/<stanza>/archive-push.lock` (one per stanza
//! and host) and exits once nothing has been ready for [`PUSH_IDLE`]. Pushes are
//! idempotent and an acknowledgement is written only after the stores, so a worker killed
//! at any moment loses nothing: the waiting foreground sees the lock free, starts another,
//! and it pushes what is still unacknowledged.
//!
//! `archive-push-queue-max`: when more ready WAL than that waits unacknowledged, the worker
//! acknowledges all of it without pushing, with a warning (the `.ok` says `dropped`):
//! PostgreSQL then recycles it, and the archive has a gap, which `verify`, `check` and
//! `info` report, instead of pg_wal filling the disk and stopping the primary.
//!
//! ## Get (prefetch)
//!
//! When PostgreSQL asks for segment S, the foreground first looks for S in
//! `<spool>/<stanza>/in/<archive-id>/`. A spooled segment was decoded by the worker, its
//! length and hash checked, and fsynced before it was renamed into the spool, beside
//! `S.blake3`: the BLAKE3 the repository recorded for it (the spool is the owner's only,
//! checked on every use: it holds WAL as pg_wal does). The foreground moves it beside its
//! destination under a temporary name (a rename, or a copy across file systems), hashes it
//! there and hands it to PostgreSQL (a rename) only if the hash is the recorded one: a copy
//! damaged or changed in the spool after the worker checked it is removed and S fetched
//! from the repository, and what is checked is what PostgreSQL gets. Then the foreground
//! records S as the newest
//! request (`in/request`) and makes sure a worker runs. The worker keeps the queue: the
//! segments after S on S's timeline, as many as fit in `archive-get-queue-max`, fetched
//! `process-max` at a time, written whole before they are renamed into the spool; anything
//! else in the spool (S itself, once served; another timeline after a switch; segments
//! behind a seek) is removed. A segment not in the spool is fetched by the foreground from
//! the repository as without prefetch (waiting briefly first if the worker is fetching it
//! at that moment). So prefetch can make a call faster but never changes its answer: "not
//! found" always comes from the repository itself. The worker stops at the end of the
//! archive and exits after [`GET_IDLE`] without a new request.
//!
//! ## The worker process
//!
//! The CLI starts a worker by running its own command line again with
//! [`WORKER_ENV`] set to the role (see [`WorkerRole`]), in a process group of its own
//! (PostgreSQL's signals to the archiver or startup process do not reach it), stdout and
//! stdin on /dev/null and stderr appended to `<spool>/<stanza>/<role>.log`. It thus
//! resolves exactly the options the foreground did.

use crate::wal_archive;
use crate::{open_stanza, Error, Result, Settings};
use futures::stream::{self, StreamExt};
use pgstrata_pg::lsn;
use pgstrata_repo::layout;
use pgstrata_repo::stanza::StanzaInfo;
use pgstrata_repo::Storage;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// archive-push without `archive-async`: the file stored in every repository at once.
pub use crate::wal_archive::archive_push_all;

/// The environment variable that makes a `pgstrata archive-push` or `archive-get` a worker.
pub const WORKER_ENV: &str = "PGSTRATA_ASYNC_WORKER";
/// The absolute path of pg_wal, for a push worker (the foreground knows it from `%p`).
pub const WAL_DIR_ENV: &str = "PGSTRATA_ASYNC_WAL_DIR";
/// The file the launching foreground waits for: pushed even if it is not marked ready
/// (archive-push run by hand, or a status file renamed meanwhile).
pub const WANTED_ENV: &str = "PGSTRATA_ASYNC_WANTED";

/// A push worker exits after this long with nothing to push.
pub const PUSH_IDLE: Duration = Duration::from_secs(2);
/// A prefetch worker exits after this long without a new request.
pub const GET_IDLE: Duration = Duration::from_secs(5);
/// How often a waiting foreground looks for its acknowledgement.
const POLL: Duration = Duration::from_millis(5);

/// What a worker process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerRole {
    Push,
    Get,
}

impl WorkerRole {
    pub fn name(self) -> &'static str {
        match self {
            WorkerRole::Push => "archive-push-async",
            WorkerRole::Get => "archive-get-async",
        }
    }

    pub fn parse(s: &str) -> Option<WorkerRole> {
        [WorkerRole::Push, WorkerRole::Get]
            .into_iter()
            .find(|r| r.name() == s)
    }
}

/// Starts a worker: `(role, extra environment, stderr log file)`. The CLI re-runs itself.
pub type Launcher<'a> = &'a dyn Fn(WorkerRole, &[(&str, String)], &Path) -> std::io::Result<()>;

/// The options of asynchronous archiving and prefetch.
#[derive(Debug, Clone)]
pub struct AsyncOptions {
    pub spool_path: PathBuf,
    /// Files pushed, or segments fetched, at once.
    pub process_max: std::num::NonZeroUsize,
    /// Ready WAL bytes past which a push worker drops WAL instead of pushing it.
    pub push_queue_max: Option<u64>,
    /// Bytes of WAL prefetched after the requested segment; 0 turns prefetch off.
    pub get_queue_max: u64,
    /// How long a push foreground waits for its acknowledgement.
    pub timeout: Duration,
}

impl AsyncOptions {
    fn stanza_dir(&self, s: &Settings) -> PathBuf {
        self.spool_path.join(&s.stanza)
    }
}

/// Create `dir` (and parents) readable by the owner only: the spool holds WAL. `dir` is
/// `spool` (spool-path) or below it, and `spool` and every directory from it down to `dir`
/// must be this user's, writable by no one else (see [`pgstrata_repo::private_dir`]):
/// whoever could write there could replace acknowledgements or the prefetched WAL.
fn create_private_dir(spool: &Path, dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let make = |d: &Path| {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .map_err(|e| {
                Error::io(
                    format!("create spool directory {} (set spool-path)", d.display()),
                    e,
                )
            })
    };
    let refuse = |why: pgstrata_repo::Error| {
        Error::refused(format!(
            "{why}; or set spool-path to a directory of this user's"
        ))
    };
    // Each one checked before anything is made inside it.
    make(spool)?;
    pgstrata_repo::private_dir::check(spool, "spool-path", true).map_err(refuse)?;
    let mut checked = spool.to_path_buf();
    let below = dir
        .strip_prefix(spool)
        .expect("spool directories are under spool-path");
    for part in below.components() {
        checked.push(part);
        make(&checked)?;
        pgstrata_repo::private_dir::check(&checked, "spool directory", false).map_err(refuse)?;
    }
    Ok(())
}

/// An exclusive `flock` on `path`, if no other process holds it.
fn try_lock(path: &Path) -> Result<Option<nix::fcntl::Flock<File>>> {
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("open lock file {}", path.display()), e))?;
    match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(Error::io(
            format!("lock {}", path.display()),
            std::io::Error::from(e),
        )),
    }
}

/// Whether a worker holds the lock at `path` now.
fn worker_running(path: &Path) -> Result<bool> {
    Ok(try_lock(path)?.is_none())
}

/// Write `bytes` to `dir/name` durably: a temporary file, fsync, rename, fsync of `dir`.
fn write_durable(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

// ---------------------------------------------------------------------------------------
// Push
// ---------------------------------------------------------------------------------------

/// The identity of a WAL file in pg_wal that an acknowledgement vouches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: i128,
}

impl Stamp {
    fn of(path: &Path) -> std::io::Result<Stamp> {
        let m = fs::metadata(path)?;
        Ok(Stamp {
            size: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }

    fn ack_text(self, dropped: bool) -> String {
        format!(
            "{} {}{}\n",
            self.size,
            self.mtime_ns,
            if dropped { " dropped" } else { "" }
        )
    }

    fn matches_ack(self, text: &str) -> bool {
        let mut words = text.split_whitespace();
        words.next().and_then(|w| w.parse().ok()) == Some(self.size)
            && words.next().and_then(|w| w.parse().ok()) == Some(self.mtime_ns)
    }
}

/// What the spool says about one file.
enum Ack {
    None,
    Ok,
    Error(String),
}

fn read_ack(out: &Path, name: &str, stamp: Stamp) -> Ack {
    if let Ok(text) = fs::read_to_string(out.join(format!("{name}.ok"))) {
        if stamp.matches_ack(&text) {
            return Ack::Ok;
        }
    }
    match fs::read_to_string(out.join(format!("{name}.error"))) {
        Ok(msg) => Ack::Error(msg),
        Err(_) => Ack::None,
    }
}

/// archive-push with `archive-async`: wait until the worker has acknowledged `wal_path`,
/// starting one when none runs.
pub async fn push(
    repos: &[Settings],
    o: &AsyncOptions,
    wal_path: &Path,
    launch: Launcher<'_>,
) -> Result<()> {
    let s = &repos[0];
    let name = wal_archive::checked_wal_name(wal_path)?;
    let dir = o.stanza_dir(s);
    let out = dir.join("out");
    create_private_dir(&o.spool_path, &out)?;
    let lock = dir.join("archive-push.lock");
    let wal_dir = std::path::absolute(wal_path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| {
            Error::config(format!(
                "archive-push: cannot tell the directory of '{}'",
                wal_path.display()
            ))
        })?;
    let stamp = Stamp::of(wal_path)
        .map_err(|e| Error::io(format!("archive-push: stat {}", wal_path.display()), e))?;
    let log = dir.join(format!("{}.log", WorkerRole::Push.name()));
    let started = Instant::now();
    let mut launched: Option<Instant> = None;
    let mut launches = 0u32;
    loop {
        match read_ack(&out, &name, stamp) {
            Ack::Ok => {
                log::info!("{name} was pushed by the asynchronous worker");
                return Ok(());
            }
            Ack::Error(msg) => {
                // Removed so that PostgreSQL's retry pushes again.
                let _ = fs::remove_file(out.join(format!("{name}.error")));
                return Err(Error::new(
                    crate::ErrorKind::Io,
                    format!("archive-push {name} (asynchronous): {}", msg.trim()),
                ));
            }
            Ack::None => {}
        }
        // A worker just started may not hold its lock yet: give it a second.
        let settling = launched.is_some_and(|t| t.elapsed() < Duration::from_secs(1));
        if !settling && !worker_running(&lock)? {
            if launches >= 2 {
                // Two workers went without acknowledging this file (killed, or failing
                // before they could say why): push it here, as without archive-async.
                log::warn!(
                    "the asynchronous archive-push worker exited twice before acknowledging {name}; pushing it directly (see {})",
                    log.display()
                );
                return wal_archive::archive_push_all(repos, wal_path).await;
            }
            launches += 1;
            launch(
                WorkerRole::Push,
                &[
                    (WAL_DIR_ENV, wal_dir.display().to_string()),
                    (WANTED_ENV, name.clone()),
                ],
                &log,
            )
            .map_err(|e| Error::io("archive-push: start the asynchronous worker", e))?;
            launched = Some(Instant::now());
        }
        if started.elapsed() > o.timeout {
            return Err(Error::new(
                crate::ErrorKind::Io,
                format!(
                    "archive-push {name}: not acknowledged by the asynchronous worker within archive-timeout ({} s); see {}",
                    o.timeout.as_secs(),
                    log.display()
                ),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The WAL files PostgreSQL has marked ready, in the order it archives them: history files
/// first, then by name (oldest first).
fn ready_files(wal_dir: &Path) -> Result<Vec<String>> {
    let status = wal_dir.join("archive_status");
    let entries =
        fs::read_dir(&status).map_err(|e| Error::io(format!("list {}", status.display()), e))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".ready")
                .map(str::to_string)
        })
        .filter(|n| wal_archive::valid_wal_name(n))
        .collect();
    names.sort_by_key(|n| (!n.ends_with(".history"), n.clone()));
    Ok(names)
}

/// Remove acknowledgements of files no longer ready (PostgreSQL marked them done) once they
/// are a minute old: a foreground may still be about to read one (a file pushed by hand,
/// not marked ready, is acknowledged all the same).
fn prune_acks(out: &Path, ready: &[String]) {
    let old = |e: &fs::DirEntry| {
        e.metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60))
    };
    let Ok(entries) = fs::read_dir(out) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let file = e.file_name().to_string_lossy().to_string();
        let Some(name) = file
            .strip_suffix(".ok")
            .or_else(|| file.strip_suffix(".error"))
        else {
            continue;
        };
        if !ready.iter().any(|r| r == name) && old(&e) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The push worker: push every ready file until nothing has been ready for [`PUSH_IDLE`].
/// Returns at once when another worker holds the stanza's lock.
pub async fn push_worker(
    repos: &[Settings],
    o: &AsyncOptions,
    wal_dir: &Path,
    wanted: Option<&str>,
) -> Result<()> {
    let s = &repos[0];
    let dir = o.stanza_dir(s);
    let out = dir.join("out");
    create_private_dir(&o.spool_path, &out)?;
    let Some(_lock) = try_lock(&dir.join("archive-push.lock"))? else {
        return Ok(());
    };
    let opened = &open_repositories(repos, wal_dir, &out).await?;
    let mut idle_since = Instant::now();
    let mut wanted = wanted
        .filter(|w| wal_archive::valid_wal_name(w))
        .map(str::to_string);
    loop {
        let (todo, failed) = unacknowledged(wal_dir, &out, wanted.take())?;
        if drop_over_queue_max(o, &todo, &failed, &out)? {
            continue;
        }
        if todo.is_empty() {
            if idle_since.elapsed() > PUSH_IDLE {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        idle_since = Instant::now();
        push_and_acknowledge(repos, opened, o, wal_dir, &out, todo).await?;
    }
}

/// The stanza opened in every repository, for the push worker. When one fails, every
/// ready file is acknowledged with the error in `out`: the waiting foreground learns why
/// at once rather than time out.
async fn open_repositories(
    repos: &[Settings],
    wal_dir: &Path,
    out: &Path,
) -> Result<Vec<(Storage, StanzaInfo)>> {
    match futures::future::try_join_all(repos.iter().map(|r| async move {
        open_stanza(r)
            .await
            .map_err(|e| e.context(format!("repo{}", r.repo_index)))
    }))
    .await
    {
        Ok(o) => Ok(o),
        Err(e) => {
            for name in ready_files(wal_dir)? {
                let _ = write_durable(out, &format!("{name}.error"), e.to_string().as_bytes());
            }
            Err(e)
        }
    }
}

/// A WAL file waiting to be pushed, with what its acknowledgement will vouch for.
type Waiting = (String, Stamp);

/// The files not acknowledged yet in `out`: those to push, and those whose push failed
/// (retried once PostgreSQL's call has reported the failure and removed the `.error`).
/// `wanted` (the launching foreground's file) is among them, ready or not. Acknowledgements
/// of files no longer ready are removed.
fn unacknowledged(
    wal_dir: &Path,
    out: &Path,
    wanted: Option<String>,
) -> Result<(Vec<Waiting>, Vec<Waiting>)> {
    let mut ready = ready_files(wal_dir)?;
    prune_acks(out, &ready);
    if let Some(w) = wanted {
        if !ready.contains(&w) {
            ready.insert(0, w);
        }
    }
    let mut todo = Vec::new();
    let mut failed = Vec::new();
    for name in ready {
        let Ok(stamp) = Stamp::of(&wal_dir.join(&name)) else {
            continue; // recycled meanwhile
        };
        match read_ack(out, &name, stamp) {
            Ack::None => todo.push((name, stamp)),
            Ack::Error(_) => failed.push((name, stamp)),
            Ack::Ok => {}
        }
    }
    Ok((todo, failed))
}

/// `archive-push-queue-max`: when more WAL than that waits (`todo` and `failed`), every
/// waiting file is acknowledged as dropped, with a warning. True when it dropped them.
fn drop_over_queue_max(
    o: &AsyncOptions,
    todo: &[Waiting],
    failed: &[Waiting],
    out: &Path,
) -> Result<bool> {
    let Some(max) = o.push_queue_max else {
        return Ok(false);
    };
    let mut waiting: Vec<Waiting> = todo.iter().chain(failed).cloned().collect();
    // Segments only: history and backup-label files are small and must not tip it.
    let bytes: u64 = waiting
        .iter()
        .filter(|(n, _)| lsn::is_segment_name(n))
        .map(|(_, st)| st.size)
        .sum();
    if bytes <= max {
        return Ok(false);
    }
    waiting.sort_by(|a, b| a.0.cmp(&b.0));
    log::warn!(
        "{bytes} bytes of WAL wait to be archived, more than archive-push-queue-max ({max}): dropping {} file(s) ({} .. {}) without archiving them. \
         The archive now has a gap: point-in-time recovery cannot cross it; take a full backup",
        waiting.len(),
        waiting[0].0,
        waiting[waiting.len() - 1].0
    );
    for (name, stamp) in &waiting {
        let _ = fs::remove_file(out.join(format!("{name}.error")));
        write_durable(out, &format!("{name}.ok"), stamp.ack_text(true).as_bytes())
            .map_err(|e| Error::io(format!("acknowledge {name} in {}", out.display()), e))?;
    }
    Ok(true)
}

/// Push the files of `todo` to every repository and acknowledge each in `out`: `.ok` once
/// every repository has it, else `.error` with the reason.
async fn push_and_acknowledge(
    repos: &[Settings],
    opened: &[(Storage, StanzaInfo)],
    o: &AsyncOptions,
    wal_dir: &Path,
    out: &Path,
    todo: Vec<Waiting>,
) -> Result<()> {
    // Two stages: files read, compressed and decoded (once for every repository), each
    // on one thread, as many at once as there are cores (at most process-max); and
    // process-max files being stored. More files compressing than cores only evict
    // each other's data from the cores' caches: in `bench wal_async` on 2 cores, 4
    // files compressing beside 4 in flight took 12 % more CPU a segment than 4 files
    // each compressed then stored, and 2 compressing beside 4 in flight the same CPU
    // as those, in 17 % less memory.
    let width = o.process_max.get();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut acked = stream::iter(todo)
        .map(|(name, stamp)| async move {
            let path = wal_dir.join(&name);
            let prepared = wal_archive::prepare_push_all(repos, opened, &name, &path, 1).await;
            (name, stamp, path, prepared)
        })
        .buffer_unordered(width.min(cores))
        .map(|(name, stamp, path, prepared)| async move {
            let stored = match prepared {
                Ok(p) => wal_archive::store_prepared_all(repos, opened, &path, p).await,
                Err(e) => Err(e),
            };
            // Acknowledged only once every repository has it.
            let (file, text) = match stored {
                Ok(()) => (format!("{name}.ok"), stamp.ack_text(false)),
                Err(e) => {
                    log::error!("{name}: {e}");
                    (format!("{name}.error"), e.to_string())
                }
            };
            let dir = out.to_path_buf();
            tokio::task::spawn_blocking(move || write_durable(&dir, &file, text.as_bytes()))
                .await
                .expect("acknowledgement writer")
                .map_err(|e| Error::io(format!("acknowledge {name} in {}", out.display()), e))
        })
        .buffer_unordered(width);
    while let Some(written) = acked.next().await {
        written?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Get (prefetch)
// ---------------------------------------------------------------------------------------

const REQUEST: &str = "request";

/// The file beside spooled segment `S` holding the BLAKE3 (hex) its archive object records:
/// `S.blake3`.
fn recorded_hash_path(spooled: &Path) -> PathBuf {
    let mut p = spooled.as_os_str().to_owned();
    p.push(".blake3");
    PathBuf::from(p)
}

/// archive-get with prefetch: serve `name` from the spool when it is there, tell the worker
/// what was asked, and otherwise fetch from the repository. Same answer as
/// [`wal_archive::archive_get`]: true when found.
pub async fn get(
    repos: &[Settings],
    o: &AsyncOptions,
    name: &str,
    dest: &Path,
    launch: Launcher<'_>,
) -> Result<bool> {
    let s = &repos[0];
    if o.get_queue_max == 0 || !lsn::is_segment_name(name) {
        return wal_archive::archive_get_any(repos, name, dest).await;
    }
    let dir = o.stanza_dir(s);
    let inbox = dir.join("in");
    if let Err(e) = create_private_dir(&o.spool_path, &inbox) {
        // Prefetch only makes calls faster: without it this call is answered all the same.
        if e.kind == crate::ErrorKind::Refused {
            log::warn!("prefetch is off: {e}");
        } else {
            log::debug!("prefetch off: {e}");
        }
        return wal_archive::archive_get_any(repos, name, dest).await;
    }
    let served = serve_spooled(&inbox, name, dest, Duration::ZERO);
    // Tell the worker (atomically: it must never read half a name) and make sure it runs.
    let request = write_durable_nosync(&inbox, REQUEST, name.as_bytes())
        .map_err(|e| Error::io(format!("write {}", inbox.join(REQUEST).display()), e))
        .and_then(|()| {
            if worker_running(&dir.join("archive-get.lock"))? {
                return Ok(());
            }
            let log = dir.join(format!("{}.log", WorkerRole::Get.name()));
            launch(WorkerRole::Get, &[], &log)
                .map_err(|e| Error::io("archive-get: start the prefetch worker", e))
        });
    if let Err(e) = request {
        log::warn!("archive-get prefetch is off for this call: {e}");
    }
    if served || serve_spooled(&inbox, name, dest, Duration::from_secs(5)) {
        return Ok(true);
    }
    wal_archive::archive_get_any(repos, name, dest).await
}

/// Write `dir/name` through a temporary file and a rename, without fsync (spool contents
/// are a cache: a torn file fails its hash check and is fetched again).
fn write_durable_nosync(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, dir.join(name))
}

/// Hand spooled segment `name` to PostgreSQL at `dest`, if the spool has it (waiting up
/// to `wait` while the worker is fetching it) and it is what the repository holds. A
/// spooled copy that cannot be handed over is removed.
fn serve_spooled(inbox: &Path, name: &str, dest: &Path, wait: Duration) -> bool {
    let Ok(entries) = fs::read_dir(inbox) else {
        return false;
    };
    let queues: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    let deadline = Instant::now() + wait;
    for q in queues {
        let path = q.join(name);
        let in_flight = q.join(format!(".{name}.tmp"));
        while !path.exists() && in_flight.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if !path.exists() {
            continue;
        }
        let handed = hand_over(&path, name, dest);
        let _ = fs::remove_file(&path);
        let _ = fs::remove_file(recorded_hash_path(&path));
        match handed {
            Ok(()) => {
                log::info!("restored {name} from the prefetch queue");
                return true;
            }
            Err(why) => log::warn!(
                "prefetched {name} in {}: {why}; fetching it from the repository",
                q.display()
            ),
        }
    }
    false
}

/// Move spooled segment `spooled` to `dest` if its content hashes to the BLAKE3 the
/// repository recorded for it (the worker wrote it beside the segment). It is checked
/// where PostgreSQL will read it, under a temporary name beside `dest`, and renamed to
/// `dest` only then: nothing done to the spool after the check reaches PostgreSQL.
fn hand_over(spooled: &Path, name: &str, dest: &Path) -> Result<()> {
    let unreadable_hash = "its recorded hash cannot be read";
    let recorded = fs::read_to_string(recorded_hash_path(spooled))
        .map_err(|e| Error::io(unreadable_hash, e))?;
    let recorded = blake3::Hash::from_hex(recorded.trim())
        .map_err(|e| Error::integrity(format!("{unreadable_hash}: {e}")))?;
    let tmp = dest.with_file_name(format!(".{name}.pgstrata.tmp"));
    let not_moved = |e| Error::io("could not be moved into place", e);
    let checked = fs::rename(spooled, &tmp)
        .or_else(|e| {
            if e.raw_os_error() != Some(nix::libc::EXDEV) {
                return Err(e);
            }
            fs::copy(spooled, &tmp).map(|_| ())
        })
        .map_err(not_moved)
        .and_then(|()| {
            let mut hasher = blake3::Hasher::new();
            File::open(&tmp)
                .and_then(|f| hasher.update_reader(f).map(|_| ()))
                .map_err(|e| Error::io("could not be read back", e))?;
            if hasher.finalize() != recorded {
                return Err(Error::integrity("its content does not match the BLAKE3 hash the repository recorded for it (damaged or altered in the spool)"));
            }
            fs::rename(&tmp, dest).map_err(not_moved)
        });
    if checked.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    checked
}

/// What became of one prefetched segment.
enum Fetched {
    Done,
    NotFound,
    Failed(Error),
}

/// Decode stored WAL object `obj` into `tmp` (checking its length and hash), make it
/// durable, record the hash the object holds beside `done` (for the foreground's check,
/// [`hand_over`]) and rename it to `done`: a spooled segment is whole and verified when it
/// appears (a spooled file torn by a crash would reach PostgreSQL, which might take it for
/// the end of the WAL).
///
/// The fsync also pays off: done here, beside recovery, it is not done on recovery's
/// path. Without it (tried: an unsynced queue named by the kernel's boot id) recovery
/// waited for each segment's writeback, and replaying 64 segments took 12.4 s instead of
/// 9.7 s (`bench wal_async --segments 64`).
fn spool_segment(obj: &[u8], key: &str, tmp: &Path, done: &Path) -> Result<()> {
    let recorded = pgstrata_repo::wal_object::parse_header(obj, key)?.hash;
    let written = File::create(tmp)
        .map_err(|e| Error::io(format!("create {}", tmp.display()), e))
        .and_then(|mut f| {
            pgstrata_repo::wal_object::decode_to(obj, key, &mut f)?;
            f.sync_all()
                .map_err(|e| Error::io(format!("fsync {}", tmp.display()), e))
        })
        .and_then(|()| {
            // A hash file lost in a crash only makes the foreground fetch the segment again.
            let hash_path = recorded_hash_path(done);
            fs::write(
                &hash_path,
                blake3::Hash::from_bytes(recorded).to_hex().as_str(),
            )
            .map_err(|e| Error::io(format!("write {}", hash_path.display()), e))
        })
        .and_then(|()| {
            fs::rename(tmp, done).map_err(|e| Error::io(format!("rename {}", tmp.display()), e))
        });
    if written.is_err() {
        let _ = fs::remove_file(tmp);
    }
    written
}

/// The prefetch worker: keep the segments after the newest request in the spool until no
/// request came for [`GET_IDLE`]. Returns at once when another worker holds the lock.
pub async fn get_worker(repos: &[Settings], o: &AsyncOptions) -> Result<()> {
    let s = &repos[0];
    let dir = o.stanza_dir(s);
    let inbox = dir.join("in");
    create_private_dir(&o.spool_path, &inbox)?;
    let Some(_lock) = try_lock(&dir.join("archive-get.lock"))? else {
        return Ok(());
    };
    let Some((storages, stanza)) = open_for_prefetch(repos).await else {
        return Ok(()); // the foreground fetches and reports the failure itself
    };
    let archive_id = stanza.cluster.archive_id();
    let seg_size = stanza.cluster.wal_segment_size;
    let queue = prefetch_queue(o, &inbox, &archive_id)?;
    let depth = (o.get_queue_max / seg_size).max(1);
    let mut last_request = String::new();
    let mut last_change = Instant::now();
    // The first segment the archive did not have, for the current request: asked again
    // only after a pause (the archive may still be growing).
    let mut end_of_archive: Option<(String, Instant)> = None;
    loop {
        let request = fs::read_to_string(inbox.join(REQUEST)).unwrap_or_default();
        if request != last_request {
            last_request = request.clone();
            last_change = Instant::now();
        } else if last_change.elapsed() > GET_IDLE {
            return Ok(());
        }
        let Some((tli, segno)) = lsn::parse_segment_name(request.trim(), seg_size) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let window: Vec<String> = (1..=depth)
            .map(|i| lsn::segment_name(tli, segno + i, seg_size))
            .collect();
        keep_only_window(&queue, &window);
        // Past the end of the archive found less than a second ago: wait before asking again.
        let end = end_of_archive
            .as_ref()
            .filter(|(_, at)| at.elapsed() < Duration::from_secs(1))
            .map(|(n, _)| n.clone());
        let missing: Vec<&String> = window
            .iter()
            .take_while(|n| end.as_ref().is_none_or(|end| *n < end))
            .filter(|n| !queue.join(n).exists())
            .take(o.process_max.get())
            .collect();
        if missing.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let fetched = fetch_into_queue(s, o, &storages, &archive_id, &queue, missing).await;
        if let Some(end) = end_of_round(&queue, fetched) {
            end_of_archive = Some((end, Instant::now()));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The repositories that open, in the order given (the one asked for first; segments
/// come from the first that has them), with the stanza record of the first. None when none
/// opens.
async fn open_for_prefetch(repos: &[Settings]) -> Option<(Vec<Storage>, StanzaInfo)> {
    let mut storages = Vec::new();
    let mut first_stanza = None;
    for r in repos {
        match open_stanza(r).await {
            Ok((storage, stanza)) => {
                first_stanza.get_or_insert(stanza);
                storages.push(storage);
            }
            Err(e) => log::warn!("prefetch: repo{}: {e}", r.repo_index),
        }
    }
    Some((storages, first_stanza?))
}

/// The prefetch queue of `archive_id` in `inbox`, created; queues of another archive id
/// (before a stanza upgrade) are of no use now and removed.
fn prefetch_queue(o: &AsyncOptions, inbox: &Path, archive_id: &str) -> Result<PathBuf> {
    let queue = inbox.join(archive_id);
    create_private_dir(&o.spool_path, &queue)?;
    for e in fs::read_dir(inbox).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) && e.path() != queue {
            let _ = fs::remove_dir_all(e.path());
        }
    }
    Ok(queue)
}

/// Remove from `queue` everything outside `window`: served segments, another timeline,
/// segments behind a seek.
fn keep_only_window(queue: &Path, window: &[String]) {
    for e in fs::read_dir(queue).into_iter().flatten().flatten() {
        let file = e.file_name().to_string_lossy().to_string();
        let segment = file.strip_suffix(".blake3").unwrap_or(&file);
        if !window.iter().any(|w| w == segment) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Fetch the `missing` segments into `queue`, in order, process-max at a time, each decoded
/// (its hash checked) and made durable beside the queue before it is renamed in.
async fn fetch_into_queue(
    s: &Settings,
    o: &AsyncOptions,
    storages: &[Storage],
    archive_id: &str,
    queue: &Path,
    missing: Vec<&String>,
) -> Vec<(String, Fetched)> {
    stream::iter(missing)
        .map(|n| {
            let key = layout::archive_object(&s.stanza, archive_id, n);
            let tmp = queue.join(format!(".{n}.tmp"));
            let done = queue.join(n);
            async move {
                // Marks the fetch in flight for a foreground that wants this segment.
                let _ = File::create(&tmp);
                let mut got = None;
                for storage in storages {
                    match storage.get(&key).await {
                        Ok(obj) => {
                            got = Some(Ok(obj));
                            break;
                        }
                        Err(e) => {
                            got.get_or_insert(Err(e));
                        }
                    }
                }
                let outcome = match got.expect("at least one repository") {
                    Err(e) if e.is_not_found() => Fetched::NotFound,
                    Err(e) => Fetched::Failed(e.into()),
                    Ok(obj) => {
                        tokio::task::spawn_blocking(move || spool_segment(&obj, &key, &tmp, &done))
                            .await
                            .expect("prefetch decode thread")
                            .map_or_else(Fetched::Failed, |()| Fetched::Done)
                    }
                };
                (n.clone(), outcome)
            }
        })
        .buffered(o.process_max.get())
        .collect()
        .await
}

/// The first segment of a round of `fetched` (in order) that the archive did not have or
/// that failed, which ends the round: the segments after it are not kept (the next round
/// asks again). None when every one was fetched.
fn end_of_round(queue: &Path, fetched: Vec<(String, Fetched)>) -> Option<String> {
    let mut end = None;
    for (n, outcome) in fetched {
        if end.is_some() {
            // Past the end: not kept (the next round asks again).
            let _ = fs::remove_file(queue.join(&n));
            let _ = fs::remove_file(recorded_hash_path(&queue.join(&n)));
            continue;
        }
        match outcome {
            Fetched::Done => {}
            Fetched::NotFound => end = Some(n),
            Fetched::Failed(why) => {
                log::warn!("prefetch {n}: {why}");
                end = Some(n);
            }
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A spool directory (spool-path itself or one below it) that another user owns or
    /// others can write is refused, naming it, its owner and its mode: they could replace
    /// acknowledgements or prefetched WAL.
    #[test]
    fn a_spool_others_own_or_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool");
        let inbox = spool.join("st/in");
        create_private_dir(&spool, &inbox).unwrap();
        assert_eq!(
            fs::metadata(&inbox).unwrap().permissions().mode() & 0o777,
            0o700
        );
        for open in [&spool, &spool.join("st")] {
            fs::set_permissions(open, fs::Permissions::from_mode(0o777)).unwrap();
            let e = create_private_dir(&spool, &inbox).unwrap_err();
            assert_eq!(e.kind, crate::ErrorKind::Refused);
            assert!(
                e.message.contains(&format!("{} (owner", open.display()))
                    && e.message.contains("mode 0777")
                    && e.message.contains("chmod 0700"),
                "{e}"
            );
            fs::set_permissions(open, fs::Permissions::from_mode(0o700)).unwrap();
        }
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&inbox, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let e = create_private_dir(&spool, &inbox).unwrap_err();
            assert!(e.message.contains("owner uid 65534"), "{e}");
        }
        // spool-path may be reached through a link the operator made.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&spool, &link).unwrap();
        nix::unistd::chown(&inbox, Some(nix::unistd::geteuid()), None).unwrap();
        create_private_dir(&link, &link.join("st/in")).unwrap();
    }
}
