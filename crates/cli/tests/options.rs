//! The option layer as a user meets it: secrets kept off the command line and out of
//! logs, file modes whatever the caller's umask, TLS to PostgreSQL.

use crate::common::*;
use pgstrata_testkit::{give_to_pg_user, Cluster};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The real binary, no cluster: secrets are refused on the command line with where to put
/// them, never printed (even at debug level), and a config file others can read is warned
/// about.
#[test]
fn secrets_stay_off_the_command_line_and_out_of_the_log() {
    let dir = pgstrata_testkit::Scratch::new("secrets");
    let repo = dir.join("repo");
    let run = |args: &[&str], envs: &[(&str, &str)]| {
        let mut c = Command::new(exe());
        c.args(args).env_remove("PGSTRATA_CONFIG");
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let repo_path = format!("--repo-path={}", repo.display());
    let out = run(
        &[
            "--stanza=main",
            &repo_path,
            "--repo-s3-key-secret=hunter2",
            "info",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("PGSTRATA_REPO_S3_KEY_SECRET") && err.contains("config file"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");

    // From the environment it is taken, and the debug log shows it redacted.
    let out = run(
        &[
            "--stanza=main",
            &repo_path,
            "--log-level-console=debug",
            "info",
        ],
        &[("PGSTRATA_REPO_S3_KEY_SECRET", "hunter2")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--repo-s3-key-secret=<redacted>"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");

    // In a config file: a warning when group or others can read it, none at 0600.
    let cfg = dir.join("pgstrata.toml");
    std::fs::write(&cfg, "[main]\nrepo-azure-key = \"hunter2\"\n").unwrap();
    let config = format!("--config={}", cfg.display());
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&["--stanza=main", &config, &repo_path, "info"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WARN") && err.contains("repo-azure-key") && err.contains("chmod 600"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = run(&["--stanza=main", &config, &repo_path, "info"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("WARN"), "{err}");
}

/// The stanza name becomes part of file names (the log file, the spool): one that is not
/// letters, digits, '-' and '_' is refused before anything is named after it, so
/// `--stanza=../../x` cannot make pgstrata create a log file outside log-path.
#[test]
fn a_stanza_name_that_is_a_path_is_refused_before_the_log_file_is_named() {
    let dir = pgstrata_testkit::Scratch::new("stanza-name");
    let logs = dir.join("a/b/logs");
    std::fs::create_dir_all(&logs).unwrap();
    let before = tree(&dir.path);
    let out = Command::new(exe())
        .env_remove("PGSTRATA_CONFIG")
        .env_remove("PGSTRATA_STANZA")
        .args([
            "--stanza=../../x",
            &format!("--repo-path={}", dir.join("repo").display()),
            &format!("--log-path={}", logs.display()),
            "--log-level-file=info",
            "info",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("stanza name '../../x' is not allowed")
            && err.contains("letters, digits, '-' or '_'"),
        "{err}"
    );
    assert_eq!(tree(&dir.path), before, "no file created anywhere: {err}");
    assert!(!dir.join("a/x-info.log").exists());
}

/// Under umask 022, what pgstrata writes (repository objects and directories, archived WAL,
/// the log) is neither writable by the group nor readable by others.
#[test]
fn repository_files_are_private_whatever_the_umask() {
    let env = Env::new("umask");
    let logs = env.scratch.join("log");
    std::fs::create_dir_all(&logs).unwrap();
    give_to_pg_user(&logs);
    let under_022 = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("PGSTRATA_LOG_PATH", &logs)
            .env("PGSTRATA_LOG_LEVEL_FILE", "info");
        // SAFETY: umask is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
                Ok(())
            });
        }
        run_ok(c)
    };
    under_022(&["stanza-create"]);
    under_022(&["--start-fast", "backup"]);
    let mut checked = 0;
    let mut check = |dir: &Path| {
        for (rel, _) in tree(dir) {
            let p = dir.join(rel.trim_end_matches('/'));
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue; // removed meanwhile (WAL staging)
            };
            let mode = md.permissions().mode() & 0o777;
            assert_eq!(mode & 0o027, 0, "{} is {mode:04o}", p.display());
            checked += 1;
        }
    };
    check(&env.repo.join(STANZA));
    check(&logs);
    assert!(checked > 10, "{checked} files checked");
    let label_dir = std::fs::read_dir(env.repo.join(STANZA).join("backup"))
        .unwrap()
        .flatten()
        .next()
        .expect("a backup")
        .path();
    assert_eq!(
        std::fs::metadata(&label_dir).unwrap().permissions().mode() & 0o777,
        0o750
    );
}

/// A self-signed CA and a server certificate for `localhost`, made with the openssl CLI.
fn make_certificates(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = dir.join(format!("{name}-ca.key"));
    let ca = dir.join(format!("{name}-ca.crt"));
    let key = dir.join(format!("{name}-server.key"));
    let csr = dir.join(format!("{name}-server.csr"));
    let crt = dir.join(format!("{name}-server.crt"));
    let ext = dir.join(format!("{name}-san.ext"));
    std::fs::write(&ext, "subjectAltName = DNS:localhost\n").unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = |p: &Path| p.to_str().unwrap().to_string();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN={name} test CA"),
        "-keyout",
        &p(&ca_key),
        "-out",
        &p(&ca),
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &p(&key),
        "-out",
        &p(&csr),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p(&csr),
        "-CA",
        &p(&ca),
        "-CAkey",
        &p(&ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &p(&ext),
        "-out",
        &p(&crt),
    ]);
    for f in [&ca, &crt, &key] {
        give_to_pg_user(f);
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (ca, crt, key)
}

/// (Re)start `c` listening on TCP localhost, with TLS on or off.
fn start_on_tcp(c: &Cluster, ssl: bool) {
    if c.is_running() {
        c.stop().unwrap();
    }
    let opts = format!(
        "-p {} -k {} -c listen_addresses=localhost -c ssl={}",
        c.port,
        c.socket_dir.display(),
        if ssl { "on" } else { "off" }
    );
    let out = c
        .bin
        .cmd("pg_ctl")
        .arg("-D")
        .arg(&c.data)
        .arg("-l")
        .arg(&c.log_file)
        .args(["-o", &opts, "-w", "start"])
        .output()
        .unwrap();
    assert!(out.status.success(), "start: {}", c.log_tail());
}

/// TLS to PostgreSQL over TCP: verify-full succeeds with the right CA and host name and fails
/// clearly with a wrong CA or host name; verify-ca ignores the name; require against a
/// server without TLS fails clearly.
#[test]
fn tls_to_postgresql_verifies_what_sslmode_says() {
    let env = Env::new("tls");
    let dir = env.scratch.path.clone();
    let (ca, crt, key) = make_certificates(&dir, "right");
    let (wrong_ca, _, _) = make_certificates(&dir, "wrong");
    let conf = env.cluster.data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "ssl_cert_file = '{}'\nssl_key_file = '{}'\n",
        crt.display(),
        key.display()
    ));
    std::fs::write(&conf, text).unwrap();
    start_on_tcp(&env.cluster, true);

    let connect = |host: &str, mode: &str, root: Option<&Path>| {
        // stanza-create connects and compares the server's identity with the stanza's.
        let mut c = env.cmd(&["stanza-create"]);
        c.env("PGSTRATA_PG_HOST", host)
            .env("PGSTRATA_PG_SSLMODE", mode);
        if let Some(r) = root {
            c.env("PGSTRATA_PG_SSLROOTCERT", r);
        }
        c
    };
    env.stanza_create();
    run_ok(connect("localhost", "verify-full", Some(&ca)));
    let (code, err) = run_fail(connect("localhost", "verify-full", Some(&wrong_ca)));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("cannot connect to PostgreSQL")
            && err.contains("verify-full")
            && err.contains("certificate"),
        "{err}"
    );
    // The certificate names localhost, not 127.0.0.1: verify-full refuses, verify-ca accepts.
    let (_, err) = run_fail(connect("127.0.0.1", "verify-full", Some(&ca)));
    assert!(err.contains("certificate"), "{err}");
    run_ok(connect("127.0.0.1", "verify-ca", Some(&ca)));
    let (_, err) = run_fail(connect("127.0.0.1", "verify-ca", Some(&wrong_ca)));
    assert!(err.contains("certificate"), "{err}");
    // prefer and require encrypt without checking.
    run_ok(connect("localhost", "require", None));
    let missing = dir.join("missing.crt");
    let (code, err) = run_fail(connect("localhost", "verify-full", Some(&missing)));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing.crt"), "{err}");

    // A server without TLS: require fails clearly, prefer falls back to plain text.
    start_on_tcp(&env.cluster, false);
    let (code, err) = run_fail(connect("localhost", "require", None));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("does not support TLS"), "{err}");
    run_ok(connect("localhost", "prefer", None));
}
