//! pgstrata on S3 with a per-request latency, against the same steps on a local repository,
//! and pgBackRest on the same S3 server. The S3 server is the test kit's moto; in front of it
//! the test kit's proxy adds DELAY_MS before each request/response turn and counts the
//! requests. Targets, one after the other on the same data: pgstrata local; pgstrata on S3
//! through the proxy (http) at `--process-max` and at each `--s3-process-max`; with
//! `--s3-nodelay` pgstrata on moto directly; and when pgBackRest is measured (it only speaks
//! https to S3) pgstrata and each pgBackRest through the proxy's TLS listener, plus each
//! pgBackRest local.
//!
//! Scenario `restore`: pgbench -i -s SCALE + COPIES copies; per target a full backup, a 1 %
//! change, an incremental, a full restore of the incremental and a delta restore over a
//! restore of the full. Scenario `bundling`: TABLES small tables; per target a full backup
//! and a restore with bundling on and off, and the objects the backup wrote.
//!
//! Options: --scenarios restore,bundling --scale N (20) --copies N (2) --change-pct P (1)
//!          --tables N (500) --rows N (1) --delay-ms MS (20) --connect-delay-ms MS (0)
//!          --s3-process-max LIST (4; "none" for none) --s3-nodelay --codec C (zst)
//!          --pgbr-bundle y|n (y: what one uses on an object store)

use super::{delete_ranges, pgbr_modes, pgbr_setup, PgbrMode};
use crate::args::Args;
use crate::harness::{Bench, STANZA};
use crate::repos::{Repo, Setup};
use crate::results::Measured;
use crate::results::Row;
use crate::tools::Tool;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

pub(super) const BUCKET: &str = "pgstrata-bench";

pub struct Opts {
    scenarios: Vec<String>,
    scale: u64,
    copies: u64,
    change_pct: u64,
    tables: u64,
    rows: u64,
    delay_ms: u64,
    connect_delay_ms: u64,
    s3_pm: Vec<u64>,
    nodelay: bool,
    codec: String,
    pgbr_bundle: bool,
}

impl Opts {
    pub fn parse(a: &mut Args) -> Result<Opts, String> {
        let pm = a.string("s3-process-max", "4");
        let o = Opts {
            scenarios: a.list("scenarios", "restore,bundling", &["restore", "bundling"])?,
            scale: a.uint("scale", 20, 1)?,
            copies: a.uint("copies", 2, 1)?,
            change_pct: a.uint("change-pct", 1, 1)?,
            tables: a.uint("tables", 500, 1)?,
            rows: a.uint("rows", 1, 0)?,
            delay_ms: a.uint("delay-ms", 20, 0)?,
            connect_delay_ms: a.uint("connect-delay-ms", 0, 0)?,
            s3_pm: if pm == "none" {
                vec![]
            } else {
                Args::parse(["--x".to_string(), pm])?.uint_list("x", "")?
            },
            nodelay: a.flag("s3-nodelay"),
            codec: a.string("codec", "zst"),
            pgbr_bundle: match a.string("pgbr-bundle", "y").as_str() {
                "y" => true,
                "n" => false,
                v => return Err(format!("--pgbr-bundle must be y or n, got '{v}'")),
            },
        };
        crate::tools::default_level(&o.codec)?;
        Ok(o)
    }
    pub fn params(&self) -> String {
        format!(
            "scenarios={} scale={} copies={} tables={} delay-ms={} codec={}",
            self.scenarios.join(","),
            self.scale,
            self.copies,
            self.tables,
            self.delay_ms,
            self.codec
        )
    }
}

/// The test kit's HTTP proxy in front of moto: delays and counts request/response turns.
pub(super) struct S3Proxy {
    proxy: pgstrata_testkit::Proxy,
    pub(super) port: u16,
    pub(super) tls_port: Option<u16>,
}

