//! The `pgstrata` binary: resolve options, set up logging, run one command, map the
//! outcome to an exit code.
//!
//! Exit codes: 0 success; 1 archive-get found no such WAL file (what restore_command must
//! say for "not found"); 2 configuration or usage error; 3 any other failure; 4 damaged
//! repository data.

mod config;
mod demo;
mod logging;
mod options;

use pgstrata_engine::archive::PushOutcome;
use pgstrata_engine::backup::BackupOptions;
use pgstrata_engine::expire::{ExpireOptions, RetentionType};
use pgstrata_engine::restore::{RecoveryType, RestoreOptions};
use pgstrata_engine::track::Track;
use pgstrata_engine::{Error, Settings};
use pgstrata_repo::codec::{CompressType, Compression};
use pgstrata_repo::manifest::BackupType;
use pgstrata_repo::storage::{AzureConfig, GcsConfig, RepoConfig, RepoKind, S3Config};
use std::path::PathBuf;
use std::time::Duration;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let env: std::collections::HashMap<String, String> = std::env::vars().collect();
    let inv = match config::resolve(&argv, &env) {
        Ok(i) => i,
        Err(msg) => {
            eprintln!("ERROR: {msg}");
            std::process::exit(2);
        }
    };
    logging::init(
        if inv.command == "demo" {
            "info"
        } else {
            inv.get("log-level-console").unwrap_or("warn")
        },
        inv.get("log-level-file").unwrap_or("off"),
        inv.get("log-path"),
        inv.get("stanza"),
        &inv.command,
    );
    let code = match run(&inv) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ERROR: {e}");
            logging::error_to_file(&e.to_string());
            e.exit_code()
        }
    };
    std::process::exit(code);
}

fn settings(inv: &config::Invocation) -> Result<Settings, Error> {
    let stanza = inv.require("stanza").map_err(Error::config)?.to_string();
    let compress_type = CompressType::parse(inv.get("compress-type").unwrap_or("zst"))
        .expect("validated by the option table");
    let level = inv.int("compress-level").map(|l| l as i32);
    let compression = Compression::new(compress_type, level)?;
    Ok(Settings {
        stanza,
        repo: repo_config(inv),
        pg_path: inv.get("pg-path").map(PathBuf::from),
        pg_host: inv.get("pg-host").map(str::to_string),
        pg_port: inv.int("pg-port").unwrap_or(5432) as u16,
        pg_user: inv.get("pg-user").map(str::to_string),
        pg_database: inv.get("pg-database").unwrap_or("postgres").to_string(),
        compression,
        process_max: inv.int("process-max").unwrap_or(1) as usize,
        start_fast: inv.flag("start-fast"),
        archive_timeout: Duration::from_secs(inv.int("archive-timeout").unwrap_or(60) as u64),
        lock_path: PathBuf::from(inv.get("lock-path").unwrap_or("/tmp/pgstrata")),
        config_file: inv.config_file.clone(),
        frame_size: pgstrata_repo::pack::DEFAULT_FRAME_SIZE,
        pack_size: inv
            .int("bundle-size")
            .map(|v| v as usize)
            .unwrap_or(pgstrata_repo::pack::DEFAULT_PACK_SIZE),
        bundle_limit: if inv.get("bundle") == Some("false") {
            0
        } else {
            inv.int("bundle-limit").map(|v| v as u64).unwrap_or(2 << 20)
        },
    })
}

/// A report on standard output: JSON with `--output=json`, else the command's text form.
fn print_report<T: serde::Serialize>(
    inv: &config::Invocation,
    report: &T,
    render_text: impl Fn(&T) -> String,
) {
    if inv.get("output") == Some("json") {
        println!(
            "{}",
            serde_json::to_string_pretty(report).expect("serialize report")
        );
    } else {
        print!("{}", render_text(report));
    }
}

