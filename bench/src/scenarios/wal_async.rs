//! WAL at production rates on an object store (issue 14): a backlog of ready segments
//! archived the way PostgreSQL's archiver does it (one archive_command after another, each
//! file marked done when its command returns), synchronously and with `archive-async`; then
//! the same segments fetched back the way recovery asks for them (one restore_command after
//! another), without and with prefetch. pgstrata against pgBackRest 2.59.1 (archive-async,
//! its default archive-get-queue-max), both on moto's S3 behind the test kit's proxy's
//! DELAY_MS per request (pgstrata over http, pgBackRest over the proxy's TLS listener: it
//! speaks only https to S3).
//!
//! Third, recovery for real: a base backup taken before the segments (restored by pgstrata
//! for every tool; not timed) started with the tool's restore_command, timed from the
//! server's start to its promotion at the end of the archive. Every segment list starts
//! with the base backup's own few segments. The same replay with `cp` from a local
//! directory of plain segments is PostgreSQL's own apply rate, the floor of any tool. Each
//! restore_command runs under `bench time-call`, which logs its wall time: how much of the
//! replay was spent in the tool at all.
//!
//! The backlog: SEGMENTS real segments (pgbench traffic and bulk updates) copied into a
//! stand-in data directory (`pg_wal/` with `archive_status/*.ready`, and the cluster's
//! `global/pg_control`, which pgBackRest reads), so that every tool sees the same files
//! and the same backlog. The archiver loop is the timed command; the asynchronous workers it
//! starts are not its children, so peak memory is sampled from /proc: the largest sum of
//! the resident sets of all the tool's processes during the step. The CPU time of the S3
//! server and the delay proxy (moto in python, the proxy in the bench process, on the same cores) is sampled beside it.
//!
//! Options: --segments LIST (64,512) --delay-ms MS (20) --async-process-max N (4)
//!          --codec C (zst) --scale N (10)

use super::s3_latency::{pki, S3Proxy, BUCKET};
use crate::args::Args;
use crate::harness::{Bench, STANZA};
use crate::repos::{Repo, Setup};
use crate::results::Measured;
use crate::results::Row;
use crate::tools::Tool;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Opts {
    segments: Vec<u64>,
    delay_ms: u64,
    async_pm: u64,
    codec: String,
    scale: u64,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let o = Opts {
            segments: a.uint_list("segments", "64,512")?,
            delay_ms: a.uint("delay-ms", 20, 0)?,
            async_pm: a.uint("async-process-max", 4, 1)?,
            codec: a.string("codec", "zst"),
            scale: a.uint("scale", 10, 1)?,
        };
        crate::tools::default_level(&o.codec)?;
        if o.segments.is_empty() {
            return Err("--segments: give at least one count".into());
        }
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "segments={} delay-ms={} async-process-max={} codec={} scale={}",
            self.segments
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            self.delay_ms,
            self.async_pm,
            self.codec,
            self.scale
        )
    }
}

/// One way of archiving and fetching.
struct Target {
    label: String,
    tool: Tool,
    asynchronous: bool,
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    let moto = pgstrata_testkit::S3Server::start(BUCKET)?;
    let tls = if b.pgbackrest.is_empty() {
        None
    } else {
        Some(pki(b)?)
    };
    let proxy = S3Proxy::start(
        o.delay_ms,
        0,
        moto.port,
        tls.as_ref().map(|(_, c, k)| (c.clone(), k.clone())),
    )?;
    let mut link = Link {
        proxy,
        ca: tls.as_ref().map(|(ca, _, _)| ca.clone()),
    };
    let segments = generate_segments(b, o)?;
    let targets = targets(b);
    let mut labels: Vec<&str> = targets.iter().map(|t| t.label.as_str()).collect();
    labels.push(FLOOR);
    b.results.declare(&labels);

