//! `restore`: rebuild a data directory from one backup's manifest, and write the recovery
//! settings that bring it to a consistent state (or to a target) from the archive.
//!
//! Every backup is logically full, so restore reads one manifest and fetches what it points
//! at. Each file's BLAKE3 is checked as it is written; a mismatch stops the restore naming
//! the file. With `--delta`, files whose size and hash already match are left alone and
//! files the backup does not have are removed, so the result equals a fresh restore.

use crate::content::{check_reader, extents_of, for_each_extent, read_full_at, ContentCheck};
use crate::owner::{running_as_root, OwnerResolver};
use crate::progress::{human_bytes, Progress};
use crate::{open_stanza, Error, Result, Settings};
use pgstrata_repo::manifest::block_hash;
use pgstrata_repo::manifest::{list_backups, Entry, FileEntry, Manifest, Owner};
use pgstrata_repo::pack::{Chunk, FrameReader};
use pgstrata_repo::Storage;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryType {
    /// Replay all archived WAL.
    Default,
    /// Stop as soon as the backup is consistent.
    Immediate,
    Time,
    Lsn,
    Xid,
    Name,
    /// Start as a standby that keeps fetching WAL from the archive.
    Standby,
    /// Write no recovery settings at all.
    None,
}

impl RecoveryType {
    pub const NAMES: &'static [&'static str] = &[
        "default",
        "immediate",
        "time",
        "lsn",
        "xid",
        "name",
        "standby",
        "none",
    ];

    pub fn parse(s: &str) -> Option<RecoveryType> {
        Some(match s {
            "default" => RecoveryType::Default,
            "immediate" => RecoveryType::Immediate,
            "time" => RecoveryType::Time,
            "lsn" => RecoveryType::Lsn,
            "xid" => RecoveryType::Xid,
            "name" => RecoveryType::Name,
            "standby" => RecoveryType::Standby,
            "none" => RecoveryType::None,
            _ => return None,
        })
    }

    fn needs_target(self) -> bool {
        matches!(
            self,
            RecoveryType::Time | RecoveryType::Lsn | RecoveryType::Xid | RecoveryType::Name
        )
    }
}

#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub set: Option<String>,
    pub delta: bool,
    pub force: bool,
    pub tablespace_map: Vec<(u32, PathBuf)>,
    pub recovery_type: RecoveryType,
    pub target: Option<String>,
    pub target_action: Option<String>,
    pub target_timeline: Option<String>,
    pub target_exclusive: bool,
    /// Write `archive_mode = off` so the restored cluster does not archive into the
    /// repository of its source (test restores, copies for analysis).
    pub archive_off: bool,
    /// The command line restore_command runs (pgstrata with the options that find the
    /// repository), without the `archive-get %f "%p"` part.
    pub archive_get_command: String,
}

#[derive(Debug, Default)]
pub struct RestoreReport {
    pub label: String,
    /// Files written whole.
    pub files_written: u64,
    /// Files (delta) whose differing blocks were rewritten in place.
    pub files_patched: u64,
    /// Files (delta) already identical.
    pub files_kept: u64,
    pub bytes_written: u64,
    /// Bytes read from the repository.
    pub bytes_fetched: u64,
    pub removed: u64,
}

/// What one worker did.
#[derive(Default)]
struct WorkerTally {
    written: u64,
    patched: u64,
    kept: u64,
    bytes_written: u64,
    bytes_fetched: u64,
}

/// Parse a recovery_target_time the way a user writes it for PostgreSQL.
pub fn parse_target_time(s: &str) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t);
    }
    for fmt in [
        "%Y-%m-%d %H:%M:%S%.f%#z",
        "%Y-%m-%d %H:%M:%S%#z",
        "%Y-%m-%dT%H:%M:%S%.f%#z",
    ] {
        if let Ok(t) = chrono::DateTime::parse_from_str(s, fmt) {
            return Some(t);
        }
    }
    None
}

