//! The manifest as a repository writer could forge it: entries that would make restore
//! write outside its target, links where PostgreSQL has none, setuid modes, extents that do
//! not add up. Each is written with a valid checksum (the checksum has no key) and must be
//! refused as damaged (exit 4), naming the entry, before restore writes anything.
//!
//! Also the format's promise to the future: a frozen repository written by format 1
//! (`crates/repo/tests/fixtures/format-1`) must restore with every later version.

use crate::common::*;
use pgstrata_repo::fixture::file_mut;
use pgstrata_repo::manifest::{Entry, FileEntry, Manifest, Tablespace};
use pgstrata_testkit::{give_to_pg_user, Cluster, PgBin, Scratch};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A copy of the file entry `PG_VERSION` at `path`.
fn file_at(m: &Manifest, path: &str) -> Entry {
    let mut f = m
        .files()
        .find(|f| &*f.path == "PG_VERSION")
        .expect("PG_VERSION")
        .clone();
    f.path = path.into();
    Entry::File(Box::new(f))
}

fn link_at(m: &Manifest, path: &str, target: &Path) -> Entry {
    let Entry::Dir(root) = &m.entries[0] else {
        panic!("the root entry is a directory")
    };
    Entry::link(path, target.display().to_string(), root.owner.clone())
}

#[test]
fn forged_manifests_are_refused_before_restore_writes_anything() {
    let env = Env::new("forged");
    env.stanza_create();
    let label = env.backup(&["--type=full"]);
    let genuine = crate::common::manifest(&env.repo, &label);

    // What restore must never reach: a directory beside the targets.
    let canary = env.scratch.join("canary");
    std::fs::create_dir_all(&canary).unwrap();
    std::fs::write(canary.join("keep"), b"untouched").unwrap();
    let canary_before = content_tree(&canary);

    type Forge = Box<dyn Fn(&mut Manifest)>;
    let escape = "../canary/pwned".to_string();
    let absolute = canary.join("pwned").display().to_string();
    let canary_dir = canary.clone();
    let canary_dir2 = canary.clone();
    let cases: Vec<(&str, String, Forge)> = vec![
        (
            "a '..' path",
            escape.clone(),
            Box::new(move |m| m.entries.push(file_at(m, &escape))),
        ),
        (
            "an absolute path",
            absolute.clone(),
            Box::new(move |m| m.entries.push(file_at(m, &absolute))),
        ),
        (
            "a link at base/1",
            "base/1".into(),
            // template1's directory becomes a link: its files would be written through it.
            Box::new(move |m| {
                let at = m.entries.iter().position(|e| e.path() == "base/1").unwrap();
                m.entries[at] = link_at(m, "base/1", &canary_dir);
                m.entries.push(file_at(m, "base/1/pwned"));
            }),
        ),
        (
            "a file under a link, outside the tablespace's version directory",
            "pg_tblspc/99999/pwned".into(),
            Box::new(move |m| {
                m.tablespaces.push(Tablespace {
                    oid: 99999,
                    location: canary_dir2.display().to_string(),
                });
                m.entries.push(link_at(m, "pg_tblspc/99999", &canary_dir2));
                m.entries.push(file_at(m, "pg_tblspc/99999/pwned"));
            }),
        ),
        (
            "a setuid mode",
            "PG_VERSION".into(),
            Box::new(|m| file_mut(m, "PG_VERSION").owner.mode = 0o4755),
        ),
        (
            "extents short of the size",
            "PG_VERSION".into(),
            Box::new(|m| file_mut(m, "PG_VERSION").size += 1),
        ),
        (
            "a huge block_size",
            "global/pg_control".into(),
            Box::new(|m| file_mut(m, "global/pg_control").block_size = 1 << 31),
        ),
    ];
    for (i, (what, entry, forge)) in cases.into_iter().enumerate() {
        let mut m = genuine.clone();
        forge(&mut m);
        m.entries.sort_by(|a, b| a.path().cmp(b.path()));
        forge_in_place(&env, &mut m);
        let target = env.scratch.join(&format!("forged-{i}"));
        let (code, err) = run_fail(env.cmd_as_invoker(&[
            &format!("--pg-path={}", target.display()),
            "--archive-mode=off",
            "restore",
        ]));
        assert_eq!(code, 4, "{what}: damaged-data exit code: {err}");
        assert!(
            err.contains(&format!("entry {entry:?}")),
            "{what}: names the entry {entry:?}: {err}"
        );
        assert!(!target.exists(), "{what}: nothing written to the target");
        assert_eq!(
            content_tree(&canary),
            canary_before,
            "{what}: nothing written outside the target"
        );
    }

    // `packs_used` that does not match the entries (what expire frees packs by): restore,
    // which does not go by it, reads the manifest as a stream and does not check it;
    // verify counts the frames as it reads and fails the backup.
    let mut m = genuine.clone();
    m.set_packs_used();
    m.packs_used.as_mut().unwrap()[0].2 += 1;
    forge_in_place(&env, &mut m);
    let out = env.cmd(&["verify"]).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(
        text.contains("packs_used does not match the entries"),
        "{text}"
    );
}

