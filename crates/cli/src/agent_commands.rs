//! The agent commands (`agent repo`, `agent run`) and the backup host's side of
//! `pg-remote`: pgstrata across hosts, as the binary does it (the protocol and the serving
//! side are `pgstrata-remote`, whose `agent` module this one drives).
//!
//! - `repo-remote` needs nothing here: its repository opens as a `RemoteStore`, and every
//!   command works through it unchanged. The far side is `pgstrata agent repo`, which
//!   serves only the stanzas its forced command names, append-only.
//! - `pg-remote`: on the backup host, stanza-create, check and backup do not run here.
//!   [`run_on_pg_remote`] starts `pgstrata agent run` on the database host over SSH, sends
//!   it a [`Job`] (which job, the stanza, and the few per-job choices the option table
//!   lets the backup host make: backup type, compression, process-max, ...), and serves
//!   this host's repository to it, that stanza only and append-only, until it is done.
//!   The job runs there ([`agent`]), next to the data, with the database host's own
//!   settings (data directory, connection, standby, passphrase) from its own
//!   configuration: it connects to PostgreSQL, walks, reads, checksums, hashes and
//!   compresses the data directory with `process-max` workers, and only compressed frames
//!   and metadata cross the link. Its log and progress reach this host's stderr through
//!   ssh; its standard output comes back in the final frame and is printed here, so
//!   `label=$(pgstrata backup)` still works. The stanza lock is taken, and retention
//!   applied, here.
//!
//! Why run the job there rather than stream files from there: the backup engine then is
//! one code path, the same on one host and two; each change-detection step (WAL change
//! maps, page LSNs, block hashes against the prior manifest) runs where reading is cheap;
//! and a dropped link fails the job on both sides (the agent's repository requests fail;
//! PostgreSQL ends the backup with the session), leaving only invisible objects.
//!
//! Why a job and not a command line: each host can harm only what it owns. The backup
//! host may ask for a backup, not choose which data directory is read, which server or
//! ssh client is run, or which file is parsed as a configuration; the database host may
//! add a backup, not remove one.

