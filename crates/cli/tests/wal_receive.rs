//! `wal-receive`: WAL streamed into the repository as it is written. In synchronous mode
//! (synchronous_standby_names naming the receiver's slot) no committed transaction is lost
//! when the primary's host is: its data directory deleted, a restore from the repository
//! holds every commit, the last ones from the partial segment the receiver stored.

use crate::common::*;
use std::time::{Duration, Instant};

/// A process found by its command line (`marker` is unique to it), SIGKILLed when dropped.
struct Receiver {
    marker: String,
    child: std::process::Child,
}

impl Receiver {
    fn start(env: &Env, extra: &[&str]) -> Receiver {
        // Unique to this receiver: how it is found (as root the child is runuser).
        let marker = format!(
            "--lock-path={}",
            env.scratch.join("receiver-locks").display()
        );
        let mut args = vec![marker.as_str(), "--log-level-console=info"];
        args.extend_from_slice(extra);
        args.push("wal-receive");
        let child = env
            .cmd(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        Receiver { marker, child }
    }

    fn kill(&mut self) -> String {
        let pattern = format!("^{} {}", exe().display(), self.marker);
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-f", &pattern])
            .status();
        let _ = self.child.kill();
        let out = std::mem::replace(
            &mut self.child,
            std::process::Command::new("true").spawn().unwrap(),
        )
        .wait_with_output()
        .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Wait until the server lists the receiver as a synchronous standby.
fn wait_until_sync(env: &Env, receiver: &mut Receiver) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = env.sql(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'pgstrata_test'",
        );
        if state.trim() == "sync" {
            return;
        }
        if Instant::now() > deadline || receiver.child.try_wait().unwrap().is_some() {
            panic!(
                "the receiver did not become a synchronous standby ({state:?}):\n{}",
                receiver.kill()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn synchronous_receive_keeps_every_commit_when_the_primary_is_lost() {
    let env = Env::new("walrcv-sync");
    env.stanza_create();
    env.sql("CREATE TABLE commits (n int)");
    env.backup(&["--type=full"]);
    env.sql("ALTER SYSTEM SET synchronous_standby_names = 'pgstrata_test'");
    env.sql("SELECT pg_reload_conf()");
    let mut receiver = Receiver::start(&env, &["--wal-receive-synchronous"]);
    wait_until_sync(&env, &mut receiver);
    // check reports the receiver's slot in use.
    let out = env
        .cmd(&["--log-level-console=info", "check"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("replication slot pgstrata_test: in use by wal-receive"),
        "{said}"
    );
    // A second receiver of the stanza is refused while the first runs.
    let (code, err) = run_fail(env.cmd(&["wal-receive"]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("wal-receive"), "{err}");

    // 1,000 transactions of one row each, every commit acknowledged; a time between the
    // 500th and the 501st.
    let script = env.scratch.join("insert.sql");
    std::fs::write(&script, "INSERT INTO commits VALUES (1);\n").unwrap();
    pgstrata_testkit::give_to_pg_user(&script);
    env.pgbench(&["-n", "-t", "500", "-f", &script.display().to_string()]);
    std::thread::sleep(Duration::from_millis(1100));
    let between = env.sql("SELECT now()").trim().to_string();
    std::thread::sleep(Duration::from_millis(1100));
    env.pgbench(&["-n", "-t", "500", "-f", &script.display().to_string()]);
    assert_eq!(env.sql("SELECT count(*) FROM commits").trim(), "1000");

    // The primary's host is lost: stopped at once, its data directory gone.
    stop_at_once(&env.cluster);
    let log = receiver.kill();
    eprintln!("receiver log:\n{log}");
    std::fs::remove_dir_all(&env.cluster.data).unwrap();
    let partials: Vec<String> = tree(&env.repo)
        .into_keys()
        .filter(|k| k.ends_with(".receive.partial"))
        .collect();
    assert!(!partials.is_empty(), "a partial segment is stored:\n{log}");

    // The repository with a segment being received verifies, and info lists it.
    env.ok(&["verify"]);
    let info = env.ok(&["info"]);
    assert!(
        info.contains("wal-receive: receiving 0000000100000000000000"),
        "{info}"
    );

    let restored = env.restore_and_start("restored", &[]);
    let n = restored
        .psql("postgres", "SELECT count(*) FROM commits")
        .unwrap();
    assert_eq!(n.trim(), "1000", "every committed row restored:\n{log}");
    restored.stop().unwrap();

    // Point-in-time recovery to a time inside the partial segment.
    let target = format!("--target={between}");
    let at_time = env.restore_and_start("at-time", &["--type=time", &target]);
    let n = at_time
        .psql("postgres", "SELECT count(*) FROM commits")
        .unwrap();
    assert_eq!(n.trim(), "500", "recovered to {between}");
    at_time.stop().unwrap();
}

/// Wait until the receiver reports flushed everything server `c` has written (replayed,
/// on a standby).
fn wait_until_flushed(c: &pgstrata_testkit::Cluster, receiver: &mut Receiver) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let caught_up = c
            .psql(
                "postgres",
                "SELECT coalesce(flush_lsn >= (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END), false) FROM pg_stat_replication WHERE application_name = 'pgstrata_test'",
            )
            .unwrap_or_default();
        if caught_up.trim() == "t" {
            return;
        }
        if Instant::now() > deadline {
            panic!("the receiver did not catch up:\n{}", receiver.kill());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// kill -9 of the receiver at random points under load: after each restart it goes on
/// from its slot, the archive (written by the receiver alone: archive_command stores
/// nothing) has no gap, and a restore equals the source.
#[test]
fn a_receiver_killed_anywhere_leaves_no_gap_and_restores_equal() {
    let env = Env::new("walrcv-kill");
    env.stanza_create();
    env.pgbench_init(1);
    env.backup(&["--type=full"]);
    // From now on only the receiver stores WAL.
    env.sql("ALTER SYSTEM SET archive_command = '/bin/true'");
    env.sql("SELECT pg_reload_conf()");
    let seed = test_seed();
    eprintln!("seed {seed} (PGSTRATA_TEST_SEED)");
    let mut rng = seed;
    let mut next = |below: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % below
    };
    let mut load = env
        .cluster
        .pgbench_spawn(&["-n", "-c", "2", "-T", "12", "postgres"])
        .unwrap();
    let mut logs = String::new();
    for round in 0..4 {
        let mut receiver = Receiver::start(&env, &["--wal-receive-flush-interval=1s"]);
        std::thread::sleep(Duration::from_millis(300 + next(2000)));
        if round % 2 == 1 {
            env.sql("SELECT pg_switch_wal()");
        }
        std::thread::sleep(Duration::from_millis(next(500)));
        logs.push_str(&receiver.kill());
    }
    assert!(load.wait().unwrap().success(), "pgbench");
    env.sql("SELECT pg_switch_wal()");
    env.sql("CREATE TABLE after_load AS SELECT generate_series(1, 1000) AS n");
    let mut receiver = Receiver::start(&env, &[]);
    wait_until_flushed(&env.cluster, &mut receiver);
    let source = env.hashes();
    stop_at_once(&env.cluster);
    logs.push_str(&receiver.kill());
    let out = env.cmd(&["--output=json", "verify"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let v = v.as_array().map(|a| a[0].clone()).unwrap_or(v);
    assert_eq!(v["wal"]["gaps"], serde_json::json!([]), "{v}\n{logs}");
    let restored = env.restore_and_start("restored", &[]);
    assert_eq!(
        restored.content_hashes().unwrap(),
        source,
        "restored from the received WAL\n{logs}"
    );
    restored.stop().unwrap();
}

/// Asynchronously, a commit streamed when nothing was written for a flush interval is
/// stored at once, not an interval later: the primary lost right after a quiet cluster's
/// commit loses nothing.
#[test]
fn an_asynchronous_receiver_stores_a_quiet_clusters_commit_at_once() {
    let env = Env::new("walrcv-quiet");
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.sql("ALTER SYSTEM SET archive_command = '/bin/true'");
    env.sql("SELECT pg_reload_conf()");
    let interval = Duration::from_secs(6);
    let mut receiver = Receiver::start(&env, &["--wal-receive-flush-interval=6s"]);
    wait_until_flushed(&env.cluster, &mut receiver);
    std::thread::sleep(interval + Duration::from_millis(500));
    env.sql("CREATE TABLE last_words AS SELECT 'kept' AS w");
    let committed = Instant::now();
    wait_until_flushed(&env.cluster, &mut receiver);
    let took = committed.elapsed();
    stop_at_once(&env.cluster);
    let logs = receiver.kill();
    assert!(
        took < interval / 2,
        "the commit waited {took:?} for a {interval:?} flush interval\n{logs}"
    );
    let restored = env.restore_and_start("restored", &[]);
    assert_eq!(
        restored
            .psql("postgres", "SELECT w FROM last_words")
            .unwrap()
            .trim(),
        "kept",
        "{logs}"
    );
    restored.stop().unwrap();
}

/// A receiver streaming from a standby follows it through its promotion: the new
/// timeline's WAL and history file are stored (the standby archives nothing), and a
/// restore across the timeline switch holds the commits of both timelines.
#[test]
fn the_receiver_follows_a_promoted_standby_onto_its_new_timeline() {
    let env = Env::new("walrcv-promote");
    env.stanza_create();
    env.sql("CREATE TABLE before_promotion (n int)");
    env.backup(&["--type=full"]);
    let standby = crate::standby::start_standby(&env);
    let host = format!("--pg-host={}", standby.socket_dir.display());
    let port = format!("--pg-port={}", standby.port);
    let mut receiver = Receiver::start(&env, &[&host, &port, "--wal-receive-flush-interval=1s"]);
    env.sql("INSERT INTO before_promotion SELECT generate_series(1, 100)");
    // The old primary goes away with the rows on the standby and in the repository.
    env.sql("CHECKPOINT");
    std::thread::sleep(Duration::from_millis(500));
    wait_until_flushed(&standby, &mut receiver);
    env.cluster.stop().unwrap();
    standby.promote().unwrap();
    standby.wait_for_promotion(Duration::from_secs(60)).unwrap();
    standby
        .psql(
            "postgres",
            "CREATE TABLE after_promotion AS SELECT generate_series(1, 200) AS n",
        )
        .unwrap();
    wait_until_flushed(&standby, &mut receiver);
    let source = standby.content_hashes().unwrap();
    stop_at_once(&standby);
    let log = receiver.kill();
    let objects = tree(&env.repo);
    assert!(
        objects.keys().any(|k| k.ends_with("/00000002.history")),
        "the new timeline's history is stored:\n{log}"
    );
    assert!(
        objects
            .keys()
            .any(|k| k.contains("/00000002000000000000000")),
        "WAL of timeline 2 is stored: {:?}\n{log}",
        objects.keys().collect::<Vec<_>>()
    );
    let restored = env.restore_and_start("across", &[]);
    assert_eq!(
        restored.content_hashes().unwrap(),
        source,
        "restored across the promotion\n{log}"
    );
    restored.stop().unwrap();
}

/// A server of another cluster than the stanza's is refused at once (exit 3), naming both,
/// and nothing is stored.
#[test]
fn a_server_of_another_cluster_is_refused() {
    let env = Env::new("walrcv-other");
    env.stanza_create();
    let other = Env::new("walrcv-other-cluster");
    let mut c = env.cmd(&["wal-receive"]);
    c.env("PGSTRATA_PG_HOST", &other.cluster.socket_dir)
        .env("PGSTRATA_PG_PORT", other.cluster.port.to_string());
    let (code, err) = run_fail(c);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("is cluster"), "{err}");
    assert!(
        !tree(&env.repo)
            .keys()
            .any(|k| k.contains(".receive.partial")),
        "nothing received"
    );
}