/// A manifest that points a relation file at genuine frames of another file of the same
/// size (every frame's check passes, the extents add up) is refused by restore as damaged,
/// naming the file: a relation file has no whole-file hash, and its block map is what
/// proves the bytes written are the ones backed up.
#[test]
fn genuine_frames_under_another_files_name_are_refused() {
    let env = Env::new("swapped-frames");
    env.stanza_create();
    env.sql("CREATE TABLE a AS SELECT g AS x FROM generate_series(1, 1000) g");
    env.sql("CREATE TABLE b AS SELECT g + 1000 AS x FROM generate_series(1, 1000) g");
    env.sql("CHECKPOINT");
    let path_of = |t: &str| {
        env.sql(&format!("SELECT pg_relation_filepath('{t}')"))
            .trim()
            .to_string()
    };
    let (a, b) = (path_of("a"), path_of("b"));
    let label = env.backup(&["--type=full"]);
    let mut m = crate::common::manifest(&env.repo, &label);
    let theirs = file_mut(&mut m, &b).clone();
    let ours = file_mut(&mut m, &a);
    assert!(
        ours.hash.is_none(),
        "a relation file has no whole-file hash"
    );
    assert_eq!(ours.size, theirs.size, "two tables of the same size");
    assert!(ours.map.is_none() && theirs.map.is_none(), "extents inline");
    assert_ne!(
        ours.block_hash(0),
        theirs.block_hash(0),
        "with other content"
    );
    ours.chunks = theirs.chunks;
    forge_in_place(&env, &mut m);
    let target = env.scratch.join("swapped");
    let (code, err) = run_fail(env.cmd_as_invoker(&[
        &format!("--pg-path={}", target.display()),
        "--archive-mode=off",
        "restore",
    ]));
    assert_eq!(code, 4, "damaged-data exit code: {err}");
    assert!(
        err.contains(&a) && err.contains("does not match the hashes recorded at backup time"),
        "names the file {a}: {err}"
    );
}

