//! Encrypted repositories (`repo-cipher-type=aes-256-gcm`): nothing of the database shows in
//! the repository, every kind of damage or tampering is refused with the right exit code,
//! passphrases rotate without touching backup data, and the whole cycle works on S3.

use crate::common::*;
use crate::object_store::{s3_storage, s3_toml};
use pgstrata_testkit::S3Server;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const PASS: &str = "correct horse battery staple";
const MARKER: &str = "PGSTRATA-SECRET-MARKER-4f1c";

/// Config body of an encrypted local repository, stored without compression so that any
/// leak would show.
fn encrypted_toml(pass: &str) -> String {
    format!(
        "repo-path = \"{{repo}}\"\nrepo-cipher-type = \"aes-256-gcm\"\nrepo-cipher-pass = \"{pass}\"\ncompress-type = \"none\"\n"
    )
}

fn encrypted_env(name: &str) -> Env {
    Env::with_config_compress(name, &encrypted_toml(PASS), "none")
}

/// Every file under `dir` (recursively), by path relative to it.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if !e.file_name().to_string_lossy().contains('#') {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// BLAKE3 of every file under `dir`.
fn hashes_under(dir: &Path) -> BTreeMap<PathBuf, String> {
    files(dir)
        .into_iter()
        .map(|p| {
            let h = blake3::hash(&std::fs::read(&p).unwrap())
                .to_hex()
                .to_string();
            (p.strip_prefix(dir).unwrap().to_path_buf(), h)
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The marker table: its rows, in order.
fn marker_rows(c: &pgstrata_testkit::Cluster) -> String {
    c.psql(
        "postgres",
        "SELECT count(*) || ':' || md5(string_agg(v, ',' ORDER BY v)) FROM marker_table",
    )
    .unwrap()
}

#[test]
fn an_encrypted_repository_shows_nothing_of_the_database_and_restores() {
    let env = encrypted_env("enc-leak");
    env.sql(&format!(
        "CREATE TABLE marker_table AS SELECT '{MARKER} row ' || g AS v FROM generate_series(1, 20000) g"
    ));
    let rel_path = env
        .sql("SELECT pg_relation_filepath('marker_table')")
        .trim()
        .to_string();
    assert!(rel_path.starts_with("base/"), "{rel_path}");
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    env.sql(&format!(
        "INSERT INTO marker_table SELECT '{MARKER} later ' || g FROM generate_series(1, 5000) g"
    ));
    env.flush_wal();
    let incr = env.backup(&["--type=incr"]);
    // The full goes; the incremental keeps reading the frames it shares with it.
    env.ok(&[&format!("--set={full}"), "expire"]);
    env.flush_wal();
    let expected = marker_rows(&env.cluster);

    let stanza_dir = env.repo.join(STANZA);
    let all = files(&stanza_dir);
    assert!(all.iter().any(|p| p.to_string_lossy().contains("/pack/")));
    assert!(all
        .iter()
        .any(|p| p.to_string_lossy().contains("/archive/")));
    for p in &all {
        let bytes = std::fs::read(p).unwrap();
        for secret in [MARKER, rel_path.as_str(), "PG_VERSION", "pg_control"] {
            assert!(
                !contains(&bytes, secret),
                "{} holds '{secret}' in the clear",
                p.display()
            );
        }
        let name = p
            .strip_prefix(&env.repo)
            .unwrap()
            .to_string_lossy()
            .to_string();
        assert!(
            !name.contains("base/") && !name.contains("PG_VERSION"),
            "{name}"
        );
    }

    let set = format!("--set={incr}");
    restore_then_delta(&env, &set, &expected);
}

/// A copy of the repository to damage, and the command that reads it.
fn damaged_copy(env: &Env, name: &str) -> PathBuf {
    let copy = env.scratch.join(name);
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(&env.repo)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success());
    copy
}

/// Run on the damaged copy, expecting failure: the exit code, and what it printed.
fn on_copy(env: &Env, copy: &Path, args: &[&str]) -> (i32, String) {
    let mut c = env.cmd(args);
    c.env("PGSTRATA_REPO_PATH", copy);
    let out = c.output().unwrap();
    assert!(
        !out.status.success(),
        "{args:?} succeeded on a damaged repository"
    );
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// restore (into a new directory) and verify of `label` both refuse the copy as damaged,
/// naming `object`.
fn refused_as_damaged(env: &Env, copy: &Path, label: &str, object: &str) {
    let target = env.scratch.join(&format!(
        "restore-{}",
        copy.file_name().unwrap().to_string_lossy()
    ));
    let pg_path = format!("--pg-path={}", target.display());
    let set = format!("--set={label}");
    for args in [
        vec![pg_path.as_str(), set.as_str(), "restore"],
        vec![set.as_str(), "verify"],
    ] {
        let (code, err) = on_copy(env, copy, &args);
        let out = format!("{args:?}: exit {code}: {err}");
        assert_eq!(code, 4, "{out}");
        assert!(err.contains(object), "names {object}: {out}");
    }
}

fn flip_byte(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

#[test]
fn wrong_passphrases_and_damage_are_refused() {
    let env = encrypted_env("enc-refuse");
    env.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 100000) g");
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    env.sql("UPDATE t SET g = g + 1 WHERE g < 100");
    let incr = env.backup(&["--type=incr"]);
    env.flush_wal();

    // A wrong passphrase: one clear line, exit 2.
    let mut c = env.cmd(&["info"]);
    c.env("PGSTRATA_REPO_CIPHER_PASS", "not the passphrase");
    let (code, err) = run_fail(c);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim(),
        "ERROR: the passphrase opens none of stanza test's 1 key",
        "{err}"
    );

    // No passphrase at all: exit 2 saying where to set it.
    let no_pass = env.scratch.join("no-pass.toml");
    std::fs::write(
        &no_pass,
        format!("[global]\nrepo-path = \"{}\"\n", env.repo.display()),
    )
    .unwrap();
    pgstrata_testkit::give_to_pg_user(&no_pass);
    let mut c = env.cmd(&["info"]);
    c.env("PGSTRATA_CONFIG", &no_pass);
    let (code, err) = run_fail(c);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("stanza 'test' is encrypted") && err.contains("PGSTRATA_REPO_CIPHER_PASS"),
        "{err}"
    );
    // Encryption is chosen once: stanza-create cannot turn it off.
    let (code, err) = run_fail(env.cmd(&["--repo-cipher-type=none", "stanza-create"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("exists and is encrypted"), "{err}");

    let backup_dir = |repo: &Path, label: &str| repo.join(STANZA).join("backup").join(label);
    // Objects `names` (one and its copy) of the full copied over the incremental's, in a
    // fresh copy of the repository `case`: refused as damaged, naming the first.
    let replayed = |case: &str, names: [&str; 2]| {
        let copy = damaged_copy(&env, case);
        for name in names {
            std::fs::copy(
                backup_dir(&copy, &full).join(name),
                backup_dir(&copy, &incr).join(name),
            )
            .unwrap();
        }
        refused_as_damaged(&env, &copy, &incr, &format!("backup/{incr}/{}", names[0]));
    };

    // A flipped bit in a pack.
    let copy = damaged_copy(&env, "flipped");
    let pack = backup_dir(&copy, &full).join("pack/0-0");
    flip_byte(&pack, std::fs::metadata(&pack).unwrap().len() as usize / 2);
    refused_as_damaged(&env, &copy, &full, &format!("backup/{full}/pack/0-0"));

    // A truncated manifest (and its copy).
    let copy = damaged_copy(&env, "truncated");
    for name in ["backup.manifest", "backup.manifest.copy"] {
        let p = backup_dir(&copy, &incr).join(name);
        let len = std::fs::metadata(&p).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 7)
            .unwrap();
    }
    refused_as_damaged(
        &env,
        &copy,
        &incr,
        &format!("backup/{incr}/backup.manifest"),
    );

    // A flipped bit in the manifest alone: its copy holds the same sealed bytes (sealed
    // under the manifest's name) and is read instead, with a warning naming both.
    let copy = damaged_copy(&env, "manifest-alone");
    let manifest = backup_dir(&copy, &incr).join("backup.manifest");
    flip_byte(
        &manifest,
        std::fs::metadata(&manifest).unwrap().len() as usize / 2,
    );
    let mut c = env.cmd(&[&format!("--set={incr}"), "verify"]);
    c.env("PGSTRATA_REPO_PATH", &copy);
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(4),
        "verify reports the lost redundancy: {text}"
    );
    assert!(
        text.contains(&format!("backup {incr}: ok"))
            && text.contains("backup.manifest is damaged")
            && text.contains("backup.manifest.copy is intact"),
        "{text}"
    );
    // verify --repair rewrites it from the copy (sealed under the manifest's name, as
    // written); a second verify passes.
    let mut c = env.cmd(&["verify", "--repair"]);
    c.env("PGSTRATA_REPO_PATH", &copy);
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "verify --repair: {text}");
    assert!(
        text.contains("repaired:") && text.contains("backup.manifest"),
        "{text}"
    );
    let mut c = env.cmd(&["verify"]);
    c.env("PGSTRATA_REPO_PATH", &copy);
    assert!(c.status().unwrap().success(), "a second verify passes");

    // Two pack objects swapped.
    let copy = damaged_copy(&env, "swapped");
    let (a, b) = (
        backup_dir(&copy, &full).join("pack/0-0"),
        backup_dir(&copy, &full).join("pack/1-0"),
    );
    let tmp = copy.join("swap");
    std::fs::rename(&a, &tmp).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&tmp, &b).unwrap();
    refused_as_damaged(&env, &copy, &full, &format!("backup/{full}/pack/"));

    // The manifest (and its copy) of another backup copied over this one's.
    replayed("replayed", ["backup.manifest", "backup.manifest.copy"]);

    // The first part of another backup's manifest (and its copy) copied over this one's:
    // sealed under the other backup's names, it fails authentication.
    replayed("replayed-part", ["manifest/0", "manifest/0.copy"]);

    // A damaged WAL object: archive-get fails above 125, so PostgreSQL stops instead of
    // ending recovery early.
    let copy = damaged_copy(&env, "wal");
    let segment = files(&copy.join(STANZA).join("archive"))
        .into_iter()
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.len() == 24 && n.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .expect("an archived segment");
    flip_byte(&segment, 100);
    let name = segment.file_name().unwrap().to_string_lossy().to_string();
    let dest = env.scratch.join("fetched-segment");
    let (code, err) = on_copy(
        &env,
        &copy,
        &["archive-get", &name, &dest.display().to_string()],
    );
    assert!(code > 125, "exit {code}: {err}");
    assert!(err.contains(&name), "{err}");
    assert!(!dest.exists());

    // Vanished backups: this host looks (info), expire --set removes the full backup (and
    // writes a sealed record), then an attacker deletes the incremental's manifest, its
    // copy and its parts, replays the record under another name and forges one naming
    // the incremental. Both records are refused, the incremental is VANISHED, verify
    // fails.
    let copy = damaged_copy(&env, "vanished");
    let on = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("PGSTRATA_REPO_PATH", &copy);
        c.output().unwrap()
    };
    assert!(on(&["info"]).status.success());
    assert!(on(&[&format!("--set={full}"), "expire"]).status.success());
    let records = copy.join(STANZA).join("expired");
    let record = files(&records).pop().expect("expire wrote a record");
    std::fs::copy(&record, records.join("1-1.json")).unwrap();
    std::fs::write(
        records.join("2-2.json"),
        format!(r#"{{"name":"2-2","stanza":"{STANZA}","time":"2026-01-01T00:00:00Z","backups":["{incr}"],"wal":[]}}"#),
    )
    .unwrap();
    for planted in ["1-1.json", "2-2.json"] {
        pgstrata_testkit::give_to_pg_user(&records.join(planted));
    }
    std::fs::remove_dir_all(backup_dir(&copy, &incr).join("manifest")).unwrap();
    for name in ["backup.manifest", "backup.manifest.copy"] {
        std::fs::remove_file(backup_dir(&copy, &incr).join(name)).unwrap();
    }
    let out = on(&["info"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("VANISHED: backup {incr} vanished"))
            && text.contains("1-1.json refused")
            && text.contains("2-2.json refused"),
        "{text}"
    );
    assert_eq!(on(&["verify"]).status.code(), Some(4));
}