    for &n in &o.segments {
        // The base backup's own segments come first (`lead` of them), then n of the load.
        let case = Case {
            names: &segments.names[..(segments.lead + n) as usize],
            push: format!("{n} ready segments, S3 +{} ms", o.delay_ms),
            get: format!("{n} segments fetched in order, S3 +{} ms", o.delay_ms),
            replay: format!("{n} segments replayed by recovery, S3 +{} ms", o.delay_ms),
        };
        for (i, t) in targets.iter().enumerate() {
            let tag = format!("async-{n}-{i}");
            measure_target(b, o, &mut link, &segments, &case, t, &tag)?;
        }
        replay_floor(b, &segments, &case, n)?;
    }
    Ok(())
}

/// The S3 server's delay proxy, and the CA certificate of its TLS listener (pgBackRest's).
struct Link {
    proxy: S3Proxy,
    ca: Option<PathBuf>,
}

/// The segments every tool archives and fetches, and the base backup recovery replays
/// them onto.
struct Segments {
    /// The repository (pgstrata's) holding the base backup.
    src: Repo,
    /// The base backup's label.
    base: String,
    /// A directory of the segments, plain.
    dir: PathBuf,
    /// Their names, in order: the base backup's own first, then the load's.
    names: Vec<String>,
    /// How many of `names` are the base backup's own.
    lead: u64,
}

/// One count of segments: the first `names`, and its three measurements' cases.
struct Case<'a> {
    names: &'a [String],
    push: String,
    get: String,
    replay: String,
}

/// Generate the largest count of segments once (pgbench traffic after a base backup) and
/// fetch them from the base backup's start on into a directory.
fn generate_segments(b: &mut Bench, o: &Opts) -> Result<Segments, String> {
    b.start_cluster("max_wal_size = '4GB'\nsynchronous_commit = off")?;
    b.load_pgbench(o.scale, 0, "")?;
    let most = *o.segments.iter().max().unwrap();
    let src_tool = b.pgstrata.first().cloned().ok_or("no pgstrata binary")?;
    let src = Repo::new(b, &src_tool, "source", "wal-src", "lz4", Setup::default())?;
    src.stanza_create(b)?;
    b.archive_to(&[src.archive_push_line()])?;
    // The base backup recovery replays the segments onto (restored by pgstrata for every
    // tool: only the replay through each tool's restore_command is measured).
    let (_, base) = src.backup(b, "full", &[])?;
    let base_wal = src.backup_info(b, &base)?["wal_start"]
        .as_str()
        .ok_or("the base backup's first WAL segment")?
        .to_string();
    eprintln!("[bench] generating {most} segments");
    let first = super::generate_pgbench_segments(b, most)?;
    b.archive_nowhere();
    let dir = b.dir("segments")?;
    // The segments from the base backup's start on: the backup's own first, then the load.
    let seg_size = super::wal_segment_size(b)?;
    let base_start = pgstrata_pg::lsn::parse_segment_name(&base_wal, seg_size)
        .ok_or("the base backup's first WAL segment name")?
        .1
        * seg_size;
    let lead = (first - base_start) / seg_size;
    let names = super::fetch_segments(b, &src, base_start, lead + most, &dir)?;
    Ok(Segments {
        src,
        base,
        dir,
        names,
        lead,
    })
}

/// Every tool synchronously, then asynchronously.
fn targets(b: &Bench) -> Vec<Target> {
    b.pgstrata
        .iter()
        .chain(&b.pgbackrest)
        .flat_map(|t| {
            [false, true].map(|asynchronous| Target {
                label: format!(
                    "{} {}",
                    t.label,
                    if asynchronous { "async" } else { "sync" }
                ),
                tool: t.clone(),
                asynchronous,
            })
        })
        .collect()
}

