//! The `pgstrata` binary: resolve options, set up logging, run one command, map the
//! outcome to an exit code.
//!
//! Exit codes: 0 success; 1 archive-get found no such WAL file (what restore_command must
//! say for "not found"); 2 configuration or usage error; 3 any other failure; 4 damaged
//! repository data, or corruption restore-test found in the restored cluster. archive-get
//! outside standby mode adds 128 to 2, 3 and 4 (see [`archive_get_exit_code`]).

mod agent;
mod config;
mod demo;
mod generate;
mod logging;
mod options;

use pgstrata_engine::commands::archive;
use pgstrata_engine::commands::backup::BackupOptions;
use pgstrata_engine::commands::expire::ExpireOptions;
use pgstrata_engine::commands::metrics;
use pgstrata_engine::commands::restore::RestoreOptions;
use pgstrata_engine::{Error, Settings, StandbySource};
use pgstrata_repo::cipher::Passphrase;
use pgstrata_repo::codec::Compression;
use pgstrata_repo::storage::{AzureConfig, GcsConfig, RepoConfig, S3Config, Secret, SshTarget};
use std::path::PathBuf;
use std::time::Duration;

fn main() {
    limit_malloc_arenas();
    // Whatever umask the caller had (022 from a shell, 077 under the postmaster), files are
    // created 0640 and directories 0750: the repository holds the whole database, password
    // hashes included, and must never be world-readable; the same modes whoever writes.
    // Restore sets the modes recorded in the backup explicitly.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o027));
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    // Only archive-get's "not found" may exit 1..125 quietly: decided before anything can fail.
    let is_archive_get = argv.iter().any(|a| a == "archive-get");
    let exit = |code: i32| -> ! {
        std::process::exit(if is_archive_get {
            archive_get_exit_code(code, std::path::Path::new("standby.signal").exists())
        } else {
            code
        })
    };
    let inv = match config::resolve(&argv, &env) {
        Ok(i) => i,
        Err(msg) => {
            eprintln!("ERROR: {msg}");
            exit(2);
        }
    };
    logging::init(
        if inv.command == "demo" {
            "info"
        } else {
            inv.text("log-level-console")
        },
        inv.text("log-level-file"),
        inv.get("log-path"),
        inv.stanza(),
        &inv.command,
    );
    if options::find("progress", &inv.command).is_some() {
        pgstrata_engine::progress::set_mode(inv.choice("progress"));
    }
    for w in &inv.warnings {
        log::warn!("{w}");
    }
    log::debug!("{} {}", inv.command, inv.describe());
    // A panic must not exit 101: restore_command would read that as "not in the archive".
    let outcome = std::panic::catch_unwind(|| run(&inv)).unwrap_or_else(|_| {
        Err(Error::new(
            pgstrata_engine::ErrorKind::Io,
            format!("{} stopped on an internal error (a bug)", inv.command),
        ))
    });
    let code = match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ERROR: {e}");
            logging::error_to_file(&e.to_string());
            e.exit_code()
        }
    };
    exit(code);
}

/// archive-get's exit code as restore_command must give it. PostgreSQL reads any code up to
/// 125 as "this file is not in the archive": recovery ends there and the server promotes,
/// dropping the WAL it could not fetch. So a failure (damaged WAL, unreachable repository,
/// bad configuration) exits 128 + its usual code, which stops the server instead. A standby
/// (`standby.signal` in the working directory, which PostgreSQL sets to the data directory)
/// keeps the usual code: it retries later rather than shutting down, and never promotes by
/// itself. 0 (fetched) and 1 (not in the archive) are kept either way.
fn archive_get_exit_code(code: i32, standby: bool) -> i32 {
    match code {
        0 | 1 => code,
        _ if standby => code,
        _ => 128 + code,
    }
}

/// The settings of the repository `--repo` selects (repository 1 without it).
fn settings(inv: &config::Invocation) -> Result<Settings, Error> {
    settings_of(inv.selected_repo().map_err(Error::config)?)
}

