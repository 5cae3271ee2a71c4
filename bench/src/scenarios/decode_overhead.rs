//! What the WAL decoder adds to archive-push, which runs it beside compression: per round,
//! lz4 encode + hash of SEGMENTS real segments (pgstrata's `wal::encode`) against decoding
//! the same segments (`pg::wal::decode_segment`). The segments are pgbench TPC-B traffic,
//! copied from pg_wal. Measured in-process on this tree's libraries (not a `--pgstrata`
//! binary), on one thread.
//!
//! Options: --segments N (20) --scale N (10) --rounds N (3)

use crate::args::Args;
use crate::harness::Bench;
use crate::results::Row;
use std::time::Instant;

pub struct Opts {
    segments: u64,
    scale: u64,
    rounds: u64,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        Ok(Opts {
            segments: a.uint("segments", 20, 1)?,
            scale: a.uint("scale", 10, 1)?,
            rounds: a.uint("rounds", 3, 1)?,
        })
    }
    pub fn params(&self) -> String {
        format!("segments={} scale={}", self.segments, self.scale)
    }
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    b.start_cluster("")?;
    b.load_pgbench(o.scale, 0, "")?;
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()?;
    let first = b.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")?;
    eprintln!(
        "[bench] generating {} segments of pgbench traffic from {first}",
        o.segments
    );
    let wal = b.cluster().data.join("pg_wal");
    let mut names: Vec<String> = Vec::new();
    for _ in 0..60 {
        let current = b.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")?;
        names = segment_names(&wal, &first, &current);
        if names.len() as u64 >= o.segments {
            break;
        }
        b.cluster().pgbench(&[
            "-n", "-c", "2", "-j", "2", "-M", "prepared", "-T", "5", "postgres",
        ])?;
    }
    names.truncate(o.segments as usize);
    let segs: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(wal.join(n)).map_err(|e| format!("read {n}: {e}")))
        .collect::<Result<_, _>>()?;
    let major = b.pg.major;
    let lz4 = pgstrata_repo::codec::Compression::new(pgstrata_repo::codec::CompressType::Lz4, None)
        .map_err(|e| e.to_string())?;
    let case = format!("{} segments", segs.len());
    let tool = "pgstrata (library, this tree)";
    for round in 1..=o.rounds {
        let t = Instant::now();
        for s in &segs {
            std::hint::black_box(pgstrata_repo::wal_object::encode(s, lz4, 1));
        }
        let encode = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut records = 0;
        for s in &segs {
            records += pgstrata_pg::wal::decode_segment(s, major, 8192)
                .map(|d| d.records)
                .unwrap_or(0);
        }
        let decode = t.elapsed().as_secs_f64();
        let row = |step: &str, s: f64| Row {
            seconds: Some(s),
            ..Row::text(&case, step, tool, "")
        };
        b.results.record(Row {
            run: round,
            ..row("lz4 encode + hash", encode)
        })?;
        b.results.record(
            Row {
                run: round,
                ..row("decode", decode)
            }
            .note(format!(
                "{records} records; {:.0} % of encode",
                decode / encode * 100.0
            )),
        )?;
    }
    Ok(())
}

/// Segment files in pg_wal from `first` to before `current`, in order.
fn segment_names(wal: &std::path::Path, first: &str, current: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(wal)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.len() == 24 && n.chars().all(|c| c.is_ascii_hexdigit()))
                .filter(|n| n.as_str() >= first && n.as_str() < current)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
