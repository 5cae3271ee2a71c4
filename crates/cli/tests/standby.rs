//! Backups from a streaming standby (backup-standby): the backup restores equal to the
//! primary, and the primary's relation files are never opened (strace says so); a
//! standby that lags past archive-timeout is a clear error.

use crate::common::*;
use pgstrata_testkit::{pg_command, Cluster};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// A streaming standby of `env`'s cluster, on a replication slot.
pub(crate) fn start_standby(env: &Env) -> Cluster {
    env.sql("SELECT pg_create_physical_replication_slot('standby1')");
    let data = env.scratch.join("standby");
    run_ok({
        let mut c = env.cluster.bin.cmd("pg_basebackup");
        c.arg("-D")
            .arg(&data)
            .args([
                "-R", "-S", "standby1", "-X", "stream", "-c", "fast", "-U", "postgres",
            ])
            .arg("-h")
            .arg(&env.cluster.socket_dir)
            .arg("-p")
            .arg(env.cluster.port.to_string());
        c
    });
    // Its own settings: no archiving of its own.
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str("\narchive_mode = off\nhot_standby = on\n");
    std::fs::write(&conf, text).unwrap();
    let standby = Cluster::adopt(&env.cluster.bin, &data, &env.scratch.path);
    standby.start().expect("start standby");
    let deadline = Instant::now() + Duration::from_secs(60);
    while standby
        .psql("postgres", "SELECT status FROM pg_stat_wal_receiver")
        .unwrap_or_default()
        .trim()
        != "streaming"
    {
        assert!(Instant::now() < deadline, "the standby does not stream");
        std::thread::sleep(Duration::from_millis(100));
    }
    standby
}

fn standby_args(standby: &Cluster) -> Vec<String> {
    vec![
        "--backup-standby".into(),
        format!("--standby-path={}", standby.data.display()),
        format!("--standby-host={}", standby.socket_dir.display()),
        format!("--standby-port={}", standby.port),
    ]
}

/// Files under `data_dir` that the traced process opened (from `strace -e openat`).
fn opened_under(trace: &str, data_dir: &std::path::Path) -> BTreeSet<String> {
    let prefix = format!("{}/", data_dir.display());
    trace
        .lines()
        .filter(|l| l.contains("openat(") && !l.contains("= -1") && !l.contains("O_DIRECTORY"))
        .filter_map(|l| {
            let start = l.find('"')? + 1;
            let end = start + l[start..].find('"')?;
            l[start..end].strip_prefix(&prefix).map(str::to_string)
        })
        .collect()
}

fn is_relation_file(rel: &str) -> bool {
    (rel.starts_with("base/") || rel.starts_with("global/") || rel.starts_with("pg_tblspc/"))
        && rel
            .rsplit('/')
            .next()
            .is_some_and(|n| n.as_bytes().first().is_some_and(u8::is_ascii_digit))
}

#[test]
fn a_backup_from_a_standby_restores_equal_and_reads_no_primary_relation_file() {
    let env = Env::new("standby");
    env.stanza_create();
    env.pgbench_init(2);
    let standby = start_standby(&env);
    let from_standby = standby_args(&standby);

    // A full backup from the standby, traced.
    let trace_file = env.scratch.join("backup.strace");
    let mut c = pg_command("strace");
    c.args(["-f", "-e", "trace=openat", "-o"])
        .arg(&trace_file)
        .arg(exe());
    // The same environment env.cmd gives pgstrata.
    let probe = env.cmd(&[]);
    for (k, v) in probe.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c.args(&from_standby).args([
        "--start-fast",
        "--process-max=2",
        "--type=full",
        "--log-level-console=info",
        "backup",
    ]);
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "backup from the standby failed: {err}"
    );
    assert!(err.contains("reading relation files from"), "{err}");
    let trace = std::fs::read_to_string(&trace_file).unwrap();
    let primary_relations: Vec<String> = opened_under(&trace, &env.cluster.data)
        .into_iter()
        .filter(|r| is_relation_file(r))
        .collect();
    assert!(
        primary_relations.is_empty(),
        "the backup opened the primary's relation files: {primary_relations:?}"
    );
    let standby_relations = opened_under(&trace, &standby.data)
        .into_iter()
        .filter(|r| is_relation_file(r))
        .count();
    assert!(
        standby_relations > 100,
        "only {standby_relations} relation files were read from the standby"
    );

    // Changes, then an incremental from the standby; restore equals the primary.
    env.pgbench(&["-t", "300", "-c", "2"]);
    env.sql("DELETE FROM pgbench_accounts WHERE aid % 50 = 0; CREATE TABLE added AS SELECT generate_series(1, 20000) AS x");
    let mut args: Vec<&str> = from_standby.iter().map(String::as_str).collect();
    args.extend(["--type=incr"]);
    let incr = env.backup(&args);
    assert!(incr.ends_with('I'), "{incr}");
    let expected = env.hashes();
    let restored =
        env.restore_and_start("restored", &["--type=immediate", &format!("--set={incr}")]);
    let got = restored.content_hashes().unwrap();
    restored.stop().unwrap();
    assert_eq!(
        got, expected,
        "the backup from the standby differs from the primary"
    );

    // A standby that stops replaying: the backup waits archive-timeout, then says how far
    // the standby got.
    standby
        .psql("postgres", "SELECT pg_wal_replay_pause()")
        .unwrap();
    env.sql("CREATE TABLE while_paused AS SELECT 1 AS x");
    let mut args: Vec<String> = from_standby.clone();
    args.extend([
        "--archive-timeout=3".into(),
        "--start-fast".into(),
        "backup".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, err) = run_fail(env.cmd(&args));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("has replayed only to"), "{err}");
    standby
        .psql("postgres", "SELECT pg_wal_replay_resume()")
        .unwrap();

    // The primary is not a standby: naming it as one is refused before anything starts.
    let args = [
        "--backup-standby".to_string(),
        format!("--standby-path={}", env.cluster.data.display()),
        format!("--standby-host={}", env.cluster.socket_dir.display()),
        format!("--standby-port={}", env.cluster.port),
        "backup".to_string(),
    ];
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, err) = run_fail(env.cmd(&refs));
    assert!(err.contains("is not a standby"), "{err}");
    standby.stop().unwrap();
}
