//! What every scenario shares: the scratch directory, the source cluster (the test kit's
//! `Cluster`, with the benchmark's settings added), the archive command that pushes every WAL
//! segment to every repository being measured, and timed runs of one tool command.
//!
//! Timing: wall clock of the one command, after `sync` and a 1 s pause so that no command
//! pays for another one's writeback; the page cache is not dropped. Peak RSS, user and system
//! CPU come from `wait4` on the child: its rusage includes the descendants it waited for,
//! and `ru_maxrss` is the peak of the largest single process (pgstrata is one process;
//! pgBackRest runs `process-max` worker processes beside its main one).

use crate::results::{DiskTraffic, Measured, Results};
use crate::tools::Tool;
use pgstrata_testkit::{as_user, give_to_pg_user, Cluster, PgBin, Scratch, PG_OS_USER};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const STANZA: &str = "bench";

pub struct Bench {
    /// The device the scratch directory is on: its traffic is recorded around each command.
    disk: Option<String>,
    pub process_max: u64,
    pub runs: u64,
    pub verify: bool,
    /// `--step-limit`: how long a timed command may run before it is stopped.
    pub step_limit: Option<std::time::Duration>,
    pub pg: PgBin,
    pub scratch: Scratch,
    pub log_dir: PathBuf,
    pub pgstrata: Vec<Tool>,
    pub pgbackrest: Vec<Tool>,
    pub results: Results,
    pub cluster: Option<Cluster>,
    /// The content check, when the generic one (every table) does not fit the scenario.
    pub check_sql: Option<String>,
    archive_env: PathBuf,
    log_seq: usize,
}

impl Bench {
    pub fn new(
        scenario: &'static str,
        common: crate::args::Common,
        params: String,
    ) -> Result<Bench, String> {
        let pg = PgBin::major(common.pg_major).or_else(|_| PgBin::default_install())?;
        let mut scratch = Scratch::new(&format!("bench-{scenario}"));
        scratch.keep = common.keep;
        let log_dir = scratch.join("log");
        let bin_dir = scratch.join("bin");
        for d in [&log_dir, &bin_dir] {
            std::fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
            give_to_pg_user(d);
        }
        let pgstrata = common
            .pgstrata
            .iter()
            .map(|(label, path)| Tool::pgstrata(label, path, &bin_dir))
            .collect::<Result<Vec<_>, _>>()?;
        let pgbackrest = common
            .pgbackrest
            .iter()
            .map(|p| Tool::pgbackrest(p))
            .collect::<Result<Vec<_>, _>>()?;
        let tools: Vec<&Tool> = pgstrata.iter().chain(&pgbackrest).collect();
        let results = Results::create(&common.out_dir, scenario, &params, &tools, &pg)?;
        eprintln!("[bench] {scenario}: scratch {}", scratch.path.display());
        Ok(Bench {
            disk: crate::results::disk_device(&scratch.path),
            process_max: common.process_max,
            runs: common.runs,
            verify: common.verify,
            step_limit: common.step_limit,
            pg,
            archive_env: bin_dir.join("archive.env"),
            scratch,
            log_dir,
            pgstrata,
            pgbackrest,
            results,
            cluster: None,
            check_sql: None,
            log_seq: 0,
        })
    }

    pub fn cluster(&self) -> &Cluster {
        self.cluster.as_ref().expect("source cluster started")
    }

    /// A directory under the scratch directory, owned by the PostgreSQL user.
    pub fn dir(&self, name: &str) -> Result<PathBuf, String> {
        let d = self.scratch.join(name);
        std::fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
        give_to_pg_user(&d);
        Ok(d)
    }

    /// An empty data directory for a restore (mode 0700, owned by the PostgreSQL user).
    pub fn empty_data_dir(&self, name: &str) -> Result<PathBuf, String> {
        let d = self.scratch.join(name);
        let _ = std::fs::remove_dir_all(&d);
        let d = self.dir(name)?;
        pgstrata_testkit::set_mode(&d, 0o700)?;
        Ok(d)
    }

    /// Run a tool command as the PostgreSQL user with its output in the log directory.
    /// `timed` settles the page cache's writeback first.
    pub fn run(&mut self, name: &str, cmd: &mut Command, timed: bool) -> Result<Measured, String> {
        self.run_as(PG_OS_USER, name, cmd, timed)
    }