/// The settings of every configured repository: the one `--repo` selects first.
fn all_settings(inv: &config::Invocation) -> Result<Vec<Settings>, Error> {
    let first = inv.selected_repo().map_err(Error::config)?.repo_index;
    let mut views: Vec<&config::Invocation> = inv.repo_views().collect();
    views.sort_by_key(|v| (v.repo_index != first, v.repo_index));
    views.into_iter().map(settings_of).collect()
}

/// The settings of repository view `inv`.
fn settings_of(inv: &config::Invocation) -> Result<Settings, Error> {
    let stanza = inv.require("stanza").map_err(Error::config)?.to_string();
    let compression = Compression::new(inv.choice("compress-type"), inv.int_opt("compress-level"))?;
    Ok(Settings {
        stanza,
        repo_index: inv.repo_index,
        repo: repo_config(inv),
        pg_path: inv.get("pg-path").map(PathBuf::from),
        pg_host: Some(inv.text("pg-host").to_string()),
        pg_port: inv.int("pg-port"),
        pg_user: inv.get("pg-user").map(str::to_string),
        pg_database: inv.text("pg-database").to_string(),
        pg_sslmode: inv.choice("pg-sslmode"),
        pg_sslrootcert: inv.get("pg-sslrootcert").map(PathBuf::from),
        compression,
        process_max: inv.int("process-max"),
        start_fast: inv.flag("start-fast"),
        archive_timeout: Duration::from_secs(inv.int("archive-timeout")),
        archive_lag_max: Duration::from_secs(inv.int("archive-lag-max")),
        lock_path: inv.text("lock-path").into(),
        config_file: inv.config_file.clone(),
        frame_size: pgstrata_repo::pack::DEFAULT_FRAME_SIZE,
        pack_size: inv.int("bundle-size"),
        bundle_limit: if inv.flag("bundle") {
            inv.int("bundle-limit")
        } else {
            0
        },
        cipher_type: inv.choice("repo-cipher-type"),
        cipher_pass: inv.get("repo-cipher-pass").map(Passphrase::new),
        cipher_key_cache: inv.flag("repo-cipher-key-cache"),
        standby: standby_source(inv)?,
    })
}

/// Two malloc arenas instead of glibc's eight per core: every worker and runtime thread
/// would otherwise get an arena of its own, and memory freed in one is not reused by
/// another, which on a backup of 90,000 files added a quarter to the peak RSS. Small
/// allocations are served from per-thread caches anyway, so contention stays low. Called
/// first, before any thread exists (`MALLOC_ARENA_MAX` in the environment still wins).
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; no thread runs yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// backup-standby's standby, when it is on.
fn standby_source(inv: &config::Invocation) -> Result<Option<StandbySource>, Error> {
    if inv.command != "backup" || !inv.flag("backup-standby") {
        return Ok(None);
    }
    // The backup runs on another host (the standby's or the database host's), whose own
    // configuration names its standby.
    if inv.get("standby-remote").is_some() || inv.get("pg-remote").is_some() {
        return Ok(None);
    }
    Ok(Some(StandbySource {
        path: inv
            .get("standby-path")
            .ok_or_else(|| {
                Error::config("backup-standby needs standby-path: the standby's data directory")
            })?
            .into(),
        host: inv.text("standby-host").to_string(),
        port: inv.int("standby-port"),
    }))
}

