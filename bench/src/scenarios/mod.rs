//! One module per scenario, each `Opts::parse` (its own options) and `run` (the steps).
//! What they share: the peer matrix (which pgBackRest configurations stand beside pgstrata),
//! the order rotation that spreads ordering effects, and the 1 % change of seed 000.

pub mod bundling;
pub mod copy;
pub mod decode_overhead;
pub mod full_backup;
pub mod growth;
pub mod incremental;
pub mod instant;
pub mod many_files;
pub mod remote_link;
pub mod restore;
pub mod s3_latency;
pub mod wal_archive;
pub mod wal_async;
pub mod wal_receive;
pub mod wal_tracking;

use crate::args::Args;
use crate::args::Common;
use crate::harness::Bench;
use crate::repos::{Repo, Setup};
use crate::results::Measured;
use crate::results::Results;
use crate::tools::{Kind, Tool};

/// Passphrase of the benchmarks' encrypted repositories (every tool).
const BENCH_CIPHER_PASS: &str = "pgstrata-bench-passphrase";

pub fn run(name: &str, mut a: Args) -> Result<(), String> {
    macro_rules! scenario {
        ($m:ident) => {{
            let o = $m::Opts::parse(&mut a)?;
            let params = o.params();
            go(stringify!($m), a, params, |b| $m::run(b, &o))
        }};
    }
    match name {
        "full_backup" => scenario!(full_backup),
        "copy" => scenario!(copy),
        "wal_receive" => scenario!(wal_receive),
        "instant" => scenario!(instant),
        "incremental" => scenario!(incremental),
        "restore" => scenario!(restore),
        "bundling" => scenario!(bundling),
        "s3_latency" => scenario!(s3_latency),
        "wal_tracking" => scenario!(wal_tracking),
        "wal_archive" => scenario!(wal_archive),
        "wal_async" => scenario!(wal_async),
        "decode_overhead" => scenario!(decode_overhead),
        "remote_link" => scenario!(remote_link),
        "many_files" => scenario!(many_files),
        "growth" => scenario!(growth),
        _ => Err(format!("unknown scenario '{name}' (see bench help)")),
    }
}

fn go(
    name: &'static str,
    mut a: Args,
    params: String,
    f: impl FnOnce(&mut Bench) -> Result<(), String>,
) -> Result<(), String> {
    let common = Common::parse(&mut a)?;
    a.finish()?;
    let params = format!(
        "{params} process-max={} runs={}",
        common.process_max, common.runs
    );
    let out_dir = common.out_dir.clone();
    let mut b = Bench::new(name, common, params)?;
    let outcome = f(&mut b);
    b.archive_nowhere();
    if let Err(e) = &outcome {
        b.scratch.keep = true;
        eprintln!(
            "[bench] {name} failed; scratch directory kept: {}",
            b.scratch.path.display()
        );
        eprintln!("[bench] {e}");
    }
    let mut limits = Results::create(
        &out_dir,
        "limits",
        &format!("measured after {name}"),
        &[],
        &b.pg,
    )?;
    let sample = b
        .cluster
        .as_ref()
        .and_then(|c| largest_file(&c.data.join("base")));
    crate::limits::measure(&mut limits, &b.scratch.path, sample.as_deref())?;
    let _ = b.drop_cluster();
    println!("{}", crate::results::render(&b.results.records));
    println!(
        "Physical limits:\n\n{}",
        crate::results::render_limits(&limits.records)
    );
    eprintln!(
        "[bench] results appended to {} (README tables: cargo run -p pgstrata-bench -- report)",
        b.results.file.display()
    );
    outcome
}

fn largest_file(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let cand = if p.is_dir() {
            largest_file(&p).and_then(|f| std::fs::metadata(&f).ok().map(|m| (m.len(), f)))
        } else {
            e.metadata().ok().map(|m| (m.len(), p))
        };
        if let Some(c) = cand {
            if best.as_ref().is_none_or(|b| c.0 > b.0) {
                best = Some(c);
            }
        }
    }
    best.map(|b| b.1)
}

/// How a pgBackRest repository is set up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PgbrMode {
    /// repo1-bundle=n: pgBackRest's default.
    Plain,
    Bundle,
    /// Bundling and block incremental (a beta in 2.45: needs beta=y).
    Block,
}

impl PgbrMode {
    pub fn parse_bundle(v: &str) -> Result<Vec<PgbrMode>, String> {
        Ok(match v {
            "n" => vec![PgbrMode::Plain],
            "y" => vec![PgbrMode::Bundle],
            "both" => vec![PgbrMode::Plain, PgbrMode::Bundle],
            _ => return Err(format!("--pgbr-bundle must be n, y or both, got '{v}'")),
        })
    }
}

