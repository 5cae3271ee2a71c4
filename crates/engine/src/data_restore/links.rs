//! The data directory's own symbolic links, restored as links (`--link-all`, `--link-map`).
//!
//! A backup follows the links at the top of the data directory (`pg_wal -> /fast/wal`, a
//! log directory, `postgresql.conf -> /etc/...`) and records each beside the entries that
//! hold what it pointed to (the manifest's `links`). By default restore writes those
//! entries as real directories and files in the data directory, as pgBackRest does: the
//! source's link targets may not exist here, or may be the running source's own. With
//! `--link-all` every recorded link is made again, pointing where it pointed; with
//! `--link-map=NAME=DIR` that one points at `DIR` instead (and a directory of the backup
//! that was no link, `pg_wal` say, becomes one: a WAL directory moved to a faster disk at
//! restore).
//!
//! A linked directory is written as a tablespace location is: opened once by the path the
//! backup or the operator chose, every entry under it written through that handle, never
//! through the link. A linked file is written into the data directory as any file, then
//! copied to its target (under a temporary name, fsynced, renamed) and replaced by the
//! link. A target that overlaps the data directory, a tablespace or another link's is
//! refused; so is a directory target that is not empty unless `--delta` or `--force`
//! says to overwrite (a delta restore then removes what the backup lacks in it, as it does
//! in the data directory).

use super::tree::{DirHandle, ParentCache, TargetTree};
use crate::{Error, Result};
use pgstrata_repo::manifest::{Entry, Manifest};
use std::os::fd::AsFd;
use std::path::{Component, Path, PathBuf};

/// One of the data directory's links, restored as a link.
#[derive(Debug, Clone)]
pub(crate) struct LinkTarget {
    /// Its name in the data directory.
    pub path: String,
    /// What the link says: the backup's target, or the mapped directory.
    pub link_text: PathBuf,
    /// Where its content goes: `link_text`, a relative one taken from the data directory.
    pub location: PathBuf,
    /// A directory (its entries are written under `location`), else a file.
    pub dir: bool,
    /// Given with `--link-map` (otherwise the backup's target).
    pub mapped: bool,
}

/// The links restore makes: every recorded one with `link_all`, and those `link_map` names
/// (a directory of the backup that was no link becomes one). `layout`: the manifest's
/// directories and links; `taken`: the data directory and the tablespace locations.
pub(crate) fn link_targets(
    m: &Manifest,
    layout: &[Entry],
    pg_path: &Path,
    link_all: bool,
    link_map: &[(String, PathBuf)],
    taken: &[&Path],
) -> Result<Vec<LinkTarget>> {
    let is_dir = |name: &str| {
        layout
            .iter()
            .any(|e| matches!(e, Entry::Dir(d) if d.path == name))
    };
    for (name, dir) in link_map {
        if !dir.is_absolute() {
            return Err(Error::config(format!(
                "--link-map={name}={}: the target must be an absolute path",
                dir.display()
            )));
        }
        if !m.links.iter().any(|l| &l.path == name) && !is_dir(name) {
            let names: Vec<&str> = m.links.iter().map(|l| l.path.as_str()).collect();
            return Err(Error::config(format!(
                "--link-map={name}=...: backup {} has no link or directory '{name}' at the top of the data directory (its links: {})",
                m.label,
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            )));
        }
    }
    let mut targets: Vec<LinkTarget> = Vec::new();
    let mut names: Vec<&str> = m.links.iter().map(|l| l.path.as_str()).collect();
    names.extend(link_map.iter().map(|(n, _)| n.as_str()));
    names.sort_unstable();
    names.dedup();
    for name in names {
        let mapped = link_map.iter().rev().find(|(n, _)| n == name);
        let recorded = m.links.iter().find(|l| l.path == name);
        let link_text = match (mapped, recorded) {
            (Some((_, dir)), _) => dir.clone(),
            (None, Some(l)) if link_all => PathBuf::from(&l.target),
            _ => continue,
        };
        let location = normalize(&pg_path.join(&link_text));
        let t = LinkTarget {
            path: name.to_string(),
            dir: is_dir(name),
            link_text,
            location,
            mapped: mapped.is_some(),
        };
        check_overlap(&t, pg_path, taken, &targets)?;
        targets.push(t);
    }
    Ok(targets)
}

/// A link target must not lie in the data directory, a tablespace location or another
/// link's target, nor hold them.
fn check_overlap(
    t: &LinkTarget,
    pg_path: &Path,
    taken: &[&Path],
    others: &[LinkTarget],
) -> Result<()> {
    let overlaps = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
    let clash = taken
        .iter()
        .copied()
        .chain(others.iter().map(|o| o.location.as_path()))
        .find(|p| overlaps(&t.location, p));
    match clash {
        Some(p) => Err(Error::config(format!(
            "link {} would be restored into {}, which overlaps {}{}: map it elsewhere with --link-map={}=/NEW/DIR",
            t.path,
            t.location.display(),
            p.display(),
            if p == pg_path { " (the data directory)" } else { "" },
            t.path
        ))),
        None => Ok(()),
    }
}

