//! Bad input gets a clear message, a non-zero exit, and leaves nothing behind; a damaged
//! repository fails loudly; a killed backup leaves no half backup.

use crate::common::*;
use pgstrata_repo::Named;
use std::time::Duration;

#[test]
fn bad_input_is_refused_clearly_and_writes_nothing() {
    let env = Env::new("bad");
    env.pgbench_init(1);
    env.stanza_create();
    let label = env.backup(&[]);
    // The archiver pushes the backup's .backup history file after the backup returns: let
    // it finish (the segments after it are archived in name order) before the snapshot.
    env.flush_wal();
    let before = tree(&env.repo);

    // Unknown stanza.
    let (code, err) = run_fail(env.cmd(&["--stanza=nope", "backup"]));
    assert_eq!(code, 3);
    assert!(err.contains("stanza 'nope' does not exist"), "{err}");

    // Malformed config file, and an unknown option in it.
    let cfg = env.scratch.join("bad.toml");
    std::fs::write(
        &cfg,
        "[global]\nrepo-path = \"/x\"\nprocess-max = \"many\"\n",
    )
    .unwrap();
    let (code, err) = run_fail(env.cmd(&[&format!("--config={}", cfg.display()), "backup"]));
    assert_eq!(code, 2);
    assert!(err.contains("process-max") && err.contains("many"), "{err}");
    std::fs::write(&cfg, "[global]\nrepo_path = \"/x\"\n").unwrap();
    let (code, err) = run_fail(env.cmd(&[&format!("--config={}", cfg.display()), "info"]));
    assert_eq!(code, 2);
    assert!(err.contains("unknown option 'repo_path'"), "{err}");
    std::fs::write(&cfg, "[global\n").unwrap();
    let (_, err) = run_fail(env.cmd(&[&format!("--config={}", cfg.display()), "info"]));
    assert!(err.contains("not valid TOML"), "{err}");

    // Unreachable server.
    let (code, err) = run_fail(env.cmd(&["--pg-port=1", "backup"]));
    assert_eq!(code, 3);
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");

    // A repository stanza that belongs to another cluster.
    let other = Env::new("bad-other");
    let mut c = other.cmd(&["stanza-create"]);
    c.env("PGSTRATA_REPO_PATH", &env.repo);
    let (_, err) = run_fail(c);
    assert!(err.contains("belongs to another cluster"), "{err}");
    let mut c = other.cmd(&["backup"]);
    c.env("PGSTRATA_REPO_PATH", &env.repo);
    let (_, err) = run_fail(c);
    assert!(err.contains("belongs to cluster"), "{err}");

    assert_eq!(
        tree(&env.repo),
        before,
        "failed commands wrote nothing to the repository"
    );

    // Restore into a non-empty directory without --delta/--force.
    let target = env.scratch.join("occupied");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("precious"), b"keep me").unwrap();
    let (_, err) =
        run_fail(env.cmd_as_invoker(&[&format!("--pg-path={}", target.display()), "restore"]));
    assert!(
        err.contains("not empty") && err.contains("--delta"),
        "{err}"
    );
    assert_eq!(std::fs::read(target.join("precious")).unwrap(), b"keep me");
    assert_eq!(
        std::fs::read_dir(&target).unwrap().count(),
        1,
        "nothing written"
    );

    // Restore over a running cluster's directory is refused even with --force.
    let (_, err) = run_fail(env.cmd_as_invoker(&["--force", "restore"]));
    assert!(err.contains("running"), "{err}");

    // A flipped bit in a stored frame: restore stops and names the file the frame belongs
    // to. Once in a frame of a table's data; once in the largest frame of a small file,
    // which restore fetches together with the other small files of its group. (Not just the
    // middle of the largest pack: a pack also holds frames of the manifest's block maps.)
    let manifest = manifest_with_maps(&env.repo, &label);
    let accounts = env.sql("SELECT pg_relation_filepath('pgbench_accounts')");
    let stored = || {
        manifest
            .files()
            .filter(|f| f.path.starts_with("base/"))
            .flat_map(|f| f.chunks.iter().map(move |c| (f, c)))
            .filter(|(_, c)| c.pack.is_some() && c.backup.is_none())
    };
    let in_accounts = stored()
        .filter(|(f, _)| *f.path == *accounts)
        .max_by_key(|(_, c)| c.stored);
    assert!(
        in_accounts.is_some(),
        "{accounts} stored in the backup's packs"
    );
    let in_small_file = stored()
        .filter(|(f, _)| f.size <= 1 << 20)
        .max_by_key(|(_, c)| c.stored);
    for (i, (_, chunk)) in [in_accounts, in_small_file]
        .into_iter()
        .flatten()
        .enumerate()
    {
        // Small files share frames (bundling): any file of the damaged frame is right.
        let in_frame: Vec<&str> = stored()
            .filter(|(_, c)| c.pack == chunk.pack && c.offset == chunk.offset)
            .map(|(f, _)| &*f.path)
            .collect();
        let pack = env.repo.join(pgstrata_repo::layout::pack(
            STANZA,
            &label,
            chunk.pack.as_ref().unwrap(),
        ));
        let flip =
            |bytes: &mut Vec<u8>| bytes[(chunk.offset + chunk.stored as u64 / 2) as usize] ^= 0x01;
        let mut bytes = std::fs::read(&pack).unwrap();
        flip(&mut bytes);
        std::fs::write(&pack, &bytes).unwrap();
        let target = env.scratch.join(&format!("from-damaged-{i}"));
        let (code, err) =
            run_fail(env.cmd_as_invoker(&[&format!("--pg-path={}", target.display()), "restore"]));
        assert_eq!(code, 4, "damage has its own exit code: {err}");
        assert!(err.contains("checksum") && err.contains("damaged"), "{err}");
        assert!(
            in_frame.iter().any(|f| err.contains(&format!("{f}:"))),
            "names the file of the damaged frame ({in_frame:?}): {err}"
        );
        flip(&mut bytes);
        std::fs::write(&pack, &bytes).unwrap();
    }
}

