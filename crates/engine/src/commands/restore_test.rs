//! `restore-test`: proof that a backup restores and that its data is sound, for a nightly
//! job. Page checksums, checked at backup time, cannot see an index whose entries are out
//! of order or a heap tuple pointing nowhere when every page's checksum is valid; a real
//! restore, recovery and `pg_amcheck` can.
//!
//! Steps: restore the backup (default the newest) into a scratch directory with
//! `archive_mode = off` (its restore_command still reads the archive); start it with the
//! server binaries of the backup's major version, on a free port and a socket directory
//! inside the scratch directory, never touching the source cluster; wait until recovery is
//! done and it is promoted; run `pg_amcheck --heapallindexed` (heap and B-tree checks,
//! installing the amcheck extension where missing: the cluster is thrown away) on every
//! database that accepts connections; stop it; run `pg_checksums --check` when the backup
//! has data checksums; remove the scratch directory unless `--keep`.
//!
//! Tablespaces are restored inside the scratch directory too, never at their source
//! locations.
//!
//! Page checks use `pg_checksums` on the stopped cluster rather than pgstrata's own
//! backup-time check: that check already ran on every page when the backup was taken, and
//! checking the restored cluster with PostgreSQL's own tool of the same major version
//! also covers the pages recovery rewrote, with no second definition of a valid page.
//!
//! As root, the server programs run as the PostgreSQL OS user (`pgstrata_cluster`), as in
//! `demo` and the tests. The scratch cluster accepts only local connections through its
//! private socket directory, trusted (its own `pg_hba.conf` in the scratch directory).
//!
//! The backup's configuration is whoever could change the source cluster's (ALTER SYSTEM,
//! a file in its data directory): the scratch server runs none of it. Every setting that
//! runs a command, loads code or names a file to read or write is given on the server's
//! command line (`-c`, which wins over postgresql.conf and postgresql.auto.conf) with
//! pgstrata's own value: restore_command is pgstrata's archive-get, the other commands
//! are empty, no library is preloaded but those of `--restore-test-preload`. A `-c`
//! cannot stop a file from being read, so the restored configuration files' `include`
//! directives are commented out. The clients (psql, pg_amcheck) override the per-database
//! and per-role settings that load libraries, through PGOPTIONS, which wins over those.
//! The server and every tool run with a clean environment (PATH, HOME, locale and time
//! zone only): whatever of the backup still runs inside the server (a function in an
//! index expression that amcheck evaluates) sees none of pgstrata's secrets, which
//! restore_command reads from the config file instead.

use crate::data_restore::{RecoveryType, RestoreOptions, RestoreReport, TargetAction};
use crate::{Error, ErrorKind, Result, Settings};
use pgstrata_cluster::{give_to_pg_user, Cluster, PgBin, Scratch};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Problems listed per database and in the summary; the rest are counted.
const FIRST_PROBLEMS: usize = 20;

#[derive(Debug, Clone)]
pub struct RestoreTestOptions {
    /// Which backup, how far to recover, which databases (restore's own options).
    pub restore: RestoreOptions,
    /// The scratch directory (absent or empty); default a new one in the temp directory.
    pub scratch: Option<PathBuf>,
    pub keep: bool,
    /// Server binaries; default those of the backup's major version, found like the tests
    /// find them.
    pub pg_bin: Option<PathBuf>,
    /// The scratch server's shared_preload_libraries (`--restore-test-preload`): the
    /// backup's own list is not used.
    pub preload: Vec<String>,
    /// `restore-table`: dump these tables instead of checking everything.
    pub dump: Option<TableDump>,
}

/// What `restore-table` dumps: tables of one database, into one file.
#[derive(Debug, Clone)]
pub struct TableDump {
    pub database: String,
    /// `SCHEMA.TABLE` (or `TABLE`, in the search path), as pg_dump's `--table` takes them.
    pub tables: Vec<String>,
    pub output: PathBuf,
}

