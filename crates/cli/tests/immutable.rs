//! Immutable repositories on S3 (Object Lock), against a real S3 server (moto implements
//! Object Lock: a delete of a locked version is refused, a plain delete leaves a delete
//! marker), and reading the repository as it was (`repo-target-time`) after an attacker
//! holding its credentials deleted everything.

use crate::common::*;
use crate::object_store::{s3_toml, S3_PREFIX};
use pgstrata_repo::s3_versions::{LockMode, ObjectLock};
use pgstrata_repo::Storage;
use pgstrata_testkit::S3Server;

fn locked_toml(bucket: &str, endpoint: &str, mode: &str) -> String {
    s3_toml(bucket, endpoint)
        + &format!("repo-s3-object-lock = \"{mode}\"\nrepo-immutable-days = 1\n")
}

/// stanza-create refuses a bucket that would not lock what pgstrata writes, and says how
/// to set it up; an immutable repository refuses `verify --repair`.
#[test]
fn a_bucket_that_does_not_lock_as_configured_is_refused() {
    let server = S3Server::start("pgstrata-unlocked").expect("moto S3 server (run .ci/setup)");
    server
        .create_bucket("pgstrata-governance", Some(("GOVERNANCE", 1)))
        .unwrap();
    server
        .create_bucket("pgstrata-lock-nodefault", None)
        .unwrap();
    let env = Env::with_config(
        "lock-refused",
        &locked_toml(&server.bucket, &server.endpoint(), "compliance"),
    );

    let (code, err) = run_fail(env.cmd(&["stanza-create"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("has no Object Lock") && err.contains("put-object-lock-configuration"),
        "{err}"
    );

    // Locked, but in another mode than configured.
    let (code, err) = run_fail(env.cmd(&["--repo-s3-bucket=pgstrata-governance", "stanza-create"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("GOVERNANCE") && err.contains("compliance"),
        "{err}"
    );
    // As configured: accepted.
    env.ok(&[
        "--repo-s3-bucket=pgstrata-governance",
        "--repo-s3-object-lock=governance",
        "stanza-create",
    ]);
    let (code, err) = run_fail(env.cmd(&[
        "--repo-s3-bucket=pgstrata-governance",
        "--repo-s3-object-lock=governance",
        "verify",
        "--repair",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("immutable"), "{err}");
    env.cluster.stop().unwrap();
    let (code, err) = run_fail(env.cmd(&[
        "--repo-s3-bucket=pgstrata-governance",
        "--repo-s3-object-lock=governance",
        "--force",
        "stanza-delete",
    ]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("immutable"), "{err}");
}

/// Backups and an expire on a locked bucket; then an attacker with the repository's
/// credentials deletes every object, versions first (refused) then plainly (delete
/// markers). Nothing shows at present, and `restore --repo-target-time` restores the
/// newest backup and the WAL after it, equal to the source.
#[test]
fn an_attacker_with_the_credentials_cannot_remove_a_locked_repository() {
    let server = S3Server::start("pgstrata-scratch").expect("moto S3 server (run .ci/setup)");
    let bucket = "pgstrata-locked";
    server
        .create_bucket(bucket, Some(("COMPLIANCE", 1)))
        .unwrap();
    let toml = locked_toml(bucket, &server.endpoint(), "compliance") + "repo-retention-full = 1\n";
    let env = Env::with_config("locked", &toml);
    env.pgbench_init(1);
    env.stanza_create();
    env.ok(&["check"]);
    let first = env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "200"]);
    // Retention 1: the backup expires the first full, whose objects the lock keeps.
    let second = env.backup(&["--type=full"]);
    let info = env.info_json();
    assert_eq!(
        backup_labels(&info),
        [second.as_str()],
        "the expired full is out of view"
    );
    let mut config = server.repo_config(S3_PREFIX);
    config.s3.bucket = bucket.into();
    config.s3.object_lock = Some(ObjectLock {
        mode: LockMode::Compliance,
        days: 1,
    });
    let storage = Storage::open(&config).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let manifest = pgstrata_repo::layout::manifest(STANZA, &first);
    assert!(
        rt.block_on(storage.exists(&manifest)).unwrap(),
        "the lock keeps the expired manifest"
    );
    let out = env.ok(&["expire"]);
    assert!(out.contains("wait for their retention"), "{out}");

    env.sql("CREATE TABLE after_backup AS SELECT g FROM generate_series(1, 5000) g");
    env.flush_wal();
    let expected = env.hashes();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let before_attack = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    std::thread::sleep(std::time::Duration::from_millis(2100));

    // The attack: every version, then every object.
    let versions = storage
        .versions()
        .expect("an immutable repository lists versions");
    let all = rt.block_on(versions.list_versions("")).unwrap();
    assert!(all.len() > 20, "{}", all.len());
    for v in &all {
        let deleted = rt.block_on(versions.delete_version(&v.key, &v.version_id));
        // Delete markers (of the lock, of probes) carry no retention and may go.
        assert!(
            v.delete_marker || deleted.is_err(),
            "S3 deleted locked version {} of {}",
            v.version_id,
            v.key
        );
    }
    let current: Vec<String> = rt
        .block_on(storage.list(""))
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    rt.block_on(storage.delete_many(&current)).unwrap();
    assert!(
        rt.block_on(storage.list("")).unwrap().is_empty(),
        "every object is hidden"
    );
    let (code, _) = run_fail(env.cmd(&["info"]));
    assert_ne!(code, 0, "at present the stanza is gone");

    // As it was before the attack.
    let as_of = format!("--repo-target-time={before_attack}");
    let info: serde_json::Value =
        serde_json::from_str(&env.ok(&["--output=json", &as_of, "info"])).unwrap();
    assert_eq!(backup_labels(&info), [second.as_str()]);
    let c = env.restore_and_start("before-attack", &[&as_of]);
    assert_eq!(
        c.content_hashes().unwrap(),
        expected,
        "restored as of before the attack"
    );
    // Read-only: a command that writes is refused, naming why.
    let (code, err) = run_fail(env.cmd(&[&as_of, "backup"]));
    assert_eq!(code, 2, "{err}");

    // What was there before the attack copied into a new repository, which verifies.
    let repo2 = env.scratch.join("rescue");
    std::fs::create_dir_all(&repo2).unwrap();
    pgstrata_testkit::give_to_pg_user(&repo2);
    let with_repo2 = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("PGSTRATA_REPO2_PATH", &repo2);
        c
    };
    let as_of_1 = format!("--repo1-target-time={before_attack}");
    run_ok(with_repo2(&["--from-repo=1", &as_of_1, "--repo=2", "copy"]));
    let info: serde_json::Value =
        serde_json::from_str(&run_ok(with_repo2(&["--repo=2", "--output=json", "info"]))).unwrap();
    let info = info.as_array().map(|a| a[0].clone()).unwrap_or(info);
    assert_eq!(backup_labels(&info), [second.as_str()]);
    run_ok(with_repo2(&["--repo=2", "verify"]));
}
