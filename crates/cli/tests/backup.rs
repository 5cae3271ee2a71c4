//! backup: what the walk finds (in-place tablespaces) and the last check before the manifest
//! makes a backup visible.

use crate::common::*;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

#[test]
fn in_place_tablespace_is_backed_up_and_restored() {
    let env = Env::new("inplace_ts");
    env.sql("ALTER SYSTEM SET allow_in_place_tablespaces = on");
    env.sql("SELECT pg_reload_conf()");
    env.sql("CREATE TABLESPACE inplace LOCATION ''");
    env.sql("CREATE TABLE in_place TABLESPACE inplace AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 20000) g");
    let oid = env.sql("SELECT oid FROM pg_tablespace WHERE spcname = 'inplace'");
    env.stanza_create();
    env.backup(&["--type=full"]);
    // An incremental finds the tablespace's changed blocks like any other relation's.
    env.sql("UPDATE in_place SET v = 'changed' WHERE id % 100 = 0");
    env.backup(&["--type=incr"]);
    let expected = env.hashes();

    let c = env.restore_and_start("restored", &["--type=immediate"]);
    let restored = c.data.join(format!("pg_tblspc/{oid}"));
    let md = std::fs::symlink_metadata(&restored).unwrap();
    assert!(
        md.is_dir(),
        "{} is restored as a directory",
        restored.display()
    );
    assert_eq!(c.content_hashes().unwrap(), expected);
    assert_eq!(
        c.psql(
            "postgres",
            "SELECT count(*) FROM in_place WHERE v = 'changed'"
        )
        .unwrap(),
        "200"
    );
}

/// The incremental's copy is done and it waits for its WAL to be archived (held back by a
/// failing archive_command) when the full's packs are deleted, as an expire that ignored the
/// lock would: the backup refuses to write a manifest that points at them.
#[test]
fn a_backup_whose_prior_packs_vanish_is_not_written() {
    let env = Env::new("prior_gone");
    env.pgbench_init(1);
    env.stanza_create();
    let full = env.backup(&["--type=full"]);
    env.pgbench(&["-n", "-t", "50"]);
    env.sql("ALTER SYSTEM SET archive_command = 'false'");
    env.sql("SELECT pg_reload_conf()");
    std::thread::sleep(std::time::Duration::from_millis(500));

    let mut child = env
        .cmd(&[
            "--start-fast",
            "--log-level-console=info",
            "--archive-timeout=120",
            "--type=incr",
            "backup",
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    while !log.contains("waiting for WAL") {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "backup ended before waiting for WAL:\n{log}"
        );
        log.push_str(&line);
    }
    let packs = env.repo.join(format!("{STANZA}/backup/{full}/pack"));
    std::fs::remove_dir_all(&packs).unwrap();
    env.sql("ALTER SYSTEM RESET archive_command");
    env.sql("SELECT pg_reload_conf()");

    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "{log}{rest}");
    assert!(
        rest.contains("not written: pack ")
            && rest.contains(&format!("/backup/{full}/pack/"))
            && rest.contains("was deleted while the backup ran"),
        "{rest}"
    );
    assert_eq!(
        backup_labels(&env.info_json()),
        [full.as_str()],
        "no manifest for the incremental"
    );
}
