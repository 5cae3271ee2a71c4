//! Rebuilding a data directory from one backup's manifest, and writing the recovery
//! settings that bring it to a consistent state (or to a target) from the archive: the
//! work of the `restore` command (`commands/restore.rs`, which is its surface) and of
//! `restore-test`, which restores into a scratch directory.
//!
//! Every backup is logically full, so restore reads one manifest and fetches what it points
//! at. Each file's BLAKE3 is checked as it is written; a mismatch stops the restore naming
//! the file. With `--delta`, files whose size and hash already match are left alone and
//! files the backup does not have are removed, so the result equals a fresh restore.
//!
//! A restore is a plan, then its execution:
//!
//! - [`plan`]: choose the backup, map tablespaces, check that the targets may be written.
//!   Nothing is written; `--dry-run` prints the plan and stops.
//!   The workers' jobs are made from the manifest as it is read a last time
//!   ([`crate::content::with_streamed_jobs`]): never decoded whole, and from format 4
//!   fetched a part at a time, so memory follows the files in flight.
//! - [`tree`]: the targets as directory handles; every write is relative to one and never
//!   follows a link, so neither the repository nor the target's owner can turn a root
//!   restore against its host.
//! - [`write`]: the workers (on [`crate::pool`]): keep, patch or write each file, checked
//!   against the recorded hashes.
//! - [`recovery`]: `backup_label`, recovery settings and the signal file.
//! - [`selective`]: the databases `--db-include`/`--db-exclude` leave out, whose files are
//!   written as sparse zeroed files, nothing fetched.
//!
//! Order makes an interrupted restore safe to rerun with `--delta`, and never startable by
//! mistake: `global/pg_control` is removed first (delta) and written last, after every
//! other file and directory is made durable (one `syncfs` per target filesystem, not an
//! fsync per file: see [`tree::TargetTree::sync_filesystems`]); `PG_VERSION` is written first, so a directory left
//! by an interrupted restore is recognised as a data directory by `--delta`.

mod links;
mod pieces;
mod plan;
mod recovery;
mod selective;
mod tree;
mod write;

pub use plan::RestorePlan;
pub(crate) use plan::WriteMode;
pub(crate) use recovery::restore_command;
pub(crate) use tree::dir_is_empty;

use crate::owner::{running_as_root, OwnerResolver};
use crate::progress::{human_bytes, Progress};
use crate::{open_stanza, Error, Result, Settings};
use pgstrata_repo::manifest::{Entry, FileEntry};
use pgstrata_repo::Storage;
use std::collections::HashSet;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tree::{list, remove_at, set_attributes, DirHandle, EntryKind, ParentCache, TargetTree};
use write::{Shared, Worker};

// Names as given to `--type` of restore.
pgstrata_repo::named! {
    pub enum RecoveryType {
        /// Replay all archived WAL.
        Default = "default",
        /// Stop as soon as the backup is consistent.
        Immediate = "immediate",
        Time = "time",
        Lsn = "lsn",
        Xid = "xid",
        Name = "name",
        /// Start as a standby that keeps fetching WAL from the archive.
        Standby = "standby",
        /// Write no recovery settings at all.
        None = "none",
        /// Keep the target's recovery settings and signal files as they are (a delta
        /// restore of a standby stays a standby).
        Preserve = "preserve",
    }
}

impl RecoveryType {
    pub(crate) fn needs_target(self) -> bool {
        matches!(
            self,
            RecoveryType::Time | RecoveryType::Lsn | RecoveryType::Xid | RecoveryType::Name
        )
    }
}

// Names as given to `--target-action` (PostgreSQL's values).
pgstrata_repo::named! {
    /// What the server does when it reaches the recovery target (`recovery_target_action`).
    pub enum TargetAction { Pause = "pause", Promote = "promote", Shutdown = "shutdown" }
}