/// `t` archiving `case`'s segments from a stand-in data directory, fetching them back as
/// recovery does, and recovery replaying them through it: three rows.
fn measure_target(
    b: &mut Bench,
    o: &Opts,
    link: &mut Link,
    segments: &Segments,
    case: &Case,
    t: &Target,
    tag: &str,
) -> Result<(), String> {
    let names = case.names;
    let endpoint = if t.tool.is_pgstrata() {
        format!("http://127.0.0.1:{}", link.proxy.port)
    } else {
        link.proxy
            .tls_port
            .ok_or("pgBackRest needs the proxy's TLS listener")?
            .to_string()
    };
    let data = stand_in_data_dir(b, tag, &segments.dir, names)?;
    let spool = b.dir(&format!("spool-{tag}"))?;
    let repo = repo(b, o, t, tag, &endpoint, &spool, link.ca.as_deref())?;
    repo.stanza_create(b)?;
    use_stand_in(b, &repo, &data)?;
    time_push(b, &mut link.proxy, &repo, &data.join("pg_wal"), case, t)?;
    // Fetch back as recovery does; pgstrata asynchronous = with prefetch, its
    // synchronous row without (archive-get-queue-max=0).
    let out = b.dir(&format!("get-{tag}"))?;
    std::thread::sleep(Duration::from_secs(3)); // let idle workers exit
    time_get(b, &mut link.proxy, &repo, &out, &segments.dir, case, t)?;
    std::thread::sleep(Duration::from_secs(6)); // prefetch workers exit when idle
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&spool);
    let spool = b.dir(&format!("spool-{tag}"))?;
    time_replay(b, &mut link.proxy, &repo, segments, case, t, tag)?;
    for d in [&data, &spool] {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(())
}

/// The proxy's requests during one step: its turns after `before` up to `after`.
struct Turns {
    before: u64,
    after: u64,
}

impl Turns {
    /// `step` run with `proxy` counting its requests.
    fn counting<T>(
        proxy: &mut S3Proxy,
        step: impl FnOnce() -> Result<T, String>,
    ) -> Result<(T, Turns), String> {
        let before = proxy.turns()?;
        let out = step()?;
        let after = proxy.turns()?;
        Ok((out, Turns { before, after }))
    }

    fn count(&self) -> u64 {
        self.after - self.before
    }

    /// `t`'s row of `case` and `step`, measured `m`, with the step's request count.
    fn row(&self, case: &str, step: &str, t: &Target, m: &Measured) -> Row {
        Row::timed(case, step, &t.label, 1, m).with_count(Some(self.count()))
    }
}

impl Target {
    /// How its restore_command fetches.
    fn fetching(&self) -> &'static str {
        if self.asynchronous {
            "prefetch (default queue)"
        } else {
            "no prefetch"
        }
    }
}

/// `t` running `command` once for each of `case`'s segments in `dir` in order (`then`
/// after each: [`super::per_segment_loop`]), timed and sampled, the proxy counting.
#[allow(clippy::too_many_arguments)]
fn time_per_segment(
    b: &mut Bench,
    proxy: &mut S3Proxy,
    repo: &Repo,
    dir: &Path,
    case: &Case,
    t: &Target,
    command: &str,
    then: &str,
) -> Result<(Measured, Sampled, Turns), String> {
    let ((m, seen), turns) = Turns::counting(proxy, || {
        sampled(Some(&t.tool), || {
            super::per_segment_loop(b, repo, dir, case.names, command, then)
        })
    })?;
    Ok((m, seen, turns))
}

/// PostgreSQL's archiver: each ready file of `wal` in order, marked done when its command
/// returns.
fn time_push(
    b: &mut Bench,
    proxy: &mut S3Proxy,
    repo: &Repo,
    wal: &Path,
    case: &Case,
    t: &Target,
) -> Result<(), String> {
    let n = case.names.len() as f64;
    let (m, seen, turns) = time_per_segment(
        b,
        proxy,
        repo,
        wal,
        case,
        t,
        "archive-push",
        "mv \"$d/archive_status/$f.ready\" \"$d/archive_status/$f.done\";",
    )?;
    b.results.record(
        turns
            .row(&case.push, "archive backlog", t, &m)
            .note(format!(
                "{:.1} segments/s; {:.1} requests a segment ({}); {}",
                n / m.seconds,
                turns.count() as f64 / n,
                proxy.mix(turns.before + 1, turns.after),
                seen.note(&t.tool.label, case.names.len())
            )),
    )
}

