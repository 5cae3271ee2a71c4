//! Asynchronous archive-push (`archive-async`) and archive-get prefetch, driven by a real
//! PostgreSQL: its archiver calls archive-push, its startup process archive-get.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Config body: a local repository, asynchronous archiving with a spool in the scratch
/// directory, `extra` appended.
fn async_toml(extra: &str) -> String {
    format!(
        "repo-path = \"{{repo}}\"\narchive-async = true\nspool-path = \"{{repo}}/../spool\"\nprocess-max = 4\nlog-path = \"{{repo}}/../log\"\nlog-level-file = \"info\"\n{extra}"
    )
}

/// Pids of running pgstrata asynchronous workers of `role` for the config file `config`.
fn workers(role: &str, config: &Path) -> Vec<i32> {
    let want_role = format!("PGSTRATA_ASYNC_WORKER={role}");
    let want_config = format!("--config={}", config.display());
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let (Ok(environ), Ok(cmdline)) = (
            std::fs::read(e.path().join("environ")),
            std::fs::read(e.path().join("cmdline")),
        ) else {
            continue;
        };
        let has = |hay: &[u8], needle: &str| hay.split(|b| *b == 0).any(|w| w == needle.as_bytes());
        if has(&environ, &want_role) && has(&cmdline, &want_config) {
            pids.push(pid);
        }
    }
    pids
}

/// Files PostgreSQL has marked ready to archive and not yet archived.
fn ready(env: &Env) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(env.cluster.data.join("pg_wal/archive_status"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(".ready")
                .map(str::to_string)
        })
        .collect();
    v.sort();
    v
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn archived_segments(repo: &Path) -> Vec<String> {
    let mut v = vec![];
    let mut stack = vec![repo.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let n = e.file_name().to_string_lossy().to_string();
                if n.len() == 24 && n.bytes().all(|b| b.is_ascii_hexdigit()) {
                    v.push(n);
                }
            }
        }
    }
    v.sort();
    v
}

#[test]
fn async_push_under_load_survives_killed_workers_and_prefetch_replays_it_all() {
    let env = Env::with_config("async", &async_toml(""));
    let config = env.config.clone().unwrap();
    env.stanza_create();
    env.cluster
        .pgbench(&["-i", "-s", "2", "-q", "postgres"])
        .unwrap();
    env.backup(&["--type=full"]);
    // Load, with WAL switched often so that many segments become ready at once.
    let mut load = env
        .cluster
        .pgbench_spawn(&["-n", "-c", "2", "-T", "25", "postgres"])
        .unwrap();
    let mut kills = 0;
    let mut rng = 0x9e37_79b9_u64;
    let start = Instant::now();
    while kills < 10 && start.elapsed() < Duration::from_secs(60) {
        env.sql("SELECT pg_switch_wal()");
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(100 + rng % 400));
        for pid in workers("archive-push-async", &config) {
            if nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .is_ok()
            {
                kills += 1;
            }
        }
    }
    assert!(
        kills >= 10,
        "only {kills} workers were killed: the async worker did not run"
    );
    load.wait().unwrap();
    env.sql("CREATE TABLE after_load AS SELECT 42 AS answer");
    let want = env.hashes();
    // check switches WAL and waits until it is archived: the asynchronous path catches up.
    env.flush_wal();
    wait_until("the archiver to drain", Duration::from_secs(60), || {
        ready(&env).is_empty()
    });
    let stats = env.sql("SELECT archived_count, failed_count FROM pg_stat_archiver");
    eprintln!("pg_stat_archiver: {stats}");

    // Nothing lost: no gap anywhere in the archive, and verify agrees.
    let segs = archived_segments(&env.repo);
    assert!(segs.len() >= 10, "{segs:?}");
    let out = env.ok(&["verify"]);
    assert!(!out.contains("gap"), "{out}");
    let info = env.ok(&["info"]);
    assert!(!info.contains("GAP"), "{info}");
    assert!(
        info.contains("wal waiting to be archived: 0 ready"),
        "{info}"
    );

    // A restore replaying every segment through archive-get with prefetch equals the source.
    let spool = env.scratch.join("restore-spool");
    let restored = env.restore_and_start(
        "restored",
        &[
            &format!("--spool-path={}", spool.display()),
            "--archive-get-queue-max=64MiB",
        ],
    );
    assert_eq!(restored.content_hashes().unwrap(), want);
    let conf = std::fs::read_to_string(restored.data.join("postgresql.auto.conf")).unwrap();
    assert!(
        conf.contains("--archive-get-queue-max=67108864") && conf.contains("--spool-path="),
        "restore_command carries the prefetch options: {conf}"
    );
    let log = std::fs::read_to_string(env.scratch.join("log/test-archive-get.log")).unwrap();
    let from_queue = log.matches("from the prefetch queue").count();
    let from_repo = log.matches("from the archive").count();
    assert!(
        from_queue > from_repo,
        "most segments were served from the prefetch queue ({from_queue} of {})",
        from_queue + from_repo
    );
    restored.stop().unwrap();
}

