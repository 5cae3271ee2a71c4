//! Seed 000's scenario at growing database sizes (issue 12): the cost of an incremental
//! should follow the change, not the database. Per scale (`--scales`), `wal_tracking`'s
//! steps without its copies and variants: a fresh cluster with pgbench -i -s SCALE, VACUUM
//! ANALYZE, CHECKPOINT; a full backup with pgstrata (its defaults: `--track=auto`) and with
//! pgBackRest (bundling and block incremental); then the same change at every size, an
//! UPDATE of ROWS_CHANGED accounts spread evenly over pgbench_accounts (one row per page,
//! every segment file touched), VACUUM, CHECKPOINT, and an incremental with each tool.
//! Reported per size: incremental time, what it read and stored (each tool's info), its
//! manifest's bytes with the copy (`backup.manifest` + `backup.manifest.copy`; the note has
//! the manifest alone), and the peak RSS of all the tool's processes, sampled from /proc.
//!
//! Options: --scales LIST (80,600: about 1.3 GB and 10 GB) --rows-changed N (300)
//!          --codec C (zst)

use super::wal_tracking::{at_size, Size};
use super::{remove_repos, PgbrMode};
use crate::args::Args;
use crate::harness::Bench;
use crate::repos::Setup;

pub struct Opts {
    scales: Vec<u64>,
    rows_changed: u64,
    codec: String,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let o = Opts {
            scales: a.uint_list("scales", "80,600")?,
            rows_changed: a.uint("rows-changed", 300, 1)?,
            codec: a.string("codec", "zst"),
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }
    pub fn params(&self) -> String {
        let scales: Vec<String> = self.scales.iter().map(u64::to_string).collect();
        format!(
            "scales={} rows-changed={} codec={}",
            scales.join(","),
            self.rows_changed,
            self.codec
        )
    }
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    for (si, &scale) in o.scales.iter().enumerate() {
        let size = Size {
            scale,
            copies: 0,
            rows_changed: o.rows_changed,
            codec: &o.codec,
            variants: &[("", Setup::default())],
            pgbr: &[PgbrMode::Block],
            all_processes: true,
        };
        let repos = at_size(b, si, &size)?;
        remove_repos(b, &repos);
    }
    Ok(())
}
