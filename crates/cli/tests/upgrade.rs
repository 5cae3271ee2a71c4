//! A major upgrade with pg_upgrade, as a DBA does it: PostgreSQL 15 backed up, upgraded
//! to 18, `stanza-upgrade`, backed up again; both sides' backups restore (each with its
//! own major's binaries and its own cluster's WAL), verify and copy see both archives, and
//! retention expires the old cluster's backups and archive together.

use crate::common::*;
use pgstrata_testkit::{give_to_pg_user, Cluster, PgBin};
use std::process::Command;
use std::time::Duration;

/// pgstrata against `cluster` instead of the environment's own (the upgraded one).
fn on(env: &Env, cluster: &Cluster, args: &[&str]) -> Command {
    let mut c = env.cmd(args);
    c.env("PGSTRATA_PG_PATH", &cluster.data)
        .env("PGSTRATA_PG_HOST", &cluster.socket_dir)
        .env("PGSTRATA_PG_PORT", cluster.port.to_string());
    c
}

/// Stop `old` and upgrade it with `new_bin`'s pg_upgrade into a new cluster, which
/// archives into the same stanza (archiving is off during pg_upgrade, as the upgrade
/// guides say, and on from its first start). Returns the new cluster, stopped.
fn pg_upgrade(env: &Env, new_bin: &PgBin) -> Cluster {
    let old = &env.cluster;
    // Debian's PostgreSQL 15 build (15.20-0+deb12u1) stores an option of its own,
    // pg_attver, in every column's attoptions; pg_dump carries it into the new cluster,
    // whose upstream build refuses it ("unrecognized parameter"). Cleared on user tables
    // first, or pg_upgrade fails before pgstrata has a part in it.
    for db in old.databases().unwrap() {
        old.psql(
            &db,
            "UPDATE pg_attribute SET attoptions = NULL \
             WHERE attrelid >= 16384 AND attoptions::text LIKE '%pg_attver%'",
        )
        .unwrap();
    }
    old.stop().unwrap();
    let dir = env.scratch.join("pg18");
    std::fs::create_dir_all(&dir).unwrap();
    give_to_pg_user(&dir);
    let archive_command = format!(
        "{} --stanza={STANZA} --repo-path={} archive-push %p",
        exe().display(),
        env.repo.display()
    );
    let new = Cluster::init(new_bin, &dir, &archive_command).expect("initdb 18");
    let conf = new.data.join("postgresql.conf");
    let with_archiving = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{with_archiving}\narchive_mode = off\n")).unwrap();
    let mut upgrade = new_bin.cmd("pg_upgrade");
    upgrade
        .current_dir(&dir)
        .arg("-b")
        .arg(&old.bin.dir)
        .arg("-B")
        .arg(&new_bin.dir)
        .arg("-d")
        .arg(&old.data)
        .arg("-D")
        .arg(&new.data)
        .args(["-U", "postgres", "-p"])
        .arg(pgstrata_testkit::free_port().to_string())
        .arg("-P")
        .arg(pgstrata_testkit::free_port().to_string())
        .arg("--socketdir")
        .arg(&dir);
    let out = upgrade.output().expect("run pg_upgrade");
    assert!(
        out.status.success(),
        "pg_upgrade failed:\n{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        upgrade_logs(&new.data)
    );
    std::fs::write(&conf, with_archiving).unwrap();
    new
}

/// The tails of pg_upgrade's logs (kept in the new data directory), for a failure's message.
fn upgrade_logs(data: &std::path::Path) -> String {
    let mut out = String::new();
    let mut dirs = vec![data.join("pg_upgrade_output.d")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if let Ok(text) = std::fs::read_to_string(&p) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                out.push_str(&format!("--- {}\n{tail}\n", p.display()));
            }
        }
    }
    out
}

/// Restore `label` to restore point `point` into scratch/`name` and start it with `bin`.
fn restore_to(env: &Env, bin: &PgBin, name: &str, label: &str, point: &str) -> Cluster {
    let target = env.scratch.join(name);
    run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", target.display()),
        "--process-max=2",
        "--archive-mode=off",
        "--type=name",
        &format!("--target={point}"),
        "--target-action=promote",
        &format!("--set={label}"),
        "restore",
    ]));
    let c = Cluster::adopt(bin, &target, &env.scratch.path);
    c.start().expect("start restored cluster");
    c.wait_for_promotion(Duration::from_secs(180))
        .expect("restored cluster recovers");
    c
}