#[test]
fn killed_backup_leaves_no_half_backup_and_the_next_one_succeeds() {
    let env = Env::new("kill");
    env.pgbench_init(30);
    env.stanza_create();
    // Killed once packs are written, then once the parts of its manifest are (the first
    // is written as the copy reaches global/pg_control, whose place it keeps): neither
    // packs nor parts without their manifest are a backup.
    for (marker, what) in [("/pack/", "packs"), ("/manifest/", "parts")] {
        kill_midway(
            &env,
            &[
                "--process-max=1",
                "--start-fast",
                "--compress-type=bz2",
                "backup",
            ],
            marker,
        );
        let info = env.info_json();
        assert_eq!(
            info["backups"].as_array().unwrap().len(),
            0,
            "no half backup is visible after one killed with {what} written: {info}"
        );
    }
    let expected = env.hashes();
    let label = env.backup(&[]);
    let info = env.info_json();
    assert_eq!(info["backups"][0]["label"], label.as_str());
    let c = env.restore_and_start("after-kill", &["--type=immediate"]);
    assert_eq!(c.content_hashes().unwrap(), expected);
}

/// Every object under `dir` (a local repository's backup directory), made `age` old.
fn age_objects(dir: &std::path::Path, age: Duration) {
    let when = std::time::SystemTime::now() - age;
    for (rel, _) in tree(dir) {
        let p = dir.join(rel);
        if p.is_file() {
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
    }
}

/// A backup killed after some of its packs were stored is resumed by the next one: the
/// blocks that still match point at the interrupted backup's frames (stored with another
/// codec) instead of being compressed and stored again. expire keeps the interrupted
/// backup's packs while it is the newest, and once a complete backup is newer removes its
/// checkpoints and the packs nothing references, keeping those the resumed backup uses.
#[test]
fn an_interrupted_backup_is_resumed_and_expire_keeps_what_the_resumed_one_uses() {
    let env = Env::new("resume");
    env.pgbench_init(30);
    env.stanza_create();
    kill_midway(
        &env,
        &[
            "--process-max=1",
            "--start-fast",
            "--compress-type=bz2",
            "--bundle-size=4MiB",
            "backup",
        ],
        "/resume/",
    );
    let backups = env.repo.join(format!("{STANZA}/backup"));
    let interrupted: Vec<String> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(interrupted.len(), 1, "{interrupted:?}");
    let interrupted = &interrupted[0];
    let objects = |label: &str, part: &str| {
        tree(&backups.join(label))
            .into_iter()
            .filter(|(k, size)| k.starts_with(part) && *size > 0 && !k.ends_with('/'))
            .count()
    };
    assert!(objects(interrupted, "resume/") >= 1);
    let interrupted_packs = objects(interrupted, "pack/");

    // Aged past the grace period, the interrupted backup is still kept: it is the newest.
    age_objects(&backups.join(interrupted), Duration::from_secs(7200));
    env.ok(&["--repo-retention-full=1", "expire"]);
    assert_eq!(objects(interrupted, "pack/"), interrupted_packs);
    assert!(objects(interrupted, "resume/") >= 1);

    let expected = env.hashes();
    let label = env.backup(&["--compress-type=zst"]);
    let m = manifest_with_maps(&env.repo, &label);
    assert!(
        m.stats.resumed > 10 << 20,
        "{} bytes resumed from {interrupted}",
        m.stats.resumed
    );
    assert_eq!(
        m.pack_codecs.get(interrupted.as_str()).map(|c| c.name()),
        Some("bz2"),
        "the interrupted backup's frames are bz2"
    );
    assert!(
        m.stats.bytes_read >= m.stats.db_size / 2,
        "every block is read"
    );
    assert_eq!(
        objects(&label, "resume/"),
        0,
        "a complete backup's checkpoints go"
    );
    assert!(objects(interrupted, "resume/") > 0);

    env.ok(&["--repo-retention-full=1", "expire"]);
    assert_eq!(
        objects(interrupted, "resume/"),
        0,
        "checkpoints go once resumed"
    );
    let kept = objects(interrupted, "pack/");
    assert!(
        kept > 0 && kept <= interrupted_packs,
        "{kept} of {interrupted_packs} packs are still referenced"
    );
    env.ok(&["verify"]);
    let c = env.restore_and_start("resumed", &["--type=immediate"]);
    assert_eq!(c.content_hashes().unwrap(), expected);
}

/// The real binary, no cluster (pg_control is read before connecting): a data directory
/// whose pg_control is damaged is damage, exit 4 with the reason, not an I/O failure; one
/// of a PostgreSQL release pgstrata does not read is refused (exit 3). Nothing is written.
#[test]
fn a_damaged_pg_control_exits_as_damage() {
    let dir = pgstrata_testkit::Scratch::new("damaged-control");
    let (data, repo) = (dir.join("data"), dir.join("repo"));
    std::fs::create_dir_all(data.join("global")).unwrap();
    let stanza_create = || {
        let mut c = std::process::Command::new(exe());
        c.env_remove("PGSTRATA_CONFIG")
            .arg("--stanza=main")
            .arg(format!("--repo-path={}", repo.display()))
            .arg(format!("--pg-path={}", data.display()))
            .arg("stanza-create");
        run_fail(c)
    };
    // PostgreSQL 14-16's control version, and a CRC that does not match.
    let mut control = vec![0u8; 8192];
    control[8..12].copy_from_slice(&1300u32.to_le_bytes());
    std::fs::write(data.join("global/pg_control"), &control).unwrap();
    let (code, err) = stanza_create();
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("pg_control: CRC mismatch") && err.contains("damaged"),
        "{err}"
    );
    // PostgreSQL 12's control version: not damage, a release pgstrata does not read.
    control[8..12].copy_from_slice(&1201u32.to_le_bytes());
    std::fs::write(data.join("global/pg_control"), &control).unwrap();
    let (code, err) = stanza_create();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("is not one of PostgreSQL 14-18"), "{err}");
    assert!(tree(&repo).is_empty(), "nothing written to the repository");
}

