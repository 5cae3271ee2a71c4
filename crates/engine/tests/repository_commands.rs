//! The engine's commands on repositories built without PostgreSQL (`fixture`): verify,
//! expire (retention and garbage collection), restore and info, on a clean repository and
//! on deliberately damaged ones. Part of the fast tier: no cluster, no root, no servers.
//!
//! Each test in `on_both_backends!` runs twice: on a local directory (opened from its
//! path, as the CLI configures it) and on an in-memory object store handed to the
//! command already opened (`Settings::opened`), so object-store code paths (whole puts,
//! listings by prefix, no directories) are covered without a server.

mod fixture;

use fixture::{Backend, BackupSpec, Repo, STANZA};
use pgstrata_engine::commands::expire::{expire, ExpireOptions, RetentionType};
use pgstrata_engine::commands::restore::{RecoveryType, RestoreOptions};
use pgstrata_engine::commands::{info, verify};
use pgstrata_repo::layout;
use pgstrata_repo::manifest::{BackupType, Manifest};

const FULL1: &str = "20260101-000000F";
const FULL2: &str = "20260102-000000F";
const FULL3: &str = "20260103-000000F";

/// Bytes that differ in every block, so a wrong extent shows.
fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A repository with three full backups, each with its own files and the WAL from the
/// first backup's start to the last one's stop (segments 10..=31).
async fn three_fulls(backend: Backend) -> (Repo, Vec<Manifest>) {
    let repo = Repo::on(backend).await;
    let (a, b, c) = (content(1, 20_000), content(2, 8192), content(3, 100));
    let mut manifests = vec![];
    for (i, label) in [FULL1, FULL2, FULL3].into_iter().enumerate() {
        let segno = 10 + 10 * i as u64;
        manifests.push(
            repo.backup(&BackupSpec {
                label,
                backup_type: BackupType::Full,
                prior: None,
                segments: (segno, segno + 1),
                files: &[
                    ("base/1/16384", &a),
                    ("base/1/PG_VERSION", b"15\n"),
                    ("global/pg_control", &b),
                    ("postgresql.conf", &c),
                ],
            })
            .await,
        );
    }
    repo.archive_wal(10, 31).await;
    (repo, manifests)
}

async fn verify_all(repo: &Repo) -> verify::VerifyReport {
    verify::verify(&repo.settings(None), &Default::default())
        .await
        .unwrap()
}

fn verdict<'r>(r: &'r verify::VerifyReport, label: &str) -> &'r verify::BackupVerdict {
    r.backups.iter().find(|b| b.label == label).unwrap()
}

async fn a_clean_repository_verifies(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let r = verify_all(&repo).await;
    assert!(r.ok, "{}", verify::render_text(&r));
    assert_eq!(r.backups.len(), 3);
    assert!(r.backups.iter().all(|b| b.ok && b.files == 4));
    assert_eq!(r.wal.segments, 22);
    assert!(r.wal.damaged.is_empty() && r.wal.gaps.is_empty());
}

async fn verify_finds_a_flipped_byte_in_a_pack_frame(backend: Backend) {
    let (repo, m) = three_fulls(backend).await;
    repo.flip_byte(&repo.pack_of(&m[1], "base/1/16384"), 5000)
        .await;
    let r = verify_all(&repo).await;
    assert!(!r.ok, "a damaged frame fails verify (exit 4)");
    let bad = verdict(&r, FULL2);
    assert!(!bad.ok);
    assert!(
        bad.errors.iter().any(|e| e.contains("base/1/16384")),
        "the damaged file is named: {:?}",
        bad.errors
    );
    assert!(verdict(&r, FULL1).ok && verdict(&r, FULL3).ok);
}

async fn verify_finds_a_missing_pack(backend: Backend) {
    let (repo, m) = three_fulls(backend).await;
    repo.remove(&repo.pack_of(&m[0], "global/pg_control")).await;
    let r = verify_all(&repo).await;
    assert!(!r.ok);
    let bad = verdict(&r, FULL1);
    assert!(
        bad.errors.iter().any(|e| e.contains("global/pg_control")),
        "{:?}",
        bad.errors
    );
    assert!(verdict(&r, FULL2).ok);
}