use crate::args::{self, Agent, Invocation, RemoteJob, Repo};
use crate::options;
use pgstrata_engine::{Error, ErrorKind};
use pgstrata_remote::agent::{Policy, Reseal, Serving};
use pgstrata_remote::protocol::{self, Done, Job, JobKind, Message};
use pgstrata_remote::{RemoteStore, SshSession};
use pgstrata_repo::cipher::{SessionKey, SessionReseal};
use pgstrata_repo::manifest::patch::Rebuilder;
use pgstrata_repo::Storage;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// `pgstrata agent repo` and `pgstrata agent run`.
pub(crate) fn agent(
    agent: &Agent,
    run_command: fn(&Invocation) -> Result<i32, Error>,
) -> Result<i32, Error> {
    let stanzas = agent.stanzas.clone();
    match agent.mode.as_deref() {
        Some("repo") => {
            if stanzas.is_empty() {
                return Err(Error::config(
                    "agent repo serves only the stanzas it is given: put --stanza=NAME (repeatable) in the forced command of authorized_keys",
                ));
            }
            runtime().block_on(pgstrata_remote::agent::serve_repo(
                &agent.repo_path,
                Some(Arc::new(Rebuilder::without_key())),
                Policy::append_only(stanzas),
                agent.buffer_max,
            ))?;
            Ok(0)
        }
        Some("run") => agent_run(&stanzas, run_command),
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

/// The job's invocation on this host: this agent's own command line (the forced command:
/// `--config`, log options), the job's stanza and command, and the job's choices, each
/// one the option table lets a backup host make for that command; settings from this
/// host's configuration file and environment, as any local command reads them.
fn job_invocation(own_args: &[String], stanzas: &[String], job: &Job) -> Result<Invocation, Error> {
    let command = job.job.command();
    pgstrata_repo::layout::check_stanza_name(&job.stanza)
        .map_err(|why| Error::config(format!("the backup host's job: {why}")))?;
    if !stanzas.is_empty() && !stanzas.contains(&job.stanza) {
        return Err(Error::config(format!(
            "the backup host asked for stanza '{}'; this agent works for {} only (its --stanza)",
            job.stanza,
            stanzas.join(", ")
        )));
    }
    // This agent's own words, but for its command and its stanzas (the job names one).
    let mut argv = Vec::new();
    let mut words = own_args.iter();
    while let Some(w) = words.next() {
        match w.as_str() {
            "--stanza" => {
                words.next();
            }
            "agent" | "run" => {}
            _ if w.starts_with("--stanza=") => {}
            _ => argv.push(w.clone()),
        }
    }
    argv.push(format!("--stanza={}", job.stanza));
    argv.push(command.to_string());
    for (name, value) in &job.choices {
        match options::find(name, command) {
            Some(def) if def.peer => argv.push(format!("--{name}={value}")),
            _ => {
                return Err(Error::config(format!(
                    "the backup host sent option '{name}' for {command}; only the database host sets it (in its own configuration): refused"
                )))
            }
        }
    }
    let env = std::env::vars().collect();
    // The job's command refuses pg-remote and standby-remote in this host's configuration
    // when it is parsed (`args::parse`): this host does the job itself.
    args::resolve(&argv, &env).map_err(Error::config)
}

/// `pgstrata agent run` on the database host: the hellos, the [`Job`], the job with every
/// repository opened as the backup host's, and the [`Done`].
fn agent_run(
    stanzas: &[String],
    run_command: fn(&Invocation) -> Result<i32, Error>,
) -> Result<i32, Error> {
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
    pgstrata_remote::client::hello(&mut input, &mut protocol_out, "the backup host", true)?;
    let job = match protocol::read_frame(&mut input) {
        Ok(Some((Message::Job(job), _))) => job,
        Ok(other) => {
            return Err(io_err(
                "the backup host did not send a job",
                format!("{other:?}"),
            ))
        }
        Err(e) => return Err(io_err("read the job", e)),
    };
    if let Some(wire) = &job.sealing {
        let session =
            SessionKey::from_wire(wire).map_err(|e| io_err("the backup host's session key", e))?;
        pgstrata_engine::encryption::use_session_key(session);
    }
    let origin = RemoteStore::origin(std::io::stdin(), protocol_out);
    Storage::serve_every_open_from(origin.clone(), "the backup host's repository".to_string())?;
    args::enter_agent_run();

    let own_args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = job_invocation(&own_args, stanzas, &job).and_then(|inv| {
        crate::logging::set_console_level(args::reporting(&inv).console);
        log::info!(
            "agent: {} of stanza '{}' for the backup host",
            job.job.command(),
            job.stanza
        );
        std::panic::catch_unwind(|| run_command(&inv)).unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Io,
                "the agent stopped on an internal error (a bug)",
            ))
        })
    });
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
    runtime().block_on(origin.finish(done))?;
    Ok(0)
}

