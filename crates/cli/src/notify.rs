//! `notify-command`: tell the operator's program how a command ended.
//!
//! After backup, expire, verify, copy or restore-test, pgstrata runs the configured program
//! on this host with a JSON summary on its standard input (command, stanza, repository,
//! result, exit code, what the command reports, duration, error). The program gets a clean
//! environment (a fixed `PATH` and `LANG` only): pgstrata's own environment holds
//! passphrases and object-store keys, which must not leak into a mail or chat hook. It
//! runs for at most `notify-timeout`, then is killed. Whatever happens to it is logged and
//! never changes the command's exit code: a broken hook must not make a good backup look
//! failed, nor hide a failed one.

use pgstrata_engine::ErrorKind;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

// Names as configured (`notify-on`).
pgstrata_repo::named! {
    pub enum NotifyOn { Failure = "failure", Always = "always" }
}

/// The commands that notify.
pub(crate) const COMMANDS: &[&str] = &["backup", "expire", "verify", "copy", "restore-test"];

/// What to run, and when.
pub(crate) struct Notify {
    pub(crate) program: PathBuf,
    pub(crate) on: NotifyOn,
    pub(crate) timeout: Duration,
}

/// The summary the program reads.
#[derive(Serialize)]
struct Summary<'a> {
    command: &'a str,
    stanza: Option<&'a str>,
    /// The repository the command used (`--repo`, when given).
    repo: Option<u8>,
    result: &'static str,
    exit_code: i32,
    /// What the command reported (its report as `--output=json` gives it), when it got so
    /// far: the backup's label and sizes, the backups expired or copied, verify's verdict.
    report: Option<serde_json::Value>,
    duration_ms: u64,
    error: Option<&'a str>,
    host: String,
    time: String,
}

/// The command's report, kept for the summary ([`report`]).
static REPORT: Mutex<Option<serde_json::Value>> = Mutex::new(None);

/// Keep what the command reports, for the notification.
pub(crate) fn report<T: Serialize>(r: &T) {
    if let Ok(v) = serde_json::to_value(r) {
        *REPORT.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
    }
}

/// How command `command` ended.
pub(crate) struct Outcome<'a> {
    pub(crate) command: &'a str,
    pub(crate) stanza: Option<&'a str>,
    pub(crate) repo: Option<u8>,
    pub(crate) exit_code: i32,
    pub(crate) error: Option<&'a str>,
    pub(crate) started: Instant,
}

impl Notify {
    /// Run the program if `outcome` is one it wants; log what went wrong, if anything.
    pub(crate) fn send(&self, outcome: &Outcome) {
        if self.on == NotifyOn::Failure && outcome.exit_code == 0 {
            return;
        }
        let summary = Summary {
            command: outcome.command,
            stanza: outcome.stanza,
            repo: outcome.repo,
            result: if outcome.exit_code == 0 {
                "ok"
            } else {
                "failed"
            },
            exit_code: outcome.exit_code,
            report: REPORT.lock().unwrap_or_else(|e| e.into_inner()).take(),
            duration_ms: outcome.started.elapsed().as_millis() as u64,
            error: outcome.error,
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        };
        let json = serde_json::to_vec_pretty(&summary).expect("serialize summary");
        match self.run(&json) {
            Ok(()) => log::info!("notify-command {} ran", self.program.display()),
            Err(e) => log::warn!(
                "notify-command {}: {e} (the {} itself {})",
                self.program.display(),
                outcome.command,
                if outcome.exit_code == 0 {
                    "succeeded"
                } else {
                    "failed as reported"
                }
            ),
        }
    }

    /// Run the program with `stdin`, in a clean environment, for at most the timeout.
    fn run(&self, stdin: &[u8]) -> Result<(), pgstrata_engine::Error> {
        let fail = |why: String| pgstrata_engine::Error::new(ErrorKind::Io, why);
        let mut child = std::process::Command::new(&self.program)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .current_dir("/")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("could not be started: {e}")))?;
        // A program that does not read its input must not block us: a write error (it
        // closed its end) is its business.
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin);
        }
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(fail(format!(
                        "still running after {} s (notify-timeout): killed",
                        self.timeout.as_secs()
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(fail(format!("could not be waited for: {e}"))),
            }
        };
        if status.success() {
            return Ok(());
        }
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = (&mut e).take(4096).read_to_string(&mut err);
        }
        Err(fail(format!("{status}: {}", err.trim())))
    }
}