#[test]
fn push_queue_max_drops_wal_loudly_and_check_info_verify_report_the_gap() {
    let env = Env::with_config(
        "async-drop",
        &async_toml("archive-push-queue-max = \"32MiB\"\n"),
    );
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.flush_wal();
    // The repository refuses writes: WAL piles up in pg_wal.
    let archive_dir = first_archive_dir(&env.repo);
    set_mode(&archive_dir, 0o500);
    for i in 0..4 {
        env.sql(&format!(
            "CREATE TABLE t{i} AS SELECT generate_series(1, 1000) AS x"
        ));
        env.sql("SELECT pg_switch_wal()");
    }
    // More than 16 MiB waited: the worker drops it (acknowledges without pushing).
    // (PostgreSQL retries a failed file after 60 s.)
    wait_until("WAL to be dropped", Duration::from_secs(120), || {
        ready(&env).is_empty()
    });
    set_mode(&archive_dir, 0o750);
    env.sql("CREATE TABLE later AS SELECT 1 AS x");
    env.flush_wal();
    let worker_log = std::fs::read_to_string(env.scratch.join("spool/test/archive-push-async.log"))
        .unwrap_or_default();
    assert!(
        worker_log.contains("archive-push-queue-max") && worker_log.contains("dropping"),
        "the drop is loud: {worker_log}"
    );
    let verify = env.cmd(&["verify"]).output().unwrap();
    let out = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(4), "{out}");
    assert!(out.contains("gap"), "{out}");
    let info = env.ok(&["info"]);
    assert!(info.contains("GAP"), "{info}");
    let check = env.cmd(&["check"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(stderr.contains("gap"), "check reports the gap: {stderr}");
}

#[test]
fn check_fails_when_archiving_falls_behind() {
    let env = Env::with_config("async-lag", &async_toml("archive-timeout = 2\n"));
    env.stanza_create();
    env.flush_wal();
    let archive_dir = first_archive_dir(&env.repo);
    set_mode(&archive_dir, 0o500);
    env.sql("SELECT pg_switch_wal()");
    env.sql("CREATE TABLE t AS SELECT 1 AS x");
    env.sql("SELECT pg_switch_wal()");
    wait_until("WAL to wait", Duration::from_secs(30), || {
        !ready(&env).is_empty()
    });
    std::thread::sleep(Duration::from_secs(3));
    let (code, out) = run_fail(env.cmd(&["--archive-lag-max=1", "check"]));
    assert_ne!(code, 0);
    assert!(out.contains("falling behind"), "{out}");
    let info = env.ok(&["info"]);
    assert!(info.contains("not in this repository"), "{info}");
    // The failing pushes reached PostgreSQL as failures, so nothing was acknowledged early.
    let failed: u64 = env
        .sql("SELECT failed_count FROM pg_stat_archiver")
        .trim()
        .parse()
        .unwrap();
    assert!(failed > 0);
    set_mode(&archive_dir, 0o750);
    env.flush_wal();
    wait_until("archiving to catch up", Duration::from_secs(60), || {
        ready(&env).is_empty()
    });
    env.ok(&["--archive-lag-max=1", "check"]);
}

fn first_archive_dir(repo: &Path) -> PathBuf {
    // archive/<stanza>/<archive-id>/...: the directory holding segment objects.
    let mut stack = vec![repo.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if archived_segments(&d).contains(&e.file_name().to_string_lossy().to_string()) {
                return d;
            }
        }
    }
    panic!("no archived segment under {}", repo.display());
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}
