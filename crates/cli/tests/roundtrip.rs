//! Backups of live clusters restored and compared with the source: under load, at PITR
//! targets, with a tablespace, with every codec, and on a second PostgreSQL major.

use crate::common::*;
use std::os::unix::fs::MetadataExt;

#[test]
fn full_backup_under_load_restores_exactly() {
    let env = Env::new("load");
    env.pgbench_init(10);
    env.stanza_create();
    let mut load = env
        .cluster
        .pgbench_spawn(&["-n", "-c", "2", "-T", "600", "postgres"])
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let label = env.backup(&[]);
    load.kill().unwrap();
    load.wait().unwrap();
    // The state to compare with: the source after the load, marked by a restore point.
    let expected = env.hashes();
    env.sql("SELECT pg_create_restore_point('after_load')");
    env.flush_wal();

    let info = env.info_json();
    let b = &info["backups"][0];
    assert_eq!(b["label"], label.as_str());
    assert_eq!(
        b["page_errors"], 0,
        "a healthy cluster has no page checksum errors"
    );
    assert!(b["database_size"].as_u64().unwrap() > 100 << 20);

    let restored = env.restore_and_start("restored", &["--type=name", "--target=after_load"]);
    assert_eq!(
        restored.content_hashes().unwrap(),
        expected,
        "restored data equals the source"
    );
    restored.stop().unwrap();
    pg_checksums_ok(&restored);
    if pgstrata_testkit::is_root() {
        // Restored as root: files belong to the cluster's owner.
        let owner = std::fs::metadata(env.cluster.data.join("PG_VERSION"))
            .unwrap()
            .uid();
        for f in [
            "PG_VERSION",
            "global/pg_control",
            "base",
            "backup_label.old",
        ] {
            let p = restored.data.join(f);
            if p.exists() {
                assert_eq!(
                    std::fs::metadata(&p).unwrap().uid(),
                    owner,
                    "{f} owned by the cluster's owner"
                );
            }
        }
    }
}

