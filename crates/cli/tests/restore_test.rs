//! restore-test, selective restore and annotations: a nightly restore-test passes on a
//! healthy backup, finds an index that is corrupt behind valid page checksums (exit 4,
//! naming it), and reports a cluster that cannot recover (exit 3, with the server log);
//! `--db-include`/`--db-exclude` restore the chosen databases equal to the source while the
//! others' files take no disk and nothing of them is fetched, also with `--delta`; a
//! backup's own configuration (ALTER SYSTEM commands, includes, preload libraries) runs
//! nothing on the restore-test host, and its SQL sees none of pgstrata's environment.

use crate::common::*;
use pgstrata_testkit::Cluster;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// restore-test as the invoking user (root in CI: the scratch server runs as postgres),
/// into scratch/`name`; returns the exit code, the JSON report (if any) and stderr.
fn restore_test(env: &Env, name: &str, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let pg_path = format!("--pg-path={}", env.scratch.join(name).display());
    let mut args = vec!["--output=json", pg_path.as_str()];
    args.extend_from_slice(extra);
    args.push("restore-test");
    let out: Output = env
        .cmd_as_invoker(&args)
        .output()
        .expect("run restore-test");
    let report = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        report,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Swap the keys of two index tuples on B-tree leaf page 1: the index's order is wrong,
/// yet every page is well formed (and gets a valid checksum once they are recomputed).
fn swap_index_keys(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let page = &mut bytes[8192..16384];
    let lower = u16::from_le_bytes([page[12], page[13]]) as usize;
    let item = |i: usize| {
        let lp = u32::from_le_bytes(page[24 + 4 * i..28 + 4 * i].try_into().unwrap());
        (lp & 0x7fff) as usize
    };
    assert!((lower - 24) / 4 > 20, "the leaf page holds too few items");
    let (a, b) = (item(10), item(20));
    let key_a: [u8; 4] = page[a + 8..a + 12].try_into().unwrap();
    let key_b: [u8; 4] = page[b + 8..b + 12].try_into().unwrap();
    page[a + 8..a + 12].copy_from_slice(&key_b);
    page[b + 8..b + 12].copy_from_slice(&key_a);
    std::fs::write(path, bytes).unwrap();
}

fn pg_checksums(c: &Cluster, mode: &str) {
    let out = c
        .bin
        .cmd("pg_checksums")
        .arg(mode)
        .arg("-D")
        .arg(&c.data)
        .output()
        .unwrap();
    assert!(out.status.success(), "pg_checksums {mode}: {out:?}");
}

#[test]
fn restore_test_passes_a_sound_backup_and_names_a_corrupt_index() {
    let env = Env::new("rtest");
    env.stanza_create();
    env.sql("CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g");
    // A tablespace: restore-test restores it inside its scratch directory, never over the
    // source's location.
    let ts = env.create_tablespace("ts1");
    env.sql("CREATE TABLE in_ts1 (id int PRIMARY KEY) TABLESPACE ts1; INSERT INTO in_ts1 SELECT generate_series(1, 100)");
    let source_ts: Vec<String> = content_tree(&ts).into_keys().collect();
    let label = env.backup(&[
        "--type=full",
        "--annotation=ticket=OPS-1",
        "--annotation=why=nightly check",
    ]);

    // Annotations are kept and shown, with the databases backed up.
    let info = env.info_json();
    let b = &info["backups"][0];
    assert_eq!(
        b["annotations"],
        serde_json::json!({"ticket": "OPS-1", "why": "nightly check"})
    );
    let dbs = each_str(&b["databases"], "name");
    assert!(
        dbs.contains(&"postgres") && dbs.contains(&"template0"),
        "{dbs:?}"
    );
    assert!(env.ok(&["info"]).contains("annotation: ticket=OPS-1"));
    let (code, err) = run_fail(env.cmd(&["--annotation=novalue", "backup"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--annotation='novalue'"), "{err}");

    let (code, report, err) = restore_test(&env, "healthy", &[]);
    assert_eq!(code, 0, "{err}\n{report:#}");
    assert_eq!(report["backup"], label.as_str());
    assert_eq!(report["ok"], true);
    assert_eq!(report["page_check"]["checked"], true);
    let checked = each_str(&report["databases"], "name");
    assert!(
        checked.contains(&"postgres") && checked.contains(&"template1"),
        "{checked:?}"
    );
    assert!(
        !env.scratch.join("healthy").exists(),
        "the scratch directory is removed"
    );
    // The scratch cluster promoted onto a new timeline without archiving into the repository.
    assert!(!tree(&env.repo)
        .keys()
        .any(|k| k.contains("00000002.history")));
    assert!(env.cluster.is_running());
    let after: Vec<String> = content_tree(&ts).into_keys().collect();
    assert_eq!(
        after, source_ts,
        "nothing restored into the source's tablespace"
    );

    // As the PostgreSQL OS user, into the default scratch directory (TMPDIR), as text.
    let mut cmd = env.cmd(&["restore-test"]);
    cmd.env_remove("PGSTRATA_PG_PATH");
    let text = run_ok(cmd);
    assert!(
        text.contains(&format!("restore-test of backup {label}")) && text.contains(": ok in"),
        "{text}"
    );
    assert!(
        text.contains("database postgres: ok") && text.contains("page checksums: ok"),
        "{text}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("pgstrata-restore-test-")
        })
        .collect();
    assert!(
        leftovers.is_empty(),
        "scratch directories left: {leftovers:?}"
    );

    let (code, _, err) = restore_test(&env, "no-binaries", &["--pg-bin=/nonexistent/bin"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--pg-bin=/nonexistent/bin"), "{err}");
    assert!(!env.scratch.join("no-binaries").exists());

    // A recovery that cannot complete: exit 3, with the server's reason.
    let (code, _, err) = restore_test(&env, "unrecoverable", &["--type=lsn", "--target=0/1"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("server log") && err.contains("recovery"),
        "{err}"
    );

    // Damage the index offline, recompute checksums so the backup's page checks pass.
    let index = env
        .cluster
        .data
        .join(env.sql("SELECT pg_relation_filepath('t_pkey')"));
    env.cluster.stop().unwrap();
    swap_index_keys(&index);
    pg_checksums(&env.cluster, "--disable");
    pg_checksums(&env.cluster, "--enable");
    env.cluster.start().unwrap();
    env.backup(&["--type=full"]);
    assert_eq!(env.info_json()["backups"][1]["page_errors"], 0);

    let (code, report, err) = restore_test(&env, "damaged", &[]);
    assert_eq!(code, 4, "{err}\n{report:#}");
    assert!(err.contains("t_pkey"), "{err}");
    assert_eq!(report["ok"], false);
    assert_eq!(report["page_check"]["ok"], true);
    let postgres = report["databases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "postgres")
        .unwrap();
    assert_eq!(postgres["ok"], false);
    assert!(
        postgres["problems"][0]
            .as_str()
            .unwrap()
            .contains("btree index \"postgres.public.t_pkey\""),
        "{report:#}"
    );
}

/// Allocated bytes and length of the relation files of a database directory.
fn allocation(db_dir: &Path) -> (u64, u64) {
    let mut allocated = 0;
    let mut len = 0;
    for e in std::fs::read_dir(db_dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "PG_VERSION" || name == "pg_filenode.map" {
            continue;
        }
        let md = e.metadata().unwrap();
        allocated += md.blocks() * 512;
        len += md.len();
    }
    (allocated, len)
}

#[test]
fn db_include_restores_one_database_and_fetches_nothing_of_the_others() {
    let env = Env::new("selective");
    env.stanza_create();
    env.sql("CREATE DATABASE keep1");
    env.sql("CREATE DATABASE drop1");
    env.cluster
        .psql(
            "keep1",
            "CREATE TABLE k AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 20000) g",
        )
        .unwrap();
    env.cluster
        .psql("drop1", "CREATE TABLE d AS SELECT g AS id, repeat(md5(g::text), 8) AS v FROM generate_series(1, 20000) g")
        .unwrap();
    let drop_oid = env.sql("SELECT oid FROM pg_database WHERE datname = 'drop1'");
    env.backup(&["--type=full"]);

    let target = env.scratch.join("unknown");
    let (code, err) = run_fail(env.cmd_as_invoker(&[
        &format!("--pg-path={}", target.display()),
        "--db-include=nope",
        "restore",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("'nope'") && err.contains("keep1") && err.contains("drop1"),
        "{err}"
    );
    assert!(!target.exists(), "nothing written");

    let plan = run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", env.scratch.join("plan").display()),
        "--db-exclude=drop1",
        "--dry-run",
        "restore",
    ]));
    assert!(
        plan.contains(&format!("databases not restored: drop1 ({drop_oid})")),
        "{plan}"
    );

    let target = restore_only(&env, "selected", &["--db-include=keep1"]);
    let (allocated, len) = allocation(&target.join("base").join(&drop_oid));
    assert!(len > 4 << 20, "drop1's files keep their size: {len}");
    assert_eq!(allocated, 0, "drop1's files allocate nothing");
    let restored = Cluster::adopt(&env.cluster.bin, &target, &env.scratch.path);
    restored.start().unwrap();
    restored
        .wait_for_promotion(Duration::from_secs(120))
        .unwrap();
    let keep = |h: std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
        h.into_iter()
            .filter(|(k, _)| k.starts_with("keep1."))
            .collect()
    };
    let expected = keep(env.hashes());
    assert!(!expected.is_empty());
    let dbs: Vec<String> = restored.databases().unwrap();
    assert!(dbs.contains(&"drop1".to_string()));
    restored.psql("postgres", "DROP DATABASE drop1").unwrap();
    assert_eq!(keep(restored.content_hashes().unwrap()), expected);
    restored.stop().unwrap();

    // Delta over a whole restore: drop1's files are emptied, and nothing is fetched.
    let target = restore_only(&env, "delta", &[]);
    let (allocated, _) = allocation(&target.join("base").join(&drop_oid));
    assert!(allocated > 4 << 20);
    let out = run_ok(env.cmd_as_invoker(&[
        &format!("--pg-path={}", target.display()),
        "--delta",
        "--db-exclude=drop1",
        "--archive-mode=off",
        "--type=immediate",
        "restore",
    ]));
    let fetched: u64 = out
        .rsplit("; ")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fetched bytes in {out}"));
    // pg_control is always rewritten; drop1's megabytes are not fetched.
    assert!(fetched < 256 << 10, "{out}");
    assert!(out.contains(" zeroed"), "{out}");
    assert_eq!(allocation(&target.join("base").join(&drop_oid)).0, 0);
}

/// A backup whose configuration would run commands, load code or read files on the host
/// that runs restore-test (settings made with ALTER SYSTEM, an `include` in
/// postgresql.conf, a database's own session_preload_libraries) is restored and checked
/// without any of it: no command runs (so pgstrata's environment, here a canary variable,
/// never reaches one), no file is written where the backup says, no library is loaded but
/// those of `--restore-test-preload`.
#[test]
fn restore_test_runs_nothing_of_the_backups_configuration() {
    let env = Env::new("rtconf");
    env.stanza_create();
    let trap = env.scratch.join("trap");
    std::fs::create_dir(&trap).unwrap();
    pgstrata_testkit::give_to_pg_user(&trap);
    let env_dump = trap.join("recovery-end.env");
    let pid_file = trap.join("included.pid");
    let included = trap.join("included.conf");
    std::fs::write(
        &included,
        // A write outside the scratch directory, and a line that stops the server if read.
        format!(
            "external_pid_file = '{}'\npgstrata_read_this_file = on\n",
            pid_file.display()
        ),
    )
    .unwrap();
    pgstrata_testkit::give_to_pg_user(&included);
    // In the source: nothing reloads, so none of it runs there.
    env.sql(&format!(
        "ALTER SYSTEM SET recovery_end_command = 'env > {}'",
        env_dump.display()
    ));
    env.sql("ALTER SYSTEM SET shared_preload_libraries = 'auto_explain'");
    // An index whose expression runs a command (`env`) when evaluated outside the source:
    // amcheck's heapallindexed check evaluates it in the scratch server, as superuser.
    let environ = trap.join("server.environ");
    env.sql(&format!(
        "CREATE FUNCTION leak_env() RETURNS void LANGUAGE plpgsql AS $$ BEGIN \
         IF current_setting('data_directory') <> '{}' THEN \
         EXECUTE format('COPY (SELECT 1) TO PROGRAM %L', 'env > {}'); \
         END IF; END $$; \
         CREATE FUNCTION leak(i int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN \
         PERFORM public.leak_env(); RETURN i; END $$; \
         CREATE TABLE leaky (i int); INSERT INTO leaky VALUES (1); CREATE INDEX ON leaky (leak(i))",
        env.cluster.data.display(),
        environ.display()
    ));
    env.sql("CREATE DATABASE trapdb");
    env.sql("ALTER DATABASE trapdb SET session_preload_libraries = 'pgstrata_no_such_library'");
    let conf = env.cluster.data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!("include '{}'\n", included.display()));
    std::fs::write(&conf, text).unwrap();
    env.backup(&["--type=full"]);

    let run = |name: &str, extra: &[&str]| {
        let pg_path = format!("--pg-path={}", env.scratch.join(name).display());
        let mut args = vec![
            "--output=json",
            "--log-level-console=info",
            pg_path.as_str(),
        ];
        args.extend_from_slice(extra);
        args.push("restore-test");
        let mut cmd = env.cmd_as_invoker(&args);
        cmd.env("PGSTRATA_TEST_CANARY", "canary-5b1f0e");
        let out = cmd.output().expect("run restore-test");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let leaked = std::fs::read_to_string(&env_dump).unwrap_or_default();
        assert!(
            !env_dump.exists(),
            "the backup's recovery_end_command ran (canary in its environment: {}):\n{err}",
            leaked.contains("canary-5b1f0e")
        );
        assert!(
            !pid_file.exists(),
            "the backup's included file was read:\n{err}"
        );
        assert_eq!(out.status.code(), Some(0), "{err}");
        // The backup's own SQL does run in the scratch server, but sees no secret.
        let seen = std::fs::read_to_string(&environ).expect("the index expression ran");
        std::fs::remove_file(&environ).unwrap();
        assert!(
            !seen.contains("canary-5b1f0e") && !seen.contains("PGSTRATA_"),
            "the scratch server's environment: {seen}"
        );
        err
    };

    let err = run("plain", &[]);
    assert!(
        err.contains("commented out") && err.contains(&included.display().to_string()),
        "{err}"
    );
    assert!(
        err.contains("shared_preload_libraries = ''"),
        "the backup's preload list is not used:\n{err}"
    );
    let err = run("preload", &["--restore-test-preload=auto_explain"]);
    assert!(
        err.contains("shared_preload_libraries = 'auto_explain'"),
        "{err}"
    );
}
