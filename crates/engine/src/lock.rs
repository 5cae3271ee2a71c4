//! The stanza lock: one backup or expire at a time per stanza.
//!
//! A lock is an object created with a create-only write, so two processes cannot both take
//! it, on a local disk or an object store alike. It names its holder (host, pid, command,
//! time). A lock whose holder process is gone (same host, pid not running) is stale: it is
//! removed with a warning, by one process at a time (a host-local file lock), so two
//! processes can never both replace it. archive-push and archive-get never lock: they only write
//! write-once WAL objects.

use crate::{Error, ErrorKind, Result};
use pgstrata_repo::{layout, ErrorKind as RepoKind, Storage};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Holder {
    host: String,
    pid: i32,
    command: String,
    since: String,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Is `pid` a running pgstrata process? A killed process may linger as a zombie until its
/// parent reaps it, and a pid may have been reused by another program: /proc tells both.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            !matches!(state, Some('Z') | Some('X'))
                && String::from_utf8_lossy(&cmdline).contains("pgstrata")
        }
        Err(_) if std::path::Path::new("/proc/self/stat").exists() => false,
        Err(_) => nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok(),
    }
}

/// Serializes stale-lock takeovers among the processes of this host (an exclusive flock on
/// a file in the temporary directory, held until dropped). Taken on a blocking thread so a
/// waiting task never stalls the runtime.
async fn takeover_guard() -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = std::env::temp_dir().join("pgstrata-lock-takeover");
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::OpenOptionsExt;
        // Readable by everyone, so the postgres user and root can share it: flock needs
        // only an open file.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&path)
            .or_else(|_| std::fs::File::open(&path))
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        // The umask (0027) took the mode's "others" bits: give them back. Fails harmlessly
        // on a file another user created.
        let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, errno)| {
            Error::io(
                format!("lock {}", path.display()),
                std::io::Error::from(errno),
            )
        })
    })
    .await
    .expect("lock thread")
}

/// Run `work` holding the stanza lock; the lock is released whatever the outcome.
pub async fn with_lock<T>(
    storage: &Storage,
    stanza: &str,
    command: &str,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let key = layout::lock(stanza);
    let me = Holder {
        host: hostname(),
        pid: std::process::id() as i32,
        command: command.to_string(),
        since: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    let body = serde_json::to_vec(&me).expect("serialize lock");
    let mut attempts = 0;
    loop {
        attempts += 1;
        match storage.put_new(&key, body.clone().into()).await {
            Ok(()) => break,
            Err(e) if e.kind == RepoKind::AlreadyExists && attempts < 3 => {
                let holder: Option<Holder> = match storage.get(&key).await {
                    Ok(b) => serde_json::from_slice(&b).ok(),
                    Err(e) if e.is_not_found() => continue, // released meanwhile
                    Err(e) => return Err(e.into()),
                };
                match holder {
                    Some(h) if h.host == me.host && !alive(h.pid) => {
                        // Only processes on the holder's host judge its lock stale, so a
                        // host-local file lock makes them take it over one at a time. Under
                        // it, the lock is read again and deleted only if it is still the
                        // stale one: another process may have replaced it meanwhile.
                        let _guard = takeover_guard().await?;
                        match storage.get(&key).await {
                            Ok(b) if serde_json::from_slice::<Holder>(&b).is_ok_and(|n| n.pid == h.pid && n.since == h.since) => {
                                log::warn!(
                                    "removing a stale lock of stanza '{stanza}': {} (pid {}) since {} is no longer running",
                                    h.command,
                                    h.pid,
                                    h.since
                                );
                                storage.delete(&key).await?
                            }
                            Ok(_) => continue,
                            Err(e) if e.is_not_found() => continue,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Some(h) => {
                        return Err(Error::new(
                            ErrorKind::Refused,
                            format!(
                                "stanza '{stanza}' is locked by {} (pid {} on {}, since {}): wait for it to finish; \
                                 if that process is gone, delete {key} in the repository",
                                h.command, h.pid, h.host, h.since
                            ),
                        ))
                    }
                    None => {
                        return Err(Error::refused(format!(
                            "stanza '{stanza}' is locked by an unreadable lock object {key}: delete it if no backup or expire is running"
                        )))
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    let result = work.await;
    if let Err(e) = storage.delete(&key).await {
        log::warn!("could not release the lock {key}: {e}");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Many would-be holders find the same stale lock at once: at no time do two of them
    /// hold the stanza, and one of them gets it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stale_lock_is_taken_over_by_one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::local(dir.path()).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!alive(dead_pid));
        for round in 0..20 {
            let stale = Holder {
                host: hostname(),
                pid: dead_pid,
                command: "backup".into(),
                since: format!("2026-01-01T00:00:{round:02}Z"),
            };
            storage
                .put_new(
                    &layout::lock("st"),
                    serde_json::to_vec(&stale).unwrap().into(),
                )
                .await
                .unwrap();
            let holding = Arc::new(AtomicUsize::new(0));
            let most = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for _ in 0..6 {
                let (storage, holding, most) = (storage.clone(), holding.clone(), most.clone());
                tasks.push(tokio::spawn(async move {
                    with_lock(&storage, "st", "test", async {
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        holding.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .await
                }));
            }
            let mut took = 0;
            for t in tasks {
                if t.await.unwrap().is_ok() {
                    took += 1;
                }
            }
            assert_eq!(
                most.load(Ordering::SeqCst),
                1,
                "round {round}: two held the lock"
            );
            assert!(took >= 1, "round {round}: nobody took over the stale lock");
            assert!(!storage.exists(&layout::lock("st")).await.unwrap());
        }
    }
}