async fn choose_backup(storage: &Storage, s: &Settings, o: &RestoreOptions) -> Result<Manifest> {
    let labels = list_backups(storage, &s.stanza).await?;
    if labels.is_empty() {
        return Err(Error::refused(format!(
            "stanza '{}' has no backups to restore",
            s.stanza
        )));
    }
    if let Some(set) = &o.set {
        if !labels.contains(set) {
            return Err(Error::config(format!(
                "backup '{set}' does not exist in stanza '{}' (backups: {})",
                s.stanza,
                labels.join(", ")
            )));
        }
        return Ok(Manifest::load(storage, &s.stanza, set).await?);
    }
    if o.recovery_type == RecoveryType::Time {
        let target = o.target.as_deref().unwrap_or_default();
        let t = parse_target_time(target).ok_or_else(|| {
            Error::config(format!(
                "--target='{target}' is not a time with a time zone, like '2026-11-23 10:15:00+00'"
            ))
        })?;
        for label in labels.iter().rev() {
            let m = Manifest::load(storage, &s.stanza, label).await?;
            if m.stop.epoch < t.timestamp() {
                log::info!("backup {label} is the newest that ended before {target}");
                return Ok(m);
            }
        }
        return Err(Error::refused(format!(
            "no backup of stanza '{}' ended before {target}",
            s.stanza
        )));
    }
    Ok(Manifest::load(storage, &s.stanza, labels.last().unwrap()).await?)
}

fn dir_is_empty(p: &Path) -> Result<bool> {
    match std::fs::read_dir(p) {
        Ok(mut rd) => Ok(rd.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io(format!("read {}", p.display()), e)),
    }
}

/// Refuse to touch the directory of a running server.
fn refuse_if_running(pg_path: &Path) -> Result<()> {
    let pidfile = pg_path.join("postmaster.pid");
    let Ok(text) = std::fs::read_to_string(&pidfile) else {
        return Ok(());
    };
    if let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
    {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if alive {
            return Err(Error::refused(format!(
                "PostgreSQL is running on {} (postmaster.pid names process {pid}): stop it before restoring",
                pg_path.display()
            )));
        }
    }
    Ok(())
}

fn remove_path(p: &Path) -> std::io::Result<()> {
    let md = std::fs::symlink_metadata(p)?;
    if md.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

fn clear_dir(p: &Path) -> Result<u64> {
    let mut n = 0;
    let rd = match std::fs::read_dir(p) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(format!("read {}", p.display()), e)),
    };
    for ent in rd {
        let ent = ent.map_err(|e| Error::io(format!("read {}", p.display()), e))?;
        remove_path(&ent.path())
            .map_err(|e| Error::io(format!("remove {}", ent.path().display()), e))?;
        n += 1;
    }
    Ok(n)
}

/// Map a manifest path to where it goes on this host.
struct PathMapper {
    pg_path: PathBuf,
    /// Tablespace oid -> restore location.
    tablespaces: HashMap<u32, PathBuf>,
}

impl PathMapper {
    fn map(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            return self.pg_path.clone();
        }
        if let Some(rest) = rel.strip_prefix("pg_tblspc/") {
            let (oid, tail) = rest.split_once('/').unwrap_or((rest, ""));
            if let (Ok(oid), false) = (oid.parse::<u32>(), tail.is_empty()) {
                if let Some(loc) = self.tablespaces.get(&oid) {
                    return loc.join(tail);
                }
            }
        }
        self.pg_path.join(rel)
    }
}

