//! Restore cannot be turned against its host: links, FIFOs and hard links planted in the
//! target are replaced, never written through; directories that are not data directories
//! and tablespace locations of another cluster are refused; a restore killed anywhere is
//! never startable and resumes with --delta.

use crate::common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn small_env(name: &str) -> Env {
    let env = Env::new(name);
    env.pgbench_init(1);
    env.stanza_create();
    env.backup(&[]);
    env
}

fn restore_args(target: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        format!("--pg-path={}", target.display()),
        "--process-max=2".into(),
        "--archive-mode=off".into(),
        "--type=immediate".into(),
        "--target-action=promote".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("restore".into());
    args
}

fn restore_cmd(env: &Env, target: &Path, extra: &[&str]) -> Command {
    let args = restore_args(target, extra);
    env.cmd_as_invoker(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A file the restoring user could overwrite, were restore to follow a link to it.
fn canary(env: &Env, name: &str) -> std::path::PathBuf {
    let p = env.scratch.join(name);
    std::fs::write(&p, "precious").unwrap();
    pgstrata_testkit::give_to_pg_user(&p);
    p
}

#[test]
fn links_fifos_and_hard_links_in_the_target_are_replaced_never_written_through() {
    let env = small_env("nofollow");
    let fresh = restore_only(&env, "fresh", &[]);
    let target = restore_only(&env, "target", &[]);

    // What a hostile owner of the target could plant before a root `restore --delta`.
    let shadow = canary(&env, "shadow");
    std::fs::remove_file(target.join("global/pg_control")).unwrap();
    std::os::unix::fs::symlink(&shadow, target.join("global/pg_control")).unwrap();
    let linked = canary(&env, "hard-linked");
    std::fs::remove_file(target.join("PG_VERSION")).unwrap();
    std::fs::hard_link(&linked, target.join("PG_VERSION")).unwrap();
    let outside = env.scratch.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep"), "keep").unwrap();
    pgstrata_testkit::give_to_pg_user(&outside);
    std::fs::remove_dir_all(target.join("pg_xact")).unwrap();
    std::os::unix::fs::symlink(&outside, target.join("pg_xact")).unwrap();
    let conf = target.join("postgresql.conf");
    std::fs::remove_file(&conf).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&conf)
        .status()
        .unwrap()
        .success());

    run_ok(restore_cmd(&env, &target, &["--delta"]));

    assert_eq!(std::fs::read_to_string(&shadow).unwrap(), "precious");
    assert_eq!(std::fs::read_to_string(&linked).unwrap(), "precious");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing written into the directory a link pointed at"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "keep"
    );
    assert_eq!(
        content_tree(&target),
        content_tree(&fresh),
        "the target equals a fresh restore: every planted link, FIFO and hard link replaced"
    );
}

#[test]
fn delta_and_force_refuse_a_directory_that_is_not_a_data_directory() {
    let env = small_env("notpg");
    let home = env.scratch.join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/authorized_keys"), "ssh-ed25519 AAAA").unwrap();
    pgstrata_testkit::give_to_pg_user(&home);
    let before = content_tree(&home);
    for mode in ["--delta", "--force"] {
        let (code, err) = run_fail(restore_cmd(&env, &home, &[mode]));
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains("PG_VERSION") && err.contains("not a PostgreSQL data directory"),
            "{err}"
        );
        assert_eq!(content_tree(&home), before, "{mode}: nothing touched");
    }
    // --dry-run checks the same, and with an empty target shows the plan and writes nothing.
    let (_, err) = run_fail(restore_cmd(&env, &home, &["--delta", "--dry-run"]));
    assert!(err.contains("PG_VERSION"), "{err}");
    let dry = env.scratch.join("dry");
    let out = run_ok(restore_cmd(&env, &dry, &["--dry-run"]));
    assert!(
        out.contains("restore plan: backup")
            && out.contains("mode: fresh")
            && out.contains("recovery: restore_command = ")
            && out.contains("nothing was written"),
        "{out}"
    );
    assert!(!dry.exists(), "--dry-run created {}", dry.display());
}

#[test]
fn a_copy_on_the_source_host_never_touches_the_source_tablespaces_but_in_place_restores_do() {
    let env = Env::new("tsguard");
    let ts = env.create_tablespace("ts");
    env.sql("CREATE TABLE t TABLESPACE ts AS SELECT g AS id FROM generate_series(1, 5000) g");
    let oid = env.sql("SELECT oid FROM pg_tablespace WHERE spcname = 'ts'");
    env.stanza_create();
    env.backup(&[]);
    let expected = env.hashes();
    let source_ts = content_tree(&ts);

    // A copy with --delta or --force into a data directory (made by an earlier copy with
    // the tablespace mapped) must not follow the backup's locations into the source's.
    let copy = restore_only(
        &env,
        "copy",
        &[&format!(
            "--tablespace-map={oid}={}",
            env.scratch.join("ts-copy").display()
        )],
    );
    for mode in ["--delta", "--force"] {
        let (code, err) = run_fail(restore_cmd(&env, &copy, &[mode]));
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains(&format!("--tablespace-map={oid}="))
                && err.contains(&ts.display().to_string()),
            "{mode}: {err}"
        );
    }
    assert_eq!(
        content_tree(&ts),
        source_ts,
        "the source's tablespace is untouched"
    );

    // In place: the data directory's own link points at the location, so --delta may write.
    env.sql("INSERT INTO t SELECT g FROM generate_series(1, 1000) g");
    env.cluster.stop().unwrap();
    run_ok(restore_cmd(&env, &env.cluster.data, &["--delta"]));
    env.cluster.start().unwrap();
    env.cluster
        .wait_for_promotion(Duration::from_secs(120))
        .unwrap();
    assert_eq!(
        env.hashes(),
        expected,
        "in-place delta restore of the backup"
    );
}

