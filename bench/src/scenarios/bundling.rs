//! Many small tables (seed 003, scaled down): TABLES tables `tI (id int)` with ROWS rows each
//! (1000 per transaction), VACUUM ANALYSE (a _fsm and a _vm fork each: about 3 small files per
//! table), CHECKPOINT. Per bundling variant and run, fresh repositories: a full backup with
//! each tool, the objects it added to the backup area, the area's size, and a restore.
//! Variants apply to both tools: `off` (pgstrata --bundle=false, pgBackRest repo1-bundle=n),
//! `default` (each tool's default limits; pgBackRest 2.59.1 also with block incremental),
//! `LIMIT:SIZE` (both tools with these bundle limits, e.g. 2MiB:10MiB).
//!
//! Options: --tables N (20000) --rows N (1) --scale N (0: no pgbench data)
//!          --variants LIST (off,default) --codec C (zst) --no-restore

use super::{pgbr_modes, pgbr_setup, record_database_size, remove_repos, rotated, PgbrMode};
use crate::args::Args;
use crate::harness::{file_count, Bench};
use crate::repos::{Repo, Setup};
use crate::results::Row;

pub struct Opts {
    tables: u64,
    rows: u64,
    scale: u64,
    variants: Vec<String>,
    codec: String,
    restore: bool,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let o = Opts {
            tables: a.uint("tables", 20000, 1)?,
            rows: a.uint("rows", 1, 0)?,
            scale: a.uint("scale", 0, 0)?,
            variants: a.list("variants", "off,default", &[])?,
            codec: a.string("codec", "zst"),
            restore: !a.flag("no-restore"),
        };
        crate::tools::default_level(&o.codec)?;
        for v in &o.variants {
            let ok = v == "off"
                || v == "default"
                || v.split_once(':')
                    .is_some_and(|(l, s)| is_size(l) && is_size(s));
            if !ok {
                return Err(format!(
                    "--variants: '{v}' is not off, default or LIMIT:SIZE (e.g. 2MiB:10MiB)"
                ));
            }
        }
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "tables={} rows={} scale={} codec={}",
            self.tables, self.rows, self.scale, self.codec
        )
    }
}

fn is_size(s: &str) -> bool {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && ["B", "KiB", "MiB", "GiB"].contains(&&s[digits.len()..])
}

/// `max_locks_per_transaction` for TABLES tables: the content check reads every table in one
/// transaction, and the shared lock table has this many slots per connection (100).
pub fn locks_for(tables: u64) -> String {
    format!("max_locks_per_transaction = {}", (tables / 40).max(1024))
}

