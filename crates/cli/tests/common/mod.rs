//! Shared fixture for the integration tests: a real cluster archiving into a real
//! repository through the real `pgstrata` binary, run as the PostgreSQL OS user.
#![allow(dead_code)]

use pgstrata_testkit::{give_to_pg_user, pg_command, Cluster, PgBin, Scratch};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

pub const STANZA: &str = "test";

/// Memory (KiB) of the Argon2id of key files the tests create: the default 64 MiB per
/// command would only slow the suite down.
pub const TEST_KDF_MEMORY_KIB: &str = "1024";

/// The binary under test, copied where the postgres user can run it whatever the
/// checkout's permissions.
pub fn exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        // Copies left by earlier runs (a test binary has no exit hook): 250 MB each.
        for e in std::fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(pid) = name.strip_prefix("pgstrata-bin-") else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let dir = std::env::temp_dir().join(format!("pgstrata-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        give_to_pg_user(&dir);
        let dest = dir.join("pgstrata");
        std::fs::copy(env!("CARGO_BIN_EXE_pgstrata"), &dest).unwrap();
        give_to_pg_user(&dest);
        dest
    })
}

pub struct Env {
    pub cluster: Cluster,
    pub repo: PathBuf,
    /// A config file holding the repository settings (object-store repositories).
    pub config: Option<PathBuf>,
    pub scratch: Scratch,
}

impl Env {
    pub fn new(name: &str) -> Env {
        Env::with_bin(
            name,
            &PgBin::default_install().expect("PostgreSQL 15 server binaries (run .ci/setup)"),
        )
    }

    pub fn with_bin(name: &str, bin: &PgBin) -> Env {
        Env::build(name, bin, None, &[], "lz4")
    }

    /// A PostgreSQL 15 cluster made with extra initdb arguments.
    pub fn with_initdb_args(name: &str, initdb_args: &[&str]) -> Env {
        Env::build(
            name,
            &PgBin::default_install().expect("PostgreSQL 15"),
            None,
            initdb_args,
            "lz4",
        )
    }

    /// A cluster whose repository settings come from a config file with `[global]` body
    /// `repo_toml` (used for object-store repositories).
    pub fn with_config(name: &str, repo_toml: &str) -> Env {
        Env::with_config_compress(name, repo_toml, "lz4")
    }

    /// Like `with_config`, archive_command compressing with `compress_type`. In
    /// `repo_toml`, `{repo}` stands for the local repository directory.
    pub fn with_config_compress(name: &str, repo_toml: &str, compress_type: &str) -> Env {
        Env::build(
            name,
            &PgBin::default_install().expect("PostgreSQL 15"),
            Some(repo_toml),
            &[],
            compress_type,
        )
    }

    fn build(
        name: &str,
        bin: &PgBin,
        repo_toml: Option<&str>,
        initdb_args: &[&str],
        archive_compress: &str,
    ) -> Env {
        let scratch = Scratch::new(name);
        let repo = scratch.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        give_to_pg_user(&repo);
        let config = repo_toml.map(|body| {
            let p = scratch.join("pgstrata.toml");
            let body = body.replace("{repo}", &repo.display().to_string());
            std::fs::write(&p, format!("[global]\n{body}\n")).unwrap();
            give_to_pg_user(&p);
            // It holds keys: readable by its owner only, as the README asks.
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            p
        });
        let location = match &config {
            Some(c) => format!("--config={}", c.display()),
            None => format!("--repo-path={}", repo.display()),
        };
        let archive_command = format!(
            "{} --stanza={STANZA} {location} --compress-type={archive_compress} archive-push %p",
            exe().display()
        );
        let cluster =
            Cluster::init_with(bin, &scratch.path, &archive_command, initdb_args).expect("initdb");
        cluster.start().expect("start cluster");
        Env {
            cluster,
            repo,
            config,
            scratch,
        }
    }