    /// As [`Bench::run`], as another OS user (the backup host's, in the two-host scenarios).
    pub fn run_as(
        &mut self,
        user: &str,
        name: &str,
        cmd: &mut Command,
        timed: bool,
    ) -> Result<Measured, String> {
        self.log_seq += 1;
        let base = self.log_dir.join(format!("{:04}-{name}", self.log_seq));
        let (out_path, err_path) = (base.with_extension("out"), base.with_extension("err"));
        let out = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
        let err = std::fs::File::create(&err_path).map_err(|e| e.to_string())?;
        as_user(cmd, user);
        cmd.current_dir(&self.scratch.path)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if timed {
            settle();
        }
        let disk_before = self.disk.as_deref().and_then(DiskTraffic::now);
        let limit = self.step_limit.filter(|_| timed);
        if limit.is_some() {
            // Its own process group, so that stopping it stops its workers too.
            std::os::unix::process::CommandExt::process_group(cmd, 0);
        }
        let t0 = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
        let stopper = limit.map(|l| stop_after(child.id() as i32, l));
        let (status, ru) = wait4(child.id() as i32)?;
        let seconds = t0.elapsed().as_secs_f64();
        let stopped_at_limit = stopper.is_some_and(Stopper::finish);
        let m = Measured {
            seconds,
            max_rss_kb: ru.ru_maxrss as u64,
            user: tv(ru.ru_utime),
            sys: tv(ru.ru_stime),
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
            disk: disk_before
                .zip(self.disk.as_deref().and_then(DiskTraffic::now))
                .map(|(before, after)| after.since(&before)),
            stopped_at_limit,
        };
        if stopped_at_limit {
            eprintln!("[bench] {name}: stopped at the step limit after {seconds:.0} s");
            return Ok(m);
        }
        if status != 0 {
            return Err(format!(
                "{name} failed (wait status {status}): {cmd:?}\n--- stdout ({}):\n{}\n--- stderr ({}):\n{}",
                out_path.display(),
                tail(&m.stdout, 30),
                err_path.display(),
                tail(&m.stderr, 30)
            ));
        }
        Ok(m)
    }

    /// initdb + start the source cluster with the benchmark's settings; its archive command
    /// pushes to whatever [`Bench::archive_to`] last listed.
    pub fn start_cluster(&mut self, extra_conf: &str) -> Result<(), String> {
        let script = self.scratch.join("bin/archive-pgstrata-and-pgbackrest.sh");
        // pgBackRest refuses to back up unless archive_command mentions "pgbackrest".
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n# archive_command of the benchmark cluster: push one segment to every repository listed in archive.env\n\
                 [ -f '{env}' ] || exit 0\n. '{env}'\n",
                env = self.archive_env.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        pgstrata_testkit::set_mode(&script, 0o755)?;
        let dir = self.dir("cluster")?;
        let cluster = Cluster::init(&self.pg, &dir, &format!("{} %p", script.display()))?;
        let conf = format!(
            "\n# pgstrata benchmark\nshared_buffers = 256MB\nmax_wal_size = 8GB\ncheckpoint_timeout = 30min\n\
             autovacuum = off\n{extra_conf}\n"
        );
        append(&cluster.data.join("postgresql.conf"), &conf)?;
        cluster.start()?;
        self.cluster = Some(cluster);
        Ok(())
    }

    /// Stop and remove the source cluster (scenarios that rebuild it per size).
    pub fn drop_cluster(&mut self) -> Result<(), String> {
        if let Some(c) = self.cluster.take() {
            c.stop()?;
            let _ = std::fs::remove_dir_all(self.scratch.join("cluster"));
        }
        Ok(())
    }

