//! `copy`: backups and their WAL copied from repository 1 to repository 2 restore from
//! repository 2 alone; a second copy moves nothing; a copy killed anywhere leaves no
//! backup half there and a rerun completes it; a damaged source object stops the copy
//! (exit 4) before the backup's manifest; each repository keeps its own retention; an
//! encrypted stanza copies to an S3 repository that then gets a passphrase of its own.

use crate::common::*;
use pgstrata_testkit::S3Server;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Repository 2, a local directory beside repository 1.
fn repo2(env: &Env) -> PathBuf {
    env.scratch.join("repo-two")
}

/// pgstrata with repository 2 given in the environment only: archive_command (which reads
/// the config file) does not know it, so only copy brings it WAL.
fn with_repo2(env: &Env, args: &[&str]) -> std::process::Command {
    with_repo2_sealed(env, args, None)
}

/// [`with_repo2`], repository 2 encrypted with `pass` when given.
fn with_repo2_sealed(env: &Env, args: &[&str], pass: Option<&str>) -> std::process::Command {
    let dir = repo2(env);
    if !dir.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        pgstrata_testkit::give_to_pg_user(&dir);
    }
    let mut c = env.cmd(args);
    c.env("PGSTRATA_REPO2_PATH", &dir);
    if let Some(pass) = pass {
        c.env("PGSTRATA_REPO2_CIPHER_TYPE", "aes-256-gcm");
        c.env("PGSTRATA_REPO2_CIPHER_PASS", pass);
    }
    c
}

