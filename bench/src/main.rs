//! pgstrata's benchmarks: pgstrata against pgBackRest (Debian's 2.45 and 2.59.1) on the test
//! kit's throwaway clusters, one function per scenario. See bench/README.md.
//!
//! Results are appended as CSV under `bench/runs/DATE/` and printed as markdown tables;
//! `bench report` rewrites the README's tables from the latest CSV rows.

mod args;
mod harness;
mod limits;
mod manifest_scale;
mod procs;
mod repos;
mod results;
mod scenarios;
mod tools;

use args::{workspace_root, Args, Common};
use std::path::PathBuf;

const USAGE: &str = "\
usage: bench SCENARIO [options]      run one scenario (as root: the clusters run as postgres)
       bench report [--readme FILE] [--runs-dir DIR]   rewrite the README tables from the CSVs
       bench limits                  measure disk and codec limits only
       bench time-call LOG CMD [ARG...]  run CMD, append its wall time (µs) and exit code to
                                     LOG, exit with its code (wal_async's restore_command)

scenarios: full_backup incremental restore bundling s3_latency wal_tracking wal_archive wal_async copy wal_receive instant
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
  --step-limit SECS       stop a timed command still running after SECS (its process group)
                          and record it as taking at least SECS (a peer's hours-long restore)
scenario options: see bench/README.md, or the top of bench/src/scenarios/SCENARIO.rs";

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
            println!("{}", results::render_limits(&r.records));
            Ok(())
        }
        "manifest_scale" => manifest_scale::main(a),
        name => scenarios::run(name, a),
    }
}

/// The modules form layers: each uses only those of lower layers (no import cycle), so one
/// can be read knowing only what is below it.
#[cfg(test)]
mod layers {
    /// Lowest first; `main` (the crate root) dispatches to all of them.
    const LAYERS: &[&[&str]] = &[
        &["args", "procs", "tools"],
        &["results"],
        &["limits", "harness"],
        &["repos", "manifest_scale"],
        &["scenarios"],
    ];

    fn layer(module: &str) -> usize {
        LAYERS
            .iter()
            .position(|l| l.contains(&module))
            .unwrap_or_else(|| panic!("module {module} is in no layer of LAYERS"))
    }

    #[test]
    fn each_module_uses_only_lower_layers() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![];
        for e in std::fs::read_dir(&src).unwrap().flatten() {
            let p = e.path();
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                for f in std::fs::read_dir(&p).unwrap().flatten() {
                    files.push((name.clone(), f.path()));
                }
            } else if name != "main" {
                files.push((name, p));
            }
        }
        let mut wrong = vec![];
        for (module, path) in &files {
            let text = std::fs::read_to_string(path).unwrap();
            for (at, _) in text.match_indices("crate::") {
                let used: String = text[at + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if layer(&used) >= layer(module) && used != *module {
                    wrong.push(format!("{} uses crate::{used}", path.display()));
                }
            }
        }
        assert!(wrong.is_empty(), "imports against the layers: {wrong:#?}");
    }
}
