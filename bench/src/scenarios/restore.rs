//! Full restore and delta restore of an incremental backup taken after a 1 % change (seed
//! 000's restore part). pgbench -i -s SCALE plus COPIES copies test1..N, VACUUM ANALYZE,
//! CHECKPOINT; a full backup into every repository; DELETE of CHANGE_PCT % of every copy (one
//! contiguous aid range each), VACUUM, CHECKPOINT; an incremental into every repository. Then
//! per run and repository: (a) the incremental restored into an empty directory; (b) the
//! full restored (not timed), then the incremental over it with `--delta`; (c) (b) compared
//! with (a) file by file: a delta restore must give exactly the files of a full restore.
//! Last, the disk's rates are measured on the scratch disk and the best times set against
//! them: the full restore against writing and fsyncing what it restored, the delta restore
//! against reading it uncached (a delta restore reads every file to compare it).
//!
//! This is the scenario for "does this change slow restore": give two builds with
//! `--pgstrata before=BIN --pgstrata after=BIN --pgbackrest none --runs 5`.
//!
//! Options: --scale N (20) --copies N (4) --change-pct P (1) --codec C (zst)
//!          --variants bundle,nobundle (pgstrata: default bundling, --bundle=false)
//!          --pgbr-bundle n|y|both (both) --pgbr-block y|n (y) (pgBackRest 2.45's variants)
//!          --cold (drop the page cache before each timed restore; as root)

use super::{
    delete_ranges, load_settled_pgbench, remove_repos, repos, rotated, stanza_create_all, PgbrMode,
};
use crate::args::Args;
use crate::harness::Bench;
use crate::repos::{Repo, Setup};
use crate::results::Row;
use std::path::Path;

pub struct Opts {
    scale: u64,
    copies: u64,
    change_pct: u64,
    codec: String,
    variants: Vec<String>,
    pgbr: Vec<PgbrMode>,
    /// Drop the page cache before each timed restore.
    cold: bool,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let mut pgbr = PgbrMode::parse_bundle(&a.string("pgbr-bundle", "both"))?;
        match a.string("pgbr-block", "y").as_str() {
            "y" => pgbr.push(PgbrMode::Block),
            "n" => {}
            v => return Err(format!("--pgbr-block must be y or n, got '{v}'")),
        }
        let o = Opts {
            scale: a.uint("scale", 20, 1)?,
            copies: a.uint("copies", 4, 1)?,
            change_pct: a.uint("change-pct", 1, 1)?,
            codec: a.string("codec", "zst"),
            variants: a.list("variants", "bundle,nobundle", &["bundle", "nobundle"])?,
            pgbr,
            cold: a.flag("cold"),
        };
        crate::tools::default_level(&o.codec)?;
        if o.change_pct > 10 {
            return Err(format!("--change-pct must be 1..10, got {}", o.change_pct));
        }
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "scale={} copies={} change-pct={} codec={}{}",
            self.scale,
            self.copies,
            self.change_pct,
            self.codec,
            if self.cold { " cold" } else { "" }
        )
    }
}

pub fn pgstrata_variants(names: &[String]) -> Vec<(&'static str, Setup)> {
    names
        .iter()
        .map(|v| match v.as_str() {
            "nobundle" => (
                "--bundle=false",
                Setup {
                    backup_args: vec!["--bundle=false".into()],
                    ..Setup::default()
                },
            ),
            _ => ("", Setup::default()),
        })
        .collect()
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    load_settled_pgbench(b, o.scale, o.copies)?;
    let repos = repos(
        b,
        "r",
        &o.codec,
        &pgstrata_variants(&o.variants),
        &o.pgbr,
        &[],
    )?;
    stanza_create_all(b, &repos)?;
    b.wal_switch_and_wait()?;
    let case = format!("{} % change", o.change_pct);
    let full = full_backups(b, &repos, &case)?;
    delete_ranges(b, o.scale, o.copies, o.change_pct, 0, "test")?;
    let after = b.source_check()?;
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()?;
    let incr = incr_backups(b, &repos, &case)?;
    b.archive_nowhere();
    let sets = Sets { full, incr, after };
    let mut differ = Vec::new();
    // Per repository, the best full and delta restore times; the bytes a restore writes.
    let mut best = vec![(f64::MAX, f64::MAX); repos.len()];
    let mut restored = 0;
    for run in 1..=b.runs {
        let idx: Vec<usize> = (0..repos.len()).collect();
        for &i in rotated(&idx, run as usize - 1) {
            let r = &repos[i];
            let t = restore_both(b, o, r, i, run, &case, &sets)?;
            best[i].0 = best[i].0.min(t.full_seconds);
            best[i].1 = best[i].1.min(t.delta_seconds);
            restored = restored.max(t.restored);
            if !t.same {
                differ.push(r.label.clone());
            }
        }
    }
    remove_repos(b, &repos);
    against_disk(b, &case, &repos, &best, restored)?;
    if !differ.is_empty() {
        return Err(format!(
            "delta restore differs from the full restore of the same backup: {}",
            differ.join(", ")
        ));
    }
    Ok(())
}

