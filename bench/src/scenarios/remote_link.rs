//! A backup host and a database host joined by a 100 Mbit/s line (seed 004's scenario,
//! scaled down to one machine): the database host is the `postgres` OS user, the backup
//! host the `pgstrata-backup` user, and every byte between them crosses a throttling relay
//! on loopback (`bench/src/link.rs`, LINK_MBIT in each direction, shared by every
//! connection on it), in front of the test kit's sshd or of the cluster's unix socket.
//!
//! Measured, per run (the tools' order rotates):
//!
//! - the line itself, first: LINK_TEST_MB of random data through the relay (raw TCP), and
//!   the same through SSH (`ssh db cat FILE` from the backup host): the physical limit;
//! - a full backup taken from the backup host into its local repository: pgstrata with
//!   `pg-remote` (its agent reads, hashes and compresses on the database host with
//!   process-max workers), `pg_basebackup -Ft -X stream --checkpoint=fast` with
//!   `--compress=server-lz4` and `server-zstd` (compressed by the server's walsender, one
//!   core) over TCP through the relay into the cluster's socket, and pgBackRest with
//!   `pg1-host` over the same SSH (repo1-bundle, repo1-block, compress-type CODEC);
//! - a CHANGE_PCT % change (a contiguous DELETE in every large table, VACUUM, CHECKPOINT,
//!   its WAL archived), then an incremental with pgstrata (WAL-tracked) and pgBackRest;
//! - a restore of that incremental on the database host into an empty directory, reaching
//!   the backup host's repository over the line: pgstrata `repo-remote`, pgBackRest
//!   `repo1-host`.
//!
//! Per step: the time, the bytes the line carried for the command (both directions, its
//! own relay: WAL archiving has a relay of its own on the same line, noted beside), what the
//! backup stored, and the peak resident memory of all the tool's processes on both hosts
//! summed (the /proc sampler of `bench/src/procs.rs`; for pg_basebackup its client and the
//! walsender backends; shared memory left out), which is what the RSS table shows. The
//! `targets` rows compare with the targets: a full backup at least 1.5x faster
//! than pg_basebackup server-lz4, an incremental moving at most 1.2x the bytes it stores,
//! a restore within 1.2x of the time the line's raw rate needs for the bytes it moved
//! (times from the best run; the incremental's bytes from every run, as they depend on the
//! change and not on the machine's load).
//!
//! WAL archiving (`archive_command` on the database host) pushes to both tools'
//! repositories over SSH through its own relay on the same line; every timed step starts
//! after a WAL switch is archived.
//!
//! Each timed step also reports, per host, the CPU time and peak RSS of the tool's processes
//! there (the processes each host's OS user runs): a row `STEP: CPU on the backup host`
//! and a note with the database host's share. With `--encrypt y` every tool's repository is
//! encrypted (pgstrata aes-256-gcm, the passphrase on both hosts' configurations as
//! archive-push and restore through `repo-remote` need it; pgBackRest aes-256-cbc):
//! pgstrata's agent then seals with a session key and the backup host opens and seals
//! again what the agent reads (issue 41), which is what the backup host's CPU row
//! measures.
//!
//! Options: --scale N (30) --copies N (0) --change-pct P (1) --link-mbit M (100)
//!          --link-test-mb MB (64) --codec C (zst) --basebackup LIST (lz4,zstd; none)
//!          --encrypt n|y (n)

use super::{pgbr_setup, rotated, PgbrMode};
use crate::args::Args;
use crate::harness::{Bench, STANZA};
use crate::procs::{sampled, Matcher, Sampled};
use crate::repos::{Repo, Setup};
use crate::results::Measured;
use crate::results::Row;
use crate::tools::Tool;
use pgstrata_testkit::proxy::{Host, Line, Moved, Target};
use pgstrata_testkit::{chown_to, Proxy, SshServer, BACKUP_OS_USER, PG_OS_USER};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Opts {
    scale: u64,
    copies: u64,
    change_pct: u64,
    link_mbit: u64,
    link_test_mb: u64,
    codec: String,
    basebackup: Vec<String>,
    /// Every tool's repository encrypted.
    encrypt: bool,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let bb = a.list("basebackup", "lz4,zstd", &["lz4", "zstd", "gzip", "none"])?;
        let o = Opts {
            scale: a.uint("scale", 30, 1)?,
            copies: a.uint("copies", 0, 0)?,
            change_pct: a.uint("change-pct", 1, 1)?,
            link_mbit: a.uint("link-mbit", 100, 1)?,
            link_test_mb: a.uint("link-test-mb", 64, 1)?,
            codec: a.string("codec", "zst"),
            basebackup: bb.into_iter().filter(|m| m != "none").collect(),
            encrypt: match a.string("encrypt", "n").as_str() {
                "n" => false,
                "y" => true,
                other => return Err(format!("--encrypt takes n or y, not {other:?}")),
            },
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "scale={} copies={} change-pct={} link-mbit={} codec={} basebackup={}{}",
            self.scale,
            self.copies,
            self.change_pct,
            self.link_mbit,
            self.codec,
            if self.basebackup.is_empty() {
                "none".to_string()
            } else {
                self.basebackup.join(",")
            },
            if self.encrypt { " encrypt=y" } else { "" }
        )
    }
}