/// key-add's new passphrase: from PGSTRATA_NEW_CIPHER_PASS or the first line of
/// --new-cipher-pass-file, exactly one of them, not empty.
fn new_passphrase(inv: &config::Invocation) -> Result<Passphrase, Error> {
    let pass = match (inv.get("new-cipher-pass"), inv.get("new-cipher-pass-file")) {
        (Some(p), None) => p.to_string(),
        (None, Some(file)) => {
            let text = zeroize::Zeroizing::new(std::fs::read_to_string(file).map_err(|e| {
                Error::io(format!("read the new passphrase from --new-cipher-pass-file={file}"), e)
            })?);
            text.lines().next().unwrap_or_default().to_string()
        }
        (Some(_), Some(_)) => {
            return Err(Error::config(
                "key-add: give the new passphrase once, in PGSTRATA_NEW_CIPHER_PASS or --new-cipher-pass-file, not both",
            ))
        }
        (None, None) => {
            return Err(Error::config(
                "key-add needs the new passphrase: set PGSTRATA_NEW_CIPHER_PASS or give --new-cipher-pass-file=PATH",
            ))
        }
    };
    if pass.is_empty() {
        return Err(Error::config("key-add: the new passphrase is empty"));
    }
    Ok(Passphrase::new(pass))
}

/// A report on standard output: JSON with `--output=json`, else the command's text form.
fn print_report<T: serde::Serialize>(
    inv: &config::Invocation,
    report: &T,
    render_text: impl Fn(&T) -> String,
) {
    print_report_or_metrics(inv, report, render_text, |_, _| String::new());
}

/// [`print_report`] of a command that also speaks Prometheus (`--output=prometheus`):
/// `render_metrics` gets the report and the time now (Unix seconds).
fn print_report_or_metrics<T: serde::Serialize>(
    inv: &config::Invocation,
    report: &T,
    render_text: impl Fn(&T) -> String,
    render_metrics: impl Fn(&T, i64) -> String,
) {
    match inv.text("output") {
        "json" => println!(
            "{}",
            serde_json::to_string_pretty(report).expect("serialize report")
        ),
        "prometheus" => print!("{}", render_metrics(report, chrono::Utc::now().timestamp())),
        _ => print!("{}", render_text(report)),
    }
}

/// Reports of several repositories, `(settings, report)`: one as ever; several as a JSON
/// array of the reports with a `repo` field, one Prometheus exposition, or text sections
/// headed by repository.
fn print_repo_reports<T: serde::Serialize>(
    inv: &config::Invocation,
    reports: &[(Settings, T)],
    render_text: impl Fn(&T) -> String,
    render_metrics: impl Fn(&T, i64) -> String,
) {
    if let [(_, only)] = reports {
        return print_report_or_metrics(inv, only, render_text, render_metrics);
    }
    match inv.text("output") {
        "json" => {
            let all: Vec<serde_json::Value> = reports
                .iter()
                .map(|(s, r)| {
                    let mut v = serde_json::to_value(r).expect("serialize report");
                    if let Some(o) = v.as_object_mut() {
                        o.insert("repo".into(), s.repo_index.into());
                    }
                    v
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&all).expect("serialize reports")
            );
        }
        "prometheus" => {
            let now = chrono::Utc::now().timestamp();
            let parts: Vec<String> = reports
                .iter()
                .map(|(_, r)| render_metrics(r, now))
                .collect();
            print!("{}", metrics::merge_expositions(&parts));
        }
        _ => {
            for (i, (s, r)) in reports.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                println!("repo{}: {}", s.repo_index, repo_location(s));
                print!("{}", render_text(r));
            }
        }
    }
}

/// Where a repository is, for people: its path or URL, no credentials.
fn repo_location(s: &Settings) -> String {
    s.storage()
        .map(|st| st.description().to_string())
        .unwrap_or_else(|_| s.repo.path.clone())
}

/// The repositories a command that can cover all of them works on: the one `--repo`
/// names, else every configured one.
fn covered_repos(inv: &config::Invocation) -> Result<Vec<Settings>, Error> {
    if inv.get("repo").is_some() {
        Ok(vec![settings(inv)?])
    } else {
        let mut all = all_settings(inv)?;
        all.sort_by_key(|s| s.repo_index);
        Ok(all)
    }
}