pub async fn restore(s: &Settings, o: &RestoreOptions) -> Result<RestoreReport> {
    let started = Instant::now();
    if o.recovery_type.needs_target() && o.target.is_none() {
        return Err(Error::config(
            format!("--type={:?} needs --target", o.recovery_type).to_lowercase(),
        ));
    }
    if let Some(a) = &o.target_action {
        if !["pause", "promote", "shutdown"].contains(&a.as_str()) {
            return Err(Error::config(format!(
                "--target-action='{a}' is not one of pause, promote, shutdown"
            )));
        }
    }
    let pg_path = s.pg_path()?.to_path_buf();
    let (storage, _stanza) = open_stanza(s).await?;
    let m = choose_backup(&storage, s, o).await?;

    // Where each tablespace goes.
    let mut tablespaces = HashMap::new();
    for t in &m.tablespaces {
        tablespaces.insert(t.oid, PathBuf::from(&t.location));
    }
    for (oid, dir) in &o.tablespace_map {
        if !tablespaces.contains_key(oid) {
            return Err(Error::config(format!(
                "--tablespace-map: backup {} has no tablespace with OID {oid} (it has: {})",
                m.label,
                m.tablespaces
                    .iter()
                    .map(|t| t.oid.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        tablespaces.insert(*oid, dir.clone());
    }

    // Safety checks before anything is written.
    refuse_if_running(&pg_path)?;
    let overwrite = o.delta || o.force;
    let mut targets = vec![pg_path.clone()];
    targets.extend(tablespaces.values().cloned());
    for dir in &targets {
        if !overwrite && !dir_is_empty(dir)? {
            return Err(Error::refused(format!(
                "{} is not empty: restore into an empty directory, or use --delta (rewrite only what differs) or --force (replace everything)",
                dir.display()
            )));
        }
    }
    log::info!(
        "restoring backup {} ({} files, {}) into {}",
        m.label,
        m.stats.files,
        human_bytes(m.stats.db_size),
        pg_path.display()
    );
    let mut report = RestoreReport {
        label: m.label.clone(),
        ..Default::default()
    };
    let mapper = PathMapper {
        pg_path: pg_path.clone(),
        tablespaces,
    };
    if o.force && !o.delta {
        for dir in &targets {
            report.removed += clear_dir(dir)?;
        }
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&pg_path)
        .map_err(|e| Error::io(format!("create {}", pg_path.display()), e))?;
    if o.delta {
        report.removed += remove_extraneous(&m, &mapper)?;
    }

    // Directories and links first.
    let chown = running_as_root();
    let mut resolver = OwnerResolver::default();
    for e in &m.entries {
        match e {
            Entry::Dir { path, .. } => {
                let p = mapper.map(path);
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&p)
                    .map_err(|e| Error::io(format!("create directory {}", p.display()), e))?;
            }
            Entry::Link {
                path,
                target,
                owner,
            } => {
                let link = mapper.map(path);
                let oid = path
                    .strip_prefix("pg_tblspc/")
                    .and_then(|o| o.parse::<u32>().ok());
                let dest = oid
                    .and_then(|o| mapper.tablespaces.get(&o).cloned())
                    .unwrap_or_else(|| PathBuf::from(target));
                if let Some(parent) = link.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
                }
                if std::fs::read_link(&link).ok().as_deref() != Some(dest.as_path()) {
                    if std::fs::symlink_metadata(&link).is_ok() {
                        remove_path(&link)
                            .map_err(|e| Error::io(format!("remove {}", link.display()), e))?;
                    }
                    std::os::unix::fs::symlink(&dest, &link).map_err(|e| {
                        Error::io(format!("link {} -> {}", link.display(), dest.display()), e)
                    })?;
                }
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dest)
                    .map_err(|e| {
                        Error::io(format!("create tablespace directory {}", dest.display()), e)
                    })?;
                if chown {
                    let (u, g) = resolver.ids(owner);
                    let _ = nix::unistd::fchownat(
                        None,
                        &link,
                        Some(u.into()),
                        Some(g.into()),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    );
                    set_owner(&dest, owner, &mut resolver)?;
                }
            }
            Entry::File(_) => {}
        }
    }

    // Files, in parallel.
    let files: Vec<FileEntry> = m.files().cloned().collect();
    let total_bytes = files.iter().map(|f| f.size).sum();
    let progress = Progress::start("restore", total_bytes, files.len() as u64);
    let shared = Arc::new(RestoreShared {
        storage: storage.clone(),
        runtime: tokio::runtime::Handle::current(),
        manifest: m.clone(),
        delta: o.delta,
        chown,
        counters: progress.counters.clone(),
        queue: Mutex::new(plan_jobs(files)),
        paths: files_paths(&m, &mapper),
    });
    let workers = s.process_max.max(1);
    let results = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    let shared = shared.clone();
                    std::thread::spawn(move || restore_worker(&shared))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("restore worker panicked"))
                .collect::<Vec<_>>()
        })
        .await
        .expect("restore threads")
    };
    progress.finish();
    for r in results {
        let t = r.map_err(|mut e| {
            if e.kind == crate::ErrorKind::Integrity {
                e.message = format!("restore stopped: {}", e.message);
            }
            e
        })?;
        report.files_written += t.written;
        report.files_patched += t.patched;
        report.files_kept += t.kept;
        report.bytes_written += t.bytes_written;
        report.bytes_fetched += t.bytes_fetched;
    }

    // Directory modes and owners last (a 0500 directory would block writing into it).
    for e in &m.entries {
        if let Entry::Dir { path, owner } = e {
            let p = mapper.map(path);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(owner.mode))
                .map_err(|e| Error::io(format!("chmod {}", p.display()), e))?;
            if chown {
                set_owner(&p, owner, &mut resolver)?;
            }
        }
    }

    let root_owner = m.entries.iter().find_map(|e| match e {
        Entry::Dir { path, owner } if path.is_empty() => Some(owner.clone()),
        _ => None,
    });
    write_recovery_files(&pg_path, &m, o, root_owner.as_ref(), &mut resolver)?;
    log::info!(
        "restore of {} complete: {} files written, {} patched, {} unchanged, {} removed; {} written, {} fetched, {:.1}s",
        m.label,
        report.files_written,
        report.files_patched,
        report.files_kept,
        report.removed,
        human_bytes(report.bytes_written),
        human_bytes(report.bytes_fetched),
        started.elapsed().as_secs_f64()
    );
    Ok(report)
}