async fn verify_finds_a_missing_wal_segment_as_a_gap_and_an_invalid_backup(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    // Segment 21 is FULL2's stop: FULL2 cannot become consistent.
    repo.remove(&repo.wal_key(21)).await;
    let r = verify_all(&repo).await;
    assert!(!r.ok);
    let gap = (fixture::segment_name(21), fixture::segment_name(21));
    assert_eq!(r.wal.gaps, vec![gap]);
    assert!(!verdict(&r, FULL2).ok, "{:?}", verdict(&r, FULL2).errors);
    assert!(verdict(&r, FULL1).ok && verdict(&r, FULL3).ok);
}

async fn verify_finds_a_damaged_wal_segment(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    repo.flip_byte(&repo.wal_key(15), -1).await;
    let r = verify_all(&repo).await;
    assert!(!r.ok);
    assert_eq!(r.wal.damaged.len(), 1, "{:?}", r.wal.damaged);
    assert!(r.wal.damaged[0].contains(&fixture::segment_name(15)));
}

/// The value of metric `name` in an exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

async fn a_manifest_damaged_with_its_copy_intact_restores_but_fails_verify(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let main = layout::manifest(STANZA, FULL2);
    repo.flip_byte(&main, 40).await;
    let copy = layout::manifest_copy(STANZA, FULL2);
    assert_ne!(
        repo.storage.get_unsealed(&main).await.unwrap(),
        repo.storage.get_unsealed(&copy).await.unwrap()
    );
    // The backup restores from the copy...
    let target = tempfile::tempdir().unwrap();
    restore_into(&repo, FULL2, target.path()).await.unwrap();
    assert_eq!(
        std::fs::read(target.path().join("base/1/16384")).unwrap(),
        content(1, 20_000)
    );
    // ...but its redundancy is gone, and verify says so: exit 4, the object named.
    let r = verify_all(&repo).await;
    let text = verify::render_text(&r);
    assert!(!r.ok, "{text}");
    assert!(verdict(&r, FULL2).ok, "the backup itself restores: {text}");
    assert_eq!(r.damaged_objects.len(), 1, "{text}");
    let d = &r.damaged_objects[0];
    assert_eq!((&d.key, &d.twin, d.twin_intact), (&main, &copy, true));
    assert!(
        text.contains(&main) && text.contains("lost its redundancy"),
        "{text}"
    );
    let metrics = pgstrata_engine::commands::metrics::render_verify(&r, 0);
    assert_eq!(metric(&metrics, "pgstrata_verify_damaged_objects"), 1.0);
    assert_eq!(metric(&metrics, "pgstrata_verify_ok"), 0.0);
}

async fn a_removed_manifest_copy_and_a_damaged_part_fail_verify(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let copy = layout::manifest_copy(STANZA, FULL1);
    repo.remove(&copy).await;
    let part = layout::manifest_part(STANZA, FULL3, 0);
    repo.flip_byte(&part, 50).await;
    let r = verify_all(&repo).await;
    let text = verify::render_text(&r);
    assert!(!r.ok, "{text}");
    assert!(r.backups.iter().all(|b| b.ok), "all still restore: {text}");
    let found: Vec<_> = r
        .damaged_objects
        .iter()
        .map(|d| (d.key.as_str(), d.twin_intact))
        .collect();
    assert_eq!(
        found,
        vec![(copy.as_str(), true), (part.as_str(), true)],
        "{text}"
    );
    assert!(r.damaged_objects[0].why.contains("missing"), "{text}");
}

async fn verify_repair_rewrites_damaged_twins_and_a_second_verify_passes(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let main = layout::manifest(STANZA, FULL1);
    let intact = repo.storage.get_unsealed(&main).await.unwrap();
    repo.flip_byte(&main, 40).await;
    let (part, part_copy) = (
        layout::manifest_part(STANZA, FULL2, 0),
        layout::manifest_part_copy(STANZA, FULL2, 0),
    );
    repo.remove(&part_copy).await;
    let repair = verify::VerifyOptions {
        set: None,
        repair: true,
    };
    let r = verify::verify(&repo.settings(None), &repair).await.unwrap();
    let text = verify::render_text(&r);
    assert_eq!(r.repaired, vec![main.clone(), part_copy.clone()], "{text}");
    assert!(r.damaged_objects.is_empty() && r.ok, "{text}");
    assert!(text.contains(&format!("repaired: {main}")), "{text}");
    // The same bytes as before the damage; the removed copy is back.
    assert_eq!(repo.storage.get_unsealed(&main).await.unwrap(), intact);
    assert_eq!(
        repo.storage.get_unsealed(&part_copy).await.unwrap(),
        repo.storage.get_unsealed(&part).await.unwrap()
    );
    let again = verify_all(&repo).await;
    assert!(
        again.ok && again.repaired.is_empty(),
        "{}",
        verify::render_text(&again)
    );
}

