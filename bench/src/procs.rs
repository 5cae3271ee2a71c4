//! Memory and CPU of every process of a tool, wherever it runs: `wait4` sees only the
//! command and the children it waited for, not the processes a tool starts on the other
//! host over SSH, its detached workers, or the server backend that compresses for
//! pg_basebackup. A sampler thread reads /proc every 10 ms during a step and sums, per
//! group of processes, their resident sets (less shared memory: a PostgreSQL backend's
//! RSS includes the shared buffers it touched) and keeps their CPU time.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which processes belong to a group.
#[derive(Clone, Debug)]
pub enum Matcher {
    /// Processes running one of these binaries.
    Exe(Vec<PathBuf>),
    /// Processes running `exe` whose command line (as the process shows it) starts with
    /// `prefix`: "postgres: walsender" for the backends serving pg_basebackup.
    ExeTitled { exe: PathBuf, prefix: String },
    /// Processes running `exe` without the argument `arg` on their command line: a tool's
    /// command and its workers, not the archive-push that PostgreSQL runs meanwhile.
    ExeWithout { exe: PathBuf, arg: String },
    /// These processes: servers found once with [`pids_with_arg`] (matching a command line
    /// on every sweep would cost the sampler a read per process).
    Pids(Vec<u32>),
    /// Processes any of these match.
    Any(Vec<Matcher>),
}