/// What a column runs.
enum Kind {
    /// A tool with a repository on the backup host: `bh` runs there (backup-host user),
    /// `db` on the database host (archive-push, restore).
    Tool { bh: Box<Repo>, db: Box<Repo> },
    /// pg_basebackup with this server-side compression method.
    Basebackup(String),
}

struct Column {
    label: String,
    kind: Kind,
    /// Its processes, on both hosts.
    procs: Matcher,
}

/// The two hosts and the line between them.
struct Hosts {
    link: Line,
    _ssh: SshServer,
    /// The backup host's SSH sessions to the database host (backups, pg-remote, pg1-host).
    ssh_backup: Proxy,
    /// The database host's SSH sessions for restores (repo-remote, repo1-host).
    ssh_db: Proxy,
    /// The database host's SSH sessions for WAL archiving.
    ssh_archive: Proxy,
    /// TCP to the cluster's unix socket (pg_basebackup).
    pg: Proxy,
    /// ssh wrappers (`cmd-ssh`) through those relays.
    wrap_backup: PathBuf,
    wrap_db: PathBuf,
    wrap_archive: PathBuf,
}

/// The best run of a step of a column (for the targets).
#[derive(Clone, Copy, Default)]
struct Best {
    seconds: f64,
    moved: u64,
    stored: u64,
    /// Everything the backup wrote into the repository (data, manifests).
    written: u64,
}

/// The best run of each column's steps, and every run's incremental: the targets' inputs.
#[derive(Default)]
struct Tally {
    best: HashMap<(String, &'static str), Best>,
    /// Every run's incremental: what it moves and stores depends on the change, not on the
    /// machine's load, so the target is judged on all of them.
    incr_runs: HashMap<String, Vec<Best>>,
}

impl Tally {
    fn keep(&mut self, label: &str, step: &'static str, x: Best) {
        let e = self.best.entry((label.to_string(), step)).or_insert(x);
        if x.seconds < e.seconds {
            *e = x;
        }
    }

    fn best(&self, label: &str, step: &'static str) -> Option<Best> {
        self.best.get(&(label.to_string(), step)).copied()
    }
}

/// What every timed step records against: the line and its rate.
struct Stage<'a> {
    hosts: &'a Hosts,
    case: String,
    /// The line's raw rate, bytes per second.
    raw_rate: f64,
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    b.start_cluster("max_wal_senders = 4\n")?;
    let tables = b.load_pgbench(o.scale, o.copies, "acc_")?;
    b.source_check()?; // reads every table: hint bits settle now
    b.sql("CHECKPOINT")?;
    super::record_database_size(b)?;

    let hosts = two_hosts(b, o)?;
    let raw_rate = measure_link(b, o, &hosts)?;
    let cols = columns(b, o, &hosts)?;
    let labels: Vec<&str> = cols.iter().map(|c| c.label.as_str()).collect();
    b.results.declare(&labels);
    let db_repos: Vec<&Repo> = cols
        .iter()
        .filter_map(|c| match &c.kind {
            Kind::Tool { db, .. } => Some(&**db),
            Kind::Basebackup(_) => None,
        })
        .collect();
    for c in &cols {
        if let Kind::Tool { bh, .. } = &c.kind {
            bh.stanza_create(b)?;
        }
    }
    b.archive_to(&Repo::push_commands(&db_repos))?;