async fn verify_repair_leaves_a_pair_damaged_twice_and_fails(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    for key in [
        layout::manifest_part(STANZA, FULL3, 0),
        layout::manifest_part_copy(STANZA, FULL3, 0),
    ] {
        repo.flip_byte(&key, 50).await;
    }
    let repair = verify::VerifyOptions {
        set: None,
        repair: true,
    };
    let r = verify::verify(&repo.settings(None), &repair).await.unwrap();
    let text = verify::render_text(&r);
    assert!(!r.ok && r.repaired.is_empty(), "{text}");
    assert_eq!(r.damaged_objects.len(), 2, "{text}");
    assert!(r.damaged_objects.iter().all(|d| !d.twin_intact), "{text}");
    assert!(!verdict(&r, FULL3).ok, "{text}");
}

async fn a_manifest_damaged_with_its_copy_fails_verify(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    for key in [
        layout::manifest(STANZA, FULL3),
        layout::manifest_copy(STANZA, FULL3),
    ] {
        repo.flip_byte(&key, 40).await;
    }
    let outcome = verify::verify(&repo.settings(None), &Default::default()).await;
    match outcome {
        Ok(r) => assert!(
            !r.ok && !verdict(&r, FULL3).ok,
            "{}",
            verify::render_text(&r)
        ),
        Err(e) => assert_eq!(e.exit_code(), 4, "{e}"),
    }
}

fn expire_options(full: u32) -> ExpireOptions {
    ExpireOptions {
        set: None,
        retention_full: Some(full),
        retention_full_type: RetentionType::Count,
        retention_diff: None,
        retention_archive: None,
        retention_window: None,
        dry_run: false,
    }
}

async fn expire_keeps_the_newest_fulls_and_frees_only_what_they_do_not_use(backend: Backend) {
    let (repo, m) = three_fulls(backend).await;
    let report = expire(&repo.settings(None), &expire_options(2))
        .await
        .unwrap();
    assert_eq!(report.expired, vec![FULL1.to_string()]);
    assert_eq!(repo.labels().await, vec![FULL2, FULL3]);
    assert_eq!(report.packs_deleted, 4, "FULL1's four packs");
    assert!(!repo.exists(&repo.pack_of(&m[0], "base/1/16384")).await);
    assert!(repo.exists(&repo.pack_of(&m[1], "base/1/16384")).await);
    // WAL before the oldest kept backup's start (segment 20) is gone, the rest stays.
    assert_eq!(report.wal_deleted, 10);
    assert!(!repo.exists(&repo.wal_key(19)).await);
    assert!(repo.exists(&repo.wal_key(20)).await);
    // What is kept still verifies: nothing referenced was removed.
    let r = verify_all(&repo).await;
    assert!(r.ok, "{}", verify::render_text(&r));
}

/// `expire --dry-run` names what an expire would remove, each backup with its rule, and
/// changes nothing (not one object); the expire that follows removes exactly that.
async fn expire_dry_run_says_what_would_go_and_why_and_changes_nothing(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let objects = || async {
        let all = repo.storage.list("").await.unwrap();
        all.into_iter().map(|o| o.key).collect::<Vec<_>>()
    };
    let before = objects().await;
    let dry = ExpireOptions {
        dry_run: true,
        ..expire_options(1)
    };
    let would = expire(&repo.settings(None), &dry).await.unwrap();
    assert!(would.dry_run);
    assert_eq!(would.expired, vec![FULL1.to_string(), FULL2.to_string()]);
    assert_eq!(
        would.reasons[FULL1],
        "older than the oldest of the 1 newest full backups (repo-retention-full=1)"
    );
    assert_eq!(would.wal_ranges.len(), 1, "{:?}", would.wal_ranges);
    assert_eq!(would.wal_ranges[0].first, fixture::segment_name(10));
    assert_eq!(would.wal_ranges[0].last, fixture::segment_name(29));
    assert!(
        would.packs_deleted > 0 && would.bytes_freed > 0,
        "{would:?}"
    );
    let text = pgstrata_engine::commands::expire::render_text(&would);
    assert!(text.contains("would expire 2 backup(s)"), "{text}");
    assert!(
        text.contains(&format!("backup {FULL2}: older than")),
        "{text}"
    );
    assert_eq!(objects().await, before, "a dry run changes nothing");
    assert_eq!(repo.labels().await, vec![FULL1, FULL2, FULL3]);

    let done = expire(&repo.settings(None), &expire_options(1))
        .await
        .unwrap();
    assert!(!done.dry_run);
    assert_eq!(done.expired, would.expired);
    assert_eq!(
        (done.packs_deleted, done.bytes_freed, done.wal_deleted),
        (would.packs_deleted, would.bytes_freed, would.wal_deleted)
    );
    assert_eq!(repo.labels().await, vec![FULL3]);
}