impl Matcher {
    fn matches(&self, pid: u32, exe: &Path, proc_dir: &Path) -> bool {
        match self {
            Matcher::Exe(bins) => bins.iter().any(|b| b == exe),
            Matcher::ExeTitled { exe: e, prefix } => {
                e == exe
                    && std::fs::read(proc_dir.join("cmdline"))
                        .map(|c| c.starts_with(prefix.as_bytes()))
                        .unwrap_or(false)
            }
            Matcher::ExeWithout { exe: e, arg } => {
                e == exe
                    && std::fs::read(proc_dir.join("cmdline"))
                        .is_ok_and(|c| !c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
            }
            Matcher::Pids(pids) => pids.contains(&pid),
            Matcher::Any(all) => all.iter().any(|m| m.matches(pid, exe, proc_dir)),
        }
    }
}

/// What the sampler saw of one group during a step.
#[derive(Clone, Debug, Default)]
pub struct Sampled {
    /// Largest sum of the group's resident sets (less shared memory) at one instant, KiB.
    pub peak_rss_kb: u64,
    /// Most processes of the group at one instant.
    pub peak_procs: u64,
    /// CPU time (user + system) the group used during the step, seconds (a process's last
    /// 10 ms may be missed; a process that was running before the step counts from its
    /// start).
    pub cpu_seconds: f64,
    /// The same per OS user (real uid) running the processes: on one machine standing for
    /// two hosts, each host is a user (the backup host's, the database host's).
    pub by_user: BTreeMap<u32, UserShare>,
}

/// What one OS user's processes of a group used during a step.
#[derive(Clone, Debug, Default)]
pub struct UserShare {
    /// Largest sum of their resident sets (less shared memory) at one instant, KiB.
    pub peak_rss_kb: u64,
    /// CPU time (user + system), seconds.
    pub cpu_seconds: f64,
}

impl Sampled {
    /// The share of the processes OS user `name` runs (zero when it ran none).
    pub fn of_user(&self, name: &str) -> UserShare {
        uid_of(name)
            .and_then(|uid| self.by_user.get(&uid).cloned())
            .unwrap_or_default()
    }
}

/// The uid of OS user `name`.
pub fn uid_of(name: &str) -> Option<u32> {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

/// CPU time (utime + stime, in clock ticks) of a process from its `/proc/PID/stat`:
/// fields 14 and 15, counted after the ')' closing its command name.
pub fn cpu_ticks(stat: &str) -> u64 {
    stat.rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// The processes running now with an argument containing `part` on their command line:
/// interpreted programs (moto_server and bench/delay_proxy.py run python).
pub fn pids_with_arg(part: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            cmdline
                .split(|&b| b == 0)
                .any(|a| String::from_utf8_lossy(a).contains(part))
                .then_some(pid)
        })
        .collect()
}

/// Run `f` while sampling each group of `groups`; a process counts in the first group it
/// matches.
pub fn sampled<T>(
    groups: &[Matcher],
    f: impl FnOnce() -> Result<T, String>,
) -> Result<(T, Vec<Sampled>), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let groups = groups.to_vec();
    // CPU ticks of the processes already running (servers): only what they use from now
    // on counts.
    let mut before: HashMap<(usize, u32), u64> = HashMap::new();
    sweep(&groups, |g, pid, _, _, ticks| {
        before.insert((g, pid), ticks);
    });
    let sampler = std::thread::spawn(move || {
        let mut out = vec![Sampled::default(); groups.len()];
        // CPU ticks per (group, pid): the largest seen; and the uid of each.
        let mut ticks: HashMap<(usize, u32), u64> = HashMap::new();
        let mut owner: HashMap<u32, u32> = HashMap::new();
        loop {
            // One more sweep after the step, for the servers' final CPU time.
            let last = flag.load(Ordering::Relaxed);
            let mut rss = vec![0u64; groups.len()];
            let mut procs = vec![0u64; groups.len()];
            let mut user_rss: HashMap<(usize, u32), u64> = HashMap::new();
            sweep(&groups, |g, pid, uid, rss_kb, used| {
                rss[g] += rss_kb;
                procs[g] += 1;
                *user_rss.entry((g, uid)).or_default() += rss_kb;
                owner.insert(pid, uid);
                let seen = ticks.entry((g, pid)).or_default();
                *seen = (*seen).max(used);
            });
            for (i, o) in out.iter_mut().enumerate() {
                o.peak_rss_kb = o.peak_rss_kb.max(rss[i]);
                o.peak_procs = o.peak_procs.max(procs[i]);
            }
            for ((g, uid), kb) in user_rss {
                let share = out[g].by_user.entry(uid).or_default();
                share.peak_rss_kb = share.peak_rss_kb.max(kb);
            }
            if last {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        for (key, t) in ticks {
            let used = t.saturating_sub(before.get(&key).copied().unwrap_or(0));
            out[key.0].cpu_seconds += used as f64 / hz;
            if let Some(uid) = owner.get(&key.1) {
                out[key.0].by_user.entry(*uid).or_default().cpu_seconds += used as f64 / hz;
            }
        }
        out
    });
    let r = f();
    stop.store(true, Ordering::Relaxed);
    let seen = sampler
        .join()
        .map_err(|_| "the /proc sampler panicked".to_string())?;
    Ok((r?, seen))
}

/// Call `each(group, pid, uid, resident KiB less shared memory, CPU ticks)` for every
/// process that matches one of `groups` (the first it matches).
fn sweep(groups: &[Matcher], mut each: impl FnMut(usize, u32, u32, u64, u64)) {
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let dir = e.path();
        let Ok(exe) = std::fs::read_link(dir.join("exe")) else {
            continue;
        };
        let Some(g) = groups.iter().position(|m| m.matches(pid, &exe, &dir)) else {
            continue;
        };
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        each(
            g,
            pid,
            field("Uid:") as u32,
            field("VmRSS:").saturating_sub(field("RssShmem:")),
            cpu_ticks(&stat),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the per-host rows of remote_link stand on: a busy child's CPU time and memory
    /// are counted for the OS user running it.
    #[test]
    fn a_processs_cpu_counts_for_its_user() {
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let me = nix::unistd::getuid().as_raw();
        let ((), seen) = sampled(&[Matcher::Exe(vec![sh])], || {
            let status = std::process::Command::new("/bin/sh")
                .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i + 1)); done"])
                .status()
                .map_err(|e| e.to_string())?;
            assert!(status.success());
            Ok(())
        })
        .unwrap();
        let share = seen[0].by_user.get(&me).cloned().unwrap_or_default();
        assert!(share.cpu_seconds > 0.1, "{seen:?}");
        assert!(share.peak_rss_kb > 0, "{seen:?}");
        assert_eq!(seen[0].by_user.len(), 1, "{seen:?}");
        let name = nix::unistd::User::from_uid(nix::unistd::getuid())
            .unwrap()
            .unwrap()
            .name;
        assert_eq!(seen[0].of_user(&name).cpu_seconds, share.cpu_seconds);
    }
}