/// A full backup in every repository: their labels.
fn full_backups(b: &mut Bench, repos: &[Repo], case: &str) -> Result<Vec<String>, String> {
    let mut full = Vec::new();
    for r in repos {
        let (m, label) = r.backup(b, "full", &[])?;
        b.results
            .record(Row::timed(case, "full backup", &r.label, 1, &m))?;
        full.push(label);
    }
    Ok(full)
}

/// An incremental backup in every repository (the last first), checked to be one: their
/// labels, in the repositories' order.
fn incr_backups(b: &mut Bench, repos: &[Repo], case: &str) -> Result<Vec<String>, String> {
    let mut incr = vec![String::new(); repos.len()];
    for (i, r) in repos.iter().enumerate().rev() {
        let (m, label) = r.backup(b, "incr", &[])?;
        b.results
            .record(Row::timed(case, "incr backup", &r.label, 1, &m))?;
        let sizes = r.backup_sizes(b, &label)?;
        if sizes.kind != "incr" {
            return Err(format!(
                "{}: backup {label} is '{}', not incr",
                r.label, sizes.kind
            ));
        }
        b.results
            .record(Row::bytes(case, "incr stored", &r.label, 1, sizes.stored))?;
        incr[i] = label;
    }
    Ok(incr)
}

/// The backups restored, per repository, and the source's content check after the change.
struct Sets {
    full: Vec<String>,
    incr: Vec<String>,
    after: String,
}

/// What one run's two restores from one repository took.
struct Restored {
    full_seconds: f64,
    delta_seconds: f64,
    /// The bytes the full restore wrote.
    restored: u64,
    /// Whether the delta restore left the same files as the full restore.
    same: bool,
}

/// Run `run` of repository `i` (`r`): a full restore of its incremental, then a delta
/// restore of it over a restore of its full backup, compared with the full restore.
fn restore_both(
    b: &mut Bench,
    o: &Opts,
    r: &Repo,
    i: usize,
    run: u64,
    case: &str,
    sets: &Sets,
) -> Result<Restored, String> {
    let (full, incr) = (&sets.full, &sets.incr);
    let full_dir = b.empty_data_dir("restore-full")?;
    if o.cold {
        crate::harness::drop_page_cache()?;
    }
    let m = r.restore(b, &full_dir, &[&format!("--set={}", incr[i])])?;
    let full_seconds = m.seconds;
    let restored = b.du(&full_dir);
    b.results.record(Row::timed(
        case,
        "full restore of the incr",
        &r.label,
        run,
        &m,
    ))?;
    let delta_dir = b.empty_data_dir("restore-delta")?;
    r.restore(b, &delta_dir, &[&format!("--set={}", full[i])])?;
    let set = format!("--set={}", incr[i]);
    let mut args = vec!["--delta", set.as_str()];
    if !r.is_pgstrata() {
        args.push("--log-level-console=detail"); // lists the files it rewrote
    }
    if o.cold {
        crate::harness::drop_page_cache()?;
    }
    let m = r.restore(b, &delta_dir, &args)?;
    let fetched = if r.is_pgstrata() {
        pgstrata_fetched(&m.stdout)
    } else {
        pgbr_fetched(r, &incr[i], &delta_dir, &m.stdout)
    };
    b.results.record(Row::timed(
        case,
        "delta restore of the incr",
        &r.label,
        run,
        &m,
    ))?;
    if run == 1 {
        b.results.record(Row::bytes(
            case,
            "delta restore: fetched",
            &r.label,
            1,
            fetched,
        ))?;
    }
    let same = same_files(&full_dir, &delta_dir)?;
    if run == 1 {
        b.results.record(Row::text(
            case,
            "delta = full restore",
            &r.label,
            if same { "yes" } else { "NO" },
        ))?;
    }
    if b.verify && run == 1 && i == 0 {
        b.verify_restore(&delta_dir, &sets.after, "delta")?;
    }
    let _ = std::fs::remove_dir_all(&full_dir);
    let _ = std::fs::remove_dir_all(&delta_dir);
    Ok(Restored {
        full_seconds,
        delta_seconds: m.seconds,
        restored,
        same,
    })
}