fn files_paths(m: &Manifest, mapper: &PathMapper) -> HashMap<String, PathBuf> {
    m.files()
        .map(|f| (f.path.clone(), mapper.map(&f.path)))
        .collect()
}

fn set_owner(p: &Path, owner: &Owner, resolver: &mut OwnerResolver) -> Result<()> {
    let (u, g) = resolver.ids(owner);
    nix::unistd::chown(p, Some(u.into()), Some(g.into()))
        .map_err(|e| Error::io(format!("chown {}", p.display()), std::io::Error::from(e)))
}

/// Delete what the backup does not have (delta restore). Paths are compared in manifest
/// terms, walking tablespaces through the mapped locations.
fn remove_extraneous(m: &Manifest, mapper: &PathMapper) -> Result<u64> {
    let wanted: HashSet<&str> = m.entries.iter().map(|e| e.path()).collect();
    let mut removed = 0;
    fn walk(
        dir: &Path,
        rel: &str,
        wanted: &HashSet<&str>,
        mapper: &PathMapper,
        removed: &mut u64,
    ) -> Result<()> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("read {}", dir.display()), e)),
        };
        for ent in rd {
            let ent = ent.map_err(|e| Error::io(format!("read {}", dir.display()), e))?;
            let name = ent.file_name().to_string_lossy().to_string();
            let child = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let path = ent.path();
            if !wanted.contains(child.as_str()) {
                remove_path(&path)
                    .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
                *removed += 1;
                continue;
            }
            let md = std::fs::symlink_metadata(&path)
                .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
            if md.file_type().is_symlink() {
                // Tablespace links: walk their mapped location.
                if let Some(oid) = child
                    .strip_prefix("pg_tblspc/")
                    .and_then(|o| o.parse::<u32>().ok())
                {
                    if let Some(loc) = mapper.tablespaces.get(&oid) {
                        walk(loc, &child, wanted, mapper, removed)?;
                    }
                }
            } else if md.is_dir() {
                walk(&path, &child, wanted, mapper, removed)?;
            }
        }
        Ok(())
    }
    walk(&mapper.pg_path, "", &wanted, mapper, &mut removed)?;
    Ok(removed)
}

struct RestoreShared {
    storage: Storage,
    runtime: tokio::runtime::Handle,
    manifest: Manifest,
    delta: bool,
    chown: bool,
    counters: Arc<crate::progress::Counters>,
    queue: Mutex<Vec<RestoreJob>>,
    paths: HashMap<String, PathBuf>,
}

/// A unit of restore work: one file, or small files stored next to each other in one pack,
/// fetched with one ranged read (over an object store, one request instead of hundreds).
enum RestoreJob {
    One(FileEntry),
    Group(Vec<FileEntry>),
}

