//! Block-level incremental and differential backups, delta restore, bundling, expire.

use crate::common::*;

/// The seed scenario in small: copies of pgbench_accounts, a full backup, 1 % of each
/// table's rows deleted as one range, VACUUM, an incremental.
#[test]
fn incremental_after_one_percent_deletes_stores_a_small_fraction() {
    let env = Env::new("seed");
    env.pgbench_init(10);
    for i in 1..=3 {
        env.sql(&format!(
            "CREATE TABLE test{i} AS SELECT * FROM pgbench_accounts"
        ));
    }
    // A settled database, as in the seed: hint bits set, visibility map written.
    env.sql("VACUUM ANALYZE");
    env.sql("CHECKPOINT");
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    for i in 1..=3 {
        let lo = i * 200_000;
        env.sql(&format!(
            "DELETE FROM test{i} WHERE aid BETWEEN {lo} AND {}",
            lo + 9_999
        ));
    }
    env.sql("VACUUM ANALYZE");
    env.sql("CHECKPOINT");
    let incr = env.backup(&["--type=incr"]);
    let info = env.info_json();
    let f = info_backup(&info, &full);
    let i = info_backup(&info, &incr);
    assert_eq!(i["type"], "incr");
    assert_eq!(i["prior"], full.as_str());
    let db = i["database_size"].as_u64().unwrap();
    let stored = i["stored_size"].as_u64().unwrap();
    // File-level incremental would store every changed file whole: the three 128 MiB tables
    // at least. Block-level stores the changed blocks only.
    assert!(
        stored * 100 < db,
        "incremental stored {stored} bytes of a {db}-byte database: more than 1 %"
    );
    assert!(
        stored * 5 < f["stored_size"].as_u64().unwrap(),
        "incremental much smaller than the full backup"
    );
    // Restoring the incremental alone gives the source.
    let expected = env.hashes();
    env.restore_set_exactly("incr", &incr, &expected);
}

/// Ten incrementals with varied changes; the tenth restores exactly, and still does after
/// the full and the first five incrementals are expired one by one.
#[test]
fn chain_of_ten_incrementals_survives_expiring_its_ancestors() {
    let env = Env::new("chain");
    env.pgbench_init(2);
    env.sql("CREATE TABLE keep (id int primary key, v text)");
    env.sql("INSERT INTO keep SELECT g, md5(g::text) FROM generate_series(1, 20000) g");
    env.stanza_create();
    let mut labels = vec![env.backup(&["--type=full"])];
    let steps = [
        "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 97 = 0",
        "CREATE TABLE t_new AS SELECT g AS id, repeat('x', 200) AS pad FROM generate_series(1, 30000) g",
        "DROP TABLE pgbench_history",
        "TRUNCATE pgbench_tellers",
        "REINDEX TABLE pgbench_accounts",
        "DELETE FROM keep WHERE id BETWEEN 5000 AND 6000",
        "CREATE INDEX keep_v ON keep (v)",
        "UPDATE t_new SET pad = repeat('y', 100) WHERE id < 500",
        "VACUUM FULL keep",
        "INSERT INTO keep SELECT g, 'late' FROM generate_series(30001, 31000) g",
    ];
    for sql in steps {
        env.sql(sql);
        env.sql("CHECKPOINT");
        labels.push(env.backup(&["--type=incr"]));
    }
    let expected = env.hashes();
    let tenth = labels.last().unwrap().clone();
    let c = env.restore_set_exactly("tenth", &tenth, &expected);
    c.stop().unwrap();
    drop(c);

    let before = env.info_json()["repo_size"].as_u64().unwrap();
    for label in &labels[..6] {
        env.ok(&[&format!("--set={label}"), "expire"]);
    }
    let info = env.info_json();
    assert_eq!(backup_labels(&info), labels[6..]);
    assert!(
        info["repo_size"].as_u64().unwrap() < before,
        "expire freed storage"
    );
    // The tenth still restores exactly after its ancestors expired.
    env.restore_set_exactly("tenth-after-expire", &tenth, &expected);
}

#[test]
fn differential_backups_restore_exactly() {
    let env = Env::new("diff");
    env.pgbench_init(2);
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "200"]);
    let incr = env.backup(&["--type=incr"]);
    env.sql("CREATE TABLE d AS SELECT g FROM generate_series(1, 10000) g");
    let diff = env.backup(&["--type=diff"]);
    let expected = env.hashes();
    let info = env.info_json();
    assert_eq!(
        info_backup(&info, &diff)["prior"],
        full.as_str(),
        "a diff compares with the newest full"
    );
    assert_eq!(info_backup(&info, &incr)["prior"], full.as_str());
    env.restore_set_exactly("diff", &diff, &expected);
}

