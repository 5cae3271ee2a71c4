//! `restore --instant`: PostgreSQL starts on the data directory while its large relation
//! files are still in the repository, answers queries (each block fetched the first time
//! it is read), and ends with ordinary files equal to the source once hydrated.

use crate::common::*;
use std::time::{Duration, Instant};

/// Unmounts a leftover instant mount (a failed test) so the scratch directory can go:
/// not even root may enter a user's FUSE mount.
struct MountGuard(std::path::PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.join("mnt"))
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn instant_dir(target: &std::path::Path) -> std::path::PathBuf {
    target.with_file_name(format!(
        ".{}.pgstrata-instant",
        target.file_name().unwrap().to_string_lossy()
    ))
}

/// Links left in the data directory (deferred files not yet handed over).
fn links_under(dir: &std::path::Path) -> usize {
    let mut n = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                n += 1;
            } else if t.is_dir() {
                dirs.push(e.path());
            }
        }
    }
    n
}

/// Start the cluster restored at `target` and wait until recovery ends.
fn start_restored(env: &Env, target: &std::path::Path) -> pgstrata_testkit::Cluster {
    let c = pgstrata_testkit::Cluster::adopt(&env.cluster.bin, target, &env.scratch.path);
    c.start().expect("start the instantly restored cluster");
    c.wait_for_promotion(Duration::from_secs(180))
        .expect("recovers");
    c
}

/// The files served for the instant restore at `target` (through the links in it) are
/// the restoring user's alone: the mount is not `allow_other`, so root (who passes every
/// permission check of the directories) is refused by the filesystem itself, and so is any
/// other user; the owner reads them.
fn assert_only_the_owner_enters_the_mount(target: &std::path::Path) {
    let mut dirs = vec![target.to_path_buf()];
    let link = 'found: loop {
        let d = dirs.pop().expect("a deferred file's link");
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_symlink() && e.path().starts_with(target.join("base")) {
                break 'found e.path();
            } else if t.is_dir() {
                dirs.push(e.path());
            }
        }
    };
    let served = std::fs::read_link(&link).unwrap();
    assert!(
        served.to_string_lossy().contains("pgstrata-instant/mnt/"),
        "{} -> {}",
        link.display(),
        served.display()
    );
    if !pgstrata_testkit::is_root() {
        // The tests' own user restored: it reads, and has no one else to be.
        assert!(std::fs::read(&served).is_ok(), "{}", served.display());
        return;
    }
    let err = std::fs::File::open(&served).expect_err("root opens a served file");
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{}: {err}",
        served.display()
    );
    let read_as = |user: &str| {
        std::process::Command::new("runuser")
            .args(["-u", user, "--", "head", "-c", "8192"])
            .arg(&served)
            .output()
            .unwrap()
    };
    let theirs = read_as("nobody");
    assert!(
        !theirs.status.success(),
        "another user read {}",
        served.display()
    );
    let owners = read_as(pgstrata_testkit::PG_OS_USER);
    assert!(
        owners.status.success() && owners.stdout.len() == 8192,
        "the owner reads {}: {}",
        served.display(),
        String::from_utf8_lossy(&owners.stderr)
    );
}

/// A full backup stored as the database holds it (pgbench's tables compress 20 to 1: so
/// a rate limit keeps hydration under way for seconds), and where to restore it: the
/// target, the guard that unmounts whatever is left there, and `--pg-path=` for it.
fn uncompressed_backup_and_target(env: &Env) -> (std::path::PathBuf, MountGuard, String) {
    env.backup(&["--type=full", "--compress-type=none"]);
    let target = env.scratch.join("instant");
    let guard = MountGuard(instant_dir(&target));
    let pg_path = format!("--pg-path={}", target.display());
    (target, guard, pg_path)
}

