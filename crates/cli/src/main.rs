//! The `pgstrata` binary: resolve options, set up logging, run one command, map the
//! outcome to an exit code.
//!
//! Options become a typed [`args::Command`] in one place (`args`); [`run`] hands it to one
//! function per command.
//!
//! Exit codes: 0 success; 1 archive-get found no such WAL file (what restore_command must
//! say for "not found"); 2 configuration or usage error; 3 any other failure; 4 damaged
//! repository data, or corruption restore-test found in the restored cluster. archive-get
//! outside standby mode adds 128 to 2, 3 and 4 (see [`archive_get_exit_code`]).

mod agent_commands;
mod args;
mod demo;
mod generate;
mod logging;
mod notify;
mod options;

use args::{
    ArchiveGet, ArchivePush, Backup, Command, Copy, KeyAdd, Output, RemoteJob, Repo, Report,
    ReportOutput, Repos, Restore, RestoreTest, Verify,
};
use pgstrata_engine::commands::archive;
use pgstrata_engine::commands::metrics;
use pgstrata_engine::{Error, Settings};
use pgstrata_remote::protocol::JobKind;
use pgstrata_repo::cipher::Passphrase;
use std::path::{Path, PathBuf};

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
    let inv = match args::resolve(&argv, &env) {
        Ok(i) => i,
        Err(msg) => {
            eprintln!("ERROR: {msg}");
            exit(2);
        }
    };
    let reporting = args::reporting(&inv);
    logging::init(
        reporting.console,
        reporting.file,
        &reporting.log_path,
        reporting.stanza.as_deref(),
        &inv.command,
    );
    if let Some(mode) = reporting.progress {
        pgstrata_engine::progress::set_mode(mode);
    }
    for w in &inv.warnings {
        log::warn!("{w}");
    }
    log::debug!("{} {}", inv.command, inv.describe());
    let started = std::time::Instant::now();
    // A panic must not exit 101: restore_command would read that as "not in the archive".
    let outcome = std::panic::catch_unwind(|| run(&inv)).unwrap_or_else(|_| {
        Err(Error::new(
            pgstrata_engine::ErrorKind::Io,
            format!("{} stopped on an internal error (a bug)", inv.command),
        ))
    });
    let (code, error) = match outcome {
        Ok(code) => (code, None),
        Err(e) => {
            eprintln!("ERROR: {e}");
            logging::error_to_file(&e.to_string());
            (e.exit_code(), Some(e.to_string()))
        }
    };
    if let Some(n) = &reporting.notify {
        n.send(&notify::Outcome {
            command: &inv.command,
            stanza: reporting.stanza.as_deref(),
            repo: reporting.repo,
            exit_code: code,
            error: error.as_deref(),
            started,
        });
    }
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

