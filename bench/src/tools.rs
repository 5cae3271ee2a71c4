//! The tools under test: one pgstrata build or pgBackRest version each, with its version
//! line, and the codec levels both are given. Their repositories are in `repos`.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Pgstrata,
    PgBackRest {
        /// Block incremental needs `beta=y` (2.45 has it as a beta feature).
        block_beta: bool,
    },
}

/// One binary: pgstrata (a build, copied into the scratch directory so that a rebuild during
/// the run does not change what is measured) or a pgBackRest version.
#[derive(Clone, Debug)]
pub struct Tool {
    pub kind: Kind,
    /// Column title: "pgstrata", "pgstrata before", "pgBackRest 2.45".
    pub label: String,
    pub bin: PathBuf,
    /// Version line, plus the sha256 prefix for pgstrata.
    pub version: String,
}

impl Tool {
    pub fn pgstrata(label: &str, path: &Path, bin_dir: &Path) -> Result<Tool, String> {
        let name = if label.is_empty() {
            "pgstrata".to_string()
        } else {
            format!("pgstrata-{label}")
        };
        let copy = bin_dir.join(&name);
        std::fs::copy(path, &copy)
            .map_err(|e| format!("copy pgstrata binary {}: {e}", path.display()))?;
        pgstrata_testkit::set_mode(&copy, 0o755)?;
        let version = first_line(&capture(Command::new(&copy).arg("version"))?);
        let sha = capture(Command::new("sha256sum").arg(&copy))?;
        Ok(Tool {
            kind: Kind::Pgstrata,
            label: if label.is_empty() {
                "pgstrata".into()
            } else {
                format!("pgstrata {label}")
            },
            bin: copy,
            version: format!("{version} (sha256 {})", &sha[..12.min(sha.len())]),
        })
    }

    pub fn pgbackrest(path: &Path) -> Result<Tool, String> {
        let version = first_line(&capture(Command::new(path).arg("version"))?);
        let help =
            capture(Command::new(path).args(["help", "backup", "repo-block"])).unwrap_or_default();
        Ok(Tool {
            kind: Kind::PgBackRest {
                block_beta: help.contains("BETA"),
            },
            label: version.clone(),
            bin: path.to_path_buf(),
            version,
        })
    }

    pub fn is_pgstrata(&self) -> bool {
        self.kind == Kind::Pgstrata
    }
}

fn capture(cmd: &mut Command) -> Result<String, String> {
    let out = pgstrata_testkit::run_ok(cmd)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

/// Each codec's default level, given to both tools explicitly.
pub fn default_level(codec: &str) -> Result<u32, String> {
    Ok(match codec {
        "zst" => 3,
        "lz4" => 1,
        "gz" => 6,
        "bz2" => 9,
        "none" => 0,
        _ => return Err(format!("unknown codec '{codec}' (zst, lz4, gz, bz2, none)")),
    })
}
