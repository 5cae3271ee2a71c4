//! Incrementals that learn changed blocks from the WAL: a randomized workload restored
//! exactly, every changed block listed by the maps, and gaps sending files back to hashing.

use crate::common::*;
use pgstrata_repo::manifest::{Manifest, Tracking};
use std::collections::BTreeMap;

/// A small deterministic generator (no dependency needed for test randomness).
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn manifest(env: &Env, label: &str) -> Manifest {
    manifest_with_maps(&env.repo, label)
}

/// Content hashes of every table except unlogged ones (their data is reset on recovery,
/// so a backup does not carry it).
fn logged_hashes(env: &Env) -> BTreeMap<String, String> {
    env.hashes()
        .into_iter()
        .filter(|(k, _)| {
            let name = k.rsplit('.').next().unwrap();
            env.sql(&format!(
                "SELECT relpersistence FROM pg_class WHERE relname = '{name}'"
            )) != "u"
        })
        .collect()
}

/// Fail over: a standby restored from backup `label` replays the archive, the primary
/// stops, the standby is promoted (timeline 2) and becomes `env.cluster`.
fn promote_standby(env: &mut Env, label: &str, ts_oid: &str) {
    env.flush_wal();
    let before = logged_hashes(env);
    let standby_dir = env.scratch.join("standby");
    run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", standby_dir.display()),
        "--type=standby",
        &format!("--set={label}"),
        &format!(
            "--tablespace-map={ts_oid}={}",
            env.scratch.join("ts-standby").display()
        ),
        "restore",
    ]));
    env.cluster.stop().unwrap();
    let mut standby =
        pgstrata_testkit::Cluster::adopt(&env.cluster.bin, &standby_dir, &env.scratch.path);
    standby.log_file = env.scratch.join("standby.log");
    standby.start().unwrap();
    standby.promote().unwrap();
    env.cluster = standby;
    // (pg_control_checkpoint() lags until the end-of-recovery checkpoint completes.)
    assert_eq!(
        env.sql("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"),
        "00000002"
    );
    assert_eq!(
        logged_hashes(env),
        before,
        "the promoted standby holds what the primary held"
    );
}

