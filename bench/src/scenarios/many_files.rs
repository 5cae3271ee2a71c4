//! Many one-row tables (issue 12): what the number of files costs each tool, in time, memory
//! and objects. TABLES tables `tI (id int)` with ROWS rows each (the `bundling` scenario's
//! source: 1000 tables per transaction, VACUUM ANALYZE, about 3 files per table, CHECKPOINT).
//! Per run, fresh repositories (pgstrata with its defaults; pgBackRest with bundling and block
//! incremental): a full backup into each, then with nothing changed (a CHECKPOINT and a WAL
//! switch) an incremental into each, then the incremental restored into an empty directory.
//!
//! Every step's peak RSS is the largest sum, at one instant, of all the processes running the
//! tool's binary (sampled from /proc every 10 ms): pgBackRest's `process-max` workers count,
//! the archive-push that PostgreSQL runs during a backup does not. Per backup: the objects it added to the
//! backup area, its `backup.manifest` (the note has it with its `.copy`), and what it stored
//! by the tool's own info.
//!
//! Options: --tables N (100000) --rows N (1) --codec C (zst)

use super::bundling::{locks_for, small_tables_source};
use super::{
    all_processes, manifest_bytes, remove_repos, repos, rotated, stanza_create_all, PgbrMode,
};
use crate::args::Args;
use crate::harness::{file_count, Bench};
use crate::repos::{Repo, Setup};
use crate::results::Row;

pub struct Opts {
    tables: u64,
    rows: u64,
    codec: String,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let o = Opts {
            tables: a.uint("tables", 100_000, 1)?,
            rows: a.uint("rows", 1, 0)?,
            codec: a.string("codec", "zst"),
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "tables={} rows={} codec={}",
            self.tables, self.rows, self.codec
        )
    }
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    b.start_cluster(&locks_for(o.tables))?;
    let check = small_tables_source(b, o.tables, o.rows)?;
    let case = format!("{} tables of {} row(s)", o.tables, o.rows);
    for run in 1..=b.runs {
        let repos = repos(
            b,
            &format!("r{run}"),
            &o.codec,
            &[("", Setup::default())],
            &[PgbrMode::Block],
            &[],
        )?;
        stanza_create_all(b, &repos)?;
        b.sql("CHECKPOINT")?;
        b.wal_switch_and_wait()?;
        let order = rotated(&repos, run as usize - 1);
        for r in &order {
            backup(b, r, &case, run, "full")?;
        }
        b.sql("CHECKPOINT")?;
        b.wal_switch_and_wait()?;
        let mut incr = std::collections::HashMap::new();
        for r in &order {
            incr.insert(r.label.clone(), backup(b, r, &case, run, "incr")?);
        }
        b.archive_nowhere();
        for r in &order {
            let dir = b.empty_data_dir("restore")?;
            let set = format!("--set={}", incr[&r.label]);
            let (m, (), note) = all_processes(r, || Ok((r.restore(b, &dir, &[&set])?, ())))?;
            b.results.record(
                Row::timed(&case, "full restore of the incr", &r.label, run, &m).note(note),
            )?;
            if b.verify && run == 1 && r.is_pgstrata() {
                b.verify_restore(&dir, &check, "many-files")?;
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        remove_repos(b, &repos);
    }
    Ok(())
}

/// A backup of `kind` into `r` with everything it is measured by: time and memory, objects
/// added to the backup area, manifest and stored bytes. Returns its label.
fn backup(b: &mut Bench, r: &Repo, case: &str, run: u64, kind: &str) -> Result<String, String> {
    let before = file_count(&r.backup_area());
    let (m, label, note) = all_processes(r, || r.backup(b, kind, &[]))?;
    let step = if kind == "full" {
        "full backup"
    } else {
        "no-change incr"
    };
    b.results
        .record(Row::timed(case, step, &r.label, run, &m).note(note))?;
    let sizes = r.backup_sizes(b, &label)?;
    if sizes.kind != kind {
        return Err(format!(
            "{}: backup {label} is '{}', not {kind}",
            r.label, sizes.kind
        ));
    }
    let objects = file_count(&r.backup_area()) - before;
    let (manifest, with_copy) = manifest_bytes(r, &label)?;
    b.results.record(Row::count(
        case,
        &format!("{kind}: objects written"),
        &r.label,
        run,
        objects,
    ))?;
    b.results.record(
        Row::bytes(
            case,
            &format!("{kind}: backup.manifest"),
            &r.label,
            run,
            Some(manifest),
        )
        .note(format!(
            "with its copy {:.2} MB",
            with_copy as f64 / 1048576.0
        )),
    )?;
    b.results.record(Row::bytes(
        case,
        &format!("{kind}: stored"),
        &r.label,
        run,
        sizes.stored,
    ))?;
    Ok(label)
}
