//! The repositories under test. A `Repo` is one tool with one configuration (codec,
//! bundling, block incremental, storage) writing into its own repository; every scenario is
//! a list of repositories put through the same steps on the same data, timed by the harness.

use crate::harness::{Bench, STANZA};
use crate::results::Measured;
use crate::tools::{default_level, Tool};
use std::path::{Path, PathBuf};
use std::process::Command;

/// How a repository is configured beyond the codec.
#[derive(Clone, Default)]
pub struct Setup {
    /// pgstrata: TOML `key = value` lines (values already quoted); pgBackRest: `key=value`.
    pub settings: Vec<String>,
    /// Extra arguments of every backup (pgstrata `--bundle=false`, `--track=hash`).
    pub backup_args: Vec<String>,
    /// Extra arguments of incremental backups only (pgstrata `--track=wal`).
    pub incr_args: Vec<String>,
    /// The repository is not a local directory (S3): `settings` say where it is.
    pub remote: bool,
    /// Workers, when not the scenario's `--process-max`.
    pub process_max: Option<u64>,
}

pub struct Repo {
    pub label: String,
    /// The OS user its commands run as (the PostgreSQL user, but for a backup host's).
    pub user: String,
    pub tool: Tool,
    /// Local repository directory (unused when remote).
    pub dir: PathBuf,
    pub config: PathBuf,
    pub setup: Setup,
}

impl Repo {
    /// Write the configuration of a repository `name` for `tool` (label = column title).
    pub fn new(
        b: &Bench,
        tool: &Tool,
        label: &str,
        name: &str,
        codec: &str,
        setup: Setup,
    ) -> Result<Repo, String> {
        let level = default_level(codec)?;
        let dir = b.scratch.join(&format!("repo-{name}"));
        let config = b.scratch.join(&format!("{name}.conf"));
        let c = b.cluster();
        let log = b.log_dir.display();
        let text = if tool.is_pgstrata() {
            let mut g = vec![
                format!("compress-type = \"{codec}\""),
                format!("compress-level = {level}"),
                format!(
                    "process-max = {}",
                    setup.process_max.unwrap_or(b.process_max)
                ),
                format!("log-path = \"{log}\""),
            ];
            if !setup.remote {
                g.push(format!("repo-path = \"{}\"", dir.display()));
            }
            g.extend(setup.settings.iter().cloned());
            format!(
                "[global]\n{}\n\n[{STANZA}]\npg-path = \"{}\"\npg-host = \"{}\"\npg-port = {}\npg-user = \"postgres\"\n",
                g.join("\n"),
                c.data.display(),
                c.socket_dir.display(),
                c.port
            )
        } else {
            let mut g = vec![
                "repo1-retention-full=99".to_string(),
                format!("compress-type={codec}"),
                format!("compress-level={level}"),
                format!("process-max={}", setup.process_max.unwrap_or(b.process_max)),
                "start-fast=y".into(),
                format!("log-path={log}"),
                format!("lock-path={}", b.scratch.join("lock").display()),
                "log-level-console=warn".into(),
                "log-level-file=off".into(),
            ];
            if !setup.remote {
                g.push(format!("repo1-path={}", dir.display()));
            }
            g.extend(setup.settings.iter().cloned());
            format!(
                "[global]\n{}\n\n[{STANZA}]\npg1-path={}\npg1-socket-path={}\npg1-port={}\npg1-user=postgres\n",
                g.join("\n"),
                c.data.display(),
                c.socket_dir.display(),
                c.port
            )
        };
        std::fs::write(&config, text).map_err(|e| format!("write {}: {e}", config.display()))?;
        pgstrata_testkit::give_to_pg_user(&config);
        if !setup.remote {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            pgstrata_testkit::give_to_pg_user(&dir);
        }
        Ok(Repo {
            label: label.to_string(),
            user: pgstrata_testkit::PG_OS_USER.to_string(),
            tool: tool.clone(),
            dir,
            config,
            setup,
        })
    }