/// The randomized workload: between WAL-tracked incrementals, a random mix of DML,
/// VACUUM (FULL), TRUNCATE, CREATE/DROP TABLE and INDEX, SET TABLESPACE, unlogged tables and
/// CREATE DATABASE with both strategies, and one standby promotion; every backup restores
/// to exactly the data the source had when it was taken.
#[test]
fn randomized_workload_restores_exactly_from_wal_tracked_incrementals() {
    let mut env = Env::new("walrandom");
    env.create_tablespace("ts");
    env.sql("ALTER SYSTEM SET autovacuum = off");
    env.sql("SELECT pg_reload_conf()");
    for i in 0..4 {
        env.sql(&format!("CREATE TABLE t{i} (id int, v text)"));
        env.sql(&format!(
            "INSERT INTO t{i} SELECT g, md5(g::text) FROM generate_series(1, 20000) g"
        ));
    }
    env.stanza_create();
    env.backup(&["--type=full"]);
    let seed = std::env::var("PGSTRATA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261123);
    let mut rng = Rng(seed);
    let mut tables: Vec<String> = (0..4).map(|i| format!("t{i}")).collect();
    let mut next_table = 4;
    let mut next_db = 0;
    let mut backups: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    let ts_oid = env.sql("SELECT oid FROM pg_tablespace WHERE spcname = 'ts'");
    // The round that starts on the promoted standby (timeline 2).
    const PROMOTION_ROUND: usize = 2;
    for round in 0..5 {
        if round == PROMOTION_ROUND {
            let last = backups.last().unwrap().0.clone();
            promote_standby(&mut env, &last, &ts_oid);
        }
        for _ in 0..12 {
            let t = tables[rng.next(tables.len() as u64) as usize].clone();
            let sql = match rng.next(13) {
                0 | 1 => format!(
                    "INSERT INTO {t} SELECT g, md5(random()::text) FROM generate_series(1, {}) g",
                    1 + rng.next(3000)
                ),
                2 | 3 => format!(
                    "UPDATE {t} SET v = md5(v) WHERE id % {} = 0",
                    2 + rng.next(50)
                ),
                4 => format!(
                    "DELETE FROM {t} WHERE id BETWEEN {} AND {}",
                    rng.next(10000),
                    10000 + rng.next(5000)
                ),
                5 => format!("VACUUM {t}"),
                6 => format!("VACUUM FULL {t}"),
                7 => format!("TRUNCATE {t}"),
                8 => {
                    let name = format!("t{next_table}");
                    next_table += 1;
                    tables.push(name.clone());
                    let unlogged = if rng.next(3) == 0 { "UNLOGGED " } else { "" };
                    format!("CREATE {unlogged}TABLE {name} AS SELECT g AS id, repeat('p', 100) AS v FROM generate_series(1, 5000) g")
                }
                9 if tables.len() > 2 => {
                    tables.retain(|x| *x != t);
                    format!("DROP TABLE {t}")
                }
                10 => format!("CREATE INDEX IF NOT EXISTS {t}_v ON {t} (v)"),
                11 => format!(
                    "ALTER TABLE {t} SET TABLESPACE {}",
                    if rng.next(2) == 0 { "ts" } else { "pg_default" }
                ),
                _ => {
                    let strategy = if rng.next(2) == 0 {
                        "WAL_LOG"
                    } else {
                        "FILE_COPY"
                    };
                    next_db += 1;
                    format!("CREATE DATABASE db{next_db} STRATEGY {strategy}")
                }
            };
            env.sql(&sql);
        }
        let expected = logged_hashes(&env);
        if round == PROMOTION_ROUND {
            // The maps of timeline 1 do not cover timeline 2: the default --track=auto
            // hashes every block and says why.
            let label = env.backup(&["--type=incr"]);
            let m = manifest(&env, &label);
            assert_eq!(m.start.timeline, 2);
            assert_eq!(m.track, Some(Tracking::Hash));
            assert!(
                m.delta_reason
                    .as_deref()
                    .unwrap_or_default()
                    .contains("timeline changed from 1 to 2"),
                "{:?}",
                m.delta_reason
            );
            backups.push((label, expected));
            continue;
        }
        let label = env.backup(&["--type=incr", "--track=wal"]);
        let m = manifest(&env, &label);
        assert_eq!(
            m.track,
            Some(Tracking::Wal),
            "round {round}: {:?}",
            m.track_reason
        );
        backups.push((label, expected));
    }
    for (label, expected) in &backups {
        let ts_map = format!(
            "--tablespace-map={ts_oid}={}",
            env.scratch.join(&format!("ts-{label}")).display()
        );
        let c = env.restore_and_start(
            &format!("r-{label}"),
            &["--type=immediate", &format!("--set={label}"), &ts_map],
        );
        let got: BTreeMap<String, String> = c
            .content_hashes()
            .unwrap()
            .into_iter()
            .filter(|(k, _)| expected.contains_key(k))
            .collect();
        assert_eq!(
            &got, expected,
            "seed {seed}: restore of {label} equals the source at that backup"
        );
    }
}

/// On a quiet, then stopped cluster every block of every WAL-tracked file in the last
/// backup matches the file on disk: nothing the WAL changed was missed.
#[test]
fn wal_tracking_misses_no_changed_block() {
    let env = Env::new("walcheck");
    env.sql("ALTER SYSTEM SET autovacuum = off");
    env.sql("SELECT pg_reload_conf()");
    env.pgbench_init(5);
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "500", "-c", "2"]);
    env.sql("DELETE FROM pgbench_accounts WHERE aid BETWEEN 100000 AND 104000");
    env.sql("VACUUM pgbench_accounts");
    env.sql("CHECKPOINT");
    let label = env.backup(&["--type=incr", "--track=wal"]);
    env.cluster.stop().unwrap();
    let m = manifest(&env, &label);
    assert_eq!(m.track, Some(Tracking::Wal));
    assert!(m.stats.files_tracked > 0);
    // VACUUM changed free space and visibility maps: read whole, and info says so.
    assert!(
        m.stats
            .files_hashed
            .get("free space or visibility map")
            .is_some_and(|n| *n > 0),
        "{:?}",
        m.stats.files_hashed
    );
    let info = env.ok(&["info"]);
    assert!(
        info.contains("files hashed:") && info.contains("free space or visibility map"),
        "{info}"
    );
    let mut checked = 0;
    for f in m.files().filter(|f| f.hash.is_none()) {
        let data = std::fs::read(env.cluster.data.join(&*f.path)).unwrap();
        assert_eq!(data.len() as u64, f.size, "{}", f.path);
        for (i, block) in data.chunks(f.block_size as usize).enumerate() {
            assert_eq!(
                f.block_hash(i),
                Some(pgstrata_repo::manifest::block_hash(block)),
                "{} block {i} changed but the backup kept an older copy",
                f.path
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "checked {checked} blocks");
}

/// A missing or damaged map: the next incremental hashes files instead, says why, and
/// still restores exactly.
#[test]
fn a_gap_in_the_maps_falls_back_to_hashing() {
    let env = Env::new("walgap");
    env.pgbench_init(3);
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "300"]);
    env.flush_wal();
    // A damaged map (inside its segment's object; the WAL itself is intact).
    let maps = archived_maps(&env.repo);
    assert!(maps.len() >= 2, "{} maps", maps.len());
    let (last, mut bytes) = maps[maps.len() - 1].clone();
    let n = bytes.len() - 1;
    bytes[n] ^= 0xFF;
    rewrite_map(&env.repo, &last, Some(&bytes));
    let (code, err) = run_fail(env.cmd(&["--type=incr", "--track=wal", "--start-fast", "backup"]));
    assert_eq!(code, 3);
    assert!(
        err.contains("--track=wal") && err.contains("checksum"),
        "{err}"
    );
    let label = env.backup(&["--type=incr"]);
    let info = env.info_json();
    let b = info_backup(&info, &label);
    assert_eq!(b["track"], "hash");
    assert!(
        b["track_reason"].as_str().unwrap().contains("checksum"),
        "{b}"
    );
    let expected = env.hashes();
    drop(env.restore_set_exactly("gap", &label, &expected));

    // A missing map, for a segment PostgreSQL has already removed from pg_wal.
    let start_wal = manifest(&env, &label).start.wal;
    env.pgbench(&["-n", "-t", "300"]);
    env.flush_wal();
    env.sql("CHECKPOINT");
    assert!(
        !env.cluster.data.join("pg_wal").join(&start_wal).exists(),
        "CHECKPOINT removes archived segments from pg_wal"
    );
    // The segment as an older writer that crashed before its `.map` would have left it.
    let missing = archived_maps(&env.repo)
        .into_iter()
        .find(|(k, _)| k.ends_with(&start_wal))
        .expect("the map of the backup's start segment")
        .0;
    rewrite_map(&env.repo, &missing, None);
    refused_then_hashed(
        &env,
        &format!("{start_wal} has no block-change map"),
        "gap2",
    );
}