/// Create the small tables: 1000 per transaction (a DO block each), 20 transactions per psql
/// call; then VACUUM ANALYZE (the _fsm and _vm forks) and CHECKPOINT.
pub fn create_small_tables(b: &Bench, tables: u64, rows: u64) -> Result<(), String> {
    eprintln!("[bench] creating {tables} tables with {rows} row(s) each");
    let t0 = std::time::Instant::now();
    let batches: Vec<String> = (1..=tables)
        .step_by(1000)
        .map(|first| {
            let last = (first + 999).min(tables);
            format!(
                "BEGIN; DO $$ BEGIN FOR i IN {first}..{last} LOOP EXECUTE format('CREATE TABLE t%s (id int)', i); \
                 IF {rows} > 0 THEN EXECUTE format('INSERT INTO t%s SELECT generate_series(1, {rows})', i); END IF; \
                 END LOOP; END $$; COMMIT; "
            )
        })
        .collect();
    for (i, chunk) in batches.chunks(20).enumerate() {
        b.sql(&chunk.concat())?;
        eprintln!(
            "[bench] {} tables created ({:.0} s)",
            (((i + 1) * 20000) as u64).min(tables),
            t0.elapsed().as_secs_f64()
        );
    }
    b.sql("VACUUM ANALYZE")?;
    b.sql("CHECKPOINT")?;
    eprintln!(
        "[bench] small tables vacuumed ({:.0} s)",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Number of small tables and their rows: one query, whatever the number of tables.
const SMALL_TABLES_CHECK: &str = "CREATE FUNCTION bench_small_tables_check(OUT tables bigint, OUT rows_total bigint) \
    LANGUAGE plpgsql AS $$ DECLARE r record; n bigint; BEGIN tables := 0; rows_total := 0; \
    FOR r IN SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ '^t[0-9]+$' LOOP \
    EXECUTE format('SELECT count(*) FROM %I', r.relname) INTO n; tables := tables + 1; rows_total := rows_total + n; \
    END LOOP; END $$";

/// The source of this scenario and `many_files` (on a started cluster): the small tables,
/// the content check (the number of tables and rows), the database's size and its files
/// recorded. Returns the source's check when restores are verified.
pub fn small_tables_source(b: &mut Bench, tables: u64, rows: u64) -> Result<String, String> {
    create_small_tables(b, tables, rows)?;
    b.sql(SMALL_TABLES_CHECK)?;
    b.check_sql = Some("SELECT * FROM bench_small_tables_check()".into());
    let check = if b.verify {
        b.source_check()?
    } else {
        String::new()
    };
    let files = file_count(&b.cluster().data);
    record_database_size(b)?;
    b.results
        .record(Row::count("source", "files in PGDATA", "source", 0, files))?;
    Ok(check)
}

fn repos_for(b: &Bench, variant: &str, case: &str, codec: &str) -> Result<Vec<Repo>, String> {
    let (pgs_args, pgbr_extra): (Vec<String>, Vec<String>) = match variant.split_once(':') {
        Some((l, s)) => (
            vec![
                "--bundle=true".into(),
                format!("--bundle-limit={l}"),
                format!("--bundle-size={s}"),
            ],
            vec![
                format!("repo1-bundle-limit={l}"),
                format!("repo1-bundle-size={s}"),
            ],
        ),
        None if variant == "off" => (vec!["--bundle=false".into()], vec![]),
        None => (vec!["--bundle=true".into()], vec![]),
    };
    let mut setups = Vec::new();
    for t in &b.pgstrata {
        let setup = Setup {
            backup_args: pgs_args.clone(),
            ..Setup::default()
        };
        setups.push((t, t.label.clone(), setup));
    }
    for t in &b.pgbackrest {
        let modes = if variant == "off" {
            vec![PgbrMode::Plain]
        } else {
            pgbr_modes(t, &[PgbrMode::Bundle])
        };
        for mode in modes {
            let (_, mut setup) = pgbr_setup(t, mode);
            setup.settings.extend(pgbr_extra.iter().cloned());
            setups.push((t, t.label.clone(), setup));
        }
    }
    super::new_repos(b, case, codec, setups)
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    b.start_cluster(&locks_for(o.tables))?;
    if o.scale > 0 {
        b.load_pgbench(o.scale, 0, "")?;
    }
    let check = small_tables_source(b, o.tables, o.rows)?;
    for (vi, variant) in o.variants.iter().enumerate() {
        let case = match variant.as_str() {
            "off" => "no bundling".to_string(),
            "default" => "bundling, each tool's defaults".to_string(),
            v => format!("bundling {v}"),
        };
        for run in 1..=b.runs {
            let repos = repos_for(b, variant, &format!("{}-r{run}", vi), &o.codec)?;
            super::stanza_create_all(b, &repos)?;
            b.sql("CHECKPOINT")?;
            b.wal_switch_and_wait()?;
            let order = rotated(&repos, vi + run as usize);
            let mut labels = std::collections::HashMap::new();
            for r in &order {
                let before = file_count(&r.backup_area());
                let (m, label) = r.backup(b, "full", &[])?;
                b.results
                    .record(Row::timed(&case, "full backup", &r.label, run, &m))?;
                let objects = file_count(&r.backup_area()) - before;
                b.results
                    .record(Row::count(&case, "objects written", &r.label, run, objects))?;
                b.results.record(Row::bytes(
                    &case,
                    "backup size",
                    &r.label,
                    run,
                    Some(b.du(&r.backup_area())),
                ))?;
                labels.insert(r.label.clone(), label);
            }
            if o.restore {
                for r in &order {
                    let dir = b.empty_data_dir("restore")?;
                    let m = r.restore(b, &dir, &[&format!("--set={}", labels[&r.label])])?;
                    b.results
                        .record(Row::timed(&case, "restore", &r.label, run, &m))?;
                    if b.verify && run == 1 && r.label == b.pgstrata[0].label {
                        b.verify_restore(&dir, &check, &format!("bundling-{vi}"))?;
                    }
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
            remove_repos(b, &repos);
        }
    }
    Ok(())
}
