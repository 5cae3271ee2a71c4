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
//! With `--s3`, seed 003's setting: every repository is on the test kit's S3 server (moto)
//! behind its proxy's TLS listener, which adds DELAY_MS before every request/response turn
//! and counts them; each step's cell carries its requests, the note has them by kind. A
//! peer's restore of a million files at one request a file takes hours: `--step-limit`
//! stops it and the table shows a lower bound.
//!
//! Options: --tables N (100000) --rows N (1) --codec C (zst) --s3 --delay-ms MS (20)

use super::bundling::{locks_for, small_tables_source};
use super::s3_latency::{list_objects, pki, repo_settings, S3Proxy, BUCKET};
use super::{
    all_processes, manifest_bytes, manifest_sizes, new_repos, pgbr_setup, remove_repos, rotated,
    stanza_create_all, PgbrMode,
};
use crate::args::Args;
use crate::harness::{file_count, Bench, STANZA};
use crate::repos::{Repo, Setup};
use crate::results::{Measured, Row};
use std::path::PathBuf;

pub struct Opts {
    tables: u64,
    rows: u64,
    codec: String,
    s3: bool,
    delay_ms: u64,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let o = Opts {
            tables: a.uint("tables", 100_000, 1)?,
            rows: a.uint("rows", 1, 0)?,
            codec: a.string("codec", "zst"),
            s3: a.flag("s3"),
            delay_ms: a.uint("delay-ms", 20, 0)?,
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }
    pub fn params(&self) -> String {
        let s3 = if self.s3 {
            format!(" s3 delay-ms={}", self.delay_ms)
        } else {
            String::new()
        };
        format!(
            "tables={} rows={} codec={}{s3}",
            self.tables, self.rows, self.codec
        )
    }
}

/// The S3 server, its proxy, and the CA the tools trust.
struct S3 {
    moto: pgstrata_testkit::S3Server,
    proxy: S3Proxy,
    ca: PathBuf,
}

impl S3 {
    fn start(b: &Bench, delay_ms: u64) -> Result<S3, String> {
        let moto = pgstrata_testkit::S3Server::start(BUCKET)?;
        let (ca, cert, key) = pki(b)?;
        let proxy = S3Proxy::start(delay_ms, 0, moto.port, Some((cert, key)))?;
        Ok(S3 { moto, proxy, ca })
    }

    /// Where `r`'s repository keeps its backups in the bucket.
    fn backup_area(r: &Repo) -> String {
        let prefix = prefix(&r.config.file_stem().unwrap_or_default().to_string_lossy());
        if r.is_pgstrata() {
            format!("{prefix}/{STANZA}/backup/")
        } else {
            format!("{prefix}/backup/{STANZA}/")
        }
    }
}

/// The key prefix of the repository whose configuration is named `name` (`<case>-<n>`).
fn prefix(name: &str) -> String {
    format!("bench-{name}")
}

/// A step of `r`, measured over all its processes, with the requests it made through the
/// proxy when on S3: (cost, result, note, requests).
fn measured<T>(
    s3: Option<&mut S3>,
    r: &Repo,
    f: impl FnOnce() -> Result<(Measured, T), String>,
) -> Result<(Measured, T, String, Option<u64>), String> {
    let Some(s3) = s3 else {
        let (m, x, note) = all_processes(r, f)?;
        return Ok((m, x, note, None));
    };
    let before = s3.proxy.turns()?;
    let (m, x, note) = all_processes(r, f)?;
    let after = s3.proxy.turns()?;
    let mix = s3.proxy.mix(before + 1, after);
    Ok((
        m,
        x,
        format!("{note}; requests: {mix}"),
        Some(after - before),
    ))
}

