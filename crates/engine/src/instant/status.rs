//! `instant-status`: how far an instant restore's hydration is, from the `status.json` its
//! serving process writes every second.

use crate::progress::human_bytes;
use crate::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// What the serving process last wrote.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// `hydrating`, `complete` or `failed`.
    pub state: String,
    pub pid: u32,
    pub files_total: u64,
    pub files_local: u64,
    pub bytes_total: u64,
    pub bytes_local: u64,
    /// Bytes read from the repository (as stored).
    pub bytes_fetched: u64,
    pub fetch_rate_bytes: u64,
    pub eta_seconds: Option<u64>,
    /// Reads (and partial writes) that waited for a fetch, and how long on average.
    pub on_demand_fetches: u64,
    pub on_demand_latency_ms: f64,
    pub on_demand_max_latency_ms: f64,
    /// Once `complete`: files still served through the mount because PostgreSQL has them
    /// open there; each becomes an ordinary file when closed (at PostgreSQL's next
    /// restart at the latest).
    #[serde(default)]
    pub files_open_through_mount: u64,
    pub failed_file: Option<String>,
    pub error: Option<String>,
    /// What `instant-status` exits with when it failed: 4 damage, 3 anything else.
    pub exit_code: Option<i32>,
    /// Unix time of the write.
    pub updated: i64,
}

impl Status {
    /// Replace `status.json` in `dir` (whole: written beside it, then renamed).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join("status.json.tmp");
        let json = serde_json::to_vec_pretty(self).expect("status serializes");
        std::fs::write(&tmp, json)
            .and_then(|()| std::fs::rename(&tmp, dir.join("status.json")))
            .map_err(|e| Error::io(format!("write {}", tmp.display()), e))
    }

    fn read(dir: &Path) -> Result<Status> {
        let path = dir.join("status.json");
        let text = std::fs::read(&path).map_err(|e| {
            Error::io(
                format!(
                    "read {} (no instant restore of this data directory has started serving)",
                    path.display()
                ),
                e,
            )
        })?;
        serde_json::from_slice(&text)
            .map_err(|e| Error::integrity(format!("{}: {e}", path.display())))
    }

    /// Whether the serving process is gone without finishing (killed): while hydrating,
    /// or while files it serves wait to be handed over.
    fn is_orphaned(&self) -> bool {
        (self.state == "hydrating" || self.files_open_through_mount > 0) && !process_runs(self.pid)
    }
}

/// The status of the instant restore of `pg_path`; with `wait`, once hydration completed
/// or failed. Failure (and a serving process gone) is an error with the exit code the
/// status gives (4 damage, 3 otherwise).
pub fn instant_status(pg_path: &Path, wait: bool) -> Result<Status> {
    let dir = super::instant_dir(pg_path)?;
    loop {
        let status = Status::read(&dir)?;
        if status.state == "failed" {
            let kind = match status.exit_code {
                Some(4) => ErrorKind::Integrity,
                _ => ErrorKind::Io,
            };
            return Err(Error::new(
                kind,
                format!(
                    "instant restore of {} failed at {}: {}",
                    pg_path.display(),
                    status.failed_file.as_deref().unwrap_or("?"),
                    status.error.as_deref().unwrap_or("?")
                ),
            ));
        }
        if status.is_orphaned() {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "the instant restore of {} stopped (process {} is gone) at {} of {}: resume it with restore --instant --resume --pg-path={}",
                    pg_path.display(),
                    status.pid,
                    human_bytes(status.bytes_local),
                    human_bytes(status.bytes_total),
                    pg_path.display()
                ),
            ));
        }
        if !wait || status.state == "complete" {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The status for people.
pub fn render_status(s: &Status) -> String {
    let pct = if s.bytes_total > 0 {
        s.bytes_local as f64 * 100.0 / s.bytes_total as f64
    } else {
        100.0
    };
    let eta = match (s.state.as_str(), s.eta_seconds) {
        ("hydrating", Some(eta)) => format!(", about {eta} s left"),
        _ => String::new(),
    };
    let waiting = match s.files_open_through_mount {
        0 => String::new(),
        n => format!(
            "; {n} files still open through the mount (each an ordinary file once PostgreSQL closes it, at its next restart at the latest)"
        ),
    };
    format!(
        "instant restore {}: {} of {} local ({pct:.1} %), {} of {} files; fetching {}/s{eta}; {} on-demand fetches, {:.1} ms on average ({:.1} ms at most){waiting}\n",
        s.state,
        human_bytes(s.bytes_local),
        human_bytes(s.bytes_total),
        s.files_local,
        s.files_total,
        human_bytes(s.fetch_rate_bytes),
        s.on_demand_fetches,
        s.on_demand_latency_ms,
        s.on_demand_max_latency_ms
    )
}

/// Whether process `pid` runs (a zombie, killed and not yet reaped, does not).
fn process_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command name, which is in parentheses.
            let after = stat.rsplit_once(')')?.1;
            after
                .split_whitespace()
                .next()
                .map(|state| state != "Z" && state != "X")
        })
        .unwrap_or(false)
}