#[test]
fn point_in_time_restore_to_time_lsn_xid_and_name() {
    let env = Env::new("pitr");
    env.sql("CREATE TABLE t (id int primary key, v text)");
    env.stanza_create();
    env.backup(&[]);

    env.sql("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 1000) g");
    let at_name = env.hashes();
    env.sql("SELECT pg_create_restore_point('rp1')");

    let xid = env
        .cluster
        .psql(
            "postgres",
            "INSERT INTO t SELECT g, 'b' FROM generate_series(1001, 2000) g; SELECT txid_current()",
        )
        .unwrap();
    let at_xid = env.hashes();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let time = env.sql(
        "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00'",
    );
    let at_time = at_xid.clone();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    env.sql("UPDATE t SET v = 'c' WHERE id <= 500");
    let lsn = env.sql("SELECT pg_current_wal_lsn()");
    let at_lsn = env.hashes();
    env.sql("DELETE FROM t WHERE id > 1500");
    env.flush_wal();

    for (name, args, expected) in [
        (
            "name",
            vec!["--type=name".to_string(), "--target=rp1".to_string()],
            &at_name,
        ),
        (
            "xid",
            vec!["--type=xid".into(), format!("--target={}", xid.trim())],
            &at_xid,
        ),
        (
            "time",
            vec!["--type=time".into(), format!("--target={time}")],
            &at_time,
        ),
        (
            "lsn",
            vec!["--type=lsn".into(), format!("--target={lsn}")],
            &at_lsn,
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let c = env.restore_and_start(&format!("pitr-{name}"), &args);
        assert_eq!(
            &c.content_hashes().unwrap(),
            expected,
            "restore to {name} target"
        );
        c.stop().unwrap();
    }
}

#[test]
fn tablespace_outside_the_data_directory_is_restored_and_remapped() {
    let env = Env::new("tblspc");
    env.create_tablespace("ts1");
    env.sql("CREATE TABLE in_ts TABLESPACE ts1 AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 20000) g");
    env.sql("CREATE TABLE in_base AS SELECT g AS id FROM generate_series(1, 100) g");
    let oid = env.sql("SELECT oid FROM pg_tablespace WHERE spcname = 'ts1'");
    env.stanza_create();
    env.backup(&[]);
    let expected = env.hashes();

    // The original location is in use: restoring there without --delta/--force is refused.
    let target = env.scratch.join("refused");
    let (_, err) =
        run_fail(env.cmd_as_invoker(&[&format!("--pg-path={}", target.display()), "restore"]));
    assert!(err.contains("not empty") && err.contains("ts1"), "{err}");

    let new_ts = env.scratch.join("ts1-moved");
    let c = env.restore_and_start(
        "remapped",
        &[
            "--type=immediate",
            &format!("--tablespace-map={oid}={}", new_ts.display()),
        ],
    );
    let link = std::fs::read_link(c.data.join(format!("pg_tblspc/{oid}"))).unwrap();
    assert_eq!(link, new_ts, "tablespace link points at the new location");
    assert!(
        std::fs::read_dir(&new_ts).unwrap().count() > 0,
        "tablespace files restored there"
    );
    assert_eq!(c.content_hashes().unwrap(), expected);
    let loc = c
        .psql("postgres", &format!("SELECT pg_tablespace_location({oid})"))
        .unwrap();
    assert_eq!(loc, new_ts.display().to_string());
    c.stop().unwrap();

    // --tablespace-map-all: every tablespace under one directory, by OID.
    let all = env.scratch.join("all-ts");
    let c = env.restore_and_start(
        "mapped-all",
        &[
            "--type=immediate",
            &format!("--tablespace-map-all={}", all.display()),
        ],
    );
    let link = std::fs::read_link(c.data.join(format!("pg_tblspc/{oid}"))).unwrap();
    assert_eq!(link, all.join(&oid));
    assert_eq!(c.content_hashes().unwrap(), expected);
    c.stop().unwrap();
}

/// The data directory's own links (pg_wal and a log directory on other disks, a
/// configuration file kept elsewhere): restored as what they pointed to by default, as
/// links with --link-all (refused where the source's targets are in use), and pointing
/// elsewhere with --link-map; each restored cluster starts with the source's data.
#[test]
fn data_directory_links_are_restored_as_asked() {
    let env = Env::new("links");
    env.cluster.stop().unwrap();
    let data = env.cluster.data.clone();
    let outside = |name: &str| {
        let p = env.scratch.join(name);
        std::fs::create_dir_all(&p).unwrap();
        pgstrata_testkit::give_to_pg_user(&p);
        p
    };
    let (wal, log, conf) = (outside("wal"), outside("log"), outside("conf"));
    for e in std::fs::read_dir(data.join("pg_wal")).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), wal.join(e.file_name())).unwrap();
    }
    std::fs::remove_dir(data.join("pg_wal")).unwrap();
    std::os::unix::fs::symlink(&wal, data.join("pg_wal")).unwrap();
    std::fs::write(log.join("old.log"), "a log line\n").unwrap();
    pgstrata_testkit::give_to_pg_user(&log.join("old.log"));
    std::os::unix::fs::symlink(&log, data.join("log")).unwrap();
    std::fs::rename(data.join("pg_ident.conf"), conf.join("pg_ident.conf")).unwrap();
    std::os::unix::fs::symlink(conf.join("pg_ident.conf"), data.join("pg_ident.conf")).unwrap();
    env.cluster.start().unwrap();
    env.pgbench_init(1);
    env.stanza_create();
    env.backup(&["--type=full"]);
    let expected = env.hashes();
    let ident = std::fs::read(conf.join("pg_ident.conf")).unwrap();

    // By default: real directories and files in the data directory.
    let c = env.restore_and_start("plain", &["--type=immediate"]);
    assert!(std::fs::symlink_metadata(c.data.join("pg_wal"))
        .unwrap()
        .is_dir());
    assert!(std::fs::symlink_metadata(c.data.join("pg_ident.conf"))
        .unwrap()
        .is_file());
    assert_eq!(
        std::fs::read(c.data.join("log/old.log")).unwrap(),
        b"a log line\n"
    );
    assert_eq!(c.content_hashes().unwrap(), expected);
    c.stop().unwrap();

    // --link-all alone would write into the source's pg_wal, which is in use.
    let target = env.scratch.join("refused");
    let (code, err) = run_fail(env.cmd_as_invoker(&[
        &format!("--pg-path={}", target.display()),
        "--link-all",
        "restore",
    ]));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("not empty") && err.contains("--link-map=pg_wal="),
        "{err}"
    );

    let (wal2, log2, conf2) = (
        env.scratch.join("wal2"),
        env.scratch.join("log2"),
        env.scratch.join("conf2/ident"),
    );
    let c = env.restore_and_start(
        "linked",
        &[
            "--type=immediate",
            "--link-all",
            &format!("--link-map=pg_wal={}", wal2.display()),
            &format!("--link-map=log={}", log2.display()),
            &format!("--link-map=pg_ident.conf={}", conf2.display()),
        ],
    );
    assert_eq!(std::fs::read_link(c.data.join("pg_wal")).unwrap(), wal2);
    assert_eq!(std::fs::read_link(c.data.join("log")).unwrap(), log2);
    assert_eq!(
        std::fs::read_link(c.data.join("pg_ident.conf")).unwrap(),
        conf2
    );
    assert_eq!(std::fs::read(&conf2).unwrap(), ident);
    // ...which the cluster's owner reads through the link, as the server does.
    let through_link = std::process::Command::new("runuser")
        .args(["-u", "postgres", "--", "cat"])
        .arg(c.data.join("pg_ident.conf"))
        .output()
        .unwrap();
    if pgstrata_testkit::is_root() {
        assert!(through_link.stdout == ident, "{through_link:?}");
    }
    assert_eq!(
        std::fs::read(log2.join("old.log")).unwrap(),
        b"a log line\n"
    );
    assert!(
        std::fs::read_dir(&wal2).unwrap().count() > 1,
        "the restored cluster writes its WAL through the link"
    );
    assert_eq!(c.content_hashes().unwrap(), expected);
    c.stop().unwrap();
    // The source's own targets were not touched.
    assert_eq!(std::fs::read(conf.join("pg_ident.conf")).unwrap(), ident);
}

