//! The parser: an [`Invocation`]'s resolved values into a typed [`Command`]. The one module
//! that reads options by name; its tests check every command reads every option the
//! table lists for it, under the names the table gives.

use super::resolve::Invocation;
use super::{
    Agent, ArchiveGet, ArchivePush, Backup, Command, Copy, KeyAdd, RemoteJob, Repo, Report,
    Reporting, Repos, Restore, RestoreTest, Verify,
};
use crate::logging::LogLevel;
use crate::options;
use pgstrata_engine::commands::archive::AsyncOptions;
use pgstrata_engine::commands::backup::BackupOptions;
use pgstrata_engine::commands::expire::ExpireOptions;
use pgstrata_engine::commands::restore::RestoreOptions;
use pgstrata_engine::commands::restore_test::RestoreTestOptions;
use pgstrata_engine::{Error, Settings, StandbySource};
use pgstrata_remote::protocol::JobKind;
use pgstrata_repo::cipher::Passphrase;
use pgstrata_repo::codec::Compression;
use pgstrata_repo::s3_versions::{LockMode, ObjectLock};
use pgstrata_repo::storage::{AzureConfig, GcsConfig, RepoConfig, S3Config, Secret, SshTarget};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

/// How the run reports (log levels, log file, progress): set up before the command runs.
pub(crate) fn reporting(inv: &Invocation) -> Reporting {
    let console = inv.choice::<LogLevel>("log-level-console").filter();
    Reporting {
        // The demo tells its story at info level.
        console: if inv.command == "demo" {
            log::LevelFilter::Info
        } else {
            console
        },
        file: inv.choice::<LogLevel>("log-level-file").filter(),
        log_path: PathBuf::from(inv.text("log-path")),
        stanza: inv.stanza().map(str::to_string),
        progress: options::find("progress", &inv.command).map(|_| inv.choice("progress")),
        notify: options::find("notify-command", &inv.command).and_then(|_| {
            let on = inv.choice("notify-on");
            let timeout = std::time::Duration::from_secs(inv.int("notify-timeout"));
            let program = PathBuf::from(inv.get("notify-command")?);
            Some(crate::notify::Notify {
                program,
                on,
                timeout,
            })
        }),
        repo: options::find("repo", &inv.command).and_then(|_| inv.int_opt("repo")),
    }
}

/// The command `inv` asks for, with its settings.
pub(crate) fn command(inv: &Invocation) -> Result<Command, Error> {
    let first_arg = || inv.args.first().cloned();
    Ok(match inv.command.as_str() {
        "help" => Command::Help { topic: first_arg() },
        "completions" => Command::Completions { shell: first_arg() },
        "version" => Command::Version,
        "demo" => Command::Demo {
            pg_bin: path(inv, "pg-bin"),
        },
        "agent" => Command::Agent(agent(inv)?),
        "stanza-create" | "check" | "backup" => on_database_host(inv)?,
        "restore" => Command::Restore(restore(inv)?),
        "restore-test" => Command::RestoreTest(restore_test(inv)?),
        "restore-table" => Command::RestoreTable(restore_table(inv)?),
        "archive-push" => Command::ArchivePush(archive_push(inv)?),
        "archive-get" => Command::ArchiveGet(archive_get(inv)?),
        "expire" => Command::Expire {
            repos: repos(inv)?,
            output: inv.choice("output"),
        },
        "info" => Command::Info(report(inv)?),
        "verify" => Command::Verify(Verify {
            report: report(inv)?,
            repair: inv.flag("repair"),
        }),
        "copy" => Command::Copy(Copy {
            repos: repos(inv)?,
            from_repo: inv.int("from-repo"),
            options: pgstrata_engine::commands::copy::CopyOptions {
                set: inv.get("set").map(str::to_string),
            },
            output: inv.choice("output"),
        }),
        "instant-status" => Command::InstantStatus {
            pg_path: path(inv, "pg-path")
                .ok_or_else(|| Error::config("instant-status needs --pg-path"))?,
            wait: inv.flag("wait"),
            output: inv.choice("output"),
        },
        "wal-receive" => Command::WalReceive {
            repos: repos(inv)?,
            options: pgstrata_engine::commands::wal_receive::WalReceiveOptions {
                flush_interval: Duration::from_secs(inv.int("wal-receive-flush-interval")),
                synchronous: inv.flag("wal-receive-synchronous"),
            },
        },
        "key-add" => Command::KeyAdd(KeyAdd {
            repos: repos(inv)?,
            new_pass: inv
                .get("new-cipher-pass")
                .map(|p| zeroize::Zeroizing::new(p.to_string())),
            new_pass_file: path(inv, "new-cipher-pass-file"),
        }),
        "key-list" => Command::KeyList {
            repos: repos(inv)?,
            output: inv.choice("output"),
        },
        "annotate" => Command::Annotate {
            repos: repos(inv)?,
            options: annotate_options(inv)?,
            output: inv.choice("output"),
        },
        "stanza-upgrade" => Command::StanzaUpgrade(repos(inv)?),
        "stanza-delete" => Command::StanzaDelete {
            repos: repos(inv)?,
            force: inv.flag("force"),
        },
        "repo-ls" => Command::RepoLs {
            repos: repos(inv)?,
            path: first_arg(),
            recurse: inv.flag("recurse"),
            output: inv.choice("output"),
        },
        "repo-get" => Command::RepoGet {
            repos: repos(inv)?,
            path: first_arg(),
        },
        "key-remove" => {
            let repos = repos(inv)?;
            let key_id = inv.require("key-id").map_err(Error::config)?.to_string();
            Command::KeyRemove { repos, key_id }
        }
        other => return Err(Error::config(format!("unknown command '{other}'"))),
    })
}

