//! verify: every backup read back and the WAL archive checked, without restoring; damage
//! and missing WAL are named, with the integrity exit code.

use crate::common::*;

/// Run verify; returns (exit code, stdout, stderr).
fn verify(env: &Env, args: &[&str]) -> (i32, String, String) {
    let mut a = args.to_vec();
    a.push("verify");
    let out = env.cmd(&a).output().expect("run pgstrata verify");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn verify_passes_a_sound_repository_and_names_damage_and_missing_wal() {
    let env = Env::new("verify");
    env.pgbench_init(2);
    env.sql("CHECKPOINT");
    env.stanza_create();
    // Files modified in the second a backup starts are re-read by the next one: keep the
    // load's mtimes out of the full's second so the incremental carries them unchanged.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let full = env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "200"]);
    let incr = env.backup(&["--type=incr"]);
    env.flush_wal();

    // Sound: every backup ok; the incremental's unchanged files were checked with the full.
    let (code, out, err) = verify(&env, &["--output=json", "--process-max=2"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["ok"], true, "{r}");
    let backups = r["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 2);
    let (f, i) = (&backups[0], &backups[1]);
    assert_eq!(
        (f["label"].as_str(), f["ok"].as_bool()),
        (Some(full.as_str()), Some(true))
    );
    assert_eq!(
        (i["label"].as_str(), i["ok"].as_bool()),
        (Some(incr.as_str()), Some(true))
    );
    // (Within one backup, identical entries such as empty files are read once too.)
    let read = |b: &serde_json::Value| b["files_read"].as_u64().unwrap();
    assert!(read(f) * 2 > f["files"].as_u64().unwrap(), "{f}");
    assert!(
        read(i) * 4 < read(f),
        "unchanged files are not read twice: {i}"
    );
    assert!(r["wal"]["segments"].as_u64().unwrap() >= 2, "{r}");
    assert!(r["wal"]["maps"].as_u64().unwrap() >= 2, "{r}");
    assert!(r["wal"]["damaged"].as_array().unwrap().is_empty());
    assert!(r["wal"]["gaps"].as_array().unwrap().is_empty());

    // A hole in the archive after both backups: they stay valid, but point-in-time
    // recovery cannot cross it, so verify fails (exit 4) and names it.
    for n in 0..2 {
        env.sql(&format!("CREATE TABLE after_{n} AS SELECT 1 AS x"));
        env.flush_wal();
    }
    let is_segment = |k: &str| {
        let name = k.rsplit('/').next().unwrap();
        name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let segments: Vec<String> = tree(&env.repo)
        .into_keys()
        .filter(|k| is_segment(k))
        .collect();
    let hole = &segments[segments.len() - 2];
    let hole_name = hole.rsplit('/').next().unwrap();
    let kept = std::fs::read(env.repo.join(hole)).unwrap();
    std::fs::remove_file(env.repo.join(hole)).unwrap();
    let (code, out, err) = verify(&env, &["--output=json"]);
    assert_eq!(code, 4, "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["backups"][0]["ok"], true, "{r}");
    assert_eq!(r["backups"][1]["ok"], true, "{r}");
    assert_eq!(
        r["wal"]["gaps"][0],
        serde_json::json!([hole_name, hole_name])
    );
    let (_, text, _) = verify(&env, &[]);
    assert!(
        text.contains(&format!("gap: {hole_name} .. {hole_name}")),
        "{text}"
    );
    std::fs::write(env.repo.join(hole), kept).unwrap();

    // A flipped bit in the full's largest pack: the full is invalid, the damaged file is
    // named, and the exit code is the integrity one. Nothing in the repository changes.
    let before = tree(&env.repo);
    let pack = before
        .iter()
        .filter(|(k, _)| k.contains(&format!("backup/{full}/pack/")))
        .max_by_key(|(_, size)| **size)
        .map(|(k, _)| env.repo.join(k))
        .unwrap();
    let original = std::fs::read(&pack).unwrap();
    let mut bytes = original.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&pack, &bytes).unwrap();
    let (code, out, err) = verify(&env, &[]);
    assert_eq!(code, 4, "{out}\n{err}");
    assert!(out.contains(&format!("backup {full}: INVALID")), "{out}");
    assert!(
        out.contains("error: base/") && out.contains("checksum"),
        "{out}"
    );
    assert!(err.contains("verify found problems"), "{err}");
    assert_eq!(tree(&env.repo), before, "verify changes nothing");
    // --set checks just one backup.
    let (code, out, _) = verify(&env, &[&format!("--set={incr}"), "--output=json"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["backups"].as_array().unwrap().len(), 1);
    assert_eq!(code == 0, r["backups"][0]["ok"] == true);
    std::fs::write(&pack, &original).unwrap();

    // A flipped bit in the frame of a small file whose pack holds other small files
    // (verify reads those a group at a time, with one read, as restore does): that file
    // is named, no other file is.
    let m = crate::common::manifest(&env.repo, &full);
    let mut packs: std::collections::BTreeMap<String, Vec<(String, u64, u32)>> = Default::default();
    for f in m.files().filter(|f| f.size > 0 && f.size <= 1 << 20) {
        if let [c] = &f.chunks[..] {
            if let (Some(pack), None) = (c.pack, c.backup) {
                let file = (f.path.to_string(), c.offset, c.stored);
                packs
                    .entry(pack.as_str().to_string())
                    .or_default()
                    .push(file);
            }
        }
    }
    let (shared_pack, small) = packs
        .into_iter()
        .find(|(_, files)| files.len() >= 3)
        .expect("a pack of small files");
    let (damaged, offset, stored) = small[small.len() / 2].clone();
    let pack = env
        .repo
        .join(format!("{STANZA}/backup/{full}/pack/{shared_pack}"));
    let original = std::fs::read(&pack).unwrap();
    let mut bytes = original.clone();
    bytes[(offset + stored as u64 / 2) as usize] ^= 0x01;
    std::fs::write(&pack, &bytes).unwrap();
    let (code, out, err) = verify(&env, &["--output=json", "--process-max=2"]);
    assert_eq!(code, 4, "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let errors: Vec<&str> = r["backups"][0]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(&format!("{damaged}:")) && errors[0].contains("checksum"),
        "{errors:?}"
    );
    assert_eq!(
        r["backups"][1]["ok"], false,
        "the incremental carries them: {r}"
    );
    std::fs::write(&pack, &original).unwrap();

    // A WAL segment the incremental needs to become consistent is gone: the incremental is
    // invalid and the segment named; the hole is reported as a gap.
    let start_wal = env.info_json()["backups"][1]["start_wal"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            let key = format!("{STANZA}/backup/{incr}/backup.manifest");
            pgstrata_repo::manifest::Manifest::decode(
                &std::fs::read(env.repo.join(&key)).unwrap(),
                &key,
            )
            .unwrap()
            .start
            .wal
        });
    let segment = tree(&env.repo)
        .into_keys()
        .find(|k| k.ends_with(&format!("/{start_wal}")))
        .expect("the incremental's start segment is archived");
    std::fs::remove_file(env.repo.join(&segment)).unwrap();
    let (code, out, err) = verify(&env, &["--output=json"]);
    assert_eq!(code, 4, "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["ok"], false);
    assert_eq!(
        r["backups"][0]["ok"], true,
        "the full does not need that segment"
    );
    assert_eq!(r["backups"][1]["ok"], false);
    assert!(
        r["backups"][1]["errors"][0]
            .as_str()
            .unwrap()
            .contains(&format!(
                "{start_wal}, needed to make the backup consistent, is not archived"
            )),
        "{r}"
    );
    assert_eq!(r["wal"]["gaps"][0][0], start_wal.as_str(), "{r}");
}
