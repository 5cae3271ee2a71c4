//! The stanza lock: one backup or expire at a time per stanza.
//!
//! A lock is an object created with a create-only write, so two processes cannot both take
//! it, on a local disk or an object store alike. It names its holder (host, boot, PID
//! namespace, pid and the process's start time, command, time) and carries a random token,
//! so a holder whose first write lost its answer recognises the lock as its own (see
//! `Storage::put_new`).
//!
//! A lock is stale only when its holder is provably gone: on this host, and either from an
//! earlier boot, or in this PID namespace with its pid not running (`kill(pid, 0)` says
//! ESRCH; EPERM means it runs as another user) or running but started at another time (the
//! pid was reused). A holder on another host, or in another PID namespace of this boot (a
//! container), cannot be checked and counts as alive: the user deletes its lock. Stale locks
//! are removed with a warning, by one process at a time: a host-local `flock` in the
//! `lock-path` directory, which must belong to the user and be writable by nobody else (a
//! lock file others can replace would let them hold or break the takeover). archive-push and
//! archive-get never lock: they only write write-once WAL objects.

use crate::{Error, ErrorKind, Result};
use pgstrata_repo::{layout, ErrorKind as RepoKind, Storage};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Holder {
    host: String,
    pid: i32,
    command: String,
    since: String,
    /// This boot of the host (`/proc/sys/kernel/random/boot_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
    /// The PID namespace `pid` belongs to (`readlink /proc/self/ns/pid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid_ns: Option<String>,
    /// When the process started, in clock ticks after boot (`/proc/<pid>/stat` field 22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start_ticks: Option<u64>,
    /// Random, unique to this holder.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    token: String,
}

impl Holder {
    fn me(command: &str) -> Holder {
        let pid = std::process::id() as i32;
        Holder {
            host: hostname(),
            pid,
            command: command.to_string(),
            since: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            boot_id: boot_id(),
            pid_ns: pid_namespace(),
            start_ticks: start_ticks(pid),
            token: random_token(),
        }
    }

    fn same_holder(&self, other: &Holder) -> bool {
        self.pid == other.pid && self.since == other.since && self.token == other.token
    }
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|b| b.trim().to_string())
}

fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|l| l.display().to_string())
}

/// A process's start time in clock ticks after boot, when /proc shows it.
fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start with the state, field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn random_token() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if random.is_err() {
        // Still unique enough to tell this holder from others: time and pid.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (nanos ^ ((std::process::id() as u128) << 96)).to_le_bytes();
    }
    hex_of(&bytes)
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Is the holder provably gone? Only a holder of this host can be judged; see the module
/// docs for the rules.
fn holder_is_gone(h: &Holder, me: &Holder) -> bool {
    if h.host != me.host {
        return false;
    }
    if let (Some(theirs), Some(mine)) = (&h.boot_id, &me.boot_id) {
        if theirs != mine {
            return true; // the host rebooted since: every process of then is gone
        }
    }
    if h.pid_ns.is_some() && h.pid_ns != me.pid_ns {
        return false; // another PID namespace: its pids mean nothing here
    }
    !pid_running(h.pid, h.start_ticks)
}

/// Is `pid` running (and, when known, the process that started at `started`)? Only ESRCH
/// means no such process: EPERM is a process of another user, and /proc may hide it
/// (hidepid), so /proc is asked only to tell a zombie or a reused pid.
fn pid_running(pid: i32, started: Option<u64>) -> bool {
    use nix::errno::Errno;
    if pid <= 0 {
        return false;
    }
    // Ok, EPERM (another user's process) and anything else: it exists.
    if let Err(Errno::ESRCH) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        return false;
    }
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A killed process lingers as a zombie until its parent reaps it.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if matches!(state, Some('Z') | Some('X')) {
            return false;
        }
        if let (Some(recorded), Some(now)) = (started, start_ticks(pid)) {
            return recorded == now;
        }
    }
    true
}

