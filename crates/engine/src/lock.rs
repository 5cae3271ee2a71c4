//! The stanza lock: one backup or expire at a time per stanza.
//!
//! A lock is an object created with a create-only write, so two processes cannot both take
//! it, on a local disk or an object store alike. It names its holder (host, pid, command,
//! time). A lock whose holder process is gone (same host, pid not running) is stale: it is
//! removed with a warning. archive-push and archive-get never lock: they only write
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
                        log::warn!(
                            "removing a stale lock of stanza '{stanza}': {} (pid {}) since {} is no longer running",
                            h.command,
                            h.pid,
                            h.since
                        );
                        // Delete only what we judged stale: another process may have
                        // replaced it meanwhile.
                        match storage.get(&key).await {
                            Ok(b) if serde_json::from_slice::<Holder>(&b).is_ok_and(|n| n.pid == h.pid && n.since == h.since) => {
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