fn expire_options(inv: &config::Invocation) -> Option<ExpireOptions> {
    let o = ExpireOptions {
        set: inv.get("set").map(str::to_string),
        retention_full: inv.int_opt("repo-retention-full"),
        retention_full_type: inv.choice("repo-retention-full-type"),
        retention_diff: inv.int_opt("repo-retention-diff"),
        retention_archive: inv.int_opt("repo-retention-archive"),
    };
    (o.set.is_some() || o.retention_full.is_some() || o.retention_diff.is_some()).then_some(o)
}

/// Retention after a backup, as pgBackRest does when it is configured; where the
/// repository is: a database host that reaches it through `repo-remote`, or does a backup
/// host's job (`agent run`), may only add to it, and the backup host applies it.
fn apply_retention(
    inv: &config::Invocation,
    s: &Settings,
    rt: &tokio::runtime::Runtime,
) -> Result<(), Error> {
    let Some(e) = expire_options(inv.selected_repo().map_err(Error::config)?) else {
        return Ok(());
    };
    if agent::in_agent_run() {
        return Ok(());
    }
    if s.repo.remote.is_some() {
        log::info!(
            "retention is applied on the backup host ('pgstrata expire' there): this host adds to the repository, it does not delete"
        );
        return Ok(());
    }
    rt.block_on(pgstrata_engine::commands::expire::expire(s, &e))?;
    Ok(())
}

fn backup_options(inv: &config::Invocation) -> Result<BackupOptions, Error> {
    let mut annotations = std::collections::BTreeMap::new();
    for a in inv.list("annotation") {
        let (key, value) = a
            .split_once('=')
            .ok_or_else(|| Error::config(format!("--annotation='{a}': expected KEY=VALUE")))?;
        pgstrata_repo::manifest::check_annotation(key, value)
            .map_err(|why| Error::config(format!("--annotation='{a}': {why}")))?;
        annotations.insert(key.to_string(), value.to_string());
    }
    Ok(BackupOptions {
        backup_type: inv.choice("type"),
        delta: inv.flag("delta"),
        track: inv.choice("track"),
        annotations,
        resume: inv.flag("resume"),
        locked_by_caller: agent::in_agent_run(),
    })
}

fn restore_options(inv: &config::Invocation, s: &Settings) -> Result<RestoreOptions, Error> {
    let mut tablespace_map = Vec::new();
    for m in inv.list("tablespace-map") {
        let (oid, dir) = m
            .split_once('=')
            .and_then(|(o, d)| o.parse::<u32>().ok().map(|o| (o, PathBuf::from(d))))
            .ok_or_else(|| Error::config(format!("--tablespace-map='{m}': expected OID=DIR")))?;
        tablespace_map.push((oid, dir));
    }
    Ok(RestoreOptions {
        delta: inv.flag("delta"),
        force: inv.flag("force"),
        dry_run: inv.flag("dry-run"),
        tablespace_map,
        target_action: inv.choice_opt("target-action"),
        archive_off: inv.text("archive-mode") == "off",
        ..recovery_options(inv, s)
    })
}

/// The options restore and restore-test share: which backup, how far to recover, which
/// databases. The rest as a fresh restore into an empty directory has them.
fn recovery_options(inv: &config::Invocation, s: &Settings) -> RestoreOptions {
    RestoreOptions {
        set: inv.get("set").map(str::to_string),
        delta: false,
        force: false,
        dry_run: false,
        tablespace_map: vec![],
        tablespace_root: None,
        recovery_type: inv.choice("type"),
        target: inv.get("target").map(str::to_string),
        target_action: None,
        target_timeline: inv.get("target-timeline").map(str::to_string),
        target_exclusive: inv.flag("target-exclusive"),
        archive_off: false,
        archive_get_command: archive_get_command(inv, s),
        db_include: inv.list("db-include").to_vec(),
        db_exclude: inv.list("db-exclude").to_vec(),
    }
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.clamp(2, 8))
        .enable_all()
        .build()
        .expect("start async runtime")
}

