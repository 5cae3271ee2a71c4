//! Two repositories (repo-* and repo2-*): archive-push writes both, backups and restores
//! pick one, archive-get falls through them, retention is per repository.

use crate::common::*;
use pgstrata_testkit::set_mode;
use std::path::{Path, PathBuf};

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if e.file_name().to_string_lossy() == name {
            return Some(p);
        }
    }
    None
}

fn segments(dir: &Path) -> Vec<String> {
    let mut v = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            v.extend(segments(&p));
        } else {
            let n = e.file_name().to_string_lossy().to_string();
            if n.len() == 24 && n.bytes().all(|b| b.is_ascii_hexdigit()) {
                v.push(n);
            }
        }
    }
    v.sort();
    v
}

#[test]
fn two_repositories_archive_back_up_restore_and_fall_back() {
    let env = Env::with_config(
        "multirepo",
        "repo-path = \"{repo}\"\nrepo2-path = \"{repo}-two\"\nrepo2-retention-full = 1\n",
    );
    let repo2 = PathBuf::from(format!("{}-two", env.repo.display()));
    let created = env.ok(&["stanza-create"]);
    assert!(
        created.contains("created in repo1") && created.contains("created in repo2"),
        "{created}"
    );
    env.pgbench_init(1);
    env.backup(&["--type=full"]); // repository 1
    env.backup(&["--repo=2", "--type=full"]);
    env.sql("CREATE TABLE after AS SELECT generate_series(1, 5000) AS x");
    let label2 = env.backup(&["--repo=2", "--type=full"]);
    env.sql("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 7 = 0");
    let want = env.hashes();
    env.flush_wal(); // check: both repositories receive the switched segment

    // Every archived segment is in both (repository 2's retention expired its WAL from
    // before its kept backup).
    let in1 = segments(&env.repo);
    let in2 = segments(&repo2);
    assert!(!in2.is_empty());
    let in1_since: Vec<String> = in1.iter().filter(|s| **s >= in2[0]).cloned().collect();
    assert_eq!(in1_since, in2, "archive-push writes every repository");

    // Retention per repository: repo2 keeps one full, repo1 (no retention) all of its own.
    let info: serde_json::Value =
        serde_json::from_str(&env.ok(&["--output=json", "info"])).unwrap();
    let per_repo = info.as_array().expect("one report per repository");
    assert_eq!(per_repo.len(), 2, "{info}");
    let labels = |n: u64| backup_labels(per_repo.iter().find(|r| r["repo"] == n).unwrap());
    assert_eq!(labels(2), [label2.as_str()]);
    assert_eq!(labels(1).len(), 1);
    let text = env.ok(&["info"]);
    assert!(
        text.contains("repo1: ") && text.contains("repo2: "),
        "{text}"
    );
    let verify = env.ok(&["verify"]);
    assert!(verify.contains("repo2: "), "{verify}");

    // Restore from repository 2: equal, and its restore_command reads repository 2 first.
    let restored = env.restore_and_start("from-two", &["--repo=2"]);
    assert_eq!(restored.content_hashes().unwrap(), want);
    let conf = std::fs::read_to_string(restored.data.join("postgresql.auto.conf")).unwrap();
    assert!(
        conf.contains("--repo=2") && conf.contains("--repo2-path="),
        "{conf}"
    );
    restored.stop().unwrap();

    // archive-get falls through: a segment gone from repository 1 comes from repository 2.
    let seg = in1.last().unwrap().clone();
    std::fs::remove_file(find_file(&env.repo, &seg).unwrap()).unwrap();
    let got = env.scratch.join("got");
    env.ok(&["archive-get", &seg, got.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&got).unwrap().len(), 16 << 20);
    // In neither: "not found" (1).
    let in2 = find_file(&repo2, &seg).unwrap();
    let saved = std::fs::read(&in2).unwrap();
    std::fs::remove_file(&in2).unwrap();
    let out = env
        .cmd(&[
            "archive-get",
            &seg,
            env.scratch.join("none").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // Damaged in repository 2 and absent from repository 1: a failure, not "not found",
    // which would end recovery early.
    let mut damaged = saved.clone();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0xff;
    std::fs::write(&in2, &damaged).unwrap();
    let (code, err) = run_fail(env.cmd(&[
        "archive-get",
        &seg,
        env.scratch.join("bad").to_str().unwrap(),
    ]));
    assert!(code > 125, "{code}: {err}");
    assert!(err.contains("repo2"), "{err}");
    std::fs::write(&in2, &saved).unwrap();

    // Repository 2 refusing writes: archiving stalls (PostgreSQL sees failures naming repo2),
    // repository 1 still gets the segment, and both catch up once repository 2 is back.
    let dir2 = in2.parent().unwrap().to_path_buf();
    set_mode(&dir2, 0o500).unwrap();
    let before = env.sql("SELECT failed_count FROM pg_stat_archiver");
    env.sql("CREATE TABLE stalled AS SELECT 1 AS x");
    let stuck = env.sql("SELECT pg_walfile_name(pg_current_wal_lsn())");
    env.sql("SELECT pg_switch_wal()");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while env.sql("SELECT failed_count FROM pg_stat_archiver") == before {
        assert!(
            std::time::Instant::now() < deadline,
            "archiving did not fail"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        find_file(&env.repo, stuck.trim()).is_some(),
        "repository 1 has it"
    );
    assert!(find_file(&repo2, stuck.trim()).is_none());
    assert!(
        env.cluster.log_tail().contains("repo2"),
        "{}",
        env.cluster.log_tail()
    );
    set_mode(&dir2, 0o750).unwrap();
    env.flush_wal();
    assert!(
        find_file(&repo2, stuck.trim()).is_some(),
        "repository 2 caught up"
    );
}