    let stage = Stage {
        hosts: &hosts,
        case: format!("{} Mbit/s link", o.link_mbit),
        raw_rate,
    };
    let mut tally = Tally::default();
    let pgbb_dir = backup_host_dir(b, "pgbb")?;
    let tools: Vec<&Column> = cols
        .iter()
        .filter(|c| matches!(c.kind, Kind::Tool { .. }))
        .collect();
    for run in 1..=b.runs {
        for c in rotated(&cols, run as usize) {
            full_backup(b, &stage, c, run, &pgbb_dir, &mut tally)?;
        }
        // The change, its WAL archived (block-change maps included), an incremental.
        change(b, &tables, o, run)?;
        b.wal_switch_and_wait()?;
        for c in rotated(&tools, run as usize) {
            incr_backup(b, &stage, c, run, &mut tally)?;
        }
        // Restores of the incremental on the database host, over the line; the first
        // column's first restore is checked against the source.
        let check = if b.verify && run == 1 {
            Some(b.source_check()?)
        } else {
            None
        };
        for c in rotated(&tools, run as usize) {
            let check = check.as_deref().filter(|_| c.label == cols[0].label);
            restore(b, &stage, c, run, check, &mut tally)?;
        }
    }
    b.archive_nowhere();

    let first = cols[0].label.clone();
    for (what, result) in targets(&cols, &tally, raw_rate) {
        eprintln!("[bench] target: {what}: {result}");
        b.results
            .record(Row::text("targets", &what, &first, &result))?;
    }
    Ok(())
}

/// A full backup of column `c` from the backup host (pg_basebackup's output removed again).
fn full_backup(
    b: &mut Bench,
    st: &Stage,
    c: &Column,
    run: u64,
    pgbb_dir: &Path,
    tally: &mut Tally,
) -> Result<(), String> {
    b.wal_switch_and_wait()?;
    let relay = if matches!(c.kind, Kind::Basebackup(_)) {
        &st.hosts.pg
    } else {
        &st.hosts.ssh_backup
    };
    let (before, arch) = (relay.moved(), st.hosts.ssh_archive.moved());
    let (m, seen, stored) = match &c.kind {
        Kind::Tool { bh, .. } => {
            let (r, seen) = sampled(&groups(&c.procs), || bh.backup(b, "full", &[]))?;
            (r.0.clone(), seen, b.du(&bh.backup_area().join(&r.1)))
        }
        Kind::Basebackup(method) => {
            let out = pgbb_dir.join(format!("{method}-r{run}"));
            let (m, seen) = sampled(&groups(&c.procs), || basebackup(b, st.hosts, method, &out))?;
            let stored = b.du(&out);
            let _ = std::fs::remove_dir_all(&out);
            (m, seen, stored)
        }
    };
    let moved = relay.moved().since(before);
    let arch = st.hosts.ssh_archive.moved().since(arch);
    let case = &st.case;
    record(b, case, "full backup", &c.label, run, m.clone(), &seen)?;
    b.results.record(
        Row::bytes(
            case,
            "full backup: over the link",
            &c.label,
            run,
            Some(moved.total()),
        )
        .note(moved_note(&moved, &arch, m.seconds, st.raw_rate)),
    )?;
    b.results.record(Row::bytes(
        case,
        "full backup: stored",
        &c.label,
        run,
        Some(stored),
    ))?;
    tally.keep(
        &c.label,
        "full",
        Best {
            seconds: m.seconds,
            moved: moved.total(),
            stored,
            written: stored,
        },
    );
    Ok(())
}

/// An incremental backup of tool column `c` after the change.
fn incr_backup(
    b: &mut Bench,
    st: &Stage,
    c: &Column,
    run: u64,
    tally: &mut Tally,
) -> Result<(), String> {
    let Kind::Tool { bh, .. } = &c.kind else {
        return Ok(());
    };
    b.wal_switch_and_wait()?;
    let (before, arch) = (st.hosts.ssh_backup.moved(), st.hosts.ssh_archive.moved());
    let ((m, label), seen) = sampled(&groups(&c.procs), || bh.backup(b, "incr", &[]))?;
    let moved = st.hosts.ssh_backup.moved().since(before);
    let arch = st.hosts.ssh_archive.moved().since(arch);
    let sizes = bh.backup_sizes(b, &label)?;
    if sizes.kind != "incr" {
        return Err(format!("{}: {label} is a {} backup", c.label, sizes.kind));
    }
    let stored = sizes.stored.unwrap_or(0);
    let written = b.du(&bh.backup_area().join(&label));
    let case = &st.case;
    record(b, case, "incr backup", &c.label, run, m.clone(), &seen)?;
    b.results.record(
        Row::bytes(
            case,
            "incr backup: over the link",
            &c.label,
            run,
            Some(moved.total()),
        )
        .note(moved_note(&moved, &arch, m.seconds, st.raw_rate)),
    )?;
    let track = if sizes.track.is_empty() {
        String::new()
    } else {
        format!("; track {}", sizes.track)
    };
    b.results.record(
        Row::bytes(case, "incr backup: stored", &c.label, run, Some(stored)).note(format!(
            "read {:.2} MB{track}",
            sizes.read.unwrap_or(0) as f64 / 1048576.0
        )),
    )?;
    tally
        .incr_runs
        .entry(c.label.clone())
        .or_default()
        .push(Best {
            seconds: m.seconds,
            moved: moved.total(),
            stored,
            written,
        });
    b.results.record(
        Row::bytes(
            case,
            "incr backup: written to the repository",
            &c.label,
            run,
            Some(written),
        )
        .note("the backup's directory: its data and its manifests"),
    )
}