/// The modes a pgBackRest version runs in: the ones asked for on a version whose block
/// incremental is a beta (2.45), and bundling + block incremental on a current one (2.59.1).
pub fn pgbr_modes(tool: &Tool, asked: &[PgbrMode]) -> Vec<PgbrMode> {
    match tool.kind {
        Kind::PgBackRest { block_beta: true } => asked.to_vec(),
        _ => vec![PgbrMode::Block],
    }
}

/// Column title and configuration of a pgBackRest repository.
pub fn pgbr_setup(tool: &Tool, mode: PgbrMode) -> (String, Setup) {
    let beta = matches!(tool.kind, Kind::PgBackRest { block_beta: true });
    let (what, settings): (&str, Vec<&str>) = match mode {
        PgbrMode::Plain => ("bundle=n", vec!["repo1-bundle=n"]),
        PgbrMode::Bundle => ("bundle=y", vec!["repo1-bundle=y"]),
        PgbrMode::Block if beta => (
            "bundle=y, block=y, beta",
            vec!["repo1-bundle=y", "repo1-block=y", "beta=y"],
        ),
        PgbrMode::Block => ("bundle=y, block=y", vec!["repo1-bundle=y", "repo1-block=y"]),
    };
    (
        format!("{} ({what})", tool.label),
        Setup {
            settings: settings.into_iter().map(str::to_string).collect(),
            ..Setup::default()
        },
    )
}

/// Repositories for every pgstrata binary × `variants` (title suffix, setup) and every
/// pgBackRest version × its modes, named `<case>-<n>`.
pub fn repos(
    b: &Bench,
    case: &str,
    codec: &str,
    variants: &[(&str, Setup)],
    pgbr_asked: &[PgbrMode],
    pgbr_extra: &[String],
) -> Result<Vec<Repo>, String> {
    let mut setups = Vec::new();
    for t in &b.pgstrata {
        for (suffix, setup) in variants {
            let label = if suffix.is_empty() {
                t.label.clone()
            } else {
                format!("{} {suffix}", t.label)
            };
            setups.push((t, label, setup.clone()));
        }
    }
    for t in &b.pgbackrest {
        for mode in pgbr_modes(t, pgbr_asked) {
            let (label, mut setup) = pgbr_setup(t, mode);
            setup.settings.extend(pgbr_extra.iter().cloned());
            setups.push((t, label, setup));
        }
    }
    new_repos(b, case, codec, setups)
}

/// A repository for each (tool, column title, setup) of `setups`, in order, named
/// `<case>-<n>`.
pub fn new_repos(
    b: &Bench,
    case: &str,
    codec: &str,
    setups: Vec<(&Tool, String, Setup)>,
) -> Result<Vec<Repo>, String> {
    (0..)
        .zip(setups)
        .map(|(n, (t, label, setup))| Repo::new(b, t, &label, &format!("{case}-{n}"), codec, setup))
        .collect()
}

/// `items` rotated by `k`: which tool goes first changes between runs and cases.
pub fn rotated<T>(items: &[T], k: usize) -> Vec<&T> {
    let n = items.len().max(1);
    items.iter().cycle().skip(k % n).take(items.len()).collect()
}

pub fn stanza_create_all(b: &mut Bench, repos: &[Repo]) -> Result<(), String> {
    let labels: Vec<&str> = repos.iter().map(|r| r.label.as_str()).collect();
    b.results.declare(&labels);
    for r in repos {
        r.stanza_create(b)?;
    }
    let refs: Vec<&Repo> = repos.iter().collect();
    b.archive_to(&Repo::push_commands(&refs))
}

/// Remove the repositories of a finished case (disk space), after the archive command
/// stopped pushing to them.
pub fn remove_repos(b: &Bench, repos: &[Repo]) {
    b.archive_nowhere();
    if !b.scratch.keep {
        for r in repos {
            let _ = std::fs::remove_dir_all(&r.dir);
        }
    }
}

/// Seed 000's change: delete `pct` % of every copy (`{prefix}1` to `{prefix}{copies}`) as
/// one contiguous aid range; `n` numbers the change so that successive changes hit rows
/// that are still there.
pub fn delete_ranges(
    b: &Bench,
    scale: u64,
    copies: u64,
    pct: u64,
    n: u64,
    prefix: &str,
) -> Result<(), String> {
    let tables: Vec<String> = (1..=copies).map(|i| format!("{prefix}{i}")).collect();
    delete_ranges_of(b, &tables, scale, pct, n)
}