/// `copy --repo=2 --output=json` (plus `extra`), its report.
fn copy_json(c: std::process::Command) -> serde_json::Value {
    let out = run_ok(c);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn copy_args(extra: &[&str]) -> Vec<String> {
    let mut a = vec!["--repo=2".to_string(), "--output=json".to_string()];
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push("copy".into());
    a
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// From now on repository 2 is in the config file too (archive-push writes it as well).
fn add_to_config(env: &Env, body: &str) {
    let cfg = env.config.as_ref().unwrap();
    let text = std::fs::read_to_string(cfg).unwrap();
    std::fs::write(cfg, format!("{text}{body}\n")).unwrap();
}

fn labels_in(env: &Env, repo: u8) -> Vec<String> {
    let info: serde_json::Value =
        serde_json::from_str(&env.ok(&["--output=json", &format!("--repo={repo}"), "info"]))
            .unwrap();
    let info = info.as_array().map(|a| a[0].clone()).unwrap_or(info);
    backup_labels(&info)
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// (a) and (e): a full and an incremental copied to a second local repository restore
/// from it equal to the source; a second copy moves nothing; the full expired in
/// repository 1 still restores from repository 2.
#[test]
fn copied_backups_restore_from_the_second_repository_which_keeps_its_own_retention() {
    let env = Env::with_config("copy-posix", "repo-path = \"{repo}\"\n");
    env.stanza_create();
    env.pgbench_init(1);
    let full = env.backup(&["--type=full"]);
    let at_full = env.hashes();
    env.pgbench(&["-n", "-t", "200"]);
    env.sql("CREATE TABLE after_full AS SELECT generate_series(1, 20000) AS x");
    let incr = env.backup(&["--type=incr"]);
    let at_incr = env.hashes();
    env.flush_wal();

    // Repository 2 has no stanza yet: copy creates it, copies both backups and the WAL.
    let r = copy_json(with_repo2(&env, &strs(&copy_args(&[]))));
    assert_eq!(r["stanza_created"], true, "{r}");
    assert_eq!(r["backups_copied"], serde_json::json!([full, incr]), "{r}");
    assert!(r["objects_copied"].as_u64().unwrap() > 10, "{r}");
    assert!(r["bytes_copied"].as_u64().unwrap() > 1 << 20, "{r}");
    assert!(r["wal_copied"].as_u64().unwrap() >= 2, "{r}");
    // Text output names what was copied.
    let text = run_ok(with_repo2(&env, &["--repo=2", "copy"]));
    assert!(text.contains("0 backup(s) copied"), "{text}");

    // Repository 2 in the config file: archive-push writes it too from now on.
    add_to_config(&env, &format!("repo2-path = \"{}\"", repo2(&env).display()));
    let again = copy_json(env.cmd(&strs(&copy_args(&[]))));
    assert_eq!(again["objects_copied"], 0, "{again}");
    assert_eq!(again["backups_copied"], serde_json::json!([]), "{again}");
    assert!(again["objects_skipped"].as_u64().unwrap() > 0, "{again}");
    assert_eq!(labels_in(&env, 2), [full.as_str(), incr.as_str()]);
    env.ok(&["--repo=2", "verify"]);

    let c = env.restore_and_start(
        "incr-from-two",
        &["--repo=2", "--type=immediate", &format!("--set={incr}")],
    );
    assert_eq!(
        c.content_hashes().unwrap(),
        at_incr,
        "incr restored from repo2"
    );
    c.stop().unwrap();

    // (e) Retention per repository: the full expired in repository 1 is gone there and
    // still restores from repository 2; copy does not bring it back nor take it away.
    // First a dry run (JSON): it names the backup and its rule, and removes nothing.
    let set = format!("--set={full}");
    let out = env.ok(&["--repo=1", &set, "--dry-run", "--output=json", "expire"]);
    let would: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(would["dry_run"], true, "{would}");
    assert_eq!(would["expired"], serde_json::json!([full]), "{would}");
    assert_eq!(would["reasons"][&full], "named by --set", "{would}");
    assert_eq!(labels_in(&env, 1), [full.as_str(), incr.as_str()]);
    env.ok(&["--repo=1", &set, "expire"]);
    assert_eq!(labels_in(&env, 1), [incr.as_str()]);
    let r = copy_json(env.cmd(&strs(&copy_args(&[]))));
    assert_eq!(r["backups_copied"], serde_json::json!([]), "{r}");
    assert_eq!(labels_in(&env, 2), [full.as_str(), incr.as_str()]);
    let c = env.restore_and_start(
        "full-from-two",
        &["--repo=2", "--type=immediate", &format!("--set={full}")],
    );
    assert_eq!(
        c.content_hashes().unwrap(),
        at_full,
        "expired in repo1, restored from repo2"
    );
    c.stop().unwrap();
}

/// SIGKILL the copy started by `c` `delay` after it started; waits until it is gone. As
/// root the child is runuser: pgstrata itself is found by its command line, which starts
/// with its path and the unique `marker`. False when it finished first.
fn kill_after(
    mut c: std::process::Command,
    marker: &str,
    delay: Duration,
    ready: impl Fn() -> bool,
) -> bool {
    let mut child = c.spawn().unwrap();
    let pattern = format!("^{} {marker}", exe().display());
    let pids = || -> Vec<String> {
        let out = std::process::Command::new("pgrep")
            .args(["-f", &pattern])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    // Started (or already done) before the delay counts.
    while pids().is_empty() && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(2));
    }
    // Killed after `delay`, or as soon as `ready` says so.
    let started = std::time::Instant::now();
    while started.elapsed() < delay && !ready() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let killed = pids();
    for pid in &killed {
        let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let status = child.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while killed.iter().any(|p| Path::new("/proc").join(p).exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{killed:?} not reaped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !killed.is_empty() || status.success(),
        "the copy failed on its own: {status}"
    );
    !killed.is_empty()
}

/// (c) A copy killed at random points never shows a partial backup in repository 2, and a
/// rerun completes it: the result restores equal to the source.
#[test]
fn a_copy_killed_anywhere_leaves_no_partial_backup_and_resumes() {
    kill_and_resume("copy-kill", None);
}

/// (c) The same when repository 2 is encrypted and repository 1 is not, so that every
/// frame is sealed again: a rerun after a kill writes new packs and finishes.
#[test]
fn a_resealing_copy_killed_anywhere_resumes() {
    kill_and_resume("copy-kill-sealed", Some("passphrase of repository two"));
}

fn kill_and_resume(name: &str, pass: Option<&str>) {
    let env = Env::with_config(name, "repo-path = \"{repo}\"\nbundle-size = \"1MiB\"\n");
    let r2 = |args: &[&str]| with_repo2_sealed(&env, args, pass);
    env.stanza_create();
    if pass.is_some() {
        run_ok(r2(&["--repo=2", "stanza-create"]));
    }
    env.pgbench_init(2);
    let full = env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "200"]);
    let incr = env.backup(&["--type=incr"]);
    let at_incr = env.hashes();
    env.flush_wal();
    let seed: u64 = test_seed();
    // How long a whole copy takes, to a third repository thrown away after.
    let repo3 = env.scratch.join("repo-three");
    std::fs::create_dir_all(&repo3).unwrap();
    pgstrata_testkit::give_to_pg_user(&repo3);
    let repo_3 = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("PGSTRATA_REPO3_PATH", &repo3);
        if let Some(pass) = pass {
            c.env("PGSTRATA_REPO3_CIPHER_TYPE", "aes-256-gcm");
            c.env("PGSTRATA_REPO3_CIPHER_PASS", pass);
        }
        c
    };
    if pass.is_some() {
        run_ok(repo_3(&["--repo=3", "stanza-create"]));
    }
    let started = std::time::Instant::now();
    run_ok(repo_3(&["--repo=3", "copy"]));
    let whole = started.elapsed();
    eprintln!("seed {seed} (PGSTRATA_TEST_SEED), a whole copy takes {whole:?}");
    let mut rng = seed;
    let (mut kills, mut partial_seen) = (0, 0);
    // Kill at random points until a run gets to finish on its own.
    for round in 0..12 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let fraction = ((rng >> 33) % 1000) as f64 / 1000.0;
        let delay = whole.mul_f64(fraction * 0.5);
        // Unique to this test's copies (tests run side by side).
        let marker = format!("--lock-path={}", env.scratch.join("copy-locks").display());
        // The first time as soon as a pack is there: a copy stopped mid-way for sure.
        let pack_there = || round == 0 && tree(&repo2(&env)).keys().any(|k| k.contains("/pack/"));
        let copy = r2(&[&marker, "--repo=2", "copy"]);
        let killed = kill_after(copy, &marker, delay, pack_there);
        kills += killed as u32;
        // Whatever repository 2 shows is whole: a listed backup is one of the source's and
        // verifies (its packs, parts and the WAL it needs are all there).
        let objects = tree(&repo2(&env));
        let packs = objects.keys().filter(|k| k.contains("/pack/")).count();
        if !objects
            .keys()
            .any(|k| k.ends_with(&format!("{incr}/backup.manifest")))
            && packs > 0
        {
            partial_seen += 1;
        }
        if objects.contains_key(&format!("{STANZA}/stanza.json")) {
            let listed = {
                let out = run_ok(r2(&["--output=json", "--repo=2", "info"]));
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                backup_labels(&v)
                    .into_iter()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            };
            for l in &listed {
                assert!(
                    [&full, &incr].contains(&l),
                    "{l} in repo2 after kill {round}"
                );
                let out = r2(&["--repo=2", "--output=json", "verify"])
                    .output()
                    .unwrap();
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let v = v.as_array().map(|a| a[0].clone()).unwrap_or(v);
                for b in v["backups"].as_array().unwrap() {
                    assert_eq!(b["ok"], true, "after kill {round}: {b}");
                }
                if !v["wal"]["gaps"].as_array().unwrap().is_empty() {
                    let wal: Vec<String> = tree(&repo2(&env))
                        .into_keys()
                        .filter(|k| k.contains("/archive/"))
                        .collect();
                    eprintln!("after kill {round}: gaps {} in {wal:?}", v["wal"]["gaps"]);
                }
            }
        }
        if !killed {
            break;
        }
    }
    assert!(
        partial_seen >= 1,
        "no kill left a partial copy behind ({kills} kills)"
    );
    assert!(kills >= 1, "no copy was killed before it finished");
    let r = copy_json(r2(&strs(&copy_args(&[]))));
    eprintln!("after {kills} kills: {r}");
    let again = copy_json(r2(&strs(&copy_args(&[]))));
    assert_eq!(again["objects_copied"], 0, "{again}");
    add_to_config(&env, &format!("repo2-path = \"{}\"", repo2(&env).display()));
    if let Some(pass) = pass {
        add_to_config(
            &env,
            &format!("repo2-cipher-type = \"aes-256-gcm\"\nrepo2-cipher-pass = \"{pass}\""),
        );
    }
    env.ok(&["--repo=2", "verify"]);
    assert_eq!(labels_in(&env, 2), [full.as_str(), incr.as_str()]);
    let c = env.restore_and_start(
        "after-kills",
        &["--repo=2", "--type=immediate", &format!("--set={incr}")],
    );
    assert_eq!(c.content_hashes().unwrap(), at_incr);
    c.stop().unwrap();
}

