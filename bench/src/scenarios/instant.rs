//! Instant restore (issue 44): how soon a restored cluster answers, and how it serves while
//! its data arrives. pgbench -i -s SCALE plus COPIES copies, settled; a full backup into
//! pgstrata's repository and pgBackRest 2.59.1's (bundling, block incremental). Then:
//!
//! - per tool, a normal restore (`--type=immediate`): its time, then the cluster started and
//!   the first query (`SELECT count(*) FROM pgbench_branches`) answered: time from the
//!   restore's start; on pgstrata's, `pgbench -S` for SECONDS (the reference TPS);
//! - pgstrata `restore --instant`: its time, the first query's (from the restore's start),
//!   `pgbench -S` in windows of 5 s while it hydrates (TPS and how much was local at each
//!   window's end), the time until `instant-status --wait` returns (hydration complete,
//!   from the restore's start), `pgbench -S` for SECONDS once hydrated, and the serving
//!   process's peak RSS (VmHWM, read before it leaves).
//!
//! Options: --scale N (30) --copies N (8) --codec C (zst) --seconds N (10)

use super::{load_settled_pgbench, remove_repos, repos, stanza_create_all, PgbrMode};
use crate::args::Args;
use crate::harness::{append, Bench};
use crate::repos::{Repo, Setup};
use crate::results::{Measured, Row};
use pgstrata_testkit::Cluster;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Opts {
    scale: u64,
    copies: u64,
    codec: String,
    seconds: u64,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let o = Opts {
            scale: a.uint("scale", 30, 1)?,
            copies: a.uint("copies", 8, 0)?,
            codec: a.string("codec", "zst"),
            seconds: a.uint("seconds", 10, 1)?,
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }

    pub fn params(&self) -> String {
        format!(
            "scale={} copies={} codec={} seconds={}",
            self.scale, self.copies, self.codec, self.seconds
        )
    }
}

const CASE: &str = "full";
const FIRST_QUERY: &str = "SELECT count(*) FROM pgbench_branches";

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    load_settled_pgbench(b, o.scale, o.copies)?;
    let repos = repos(
        b,
        "instant",
        &o.codec,
        &[("", Setup::default())],
        &[PgbrMode::Block],
        &[],
    )?;
    stanza_create_all(b, &repos)?;
    b.wal_switch_and_wait()?;
    for r in &repos {
        let (m, _) = r.backup(b, "full", &[])?;
        b.results
            .record(Row::timed(CASE, "full backup", &r.label, 1, &m))?;
    }
    b.archive_nowhere();
    let mut reference_tps = None;
    for r in &repos {
        let tps = normal_restore(b, o, r)?;
        reference_tps = reference_tps.or(tps);
    }
    let pgstrata = repos
        .iter()
        .find(|r| r.is_pgstrata())
        .ok_or("no pgstrata repository")?;
    instant_restore(b, o, pgstrata, reference_tps.unwrap_or(0.0))?;
    remove_repos(b, &repos);
    Ok(())
}

/// Start the cluster restored in `data` (archiving off) and wait until it answers.
fn start(b: &Bench, data: &Path, tag: &str) -> Result<Cluster, String> {
    append(&data.join("postgresql.conf"), "\narchive_mode = off\n")?;
    let dir = b.dir(&format!("run-{tag}"))?;
    let c = Cluster::adopt(&b.pg, data, &dir);
    c.start()?;
    c.wait_for_promotion(Duration::from_secs(3600))?;
    c.psql("postgres", FIRST_QUERY)?;
    Ok(c)
}

/// `pgbench -S` for `seconds` against `c`: its TPS.
fn select_tps(c: &Cluster, seconds: u64) -> Result<f64, String> {
    let out = c.pgbench(&[
        "-n",
        "-S",
        "-c",
        "2",
        "-j",
        "2",
        "-T",
        &seconds.to_string(),
        "postgres",
    ])?;
    out.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")
                .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        })
        .ok_or_else(|| format!("no tps in pgbench's output:\n{out}"))
}

/// A timed step as a row with only a time.
fn seconds_row(step: &str, tool: &str, seconds: f64, note: String) -> Row {
    let m = Measured {
        seconds,
        ..Measured::default()
    };
    Row::timed(CASE, step, tool, 1, &m).note(note)
}

