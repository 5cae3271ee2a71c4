//! Asynchronous archive-push (`archive-async`) and archive-get prefetch, driven by a real
//! PostgreSQL: its archiver calls archive-push, its startup process archive-get.

use crate::common::*;
use pgstrata_testkit::set_mode;
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

/// A config file holding only `body` (and the spool, log and prefetch settings), owned by
/// the PostgreSQL user: for restores from one repository alone.
fn alone_config(env: &Env, name: &str, body: &str) -> PathBuf {
    let p = env.scratch.join(&format!("{name}.toml"));
    let spool = env.scratch.join(&format!("{name}-spool"));
    let log = env.scratch.join("log");
    std::fs::write(
        &p,
        format!(
            "[global]\n{body}\nspool-path = \"{}\"\nprocess-max = 4\nlog-path = \"{}\"\nlog-level-file = \"info\"\n",
            spool.display(),
            log.display()
        ),
    )
    .unwrap();
    pgstrata_testkit::give_to_pg_user(&p);
    set_mode(&p, 0o600).unwrap();
    p
}

#[test]
fn async_push_to_local_and_s3_under_load_survives_killed_workers() {
    let s3 = pgstrata_testkit::S3Server::start("async-wal").expect("moto_server");
    let s3_repo1 = crate::object_store::s3_toml(&s3.bucket, &s3.endpoint());
    let s3_repo2 = s3_repo1.replace("repo-", "repo2-");
    let env = Env::with_config("async", &async_toml(&s3_repo2));
    let config = env.config.clone().unwrap();
    env.stanza_create();
    env.pgbench_init(2);
    env.backup(&["--type=full"]);
    env.backup(&["--repo=2", "--type=full"]);
    // Load, with WAL switched often so that many segments become ready at once.
    let mut load = env
        .cluster
        .pgbench_spawn(&["-n", "-c", "2", "-T", "25", "postgres"])
        .unwrap();
    let mut kills = 0;
    let mut rng = 0x9e37_79b9_u64;
    let start = Instant::now();
    while kills < 10 && start.elapsed() < Duration::from_secs(90) {
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
    // check switches WAL and waits until it is archived in both repositories.
    env.flush_wal();
    wait_until("the archiver to drain", Duration::from_secs(60), || {
        ready(&env).is_empty()
    });

    // Nothing lost: no gap in either repository, and verify agrees.
    let local = archived_segments(&env.repo);
    assert!(local.len() >= 10, "{local:?}");
    let verify = env.ok(&["verify"]);
    assert!(
        verify.contains("repo2: ") && !verify.contains("gap"),
        "{verify}"
    );
    let info = env.ok(&["info"]);
    assert!(!info.contains("GAP"), "{info}");
    assert!(
        info.contains("wal waiting to be archived: 0 ready"),
        "{info}"
    );

    // Each repository alone restores and replays to the source, served by prefetch.
    for (name, body) in [
        (
            "local-alone",
            format!("repo-path = \"{}\"", env.repo.display()),
        ),
        ("s3-alone", s3_repo1.clone()),
    ] {
        let alone = alone_config(&env, name, &body);
        let restored = env.restore_and_start(
            name,
            &[
                &format!("--config={}", alone.display()),
                "--archive-get-queue-max=64MiB",
            ],
        );
        assert_eq!(
            restored.content_hashes().unwrap(),
            want,
            "restored from {name}"
        );
        let conf = std::fs::read_to_string(restored.data.join("postgresql.auto.conf")).unwrap();
        assert!(
            conf.contains("--archive-get-queue-max=67108864")
                && conf.contains(&alone.display().to_string()),
            "restore_command carries the prefetch options: {conf}"
        );
        restored.stop().unwrap();
    }
    let log = std::fs::read_to_string(env.scratch.join("log/test-archive-get.log")).unwrap();
    let from_queue = log.matches("from the prefetch queue").count();
    let from_repo = log.matches("from the archive").count();
    assert!(
        from_queue > from_repo,
        "most segments were served from the prefetch queue ({from_queue} of {})",
        from_queue + from_repo
    );
}

/// Prefetch follows recovery across a timeline switch: a backup restored, promoted and
/// archiving on timeline 2; a second restore of the same backup replays timeline 1 up to
/// the switch, then timeline 2, through the prefetch queue.
#[test]
fn prefetch_follows_a_timeline_switch() {
    let env = Env::with_config("async-tli", &async_toml(""));
    env.stanza_create();
    env.pgbench_init(1);
    env.backup(&["--type=full"]);
    for i in 0..3 {
        env.sql(&format!(
            "CREATE TABLE tl1_{i} AS SELECT generate_series(1, 20000) AS x"
        ));
        env.sql("SELECT pg_switch_wal()");
    }
    env.flush_wal();
    env.cluster.stop().unwrap();

    // The promoted copy archives timeline 2 into the same stanza.
    let first = env.scratch.join("first");
    run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", first.display()),
        "--target-action=promote",
        "restore",
    ]));
    let promoted = pgstrata_testkit::Cluster::adopt(&env.cluster.bin, &first, &env.scratch.path);
    promoted.start().unwrap();
    promoted
        .wait_for_promotion(Duration::from_secs(180))
        .unwrap();
    for i in 0..3 {
        promoted
            .psql(
                "postgres",
                &format!("CREATE TABLE tl2_{i} AS SELECT generate_series(1, 20000) AS x"),
            )
            .unwrap();
        promoted.psql("postgres", "SELECT pg_switch_wal()").unwrap();
    }
    let want = promoted.content_hashes().unwrap();
    let tli2_last = promoted
        .psql("postgres", "SELECT pg_walfile_name(pg_current_wal_lsn())")
        .unwrap();
    promoted.psql("postgres", "SELECT pg_switch_wal()").unwrap();
    wait_until("timeline 2 to be archived", Duration::from_secs(60), || {
        archived_segments(&env.repo).contains(&tli2_last.trim().to_string())
    });
    promoted.stop().unwrap();

    // The same backup again, following the latest timeline, through the prefetch queue.
    let restored = env.restore_and_start("second", &["--archive-get-queue-max=64MiB"]);
    assert_eq!(restored.content_hashes().unwrap(), want);
    let tli: String = restored
        .psql(
            "postgres",
            "SELECT timeline_id FROM pg_control_checkpoint()",
        )
        .unwrap();
    assert!(tli.trim().parse::<u32>().unwrap() >= 3, "{tli}");
    restored.stop().unwrap();
    let log = std::fs::read_to_string(env.scratch.join("log/test-archive-get.log")).unwrap();
    assert!(log.contains("from the prefetch queue"), "{log}");
}