/// A restore of the incremental of tool column `c` on the database host, compared with the
/// source when `check` is given.
fn restore(
    b: &mut Bench,
    st: &Stage,
    c: &Column,
    run: u64,
    check: Option<&str>,
    tally: &mut Tally,
) -> Result<(), String> {
    let Kind::Tool { db, .. } = &c.kind else {
        return Ok(());
    };
    let dir = b.empty_data_dir("restore")?;
    let ssh = format!("--cmd-ssh={}", st.hosts.wrap_db.display());
    let before = st.hosts.ssh_db.moved();
    let (m, seen) = sampled(&groups(&c.procs), || db.restore(b, &dir, &[&ssh]))?;
    let moved = st.hosts.ssh_db.moved().since(before);
    let restored = b.du(&dir);
    let case = &st.case;
    record(
        b,
        case,
        "restore of the incr",
        &c.label,
        run,
        m.clone(),
        &seen,
    )?;
    b.results.record(
        Row::bytes(
            case,
            "restore: over the link",
            &c.label,
            run,
            Some(moved.total()),
        )
        .note(format!(
            "{}; restored {:.1} MB",
            moved_note(&moved, &Moved::default(), m.seconds, st.raw_rate),
            restored as f64 / 1048576.0
        )),
    )?;
    tally.keep(
        &c.label,
        "restore",
        Best {
            seconds: m.seconds,
            moved: moved.total(),
            stored: restored,
            written: 0,
        },
    );
    if let Some(check) = check {
        b.verify_restore(&dir, check, "remote-link")?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The targets, from the best runs: `(what, result)`; "met" or "not met" is said
/// for the first column.
fn targets(cols: &[Column], tally: &Tally, raw_rate: f64) -> Vec<(String, String)> {
    let first = &cols[0].label;
    let verdict = |c: &Column, met: bool| match (&c.label == first, met) {
        (false, _) => "",
        (true, true) => ": met",
        (true, false) => ": not met",
    };
    let mut targets = Vec::new();
    if let (Some(p), Some(l)) = (
        tally.best(first, "full"),
        cols.iter()
            .find(|c| matches!(&c.kind, Kind::Basebackup(m) if m == "lz4"))
            .and_then(|c| tally.best(&c.label, "full")),
    ) {
        let x = l.seconds / p.seconds;
        targets.push((
            "full backup: faster than pg_basebackup server-lz4 (target >= 1.5x)".to_string(),
            format!(
                "{x:.2}x ({:.2} s vs {:.2} s): {}",
                p.seconds,
                l.seconds,
                if x >= 1.5 { "met" } else { "not met" }
            ),
        ));
    }
    for c in cols.iter().filter(|c| matches!(c.kind, Kind::Tool { .. })) {
        if let Some(runs) = tally.incr_runs.get(&c.label) {
            let list =
                |f: &dyn Fn(&Best) -> String| runs.iter().map(f).collect::<Vec<_>>().join(", ");
            let worst = runs
                .iter()
                .map(|i| i.moved as f64 / i.stored.max(1) as f64)
                .fold(0.0, f64::max);
            targets.push((
                format!("{}: incr moved / stored (target <= 1.2x)", c.label),
                format!(
                    "{} (run by run; over the link {} MB, stored {} MB); moved / everything written to the repository, manifests included: {}{}",
                    list(&|i| format!("{:.2}x", i.moved as f64 / i.stored.max(1) as f64)),
                    list(&|i| format!("{:.3}", i.moved as f64 / 1048576.0)),
                    list(&|i| format!("{:.3}", i.stored as f64 / 1048576.0)),
                    list(&|i| format!("{:.2}x", i.moved as f64 / i.written.max(1) as f64)),
                    verdict(c, worst <= 1.2)
                ),
            ));
        }
        if let Some(r) = tally.best(&c.label, "restore") {
            let bound = r.moved as f64 / raw_rate;
            let x = r.seconds / bound;
            targets.push((
                format!("{}: restore time / link time of its bytes (target <= 1.2x)", c.label),
                format!(
                    "{x:.2}x ({:.2} s; {:.1} MB over the link need {bound:.2} s at {:.2} MB/s; {:.2} MB/s of data restored){}",
                    r.seconds,
                    r.moved as f64 / 1048576.0,
                    raw_rate / 1048576.0,
                    r.stored as f64 / 1048576.0 / r.seconds,
                    verdict(c, x <= 1.2)
                ),
            ));
        }
    }
    targets
}

/// The per-step sample groups: the column's processes, and the SSH clients (to count
/// the sessions).
fn groups(procs: &Matcher) -> Vec<Matcher> {
    vec![
        procs.clone(),
        Matcher::Exe(vec![PathBuf::from("/usr/bin/ssh")]),
    ]
}

/// A timed row whose peak RSS is that of all the column's processes (both hosts), and a
/// row of the CPU time its processes used on the backup host (the backup host's user),
/// the database host's beside it in the note.
fn record(
    b: &mut Bench,
    case: &str,
    step: &str,
    label: &str,
    run: u64,
    mut m: Measured,
    seen: &[Sampled],
) -> Result<(), String> {
    let largest = m.max_rss_kb;
    m.max_rss_kb = seen[0].peak_rss_kb;
    let (bh, db) = (seen[0].of_user(BACKUP_OS_USER), seen[0].of_user(PG_OS_USER));
    let mb = |kb: u64| kb as f64 / 1024.0;
    b.results.record(Row::timed(case, step, label, run, &m).note(format!(
        "all processes on both hosts: peak RSS {:.0} MB, up to {} at once, CPU {:.2} s; ssh clients up to {}; wait4 (largest process on this side) {:.0} MB",
        mb(seen[0].peak_rss_kb),
        seen[0].peak_procs,
        seen[0].cpu_seconds,
        seen[1].peak_procs,
        mb(largest)
    )))?;
    b.results.record(Row {
        case: case.into(),
        step: format!("{step}: CPU on the backup host"),
        tool: label.into(),
        run,
        seconds: Some(bh.cpu_seconds),
        max_rss_mb: Some(mb(bh.peak_rss_kb)),
        note: format!(
            "CPU seconds of the tool's processes run by {BACKUP_OS_USER} (peak RSS {:.0} MB); on the database host ({PG_OS_USER}): CPU {:.2} s, peak RSS {:.0} MB",
            mb(bh.peak_rss_kb),
            db.cpu_seconds,
            mb(db.peak_rss_kb)
        ),
        ..Row::default()
    })
}

fn moved_note(m: &Moved, arch: &Moved, seconds: f64, raw_rate: f64) -> String {
    let mb = |x: u64| x as f64 / 1048576.0;
    let mut s = format!(
        "{:.2} MB from the command's side, {:.2} MB back, {} connection(s); {:.1} % of the line's raw rate over {:.2} s",
        mb(m.to_target),
        mb(m.from_target),
        m.connections,
        100.0 * m.total() as f64 / seconds.max(1e-9) / raw_rate,
        seconds
    );
    if arch.total() > 0 {
        s += &format!(
            "; WAL archiving meanwhile {:.2} MB, {} connection(s)",
            mb(arch.total()),
            arch.connections
        );
    }
    s
}

/// sshd, the line and its relays, and the ssh wrappers through them.
fn two_hosts(b: &Bench, o: &Opts) -> Result<Hosts, String> {
    let ssh = SshServer::start(&b.scratch.join("sshd"))?;
    let link = Line::new(o.link_mbit);
    let ssh_backup = link.relay(Host::Backup, Target::Tcp(ssh.port))?;
    let ssh_db = link.relay(Host::Db, Target::Tcp(ssh.port))?;
    let ssh_archive = link.relay(Host::Db, Target::Tcp(ssh.port))?;
    let c = b.cluster();
    let pg = link.relay(
        Host::Backup,
        Target::Unix(c.socket_dir.join(format!(".s.PGSQL.{}", c.port))),
    )?;
    eprintln!(
        "[bench] {} Mbit/s line: sshd {}; relays: backup host ssh {}, database host ssh {} (restore) and {} (archiving), PostgreSQL {}",
        o.link_mbit, ssh.port, ssh_backup.port, ssh_db.port, ssh_archive.port, pg.port
    );
    Ok(Hosts {
        wrap_backup: ssh.client_via(BACKUP_OS_USER, ssh_backup.port)?,
        wrap_db: ssh.client_via(PG_OS_USER, ssh_db.port)?,
        wrap_archive: ssh.client_via(PG_OS_USER, ssh_archive.port)?,
        link,
        _ssh: ssh,
        ssh_backup,
        ssh_db,
        ssh_archive,
        pg,
    })
}

/// The physical limit: the line's rate, raw and through SSH. Returns bytes per second
/// (raw).
fn measure_link(b: &mut Bench, o: &Opts, h: &Hosts) -> Result<f64, String> {
    let bytes = (o.link_test_mb * 1048576) as usize;
    let seconds = h.link.measure_raw(bytes)?;
    let rate = bytes as f64 / seconds;
    b.results.record(Row {
        case: "link".into(),
        step: format!(
            "line, raw TCP through the relay: {} MB of random data in",
            o.link_test_mb
        ),
        tool: "source".into(),
        run: 1,
        seconds: Some(seconds),
        note: format!(
            "{:.2} MB/s = {:.1} Mbit/s; configured {} Mbit/s",
            rate / 1048576.0,
            rate * 8.0 / 1e6,
            o.link_mbit
        ),
        ..Row::default()
    })?;
    // Through SSH, from the database host to the backup host as backups flow.
    let file = b.scratch.join("link-test.bin");
    let mut data = vec![0u8; bytes];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut data))
        .map_err(|e| e.to_string())?;
    std::fs::write(&file, &data).map_err(|e| e.to_string())?;
    pgstrata_testkit::set_mode(&file, 0o644)?;
    let before = h.ssh_backup.moved();
    let m = b.run_as(
        BACKUP_OS_USER,
        "link-ssh",
        Command::new("sh").arg("-c").arg(format!(
            "'{}' {PG_OS_USER}@db-host cat '{}' | wc -c",
            h.wrap_backup.display(),
            file.display()
        )),
        true,
    )?;
    let moved = h.ssh_backup.moved().since(before);
    if m.stdout.trim() != bytes.to_string() {
        return Err(format!(
            "link test through SSH: {} of {bytes} bytes arrived",
            m.stdout.trim()
        ));
    }
    let _ = std::fs::remove_file(&file);
    b.results.record(Row {
        case: "link".into(),
        step: format!("line, through SSH (ssh db cat FILE): {} MB in", o.link_test_mb),
        tool: "source".into(),
        run: 1,
        seconds: Some(m.seconds),
        note: format!(
            "{:.2} MB/s of data = {:.0} % of raw; {:.2} MB on the line with SSH's framing and session setup",
            bytes as f64 / m.seconds / 1048576.0,
            100.0 * bytes as f64 / m.seconds / rate,
            moved.total() as f64 / 1048576.0
        ),
        ..Row::default()
    })?;
    eprintln!(
        "[bench] line: raw {:.2} MB/s, through SSH {:.2} MB/s",
        rate / 1048576.0,
        bytes as f64 / m.seconds / 1048576.0
    );
    Ok(rate)
}