/// What `restore-table` did.
#[derive(Debug, Serialize)]
pub struct RestoreTableReport {
    pub backup: String,
    pub database: String,
    pub tables: Vec<String>,
    pub output: PathBuf,
    /// Bytes read from the repository: the files restore writes, then the blocks the
    /// scratch server read (catalogs, the tables, what WAL replay touched).
    pub bytes_fetched: u64,
    /// Of the backup's size.
    pub backup_bytes: u64,
    /// What a full restore of the backup reads from the repository.
    pub backup_stored_bytes: u64,
    pub duration_ms: u64,
}

pub fn render_table_text(r: &RestoreTableReport) -> String {
    format!(
        "restore-table: {} of database {} from backup {} written to {}; {} read from the repository ({:.1} % of the {} a full restore reads; the backup's files are {}), in {:.1} s\n",
        r.tables.join(", "),
        r.database,
        r.backup,
        r.output.display(),
        crate::progress::human_bytes(r.bytes_fetched),
        r.bytes_fetched as f64 * 100.0 / r.backup_stored_bytes.max(1) as f64,
        crate::progress::human_bytes(r.backup_stored_bytes),
        crate::progress::human_bytes(r.backup_bytes),
        r.duration_ms as f64 / 1000.0
    )
}

/// `restore-table`: an instant restore of database `dump.database` into a scratch
/// directory that fetches only what the scratch server reads (its catalogs, the tables,
/// what WAL replay touches: nothing hydrates in the background), recovery to the target,
/// `pg_dump` of the tables into `dump.output`, then everything torn down.
///
/// Runs as the cluster's OS user (the FUSE mount is that user's): refused as root.
pub async fn restore_table(s: &Settings, o: &RestoreTestOptions) -> Result<RestoreTableReport> {
    let started = Instant::now();
    let dump = o.dump.clone().expect("restore-table has tables to dump");
    if nix::unistd::geteuid().is_root() {
        return Err(Error::config(
            "restore-table serves the scratch cluster's files through a FUSE mount only its user can enter: run it as the cluster's OS user, not as root",
        ));
    }
    if dump.tables.is_empty() {
        return Err(Error::config("restore-table needs --table=SCHEMA.TABLE"));
    }
    if dump.output.exists() {
        return Err(Error::refused(format!(
            "restore-table: {} exists: give a new file with --output",
            dump.output.display()
        )));
    }
    check_recovery_type(o)?;
    let scratch = make_scratch(s, o)?;
    let data = scratch.join("pgdata");
    let mut settings = s.clone();
    settings.pg_path = Some(data.clone());
    let restore = RestoreOptions {
        tablespace_root: Some(scratch.join("tablespaces")),
        archive_off: true,
        target_action: Some(TargetAction::Promote),
        delta: false,
        force: false,
        dry_run: false,
        instant: true,
        db_include: vec![dump.database.clone()],
        db_exclude: vec![],
        ..o.restore.clone()
    };
    let restored = crate::data_restore::restore(&settings, &restore).await?;
    let mount = MountGuard(crate::instant::instant_dir(&data)?.join("mnt"));
    let server = std::thread::spawn({
        let (settings, data) = (settings.clone(), data.clone());
        let runtime = tokio::runtime::Handle::current();
        move || runtime.block_on(crate::instant::serve_with(&settings, &data, false))
    });
    wait_serving(&data, &server).await?;
    let dumped = tokio::task::spawn_blocking({
        let (o, dump, data) = (o.clone(), dump.clone(), data.clone());
        let label = restored.label.clone();
        let pg_version = restored.pg_version;
        move || dump_tables(&scratch, &data, &label, pg_version, &o, &dump)
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Io, format!("restore-table stopped: {e}")))?;
    let on_demand = crate::instant::instant_status(&data, false)
        .map(|st| st.bytes_fetched)
        .unwrap_or(0);
    drop(mount);
    let _ = tokio::task::spawn_blocking(move || server.join()).await;
    dumped?;
    Ok(RestoreTableReport {
        backup: restored.label.clone(),
        database: dump.database,
        tables: dump.tables,
        output: dump.output,
        bytes_fetched: restored.counts.bytes_fetched + on_demand,
        backup_bytes: restored.backup_bytes,
        backup_stored_bytes: restored.counts.bytes_fetched + restored.counts.bytes_deferred,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}

/// Unmounts the scratch cluster's FUSE filesystem when dropped (the serving task then
/// ends), whatever failed before.
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Wait until the instant restore of `data` serves (or its task failed).
async fn wait_serving(data: &Path, server: &std::thread::JoinHandle<Result<()>>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if crate::instant::instant_status(data, false).is_ok() {
            return Ok(());
        }
        if server.is_finished() || Instant::now() > deadline {
            return Err(Error::new(
                ErrorKind::Io,
                "restore-table: the scratch cluster's files could not be served (see the log)",
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Start the scratch cluster, recover, `pg_dump` the tables, stop it.
fn dump_tables(
    scratch: &Scratch,
    data: &Path,
    label: &str,
    pg_version: u32,
    o: &RestoreTestOptions,
    dump: &TableDump,
) -> Result<()> {
    let mut bin = server_binaries(o.pg_bin.as_deref(), pg_version)?;
    let (env, _) = clean_environment(std::env::vars_os(), pg_version);
    bin.env = Some(env);
    let cluster = configure(scratch, data, bin, o)?;
    cluster.start().map_err(|e| {
        Error::refused(format!(
            "restore-table: the scratch cluster of backup {label} did not start: {e}"
        ))
    })?;
    let dumped = wait_until_promoted(&cluster, label).and_then(|()| {
        let mut cmd = cluster.bin.client("pg_dump");
        cmd.arg("-h")
            .arg(&cluster.socket_dir)
            .args(["-p", &cluster.port.to_string(), "-U", "postgres"])
            .args(["-d", &dump.database, "-f"])
            .arg(&dump.output);
        for t in &dump.tables {
            cmd.arg(format!("--table={t}"));
        }
        let out = cmd.output().map_err(|e| Error::io("run pg_dump", e))?;
        if out.status.success() {
            Ok(())
        } else {
            let _ = std::fs::remove_file(&dump.output);
            Err(Error::refused(format!(
                "restore-table: pg_dump of {} from database {} as of the target failed: {}",
                dump.tables.join(", "),
                dump.database,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    });
    let stopped = cluster
        .stop()
        .map_err(|e| Error::refused(format!("restore-table: stop the scratch cluster: {e}")));
    dumped.and(stopped)
}

#[derive(Debug, Serialize)]
pub struct RestoreTestReport {
    pub backup: String,
    pub pg_version: u32,
    /// No corruption found.
    pub ok: bool,
    pub duration_ms: u64,
    pub restore_ms: u64,
    pub recovery_ms: u64,
    pub databases: Vec<DatabaseCheck>,
    /// Databases left out by `--db-include`/`--db-exclude`: not checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_restored: Vec<String>,
    pub page_check: PageCheck,
    /// The first problems found, across databases and pages.
    pub problems: Vec<String>,
    /// The scratch directory, when `--keep` kept it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct DatabaseCheck {
    pub name: String,
    pub ok: bool,
    pub duration_ms: u64,
    pub problems: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct PageCheck {
    /// False when the backup has no data checksums.
    pub checked: bool,
    pub ok: bool,
    pub problems: Vec<String>,
}

pub async fn restore_test(s: &Settings, o: &RestoreTestOptions) -> Result<RestoreTestReport> {
    let started = Instant::now();
    check_recovery_type(o)?;
    let scratch = make_scratch(s, o)?;
    let data = scratch.join("pgdata");
    let mut settings = s.clone();
    settings.pg_path = Some(data.clone());
    // Made here, for the server's user: restore would create it for the invoking one.
    let tablespaces = scratch.join("tablespaces");
    std::fs::create_dir_all(&tablespaces)
        .map_err(|e| Error::io(format!("create {}", tablespaces.display()), e))?;
    give_to_pg_user(&tablespaces);
    let restore = RestoreOptions {
        tablespace_root: Some(tablespaces),
        archive_off: true,
        target_action: Some(TargetAction::Promote),
        delta: false,
        force: false,
        dry_run: false,
        ..o.restore.clone()
    };
    let restored = crate::data_restore::restore(&settings, &restore).await?;
    let restore_ms = started.elapsed().as_millis() as u64;
    let (scratch, report) = tokio::task::spawn_blocking({
        let o = o.clone();
        move || {
            let report = check_restored(&scratch, &data, &restored, &o, restore_ms);
            (scratch, report)
        }
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Io, format!("restore-test stopped: {e}")))?;
    let mut report = report?;
    report.duration_ms = started.elapsed().as_millis() as u64;
    if o.keep {
        report.kept = Some(scratch.path.clone());
    }
    Ok(report)
}

/// The preload list names libraries, and the recovery ends in a promoted cluster.
fn check_recovery_type(o: &RestoreTestOptions) -> Result<()> {
    if let Some(bad) = o.preload.iter().find(|l| !is_library_name(l)) {
        return Err(Error::config(format!(
            "--restore-test-preload='{bad}': give one library name (letters, digits, _ $ . / -) per option"
        )));
    }
    if matches!(
        o.restore.recovery_type,
        RecoveryType::Standby | RecoveryType::None | RecoveryType::Preserve
    ) {
        return Err(Error::config(format!(
            "restore-test --type={}: the scratch cluster must recover and be promoted (immediate, default, or a target)",
            pgstrata_repo::Named::name(o.restore.recovery_type)
        )));
    }
    Ok(())
}

/// The scratch directory: `--pg-path` when given (absent or empty: never someone's data
/// directory), else a new directory in the temp directory, made by this process (never one
/// that someone else placed at a name they guessed). Removed when dropped, unless `--keep`.
fn make_scratch(s: &Settings, o: &RestoreTestOptions) -> Result<Scratch> {
    let path = match &o.scratch {
        Some(p) => {
            if !crate::data_restore::dir_is_empty(p)? {
                return Err(Error::refused(format!(
                    "restore-test: {} is not empty: give an absent or empty scratch directory with --pg-path",
                    p.display()
                )));
            }
            std::fs::create_dir_all(p)
                .map_err(|e| Error::io(format!("create scratch directory {}", p.display()), e))?;
            p.clone()
        }
        None => new_temp_dir(&s.stanza)?,
    };
    // Absolute: tablespace locations and server settings name paths inside it.
    let path = std::fs::canonicalize(&path)
        .map_err(|e| Error::io(format!("resolve scratch directory {}", path.display()), e))?;
    give_to_pg_user(&path);
    Ok(Scratch { path, keep: o.keep })
}

/// `$TMPDIR/pgstrata-restore-test-<stanza>-<pid>-<n>`, created new (mkdir fails on
/// anything already there, a link included).
fn new_temp_dir(stanza: &str) -> Result<PathBuf> {
    let base = std::env::temp_dir();
    let mut n = 0;
    loop {
        let path = base.join(format!(
            "pgstrata-restore-test-{stanza}-{}-{n}",
            std::process::id()
        ));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
            Err(e) => {
                return Err(Error::io(
                    format!("create scratch directory {}", path.display()),
                    e,
                ))
            }
        }
    }
}

/// Start the restored cluster, check it, stop it.
fn check_restored(
    scratch: &Scratch,
    data: &Path,
    restored: &RestoreReport,
    o: &RestoreTestOptions,
    restore_ms: u64,
) -> Result<RestoreTestReport> {
    let mut bin = server_binaries(o.pg_bin.as_deref(), restored.pg_version)?;
    let (env, dropped) = clean_environment(std::env::vars_os(), restored.pg_version);
    if !dropped.is_empty() {
        log::info!(
            "restore-test: not passed on to the scratch server and its tools: {}",
            dropped.join(", ")
        );
    }
    bin.env = Some(env);
    let cluster = configure(scratch, data, bin, o)?;
    let recovery_started = Instant::now();
    cluster.start().map_err(|e| {
        Error::refused(format!(
            "restore-test: the restored cluster of backup {} did not start: {e}",
            restored.label
        ))
    })?;
    wait_until_promoted(&cluster, &restored.label).map_err(|e| match secrets_hint(&dropped) {
        Some(hint) => e.context(hint),
        None => e,
    })?;
    let recovery_ms = recovery_started.elapsed().as_millis() as u64;
    let preloaded = cluster
        .psql("template1", "SHOW shared_preload_libraries")
        .unwrap_or_else(|e| format!("(unknown: {e})"));
    log::info!(
        "restore-test: the scratch server runs with shared_preload_libraries = '{preloaded}'"
    );
    let databases = check_databases(&cluster, &restored.excluded_databases)?;
    cluster
        .stop()
        .map_err(|e| Error::refused(format!("restore-test: stop the scratch cluster: {e}")))?;
    let page_check = check_pages(&cluster, restored.data_checksums)?;
    let problems: Vec<String> = databases
        .iter()
        .flat_map(|d| d.problems.iter().cloned())
        .chain(page_check.problems.iter().cloned())
        .take(FIRST_PROBLEMS)
        .collect();
    Ok(RestoreTestReport {
        backup: restored.label.clone(),
        pg_version: restored.pg_version,
        ok: databases.iter().all(|d| d.ok) && page_check.ok,
        duration_ms: 0,
        restore_ms,
        recovery_ms,
        databases,
        not_restored: restored.excluded_databases.clone(),
        page_check,
        problems,
        kept: None,
    })
}

/// The server binaries of major version `major`: in `pg_bin` (which must hold that
/// version), else where the tests and `demo` find them.
fn server_binaries(pg_bin: Option<&Path>, major: u32) -> Result<PgBin> {
    let bin = match pg_bin {
        Some(dir) => PgBin::at(dir.to_path_buf())
            .map_err(|e| Error::config(format!("--pg-bin={}: {e}", dir.display())))?,
        None => PgBin::major(major).map_err(|e| {
            Error::refused(format!(
                "restore-test needs the PostgreSQL {major} server binaries (or --pg-bin): {e}"
            ))
        })?,
    };
    if bin.major != major {
        return Err(Error::config(format!(
            "--pg-bin={} holds PostgreSQL {}, but the backup is of PostgreSQL {major}",
            bin.dir.display(),
            bin.major
        )));
    }
    Ok(bin)
}

/// Make the restored directory startable here and unable to run anything of the backup's:
/// its own access rules, no include directives, and the settings of [`forced_settings`] on
/// the command line; a private socket directory and port.
fn configure(
    scratch: &Scratch,
    data: &Path,
    bin: PgBin,
    o: &RestoreTestOptions,
) -> Result<Cluster> {
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        give_to_pg_user(path);
        Ok::<_, Error>(())
    };
    let socket_dir = scratch.join("sock");
    std::fs::create_dir_all(&socket_dir)
        .map_err(|e| Error::io(format!("create {}", socket_dir.display()), e))?;
    give_to_pg_user(&socket_dir);
    let hba = scratch.join("pg_hba.conf");
    let ident = scratch.join("pg_ident.conf");
    write(&hba, "local all all trust\n")?;
    write(&ident, "")?;
    // Debian keeps postgresql.conf in /etc: the server needs one in the data directory.
    let conf = data.join("postgresql.conf");
    if !conf.exists() {
        write(&conf, "")?;
    }
    for file in [conf, data.join("postgresql.auto.conf")] {
        comment_out_includes(&file)?;
    }
    let settings = forced_settings(bin.major, data, &hba, &ident, o);
    Ok(Cluster {
        bin,
        data: data.to_path_buf(),
        port: pgstrata_cluster::free_port(),
        socket_dir,
        log_file: scratch.join("postgres.log"),
        settings,
    })
}

/// What the scratch server runs with, whatever the backup's configuration says: every
/// setting that runs a command (restore_command is pgstrata's archive-get), loads code
/// (only `--restore-test-preload`'s libraries), reads or writes a file outside the data
/// directory, or accepts connections from elsewhere.
fn forced_settings(
    major: u32,
    data: &Path,
    hba: &Path,
    ident: &Path,
    o: &RestoreTestOptions,
) -> Vec<(String, String)> {
    let path = |p: &Path| p.display().to_string();
    let mut settings: Vec<(&str, String)> = vec![
        ("data_directory", path(data)),
        ("hba_file", path(hba)),
        ("ident_file", path(ident)),
        ("external_pid_file", String::new()),
        ("listen_addresses", String::new()),
        ("unix_socket_permissions", "0700".into()),
        ("unix_socket_group", String::new()),
        ("archive_mode", "off".into()),
        ("archive_command", String::new()),
        (
            "restore_command",
            crate::data_restore::restore_command(&o.restore),
        ),
        ("recovery_end_command", String::new()),
        ("archive_cleanup_command", String::new()),
        ("primary_conninfo", String::new()),
        ("ssl", "off".into()),
        ("ssl_passphrase_command", String::new()),
        ("shared_preload_libraries", o.preload.join(",")),
        ("session_preload_libraries", String::new()),
        ("local_preload_libraries", String::new()),
        ("dynamic_library_path", "$libdir".into()),
        ("jit", "off".into()),
        ("jit_provider", "llvmjit".into()),
        ("logging_collector", "off".into()),
    ];
    if major == 14 {
        settings.push(("stats_temp_directory", "pg_stat_tmp".into()));
    }
    if major >= 15 {
        settings.push(("archive_library", String::new()));
    }
    if major >= 17 {
        settings.push(("event_triggers", "off".into()));
    }
    if major >= 18 {
        settings.push(("oauth_validator_libraries", String::new()));
    }
    settings
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// Settings that a database or role of the backup can set for the sessions of the tools
/// (ALTER DATABASE/ROLE ... SET): the clients send them back as PGOPTIONS, which wins.
fn client_options(major: u32) -> String {
    let mut options = vec![
        "-c session_preload_libraries=",
        "-c local_preload_libraries=",
        "-c dynamic_library_path=$libdir",
        "-c jit=off",
    ];
    if major >= 17 {
        options.push("-c event_triggers=off");
    }
    options.join(" ")
}

/// The environment of the scratch server and its tools: PATH, HOME, the locale and time
/// zone of this one, and PGOPTIONS from [`client_options`]. Returns it and the names of
/// the variables left out.
fn clean_environment(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    major: u32,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut kept = vec![("PGOPTIONS".to_string(), client_options(major))];
    let mut dropped = Vec::new();
    for (name, value) in vars {
        let name = name.to_string_lossy().into_owned();
        let keep = matches!(name.as_str(), "PATH" | "HOME" | "LANG" | "LANGUAGE" | "TZ")
            || name.starts_with("LC_");
        match value.into_string() {
            Ok(value) if keep => kept.push((name, value)),
            _ => dropped.push(name),
        }
    }
    dropped.sort();
    (kept, dropped)
}

/// Why a restore_command may have failed, when secrets may have come from the environment.
fn secrets_hint(dropped: &[String]) -> Option<String> {
    let secret_like = |n: &&String| {
        ["PGSTRATA_", "AWS_", "AZURE_", "GOOGLE_"]
            .iter()
            .any(|p| n.starts_with(p))
    };
    let names: Vec<&String> = dropped.iter().filter(secret_like).collect();
    (!names.is_empty()).then(|| {
        format!(
            "the scratch server runs with a clean environment (without {}): what its restore_command \
             (pgstrata archive-get) needs, repo-cipher-pass or object-store keys included, must be in the config file",
            names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// Comment out the `include`, `include_dir` and `include_if_exists` directives of a
/// restored configuration file: the scratch server reads no file the backup names.
fn comment_out_includes(path: &Path) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    let mut changed = false;
    let lines: Vec<String> = text
        .split('\n')
        .map(|line| {
            if !is_include(line) {
                return line.to_string();
            }
            changed = true;
            log::info!(
                "restore-test: commented out '{}' in {}: the scratch server follows no include of the backup",
                line.trim(),
                path.display()
            );
            format!("# not followed by pgstrata restore-test: {line}")
        })
        .collect();
    if changed {
        // Rewritten in place: the file keeps the owner restore gave it.
        std::fs::write(path, lines.join("\n"))
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    }
    Ok(())
}

/// Whether a configuration line is an include directive: its parameter name (PostgreSQL's
/// are case-insensitive, optionally followed by `=`) is include, include_dir or
/// include_if_exists.
fn is_include(line: &str) -> bool {
    let name: String = line
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect::<String>()
        .to_ascii_lowercase();
    matches!(
        name.as_str(),
        "include" | "include_dir" | "include_if_exists"
    )
}

/// A library name for shared_preload_libraries that needs no quoting in a list or on the
/// server's command line.
fn is_library_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_$./-".contains(c))
}

/// Wait until recovery has ended and the cluster is promoted; fail with the server log's
/// tail as soon as the server is gone (a missing WAL file, a bad setting).
fn wait_until_promoted(c: &Cluster, label: &str) -> Result<()> {
    loop {
        if c.psql("template1", "SELECT pg_is_in_recovery()")
            .is_ok_and(|v| v == "f")
        {
            return Ok(());
        }
        if !c.is_running() {
            return Err(Error::refused(format!(
                "restore-test: the restored cluster of backup {label} stopped during recovery; server log:\n{}",
                c.log_tail()
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `pg_amcheck --heapallindexed` on every database that accepts connections, but those
/// left out of a selective restore (their files are zeros).
fn check_databases(c: &Cluster, excluded: &[String]) -> Result<Vec<DatabaseCheck>> {
    let names = c
        .psql(
            "template1",
            "SELECT datname FROM pg_database WHERE datallowconn ORDER BY oid",
        )
        .map_err(|e| {
            Error::new(
                ErrorKind::Postgres,
                format!("restore-test: list the databases: {e}"),
            )
        })?;
    let mut out = Vec::new();
    for name in names.lines().filter(|n| !excluded.iter().any(|x| x == n)) {
        let started = Instant::now();
        let mut cmd = c.bin.client("pg_amcheck");
        cmd.arg("-h")
            .arg(&c.socket_dir)
            .arg("-p")
            .arg(c.port.to_string())
            .args([
                "-U",
                "postgres",
                "--heapallindexed",
                "--install-missing",
                "-d",
                name,
            ]);
        let run = run_tool(&mut cmd, "pg_amcheck")?;
        let problems = match run.code {
            0 => vec![],
            2 => amcheck_problems(&run.stdout),
            _ => {
                return Err(Error::refused(format!(
                    "restore-test: pg_amcheck could not check database '{name}' (exit {}): {}{}",
                    run.code, run.stdout, run.stderr
                )))
            }
        };
        log::info!(
            "restore-test: database {name}: {} problem(s)",
            problems.len()
        );
        out.push(DatabaseCheck {
            name: name.to_string(),
            ok: run.code == 0,
            duration_ms: started.elapsed().as_millis() as u64,
            problems: problems.into_iter().take(FIRST_PROBLEMS).collect(),
        });
    }
    Ok(out)
}

/// pg_amcheck's report as one line per problem: the object (`btree index "db.s.name":`)
/// and its first detail line.
fn amcheck_problems(stdout: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut detail_taken = true;
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        if !line.starts_with(char::is_whitespace) {
            out.push(line.trim_end_matches(':').to_string());
            detail_taken = false;
        } else if !detail_taken {
            if let Some(last) = out.last_mut() {
                last.push_str(": ");
                last.push_str(line.trim());
            }
            detail_taken = true;
        }
    }
    out
}

/// `pg_checksums --check` on the stopped cluster, when it has data checksums.
fn check_pages(c: &Cluster, data_checksums: bool) -> Result<PageCheck> {
    if !data_checksums {
        return Ok(PageCheck {
            checked: false,
            ok: true,
            problems: vec![],
        });
    }
    let mut cmd = c.bin.cmd("pg_checksums");
    cmd.arg("--check").arg("-D").arg(&c.data);
    let run = run_tool(&mut cmd, "pg_checksums")?;
    let prefix = format!("{}/", c.data.display());
    let problems: Vec<String> = run
        .stderr
        .lines()
        .filter(|l| l.contains("checksum verification failed"))
        .map(|l| l.replace(&prefix, "").replace("pg_checksums: error: ", ""))
        .collect();
    if run.code != 0 && problems.is_empty() {
        return Err(Error::refused(format!(
            "restore-test: pg_checksums could not check the restored cluster (exit {}): {}",
            run.code, run.stderr
        )));
    }
    Ok(PageCheck {
        checked: true,
        ok: problems.is_empty(),
        problems: problems.into_iter().take(FIRST_PROBLEMS).collect(),
    })
}

struct ToolRun {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_tool(cmd: &mut Command, what: &str) -> Result<ToolRun> {
    let out = cmd
        .output()
        .map_err(|e| Error::io(format!("restore-test: run {what}"), e))?;
    Ok(ToolRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

pub fn render_text(r: &RestoreTestReport) -> String {
    let mut out = format!(
        "restore-test of backup {} (PostgreSQL {}): {} in {:.1}s (restore {:.1}s, recovery {:.1}s)\n",
        r.backup,
        r.pg_version,
        if r.ok { "ok" } else { "CORRUPTION FOUND" },
        r.duration_ms as f64 / 1000.0,
        r.restore_ms as f64 / 1000.0,
        r.recovery_ms as f64 / 1000.0
    );
    for d in &r.databases {
        out.push_str(&format!(
            "    database {}: {} ({:.1}s)\n",
            d.name,
            if d.ok { "ok" } else { "corrupt" },
            d.duration_ms as f64 / 1000.0
        ));
        for p in &d.problems {
            out.push_str(&format!("        {p}\n"));
        }
    }
    if !r.not_restored.is_empty() {
        out.push_str(&format!(
            "    not restored, not checked: {}\n",
            r.not_restored.join(", ")
        ));
    }
    let pages = match (r.page_check.checked, r.page_check.ok) {
        (false, _) => "not checked (the backup has no data checksums)",
        (true, true) => "ok",
        (true, false) => "checksum failures",
    };
    out.push_str(&format!("    page checksums: {pages}\n"));
    for p in &r.page_check.problems {
        out.push_str(&format!("        {p}\n"));
    }
    if let Some(k) = &r.kept {
        out.push_str(&format!("    kept in {}\n", k.display()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_directives_are_recognised_in_every_spelling() {
        for line in [
            "include 'x.conf'",
            "  INCLUDE = 'x.conf'",
            "include_dir'conf.d'",
            "\tinclude_if_exists = '/etc/x' # comment",
        ] {
            assert!(is_include(line), "{line}");
        }
        for line in [
            "# include 'x.conf'",
            "included_setting = 1",
            "shared_preload_libraries = 'include'",
            "",
        ] {
            assert!(!is_include(line), "{line}");
        }
    }

    #[test]
    fn the_environment_keeps_no_secret() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("LC_ALL", "C.UTF-8"),
            ("PGSTRATA_REPO_CIPHER_PASS", "hunter2"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("PGPASSWORD", "pw"),
            ("PGOPTIONS", "-c session_preload_libraries=evil"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let (kept, dropped) = clean_environment(vars.into_iter(), 15);
        let names: Vec<&str> = kept.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PGOPTIONS", "PATH", "LC_ALL"]);
        assert!(
            kept[0].1.contains("session_preload_libraries= "),
            "{kept:?}"
        );
        assert_eq!(
            dropped,
            [
                "AWS_SECRET_ACCESS_KEY",
                "PGOPTIONS",
                "PGPASSWORD",
                "PGSTRATA_REPO_CIPHER_PASS"
            ]
        );
        assert!(secrets_hint(&dropped)
            .unwrap()
            .contains("PGSTRATA_REPO_CIPHER_PASS"));
    }

    #[test]
    fn amcheck_output_becomes_one_line_per_problem() {
        let stdout = "btree index \"postgres.public.t_pkey\":\n    ERROR:  item order invariant violated for index \"t_pkey\"\n    DETAIL:  Lower index tid=(1,11)\nheap table \"app.public.t\", block 3, offset 2:\n    xmin 999 precedes relation freeze threshold\n";
        assert_eq!(
            amcheck_problems(stdout),
            vec![
                "btree index \"postgres.public.t_pkey\": ERROR:  item order invariant violated for index \"t_pkey\"",
                "heap table \"app.public.t\", block 3, offset 2: xmin 999 precedes relation freeze threshold",
            ]
        );
    }
}