/// Small files are grouped by the pack their first frame is in (frames of one file may
/// continue in the next pack, which the group's read covers too); larger files go alone,
/// largest first so all workers stay busy to the end. The queue is popped from the back.
fn plan_jobs(files: Vec<FileEntry>) -> Vec<RestoreJob> {
    const SMALL: u64 = 1 << 20;
    // A group's frames stay decoded in memory until its last file is written: bound both
    // what one read fetches and what the worker holds.
    const GROUP_BYTES: u64 = 8 << 20;
    const GROUP_RAW: u64 = 64 << 20;
    const GROUP_FILES: usize = 512;
    let mut alone = Vec::new();
    let mut small: Vec<(String, String, u64, FileEntry)> = Vec::new();
    for f in files {
        match f.chunks.iter().find(|c| !c.is_zero()) {
            Some(c) if f.size <= SMALL => {
                let owner = c.backup.clone().unwrap_or_default();
                small.push((owner, c.pack.clone().unwrap_or_default(), c.offset, f));
            }
            _ => alone.push(f),
        }
    }
    small.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
    let mut jobs: Vec<RestoreJob> = Vec::new();
    let mut group: Vec<FileEntry> = Vec::new();
    let mut key: Option<(String, String)> = None;
    let (mut bytes, mut raw) = (0u64, 0u64);
    for (owner, pack, _, f) in small {
        let k = Some((owner, pack));
        if !group.is_empty()
            && (k != key || bytes >= GROUP_BYTES || raw >= GROUP_RAW || group.len() >= GROUP_FILES)
        {
            jobs.push(RestoreJob::Group(std::mem::take(&mut group)));
            (bytes, raw) = (0, 0);
        }
        key = k;
        bytes += f.chunks.iter().map(|c| c.stored as u64).sum::<u64>();
        raw += f.size;
        group.push(f);
    }
    if !group.is_empty() {
        jobs.push(RestoreJob::Group(group));
    }
    alone.sort_by_key(|f| f.size);
    jobs.extend(alone.into_iter().map(RestoreJob::One));
    jobs
}

fn restore_worker(sh: &RestoreShared) -> Result<WorkerTally> {
    let mut resolver = OwnerResolver::default();
    let mut tally = WorkerTally::default();
    let mut reader = FrameReader::new(&sh.storage, &sh.manifest);
    loop {
        let Some(job) = sh.queue.lock().unwrap().pop() else {
            break;
        };
        let fetched_before = reader.fetched;
        match job {
            RestoreJob::One(f) => {
                let action = decide(sh, &f)?;
                restore_one(sh, &mut reader, &f, action, &mut tally, &mut resolver)?
            }
            RestoreJob::Group(files) => {
                // Decide every file first (a delta restore compares local blocks), then
                // fetch what all of them need with one merged read.
                let actions = files
                    .iter()
                    .map(|f| decide(sh, f))
                    .collect::<Result<Vec<_>>>()?;
                let chunks: Vec<&Chunk> = files
                    .iter()
                    .zip(&actions)
                    .flat_map(|(f, a)| a.needed(f))
                    .filter(|c| !c.is_zero())
                    .collect();
                reader.pin();
                if !chunks.is_empty() {
                    sh.runtime
                        .block_on(reader.load(&chunks, &files[0].path))
                        .map_err(|e| Error::integrity(e.to_string()))?;
                }
                for (f, action) in files.iter().zip(actions) {
                    restore_one(sh, &mut reader, f, action, &mut tally, &mut resolver)?;
                }
                reader.unpin();
            }
        }
        tally.bytes_fetched += reader.fetched - fetched_before;
    }
    Ok(tally)
}

/// What restoring one file takes, decided from the local file alone (nothing fetched yet).
enum Action {
    /// The local file already is the backed-up file.
    Keep,
    /// Write the whole file.
    Write,
    /// Write these extents (the blocks that differ) in place, then truncate to size.
    Patch(Vec<(u64, Chunk)>),
}

impl Action {
    /// The extents this action reads from the repository.
    fn needed<'a>(&'a self, f: &'a FileEntry) -> Box<dyn Iterator<Item = &'a Chunk> + 'a> {
        match self {
            Action::Keep => Box::new(std::iter::empty()),
            Action::Write => Box::new(f.chunks.iter()),
            Action::Patch(extents) => Box::new(extents.iter().map(|(_, c)| c)),
        }
    }
}

fn decide(sh: &RestoreShared, f: &FileEntry) -> Result<Action> {
    let path = &sh.paths[&f.path];
    if !sh.delta {
        Ok(Action::Write)
    } else if f.block_size > 0 {
        delta_plan(f, path)
    } else if local_matches(path, f)? {
        Ok(Action::Keep)
    } else {
        Ok(Action::Write)
    }
}