/// One restore_command after another into `out`, each segment checked against `seg_dir`'s.
fn time_get(
    b: &mut Bench,
    proxy: &mut S3Proxy,
    repo: &Repo,
    out: &Path,
    seg_dir: &Path,
    case: &Case,
    t: &Target,
) -> Result<(), String> {
    let names = case.names;
    let (m, seen, turns) = time_per_segment(b, proxy, repo, out, case, t, "archive-get", "")?;
    for name in names {
        if std::fs::read(out.join(name)).ok() != std::fs::read(seg_dir.join(name)).ok() {
            return Err(format!("{}: archive-get of {name} differs", t.label));
        }
    }
    b.results
        .record(turns.row(&case.get, "restore_command", t, &m).note(format!(
            "{:.1} segments/s, {:.0} ms a call; {}; {}",
            names.len() as f64 / m.seconds,
            1000.0 * m.seconds / names.len() as f64,
            t.fetching(),
            seen.note(&t.tool.label, names.len())
        )))
}

/// Recovery for real: the base backup replaying every segment through the tool's
/// restore_command, from start to promotion at the end of the archive.
fn time_replay(
    b: &mut Bench,
    proxy: &mut S3Proxy,
    repo: &Repo,
    segments: &Segments,
    case: &Case,
    t: &Target,
    tag: &str,
) -> Result<(), String> {
    let names = case.names;
    let restore_command = format!(
        "{} --config={} --stanza={STANZA}{} archive-get %f \"%p\"",
        t.tool.bin.display(),
        repo.config.display(),
        // pgBackRest insists that pg1-path is the server's data directory.
        if t.tool.is_pgstrata() {
            String::new()
        } else {
            " --pg1-path=@DATA@".to_string()
        }
    );
    let ((seconds, seen, calls), turns) = Turns::counting(proxy, || {
        replay(b, segments, tag, &restore_command, Some(&t.tool), names)
    })?;
    let m = Measured {
        seconds,
        max_rss_kb: seen.tool.peak_rss_kb,
        ..Measured::default()
    };
    b.results.record(
        turns
            .row(&case.replay, "restore + replay", t, &m)
            .note(format!(
                "{:.1} segments/s replayed; {}; {}; {}",
                names.len() as f64 / seconds,
                t.fetching(),
                calls.note(),
                seen.note(&t.tool.label, names.len())
            )),
    )
}

/// The limit: PostgreSQL replaying the same segments copied from a local directory of
/// plain segments, no tool in the way. Only these `names` (hard links): the segments
/// directory holds those of the largest count.
fn replay_floor(b: &mut Bench, segments: &Segments, case: &Case, n: u64) -> Result<(), String> {
    let names = case.names;
    let floor_dir = b.dir(&format!("segments-{n}"))?;
    for name in names {
        let link = floor_dir.join(name);
        if !link.exists() {
            std::fs::hard_link(segments.dir.join(name), &link)
                .map_err(|e| format!("link {}: {e}", link.display()))?;
        }
    }
    let restore_command = format!("cp \"{}/%f\" \"%p\"", floor_dir.display());
    let tag = format!("floor-{n}");
    let (seconds, _, calls) = replay(b, segments, &tag, &restore_command, None, names)?;
    let m = Measured {
        seconds,
        ..Measured::default()
    };
    b.results.record(
        Row::timed(&case.replay, "restore + replay", FLOOR, 1, &m).note(format!(
            "{:.1} segments/s replayed; restore_command cp from a local directory (PostgreSQL's apply rate); {}",
            names.len() as f64 / seconds,
            calls.note()
        )),
    )
}

/// Column of the replay without any tool: what recovery itself costs.
const FLOOR: &str = "cp from local disk";

