//! Command-line options: `--name value`, `--name=value` and flags, read by name with typed
//! getters. Every scenario takes what it knows and `finish` refuses the rest, so a typo is an
//! error naming the option rather than a silently ignored setting.

use std::collections::BTreeMap;
use std::path::PathBuf;

pub struct Args {
    /// Option name (without `--`) -> values in the order given (repeatable options).
    values: BTreeMap<String, Vec<String>>,
    pub positional: Vec<String>,
}

/// Options that take no value.
const FLAGS: &[&str] = &[
    "verify",
    "keep",
    "no-build",
    "no-restore",
    "s3-nodelay",
    "s3",
    "help",
];

impl Args {
    pub fn parse(raw: impl IntoIterator<Item = String>) -> Result<Args, String> {
        let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut positional = Vec::new();
        let mut it = raw.into_iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                positional.push(a);
                continue;
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None if FLAGS.contains(&name) => (name.to_string(), "true".to_string()),
                None => {
                    let v = it
                        .next()
                        .ok_or_else(|| format!("option --{name} needs a value"))?;
                    (name.to_string(), v)
                }
            };
            values.entry(name).or_default().push(value);
        }
        Ok(Args { values, positional })
    }

    pub fn flag(&mut self, name: &str) -> bool {
        self.values
            .remove(name)
            .is_some_and(|v| v.last().is_some_and(|x| x != "false"))
    }

    pub fn string(&mut self, name: &str, default: &str) -> String {
        self.opt_string(name).unwrap_or_else(|| default.to_string())
    }

    pub fn opt_string(&mut self, name: &str) -> Option<String> {
        self.values.remove(name).and_then(|mut v| v.pop())
    }

    /// Every value of a repeatable option.
    pub fn all(&mut self, name: &str) -> Vec<String> {
        self.values.remove(name).unwrap_or_default()
    }

    pub fn uint(&mut self, name: &str, default: u64, min: u64) -> Result<u64, String> {
        match self.opt_string(name) {
            None => Ok(default),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n >= min => Ok(n),
                _ => Err(format!("--{name} must be an integer >= {min}, got '{v}'")),
            },
        }
    }

    /// A comma-separated list, each item checked against `allowed` (when not empty).
    pub fn list(
        &mut self,
        name: &str,
        default: &str,
        allowed: &[&str],
    ) -> Result<Vec<String>, String> {
        let v = self.string(name, default);
        let items: Vec<String> = v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if items.is_empty() {
            return Err(format!("--{name} is empty"));
        }
        if let Some(bad) = items
            .iter()
            .find(|i| !allowed.is_empty() && !allowed.contains(&i.as_str()))
        {
            return Err(format!(
                "--{name}: unknown value '{bad}' (allowed: {})",
                allowed.join(", ")
            ));
        }
        Ok(items)
    }

    pub fn uint_list(&mut self, name: &str, default: &str) -> Result<Vec<u64>, String> {
        self.list(name, default, &[])?
            .iter()
            .map(|s| {
                s.parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("--{name}: '{s}' is not a positive integer"))
            })
            .collect()
    }

    /// Refuse options nobody asked for.
    pub fn finish(self) -> Result<(), String> {
        if let Some(name) = self.values.keys().next() {
            return Err(format!("unknown option --{name} (see bench help)"));
        }
        if !self.positional.is_empty() {
            return Err(format!("unexpected argument '{}'", self.positional[0]));
        }
        Ok(())
    }
}

/// Options every scenario takes.
pub struct Common {
    pub process_max: u64,
    pub runs: u64,
    pub verify: bool,
    pub keep: bool,
    /// A timed command still running after this long is stopped and recorded as a lower
    /// bound (`--step-limit SECS`; None: no limit).
    pub step_limit: Option<std::time::Duration>,
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
    pub fn parse(a: &mut Args) -> Result<Common, String> {
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
            step_limit: match a.uint("step-limit", 0, 0)? {
                0 => None,
                n => Some(std::time::Duration::from_secs(n)),
            },
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

impl Common {
    /// For commands that measure no tool.
    pub fn parse_without_tools(a: &mut Args) -> Result<Common, String> {
        let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
        Ok(Common {
            process_max: 1,
            runs: 1,
            verify: false,
            keep: a.flag("keep"),
            step_limit: None,
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
