//! `pgstrata demo`: the whole story on a throwaway cluster, in a couple of minutes.
//!
//! It creates a cluster with pgbench data, archives its WAL with `pgstrata archive-push`,
//! takes a backup, changes the data, takes a second backup, restores it into a new
//! directory, starts the restored cluster and compares every table with the source.
//! Run as root, it first becomes the `postgres` user, since PostgreSQL will not run as root.

use pgstrata_cluster::{Cluster, PgBin, Scratch};
use pgstrata_engine::commands::backup::BackupOptions;
use pgstrata_engine::commands::restore::{RecoveryType, RestoreOptions, TargetAction};
use pgstrata_engine::progress::human_bytes;
use pgstrata_engine::{Error, Settings};
use pgstrata_repo::codec::{CompressType, Compression};
use pgstrata_repo::manifest::BackupType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fail(what: &str) -> impl FnOnce(pgstrata_cluster::Error) -> Error + '_ {
    move |e| {
        Error::new(
            pgstrata_engine::ErrorKind::Refused,
            format!("demo: {what}: {e}"),
        )
    }
}

fn become_postgres() -> Result<(), Error> {
    if !pgstrata_cluster::is_root() {
        return Ok(());
    }
    let user = nix::unistd::User::from_name(pgstrata_cluster::PG_OS_USER)
        .ok()
        .flatten()
        .ok_or_else(|| Error::refused("demo: running as root needs a 'postgres' user to run PostgreSQL (install postgresql-15)"))?;
    nix::unistd::setgid(user.gid)
        .and_then(|_| nix::unistd::setuid(user.uid))
        .map_err(|e| Error::refused(format!("demo: cannot become postgres: {e}")))?;
    // SAFETY-free: environment for child programs.
    std::env::set_var("HOME", &user.dir);
    println!("   (running as root: switched to the postgres user)");
    Ok(())
}

