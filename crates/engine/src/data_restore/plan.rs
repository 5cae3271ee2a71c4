//! The restore plan: which backup, where each part of it goes, whether the targets may be
//! written, and what the workers will do. Everything here is decided before anything is
//! written, and the plan can be printed (`restore --dry-run`) and tested without a
//! cluster. The workers' jobs themselves are made as the manifest is read again
//! ([`crate::content::with_streamed_jobs`]).
//!
//! Targets must prove they are what restore is about to overwrite. A non-empty data
//! directory is written only with `--delta` or `--force` and only when it holds a
//! `PG_VERSION` (pgBackRest refuses the same). A tablespace location comes from the backup,
//! that is from the *source* host: restoring a copy on the source's own host would patch or
//! empty the running source's tablespaces. So a location that is not empty is written only
//! when the operator mapped it (`--tablespace-map`) or when this data directory's own
//! `pg_tblspc/<oid>` already points at it (an in-place restore of the cluster itself); and
//! only this major version's `PG_<major>_<catver>` directory in it is ever pruned.

use super::tree::dir_is_empty;
use super::{RecoveryType, RestoreOptions};
use crate::content::{FileJob, SMALL_FILE};
use crate::progress::human_bytes;
use crate::{Error, Result, Settings};
use pgstrata_repo::manifest::{list_backups, Entry, FileEntry, Manifest, StoredManifest};
use pgstrata_repo::Storage;
use std::fmt;
use std::path::{Path, PathBuf};

/// How the targets are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// Into empty (or absent) directories.
    Fresh,
    /// Over an existing data directory: compare local files block by block, rewrite what
    /// differs, remove what the backup lacks.
    Delta,
    /// Over an existing data directory: remove everything first.
    Force,
}

/// Where one tablespace is restored, and why there.
#[derive(Debug, Clone)]
pub(crate) struct TablespaceTarget {
    pub oid: u32,
    pub location: PathBuf,
    /// Given with `--tablespace-map` (otherwise the source's location).
    pub mapped: bool,
    /// This major version's directories in the location (`PG_<major>_<catver>`): the only
    /// part of a location restore writes or prunes.
    pub version_dirs: Vec<String>,
}

/// A unit of restore work: one file, or small files stored next to each other in one pack,
/// fetched with one ranged read (over an object store, one request instead of hundreds).
pub(crate) type RestoreJob = FileJob<Box<FileEntry>>;

/// Everything restore will do, decided before it writes anything.
///
/// The files are not held: the workers' jobs are made from the manifest as it is read
/// again ([`crate::content::with_streamed_jobs`]), so a restore's memory follows what is
/// in flight, not the number of files. What the plan keeps is what the directory layer
/// and the order need.
#[derive(Debug)]
pub struct RestorePlan {
    pub(crate) manifest: StoredManifest,
    pub(crate) pg_path: PathBuf,
    pub(crate) mode: WriteMode,
    pub(crate) tablespaces: Vec<TablespaceTarget>,
    /// The data directory's links restored as links (`--link-all`, `--link-map`).
    pub(crate) links: Vec<super::links::LinkTarget>,
    /// Written first, alone: a directory holding it is a data directory to `--delta`, so a
    /// restore interrupted at any later point can be resumed with `--delta`.
    pub(crate) first: Option<FileEntry>,
    /// Written last, after everything else is durable: while it is missing the directory
    /// cannot be started by mistake.
    pub(crate) control: Option<FileEntry>,
    /// Databases left out (`--db-include`, `--db-exclude`): their files written zeroed.
    pub(crate) selection: super::selective::Selection,
}

pub(super) const PG_VERSION: &str = "PG_VERSION";
pub(super) const PG_CONTROL: &str = "global/pg_control";
/// The files restore writes on their own, first and last: kept as the manifest is checked.
const KEPT: [&str; 2] = [PG_VERSION, PG_CONTROL];

