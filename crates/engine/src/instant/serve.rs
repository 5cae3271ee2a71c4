//! The serving process of an instant restore: mount, hydrate with `process-max` workers,
//! report progress, hand over, and wait for the mount to be let go.

use super::served::Served;
use super::{State, PERSIST_EVERY};
use crate::{open_stanza, Error, ErrorKind, Result, Settings};
use pgstrata_repo::manifest::Manifest;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Serve the instant restore of `pg_path` until it is handed over and its last open file
/// closed (or the process is killed). Runs in the foreground: `restore --instant` starts it
/// as a process of its own.
pub async fn serve(s: &Settings, pg_path: &Path) -> Result<()> {
    serve_with(s, pg_path, true).await
}

/// [`serve`], or with `hydrate` false only what is read (nothing in the background, no
/// hand-over): `restore-table`'s scratch cluster, served until its mount is let go.
pub async fn serve_with(s: &Settings, pg_path: &Path, hydrate: bool) -> Result<()> {
    let dir = super::instant_dir(pg_path)?;
    let state = State::read(&dir)?;
    let (storage, _) = open_stanza(s).await?;
    let manifest = Manifest::load(&storage, &s.stanza, &state.label).await?;
    let wanted: HashSet<&str> = state.files.iter().map(|f| f.path.as_str()).collect();
    let mut entries = HashMap::new();
    for f in manifest.files().filter(|f| wanted.contains(&*f.path)) {
        let f = if f.map_unloaded() {
            manifest.load_map(&storage, f).await?
        } else {
            f.clone()
        };
        entries.insert(f.path.to_string(), crate::content::extents_of(&f));
    }
    std::fs::write(dir.join("pid"), std::process::id().to_string())
        .map_err(|e| Error::io(format!("write {}", dir.join("pid").display()), e))?;
    let runtime = tokio::runtime::Handle::current();
    let workers = if hydrate { s.process_max.get() } else { 0 };
    let served = Arc::new(Served::open(
        &dir, &state, storage, manifest, runtime, entries,
    )?);
    tokio::task::spawn_blocking(move || run(served, state, workers, hydrate))
        .await
        .map_err(|e| Error::new(ErrorKind::Io, format!("instant restore stopped: {e}")))?
}

/// Mount, hydrate, hand over, and wait for the mount to be let go.
fn run(served: Arc<Served>, state: State, workers: usize, hydrate: bool) -> Result<()> {
    let started = Instant::now();
    let mnt = served.dir.join("mnt");
    // A mount left by a killed process: gone before this one.
    let _ = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status();
    let mounted = super::fs::mount(served.clone(), &mnt)?;
    let write_status = |st: &str| {
        let status = served.status(started, st);
        if let Err(e) = status.write(&served.dir) {
            log::warn!("instant restore: {e}");
        }
        status
    };
    write_status("hydrating");
    if !hydrate {
        log::info!("instant restore: serving {} on demand only", mnt.display());
        mounted.session.join().ok();
        write_status("hydrating");
        return Ok(());
    }
    log::info!(
        "instant restore of {}: serving {} deferred files at {}",
        state.pg_path.display(),
        state.files.len(),
        mnt.display()
    );
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<()> {
        let hydrators: Vec<_> = (0..workers)
            .map(|worker| {
                let served = &served;
                scope.spawn(move || served.hydrate(worker))
            })
            .collect();
        scope.spawn(|| {
            let mut persisted = Instant::now();
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(250).min(PERSIST_EVERY));
                write_status("hydrating");
                if persisted.elapsed() >= PERSIST_EVERY {
                    if let Err(e) = served.persist_all() {
                        log::warn!("instant restore: {e}");
                    }
                    persisted = Instant::now();
                }
            }
        });
        for h in hydrators {
            h.join().expect("hydrating worker");
        }
        done.store(true, Ordering::SeqCst);
        Ok(())
    })?;
    let failed = served.failed.lock().expect("failure").clone();
    if let Some((file, error, _)) = failed {
        write_status("failed");
        mounted.session.join().ok();
        return Err(Error::new(
            ErrorKind::Integrity,
            format!("instant restore failed at {file}: {error}"),
        ));
    }
    served.persist_all()?;
    log::info!(
        "instant restore of {}: every block local after {:.1} s",
        state.pg_path.display(),
        started.elapsed().as_secs_f64()
    );
    hand_over(&served, &state, &mounted, &write_status)?;
    log::info!(
        "instant restore of {}: the data directory holds ordinary files now",
        state.pg_path.display()
    );
    // Detached at once: new opens find ordinary files; files open through the mount are
    // served until they are closed (at PostgreSQL's next restart at the latest).
    let _ = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(&mnt)
        .status();
    mounted.session.join().ok();
    let _ = std::fs::remove_file(served.dir.join("pid"));
    let _ = std::fs::remove_dir(&mnt);
    let _ = std::fs::remove_dir(served.dir.join("store"));
    Ok(())
}

/// Every block is local: hand each file over (`Served::hand_over`), those open through
/// the mount at once too where the kernel allows it, else once they are closed; the
/// status says how many wait.
fn hand_over(
    served: &Served,
    state: &State,
    mounted: &super::fs::Mounted,
    write_status: &dyn Fn(&str) -> super::Status,
) -> Result<()> {
    let open_too = mounted.can_hand_over_open_files();
    let mut written = None;
    loop {
        let waiting = served.hand_over(state, open_too, |i, pages| mounted.forget(i, pages))?;
        served.files_waiting.store(waiting as u64, Ordering::SeqCst);
        if written.is_none_or(|at: Instant| at.elapsed() >= Duration::from_secs(1)) {
            write_status("complete");
            written = Some(Instant::now());
        }
        if waiting == 0 {
            write_status("complete");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
