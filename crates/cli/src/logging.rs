//! Logging: levels for the console (standard error) and for a file, set by
//! log-level-console, log-level-file and log-path.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

struct Logger {
    /// A `log::LevelFilter` as usize: `agent run` sets it to the level its job asks for.
    console: AtomicUsize,
    file_level: log::LevelFilter,
    file: Option<Mutex<std::fs::File>>,
}

fn from_usize(n: usize) -> log::LevelFilter {
    log::LevelFilter::iter()
        .find(|l| *l as usize == n)
        .unwrap_or(log::LevelFilter::Trace)
}

impl Logger {
    fn console(&self) -> log::LevelFilter {
        from_usize(self.console.load(Ordering::Relaxed))
    }
}

pgstrata_repo::named! {
    /// A level of log-level-console and log-level-file.
    pub(crate) enum LogLevel {
        Off = "off",
        Error = "error",
        Warn = "warn",
        Info = "info",
        Debug = "debug",
        Trace = "trace",
    }
}

impl LogLevel {
    pub(crate) fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        }
    }
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.target().starts_with("pgstrata")
            && (m.level() <= self.console() || m.level() <= self.file_level)
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        if r.level() <= self.console() {
            let _ = writeln!(std::io::stderr(), "{}: {}", r.level(), r.args());
        }
        if r.level() <= self.file_level {
            if let Some(f) = &self.file {
                let now = chrono::Local::now().format("%Y-%m-%d %H:%M:%S%.3f");
                let _ = writeln!(
                    f.lock().unwrap(),
                    "{now} P{:05} {}: {}",
                    std::process::id(),
                    r.level(),
                    r.args()
                );
            }
        }
    }

    fn flush(&self) {}
}

/// Write an error to the log file only (the console already shows it).
pub(crate) fn error_to_file(msg: &str) {
    if let Some(l) = LOGGER.get() {
        if l.file_level >= log::LevelFilter::Error {
            if let Some(f) = &l.file {
                let now = chrono::Local::now().format("%Y-%m-%d %H:%M:%S%.3f");
                let _ = writeln!(
                    f.lock().unwrap(),
                    "{now} P{:05} ERROR: {msg}",
                    std::process::id()
                );
            }
        }
    }
}

static LOGGER: std::sync::OnceLock<Logger> = std::sync::OnceLock::new();

/// Install the logger. A log file that cannot be opened is reported on the console once.
/// The file is `<log_path>/<stanza>-<command>.log`: `stanza` must be a name config
/// resolution checked (letters, digits, '-', '_'), never a path.
pub(crate) fn init(
    console: log::LevelFilter,
    file_level: log::LevelFilter,
    log_path: &std::path::Path,
    stanza: Option<&str>,
    command: &str,
) {
    let mut file = None;
    if file_level != log::LevelFilter::Off {
        let name = format!("{}-{command}.log", stanza.unwrap_or("all"));
        let p = log_path.join(name);
        match std::fs::create_dir_all(log_path).and_then(|_| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
        }) {
            Ok(f) => file = Some(Mutex::new(f)),
            Err(e) => eprintln!("WARN: cannot open log file {}: {e}", p.display()),
        }
    }
    let max = console.max(if file.is_some() {
        file_level
    } else {
        log::LevelFilter::Off
    });
    let logger = LOGGER.get_or_init(|| Logger {
        console: AtomicUsize::new(console as usize),
        file_level,
        file,
    });
    let _ = log::set_logger(logger);
    log::set_max_level(max);
}

/// Change the console's level (`agent run`: its job's `log-level-console`, which reaches
/// the backup host's terminal through ssh).
pub(crate) fn set_console_level(console: log::LevelFilter) {
    if let Some(l) = LOGGER.get() {
        l.console.store(console as usize, Ordering::Relaxed);
        let file = if l.file.is_some() {
            l.file_level
        } else {
            log::LevelFilter::Off
        };
        log::set_max_level(console.max(file));
    }
}