impl RestorePlan {
    /// Plan the restore of `manifest` into `pg_path`, from what checking it kept (a
    /// selective restore reads the entries once more, to count what it leaves out).
    pub async fn new(
        manifest: StoredManifest,
        pg_path: &Path,
        o: &RestoreOptions,
    ) -> Result<RestorePlan> {
        let mode = match (o.delta, o.force) {
            (true, _) => WriteMode::Delta,
            (false, true) => WriteMode::Force,
            (false, false) => WriteMode::Fresh,
        };
        let header = manifest.header();
        let mut selection = super::selective::select(header, &o.db_include, &o.db_exclude)?;
        if !selection.excluded.is_empty() {
            manifest
                .for_each_entry::<Error>(|e| {
                    if let Entry::File(f) = e {
                        if selection.is_zeroed(&f.path) {
                            selection.zeroed_files += 1;
                            selection.zeroed_bytes += f.size;
                        }
                    }
                    Ok(())
                })
                .await?;
        }
        let kept = |path: &str| manifest.kept().iter().find(|f| &*f.path == path).cloned();
        let (first, control) = (kept(PG_VERSION), kept(PG_CONTROL));
        let mut map = o.tablespace_map.clone();
        if let Some(root) = &o.tablespace_root {
            for t in &header.tablespaces {
                if !map.iter().any(|(oid, _)| *oid == t.oid) {
                    map.push((t.oid, root.join(t.oid.to_string())));
                }
            }
        }
        let tablespaces = tablespace_targets(header, manifest.layout(), pg_path, &map)?;
        let taken: Vec<&Path> = std::iter::once(pg_path)
            .chain(tablespaces.iter().map(|t| t.location.as_path()))
            .collect();
        let links = super::links::link_targets(
            header,
            manifest.layout(),
            pg_path,
            o.link_all,
            &o.link_map,
            &taken,
        )?;
        Ok(RestorePlan {
            manifest,
            pg_path: pg_path.to_path_buf(),
            mode,
            tablespaces,
            links,
            first,
            control,
            selection,
        })
    }

    /// The backup's manifest without its entries.
    pub fn header(&self) -> &Manifest {
        self.manifest.header()
    }

    /// Refuse targets restore must not write (see the module docs). Reads, never writes.
    pub(crate) fn check_targets(&self) -> Result<()> {
        refuse_if_running(&self.pg_path)?;
        let overwrite = self.mode != WriteMode::Fresh;
        if !dir_is_empty(&self.pg_path)? {
            if !overwrite {
                return Err(Error::refused(format!(
                    "{} is not empty: restore into an empty directory, or use --delta (rewrite only what differs) or --force (replace everything)",
                    self.pg_path.display()
                )));
            }
            let version = self.pg_path.join(PG_VERSION);
            if !std::fs::symlink_metadata(&version).is_ok_and(|m| m.is_file()) {
                return Err(Error::refused(format!(
                    "{} is not empty and has no PG_VERSION: it is not a PostgreSQL data directory, and --delta or --force would overwrite whatever it is; restore into an empty directory",
                    self.pg_path.display()
                )));
            }
        }
        let mut unproven = Vec::new();
        for t in &self.tablespaces {
            if dir_is_empty(&t.location)? {
                continue;
            }
            let link = self.pg_path.join("pg_tblspc").join(t.oid.to_string());
            let ours = std::fs::read_link(&link).is_ok_and(|l| l == t.location);
            if !t.mapped && !ours {
                unproven.push(t);
                continue;
            }
            for v in &t.version_dirs {
                if !overwrite && !dir_is_empty(&t.location.join(v))? {
                    return Err(Error::refused(format!(
                        "tablespace {} location {} already holds {v}: use --delta or --force to overwrite it",
                        t.oid,
                        t.location.display()
                    )));
                }
            }
        }
        super::links::check_link_targets(&self.links, overwrite)?;
        if !unproven.is_empty() {
            let list: Vec<String> = unproven
                .iter()
                .map(|t| format!("{} ({})", t.oid, t.location.display()))
                .collect();
            let map: Vec<String> = unproven
                .iter()
                .map(|t| format!("--tablespace-map={}=/NEW/DIR", t.oid))
                .collect();
            return Err(Error::refused(format!(
                "tablespace location(s) not empty and not this data directory's own: {}. They are where the backup's source keeps its tablespaces; restoring there could overwrite a running cluster's data. Map each to a new directory ({}), or restore in place over the data directory whose pg_tblspc links point there",
                list.join(", "),
                map.join(" ")
            )));
        }
        Ok(())
    }
}