/// Parse `inv` into its command and run it: the exit code.
fn run(inv: &args::Invocation) -> Result<i32, Error> {
    match args::command(inv)? {
        Command::Help { topic } => help(topic.as_deref()),
        Command::Completions { shell } => completions(shell.as_deref()),
        Command::Version => version(),
        Command::Demo { pg_bin } => demo::run(pg_bin).map(|_| 0),
        Command::Agent(agent) => agent_commands::agent(&agent, run),
        Command::OnAnotherHost(job) => on_another_host(&job),
        Command::StanzaCreate(repos) => stanza_create(&repos),
        Command::StanzaUpgrade(repos) => stanza_upgrade(&repos),
        Command::Check(repos) => check(&repos),
        Command::Backup(b) => backup(&b),
        Command::Restore(r) => restore(&r),
        Command::RestoreTest(r) => restore_test(&r),
        Command::RestoreTable(r) => {
            let s = &r.repos.selected().settings;
            let report = runtime(s.process_max.get() + 2).block_on(
                pgstrata_engine::commands::restore_test::restore_table(s, &r.options),
            )?;
            print!(
                "{}",
                pgstrata_engine::commands::restore_test::render_table_text(&report)
            );
            Ok(0)
        }
        Command::ArchivePush(a) => archive_push(&a),
        Command::ArchiveGet(a) => archive_get(&a),
        Command::Expire { repos, output } => expire(&repos, output),
        Command::Info(r) => info(&r),
        Command::Verify(r) => verify(&r),
        Command::KeyAdd(k) => key_add(&k),
        Command::Copy(c) => copy(&c),
        Command::InstantStatus {
            pg_path,
            wait,
            output,
        } => {
            let status = pgstrata_engine::instant::instant_status(&pg_path, wait)?;
            print_report_or_metrics(
                output,
                &status,
                pgstrata_engine::instant::render_status,
                |s, now| pgstrata_engine::commands::metrics::render_instant(s, &pg_path, now),
            );
            Ok(0)
        }
        Command::WalReceive { repos, options } => {
            let repos = repos.selected_first();
            runtime(2).block_on(pgstrata_engine::commands::wal_receive::wal_receive(
                &repos, &options,
            ))?;
            Ok(0)
        }
        Command::KeyList { repos, output } => key_list(&repos, output),
        Command::RepoLs {
            repos,
            path,
            recurse,
            output,
        } => repo_ls(&repos, path.as_deref(), recurse, output),
        Command::RepoGet { repos, path } => repo_get(&repos, path.as_deref()),
        Command::Annotate {
            repos,
            options,
            output,
        } => {
            use pgstrata_engine::commands::annotate;
            let s = &repos.selected().settings;
            let r = runtime(2).block_on(annotate::annotate(s, &options))?;
            print_report(output, &r, annotate::render_text);
            Ok(0)
        }
        Command::StanzaDelete { repos, force } => {
            let s = &repos.selected().settings;
            let r = runtime(2).block_on(
                pgstrata_engine::commands::stanza_delete::stanza_delete(s, force),
            )?;
            print!(
                "{}",
                pgstrata_engine::commands::stanza_delete::render_text(&r)
            );
            Ok(0)
        }
        Command::KeyRemove { repos, key_id } => key_remove(&repos, &key_id),
    }
}