/// The arguments of `restore --instant` of the newest backup (to its end, promoted, no
/// archiving) into `pg_path` (`--pg-path=DIR`), hydration slowed by `rate_limit`
/// (`--repo-rate-limit=...`) so that it is under way for seconds.
fn slowed_instant_restore<'a>(pg_path: &'a str, rate_limit: &'a str) -> [&'a str; 8] {
    [
        pg_path,
        "--process-max=2",
        rate_limit,
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
        "--instant",
        "restore",
    ]
}

/// pgbench's balances in `c` add up to its history: no transaction lost in part.
fn assert_balances_agree(c: &pgstrata_testkit::Cluster) {
    let balances = c
        .psql(
            "postgres",
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history) \
             AND (SELECT sum(bbalance) FROM pgbench_branches) = (SELECT sum(delta) FROM pgbench_history)",
        )
        .unwrap();
    assert_eq!(balances.trim(), "t", "balances agree with the history");
}

/// `pg_amcheck --heapallindexed` of every database of `c` finds nothing.
fn assert_amcheck_clean(c: &pgstrata_testkit::Cluster) {
    let amcheck = c
        .bin
        .cmd("pg_amcheck")
        .args(["--heapallindexed", "-h"])
        .arg(&c.socket_dir)
        .args([
            "-p",
            &c.port.to_string(),
            "-U",
            "postgres",
            "--all",
            "--install-missing",
        ])
        .output()
        .unwrap();
    assert!(
        amcheck.status.success(),
        "pg_amcheck: {}{}",
        String::from_utf8_lossy(&amcheck.stdout),
        String::from_utf8_lossy(&amcheck.stderr)
    );
}

/// A backup restored with --instant: the cluster starts and answers while hydrating, the
/// status reaches complete, the links are gone, and after a restart (no pgstrata
/// process left) every table equals the source.
#[test]
fn an_instant_restore_answers_at_once_and_ends_with_ordinary_files() {
    let env = Env::new("instant");
    env.stanza_create();
    env.pgbench_init(5);
    env.backup(&["--type=full"]);
    let source = env.hashes();
    let target = env.scratch.join("instant");
    let _guard = MountGuard(instant_dir(&target));
    let pg_path = format!("--pg-path={}", target.display());
    let started = Instant::now();
    let out = env.ok(&[
        &pg_path,
        "--process-max=2",
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
        "--instant",
        "restore",
    ]);
    let restored_in = started.elapsed();
    assert!(out.contains("deferred"), "{out}");
    assert!(links_under(&target) > 0, "no file was deferred: {out}");
    let c = start_restored(&env, &target);
    let count = c
        .psql("postgres", "SELECT count(*) FROM pgbench_accounts")
        .unwrap();
    assert_eq!(count.trim(), "500000");
    let answered_in = started.elapsed();
    eprintln!("restore returned after {restored_in:?}, first answer after {answered_in:?}");
    let status = env.ok(&[&pg_path, "--wait", "--output=json", "instant-status"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["state"], "complete", "{v}");
    assert_eq!(v["bytes_local"], v["bytes_total"], "{v}");
    // Each file nothing has open through the mount is ordinary already (the status is
    // read first: files still open only become fewer).
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&[&pg_path, "--output=json", "instant-status"])).unwrap();
    let links = links_under(&target) as u64;
    let open = v["files_open_through_mount"].as_u64().unwrap();
    assert!(
        links <= open,
        "{links} links left with {open} files open through the mount"
    );
    let metrics = env.ok(&[&pg_path, "--output=prometheus", "instant-status"]);
    let local = format!(
        "pgstrata_instant_bytes_local{{data_directory=\"{}\"}} {}",
        target.display(),
        v["bytes_total"]
    );
    assert!(metrics.contains(&local), "{local} in:\n{metrics}");
    assert!(
        metrics.contains("pgstrata_instant_fetches_on_demand_total"),
        "{metrics}"
    );
    assert_eq!(c.content_hashes().unwrap(), source, "while still served");
    stop_and_see_the_serving_process_leave(&c, v["pid"].as_u64().unwrap());
    assert_eq!(links_under(&target), 0, "every link replaced by its file");
    c.start().unwrap();
    assert_eq!(c.content_hashes().unwrap(), source, "after a restart");
    assert_amcheck_clean(&c);
    c.stop().unwrap();
}