#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub set: Option<String>,
    pub delta: bool,
    pub force: bool,
    /// Print the plan and stop: nothing is written.
    pub dry_run: bool,
    pub tablespace_map: Vec<(u32, PathBuf)>,
    /// Restore every tablespace not in `tablespace_map` into `<this>/<oid>` instead of
    /// its source location (`--tablespace-map-all`; restore-test: the scratch directory).
    pub tablespace_root: Option<PathBuf>,
    /// Make every link of the data directory the backup recorded a link again
    /// (`--link-all`; by default they are restored as what they pointed to).
    pub link_all: bool,
    /// Restore these links (or directories) of the data directory as links to these
    /// directories (`--link-map=NAME=DIR`).
    pub link_map: Vec<(String, PathBuf)>,
    pub recovery_type: RecoveryType,
    pub target: Option<String>,
    pub target_action: Option<TargetAction>,
    pub target_timeline: Option<String>,
    pub target_exclusive: bool,
    /// Write `archive_mode = off` so the restored cluster does not archive into the
    /// repository of its source (test restores, copies for analysis).
    pub archive_off: bool,
    /// The command line restore_command runs (pgstrata with the options that find the
    /// repository), without the `archive-get %f "%p"` part.
    pub archive_get_command: String,
    /// Selective restore: only these databases (and the system ones) are restored.
    pub db_include: Vec<String>,
    /// Selective restore: these databases' files are zeroed, not fetched.
    pub db_exclude: Vec<String>,
    /// `recovery-option=KEY=VALUE`: more settings for postgresql.auto.conf, in order; one
    /// of pgstrata's own keys given here replaces pgstrata's value.
    pub recovery_options: Vec<(String, String)>,
    /// `--instant`: large relation files are served on demand (`crate::instant`).
    pub instant: bool,
}

#[derive(Debug, Default)]
pub struct RestoreReport {
    pub label: String,
    /// What the workers wrote and fetched.
    pub counts: RestoreCounts,
    pub removed: u64,
    /// Major version and page checksums of the cluster backed up.
    pub pg_version: u32,
    pub data_checksums: bool,
    /// Databases left out by `--db-include`/`--db-exclude` (their files zeroed).
    pub excluded_databases: Vec<String>,
    /// Bytes of the backup's files.
    pub backup_bytes: u64,
}

/// What restore's workers did (each keeps its own; the report has their sum).
#[derive(Debug, Default)]
pub struct RestoreCounts {
    /// Files written whole.
    pub files_written: u64,
    /// Files (delta) whose differing blocks were rewritten in place.
    pub files_patched: u64,
    /// Files (delta) already identical.
    pub files_kept: u64,
    /// Relation files of databases left out (`--db-include`, `--db-exclude`), written as
    /// sparse zeroed files.
    pub files_zeroed: u64,
    /// Instant restore: relation files left to be served on demand.
    pub files_deferred: u64,
    pub bytes_written: u64,
    /// Bytes read from the repository.
    pub bytes_fetched: u64,
    /// Instant restore: bytes of the repository the deferred files' frames hold (each
    /// frame once), which a full restore would have read.
    pub bytes_deferred: u64,
}