impl S3Proxy {
    /// Start the proxy before moto's `upstream` port: `delay_ms` per request turn,
    /// `connect_delay_ms` per connection, and a TLS listener when `tls` (cert, key) is given.
    pub(super) fn start(
        delay_ms: u64,
        connect_delay_ms: u64,
        upstream: u16,
        tls: Option<(PathBuf, PathBuf)>,
    ) -> Result<S3Proxy, String> {
        let mut p = pgstrata_testkit::Proxy::to(pgstrata_testkit::proxy::Target::Tcp(upstream))
            .http()
            .delay_per_turn(Duration::from_millis(delay_ms))
            .delay_per_connection(Duration::from_millis(connect_delay_ms));
        if let Some((cert, key)) = &tls {
            p = p.tls(cert, key);
        }
        let proxy = p.start()?;
        Ok(S3Proxy {
            port: proxy.port,
            tls_port: proxy.tls_port,
            proxy,
        })
    }

    /// Request/response turns since the start.
    pub(super) fn turns(&mut self) -> Result<u64, String> {
        Ok(self.proxy.turns())
    }

    /// Requests of turns first..=last by kind: "GET 12, PUT 3, LIST 2".
    pub(super) fn mix(&self, first: u64, last: u64) -> String {
        let mut n: std::collections::BTreeMap<String, u64> = Default::default();
        for r in self.proxy.requests() {
            if r.turn < first || r.turn > last {
                continue;
            }
            let mut words = r.line.split_whitespace();
            let (m, target) = (words.next().unwrap_or("?"), words.next().unwrap_or(""));
            let kind = if m == "GET" && target.contains("list-type=2") {
                "LIST"
            } else {
                m
            };
            *n.entry(kind.to_string()).or_default() += 1;
        }
        n.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One tool on one kind of repository.
struct Target {
    label: String,
    tool: Tool,
    /// S3 endpoint; None: a local repository.
    endpoint: Option<String>,
    process_max: u64,
    proxied: bool,
}

struct Env {
    moto_port: u16,
    proxy: S3Proxy,
    ca: Option<PathBuf>,
}

fn targets(b: &Bench, o: &Opts, env: &Env) -> Vec<Target> {
    let d = o.delay_ms;
    let http = format!("http://127.0.0.1:{}", env.proxy.port);
    let mut out = Vec::new();
    let t = |tool: &Tool, what: String, endpoint: Option<String>, pm: u64, proxied: bool| Target {
        label: format!("{} {what}", tool.label),
        tool: tool.clone(),
        endpoint,
        process_max: pm,
        proxied,
    };
    let pm = b.process_max;
    for p in b.pgstrata.iter().chain(&b.pgbackrest) {
        out.push(t(p, "local".into(), None, pm, false));
        if p.is_pgstrata() {
            out.push(t(p, format!("S3+{d}ms"), Some(http.clone()), pm, true));
            for &n in o.s3_pm.iter().filter(|&&n| n != pm) {
                out.push(t(p, format!("S3+{d}ms pm{n}"), Some(http.clone()), n, true));
            }
            if o.nodelay {
                let direct = format!("http://127.0.0.1:{}", env.moto_port);
                out.push(t(p, "S3 no delay".into(), Some(direct), pm, false));
            }
        }
        if let Some(tls) = env.proxy.tls_port {
            // pgBackRest is given the port alone (repo1-storage-port; see target_repo).
            let endpoint = if p.is_pgstrata() {
                format!("https://127.0.0.1:{tls}")
            } else {
                tls.to_string()
            };
            out.push(t(p, format!("S3+{d}ms https"), Some(endpoint), pm, true));
        }
    }
    out
}

fn target_repo(
    b: &Bench,
    env: &Env,
    t: &Target,
    tag: &str,
    codec: &str,
    bundle: bool,
) -> Result<Repo, String> {
    let prefix = format!("bench-{tag}");
    let mut setup = if t.tool.is_pgstrata() {
        Setup {
            backup_args: vec![format!("--bundle={bundle}")],
            ..Setup::default()
        }
    } else {
        let mode = if bundle {
            pgbr_modes(&t.tool, &[PgbrMode::Bundle])[0]
        } else {
            PgbrMode::Plain
        };
        pgbr_setup(&t.tool, mode).1
    };
    setup.process_max = Some(t.process_max);
    if let Some(ep) = &t.endpoint {
        setup.remote = true;
        let ca = env.ca.as_deref();
        setup
            .settings
            .extend(repo_settings(&t.tool, ep, &prefix, ca));
    }
    Repo::new(b, &t.tool, &t.label, tag, codec, setup)
}

/// A repository of `tool` under `/prefix` of the bench bucket at `endpoint`: pgstrata's
/// TOML lines (`https://` endpoints trust `ca`), pgBackRest's `key=value` lines (it is given
/// the port alone, on 127.0.0.1, over TLS without verification).
pub(super) fn repo_settings(
    tool: &Tool,
    endpoint: &str,
    prefix: &str,
    ca: Option<&std::path::Path>,
) -> Vec<String> {
    if tool.is_pgstrata() {
        let mut s = vec![
            "repo-type = \"s3\"".to_string(),
            format!("repo-path = \"/{prefix}\""),
            format!("repo-s3-bucket = \"{BUCKET}\""),
            format!("repo-s3-endpoint = \"{endpoint}\""),
            "repo-s3-region = \"us-east-1\"".into(),
            "repo-s3-uri-style = \"path\"".into(),
            "repo-s3-key = \"test\"".into(),
            "repo-s3-key-secret = \"test\"".into(),
        ];
        if let (true, Some(ca)) = (endpoint.starts_with("https"), ca) {
            s.push(format!("repo-s3-ca-file = \"{}\"", ca.display()));
        }
        s
    } else {
        vec![
            "repo1-type=s3".to_string(),
            format!("repo1-path=/{prefix}"),
            format!("repo1-s3-bucket={BUCKET}"),
            "repo1-s3-endpoint=127.0.0.1".into(),
            format!("repo1-storage-port={endpoint}"),
            "repo1-storage-verify-tls=n".into(),
            "repo1-s3-region=us-east-1".into(),
            "repo1-s3-uri-style=path".into(),
            "repo1-s3-key=test".into(),
            "repo1-s3-key-secret=test".into(),
        ]
    }
}

/// Run one step of a target, counting its requests when it goes through the proxy.
fn step<T>(
    b: &mut Bench,
    env: &mut Env,
    t: &Target,
    f: impl FnOnce(&mut Bench) -> Result<(Measured, T), String>,
) -> Result<(Measured, T, Option<u64>, String), String> {
    let before = if t.proxied {
        Some(env.proxy.turns()?)
    } else {
        None
    };
    let (m, x) = f(b)?;
    match before {
        Some(a) => {
            let z = env.proxy.turns()?;
            Ok((m, x, Some(z - a), env.proxy.mix(a + 1, z)))
        }
        None => Ok((m, x, None, String::new())),
    }
}

/// Every object under a key prefix with its size, listed from moto directly (not counted,
/// not delayed).
pub(super) fn list_objects(moto_port: u16, prefix: &str) -> Result<Vec<(String, u64)>, String> {
    use std::io::{Read, Write};
    let (mut out, mut token) = (Vec::new(), None::<String>);
    let escape = |t: &str| {
        t.replace('%', "%25")
            .replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D")
    };
    loop {
        let mut q = format!(
            "/{BUCKET}?list-type=2&max-keys=1000&prefix={}",
            escape(prefix)
        );
        if let Some(t) = &token {
            q += &format!("&continuation-token={}", escape(t));
        }
        let mut s =
            std::net::TcpStream::connect(("127.0.0.1", moto_port)).map_err(|e| e.to_string())?;
        write!(
            s,
            "GET {q} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut body = String::new();
        s.read_to_string(&mut body).map_err(|e| e.to_string())?;
        let field = |x: &str, tag: &str| {
            x.split(&format!("<{tag}>"))
                .nth(1)
                .and_then(|v| v.split('<').next())
                .map(str::to_string)
        };
        for item in body.split("<Contents>").skip(1) {
            let key = field(item, "Key").unwrap_or_default();
            let size = field(item, "Size")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            out.push((key, size));
        }
        token = body
            .contains("<IsTruncated>true")
            .then(|| field(&body, "NextContinuationToken"))
            .flatten();
        if token.is_none() {
            return Ok(out);
        }
    }
}

fn objects(env: &Env, r: &Repo, t: &Target, tag: &str) -> Result<u64, String> {
    if t.endpoint.is_none() {
        return Ok(crate::harness::file_count(&r.backup_area()));
    }
    let area = if t.tool.is_pgstrata() {
        format!("bench-{tag}/{STANZA}/backup/")
    } else {
        format!("bench-{tag}/backup/{STANZA}/")
    };
    Ok(list_objects(env.moto_port, &area)?.len() as u64)
}

/// A CA and a server certificate for 127.0.0.1 (pgBackRest only speaks https to S3).
pub(super) fn pki(b: &Bench) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let dir = b.dir("pki")?;
    let script = "set -e
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=pgstrata bench CA' -keyout ca.key -out ca.pem -addext 'basicConstraints=critical,CA:TRUE' -addext 'keyUsage=critical,keyCertSign,cRLSign'
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj '/CN=127.0.0.1' -keyout server.key -out server.csr
printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nkeyUsage=digitalSignature,keyEncipherment\\nextendedKeyUsage=serverAuth\\n' > ext.cnf
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf -out server.pem
chmod 644 ca.pem";
    pgstrata_testkit::run_ok(Command::new("sh").arg("-c").arg(script).current_dir(&dir))?;
    Ok((
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    ))
}

pub fn run(b: &mut Bench, o: &Opts) -> Result<(), String> {
    let moto = pgstrata_testkit::S3Server::start(BUCKET)?;
    let (ca, tls) = if b.pgbackrest.is_empty() {
        (None, None)
    } else {
        let (ca, cert, key) = pki(b)?;
        (Some(ca), Some((cert, key)))
    };
    let proxy = S3Proxy::start(o.delay_ms, o.connect_delay_ms, moto.port, tls)?;
    let mut env = Env {
        moto_port: moto.port,
        proxy,
        ca,
    };
    let targets = targets(b, o, &env);
    let labels: Vec<&str> = targets.iter().map(|t| t.label.as_str()).collect();
    b.results.declare(&labels);
    b.start_cluster("max_locks_per_transaction = 1024")?;
    if o.scenarios.iter().any(|s| s == "restore") {
        restore_scenario(b, o, &mut env, &targets)?;
    }
    if o.scenarios.iter().any(|s| s == "bundling") {
        bundling_scenario(b, o, &mut env, &targets)?;
    }
    Ok(())
}

fn record(
    b: &mut Bench,
    case: &str,
    name: &str,
    t: &Target,
    m: &Measured,
    req: Option<u64>,
    mix: String,
) -> Result<(), String> {
    b.results.record(
        Row::timed(case, name, &t.label, 1, m)
            .with_count(req)
            .note(mix),
    )
}

fn restore_scenario(
    b: &mut Bench,
    o: &Opts,
    env: &mut Env,
    targets: &[Target],
) -> Result<(), String> {
    b.load_pgbench(o.scale, o.copies, "test")?;
    b.sql("VACUUM ANALYZE")?;
    b.sql("CHECKPOINT")?;
    let case = format!(
        "restore scenario, {:.0} MB",
        super::database_size(b)? as f64 / 1048576.0
    );
    let mut repos = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let r = target_repo(
            b,
            env,
            t,
            &format!("r{i}"),
            &o.codec,
            o.pgbr_bundle || t.tool.is_pgstrata(),
        )?;
        r.stanza_create(b)?;
        b.archive_to(&[r.archive_push_line()])?;
        b.wal_switch_and_wait()?;
        let (m, label, req, mix) = step(b, env, t, |b| r.backup(b, "full", &[]))?;
        record(b, &case, "full backup", t, &m, req, mix)?;
        repos.push((r, label, String::new()));
    }
    b.archive_nowhere();
    delete_ranges(b, o.scale, o.copies, o.change_pct, 0, "test")?;
    b.sql("CHECKPOINT")?;
    for (t, (r, _, incr)) in targets.iter().zip(repos.iter_mut()) {
        b.archive_to(&[r.archive_push_line()])?;
        b.wal_switch_and_wait()?;
        let (m, label, req, mix) = step(b, env, t, |b| r.backup(b, "incr", &[]))?;
        record(b, &case, "incr backup", t, &m, req, mix)?;
        *incr = label;
    }
    b.archive_nowhere();
    for (t, (r, full, incr)) in targets.iter().zip(&repos) {
        let full_dir = b.empty_data_dir("restore-full")?;
        let (m, _, req, mix) = step(b, env, t, |b| {
            Ok((r.restore(b, &full_dir, &[&format!("--set={incr}")])?, ()))
        })?;
        record(b, &case, "full restore of the incr", t, &m, req, mix)?;
        let delta_dir = b.empty_data_dir("restore-delta")?;
        r.restore(b, &delta_dir, &[&format!("--set={full}")])?;
        let (m, _, req, mix) = step(b, env, t, |b| {
            Ok((
                r.restore(b, &delta_dir, &["--delta", &format!("--set={incr}")])?,
                (),
            ))
        })?;
        record(b, &case, "delta restore of the incr", t, &m, req, mix)?;
        let _ = std::fs::remove_dir_all(&full_dir);
        let _ = std::fs::remove_dir_all(&delta_dir);
    }
    let mut drop = String::from(
        "DROP TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history",
    );
    for i in 1..=o.copies {
        drop += &format!(", test{i}");
    }
    b.sql(&drop)?;
    b.sql("CHECKPOINT")?;
    Ok(())
}

fn bundling_scenario(
    b: &mut Bench,
    o: &Opts,
    env: &mut Env,
    targets: &[Target],
) -> Result<(), String> {
    super::bundling::create_small_tables(b, o.tables, o.rows)?;
    let files = crate::harness::file_count(&b.cluster().data);
    for (i, t) in targets.iter().enumerate() {
        for bundle in [true, false] {
            let case = format!(
                "bundling scenario, {files} files, bundling {}",
                if bundle { "on" } else { "off" }
            );
            let tag = format!("b{i}-{bundle}");
            let r = target_repo(b, env, t, &tag, &o.codec, bundle)?;
            r.stanza_create(b)?;
            b.archive_to(&[r.archive_push_line()])?;
            b.sql("CHECKPOINT")?;
            b.wal_switch_and_wait()?;
            let before = objects(env, &r, t, &tag)?;
            let (m, label, req, mix) = step(b, env, t, |b| r.backup(b, "full", &[]))?;
            record(b, &case, "full backup", t, &m, req, mix)?;
            let written = objects(env, &r, t, &tag)? - before;
            b.results
                .record(Row::count(&case, "objects written", &t.label, 1, written))?;
            b.archive_nowhere();
            let dir = b.empty_data_dir("restore")?;
            let (m, _, req, mix) = step(b, env, t, |b| {
                Ok((r.restore(b, &dir, &[&format!("--set={label}")])?, ()))
            })?;
            record(b, &case, "restore", t, &m, req, mix)?;
            let _ = std::fs::remove_dir_all(&dir);
            if t.endpoint.is_none() {
                let _ = std::fs::remove_dir_all(&r.dir);
            }
        }
    }
    Ok(())
}
