//! pgstrata's benchmarks: pgstrata against pgBackRest (Debian's 2.45 and 2.59.1) on the test
//! kit's throwaway clusters, one function per scenario. See bench/README.md.
//!
//! Results are appended as CSV under `bench/runs/DATE/` and printed as markdown tables;
//! `bench report` rewrites the README's tables from the latest CSV rows.

mod args;
mod harness;
mod limits;
mod link;
mod manifest_scale;
mod procs;
mod results;
mod scenarios;
mod tools;

use args::Args;
use std::path::PathBuf;

const USAGE: &str = "\
usage: bench SCENARIO [options]      run one scenario (as root: the clusters run as postgres)
       bench report [--readme FILE] [--runs-dir DIR]   rewrite the README tables from the CSVs
       bench limits                  measure disk and codec limits only
       bench time-call LOG CMD [ARG...]  run CMD, append its wall time (µs) and exit code to
                                     LOG, exit with its code (wal_async's restore_command)

scenarios: full_backup incremental restore bundling s3_latency wal_tracking wal_archive wal_async
           decode_overhead remote_link many_files growth
           manifest_scale (no PostgreSQL: the metadata of a 1 TB backup, formats 1 and 2)

options of every scenario:
  --pgstrata [LABEL=]BIN  pgstrata binary to measure; repeat to compare builds side by side
                          (default: build target/bench/release/pgstrata with cargo)
  --no-build              use target/bench/release/pgstrata as it is
  --pgbackrest BIN|none   pgBackRest binary; repeatable (default: /usr/bin/pgbackrest and
                          /opt/pgbackrest-2.59.1/bin/pgbackrest, whichever exist)
  --process-max N         workers of both tools (default 2)
  --runs N                repeat the timed steps, keep the best (default 1)
  --verify                start restored clusters and compare their tables with the source
  --pg-major N            PostgreSQL major of the source cluster (default 15)
  --out-dir DIR           where the CSV goes (default bench/runs/DATE)
  --keep                  keep the scratch directory (repositories, logs)
scenario options: see bench/README.md, or the top of bench/src/scenarios/SCENARIO.rs";

/// Options every scenario takes.
pub struct Common {
    pub process_max: u64,
    pub runs: u64,
    pub verify: bool,
    pub keep: bool,
    pub pg_major: u32,
    pub out_dir: PathBuf,
    pub pgstrata: Vec<(String, PathBuf)>,
    pub pgbackrest: Vec<PathBuf>,
}

pub fn workspace_root() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    bench.parent().map(PathBuf::from).unwrap_or(bench)
}

impl Common {
    fn parse(a: &mut Args) -> Result<Common, String> {
        let no_build = a.flag("no-build");
        let mut pgstrata: Vec<(String, PathBuf)> = a
            .all("pgstrata")
            .into_iter()
            .map(|v| match v.split_once('=') {
                Some((l, p)) => (l.to_string(), PathBuf::from(p)),
                None => (String::new(), PathBuf::from(v)),
            })
            .collect();
        if pgstrata.is_empty() {
            pgstrata.push((String::new(), build_pgstrata(!no_build)?));
        }
        let given = a.all("pgbackrest");
        let pgbackrest = if given.iter().any(|g| g == "none") {
            Vec::new()
        } else if given.is_empty() {
            [
                "/usr/bin/pgbackrest",
                "/opt/pgbackrest-2.59.1/bin/pgbackrest",
            ]
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.is_file())
            .collect()
        } else {
            given.into_iter().map(PathBuf::from).collect()
        };
        Ok(Common {
            process_max: a.uint("process-max", 2, 1)?,
            runs: a.uint("runs", 1, 1)?,
            verify: a.flag("verify"),
            pgstrata,
            pgbackrest,
            ..Common::parse_without_tools(a)?
        })
    }
}