/// Stop the restored cluster: the serving process (`pid`) hands over the files it still
/// served, now closed, and leaves.
fn stop_and_see_the_serving_process_leave(c: &pgstrata_testkit::Cluster, pid: u64) {
    c.stop().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the serving process stays after the cluster stopped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The serving process killed (-9) at random points of hydration, again after each
/// resume, after PostgreSQL wrote to the files it serves: PostgreSQL fails (its files are
/// gone from under it), `restore --instant --resume` serves them again, and after crash
/// recovery nothing committed is lost (every pgbench transaction there, balances agree) and
/// pg_amcheck is clean. The first kill comes right after a checkpoint: the pages it wrote
/// must be found after the resume, since crash recovery starts at it (the test clusters
/// run with `fsync = off`, so no fsync makes their blocks' bits durable).
#[test]
fn a_killed_instant_restore_resumes_and_loses_no_commit() {
    let env = Env::new("instant-kill");
    env.stanza_create();
    env.pgbench_init(10);
    let (target, _guard, pg_path) = uncompressed_backup_and_target(&env);
    let args = slowed_instant_restore(&pg_path, "--repo-rate-limit=6MiB");
    env.ok(&args);
    assert_only_the_owner_enters_the_mount(&target);
    let c = start_restored(&env, &target);
    let mut resume = args.to_vec();
    resume.insert(resume.len() - 1, "--resume");
    let seed = test_seed();
    eprintln!("seed {seed} (PGSTRATA_TEST_SEED)");
    let mut committed = 0;
    let mut kills = 0;
    for round in 0..3u64 {
        let out = c
            .pgbench(&["-n", "-c", "2", "-t", "20", "postgres"])
            .unwrap();
        assert!(
            out.contains("number of transactions actually processed: 40"),
            "{out}"
        );
        committed += 40;
        c.psql("postgres", "CHECKPOINT").unwrap();
        let pause = if round == 0 {
            0
        } else {
            (seed >> (round * 16)) % 1500
        };
        std::thread::sleep(Duration::from_millis(pause));
        let status: serde_json::Value =
            serde_json::from_str(&env.ok(&[&pg_path, "--output=json", "instant-status"])).unwrap();
        if status["state"] == "complete" {
            break;
        }
        let pid = status["pid"].as_u64().unwrap();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
        kills += 1;
        eprintln!("round {round}: killed at {status}");
        // PostgreSQL's host is still up: stop it as a crash would.
        stop_at_once(&c);
        let failed = env.cmd(&[&pg_path, "instant-status"]).output().unwrap();
        assert_eq!(
            failed.status.code(),
            Some(3),
            "a killed process is reported"
        );
        let out = env.ok(&resume);
        assert!(out.contains("serving") || out.contains("complete"), "{out}");
        c.start().unwrap();
    }
    assert!(kills >= 1, "killed during hydration at least once");
    env.ok(&[&pg_path, "--wait", "instant-status"]);
    let q = |sql: &str| c.psql("postgres", sql).unwrap().trim().to_string();
    assert_eq!(
        q("SELECT count(*) FROM pgbench_history"),
        committed.to_string(),
        "every commit kept"
    );
    assert_balances_agree(&c);
    assert_amcheck_clean(&c);
    c.stop().unwrap();
}

/// pgbench's read-write transactions while the files are served, hydrated and handed
/// over: backends that opened a file through the mount before the hand-over and those
/// that open the ordinary file after it read and write the same bytes (a page cached by
/// the kernel for one path and changed through the other would be a lost update: a
/// duplicate key, wrong balances), and sizes agree (a relation extended through one path
/// is as long through the other).
#[test]
fn writes_across_the_hand_over_lose_nothing() {
    let env = Env::new("instant-rw");
    env.stanza_create();
    env.pgbench_init(10);
    let (target, _guard, pg_path) = uncompressed_backup_and_target(&env);
    env.ok(&slowed_instant_restore(&pg_path, "--repo-rate-limit=24MiB"));
    let c = start_restored(&env, &target);
    let q = |sql: &str| c.psql("postgres", sql).unwrap().trim().to_string();
    let accounts = target.join(q("SELECT pg_relation_filepath('pgbench_accounts')"));
    // Backends that have pgbench_accounts open through the mount from before hydration
    // completes until well after, while new connections (-C) open it by its ordinary
    // name once it is handed over.
    let (out, out_c, status) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            c.pgbench(&["-n", "-c", "4", "-j", "2", "-T", "20", "postgres"])
                .unwrap()
        });
        let status: serde_json::Value =
            serde_json::from_str(&env.ok(&[&pg_path, "--wait", "--output=json", "instant-status"]))
                .unwrap();
        assert_eq!(status["state"], "complete", "{status}");
        assert!(!load.is_finished(), "hydration took longer than the load");
        let out_c = c
            .pgbench(&["-n", "-C", "-c", "2", "-j", "2", "-T", "8", "postgres"])
            .unwrap();
        assert!(
            !accounts.is_symlink(),
            "pgbench_accounts still served through the mount"
        );
        (load.join().unwrap(), out_c, status)
    });
    assert_eq!(status["files_open_through_mount"], 0, "{status}");
    for o in [&out, &out_c] {
        assert!(!o.contains("error"), "pgbench failed: {o}");
    }
    // Every file is ordinary, the cluster still running.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while links_under(&target) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} files still served after their backends closed them",
            links_under(&target)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_balances_agree(&c);
    assert_amcheck_clean(&c);
    c.stop().unwrap();
    c.start().unwrap();
    assert_eq!(
        q("SELECT count(*) FROM pgbench_accounts"),
        "1000000",
        "after a restart on the ordinary files"
    );
    assert_amcheck_clean(&c);
    c.stop().unwrap();
}

