//! pgstrata across hosts, as the binary does it (the protocol is `pgstrata-remote`).
//!
//! - `repo-remote` needs nothing here: its repository opens as a `RemoteStore`, and every
//!   command works through it unchanged. The far side is `pgstrata agent repo`.
//! - `pg-remote`: on the backup host, stanza-create, check and backup do not run here.
//!   [`run_on_pg_remote`] starts `pgstrata agent run` on the database host over SSH, sends
//!   it the command and this host's resolved options for the stanza (in a frame: they may
//!   hold the cipher passphrase), and serves this host's repository to it until it is done.
//!   The command runs there ([`agent`]), next to the data: it connects to PostgreSQL,
//!   walks, reads, checksums, hashes and compresses (and encrypts) the data directory with
//!   `process-max` workers, and only compressed frames and metadata cross the link. Its
//!   log and progress reach this host's stderr through ssh; its standard output comes back
//!   in the final frame and is printed here, so `label=$(pgstrata backup)` still works.
//!
//! Why run the command there rather than stream files from there: the backup engine then
//! is one code path, the same on one host and two; each change-detection step (WAL change
//! maps, page LSNs, block hashes against the prior manifest) runs where reading is cheap;
//! and a dropped link fails the command on both sides (the agent's repository requests
//! fail; PostgreSQL ends the backup with the session), leaving only invisible objects.

use crate::config::{self, Invocation};
use crate::options;
use pgstrata_engine::{Error, ErrorKind};
use pgstrata_remote::protocol::{self, Done, Message, Run};
use pgstrata_remote::{RemoteStore, SshSession, SshTarget};
use pgstrata_repo::manifest::patch::Rebuilder;
use pgstrata_repo::Storage;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// Commands that run on the database host when `pg-remote` is set.
pub(crate) const PG_REMOTE_COMMANDS: &[&str] = &["stanza-create", "check", "backup"];

/// Options never sent to the agent: the remote hop itself, and where this host logs.
const NOT_FORWARDED: &[&str] = &[
    "pg-remote",
    "pg-remote-port",
    "pg-remote-cmd",
    "standby-remote",
    "standby-remote-port",
    "standby-remote-cmd",
    "config",
    "repo",
    "log-path",
    "log-level-file",
];

/// `pgstrata agent repo` and `pgstrata agent run`.
pub(crate) fn agent(
    inv: &Invocation,
    run_command: fn(&Invocation) -> Result<i32, Error>,
) -> Result<i32, Error> {
    match inv.args.first().map(String::as_str) {
        Some("repo") => {
            let root = std::path::PathBuf::from(inv.text("repo-path"));
            runtime()
                .block_on(pgstrata_remote::agent::serve_repo(
                    &root,
                    Some(Arc::new(Rebuilder::without_key())),
                ))
                .map_err(|m| Error::new(ErrorKind::Io, m))?;
            Ok(0)
        }
        Some("run") => agent_run(run_command),
        _ => Err(Error::config(
            "agent is started by pgstrata over SSH: 'agent repo' (repo-remote) or 'agent run' (pg-remote)",
        )),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("start async runtime")
}

fn io_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("agent: {what}: {e}"))
}

/// `pgstrata agent run` on the database host: the hellos, the [`Run`], the command with
/// every repository opened as the backup host's, and the [`Done`].
fn agent_run(run_command: fn(&Invocation) -> Result<i32, Error>) -> Result<i32, Error> {
    // The protocol keeps the real stdout; the command's own output goes into a pipe and
    // travels back in the Done frame (a println! must not land in the frame stream).
    let protocol_out = nix::unistd::dup(1).map_err(|e| io_err("dup stdout", e))?;
    // SAFETY: dup just returned this descriptor, owned by nobody else.
    let mut protocol_out = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(protocol_out) });
    let (captured_r, captured_w) = nix::unistd::pipe().map_err(|e| io_err("pipe", e))?;
    nix::unistd::dup2(captured_w.as_raw_fd(), 1).map_err(|e| io_err("dup2", e))?;
    drop(captured_w);
    let capture = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = std::fs::File::from(captured_r).read_to_end(&mut out);
        out
    });

    let mut input = std::io::stdin();
    pgstrata_remote::client::hello(&mut input, &mut protocol_out, "the backup host", true)
        .map_err(|e| Error::new(ErrorKind::Io, String::from(e)))?;
    let run = match protocol::read_frame(&mut input) {
        Ok(Some((Message::Run(run), _))) => run,
        Ok(other) => {
            return Err(io_err(
                "the backup host did not send a command",
                format!("{other:?}"),
            ))
        }
        Err(e) => return Err(io_err("read the command", e)),
    };
    let origin = RemoteStore::origin(std::io::stdin(), protocol_out);
    Storage::serve_every_open_from(origin.clone(), "the backup host's repository".to_string())?;

    let mut argv = vec!["--config=/dev/null".to_string()];
    argv.extend(run.args.iter().cloned());
    let env = run.env.into_iter().collect();
    let outcome = match config::resolve(&argv, &env) {
        Err(msg) => Err(Error::config(msg)),
        Ok(inv) => std::panic::catch_unwind(|| run_command(&inv)).unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Io,
                "the agent stopped on an internal error (a bug)",
            ))
        }),
    };
    let _ = std::io::stdout().flush();
    // Close our end of the capture pipe so its reader sees the end.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
    let stdout = String::from_utf8_lossy(&capture.join().unwrap_or_default()).into_owned();
    let done = match outcome {
        Ok(code) => Done {
            exit_code: code,
            stdout,
            error: None,
        },
        Err(e) => Done {
            exit_code: e.exit_code(),
            stdout,
            error: Some(e.to_string()),
        },
    };
    runtime()
        .block_on(origin.finish(done))
        .map_err(|m| Error::new(ErrorKind::Io, m))?;
    Ok(0)
}

