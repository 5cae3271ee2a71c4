//! WAL-tracked incrementals against database size (issue 4): an incremental's cost should
//! follow the change, not the database. Per scale: a fresh cluster with pgbench -i -s SCALE
//! plus COPIES copies, VACUUM ANALYZE, CHECKPOINT; repositories pgstrata `--track=wal`,
//! pgstrata `--track=hash` and pgBackRest; a full backup into each; then per run an UPDATE of
//! ROWS_CHANGED rows spread evenly over every large table (every segment file's mtime moves,
//! so a file-level tool copies all of them), VACUUM, CHECKPOINT, and an incremental into each.
//!
//! Then the cost of decoding in archive-push: SEGMENTS real segments of pgbench TPC-B traffic,
//! fetched back with archive-get, pushed one process per file (as archive_command does) into
//! fresh repositories as segments (decoded, block-change map written) and as the same bytes
//! named `.partial` (not decoded); best of PUSH_ROUNDS.
//!
//! Options: --scales LIST (10,40,100) --copies N (1) --rows-changed N (100) --codec C (lz4)
//!          --pgbr-bundle n|y (n; 2.45's file-level incremental) --segments N (20; 0 skips)
//!          --push-rounds N (3)

use super::{
    all_processes, database_size, manifest_bytes, remove_repos, repos, rotated, stanza_create_all,
    PgbrMode,
};
use crate::args::Args;
use crate::harness::Bench;
use crate::repos::{Repo, Setup};
use crate::results::Row;

pub struct Opts {
    scales: Vec<u64>,
    copies: u64,
    rows_changed: u64,
    codec: String,
    pgbr: Vec<PgbrMode>,
    segments: u64,
    push_rounds: u64,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let pgbr = match a.string("pgbr-bundle", "n").as_str() {
            "n" => vec![PgbrMode::Plain],
            "y" => vec![PgbrMode::Bundle],
            v => return Err(format!("--pgbr-bundle must be n or y, got '{v}'")),
        };
        let o = Opts {
            scales: a.uint_list("scales", "10,40,100")?,
            copies: a.uint("copies", 1, 0)?,
            rows_changed: a.uint("rows-changed", 100, 1)?,
            codec: a.string("codec", "lz4"),
            pgbr,
            segments: a.uint("segments", 20, 0)?,
            push_rounds: a.uint("push-rounds", 3, 1)?,
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }
    pub fn params(&self) -> String {
        let scales: Vec<String> = self.scales.iter().map(u64::to_string).collect();
        format!(
            "scales={} copies={} rows-changed={} codec={} segments={}",
            scales.join(","),
            self.copies,
            self.rows_changed,
            self.codec,
            self.segments
        )
    }
}

fn track(t: &str) -> (String, Setup) {
    (
        format!("--track={t}"),
        Setup {
            incr_args: vec![format!("--track={t}")],
            ..Setup::default()
        },
    )
}

/// UPDATE `rows` rows spread evenly over every large table, a different set per change.
fn spread_update(
    b: &Bench,
    tables: &[String],
    scale: u64,
    rows: u64,
    n: u64,
) -> Result<(), String> {
    let step = (scale * 100_000 / rows).max(1);
    let off = (1 + n * 7919) % step;
    for t in tables {
        b.sql(&format!(
            "UPDATE {t} SET abalance = abalance + 1 WHERE aid IN (SELECT 1 + k * {step} + {off} FROM generate_series(0, {}) k)",
            rows - 1
        ))?;
    }
    b.sql("VACUUM ANALYZE")?;
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()
}

/// One database size of the incremental-against-size measurements (this scenario's and
/// `growth`'s).
pub struct Size<'a> {
    pub scale: u64,
    pub copies: u64,
    pub rows_changed: u64,
    pub codec: &'a str,
    /// pgstrata's repositories: column suffix and setup.
    pub variants: &'a [(&'a str, Setup)],
    pub pgbr: &'a [PgbrMode],
    /// Peak RSS of all the tool's processes (sampled from /proc), not wait4's largest one.
    pub all_processes: bool,
}