    pub fn is_pgstrata(&self) -> bool {
        self.tool.is_pgstrata()
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.tool.bin);
        c.arg(format!("--config={}", self.config.display()))
            .arg(format!("--stanza={STANZA}"));
        c
    }

    fn slug(&self) -> String {
        self.config
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string()
    }

    /// The archive command's lines that push to each of `repos` ([`Bench::archive_to`]).
    pub fn push_commands(repos: &[&Repo]) -> Vec<String> {
        repos.iter().map(|r| r.archive_push_line()).collect()
    }

    pub fn archive_push_line(&self) -> String {
        format!(
            "'{}' --config='{}' --stanza={STANZA} archive-push \"$1\" || exit 1",
            self.tool.bin.display(),
            self.config.display()
        )
    }

    pub fn stanza_create(&self, b: &mut Bench) -> Result<(), String> {
        if !self.is_pgstrata() {
            let _ = std::fs::create_dir_all(b.scratch.join("lock"));
            pgstrata_testkit::give_to_pg_user(&b.scratch.join("lock"));
        }
        b.run_as(
            &self.user,
            &format!("stanza-create-{}", self.slug()),
            self.cmd().arg("stanza-create"),
            false,
        )
        .map(|_| ())
    }

    /// A timed backup; returns its cost and label.
    pub fn backup(
        &self,
        b: &mut Bench,
        kind: &str,
        extra: &[&str],
    ) -> Result<(Measured, String), String> {
        let mut c = self.cmd();
        c.arg(format!("--type={kind}"));
        if self.is_pgstrata() {
            c.arg("--start-fast").args(&self.setup.backup_args);
        }
        if kind == "incr" {
            c.args(&self.setup.incr_args);
        }
        c.args(extra).arg("backup");
        let m = b.run_as(
            &self.user,
            &format!("backup-{kind}-{}", self.slug()),
            &mut c,
            true,
        )?;
        let label = if self.is_pgstrata() {
            m.stdout
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .and_then(|l| l.split_whitespace().last())
                .unwrap_or("")
                .to_string()
        } else {
            self.info(b)?[0]["backup"]
                .as_array()
                .and_then(|a| a.last())
                .and_then(|x| x["label"].as_str())
                .unwrap_or("")
                .to_string()
        };
        if label.is_empty() {
            return Err(format!(
                "{}: no backup label after the {kind} backup",
                self.label
            ));
        }
        eprintln!(
            "[bench] {}: {kind} backup {label} in {:.2} s",
            self.label, m.seconds
        );
        Ok((m, label))
    }

    /// A timed restore into `dir` with extra arguments (`--set=`, `--delta`).
    pub fn restore(&self, b: &mut Bench, dir: &Path, args: &[&str]) -> Result<Measured, String> {
        let mut c = self.cmd();
        if self.is_pgstrata() {
            c.arg(format!("--pg-path={}", dir.display()));
        } else {
            c.arg(format!("--pg1-path={}", dir.display()));
        }
        c.args(args).arg("restore");
        let m = b.run_as(
            &self.user,
            &format!("restore-{}", self.slug()),
            &mut c,
            true,
        )?;
        eprintln!(
            "[bench] {}: restore {args:?} in {:.2} s",
            self.label, m.seconds
        );
        Ok(m)
    }

    pub fn info(&self, b: &mut Bench) -> Result<serde_json::Value, String> {
        let m = b.run_as(
            &self.user,
            &format!("info-{}", self.slug()),
            self.cmd().args(["--output=json", "info"]),
            false,
        )?;
        serde_json::from_str(&m.stdout)
            .map_err(|e| format!("{}: info is not JSON: {e}", self.label))
    }

    /// One backup's entry in `info --output=json`.
    pub fn backup_info(&self, b: &mut Bench, label: &str) -> Result<serde_json::Value, String> {
        let info = self.info(b)?;
        let list = if self.is_pgstrata() {
            info.get("backups")
                .or_else(|| info[0].get("backups"))
                .cloned()
        } else {
            info[0].get("backup").cloned()
        };
        list.and_then(|l| {
            l.as_array()
                .and_then(|a| a.iter().find(|x| x["label"] == label).cloned())
        })
        .ok_or_else(|| format!("{}: backup {label} not in info", self.label))
    }

    /// What the backup stored, read and its type, from the tool's own info.
    pub fn backup_sizes(&self, b: &mut Bench, label: &str) -> Result<BackupSizes, String> {
        let x = self.backup_info(b, label)?;
        Ok(if self.is_pgstrata() {
            BackupSizes {
                kind: x["type"].as_str().unwrap_or("").into(),
                stored: x["stored_size"].as_u64(),
                read: x["bytes_read"].as_u64(),
                track: format!(
                    "{}{}",
                    x["track"].as_str().unwrap_or(""),
                    x["track_reason"]
                        .as_str()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                ),
            }
        } else {
            BackupSizes {
                kind: x["type"].as_str().unwrap_or("").into(),
                stored: x["info"]["repository"]["delta"].as_u64(),
                read: x["info"]["delta"].as_u64(),
                track: String::new(),
            }
        })
    }

    /// The local backup area (archived WAL excluded).
    pub fn backup_area(&self) -> PathBuf {
        if self.is_pgstrata() {
            self.dir.join(STANZA).join("backup")
        } else {
            self.dir.join("backup").join(STANZA)
        }
    }
}

pub struct BackupSizes {
    pub kind: String,
    pub stored: Option<u64>,
    pub read: Option<u64>,
    pub track: String,
}