/// Restore the base backup of `segments` into a new data directory, start it with
/// `restore_command` (`@DATA@` stands for the data directory) and time it from start to
/// promotion at the end of the archive; checks that it replayed every one of `names`.
/// Samples `tool`'s processes meanwhile, and times every restore_command call through
/// `bench time-call` (the same few milliseconds a call in every row, `cp` included).
fn replay(
    b: &mut Bench,
    segments: &Segments,
    tag: &str,
    restore_command: &str,
    tool: Option<&Tool>,
    names: &[String],
) -> Result<(f64, Sampled, Calls), String> {
    let restored = b.empty_data_dir(&format!("replay-{tag}"))?;
    let calls_log = b.dir("calls")?.join(format!("{tag}.log"));
    let restore_command = format!(
        "{} time-call {} {restore_command}",
        time_call_shim(b)?.display(),
        calls_log.display()
    );
    segments.src.restore(
        b,
        &restored,
        &[&format!("--set={}", segments.base), "--archive-mode=off"],
    )?;
    let conf = restored.join("postgresql.auto.conf");
    let text = std::fs::read_to_string(&conf).map_err(|e| e.to_string())?;
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("restore_command"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        + &format!(
            "restore_command = '{}'\n",
            restore_command.replace("@DATA@", &restored.display().to_string())
        );
    std::fs::write(&conf, text).map_err(|e| e.to_string())?;
    crate::harness::append(&restored.join("postgresql.conf"), "\narchive_mode = off\n")?;
    let sock = b.dir(&format!("sock-{tag}"))?;
    let cluster = pgstrata_testkit::Cluster::adopt(&b.pg, &restored, &sock);
    crate::harness::settle();
    let t0 = std::time::Instant::now();
    let run = || {
        cluster.start()?;
        Ok(cluster.wait_for_promotion(Duration::from_secs(3600))?)
    };
    // Sampled without a tool too (the servers only): the sampler's own CPU is then the
    // same in every row.
    let seen = sampled(tool, run)?.1;
    let seconds = t0.elapsed().as_secs_f64();
    let last = cluster.psql(
        "postgres",
        "SELECT pg_walfile_name(pg_last_wal_replay_lsn())",
    )?;
    cluster.stop()?;
    let _ = std::fs::remove_dir_all(&restored);
    let replayed_to = names.last().map(|n| n[8..].to_string()).unwrap_or_default();
    if last.trim().get(8..) < Some(replayed_to.as_str()) {
        return Err(format!(
            "{tag}: recovery ended at {} before the last archived segment {}",
            last.trim(),
            names.last().unwrap()
        ));
    }
    Ok((seconds, seen, Calls::read(&calls_log)?))
}

/// The restore_command calls of one replay, as `bench time-call` logged them.
struct Calls {
    calls: u64,
    /// Calls that returned a file (exit code 0).
    found: u64,
    seconds: f64,
}

impl Calls {
    fn read(log: &Path) -> Result<Calls, String> {
        let text = std::fs::read_to_string(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut c = Calls {
            calls: 0,
            found: 0,
            seconds: 0.0,
        };
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(us), Some(code)) = (f.next(), f.next()) else {
                continue;
            };
            c.calls += 1;
            c.found += u64::from(code == "0");
            c.seconds += us.parse::<f64>().unwrap_or(0.0) / 1e6;
        }
        Ok(c)
    }

    /// "71 restore_command calls (66 found): 1.52 s in them, 21 ms a call"
    fn note(&self) -> String {
        format!(
            "{} restore_command calls ({} found): {:.2} s in them, {:.0} ms a call",
            self.calls,
            self.found,
            self.seconds,
            1000.0 * self.seconds / self.calls.max(1) as f64
        )
    }
}

/// This bench binary, copied into the scratch directory (once) for the PostgreSQL user to
/// run as `time-call`.
fn time_call_shim(b: &Bench) -> Result<PathBuf, String> {
    let shim = b.dir("bin")?.join("bench-time-call");
    if !shim.exists() {
        let me = std::env::current_exe().map_err(|e| format!("the bench's own path: {e}"))?;
        std::fs::copy(&me, &shim)
            .map_err(|e| format!("copy {} to {}: {e}", me.display(), shim.display()))?;
        pgstrata_testkit::set_mode(&shim, 0o755)?;
    }
    Ok(shim)
}