/// A restore by `r` with `args` into a new directory (`name`), timed, then the cluster
/// started and the first query answered, timed from the restore's start (`tag` names the
/// steps): the running cluster, its directory and when the restore started.
fn restore_and_answer(
    b: &mut Bench,
    r: &Repo,
    name: &str,
    args: &[&str],
    tag: &str,
) -> Result<(Cluster, PathBuf, Instant), String> {
    let dir = b.empty_data_dir(name)?;
    let t0 = Instant::now();
    let m = r.restore(b, &dir, args)?;
    b.results
        .record(Row::timed(CASE, &format!("restore{tag}"), &r.label, 1, &m))?;
    let c = start(b, &dir, name)?;
    b.results.record(seconds_row(
        &format!("first query (from the restore's start){tag}"),
        &r.label,
        t0.elapsed().as_secs_f64(),
        format!(
            "{FIRST_QUERY}: restore {:.2} s, then start and recovery",
            m.seconds
        ),
    ))?;
    Ok((c, dir, t0))
}

/// A normal restore by `r`, the first query after it, and (pgstrata) the reference TPS.
fn normal_restore(b: &mut Bench, o: &Opts, r: &Repo) -> Result<Option<f64>, String> {
    let (c, dir, _) = restore_and_answer(
        b,
        r,
        "restore-normal",
        &["--type=immediate", "--target-action=promote"],
        "",
    )?;
    let tps = if r.is_pgstrata() {
        let tps = select_tps(&c, o.seconds)?;
        b.results.record(Row::text(
            CASE,
            "pgbench -S TPS, normal restore",
            &r.label,
            &format!("{tps:.0} (2 clients, {} s)", o.seconds),
        ))?;
        Some(tps)
    } else {
        None
    };
    c.stop()?;
    std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(tps)
}

/// The instant directory's status, as the serving process last wrote it.
fn status(dir: &Path) -> Option<serde_json::Value> {
    let path = dir.with_file_name(format!(
        ".{}.pgstrata-instant/status.json",
        dir.file_name()?.to_string_lossy()
    ));
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn instant_restore(b: &mut Bench, o: &Opts, r: &Repo, reference: f64) -> Result<(), String> {
    let (c, dir, t0) = restore_and_answer(
        b,
        r,
        "restore-instant",
        &["--type=immediate", "--target-action=promote", "--instant"],
        " --instant",
    )?;
    // pgbench -S while hydrating, in windows.
    let mut window = 0;
    loop {
        let s = status(&dir).ok_or("no status.json")?;
        if s["state"] != "hydrating" {
            break;
        }
        window += 1;
        let tps = select_tps(&c, 5)?;
        let s = status(&dir).ok_or("no status.json")?;
        let pct = s["bytes_local"].as_f64().unwrap_or(0.0) * 100.0
            / s["bytes_total"].as_f64().unwrap_or(1.0).max(1.0);
        eprintln!(
            "[bench] instant: window {window}: {tps:.0} TPS ({:.2}x the normal restore's), {pct:.0} % local",
            tps / reference.max(1.0)
        );
        b.results.record(Row::text(
            CASE,
            &format!("pgbench -S TPS while hydrating, window {window}"),
            &r.label,
            &format!(
                "{tps:.0} ({:.2}x the normal restore's; {pct:.0} % local at its end, t = {:.0} s)",
                tps / reference.max(1.0),
                t0.elapsed().as_secs_f64()
            ),
        ))?;
    }
    let s = status(&dir).ok_or("no status.json")?;
    if s["state"] == "failed" {
        return Err(format!("instant restore failed: {s}"));
    }
    // instant-status --wait has returned by now (the state left hydrating): its time is
    // the status's last update.
    let hydrated =
        s["updated"].as_i64().unwrap_or(0) as f64 - (chrono_now() - t0.elapsed().as_secs_f64());
    b.results.record(seconds_row(
        "hydration complete (from the restore's start)",
        &r.label,
        hydrated.max(0.0),
        format!(
            "{} fetched, {} on-demand fetches ({:.1} ms on average)",
            s["bytes_fetched"], s["on_demand_fetches"], s["on_demand_latency_ms"]
        ),
    ))?;
    let pid = s["pid"].as_u64().unwrap_or(0);
    let hwm = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        });
    b.results.record(Row::text(
        CASE,
        "serving process peak RSS",
        &r.label,
        &hwm.map_or("gone".into(), |kb| format!("{:.1} MB", kb as f64 / 1024.0)),
    ))?;
    let tps = select_tps(&c, o.seconds)?;
    b.results.record(Row::text(
        CASE,
        "pgbench -S TPS once hydrated",
        &r.label,
        &format!(
            "{tps:.0} ({:.2}x the normal restore's)",
            tps / reference.max(1.0)
        ),
    ))?;
    c.stop()?;
    Ok(())
}

/// Seconds since the Unix epoch.
fn chrono_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
