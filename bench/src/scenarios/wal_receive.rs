//! `wal_receive`: what streaming WAL into the repository costs the server, and what it
//! saves (issue 45). pgbench -i -s SCALE, settled; archive_command pushes to a local
//! repository as usual. Then per case, with `pgstrata wal-receive` running as asked:
//!
//! - `none` (no receiver), `async` and `sync` (`wal-receive-synchronous`, the slot named in
//!   `synchronous_standby_names`), into the local repository and into S3 (moto behind the
//!   test kit's proxy, DELAY_MS a request);
//! - pgbench (tpcb-like, CLIENTS clients, SECONDS seconds): TPS and mean latency;
//! - one client committing one-row inserts for SECONDS seconds: the commit latency, which
//!   synchronous mode lengthens by a repository write;
//! - the receiver's CPU (user + system over the run's wall time) and peak RSS.
//!
//! Last, the loss of asynchronous mode, measured: a client inserts a row with its time
//! every 2 ms, the primary is stopped with `-m immediate` mid-run, and restarted (crash
//! recovery keeps every committed row); a restore from the repository (archive and
//! received WAL) to the end is compared with it: rows and seconds of commits missing.
//! pgBackRest streams no WAL (its issue 2233): its loss is up to archive_timeout.
//!
//! Options: --scale N (10) --clients N (4) --seconds N (15) --delay-ms MS (20)

use super::load_settled_pgbench;
use super::s3_latency::{S3Proxy, BUCKET};
use crate::args::Args;
use crate::harness::{Bench, STANZA};
use crate::results::Row;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Opts {
    scale: u64,
    clients: u64,
    seconds: u64,
    delay_ms: u64,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        Ok(Opts {
            scale: a.uint("scale", 10, 1)?,
            clients: a.uint("clients", 4, 1)?,
            seconds: a.uint("seconds", 15, 1)?,
            delay_ms: a.uint("delay-ms", 20, 0)?,
        })
    }

    pub fn params(&self) -> String {
        format!(
            "scale={} clients={} seconds={} delay-ms={}",
            self.scale, self.clients, self.seconds, self.delay_ms
        )
    }
}

/// The slot (and application name) of the benchmark stanza's receiver.
const SLOT: &str = "pgstrata_bench";

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    let moto = pgstrata_testkit::S3Server::start(BUCKET)?;
    let proxy = S3Proxy::start(o.delay_ms, 0, moto.port, None)?;
    load_settled_pgbench(b, o.scale, 0)?;
    let tool = b.pgstrata.first().cloned().ok_or("no pgstrata binary")?;
    b.results.declare(&[tool.label.as_str()]);
    let local = b.dir("repo-walrcv-local")?;
    pgstrata_testkit::give_to_pg_user(&local);
    let local_cfg = config(
        b,
        "local",
        &format!("repo-path = \"{}\"\n", local.display()),
    )?;
    let s3_cfg = config(
        b,
        "s3",
        &format!(
            "repo-path = \"/bench-walrcv\"\nrepo-type = \"s3\"\nrepo-s3-bucket = \"{BUCKET}\"\n\
             repo-s3-endpoint = \"http://127.0.0.1:{}\"\nrepo-s3-region = \"us-east-1\"\n\
             repo-s3-uri-style = \"path\"\nrepo-s3-key = \"test\"\nrepo-s3-key-secret = \"test\"\n",
            proxy.port
        ),
    )?;
    for cfg in [&local_cfg, &s3_cfg] {
        let mut c = pgstrata(&tool.bin, cfg);
        c.arg("stanza-create");
        b.run("stanza-create", &mut c, false)?;
    }
    let push = format!(
        "{} --config={} --stanza={STANZA} archive-push \"$1\"",
        tool.bin.display(),
        local_cfg.display()
    );
    b.archive_to(&[push])?;
    let insert = b.scratch.join("insert.sql");
    std::fs::write(&insert, "INSERT INTO commits VALUES (clock_timestamp());\n")
        .map_err(|e| e.to_string())?;
    pgstrata_testkit::give_to_pg_user(&insert);
    b.sql("CREATE TABLE commits (at timestamptz)")?;
    let cases: [(&str, Option<(&PathBuf, bool)>); 5] = [
        ("none", None),
        ("async, local", Some((&local_cfg, false))),
        ("sync, local", Some((&local_cfg, true))),
        ("async, S3", Some((&s3_cfg, false))),
        ("sync, S3", Some((&s3_cfg, true))),
    ];
    for (case, receiver) in cases {
        measure_case(b, o, &tool, case, receiver, &insert)?;
    }
    measure_async_loss(b, &tool, &local_cfg, &insert)?;
    drop(moto);
    Ok(())
}

