//! Incremental backup after a 1 % change (seed 000's backup table). pgbench -i -s SCALE plus
//! COPIES copies test1..N, VACUUM ANALYZE (sets the visibility map, so the next VACUUM only
//! touches changed pages), CHECKPOINT. Per codec and run, fresh repositories: a full backup
//! with each, then DELETE of CHANGE_PCT % of every copy (one contiguous range, a different
//! one each time), VACUUM, CHECKPOINT, WAL archived, and an incremental with each.
//! pgstrata runs once per `--track` mode; pgBackRest 2.45 with file-level incrementals and
//! with its (beta) block incremental; 2.59.1 with bundling and block incremental.
//! Stored: each tool's info (pgstrata stored_size; pgBackRest repository.delta); read:
//! pgstrata bytes_read, pgBackRest delta (the bytes of the files it copied).
//!
//! Options: --scale N (20) --copies N (4) --change-pct P (1) --codecs LIST (gz,lz4,zst)
//!          --track LIST (auto,hash) --pgbr LIST (file,block) --pgbr-bundle n|y (n)

use super::{
    delete_ranges, load_settled_pgbench, remove_repos, repos, rotated, stanza_create_all, PgbrMode,
};
use crate::args::Args;
use crate::harness::Bench;
use crate::repos::{Repo, Setup};
use crate::results::Row;

pub struct Opts {
    scale: u64,
    copies: u64,
    change_pct: u64,
    codecs: Vec<String>,
    tracks: Vec<String>,
    pgbr: Vec<PgbrMode>,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let file_mode = match a.string("pgbr-bundle", "n").as_str() {
            "n" => PgbrMode::Plain,
            "y" => PgbrMode::Bundle,
            v => return Err(format!("--pgbr-bundle must be n or y, got '{v}'")),
        };
        let pgbr = a
            .list("pgbr", "file,block", &["file", "block"])?
            .iter()
            .map(|v| {
                if v == "file" {
                    file_mode
                } else {
                    PgbrMode::Block
                }
            })
            .collect();
        let o = Opts {
            scale: a.uint("scale", 20, 1)?,
            copies: a.uint("copies", 4, 1)?,
            change_pct: a.uint("change-pct", 1, 1)?,
            codecs: a.list("codecs", "gz,lz4,zst", &["zst", "lz4", "gz", "bz2", "none"])?,
            tracks: a.list("track", "auto,hash", &["auto", "wal", "hash", "none"])?,
            pgbr,
        };
        if o.change_pct > 10 {
            return Err(format!("--change-pct must be 1..10, got {}", o.change_pct));
        }
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "scale={} copies={} change-pct={} codecs={} track={}",
            self.scale,
            self.copies,
            self.change_pct,
            self.codecs.join(","),
            self.tracks.join(",")
        )
    }
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    load_settled_pgbench(b, o.scale, o.copies)?;
    let variants = track_variants(o);
    let variants: Vec<(&str, Setup)> = variants
        .iter()
        .map(|(l, s)| (l.as_str(), s.clone()))
        .collect();
    let mut change = 0;
    for (ci, codec) in o.codecs.iter().enumerate() {
        for run in 1..=b.runs {
            codec_run(b, o, &variants, codec, ci, run, change)?;
            change += 1;
        }
    }
    Ok(())
}

/// One pgstrata variant per `--track` mode.
fn track_variants(o: &Opts) -> Vec<(String, Setup)> {
    o.tracks
        .iter()
        .map(|t| {
            let incr_args = if t == "none" {
                vec![]
            } else {
                vec![format!("--track={t}")]
            };
            (
                format!("--track={t}"),
                Setup {
                    incr_args,
                    ..Setup::default()
                },
            )
        })
        .collect()
}

/// Run `run` of codec `codec` (the `ci`th): fresh repositories, a full backup with each,
/// the `change`th change, an incremental with each (and, verifying, pgstrata's restored).
fn codec_run(
    b: &mut Bench,
    o: &Opts,
    variants: &[(&str, Setup)],
    codec: &str,
    ci: usize,
    run: u64,
    change: u64,
) -> Result<(), String> {
    let repos = repos(b, &format!("{codec}-r{run}"), codec, variants, &o.pgbr, &[])?;
    stanza_create_all(b, &repos)?;
    b.sql("VACUUM ANALYZE")?;
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()?;
    let order: Vec<usize> = rotated(&(0..repos.len()).collect::<Vec<_>>(), ci + run as usize)
        .into_iter()
        .copied()
        .collect();
    let mut labels = vec![(String::new(), String::new()); repos.len()];
    for &i in &order {
        let (m, label) = repos[i].backup(b, "full", &[])?;
        b.results
            .record(Row::timed(codec, "full backup", &repos[i].label, run, &m))?;
        labels[i].0 = label;
    }
    delete_ranges(b, o.scale, o.copies, o.change_pct, change, "test")?;
    let after = if b.verify && run == 1 {
        b.source_check()?
    } else {
        String::new()
    };
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()?;
    incr_backups(b, codec, run, &repos, &order, &mut labels)?;
    if b.verify && run == 1 {
        for (i, r) in repos.iter().enumerate().filter(|(_, r)| r.is_pgstrata()) {
            let dir = b.empty_data_dir("restore-verify")?;
            r.restore(b, &dir, &[&format!("--set={}", labels[i].1)])?;
            b.verify_restore(&dir, &after, &format!("{codec}-{i}"))?;
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    remove_repos(b, &repos);
    Ok(())
}

/// An incremental with each of `repos` in `order`, checked to be one, its label put beside
/// its full's in `labels`; in the first run, what each stored and read.
fn incr_backups(
    b: &mut Bench,
    codec: &str,
    run: u64,
    repos: &[Repo],
    order: &[usize],
    labels: &mut [(String, String)],
) -> Result<(), String> {
    for &i in order {
        let r = &repos[i];
        let (m, label) = r.backup(b, "incr", &[])?;
        let sizes = r.backup_sizes(b, &label)?;
        if sizes.kind != "incr" {
            return Err(format!(
                "{}: backup {label} is '{}', not incr",
                r.label, sizes.kind
            ));
        }
        b.results.record(
            Row::timed(codec, "incr backup", &r.label, run, &m).note(sizes.track.clone()),
        )?;
        if run == 1 {
            let full = r.backup_sizes(b, &labels[i].0)?;
            b.results
                .record(Row::bytes(codec, "full stored", &r.label, 1, full.stored))?;
            b.results
                .record(Row::bytes(codec, "incr stored", &r.label, 1, sizes.stored))?;
            b.results
                .record(Row::bytes(codec, "incr read", &r.label, 1, sizes.read))?;
        }
        labels[i].1 = label;
    }
    Ok(())
}