fn restore_one(
    sh: &RestoreShared,
    reader: &mut FrameReader,
    f: &FileEntry,
    action: Action,
    tally: &mut WorkerTally,
    resolver: &mut OwnerResolver,
) -> Result<()> {
    let path = &sh.paths[&f.path];
    match action {
        Action::Keep => tally.kept += 1,
        Action::Patch(extents) => {
            tally.patched += 1;
            tally.bytes_written += patch_file(sh, reader, f, path, &extents)?;
        }
        Action::Write => {
            write_file(sh, reader, f, path)?;
            tally.written += 1;
            tally.bytes_written += f.size;
        }
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(f.owner.mode))
        .map_err(|e| Error::io(format!("chmod {}", path.display()), e))?;
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(f.mtime.max(0) as u64);
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|fh| fh.set_modified(mtime))
        .map_err(|e| Error::io(format!("set mtime of {}", path.display()), e))?;
    if sh.chown {
        set_owner(path, &f.owner, resolver)?;
    }
    sh.counters.files.fetch_add(1, Ordering::Relaxed);
    sh.counters.bytes.fetch_add(f.size, Ordering::Relaxed);
    Ok(())
}

/// Delta restore of a file without a block map: does the local file already hold exactly
/// this content?
fn local_matches(path: &Path, f: &FileEntry) -> Result<bool> {
    let mut fh = match std::fs::File::open(path) {
        Ok(fh) => fh,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    let md = fh
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if !md.is_file() || md.len() != f.size {
        return Ok(false);
    }
    Ok(check_reader(f, &mut fh, path).is_ok())
}

/// Write a whole file from its extents.
fn write_file(
    sh: &RestoreShared,
    reader: &mut FrameReader,
    f: &FileEntry,
    path: &Path,
) -> Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(path)
            .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
    }
    let mut out = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(path)
            .map_err(|e| Error::io(format!("create {}", path.display()), e))?,
    );
    let mut check = ContentCheck::new(f);
    for_each_extent(&sh.runtime, reader, &extents_of(f), &f.path, |_, data| {
        check.update(data);
        out.write_all(data)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    })?;
    let out = out
        .into_inner()
        .map_err(|e| Error::io(format!("write {}", path.display()), e.into_error()))?;
    out.sync_all()
        .map_err(|e| Error::io(format!("sync {}", path.display()), e))?;
    check.finish()
}

/// Delta restore of a file with a block map: hash the local blocks and find the extents
/// holding blocks that differ. A missing local file (or a directory in its place) is
/// written whole.
fn delta_plan(f: &FileEntry, path: &Path) -> Result<Action> {
    let fh = match std::fs::File::open(path) {
        Ok(fh) if fh.metadata().is_ok_and(|m| m.is_file()) => fh,
        Ok(_) => return Ok(Action::Write),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Action::Write),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    let local_len = fh
        .metadata()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
        .len();
    let bs = f.block_size as u64;
    let mut differing: Vec<(u64, u64)> = Vec::new(); // (offset, len) runs
    let mut buf = vec![0u8; (1 << 20) / bs as usize * bs as usize];
    let mut offset = 0u64;
    let mut check = ContentCheck::new(f);
    while offset < f.size {
        let want = (f.size - offset).min(buf.len() as u64) as usize;
        let have = local_len.saturating_sub(offset).min(want as u64) as usize;
        let n = read_full_at(&fh, &mut buf[..have], offset)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        check.update(&buf[..n]);
        for (i, block) in buf[..want].chunks(bs as usize).enumerate() {
            let block_off = offset + i as u64 * bs;
            let index = (block_off / bs) as usize;
            let local_ok = block_off + block.len() as u64 <= offset + n as u64;
            if !(local_ok && f.block_hash(index) == Some(block_hash(block))) {
                match differing.last_mut() {
                    Some((o, l)) if *o + *l == block_off => *l += block.len() as u64,
                    _ => differing.push((block_off, block.len() as u64)),
                }
            }
        }
        offset += want as u64;
    }
    if differing.is_empty() && local_len == f.size && check.finish().is_ok() {
        return Ok(Action::Keep);
    }
    // The extents covering the differing runs, cut to them.
    let mut starts = Vec::with_capacity(f.chunks.len());
    let mut pos = 0u64;
    for c in &f.chunks {
        starts.push(pos);
        pos += c.raw as u64;
    }
    let mut needed: Vec<(u64, Chunk)> = Vec::new();
    for (off, len) in &differing {
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
    Ok(Action::Patch(needed))
}

/// Write the differing extents in place, truncate, and prove the result is the backed-up
/// file. Returns the bytes written (at least 1: the file was touched).
fn patch_file(
    sh: &RestoreShared,
    reader: &mut FrameReader,
    f: &FileEntry,
    path: &Path,
    needed: &[(u64, Chunk)],
) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut fh = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let mut written = 0u64;
    for_each_extent(&sh.runtime, reader, needed, &f.path, |at, data| {
        written += data.len() as u64;
        fh.write_all_at(data, at)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    })?;
    fh.set_len(f.size)
        .map_err(|e| Error::io(format!("truncate {}", path.display()), e))?;
    fh.sync_all()
        .map_err(|e| Error::io(format!("sync {}", path.display()), e))?;
    use std::io::Seek;
    fh.seek(std::io::SeekFrom::Start(0))
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    check_reader(f, &mut fh, path)?;
    Ok(written.max(1))
}