/// The best restore times against the disk's rates, measured now on the scratch disk: a full
/// restore writes and fsyncs `restored` bytes, a delta restore reads them all (to compare).
fn against_disk(
    b: &mut Bench,
    case: &str,
    repos: &[Repo],
    best: &[(f64, f64)],
    restored: u64,
) -> Result<(), String> {
    let disk = crate::limits::disk(&b.scratch.path)?;
    let rate = |step: &str| {
        disk.iter()
            .find(|d| d.0 == step)
            .map_or(f64::NAN, |d| d.2 as f64 / d.1)
    };
    let (write, read) = (rate("write + fsync"), rate("read, uncached"));
    b.results.record(
        Row::bytes(case, "restored by a full restore", "source", 0, Some(restored)).note(
            format!(
                "the scratch disk after the restores: write + fsync {:.0} MB/s, read uncached {:.0} MB/s",
                write / 1048576.0,
                read / 1048576.0
            ),
        ),
    )?;
    for (r, &(full, delta)) in repos.iter().zip(best) {
        for (step, seconds, rate) in [
            ("full restore ÷ disk write floor", full, write),
            ("delta restore ÷ disk read floor", delta, read),
        ] {
            let floor = restored as f64 / rate;
            b.results.record(Row::text(
                case,
                step,
                &r.label,
                &format!("{:.2}× (floor {floor:.2} s)", seconds / floor),
            ))?;
        }
    }
    Ok(())
}

/// "restored backup L: ...; N bytes fetched" (pgstrata's summary line).
pub fn pgstrata_fetched(stdout: &str) -> Option<u64> {
    let line = stdout.lines().find(|l| l.contains("bytes fetched"))?;
    let before = line.split(" bytes fetched").next()?;
    before.rsplit([' ', ';']).next()?.parse().ok()
}

/// pgBackRest's delta restore: the files its detail log says it restored (not "exists and
/// matches"), their repository size taken from the incremental's manifest (derived, not
/// measured).
fn pgbr_fetched(r: &Repo, label: &str, dir: &Path, log: &str) -> Option<u64> {
    let manifest = std::fs::read_to_string(
        r.dir
            .join("backup/bench")
            .join(label)
            .join("backup.manifest"),
    )
    .ok()?;
    let mut in_files = false;
    let mut sizes = std::collections::HashMap::new();
    for l in manifest.lines() {
        if l.starts_with('[') {
            in_files = l == "[target:file]";
            continue;
        }
        if let (true, Some((k, v))) = (in_files, l.split_once('=')) {
            let j: serde_json::Value = serde_json::from_str(v).ok()?;
            let size = j["repo-size"].as_u64().or(j["size"].as_u64()).unwrap_or(0);
            sizes.insert(k.to_string(), size);
        }
    }
    let prefix = format!("{}/", dir.display());
    let total = log
        .lines()
        .filter(|l| l.contains("DETAIL: restore file ") && !l.contains(" - exists and "))
        .filter_map(|l| l.split("DETAIL: restore file ").nth(1)?.split(" (").next())
        .map(|p| {
            p.trim_end_matches(".pgbackrest.tmp")
                .trim_start_matches(&prefix)
        })
        .filter_map(|p| sizes.get(&format!("pg_data/{p}")))
        .sum();
    Some(total)
}

/// The two directories hold the same files (postgresql.auto.conf compared without the
/// recovery settings, where pgBackRest writes the restore time and directory).
fn same_files(a: &Path, b: &Path) -> Result<bool, String> {
    let out = std::process::Command::new("diff")
        .args([
            "-r",
            "--no-dereference",
            "--exclude=postgresql.auto.conf",
            "-q",
        ])
        .arg(a)
        .arg(b)
        .output()
        .map_err(|e| format!("diff: {e}"))?;
    let auto = |d: &Path| {
        std::fs::read_to_string(d.join("postgresql.auto.conf"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                !l.starts_with("# Recovery settings generated") && !l.starts_with("restore_command")
            })
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    if !out.status.success() {
        eprintln!(
            "[bench] delta and full restore differ:\n{}",
            crate::harness::tail(&String::from_utf8_lossy(&out.stdout), 20)
        );
    }
    Ok(out.status.success() && auto(a) == auto(b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_fetched_are_read_from_the_restore_summary() {
        let out = "restored backup 20260101-000000I: 3 files written, 1 patched, 900 unchanged, 0 removed; 232593 bytes fetched\n";
        assert_eq!(super::pgstrata_fetched(out), Some(232593));
        assert_eq!(super::pgstrata_fetched("restored backup X\n"), None);
    }
}