/// A directory standing in for the data directory: the cluster's pg_control and a pg_wal
/// holding `names`, each marked ready to archive.
fn stand_in_data_dir(
    b: &Bench,
    tag: &str,
    seg_dir: &Path,
    names: &[String],
) -> Result<PathBuf, String> {
    let data = b.dir(&format!("data-{tag}"))?;
    let status = data.join("pg_wal/archive_status");
    let global = data.join("global");
    for d in [&status, &global] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let io = |e: std::io::Error| e.to_string();
    std::fs::copy(
        b.cluster().data.join("global/pg_control"),
        global.join("pg_control"),
    )
    .map_err(io)?;
    std::fs::write(data.join("PG_VERSION"), "15\n").map_err(io)?;
    for n in names {
        std::fs::copy(seg_dir.join(n), data.join("pg_wal").join(n)).map_err(io)?;
        std::fs::write(status.join(format!("{n}.ready")), "").map_err(io)?;
    }
    for d in [&data, &data.join("pg_wal"), &status, &global] {
        pgstrata_testkit::give_to_pg_user(d);
        pgstrata_testkit::set_mode(d, 0o700)?;
    }
    for e in walk(&data) {
        pgstrata_testkit::give_to_pg_user(&e);
    }
    Ok(data)
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn repo(
    b: &Bench,
    o: &Opts,
    t: &Target,
    tag: &str,
    endpoint: &str,
    spool: &Path,
    ca: Option<&Path>,
) -> Result<Repo, String> {
    let prefix = format!("bench-{tag}");
    let mut settings = super::s3_latency::repo_settings(&t.tool, endpoint, &prefix, ca);
    if t.tool.is_pgstrata() {
        settings.extend([
            format!("archive-async = {}", t.asynchronous),
            format!("spool-path = \"{}\"", spool.display()),
            "archive-timeout = 600".into(),
        ]);
        if !t.asynchronous {
            settings.push("archive-get-queue-max = 0".into());
        }
    } else {
        settings.extend([
            format!("archive-async={}", if t.asynchronous { "y" } else { "n" }),
            format!("spool-path={}", spool.display()),
            "archive-timeout=600".into(),
        ]);
    }
    let setup = Setup {
        settings,
        remote: true,
        process_max: Some(if t.asynchronous { o.async_pm } else { 1 }),
        ..Setup::default()
    };
    Repo::new(
        b,
        &t.tool,
        &t.label,
        &tag.replace('-', "_"),
        &o.codec,
        setup,
    )
}

/// After stanza-create (which checks pg1-path against the running cluster), point
/// pgBackRest's pg1-path at the stand-in data directory: it finds pg_wal there.
fn use_stand_in(b: &Bench, repo: &Repo, data: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(&repo.config).map_err(|e| e.to_string())?;
    let text = text.replace(
        &format!("pg1-path={}", b.cluster().data.display()),
        &format!("pg1-path={}", data.display()),
    );
    std::fs::write(&repo.config, text).map_err(|e| e.to_string())
}

/// What the sampler saw during a step.
#[derive(Default)]
struct Sampled {
    /// The processes running the tool's binary (foreground calls and detached
    /// asynchronous workers alike).
    tool: crate::procs::Sampled,
    /// The S3 server and the delay proxy in front of it: they share the machine's cores
    /// with the tool.
    servers: crate::procs::Sampled,
}

impl Sampled {
    /// "all <tool> processes: peak RSS .., CPU .. ms a segment; S3 server and proxy: CPU .."
    fn note(&self, label: &str, segments: usize) -> String {
        format!(
            "all {label} processes: peak RSS {} MB, CPU {:.0} ms a segment; S3 server and proxy: CPU {:.0} ms a segment",
            self.tool.peak_rss_kb / 1024,
            1000.0 * self.tool.cpu_seconds / segments as f64,
            1000.0 * self.servers.cpu_seconds / segments as f64
        )
    }
}

/// Run `f`, sampling every 10 ms the processes running `tool`'s binary (none without a
/// tool) and the servers.
fn sampled<T>(
    tool: Option<&Tool>,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<(T, Sampled), String> {
    use crate::procs::Matcher;
    let bins = tool
        .map(|t| std::fs::canonicalize(&t.bin).unwrap_or_else(|_| t.bin.clone()))
        .into_iter()
        .collect();
    let groups = [
        Matcher::Exe(bins),
        // The proxy is threads of this process: its CPU counts with the server's.
        Matcher::Pids(
            crate::procs::pids_with_arg("moto_server")
                .into_iter()
                .chain([std::process::id()])
                .collect(),
        ),
    ];
    let (r, mut seen) = crate::procs::sampled(&groups, f)?;
    let servers = seen.pop().unwrap_or_default();
    let tool = seen.pop().unwrap_or_default();
    Ok((r, Sampled { tool, servers }))
}