/// The runtime of archive-push and archive-get, which PostgreSQL starts once per WAL file:
/// no worker threads to start and stop (their heavy work runs on threads of their own).
fn per_file_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("start async runtime")
}

/// Asynchronous archiving and prefetch settings of archive-push and archive-get.
fn async_options(inv: &config::Invocation) -> archive::AsyncOptions {
    let pushing = inv.command == "archive-push";
    archive::AsyncOptions {
        spool_path: inv.text("spool-path").into(),
        process_max: inv.int("process-max"),
        push_queue_max: if pushing {
            inv.int_opt("archive-push-queue-max")
        } else {
            None
        },
        get_queue_max: if pushing {
            0
        } else {
            inv.int("archive-get-queue-max")
        },
        timeout: Duration::from_secs(if pushing {
            inv.int("archive-timeout")
        } else {
            60
        }),
    }
}

/// The role this process was started in as an asynchronous worker, if it was.
fn worker_role() -> Option<archive::WorkerRole> {
    archive::WorkerRole::parse(&std::env::var(archive::WORKER_ENV).ok()?)
}

/// Start an asynchronous worker: this command line again, with the worker's role in the
/// environment, in a process group of its own (PostgreSQL's signals to its archiver or
/// startup process must not reach it), stderr appended to `log`.
fn launch_worker(
    role: archive::WorkerRole,
    env: &[(&str, String)],
    log: &std::path::Path,
) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    std::process::Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .env(archive::WORKER_ENV, role.name())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map(|_child| ())
}

fn repo_config(inv: &config::Invocation) -> RepoConfig {
    let get = |n: &str| inv.get(n).map(str::to_string);
    RepoConfig {
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
        remote: inv.get("repo-remote").map(|host| SshTarget {
            host: host.to_string(),
            port: inv.int_opt("repo-remote-port"),
            ssh: inv.text("cmd-ssh").to_string(),
            remote_cmd: inv.text("repo-remote-cmd").to_string(),
        }),
        remote_stanza: inv.get("stanza").map(str::to_string),
    }
}

