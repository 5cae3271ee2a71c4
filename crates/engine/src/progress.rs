//! Progress of long work: a live line on a terminal, a log line every 10 s otherwise.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Counters {
    pub bytes: AtomicU64,
    pub files: AtomicU64,
}

pub(crate) struct Progress {
    pub counters: Arc<Counters>,
    done: Arc<AtomicBool>,
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

impl Progress {
    pub fn start(what: &'static str, total_bytes: u64, total_files: u64) -> Progress {
        let counters = Arc::new(Counters::default());
        let done = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        let (c, d) = (counters.clone(), done.clone());
        let thread =
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut last_log = Instant::now();
                while !d.load(Ordering::Relaxed) {
                    // Parked, not slept: finish() unparks so the command does not wait on us.
                    std::thread::park_timeout(Duration::from_millis(if tty { 250 } else { 500 }));
                    let bytes = c.bytes.load(Ordering::Relaxed);
                    let files = c.files.load(Ordering::Relaxed);
                    let secs = started.elapsed().as_secs_f64().max(0.001);
                    let rate = bytes as f64 / secs;
                    let eta = if rate > 0.0 && total_bytes > bytes {
                        format!("{:.0}s", (total_bytes - bytes) as f64 / rate)
                    } else {
                        "-".into()
                    };
                    let line =
                        format!(
                    "{what}: {} of {} ({:.0}%), {files}/{total_files} files, {}/s, ETA {eta}",
                    human_bytes(bytes),
                    human_bytes(total_bytes),
                    if total_bytes > 0 { bytes as f64 * 100.0 / total_bytes as f64 } else { 100.0 },
                    human_bytes(rate as u64),
                );
                    if tty {
                        let mut e = std::io::stderr().lock();
                        let _ = write!(e, "\r\x1b[2K{line}");
                        let _ = e.flush();
                    } else if last_log.elapsed() >= Duration::from_secs(10) {
                        log::info!("{line}");
                        last_log = Instant::now();
                    }
                }
                if tty {
                    let _ = write!(std::io::stderr(), "\r\x1b[2K");
                }
            });
        Progress {
            counters,
            done,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
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