/// A config file for the receiver and the commands of one repository.
fn config(b: &Bench, name: &str, repo: &str) -> Result<PathBuf, String> {
    let c = b.cluster();
    let path = b.scratch.join(&format!("walrcv-{name}.toml"));
    let body = format!(
        "[global]\n{repo}pg-host = \"{}\"\npg-port = {}\npg-user = \"postgres\"\npg-path = \"{}\"\n\
         lock-path = \"{}\"\nstate-path = \"{}\"\nwal-receive-slot = \"{SLOT}\"\n",
        c.socket_dir.display(),
        c.port,
        c.data.display(),
        b.scratch.join("walrcv-locks").display(),
        b.scratch.join(&format!("walrcv-state-{name}")).display(),
    );
    std::fs::write(&path, body).map_err(|e| e.to_string())?;
    pgstrata_testkit::give_to_pg_user(&path);
    Ok(path)
}

fn pgstrata(bin: &Path, cfg: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg(format!("--config={}", cfg.display()))
        .arg(format!("--stanza={STANZA}"));
    c
}

/// A running receiver: its process (found by its config file's name) sampled for CPU and
/// memory, killed when done.
struct Receiver {
    child: std::process::Child,
    pid: u32,
    ticks_at_start: u64,
    started: Instant,
}

impl Receiver {
    fn start(bin: &Path, cfg: &Path, synchronous: bool) -> Result<Receiver, String> {
        let mut c = pgstrata_testkit::pg_command(bin);
        c.arg(format!("--config={}", cfg.display()))
            .arg(format!("--stanza={STANZA}"))
            .arg(format!("--wal-receive-synchronous={synchronous}"))
            .arg("wal-receive")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let child = c.spawn().map_err(|e| e.to_string())?;
        let pattern = format!("^{} --config={}", bin.display(), cfg.display());
        let deadline = Instant::now() + Duration::from_secs(30);
        let pid = loop {
            let out = Command::new("pgrep")
                .args(["-f", &pattern])
                .output()
                .map_err(|e| e.to_string())?;
            if let Some(pid) = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
            {
                break pid;
            }
            if Instant::now() > deadline {
                return Err("wal-receive did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Receiver {
            child,
            pid,
            ticks_at_start: cpu_ticks(pid),
            started: Instant::now(),
        })
    }

    /// CPU share of one core since the start, and peak RSS (KiB); then stop it.
    fn finish(mut self) -> (f64, u64) {
        let ticks = cpu_ticks(self.pid).saturating_sub(self.ticks_at_start);
        let hz = 100.0; // USER_HZ on Linux
        let cpu = ticks as f64 / hz / self.started.elapsed().as_secs_f64();
        let rss = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            })
            .unwrap_or(0);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        (cpu, rss)
    }
}

/// utime + stime of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat, 12 and 13 after the command name's ')'.
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

