//! Full backup and full restore (seed 000's data set): `pgbench -i -s SCALE` plus COPIES
//! copies of pgbench_accounts, read once (hint bits settled) and checkpointed; then per codec
//! and run, fresh repositories for every tool, a full backup with each (order rotates), the
//! size of each backup area (archived WAL excluded) and a restore of each into an empty
//! directory. `--verify` starts what the first pgstrata restored and compares its tables.
//!
//! Options: --scale N (20) --copies N (2) --codecs LIST (zst,lz4,gz)
//!          --pgbr-bundle n|y|both (n: pgBackRest 2.45's default; 2.59.1 always runs with
//!          bundling and block incremental)

use super::{record_database_size, remove_repos, repos, rotated, stanza_create_all, PgbrMode};
use crate::args::Args;
use crate::harness::Bench;
use crate::results::Row;
use crate::tools::Setup;

pub struct Opts {
    scale: u64,
    copies: u64,
    codecs: Vec<String>,
    pgbr: Vec<PgbrMode>,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        Ok(Opts {
            scale: a.uint("scale", 20, 1)?,
            copies: a.uint("copies", 2, 0)?,
            codecs: a.list("codecs", "zst,lz4,gz", &["zst", "lz4", "gz", "bz2", "none"])?,
            pgbr: PgbrMode::parse_bundle(&a.string("pgbr-bundle", "n"))?,
        })
    }
    pub fn params(&self) -> String {
        format!(
            "scale={} copies={} codecs={}",
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
            let repos = repos(b, &case, codec, &[("", Setup::default())], &o.pgbr, &[])?;
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