/// key-add, key-list and key-remove of the first key: the new passphrase restores, the old
/// one is refused, and no object of backup/ or archive/ changed.
fn rotate(env: &Env, stanza_objects: impl Fn() -> BTreeMap<PathBuf, String>) {
    let before = stanza_objects();
    assert!(!before.is_empty());
    // Earlier commands left the master key in the host key cache: the next one takes it
    // from there (no Argon2id), and the cache must stop working with the key removed below.
    let mut info = env.cmd(&["--log-level-console=debug", "info"]);
    let out = info.output().unwrap();
    let log =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("master key from the host key cache"), "{log}");
    let listed = |env: &Env| -> Vec<serde_json::Value> {
        serde_json::from_str(&env.ok(&["--output=json", "key-list"])).unwrap()
    };
    let first = listed(env);
    assert_eq!(first.len(), 1, "{first:?}");
    let mut add = env.cmd(&["key-add"]);
    add.env("PGSTRATA_NEW_CIPHER_PASS", "the new passphrase");
    run_ok(add);
    let keys = listed(env);
    assert_eq!(keys.len(), 2, "{keys:?}");
    for k in &keys {
        for field in ["id", "created", "host", "user"] {
            assert!(k[field].as_str().is_some_and(|v| !v.is_empty()), "{k}");
        }
    }
    let old_id = first[0]["id"].as_str().unwrap().to_string();
    // Removed with the old passphrase itself (a key may remove the key that opened it): the
    // host key cache still holds the master key as the old passphrase opened it.
    run_ok(env.cmd(&[&format!("--key-id={old_id}"), "key-remove"]));
    let keys = listed(env);
    assert_eq!(keys.len(), 1);
    assert_ne!(keys[0]["id"].as_str().unwrap(), old_id);

    // The old passphrase (still in the config file) opens nothing now, cached or not.
    let (code, err) = run_fail(env.cmd(&["info"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("opens none of stanza test's 1 key"), "{err}");
    // The last key stays.
    let last = keys[0]["id"].as_str().unwrap();
    let mut remove = env.cmd(&[&format!("--key-id={last}"), "key-remove"]);
    remove.env("PGSTRATA_REPO_CIPHER_PASS", "the new passphrase");
    let (code, err) = run_fail(remove);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("last key"), "{err}");

    let after = stanza_objects();
    for (name, hash) in &before {
        assert_eq!(after.get(name), Some(hash), "{} changed", name.display());
    }
}

