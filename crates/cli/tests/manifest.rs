//! The manifest as a repository writer could forge it: entries that would make restore
//! write outside its target, links where PostgreSQL has none, setuid modes, extents that do
//! not add up. Each is written with a valid checksum (the checksum has no key) and must be
//! refused as damaged (exit 4), naming the entry, before restore writes anything.

use crate::common::*;
use pgstrata_repo::manifest::{Entry, FileEntry, Manifest, Tablespace};
use std::path::Path;

fn file_mut<'a>(m: &'a mut Manifest, path: &str) -> &'a mut FileEntry {
    m.entries
        .iter_mut()
        .find_map(|e| match e {
            Entry::File(f) if f.path == path => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no file {path} in the manifest"))
}

/// A copy of the file entry `PG_VERSION` at `path`.
fn file_at(m: &Manifest, path: &str) -> Entry {
    let mut f = m
        .files()
        .find(|f| f.path == "PG_VERSION")
        .expect("PG_VERSION")
        .clone();
    f.path = path.to_string();
    Entry::File(f)
}

fn link_at(m: &Manifest, path: &str, target: &Path) -> Entry {
    let Entry::Dir { owner, .. } = &m.entries[0] else {
        panic!("the root entry is a directory")
    };
    Entry::Link {
        path: path.to_string(),
        target: target.display().to_string(),
        owner: owner.clone(),
    }
}

#[test]
fn forged_manifests_are_refused_before_restore_writes_anything() {
    let env = Env::new("forged");
    env.stanza_create();
    let label = env.backup(&["--type=full"]);
    let key = env
        .repo
        .join(format!("{STANZA}/backup/{label}/backup.manifest"));
    let genuine = Manifest::decode(&std::fs::read(&key).unwrap(), "genuine").unwrap();

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
                m.entries
                    .push(link_at(m, "pg_tblspc/99999", &canary_dir2));
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
        std::fs::write(&key, m.encode()).unwrap();
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
}