/// A directory under the scratch directory owned by the backup host's user (mode 0700).
fn backup_host_dir(b: &Bench, name: &str) -> Result<PathBuf, String> {
    let d = b.scratch.join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
    chown_to(&d, BACKUP_OS_USER)?;
    pgstrata_testkit::set_mode(&d, 0o700)?;
    Ok(d)
}

fn write_config(path: &Path, text: &str, user: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
    chown_to(path, user)?;
    Ok(pgstrata_testkit::set_mode(path, 0o600)?)
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Every column: each pgstrata, each pg_basebackup method, each pgBackRest.
fn columns(b: &mut Bench, o: &Opts, h: &Hosts) -> Result<Vec<Column>, String> {
    let mut cols = Vec::new();
    let pgstrata = b.pgstrata.clone();
    for (i, t) in pgstrata.iter().enumerate() {
        let (bh, db) = pgstrata_repos(b, o, h, t, &format!("pgstrata{i}"))?;
        cols.push(Column {
            label: t.label.clone(),
            kind: Kind::Tool {
                bh: Box::new(bh),
                db: Box::new(db),
            },
            procs: Matcher::Exe(vec![canonical(&t.bin)]),
        });
    }
    if !o.basebackup.is_empty() {
        let version = pgstrata_testkit::run_ok(b.pg.client("pg_basebackup").arg("--version"))
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())?;
        b.results.add_version("pg_basebackup", &version);
    }
    let client = canonical(&b.pg.dir.join("pg_basebackup"));
    let server = canonical(&b.pg.dir.join("postgres"));
    for method in &o.basebackup {
        cols.push(Column {
            label: format!("pg_basebackup (server-{method})"),
            kind: Kind::Basebackup(method.clone()),
            // The client, and the walsender backends that read and compress.
            procs: Matcher::Any(vec![
                Matcher::Exe(vec![client.clone()]),
                Matcher::ExeTitled {
                    exe: server.clone(),
                    prefix: "postgres: walsender".into(),
                },
            ]),
        });
    }
    let pgbackrest = b.pgbackrest.clone();
    for (i, t) in pgbackrest.iter().enumerate() {
        let (label, setup) = pgbr_setup(t, super::pgbr_modes(t, &[PgbrMode::Block])[0]);
        let (bh, db) = pgbr_repos(b, o, h, t, &label, &setup, &format!("pgbr{i}"))?;
        cols.push(Column {
            label,
            kind: Kind::Tool {
                bh: Box::new(bh),
                db: Box::new(db),
            },
            procs: Matcher::Exe(vec![canonical(&t.bin)]),
        });
    }
    Ok(cols)
}

