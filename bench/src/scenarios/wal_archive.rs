//! WAL archiving one process per segment, as PostgreSQL runs archive_command and
//! restore_command (issue 14): SEGMENTS real segments (pgbench traffic and bulk updates),
//! then per round and tool a fresh repository, archive-push of every segment one process at
//! a time, and archive-get of every segment back, one process at a time, into an empty
//! directory (compared with the source bytes). Best of ROUNDS; the tool order rotates.
//!
//! Options: --segments N (64) --rounds N (3) --codec C (zst) --scale N (10)

use super::{repos, rotated, PgbrMode};
use crate::args::Args;
use crate::harness::Bench;
use crate::repos::{Repo, Setup};
use crate::results::Row;

pub struct Opts {
    segments: u64,
    rounds: u64,
    codec: String,
    scale: u64,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let o = Opts {
            segments: a.uint("segments", 64, 1)?,
            rounds: a.uint("rounds", 3, 1)?,
            codec: a.string("codec", "zst"),
            scale: a.uint("scale", 10, 1)?,
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "segments={} rounds={} codec={} scale={}",
            self.segments, self.rounds, self.codec, self.scale
        )
    }
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    b.start_cluster("max_wal_size = '4GB'\nsynchronous_commit = off")?;
    b.load_pgbench(o.scale, 0, "")?;
    let src_tool = b.pgstrata.first().cloned().ok_or("no pgstrata binary")?;
    let src = Repo::new(
        b,
        &src_tool,
        "source",
        "wal-src",
        &o.codec,
        Setup::default(),
    )?;
    src.stanza_create(b)?;
    b.archive_to(&[src.archive_push_line()])?;
    eprintln!("[bench] generating {} segments", o.segments);
    let first = super::generate_pgbench_segments(b, o.segments)?;
    b.archive_nowhere();
    let seg_dir = b.dir("segments")?;
    let names = super::fetch_segments(b, &src, first, o.segments, &seg_dir)?;
    let _ = std::fs::remove_dir_all(&src.dir);

    let case = format!("{} segments, one process each", o.segments);
    for round in 1..=o.rounds {
        let all = repos(
            b,
            &format!("wal-{round}"),
            &o.codec,
            &[("", Setup::default())],
            &[PgbrMode::Plain],
            &[],
        )?;
        if round == 1 {
            let labels: Vec<&str> = all.iter().map(|r| r.label.as_str()).collect();
            b.results.declare(&labels);
        }
        for repo in rotated(&all, round as usize) {
            repo.stanza_create(b)?;
            let push = super::per_segment_loop(b, repo, &seg_dir, &names, "archive-push", "")?;
            b.results.record(
                Row::timed(&case, "archive-push", &repo.label, round, &push)
                    .note(per_call(&push, o.segments)),
            )?;
            let out = b.dir(&format!("get-{round}"))?;
            let get = super::per_segment_loop(b, repo, &out, &names, "archive-get", "")?;
            for n in &names {
                if std::fs::read(out.join(n)).ok() != std::fs::read(seg_dir.join(n)).ok() {
                    return Err(format!("{}: archive-get of {n} differs", repo.label));
                }
            }
            b.results.record(
                Row::timed(&case, "archive-get", &repo.label, round, &get)
                    .note(per_call(&get, o.segments)),
            )?;
            let _ = std::fs::remove_dir_all(&out);
            let _ = std::fs::remove_dir_all(&repo.dir);
        }
    }
    Ok(())
}

fn per_call(m: &crate::results::Measured, segments: u64) -> String {
    format!(
        "{:.1} segments/s, {:.0} ms a call; CPU {:.2} s",
        segments as f64 / m.seconds,
        1000.0 * m.seconds / segments as f64,
        m.user + m.sys
    )
}
