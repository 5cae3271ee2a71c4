//! The whole cycle on an S3 repository served by a real S3 server over HTTP, and the
//! stanza lock keeping two backups apart.

use crate::common::*;
use pgstrata_testkit::S3Server;

#[test]
fn full_cycle_on_an_s3_repository() {
    let server = S3Server::start("pgstrata-test").expect("moto S3 server (run .ci/setup)");
    let env = Env::with_config(
        "s3",
        &format!(
            "repo-type = \"s3\"\nrepo-path = \"/backups/cluster1\"\nrepo-s3-bucket = \"{}\"\n\
             repo-s3-endpoint = \"{}\"\nrepo-s3-region = \"us-east-1\"\nrepo-s3-uri-style = \"path\"\n\
             repo-s3-key = \"test\"\nrepo-s3-key-secret = \"test\"\n",
            server.bucket,
            server.endpoint()
        ),
    );
    env.cluster
        .pgbench(&["-i", "-s", "5", "-q", "postgres"])
        .unwrap();
    env.stanza_create();
    env.ok(&["check"]); // WAL reaches the S3 archive
    let full = env.backup(&["--type=full"]);
    env.cluster
        .pgbench(&["-n", "-t", "300", "postgres"])
        .unwrap();
    env.sql("CREATE TABLE on_s3 AS SELECT g FROM generate_series(1, 10000) g");
    let incr = env.backup(&["--type=incr"]);
    env.sql("INSERT INTO on_s3 SELECT g FROM generate_series(10001, 12000) g");
    env.sql("SELECT pg_create_restore_point('s3_point')");
    let expected = env.hashes();
    env.flush_wal();

    let info = env.info_json();
    assert_eq!(info["backups"].as_array().unwrap().len(), 2);
    assert!(info["archive_max"].is_string());
    assert!(info["repo_size"].as_u64().unwrap() > 0);
    // Nothing landed in the local directory: the repository is in the bucket.
    assert!(tree(&env.repo).is_empty(), "{:?}", tree(&env.repo));

    // Restore the incremental and replay WAL from S3 to a named point.
    let c = env.restore_and_start(
        "restored",
        &["--type=name", "--target=s3_point", &format!("--set={incr}")],
    );
    assert_eq!(
        c.content_hashes().unwrap(),
        expected,
        "restore from S3 equals the source"
    );
    c.stop().unwrap();
    let dir = c.data.clone();
    drop(c);

    // Delta restore of the same backup over the used copy (ranged reads of changed frames).
    let fresh = restore_only(&env, "fresh", &[&format!("--set={incr}")]);
    let out = run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", dir.display()),
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
        "--delta",
        &format!("--set={incr}"),
        "restore",
    ]));
    assert!(out.contains("patched"), "{out}");
    assert_eq!(content_tree(&dir), content_tree(&fresh));

    // Expire the full: the incremental still restores from what remains in the bucket.
    env.ok(&[&format!("--set={full}"), "expire"]);
    let info = env.info_json();
    assert_eq!(info["backups"].as_array().unwrap().len(), 1);
    let c = env.restore_and_start(
        "after-expire",
        &["--type=immediate", &format!("--set={incr}")],
    );
    assert!(c
        .content_hashes()
        .unwrap()
        .contains_key("postgres.public.on_s3"));
}

#[test]
fn two_backups_of_one_stanza_cannot_run_at_once() {
    let env = Env::new("lock");
    env.cluster
        .pgbench(&["-i", "-s", "10", "-q", "postgres"])
        .unwrap();
    env.stanza_create();
    let spawn = || {
        env.cmd(&[
            "--type=full",
            "--compress-type=gz",
            "--process-max=1",
            "backup",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let a = spawn();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let b = spawn();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ok = [a.status.success(), b.status.success()];
    assert_eq!(
        ok.iter().filter(|s| **s).count(),
        1,
        "exactly one backup runs: {ok:?}"
    );
    let loser = if a.status.success() { &b } else { &a };
    let err = String::from_utf8_lossy(&loser.stderr);
    assert!(
        err.contains("is locked by backup") && err.contains("pid"),
        "{err}"
    );
    assert_eq!(env.info_json()["backups"].as_array().unwrap().len(), 1);
    // The lock is gone once the winner finished.
    env.backup(&["--type=incr"]);
}