/// `repo-retention-window`: the newest backup that ended before the window began and
/// every one after stay, with continuous WAL from its start (even with a smaller
/// `repo-retention-archive`); with `repo-retention-full` too, the window keeps what that
/// rule alone would expire.
async fn a_retention_window_keeps_every_point_in_it_restorable(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    // The window begins at noon on the day of FULL2: FULL2 (ended that midnight) is the
    // newest backup that ended before it.
    let begins = chrono::DateTime::parse_from_rfc3339("2026-01-02T12:00:00Z").unwrap();
    let window = (chrono::Utc::now().timestamp() - begins.timestamp()) as u64;
    let o = ExpireOptions {
        retention_full: Some(1),
        retention_archive: Some(1),
        retention_window: Some(window),
        dry_run: true,
        ..expire_options(1)
    };
    // With repo-retention-full=1 alone FULL1 and FULL2 would go; the window keeps FULL2.
    let both = expire(&repo.settings(None), &o).await.unwrap();
    assert_eq!(both.expired, vec![FULL1.to_string()]);
    assert!(
        both.reasons[FULL1].contains("repo-retention-full=1"),
        "{both:?}"
    );
    // The window alone: the same backup, for the window's reason.
    let alone = ExpireOptions {
        retention_full: None,
        dry_run: false,
        ..o.clone()
    };
    let done = expire(&repo.settings(None), &alone).await.unwrap();
    assert_eq!(done.expired, vec![FULL1.to_string()]);
    assert!(
        done.reasons[FULL1].contains("ended before the window began"),
        "{done:?}"
    );
    assert_eq!(repo.labels().await, vec![FULL2, FULL3]);
    // repo-retention-archive=1 alone would keep only FULL3's WAL continuous and delete
    // 22..29; the window keeps every segment from FULL2's start.
    for segno in 20..=31 {
        assert!(repo.exists(&repo.wal_key(segno)).await, "segment {segno}");
    }
    assert!(!repo.exists(&repo.wal_key(19)).await);
    // A window older than every backup keeps them all.
    let wide = ExpireOptions {
        retention_window: Some(100 * 365 * 86400),
        ..alone
    };
    let none = expire(&repo.settings(None), &wide).await.unwrap();
    assert!(none.expired.is_empty(), "{none:?}");
}

