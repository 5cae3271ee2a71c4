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