/// Modes a repository writer forged (0777 with sticky and setgid bits, which pass
/// validation and are masked to permission bits there) never reach the restored cluster
/// as such: files get at most read and write for the owner and read for the group,
/// directories at most everything for the owner and read and search for the group (what
/// PostgreSQL makes with `initdb --allow-group-access`). Nothing is executable, nothing
/// writable or readable by others.
#[test]
fn forged_modes_are_clamped_to_what_postgresql_makes() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new("forged-modes");
    env.stanza_create();
    let label = env.backup(&["--type=full"]);
    let mut m = crate::common::manifest(&env.repo, &label);
    for e in &mut m.entries {
        match e {
            Entry::File(f) => f.owner.mode = 0o1777,
            Entry::Dir(d) => d.owner.mode = 0o3777,
            Entry::Link(_) => {}
        }
    }
    forge_in_place(&env, &mut m);
    let target = restore_only(&env, "forged-modes", &[]);
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    let mut checked = 0;
    let mut dirs = vec![target.clone()];
    while let Some(d) = dirs.pop() {
        assert_eq!(mode(&d), 0o750, "directory {}", d.display());
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let (p, t) = (e.path(), e.file_type().unwrap());
            if t.is_dir() {
                dirs.push(p);
            } else if t.is_file() {
                assert_eq!(mode(&p) & !0o640, 0, "file {}: {:o}", p.display(), mode(&p));
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{checked} files checked");
    assert_eq!(mode(&target.join("PG_VERSION")), 0o640);
}

/// Replace backup `m.label`'s manifest, its copy and its parts with `m`, all written as a
/// writer of the repository could: hashes and copies consistent, so that a reader has
/// only the entries themselves to refuse.
fn forge_in_place(env: &Env, m: &mut Manifest) {
    let dir = env.repo.join(format!("{STANZA}/backup/{}", m.label));
    for name in ["backup.manifest", "backup.manifest.copy"] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    let _ = std::fs::remove_dir_all(dir.join("manifest"));
    let storage = pgstrata_repo::Storage::local(&env.repo).unwrap();
    crate::common::block_on(m.publish(&storage)).unwrap();
    let parts = dir.join("manifest");
    let written = std::fs::read_dir(&parts)
        .unwrap()
        .flatten()
        .map(|e| e.path());
    for path in written.chain([
        parts.clone(),
        dir.join("backup.manifest"),
        dir.join("backup.manifest.copy"),
    ]) {
        give_to_pg_user(&path);
    }
}

/// Flip one bit in the middle of a repository file.
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_damaged_manifest_is_read_from_its_copy_and_a_damaged_backup_stops_nothing_else() {
    let env = Env::new("manifest-copy");
    env.stanza_create();
    let first = env.backup(&["--type=full"]);
    env.sql("CREATE TABLE t AS SELECT generate_series(1, 1000) AS x");
    let second = env.backup(&["--type=incr"]);
    env.flush_wal();
    let dir = env.repo.join(format!("{STANZA}/backup/{second}"));
    let (manifest, copy) = (
        dir.join("backup.manifest"),
        dir.join("backup.manifest.copy"),
    );
    assert_eq!(
        std::fs::read(&manifest).unwrap(),
        std::fs::read(&copy).unwrap()
    );

    // The manifest damaged: restore reads the copy, and says so.
    damage(&manifest);
    let target = env.scratch.join("from-copy");
    let out = env
        .cmd_as_invoker(&[
            &format!("--pg-path={}", target.display()),
            &format!("--set={second}"),
            "--archive-mode=off",
            "restore",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "restore from the copy: {err}");
    assert!(
        err.contains("backup.manifest.copy") && err.contains("checksum"),
        "warns: {err}"
    );

    // A damaged part of its entries (format 4): the part's copy serves the reads, so the
    // backup is valid, but verify fails (exit 4) naming the part and its intact twin:
    // the backup has lost its redundancy.
    let part = dir.join("manifest/0");
    let intact = std::fs::read(&part).unwrap();
    damage(&part);
    let out = env
        .cmd(&[&format!("--set={second}"), "verify"])
        .output()
        .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "verify with a damaged part: {err}"
    );
    assert!(
        text.contains(&format!("backup {second}: ok")),
        "the backup still restores: {text}"
    );
    assert!(
        text.contains("manifest/0 is damaged") && text.contains("manifest/0.copy is intact"),
        "names the part and its twin: {text}"
    );
    std::fs::write(&part, intact).unwrap();
    assert!(target.join("PG_VERSION").exists());

    // The copy damaged too: info and verify report the backup as damaged and go on with
    // the other one; verify fails.
    damage(&copy);
    let info = env.info_json();
    assert_eq!(info["backups"].as_array().unwrap().len(), 1, "{info}");
    assert_eq!(info["backups"][0]["label"], first.as_str());
    assert_eq!(info["damaged"][0]["label"], second.as_str(), "{info}");
    let text = env.ok(&["info"]);
    assert!(
        text.contains(&format!("damaged backup: {second}")),
        "{text}"
    );
    let out = env.cmd(&["--output=json", "verify"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "verify fails on a damaged backup"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let backups = r["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 2, "{r}");
    assert_eq!(
        (backups[0]["label"].as_str(), backups[0]["ok"].as_bool()),
        (Some(first.as_str()), Some(true)),
        "the intact backup is still verified: {r}"
    );
    assert_eq!(backups[1]["ok"], false);
    assert!(
        backups[1]["errors"][0]
            .as_str()
            .unwrap()
            .contains("damaged"),
        "{r}"
    );

    // expire --set removes the damaged backup: manifest, copy and parts.
    env.ok(&[&format!("--set={second}"), "expire"]);
    assert!(!manifest.exists() && !copy.exists());
    let left: Vec<String> = tree(&dir)
        .into_keys()
        .filter(|k| k.contains("manifest"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let info = env.info_json();
    assert!(info.get("damaged").is_none(), "{info}");
    assert_eq!(info["backups"].as_array().unwrap().len(), 1);
}

/// A repository written by pgstrata of format `version`, frozen: every later version must
/// read it. Each was made by [`make_format_fixture`] of the last build of its format.
fn format_fixture(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../repo/tests/fixtures/format-{version}"))
}

/// Copy `from` to `to` (files and directories), owned by the PostgreSQL OS user.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    give_to_pg_user(to);
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else if !e.file_name().to_string_lossy().contains('#') {
            std::fs::copy(e.path(), &dest).unwrap();
            give_to_pg_user(&dest);
        }
    }
}

/// The rows the fixture's table holds in its incremental backup: count, and a digest.
const FIXTURE_ROWS: &str =
    "SELECT count(*) || ' ' || md5(string_agg(id || v, ',' ORDER BY id)) FROM fixture";

/// What `FIXTURE_ROWS` returned on the fixture's source when it was made.
const FIXTURE_EXPECTED: &str = "1100 73862a618ac0ef86d7690c61bc0eb272";

/// Makes the frozen fixture of this build's format (PostgreSQL 15, 1 MiB WAL segments, a
/// full and an incremental backup with zstd, WAL with lz4). Run deliberately, once per
/// format, with the last build of that format:
/// `cargo test -p pgstrata --test integration -- --ignored make_format_fixture`.
#[test]
#[ignore]
fn make_format_fixture() {
    let env = Env::with_initdb_args("fixture", &["--wal-segsize=1"]);
    env.stanza_create();
    env.sql(
        "CREATE TABLE fixture AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 1000) g",
    );
    env.backup(&["--type=full", "--compress-type=zst"]);
    env.sql("UPDATE fixture SET v = 'changed' WHERE id <= 10");
    env.sql("INSERT INTO fixture SELECT g, 'new' FROM generate_series(1001, 1100) g");
    env.backup(&["--type=incr", "--compress-type=zst"]);
    env.flush_wal();
    println!("{}", env.sql(FIXTURE_ROWS).trim());
    let dest = format_fixture(pgstrata_repo::FORMAT_VERSION);
    let _ = std::fs::remove_dir_all(&dest);
    copy_tree(&env.repo, &dest);
    let _ = std::fs::remove_dir_all(dest.join(STANZA).join("lock"));
}

#[test]
fn the_frozen_format_1_repository_still_restores() {
    frozen_repository_restores(1);
}

#[test]
fn the_frozen_format_3_repository_still_restores() {
    frozen_repository_restores(3);
}

/// The frozen repository of format `version` is listed, verified, restored (the
/// incremental, its content checked in the started cluster) and expired.
fn frozen_repository_restores(version: u32) {
    let scratch = Scratch::new(&format!("format-{version}"));
    let repo = scratch.join("repo");
    copy_tree(&format_fixture(version), &repo);
    let pgstrata = |args: &[&str]| {
        let mut c = std::process::Command::new(exe());
        c.env("PGSTRATA_REPO_PATH", &repo)
            .env("PGSTRATA_STANZA", STANZA)
            .args(args);
        c
    };
    let info: serde_json::Value =
        serde_json::from_str(&run_ok(pgstrata(&["--output=json", "info"]))).unwrap();
    let labels = backup_labels(&info);
    assert_eq!(labels.len(), 2, "{info}");
    assert!(
        labels[0].ends_with('F') && labels[1].ends_with('I'),
        "{info}"
    );
    run_ok(pgstrata(&["verify"]));
    if version == 1 {
        // Format-1 manifests written before databases and annotations were recorded: no
        // annotations shown, and a selective restore is refused, naming why, writing
        // nothing.
        assert!(info["backups"][1].get("annotations").is_none(), "{info}");
        let target = scratch.join("selective");
        let (code, err) = run_fail(pgstrata(&[
            &format!("--pg-path={}", target.display()),
            "--db-exclude=postgres",
            "restore",
        ]));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("does not record its databases"), "{err}");
        assert!(!target.exists());
    }

    let target = scratch.join("restored");
    run_ok(pgstrata(&[
        &format!("--pg-path={}", target.display()),
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
        "restore",
    ]));
    let bin = PgBin::default_install().expect("PostgreSQL 15");
    let cluster = Cluster::adopt(&bin, &target, &scratch.path);
    cluster.start().expect("start the restored fixture");
    cluster
        .wait_for_promotion(Duration::from_secs(120))
        .expect("the restored fixture recovers");
    let rows = cluster.psql("postgres", FIXTURE_ROWS).unwrap();
    assert_eq!(rows.trim(), FIXTURE_EXPECTED, "the incremental's content");

    // Expire reads the manifests' headers (format 1 has no packs_used: whole, for it) and
    // deletes no pack the two kept backups use.
    let packs = || -> Vec<String> {
        tree(&repo)
            .into_keys()
            .filter(|k| k.contains("/pack/"))
            .collect()
    };
    let before = packs();
    assert!(!before.is_empty());
    run_ok(pgstrata(&["--repo-retention-full=1", "expire"]));
    assert_eq!(packs(), before);
}

#[test]
fn the_frozen_format_1_repository_is_extended_by_new_backups() {
    frozen_repository_is_extended(1);
}

#[test]
fn the_frozen_format_3_repository_is_extended_by_new_backups() {
    frozen_repository_is_extended(3);
}

/// The frozen repository of format `version` extended by backups of this build's format:
/// the restored fixture archives into it again; two incrementals on top of the fixture's
/// incremental each restore to what their source held, and the second carries the maps of
/// the first's larger files by reference. From format 1, the first one stores those maps
/// apart for the first time.
fn frozen_repository_is_extended(version: u32) {
    let scratch = Scratch::new(&format!("format-{version}-extended"));
    let repo = scratch.join("repo");
    copy_tree(&format_fixture(version), &repo);
    let bin = PgBin::default_install().expect("PostgreSQL 15");
    let restore = |target: &Path, set: Option<&str>| {
        let mut c = std::process::Command::new(exe());
        c.env("PGSTRATA_REPO_PATH", &repo)
            .env("PGSTRATA_STANZA", STANZA)
            .arg(format!("--pg-path={}", target.display()))
            .args(set.map(|s| format!("--set={s}")))
            .args([
                "--archive-mode=off",
                "--type=immediate",
                "--target-action=promote",
                "restore",
            ]);
        run_ok(c);
        let cluster = Cluster::adopt(&bin, target, &scratch.path);
        cluster.start().expect("start the restored cluster");
        cluster
            .wait_for_promotion(Duration::from_secs(120))
            .expect("the restored cluster recovers");
        cluster
    };
    let source_dir = scratch.join("source");
    let source = restore(&source_dir, None);
    let archive_command = format!(
        "{} --stanza={STANZA} --repo-path={} archive-push %p",
        exe().display(),
        repo.display()
    );
    source
        .psql("postgres", "ALTER SYSTEM SET archive_mode = on")
        .unwrap();
    source
        .psql(
            "postgres",
            &format!(
                "ALTER SYSTEM SET archive_command = '{}'",
                archive_command.replace('\'', "''")
            ),
        )
        .unwrap();
    source.stop().unwrap();
    source.start().unwrap();
    let on_source = |args: &[&str]| {
        let mut c = pgstrata_testkit::pg_command(exe());
        c.env("PGSTRATA_REPO_PATH", &repo)
            .env("PGSTRATA_STANZA", STANZA)
            .env("PGSTRATA_PG_PATH", &source_dir)
            .env("PGSTRATA_PG_HOST", &source.socket_dir)
            .env("PGSTRATA_PG_PORT", source.port.to_string())
            .env("PGSTRATA_PG_USER", "postgres")
            .args(args);
        run_ok(c).trim().to_string()
    };
    // The promotion's history file was written while archiving was off.
    let history = source_dir.join("pg_wal/00000002.history");
    on_source(&["archive-push", history.to_str().unwrap()]);

    source
        .psql(
            "postgres",
            "UPDATE fixture SET v = 'format 2' WHERE id % 7 = 0",
        )
        .unwrap();
    let first = on_source(&["--start-fast", "--type=incr", "backup"]);
    let first_rows = source.psql("postgres", FIXTURE_ROWS).unwrap();
    source
        .psql(
            "postgres",
            "INSERT INTO fixture SELECT g, 'second' FROM generate_series(1101, 3000) g",
        )
        .unwrap();
    let second = on_source(&["--start-fast", "--type=incr", "backup"]);
    let second_rows = source.psql("postgres", FIXTURE_ROWS).unwrap();

    let (m1, m2) = (
        crate::common::manifest(&repo, &first),
        crate::common::manifest(&repo, &second),
    );
    assert_eq!(m1.format_version, pgstrata_repo::FORMAT_VERSION);
    let fixture_prior = m1.prior.clone().unwrap();
    assert!(fixture_prior.ends_with('I') && fixture_prior < first);
    if version == 1 {
        // The first new backup stores the maps of the large files it carried unread from
        // the format 1 manifest.
        let stored_by_first: Vec<&FileEntry> = m1
            .files()
            .filter(|f| f.map.as_ref().is_some_and(|m| m.backup.is_none()))
            .collect();
        assert!(stored_by_first.len() > 10, "{} maps", stored_by_first.len());
        assert!(stored_by_first.iter().all(|f| f.chunks.is_empty()));
    }
    // The second carries the first's maps by reference.
    let carried = m2
        .files()
        .filter(|f| f.map.as_ref().and_then(|m| m.backup.as_deref()) == Some(first.as_str()))
        .count();
    assert!(carried > 10, "{carried} maps carried by reference");
    assert!(m1
        .files()
        .all(|f| f.map.is_some() || f.block_hashes.len() <= 8));

    // Every backup of both formats reads back; each new one restores as it was.
    let pgstrata_ok = |args: &[&str]| {
        let mut c = std::process::Command::new(exe());
        c.env("PGSTRATA_REPO_PATH", &repo)
            .env("PGSTRATA_STANZA", STANZA)
            .args(args);
        run_ok(c)
    };
    pgstrata_ok(&["verify"]);
    source.stop().unwrap();
    for (label, rows) in [(&first, &first_rows), (&second, &second_rows)] {
        let restored = restore(&scratch.join(label), Some(label));
        assert_eq!(
            &restored.psql("postgres", FIXTURE_ROWS).unwrap(),
            rows,
            "backup {label}"
        );
        restored.stop().unwrap();
    }

    // The fixture's full backup expired alone: the new backups keep the frames of it
    // they reference, and still verify.
    let fixture_full = m1.pack_codecs.keys().find(|l| l.ends_with('F')).cloned();
    let fixture_full = fixture_full.expect("the incremental references the fixture's full");
    pgstrata_ok(&[&format!("--set={fixture_full}"), "expire"]);
    pgstrata_ok(&["verify"]);
    // A delta restore of the second new backup over the first one's restore rewrites
    // only what differs, and gives the second one's content.
    let target = scratch.join(&first);
    let mut c = std::process::Command::new(exe());
    c.env("PGSTRATA_REPO_PATH", &repo)
        .env("PGSTRATA_STANZA", STANZA)
        .arg(format!("--pg-path={}", target.display()))
        .arg(format!("--set={second}"))
        .args([
            "--delta",
            "--archive-mode=off",
            "--type=immediate",
            "--target-action=promote",
            "restore",
        ]);
    let out = run_ok(c);
    assert!(out.contains("unchanged"), "{out}");
    let cluster = Cluster::adopt(&bin, &target, &scratch.path);
    cluster.start().expect("start the delta-restored cluster");
    cluster
        .wait_for_promotion(Duration::from_secs(120))
        .expect("the delta-restored cluster recovers");
    assert_eq!(cluster.psql("postgres", FIXTURE_ROWS).unwrap(), second_rows);
}