/// Quote a value for postgresql.conf.
fn conf_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

const RECOVERY_KEYS: &[&str] = &[
    "restore_command",
    "recovery_target",
    "recovery_target_time",
    "recovery_target_lsn",
    "recovery_target_xid",
    "recovery_target_name",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_timeline",
];
const MARK: &str = "# pgstrata restore:";

fn write_recovery_files(
    pg_path: &Path,
    m: &Manifest,
    o: &RestoreOptions,
    owner: Option<&Owner>,
    resolver: &mut OwnerResolver,
) -> Result<()> {
    let write = |name: &str, content: &str, resolver: &mut OwnerResolver| -> Result<()> {
        let p = pg_path.join(name);
        std::fs::write(&p, content).map_err(|e| Error::io(format!("write {}", p.display()), e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("chmod {}", p.display()), e))?;
        if let (Some(owner), true) = (owner, running_as_root()) {
            set_owner(&p, owner, resolver)?;
        }
        Ok(())
    };
    write("backup_label", &m.backup_label, resolver)?;
    for stale in ["tablespace_map", "recovery.signal", "standby.signal"] {
        let _ = std::fs::remove_file(pg_path.join(stale));
    }
    if o.recovery_type == RecoveryType::None {
        return Ok(());
    }
    let auto = pg_path.join("postgresql.auto.conf");
    let existing = std::fs::read_to_string(&auto).unwrap_or_default();
    let mut conf: Vec<String> = existing
        .lines()
        .filter(|l| {
            let key = l.split('=').next().unwrap_or("").trim();
            !l.starts_with(MARK) && !RECOVERY_KEYS.contains(&key)
        })
        .map(str::to_string)
        .collect();
    conf.push(format!("{MARK} recovery settings for backup {}", m.label));
    conf.push(format!(
        "restore_command = {}",
        conf_quote(&format!("{} archive-get %f \"%p\"", o.archive_get_command))
    ));
    let target = o.target.clone().unwrap_or_default();
    match o.recovery_type {
        RecoveryType::Immediate => conf.push("recovery_target = 'immediate'".into()),
        RecoveryType::Time => conf.push(format!("recovery_target_time = {}", conf_quote(&target))),
        RecoveryType::Lsn => conf.push(format!("recovery_target_lsn = {}", conf_quote(&target))),
        RecoveryType::Xid => conf.push(format!("recovery_target_xid = {}", conf_quote(&target))),
        RecoveryType::Name => conf.push(format!("recovery_target_name = {}", conf_quote(&target))),
        _ => {}
    }
    if o.recovery_type.needs_target() && o.target_exclusive {
        conf.push("recovery_target_inclusive = false".into());
    }
    if let Some(a) = &o.target_action {
        if o.recovery_type != RecoveryType::Standby {
            conf.push(format!("recovery_target_action = {}", conf_quote(a)));
        }
    }
    if let Some(t) = &o.target_timeline {
        conf.push(format!("recovery_target_timeline = {}", conf_quote(t)));
    }
    if o.archive_off {
        conf.push("archive_mode = 'off'".into());
    }
    write("postgresql.auto.conf", &(conf.join("\n") + "\n"), resolver)?;
    let signal = if o.recovery_type == RecoveryType::Standby {
        "standby.signal"
    } else {
        "recovery.signal"
    };
    write(signal, "", resolver)?;
    Ok(())
}