/// Wait until the receiver streams (and, synchronous, counts as a synchronous standby).
fn wait_streaming(b: &Bench, synchronous: bool) -> Result<(), String> {
    let want = if synchronous { "sync" } else { "async" };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = b.sql(&format!(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{SLOT}' AND state = 'streaming'"
        ))?;
        if state.trim() == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the receiver is not streaming as {want} ({state:?})"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `tps = N` and `latency average = N ms` from pgbench's report.
fn pgbench_figures(out: &str) -> (f64, f64) {
    let grab = |prefix: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    (grab("tps = "), grab("latency average = "))
}

fn measure_case(
    b: &mut Bench,
    o: &Opts,
    tool: &crate::tools::Tool,
    case: &str,
    receiver: Option<(&PathBuf, bool)>,
    insert: &Path,
) -> Result<(), String> {
    let sync = receiver.is_some_and(|(_, s)| s);
    b.sql(&format!(
        "ALTER SYSTEM SET synchronous_standby_names = '{}'",
        if sync { SLOT } else { "" }
    ))?;
    b.sql("SELECT pg_reload_conf()")?;
    let running = match receiver {
        Some((cfg, synchronous)) => {
            let r = Receiver::start(&tool.bin, cfg, synchronous)?;
            wait_streaming(b, synchronous)?;
            Some(r)
        }
        None => None,
    };
    let secs = o.seconds.to_string();
    let clients = o.clients.to_string();
    let load = b
        .cluster()
        .pgbench(&["-n", "-c", &clients, "-j", "2", "-T", &secs, "postgres"])?;
    let (tps, latency) = pgbench_figures(&load);
    let one = b.cluster().pgbench(&[
        "-n",
        "-c",
        "1",
        "-T",
        &secs,
        "-f",
        &insert.display().to_string(),
        "postgres",
    ])?;
    let (commits, commit_ms) = pgbench_figures(&one);
    let usage = running.map(Receiver::finish);
    eprintln!(
        "[bench] wal_receive {case}: pgbench {tps:.0} tps ({latency:.2} ms), one client {commits:.0} commits/s ({commit_ms:.3} ms){}",
        usage
            .map(|(cpu, rss)| format!(", receiver {:.0} % of a core, {} MB", cpu * 100.0, rss / 1024))
            .unwrap_or_default()
    );
    let label = tool.label.as_str();
    let rec = |b: &mut Bench, step: &str, v: f64, unit: &str| {
        b.results
            .record(Row::text(case, step, label, &format!("{v:.2} {unit}")))
    };
    rec(b, "pgbench TPS", tps, "tps")?;
    rec(b, "pgbench latency", latency, "ms")?;
    rec(b, "one-row commit latency", commit_ms, "ms")?;
    if let Some((cpu, rss)) = usage {
        rec(b, "receiver CPU", cpu * 100.0, "% of a core")?;
        rec(b, "receiver peak RSS", rss as f64 / 1024.0, "MB")?;
    }
    Ok(())
}

/// Asynchronous mode's loss: rows committed on the primary (crash recovery keeps them all)
/// against rows a restore from the repository holds, when the primary stops mid-run.
fn measure_async_loss(
    b: &mut Bench,
    tool: &crate::tools::Tool,
    cfg: &Path,
    insert: &Path,
) -> Result<(), String> {
    let bin = tool.bin.as_path();
    b.sql("ALTER SYSTEM SET synchronous_standby_names = ''")?;
    b.sql("SELECT pg_reload_conf()")?;
    b.sql("TRUNCATE commits")?;
    // A backup to restore from: the load's data.
    let mut backup = pgstrata(bin, cfg);
    backup.args(["--start-fast", "--type=full", "backup"]);
    b.run("backup-for-loss", &mut backup, false)?;
    let receiver = Receiver::start(bin, cfg, false)?;
    wait_streaming(b, false)?;
    let mut load = b
        .cluster()
        .pgbench_spawn(&[
            "-n",
            "-c",
            "1",
            "-R",
            "500",
            "-T",
            "30",
            "-f",
            &insert.display().to_string(),
            "postgres",
        ])
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(5300));
    let c = b.cluster();
    let mut stop = c.bin.cmd("pg_ctl");
    stop.arg("-D")
        .arg(&c.data)
        .args(["-m", "immediate", "-w", "stop"]);
    pgstrata_testkit::run_ok(&mut stop).map_err(|e| e.to_string())?;
    let _ = load.wait();
    let _ = receiver.finish();
    b.archive_nowhere();
    b.cluster().start()?;
    let count = "SELECT count(*), extract(epoch FROM max(at)) FROM commits";
    let primary = b.sql(count)?;
    let restored_dir = b.dir("walrcv-restored")?;
    std::fs::remove_dir_all(&restored_dir).map_err(|e| e.to_string())?;
    let mut restore = pgstrata(bin, cfg);
    restore.args([
        &format!("--pg-path={}", restored_dir.display()),
        "--archive-mode=off",
        "--target-action=promote",
        "restore",
    ]);
    b.run("restore-after-loss", &mut restore, false)?;
    let restored =
        pgstrata_testkit::Cluster::adopt(&b.cluster().bin, &restored_dir, &b.scratch.path);
    restored.start()?;
    restored.wait_for_promotion(Duration::from_secs(120))?;
    let got = restored.psql("postgres", count)?;
    restored.stop()?;
    let parse = |s: &str| -> (u64, f64) {
        let mut f = s.trim().split('|');
        (
            f.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            f.next().and_then(|v| v.parse().ok()).unwrap_or(0.0),
        )
    };
    let ((committed, last), (kept, kept_last)) = (parse(&primary), parse(&got));
    let lost = committed.saturating_sub(kept);
    let seconds = (last - kept_last).max(0.0);
    eprintln!(
        "[bench] wal_receive async loss: {committed} committed, {kept} restored: {lost} rows, the last {seconds:.2} s of commits (flush interval 1 s)"
    );
    b.results.record(Row::text(
        "async, local",
        "loss when the primary stops",
        &tool.label,
        &format!("{lost} of {committed} rows, {seconds:.2} s of commits"),
    ))?;
    Ok(())
}