/// A restored cluster diverges; delta restore brings it back to exactly a fresh restore.
#[test]
fn delta_restore_equals_a_fresh_restore_after_divergence() {
    let env = Env::new("delta");
    env.pgbench_init(5);
    env.sql("CREATE TABLE doomed AS SELECT g FROM generate_series(1, 5000) g");
    env.sql("CREATE TABLE shrink AS SELECT g FROM generate_series(1, 50000) g");
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "100"]);
    let label = env.backup(&["--type=incr"]);

    let fresh = restore_only(&env, "fresh", &[&format!("--set={label}")]);
    let diverged =
        env.restore_and_start("diverged", &[&format!("--set={label}"), "--type=immediate"]);
    diverged.pgbench(&["-n", "-t", "300", "postgres"]).unwrap();
    for sql in [
        "DROP TABLE doomed",
        "CREATE TABLE newcomer AS SELECT g FROM generate_series(1, 20000) g",
        "TRUNCATE shrink",
        "CHECKPOINT",
    ] {
        diverged.psql("postgres", sql).unwrap();
    }
    diverged.stop().unwrap();
    diverged.start().unwrap();
    diverged.stop().unwrap();
    let dir = diverged.data.clone();
    drop(diverged);
    assert_ne!(content_tree(&dir), content_tree(&fresh));

    let out = run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", dir.display()),
        "--process-max=2",
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
        "--delta",
        &format!("--set={label}"),
        "restore",
    ]));
    assert!(
        out.contains("patched") && out.contains("unchanged"),
        "{out}"
    );
    assert_eq!(
        content_tree(&dir),
        content_tree(&fresh),
        "delta restore equals a fresh restore, file by file"
    );
}

#[test]
fn bundling_keeps_the_object_count_small() {
    let env = Env::new("bundle");
    env.sql(
        "DO $$ BEGIN FOR i IN 1..700 LOOP EXECUTE format('CREATE TABLE small_%s (id int, v text)', i); \
         EXECUTE format('INSERT INTO small_%s VALUES (1, ''x'')', i); END LOOP; END $$",
    );
    env.sql("CHECKPOINT");
    env.stanza_create();
    let bundled = env.backup(&["--type=full"]);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let unbundled = env.backup(&["--type=full", "--bundle=false"]);
    let files = env.info_json()["backups"][0]["files"].as_u64().unwrap();
    let (b, u) = (pack_count(&env, &bundled), pack_count(&env, &unbundled));
    assert!(files > 2500, "700 tables make thousands of files ({files})");
    assert!(
        b <= 10,
        "bundled backup wrote {b} pack objects for {files} files"
    );
    assert!(
        u > 1000,
        "without bundling each file gets its own pack ({u})"
    );
    let expected = env.hashes();
    env.restore_set_exactly("bundled", &bundled, &expected);
}

#[test]
fn killed_incremental_leaves_the_repository_valid() {
    let env = Env::new("killincr");
    env.pgbench_init(20);
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.sql("UPDATE pgbench_accounts SET abalance = 1 WHERE aid % 3 = 0");
    env.sql("CHECKPOINT");
    kill_midway(
        &env,
        &[
            "--process-max=1",
            "--compress-type=bz2",
            "--type=incr",
            "--start-fast",
            "backup",
        ],
        "I/pack/",
    );
    assert_eq!(
        env.info_json()["backups"].as_array().unwrap().len(),
        1,
        "only the full backup is visible"
    );
    // The killed process left its lock: the next backup sees it is stale and proceeds.
    let label = env.backup(&["--type=incr"]);
    let expected = env.hashes();
    env.restore_set_exactly("after-kill", &label, &expected);
}

#[test]
fn retention_expires_old_backups_and_their_wal_and_keeps_the_rest_restorable() {
    let env = Env::new("retention");
    env.pgbench_init(2);
    env.stanza_create();
    let old_full = env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "100"]);
    let old_incr = env.backup(&["--type=incr"]);
    env.pgbench(&["-n", "-t", "100"]);
    env.flush_wal();
    let min_before = env.info_json()["archive_min"].as_str().unwrap().to_string();
    let new_full = env.backup(&["--type=full", "--repo-retention-full=1"]);
    let info = env.info_json();
    assert_eq!(
        backup_labels(&info),
        [new_full.as_str()],
        "{old_full} and {old_incr} expired after the new full"
    );
    assert!(
        !tree(&env.repo)
            .keys()
            .any(|k| k.contains(&format!("backup/{old_full}/pack/"))),
        "old packs freed"
    );
    let min_after = info["archive_min"].as_str().unwrap();
    assert!(
        min_after > min_before.as_str(),
        "WAL before the kept backup expired ({min_before} -> {min_after})"
    );
    assert_eq!(
        min_after,
        info_backup(&info, &new_full)["wal_start"].as_str().unwrap()
    );
    let (code, err) = run_fail(env.cmd(&["expire"]));
    assert_eq!(code, 2, "{err}");
    let expected = env.hashes();
    let c = env.restore_and_start("kept", &["--type=immediate"]);
    assert_eq!(c.content_hashes().unwrap(), expected);
}