/// Run `job` on its target (the database host of pg-remote, or the standby's host of
/// standby-remote), once for each repository of `views`, serving each repository from
/// here (the job's stanza only, append-only). A backup holds the stanza lock here while
/// it runs. Returns the exit code; the agent's errors are printed as they would be by a
/// local run.
pub(crate) fn run_on_pg_remote(job: &RemoteJob, views: &[&Repo]) -> Result<i32, Error> {
    let rt = runtime();
    let kind = job.kind;
    for view in views {
        let settings = &view.settings;
        let storage = if kind == JobKind::StanzaCreate {
            settings.storage_or_create()?
        } else {
            settings.storage()?
        };
        let message = Job {
            job: kind,
            stanza: settings.stanza.clone(),
            choices: view.peer_choices.clone(),
            sealing: None,
        };
        let session = serve_job(job, settings, &storage, &message);
        let done = if kind == JobKind::Backup {
            rt.block_on(pgstrata_engine::commands::backup::with_backup_lock(
                settings, session,
            ))?
        } else {
            rt.block_on(session)?
        };
        print!("{}", done.stdout);
        if let Some(e) = &done.error {
            let msg = if views.len() > 1 {
                format!("repo{}: {e}", settings.repo_index)
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

/// Start `agent run` on the remote job's target, send it `job`, and serve `storage` to it
/// until it is done.
async fn serve_job(
    remote: &RemoteJob,
    settings: &pgstrata_engine::Settings,
    storage: &Storage,
    job: &Job,
) -> Result<Done, Error> {
    let target = &remote.target;
    let command = remote.kind.command();
    // Without a forced command these words are the agent's command line; with one (as the
    // README sets up), the database host's own words replace them.
    let mut agent_args = vec![
        "agent".to_string(),
        "run".to_string(),
        format!("--stanza={}", job.stanza),
    ];
    agent_args.extend(
        remote
            .config
            .as_ref()
            .map(|c| format!("--config={}", c.display())),
    );
    // An encrypted stanza: the agent seals with a session key of its own, and this host
    // reseals for it what it reads; the passphrase and master keys stay here.
    let master =
        pgstrata_engine::encryption::master_for_peer(settings, job.job == JobKind::StanzaCreate)
            .await?;
    let mut job = job.clone();
    let reseal = match &master {
        Some(m) => {
            let session = m.session_for_peer().map_err(Error::from)?;
            job.sealing = Some(session.to_wire().to_string());
            Some(Arc::new(SessionReseal::new(m.clone(), session)) as Arc<dyn Reseal>)
        }
        None => None,
    };
    let mut session =
        SshSession::start(target, &agent_args).map_err(|e| Error::from(e).context(command))?;
    session
        .output
        .write_all(&protocol::frame(&Message::Job(job.clone()), b""))
        .and_then(|_| session.output.flush())
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("send the job to the agent on {}: {e}", target.host),
            )
        })?;
    let SshSession {
        mut child,
        input,
        output,
    } = session;
    // The agent sends a backup's manifest as a patch against the prior one; this host
    // rebuilds it, and seals it with the stanza's master key.
    let rebuilder = Rebuilder::with_key(async move { master });
    let serving = Serving {
        store: storage.object_store(),
        rebuild: Some(Arc::new(rebuilder)),
        reseal,
        policy: Policy::append_only(vec![job.stanza.clone()]),
        buffer_max: remote.buffer_max,
    };
    let served = pgstrata_remote::agent::serve(serving, input, output).await;
    let status = child.wait().ok();
    match served {
        Ok(Some(done)) => Ok(done),
        Ok(None) | Err(_) => {
            let why = served
                .err()
                .map_or_else(|| "it closed the connection".into(), |e| e.to_string());
            Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{} on {} did not finish: {why} (ssh exited with {}); nothing it wrote is visible in the repository, and the next run starts afresh",
                    command,
                    target.host,
                    status
                        .and_then(|s| s.code())
                        .map_or("a signal".to_string(), |c| format!("status {c}"))
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The job runs with the settings of the agent's own configuration, named on its
    /// command line in either spelling, and the backup host's choices on top.
    #[test]
    fn a_job_runs_with_this_hosts_configuration_and_the_peers_choices() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("db.toml");
        std::fs::write(
            &config,
            "[global]\nprocess-max = 8\n[main]\npg-path = \"/srv/pg/main\"\n",
        )
        .unwrap();
        let own: Vec<String> = [
            "agent",
            "run",
            "--config",
            config.to_str().unwrap(),
            "--stanza",
            "main",
        ]
        .map(String::from)
        .to_vec();
        let job = Job {
            job: JobKind::Backup,
            stanza: "main".into(),
            choices: vec![
                ("type".into(), "full".into()),
                ("process-max".into(), "2".into()),
            ],
            sealing: None,
        };
        let inv = job_invocation(&own, &["main".to_string()], &job).unwrap();
        let Ok(args::Command::Backup(backup)) = args::command(&inv) else {
            panic!("a backup here")
        };
        let s = &backup.repos.selected().settings;
        assert_eq!(
            s.pg_path.as_deref(),
            Some(std::path::Path::new("/srv/pg/main"))
        );
        assert_eq!(s.process_max.get(), 2);
        assert_eq!(
            backup.options.backup_type,
            pgstrata_repo::manifest::BackupType::Full
        );
        let mut other = job.clone();
        other.choices = vec![("pg-path".into(), "/etc".into())];
        let e = job_invocation(&own, &["main".to_string()], &other).unwrap_err();
        assert!(e.to_string().contains("'pg-path'"), "{e}");
    }
}