/// With a gap in the maps, `--track=wal` refuses naming `why`; the default `--track=auto`
/// hashes instead, records `why`, and restores exactly.
fn refused_then_hashed(env: &Env, why: &str, restore_name: &str) {
    let (code, err) = run_fail(env.cmd(&["--type=incr", "--track=wal", "--start-fast", "backup"]));
    assert_eq!(code, 3);
    assert!(err.contains(why), "{err}");
    let label = env.backup(&["--type=incr"]);
    let m = manifest(env, &label);
    assert_eq!(m.track, Some(Tracking::Hash));
    assert!(
        m.track_reason.as_deref().unwrap_or_default().contains(why),
        "{:?}",
        m.track_reason
    );
    let expected = env.hashes();
    env.restore_set_exactly(restore_name, &label, &expected);
}

/// A standby promotion (timeline switch) between backups: the first incremental on the new
/// timeline hashes every block and says why; the next one uses the WAL again; both restore
/// exactly.
#[test]
fn a_timeline_switch_forces_hashing_then_tracking_resumes() {
    let env = Env::new("promote");
    env.pgbench_init(3);
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    // A standby from the backup, fed from the archive; the old primary goes away.
    let standby_dir = env.scratch.join("standby");
    run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", standby_dir.display()),
        "--type=standby",
        &format!("--set={full}"),
        "restore",
    ]));
    env.pgbench(&["-n", "-t", "200"]);
    env.flush_wal();
    env.cluster.stop().unwrap();
    let standby =
        pgstrata_testkit::Cluster::adopt(&env.cluster.bin, &standby_dir, &env.scratch.path);
    standby.start().unwrap();
    standby.promote().unwrap();
    let on = |mut c: std::process::Command| {
        c.env("PGSTRATA_PG_PATH", &standby.data)
            .env("PGSTRATA_PG_HOST", &standby.socket_dir)
            .env("PGSTRATA_PG_PORT", standby.port.to_string());
        c
    };
    standby.pgbench(&["-n", "-t", "200", "postgres"]).unwrap();
    let first = run_ok(on(env.cmd(&["--type=incr", "--start-fast", "backup"])))
        .trim()
        .to_string();
    standby
        .psql(
            "postgres",
            "UPDATE pgbench_branches SET bbalance = bbalance + 1",
        )
        .unwrap();
    standby.psql("postgres", "CHECKPOINT").unwrap();
    let expected = standby.content_hashes().unwrap();
    let second = run_ok(on(env.cmd(&[
        "--type=incr",
        "--start-fast",
        "--track=wal",
        "backup",
    ])))
    .trim()
    .to_string();
    let m1 = manifest(&env, &first);
    assert_eq!(m1.start.timeline, 2);
    assert!(
        m1.delta_reason
            .as_deref()
            .unwrap_or_default()
            .contains("timeline"),
        "{:?}",
        m1.delta_reason
    );
    let m2 = manifest(&env, &second);
    assert_eq!(m2.track, Some(Tracking::Wal), "{:?}", m2.track_reason);
    standby.stop().unwrap();
    env.restore_set_exactly("after-promotion", &second, &expected);
}