    /// Point the archive command at these repositories (atomically: the script reads the
    /// list at each call, so no reload is needed).
    pub fn archive_to(&self, push_commands: &[String]) -> Result<(), String> {
        let text: String = push_commands.iter().map(|c| c.clone() + "\n").collect();
        let tmp = self.archive_env.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &self.archive_env).map_err(|e| e.to_string())
    }

    pub fn archive_nowhere(&self) {
        let _ = std::fs::remove_file(&self.archive_env);
    }

    pub fn sql(&self, sql: &str) -> Result<String, String> {
        Ok(self.cluster().psql("postgres", sql)?)
    }

    /// Switch WAL and wait until the segment just completed, and everything before it, is
    /// archived: no push of earlier WAL then runs during the next timed command. Read from
    /// `archive_status` (`pg_stat_archiver.last_archived_wal` is the latest, not the highest).
    pub fn wal_switch_and_wait(&self) -> Result<(), String> {
        self.sql("SELECT txid_current()")?; // some WAL, so that the switch completes a segment
        let seg = self.sql("SELECT pg_walfile_name(pg_switch_wal())")?;
        let data = &self.cluster().data;
        let status = data.join("pg_wal/archive_status");
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let done = status.join(format!("{seg}.done")).exists()
                || !data.join("pg_wal").join(&seg).exists();
            let pending = std::fs::read_dir(&status)
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .any(|n| n.ends_with(".ready") && n[..24.min(n.len())] <= seg[..]);
            if done && !pending {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "WAL segment {seg} not archived within 300 s (see {})",
                    self.log_dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `pgbench -i -s SCALE` plus COPIES tables `<prefix>i` created from pgbench_accounts.
    /// Returns the large tables.
    pub fn load_pgbench(
        &self,
        scale: u64,
        copies: u64,
        prefix: &str,
    ) -> Result<Vec<String>, String> {
        eprintln!("[bench] pgbench -i -s {scale}, {copies} copies");
        self.cluster()
            .pgbench(&["-i", "-s", &scale.to_string(), "-q", "postgres"])?;
        let mut tables = vec!["pgbench_accounts".to_string()];
        for i in 1..=copies {
            self.sql(&format!(
                "CREATE TABLE {prefix}{i} AS SELECT * FROM pgbench_accounts"
            ))?;
            tables.push(format!("{prefix}{i}"));
        }
        Ok(tables)
    }

    /// What a correct restore must hold: per user table, its row count and a sum of row
    /// hashes (cheaper than the test kit's md5 of every row, for GB-sized tables).
    pub fn content_check(&self, cluster: &Cluster) -> Result<String, String> {
        if let Some(sql) = &self.check_sql {
            return Ok(cluster.psql("postgres", sql)?);
        }
        let tables = cluster.psql(
            "postgres",
            "SELECT format('%I', tablename) FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
        )?;
        if tables.is_empty() {
            return Ok(String::new());
        }
        let sql = tables
            .lines()
            .map(|t| {
                format!("SELECT '{t}', count(*), sum(abs(hashtext(x::text)::bigint)) FROM {t} x")
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        Ok(cluster.psql("postgres", &format!("SELECT * FROM ({sql}) s ORDER BY 1"))?)
    }

    pub fn source_check(&self) -> Result<String, String> {
        self.content_check(self.cluster())
    }

    /// Start a restored data directory (WAL replayed through the restore command the tool
    /// wrote), wait for promotion and compare its tables with `expected`.
    pub fn verify_restore(&self, data: &Path, expected: &str, tag: &str) -> Result<(), String> {
        eprintln!(
            "[bench] verify: starting the cluster restored in {}",
            data.display()
        );
        append(&data.join("postgresql.conf"), "\narchive_mode = off\n")?;
        let _ = std::fs::remove_file(data.join("postmaster.pid"));
        // The directory holds the socket, whose path goes into pg_ctl's -o: no spaces.
        let slug: String = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let dir = self.dir(&format!("verify-{slug}"))?;
        let restored = Cluster::adopt(&self.pg, data, &dir);
        restored.start()?;
        restored.wait_for_promotion(Duration::from_secs(600))?;
        let got = self.content_check(&restored)?;
        restored.stop()?;
        if got != expected {
            return Err(format!(
                "verify {tag}: the restored cluster differs from the source\nexpected:\n{expected}\ngot:\n{got}"
            ));
        }
        eprintln!("[bench] verify {tag}: restored contents equal the source");
        Ok(())
    }

    /// Bytes under a directory (`du -sb`), optionally excluding pg_wal.
    pub fn du(&self, path: &Path) -> u64 {
        dir_size(path, &mut |_| true)
    }
}

/// Bytes of the regular files under `path` whose path passes `keep`.
pub fn dir_size(path: &Path, keep: &mut dyn FnMut(&Path) -> bool) -> u64 {
    let Ok(rd) = std::fs::read_dir(path) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => dir_size(&p, keep),
                Ok(t) if t.is_file() && keep(&p) => e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => 0,
            }
        })
        .sum()
}

/// Regular files under `path`.
pub fn file_count(path: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(path) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => file_count(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

/// Flush dirty pages left by earlier steps, so no timed command pays for them.
pub fn settle() {
    unsafe { libc::sync() };
    std::thread::sleep(Duration::from_secs(1));
}

/// Write back and drop the page cache (as root), so that the next command reads from the
/// disk: a cold-cache measurement.
pub fn drop_page_cache() -> Result<(), String> {
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("drop the page cache (/proc/sys/vm/drop_caches, needs root): {e}"))
}

/// Stops a process group when it is still running at the step limit.
struct Stopper {
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<bool>,
}

/// Watch process group `pgid`: past `limit`, SIGTERM, and SIGKILL 10 s later.
fn stop_after(pgid: i32, limit: std::time::Duration) -> Stopper {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        use std::sync::mpsc::RecvTimeoutError::Timeout;
        if finished.recv_timeout(limit) != Err(Timeout) {
            return false;
        }
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        if finished.recv_timeout(std::time::Duration::from_secs(10)) == Err(Timeout) {
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        true
    });
    Stopper { done, thread }
}

impl Stopper {
    /// After the command ended: whether it was stopped.
    fn finish(self) -> bool {
        let _ = self.done.send(());
        self.thread.join().unwrap_or(false)
    }
}

fn wait4(pid: i32) -> Result<(i32, libc::rusage), String> {
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            return Ok((status, ru));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("wait4({pid}): {e}"));
        }
    }
}

fn tv(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("append to {}: {e}", path.display()))
}