impl RestoreCounts {
    fn add(&mut self, o: RestoreCounts) {
        crate::add_fields!(self += o; files_written, files_patched, files_kept, files_zeroed, files_deferred, bytes_written, bytes_fetched, bytes_deferred);
    }
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

/// Choose the backup and plan the restore; nothing is written. `restore --dry-run` prints
/// this plan and the recovery settings.
pub async fn plan(s: &Settings, o: &RestoreOptions) -> Result<(RestorePlan, Vec<String>)> {
    if o.recovery_type.needs_target() && o.target.is_none() {
        return Err(Error::config(
            format!("--type={:?} needs --target", o.recovery_type).to_lowercase(),
        ));
    }
    let pg_path = s.pg_path()?.to_path_buf();
    let (storage, _stanza) = open_stanza(s).await?;
    let m = plan::choose_backup(&storage, s, o).await?;
    let plan = RestorePlan::new(m, &pg_path, o).await?;
    plan.check_targets()?;
    let settings = match recovery::signal_file(o.recovery_type) {
        Some(signal) => {
            let mut lines = recovery::recovery_settings(&plan.header().label, o);
            lines.push(format!("(and {signal})"));
            lines
        }
        None => vec![],
    };
    Ok((plan, settings))
}

pub async fn restore(s: &Settings, o: &RestoreOptions) -> Result<RestoreReport> {
    let started = Instant::now();
    let (plan, _) = plan(s, o).await?;
    // With the stanza's key, when it is encrypted (opened once per process).
    let (storage, _) = open_stanza(s).await?;
    log::info!(
        "restoring backup {} ({} files, {}) into {}",
        plan.header().label,
        plan.manifest.files().0,
        human_bytes(plan.manifest.files().1),
        plan.pg_path.display()
    );
    let runtime = tokio::runtime::Handle::current();
    let (o, workers) = (o.clone(), s.process_max.get());
    let report =
        tokio::task::spawn_blocking(move || execute(&plan, &storage, runtime, &o, workers))
            .await
            .map_err(|e| Error::new(crate::ErrorKind::Io, format!("restore stopped: {e}")))??;
    log::info!(
        "restore of {} complete: {} files written, {} patched, {} unchanged, {} zeroed, {} removed; {} written, {} fetched, {:.1}s",
        report.label,
        report.counts.files_written,
        report.counts.files_patched,
        report.counts.files_kept,
        report.counts.files_zeroed,
        report.removed,
        human_bytes(report.counts.bytes_written),
        human_bytes(report.counts.bytes_fetched),
        started.elapsed().as_secs_f64()
    );
    Ok(report)
}

/// Carry out a checked plan (blocking: runs the workers).
fn execute(
    plan: &RestorePlan,
    storage: &Storage,
    runtime: tokio::runtime::Handle,
    o: &RestoreOptions,
    workers: usize,
) -> Result<RestoreReport> {
    let m = plan.header();
    let mut report = RestoreReport {
        label: m.label.clone(),
        pg_version: m.server_version_num / 10000,
        data_checksums: m.data_checksums,
        excluded_databases: plan
            .selection
            .excluded
            .iter()
            .map(|d| d.name.clone())
            .collect(),
        ..Default::default()
    };
    let tree = open_targets(plan)?;
    // --type=preserve: the target's recovery settings, before the backup's copy of the
    // file replaces them.
    let preserved = match o.recovery_type {
        RecoveryType::Preserve => recovery::read_auto_conf(&tree, &mut ParentCache::default())?,
        _ => None,
    };
    report.removed += prepare_targets(plan, &tree, &runtime, o.recovery_type)?;
    let chown = running_as_root();
    let deferring = o
        .instant
        .then(|| crate::instant::Deferring::prepare(&plan.pg_path))
        .transpose()?;
    let (files, bytes) = plan.manifest.files();
    report.backup_bytes = bytes;
    let limit = crate::progress::repository_limit(storage);
    let progress = Progress::start("restore", bytes, files, limit);
    let counters = progress.counters.clone();
    let sh = Shared {
        storage,
        runtime,
        manifest: m,
        tree: &tree,
        delta: plan.mode == WriteMode::Delta,
        selection: &plan.selection,
        chown,
        instant: deferring.as_ref(),
        counters: &counters,
    };
    let mut tallies = Vec::new();
    // PG_VERSION first, before any directory: from here on the target is a data directory
    // to --delta.
    if let Some(f) = &plan.first {
        let mut w = Worker::new(&sh);
        write::restore_file(&sh, &mut w, f)?;
        tree.root.sync()?;
        tallies.push(w.finish());
    }
    // Then the directories and links: a restore killed before PG_VERSION leaves nothing but
    // an empty directory, which a fresh restore or --delta takes again.
    let mut layout = Layout {
        plan,
        tree: &tree,
        owners: chown.then(OwnerResolver::default),
        cache: ParentCache::default(),
    };
    layout.make_dirs_and_links()?;
    let result = write_files(&sh, plan, storage, workers);
    progress.finish();
    tallies.extend(result.map_err(|mut e| {
        if e.is_damage() {
            e.message = format!("restore stopped: {}", e.message);
        }
        e
    })?);

    layout.finish_dirs()?;
    links::link_files(&tree, &plan.links, &mut layout.cache)?;
    let root_owner = plan.manifest.layout().iter().find_map(|e| match e {
        Entry::Dir(d) if d.path.is_empty() => Some(d.owner.clone()),
        _ => None,
    });
    let root_ids = root_owner.and_then(|owner| layout.ids(&owner));
    recovery::write_recovery_files(&tree, m, o, root_ids, preserved.as_deref())?;
    if let Some(d) = &deferring {
        d.finish(&m.label, &plan.pg_path)?;
    }
    // Everything but pg_control made durable at once (files are not fsynced one by one),
    // then pg_control, under a temporary name fsynced and renamed into place.
    tree.sync_filesystems()?;
    if let Some(f) = &plan.control {
        let mut w = Worker::new(&sh);
        write::write_control(&sh, &mut w, f)?;
        tallies.push(w.finish());
    }
    for t in tallies {
        report.counts.add(t);
    }
    Ok(report)
}

/// Restore every file of the plan but the first (`PG_VERSION`) and `pg_control`, on
/// `workers` threads: the tallies of the workers.
fn write_files(
    sh: &Shared,
    plan: &RestorePlan,
    storage: &Storage,
    workers: usize,
) -> Result<Vec<RestoreCounts>> {
    crate::content::with_streamed_jobs(
        |files| read_files(&sh.runtime, &plan.manifest, files),
        |f| f,
        |window| {
            // The extents of small files, which are fetched in groups by pack (format 2+
            // stores the maps of files over 8 blocks apart). A larger file's map is
            // loaded by the worker that restores it.
            let mut small: Vec<&mut FileEntry> = window
                .iter_mut()
                .filter(|f| f.size <= crate::content::SMALL_FILE)
                .map(|f| &mut **f)
                .collect();
            Ok(sh
                .runtime
                .block_on(plan.header().load_maps_into(storage, &mut small))?)
        },
        |jobs| {
            crate::pool::run(
                workers,
                jobs,
                |_| Worker::new(sh),
                |w, job| write::run_job(sh, w, &job?),
                |w| Ok(w.finish()),
            )
        },
    )
}

/// Send every file of `manifest` but `PG_VERSION` and `global/pg_control` (written first
/// and last, on their own) to `files`, in order.
fn read_files(
    runtime: &tokio::runtime::Handle,
    manifest: &pgstrata_repo::manifest::StoredManifest,
    files: std::sync::mpsc::SyncSender<Box<FileEntry>>,
) -> Result<()> {
    runtime.block_on(manifest.for_each_entry::<Error>(|e| match e {
        Entry::File(f) if &*f.path != plan::PG_VERSION && &*f.path != plan::PG_CONTROL => {
            // The jobs are gone: the workers stopped on an error, which they report.
            files
                .send(f)
                .map_err(|_| Error::new(crate::ErrorKind::Io, "restore stopped"))
        }
        _ => Ok(()),
    }))
}

/// Create the data directory and tablespace locations if absent, and open them.
fn open_targets(plan: &RestorePlan) -> Result<TargetTree> {
    // The target itself private: its mode and owner are set from the backup later.
    let mkdir = |p: &Path| {
        tree::make_passable_parents(p)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(p)
            .map_err(|e| Error::io(format!("create {}", p.display()), e))
    };
    mkdir(&plan.pg_path)?;
    let mut tree = TargetTree::new(DirHandle::open(&plan.pg_path)?);
    for t in &plan.tablespaces {
        mkdir(&t.location)?;
        tree.add_tablespace(t.oid, DirHandle::open(&t.location)?);
    }
    for l in plan.links.iter().filter(|l| l.dir) {
        mkdir(&l.location)?;
        tree.add_linked_dir(&l.path, DirHandle::open(&l.location)?);
    }
    Ok(tree)
}

/// Make the targets unstartable, then empty them (`--force`) or remove what the backup
/// lacks (`--delta`). Returns how many entries were removed.
fn prepare_targets(
    plan: &RestorePlan,
    tree: &TargetTree,
    runtime: &tokio::runtime::Handle,
    recovery_type: RecoveryType,
) -> Result<u64> {
    let mut cache = ParentCache::default();
    if plan.mode == WriteMode::Fresh {
        return Ok(0);
    }
    tree.remove(plan::PG_CONTROL, &mut cache)?;
    if let Ok(global) = tree.root.child("global") {
        global.sync()?;
    }
    let mut removed = 0;
    if plan.mode == WriteMode::Force {
        // PG_VERSION stays until it is rewritten (first): the directory must remain
        // recognisable as a data directory however early this restore is interrupted.
        let names =
            list(tree.root.fd.as_fd()).map_err(|e| tree::io_err("read", &tree.root.path, e))?;
        for name in names.into_iter().filter(|n| n != plan::PG_VERSION) {
            remove_at(tree.root.fd.as_fd(), &name)
                .map_err(|e| tree::io_err("remove", &tree.root.path.join(&name), e))?;
            removed += 1;
        }
        for t in &plan.tablespaces {
            let loc = tree.tablespace(t.oid).expect("opened");
            for v in &t.version_dirs {
                remove_at(loc.fd.as_fd(), v)
                    .map_err(|e| tree::io_err("remove", &loc.path.join(v), e))?;
            }
        }
        for l in plan.links.iter().filter(|l| l.dir) {
            let target = tree.linked_dir(&l.path).expect("opened");
            let names =
                list(target.fd.as_fd()).map_err(|e| tree::io_err("read", &target.path, e))?;
            for name in names {
                remove_at(target.fd.as_fd(), &name)
                    .map_err(|e| tree::io_err("remove", &target.path.join(&name), e))?;
                removed += 1;
            }
        }
    } else {
        // --type=preserve keeps the target's signal files (its settings are in
        // postgresql.auto.conf, which the backup has and which is kept as the target has it).
        let keep: &[&str] = match recovery_type {
            RecoveryType::Preserve => &recovery::SIGNAL_FILES,
            _ => &[],
        };
        removed += remove_extraneous(plan, tree, runtime, keep)?;
    }
    tree.root.sync()?;
    Ok(removed)
}

/// Delete what the backup does not have (delta restore), walking through handles. In a
/// tablespace location only this version's directory is walked: the rest belongs to
/// other major versions (pg_upgrade) and is left alone.
fn remove_extraneous(
    plan: &RestorePlan,
    tree: &TargetTree,
    runtime: &tokio::runtime::Handle,
    keep: &[&str],
) -> Result<u64> {
    let mut wanted = Wanted::default();
    keep.iter().for_each(|k| wanted.insert(k));
    runtime.block_on(plan.manifest.for_each_entry::<Error>(|e| {
        wanted.insert(e.path());
        Ok(())
    }))?;
    let mut removed = 0;
    walk_extraneous(plan, tree, &tree.root, "", &wanted, &mut removed)?;
    Ok(removed)
}

fn walk_extraneous(
    plan: &RestorePlan,
    tree: &TargetTree,
    dir: &DirHandle,
    rel: &str,
    wanted: &Wanted,
    removed: &mut u64,
) -> Result<()> {
    let names = list(dir.fd.as_fd()).map_err(|e| tree::io_err("read", &dir.path, e))?;
    for name in names {
        let child = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if !wanted.contains(&child) {
            remove_at(dir.fd.as_fd(), &name)
                .map_err(|e| tree::io_err("remove", &dir.path.join(&name), e))?;
            *removed += 1;
            continue;
        }
        let tablespace = child
            .strip_prefix("pg_tblspc/")
            .and_then(|o| o.parse::<u32>().ok())
            .and_then(|oid| plan.tablespaces.iter().find(|t| t.oid == oid));
        if let Some(target) = tree.linked_dir(&child) {
            walk_extraneous(plan, tree, target, &child, wanted, removed)?;
        } else if let (Some(t), Some(loc)) =
            (tablespace, tablespace.and_then(|t| tree.tablespace(t.oid)))
        {
            for v in &t.version_dirs {
                if let Ok(sub) = loc.child(v) {
                    walk_extraneous(plan, tree, &sub, &format!("{child}/{v}"), wanted, removed)?;
                }
            }
        } else if let Ok(sub) = dir.child(&name) {
            // A directory (a link or a file is replaced later, when its entry is restored).
            walk_extraneous(plan, tree, &sub, &child, wanted, removed)?;
        }
    }
    Ok(())
}

/// The paths of a backup, as a delta restore looks them up: by a 128-bit hash, 16 bytes
/// a path whatever its length (a chance collision, which would keep one stray file, is
/// about n²/2¹²⁹: 10⁻²⁶ at a million paths).
#[derive(Default)]
struct Wanted(HashSet<u128>);

impl Wanted {
    fn insert(&mut self, path: &str) {
        self.0.insert(xxhash_rust::xxh3::xxh3_128(path.as_bytes()));
    }