impl fmt::Display for RestorePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.header();
        writeln!(
            f,
            "backup {} ({:?}, PostgreSQL {}, {} files, {}) into {}",
            m.label,
            m.backup_type,
            m.server_version_num / 10000,
            self.manifest.files().0,
            human_bytes(m.stats.db_size),
            self.pg_path.display()
        )?;
        let mode = match self.mode {
            WriteMode::Fresh => "fresh: the directories are empty",
            WriteMode::Delta => {
                "delta: compare local files block by block, rewrite what differs, remove what the backup lacks"
            }
            WriteMode::Force => "force: remove everything in the directories first",
        };
        writeln!(f, "  mode: {mode}")?;
        for t in &self.tablespaces {
            writeln!(
                f,
                "  tablespace {} -> {} ({}; writes only {})",
                t.oid,
                t.location.display(),
                if t.mapped {
                    "--tablespace-map"
                } else {
                    "the source's location"
                },
                t.version_dirs.join(", ")
            )?;
        }
        for l in &self.links {
            writeln!(
                f,
                "  link {} -> {} ({}{})",
                l.path,
                l.link_text.display(),
                if l.mapped { "--link-map" } else { "--link-all" },
                if l.dir { "" } else { "; a file" }
            )?;
        }
        let left_out = &self.selection.excluded;
        if !left_out.is_empty() {
            let names: Vec<String> = left_out
                .iter()
                .map(|d| format!("{} ({})", d.name, d.oid))
                .collect();
            writeln!(
                f,
                "  databases not restored: {}: {} files written as sparse zeroed files, {} not fetched; drop them once the cluster is up",
                names.join(", "),
                self.selection.zeroed_files,
                human_bytes(self.selection.zeroed_bytes)
            )?;
        }
        writeln!(
            f,
            "  order: PG_VERSION first; files of up to {} read in groups by pack, larger ones alone; global/pg_control last",
            human_bytes(SMALL_FILE)
        )
    }
}

/// Pick the backup: `--set`, else for `--type=time` the newest that ended before the
/// target, else the newest. Its manifest is checked whole, then held as stored.
pub(super) async fn choose_backup(
    storage: &Storage,
    s: &Settings,
    o: &RestoreOptions,
) -> Result<StoredManifest> {
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
        return Ok(Manifest::open(storage, &s.stanza, set, &KEPT).await?);
    }
    if o.recovery_type == RecoveryType::Time {
        let target = o.target.as_deref().unwrap_or_default();
        let t = super::parse_target_time(target).ok_or_else(|| {
            Error::config(format!(
                "--target='{target}' is not a time with a time zone, like '2026-11-23 10:15:00+00'"
            ))
        })?;
        for label in labels.iter().rev() {
            // Headers until one ended early enough; only that manifest is read whole.
            let header = Manifest::load_header(storage, &s.stanza, label).await?;
            if header.stop.epoch < t.timestamp() {
                log::info!("backup {label} is the newest that ended before {target}");
                return Ok(Manifest::open(storage, &s.stanza, label, &KEPT).await?);
            }
        }
        return Err(Error::refused(format!(
            "no backup of stanza '{}' ended before {target}",
            s.stanza
        )));
    }
    Ok(Manifest::open(storage, &s.stanza, labels.last().unwrap(), &KEPT).await?)
}

/// Each tablespace's location: the operator's mapping, else the source's location.
/// `layout`: the manifest's directories and links.
fn tablespace_targets(
    m: &Manifest,
    layout: &[Entry],
    pg_path: &Path,
    map: &[(u32, PathBuf)],
) -> Result<Vec<TablespaceTarget>> {
    for (oid, dir) in map {
        if !m.tablespaces.iter().any(|t| t.oid == *oid) {
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
        if !dir.is_absolute() {
            return Err(Error::config(format!(
                "--tablespace-map={oid}={}: the directory must be an absolute path",
                dir.display()
            )));
        }
    }
    let mut targets: Vec<TablespaceTarget> = Vec::new();
    for t in &m.tablespaces {
        let mapped = map.iter().rev().find(|(oid, _)| *oid == t.oid);
        let location = mapped
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| PathBuf::from(&t.location));
        if location.starts_with(pg_path) || pg_path.starts_with(&location) {
            return Err(Error::config(format!(
                "tablespace {} would be restored into {}, which overlaps the data directory {}: map it elsewhere with --tablespace-map={}=/NEW/DIR",
                t.oid,
                location.display(),
                pg_path.display(),
                t.oid
            )));
        }
        if let Some(other) = targets.iter().find(|o| o.location == location) {
            return Err(Error::config(format!(
                "tablespaces {} and {} would both be restored into {}",
                other.oid,
                t.oid,
                location.display()
            )));
        }
        let prefix = format!("pg_tblspc/{}/", t.oid);
        let version_dirs = layout
            .iter()
            .filter_map(|e| match e {
                Entry::Dir(d) => d.path.strip_prefix(&prefix),
                _ => None,
            })
            .filter(|rest| !rest.contains('/'))
            .map(str::to_string)
            .collect();
        targets.push(TablespaceTarget {
            oid: t.oid,
            location,
            mapped: mapped.is_some(),
            version_dirs,
        });
    }
    Ok(targets)
}