/// A pinned backup outlives retention and `expire --set`; unpinned, it expires as any
/// other, and its annotation records go with it.
async fn a_pinned_backup_is_never_expired_until_unpinned(backend: Backend) {
    use pgstrata_engine::commands::annotate::{annotate, AnnotateOptions};
    let (repo, _) = three_fulls(backend).await;
    let s = repo.settings(None);
    let pin = |pin| AnnotateOptions {
        label: FULL1.into(),
        pin: Some(pin),
        ..Default::default()
    };
    let mut note = pin(true);
    note.set.insert("reason".into(), "audit 2026".into());
    let r = annotate(&s, &note).await.unwrap();
    assert!(r.pinned);
    assert_eq!(r.annotations["reason"], "audit 2026");
    let report = expire(&s, &expire_options(1)).await.unwrap();
    assert_eq!(report.expired, vec![FULL2.to_string()]);
    assert_eq!(repo.labels().await, vec![FULL1, FULL3]);
    // Still restorable: its WAL (segments 10 and 11) stays.
    assert!(repo.exists(&repo.wal_key(10)).await);
    let one = ExpireOptions {
        set: Some(FULL1.into()),
        ..expire_options(1)
    };
    let err = expire(&s, &one).await.unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(err.to_string().contains("pinned"), "{err}");

    assert!(!annotate(&s, &pin(false)).await.unwrap().pinned);
    let report = expire(&s, &expire_options(1)).await.unwrap();
    assert_eq!(report.expired, vec![FULL1.to_string()]);
    assert_eq!(repo.labels().await, vec![FULL3]);
    let left = repo
        .storage
        .list(&format!("{STANZA}/annotations/"))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

async fn expire_keeps_packs_an_incremental_references_in_an_expired_backup(backend: Backend) {
    let repo = Repo::on(backend).await;
    let big = content(9, 30_000);
    let full = repo
        .backup(&BackupSpec {
            label: FULL1,
            backup_type: BackupType::Full,
            prior: None,
            segments: (10, 10),
            files: &[("base/1/16384", &big), ("base/1/PG_VERSION", b"15\n")],
        })
        .await;
    // The second backup is a full (retention may expire the first) whose unchanged file
    // points into the first backup's pack, as an incremental's carried file does.
    let label2 = FULL2;
    let mut second = repo
        .backup(&BackupSpec {
            label: label2,
            backup_type: BackupType::Full,
            prior: None,
            segments: (20, 20),
            files: &[("base/1/PG_VERSION", b"15\n")],
        })
        .await;
    // Rewrite its manifest with a file whose extent is in FULL1's pack.
    repo.remove_all(&format!("{STANZA}/backup/{label2}/manifest"))
        .await;
    repo.remove(&layout::manifest(STANZA, label2)).await;
    repo.remove(&layout::manifest_copy(STANZA, label2)).await;
    let mut carried = fixture::file_entry(&full, "base/1/16384").clone();
    for c in carried.chunks.iter_mut() {
        c.backup = Some(FULL1.into());
    }
    second
        .entries
        .push(pgstrata_repo::manifest::Entry::File(Box::new(carried)));
    second.entries.sort_by(|a, b| a.path().cmp(b.path()));
    second
        .pack_codecs
        .insert(FULL1.into(), full.compression.kind);
    second.set_packs_used();
    second.publish(&repo.storage).await.unwrap();
    repo.archive_wal(10, 20).await;

    let report = expire(&repo.settings(None), &expire_options(1))
        .await
        .unwrap();
    assert_eq!(report.expired, vec![FULL1.to_string()]);
    let shared = repo.pack_of(&full, "base/1/16384");
    assert!(
        repo.exists(&shared).await,
        "a pack a kept backup references stays"
    );
    assert!(
        !repo.exists(&repo.pack_of(&full, "base/1/PG_VERSION")).await,
        "an unreferenced pack of the expired backup goes"
    );
    let target = tempfile::tempdir().unwrap();
    restore_into(&repo, FULL2, target.path()).await.unwrap();
    assert_eq!(
        std::fs::read(target.path().join("base/1/16384")).unwrap(),
        big
    );
}

/// Local only: the orphans' ages are set through their files' modification times.
#[tokio::test]
async fn expire_removes_an_old_orphan_pack_and_keeps_young_and_resumable_ones() {
    let (repo, _) = three_fulls(Backend::Local).await;
    // Packs of backups that never wrote their manifest (a crash).
    let plant = |label: &str, age_secs: u64| {
        let path = repo.path(&layout::pack(STANZA, label, "0-0"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"frames").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(age_secs))
            .unwrap();
        path
    };
    let old = plant("20260102-120000F", 2 * 3600);
    let young = plant("20260101-120000F", 60); // may be a backup running elsewhere
    let resumable = plant("20260104-000000F", 2 * 3600); // newer than every backup
    let report = expire(&repo.settings(None), &expire_options(3))
        .await
        .unwrap();
    assert!(report.expired.is_empty());
    assert!(
        !old.exists(),
        "an orphan pack older than an hour is removed"
    );
    assert_eq!(report.packs_deleted, 1);
    assert!(young.exists(), "a young one may belong to a running backup");
    assert!(
        resumable.exists(),
        "the next backup may resume the newest interrupted one"
    );
    assert_eq!(repo.labels().await, vec![FULL1, FULL2, FULL3]);
    assert!(verify_all(&repo).await.ok);
}

async fn expire_of_one_set_removes_exactly_that_backup(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let o = ExpireOptions {
        set: Some(FULL2.into()),
        ..expire_options(3)
    };
    let report = expire(&repo.settings(None), &o).await.unwrap();
    assert_eq!(report.expired, vec![FULL2.to_string()]);
    assert_eq!(repo.labels().await, vec![FULL1, FULL3]);
    assert!(verify_all(&repo).await.ok);
}

fn restore_options(set: &str) -> RestoreOptions {
    RestoreOptions {
        set: Some(set.into()),
        delta: false,
        force: false,
        dry_run: false,
        tablespace_map: vec![],
        tablespace_root: None,
        link_all: false,
        link_map: vec![],
        recovery_type: RecoveryType::Default,
        target: None,
        target_action: None,
        target_timeline: None,
        target_exclusive: false,
        archive_off: false,
        archive_get_command: "pgstrata".into(),
        db_include: vec![],
        db_exclude: vec![],
        recovery_options: vec![],
        instant: false,
    }
}

async fn restore_into(
    repo: &Repo,
    set: &str,
    target: &std::path::Path,
) -> pgstrata_engine::Result<pgstrata_engine::commands::restore::RestoreReport> {
    pgstrata_engine::commands::restore::restore(&repo.settings(Some(target)), &restore_options(set))
        .await
}

async fn restore_writes_every_file_of_the_chosen_backup(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let target = tempfile::tempdir().unwrap();
    let report = restore_into(&repo, FULL1, target.path()).await.unwrap();
    assert_eq!(report.label, FULL1);
    assert_eq!(report.counts.files_written, 4);
    for (path, bytes) in [
        ("base/1/16384", content(1, 20_000)),
        ("base/1/PG_VERSION", b"15\n".to_vec()),
        ("global/pg_control", content(2, 8192)),
        ("postgresql.conf", content(3, 100)),
    ] {
        assert_eq!(
            std::fs::read(target.path().join(path)).unwrap(),
            bytes,
            "{path}"
        );
    }
}

async fn restore_plan_chooses_the_newest_backup_and_writes_nothing(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let target = tempfile::tempdir().unwrap();
    let o = RestoreOptions {
        set: None,
        ..restore_options(FULL1)
    };
    let (plan, _) =
        pgstrata_engine::commands::restore::plan(&repo.settings(Some(target.path())), &o)
            .await
            .unwrap();
    assert_eq!(plan.header().label, FULL3);
    assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);
}

