//! Progress of long work (backup, restore, verify): bytes done of the total, percent, rate
//! and time left.
//!
//! How it shows is one process-wide choice, like the log level (`--progress`, set once by
//! the CLI with [`set_mode`]): on a terminal (or with `on`) a live line on standard error,
//! redrawn four times a second and left showing the final state; off a terminal a log line
//! at most every [`LOG_INTERVAL`], so a cron job's log tells how far a long backup got
//! without filling up; `off` shows nothing. The work itself only bumps [`Counters`]; a
//! thread of its own draws, so a slow terminal never slows the work.

use pgstrata_repo::Named;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often progress goes to the log when it is not shown live.
pub const LOG_INTERVAL: Duration = Duration::from_secs(30);

/// How often the live line is redrawn.
const DRAW_INTERVAL: Duration = Duration::from_millis(250);

pgstrata_repo::named! {
    /// `--progress`: auto (live on a terminal, the log otherwise), on (live line on standard
    /// error even when it is not a terminal), off.
    #[derive(Default)]
    pub enum ProgressMode {
        #[default]
        Auto = "auto",
        On = "on",
        Off = "off",
    }
}

/// The mode in effect, as its index in [`ProgressMode::ALL`].
static MODE: AtomicU8 = AtomicU8::new(0);

/// Choose how progress shows for the rest of the process.
pub fn set_mode(mode: ProgressMode) {
    let index = ProgressMode::ALL.iter().position(|m| *m == mode);
    MODE.store(index.unwrap_or(0) as u8, Ordering::Relaxed);
}

fn mode() -> ProgressMode {
    ProgressMode::ALL[MODE.load(Ordering::Relaxed) as usize]
}

#[derive(Default)]
pub struct Counters {
    pub bytes: AtomicU64,
    pub files: AtomicU64,
}

impl Counters {
    pub fn add(&self, bytes: u64, files: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.files.fetch_add(files, Ordering::Relaxed);
    }
}

