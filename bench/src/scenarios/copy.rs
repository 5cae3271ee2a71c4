//! `copy` of backups between repositories (issue 43). pgbench -i -s SCALE plus COPIES
//! copies, settled. pgstrata: a full backup into repository 1 (local), then per target
//! (a second local repository; S3 on moto behind the test kit's proxy, DELAY_MS a request)
//! a timed `copy --from-repo=1 --repo=2` of the full; then a CHANGE_PCT % change, an
//! incremental into repository 1, and a timed copy of it to each target. Each copy is set
//! against a plain read of the same source objects (every file of the backup's directory
//! and the WAL archive read to /dev/null, page cache as the copy sees it): the rate target
//! is ≥ 0.8× that. The same with the page cache dropped first (a plain read from the disk,
//! and a copy to another local repository reading its source from the disk), and cold
//! with direct I/O (`dd iflag=direct`: the disk's own rate, the physical limit of a copy
//! that reads every byte from it). What the
//! copy of the incremental moves is set against what the incremental stores (target
//! ≤ 1.2×).
//!
//! pgBackRest cannot copy a backup between repositories: its users back up into each
//! (2.59.1, bundling and block incremental, repo1 then repo2: `--repo=2` is the extra
//! cost), which reads the database again. Its repo2 backups are timed beside the copies,
//! with what they read from the database.
//!
//! A last target sits on another device (OTHER_DEVICE, a tmpfs by default), the page
//! cache dropped first: the source is read from the disk and nothing is written to it, so
//! the copy is set against the cold plain read on equal terms — the case of a second
//! repository on its own disk. On one disk a copy reads and writes every byte, and the
//! rows above say what share of the disk's rate it got. The full's copy to another device
//! is timed best of `--runs`, alternating with cold plain reads (best of those too).
//!
//! Options: --scale N (20) --copies N (1) --change-pct P (1) --delay-ms MS (20) --codec C (zst)
//! --other-device DIR (/dev/shm; skipped when DIR is on the scratch directory's device)

use super::s3_latency::{S3Proxy, BUCKET};
use super::{delete_ranges, load_settled_pgbench, pgbr_modes, pgbr_setup, PgbrMode};
use crate::args::Args;
use crate::harness::{Bench, STANZA};
use crate::repos::{Repo, Setup};
use crate::results::{Measured, Row};
use std::path::Path;
use std::process::Command;

pub struct Opts {
    scale: u64,
    copies: u64,
    change_pct: u64,
    delay_ms: u64,
    codec: String,
    other_device: String,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        Ok(Opts {
            scale: a.uint("scale", 20, 1)?,
            copies: a.uint("copies", 1, 1)?,
            change_pct: a.uint("change-pct", 1, 1)?,
            delay_ms: a.uint("delay-ms", 20, 0)?,
            codec: a.string("codec", "zst"),
            other_device: a.string("other-device", "/dev/shm"),
        })
    }

    pub fn params(&self) -> String {
        format!(
            "scale={} copies={} change-pct={} delay-ms={} codec={} other-device={}",
            self.scale, self.copies, self.change_pct, self.delay_ms, self.codec, self.other_device
        )
    }
}

/// Where a copy goes: its name in the table and the environment that configures
/// repository 2 for the copy alone (archive_command does not know it).
struct Target {
    case: String,
    env: Vec<(String, String)>,
    /// The page cache is dropped before the copy: the source is read from the disk.
    cold: bool,
    /// The target's directory, emptied between rounds where the full's copy is timed best
    /// of `--runs` ([`copy_timed`]).
    wipe: Option<std::path::PathBuf>,
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    let moto = pgstrata_testkit::S3Server::start(BUCKET)?;
    let proxy = S3Proxy::start(o.delay_ms, 0, moto.port, None)?;
    load_settled_pgbench(b, o.scale, o.copies)?;
    let tool = b.pgstrata.first().cloned().ok_or("no pgstrata binary")?;
    let source = Repo::new(
        b,
        &tool,
        &tool.label,
        "copy-src",
        &o.codec,
        Setup::default(),
    )?;
    let mut repos = vec![source];
    for t in b.pgbackrest.clone() {
        for mode in pgbr_modes(&t, &[PgbrMode::Block]) {
            let (label, mut setup) = pgbr_setup(&t, mode);
            let repo2 = b.dir(&format!("repo-copy-pgbr2-{}", repos.len()))?;
            pgstrata_testkit::give_to_pg_user(&repo2);
            setup.settings.extend([
                format!("repo2-path={}", repo2.display()),
                "repo2-bundle=y".into(),
                "repo2-block=y".into(),
                "repo2-retention-full=99".into(),
            ]);
            let name = format!("copy-pgbr-{}", repos.len());
            repos.push(Repo::new(b, &t, &label, &name, &o.codec, setup)?);
        }
    }
    super::stanza_create_all(b, &repos)?;
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()?;
    let other = OtherDevice::create(b, &o.other_device)?;
    let targets = copy_targets(b, &repos[0], o, proxy.port, other.as_ref())?;
    let source = &repos[0];
    let (m, full) = source.backup(b, "full", &[])?;
    b.results
        .record(Row::timed("full", "backup repo1", &source.label, 1, &m))?;
    backup_each_repository(b, &repos[1..], "full")?;
    let full_stored = source.backup_sizes(b, &full)?.stored;
    copy_to_each(b, source, &targets, "full", &full, full_stored)?;