async fn restore_of_a_damaged_frame_fails_as_damage(backend: Backend) {
    let (repo, m) = three_fulls(backend).await;
    repo.flip_byte(&repo.pack_of(&m[0], "postgresql.conf"), 10)
        .await;
    let target = tempfile::tempdir().unwrap();
    let e = restore_into(&repo, FULL1, target.path()).await.unwrap_err();
    assert_eq!(e.exit_code(), 4, "{e}");
}

async fn info_lists_the_backups_oldest_first(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    let r = info::info(&repo.settings(None), None).await.unwrap();
    let text = info::render_text(&r);
    let at = |l: &str| text.find(l).unwrap_or_else(|| panic!("{l} in {text}"));
    assert!(at(FULL1) < at(FULL2) && at(FULL2) < at(FULL3), "{text}");
}

/// Read every file of backup `label` back the way restore does (frames fetched by ranged
/// reads, each checked against its recorded check), as `path -> bytes`.
async fn read_back(repo: &Repo, label: &str) -> pgstrata_repo::Result<Vec<(String, Vec<u8>)>> {
    let m = Manifest::load(&repo.storage, STANZA, label).await?;
    let mut reader = pgstrata_repo::pack::FrameReader::new(&repo.storage, &m);
    let mut files = vec![];
    for e in &m.entries {
        if let pgstrata_repo::manifest::Entry::File(f) = e {
            let chunks: Vec<_> = f.chunks.iter().collect();
            reader.load(&chunks, &f.path).await?;
            let mut bytes = vec![];
            for c in &f.chunks {
                bytes.extend_from_slice(reader.bytes(c)?);
            }
            files.push((f.path.to_string(), bytes));
        }
    }
    Ok(files)
}

async fn the_readers_read_back_what_was_written_and_catch_a_flipped_byte(backend: Backend) {
    let repo = Repo::on(backend).await;
    let (a, b) = (content(4, 50_000), content(5, 300));
    let m = repo
        .backup(&BackupSpec {
            label: FULL1,
            backup_type: BackupType::Full,
            prior: None,
            segments: (10, 10),
            files: &[("base/1/16384", &a), ("global/pg_control", &b)],
        })
        .await;
    let files = read_back(&repo, FULL1).await.unwrap();
    assert_eq!(
        files,
        vec![
            ("base/1/16384".to_string(), a),
            ("global/pg_control".to_string(), b)
        ]
    );
    // Damage one frame in the store: the read fails as damage, naming the file.
    let chunk = fixture::file_entry(&m, "global/pg_control").chunks[0].clone();
    let key = layout::pack(STANZA, FULL1, chunk.pack.unwrap().as_str());
    repo.flip_byte(&key, chunk.offset as i64 + 7).await;
    let e = read_back(&repo, FULL1).await.unwrap_err();
    assert_eq!(e.kind, pgstrata_repo::ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("global/pg_control"), "{e}");
}