fn path(inv: &Invocation, name: &str) -> Option<PathBuf> {
    inv.get(name).map(PathBuf::from)
}

/// `process-max`: the table's minimum is 1, so it is never zero.
fn process_max(inv: &Invocation) -> NonZeroUsize {
    NonZeroUsize::new(inv.int("process-max")).expect("the option table's minimum is 1")
}

fn agent(inv: &Invocation) -> Result<Agent, Error> {
    let stanzas = inv.list("stanza").to_vec();
    for s in &stanzas {
        pgstrata_repo::layout::check_stanza_name(s)
            .map_err(|why| Error::config(format!("agent: --stanza: {why}")))?;
    }
    Ok(Agent {
        mode: inv.args.first().cloned(),
        stanzas,
        repo_path: PathBuf::from(inv.text("repo-path")),
        buffer_max: inv.int("agent-buffer-max"),
    })
}

/// An ssh target: `host` (if set), its port and pgstrata's path there.
fn ssh_target(inv: &Invocation, host: &str, port: &str, cmd: &str) -> Option<SshTarget> {
    let (port, remote_cmd) = (inv.int_opt(port), inv.text(cmd).to_string());
    let ssh = inv.text("cmd-ssh").to_string();
    Some(SshTarget {
        host: inv.get(host)?.to_string(),
        port,
        ssh,
        remote_cmd,
    })
}

/// stanza-create, check and backup: here, or as a job on the database host (`pg-remote`)
/// or, for a backup from a standby, on the standby's host (`standby-remote`).
fn on_database_host(inv: &Invocation) -> Result<Command, Error> {
    let kind = JobKind::from_command(&inv.command).expect("a database-host command");
    let pg_remote = ssh_target(inv, "pg-remote", "pg-remote-port", "pg-remote-cmd");
    let pg_remote_config = path(inv, "pg-remote-config");
    let (standby_remote, standby_remote_config, backup_standby) = if kind == JobKind::Backup {
        (
            ssh_target(
                inv,
                "standby-remote",
                "standby-remote-port",
                "standby-remote-cmd",
            ),
            path(inv, "standby-remote-config"),
            inv.flag("backup-standby"),
        )
    } else {
        (None, None, false)
    };
    let buffer_max = inv.int("agent-buffer-max");
    if super::in_agent_run() {
        let hop = [
            ("pg-remote", &pg_remote),
            ("standby-remote", &standby_remote),
        ]
        .into_iter()
        .find_map(|(name, target)| target.as_ref().map(|_| name));
        if let Some(hop) = hop {
            return Err(Error::config(format!(
                "{hop} is set for stanza '{}' in this host's configuration, where the agent does the backup host's jobs: it belongs in the backup host's configuration",
                inv.stanza().unwrap_or_default()
            )));
        }
    }
    let elsewhere = match (standby_remote.filter(|_| backup_standby), pg_remote) {
        (Some(standby), _) => Some((standby, standby_remote_config)),
        (None, Some(db)) => Some((db, pg_remote_config)),
        (None, None) => None,
    };
    let repos = repos(inv)?;
    if let Some((target, config)) = elsewhere {
        return Ok(Command::OnAnotherHost(RemoteJob {
            kind,
            target,
            config,
            repos,
            buffer_max,
        }));
    }
    Ok(match kind {
        JobKind::StanzaCreate => Command::StanzaCreate(repos),
        JobKind::Check => Command::Check(repos),
        JobKind::Backup => Command::Backup(Backup {
            repos,
            options: backup_options(inv)?,
        }),
    })
}