/// A damaged frame of a deferred file: PostgreSQL gets an I/O error for what it holds,
/// never wrong bytes, and `instant-status` exits 4 naming the file.
#[test]
fn a_damaged_frame_is_an_io_error_and_instant_status_exits_4() {
    let env = Env::new("instant-damage");
    env.stanza_create();
    env.pgbench_init(5);
    let label = env.backup(&["--type=full"]);
    let rel = env.sql("SELECT pg_relation_filepath('pgbench_accounts')");
    let rel = rel.trim();
    // The manifest's entries (inline, or in its parts) name the frames of that file.
    let key = format!("{STANZA}/backup/{label}/backup.manifest");
    let m: serde_json::Value = serde_json::from_str(&env.ok(&["repo-get", &key])).unwrap();
    let mut entries: Vec<serde_json::Value> = m["entries"].as_array().cloned().unwrap_or_default();
    for n in 0..m["parts"].as_array().map_or(0, |p| p.len()) {
        let part = format!("{STANZA}/backup/{label}/manifest/{n}");
        let p: serde_json::Value = serde_json::from_str(&env.ok(&["repo-get", &part])).unwrap();
        entries.extend(
            p.as_array()
                .cloned()
                .unwrap_or_else(|| p["entries"].as_array().cloned().unwrap_or_default()),
        );
    }
    let file = entries
        .iter()
        .find(|e| e["path"] == rel)
        .unwrap_or_else(|| panic!("{rel} not among {} entries: {m}", entries.len()));
    // Its frames: the pack it uses most (a map, when it has one, is in another).
    let packs = file["packs"].as_array().expect("packs");
    let most = packs
        .iter()
        .max_by_key(|p| p["s"].as_u64().unwrap())
        .unwrap();
    let pack = env
        .repo
        .join(STANZA)
        .join("backup")
        .join(&label)
        .join("pack")
        .join(most["p"].as_str().unwrap());
    let mut bytes = std::fs::read(&pack).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(&pack, bytes).unwrap();
    let damaged = 1;
    assert!(damaged > 0, "{file}");
    let target = env.scratch.join("instant");
    let _guard = MountGuard(instant_dir(&target));
    let pg_path = format!("--pg-path={}", target.display());
    env.ok(&[
        &pg_path,
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
        "--instant",
        "restore",
    ]);
    let c = start_restored(&env, &target);
    let read = c.psql("postgres", "SELECT sum(abalance) FROM pgbench_accounts");
    let err = read
        .expect_err("a damaged frame must not be read as data")
        .to_string();
    assert!(
        err.contains("could not read") || err.contains("I/O error"),
        "{err}"
    );
    let out = env
        .cmd(&[&pg_path, "--wait", "instant-status"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains(rel), "names the file: {stderr}");
    stop_at_once(&c);
}

/// Point-in-time recovery through an instant restore of a backup with a tablespace (its
/// files deferred too, backed in its new location) and a database left out: the cluster
/// recovers to the target while its files are served, the tablespace's table and the
/// commits before the target are there, those after are not, and at the end no link is
/// left in the data directory or the tablespace.
#[test]
fn an_instant_pitr_with_a_tablespace_and_a_database_left_out() {
    let env = Env::new("instant-pitr");
    env.create_tablespace("ts1");
    env.sql("CREATE TABLE in_ts TABLESPACE ts1 AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 60000) g");
    env.sql("CREATE DATABASE other");
    env.cluster
        .psql(
            "other",
            "CREATE TABLE t AS SELECT generate_series(1, 100000) AS n",
        )
        .unwrap();
    let oid = env.sql("SELECT oid FROM pg_tablespace WHERE spcname = 'ts1'");
    env.stanza_create();
    env.pgbench_init(2);
    env.backup(&["--type=full"]);
    let in_ts = env.sql("SELECT sum(hashtext(v)) FROM in_ts");
    // The backup's recorded end is its stop time, rounded up: the target comes after it.
    std::thread::sleep(Duration::from_millis(1100));
    env.pgbench(&["-n", "-t", "50"]);
    let target_time = env.sql("SELECT now()");
    std::thread::sleep(Duration::from_millis(1100));
    env.pgbench(&["-n", "-t", "50"]);
    env.flush_wal();

    let target = env.scratch.join("instant");
    let new_ts = env.scratch.join("ts1-moved");
    let _guard = MountGuard(instant_dir(&target));
    let pg_path = format!("--pg-path={}", target.display());
    let out = env.ok(&[
        &pg_path,
        "--process-max=2",
        "--archive-mode=off",
        "--type=time",
        &format!("--target={target_time}"),
        "--target-action=promote",
        "--db-include=postgres",
        &format!("--tablespace-map={oid}={}", new_ts.display()),
        "--instant",
        "restore",
    ]);
    assert!(out.contains("deferred"), "{out}");
    let ts_links = links_under(&new_ts);
    assert!(ts_links > 0, "the tablespace's large file is deferred too");
    let c = start_restored(&env, &target);
    let q = |sql: &str| c.psql("postgres", sql).unwrap().trim().to_string();
    assert_eq!(
        q("SELECT count(*) FROM pgbench_history"),
        "50",
        "recovered to the target"
    );
    assert_eq!(q("SELECT sum(hashtext(v)) FROM in_ts"), in_ts.trim());
    let status: serde_json::Value =
        serde_json::from_str(&env.ok(&[&pg_path, "--wait", "--output=json", "instant-status"]))
            .unwrap();
    assert_eq!(q("SELECT sum(hashtext(v)) FROM in_ts"), in_ts.trim());
    stop_and_see_the_serving_process_leave(&c, status["pid"].as_u64().unwrap());
    assert_eq!(
        links_under(&target),
        1,
        "only pg_tblspc's link is left in the data directory"
    );
    assert_eq!(
        links_under(&new_ts),
        0,
        "the tablespace's files are ordinary"
    );
    assert!(
        std::fs::read_dir(&new_ts)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains("pgstrata")),
        "no store directory left in the tablespace"
    );
}