pub(crate) struct Progress {
    pub counters: Arc<Counters>,
    /// What the work will come to; it may grow as the work finds more ([`Progress::totals`]).
    totals: Arc<Counters>,
    done: Arc<AtomicBool>,
    /// Set before `done` when the work completed (not on an error's way out).
    completed: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A duration for people: `45s`, `12m05s`, `3h20m`.
fn human_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// One progress line: `what: done of total (percent), files, rate, ETA` (or the time it
/// took, once `finished`).
fn progress_line(
    what: &str,
    (bytes, total_bytes): (u64, u64),
    (files, total_files): (u64, u64),
    elapsed: Duration,
    finished: bool,
    limit: Option<(&str, u64)>,
) -> String {
    let secs = elapsed.as_secs_f64().max(0.001);
    let rate = bytes as f64 / secs;
    let percent = if total_bytes > 0 {
        (bytes as f64 * 100.0 / total_bytes as f64).min(100.0)
    } else {
        100.0
    };
    let tail = if finished {
        format!("done in {}", human_duration(secs))
    } else if rate > 0.0 && total_bytes > bytes {
        format!(
            "ETA {}",
            human_duration((total_bytes - bytes) as f64 / rate)
        )
    } else {
        "ETA -".into()
    };
    let limit = limit
        .map(|(which, l)| format!(" ({which} limit {}/s)", human_bytes(l)))
        .unwrap_or_default();
    format!(
        "{what}: {} of {} ({percent:.0}%), {files}/{total_files} files, {}/s{limit}, {tail}",
        human_bytes(bytes),
        human_bytes(total_bytes),
        human_bytes(rate as u64),
    )
}

/// The rate limit of work that moves `storage`'s bytes, as [`Progress::start`] shows it.
pub(crate) fn repository_limit(storage: &pgstrata_repo::Storage) -> Option<(&'static str, u64)> {
    storage.rate_limit().map(|l| ("repository", l))
}

impl Progress {
    /// Start showing the progress of `what` towards `total_bytes` in `total_files` files;
    /// the work adds to [`Progress::counters`]. Work under a rate limit (`repo-rate-limit`,
    /// `pg-read-rate-limit`) shows it beside the rate: `limit` `("read", bytes/s)`.
    pub fn start(
        what: &'static str,
        total_bytes: u64,
        total_files: u64,
        limit: Option<(&'static str, u64)>,
    ) -> Progress {
        let counters = Arc::new(Counters::default());
        let totals = Arc::new(Counters {
            bytes: AtomicU64::new(total_bytes),
            files: AtomicU64::new(total_files),
        });
        let done = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicBool::new(false));
        let live = match mode() {
            ProgressMode::Off => {
                return Progress {
                    counters,
                    totals,
                    done,
                    completed,
                    thread: None,
                }
            }
            ProgressMode::On => true,
            ProgressMode::Auto => std::io::stderr().is_terminal(),
        };
        let (c, t, d, ok) = (
            counters.clone(),
            totals.clone(),
            done.clone(),
            completed.clone(),
        );
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut last_log = Instant::now();
            let mut logged = false;
            loop {
                let finished = d.load(Ordering::Acquire);
                if finished && !ok.load(Ordering::Relaxed) {
                    // Failed: the error says what happened; a half line would only confuse.
                    if live {
                        let _ = write!(std::io::stderr(), "\r\x1b[2K");
                    }
                    break;
                }
                let line = progress_line(
                    what,
                    (
                        c.bytes.load(Ordering::Relaxed),
                        t.bytes.load(Ordering::Relaxed),
                    ),
                    (
                        c.files.load(Ordering::Relaxed),
                        t.files.load(Ordering::Relaxed),
                    ),
                    started.elapsed(),
                    finished,
                    limit,
                );
                if live {
                    let mut e = std::io::stderr().lock();
                    let _ = write!(e, "\r\x1b[2K{line}{}", if finished { "\n" } else { "" });
                    let _ = e.flush();
                } else if last_log.elapsed() >= LOG_INTERVAL || (finished && logged) {
                    // Work that logged its progress also logs its end; short work stays quiet.
                    log::info!("{line}");
                    last_log = Instant::now();
                    logged = true;
                }
                if finished {
                    break;
                }
                // Parked, not slept: finish() unparks so the command does not wait on us.
                std::thread::park_timeout(DRAW_INTERVAL);
            }
        });
        Progress {
            counters,
            totals,
            done,
            completed,
            thread: Some(thread),
        }
    }

    /// The totals, to add work found after the start to (verify learns each backup's
    /// files as it reads its manifest).
    pub fn totals(&self) -> Arc<Counters> {
        self.totals.clone()
    }

    /// Stop: a live line is drawn a last time, complete.
    pub fn finish(mut self) {
        self.completed.store(true, Ordering::Relaxed);
        self.stop();
    }

    fn stop(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_tells_percent_rate_and_time_left() {
        let line = progress_line(
            "backup",
            (256 << 20, 1 << 30),
            (10, 40),
            Duration::from_secs(4),
            false,
            None,
        );
        assert_eq!(
            line,
            "backup: 256.0 MiB of 1.0 GiB (25%), 10/40 files, 64.0 MiB/s, ETA 12s"
        );
        let line = progress_line(
            "backup",
            (256 << 20, 1 << 30),
            (10, 40),
            Duration::from_secs(16),
            false,
            Some(("read", 16 << 20)),
        );
        assert!(
            line.contains("16.0 MiB/s (read limit 16.0 MiB/s), ETA 48s"),
            "{line}"
        );
        let line = progress_line(
            "restore",
            (1 << 30, 1 << 30),
            (40, 40),
            Duration::from_secs(75),
            true,
            None,
        );
        assert!(
            line.contains("(100%)") && line.ends_with("done in 1m15s"),
            "{line}"
        );
        assert_eq!(human_duration(7322.0), "2h02m");
    }

    #[test]
    fn mode_names() {
        pgstrata_repo::named::check_named::<ProgressMode>();
    }
}