fn expire_options(inv: &config::Invocation) -> Option<ExpireOptions> {
    let o = ExpireOptions {
        set: inv.get("set").map(str::to_string),
        retention_full: inv.int("repo-retention-full").map(|v| v as u32),
        retention_full_type: if inv.get("repo-retention-full-type") == Some("time") {
            RetentionType::Time
        } else {
            RetentionType::Count
        },
        retention_diff: inv.int("repo-retention-diff").map(|v| v as u32),
        retention_archive: inv.int("repo-retention-archive").map(|v| v as u32),
    };
    (o.set.is_some() || o.retention_full.is_some() || o.retention_diff.is_some()).then_some(o)
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.clamp(2, 8))
        .enable_all()
        .build()
        .expect("start async runtime")
}

fn repo_config(inv: &config::Invocation) -> RepoConfig {
    let get = |n: &str| inv.get(n).map(str::to_string);
    RepoConfig {
        kind: match inv.get("repo-type") {
            Some("s3") => RepoKind::S3,
            Some("gcs") => RepoKind::Gcs,
            Some("azure") => RepoKind::Azure,
            _ => RepoKind::Posix,
        },
        path: inv
            .get("repo-path")
            .unwrap_or("/var/lib/pgstrata")
            .to_string(),
        s3: S3Config {
            bucket: get("repo-s3-bucket").unwrap_or_default(),
            endpoint: get("repo-s3-endpoint"),
            region: get("repo-s3-region"),
            key: get("repo-s3-key"),
            key_secret: get("repo-s3-key-secret"),
            token: get("repo-s3-token"),
            path_style: inv.get("repo-s3-uri-style") == Some("path"),
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
            key: get("repo-azure-key"),
            endpoint: get("repo-azure-endpoint"),
        },
        ca_file: get("repo-s3-ca-file"),
        verify_tls: inv.get("repo-storage-verify-tls") != Some("false"),
        timeout: Duration::from_secs(inv.int("repo-storage-timeout").unwrap_or(120) as u64),
        retries: inv.int("repo-storage-retries").unwrap_or(4) as u32,
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
    for o in options::OPTIONS
        .iter()
        .filter(|o| o.name.starts_with("repo-") && o.applies_to("archive-get"))
    {
        let Some(v) = inv.get(o.name) else { continue };
        if options::SECRET_OPTIONS.contains(&o.name) {
            if inv.came_from_command_line(o.name) {
                log::warn!(
                    "{} was given on the command line: restore_command cannot carry it; put it in the config file or the server's environment",
                    o.name
                );
            }
            continue;
        }
        if o.default != Some(v) || o.name == "repo-path" {
            parts.push(shell_quote(&format!("--{}={v}", o.name)));
        }
    }
    parts.join(" ")
}

fn shell_quote(s: &str) -> String {
    if s.bytes()
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
    match inv.command.as_str() {
        "help" => {
            match inv.args.first().map(String::as_str) {
                None => print!("{}", options::general_help()),
                Some("options") => print!("{}", options::reference_markdown()),
                Some(c) if options::COMMANDS.iter().any(|(n, _)| *n == c) => {
                    print!("{}", options::command_help(c))
                }
                Some(c) => return Err(Error::config(format!("unknown command '{c}'"))),
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
            let s = settings(inv)?;
            match runtime(2).block_on(pgstrata_engine::stanza::stanza_create(&s))? {
                pgstrata_engine::stanza::CreateOutcome::Created => {
                    println!("stanza '{}' created", s.stanza)
                }
                pgstrata_engine::stanza::CreateOutcome::AlreadyExists => {
                    println!("stanza '{}' already exists for this cluster", s.stanza)
                }
            }
            Ok(0)
        }
        "check" => {
            let s = settings(inv)?;
            runtime(2).block_on(pgstrata_engine::check::check(&s))?;
            println!("check of stanza '{}' passed", s.stanza);
            Ok(0)
        }
        "backup" => {
            let s = settings(inv)?;
            let backup_type = match inv.get("type").unwrap_or("incr") {
                "diff" => BackupType::Diff,
                "incr" => BackupType::Incr,
                _ => BackupType::Full,
            };
            let rt = runtime(s.process_max);
            let opts = BackupOptions {
                backup_type,
                delta: inv.flag("delta"),
                track: match inv.get("track") {
                    Some("wal") => Track::Wal,
                    Some("hash") => Track::Hash,
                    _ => Track::Auto,
                },
            };
            let m = rt.block_on(pgstrata_engine::backup::backup(&s, &opts))?;
            println!("{}", m.label);
            // Retention, as pgBackRest does after each backup when it is configured.
            if let Some(e) = expire_options(inv) {
                rt.block_on(pgstrata_engine::expire::expire(&s, &e))?;
            }
            Ok(0)
        }
        "restore" => {
            let s = settings(inv)?;
            let mut tablespace_map = Vec::new();
            for m in inv.list("tablespace-map") {
                let (oid, dir) = m
                    .split_once('=')
                    .and_then(|(o, d)| o.parse::<u32>().ok().map(|o| (o, PathBuf::from(d))))
                    .ok_or_else(|| {
                        Error::config(format!("--tablespace-map='{m}': expected OID=DIR"))
                    })?;
                tablespace_map.push((oid, dir));
            }
            let opts = RestoreOptions {
                set: inv.get("set").map(str::to_string),
                delta: inv.flag("delta"),
                force: inv.flag("force"),
                dry_run: inv.flag("dry-run"),
                tablespace_map,
                recovery_type: RecoveryType::parse(inv.get("type").unwrap_or("default"))
                    .expect("validated by the option table"),
                target: inv.get("target").map(str::to_string),
                target_action: inv.get("target-action").map(str::to_string),
                target_timeline: inv.get("target-timeline").map(str::to_string),
                target_exclusive: inv.flag("target-exclusive"),
                archive_off: inv.get("archive-mode") == Some("off"),
                archive_get_command: archive_get_command(inv, &s),
            };
            if opts.dry_run {
                let (plan, settings) =
                    runtime(2).block_on(pgstrata_engine::restore::plan(&s, &opts))?;
                print!("restore plan: {plan}");
                for line in settings {
                    println!("  recovery: {line}");
                }
                println!("nothing was written (--dry-run)");
                return Ok(0);
            }
            let r =
                runtime(s.process_max).block_on(pgstrata_engine::restore::restore(&s, &opts))?;
            println!(
                "restored backup {}: {} files written, {} patched, {} unchanged, {} removed; {} bytes fetched",
                r.label, r.files_written, r.files_patched, r.files_kept, r.removed, r.bytes_fetched
            );
            Ok(0)
        }
        "archive-push" => {
            let s = settings(inv)?;
            let [path] = inv.args.as_slice() else {
                return Err(Error::config(
                    "archive-push takes one argument: the WAL file path (%p)",
                ));
            };
            match runtime(2).block_on(pgstrata_engine::archive::archive_push(
                &s,
                std::path::Path::new(path),
            ))? {
                PushOutcome::Stored { .. } | PushOutcome::AlreadyArchived => Ok(0),
            }
        }
        "archive-get" => {
            let s = settings(inv)?;
            let [name, dest] = inv.args.as_slice() else {
                return Err(Error::config("archive-get takes two arguments: the WAL file name (%f) and the destination (\"%p\")"));
            };
            let found = runtime(2).block_on(pgstrata_engine::archive::archive_get(
                &s,
                name,
                std::path::Path::new(dest),
            ))?;
            Ok(if found { 0 } else { 1 })
        }
        "expire" => {
            let s = settings(inv)?;
            let Some(o) = expire_options(inv) else {
                return Err(Error::config(
                    "nothing to expire by: set repo-retention-full (and optionally repo-retention-diff), or give --set=LABEL",
                ));
            };
            let r = runtime(2).block_on(pgstrata_engine::expire::expire(&s, &o))?;
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
            let s = settings(inv)?;
            let report = runtime(2).block_on(pgstrata_engine::info::info(&s, inv.get("set")))?;
            print_report(inv, &report, pgstrata_engine::info::render_text);
            Ok(0)
        }
        "verify" => {
            let s = settings(inv)?;
            let report = runtime(s.process_max.max(2))
                .block_on(pgstrata_engine::verify::verify(&s, inv.get("set")))?;
            print_report(inv, &report, pgstrata_engine::verify::render_text);
            if report.ok {
                Ok(0)
            } else {
                Err(Error::integrity(format!(
                    "verify found problems in stanza '{}': see the report above",
                    s.stanza
                )))
            }
        }
        other => Err(Error::config(format!("unknown command '{other}'"))),
    }
}
