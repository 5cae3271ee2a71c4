//! archive-push and archive-get as PostgreSQL calls them.

use crate::common::*;

#[test]
fn archive_push_is_idempotent_refuses_conflicts_and_get_reports_not_found() {
    let env = Env::new("archive");
    env.stanza_create();
    env.flush_wal(); // at least one segment archived by the server itself
    let info = env.info_json();
    let first = info["archive_min"]
        .as_str()
        .expect("archive has WAL")
        .to_string();

    // Fetch it back: byte-identical to what the server wrote (pg_wal may have recycled it,
    // so compare with a second fetch after a re-push instead of with pg_wal).
    let got = env.scratch.join("got");
    run_ok(env.cmd(&["archive-get", &first, got.to_str().unwrap()]));
    let original = std::fs::read(&got).unwrap();
    assert_eq!(original.len(), 16 << 20);

    // Pushing the same content again succeeds (PostgreSQL may retry after a crash).
    let again = env.scratch.join(&first);
    std::fs::write(&again, &original).unwrap();
    pgstrata_testkit::give_to_pg_user(&again);
    run_ok(env.cmd(&["archive-push", again.to_str().unwrap()]));

    // The block-change map is inside the segment's object. Writers before that stored it
    // as a `.map` object after the segment; one that crashed in between left the segment
    // alone (a version-1 object), and pushing the segment again writes its `.map`.
    let map_of_first =
        |maps: Vec<(String, Vec<u8>)>| maps.into_iter().find(|(k, _)| k.ends_with(&first));
    let (key, inside) = map_of_first(archived_maps(&env.repo)).expect("a map inside the segment");
    rewrite_map(&env.repo, &key, None);
    assert!(map_of_first(archived_maps(&env.repo)).is_none());
    run_ok(env.cmd(&["archive-push", again.to_str().unwrap()]));
    assert!(
        env.repo.join(format!("{key}.map")).exists(),
        "the map written beside"
    );
    let (_, beside) = map_of_first(archived_maps(&env.repo)).unwrap();
    let decode = |bytes: &[u8]| pgstrata_repo::changemap::ChangeMap::decode(bytes, &key).unwrap();
    let (inside, beside) = (decode(&inside), decode(&beside));
    assert!(beside.usable && beside.segment == first, "{beside:?}");
    assert_eq!(beside.records, inside.records);

    // Different content under the same name fails and keeps the stored copy.
    let mut changed = original.clone();
    changed[10_000] ^= 0xFF;
    std::fs::write(&again, &changed).unwrap();
    let (code, err) = run_fail(env.cmd(&["archive-push", again.to_str().unwrap()]));
    assert_ne!(code, 0);
    assert!(
        err.contains(&first) && err.contains("different content"),
        "{err}"
    );
    let got2 = env.scratch.join("got2");
    run_ok(env.cmd(&["archive-get", &first, got2.to_str().unwrap()]));
    assert_eq!(std::fs::read(&got2).unwrap(), original, "stored copy kept");

    // A segment that is not archived: exit 1, quietly, and nothing written.
    let missing = env.scratch.join("missing");
    let out = env
        .cmd(&[
            "archive-get",
            "0000000100000000000000FE",
            missing.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.is_empty(),
        "not found is quiet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!missing.exists());
    // History files of timelines that never existed are "not found" too.
    let out = env
        .cmd(&["archive-get", "00000002.history", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    // A segment from another cluster is refused.
    let other = Env::new("archive-other");
    other.flush_wal_without_stanza();
    let foreign = other.cluster.data.join("pg_wal");
    let seg = std::fs::read_dir(&foreign)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().len() == 24)
        .expect("a WAL segment in the other cluster");
    let (_, err) = run_fail(env.cmd(&["archive-push", seg.to_str().unwrap()]));
    assert!(err.contains("cluster"), "{err}");
}

trait NoStanza {
    fn flush_wal_without_stanza(&self);
}
impl NoStanza for Env {
    fn flush_wal_without_stanza(&self) {
        self.sql("SELECT pg_switch_wal()");
    }
}

/// archive-get run from `cwd` (the data directory, as PostgreSQL runs restore_command).
fn archive_get_in(
    env: &Env,
    cwd: &std::path::Path,
    name: &str,
    extra_env: &[(&str, &str)],
) -> (i32, String) {
    let dest = cwd.join("RECOVERYXLOG");
    let mut c = env.cmd(&["archive-get", name, dest.to_str().unwrap()]);
    c.current_dir(cwd);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    run_fail(c)
}

/// A working directory the PostgreSQL user may enter; `standby` puts standby.signal in it.
fn cwd(env: &Env, name: &str, standby: bool) -> std::path::PathBuf {
    let dir = env.scratch.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    if standby {
        std::fs::write(dir.join("standby.signal"), b"").unwrap();
    }
    pgstrata_testkit::give_to_pg_user(&dir);
    dir
}

/// Any archive-get failure other than "not in the archive" must stop a recovering server
/// (exit above 125) instead of ending recovery early; a standby gets a code it retries on.
/// Proven on a real recovery: a damaged segment after the backup stops the server, which
/// does not promote.
#[test]
fn archive_get_failures_stop_recovery_and_standbys_retry() {
    let env = Env::new("archive-get-fail");
    env.stanza_create();
    env.backup(&["--type=full"]);
    let before = env.info_json()["archive_max"].as_str().unwrap().to_string();
    env.sql("CREATE TABLE after_backup AS SELECT generate_series(1, 1000) AS i");
    env.flush_wal();
    let damaged = env.info_json()["archive_max"].as_str().unwrap().to_string();
    assert!(damaged > before, "a segment archived after the backup");
    let object = tree(&env.repo)
        .into_keys()
        .find(|k| k.ends_with(&format!("/{damaged}")))
        .map(|k| env.repo.join(k))
        .expect("the archived segment's object");
    let mut bytes = std::fs::read(&object).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&object, &bytes).unwrap();

    let primary = cwd(&env, "cwd-primary", false);
    let standby = cwd(&env, "cwd-standby", true);
    // Damaged WAL: 128 + 4 outside standby mode, 4 in it.
    let (code, err) = archive_get_in(&env, &primary, &damaged, &[]);
    assert_eq!(code, 132, "{err}");
    assert!(err.contains(&damaged), "{err}");
    // The hash is checked while the file is written: nothing is left where PostgreSQL looks,
    // and no temporary file stays behind.
    let left: Vec<_> = std::fs::read_dir(&primary)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "a damaged segment left {left:?}");
    assert_eq!(archive_get_in(&env, &standby, &damaged, &[]).0, 4);
    // An unreachable repository: 128 + 3, and 3 for a standby.
    let unreachable = format!("http://127.0.0.1:{}", pgstrata_testkit::free_port());
    let s3 = [
        ("PGSTRATA_REPO_TYPE", "s3"),
        ("PGSTRATA_REPO_S3_BUCKET", "nowhere"),
        ("PGSTRATA_REPO_S3_REGION", "us-east-1"),
        ("PGSTRATA_REPO_S3_ENDPOINT", unreachable.as_str()),
        ("PGSTRATA_REPO_S3_URI_STYLE", "path"),
        ("PGSTRATA_REPO_S3_KEY", "test"),
        ("PGSTRATA_REPO_S3_KEY_SECRET", "test"),
        ("PGSTRATA_REPO_STORAGE_RETRIES", "0"),
        ("PGSTRATA_REPO_STORAGE_TIMEOUT", "2"),
    ];
    let (code, err) = archive_get_in(&env, &primary, &damaged, &s3);
    assert_eq!(code, 131, "{err}");
    assert_eq!(archive_get_in(&env, &standby, &damaged, &s3).0, 3);
    // Bad configuration stops recovery too.
    let (code, err) = archive_get_in(&env, &primary, &damaged, &[("PGSTRATA_REPO_TYPE", "ftp")]);
    assert_eq!(code, 130, "{err}");
    // "Not in the archive" stays 1 in both modes.
    assert_eq!(
        archive_get_in(&env, &primary, "0000000100000000000000FE", &[]).0,
        1
    );
    assert_eq!(
        archive_get_in(&env, &standby, "0000000100000000000000FE", &[]).0,
        1
    );

    // A real recovery that needs the damaged segment stops, and does not promote.
    let target = env.scratch.join("stops");
    run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", target.display()),
        "--archive-mode=off",
        "--target-action=promote",
        "restore",
    ]));
    let restored = pgstrata_testkit::Cluster::adopt(&env.cluster.bin, &target, &env.scratch.path);
    let _ = restored.start(); // may return once it accepts read-only connections
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while restored.is_running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server kept running on a damaged segment:\n{}",
            restored.log_tail()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let log = std::fs::read_to_string(&restored.log_file).unwrap();
    assert!(
        log.contains(&damaged) && log.contains("could not restore file"),
        "{log}"
    );
    assert!(
        !log.contains("archive recovery complete") && !log.contains("selected new timeline"),
        "the server promoted past a damaged segment:\n{log}"
    );
}