fn help(topic: Option<&str>) -> Result<i32, Error> {
    match topic {
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

fn completions(shell: Option<&str>) -> Result<i32, Error> {
    match shell {
        Some("bash") => print!("{}", generate::bash()),
        Some("zsh") => print!("{}", generate::zsh()),
        _ => return Err(Error::config("completions takes one argument: bash or zsh")),
    }
    Ok(0)
}

fn version() -> Result<i32, Error> {
    println!(
        "pgstrata {} (repository format {})",
        env!("CARGO_PKG_VERSION"),
        pgstrata_repo::FORMAT_VERSION
    );
    Ok(0)
}

/// stanza-create, check or backup as a job of `agent run` on another host, once for each
/// repository it covers; after a backup, retention here.
fn on_another_host(job: &RemoteJob) -> Result<i32, Error> {
    let views: Vec<&Repo> = if job.kind == JobKind::Backup || job.repos.chosen.is_some() {
        vec![job.repos.selected()]
    } else {
        job.repos.all.iter().collect()
    };
    let code = agent_commands::run_on_pg_remote(job, &views)?;
    if code == 0 && job.kind == JobKind::Backup {
        apply_retention(job.repos.selected(), &runtime(2))?;
    }
    Ok(code)
}

/// " in repoN" (or `with` around the number) when a command covers several repositories.
fn place(repos: &[&Repo], s: &Settings, before: &str, after: &str) -> String {
    if repos.len() > 1 {
        format!("{before}repo{}{after}", s.repo_index)
    } else {
        String::new()
    }
}

fn stanza_create(repos: &Repos) -> Result<i32, Error> {
    let repos = repos.covered();
    let rt = runtime(2);
    for r in &repos {
        let s = &r.settings;
        let place = place(&repos, s, " in ", "");
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

fn stanza_upgrade(repos: &Repos) -> Result<i32, Error> {
    use pgstrata_engine::commands::stanza_upgrade::{stanza_upgrade, UpgradeOutcome};
    let repos = repos.covered();
    let rt = runtime(2);
    for r in &repos {
        let s = &r.settings;
        let place = place(&repos, s, " in ", "");
        match rt.block_on(stanza_upgrade(s))? {
            UpgradeOutcome::Upgraded { from, to } => println!(
                "stanza '{}' upgraded{place}: cluster {from} -> {to}; its next backup is full",
                s.stanza
            ),
            UpgradeOutcome::AlreadyCurrent => {
                println!(
                    "stanza '{}' already belongs to this cluster{place}",
                    s.stanza
                )
            }
        }
    }
    Ok(0)
}

fn check(repos: &Repos) -> Result<i32, Error> {
    let repos = repos.covered();
    let rt = runtime(2);
    for r in &repos {
        let s = &r.settings;
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
            place(&repos, s, " for ", "")
        );
    }
    Ok(0)
}

fn backup(b: &Backup) -> Result<i32, Error> {
    let repo = b.repos.selected();
    let s = &repo.settings;
    let rt = runtime(s.process_max.get());
    let m = rt.block_on(pgstrata_engine::commands::backup::backup(s, &b.options))?;
    notify::report(
        &serde_json::json!({ "label": m.label, "type": m.backup_type, "stats": m.stats }),
    );
    println!("{}", m.label);
    apply_retention(repo, &rt)?;
    Ok(0)
}

/// Retention after a backup, as pgBackRest does when it is configured; where the
/// repository is: a database host that reaches it through `repo-remote`, or does a backup
/// host's job (`agent run`), may only add to it, and the backup host applies it.
fn apply_retention(repo: &Repo, rt: &tokio::runtime::Runtime) -> Result<(), Error> {
    let Some(e) = repo.expire_options() else {
        return Ok(());
    };
    if args::in_agent_run() {
        return Ok(());
    }
    if repo.settings.repo.remote.is_some() {
        log::info!(
            "retention is applied on the backup host ('pgstrata expire' there): this host adds to the repository, it does not delete"
        );
        return Ok(());
    }
    rt.block_on(pgstrata_engine::commands::expire::expire(&repo.settings, e))?;
    Ok(())
}

fn restore(r: &Restore) -> Result<i32, Error> {
    let s = &r.repos.selected().settings;
    let opts = &r.options;
    if opts.instant {
        return restore_instant(r);
    }
    if r.resume || r.foreground {
        return Err(Error::config(
            "--resume and --instant-foreground go with --instant",
        ));
    }
    if opts.dry_run {
        let (plan, settings) =
            runtime(2).block_on(pgstrata_engine::commands::restore::plan(s, opts))?;
        print!("restore plan: {plan}");
        for line in settings {
            println!("  recovery: {line}");
        }
        println!("nothing was written (--dry-run)");
        return Ok(0);
    }
    let r = runtime(s.process_max.get())
        .block_on(pgstrata_engine::commands::restore::restore(s, opts))?;
    println!(
        "restored backup {}: {} files written, {} patched, {} unchanged, {} zeroed, {} removed; {} bytes fetched",
        r.label, r.counts.files_written, r.counts.files_patched, r.counts.files_kept, r.counts.files_zeroed, r.removed, r.counts.bytes_fetched
    );
    Ok(0)
}

/// `restore --instant`: restore all but the deferred files (unless resuming), then serve
/// them from a background process (or this one, `--instant-foreground`).
fn restore_instant(r: &Restore) -> Result<i32, Error> {
    use pgstrata_engine::instant;
    let s = &r.repos.selected().settings;
    let opts = &r.options;
    if opts.delta || opts.dry_run {
        return Err(Error::config(
            "--instant restores into an empty data directory: not with --delta or --dry-run",
        ));
    }
    if nix::unistd::geteuid().is_root() {
        return Err(Error::config(
            "restore --instant mounts a FUSE filesystem that only its user can enter: run it as the cluster's OS user (e.g. sudo -u postgres pgstrata ...), not as root",
        ));
    }
    let pg_path = s
        .pg_path
        .clone()
        .ok_or_else(|| Error::config("restore needs pg-path"))?;
    if r.foreground {
        runtime(s.process_max.get() + 2).block_on(instant::serve(s, &pg_path))?;
        return Ok(0);
    }
    if !r.resume {
        let report = runtime(s.process_max.get())
            .block_on(pgstrata_engine::commands::restore::restore(s, opts))?;
        println!(
            "restored backup {}: {} files written, {} zeroed, {} deferred (served on demand); {} bytes fetched",
            report.label,
            report.counts.files_written,
            report.counts.files_zeroed,
            report.counts.files_deferred,
            report.counts.bytes_fetched
        );
    }
    if r.resume {
        if let Ok(st) = instant::instant_status(&pg_path, false) {
            if st.state == "complete" {
                println!(
                    "the instant restore of {} is complete: nothing to resume",
                    pg_path.display()
                );
                return Ok(0);
            }
        }
    }
    let (pid, log) = start_instant_server(r, &pg_path)?;
    println!(
        "serving the deferred files from process {pid} (log {}); the data directory can be started now; follow it with: pgstrata instant-status --pg-path={}",
        log.display(),
        pg_path.display()
    );
    Ok(0)
}

/// Start this restore again as the serving process (`--instant-foreground`, in a session
/// of its own, its output to the log) and wait until it serves: its pid and log.
fn start_instant_server(
    r: &Restore,
    pg_path: &std::path::Path,
) -> Result<(u32, std::path::PathBuf), Error> {
    use std::os::unix::process::CommandExt;
    let s = &r.repos.selected().settings;
    let dir = pgstrata_engine::instant::instant_dir(pg_path)?;
    let open = |p: &std::path::Path| {
        std::fs::create_dir_all(p.parent().expect("a directory")).and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
        })
    };
    // Beside the instant directory's other files when log-path cannot be written.
    let mut log = r.log_path.join(format!("{}-instant.log", s.stanza));
    let out = match open(&log) {
        Ok(f) => f,
        Err(_) => {
            log = dir.join("serve.log");
            open(&log).map_err(|e| Error::io(format!("open {}", log.display()), e))?
        }
    };
    let err = out
        .try_clone()
        .map_err(|e| Error::io(format!("open {}", log.display()), e))?;
    let exe = std::env::current_exe().map_err(|e| Error::io("find this program", e))?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.push("--instant-foreground".into());
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid only detaches the child from the terminal's session; nothing else
    // runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io("start the instant restore's process", e))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        if let Ok(st) = pgstrata_engine::instant::instant_status(pg_path, false) {
            if st.pid == child.id() {
                return Ok((child.id(), log));
            }
        }
        if let Some(code) = child.try_wait().map_err(|e| Error::io("wait", e))? {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            return Err(Error::new(
                pgstrata_engine::ErrorKind::Io,
                format!(
                    "the instant restore's process stopped ({code}) before serving: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                ),
            ));
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return Err(Error::new(
                pgstrata_engine::ErrorKind::Io,
                format!(
                    "the instant restore's process did not start serving within 120 s (log {})",
                    log.display()
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn restore_test(r: &RestoreTest) -> Result<i32, Error> {
    let s = &r.repos.selected().settings;
    let report = runtime(s.process_max.get()).block_on(
        pgstrata_engine::commands::restore_test::restore_test(s, &r.options),
    )?;
    print_report(
        r.output,
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

fn archive_push(a: &ArchivePush) -> Result<i32, Error> {
    let repos = a.repos.selected_first();
    let rt = per_file_runtime();
    if let Some(role) = worker_role() {
        let wal_dir = std::env::var_os(archive::WAL_DIR_ENV)
            .map(PathBuf::from)
            .ok_or_else(|| Error::config("an archive-push worker needs its WAL directory"))?;
        assert_eq!(role, archive::WorkerRole::Push);
        let wanted = std::env::var(archive::WANTED_ENV).ok();
        rt.block_on(archive::push_worker(
            &repos,
            &a.async_options,
            &wal_dir,
            wanted.as_deref(),
        ))?;
        return Ok(0);
    }
    if a.asynchronous {
        rt.block_on(archive::push(
            &repos,
            &a.async_options,
            &a.wal,
            &launch_worker,
        ))?;
        return Ok(0);
    }
    rt.block_on(pgstrata_engine::commands::archive::archive_push_all(
        &repos, &a.wal,
    ))?;
    Ok(0)
}

fn archive_get(a: &ArchiveGet) -> Result<i32, Error> {
    let repos = a.repos.selected_first();
    let rt = per_file_runtime();
    if worker_role() == Some(archive::WorkerRole::Get) {
        rt.block_on(archive::get_worker(&repos, &a.async_options))?;
        return Ok(0);
    }
    let found = rt.block_on(archive::get(
        &repos,
        &a.async_options,
        &a.name,
        &a.dest,
        &launch_worker,
    ))?;
    Ok(if found { 0 } else { 1 })
}

fn expire(repos: &Repos, output: ReportOutput) -> Result<i32, Error> {
    let repo = repos.selected();
    // Retention is per repository: repoN-retention-* for repository N.
    let Some(o) = repo.expire_options() else {
        return Err(Error::config(
            "nothing to expire by: set repo-retention-full (and optionally repo-retention-diff), or give --set=LABEL",
        ));
    };
    let r = runtime(2).block_on(pgstrata_engine::commands::expire::expire(&repo.settings, o))?;
    print_report(output, &r, pgstrata_engine::commands::expire::render_text);
    Ok(0)
}

fn info(r: &Report) -> Result<i32, Error> {
    let rt = runtime(2);
    let mut reports = Vec::new();
    for repo in r.repos.covered() {
        let s = &repo.settings;
        let report = rt.block_on(pgstrata_engine::commands::info::info(s, r.set.as_deref()))?;
        reports.push((s, report));
    }
    let text = pgstrata_engine::commands::info::render_text;
    print_repo_reports(r.output, &reports, text, metrics::render_info);
    Ok(0)
}

fn verify(v: &Verify) -> Result<i32, Error> {
    let r = &v.report;
    let options = pgstrata_engine::commands::verify::VerifyOptions {
        set: r.set.clone(),
        repair: v.repair,
    };
    let repos = r.repos.covered();
    let rt = runtime(repos[0].settings.process_max.get());
    let mut reports = Vec::new();
    for repo in repos {
        let s = &repo.settings;
        let report = rt.block_on(pgstrata_engine::commands::verify::verify(s, &options))?;
        reports.push((s, report));
    }
    let text = pgstrata_engine::commands::verify::render_text;
    print_repo_reports(r.output, &reports, text, metrics::render_verify);
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

fn key_add(k: &KeyAdd) -> Result<i32, Error> {
    let s = &k.repos.selected().settings;
    let new_pass = new_passphrase(
        k.new_pass.as_deref().map(String::as_str),
        k.new_pass_file.as_deref(),
    )?;
    let key = runtime(2).block_on(pgstrata_engine::commands::key::key_add(s, new_pass))?;
    println!("key {} added to stanza '{}'", key.id, s.stanza);
    Ok(0)
}

fn copy(c: &Copy) -> Result<i32, Error> {
    if c.repos.chosen.is_none() {
        return Err(Error::config(
            "copy needs --repo=N, the repository to copy to (and --from-repo=N, default 1)",
        ));
    }
    let from = c
        .repos
        .all
        .iter()
        .find(|r| r.settings.repo_index == c.from_repo)
        .ok_or_else(|| {
            Error::config(format!(
                "--from-repo={}: repository {} is not configured (set repo{}-path)",
                c.from_repo, c.from_repo, c.from_repo
            ))
        })?;
    let to = &c.repos.selected().settings;
    let report = runtime(2).block_on(pgstrata_engine::commands::copy::copy(
        &from.settings,
        to,
        &c.options,
    ))?;
    print_report(
        c.output,
        &report,
        pgstrata_engine::commands::copy::render_text,
    );
    Ok(0)
}

fn repo_ls(
    repos: &Repos,
    path: Option<&str>,
    recurse: bool,
    output: ReportOutput,
) -> Result<i32, Error> {
    use pgstrata_engine::commands::repo_tools;
    let s = &repos.selected().settings;
    let listed = runtime(2).block_on(repo_tools::repo_ls(s, path, recurse))?;
    print_report(output, &listed, |l: &Vec<_>| repo_tools::render_ls(l));
    Ok(0)
}

fn repo_get(repos: &Repos, path: Option<&str>) -> Result<i32, Error> {
    use std::io::Write;
    let path = path.ok_or_else(|| {
        Error::config(
            "repo-get needs the object's path, e.g. main/stanza.json (repo-ls lists them)",
        )
    })?;
    let s = &repos.selected().settings;
    let bytes = runtime(2).block_on(pgstrata_engine::commands::repo_tools::repo_get(s, path))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)
        .and_then(|_| out.flush())
        .map_err(|e| {
            Error::new(
                pgstrata_engine::ErrorKind::Io,
                format!("writing {path} to standard output: {e}"),
            )
        })?;
    Ok(0)
}

fn key_list(repos: &Repos, output: ReportOutput) -> Result<i32, Error> {
    let s = &repos.selected().settings;
    let keys = runtime(2).block_on(pgstrata_engine::commands::key::key_list(s))?;
    print_report(output, &keys, |keys| {
        keys.iter()
            .map(|k| format!("{}  created {} by {}@{}\n", k.id, k.created, k.user, k.host))
            .collect()
    });
    Ok(0)
}

fn key_remove(repos: &Repos, id: &str) -> Result<i32, Error> {
    let s = &repos.selected().settings;
    runtime(2).block_on(pgstrata_engine::commands::key::key_remove(s, id))?;
    println!("key {id} removed from stanza '{}'", s.stanza);
    Ok(0)
}

/// key-add's new passphrase: from PGSTRATA_NEW_CIPHER_PASS or the first line of
/// --new-cipher-pass-file, exactly one of them, not empty.
fn new_passphrase(pass: Option<&str>, file: Option<&Path>) -> Result<Passphrase, Error> {
    let pass = match (pass, file) {
        (Some(p), None) => p.to_string(),
        (None, Some(file)) => {
            let text = zeroize::Zeroizing::new(std::fs::read_to_string(file).map_err(|e| {
                Error::io(
                    format!(
                        "read the new passphrase from --new-cipher-pass-file={}",
                        file.display()
                    ),
                    e,
                )
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
    output: ReportOutput,
    report: &T,
    render_text: impl Fn(&T) -> String,
) {
    print_report_or_metrics(output.into(), report, render_text, |_, _| String::new());
}

/// [`print_report`] of a command that also speaks Prometheus (`--output=prometheus`):
/// `render_metrics` gets the report and the time now (Unix seconds).
fn print_report_or_metrics<T: serde::Serialize>(
    output: Output,
    report: &T,
    render_text: impl Fn(&T) -> String,
    render_metrics: impl Fn(&T, i64) -> String,
) {
    notify::report(report);
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(report).expect("serialize report")
        ),
        Output::Prometheus => {
            print!("{}", render_metrics(report, chrono::Utc::now().timestamp()))
        }
        Output::Text => print!("{}", render_text(report)),
    }
}

/// Reports of several repositories, `(settings, report)`: one as ever; several as a JSON
/// array of the reports with a `repo` field, one Prometheus exposition, or text sections
/// headed by repository.
fn print_repo_reports<T: serde::Serialize>(
    output: Output,
    reports: &[(&Settings, T)],
    render_text: impl Fn(&T) -> String,
    render_metrics: impl Fn(&T, i64) -> String,
) {
    if let [(_, only)] = reports {
        return print_report_or_metrics(output, only, render_text, render_metrics);
    }
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
    notify::report(&all);
    match output {
        Output::Json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&all).expect("serialize reports")
            );
        }
        Output::Prometheus => {
            let now = chrono::Utc::now().timestamp();
            let parts: Vec<String> = reports
                .iter()
                .map(|(_, r)| render_metrics(r, now))
                .collect();
            print!("{}", metrics::merge_expositions(&parts));
        }
        Output::Text => {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