/// (d) A damaged pack in repository 1: copy fails with exit 4 naming it, and repository 2
/// shows no backup.
#[test]
fn a_damaged_source_pack_stops_the_copy_before_the_backup_appears() {
    let env = Env::with_config("copy-damage", "repo-path = \"{repo}\"\n");
    env.stanza_create();
    env.pgbench_init(1);
    let full = env.backup(&["--type=full"]);
    let (pack, _) = tree(&env.repo)
        .into_iter()
        .filter(|(k, _)| k.contains(&format!("backup/{full}/pack/")))
        .max_by_key(|(_, size)| *size)
        .unwrap();
    let path = env.repo.join(&pack);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&path, &bytes).unwrap();
    let (code, err) = run_fail(with_repo2(&env, &["--repo=2", "copy"]));
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(&pack), "names {pack}: {err}");
    let out = run_ok(with_repo2(&env, &["--output=json", "--repo=2", "info"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(backup_labels(&v).is_empty(), "{v}");
    assert!(
        !tree(&repo2(&env))
            .keys()
            .any(|k| k.ends_with("backup.manifest")),
        "no manifest in repo2"
    );
}

/// (b) An encrypted stanza copied to an S3 repository: copy creates the stanza there with
/// the source's key files, repository 2 then gets its own passphrase (key-add, key-remove
/// of repository 1's), an incremental copied afterwards is sealed again for it, and a
/// restore from repository 2 with its passphrase alone equals the source. Copies into
/// repositories that cannot open the source's frames (a key-remove in repository 1 since;
/// a stanza created apart; a repository in the clear) seal every frame again.
#[test]
fn an_encrypted_stanza_copies_to_s3_which_gets_its_own_passphrase() {
    const ONE: &str = "passphrase of repository one";
    const TWO: &str = "passphrase of repository two";
    let server = S3Server::start("pgstrata-copy").expect("moto S3 server (run .ci/setup)");
    let env = Env::with_config_compress(
        "copy-s3",
        &format!(
            "repo-path = \"{{repo}}\"\nrepo-cipher-type = \"aes-256-gcm\"\nrepo-cipher-pass = \"{ONE}\"\n"
        ),
        "lz4",
    );
    env.stanza_create();
    env.pgbench_init(1);
    let full = env.backup(&["--type=full"]);
    env.flush_wal();
    let s3 =
        crate::object_store::s3_toml(&server.bucket, &server.endpoint()).replace("repo-", "repo2-");
    let s3_env = |c: &mut std::process::Command, pass: &str| {
        for line in s3.lines() {
            let (k, v) = line.split_once(" = ").unwrap();
            let name = format!("PGSTRATA_{}", k.to_uppercase().replace('-', "_"));
            c.env(name, v.trim_matches('"'));
        }
        c.env("PGSTRATA_REPO2_CIPHER_PASS", pass);
    };
    let mut c = env.cmd(&strs(&copy_args(&[])));
    s3_env(&mut c, ONE);
    let r = copy_json(c);
    assert_eq!(r["stanza_created"], true, "{r}");
    assert_eq!(r["backups_copied"], serde_json::json!([full]), "{r}");
    let full_moved = r["bytes_copied"].as_u64().unwrap() - r["wal_bytes_copied"].as_u64().unwrap();

    // Repository 2's own passphrase, and repository 1's removed from it.
    let mut list = env.cmd(&["--repo=2", "--output=json", "key-list"]);
    s3_env(&mut list, ONE);
    let keys: serde_json::Value = serde_json::from_str(&run_ok(list)).unwrap();
    let old = keys[0]["id"].as_str().unwrap().to_string();
    let mut add = env.cmd(&["--repo=2", "key-add"]);
    s3_env(&mut add, ONE);
    add.env("PGSTRATA_NEW_CIPHER_PASS", TWO);
    run_ok(add);
    let mut remove = env.cmd(&["--repo=2", &format!("--key-id={old}"), "key-remove"]);
    s3_env(&mut remove, TWO);
    run_ok(remove);
    add_to_config(&env, &format!("{s3}repo2-cipher-pass = \"{TWO}\""));

    env.pgbench(&["-n", "-t", "200"]);
    let incr = env.backup(&["--type=incr"]);
    let at_incr = env.hashes();
    env.flush_wal();
    let r = copy_json(env.cmd(&strs(&copy_args(&[]))));
    assert_eq!(r["backups_copied"], serde_json::json!([incr]), "{r}");
    // Repository 1's passphrase opens nothing in repository 2 any more.
    let mut info = env.cmd(&["--repo=2", "info"]);
    info.env("PGSTRATA_REPO2_CIPHER_PASS", ONE);
    let (code, _) = run_fail(info);
    assert_eq!(code, 2);
    let c = env.restore_and_start(
        "from-s3",
        &["--repo=2", "--type=immediate", &format!("--set={incr}")],
    );
    assert_eq!(
        c.content_hashes().unwrap(),
        at_incr,
        "restored from S3 repo2"
    );
    c.stop().unwrap();

    // A key-remove in repository 1 starts a master key generation repository 2 lacks (it
    // has a generation 2 of its own): refused as such, not taken for damage.
    let mut add = env.cmd(&["key-add"]);
    add.env("PGSTRATA_NEW_CIPHER_PASS", "a passphrase soon removed");
    run_ok(add);
    let keys: serde_json::Value =
        serde_json::from_str(&run_ok(env.cmd(&["--output=json", "key-list"]))).unwrap();
    let added = keys
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap())
        .find(|id| *id != old)
        .unwrap()
        .to_string();
    run_ok(env.cmd(&[&format!("--key-id={added}"), "key-remove"]));
    env.pgbench(&["-n", "-t", "50"]);
    let after_rotation = env.backup(&["--type=incr"]);
    let at_rotation = env.hashes();
    env.flush_wal();
    // Repository 2 holds another generation 2: every frame is sealed again, and only the
    // frames repository 2 lacks cross (it found the others through the backups it has).
    let r = copy_json(env.cmd(&strs(&copy_args(&[]))));
    assert_eq!(
        r["backups_copied"],
        serde_json::json!([after_rotation]),
        "{r}"
    );
    let moved = r["bytes_copied"].as_u64().unwrap() - r["wal_bytes_copied"].as_u64().unwrap();
    assert!(
        moved < full_moved / 2,
        "incremental re-sealed: {moved} bytes, the full {full_moved}"
    );
    let c = env.restore_and_start(
        "resealed-from-s3",
        &[
            "--repo=2",
            "--type=immediate",
            &format!("--set={after_rotation}"),
        ],
    );
    assert_eq!(
        c.content_hashes().unwrap(),
        at_rotation,
        "re-sealed in repo2"
    );
    c.stop().unwrap();

    // A third repository whose stanza was created on its own (other master keys) and a
    // fourth in the clear: every backup copied, re-sealed, restores or verifies; a second
    // copy moves nothing.
    for (n, cipher) in [(3, Some(TWO)), (4, None)] {
        let dir = env.scratch.join(&format!("repo-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        pgstrata_testkit::give_to_pg_user(&dir);
        let repo_n = |args: &[&str]| {
            let mut c = env.cmd(args);
            c.env(format!("PGSTRATA_REPO{n}_PATH"), &dir);
            if let Some(pass) = cipher {
                c.env(format!("PGSTRATA_REPO{n}_CIPHER_TYPE"), "aes-256-gcm");
                c.env(format!("PGSTRATA_REPO{n}_CIPHER_PASS"), pass);
            }
            c
        };
        let to = format!("--repo={n}");
        run_ok(repo_n(&[&to, "stanza-create"]));
        let r = copy_json(repo_n(&[&to, "--output=json", "copy"]));
        assert_eq!(
            r["backups_copied"],
            serde_json::json!([full, incr, after_rotation]),
            "{r}"
        );
        let again = copy_json(repo_n(&[&to, "--output=json", "copy"]));
        assert_eq!(again["objects_copied"], 0, "{again}");
        if n == 3 {
            add_to_config(
                &env,
                &format!(
                    "repo3-path = \"{}\"\nrepo3-cipher-type = \"aes-256-gcm\"\nrepo3-cipher-pass = \"{TWO}\"",
                    dir.display()
                ),
            );
            let c = env.restore_and_start(
                "resealed-from-three",
                &["--repo=3", "--type=immediate", &format!("--set={incr}")],
            );
            assert_eq!(c.content_hashes().unwrap(), at_incr, "re-sealed in repo3");
            c.stop().unwrap();
        } else {
            let out = run_ok(repo_n(&[&to, "--output=json", "verify"]));
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            let v = v.as_array().map(|a| a[0].clone()).unwrap_or(v);
            assert_eq!(v["backups"].as_array().unwrap().len(), 3, "{v}");
            for b in v["backups"].as_array().unwrap() {
                assert_eq!(b["ok"], true, "{b}");
            }
            let plain = tree(&dir)
                .keys()
                .filter(|k| k.ends_with("backup.manifest"))
                .map(|k| std::fs::read(dir.join(k)).unwrap())
                .all(|bytes| !bytes.starts_with(b"PGSTRSEA"));
            assert!(plain, "repository 4 holds its manifests in the clear");
        }
    }
}