/// Two archived segments of timeline 1, the second following the first.
fn consecutive_archived(repo: &Path) -> (String, String) {
    let segs = archived_segments(repo);
    let next = |n: &str| {
        let seg = u32::from_str_radix(&n[16..], 16).unwrap();
        format!("{}{:08X}", &n[..16], seg + 1)
    };
    segs.iter()
        .find(|a| segs.contains(&next(a)))
        .map(|a| (a.clone(), next(a)))
        .unwrap_or_else(|| panic!("no two consecutive segments in {segs:?}"))
}

/// The spooled copy of `name` under `spool`, once the prefetch worker has put it there.
fn spooled(spool: &Path, name: &str) -> Option<PathBuf> {
    let inbox = spool.join(STANZA).join("in");
    std::fs::read_dir(inbox)
        .ok()?
        .flatten()
        .map(|q| q.path().join(name))
        .find(|p| p.exists())
}

/// A prefetched segment altered in the spool after the worker checked it is never handed
/// to PostgreSQL: archive-get checks the spooled copy against the hash the repository
/// recorded for it and, when they differ, fetches the segment from the repository again.
/// And a spool directory that others can write is not used at all.
#[test]
fn an_altered_prefetched_segment_is_fetched_again_and_an_open_spool_is_not_used() {
    let env = Env::new("prefetch-altered");
    env.stanza_create();
    for i in 0..3 {
        env.sql(&format!(
            "CREATE TABLE t{i} AS SELECT generate_series(1, 1000) AS x"
        ));
        env.flush_wal();
    }
    let (first, second) = consecutive_archived(&env.repo);
    let spool = env.scratch.join("spool");
    let get = |spool: &Path, name: &str, dest: &Path, queue: &str| {
        env.cmd(&[
            &format!("--spool-path={}", spool.display()),
            &format!("--archive-get-queue-max={queue}"),
            "archive-get",
            name,
            dest.to_str().unwrap(),
        ])
    };
    let genuine_path = env.scratch.join("genuine");
    run_ok(get(&spool, &second, &genuine_path, "0"));
    let genuine = std::fs::read(&genuine_path).unwrap();

    // Asking for the first segment starts the worker, which spools the second.
    run_ok(get(&spool, &first, &env.scratch.join("got-first"), "64MiB"));
    let mut queued = None;
    wait_until(
        "the second segment to be prefetched",
        Duration::from_secs(30),
        || {
            queued = spooled(&spool, &second);
            queued.is_some()
        },
    );
    let queued = queued.unwrap();
    let mut altered = std::fs::read(&queued).unwrap();
    assert_eq!(altered, genuine, "spooled as archived");
    altered[1 << 20] ^= 0x40;
    std::fs::write(&queued, &altered).unwrap();

    let got = env.scratch.join("got-second");
    let out = get(&spool, &second, &got, "64MiB").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        std::fs::read(&got).unwrap() == genuine,
        "archive-get handed over the altered spooled copy: {err}"
    );
    assert!(
        err.contains(&second) && err.contains("does not match"),
        "the altered copy is reported: {err}"
    );

    // A spool others can write to is refused, with a warning, and the segment comes from
    // the repository; nothing is spooled there.
    let open = env.scratch.join("open-spool");
    std::fs::create_dir(&open).unwrap();
    pgstrata_testkit::give_to_pg_user(&open);
    set_mode(&open, 0o777).unwrap();
    let got = env.scratch.join("got-open");
    let out = get(&open, &first, &got, "64MiB").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("WARN") && err.contains(&open.display().to_string()) && err.contains("0777"),
        "the open spool is named: {err}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        std::fs::read_dir(&open).unwrap().next().is_none(),
        "nothing written to the open spool"
    );
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
    set_mode(&archive_dir, 0o500).unwrap();
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
    set_mode(&archive_dir, 0o750).unwrap();
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
    set_mode(&archive_dir, 0o500).unwrap();
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
    set_mode(&archive_dir, 0o750).unwrap();
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