#[test]
fn a_stanza_upgraded_after_pg_upgrade_restores_both_majors() {
    let bin18 = PgBin::with_pg_upgrade(18)
        .unwrap_or_else(|e| panic!("PostgreSQL 18 with pg_upgrade (run .ci/setup): {e}"));
    let env = Env::new("upgrade");
    env.pgbench_init(2);
    env.stanza_create();
    let full15 = env.backup(&["--type=full"]);
    env.sql("DELETE FROM pgbench_accounts WHERE aid % 5 = 0");
    let incr15 = env.backup(&["--type=incr"]);
    env.sql("CREATE TABLE before_upgrade AS SELECT g FROM generate_series(1, 1000) g");
    env.sql("SELECT pg_create_restore_point('on15')");
    let expected15 = env.hashes();
    env.flush_wal();

    let new = pg_upgrade(&env, &bin18);
    // Before stanza-upgrade the new cluster is refused, saying what to do.
    let (code, err) = run_fail(on(&env, &new, &["stanza-create"]));
    assert_eq!(code, 3, "{err}");
    new.start().unwrap();
    let (code, err) = run_fail(on(&env, &new, &["--start-fast", "backup"]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("run stanza-upgrade"), "{err}");

    let said = run_ok(on(&env, &new, &["stanza-upgrade"]));
    assert!(said.contains("upgraded"), "{said}");
    let again = run_ok(on(&env, &new, &["stanza-upgrade"]));
    assert!(again.contains("already belongs"), "{again}");
    // The old cluster's pg_control is no longer the stanza's.
    let (code, err) = run_fail(env.cmd(&["stanza-upgrade"]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("belonged to before"), "{err}");

    run_ok(on(&env, &new, &["check"]));
    // Asked for an incremental, the first backup of the new cluster is full.
    let full18 = run_ok(on(&env, &new, &["--start-fast", "--type=incr", "backup"]));
    let full18 = full18.trim();
    new.psql(
        "postgres",
        "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 3 = 0",
    )
    .unwrap();
    let incr18 = run_ok(on(&env, &new, &["--start-fast", "--type=incr", "backup"]));
    let incr18 = incr18.trim();
    new.psql("postgres", "CREATE TABLE after_upgrade AS SELECT 1 AS one")
        .unwrap();
    new.psql("postgres", "SELECT pg_create_restore_point('on18')")
        .unwrap();
    let expected18 = new.content_hashes().unwrap();
    run_ok(on(&env, &new, &["check"]));

    let info: serde_json::Value =
        serde_json::from_str(&run_ok(on(&env, &new, &["--output=json", "info"]))).unwrap();
    assert_eq!(info["pg_version"], 18);
    assert_eq!(info["prior_clusters"][0]["pg_version"], 15, "{info}");
    assert!(
        info["prior_clusters"][0]["archive_max"].is_string(),
        "{info}"
    );
    assert!(
        info["archive_gaps"].is_null(),
        "no false gap across clusters: {info}"
    );
    let backups = info["backups"].as_array().unwrap();
    let kind = |i: usize| {
        (
            backups[i]["type"].as_str().unwrap(),
            backups[i]["pg_version"].as_u64().unwrap(),
        )
    };
    assert_eq!(
        [kind(0), kind(1), kind(2), kind(3)],
        [("full", 15), ("incr", 15), ("full", 18), ("incr", 18)]
    );
    assert_eq!(
        backup_labels(&info),
        [full15.as_str(), incr15.as_str(), full18, incr18]
    );
    let text = run_ok(on(&env, &new, &["info"]));
    assert!(
        text.contains("before stanza-upgrade: PostgreSQL 15"),
        "{text}"
    );
    let verify = run_ok(on(&env, &new, &["verify"]));
    assert!(verify.contains("ok"), "{verify}");

    // Both sides restore, each with its own major and its own cluster's WAL (whose names
    // overlap: each cluster's WAL starts over).
    let old_bin = env.cluster.bin.clone();
    let on15 = restore_to(&env, &old_bin, "restored15", &incr15, "on15");
    assert_eq!(on15.content_hashes().unwrap(), expected15);
    on15.stop().unwrap();
    let on18 = restore_to(&env, &bin18, "restored18", incr18, "on18");
    assert_eq!(on18.content_hashes().unwrap(), expected18);
    let version = on18.psql("postgres", "SHOW server_version_num").unwrap();
    assert!(version.starts_with("18"), "{version}");
    on18.stop().unwrap();

    // A copy takes the upgrade record and both archives.
    let repo2 = env.scratch.join("repo2");
    std::fs::create_dir_all(&repo2).unwrap();
    give_to_pg_user(&repo2);
    let copy = |args: &[&str]| {
        let mut c = on(&env, &new, args);
        c.env("PGSTRATA_REPO2_PATH", &repo2);
        c
    };
    run_ok(copy(&["--from-repo=1", "--repo=2", "copy"]));
    let copied: serde_json::Value =
        serde_json::from_str(&run_ok(copy(&["--repo=2", "--output=json", "info"]))).unwrap();
    assert_eq!(copied["pg_version"], 18);
    assert_eq!(copied["prior_clusters"], info["prior_clusters"]);
    assert_eq!(copied["archive_max"], info["archive_max"]);
    run_ok(copy(&["--repo=2", "verify"]));

    // Retention: the newest full is the new cluster's; the old cluster's backups and its
    // whole archive go together, the new cluster's stay and restore.
    let expired = run_ok(on(&env, &new, &["--repo-retention-full=1", "expire"]));
    assert!(expired.contains(&full15), "{expired}");
    let info: serde_json::Value =
        serde_json::from_str(&run_ok(on(&env, &new, &["--output=json", "info"]))).unwrap();
    assert_eq!(backup_labels(&info), [full18, incr18]);
    assert!(info["prior_clusters"][0]["archive_max"].is_null(), "{info}");
    run_ok(on(&env, &new, &["verify"]));
    new.stop().unwrap();
}