/// The config file with `pass` as the passphrase (what a user does after rotating).
fn set_config_pass(env: &Env, old: &str, new: &str) {
    let cfg = env.config.as_ref().unwrap();
    let text = std::fs::read_to_string(cfg).unwrap();
    assert!(text.contains(old));
    std::fs::write(cfg, text.replace(old, new)).unwrap();
}

#[test]
fn passphrases_rotate_without_rewriting_backups() {
    let env = encrypted_env("enc-rotate");
    env.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 50000) g");
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.flush_wal();
    let expected = env.hashes();
    let stanza_dir = env.repo.join(STANZA);
    rotate(&env, || {
        let mut h = hashes_under(&stanza_dir.join("backup"));
        h.extend(hashes_under(&stanza_dir.join("archive")));
        h
    });
    set_config_pass(&env, PASS, "the new passphrase");
    env.ok(&["verify"]);
    let restored = env.restore_and_start("restored", &["--type=immediate"]);
    assert_eq!(restored.content_hashes().unwrap(), expected);
    restored.stop().unwrap();
}

#[test]
fn the_whole_encrypted_cycle_on_s3() {
    let server = S3Server::start("pgstrata-enc").expect("moto S3 server (run .ci/setup)");
    let toml = format!(
        "{}repo-cipher-type = \"aes-256-gcm\"\nrepo-cipher-pass = \"{PASS}\"\ncompress-type = \"none\"\n",
        s3_toml(&server.bucket, &server.endpoint())
    );
    let env = Env::with_config_compress("enc-s3", &toml, "none");
    env.sql(&format!(
        "CREATE TABLE marker_table AS SELECT '{MARKER} ' || g AS v FROM generate_series(1, 20000) g"
    ));
    env.stanza_create();
    env.ok(&["check"]);
    env.backup(&["--type=full"]);
    env.sql("INSERT INTO marker_table SELECT 'more ' || g FROM generate_series(1, 1000) g");
    let incr = env.backup(&["--type=incr"]);
    env.flush_wal();
    let expected = marker_rows(&env.cluster);

    let storage = s3_storage(&server);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let objects = || -> BTreeMap<PathBuf, String> {
        rt.block_on(async {
            let mut out = BTreeMap::new();
            for o in storage.list(STANZA).await.unwrap() {
                if o.key.contains("/backup/") || o.key.contains("/archive/") {
                    let b = storage.get_unsealed(&o.key).await.unwrap();
                    out.insert(PathBuf::from(&o.key), blake3::hash(&b).to_hex().to_string());
                }
            }
            out
        })
    };
    // Nothing readable in the bucket either.
    rt.block_on(async {
        for o in storage.list(STANZA).await.unwrap() {
            let b = storage.get_unsealed(&o.key).await.unwrap();
            assert!(
                !contains(&b, MARKER) && !contains(&b, "PG_VERSION"),
                "{}",
                o.key
            );
        }
    });
    rotate(&env, objects);
    set_config_pass(&env, PASS, "the new passphrase");
    env.ok(&["verify"]);
    env.ok(&["--repo-retention-full=1", "expire"]);
    let set = format!("--set={incr}");
    restore_then_delta(&env, &set, &expected);
}