/// A fresh cluster of `s.scale` (plus `s.copies` copies), a full backup into every
/// repository, then per run the spread update and an incremental into each: their times,
/// and of the first run's incrementals what they read and stored and their manifests'
/// bytes. Returns the repositories, for the caller to remove or keep.
pub fn at_size(b: &mut Bench, si: usize, s: &Size) -> Result<Vec<Repo>, String> {
    b.drop_cluster()?;
    b.start_cluster("")?;
    let tables = b.load_pgbench(s.scale, s.copies, "test")?;
    b.sql("VACUUM ANALYZE")?;
    b.sql("CHECKPOINT")?;
    let case = format!(
        "{:.0} MB (scale {})",
        database_size(b)? as f64 / 1048576.0,
        s.scale
    );
    let repos = repos(
        b,
        &format!("s{}", s.scale),
        s.codec,
        s.variants,
        s.pgbr,
        &[],
    )?;
    stanza_create_all(b, &repos)?;
    b.wal_switch_and_wait()?;
    let backup = |b: &mut Bench, r: &Repo, kind: &str| {
        if s.all_processes {
            all_processes(r, || r.backup(b, kind, &[]))
        } else {
            r.backup(b, kind, &[]).map(|(m, l)| (m, l, String::new()))
        }
    };
    for r in &repos {
        let (m, _, note) = backup(b, r, "full")?;
        b.results
            .record(Row::timed(&case, "full backup", &r.label, 1, &m).note(note))?;
    }
    let mut last = Vec::new();
    for run in 1..=b.runs {
        spread_update(b, &tables, s.scale, s.rows_changed, si as u64 * 100 + run)?;
        let after = if b.verify && run == b.runs {
            b.source_check()?
        } else {
            String::new()
        };
        last.clear();
        for r in rotated(&repos, si + run as usize) {
            let (m, label, note) = backup(b, r, "incr")?;
            let sizes = r.backup_sizes(b, &label)?;
            let note = [note, sizes.track]
                .into_iter()
                .filter(|n| !n.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            b.results
                .record(Row::timed(&case, "incr backup", &r.label, run, &m).note(note))?;
            if run == 1 {
                b.results
                    .record(Row::bytes(&case, "incr read", &r.label, 1, sizes.read))?;
                b.results
                    .record(Row::bytes(&case, "incr stored", &r.label, 1, sizes.stored))?;
                let (manifest, with_copy) = manifest_bytes(r, &label)?;
                b.results.record(
                    Row::bytes(
                        &case,
                        "incr manifest (+ .copy)",
                        &r.label,
                        1,
                        Some(with_copy),
                    )
                    .note(format!(
                        "backup.manifest {:.3} MB",
                        manifest as f64 / 1048576.0
                    )),
                )?;
            }
            last.push((r.label.clone(), label));
        }
        if b.verify && run == b.runs {
            let (label, set) = last
                .iter()
                .find(|(l, _)| *l == repos[0].label)
                .cloned()
                .expect("first repo");
            let dir = b.empty_data_dir("restore-verify")?;
            repos[0].restore(b, &dir, &[&format!("--set={set}")])?;
            b.verify_restore(&dir, &after, &format!("s{}-{label}", s.scale))?;
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(repos)
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    let variants: Vec<(String, Setup)> = vec![track("wal"), track("hash")];
    let variants: Vec<(&str, Setup)> = variants
        .iter()
        .map(|(l, s)| (l.as_str(), s.clone()))
        .collect();
    let mut last_wal_repo: Option<Repo> = None;
    for (si, &scale) in o.scales.iter().enumerate() {
        let size = Size {
            scale,
            copies: o.copies,
            rows_changed: o.rows_changed,
            codec: &o.codec,
            variants: &variants,
            pgbr: &o.pgbr,
            all_processes: false,
        };
        let mut repos = at_size(b, si, &size)?;
        b.archive_nowhere();
        if let Some(old) = last_wal_repo.take() {
            let _ = std::fs::remove_dir_all(&old.dir);
        }
        let wal_repo = repos.remove(0);
        remove_repos(b, &repos);
        b.archive_to(&[wal_repo.archive_push_line()])?;
        last_wal_repo = Some(wal_repo);
    }
    if o.segments > 0 {
        let repo = last_wal_repo.as_ref().expect("a scale ran");
        archive_push_cost(b, o, repo)?;
    }
    Ok(())
}

/// Generate `segments` segments of pgbench traffic, then time archive-push of them with and
/// without decoding.
fn archive_push_cost(b: &mut Bench, o: &Opts, wal_repo: &Repo) -> Result<(), String> {
    eprintln!(
        "[bench] archive-push: generating {} segments of pgbench traffic",
        o.segments
    );
    let first = super::generate_segments(b, o.segments, &|b| {
        b.cluster()
            .pgbench(&[
                "-n", "-c", "2", "-j", "2", "-M", "prepared", "-T", "5", "postgres",
            ])
            .map(drop)
            .map_err(String::from)
    })?;
    let case = format!("archive-push of {} segments", o.segments);
    let (m, label) = wal_repo.backup(b, "incr", &["--track=auto"])?;
    let s = wal_repo.backup_sizes(b, &label)?;
    b.results.record(
        Row::timed(
            &case,
            "incr after the traffic (--track=auto)",
            &wal_repo.label,
            1,
            &m,
        )
        .note(s.track),
    )?;
    b.results.record(Row::bytes(
        &case,
        "incr after the traffic: read",
        &wal_repo.label,
        1,
        s.read,
    ))?;
    b.archive_nowhere();
    let seg_dir = b.dir("ap-seg")?;
    let partial_dir = b.dir("ap-partial")?;
    for name in super::fetch_segments(b, wal_repo, first, o.segments, &seg_dir)? {
        // Copied as root: given to the PostgreSQL user, who reads it (archive-get wrote 0600).
        let partial = partial_dir.join(format!("{name}.partial"));
        std::fs::copy(seg_dir.join(&name), &partial).map_err(|e| e.to_string())?;
        pgstrata_testkit::give_to_pg_user(&partial);
    }
    for tool in b.pgstrata.clone() {
        for round in 1..=o.push_rounds {
            let kinds = if round % 2 == 1 {
                ["segments (decoded, map written)", ".partial (not decoded)"]
            } else {
                [".partial (not decoded)", "segments (decoded, map written)"]
            };
            for kind in kinds {
                let dir = if kind.starts_with('.') {
                    &partial_dir
                } else {
                    &seg_dir
                };
                let repo = Repo::new(
                    b,
                    &tool,
                    &tool.label,
                    &format!("ap-{round}-{}", &kind[..4]),
                    "lz4",
                    Setup::default(),
                )?;
                repo.stanza_create(b)?;
                let script = format!(
                    "for f in '{}'/*; do '{}' --config='{}' --stanza={} archive-push \"$f\" || exit 1; done",
                    dir.display(),
                    tool.bin.display(),
                    repo.config.display(),
                    crate::harness::STANZA
                );
                let m = b.run(
                    "archive-push-loop",
                    std::process::Command::new("sh").args(["-c", &script]),
                    true,
                )?;
                let maps = count_maps(&repo.dir);
                b.results.record(
                    Row::timed(&case, &format!("pushed as {kind}"), &tool.label, round, &m)
                        .note(format!("{maps} maps; CPU {:.2} s", m.user + m.sys)),
                )?;
                let _ = std::fs::remove_dir_all(&repo.dir);
            }
        }
    }
    Ok(())
}

fn count_maps(dir: &std::path::Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += count_maps(&p);
            } else if p.extension().is_some_and(|x| x == "map") {
                n += 1;
            }
        }
    }
    n
}