/// PostgreSQL 17's own WAL summaries cross-check the maps: they list nothing the maps miss.
#[test]
fn postgresql_17_wal_summaries_agree_with_the_maps() {
    let bin = pgstrata_testkit::PgBin::major(17).expect("PostgreSQL 17 (run .ci/setup)");
    let env = Env::with_bin("summaries", &bin);
    env.sql("ALTER SYSTEM SET summarize_wal = on");
    env.sql("SELECT pg_reload_conf()");
    env.pgbench_init(2);
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    let full_start = env.info_json()["backups"][0]["start_lsn"]
        .as_str()
        .unwrap()
        .to_string();
    env.pgbench(&["-n", "-t", "300"]);
    env.sql("CHECKPOINT");
    // Wait for the summarizer to write a summary past the full backup's start.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while env.sql(&format!(
        "SELECT count(*) FROM pg_available_wal_summaries() WHERE start_lsn >= '{full_start}'"
    )) == "0"
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no WAL summary appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let incr = env.backup(&["--type=incr", "--track=wal"]);
    let m = manifest(&env, &incr);
    assert_eq!(m.prior.as_deref(), Some(full.as_str()));
    assert_eq!(m.track, Some(Tracking::Wal));
    assert_eq!(
        m.summary_check.as_deref(),
        Some("WAL summaries agree with the block-change maps"),
        "the server's summaries list nothing the maps missed"
    );
    let expected = env.hashes();
    env.restore_set_exactly("summaries", &incr, &expected);
}