/// pgstrata's repository on the backup host, with the configurations of both hosts.
fn pgstrata_repos(
    b: &Bench,
    o: &Opts,
    h: &Hosts,
    t: &Tool,
    name: &str,
) -> Result<(Repo, Repo), String> {
    let repo = backup_host_dir(b, &format!("repo-{name}"))?;
    let bh_lock = backup_host_dir(b, &format!("lock-bh-{name}"))?;
    let db_lock = b.dir(&format!("lock-db-{name}"))?;
    pgstrata_testkit::set_mode(&db_lock, 0o700)?;
    let level = crate::tools::default_level(&o.codec)?;
    let c = b.cluster();
    let mut common = format!(
        "compress-type = \"{}\"\ncompress-level = {level}\nprocess-max = {}\n",
        o.codec, b.process_max
    );
    if o.encrypt {
        common += &format!(
            "repo-cipher-type = \"aes-256-gcm\"\nrepo-cipher-pass = \"{}\"\n",
            super::BENCH_CIPHER_PASS
        );
    }
    let pg = format!(
        "pg-path = \"{}\"\npg-host = \"{}\"\npg-port = {}\npg-user = \"postgres\"\n",
        c.data.display(),
        c.socket_dir.display(),
        c.port
    );
    // The database host's settings are its own (the agent reads its configuration);
    // the backup host names that file, there being no forced command here.
    let db_conf = b.scratch.join(&format!("{name}-db-host.conf"));
    let bh_conf = b.scratch.join(&format!("{name}-backup-host.conf"));
    write_config(
        &bh_conf,
        &format!(
            "[global]\n{common}repo-path = \"{}\"\nlock-path = \"{}\"\ncmd-ssh = \"{}\"\n\n[{STANZA}]\n\
             pg-remote = \"{PG_OS_USER}@db-host\"\npg-remote-cmd = \"{}\"\npg-remote-config = \"{}\"\n",
            repo.display(),
            bh_lock.display(),
            h.wrap_backup.display(),
            t.bin.display(),
            db_conf.display()
        ),
        BACKUP_OS_USER,
    )?;
    write_config(
        &db_conf,
        &format!(
            "[global]\n{common}repo-remote = \"{BACKUP_OS_USER}@backup-host\"\nrepo-path = \"{}\"\n\
             repo-remote-cmd = \"{}\"\nlock-path = \"{}\"\ncmd-ssh = \"{}\"\n\n[{STANZA}]\n{pg}",
            repo.display(),
            t.bin.display(),
            db_lock.display(),
            h.wrap_archive.display()
        ),
        PG_OS_USER,
    )?;
    let repo_of = |config: PathBuf, user: &str| Repo {
        label: t.label.clone(),
        user: user.to_string(),
        tool: t.clone(),
        dir: repo.clone(),
        config,
        setup: Setup::default(),
    };
    Ok((
        repo_of(bh_conf, BACKUP_OS_USER),
        repo_of(db_conf, PG_OS_USER),
    ))
}