/// Every configured repository's settings, after checking the one `--repo` names is.
fn repos(inv: &Invocation) -> Result<Repos, Error> {
    inv.selected_repo().map_err(Error::config)?;
    let mut views: Vec<&Invocation> = inv.repo_views().collect();
    views.sort_by_key(|v| v.repo_index);
    let all = views
        .into_iter()
        .map(|view| {
            Ok(Repo {
                settings: settings(view)?,
                expire: expire_options(view),
                peer_choices: peer_choices(view),
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(Repos {
        all,
        chosen: inv.int_opt("repo"),
    })
}

/// The settings of repository view `inv`.
fn settings(inv: &Invocation) -> Result<Settings, Error> {
    let stanza = inv.require("stanza").map_err(Error::config)?.to_string();
    let compression = Compression::new(inv.choice("compress-type"), inv.int_opt("compress-level"))?;
    let bundle_limit = inv.int("bundle-limit");
    Ok(Settings {
        stanza: stanza.clone(),
        repo_index: inv.repo_index,
        repo: repo_config(inv)?,
        opened: None,
        pg_path: path(inv, "pg-path"),
        pg_host: Some(inv.text("pg-host").to_string()),
        pg_port: inv.int("pg-port"),
        pg_user: inv.get("pg-user").map(str::to_string),
        pg_database: inv.text("pg-database").to_string(),
        pg_sslmode: inv.choice("pg-sslmode"),
        pg_sslrootcert: path(inv, "pg-sslrootcert"),
        compression,
        process_max: process_max(inv),
        start_fast: inv.flag("start-fast"),
        archive_timeout: Duration::from_secs(inv.int("archive-timeout")),
        archive_lag_max: Duration::from_secs(inv.int("archive-lag-max")),
        lock_path: inv.text("lock-path").into(),
        config_file: inv.config_file.clone(),
        frame_size: pgstrata_repo::pack::DEFAULT_FRAME_SIZE,
        pack_size: inv.int("bundle-size"),
        bundle_limit: if inv.flag("bundle") { bundle_limit } else { 0 },
        cipher_type: inv.choice("repo-cipher-type"),
        cipher_pass: inv.get("repo-cipher-pass").map(Passphrase::new),
        cipher_key_cache: inv.flag("repo-cipher-key-cache"),
        standby: standby_source(inv)?,
        state_path: Some(inv.text("state-path").into()),
        wal_receive_slot: inv.get("wal-receive-slot").map_or_else(
            || pgstrata_engine::commands::wal_receive::default_slot(&stanza),
            str::to_string,
        ),
        pg_read_rate_limit: inv.int_opt("pg-read-rate-limit"),
    })
}

fn repo_config(inv: &Invocation) -> Result<RepoConfig, Error> {
    let get = |n: &str| inv.get(n).map(str::to_string);
    Ok(RepoConfig {
        kind: inv.choice("repo-type"),
        path: inv.text("repo-path").to_string(),
        s3: S3Config {
            bucket: get("repo-s3-bucket").unwrap_or_default(),
            endpoint: get("repo-s3-endpoint"),
            region: get("repo-s3-region"),
            key: get("repo-s3-key").map(Secret::from),
            key_secret: get("repo-s3-key-secret").map(Secret::from),
            token: get("repo-s3-token").map(Secret::from),
            path_style: inv.text("repo-s3-uri-style") == "path",
            storage_class: get("repo-s3-storage-class"),
            kms_key_id: get("repo-s3-kms-key-id"),
            object_lock: object_lock(inv)?,
        },
        gcs: GcsConfig {
            bucket: get("repo-gcs-bucket").unwrap_or_default(),
            key_file: get("repo-gcs-key"),
            endpoint: get("repo-gcs-endpoint"),
        },
        azure: AzureConfig {
            account: get("repo-azure-account").unwrap_or_default(),
            container: get("repo-azure-container").unwrap_or_default(),
            key: get("repo-azure-key").map(Secret::from),
            endpoint: get("repo-azure-endpoint"),
        },
        ca_file: get("repo-s3-ca-file"),
        verify_tls: inv.flag("repo-storage-verify-tls"),
        timeout: Duration::from_secs(inv.int("repo-storage-timeout")),
        retries: inv.int("repo-storage-retries"),
        remote: ssh_target(inv, "repo-remote", "repo-remote-port", "repo-remote-cmd"),
        remote_stanza: get("stanza"),
        target_time: target_time(inv)?,
        rate_limit: inv.int_opt("repo-rate-limit"),
    })
}

/// `repo-s3-object-lock` with its `repo-immutable-days`, which it cannot go without.
fn object_lock(inv: &Invocation) -> Result<Option<ObjectLock>, Error> {
    let name = |base: &str| options::repo_option_name(base, inv.repo_index);
    match (
        inv.choice_opt::<LockMode>("repo-s3-object-lock"),
        inv.int_opt::<u32>("repo-immutable-days"),
    ) {
        (None, None) => Ok(None),
        (Some(mode), Some(days)) => {
            if inv.get("repo-type") != Some("s3") {
                return Err(Error::config(format!(
                    "{} needs {}=s3: Object Lock is S3's",
                    name("repo-s3-object-lock"),
                    name("repo-type")
                )));
            }
            Ok(Some(ObjectLock { mode, days }))
        }
        (Some(_), None) => Err(Error::config(format!(
            "{} needs {}: the days every object is kept from deletion",
            name("repo-s3-object-lock"),
            name("repo-immutable-days")
        ))),
        (None, Some(_)) => Err(Error::config(format!(
            "{} is the retention of an immutable repository: set {} (compliance or governance) too",
            name("repo-immutable-days"),
            name("repo-s3-object-lock")
        ))),
    }
}

/// `repo-target-time` as unix seconds.
fn target_time(inv: &Invocation) -> Result<Option<i64>, Error> {
    let Some(text) = inv.get("repo-target-time") else {
        return Ok(None);
    };
    match pgstrata_engine::commands::restore::parse_target_time(text) {
        Some(t) => Ok(Some(t.timestamp())),
        None => Err(Error::config(format!(
            "{}='{text}': not a time with its time zone (e.g. '2026-11-28 10:00:00+00')",
            options::repo_option_name("repo-target-time", inv.repo_index)
        ))),
    }
}

/// backup-standby's standby, when it is on and the backup runs here.
fn standby_source(inv: &Invocation) -> Result<Option<StandbySource>, Error> {
    if inv.command != "backup" {
        return Ok(None);
    }
    let (path, host, port) = (
        path(inv, "standby-path"),
        inv.text("standby-host"),
        inv.int("standby-port"),
    );
    // The backup runs on another host (the standby's or the database host's), whose own
    // configuration names its standby.
    if !inv.flag("backup-standby")
        || inv.get("standby-remote").is_some()
        || inv.get("pg-remote").is_some()
    {
        return Ok(None);
    }
    Ok(Some(StandbySource {
        path: path.ok_or_else(|| {
            Error::config("backup-standby needs standby-path: the standby's data directory")
        })?,
        host: host.to_string(),
        port,
    }))
}

/// Retention of repository view `inv`, and `--set`.
fn expire_options(inv: &Invocation) -> ExpireOptions {
    ExpireOptions {
        // Other commands' --set (restore's, annotate's) names a backup for them, not one
        // to expire.
        set: (inv.command == "expire")
            .then(|| inv.get("set").map(str::to_string))
            .flatten(),
        retention_full: inv.int_opt("repo-retention-full"),
        retention_full_type: inv.choice("repo-retention-full-type"),
        retention_diff: inv.int_opt("repo-retention-diff"),
        retention_archive: inv.int_opt("repo-retention-archive"),
        retention_window: inv.int_opt("repo-retention-window"),
        dry_run: inv.flag("dry-run"),
    }
}

/// The per-job choices of repository view `view` the agent gets: every option the table
/// marks as the backup host's to choose for this command (defaults included, so the
/// backup host decides them), and nothing else.
fn peer_choices(view: &Invocation) -> Vec<(String, String)> {
    let mut choices = Vec::new();
    for def in options::OPTIONS
        .iter()
        .filter(|o| o.peer && o.applies_to(&view.command))
    {
        if def.kind == options::Kind::List {
            for v in view.values_of(def) {
                choices.push((def.name.to_string(), v.clone()));
            }
        } else if let Some(v) = view.value_of(def) {
            choices.push((def.name.to_string(), v.to_string()));
        }
    }
    choices
}

/// `annotate`: the backup, the pin, the annotations set (`KEY=VALUE`) and removed (`KEY=`).
fn annotate_options(
    inv: &Invocation,
) -> Result<pgstrata_engine::commands::annotate::AnnotateOptions, Error> {
    let label = inv
        .require("set")
        .map_err(|_| Error::config("annotate needs --set=LABEL, the backup"))?
        .to_string();
    let pin = match (inv.flag("pin"), inv.flag("unpin")) {
        (true, true) => return Err(Error::config("--pin and --unpin: give one")),
        (true, false) => Some(true),
        (false, true) => Some(false),
        (false, false) => None,
    };
    let mut o = pgstrata_engine::commands::annotate::AnnotateOptions {
        label,
        pin,
        ..Default::default()
    };
    for (key, value) in annotations(inv)? {
        match value.is_empty() {
            true => o.unset.push(key),
            false => {
                o.set.insert(key, value);
            }
        }
    }
    Ok(o)
}

/// The `--annotation=KEY=VALUE` options, each checked.
fn annotations(inv: &Invocation) -> Result<Vec<(String, String)>, Error> {
    inv.list("annotation")
        .iter()
        .map(|a| {
            let (key, value) = a
                .split_once('=')
                .ok_or_else(|| Error::config(format!("--annotation='{a}': expected KEY=VALUE")))?;
            pgstrata_repo::manifest::check_annotation(key, value)
                .map_err(|why| Error::config(format!("--annotation='{a}': {why}")))?;
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

fn backup_options(inv: &Invocation) -> Result<BackupOptions, Error> {
    let annotations = annotations(inv)?.into_iter().collect();
    Ok(BackupOptions {
        backup_type: inv.choice("type"),
        delta: inv.flag("delta"),
        track: inv.choice("track"),
        annotations,
        resume: inv.flag("resume"),
        locked_by_caller: super::in_agent_run(),
    })
}

fn restore(inv: &Invocation) -> Result<Restore, Error> {
    let repos = repos(inv)?;
    let mut tablespace_map = Vec::new();
    for m in inv.list("tablespace-map") {
        let (oid, dir) = m
            .split_once('=')
            .and_then(|(o, d)| o.parse::<u32>().ok().map(|o| (o, PathBuf::from(d))))
            .ok_or_else(|| Error::config(format!("--tablespace-map='{m}': expected OID=DIR")))?;
        tablespace_map.push((oid, dir));
    }
    let tablespace_root = path(inv, "tablespace-map-all");
    if let Some(root) = tablespace_root.as_ref().filter(|r| !r.is_absolute()) {
        return Err(Error::config(format!(
            "--tablespace-map-all={}: the directory must be an absolute path",
            root.display()
        )));
    }
    let mut link_map = Vec::new();
    for m in inv.list("link-map") {
        let (name, dir) = m
            .split_once('=')
            .filter(|(n, d)| !n.is_empty() && !n.contains('/') && !d.is_empty())
            .ok_or_else(|| Error::config(format!("--link-map='{m}': expected NAME=DIR, NAME a link or directory at the top of the data directory (pg_wal=/fast/wal)")))?;
        link_map.push((name.to_string(), PathBuf::from(dir)));
    }
    let mut settings = Vec::new();
    for r in inv.list("recovery-option") {
        let (key, value) = r
            .split_once('=')
            .filter(|(k, _)| is_setting_name(k))
            .ok_or_else(|| {
                Error::config(format!(
                    "--recovery-option='{r}': expected KEY=VALUE, KEY a PostgreSQL setting name (letters, digits, _ and .)"
                ))
            })?;
        if value.contains(['\n', '\r', '\0']) {
            return Err(Error::config(format!(
                "--recovery-option={key}: the value must be one line"
            )));
        }
        settings.push((key.to_ascii_lowercase(), value.to_string()));
    }
    let options = RestoreOptions {
        recovery_options: settings,
        delta: inv.flag("delta"),
        force: inv.flag("force"),
        dry_run: inv.flag("dry-run"),
        tablespace_map,
        tablespace_root,
        link_all: inv.flag("link-all"),
        link_map,
        target_action: inv.choice_opt("target-action"),
        archive_off: inv.text("archive-mode") == "off",
        instant: inv.flag("instant"),
        ..recovery_options(inv, &repos.selected().settings)
    };
    Ok(Restore {
        repos,
        options,
        resume: inv.flag("resume"),
        foreground: inv.flag("instant-foreground"),
        log_path: PathBuf::from(inv.text("log-path")),
    })
}

/// A name postgresql.conf takes as a setting's key (`work_mem`, `myext.level`).
fn is_setting_name(k: &str) -> bool {
    k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

fn restore_test(inv: &Invocation) -> Result<RestoreTest, Error> {
    let repos = repos(inv)?;
    let options = RestoreTestOptions {
        restore: recovery_options(inv, &repos.selected().settings),
        scratch: path(inv, "pg-path"),
        keep: inv.flag("keep"),
        pg_bin: path(inv, "pg-bin"),
        preload: inv.list("restore-test-preload").to_vec(),
        dump: None,
    };
    Ok(RestoreTest {
        repos,
        options,
        output: inv.choice("output"),
    })
}

/// The options restore and restore-test share: which backup, how far to recover, which
/// databases. The rest as a fresh restore into an empty directory has them.
fn recovery_options(inv: &Invocation, s: &Settings) -> RestoreOptions {
    RestoreOptions {
        set: inv.get("set").map(str::to_string),
        delta: false,
        force: false,
        dry_run: false,
        tablespace_map: vec![],
        tablespace_root: None,
        link_all: false,
        link_map: vec![],
        recovery_type: inv.choice("type"),
        target: inv.get("target").map(str::to_string),
        target_action: None,
        target_timeline: inv.get("target-timeline").map(str::to_string),
        target_exclusive: inv.flag("target-exclusive"),
        archive_off: false,
        archive_get_command: archive_get_command(inv, s),
        // restore-table names its one database itself (--db).
        db_include: options::find("db-include", &inv.command)
            .map(|_| inv.list("db-include").to_vec())
            .unwrap_or_default(),
        db_exclude: options::find("db-exclude", &inv.command)
            .map(|_| inv.list("db-exclude").to_vec())
            .unwrap_or_default(),
        recovery_options: vec![],
        instant: false,
    }
}

fn restore_table(inv: &Invocation) -> Result<RestoreTest, Error> {
    let repos = repos(inv)?;
    let database = inv
        .get("db")
        .ok_or_else(|| Error::config("restore-table needs --db=NAME"))?
        .to_string();
    let output = path(inv, "output").ok_or_else(|| {
        Error::config("restore-table needs --output=FILE.sql (a new file for pg_dump's output)")
    })?;
    let options = RestoreTestOptions {
        restore: recovery_options(inv, &repos.selected().settings),
        scratch: path(inv, "pg-path"),
        keep: false,
        pg_bin: path(inv, "pg-bin"),
        preload: vec![],
        dump: Some(pgstrata_engine::commands::restore_test::TableDump {
            database,
            tables: inv.list("table").to_vec(),
            output,
        }),
    };
    Ok(RestoreTest {
        repos,
        options,
        output: super::ReportOutput::Text,
    })
}

fn archive_push(inv: &Invocation) -> Result<ArchivePush, Error> {
    let repos = repos(inv)?;
    let [wal] = inv.args.as_slice() else {
        return Err(Error::config(
            "archive-push takes one argument: the WAL file path (%p)",
        ));
    };
    Ok(ArchivePush {
        repos,
        wal: PathBuf::from(wal),
        asynchronous: inv.flag("archive-async"),
        async_options: AsyncOptions {
            spool_path: inv.text("spool-path").into(),
            process_max: process_max(inv),
            push_queue_max: inv.int_opt("archive-push-queue-max"),
            get_queue_max: 0,
            timeout: Duration::from_secs(inv.int("archive-timeout")),
        },
    })
}

fn archive_get(inv: &Invocation) -> Result<ArchiveGet, Error> {
    let repos = repos(inv)?;
    let [name, dest] = inv.args.as_slice() else {
        return Err(Error::config(
            "archive-get takes two arguments: the WAL file name (%f) and the destination (\"%p\")",
        ));
    };
    Ok(ArchiveGet {
        repos,
        name: name.clone(),
        dest: PathBuf::from(dest),
        async_options: AsyncOptions {
            spool_path: inv.text("spool-path").into(),
            process_max: process_max(inv),
            push_queue_max: None,
            get_queue_max: inv.int("archive-get-queue-max"),
            timeout: Duration::from_secs(60),
        },
    })
}

fn report(inv: &Invocation) -> Result<Report, Error> {
    Ok(Report {
        repos: repos(inv)?,
        set: inv.get("set").map(str::to_string),
        output: inv.choice("output"),
    })
}

/// The command restore_command runs: this binary with the options that locate the
/// repository, so archive-get reads where backups were written. Secrets are left out: they
/// must come from the config file or the server's environment.
fn archive_get_command(inv: &Invocation, s: &Settings) -> String {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "pgstrata".into());
    let mut parts = vec![shell_quote(&exe)];
    if let Some(c) = &s.config_file {
        parts.push(shell_quote(&format!("--config={}", c.display())));
    }
    parts.push(shell_quote(&format!("--stanza={}", s.stanza)));
    // Every repository's location (repoN-* for repository N), and archive-get's own options
    // given to restore. Secrets come from the config file or the server's environment,
    // never from here.
    const CARRIED: &[&str] = &["repo", "spool-path", "archive-get-queue-max", "cmd-ssh"];
    let carried = |o: &&options::OptionDef| !o.secret && o.applies_to("archive-get");
    for view in inv.repo_views() {
        for o in options::OPTIONS
            .iter()
            .filter(carried)
            .filter(|o| options::is_repo_option(o.name))
        {
            let Some(v) = view.get(o.name) else { continue };
            if o.default_value().as_deref() != Some(v) || o.name == "repo-path" {
                let name = options::repo_option_name(o.name, view.repo_index);
                parts.push(shell_quote(&format!("--{name}={v}")));
            }
        }
    }
    for o in options::OPTIONS
        .iter()
        .filter(carried)
        .filter(|o| CARRIED.contains(&o.name))
    {
        let Some(v) = inv.get(o.name) else { continue };
        if o.default_value().as_deref() != Some(v) {
            parts.push(shell_quote(&format!("--{}={v}", o.name)));
        }
    }
    parts.join(" ")
}

/// Quote one word for `sh -c` (restore_command runs through the shell): plain words stay
/// as they are; anything else goes in double quotes with `\`, `"`, `$` and `` ` `` escaped.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_=/.,:@".contains(&b))
    {
        s.to_string()
    } else {
        format!(
            "\"{}\"",
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('$', "\\$")
                .replace('`', "\\`")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::resolve as resolution;
    use pgstrata_engine::commands::restore::{RecoveryType, TargetAction};
    use pgstrata_engine::track::Track;
    use pgstrata_repo::manifest::BackupType;
    use std::collections::{BTreeSet, HashMap};

    fn resolve(args: &str, env: &[(&str, &str)]) -> Invocation {
        let argv: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolution::resolve(&argv, &env).unwrap()
    }

    /// The smallest command line of `command` that parses: its stanza and arguments.
    fn minimal(command: &str) -> String {
        // The agent takes a list of stanzas (the ones it serves), not one to work on.
        let takes_stanza = options::find("stanza", command).is_some() && command != "agent";
        let stanza = if takes_stanza { "--stanza=main" } else { "" };
        let args = match command {
            "archive-push" => "pg_wal/000000010000000000000001",
            "archive-get" => "000000010000000000000001 pg_wal/RECOVERYXLOG",
            "key-remove" => "--key-id=k1",
            "instant-status" => "--pg-path=/tmp/instant",
            "restore-table" => "--db=postgres --table=public.t --output=/tmp/t.sql",
            "annotate" => "--set=20261128-010000F",
            _ => "",
        };
        format!("{stanza} {command} {args}")
    }

    /// Options the table gives a command that its parser does not read, each for a reason.
    /// The test below checks each is in the table and indeed not read, so this cannot go
    /// stale.
    fn unused(command: &str, option: &str) -> bool {
        match command {
            // Resolution itself reads --config (before any option can be looked up).
            _ if option == "config" => true,
            // No repository, no ssh.
            "help" | "completions" | "version" | "demo" | "instant-status" => option == "cmd-ssh",
            // `agent repo` serves a local directory: repo-path; the agent's other
            // repository options are accepted (the forced command may share the backup
            // host's settings) and have no use there.
            "agent" => {
                (options::is_repo_option(option) && option != "repo-path") || option == "cmd-ssh"
            }
            _ => false,
        }
    }

    /// The option table and the typed parser agree: every option the table lists for a
    /// command is read by that command's parser (or named in [`unused`]), and every name
    /// the parser reads is in the table (a name that is not panics when it is read), with
    /// the type the table gives it (the typed getters check the kind). A misspelt name in
    /// the parser fails here, not in a user's run.
    #[test]
    fn every_command_reads_every_option_the_table_gives_it() {
        for (command, _) in options::COMMANDS {
            let inv = resolve(&minimal(command), &[]);
            reporting(&inv);
            if let Err(e) = super::command(&inv) {
                panic!("{command}: {e}");
            }
            let read = inv.names_read();
            let listed: BTreeSet<&str> = options::OPTIONS
                .iter()
                .filter(|o| o.applies_to(command))
                .map(|o| o.name)
                .collect();
            for name in &listed {
                if unused(command, name) {
                    assert!(!read.contains(name), "{command} reads {name}: not unused");
                } else {
                    assert!(read.contains(name), "{command} does not read --{name}");
                }
            }
            for name in &read {
                assert!(options::known(name), "{command} reads {name}");
            }
        }
    }

    /// A name outside the table cannot be read: the getter panics, which the test above
    /// turns into a failure of the command that reads it.
    #[test]
    #[should_panic(expected = "is not defined")]
    fn a_misspelt_option_name_panics_when_read() {
        resolve(&minimal("backup"), &[]).get("proces-max");
    }

    /// process-max becomes a `NonZeroUsize` without a clamp: the table forbids 0.
    #[test]
    fn process_max_is_at_least_one_in_the_table() {
        for o in options::OPTIONS.iter().filter(|o| o.name == "process-max") {
            assert!(matches!(o.kind, options::Kind::Int { min, .. } if min >= 1));
        }
    }

    /// Every typed read of every command matches the table (kind, default, engine names).
    #[test]
    fn every_command_parses_its_defaults_typed() {
        for (command, _) in options::COMMANDS {
            let inv = resolve(&minimal(command), &[]);
            let parsed = super::command(&inv).unwrap();
            let repos = match &parsed {
                Command::StanzaCreate(r) | Command::Check(r) | Command::Expire { repos: r, .. } => {
                    Some(r)
                }
                Command::Backup(b) => {
                    let o = &b.options;
                    assert_eq!((o.backup_type, o.track), (BackupType::Incr, Track::Auto));
                    Some(&b.repos)
                }
                Command::Restore(r) => {
                    assert_eq!(r.options.recovery_type, RecoveryType::Default);
                    assert_eq!(r.options.target_action, None);
                    Some(&r.repos)
                }
                Command::RestoreTest(r) | Command::RestoreTable(r) => {
                    assert_eq!(r.options.restore.recovery_type, RecoveryType::Immediate);
                    Some(&r.repos)
                }
                Command::ArchivePush(a) => Some(&a.repos),
                Command::ArchiveGet(a) => Some(&a.repos),
                Command::Info(r) | Command::Verify(Verify { report: r, .. }) => Some(&r.repos),
                Command::KeyAdd(k) => Some(&k.repos),
                Command::Copy(c) => Some(&c.repos),
                Command::WalReceive { repos, .. } => Some(repos),
                Command::StanzaUpgrade(r) => Some(r),
                Command::KeyList { repos, .. }
                | Command::KeyRemove { repos, .. }
                | Command::RepoLs { repos, .. }
                | Command::StanzaDelete { repos, .. }
                | Command::Annotate { repos, .. }
                | Command::RepoGet { repos, .. } => Some(repos),
                _ => None,
            };
            let takes_stanza = options::find("stanza", command).is_some() && *command != "agent";
            assert_eq!(repos.is_some(), takes_stanza, "{command}");
            if let Some(repos) = repos {
                let s = &repos.selected().settings;
                assert_eq!(s.repo.retries, 4);
                assert_eq!(s.pack_size, pgstrata_repo::pack::DEFAULT_PACK_SIZE);
                assert_eq!(s.process_max.get(), 1);
                assert!(repos.selected().expire_options().is_none());
            }
        }
        let inv = resolve("--stanza=main --type=diff --track=wal backup", &[]);
        let Command::Backup(b) = super::command(&inv).unwrap() else {
            panic!("backup")
        };
        let o = &b.options;
        assert_eq!((o.backup_type, o.track), (BackupType::Diff, Track::Wal));
        let inv = resolve(
            "--stanza=main --type=time --target=now --target-action=shutdown restore",
            &[],
        );
        let Command::Restore(r) = super::command(&inv).unwrap() else {
            panic!("restore")
        };
        assert_eq!(r.options.recovery_type, RecoveryType::Time);
        assert_eq!(r.options.target_action, Some(TargetAction::Shutdown));
    }

    #[test]
    fn pg_remote_makes_a_job_on_the_database_host() {
        let inv = resolve(
            "--stanza=main --pg-remote=db1 --pg-remote-port=2222 --pg-remote-config=/etc/db.toml backup",
            &[],
        );
        let Command::OnAnotherHost(job) = super::command(&inv).unwrap() else {
            panic!("a job on db1")
        };
        assert_eq!(job.kind, JobKind::Backup);
        assert_eq!(
            (job.target.host.as_str(), job.target.port),
            ("db1", Some(2222))
        );
        assert_eq!(job.config, Some(PathBuf::from("/etc/db.toml")));
        // The standby's host wins for a backup from a standby there.
        let inv = resolve(
            "--stanza=main --pg-remote=db1 --backup-standby --standby-remote=sb1 backup",
            &[],
        );
        let Command::OnAnotherHost(job) = super::command(&inv).unwrap() else {
            panic!("a job on sb1")
        };
        assert_eq!(job.target.host, "sb1");
    }

    #[test]
    fn secrets_never_show() {
        let inv = resolve(
            "--stanza=main --repo-type=s3 info",
            &[
                ("PGSTRATA_REPO_S3_KEY_SECRET", "hunter2"),
                ("PGSTRATA_REPO_AZURE_KEY", "azure-hunter2"),
                ("PGSTRATA_REPO_CIPHER_PASS", "cipher-hunter2"),
            ],
        );
        let s = settings(&inv).unwrap();
        assert!(s.cipher_pass.is_some());
        assert_eq!(s.repo.s3.key_secret.as_deref(), Some("hunter2"));
        for shown in [format!("{s:?}"), format!("{inv:?}"), inv.describe()] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("redacted"), "{shown}");
        }
        assert!(!archive_get_command(&inv, &s).contains("hunter2"));
    }

    #[test]
    fn shell_quote_survives_a_real_shell() {
        for s in [
            "plain-/path_1.2,x:y@z=w",
            "with space",
            "it's",
            "$HOME and ${HOME}",
            "`id` $(id)",
            "back\\slash\\",
            "quote\"d",
            "semi;colon | pipe & amp > redirect",
            "new\nline",
            "*?[glob]",
            "",
        ] {
            let quoted = shell_quote(s);
            let out = std::process::Command::new("sh")
                .arg("-c")
                // Exactly one argument, whatever it holds.
                .arg(format!(
                    "f() {{ [ $# -eq 1 ] || exit 9; printf %s \"$1\"; }}; f {quoted}"
                ))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{s:?} quoted as {quoted} is not one word"
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                s,
                "{s:?} quoted as {quoted}"
            );
        }
        assert_eq!(shell_quote("/usr/bin/pgstrata"), "/usr/bin/pgstrata");
    }
}