/// Refuse to touch the directory of a running server. A process that exists but belongs
/// to someone else (EPERM) is running too.
fn refuse_if_running(pg_path: &Path) -> Result<()> {
    let pidfile = pg_path.join("postmaster.pid");
    let Ok(text) = std::fs::read_to_string(&pidfile) else {
        return Ok(());
    };
    if let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
        .filter(|p| *p > 0)
    {
        let alive = !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if alive {
            return Err(Error::refused(format!(
                "PostgreSQL is running on {} (postmaster.pid names process {pid}): stop it before restoring",
                pg_path.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::plan_file_jobs;
    use pgstrata_repo::chunk::Chunk;

    #[allow(clippy::vec_box)] // as restore's windows hold them
    fn plan_jobs(files: Vec<Box<FileEntry>>) -> Vec<RestoreJob> {
        plan_file_jobs(files, |f| f)
    }

    fn file(path: &str, size: u64, pack: &str, offset: u64) -> Box<FileEntry> {
        let chunk: Chunk = serde_json::from_value(serde_json::json!({
            "p": pack, "o": offset, "s": 100, "r": size,
        }))
        .unwrap();
        serde_json::from_value(serde_json::json!({
            "path": path, "size": size, "mtime": 0, "mode": 0o600, "uid": 0, "gid": 0,
            "hash": "", "chunks": [chunk],
        }))
        .unwrap()
    }

    #[test]
    fn large_files_go_first_largest_first_then_small_files_grouped_by_pack() {
        let jobs = plan_jobs(vec![
            file("a", 100, "p1", 0),
            file("big", 5 << 20, "p2", 0),
            file("b", 100, "p1", 100),
            file("bigger", 9 << 20, "p3", 0),
            file("c", 100, "p2", 900),
        ]);
        let shape: Vec<Vec<&str>> = jobs
            .iter()
            .map(|j| match j {
                RestoreJob::One(f) => vec![&*f.path],
                RestoreJob::Group(g) => g.iter().map(|f| &*f.path).collect(),
            })
            .collect();
        assert_eq!(
            shape,
            vec![vec!["bigger"], vec!["big"], vec!["c"], vec!["a", "b"]]
        );
    }

    fn files_per_job(jobs: Vec<RestoreJob>) -> Vec<usize> {
        jobs.iter()
            .map(|j| match j {
                RestoreJob::Group(g) => g.len(),
                RestoreJob::One(_) => 1,
            })
            .collect()
    }

    #[test]
    fn groups_are_bounded_in_decoded_frames() {
        // 64 files, each in a frame of its own of 1 MiB decoded, stored in 100 bytes.
        let files = (0..64)
            .map(|i| {
                let mut f = file(&format!("f{i}"), 10, "p1", i * 100);
                f.chunks[0].frame = 1 << 20;
                f
            })
            .collect();
        let sizes = files_per_job(plan_jobs(files));
        assert_eq!(sizes, vec![8; 8], "8 MiB of decoded frames a group");
    }

    #[test]
    fn groups_are_bounded_in_files() {
        let files = (0..1200)
            .map(|i| file(&format!("f{i}"), 10, "p1", i * 10))
            .collect();
        let sizes = files_per_job(plan_jobs(files));
        assert_eq!(sizes.iter().sum::<usize>(), 1200);
        assert!(sizes.iter().all(|n| *n <= 512), "{sizes:?}");
    }
}