    /// pgstrata as the PostgreSQL OS user, with the connection and repository settings
    /// given through the environment (each command takes the ones that apply to it).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = pg_command(exe());
        self.env(&mut c);
        c.args(args);
        c
    }

    /// pgstrata as the invoking user (root in CI): used to test ownership on restore.
    pub fn cmd_as_invoker(&self, args: &[&str]) -> Command {
        let mut c = Command::new(exe());
        self.env(&mut c);
        c.args(args);
        c
    }

    fn env(&self, c: &mut Command) {
        match &self.config {
            Some(cfg) => c.env("PGSTRATA_CONFIG", cfg),
            None => c.env("PGSTRATA_REPO_PATH", &self.repo),
        };
        c.env("PGSTRATA_STANZA", STANZA)
            .env("PGSTRATA_STATE_PATH", self.scratch.join("host-state"))
            .env("PGSTRATA_PG_PATH", &self.cluster.data)
            .env("PGSTRATA_PG_HOST", &self.cluster.socket_dir)
            .env("PGSTRATA_PG_PORT", self.cluster.port.to_string())
            .env("PGSTRATA_PG_USER", "postgres")
            .env(
                pgstrata_repo::cipher::TEST_KDF_MEMORY_ENV,
                TEST_KDF_MEMORY_KIB,
            );
    }

    pub fn ok(&self, args: &[&str]) -> String {
        run_ok(self.cmd(args))
    }

    pub fn stanza_create(&self) {
        self.ok(&["stanza-create"]);
    }

    pub fn backup(&self, extra: &[&str]) -> String {
        let mut args = vec!["--start-fast", "--process-max=2", "backup"];
        args.extend_from_slice(extra);
        self.ok(&args).trim().to_string()
    }

    /// Restore into scratch/`name`, start it, wait until it accepts writes.
    pub fn restore_and_start(&self, name: &str, extra: &[&str]) -> Cluster {
        let target = self.scratch.join(name);
        let pg_path = format!("--pg-path={}", target.display());
        // A verification copy must not archive into the source's repository: its new
        // timeline would change what later restores of the source replay.
        let mut args = vec![pg_path.as_str(), "--process-max=2", "--archive-mode=off"];
        args.extend_from_slice(extra);
        if !extra.iter().any(|a| a.starts_with("--target-action")) {
            args.push("--target-action=promote");
        }
        args.push("restore");
        // Restore as the invoking user: as root this also proves ownership is restored.
        run_ok(self.cmd_as_invoker(&args));
        let c = Cluster::adopt(&self.cluster.bin, &target, &self.scratch.path);
        c.start().expect("start restored cluster");
        c.wait_for_promotion(Duration::from_secs(180))
            .expect("restored cluster recovers");
        c
    }

    /// Restore backup `label` to its end (`--type=immediate --set=LABEL`) into
    /// scratch/`name`, start it, and assert its content equals `expected` (the source's
    /// [`Env::hashes`] when the backup was taken); returns it running.
    pub fn restore_set_exactly(
        &self,
        name: &str,
        label: &str,
        expected: &BTreeMap<String, String>,
    ) -> Cluster {
        let c = self.restore_and_start(name, &["--type=immediate", &format!("--set={label}")]);
        assert_eq!(
            &c.content_hashes().unwrap(),
            expected,
            "{name}: backup {label} restored differs from the source"
        );
        c
    }

    /// `pgbench -i` at `scale` (quietly) into database postgres.
    pub fn pgbench_init(&self, scale: u32) {
        self.pgbench(&["-i", "-s", &scale.to_string(), "-q"]);
    }

    /// pgbench with `args` against database postgres.
    pub fn pgbench(&self, args: &[&str]) {
        let mut args = args.to_vec();
        args.push("postgres");
        self.cluster.pgbench(&args).expect("pgbench");
    }

    pub fn hashes(&self) -> BTreeMap<String, String> {
        self.cluster.content_hashes().expect("hash source")
    }

    pub fn sql(&self, sql: &str) -> String {
        self.cluster.psql("postgres", sql).expect("sql")
    }

    /// Create tablespace `name` in a new directory of the scratch space (the cluster's
    /// user owns it): its location.
    pub fn create_tablespace(&self, name: &str) -> std::path::PathBuf {
        let dir = self.scratch.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        pgstrata_testkit::give_to_pg_user(&dir);
        self.sql(&format!(
            "CREATE TABLESPACE {name} LOCATION '{}'",
            dir.display()
        ));
        dir
    }

    /// Switch WAL and wait until the switched segment is archived (pgstrata check does both).
    pub fn flush_wal(&self) {
        self.ok(&["check"]);
    }

    pub fn info_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["--output=json", "info"])).expect("info json")
    }
}