/// [`delete_ranges`] of pgbench_accounts copies `tables` of a database of pgbench `scale`:
/// `pct` % of each deleted as one contiguous aid range, placed by the change's number `n`
/// and the table's position, then VACUUM ANALYZE.
pub fn delete_ranges_of(
    b: &Bench,
    tables: &[String],
    scale: u64,
    pct: u64,
    n: u64,
) -> Result<(), String> {
    let rows = scale * 100_000;
    let chunk = rows * pct / 100;
    let mut sql = String::new();
    for (i, t) in (0u64..).zip(tables) {
        let frac = (5 + 13 * i + 37 * n) % (100 - pct.min(99));
        let a = rows * frac / 100 + 1;
        sql += &format!(
            "DELETE FROM {t} WHERE aid BETWEEN {a} AND {}; ",
            a + chunk - 1
        );
    }
    eprintln!("[bench] change #{n}: {sql}");
    b.sql(&sql)?;
    b.sql("VACUUM ANALYZE")?;
    Ok(())
}

/// Byte position of the current WAL insert location.
fn current_lsn(b: &Bench) -> Result<u64, String> {
    b.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")?
        .parse()
        .map_err(|e| format!("current WAL position: {e}"))
}

/// The cluster's WAL segment size in bytes.
pub fn wal_segment_size(b: &Bench) -> Result<u64, String> {
    b.sql("SELECT setting::bigint * CASE unit WHEN 'MB' THEN 1048576 ELSE 1 END FROM pg_settings WHERE name = 'wal_segment_size'")?
        .parse()
        .map_err(|e| format!("wal_segment_size: {e}"))
}

/// Run `traffic` until `segments` whole segments were written after a fresh one began, and
/// switch and wait for them to be archived. Returns the first one's start (bytes).
pub fn generate_segments(
    b: &Bench,
    segments: u64,
    traffic: &dyn Fn(&Bench) -> Result<(), String>,
) -> Result<u64, String> {
    let seg_size = wal_segment_size(b)?;
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()?;
    let first = current_lsn(b)? / seg_size * seg_size;
    // Rounds until there are enough (a slow machine writes fewer segments a round), within
    // an hour: a scenario must not go on with fewer segments than it says it measures.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    loop {
        let written = (current_lsn(b)? - first) / seg_size;
        if written >= segments {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "only {written} of {segments} WAL segments written in an hour of traffic"
            ));
        }
        traffic(b)?;
    }
    b.wal_switch_and_wait()?;
    Ok(first)
}

/// Write `segments` segments of pgbench-like WAL (bulk updates of a seventh of the accounts,
/// which write full-page images, heap and index records, between 2-second pgbench runs of
/// small transactions). Returns the first one's start (bytes).
pub fn generate_pgbench_segments(b: &Bench, segments: u64) -> Result<u64, String> {
    let round = std::cell::Cell::new(0u64);
    generate_segments(b, segments, &|b| {
        round.set(round.get() + 1);
        b.sql(&format!(
            "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid % 7 = {}",
            round.get() % 7
        ))?;
        b.cluster()
            .pgbench(&["-n", "-c", "2", "-j", "2", "-T", "2", "postgres"])
            .map(drop)
            .map_err(String::from)
    })
}

/// One timed shell loop running `command` once per segment, as PostgreSQL runs
/// archive_command and restore_command: archive-push of `dir/NAME`, or archive-get of NAME
/// into `dir/NAME`; `then` is a shell statement run after each successful call (`$d` is
/// `dir`, `$f` the name).
pub fn per_segment_loop(
    b: &mut Bench,
    repo: &Repo,
    dir: &std::path::Path,
    names: &[String],
    command: &str,
    then: &str,
) -> Result<crate::results::Measured, String> {
    let args = if command == "archive-push" {
        "\"$d/$f\""
    } else {
        "\"$f\" \"$d/$f\""
    };
    let script = format!(
        "d='{}'; for f in {}; do '{}' --config='{}' --stanza={} {command} {args} || exit 1; {then} done",
        dir.display(),
        names.join(" "),
        repo.tool.bin.display(),
        repo.config.display(),
        crate::harness::STANZA,
    );
    b.run(
        &format!("{command}-loop"),
        std::process::Command::new("sh").args(["-c", &script]),
        true,
    )
}