/// The command restore_command runs: this binary with the options that locate the
/// repository, so archive-get reads where backups were written. Secrets are left out: they
/// must come from the config file or the server's environment.
fn archive_get_command(inv: &config::Invocation, s: &Settings) -> String {
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

fn run(inv: &config::Invocation) -> Result<i32, Error> {
    if let Some(target) = agent::standby_remote(inv).or_else(|| agent::pg_remote(inv)) {
        let views: Vec<&config::Invocation> =
            if inv.command == "backup" || inv.get("repo").is_some() {
                vec![inv.selected_repo().map_err(Error::config)?]
            } else {
                let mut all: Vec<_> = inv.repo_views().collect();
                all.sort_by_key(|v| v.repo_index);
                all
            };
        let code = agent::run_on_pg_remote(inv, &target, &views)?;
        if code == 0 && inv.command == "backup" {
            apply_retention(inv, &settings(inv)?, &runtime(2))?;
        }
        return Ok(code);
    }
    match inv.command.as_str() {
        "agent" => agent::agent(inv, run),
        "help" => {
            match inv.args.first().map(String::as_str) {
                None => print!("{}", options::general_help()),
                Some("options") => print!("{}", options::reference_markdown()),
                Some("man") => print!("{}", generate::man_page()),
                Some(c) if options::COMMANDS.iter().any(|(n, _)| *n == c) => {
                    print!("{}", options::command_help(c))
                }
                Some(c) => return Err(Error::config(format!("unknown command '{c}'"))),
            }
            Ok(0)
        }
        "completions" => {
            match inv.args.first().map(String::as_str) {
                Some("bash") => print!("{}", generate::bash()),
                Some("zsh") => print!("{}", generate::zsh()),
                _ => return Err(Error::config("completions takes one argument: bash or zsh")),
            }
            Ok(0)
        }
        "version" => {
            println!(
                "pgstrata {} (repository format {})",
                env!("CARGO_PKG_VERSION"),
                pgstrata_repo::FORMAT_VERSION
            );
            Ok(0)
        }
        "demo" => demo::run(inv.get("pg-bin").map(PathBuf::from)).map(|_| 0),
        "stanza-create" => {
            let repos = covered_repos(inv)?;
            let rt = runtime(2);
            for s in &repos {
                let place = if repos.len() > 1 {
                    format!(" in repo{}", s.repo_index)
                } else {
                    String::new()
                };
                match rt.block_on(pgstrata_engine::commands::stanza_create::stanza_create(s))? {
                    pgstrata_engine::commands::stanza_create::CreateOutcome::Created => {
                        println!("stanza '{}' created{place}", s.stanza)
                    }
                    pgstrata_engine::commands::stanza_create::CreateOutcome::AlreadyExists => {
                        println!(
                            "stanza '{}' already exists for this cluster{place}",
                            s.stanza
                        )
                    }
                }
            }
            Ok(0)
        }
        "check" => {
            let repos = covered_repos(inv)?;
            let rt = runtime(2);
            for s in &repos {
                rt.block_on(pgstrata_engine::commands::check::check(s))
                    .map_err(|e| {
                        if repos.len() > 1 {
                            e.context(format!("repo{}", s.repo_index))
                        } else {
                            e
                        }
                    })?;
                println!(
                    "check of stanza '{}' passed{}",
                    s.stanza,
                    if repos.len() > 1 {
                        format!(" for repo{}", s.repo_index)
                    } else {
                        String::new()
                    }
                );
            }
            Ok(0)
        }
        "backup" => {
            let s = settings(inv)?;
            let rt = runtime(s.process_max);
            let opts = backup_options(inv)?;
            let m = rt.block_on(pgstrata_engine::commands::backup::backup(&s, &opts))?;
            println!("{}", m.label);
            apply_retention(inv, &s, &rt)?;
            Ok(0)
        }
        "restore" => {
            let s = settings(inv)?;
            let opts = restore_options(inv, &s)?;
            if opts.dry_run {
                let (plan, settings) =
                    runtime(2).block_on(pgstrata_engine::commands::restore::plan(&s, &opts))?;
                print!("restore plan: {plan}");
                for line in settings {
                    println!("  recovery: {line}");
                }
                println!("nothing was written (--dry-run)");
                return Ok(0);
            }
            let r = runtime(s.process_max)
                .block_on(pgstrata_engine::commands::restore::restore(&s, &opts))?;
            println!(
                "restored backup {}: {} files written, {} patched, {} unchanged, {} zeroed, {} removed; {} bytes fetched",
                r.label, r.counts.files_written, r.counts.files_patched, r.counts.files_kept, r.counts.files_zeroed, r.removed, r.counts.bytes_fetched
            );
            Ok(0)
        }
        "restore-test" => {
            let s = settings(inv)?;
            let o = pgstrata_engine::commands::restore_test::RestoreTestOptions {
                restore: recovery_options(inv, &s),
                scratch: inv.get("pg-path").map(PathBuf::from),
                keep: inv.flag("keep"),
                pg_bin: inv.get("pg-bin").map(PathBuf::from),
                preload: inv.list("restore-test-preload").to_vec(),
            };
            let report = runtime(s.process_max).block_on(
                pgstrata_engine::commands::restore_test::restore_test(&s, &o),
            )?;
            print_report(
                inv,
                &report,
                pgstrata_engine::commands::restore_test::render_text,
            );
            if report.ok {
                Ok(0)
            } else {
                Err(Error::integrity(format!(
                    "restore-test found corruption in backup {}: {}",
                    report.backup,
                    report
                        .problems
                        .first()
                        .map(String::as_str)
                        .unwrap_or("see the report above")
                )))
            }
        }
        "archive-push" => {
            let repos = all_settings(inv)?;
            let [path] = inv.args.as_slice() else {
                return Err(Error::config(
                    "archive-push takes one argument: the WAL file path (%p)",
                ));
            };
            let path = std::path::Path::new(path);
            let rt = per_file_runtime();
            if let Some(role) = worker_role() {
                let wal_dir = std::env::var_os(archive::WAL_DIR_ENV)
                    .map(PathBuf::from)
                    .ok_or_else(|| {
                        Error::config("an archive-push worker needs its WAL directory")
                    })?;
                assert_eq!(role, archive::WorkerRole::Push);
                let wanted = std::env::var(archive::WANTED_ENV).ok();
                rt.block_on(archive::push_worker(
                    &repos,
                    &async_options(inv),
                    &wal_dir,
                    wanted.as_deref(),
                ))?;
                return Ok(0);
            }
            if inv.flag("archive-async") {
                rt.block_on(archive::push(
                    &repos,
                    &async_options(inv),
                    path,
                    &launch_worker,
                ))?;
                return Ok(0);
            }
            rt.block_on(archive::archive_push_all(&repos, path))?;
            Ok(0)
        }
        "archive-get" => {
            let repos = all_settings(inv)?;
            let [name, dest] = inv.args.as_slice() else {
                return Err(Error::config("archive-get takes two arguments: the WAL file name (%f) and the destination (\"%p\")"));
            };
            let rt = per_file_runtime();
            if worker_role() == Some(archive::WorkerRole::Get) {
                rt.block_on(archive::get_worker(&repos, &async_options(inv)))?;
                return Ok(0);
            }
            let found = rt.block_on(archive::get(
                &repos,
                &async_options(inv),
                name,
                std::path::Path::new(dest),
                &launch_worker,
            ))?;
            Ok(if found { 0 } else { 1 })
        }
        "expire" => {
            let s = settings(inv)?;
            // Retention is per repository: repoN-retention-* for repository N.
            let Some(o) = expire_options(inv.selected_repo().map_err(Error::config)?) else {
                return Err(Error::config(
                    "nothing to expire by: set repo-retention-full (and optionally repo-retention-diff), or give --set=LABEL",
                ));
            };
            let r = runtime(2).block_on(pgstrata_engine::commands::expire::expire(&s, &o))?;
            println!(
                "expired {} backup(s){}; deleted {} pack(s) ({} bytes) and {} WAL file(s); {} bytes held in partly referenced packs",
                r.expired.len(),
                if r.expired.is_empty() { String::new() } else { format!(" ({})", r.expired.join(", ")) },
                r.packs_deleted,
                r.bytes_freed,
                r.wal_deleted,
                r.bytes_held
            );
            Ok(0)
        }
        "info" => {
            let rt = runtime(2);
            let mut reports = Vec::new();
            for s in covered_repos(inv)? {
                let report =
                    rt.block_on(pgstrata_engine::commands::info::info(&s, inv.get("set")))?;
                reports.push((s, report));
            }
            let text = pgstrata_engine::commands::info::render_text;
            print_repo_reports(inv, &reports, text, metrics::render_info);
            Ok(0)
        }
        "verify" => {
            let repos = covered_repos(inv)?;
            let rt = runtime(repos[0].process_max.max(2));
            let mut reports = Vec::new();
            for s in repos {
                let report = rt.block_on(pgstrata_engine::commands::verify::verify(
                    &s,
                    inv.get("set"),
                ))?;
                reports.push((s, report));
            }
            let text = pgstrata_engine::commands::verify::render_text;
            print_repo_reports(inv, &reports, text, metrics::render_verify);
            match reports.iter().find(|(_, r)| !r.ok) {
                None => Ok(0),
                Some((s, _)) => Err(Error::integrity(format!(
                    "verify found problems in stanza '{}'{}: see the report above",
                    s.stanza,
                    if reports.len() > 1 {
                        format!(" (repo{})", s.repo_index)
                    } else {
                        String::new()
                    }
                ))),
            }
        }
        "key-add" => {
            let s = settings(inv)?;
            let new_pass = new_passphrase(inv)?;
            let k = runtime(2).block_on(pgstrata_engine::commands::key::key_add(&s, new_pass))?;
            println!("key {} added to stanza '{}'", k.id, s.stanza);
            Ok(0)
        }
        "key-list" => {
            let s = settings(inv)?;
            let keys = runtime(2).block_on(pgstrata_engine::commands::key::key_list(&s))?;
            print_report(inv, &keys, |keys| {
                keys.iter()
                    .map(|k| format!("{}  created {} by {}@{}\n", k.id, k.created, k.user, k.host))
                    .collect()
            });
            Ok(0)
        }
        "key-remove" => {
            let s = settings(inv)?;
            let id = inv.require("key-id").map_err(Error::config)?;
            runtime(2).block_on(pgstrata_engine::commands::key::key_remove(&s, id))?;
            println!("key {id} removed from stanza '{}'", s.stanza);
            Ok(0)
        }
        other => Err(Error::config(format!("unknown command '{other}'"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgstrata_engine::commands::restore::{RecoveryType, TargetAction};
    use pgstrata_engine::track::Track;
    use pgstrata_repo::manifest::BackupType;
    use std::collections::HashMap;

    fn resolve(args: &str, env: &[(&str, &str)]) -> config::Invocation {
        let argv: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        config::resolve(&argv, &env).unwrap()
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

    #[test]
    fn archive_get_fails_above_125_unless_standby() {
        for code in [2, 3, 4] {
            assert!(archive_get_exit_code(code, false) > 125);
            assert!((1..=125).contains(&archive_get_exit_code(code, true)));
        }
        for standby in [false, true] {
            assert_eq!(archive_get_exit_code(0, standby), 0);
            assert_eq!(archive_get_exit_code(1, standby), 1);
        }
    }

    /// Every typed read of every command matches the table (kind, default, engine names).
    #[test]
    fn every_command_reads_its_options_typed() {
        for (command, _) in options::COMMANDS {
            // The agent takes a list of stanzas (the ones it serves), not one to work on.
            let takes_stanza = options::find("stanza", command).is_some() && *command != "agent";
            let stanza = if takes_stanza { "--stanza=main" } else { "" };
            let inv = resolve(&format!("{stanza} {command}"), &[]);
            if takes_stanza {
                let s = settings(&inv).unwrap();
                assert_eq!(s.repo.retries, 4);
                assert_eq!(s.pack_size, pgstrata_repo::pack::DEFAULT_PACK_SIZE);
            }
            match *command {
                "backup" => {
                    let o = backup_options(&inv).unwrap();
                    assert_eq!((o.backup_type, o.track), (BackupType::Incr, Track::Auto));
                    assert!(expire_options(&inv).is_none());
                }
                "expire" => assert!(expire_options(&inv).is_none()),
                "restore" => {
                    let s = settings(&inv).unwrap();
                    let o = restore_options(&inv, &s).unwrap();
                    assert_eq!(o.recovery_type, RecoveryType::Default);
                    assert_eq!(o.target_action, None);
                }
                "restore-test" => {
                    let o = recovery_options(&inv, &settings(&inv).unwrap());
                    assert_eq!(o.recovery_type, RecoveryType::Immediate);
                }
                _ => {}
            }
        }
        let inv = resolve("--stanza=main --type=diff --track=wal backup", &[]);
        let o = backup_options(&inv).unwrap();
        assert_eq!((o.backup_type, o.track), (BackupType::Diff, Track::Wal));
        let inv = resolve(
            "--stanza=main --type=time --target=now --target-action=shutdown restore",
            &[],
        );
        let o = restore_options(&inv, &settings(&inv).unwrap()).unwrap();
        assert_eq!(o.recovery_type, RecoveryType::Time);
        assert_eq!(o.target_action, Some(TargetAction::Shutdown));
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
}
