//! The WAL decoder on WAL written by real servers of PostgreSQL 14, 15, 17 and 18: every
//! record's CRC checks out, and the blocks and files a workload changed are all reported.

use crate::common::*;
use pgstrata_pg::wal::{decode_segment, RelFork, SegmentChanges};
use pgstrata_testkit::PgBin;

fn merge(into: &mut SegmentChanges, s: SegmentChanges) {
    for (k, v) in s.blocks {
        into.blocks.entry(k).or_default().extend(v);
    }
    into.created.extend(s.created);
    into.truncated.extend(s.truncated);
    into.dropped.extend(s.dropped);
    into.databases.extend(s.databases);
    into.records += s.records;
    into.incomplete_tail |= s.incomplete_tail;
}

fn decode_workload(major: u32, wal_compression: &str) {
    let bin = if major == 15 {
        PgBin::default_install()
    } else {
        PgBin::major(major)
    }
    .unwrap_or_else(|e| panic!("PostgreSQL {major} (run .ci/setup): {e}"));
    let env = Env::with_bin(&format!("wal{major}"), &bin);
    // Compressed full-page images must be skipped correctly (the image flags moved in 15).
    env.sql(&format!(
        "ALTER SYSTEM SET wal_compression = '{wal_compression}'"
    ));
    env.sql("SELECT pg_reload_conf()");
    env.stanza_create();
    env.sql("CREATE TABLE t (id int, pad text)");
    env.sql("INSERT INTO t SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g");
    env.sql("CHECKPOINT"); // the next changes write full-page images
    env.sql("UPDATE t SET pad = 'y' WHERE id % 1000 = 0");
    env.sql("CREATE TABLE doomed AS SELECT g FROM generate_series(1, 1000) g");
    let doomed = env.sql("SELECT relfilenode FROM pg_class WHERE relname = 'doomed'");
    env.sql("DROP TABLE doomed");
    env.sql("TRUNCATE t");
    env.sql("INSERT INTO t SELECT g, 'z' FROM generate_series(1, 100) g");
    let strategy = if major >= 15 {
        " STRATEGY FILE_COPY"
    } else {
        ""
    };
    env.sql(&format!("CREATE DATABASE copied{strategy}"));
    // A record bigger than a page, so records span pages (and likely segments).
    env.sql("CREATE TABLE big (b text)");
    env.sql("INSERT INTO big SELECT string_agg(md5(g::text), '') FROM generate_series(1, 2000) g");
    env.flush_wal();

    let info = env.info_json();
    let (first, last) = (
        info["archive_min"].as_str().unwrap().to_string(),
        info["archive_max"].as_str().unwrap().to_string(),
    );
    let seg_size = 16u64 << 20;
    let (tli, a) = pgstrata_pg::lsn::parse_segment_name(&first, seg_size).unwrap();
    let (_, b) = pgstrata_pg::lsn::parse_segment_name(&last, seg_size).unwrap();
    let mut all = SegmentChanges::default();
    let mut switched = 0;
    for segno in a..=b {
        let name = pgstrata_pg::lsn::segment_name(tli, segno, seg_size);
        let dest = env.scratch.join(&name);
        run_ok(env.cmd(&["archive-get", &name, dest.to_str().unwrap()]));
        let bytes = std::fs::read(&dest).unwrap();
        let s = decode_segment(&bytes, major, 8192)
            .unwrap_or_else(|e| panic!("PG{major} segment {name}: {e}"));
        switched += s.switched as u32;
        merge(&mut all, s);
    }
    assert!(all.records > 1000, "decoded {} records", all.records);
    assert!(switched > 0, "WAL switches are recognised");
    assert!(
        !all.incomplete_tail,
        "block headers never cut at a segment end here"
    );

    let db: u32 = env
        .sql("SELECT oid FROM pg_database WHERE datname = 'postgres'")
        .parse()
        .unwrap();
    let t_new: u32 = env
        .sql("SELECT relfilenode FROM pg_class WHERE relname = 't'")
        .parse()
        .unwrap();
    let main = |rel: u32| RelFork {
        spc: 1663,
        db,
        rel,
        fork: 0,
    };
    // TRUNCATE gave t a new relfilenode, created by SMGR create and filled block by block.
    assert!(
        all.created.contains(&main(t_new)),
        "SMGR create of the truncated table's new file"
    );
    assert!(all.blocks[&main(t_new)].contains(&0));
    // The dropped table's file is reported at commit.
    let doomed: u32 = doomed.parse().unwrap();
    assert!(
        all.dropped.contains(&(1663, db, doomed)),
        "DROP TABLE reported: {:?}",
        all.dropped
    );
    // CREATE DATABASE by file copy changes a whole directory without block WAL.
    let copied: u32 = env
        .sql("SELECT oid FROM pg_database WHERE datname = 'copied'")
        .parse()
        .unwrap();
    assert!(
        all.databases.contains(&(1663, copied)),
        "CREATE DATABASE (file copy) reported"
    );
    // The big row went to a TOAST table: many blocks of some relation of this database.
    assert!(all.blocks.iter().any(|(k, v)| k.db == db && v.len() > 10));

    // archive-push stored a block-change map inside every segment's object, saying the same.
    let maps = archived_maps(&env.repo);
    assert_eq!(
        maps.len() as u64,
        b - a + 1,
        "one map per archived segment: {:?}",
        maps.iter().map(|(k, _)| k).collect::<Vec<_>>()
    );
    assert!(
        !tree(&env.repo).keys().any(|k| k.ends_with(".map")),
        "a plain stanza stores no .map objects"
    );
    let mut from_maps = std::collections::BTreeSet::new();
    for (k, bytes) in &maps {
        let m = pgstrata_repo::changemap::ChangeMap::decode(bytes, k).unwrap();
        assert!(m.complete().is_ok(), "{k}: {:?}", m.complete());
        for f in m.blocks.iter().filter(|f| f.rel == t_new && f.fork == 0) {
            from_maps.extend(f.runs.iter().flat_map(|(s, n)| *s..s + n));
        }
    }
    assert_eq!(
        &from_maps,
        &all.blocks[&main(t_new)],
        "maps list the decoded blocks"
    );
    // A damaged map is detected, not trusted.
    let mut bytes = maps[0].1.clone();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x20;
    assert!(pgstrata_repo::changemap::ChangeMap::decode(&bytes, "damaged").is_err());
}

#[test]
fn decodes_postgresql_14_wal() {
    decode_workload(14, "on"); // PG14 knows only on (pglz) and off
}

#[test]
fn decodes_postgresql_15_wal_lz4() {
    decode_workload(15, "lz4");
}

#[test]
fn decodes_postgresql_15_wal_zstd() {
    decode_workload(15, "zstd");
}

#[test]
fn decodes_postgresql_17_wal() {
    // The npm builds of 17 and 18 have neither lz4 nor zstd; Debian's 15 has both.
    decode_workload(17, "pglz");
}

#[test]
fn decodes_postgresql_18_wal() {
    decode_workload(18, "pglz");
}
