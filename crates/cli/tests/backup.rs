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

/// `repo-rate-limit` and `pg-read-rate-limit` hold a backup of ~400 MB to their rates,
/// measured from outside: the bytes that reached the repository (or that info says were
/// read) over the command's whole run, within 10% above the limit, and not far below it
/// (the limiter does not throttle more than asked). Progress names the limit.
#[test]
fn rate_limits_hold_a_backup_to_their_rates() {
    let env = Env::new("rate_limit");
    env.sql(
        "CREATE TABLE filler AS SELECT g, repeat(md5(g::text), 10) AS pad \
         FROM generate_series(1, 1100000) g",
    );
    env.stanza_create();
    let mib = 1u64 << 20;
    let timed = |args: &[&str]| {
        let mut all = vec![
            "--start-fast",
            "--process-max=2",
            "--compress-type=none",
            "--type=full",
        ];
        all.extend_from_slice(args);
        all.push("--progress=on");
        all.push("backup");
        let started = std::time::Instant::now();
        let out = env.cmd(&all).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let label = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        (label, started.elapsed().as_secs_f64(), stderr)
    };

    let (label, secs, progress) = timed(&["--repo1-rate-limit=20MiB"]);
    let stored: u64 = tree(&env.repo.join(STANZA).join("backup").join(&label))
        .values()
        .sum();
    assert!(stored > 350 * mib, "a backup of ~400 MB: {stored}");
    let rate = stored as f64 / secs;
    let limit = (20 * mib) as f64;
    eprintln!(
        "repo-rate-limit 20 MiB/s: {stored} bytes stored in {secs:.1} s = {:.2} MiB/s",
        rate / mib as f64
    );
    assert!(
        rate <= 1.1 * limit,
        "{:.1} MiB/s stored under a 20 MiB/s limit",
        rate / mib as f64
    );
    assert!(
        rate >= 0.5 * limit,
        "{:.1} MiB/s: throttled far below the limit",
        rate / mib as f64
    );
    assert!(
        progress.contains("(repository limit 20.0 MiB/s)"),
        "{progress}"
    );

    let (label, secs, progress) = timed(&["--pg-read-rate-limit=64MiB"]);
    let info = env.info_json();
    let b = info_backup(&info, &label);
    let read = b["bytes_read"].as_u64().unwrap();
    assert!(read > 350 * mib, "{b}");
    let rate = read as f64 / secs;
    let limit = (64 * mib) as f64;
    eprintln!(
        "pg-read-rate-limit 64 MiB/s: {read} bytes read in {secs:.1} s = {:.2} MiB/s",
        rate / mib as f64
    );
    assert!(
        rate <= 1.1 * limit,
        "{:.1} MiB/s read under a 64 MiB/s limit",
        rate / mib as f64
    );
    assert!(
        rate >= 0.4 * limit,
        "{:.1} MiB/s: throttled far below the limit",
        rate / mib as f64
    );
    assert!(progress.contains("(read limit 64.0 MiB/s)"), "{progress}");
    let shown = b["read_rate"].as_u64().unwrap() as f64;
    assert!(shown <= 1.1 * limit, "info's read rate {shown}");
    let text = env.ok(&["info"]);
    assert!(text.contains("/s read, "), "{text}");
}