pub fn run_ok(mut c: Command) -> String {
    let out = c.output().expect("run pgstrata");
    assert!(
        out.status.success(),
        "{c:?} failed with {}:\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Run expecting failure; returns (exit code, stderr).
pub fn run_fail(mut c: Command) -> (i32, String) {
    let out: Output = c.output().expect("run pgstrata");
    assert!(
        !out.status.success(),
        "{c:?} should have failed but succeeded:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Every file under `dir` with its size, for "nothing was written" checks. A write in
/// flight (the archiver pushing WAL meanwhile) is not an object yet: the local store's
/// staging files (`NAME#N`), and files that vanish while being listed, are left out.
pub fn tree(dir: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, u64>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                let p = e.path();
                if e.file_name().to_string_lossy().contains('#') {
                    continue;
                }
                let Ok(md) = std::fs::symlink_metadata(&p) else {
                    continue;
                };
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                if md.is_dir() {
                    out.insert(rel + "/", 0);
                    walk(base, &p, out);
                } else {
                    out.insert(rel, md.len());
                }
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// The block-change maps archive-push stored in local repository `repo`, as (key of the
/// segment's object, encoded map), in key order: each from inside its segment's object, or
/// from the `.map` object beside a segment archived without one inside.
pub fn archived_maps(repo: &Path) -> Vec<(String, Vec<u8>)> {
    use pgstrata_repo::wal_object;
    let keys = tree(repo).into_keys().collect::<Vec<_>>();
    let is_segment = |k: &str| {
        k.contains("/archive/")
            && pgstrata_pg::lsn::is_segment_name(k.rsplit('/').next().unwrap_or_default())
    };
    let mut out = Vec::new();
    for key in keys.iter().filter(|k| is_segment(k)) {
        let obj = std::fs::read(repo.join(key)).unwrap();
        match wal_object::embedded_map(&obj, key).unwrap() {
            Some(map) => out.push((key.clone(), map.to_vec())),
            None => {
                if let Ok(map) = std::fs::read(repo.join(format!("{key}.map"))) {
                    out.push((key.clone(), map));
                }
            }
        }
    }
    out
}

/// Replace the block-change map inside segment object `key` of local repository `repo`
/// with `map` (damage, or a test's forgery); `None` leaves the segment without a map, as
/// an older writer that crashed before writing its `.map` would have.
pub fn rewrite_map(repo: &Path, key: &str, map: Option<&[u8]>) {
    use pgstrata_repo::wal_object;
    let path = repo.join(key);
    let plain = wal_object::without_map(&std::fs::read(&path).unwrap(), key).unwrap();
    let _ = std::fs::remove_file(repo.join(format!("{key}.map")));
    let rewritten = match map {
        Some(m) => wal_object::with_map(&plain, m),
        None => plain,
    };
    std::fs::write(&path, rewritten).unwrap();
}

/// pg_checksums --check on a stopped cluster.
pub fn pg_checksums_ok(c: &Cluster) {
    let out = c
        .bin
        .client("pg_checksums")
        .arg("--check")
        .arg("-D")
        .arg(&c.data)
        .output()
        .expect("run pg_checksums");
    assert!(
        out.status.success(),
        "pg_checksums --check failed on the restored cluster:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file under `dir` (following no links) with the BLAKE3 of its content; links with
/// their targets. Two equal maps mean two identical directory trees.
pub fn content_tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(d).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            if md.file_type().is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", std::fs::read_link(&p).unwrap().display()),
                );
            } else if md.is_dir() {
                out.insert(rel.clone() + "/", String::new());
                walk(base, &p, out);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.insert(rel, format!("{} {}", bytes.len(), blake3_hex(&bytes)));
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

fn blake3_hex(b: &[u8]) -> String {
    blake3::hash(b).to_hex().to_string()
}

/// Restore into scratch/`name` without starting it; returns the directory.
pub fn restore_only(env: &Env, name: &str, extra: &[&str]) -> PathBuf {
    let target = env.scratch.join(name);
    let pg_path = format!("--pg-path={}", target.display());
    let mut args = vec![
        pg_path.as_str(),
        "--process-max=2",
        "--archive-mode=off",
        "--type=immediate",
        "--target-action=promote",
    ];
    args.extend_from_slice(extra);
    args.push("restore");
    run_ok(env.cmd_as_invoker(&args));
    target
}

/// Count pack objects written by one backup.
pub fn pack_count(env: &Env, label: &str) -> usize {
    tree(&env.repo)
        .keys()
        .filter(|k| k.contains(&format!("backup/{label}/pack/")) && !k.ends_with('/'))
        .count()
}

/// Start `pgstrata ARGS` and SIGKILL it once it has written a pack object whose key contains
/// `marker` (mid-backup). Panics if it finishes first.
pub fn kill_midway(env: &Env, args: &[&str], marker: &str) {
    let mut child = env.cmd(args).spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while !tree(&env.repo)
        .keys()
        .any(|k| k.contains(marker) && !k.ends_with('/'))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no pack written within 180 s"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "pgstrata finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // As root the child is runuser: kill pgstrata itself, found by its command line.
    let pattern = format!("pgstrata {}", args.join(" "));
    let pids = Command::new("pgrep")
        .args(["-f", &pattern])
        .output()
        .unwrap();
    let killed: Vec<String> = String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    for pid in &killed {
        let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.kill();
    child.wait().unwrap();
    // Killed is not yet gone: until the process is reaped (by init, once runuser is gone)
    // its pid is alive, and the stanza lock it held is rightly taken as held.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while killed
        .iter()
        .any(|pid| Path::new("/proc").join(pid).exists())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed pgstrata ({killed:?}) is still not reaped after 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Backup `label`'s manifest in the local repository `repo`, read whole and checked as
/// pgstrata reads it (from format 4, with the entries of its parts).
pub fn manifest(repo: &Path, label: &str) -> pgstrata_repo::manifest::Manifest {
    let storage = pgstrata_repo::Storage::local(repo).unwrap();
    block_on(pgstrata_repo::manifest::Manifest::load(
        &storage, STANZA, label,
    ))
    .unwrap()
}

/// Run `f` to completion on a runtime of its own.
pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// [`manifest`], with every file's map loaded (format 2 stores those of larger files
/// apart).
pub fn manifest_with_maps(repo: &Path, label: &str) -> pgstrata_repo::manifest::Manifest {
    let mut m = manifest(repo, label);
    let storage = pgstrata_repo::Storage::local(repo).unwrap();
    block_on(m.load_maps(&storage)).unwrap();
    m
}

/// The string `field` of each object of JSON array `list`: e.g. the labels of `info`'s
/// `backups`.
pub fn each_str<'a>(list: &'a serde_json::Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|o| o[field].as_str().unwrap())
        .collect()
}

/// The labels of the backups `info --output=json` lists, oldest first.
pub fn backup_labels(info: &serde_json::Value) -> Vec<&str> {
    each_str(&info["backups"], "label")
}

/// Backup `label` as `info --output=json` lists it.
pub fn info_backup<'a>(info: &'a serde_json::Value, label: &str) -> &'a serde_json::Value {
    info["backups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["label"] == label)
        .unwrap_or_else(|| panic!("backup {label} not listed: {info}"))
}

/// The seed of a test's random choices: `PGSTRATA_TEST_SEED` to replay a run, else the
/// clock (print it, so a failure can be replayed).
pub fn test_seed() -> u64 {
    std::env::var("PGSTRATA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// The server's host is lost: `pg_ctl -m immediate stop`.
pub fn stop_at_once(c: &pgstrata_testkit::Cluster) {
    pgstrata_testkit::run_ok(c.bin.cmd("pg_ctl").arg("-D").arg(&c.data).args([
        "-m",
        "immediate",
        "-w",
        "stop",
    ]))
    .unwrap();
}