pub(crate) fn run(pg_bin: Option<PathBuf>) -> Result<(), Error> {
    let t0 = Instant::now();
    let bin = match pg_bin {
        Some(d) => PgBin {
            dir: d,
            major: 0,
            lib_dir: None,
            env: None,
        },
        None => PgBin::default_install().map_err(fail("find PostgreSQL"))?,
    };
    let scratch = Scratch::new("demo");
    let exe = install_binary(&scratch)?;
    become_postgres()?;

    let repo = scratch.join("repo");
    std::fs::create_dir_all(&repo).map_err(|e| Error::io("create demo repository", e))?;
    println!("pgstrata demo in {}", scratch.path.display());
    let archive_command = format!(
        "{} --stanza=demo --repo-path={} --compress-type=lz4 archive-push %p",
        exe.display(),
        repo.display()
    );
    let src = Cluster::init(&bin, &scratch.path, &archive_command).map_err(fail("initdb"))?;
    src.start().map_err(fail("start the cluster"))?;
    println!("1. created a PostgreSQL {} cluster with data checksums, archive_command = '{archive_command}'", bin.major);
    src.pgbench(&["-i", "-s", "10", "-q", "postgres"])
        .map_err(fail("pgbench -i"))?;
    println!("2. loaded pgbench data (scale 10, 1,000,000 accounts)");

    let mut s = settings(&repo, &src, scratch.path.join("lock"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(pgstrata_engine::commands::stanza_create::stanza_create(&s))?;
    println!("3. stanza-create: stanza 'demo' in {}", repo.display());
    let full = rt.block_on(backup(&s, BackupType::Full))?;
    println!(
        "4. full backup {}: {} of data stored as {} ({:.1}s)",
        full.label,
        human_bytes(full.stats.db_size),
        human_bytes(full.stats.stored_size),
        full.stats.duration_ms as f64 / 1000.0
    );

    change_data(&src)?;
    let expected = src.content_hashes().map_err(fail("hash tables"))?;
    let second = rt.block_on(backup(&s, BackupType::Incr))?;
    println!(
        "6. block-incremental backup {} (compared with {}): {} files unchanged, {} read, only {} of changed blocks stored ({:.1}s)",
        second.label,
        full.label,
        second.stats.files_unchanged,
        human_bytes(second.stats.bytes_read),
        human_bytes(second.stats.stored_size),
        second.stats.duration_ms as f64 / 1000.0
    );

    let restored = scratch.join("restored");
    s.pg_path = Some(restored.clone());
    let archive_get_command = format!(
        "{} --stanza=demo --repo-path={}",
        exe.display(),
        repo.display()
    );
    let r = rt.block_on(pgstrata_engine::commands::restore::restore(
        &s,
        &restore_options(&second.label, archive_get_command),
    ))?;
    println!(
        "7. restored {} into {} ({} files)",
        r.label,
        restored.display(),
        r.counts.files_written
    );
    compare_restored(&bin, &restored, &scratch, &expected)?;
    verify_and_show(&rt, &s)?;
    println!("demo finished in {:.0}s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// The server runs archive-push as its own user: give it a copy of this binary it can run.
fn install_binary(scratch: &Scratch) -> Result<PathBuf, Error> {
    let exe_src = std::env::current_exe().map_err(|e| Error::io("find pgstrata binary", e))?;
    let bin_dir = scratch.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(|e| Error::io("create demo bin dir", e))?;
    let exe = bin_dir.join("pgstrata");
    std::fs::copy(&exe_src, &exe).map_err(|e| Error::io("copy pgstrata binary", e))?;
    pgstrata_cluster::give_to_pg_user(&bin_dir);
    pgstrata_cluster::give_to_pg_user(&exe);
    Ok(exe)
}

/// The demo's settings: stanza `demo` in local repository `repo`, cluster `src`.
fn settings(repo: &Path, src: &Cluster, lock_path: PathBuf) -> Result<Settings, Error> {
    let repo = pgstrata_repo::storage::RepoConfig {
        path: repo.display().to_string(),
        retries: 3,
        ..Default::default()
    };
    Ok(Settings {
        pg_path: Some(src.data.clone()),
        pg_host: Some(src.socket_dir.display().to_string()),
        pg_port: src.port,
        pg_user: Some("postgres".into()),
        compression: Compression::new(CompressType::Zst, None)?,
        process_max: std::num::NonZeroUsize::new(2).expect("two"),
        start_fast: true,
        archive_timeout: Duration::from_secs(60),
        bundle_limit: 2 << 20,
        ..Settings::for_repository("demo", repo, lock_path)
    })
}

async fn backup(
    s: &Settings,
    backup_type: BackupType,
) -> Result<pgstrata_repo::manifest::Manifest, Error> {
    pgstrata_engine::commands::backup::backup(
        s,
        &BackupOptions {
            backup_type,
            delta: false,
            track: pgstrata_engine::track::Track::Auto,
            annotations: Default::default(),
            resume: true,
            locked_by_caller: false,
        },
    )
    .await
}

fn change_data(src: &Cluster) -> Result<(), Error> {
    src.pgbench(&["-n", "-t", "300", "-c", "2", "postgres"])
        .map_err(fail("pgbench run"))?;
    for sql in [
        "DELETE FROM pgbench_accounts WHERE aid BETWEEN 500001 AND 510000",
        "CREATE TABLE demo_note AS SELECT g AS id, md5(g::text) AS note FROM generate_series(1, 5000) g",
        "VACUUM",
    ] {
        src.psql("postgres", sql).map_err(fail("change data"))?;
    }
    println!("5. changed the data: 600 pgbench transactions, 1% of accounts deleted (one range, as in the block-incremental test report), a new table");
    Ok(())
}

/// Restore backup `label` to its consistency point and promote.
fn restore_options(label: &str, archive_get_command: String) -> RestoreOptions {
    RestoreOptions {
        set: Some(label.to_string()),
        delta: false,
        force: false,
        dry_run: false,
        tablespace_map: vec![],
        tablespace_root: None,
        link_all: false,
        link_map: vec![],
        recovery_type: RecoveryType::Immediate,
        target: None,
        target_action: Some(TargetAction::Promote),
        target_timeline: None,
        target_exclusive: false,
        archive_off: true,
        archive_get_command,
        db_include: vec![],
        db_exclude: vec![],
        recovery_options: vec![],
        instant: false,
    }
}

/// Start the restored cluster and compare every table with the source's `expected`.
fn compare_restored(
    bin: &PgBin,
    restored: &Path,
    scratch: &Scratch,
    expected: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let copy = Cluster::adopt(bin, restored, &scratch.path);
    copy.start().map_err(fail("start the restored cluster"))?;
    copy.wait_for_promotion(Duration::from_secs(120))
        .map_err(fail("recover"))?;
    let got = copy
        .content_hashes()
        .map_err(fail("hash restored tables"))?;
    if &got != expected {
        return Err(Error::integrity(format!(
            "demo: the restored cluster differs from the source:\n source: {expected:?}\n restored: {got:?}"
        )));
    }
    println!(
        "8. started the restored cluster: all {} tables equal the source at the backup ({} rows of pgbench_accounts)",
        got.len(),
        copy.psql("postgres", "SELECT count(*) FROM pgbench_accounts").unwrap_or_default()
    );
    Ok(())
}

fn verify_and_show(rt: &tokio::runtime::Runtime, s: &Settings) -> Result<(), Error> {
    let v = rt.block_on(pgstrata_engine::commands::verify::verify(
        s,
        &Default::default(),
    ))?;
    if !v.ok {
        return Err(Error::integrity(format!(
            "demo: verify found problems:\n{}",
            pgstrata_engine::commands::verify::render_text(&v)
        )));
    }
    println!(
        "9. verify: both backups read back and match their recorded hashes ({} files read for the full, {} for the incremental); {} archived WAL segments intact",
        v.backups[0].files_read,
        v.backups[1].files_read,
        v.wal.segments
    );
    let report = rt.block_on(pgstrata_engine::commands::info::info(s, None))?;
    println!(
        "\n{}",
        pgstrata_engine::commands::info::render_text(&report)
    );
    Ok(())
}