/// An instant restore of an encrypted stanza on S3 (the S3 test server): frames fetched
/// on demand and in the background are opened with the stanza's key; the data ends equal.
#[test]
fn an_instant_restore_of_an_encrypted_stanza_on_s3() {
    let server = pgstrata_testkit::S3Server::start("pgstrata-instant")
        .expect("moto S3 server (run .ci/setup)");
    let toml = format!(
        "{}repo-cipher-type = \"aes-256-gcm\"\nrepo-cipher-pass = \"instant passphrase\"\n",
        crate::object_store::s3_toml(&server.bucket, &server.endpoint())
    );
    let env = Env::with_config("instant-s3", &toml);
    env.stanza_create();
    env.pgbench_init(3);
    env.backup(&["--type=full"]);
    let source = env.hashes();
    let target = env.scratch.join("instant");
    let _guard = MountGuard(instant_dir(&target));
    let pg_path = format!("--pg-path={}", target.display());
    let out = env.ok(&[
        &pg_path,
        "--process-max=2",
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
        "--instant",
        "restore",
    ]);
    assert!(links_under(&target) > 0, "{out}");
    let c = start_restored(&env, &target);
    assert_eq!(
        c.psql("postgres", "SELECT count(*) FROM pgbench_accounts")
            .unwrap()
            .trim(),
        "300000"
    );
    env.ok(&[&pg_path, "--wait", "instant-status"]);
    assert_eq!(c.content_hashes().unwrap(), source);
    c.stop().unwrap();
}