/// A small deterministic generator: the test prints its seed, so a failure can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn a_restore_killed_at_random_points_is_never_startable_and_resumes_with_delta() {
    let env = small_env("killed");
    let fresh = env.scratch.join("fresh");
    let t0 = Instant::now();
    run_ok(restore_cmd(&env, &fresh, &[]));
    let full = t0.elapsed();
    let expected = content_tree(&fresh);
    let seed = test_seed();
    eprintln!("seed {seed} (PGSTRATA_TEST_SEED), a full restore takes {full:?}");
    let mut rng = Lcg(seed);
    let target = env.scratch.join("target");
    let mut interrupted = 0;
    // How long each mode's restore takes, learned as it goes: kill points are drawn within
    // it, so a machine that restores faster than the first (cold) restore still has its
    // restores interrupted.
    let mut span = [full, full];
    for round in 0..20 {
        // Alternate the mode that is killed: --force rewrites everything, --delta over a
        // complete directory mostly compares.
        let m = round % 2;
        let mode = ["--force", "--delta"][m];
        let delay = Duration::from_micros(rng.next() % (span[m].as_micros() as u64 + 1));
        let started = Instant::now();
        let mut child = restore_cmd(&env, &target, &[mode]).spawn().unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let status = child.wait().unwrap();
        if status.success() {
            span[m] = span[m].min(started.elapsed());
        } else {
            interrupted += 1;
        }
        if target.join("global/pg_control").exists() {
            assert_eq!(
                content_tree(&target),
                expected,
                "round {round} (seed {seed}): killed after {delay:?}, pg_control exists but the restore is incomplete"
            );
        }
        run_ok(restore_cmd(&env, &target, &["--delta"]));
        assert_eq!(
            content_tree(&target),
            expected,
            "round {round} (seed {seed}): --delta after a kill at {delay:?} equals a fresh restore"
        );
    }
    eprintln!("{interrupted} of 20 restores interrupted; learned spans {span:?}");
    assert!(
        interrupted >= 5,
        "only {interrupted} of 20 restores were interrupted: the kill points miss the restore"
    );
}

/// `--recovery-option` settings reach the restored server (one of pgstrata's own keys
/// replaced). `--type=preserve` keeps a restored standby's recovery settings and
/// standby.signal through a delta restore, and it starts as a standby again; a delta
/// restore of another type removes them.
#[test]
fn recovery_options_reach_the_server_and_preserve_keeps_a_standby_a_standby() {
    let env = small_env("recovery-options");
    let c = env.restore_and_start(
        "options",
        &[
            "--type=immediate",
            "--recovery-option=work_mem=5MB",
            "--recovery-option=recovery_target_action=promote",
        ],
    );
    assert_eq!(c.psql("postgres", "SHOW work_mem").unwrap().trim(), "5MB");
    let conf = std::fs::read_to_string(env.scratch.join("options/postgresql.auto.conf")).unwrap();
    assert_eq!(conf.matches("recovery_target_action").count(), 1, "{conf}");
    c.stop().unwrap();
    let (code, err) = run_fail(restore_cmd(
        &env,
        &env.scratch.join("bad"),
        &["--recovery-option=work mem=1"],
    ));
    assert_eq!(code, 2, "{err}");

    // A standby, then a delta restore over it that preserves its settings.
    let target = env.scratch.join("standby");
    let standby = |extra: &[&str]| {
        let mut args = vec![
            format!("--pg-path={}", target.display()),
            "--archive-mode=off".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push("restore".into());
        run_ok(env.cmd_as_invoker(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    };
    standby(&[
        "--type=standby",
        "--recovery-option=primary_conninfo=host=/nonexistent",
    ]);
    standby(&["--delta", "--type=preserve"]);
    assert!(target.join("standby.signal").exists());
    let conf = std::fs::read_to_string(target.join("postgresql.auto.conf")).unwrap();
    assert!(
        conf.contains("primary_conninfo = 'host=/nonexistent'"),
        "{conf}"
    );
    assert!(conf.contains("restore_command"), "{conf}");
    let c = pgstrata_testkit::Cluster::adopt(&env.cluster.bin, &target, &env.scratch.path);
    c.start().unwrap();
    assert_eq!(
        c.psql("postgres", "SELECT pg_is_in_recovery()")
            .unwrap()
            .trim(),
        "t"
    );
    c.stop().unwrap();
    standby(&["--delta", "--type=immediate", "--target-action=promote"]);
    assert!(!target.join("standby.signal").exists());
    assert!(target.join("recovery.signal").exists());
}