/// The repositories of run `run`: pgstrata with its defaults, pgBackRest with bundling and
/// block incremental; on S3 when `s3` is given.
fn run_repos(b: &Bench, o: &Opts, run: u64, s3: Option<&S3>) -> Result<Vec<Repo>, String> {
    let case = format!("r{run}");
    let mut setups = Vec::new();
    for t in &b.pgstrata {
        setups.push((t, t.label.clone(), Setup::default()));
    }
    for t in &b.pgbackrest {
        let (label, setup) = pgbr_setup(t, PgbrMode::Block);
        setups.push((t, label, setup));
    }
    if let Some(s3) = s3 {
        let tls = s3
            .proxy
            .tls_port
            .ok_or("the S3 proxy has no TLS listener")?;
        for (n, (t, _, setup)) in setups.iter_mut().enumerate() {
            // pgBackRest is given the port alone (repo_settings).
            let endpoint = if t.is_pgstrata() {
                format!("https://127.0.0.1:{tls}")
            } else {
                tls.to_string()
            };
            // new_repos names the configurations `<case>-<n>`.
            let prefix = prefix(&format!("{case}-{n}"));
            setup.remote = true;
            setup
                .settings
                .extend(repo_settings(t, &endpoint, &prefix, Some(&s3.ca)));
        }
    }
    new_repos(b, &case, &o.codec, setups)
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    let mut s3 = if o.s3 {
        Some(S3::start(b, o.delay_ms)?)
    } else {
        None
    };
    b.start_cluster(&locks_for(o.tables))?;
    let check = small_tables_source(b, o.tables, o.rows)?;
    let case = if o.s3 {
        format!(
            "{} tables of {} row(s), S3 +{} ms",
            o.tables, o.rows, o.delay_ms
        )
    } else {
        format!("{} tables of {} row(s)", o.tables, o.rows)
    };
    for run in 1..=b.runs {
        let repos = run_repos(b, o, run, s3.as_ref())?;
        stanza_create_all(b, &repos)?;
        b.sql("CHECKPOINT")?;
        b.wal_switch_and_wait()?;
        let order = rotated(&repos, run as usize - 1);
        for r in &order {
            backup(b, s3.as_mut(), r, &case, run, "full")?;
        }
        b.sql("CHECKPOINT")?;
        b.wal_switch_and_wait()?;
        let mut incr = std::collections::HashMap::new();
        for r in &order {
            incr.insert(
                r.label.clone(),
                backup(b, s3.as_mut(), r, &case, run, "incr")?,
            );
        }
        b.archive_nowhere();
        for r in &order {
            let dir = b.empty_data_dir("restore")?;
            let set = format!("--set={}", incr[&r.label]);
            let (m, (), note, requests) =
                measured(s3.as_mut(), r, || Ok((r.restore(b, &dir, &[&set])?, ())))?;
            b.results.record(
                Row::timed(&case, "full restore of the incr", &r.label, run, &m)
                    .with_count(requests)
                    .note(note),
            )?;
            if b.verify && run == 1 && r.is_pgstrata() && !m.stopped_at_limit {
                b.verify_restore(&dir, &check, "many-files")?;
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        remove_repos(b, &repos);
    }
    Ok(())
}

/// A backup of `kind` into `r` with everything it is measured by: time and memory (and
/// requests, on S3), objects added to the backup area, manifest and stored bytes. Returns
/// its label.
fn backup(
    b: &mut Bench,
    mut s3: Option<&mut S3>,
    r: &Repo,
    case: &str,
    run: u64,
    kind: &str,
) -> Result<String, String> {
    let objects = |s3: &Option<&mut S3>| match s3 {
        Some(s3) => Ok(list_objects(s3.moto.port, &S3::backup_area(r))?.len() as u64),
        None => Ok::<_, String>(file_count(&r.backup_area())),
    };
    let before = objects(&s3)?;
    let step = if kind == "full" {
        "full backup"
    } else {
        "no-change incr"
    };
    let (m, label, note, requests) = measured(s3.as_deref_mut(), r, || r.backup(b, kind, &[]))?;
    b.results.record(
        Row::timed(case, step, &r.label, run, &m)
            .with_count(requests)
            .note(note),
    )?;
    let sizes = r.backup_sizes(b, &label)?;
    if sizes.kind != kind {
        return Err(format!(
            "{}: backup {label} is '{}', not {kind}",
            r.label, sizes.kind
        ));
    }
    let objects = objects(&s3)? - before;
    let (manifest, with_copy) = match &s3 {
        Some(s3) => {
            let dir = format!("{}{label}/", S3::backup_area(r));
            let listed = list_objects(s3.moto.port, &dir)?;
            manifest_sizes(
                listed
                    .iter()
                    .filter_map(|(k, n)| Some((k.strip_prefix(&dir)?, *n))),
            )
        }
        None => manifest_bytes(r, &label)?,
    };
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