/// `p` without `.` and `..` components (a link's target is read as text, not resolved).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Refuse a directory target that holds something when nothing may be overwritten.
pub(crate) fn check_link_targets(links: &[LinkTarget], overwrite: bool) -> Result<()> {
    if overwrite {
        return Ok(());
    }
    let mut full = Vec::new();
    for l in links.iter().filter(|l| l.dir) {
        if !super::tree::dir_is_empty(&l.location)? {
            full.push(l);
        }
    }
    if full.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = full
        .iter()
        .map(|l| format!("{} ({})", l.path, l.location.display()))
        .collect();
    let map: Vec<String> = full
        .iter()
        .map(|l| format!("--link-map={}=/NEW/DIR", l.path))
        .collect();
    Err(Error::refused(format!(
        "link target directories not empty: {}. Restoring there could overwrite what another cluster (the backup's source) keeps there: restore each elsewhere ({}), or use --delta or --force to overwrite them",
        list.join(", "),
        map.join(" ")
    )))
}

/// Move each linked file restored in the data directory to its target and put the link in
/// its place. A file the backup did not have (a link to nothing) is left alone.
pub(crate) fn link_files(
    tree: &TargetTree,
    links: &[LinkTarget],
    cache: &mut ParentCache,
) -> Result<()> {
    for l in links.iter().filter(|l| !l.dir) {
        let Some((bytes, st)) = tree.read_file(&l.path, cache)? else {
            log::warn!("link {}: the backup has no file there: not made", l.path);
            continue;
        };
        let (Some(dir), Some(name)) = (l.location.parent(), l.location.file_name()) else {
            return Err(Error::config(format!(
                "link {}: target {} is not a file path",
                l.path,
                l.location.display()
            )));
        };
        super::tree::make_passable_parents(&l.location)?;
        let parent = DirHandle::open(dir)?;
        let tmp = format!(".{}.pgstrata.tmp", name.to_string_lossy());
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let fd = rustix::fs::openat(
                parent.fd.as_fd(),
                tmp.as_str(),
                rustix::fs::OFlags::WRONLY
                    | rustix::fs::OFlags::CREATE
                    | rustix::fs::OFlags::TRUNC
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::from_raw_mode(0o600),
            )?;
            // The mode and owner the file was restored with.
            rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(st.st_mode & 0o7777))?;
            if crate::owner::running_as_root() {
                rustix::fs::fchown(
                    &fd,
                    Some(rustix::fs::Uid::from_raw(st.st_uid)),
                    Some(rustix::fs::Gid::from_raw(st.st_gid)),
                )?;
            }
            let mut f = std::fs::File::from(fd);
            f.write_all(&bytes)?;
            f.sync_all()?;
            rustix::fs::renameat(parent.fd.as_fd(), tmp.as_str(), parent.fd.as_fd(), name)?;
            Ok(())
        };
        write().map_err(|e| Error::io(format!("write {}", l.location.display()), e))?;
        parent.sync()?;
        tree.remove(&l.path, cache)?;
        tree.ensure_link(&l.path, &l.link_text, cache)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgstrata_repo::manifest::DataLink;

    fn manifest_with(links: &[(&str, &str)]) -> (Manifest, Vec<Entry>) {
        let mut m = pgstrata_repo::fixture::manifest("20260101-000000F", None);
        m.links = links
            .iter()
            .map(|(p, t)| DataLink {
                path: p.to_string(),
                target: t.to_string(),
            })
            .collect();
        let owner = pgstrata_repo::fixture::owner(0o700);
        let layout = vec![
            Entry::dir("", owner.clone()),
            Entry::dir("pg_wal", owner.clone()),
            Entry::dir("log", owner),
        ];
        (m, layout)
    }

    /// Which links are made, and where: the recorded ones with --link-all, a mapped one
    /// wherever it is mapped (a plain directory too), a relative target from the data
    /// directory; a name the backup lacks, or a target over the data directory, a
    /// tablespace or another link, is refused.
    #[test]
    fn links_are_chosen_and_overlaps_refused() {
        let pg = Path::new("/srv/pg/data");
        let (m, layout) = manifest_with(&[("log", "../log"), ("pg_ident.conf", "/etc/pg/ident")]);
        let none = link_targets(&m, &layout, pg, false, &[], &[pg]).unwrap();
        assert!(none.is_empty(), "by default no link is made");
        let all = link_targets(&m, &layout, pg, true, &[], &[pg]).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].location, Path::new("/srv/pg/log"));
        assert_eq!(all[0].link_text, Path::new("../log"));
        assert!(all[0].dir && !all[1].dir);
        let map = vec![("pg_wal".to_string(), PathBuf::from("/fast/wal"))];
        let mapped = link_targets(&m, &layout, pg, false, &map, &[pg]).unwrap();
        assert_eq!(mapped.len(), 1);
        assert!(mapped[0].mapped && mapped[0].dir);

        let refused = |map: Vec<(String, PathBuf)>, taken: &[&Path]| {
            link_targets(&m, &layout, pg, true, &map, taken)
                .unwrap_err()
                .to_string()
        };
        let e = refused(vec![("base".into(), "/x".into())], &[pg]);
        assert!(e.contains("has no link or directory 'base'"), "{e}");
        let e = refused(vec![("pg_wal".into(), "rel".into())], &[pg]);
        assert!(e.contains("absolute"), "{e}");
        let e = refused(vec![("pg_wal".into(), "/srv/pg/data/wal".into())], &[pg]);
        assert!(
            e.contains("overlaps /srv/pg/data (the data directory)"),
            "{e}"
        );
        let ts = Path::new("/srv/ts1");
        let e = refused(vec![("pg_wal".into(), "/srv/ts1/wal".into())], &[pg, ts]);
        assert!(e.contains("overlaps /srv/ts1"), "{e}");
        let e = refused(vec![("pg_wal".into(), "/srv/pg/log/wal".into())], &[pg]);
        assert!(e.contains("overlaps /srv/pg/log"), "{e}");
    }
}
