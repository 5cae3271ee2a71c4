//! The whole cycle on an S3 repository served by a real S3 server over HTTP, the stanza
//! lock keeping two backups apart, and the network failing under it: answers lost after
//! the server acted, storage refusing during a restore, a damaged pack.

use crate::common::*;
use pgstrata_repo::Storage;
use pgstrata_testkit::{Proxy, S3Server};

pub(crate) const S3_PREFIX: &str = "/backups/cluster1";

/// Repository settings (config file body) for `bucket` reached at `endpoint`.
pub(crate) fn s3_toml(bucket: &str, endpoint: &str) -> String {
    format!(
        "repo-type = \"s3\"\nrepo-path = \"{S3_PREFIX}\"\nrepo-s3-bucket = \"{bucket}\"\n\
         repo-s3-endpoint = \"{endpoint}\"\nrepo-s3-region = \"us-east-1\"\nrepo-s3-uri-style = \"path\"\n\
         repo-s3-key = \"test\"\nrepo-s3-key-secret = \"test\"\n"
    )
}

/// The same repository, reached directly by the test (not through a proxy).
pub(crate) fn s3_storage(server: &S3Server) -> Storage {
    Storage::open(&server.repo_config(S3_PREFIX)).unwrap()
}

#[test]
fn full_cycle_on_an_s3_repository() {
    let server = S3Server::start("pgstrata-test").expect("moto S3 server (run .ci/setup)");
    let env = Env::with_config("s3", &s3_toml(&server.bucket, &server.endpoint()));
    env.pgbench_init(5);
    env.stanza_create();
    env.ok(&["check"]); // WAL reaches the S3 archive
    let full = env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "300"]);
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
    env.pgbench_init(10);
    env.stanza_create();
    let spawn = || {
        env.cmd(&[
            "--type=full",
            "--start-fast",
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

/// The connection drops after S3 stored a create-only write but before its answer arrived
/// (object_store's client then sends it again and is refused): on the stanza lock, a pack,
/// a manifest and a WAL segment, the command succeeds, leaves no lock behind, and info
/// lists what was written. Then storage refuses pack reads during a restore (exit 3, named
/// as a storage failure, not as damage) and a pack with a flipped byte is damage (exit 4).
#[test]
fn lost_answers_storage_outages_and_damage_on_s3() {
    let server = S3Server::start("pgstrata-faults").expect("moto S3 server (run .ci/setup)");
    let proxy = Proxy::http(server.port);
    let env = Env::with_config("s3-faults", &s3_toml(&server.bucket, &proxy.endpoint()));
    env.pgbench_init(1);
    env.stanza_create();
    let storage = s3_storage(&server);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lock_key = format!("{STANZA}/lock/backup.lock");

    // WAL: `check` switches away from the current segment and waits for it in the archive.
    // (Pushes before stanza-create failed: count from here.)
    let failed = || env.sql("SELECT failed_count FROM pg_stat_archiver");
    env.ok(&["check"]);
    let failed_before = failed();
    env.sql("CREATE TABLE wal_written AS SELECT 1 AS x"); // so the switch has a segment to end
    let segment = env.sql("SELECT pg_walfile_name(pg_current_wal_lsn())");
    proxy.drop_answer_to("PUT", &format!("/{} HTTP", segment.trim()));
    env.ok(&["check"]);
    assert_eq!(failed(), failed_before, "archive-push succeeded at once");
    assert_eq!(proxy.dropped().len(), 1, "the segment's answer was lost");
    let mut labels = Vec::new();
    for (dropped, (what, needle, kind)) in (1..).zip([
        ("lock", "/lock/backup.lock", "--type=full"),
        ("pack", "/pack/", "--type=full"),
        ("manifest", "/backup.manifest", "--type=incr"),
    ]) {
        env.sql(
            "INSERT INTO pgbench_history SELECT 1, 1, 1, 1, now() FROM generate_series(1, 1000)",
        );
        proxy.drop_answer_to("PUT", needle);
        labels.push(env.backup(&[kind]));
        assert_eq!(
            proxy.dropped().len(),
            dropped + 1,
            "{what}: {:?}",
            proxy.dropped()
        );
        assert!(
            !rt.block_on(storage.exists(&lock_key)).unwrap(),
            "{what}: no lock left behind"
        );
    }
    assert_eq!(
        backup_labels(&env.info_json()),
        labels,
        "info lists each backup once"
    );

    // Storage refuses every pack read after the manifest was read: a storage failure.
    proxy.refuse(Some("/pack/"));
    let outage = env.scratch.join("outage");
    let (code, err) = run_fail(env.cmd_as_invoker(&[
        &format!("--pg-path={}", outage.display()),
        &format!("--set={}", labels[0]),
        "restore",
    ]));
    assert!(proxy.refused() > 0);
    proxy.refuse(None);
    assert_eq!(code, 3, "a storage outage is no damage: {err}");
    assert!(err.contains("storage") && err.contains("/pack/"), "{err}");

    // One flipped byte in a pack: damage.
    let pack = rt
        .block_on(storage.list(&format!("{STANZA}/backup/{}/pack", labels[0])))
        .unwrap()
        .remove(0)
        .key;
    let mut bytes = rt.block_on(storage.get(&pack)).unwrap().to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    rt.block_on(storage.delete(&pack)).unwrap();
    rt.block_on(storage.put_new(&pack, bytes.into())).unwrap();
    let damaged = env.scratch.join("damaged");
    let (code, err) = run_fail(env.cmd_as_invoker(&[
        &format!("--pg-path={}", damaged.display()),
        &format!("--set={}", labels[0]),
        "restore",
    ]));
    assert_eq!(code, 4, "a damaged pack is damage: {err}");
    assert!(err.contains("damaged"), "{err}");
}