/// The database host of `inv`, when `pg-remote` is set and the command runs there.
pub(crate) fn pg_remote(inv: &Invocation) -> Option<SshTarget> {
    if !PG_REMOTE_COMMANDS.contains(&inv.command.as_str()) {
        return None;
    }
    Some(SshTarget {
        host: inv.get("pg-remote")?.to_string(),
        port: inv.int_opt("pg-remote-port"),
        ssh: inv.text("cmd-ssh").to_string(),
        remote_cmd: inv.text("pg-remote-cmd").to_string(),
    })
}

/// The standby's host, when a backup from a standby on another host runs there
/// (`standby-remote`): the bulk (every relation file) is read where it is, and the
/// primary's few other files come over its database connection (so `pg-path` is not sent:
/// the primary's data directory is not on that host).
pub(crate) fn standby_remote(inv: &Invocation) -> Option<SshTarget> {
    if inv.command != "backup" || !inv.flag("backup-standby") {
        return None;
    }
    Some(SshTarget {
        host: inv.get("standby-remote")?.to_string(),
        port: inv.int_opt("standby-remote-port"),
        ssh: inv.text("cmd-ssh").to_string(),
        remote_cmd: inv.text("standby-remote-cmd").to_string(),
    })
}

/// Run `inv` on `target` (the database host of pg-remote, or the standby's host of
/// standby-remote), once for each repository it covers, serving each repository from here. Returns the exit code; the agent's errors
/// are printed as they would be by a local run.
pub(crate) fn run_on_pg_remote(
    inv: &Invocation,
    target: &SshTarget,
    views: &[&Invocation],
) -> Result<i32, Error> {
    let rt = runtime();
    for view in views {
        let settings = crate::settings_of(view)?;
        let storage = if inv.command == "stanza-create" {
            Storage::open_or_create(&settings.repo)?
        } else {
            settings.storage()?
        };
        let run = run_message(inv, view);
        let agent_args = vec![
            "agent".to_string(),
            "run".to_string(),
            format!("--log-level-console={}", inv.text("log-level-console")),
        ];
        let mut session = SshSession::start(target, &agent_args)
            .map_err(|m| Error::new(ErrorKind::Io, format!("{}: {m}", inv.command)))?;
        session
            .output
            .write_all(&protocol::frame(&Message::Run(run), b""))
            .and_then(|_| session.output.flush())
            .map_err(|e| {
                Error::new(
                    ErrorKind::Io,
                    format!("send the command to the agent on {}: {e}", target.host),
                )
            })?;
        let SshSession {
            mut child,
            input,
            output,
        } = session;
        // The agent sends a backup's manifest as a patch against the prior one; rebuilding
        // an encrypted stanza's needs its key, opened here (Argon2id) while the agent works.
        let key = (inv.command == "backup").then(|| {
            rt.spawn(async move {
                pgstrata_engine::keys::stanza_cipher(&settings)
                    .await
                    .inspect_err(|e| log::info!("manifest patches are sent whole: {e}"))
                    .ok()
                    .flatten()
            })
        });
        let rebuilder = Rebuilder::with_key(async move {
            match key {
                Some(k) => k.await.ok().flatten(),
                None => None,
            }
        });
        let served = rt.block_on(pgstrata_remote::agent::serve(
            storage.object_store(),
            Some(Arc::new(rebuilder)),
            input,
            output,
        ));
        let status = child.wait().ok();
        let done = match served {
            Ok(Some(done)) => done,
            Ok(None) | Err(_) => {
                let why = served
                    .err()
                    .unwrap_or_else(|| "it closed the connection".into());
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{} on {} did not finish: {why} (ssh exited with {}); nothing it wrote is visible in the repository, and the next run starts afresh",
                        inv.command,
                        target.host,
                        status
                            .and_then(|s| s.code())
                            .map_or("a signal".to_string(), |c| format!("status {c}"))
                    ),
                ));
            }
        };
        print!("{}", done.stdout);
        if let Some(e) = &done.error {
            let msg = if views.len() > 1 {
                format!("repo{}: {e}", view.repo_index)
            } else {
                e.clone()
            };
            eprintln!("ERROR: {msg}");
            crate::logging::error_to_file(&msg);
        }
        if done.exit_code != 0 {
            return Ok(done.exit_code);
        }
    }
    Ok(0)
}

/// The command and the options of repository view `view` as the agent gets them.
fn run_message(inv: &Invocation, view: &Invocation) -> Run {
    // standby-remote, when set, is where the command runs (it goes before pg-remote), and
    // the primary's data directory is not there.
    let on_standby_host = standby_remote(inv).is_some();
    let mut args = vec![inv.command.clone()];
    for (name, values) in view.lists() {
        args.extend(values.iter().map(|v| format!("--{name}={v}")));
    }
    args.extend(inv.args.iter().cloned());
    let env = view
        .values()
        .filter(|(name, _)| !NOT_FORWARDED.contains(name))
        .filter(|(name, _)| !(on_standby_host && *name == "pg-path"))
        .map(|(name, value)| (options::env_name(name), value.to_string()))
        .collect();
    Run { args, env }
}