/// The directory holding the takeover `flock`: created 0700 when missing; refused when it
/// is not a directory of this user that nobody else can write to (see
/// [`pgstrata_repo::private_dir`]).
pub(crate) fn lock_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(format!("create lock-path {}", dir.display()), e)),
    }
    pgstrata_repo::private_dir::check(dir, "lock-path", false).map_err(|why| {
        Error::refused(format!(
            "{why}; or give each user running pgstrata a directory of its own (lock-path)"
        ))
    })
}

/// Serializes stale-lock takeovers among the processes of this host (an exclusive flock on
/// a file in `dir`, held until dropped). Taken on a blocking thread so a waiting task never
/// stalls the runtime.
async fn takeover_guard(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::OpenOptionsExt;
        lock_dir(&dir)?;
        let path = dir.join("lock-takeover");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
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
/// `lock_path` is the directory of the host-local takeover lock (option `lock-path`).
pub(crate) async fn with_lock<T>(
    storage: &Storage,
    stanza: &str,
    lock_path: &Path,
    command: &str,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    with_lock_at(
        storage,
        stanza,
        &layout::lock(stanza),
        lock_path,
        command,
        work,
    )
    .await
}

/// [`with_lock`] with the lock object `key`: a lock of its own for work that must not run
/// twice at once but may run beside backups (`wal-receive`).
pub(crate) async fn with_lock_at<T>(
    storage: &Storage,
    stanza: &str,
    key: &str,
    lock_path: &Path,
    command: &str,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let key = key.to_string();
    let me = Holder::me(command);
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
                    Some(h) if holder_is_gone(&h, &me) => {
                        remove_stale(storage, stanza, &key, &h, lock_path).await?
                    }
                    Some(h) => return Err(locked_by(stanza, &key, &h, &me)),
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

/// Delete the lock of holder `h`, who is gone. Only processes on the holder's host judge
/// its lock stale, so a host-local file lock makes them take it over one at a time. Under
/// it, the lock is read again and deleted only if it is still the stale one: another
/// process may have replaced it meanwhile (then the caller simply tries again).
async fn remove_stale(
    storage: &Storage,
    stanza: &str,
    key: &str,
    h: &Holder,
    lock_path: &Path,
) -> Result<()> {
    let _guard = takeover_guard(lock_path).await?;
    match storage.get(key).await {
        Ok(b) if serde_json::from_slice::<Holder>(&b).is_ok_and(|n| n.same_holder(h)) => {
            log::warn!(
                "removing a stale lock of stanza '{stanza}': {} (pid {}) since {} is no longer running",
                h.command,
                h.pid,
                h.since
            );
            Ok(storage.delete(key).await?)
        }
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The refusal naming a live (or uncheckable) holder.
fn locked_by(stanza: &str, key: &str, h: &Holder, me: &Holder) -> Error {
    let uncheckable = if h.host != me.host {
        " (another host: pgstrata cannot check it)"
    } else if h.pid_ns.is_some() && h.pid_ns != me.pid_ns {
        " (another PID namespace, a container: pgstrata cannot check it)"
    } else {
        ""
    };
    Error::new(
        ErrorKind::Refused,
        format!(
            "stanza '{stanza}' is locked by {} (pid {} on {}{uncheckable}, since {}): wait for it to finish; \
             if that process is gone, delete {key} in the repository",
            h.command, h.pid, h.host, h.since
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn dead_pid() -> i32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        pid
    }

    /// Many would-be holders find the same stale lock at once: at no time do two of them
    /// hold the stanza, and one of them gets it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stale_lock_is_taken_over_by_one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let lock_path = dir.path().join("locks");
        std::fs::create_dir(dir.path().join("repo")).unwrap();
        let storage = Storage::local(&dir.path().join("repo")).unwrap();
        let dead_pid = dead_pid();
        assert!(!pid_running(dead_pid, None));
        for round in 0..20 {
            let stale = Holder {
                pid: dead_pid,
                since: format!("2026-01-01T00:00:{round:02}Z"),
                ..Holder::me("backup")
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
                let (storage, holding, most, lock_path) = (
                    storage.clone(),
                    holding.clone(),
                    most.clone(),
                    lock_path.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    with_lock(&storage, "st", &lock_path, "test", async {
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
        let mode = std::fs::metadata(&lock_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "lock-path is created private");
    }

    /// A running process is alive whatever its command line says, and whoever owns it
    /// (pid 1 is init: not pgstrata, and another user's process for a non-root caller,
    /// where kill says EPERM).
    #[test]
    fn a_running_holder_is_alive_whatever_its_name_or_owner() {
        let me = Holder::me("backup");
        let init = Holder {
            pid: 1,
            start_ticks: None,
            ..Holder::me("backup")
        };
        assert!(!holder_is_gone(&init, &me));
        let dead = Holder {
            pid: dead_pid(),
            start_ticks: None,
            ..Holder::me("backup")
        };
        assert!(
            holder_is_gone(&dead, &me),
            "a pid that is not running is gone"
        );
        // A lock written before boot ids were recorded is judged by its pid alone.
        let old: Holder = serde_json::from_str(&format!(
            r#"{{"host":"{}","pid":1,"command":"backup","since":"2026-01-01T00:00:00Z"}}"#,
            me.host
        ))
        .unwrap();
        assert!(!holder_is_gone(&old, &me));
    }

    #[test]
    fn a_holder_of_an_earlier_boot_is_gone_and_one_in_another_pid_namespace_is_alive() {
        let me = Holder::me("backup");
        assert!(me.boot_id.is_some() && me.pid_ns.is_some(), "{me:?}");
        // This very process, but recorded by an earlier boot: gone.
        let earlier_boot = Holder {
            boot_id: Some("00000000-0000-0000-0000-000000000000".into()),
            ..Holder::me("backup")
        };
        assert!(holder_is_gone(&earlier_boot, &me));
        // Another PID namespace of this boot: its pid (dead here) cannot be checked.
        let container = Holder {
            pid: dead_pid(),
            pid_ns: Some("pid:[1]".into()),
            ..Holder::me("backup")
        };
        assert!(!holder_is_gone(&container, &me));
        let e = locked_by("st", "st/lock/backup.lock", &container, &me);
        assert!(e.message.contains("another PID namespace"), "{e}");
        // Another host: never judged here.
        let elsewhere = Holder {
            host: "elsewhere".into(),
            pid: dead_pid(),
            ..Holder::me("backup")
        };
        assert!(!holder_is_gone(&elsewhere, &me));
        // A pid now used by a process that started at another time: the holder is gone.
        let reused = Holder {
            start_ticks: me.start_ticks.map(|t| t + 1),
            ..Holder::me("backup")
        };
        assert!(holder_is_gone(&reused, &me));
        assert!(
            !holder_is_gone(&Holder::me("backup"), &me),
            "this process is alive"
        );
    }

    #[test]
    fn a_lock_path_others_can_write_or_that_is_not_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = lock_dir(&open).unwrap_err();
        assert!(
            e.message.contains(&format!("lock-path {}", open.display()))
                && e.message.contains("mode 0777")
                && e.message.contains("writable by others")
                && e.message.contains("chmod 0700"),
            "{e}"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        let e = lock_dir(&link).unwrap_err();
        assert!(e.message.contains("is not a directory"), "{e}");
        if nix::unistd::geteuid().is_root() {
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let e = lock_dir(&theirs).unwrap_err();
            assert!(
                e.message.contains("owner uid 65534")
                    && e.message.contains("mode 0700")
                    && e.message.contains("belongs to another user")
                    && e.message.contains("a directory of its own"),
                "{e}"
            );
        }
        let fine = dir.path().join("fine");
        lock_dir(&fine).unwrap();
        lock_dir(&fine).unwrap();
    }
}