#[test]
fn every_codec_backs_up_and_restores() {
    let env = Env::new("codecs");
    env.pgbench_init(1);
    env.stanza_create();
    let expected = env.hashes();
    let mut labels = vec![];
    for codec in ["none", "gz", "lz4", "zst", "bz2"] {
        labels.push((
            codec,
            env.backup(&["--type=full", &format!("--compress-type={codec}")]),
        ));
        std::thread::sleep(std::time::Duration::from_millis(1000));
    }
    let info = env.info_json();
    let size_of = |label: &str| info_backup(&info, label)["stored_size"].as_u64().unwrap();
    let none_size = size_of(&labels[0].1);
    for (codec, label) in &labels {
        if *codec != "none" {
            assert!(
                size_of(label) < none_size / 2,
                "{codec} compresses pgbench data"
            );
        }
        let c = env.restore_and_start(
            &format!("codec-{codec}"),
            &["--type=immediate", &format!("--set={label}")],
        );
        assert_eq!(
            c.content_hashes().unwrap(),
            expected,
            "{codec} restore equals the source"
        );
        c.stop().unwrap();
    }
}

/// A backup, a WAL-tracked incremental and a PITR restore on another major: PG14 uses the
/// older pg_start_backup/pg_stop_backup calls and WAL format flags, PG17 moved pg_control's
/// version, PG18 its CRC.
fn round_trip_on_major(major: u32) {
    let bin = pgstrata_testkit::PgBin::major(major)
        .unwrap_or_else(|e| panic!("PostgreSQL {major} binaries (run .ci/setup): {e}"));
    let env = Env::with_bin(&format!("pg{major}"), &bin);
    // Compressed full-page images in the WAL the incremental learns from (PG14 knows only
    // on = pglz).
    let compression = if major == 14 { "on" } else { "pglz" };
    env.sql(&format!(
        "ALTER SYSTEM SET wal_compression = '{compression}'"
    ));
    env.sql("SELECT pg_reload_conf()");
    env.pgbench_init(2);
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.sql("DELETE FROM pgbench_accounts WHERE aid % 7 = 0");
    env.sql("CHECKPOINT");
    let incr = env.backup(&["--type=incr", "--track=wal"]);
    env.sql("INSERT INTO pgbench_history SELECT 1, 1, g, 1, now() FROM generate_series(1, 500) g");
    env.sql(&format!("SELECT pg_create_restore_point('pg{major}')"));
    let expected = env.hashes();
    env.flush_wal();
    let info = env.info_json();
    assert_eq!(info["pg_version"], major);
    assert_eq!(
        info["backups"][1]["page_errors"], 0,
        "checksums verified without false alarms"
    );
    assert_eq!(info["backups"][1]["track"], "wal", "{}", info["backups"][1]);
    assert!(info["backups"][1]["files_tracked"].as_u64().unwrap() > 0);
    let c = env.restore_and_start(
        &format!("restored{major}"),
        &[
            "--type=name",
            &format!("--target=pg{major}"),
            &format!("--set={incr}"),
        ],
    );
    let version = c.psql("postgres", "SHOW server_version_num").unwrap();
    assert_eq!(version[..2].to_string(), major.to_string());
    assert_eq!(c.content_hashes().unwrap(), expected);
}

#[test]
fn postgresql_14_round_trip() {
    round_trip_on_major(14);
}

#[test]
fn postgresql_17_round_trip() {
    round_trip_on_major(17);
}

#[test]
fn postgresql_18_round_trip() {
    round_trip_on_major(18);
}