/// pgBackRest's repository on the backup host (`pg1-host`), and the database host's
/// configuration (`repo1-host`, for archive-push and restore).
#[allow(clippy::too_many_arguments)]
fn pgbr_repos(
    b: &Bench,
    o: &Opts,
    h: &Hosts,
    t: &Tool,
    label: &str,
    setup: &Setup,
    name: &str,
) -> Result<(Repo, Repo), String> {
    let repo = backup_host_dir(b, &format!("repo-{name}"))?;
    let bh_lock = backup_host_dir(b, &format!("lock-bh-{name}"))?;
    let bh_log = backup_host_dir(b, &format!("log-bh-{name}"))?;
    let db_lock = b.dir(&format!("lock-db-{name}"))?;
    let level = crate::tools::default_level(&o.codec)?;
    let c = b.cluster();
    let bh_conf = b.scratch.join(&format!("{name}-backup-host.conf"));
    let db_conf = b.scratch.join(&format!("{name}-db-host.conf"));
    let mut common = format!(
        "compress-type={}\ncompress-level={level}\nprocess-max={}\nlog-level-console=warn\nlog-level-file=off\n",
        o.codec, b.process_max
    );
    if o.encrypt {
        common += &format!(
            "repo1-cipher-type=aes-256-cbc\nrepo1-cipher-pass={}\n",
            super::BENCH_CIPHER_PASS
        );
    }
    write_config(
        &bh_conf,
        &format!(
            "[global]\n{common}repo1-path={}\nrepo1-retention-full=99\nstart-fast=y\n{}\nlog-path={}\n\
             lock-path={}\ncmd-ssh={}\n\n[{STANZA}]\npg1-host=db-host\npg1-host-user={PG_OS_USER}\n\
             pg1-host-cmd={}\npg1-host-config={}\npg1-path={}\npg1-socket-path={}\npg1-port={}\npg1-user=postgres\n",
            repo.display(),
            setup.settings.join("\n"),
            bh_log.display(),
            bh_lock.display(),
            h.wrap_backup.display(),
            t.bin.display(),
            db_conf.display(),
            c.data.display(),
            c.socket_dir.display(),
            c.port
        ),
        BACKUP_OS_USER,
    )?;
    write_config(
        &db_conf,
        &format!(
            "[global]\n{common}repo1-host=backup-host\nrepo1-host-user={BACKUP_OS_USER}\nrepo1-host-cmd={}\n\
             repo1-host-config={}\nrepo1-path={}\nlog-path={}\nlock-path={}\ncmd-ssh={}\n\n[{STANZA}]\n\
             pg1-path={}\npg1-socket-path={}\npg1-port={}\npg1-user=postgres\n",
            t.bin.display(),
            bh_conf.display(),
            repo.display(),
            b.log_dir.display(),
            db_lock.display(),
            h.wrap_archive.display(),
            c.data.display(),
            c.socket_dir.display(),
            c.port
        ),
        PG_OS_USER,
    )?;
    let repo_of = |config: PathBuf, user: &str| Repo {
        label: label.to_string(),
        user: user.to_string(),
        tool: t.clone(),
        dir: repo.clone(),
        config,
        setup: setup.clone(),
    };
    Ok((
        repo_of(bh_conf, BACKUP_OS_USER),
        repo_of(db_conf, PG_OS_USER),
    ))
}

/// pg_basebackup on the backup host, over TCP through the line into the cluster's socket.
fn basebackup(b: &mut Bench, h: &Hosts, method: &str, out: &Path) -> Result<Measured, String> {
    let mut c = b.pg.client("pg_basebackup");
    c.args([
        "-h",
        "127.0.0.1",
        "-p",
        &h.pg.port.to_string(),
        "-U",
        "postgres",
        "-w",
    ])
    .arg("-D")
    .arg(out)
    .args(["-Ft", "-X", "stream", "--checkpoint=fast"])
    .arg(format!("--compress=server-{method}"));
    let m = b.run_as(
        BACKUP_OS_USER,
        &format!("pg_basebackup-{method}"),
        &mut c,
        true,
    )?;
    eprintln!("[bench] pg_basebackup server-{method}: {:.2} s", m.seconds);
    Ok(m)
}

/// CHANGE_PCT % of every large table deleted as one contiguous range (`n` moves it between
/// runs), vacuumed and checkpointed.
fn change(b: &Bench, tables: &[String], o: &Opts, n: u64) -> Result<(), String> {
    super::delete_ranges_of(b, tables, o.scale, o.change_pct, n)?;
    b.sql("CHECKPOINT")?;
    Ok(())
}
