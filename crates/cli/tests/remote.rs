//! Two hosts over real SSH: a database host (the `postgres` OS user) and a backup host
//! (the `pgstrata-backup` OS user), neither able to read the other's files, joined only by
//! a real sshd on a loopback port. The database host archives WAL and restores through
//! `repo-remote`; the backup host runs stanza-create, check and backups through
//! `pg-remote`, which run next to the data and send only frames over the link.

use crate::common::*;
use pgstrata_testkit::{
    chown_to, give_to_pg_user, set_mode, Cluster, SshServer, BACKUP_OS_USER, PG_OS_USER,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The database host and the backup host of one test.
struct TwoHosts {
    env: Env,
    ssh: SshServer,
    /// The repository, a directory only the backup user can read.
    backup_repo: PathBuf,
    backup_config: PathBuf,
}

impl TwoHosts {
    fn new(name: &str) -> TwoHosts {
        TwoHosts::configured(name, "")
    }

    /// The two hosts with `extra` in the database host's configuration and the backup
    /// host's (each line an option for both).
    fn configured(name: &str, extra: &str) -> TwoHosts {
        let ssh_dir =
            std::env::temp_dir().join(format!("pgstrata-sshd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ssh_dir);
        let ssh = SshServer::start(&ssh_dir).expect("start sshd");
        let backup_repo = ssh_dir.join("backup-host-repo");
        std::fs::create_dir_all(&backup_repo).unwrap();
        chown_to(&backup_repo, BACKUP_OS_USER).unwrap();
        set_mode(&backup_repo, 0o700).unwrap();
        // The backup host's own configuration file (this machine's /etc/pgstrata may hold
        // the database host's, readable by postgres only, as the Debian package makes it).
        let backup_config = ssh_dir.join("backup-host.toml");
        std::fs::write(
            &backup_config,
            format!("[global]\nlog-level-file = \"off\"\n{extra}"),
        )
        .unwrap();
        chown_to(&backup_config, BACKUP_OS_USER).unwrap();
        // The database host's configuration: its repository is on the backup host.
        let env = Env::with_config(
            name,
            &format!(
                "repo-remote = \"{BACKUP_OS_USER}@backup-host\"\nrepo-path = \"{}\"\nrepo-remote-cmd = \"{}\"\ncmd-ssh = \"{}\"\n{extra}",
                backup_repo.display(),
                exe().display(),
                ssh.client(PG_OS_USER).display()
            ),
        );
        // The database host's own settings for the stanza, in its own configuration: the
        // agent takes them from there, never from the backup host.
        let db_config = env.config.clone().expect("a config file");
        let mut text = std::fs::read_to_string(&db_config).unwrap();
        text.push_str(&format!(
            "\n[{STANZA}]\npg-path = \"{}\"\npg-host = \"{}\"\npg-port = {}\npg-user = \"postgres\"\n",
            env.cluster.data.display(),
            env.cluster.socket_dir.display(),
            env.cluster.port
        ));
        std::fs::write(&db_config, text).unwrap();
        // Each key can do one thing on the other host, as the README's authorized_keys:
        // the backup host has the database host's agent do jobs with its own
        // configuration; the database host reaches this one stanza of the repository.
        ssh.force_command(
            PG_OS_USER,
            &format!(
                "{} agent run --config={}",
                exe().display(),
                db_config.display()
            ),
        )
        .unwrap();
        ssh.force_command(
            BACKUP_OS_USER,
            &format!(
                "{} agent repo --stanza={STANZA} --repo-path={}",
                exe().display(),
                backup_repo.display()
            ),
        )
        .unwrap();
        TwoHosts {
            env,
            ssh,
            backup_repo,
            backup_config,
        }
    }

    /// pgstrata on the backup host, reaching the database host with pg-remote. It names
    /// no setting of the database host's: the data directory and the connection are the
    /// agent's own.
    fn backup_host(&self, args: &[&str]) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", BACKUP_OS_USER, "--"])
            .arg(exe())
            .arg(format!("--config={}", self.backup_config.display()))
            .arg(format!("--stanza={STANZA}"))
            .arg(format!("--repo-path={}", self.backup_repo.display()))
            .arg(format!("--pg-remote={PG_OS_USER}@db-host"))
            .arg(format!("--pg-remote-cmd={}", exe().display()))
            .arg(format!(
                "--cmd-ssh={}",
                self.ssh.client(BACKUP_OS_USER).display()
            ))
            .arg("--log-level-console=info")
            .env(
                pgstrata_repo::cipher::TEST_KDF_MEMORY_ENV,
                TEST_KDF_MEMORY_KIB,
            )
            .current_dir("/")
            .args(args);
        c
    }

    /// Restore on the database host (through repo-remote), start it, wait for promotion.
    /// Restore on the database host (through repo-remote) into scratch/`name`, start it
    /// until it recovers, stop it, and assert its content is `expected` (`what` says which
    /// restore differs otherwise).
    fn assert_restores_on_db_host(
        &self,
        name: &str,
        extra: &[&str],
        expected: &BTreeMap<String, String>,
        what: &str,
    ) {
        let target = self.env.scratch.join(name);
        let pg_path = format!("--pg-path={}", target.display());
        let mut args = vec![
            pg_path.as_str(),
            "--process-max=2",
            "--archive-mode=off",
            "--target-action=promote",
        ];
        args.extend_from_slice(extra);
        args.push("restore");
        run_ok(self.env.cmd(&args));
        let c = Cluster::adopt(&self.env.cluster.bin, &target, &self.env.scratch.path);
        c.start().expect("start restored cluster");
        c.wait_for_promotion(Duration::from_secs(180))
            .expect("restored cluster recovers");
        let content = c.content_hashes().unwrap();
        c.stop().unwrap();
        assert_eq!(&content, expected, "{what}");
    }

    fn packs_of_running_backup(&self) -> usize {
        tree(&self.backup_repo)
            .keys()
            .filter(|k| k.contains("/pack/") && !k.ends_with('/'))
            .count()
    }
}

/// The agent's debug log of backup `label` says its manifest crossed the line as a patch
/// less than half the manifest's size ("…: sent as a patch of N bytes against … (whole: M
/// bytes)"). Every carried entry of an incremental gains its owner's label, so the patch
/// from a full's manifest is the largest kind: about a quarter of the manifest.
fn assert_sent_as_patch(log: &str, label: &str) {
    // The manifest, and the first part of its entries (format 4), where most bytes are.
    for object in ["backup.manifest", "manifest/0"] {
        assert_object_sent_as_patch(log, &format!("{STANZA}/backup/{label}/{object}"));
    }
}

fn assert_object_sent_as_patch(log: &str, key: &str) {
    let marker = format!("{key}: sent as a patch of ");
    let line = log
        .lines()
        .find_map(|l| Some(l.split_once(marker.as_str())?.1))
        .unwrap_or_else(|| panic!("{key} was not sent as a patch: {log}"));
    let first_number = |text: &str| -> usize {
        text.split(|c: char| !c.is_ascii_digit())
            .find(|w| !w.is_empty())
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no size in '{line}'"))
    };
    let sent = first_number(line);
    let whole = first_number(line.split_once("(whole: ").expect("whole size").1);
    assert!(
        sent * 2 < whole,
        "a {sent}-byte patch for a {whole}-byte manifest: {line}"
    );
}

#[test]
fn backup_host_and_database_host_over_ssh() {
    let h = TwoHosts::new("two-hosts");
    let env = &h.env;

    // The two users cannot read each other's files: only SSH joins them.
    let peek = Command::new("runuser")
        .args(["-u", PG_OS_USER, "--", "ls"])
        .arg(&h.backup_repo)
        .output()
        .unwrap();
    assert!(
        !peek.status.success(),
        "postgres can read the backup host's repository"
    );
    let peek = Command::new("runuser")
        .args(["-u", BACKUP_OS_USER, "--", "ls"])
        .arg(&env.cluster.data)
        .output()
        .unwrap();
    assert!(
        !peek.status.success(),
        "the backup user can read the data directory"
    );

    // stanza-create and check from the backup host (pg-remote); the check's WAL switch is
    // archived by the database host's archive_command through repo-remote.
    let out = run_ok(h.backup_host(&["stanza-create"]));
    assert!(out.contains("created"), "{out}");
    run_ok(h.backup_host(&["check"]));

    env.pgbench_init(2);
    let full = run_ok(h.backup_host(&["--start-fast", "--process-max=2", "--type=full", "backup"]));
    let full_label = full.trim().to_string();
    assert!(
        full_label.ends_with('F'),
        "backup prints its label on stdout: {full}"
    );

    // A WAL-tracked incremental: the agent reads the change maps (stored through
    // repo-remote by archive-push) from the backup host's repository.
    env.pgbench(&["-t", "300", "-c", "2"]);
    env.sql("DELETE FROM pgbench_accounts WHERE aid % 100 = 0; CREATE TABLE added AS SELECT generate_series(1, 10000) AS x");
    env.flush_wal();
    let incr = h
        .backup_host(&[
            "--start-fast",
            "--process-max=2",
            "--type=incr",
            "--track=wal",
            "--log-level-console=debug",
            "backup",
        ])
        .output()
        .unwrap();
    let incr_err = String::from_utf8_lossy(&incr.stderr);
    assert!(incr.status.success(), "incremental failed: {incr_err}");
    assert!(
        incr_err.contains("changed blocks come from the block-change maps"),
        "the incremental did not use the WAL: {incr_err}"
    );
    let incr_label = String::from_utf8_lossy(&incr.stdout).trim().to_string();
    assert!(incr_label.ends_with('I'), "{incr_label}");
    // Neither manifest crossed the line whole: the agent still held the full's manifest
    // it wrote (its object cache, in the postgres user's ~/.cache), and sent the new one
    // as a patch against it, which the backup host rebuilt.
    let full_manifest = format!("{STANZA}/backup/{full_label}/backup.manifest");
    assert!(
        incr_err.contains(&format!(
            "{full_manifest}: unchanged; read from the object cache"
        )),
        "the prior manifest crossed the line: {incr_err}"
    );
    assert_sent_as_patch(&incr_err, &incr_label);
    let expected = env.hashes();

    // The objects are on the backup host, owned by its user.
    let meta = std::fs::metadata(h.backup_repo.join(STANZA)).unwrap();
    let backup_uid = nix::unistd::User::from_name(BACKUP_OS_USER)
        .unwrap()
        .unwrap()
        .uid;
    assert_eq!(meta.uid(), backup_uid.as_raw());

    // The manifest's copy was made on the backup host from the manifest's bytes (they
    // cross the line once), as a file of its own: a hard link would be no copy at all.
    let incr_dir = h.backup_repo.join(STANZA).join("backup").join(&incr_label);
    let manifest = std::fs::read(incr_dir.join("backup.manifest")).unwrap();
    let manifest_copy = std::fs::read(incr_dir.join("backup.manifest.copy")).unwrap();
    assert_eq!(manifest, manifest_copy);
    for name in ["backup.manifest", "backup.manifest.copy"] {
        let links = std::fs::metadata(incr_dir.join(name)).unwrap().nlink();
        assert_eq!(links, 1, "{name} has {links} links");
    }

    // info on the database host, through repo-remote.
    let info = env.info_json();
    let backups = info["backups"].as_array().expect("backups");
    assert_eq!(backups.len(), 2, "{info}");

    // verify --repair from the database host: its agent serves the repository
    // append-only, so the damaged twin is named but not rewritten (the holder refuses the
    // overwrite) and the repository is left as it was.
    let copy_path = incr_dir.join("backup.manifest.copy");
    let mut damaged = manifest_copy.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x55;
    std::fs::write(&copy_path, &damaged).unwrap();
    let (code, err) = run_fail(env.cmd(&["verify", "--repair"]));
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("backup.manifest.copy") && err.contains("append-only"),
        "the refused repair is not named: {err}"
    );
    assert_eq!(
        std::fs::read(&copy_path).unwrap(),
        damaged,
        "the holder's copy was rewritten"
    );
    std::fs::write(&copy_path, &manifest_copy).unwrap();

    // A backup on the database host itself, through repo-remote, whose agent serves it
    // append-only: it adds its packs and manifest and removes only its own lock.
    let own = run_ok(env.cmd(&["--start-fast", "--type=incr", "backup"]));
    assert!(own.trim().ends_with('I'), "{own}");
    assert!(
        !h.backup_repo.join(STANZA).join("lock").exists()
            && env.info_json()["backups"].as_array().unwrap().len() == 3,
        "the database host's own backup left its lock or is not listed"
    );

    // An SSH connection dropped mid-backup fails the backup with a clear message and
    // leaves nothing visible; the next backup succeeds.
    env.pgbench_init(6);
    let before = h.packs_of_running_backup();
    let mut slow = h.backup_host(&[
        "--start-fast",
        "--process-max=1",
        "--type=full",
        "--compress-type=zst",
        "--compress-level=19",
        "backup",
    ]);
    let slow = slow
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while h.packs_of_running_backup() == before {
        assert!(Instant::now() < deadline, "no pack written within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    h.ssh.drop_connections();
    let failed = slow.wait_with_output().unwrap();
    let failed_err = String::from_utf8_lossy(&failed.stderr);
    assert!(
        !failed.status.success(),
        "the backup survived a dropped link"
    );
    assert!(
        failed_err.contains("did not finish"),
        "no clear message: {failed_err}"
    );
    assert_eq!(
        env.info_json()["backups"].as_array().unwrap().len(),
        3,
        "a half backup became visible"
    );
    let next = run_ok(h.backup_host(&["--start-fast", "--process-max=2", "--type=incr", "backup"]));
    assert!(next.trim().ends_with('I'), "{next}");
    let after_drop = env.hashes();

    // Restore on the database host through repo-remote: the incremental equals the
    // source as it was, replaying WAL fetched through repo-remote by restore_command.
    h.assert_restores_on_db_host(
        "restored-incr",
        &["--type=immediate", &format!("--set={incr_label}")],
        &expected,
        "the incremental restored through repo-remote differs",
    );
    h.assert_restores_on_db_host(
        "restored-latest",
        &[],
        &after_drop,
        "the newest backup restored through repo-remote differs",
    );
    give_to_pg_user(&env.scratch.path);
}

use std::os::unix::fs::MetadataExt;

/// An encrypted stanza across the two hosts, the agent's configuration without the
/// passphrase: the backup host gives the agent a session key to seal with and reseals
/// what it reads; the agent reads the prior manifest from its object cache and sends the
/// new one as a patch, which the backup host rebuilds and seals with the master key; no
/// credential and no passphrase crosses; the incremental restores equal to the source.
#[test]
fn an_encrypted_stanza_is_backed_up_through_an_agent_without_its_passphrase() {
    let h = TwoHosts::configured(
        "two-hosts-encrypted",
        "repo-cipher-type = \"aes-256-gcm\"\nrepo-cipher-pass = \"correct horse battery\"\n",
    );
    let env = &h.env;
    // The agent's configuration: the database host's settings, no passphrase (restore and
    // archive-push on that host, through repo-remote, keep theirs).
    let db_config = std::fs::read_to_string(env.config.as_ref().unwrap()).unwrap();
    let agent_config = env.scratch.join("agent.toml");
    std::fs::write(
        &agent_config,
        db_config
            .lines()
            .filter(|l| !l.starts_with("repo-cipher-pass"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    give_to_pg_user(&agent_config);
    // Every byte the database host's agent receives, recorded by its forced command.
    let received = env.scratch.join("agent-received");
    std::fs::write(&received, b"").unwrap();
    give_to_pg_user(&received);
    h.ssh
        .force_command(
            PG_OS_USER,
            &format!(
                "tee -a {} | {} agent run --config={}",
                received.display(),
                exe().display(),
                agent_config.display()
            ),
        )
        .unwrap();
    // The backup host's object-store credentials (in its environment here) stay there.
    let canaries = [
        ("PGSTRATA_REPO_S3_KEY_SECRET", "canary-s3-secret"),
        ("PGSTRATA_REPO_AZURE_KEY", "canary-azure-key"),
        ("PGSTRATA_REPO_GCS_KEY", "canary-gcs-key"),
    ];
    let backup_host = |args: &[&str]| {
        let mut c = h.backup_host(args);
        c.envs(canaries);
        c
    };
    run_ok(backup_host(&["stanza-create"]));
    env.pgbench_init(1);
    let full = run_ok(backup_host(&["--start-fast", "--type=full", "backup"]));
    let full_label = full.trim().to_string();
    env.pgbench(&["-t", "200", "-c", "2"]);
    let incr = backup_host(&[
        "--start-fast",
        "--type=incr",
        "--log-level-console=debug",
        "backup",
    ])
    .output()
    .unwrap();
    let incr_err = String::from_utf8_lossy(&incr.stderr);
    assert!(incr.status.success(), "incremental failed: {incr_err}");
    let incr_label = String::from_utf8_lossy(&incr.stdout).trim().to_string();
    // Three jobs crossed, and neither a credential nor the passphrase with them.
    let received = std::fs::read(&received).unwrap();
    assert!(
        received.windows(5).any(|w| w == b"\"job\""),
        "the recording holds no job: is the forced command in effect?"
    );
    for secret in [
        "correct horse battery",
        "canary-s3-secret",
        "canary-azure-key",
        "canary-gcs-key",
    ] {
        assert!(
            !received
                .windows(secret.len())
                .any(|w| w == secret.as_bytes()),
            "the backup host sent '{secret}' to the database host"
        );
    }
    assert!(
        incr_err.contains(&format!(
            "{STANZA}/backup/{full_label}/backup.manifest: unchanged; read from the object cache"
        )),
        "the prior manifest crossed the line: {incr_err}"
    );
    assert_sent_as_patch(&incr_err, &incr_label);
    // The full's manifest and frames were sealed by the agent, under its session key.
    let full_dir = h.backup_repo.join(STANZA).join("backup").join(&full_label);
    let full_manifest = std::fs::read(full_dir.join("backup.manifest")).unwrap();
    assert!(pgstrata_repo::cipher::is_sealed(&full_manifest));
    assert_eq!(
        full_manifest[8],
        pgstrata_repo::cipher::SEAL_VERSION_SESSION,
        "the full's manifest is not sealed under a session key"
    );
    let a_pack = std::fs::read_dir(full_dir.join("pack"))
        .unwrap()
        .next()
        .expect("a pack")
        .unwrap()
        .path();
    let pack = std::fs::read(a_pack).unwrap();
    assert!(
        pack.starts_with(pgstrata_repo::cipher::FRAME_SESSION_MAGIC),
        "the full's frames are not sealed under a session key"
    );
    // Sealed on the backup host, as every object of an encrypted stanza.
    let stored = std::fs::read(
        h.backup_repo
            .join(STANZA)
            .join("backup")
            .join(&incr_label)
            .join("backup.manifest"),
    )
    .unwrap();
    assert!(
        pgstrata_repo::cipher::is_sealed(&stored),
        "the rebuilt manifest is stored in the clear"
    );
    let expected = env.hashes();
    h.assert_restores_on_db_host(
        "restored",
        &["--type=immediate"],
        &expected,
        "the encrypted incremental restored differs",
    );
    give_to_pg_user(&env.scratch.path);
}

/// backup-standby with the standby on another host (standby-remote): the backup runs on
/// the standby's host, reads relation files there, and reads the primary's other files
/// through its connection; a WAL-tracked incremental finds the current segment in the
/// standby's pg_wal. Both restore equal to the primary.
#[test]
fn a_backup_runs_on_the_standby_host_and_reads_the_primary_over_its_connection() {
    let h = TwoHosts::new("standby-remote");
    let env = &h.env;
    run_ok(h.backup_host(&["stanza-create"]));
    env.pgbench_init(2);
    let standby = crate::standby::start_standby(env);
    // The standby's host has its own configuration: its standby, and the primary's
    // connection (no pg-path: the primary's data directory is not there). The backup
    // host only says where that host is. (One OS user stands for both database hosts
    // here: its key's forced command now names the standby host's configuration.)
    let standby_config = env.scratch.join("standby-host.toml");
    std::fs::write(
        &standby_config,
        format!(
            "[global]\nlog-level-file = \"off\"\n[{STANZA}]\npg-host = \"{}\"\npg-port = {}\npg-user = \"postgres\"\nbackup-standby = true\nstandby-path = \"{}\"\nstandby-host = \"{}\"\nstandby-port = {}\n",
            env.cluster.socket_dir.display(),
            env.cluster.port,
            standby.data.display(),
            standby.socket_dir.display(),
            standby.port
        ),
    )
    .unwrap();
    give_to_pg_user(&standby_config);
    h.ssh
        .force_command(
            PG_OS_USER,
            &format!(
                "{} agent run --config={}",
                exe().display(),
                standby_config.display()
            ),
        )
        .unwrap();
    let on_standby = [
        "--backup-standby".to_string(),
        format!("--standby-remote={PG_OS_USER}@standby-host"),
        format!("--standby-remote-cmd={}", exe().display()),
        "--start-fast".to_string(),
        "--process-max=2".to_string(),
    ];
    let backup = |extra: &[&str]| {
        let mut args: Vec<&str> = on_standby.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        args.push("backup");
        let out = h.backup_host(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "backup on the standby host failed: {err}"
        );
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), err)
    };
    let (full, err) = backup(&["--type=full"]);
    assert!(full.ends_with('F'), "{full}");
    assert!(err.contains("over its connection"), "{err}");
    assert!(err.contains("reading relation files from"), "{err}");

    env.pgbench(&["-t", "300", "-c", "2"]);
    env.sql("DELETE FROM pgbench_accounts WHERE aid % 70 = 0; CREATE TABLE added AS SELECT generate_series(1, 5000) AS x");
    env.flush_wal();
    let (incr, err) = backup(&["--type=incr", "--track=wal"]);
    assert!(incr.ends_with('I'), "{incr}");
    assert!(
        err.contains("changed blocks come from the block-change maps"),
        "{err}"
    );
    let expected = env.hashes();
    h.assert_restores_on_db_host(
        "restored-from-standby",
        &["--type=immediate", &format!("--set={incr}")],
        &expected,
        "the backup taken on the standby host differs",
    );
    standby.stop().unwrap();
}
