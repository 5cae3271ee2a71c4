//! Full backup and full restore (seed 000's data set): `pgbench -i -s SCALE` plus COPIES
//! copies of pgbench_accounts, read once (hint bits settled) and checkpointed; then per codec
//! and run, fresh repositories for every tool, a full backup with each (order rotates), the
//! size of each backup area (archived WAL excluded) and a restore of each into an empty
//! directory. `--verify` starts what the first pgstrata restored and compares its tables.
//!
//! Options: --scale N (20) --copies N (2) --codecs LIST (zst,lz4,gz)
//!          --pgbr-bundle n|y|both (n: pgBackRest 2.45's default; 2.59.1 always runs with
//!          bundling and block incremental)
//!          --cipher n|y|both (n): repositories encrypted with pgstrata's aes-256-gcm and
//!          pgBackRest's aes-256-cbc (columns titled "aes"); `both` runs plain and encrypted
//!          side by side, which is how the cost of encryption is read.

use super::{record_database_size, remove_repos, repos, rotated, stanza_create_all, PgbrMode};
use crate::args::Args;
use crate::harness::Bench;
use crate::repos::{Repo, Setup};
use crate::results::Row;

pub struct Opts {
    scale: u64,
    copies: u64,
    codecs: Vec<String>,
    pgbr: Vec<PgbrMode>,
    /// Plain and/or encrypted repositories.
    ciphers: Vec<bool>,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        Ok(Opts {
            scale: a.uint("scale", 20, 1)?,
            copies: a.uint("copies", 2, 0)?,
            codecs: a.list("codecs", "zst,lz4,gz", &["zst", "lz4", "gz", "bz2", "none"])?,
            pgbr: PgbrMode::parse_bundle(&a.string("pgbr-bundle", "n"))?,
            ciphers: match a.string("cipher", "n").as_str() {
                "n" => vec![false],
                "y" => vec![true],
                "both" => vec![false, true],
                other => return Err(format!("--cipher takes n, y or both, not {other:?}")),
            },
        })
    }
    pub fn params(&self) -> String {
        let cipher = match self.ciphers.as_slice() {
            [false] => "",
            [true] => " cipher=aes",
            _ => " cipher=both",
        };
        format!(
            "scale={} copies={} codecs={}{cipher}",
            self.scale,
            self.copies,
            self.codecs.join(",")
        )
    }
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    b.start_cluster("")?;
    b.load_pgbench(o.scale, o.copies, "acc_")?;
    let check = b.source_check()?; // reads every table: hint bits settle now
    b.sql("CHECKPOINT")?;
    record_database_size(b)?;
    for (ci, codec) in o.codecs.iter().enumerate() {
        for run in 1..=b.runs {
            let case = format!("{codec}-r{run}");
            let repos = cipher_repos(b, &case, codec, o)?;
            stanza_create_all(b, &repos)?;
            b.wal_switch_and_wait()?;
            let order = rotated(&repos, ci + run as usize);
            let mut labels = std::collections::HashMap::new();
            for r in &order {
                let (m, label) = r.backup(b, "full", &[])?;
                b.results
                    .record(Row::timed(codec, "full backup", &r.label, run, &m))?;
                labels.insert(r.label.clone(), label);
            }
            for r in &order {
                let size = b.du(&r.backup_area());
                b.results
                    .record(Row::bytes(codec, "backup size", &r.label, run, Some(size)))?;
            }
            for r in &order {
                let dir = b.empty_data_dir("restore")?;
                let m = r.restore(b, &dir, &[&format!("--set={}", labels[&r.label])])?;
                b.results
                    .record(Row::timed(codec, "restore", &r.label, run, &m))?;
                if b.verify && run == 1 && r.label == b.pgstrata[0].label {
                    b.verify_restore(&dir, &check, &case)?;
                }
                let _ = std::fs::remove_dir_all(&dir);
            }
            remove_repos(b, &repos);
        }
    }
    Ok(())
}

/// The run's repositories: for each of `--cipher`'s choices, one per tool, the encrypted
/// ones titled "… aes".
fn cipher_repos(b: &Bench, case: &str, codec: &str, o: &Opts) -> Result<Vec<Repo>, String> {
    let mut out = Vec::new();
    for &encrypted in &o.ciphers {
        if !encrypted {
            out.extend(repos(
                b,
                case,
                codec,
                &[("", Setup::default())],
                &o.pgbr,
                &[],
            )?);
            continue;
        }
        let pgstrata = Setup {
            settings: vec![
                "repo-cipher-type = \"aes-256-gcm\"".to_string(),
                format!("repo-cipher-pass = \"{}\"", super::BENCH_CIPHER_PASS),
            ],
            ..Setup::default()
        };
        let pgbr = [
            "repo1-cipher-type=aes-256-cbc".to_string(),
            format!("repo1-cipher-pass={}", super::BENCH_CIPHER_PASS),
        ];
        let mut encrypted = repos(
            b,
            &format!("{case}-aes"),
            codec,
            &[("aes", pgstrata)],
            &o.pgbr,
            &pgbr,
        )?;
        for r in encrypted.iter_mut().filter(|r| !r.tool.is_pgstrata()) {
            r.label = format!("{} aes", r.label);
        }
        out.extend(encrypted);
    }
    Ok(out)
}