async fn info_of(repo: &Repo) -> info::StanzaReport {
    info::info(&repo.settings(None), None).await.unwrap()
}

async fn a_backup_deleted_without_expire_is_reported_as_vanished(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    // This host looks (info), then an attacker deletes the newest backup's manifest, its
    // copy and its parts: the repository looks as if it never had it.
    assert!(info_of(&repo).await.vanished.is_empty());
    repo.remove_all(&format!("{STANZA}/backup/{FULL3}/manifest"))
        .await;
    repo.remove(&layout::manifest(STANZA, FULL3)).await;
    repo.remove(&layout::manifest_copy(STANZA, FULL3)).await;
    let r = info_of(&repo).await;
    assert_eq!(r.vanished.backups, vec![FULL3.to_string()]);
    let text = info::render_text(&r);
    assert!(
        text.contains(&format!("VANISHED: backup {FULL3} vanished")),
        "{text}"
    );
    let metrics = pgstrata_engine::commands::metrics::render_info(&r, 0);
    assert_eq!(metric(&metrics, "pgstrata_vanished_backups"), 1.0);
    // verify fails on it (exit 4), and keeps saying so.
    for _ in 0..2 {
        let v = verify_all(&repo).await;
        assert!(!v.ok, "{}", verify::render_text(&v));
        assert_eq!(v.vanished.backups, vec![FULL3.to_string()]);
    }
}

async fn an_expired_backup_has_not_vanished(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    assert!(info_of(&repo).await.vanished.is_empty());
    expire(&repo.settings(None), &expire_options(1))
        .await
        .unwrap();
    let r = info_of(&repo).await;
    assert!(r.vanished.is_empty(), "{:?}", r.vanished);
    let v = verify_all(&repo).await;
    assert!(v.ok, "{}", verify::render_text(&v));
    // The record names what went: two backups and the WAL before the kept one.
    let records = pgstrata_repo::expire_record::ExpireRecord::load_all(&repo.storage, STANZA)
        .await
        .unwrap();
    assert_eq!(records.records.len(), 1);
    assert_eq!(records.records[0].backups, vec![FULL1, FULL2]);
    assert!(records.expired_wal(&fixture::cluster().archive_id(), &fixture::segment_name(29)));
    assert!(!records.expired_wal(&fixture::cluster().archive_id(), &fixture::segment_name(30)));
}

async fn the_newest_wal_deleted_is_reported_as_vanished(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    assert!(verify_all(&repo).await.ok);
    for segno in 29..=31 {
        repo.remove(&repo.wal_key(segno)).await;
    }
    let v = verify_all(&repo).await;
    let names: Vec<String> = (29..=31).map(fixture::segment_name).collect();
    assert_eq!(v.vanished.wal, names, "{}", verify::render_text(&v));
    assert!(!v.ok);
    let r = info_of(&repo).await;
    let metrics = pgstrata_engine::commands::metrics::render_info(&r, 0);
    assert_eq!(metric(&metrics, "pgstrata_vanished_wal_segments"), 3.0);
}

async fn without_host_state_a_manifest_copy_left_alone_is_vanished(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    repo.remove(&layout::manifest(STANZA, FULL2)).await;
    let s = pgstrata_engine::Settings {
        state_path: None,
        ..repo.settings(None)
    };
    let r = info::info(&s, None).await.unwrap();
    assert_eq!(r.vanished.backups, vec![FULL2.to_string()]);
    // An expire --set of it records it: no longer reported.
    let o = ExpireOptions {
        set: Some(FULL2.into()),
        ..expire_options(3)
    };
    let report = expire(&s, &o).await.unwrap();
    assert_eq!(report.expired, vec![FULL2.to_string()]);
    assert!(!repo.exists(&layout::manifest_copy(STANZA, FULL2)).await);
    let r = info::info(&s, None).await.unwrap();
    assert!(r.vanished.is_empty(), "{:?}", r.vanished);
    assert!(verify_all(&repo).await.ok);
}