/// stanza-delete is refused without --force (exit 2) and while the cluster runs (exit 3),
/// deleting nothing; then it removes every object of the stanza, and the stanza is
/// created again from scratch and backs up.
#[test]
fn stanza_delete_needs_force_and_a_stopped_cluster_then_removes_everything() {
    let env = Env::new("stanza-delete");
    env.stanza_create();
    env.pgbench_init(1);
    env.backup(&["--type=full"]);
    env.flush_wal();
    let before = tree(&env.repo);
    assert!(before.keys().any(|k| k.contains("/pack/")), "{before:?}");
    let (code, err) = run_fail(env.cmd(&["stanza-delete"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--force"), "{err}");
    let (code, err) = run_fail(env.cmd(&["--force", "stanza-delete"]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("running"), "{err}");
    assert_eq!(tree(&env.repo), before, "nothing deleted");

    env.cluster.stop().unwrap();
    let out = env.ok(&["--force", "stanza-delete"]);
    assert!(out.contains("deleted"), "{out}");
    let left: Vec<String> = tree(&env.repo)
        .into_keys()
        .filter(|k| k.starts_with(STANZA))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let (code, err) = run_fail(env.cmd(&["info"]));
    assert_ne!(code, 0, "{err}");

    env.cluster.start().unwrap();
    env.stanza_create();
    env.backup(&["--type=full"]);
    assert_eq!(backup_labels(&env.info_json()).len(), 1);
}