/// `cargo build --release -p pgstrata` into target/bench (not the shared target/).
fn build_pgstrata(build: bool) -> Result<PathBuf, String> {
    let root = workspace_root();
    let target = root.join("target/bench");
    if build {
        eprintln!(
            "[bench] cargo build --release -p pgstrata (CARGO_TARGET_DIR={})",
            target.display()
        );
        pgstrata_testkit::run_ok(
            std::process::Command::new("cargo")
                .current_dir(&root)
                .env("CARGO_TARGET_DIR", &target)
                .args(["build", "--release", "-q", "-p", "pgstrata"])
                .stdout(std::process::Stdio::inherit())
                .stderr(std::process::Stdio::inherit()),
        )?;
    }
    let bin = target.join("release/pgstrata");
    if !bin.is_file() {
        return Err(format!(
            "{} not found: build it or pass --pgstrata BIN",
            bin.display()
        ));
    }
    Ok(bin)
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    // Before option parsing: the command's own arguments are not the bench's.
    if raw.first().map(String::as_str) == Some("time-call") {
        std::process::exit(time_call(&raw[1..]));
    }
    if let Err(e) = run(raw) {
        eprintln!("bench: error: {e}");
        std::process::exit(1);
    }
}

/// `time-call LOG CMD ARGS...`: run CMD (no shell), append "<wall µs> <exit code>" to LOG,
/// and return CMD's exit code, so that a wrapped restore_command answers PostgreSQL as the
/// command would.
fn time_call(args: &[String]) -> i32 {
    let [log, cmd, rest @ ..] = args else {
        eprintln!("bench time-call: give LOG CMD [ARG...]");
        return 2;
    };
    let t0 = std::time::Instant::now();
    let code = match std::process::Command::new(cmd).args(rest).status() {
        Ok(s) => s.code().unwrap_or(128),
        Err(e) => {
            eprintln!("bench time-call: {cmd}: {e}");
            127
        }
    };
    let line = format!("{} {code}\n", t0.elapsed().as_micros());
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = appended {
        eprintln!("bench time-call: {log}: {e}");
    }
    code
}

fn run(raw: Vec<String>) -> Result<(), String> {
    let mut a = Args::parse(raw)?;
    let cmd = if a.positional.is_empty() {
        "help".to_string()
    } else {
        a.positional.remove(0)
    };
    match cmd.as_str() {
        "help" => {
            println!("{USAGE}");
            Ok(())
        }
        "report" => {
            let readme = PathBuf::from(a.string(
                "readme",
                &workspace_root().join("bench/README.md").to_string_lossy(),
            ));
            let runs = PathBuf::from(a.string(
                "runs-dir",
                &workspace_root().join("bench/runs").to_string_lossy(),
            ));
            a.finish()?;
            let done = results::rewrite_readme(&readme, &runs)?;
            eprintln!(
                "[bench] report: {} updated: {}",
                readme.display(),
                done.join(", ")
            );
            Ok(())
        }
        "limits" => {
            let common = Common {
                pgstrata: Vec::new(),
                pgbackrest: Vec::new(),
                ..Common::parse_without_tools(&mut a)?
            };
            a.finish()?;
            let b = harness::Bench::new("limits", common, "standalone".into())?;
            let mut r = b.results;
            limits::measure(&mut r, &b.scratch.path, None)?;
            println!("{}", limits::render(&r.records));
            Ok(())
        }
        "manifest_scale" => manifest_scale::main(a),
        name => scenarios::run(name, a),
    }
}

impl Common {
    /// For commands that measure no tool.
    fn parse_without_tools(a: &mut Args) -> Result<Common, String> {
        let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
        Ok(Common {
            process_max: 1,
            runs: 1,
            verify: false,
            keep: a.flag("keep"),
            pg_major: a.uint("pg-major", 15, 10)? as u32,
            out_dir: a
                .opt_string("out-dir")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("bench/runs").join(date)),
            pgstrata: Vec::new(),
            pgbackrest: Vec::new(),
        })
    }
}