async fn an_expire_record_under_another_name_is_refused(backend: Backend) {
    let (repo, _) = three_fulls(backend).await;
    assert!(info_of(&repo).await.vanished.is_empty());
    // The attacker deletes FULL3 and plants a record claiming expire removed it, stored
    // under a name other than its own (as a replayed record would be).
    let mut forged = pgstrata_repo::expire_record::ExpireRecord::new(
        STANZA,
        "2026-01-04T00:00:00Z".into(),
        vec![FULL3.into()],
        vec![],
    );
    forged.name = "1-1".into();
    let key = layout::expire_record(STANZA, "2-2");
    repo.storage
        .put_new(&key, serde_json::to_vec(&forged).unwrap().into())
        .await
        .unwrap();
    repo.remove(&layout::manifest(STANZA, FULL3)).await;
    repo.remove(&layout::manifest_copy(STANZA, FULL3)).await;
    let r = info_of(&repo).await;
    assert_eq!(r.vanished.backups, vec![FULL3.to_string()]);
    assert_eq!(r.vanished.refused_records, vec![key]);
}

/// Local only: the objects' ages are set through their files' modification times.
#[tokio::test]
async fn expire_keeps_what_is_left_of_a_vanished_backup_until_expire_set_names_it() {
    let (repo, m) = three_fulls(Backend::Local).await;
    repo.remove(&layout::manifest(STANZA, FULL2)).await;
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    let copy = layout::manifest_copy(STANZA, FULL2);
    let pack = repo.pack_of(&m[1], "base/1/16384");
    for key in [&copy, &pack] {
        let f = std::fs::File::options()
            .write(true)
            .open(repo.path(key))
            .unwrap();
        f.set_modified(two_hours_ago).unwrap();
    }
    // By retention (all three kept): an old copy without its manifest would be a stray,
    // but no expire record names it, so it and its packs stay.
    expire(&repo.settings(None), &expire_options(3))
        .await
        .unwrap();
    assert!(repo.exists(&copy).await && repo.exists(&pack).await);
    let r = info_of(&repo).await;
    assert_eq!(r.vanished.backups, vec![FULL2.to_string()]);
    // expire --set names it: recorded, then removed.
    let o = ExpireOptions {
        set: Some(FULL2.into()),
        ..expire_options(3)
    };
    expire(&repo.settings(None), &o).await.unwrap();
    assert!(!repo.exists(&copy).await && !repo.exists(&pack).await);
    assert!(info_of(&repo).await.vanished.is_empty());
}

/// Each test `name(backend)` as `name::local` and `name::in_memory`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn local() {
                super::$name(super::Backend::Local).await
            }
            #[tokio::test]
            async fn in_memory() {
                super::$name(super::Backend::Memory).await
            }
        }
    )*};
}

on_both_backends!(
    a_clean_repository_verifies,
    verify_finds_a_flipped_byte_in_a_pack_frame,
    verify_finds_a_missing_pack,
    verify_finds_a_missing_wal_segment_as_a_gap_and_an_invalid_backup,
    verify_finds_a_damaged_wal_segment,
    a_manifest_damaged_with_its_copy_intact_restores_but_fails_verify,
    a_removed_manifest_copy_and_a_damaged_part_fail_verify,
    verify_repair_rewrites_damaged_twins_and_a_second_verify_passes,
    verify_repair_leaves_a_pair_damaged_twice_and_fails,
    a_manifest_damaged_with_its_copy_fails_verify,
    expire_keeps_the_newest_fulls_and_frees_only_what_they_do_not_use,
    expire_keeps_packs_an_incremental_references_in_an_expired_backup,
    expire_dry_run_says_what_would_go_and_why_and_changes_nothing,
    a_retention_window_keeps_every_point_in_it_restorable,
    a_pinned_backup_is_never_expired_until_unpinned,
    expire_of_one_set_removes_exactly_that_backup,
    restore_writes_every_file_of_the_chosen_backup,
    restore_plan_chooses_the_newest_backup_and_writes_nothing,
    restore_of_a_damaged_frame_fails_as_damage,
    info_lists_the_backups_oldest_first,
    the_readers_read_back_what_was_written_and_catch_a_flipped_byte,
    a_backup_deleted_without_expire_is_reported_as_vanished,
    an_expired_backup_has_not_vanished,
    the_newest_wal_deleted_is_reported_as_vanished,
    without_host_state_a_manifest_copy_left_alone_is_vanished,
    an_expire_record_under_another_name_is_refused,
);