/// Restore `set` and compare the marker rows; then change the restored copy and bring it
/// back with a delta restore (single frames by ranged reads), and compare again.
fn restore_then_delta(env: &Env, set: &str, expected: &str) {
    let restored = env.restore_and_start("restored", &[set]);
    assert_eq!(marker_rows(&restored), expected);
    restored
        .psql(
            "postgres",
            "DELETE FROM marker_table WHERE v LIKE '%later%'",
        )
        .unwrap();
    restored.stop().unwrap();
    let restored = env.restore_and_start("restored", &[set, "--delta"]);
    assert_eq!(marker_rows(&restored), expected);
    restored.stop().unwrap();
}

/// The key files of the stanza, by id, as stored.
fn key_files(env: &Env) -> BTreeMap<String, PathBuf> {
    std::fs::read_dir(env.repo.join(STANZA).join("keys"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let id = name.strip_suffix(".json")?.to_string();
            Some((id, e.path()))
        })
        .collect()
}

/// A command run with `pass` as the passphrase.
fn with_pass(env: &Env, pass: &str, args: &[&str]) -> std::process::Command {
    let mut c = env.cmd(args);
    c.env("PGSTRATA_REPO_CIPHER_PASS", pass);
    c
}

/// Issue 41, finding 1: key-remove revokes. A removed key file put back (anyone who could
/// read the repository may have kept a copy) opens what was written before its removal,
/// and nothing written after it: neither the new backup's manifest nor its packs nor the
/// WAL archived after. The remaining passphrase still reads and restores everything.
#[test]
fn a_removed_key_put_back_opens_nothing_written_after_its_removal() {
    const SECOND: &str = "the second passphrase";
    let env = encrypted_env("enc-revoke");
    env.sql(&format!(
        "CREATE TABLE marker_table AS SELECT '{MARKER} row ' || g AS v FROM generate_series(1, 20000) g"
    ));
    env.stanza_create();
    let mut add = with_pass(&env, PASS, &["key-add"]);
    add.env("PGSTRATA_NEW_CIPHER_PASS", SECOND);
    run_ok(add);
    let before = env.backup(&["--type=full"]);
    env.flush_wal();
    // The second key: the one the second passphrase opens.
    let keys = key_files(&env);
    assert_eq!(keys.len(), 2, "{keys:?}");
    let mut c = with_pass(
        &env,
        SECOND,
        &[
            "--log-level-console=debug",
            "--repo-cipher-key-cache=n",
            "info",
        ],
    );
    let out = c.output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    let (second_id, second_path) = keys
        .iter()
        .find(|(id, _)| log.contains(&format!("opened with key {id}")))
        .map(|(id, p)| (id.clone(), p.clone()))
        .unwrap_or_else(|| panic!("which key opened: {log}"));
    let aside = env.scratch.join("removed-key.json");
    std::fs::copy(&second_path, &aside).unwrap();

    run_ok(with_pass(
        &env,
        PASS,
        &[&format!("--key-id={second_id}"), "key-remove"],
    ));
    assert!(!second_path.exists());
    env.sql(&format!(
        "INSERT INTO marker_table SELECT '{MARKER} later ' || g FROM generate_series(1, 5000) g"
    ));
    let after = env.backup(&["--type=full"]);
    env.sql("INSERT INTO marker_table SELECT 'even later ' || g FROM generate_series(1, 1000) g");
    env.flush_wal();
    let expected = marker_rows(&env.cluster);

    // The removed key file put back.
    std::fs::copy(&aside, &second_path).unwrap();
    pgstrata_testkit::give_to_pg_user(&second_path);

    // The backup written after the removal: its manifest does not open, with a line saying
    // why (not "damaged"), exit 2.
    let (code, err) = run_fail(with_pass(
        &env,
        SECOND,
        &[&format!("--set={after}"), "verify"],
    ));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("backup/{after}/backup.manifest"))
            && err.contains("master key")
            && err.contains(&second_id),
        "{err}"
    );
    // Its packs: the removed key's master keys open none of their frames.
    let storage = pgstrata_repo::storage::Storage::local(&env.repo).unwrap();
    let keys = block_on(pgstrata_repo::cipher::KeySet::load(&storage, STANZA)).unwrap();
    let removed = pgstrata_repo::cipher::open_master(
        STANZA,
        &keys,
        &pgstrata_repo::cipher::Passphrase::new(SECOND),
    )
    .unwrap();
    let pack_key = format!("{STANZA}/backup/{after}/pack/0-0");
    let pack = std::fs::read(env.repo.join(&pack_key)).unwrap();
    let mut out = Vec::new();
    let e = removed
        .open_frame_into(&pack_key, 0, &pack, &mut out, "the first frame")
        .unwrap_err();
    assert!(e.context.contains("master key"), "{e}");
    // The WAL archived after the removal: archive-get refuses it.
    let newest_segment = files(&env.repo.join(STANZA).join("archive"))
        .into_iter()
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.len() == 24 && n.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .max_by_key(|p| p.file_name().unwrap().to_os_string())
        .expect("an archived segment");
    let name = newest_segment
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let dest = env.scratch.join("fetched");
    let dest_arg = dest.display().to_string();
    let (code, err) = run_fail(with_pass(&env, SECOND, &["archive-get", &name, &dest_arg]));
    assert!(
        code != 0 && err.contains(&name) && err.contains("master key"),
        "exit {code}: {err}"
    );
    assert!(!dest.exists());
    // What was written before the removal still opens with it (unavoidable: it held that
    // master key): the earlier backup restores (`verify` would also read the later WAL).
    let early = env.scratch.join("restored-early");
    run_ok(with_pass(
        &env,
        SECOND,
        &[
            &format!("--pg-path={}", early.display()),
            &format!("--set={before}"),
            "--repo-cipher-key-cache=n",
            "restore",
        ],
    ));
    assert!(early.join("PG_VERSION").exists());

    // The remaining passphrase reads everything, the removed key file notwithstanding.
    run_ok(with_pass(&env, PASS, &["archive-get", &name, &dest_arg]));
    env.ok(&["verify"]);
    let set = format!("--set={after}");
    let restored = env.restore_and_start("restored", &[&set]);
    assert_eq!(marker_rows(&restored), expected);
    restored.stop().unwrap();
}