/// Small records and 1 MiB segments: records whose block headers straddle a segment end
/// are common. archive-push of the next segment reads each such record whole and says so
/// in its map; where it could not (an older pgstrata: simulated by clearing the flag), the
/// incremental decodes the two segments itself, fetching them from the archive once
/// PostgreSQL has removed them. Both incrementals use the WAL, miss no changed block, and
/// restore exactly.
#[test]
fn records_cut_at_a_segment_end_are_read_across_the_boundary() {
    use pgstrata_repo::changemap::ChangeMap;
    let env = Env::with_initdb_args("waltail", &["--wal-segsize=1"]);
    env.sql("ALTER SYSTEM SET autovacuum = off");
    env.sql("SELECT pg_reload_conf()");
    env.sql("CREATE TABLE small (id int, v text)");
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    let maps_since = |from: &str| -> Vec<(String, ChangeMap)> {
        archived_maps(&env.repo)
            .into_iter()
            .filter(|(k, _)| k.rsplit('/').next().unwrap() >= from)
            .map(|(k, bytes)| {
                let m = ChangeMap::decode(&bytes, &k).unwrap();
                (k, m)
            })
            .collect()
    };
    // One heap-insert record (~70 bytes, half of it headers) per row, until a segment ends
    // inside a record's block headers. Every round starts on a fresh segment (the WAL switch
    // of flush_wal): a first row of varying width moves the boundaries.
    let write_until_cut = |from: &str| -> usize {
        for round in 0..40 {
            env.sql(&format!(
                "INSERT INTO small VALUES (0, repeat('y', {}))",
                8 * round
            ));
            env.sql("INSERT INTO small SELECT g, 'x' FROM generate_series(1, 20000) g");
            env.flush_wal();
            let cut = maps_since(from)
                .iter()
                .filter(|(_, m)| m.incomplete_tail)
                .count();
            if cut >= 1 {
                return cut;
            }
        }
        panic!("no segment ended inside a record's block headers");
    };

    // 1. archive-push completed the cut records. `check` (flush_wal) returns once the
    // switched segment is stored; the segment after it, whose map completes the cut
    // record, may still be on its way.
    let full_start = manifest(&env, &full).start.wal;
    write_until_cut(&full_start);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !maps_since(&full_start)
        .iter()
        .any(|(_, m)| m.completes_previous)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "archive-push read a cut record whole"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    env.sql("CHECKPOINT");
    let first = env.backup(&["--type=incr", "--track=wal"]);
    let m = manifest(&env, &first);
    assert_eq!(m.track, Some(Tracking::Wal), "{:?}", m.track_reason);

    // 2. Maps that do not complete their predecessor, segments gone from pg_wal.
    let first_start = m.start.wal;
    let cut = write_until_cut(&first_start);
    for (key, mut map) in maps_since(&first_start) {
        if map.completes_previous {
            map.completes_previous = false;
            rewrite_map(&env.repo, &key, Some(&map.encode()));
        }
    }
    env.sql("VACUUM small");
    env.sql("CHECKPOINT");
    env.flush_wal();
    env.sql("CHECKPOINT");
    let expected = env.hashes();
    let label = env.backup(&["--type=incr", "--track=wal"]);
    env.cluster.stop().unwrap();
    let m = manifest(&env, &label);
    assert_eq!(m.track, Some(Tracking::Wal), "{:?}", m.track_reason);
    let mut checked = 0;
    for f in m.files().filter(|f| f.hash.is_none()) {
        let data = std::fs::read(env.cluster.data.join(&*f.path)).unwrap();
        for (i, block) in data.chunks(f.block_size as usize).enumerate() {
            assert_eq!(
                f.block_hash(i),
                Some(pgstrata_repo::manifest::block_hash(block)),
                "{} block {i} changed but the backup kept an older copy ({cut} cut maps)",
                f.path,
            );
            checked += 1;
        }
    }
    assert!(checked > 0);
    env.restore_set_exactly("tail", &label, &expected);
}