    fn contains(&self, path: &str) -> bool {
        self.0
            .contains(&xxhash_rust::xxh3::xxh3_128(path.as_bytes()))
    }
}

/// The directory layer of a restore: directories and tablespace links before the files,
/// their modes, owners and fsyncs after them.
struct Layout<'a> {
    plan: &'a RestorePlan,
    tree: &'a TargetTree,
    /// Running as root: restore recorded owners.
    owners: Option<OwnerResolver>,
    cache: ParentCache,
}

impl Layout<'_> {
    fn ids(&mut self, owner: &pgstrata_repo::manifest::Owner) -> Option<(u32, u32)> {
        self.owners.as_mut().map(|r| r.ids(owner))
    }

    /// Directories (replacing links or files in their place) and tablespace links, parents
    /// first (manifest order).
    fn make_dirs_and_links(&mut self) -> Result<()> {
        let (plan, tree) = (self.plan, self.tree);
        for e in plan.manifest.layout() {
            match e {
                Entry::Dir(d) if tree.linked_dir(&d.path).is_some() => {
                    self.make_link(&d.path, &d.owner)?
                }
                Entry::Dir(d) => tree.ensure_dir(&d.path, &mut self.cache)?,
                Entry::Link(l) => {
                    let (path, owner) = (&l.path, &l.owner);
                    let oid = path
                        .strip_prefix("pg_tblspc/")
                        .and_then(|o| o.parse::<u32>().ok());
                    let Some(t) = plan.tablespaces.iter().find(|t| Some(t.oid) == oid) else {
                        return Err(Error::integrity(format!(
                            "backup {}: link entry {path} has no tablespace record",
                            plan.header().label
                        )));
                    };
                    tree.ensure_link(path, &t.location, &mut self.cache)?;
                    if let Some(ids) = self.ids(owner) {
                        tree.chown_link(path, ids, &mut self.cache)?;
                        let loc = tree.tablespace(t.oid).expect("opened");
                        set_attributes(
                            loc.fd.as_fd(),
                            EntryKind::Dir,
                            0o700,
                            Some(ids),
                            None,
                            &loc.path,
                        )?;
                    }
                }
                Entry::File(_) => {}
            }
        }
        Ok(())
    }

    /// Directory `path` of the data directory, restored as a link to its target.
    fn make_link(&mut self, path: &str, owner: &pgstrata_repo::manifest::Owner) -> Result<()> {
        let (plan, tree) = (self.plan, self.tree);
        let l = plan
            .links
            .iter()
            .find(|l| l.path == path)
            .expect("a linked directory");
        tree.ensure_link(path, &l.link_text, &mut self.cache)?;
        if let Some(ids) = self.ids(owner) {
            tree.chown_link(path, ids, &mut self.cache)?;
        }
        Ok(())
    }

    /// Directory modes and owners last (a 0500 directory would block writing into it), and
    /// the targets' parent directories fsynced, so a target created by this restore stays.
    /// The entries inside the targets are made durable by `sync_filesystems`.
    fn finish_dirs(&mut self) -> Result<()> {
        let (plan, tree) = (self.plan, self.tree);
        for e in plan.manifest.layout().iter().rev() {
            if let Entry::Dir(d) = e {
                let (path, owner) = (&d.path, &d.owner);
                let dir = match tree.linked_dir(path) {
                    Some(target) => DirHandle::open(&target.path)?,
                    None => tree.open_dir(path, &mut self.cache)?,
                };
                let ids = self.ids(owner);
                set_attributes(
                    dir.fd.as_fd(),
                    EntryKind::Dir,
                    owner.mode,
                    ids,
                    None,
                    &dir.path,
                )?;
            }
        }
        let targets = std::iter::once(&plan.pg_path)
            .chain(plan.tablespaces.iter().map(|t| &t.location))
            .chain(plan.links.iter().filter(|l| l.dir).map(|l| &l.location));
        for p in targets {
            if let Some(parent) = p.parent() {
                DirHandle::open(parent)?.sync()?;
            }
        }
        Ok(())
    }
}