    delete_ranges(b, o.scale, o.copies, o.change_pct, 0, "test")?;
    b.sql("CHECKPOINT")?;
    b.wal_switch_and_wait()?;
    let (m, incr) = source.backup(b, "incr", &[])?;
    b.results
        .record(Row::timed("incr", "backup repo1", &source.label, 1, &m))?;
    let stored = source.backup_sizes(b, &incr)?.stored;
    b.results
        .record(Row::bytes("incr", "incr stored", &source.label, 1, stored))?;
    backup_each_repository(b, &repos[1..], "incr")?;
    copy_to_each(b, source, &targets, "incr", &incr, stored)?;
    drop(moto);
    Ok(())
}

/// The repositories each copy goes to (each a repository 2 given by environment), their
/// directories made; the re-sealed one's stanza created.
fn copy_targets(
    b: &mut Bench,
    source: &Repo,
    o: &Opts,
    s3_port: u16,
    other: Option<&OtherDevice>,
) -> Result<Vec<Target>, String> {
    let local = b.dir("repo-copy-local")?;
    pgstrata_testkit::give_to_pg_user(&local);
    let local_cold = b.dir("repo-copy-local-cold")?;
    pgstrata_testkit::give_to_pg_user(&local_cold);
    let sealed = b.dir("repo-copy-sealed")?;
    pgstrata_testkit::give_to_pg_user(&sealed);
    let sealed_env: Vec<(String, String)> = [
        ("PGSTRATA_REPO2_PATH", sealed.display().to_string()),
        ("PGSTRATA_REPO2_CIPHER_TYPE", "aes-256-gcm".into()),
        (
            "PGSTRATA_REPO2_CIPHER_PASS",
            "bench passphrase of repository 2".into(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // Its own stanza, so its master keys are not the source's: every frame is re-sealed.
    let mut create = pgstrata_cmd(source, &sealed_env);
    create.arg("stanza-create");
    b.run("stanza-create-sealed", &mut create, false)?;
    let mut targets = vec![
        Target {
            case: "to local".into(),
            env: vec![("PGSTRATA_REPO2_PATH".into(), local.display().to_string())],
            cold: false,
            wipe: None,
        },
        Target {
            case: "to local, cold cache".into(),
            env: vec![(
                "PGSTRATA_REPO2_PATH".into(),
                local_cold.display().to_string(),
            )],
            cold: true,
            wipe: None,
        },
        Target {
            case: "re-sealed to local".into(),
            env: sealed_env,
            cold: false,
            wipe: None,
        },
        Target {
            case: format!("to S3 +{} ms", o.delay_ms),
            env: s3_env(s3_port),
            cold: false,
            wipe: None,
        },
    ];
    if let Some(other) = other {
        targets.push(Target {
            case: format!("to another device ({}), cold cache", other.0.display()),
            env: vec![("PGSTRATA_REPO2_PATH".into(), other.0.display().to_string())],
            cold: true,
            wipe: Some(other.0.clone()),
        });
    }
    Ok(targets)
}

/// A repository directory on a device other than the scratch directory's, removed when
/// the run ends (on a tmpfs it holds memory), kept with --keep.
struct OtherDevice(std::path::PathBuf, bool);

impl OtherDevice {
    fn create(b: &Bench, parent: &str) -> Result<Option<OtherDevice>, String> {
        use std::os::unix::fs::MetadataExt;
        let device = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        let parent = Path::new(parent);
        if parent.as_os_str().is_empty() || device(parent).is_none() {
            return Ok(None);
        }
        if device(parent) == device(&b.scratch.path) {
            eprintln!(
                "[bench] {} is on the scratch directory's device: no copy to another device",
                parent.display()
            );
            return Ok(None);
        }
        let dir = parent.join(format!("pgstrata-bench-copy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        pgstrata_testkit::give_to_pg_user(&dir);
        Ok(Some(OtherDevice(dir, b.scratch.keep)))
    }
}

impl Drop for OtherDevice {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// What pgBackRest's users do instead of a copy: a `kind` backup of each of `repos` into
/// repository 1, then into repository 2 (with what that one read from the database).
fn backup_each_repository(b: &mut Bench, repos: &[Repo], kind: &str) -> Result<(), String> {
    for r in repos {
        for repo in ["1", "2"] {
            let (m, label) = r.backup(b, kind, &[&format!("--repo={repo}")])?;
            let step = format!("backup repo{repo}");
            b.results.record(Row::timed(kind, &step, &r.label, 1, &m))?;
            if repo == "2" {
                let read = r.backup_sizes(b, &label)?.read;
                b.results
                    .record(Row::bytes(kind, "repo2 read from db", &r.label, 1, read))?;
            }
        }
    }
    Ok(())
}

/// The environment that makes repository 2 the S3 bucket behind the proxy.
fn s3_env(proxy_port: u16) -> Vec<(String, String)> {
    [
        ("PGSTRATA_REPO2_PATH", "/bench-copy".to_string()),
        ("PGSTRATA_REPO2_TYPE", "s3".into()),
        ("PGSTRATA_REPO2_S3_BUCKET", BUCKET.into()),
        (
            "PGSTRATA_REPO2_S3_ENDPOINT",
            format!("http://127.0.0.1:{proxy_port}"),
        ),
        ("PGSTRATA_REPO2_S3_REGION", "us-east-1".into()),
        ("PGSTRATA_REPO2_S3_URI_STYLE", "path".into()),
        ("PGSTRATA_REPO2_S3_KEY", "test".into()),
        ("PGSTRATA_REPO2_S3_KEY_SECRET", "test".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Copy backup `label` (case `case`) to each target, timed, against a plain read of its
/// backup directory and the WAL archive.
fn copy_to_each(
    b: &mut Bench,
    source: &Repo,
    targets: &[Target],
    case: &str,
    label: &str,
    stored: Option<u64>,
) -> Result<(), String> {
    let mut floors = measure_floors(b, source, case, label)?;
    for t in targets {
        let m = copy_timed(b, source, t, case, &mut floors)?;
        let report: serde_json::Value =
            serde_json::from_str(&m.stdout).map_err(|e| format!("copy report: {e}"))?;
        let moved = report["bytes_copied"].as_u64().unwrap_or(0);
        let rate = mb_per_s(moved, m.seconds);
        let plain = mb_per_s(
            floors.read_bytes,
            if t.cold {
                floors.read_cold.seconds
            } else {
                floors.read.seconds
            },
        );
        // Cold, the disk's own rate is the physical limit: how close the copy comes to it.
        let direct = if t.cold {
            let disk = mb_per_s(floors.read_bytes, floors.read_direct.seconds);
            format!(", {:.2}x the direct read", rate / disk)
        } else {
            String::new()
        };
        eprintln!(
            "[bench] copy {case} {}: {moved} bytes in {:.2} s ({rate:.0} MB/s, {:.2}x the plain read{direct})",
            t.case,
            m.seconds,
            rate / plain
        );
        let step = format!("copy {}", t.case);
        b.results
            .record(Row::timed(case, &step, &source.label, 1, &m).note(format!(
                "{rate:.0} MB/s = {:.2}x the plain read{direct}; {} objects, {} already there{}",
                rate / plain,
                report["objects_copied"],
                report["objects_skipped"],
                disk_share(&m, &floors.read_cold)
            )))?;
        let wal = report["wal_bytes_copied"].as_u64().unwrap_or(0);
        b.results.record(Row::bytes(
            case,
            &format!("moved by copy {}", t.case),
            &source.label,
            1,
            Some(moved),
        ))?;
        let own = moved - wal.min(moved);
        let vs_stored = stored.map(|s| {
            format!(
                "{:.2}x what the backup stores",
                own as f64 / s.max(1) as f64
            )
        });
        b.results.record(
            Row::bytes(
                case,
                &format!("backup objects moved {}", t.case),
                &source.label,
                1,
                Some(own),
            )
            .note(format!(
                "WAL {wal} bytes besides; {}",
                vs_stored.unwrap_or_default()
            )),
        )?;
    }
    record_cold_read(b, case, &floors)
}

/// Copy to `t`, timed. The full's copy to a target that can be emptied (another device) is
/// timed best of `--runs`, each round after a cold plain read of its own, whose best
/// replaces `floors.read_cold`: on a shared virtual machine a cold read varies by 2× and
/// more from one minute to the next (the page cache's pages cost the kernel more or less
/// to allocate), so the two are set against each other measured in alternation.
fn copy_timed(
    b: &mut Bench,
    source: &Repo,
    t: &Target,
    case: &str,
    floors: &mut Floors,
) -> Result<Measured, String> {
    let rounds = match (&t.wipe, case) {
        (Some(_), "full") => b.runs.max(1),
        _ => 1,
    };
    let mut best: Option<Measured> = None;
    for round in 0..rounds {
        if let Some(dir) = t.wipe.as_ref().filter(|_| round > 0) {
            std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            pgstrata_testkit::give_to_pg_user(dir);
            crate::harness::drop_page_cache()?;
            let read_cold = plain_read(b, &floors.dirs)?;
            eprintln!(
                "[bench] round {}: plain read, cold cache, {:.2} s",
                round + 1,
                read_cold.seconds
            );
            if read_cold.seconds < floors.read_cold.seconds {
                floors.read_cold = read_cold;
            }
        }
        let mut c = pgstrata_cmd(source, &t.env);
        c.args(["--from-repo=1", "--output=json", "copy"]);
        if t.cold {
            crate::harness::drop_page_cache()?;
        }
        let m = b.run(&format!("copy-{case}"), &mut c, true)?;
        if rounds > 1 {
            eprintln!(
                "[bench] round {}: copy {}, {:.2} s",
                round + 1,
                t.case,
                m.seconds
            );
        }
        if best.as_ref().is_none_or(|x| m.seconds < x.seconds) {
            best = Some(m);
        }
    }
    Ok(best.expect("one round at least"))
}

/// The row of the cold plain read, once the copies that may have improved it are done.
fn record_cold_read(b: &mut Bench, case: &str, floors: &Floors) -> Result<(), String> {
    let read_cold = &floors.read_cold;
    b.results.record(
        Row::timed(
            case,
            "plain read of the source objects, cold cache",
            "cat",
            1,
            read_cold,
        )
        .note(format!(
            "{:.0} MB/s; {}",
            mb_per_s(floors.read_bytes, read_cold.seconds),
            read_cold
                .disk
                .map(|d| d.describe(read_cold.seconds))
                .unwrap_or_default()
        )),
    )
}

/// What copying backup `label` is set against: a plain read of its objects (page cache,
/// then cold, then cold with direct I/O: the disk's rate without the page cache's cost)
/// and `cp -r` + sync of them.
fn measure_floors(b: &mut Bench, source: &Repo, case: &str, label: &str) -> Result<Floors, String> {
    let stanza_dir = source.dir.join(STANZA);
    let (backup, archive) = (
        stanza_dir.join("backup").join(label),
        stanza_dir.join("archive"),
    );
    let dirs = vec![backup.clone(), archive.clone()];
    let read = plain_read(b, &dirs)?;
    let read_bytes = dir_bytes(&backup) + dir_bytes(&archive);
    b.results.record(
        Row::timed(case, "plain read of the source objects", "cat", 1, &read)
            .note(format!("{:.0} MB/s", mb_per_s(read_bytes, read.seconds))),
    )?;
    crate::harness::drop_page_cache()?;
    let read_cold = plain_read(b, &dirs)?;
    crate::harness::drop_page_cache()?;
    let read_direct = plain_read_direct(b, &dirs)?;
    b.results.record(
        Row::timed(
            case,
            "plain read with direct I/O (the disk alone), cold cache",
            "cat",
            1,
            &read_direct,
        )
        .note(format!(
            "{:.0} MB/s; dd iflag=direct bs=4M of each object: no page cache",
            mb_per_s(read_bytes, read_direct.seconds)
        )),
    )?;
    let floor = b.dir(&format!("copy-floor-{case}"))?;
    let mut cp = Command::new("sh");
    cp.args([
        "-c",
        &format!(
            "cp -r '{}' '{}/backup' && cp -r '{}' '{}/archive' && sync",
            backup.display(),
            floor.display(),
            archive.display(),
            floor.display()
        ),
    ]);
    let copied = b.run("cp-floor", &mut cp, true)?;
    b.results.record(
        Row::timed(case, "cp -r + sync of the same objects", "cat", 1, &copied)
            .note(format!("{:.0} MB/s", mb_per_s(read_bytes, copied.seconds))),
    )?;
    std::fs::remove_dir_all(&floor).map_err(|e| format!("{}: {e}", floor.display()))?;
    Ok(Floors {
        dirs,
        read_bytes,
        read,
        read_cold,
        read_direct,
    })
}

/// What a copy is set against ([`measure_floors`]): the source objects' bytes and the
/// times to read them (page cache; cold; cold with direct I/O).
struct Floors {
    /// The directories read.
    dirs: Vec<std::path::PathBuf>,
    read_bytes: u64,
    read: Measured,
    read_cold: Measured,
    read_direct: Measured,
}

/// What the disk did during `copy` set against what it did during the cold plain read:
/// a copy to the same disk reads and writes every byte, so when the two move as many
/// bytes a second, the copy is as fast as the disk lets it be, whatever the plain read's rate.
fn disk_share(copy: &Measured, read_cold: &Measured) -> String {
    let (Some(c), Some(r)) = (copy.disk, read_cold.disk) else {
        return String::new();
    };
    let together = |d: &crate::results::DiskTraffic, s: f64| {
        (d.read_bytes + d.written_bytes) as f64 / s.max(1e-6)
    };
    format!(
        "; {}; {:.2}x the bytes a second the disk moved in the cold plain read",
        c.describe(copy.seconds),
        together(&c, copy.seconds) / together(&r, read_cold.seconds).max(1.0)
    )
}

/// `source`'s pgstrata with its config and stanza, repository 2 as `env` gives it.
fn pgstrata_cmd(source: &Repo, env: &[(String, String)]) -> Command {
    let mut c = Command::new(&source.tool.bin);
    c.arg(format!("--config={}", source.config.display()))
        .arg(format!("--stanza={STANZA}"))
        .arg("--repo=2");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Read every file under `dirs` to /dev/null, timed as a tool's command is.
fn plain_read(b: &mut Bench, dirs: &[std::path::PathBuf]) -> Result<Measured, String> {
    read_each_file(b, "plain-read", dirs, "cat {} + > /dev/null")
}

/// [`plain_read`] with direct I/O: each file read by `dd iflag=direct` in 4 MiB requests,
/// so that the time is the disk's and not the page cache's (whose pages the kernel
/// allocates and fills on a buffered read, at a cost in system time that on a small
/// virtual machine can exceed the disk's).
fn plain_read_direct(b: &mut Bench, dirs: &[std::path::PathBuf]) -> Result<Measured, String> {
    let dd = "sh -c 'for f; do dd if=\"$f\" of=/dev/null bs=4M iflag=direct status=none || exit 1; done' sh {} +";
    read_each_file(b, "plain-read-direct", dirs, dd)
}

/// Run `find DIRS -type f -exec EXEC`, timed as `name`.
fn read_each_file(
    b: &mut Bench,
    name: &str,
    dirs: &[std::path::PathBuf],
    exec: &str,
) -> Result<Measured, String> {
    let list: Vec<String> = dirs.iter().map(|d| format!("'{}'", d.display())).collect();
    let mut c = Command::new("sh");
    c.args([
        "-c",
        &format!("find {} -type f -exec {exec}", list.join(" ")),
    ]);
    b.run(name, &mut c, true)
}

fn dir_bytes(dir: &Path) -> u64 {
    crate::harness::dir_size(dir, &mut |_| true)
}

fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds.max(1e-6)
}