/// A restart with wal_level=minimal between backups: the parameter-change record in the WAL
/// sends the next incremental back to hashing, with the reason, and it restores exactly.
#[test]
fn wal_written_at_wal_level_minimal_falls_back_to_hashing() {
    let env = Env::new("walminimal");
    env.sql("CREATE TABLE kept AS SELECT g AS id FROM generate_series(1, 10000) g");
    env.stanza_create();
    env.backup(&["--type=full"]);
    let restart = || {
        env.cluster.stop().unwrap();
        env.cluster.start().unwrap();
    };
    for sql in [
        "ALTER SYSTEM SET wal_level = minimal",
        "ALTER SYSTEM SET archive_mode = off",
        "ALTER SYSTEM SET max_wal_senders = 0",
    ] {
        env.sql(sql);
    }
    restart();
    assert_eq!(env.sql("SHOW wal_level"), "minimal");
    // A relation file created and filled in one transaction: at minimal it is synced at
    // commit instead of WAL-logged.
    env.sql(
        "BEGIN; CREATE TABLE unlogged_at_minimal (id int, v text); \
         INSERT INTO unlogged_at_minimal SELECT g, repeat('m', 200) FROM generate_series(1, 40000) g; COMMIT",
    );
    env.sql("UPDATE kept SET id = id + 1 WHERE id % 10 = 0");
    for sql in [
        "ALTER SYSTEM RESET wal_level",
        "ALTER SYSTEM RESET archive_mode",
        "ALTER SYSTEM RESET max_wal_senders",
    ] {
        env.sql(sql);
    }
    restart();
    env.flush_wal();
    refused_then_hashed(&env, "wal_level=minimal", "minimal");
}

/// A file that changed in a few blocks gets a delta map over its prior map, without that
/// map being read; deltas chain, a file changed throughout gets a whole map again, and
/// every backup of the chain restores (whole and as a delta restore), verifies, and
/// survives the expiry of the full backup that holds the chain's whole map.
#[test]
fn few_changed_blocks_are_stored_as_delta_maps_that_chain() {
    let env = Env::new("deltamaps");
    env.sql("ALTER SYSTEM SET autovacuum = off");
    env.sql("SELECT pg_reload_conf()");
    env.sql("CREATE TABLE big (id int PRIMARY KEY, v text) WITH (fillfactor = 90)");
    env.sql("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 150000) g");
    // Hint bits set now, not by the first read after a backup (with page checksums, each
    // page's first hint after a checkpoint is WAL-logged: a change of every block).
    env.sql("VACUUM (FREEZE) big");
    let path = env.sql("SELECT pg_relation_filepath('big')");
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    let depth_of = |label: &str| {
        let m = manifest(&env, label);
        let f = m
            .files()
            .find(|f| *f.path == *path)
            .expect("the table's file");
        assert!(f.map.is_some(), "{path} has its map stored apart");
        f.map_depth
    };
    assert_eq!(depth_of(&full), 0);

    let mut backups: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    for round in 1..=3u8 {
        env.sql(&format!(
            "UPDATE big SET v = 'round {round}' WHERE id IN ({}, {}, {})",
            round as u32 * 1000,
            round as u32 * 40000,
            149_990 + round as u32
        ));
        let label = env.backup(&["--type=incr", "--track=wal"]);
        assert_eq!(depth_of(&label), round, "round {round}");
        backups.push((label, env.hashes()));
    }
    // Every row changed: a whole map again.
    env.sql("UPDATE big SET v = md5(v)");
    let whole = env.backup(&["--type=incr", "--track=wal"]);
    assert_eq!(depth_of(&whole), 0);
    backups.push((whole, env.hashes()));

    env.ok(&["verify"]);
    env.ok(&[&format!("--set={full}"), "expire"]);
    env.ok(&["verify"]);
    for (label, expected) in &backups {
        env.restore_set_exactly(&format!("r-{label}"), label, expected)
            .stop()
            .unwrap();
    }
    // A delta restore of the deepest chain over the first delta's restore.
    let (first, _) = &backups[0];
    let (deepest, expected) = &backups[2];
    let target = env.scratch.join(&format!("r-{first}"));
    run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", target.display()),
        "--process-max=2",
        "--archive-mode=off",
        "--delta",
        "--type=immediate",
        "--target-action=promote",
        &format!("--set={deepest}"),
        "restore",
    ]));
    let c = pgstrata_testkit::Cluster::adopt(&env.cluster.bin, &target, &env.scratch.path);
    c.start().unwrap();
    c.wait_for_promotion(std::time::Duration::from_secs(180))
        .unwrap();
    assert_eq!(
        &c.content_hashes().unwrap(),
        expected,
        "delta restore of {deepest}"
    );
    c.stop().unwrap();
}