/// `restore-table`: rows deleted by mistake, and a table dropped, come back from the
/// backup and the WAL as of a time before, as a pg_dump file; the repository is read far
/// less than a restore would.
#[test]
fn restore_table_gets_deleted_rows_and_a_dropped_table_back() {
    let env = Env::new("restore-table");
    env.stanza_create();
    env.pgbench_init(10);
    env.sql("CREATE TABLE precious AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 50000) g");
    env.sql("CREATE TABLE doomed AS SELECT g AS id FROM generate_series(1, 1000) g");
    env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "100"]);
    std::thread::sleep(Duration::from_millis(1100));
    let before = env.sql("SELECT now()");
    let precious = env.sql("SELECT sum(hashtext(v)) FROM precious");
    std::thread::sleep(Duration::from_millis(1100));
    env.sql("DELETE FROM precious WHERE id % 3 = 0");
    env.sql("DROP TABLE doomed");
    env.flush_wal();

    let out_file = env.scratch.join("dump").join("precious.sql");
    std::fs::create_dir_all(out_file.parent().unwrap()).unwrap();
    pgstrata_testkit::give_to_pg_user(out_file.parent().unwrap());
    let out = env.ok(&[
        &format!("--pg-path={}", env.scratch.join("table-scratch").display()),
        "--db=postgres",
        "--table=public.precious",
        "--table=public.doomed",
        &format!("--output={}", out_file.display()),
        "--type=time",
        &format!("--target={}", before.trim()),
        "restore-table",
    ]);
    eprintln!("{out}");
    // Read far less than the backup holds (its catalogs, the two tables, WAL replay's).
    let pct: f64 = out
        .split('(')
        .nth(1)
        .and_then(|s| s.split(" %").next())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no share in: {out}"));
    assert!(pct < 50.0, "fetched {pct} % of the backup: {out}");
    // Loaded into the source: the rows and the table are back.
    env.sql("ALTER TABLE precious RENAME TO precious_now");
    let psql = env
        .cluster
        .bin
        .client("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(&env.cluster.socket_dir)
        .args([
            "-p",
            &env.cluster.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-f",
        ])
        .arg(&out_file)
        .output()
        .unwrap();
    assert!(
        psql.status.success(),
        "{}",
        String::from_utf8_lossy(&psql.stderr)
    );
    assert_eq!(env.sql("SELECT sum(hashtext(v)) FROM precious"), precious);
    assert_eq!(env.sql("SELECT count(*) FROM doomed"), "1000");
}