/// Fetch the `segments` segments from `first` (bytes) out of `repo` with archive-get into
/// `dir`; returns their names.
pub fn fetch_segments(
    b: &mut Bench,
    repo: &Repo,
    first: u64,
    segments: u64,
    dir: &std::path::Path,
) -> Result<Vec<String>, String> {
    let seg_size = wal_segment_size(b)?;
    let mut names = Vec::new();
    for i in 0..segments {
        let name = b.sql(&format!(
            "SELECT pg_walfile_name(pg_lsn '0/0' + ({} + 1)::numeric)",
            first + i * seg_size
        ))?;
        let mut cmd = std::process::Command::new(&repo.tool.bin);
        cmd.arg(format!("--config={}", repo.config.display()))
            .arg(format!("--stanza={}", crate::harness::STANZA))
            .arg("archive-get")
            .arg(&name)
            .arg(dir.join(&name));
        b.run(&format!("archive-get-{name}"), &mut cmd, false)?;
        names.push(name);
    }
    Ok(names)
}

/// Bytes of the source database (sum of pg_database_size).
pub fn database_size(b: &Bench) -> Result<u64, String> {
    b.sql("SELECT sum(pg_database_size(oid)) FROM pg_database")?
        .parse()
        .map_err(|e| format!("database size: {e}"))
}

/// Record the source database's size, the table's context row.
pub fn record_database_size(b: &mut Bench) -> Result<(), String> {
    let size = database_size(b)?;
    b.results.record(crate::results::Row::bytes(
        "source",
        "database size",
        "source",
        0,
        Some(size),
    ))
}

/// The source of the incremental and restore scenarios: pgbench data, vacuumed and
/// checkpointed, its size recorded.
pub fn load_settled_pgbench(b: &mut Bench, scale: u64, copies: u64) -> Result<(), String> {
    b.start_cluster("")?;
    b.load_pgbench(scale, copies, "test")?;
    b.sql("VACUUM ANALYZE")?;
    b.sql("CHECKPOINT")?;
    record_database_size(b)
}

/// Run a timed step of `repo`'s tool (`f` returns the command's cost and its result) while
/// sampling every process running the tool's binary from /proc (pgBackRest's workers, any
/// helper it starts), but for the archive-push that PostgreSQL's archiver runs meanwhile.
/// The cost's peak RSS becomes their largest sum at one instant; the note ("all processes:
/// ...") says so, with wait4's largest single process.
pub fn all_processes<T>(
    repo: &Repo,
    f: impl FnOnce() -> Result<(Measured, T), String>,
) -> Result<(Measured, T, String), String> {
    let bin = std::fs::canonicalize(&repo.tool.bin).unwrap_or_else(|_| repo.tool.bin.clone());
    let tool = crate::procs::Matcher::ExeWithout {
        exe: bin,
        arg: "archive-push".into(),
    };
    let ((mut m, x), seen) = crate::procs::sampled(&[tool], f)?;
    let largest = m.max_rss_kb;
    m.max_rss_kb = seen[0].peak_rss_kb;
    let note = format!(
        "all processes (archive-push aside): peak RSS {:.0} MB, up to {} at once, CPU {:.2} s; wait4 (largest process) {:.0} MB",
        seen[0].peak_rss_kb as f64 / 1024.0,
        seen[0].peak_procs,
        seen[0].cpu_seconds,
        largest as f64 / 1024.0
    );
    Ok((m, x, note))
}

/// Whether `rel`, a path in a backup's directory, is part of its manifest
/// (`backup.manifest` and, in pgstrata's format 4, the parts of its entries, `manifest/<n>`),
/// and if so whether it is a copy (both tools write a `.copy`).
pub fn manifest_object(rel: &str) -> Option<bool> {
    let of_manifest =
        (rel.starts_with("backup.manifest") && !rel.contains('/')) || rel.starts_with("manifest/");
    of_manifest.then(|| rel.ends_with(".copy"))
}

/// Bytes of the manifest among a backup's objects (path in its directory, size): without
/// its copies, and with them.
pub fn manifest_sizes<'a>(objects: impl IntoIterator<Item = (&'a str, u64)>) -> (u64, u64) {
    objects
        .into_iter()
        .filter_map(|(rel, n)| Some((manifest_object(rel)?, n)))
        .fold((0, 0), |(main, all), (copy, n)| {
            (if copy { main } else { main + n }, all + n)
        })
}

/// Bytes of a backup's manifest in `repo`'s local backup area ([`manifest_object`]): without
/// its copies, and with them.
pub fn manifest_bytes(repo: &Repo, label: &str) -> Result<(u64, u64), String> {
    let dir = repo.backup_area().join(label);
    std::fs::metadata(dir.join("backup.manifest"))
        .map_err(|e| format!("{}: {}/backup.manifest: {e}", repo.label, dir.display()))?;
    let kind = |p: &std::path::Path| manifest_object(&p.strip_prefix(&dir).ok()?.to_string_lossy());
    let main = crate::harness::dir_size(&dir, &mut |p| kind(p) == Some(false));
    let all = crate::harness::dir_size(&dir, &mut |p| kind(p).is_some());
    Ok((main, all))
}