/// Issue 41, finding 2: a hostile key file (absurd Argon2id cost, or not JSON) next to a
/// good one neither stops the commands nor makes them spend its memory and time: it is
/// skipped with a warning naming it and why.
#[test]
fn hostile_key_files_are_skipped_with_a_warning() {
    let env = encrypted_env("enc-hostile-keys");
    env.stanza_create();
    let good = key_files(&env).into_values().next().unwrap();
    let mut greedy: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&good).unwrap()).unwrap();
    // Dated 1970 so that it is tried first; 1 GiB and 1 MiB, which a reader used to accept.
    greedy["id"] = "0000000000000001".into();
    greedy["created"] = "1970-01-01T00:00:00Z".into();
    greedy["kdf"]["m_cost"] = (1024 * 1024 + 1024).into();
    let keys_dir = env.repo.join(STANZA).join("keys");
    let planted = [
        (
            "0000000000000001.json",
            serde_json::to_vec(&greedy).unwrap(),
        ),
        (
            "0000000000000002.json",
            b"{ this is not a key file".to_vec(),
        ),
    ];
    for (name, body) in &planted {
        let p = keys_dir.join(name);
        std::fs::write(&p, body).unwrap();
        pgstrata_testkit::give_to_pg_user(&p);
    }
    let started = std::time::Instant::now();
    let mut c = env.cmd(&["--repo-cipher-key-cache=n", "info"]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    for (name, why) in [
        ("0000000000000001.json", "Argon2id"),
        ("0000000000000002.json", "not a valid key file"),
    ] {
        assert!(
            err.lines()
                .any(|l| l.contains("WARN") && l.contains(name) && l.contains(why)),
            "warns about {name}: {err}"
        );
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    // key-list shows the good key only, and still warns.
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&env.ok(&["--output=json", "key-list"])).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    // No key file usable at all: an error naming the skipped ones.
    std::fs::remove_file(&good).unwrap();
    let (code, err) = run_fail(env.cmd(&["--repo-cipher-key-cache=n", "info"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("0000000000000002.json"), "{err}");
}

/// Issue 41, finding 3: a stanza whose key files are gone and whose record was replaced by
/// a plain one is refused, and the message says it may have been tampered with; it never
/// advises removing the passphrase (the attacker's last step).
#[test]
fn a_stanza_stripped_of_its_keys_is_refused_as_possibly_tampered() {
    let env = encrypted_env("enc-stripped");
    env.stanza_create();
    let stanza_dir = env.repo.join(STANZA);
    std::fs::remove_dir_all(stanza_dir.join("keys")).unwrap();
    let plain = serde_json::json!({
        "format_version": 4,
        "stanza": STANZA,
        "created": "2026-01-01T00:00:00Z",
        "cluster": {
            "system_identifier": "1", "major_version": 15, "catalog_version": 202209061,
            "control_version": 1300, "wal_segment_size": 16777216, "block_size": 8192
        }
    });
    std::fs::write(
        stanza_dir.join("stanza.json"),
        serde_json::to_vec(&plain).unwrap(),
    )
    .unwrap();
    let (code, err) = run_fail(env.cmd(&["info"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tampered"), "{err}");
    assert!(err.contains(&format!("{STANZA}/keys")), "{err}");
    assert!(!err.contains("remove the passphrase"), "{err}");
}

/// repo-ls lists the stanza's objects (one level, or all below a path, as text or JSON);
/// repo-get writes an object opened and checked: the sealed stanza record as its JSON, a
/// manifest and its copy as the backup's JSON, a WAL object as the segment. A flipped
/// byte is damage (exit 4), a path outside the stanza a usage error (exit 2).
#[test]
fn repo_ls_and_repo_get_show_what_the_repository_holds_opened_and_checked() {
    let env = encrypted_env("repo-tools");
    env.stanza_create();
    env.pgbench_init(1);
    let label = env.backup(&["--type=full"]);
    env.flush_wal();

    let top = env.ok(&["repo-ls"]);
    for dir in ["archive/", "backup/", "keys/"] {
        assert!(top.contains(&format!("{STANZA}/{dir}\n")), "{top}");
    }
    assert!(top.contains(&format!("{STANZA}/stanza.json\n")), "{top}");
    let backup_dir = format!("{STANZA}/backup/{label}");
    let all: serde_json::Value =
        serde_json::from_str(&env.ok(&["repo-ls", "--recurse", "--output=json", &backup_dir]))
            .unwrap();
    let manifest_key = format!("{backup_dir}/backup.manifest");
    let manifest = all
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == manifest_key.as_str())
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(manifest["type"], "object");
    assert!(manifest["size"].as_u64().unwrap() > 0);

    // Sealed on disk, opened by repo-get.
    let record = std::fs::read(env.repo.join(STANZA).join("stanza.json")).unwrap();
    assert!(serde_json::from_slice::<serde_json::Value>(&record).is_err());
    let record: serde_json::Value =
        serde_json::from_str(&env.ok(&["repo-get", &format!("{STANZA}/stanza.json")])).unwrap();
    assert_eq!(record["stanza"], STANZA, "{record}");
    for key in [manifest_key.clone(), format!("{manifest_key}.copy")] {
        let m: serde_json::Value = serde_json::from_str(&env.ok(&["repo-get", &key])).unwrap();
        assert_eq!(m["label"], label.as_str(), "{key}");
    }
    let wal = env.ok(&["repo-ls", "--recurse", &format!("{STANZA}/archive")]);
    let segment = wal
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .find(|k| k.len() > 24 && k.rsplit('/').next().unwrap().len() == 24)
        .unwrap_or_else(|| panic!("{wal}"))
        .to_string();
    let out = env.cmd(&["repo-get", &segment]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        out.stdout.len(),
        16 << 20,
        "the segment as PostgreSQL wrote it"
    );
    assert_eq!(&out.stdout[..2], &[0x10, 0xd1], "a PostgreSQL 15 WAL page");

    // Damage, and paths outside the stanza.
    let on_disk = env.repo.join(&manifest_key);
    let mut bytes = std::fs::read(&on_disk).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&on_disk, bytes).unwrap();
    let (code, err) = run_fail(env.cmd(&["repo-get", &manifest_key]));
    assert_eq!(code, 4, "{err}");
    for outside in ["other/stanza.json", &format!("{STANZA}/../other")] {
        let (code, err) = run_fail(env.cmd(&["repo-get", outside]));
        assert_eq!(code, 2, "{outside}: {err}");
    }
}

/// annotate pins a backup and changes its annotations after the fact (sealed records in
/// an encrypted stanza); info shows both; a pin record copied to another backup is refused.
#[test]
fn annotate_pins_a_backup_and_info_shows_it() {
    let env = encrypted_env("annotate");
    env.stanza_create();
    env.pgbench_init(1);
    let first = env.backup(&["--type=full", "--annotation=ticket=OPS-1"]);
    let second = env.backup(&["--type=full"]);
    let set = format!("--set={first}");
    let out = env.ok(&[
        &set,
        "--pin",
        "--annotation=ticket=",
        "--annotation=why=audit",
        "annotate",
    ]);
    assert!(out.contains("pinned"), "{out}");
    let info = env.info_json();
    let b = info_backup(&info, &first);
    assert_eq!(b["pinned"], true, "{b}");
    assert_eq!(
        b["annotations"],
        serde_json::json!({ "why": "audit" }),
        "{b}"
    );
    assert_eq!(info_backup(&info, &second)["pinned"], false);
    assert!(env.ok(&["info"]).contains("pinned: retention keeps it"));
    let (code, err) = run_fail(env.cmd(&[&set, "--pin", "--unpin", "annotate"]));
    assert_eq!(code, 2, "{err}");
    let (code, err) = run_fail(env.cmd(&["--set=20990101-000000F", "--pin", "annotate"]));
    assert_eq!(code, 2, "{err}");

    // The sealed pin record of the first backup, copied under the second's name.
    let dir = env.repo.join(STANZA).join("annotations");
    let record = std::fs::read_dir(dir.join(&first))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let forged = dir.join(&second).join(record.file_name());
    std::fs::create_dir_all(forged.parent().unwrap()).unwrap();
    std::fs::copy(record.path(), &forged).unwrap();
    pgstrata_testkit::give_to_pg_user(forged.parent().unwrap());
    pgstrata_testkit::give_to_pg_user(&forged);
    let info = env.info_json();
    assert_eq!(
        info_backup(&info, &second)["pinned"],
        false,
        "a forged pin is not applied"
    );
    assert_eq!(info_backup(&info, &first)["pinned"], true);
}
