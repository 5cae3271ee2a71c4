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
//!   process's peak RSS (VmHWM, read before it leaves). The windows alternate `pgbench -S`
//!   and pgbench's read-write transactions, each against the same on the normal restore;
//! - pgstrata `restore --instant` again, PostgreSQL not started: the time until hydration
//!   is complete, against the normal restore's;
//! - pgstrata `restore-table` of a table of about 10 MB (`victim`, created before the
//!   backup) to a time before a `DELETE` of a tenth of its rows: its time and the bytes it
//!   read from the repository, against a full restore, the first query and `pg_dump` of
//!   the table; the dump is checked to hold every row.
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
/// The table restore-table brings back: about 10 MB with its primary key.
const VICTIM_ROWS: u64 = 110_000;

/// What the instant restore is set against: the normal restore's TPS (`pgbench -S`, then
/// read-write), and its time with the first query and a `pg_dump` of the victim table.
#[derive(Default, Clone, Copy)]
struct Reference {
    select_tps: f64,
    write_tps: f64,
    restore_and_dump: f64,
    /// The normal restore alone.
    restore_seconds: f64,
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    load_settled_pgbench(b, o.scale, o.copies)?;
    b.sql(&format!(
        "CREATE TABLE victim (id int PRIMARY KEY, v text); \
         INSERT INTO victim SELECT g, md5(g::text) FROM generate_series(1, {VICTIM_ROWS}) g; \
         CHECKPOINT"
    ))?;
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
    let before_delete = delete_by_mistake(b)?;
    b.archive_nowhere();
    let mut reference = Reference::default();
    for r in &repos {
        if let Some(measured) = normal_restore(b, o, r)? {
            reference = measured;
        }
    }
    let pgstrata = repos
        .iter()
        .find(|r| r.is_pgstrata())
        .ok_or("no pgstrata repository")?;
    instant_restore(b, o, pgstrata, reference)?;
    idle_hydration(b, pgstrata, reference)?;
    restore_table(b, pgstrata, &before_delete, reference)?;
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

/// The accident restore-table undoes: a tenth of the victim table's rows deleted, a
/// moment after the time returned (the target), and the WAL archived.
fn delete_by_mistake(b: &mut Bench) -> Result<String, String> {
    std::thread::sleep(Duration::from_millis(1100));
    let before = b.sql("SELECT now()")?.trim().to_string();
    std::thread::sleep(Duration::from_millis(1100));
    b.sql("DELETE FROM victim WHERE id % 10 = 0")?;
    b.wal_switch_and_wait()?;
    Ok(before)
}

/// `pgbench -S` (`select_only`), else its read-write transactions, for `seconds` against
/// `c`: the TPS.
fn tps(c: &Cluster, seconds: u64, select_only: bool) -> Result<f64, String> {
    let seconds = seconds.to_string();
    let mut args = vec!["-n", "-c", "2", "-j", "2", "-T", &seconds, "postgres"];
    if select_only {
        args.insert(1, "-S");
    }
    let out = c.pgbench(&args)?;
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
/// steps): the running cluster, its directory, when the restore started and how long it
/// took.
fn restore_and_answer(
    b: &mut Bench,
    r: &Repo,
    name: &str,
    args: &[&str],
    tag: &str,
) -> Result<(Cluster, PathBuf, Instant, f64), String> {
    let dir = b.empty_data_dir(name)?;
    let m = r.restore(b, &dir, args)?;
    let t0 = restore_started(&m);
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
    Ok((c, dir, t0, m.seconds))
}

/// A normal restore by `r`, the first query after it, and (pgstrata) the reference: TPS,
/// and the restore with a `pg_dump` of the victim table.
fn normal_restore(b: &mut Bench, o: &Opts, r: &Repo) -> Result<Option<Reference>, String> {
    let (c, dir, t0, restore_seconds) = restore_and_answer(
        b,
        r,
        "restore-normal",
        &["--type=immediate", "--target-action=promote"],
        "",
    )?;
    let reference = if r.is_pgstrata() {
        let dump_dir = b.dir("dump-normal")?;
        pgstrata_testkit::give_to_pg_user(&dump_dir);
        let dump = dump_dir.join("victim.sql");
        let mut pg_dump = c.bin.client("pg_dump");
        pg_dump
            .arg("-h")
            .arg(&c.socket_dir)
            .args([
                "-p",
                &c.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["--table=public.victim", "-f"])
            .arg(&dump);
        let dumped = b.run("pg-dump-victim", &mut pg_dump, false)?;
        let restore_and_dump = t0.elapsed().as_secs_f64();
        b.results.record(seconds_row(
            "full restore, first query and pg_dump of a 10 MB table",
            &r.label,
            restore_and_dump,
            format!("pg_dump {:.2} s", dumped.seconds),
        ))?;
        let _ = std::fs::remove_dir_all(&dump_dir);
        let select_tps = tps(&c, o.seconds, true)?;
        let write_tps = tps(&c, o.seconds, false)?;
        for (step, t) in [("-S", select_tps), ("read-write", write_tps)] {
            b.results.record(Row::text(
                CASE,
                &format!("pgbench {step} TPS, normal restore"),
                &r.label,
                &format!("{t:.0} (2 clients, {} s)", o.seconds),
            ))?;
        }
        Some(Reference {
            select_tps,
            write_tps,
            restore_and_dump,
            restore_seconds,
        })
    } else {
        None
    };
    c.stop()?;
    std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(reference)
}

/// The instant directory's status, as the serving process last wrote it.
fn status(dir: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(status_path(dir)?).ok()?).ok()
}

fn status_path(dir: &Path) -> Option<PathBuf> {
    Some(dir.with_file_name(format!(
        ".{}.pgstrata-instant/status.json",
        dir.file_name()?.to_string_lossy()
    )))
}

fn instant_restore(b: &mut Bench, o: &Opts, r: &Repo, reference: Reference) -> Result<(), String> {
    let (c, dir, t0, _) = restore_and_answer(
        b,
        r,
        "restore-instant",
        &["--type=immediate", "--target-action=promote", "--instant"],
        " --instant",
    )?;
    // pgbench while hydrating, in windows: -S, then read-write, and so on.
    let mut window = 0;
    loop {
        let s = status(&dir).ok_or("no status.json")?;
        if s["state"] != "hydrating" {
            break;
        }
        window += 1;
        let select_only = window % 2 == 1;
        let (kind, normal) = if select_only {
            ("-S", reference.select_tps)
        } else {
            ("read-write", reference.write_tps)
        };
        let tps = tps(&c, 5, select_only)?;
        let s = status(&dir).ok_or("no status.json")?;
        let pct = s["bytes_local"].as_f64().unwrap_or(0.0) * 100.0
            / s["bytes_total"].as_f64().unwrap_or(1.0).max(1.0);
        eprintln!(
            "[bench] instant: window {window}: pgbench {kind} {tps:.0} TPS ({:.2}x the normal restore's), {pct:.0} % local",
            tps / normal.max(1.0)
        );
        b.results.record(Row::text(
            CASE,
            &format!("pgbench TPS while hydrating, window {window}"),
            &r.label,
            &format!(
                "{kind} {tps:.0} ({:.2}x the normal restore's; {pct:.0} % local at its end, t = {:.0} s)",
                tps / normal.max(1.0),
                t0.elapsed().as_secs_f64()
            ),
        ))?;
    }
    let s = status(&dir).ok_or("no status.json")?;
    if s["state"] == "failed" {
        return Err(format!("instant restore failed: {s}"));
    }
    // Hydration ended when the status said so last: the file's modification time (its
    // `updated` field has whole seconds only).
    let written = status_path(&dir)
        .and_then(|p| std::fs::metadata(p).ok()?.modified().ok())
        .ok_or("no status.json")?;
    let hydrated = written
        .duration_since(std::time::SystemTime::now() - t0.elapsed())
        .map_or(0.0, |d| d.as_secs_f64());
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
    for (select_only, kind, normal) in [
        (true, "-S", reference.select_tps),
        (false, "read-write", reference.write_tps),
    ] {
        let tps = tps(&c, o.seconds, select_only)?;
        b.results.record(Row::text(
            CASE,
            &format!("pgbench {kind} TPS once hydrated"),
            &r.label,
            &format!(
                "{tps:.0} ({:.2}x the normal restore's)",
                tps / normal.max(1.0)
            ),
        ))?;
    }
    c.stop()?;
    remove_instant(&dir, pid)
}

/// Remove the instantly restored `dir` and its instant directory once its serving process
/// `pid` has left (when nothing has its files open through the mount): room for the next
/// restore at 20 GB.
fn remove_instant(dir: &Path, pid: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let instant = status_path(dir)
        .and_then(|p| Some(p.parent()?.to_path_buf()))
        .ok_or("no instant directory")?;
    for d in [dir, instant.as_path()] {
        std::fs::remove_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    Ok(())
}

/// When the restore measured by `m` started: its command's start, not the `sync` and
/// pause that come before every timed command.
fn restore_started(m: &Measured) -> Instant {
    Instant::now() - Duration::from_secs_f64(m.seconds)
}

/// An instant restore that nothing reads (PostgreSQL not started): how long hydration
/// takes with the machine to itself, against the normal restore's time, the two doing
/// the same work.
fn idle_hydration(b: &mut Bench, r: &Repo, reference: Reference) -> Result<(), String> {
    let dir = b.empty_data_dir("restore-instant-idle")?;
    let m = r.restore(
        b,
        &dir,
        &["--type=immediate", "--target-action=promote", "--instant"],
    )?;
    let t0 = restore_started(&m);
    // instant-status takes no stanza: the data directory is all it needs.
    let mut wait = std::process::Command::new(&r.tool.bin);
    wait.arg(format!("--pg-path={}", dir.display()))
        .args(["--wait", "instant-status"]);
    b.run_as(&r.user, "instant-status-wait", &mut wait, false)?;
    let hydrated = t0.elapsed().as_secs_f64();
    let pid = status(&dir)
        .and_then(|s| s["pid"].as_u64())
        .ok_or("no status.json")?;
    eprintln!(
        "[bench] instant, idle: hydrated in {hydrated:.2} s ({:.2}x the normal restore's {:.2} s)",
        hydrated / reference.restore_seconds.max(0.001),
        reference.restore_seconds
    );
    b.results.record(seconds_row(
        "hydration complete, nothing reading (from the restore's start)",
        &r.label,
        hydrated,
        format!(
            "{:.2}x the normal restore's {:.2} s",
            hydrated / reference.restore_seconds.max(0.001),
            reference.restore_seconds
        ),
    ))?;
    remove_instant(&dir, pid)
}

/// `restore-table` of the victim table as of `before` (the deleted rows there): its time
/// and the share of a full restore's reads it read, against a full restore with
/// `pg_dump`; the dump must hold every row.
fn restore_table(
    b: &mut Bench,
    r: &Repo,
    before: &str,
    reference: Reference,
) -> Result<(), String> {
    let scratch = b.dir("restore-table")?;
    pgstrata_testkit::give_to_pg_user(&scratch);
    let dump = scratch.join("victim.sql");
    let mut c = r.cmd();
    c.arg(format!("--pg-path={}", scratch.join("pgdata").display()))
        .args(["--db=postgres", "--table=public.victim"])
        .arg(format!("--output={}", dump.display()))
        .args([
            "--type=time",
            &format!("--target={before}"),
            "restore-table",
        ]);
    let m = b.run_as(&r.user, "restore-table", &mut c, true)?;
    // "... N read from the repository (P % of the M a full restore reads; ...)"
    let share = m
        .stdout
        .split_once(" read from the repository (")
        .and_then(|(_, rest)| rest.split(" %").next()?.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no share read in restore-table's output: {}", m.stdout))?;
    let text = std::fs::read_to_string(&dump).map_err(|e| format!("{}: {e}", dump.display()))?;
    let rows = text
        .split_once("COPY public.victim")
        .and_then(|(_, data)| data.split_once('\n')?.1.split_once("\n\\.\n"))
        .map_or(0, |(rows, _)| rows.lines().count() as u64);
    if rows != VICTIM_ROWS {
        return Err(format!(
            "restore-table's dump holds {rows} rows of victim, not {VICTIM_ROWS}"
        ));
    }
    eprintln!(
        "[bench] restore-table: {:.2} s ({:.2}x a full restore + pg_dump), {share:.1} % of a full restore's reads, {rows} rows back",
        m.seconds,
        m.seconds / reference.restore_and_dump.max(0.001)
    );
    b.results.record(
        Row::timed(CASE, "restore-table of a 10 MB table", &r.label, 1, &m).note(format!(
            "{:.2}x a full restore + first query + pg_dump; {share:.1} % of what a full restore reads from the repository; every one of the {rows} rows back",
            m.seconds / reference.restore_and_dump.max(0.001)
        )),
    )?;
    std::fs::remove_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    Ok(())
}
