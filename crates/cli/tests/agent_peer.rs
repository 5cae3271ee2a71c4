//! The agents as a hostile peer meets them: raw protocol frames written to the real
//! `pgstrata agent` process (what a compromised host can send through its SSH key), and
//! what each one does with them. The database host's `agent run` does only a backup
//! host's three jobs, with its own settings; the backup host's `agent repo` serves only
//! its stanzas, append-only; neither holds more than its buffer for a peer that does not
//! read.

use crate::common::*;
use pgstrata_remote::protocol::{
    self, Answer, Done, FailureKind, Hello, Job, JobKind, Message, Op, Request,
};
use pgstrata_testkit::Scratch;
use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A started agent with its stdin and stdout, hellos exchanged.
struct Peer {
    child: Child,
    to: ChildStdin,
    from: ChildStdout,
}

/// `pgstrata ARGS` started with its stdin, stdout and stderr piped to us.
fn spawn_piped(args: &[&str]) -> Child {
    Command::new(exe())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

impl Peer {
    fn start(args: &[&str]) -> Peer {
        let mut child = spawn_piped(args);
        let mut to = child.stdin.take().unwrap();
        let mut from = child.stdout.take().unwrap();
        to.write_all(&protocol::frame(&Message::Hello(Hello::ours()), b""))
            .unwrap();
        match protocol::read_frame(&mut from).unwrap() {
            Some((Message::Hello(_), _)) => {}
            other => panic!("no hello: {other:?}"),
        }
        Peer { child, to, from }
    }

    fn send(&mut self, m: &Message, body: &[u8]) {
        self.to.write_all(&protocol::frame(m, body)).unwrap();
    }

    fn ask(&mut self, op: Op, key: &str, to: Option<&str>, create_only: bool) -> Answer {
        let req = Request {
            id: 1,
            to: to.map(str::to_string),
            create_only,
            ..Request::new(op, key)
        };
        self.send(&Message::Request(req), b"FORGED");
        match protocol::read_frame(&mut self.from).unwrap() {
            Some((Message::Answer(a), _)) => a,
            other => panic!("{other:?}"),
        }
    }

    /// Close the stream; the agent's exit status and stderr.
    fn finish(self) -> (std::process::ExitStatus, String) {
        let Peer {
            child, to, from, ..
        } = self;
        drop((to, from));
        let out = child.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn denied(a: &Answer) -> bool {
    a.error
        .as_ref()
        .is_some_and(|e| e.kind == FailureKind::PermissionDenied)
}

/// Every file under `dir` and its bytes.
fn contents(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    tree(dir)
        .into_keys()
        .filter(|k| !k.ends_with('/'))
        .map(|k| {
            let bytes = std::fs::read(dir.join(&k)).unwrap();
            (k, bytes)
        })
        .collect()
}

/// A repository with two stanzas, as a backup host holds it.
fn two_stanza_repo(dir: &Path) {
    for (k, v) in [
        ("main/backup/20261101-010000F/backup.manifest", "MANIFEST"),
        (
            "main/backup/20261101-010000F/backup.manifest.copy",
            "MANIFEST",
        ),
        ("main/stanza.json", "MAIN"),
        ("other/stanza.json", "OTHER"),
        (
            "other/backup/20261101-010000F/backup.manifest",
            "OTHER-MANIFEST",
        ),
    ] {
        let p = dir.join(k);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, v).unwrap();
    }
}

/// `agent repo` for stanza `main`, driven as a compromised database host would: every
/// overwrite, delete and read outside `main` is refused and changes nothing; `/etc` is
/// out of reach even with `--repo-path=/`; what a backup needs (create, read, delete
/// what it created) works. Without `--stanza` the agent does not start.
#[test]
fn agent_repo_serves_its_stanzas_append_only() {
    let scratch = Scratch::new("agent-repo-hostile");
    let repo = scratch.join("repo");
    two_stanza_repo(&repo);
    let before = contents(&repo);
    let repo_arg = format!("--repo-path={}", repo.display());

    let unscoped = Command::new(exe())
        .args(["agent", "repo", &repo_arg])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(unscoped.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&unscoped.stderr).contains("--stanza=NAME"),
        "{}",
        String::from_utf8_lossy(&unscoped.stderr)
    );

    let mut peer = Peer::start(&["agent", "repo", "--stanza=main", &repo_arg]);
    let manifest = "main/backup/20261101-010000F/backup.manifest";
    let forbidden: &[(Op, &str, Option<&str>, bool)] = &[
        (Op::Put, manifest, None, false),
        (Op::Put, "main/stanza.json", None, false),
        (Op::Delete, manifest, None, false),
        (Op::Delete, &format!("{manifest}.copy"), None, false),
        (Op::Delete, "other/stanza.json", None, false),
        (
            Op::Delete,
            "other/backup/20261101-010000F/backup.manifest",
            None,
            false,
        ),
        (Op::Put, "other/stanza.json", None, true),
        (Op::Copy, "main/stanza.json", Some(manifest), false),
        (Op::Get, "other/stanza.json", None, false),
        (Op::List, "other", None, false),
    ];
    for &(op, key, to, create_only) in forbidden {
        let a = peer.ask(op, key, to, create_only);
        assert!(denied(&a), "{op:?} {key} was not refused: {a:?}");
    }
    let all = peer.ask(Op::List, "", None, false);
    assert!(
        all.objects.iter().all(|m| m.key.starts_with("main/")) && all.objects.len() == 3,
        "{:?}",
        all.objects
    );
    // What a backup does: create, read, and delete its own lock.
    assert!(peer.ask(Op::Put, "main/lock", None, true).error.is_none());
    assert!(peer.ask(Op::Get, manifest, None, false).error.is_none());
    assert!(peer
        .ask(Op::Delete, "main/lock", None, false)
        .error
        .is_none());
    let (status, err) = peer.finish();
    assert!(status.success(), "{err}");
    assert!(err.contains("append-only"), "refusals are logged: {err}");
    assert_eq!(
        contents(&repo),
        before,
        "a refused request changed the repository"
    );

    // Without a forced command the peer might choose the repository path; its stanzas
    // still bound what it reaches.
    let mut peer = Peer::start(&["agent", "repo", "--stanza=main", "--repo-path=/"]);
    for key in ["etc/passwd", "main/../etc/passwd", "../etc/passwd"] {
        let a = peer.ask(Op::Get, key, None, false);
        assert!(a.error.is_some(), "{key} was served");
    }
    peer.finish();
}

/// A job for `agent run`: a backup host's request, with `choices`.
fn job(kind: JobKind, stanza: &str, choices: &[(&str, &str)]) -> Message {
    Message::Job(Job {
        job: kind,
        stanza: stanza.into(),
        choices: choices
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        sealing: None,
    })
}

/// The first frame `agent run` answers a job with, which for a refused job is `done`
/// (it asked nothing of the repository).
fn done_of(peer: &mut Peer) -> Done {
    match protocol::read_frame(&mut peer.from).unwrap() {
        Some((Message::Done(d), _)) => d,
        other => panic!("the agent did not refuse at once: {other:?}"),
    }
}

/// `agent run`, driven as a compromised backup host would: a choice that is the database
/// host's to make (its data directory, its config file, its ssh client, its passphrase),
/// a stanza it does not serve, a job it does not do, or a command line (the old `run`
/// message) is refused before anything runs, and the refusal quotes nothing of a file.
#[test]
fn agent_run_does_a_backup_hosts_jobs_and_nothing_else() {
    let scratch = Scratch::new("agent-run-hostile");
    let secret_file = scratch.join("pgpass");
    std::fs::write(&secret_file, "db1:5432:*:postgres:TOP-SECRET-PASSWORD\n").unwrap();
    let marker = scratch.join("MARKER");
    let config = scratch.join("db-host.toml");
    std::fs::write(
        &config,
        format!(
            "[global]\nlog-level-file = \"off\"\n[main]\npg-path = \"{}\"\npg-host = \"/nonexistent\"\n",
            scratch.join("no-cluster").display()
        ),
    )
    .unwrap();
    let config_arg = format!("--config={}", config.display());
    let forged: Vec<(Message, &str)> = vec![
        (
            job(
                JobKind::Check,
                "main",
                &[("config", &secret_file.display().to_string())],
            ),
            "'config'",
        ),
        (
            job(JobKind::Backup, "main", &[("pg-path", "/etc")]),
            "'pg-path'",
        ),
        (
            job(
                JobKind::Check,
                "main",
                &[("cmd-ssh", &format!("/bin/touch {}", marker.display()))],
            ),
            "'cmd-ssh'",
        ),
        (
            job(JobKind::Backup, "main", &[("repo-cipher-pass", "x")]),
            "'repo-cipher-pass'",
        ),
        (
            job(JobKind::Backup, "main", &[("standby-remote", "evil")]),
            "'standby-remote'",
        ),
        (
            job(JobKind::Backup, "main", &[("repo1-path", "/")]),
            "'repo1-path'",
        ),
        (job(JobKind::Backup, "other", &[]), "works for main only"),
        (job(JobKind::Backup, "../../tmp", &[]), "is not allowed"),
        (
            job(JobKind::Backup, "main", &[("process-max", "100000")]),
            "process-max",
        ),
    ];
    for (message, why) in forged {
        let mut peer = Peer::start(&["agent", "run", &config_arg, "--stanza=main"]);
        peer.send(&message, b"");
        let done = done_of(&mut peer);
        let error = done.error.clone().unwrap_or_default();
        assert_eq!(done.exit_code, 2, "{message:?}: {done:?}");
        assert!(error.contains(why), "{message:?}: {error}");
        assert!(!error.contains("TOP-SECRET"), "a file was quoted: {error}");
        let (status, err) = peer.finish();
        assert!(status.success(), "{err}");
    }
    assert!(!marker.exists(), "the backup host ran a command here");

    // A command line, as protocol 2 carried it, or a job this agent does not know.
    for header in [
        r#"{"msg":"run","args":["archive-get","00000002.history","postgresql.auto.conf"],"env":[]}"#,
        r#"{"msg":"job","job":"restore","stanza":"main","choices":[]}"#,
    ] {
        let mut child = spawn_piped(&["agent", "run", &config_arg]);
        let mut to = child.stdin.take().unwrap();
        let mut frames = protocol::frame(&Message::Hello(Hello::ours()), b"");
        frames.extend((4 + header.len() as u32).to_le_bytes());
        frames.extend((header.len() as u32).to_le_bytes());
        frames.extend(header.as_bytes());
        to.write_all(&frames).unwrap();
        drop(to);
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{header} was taken");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("agent protocol"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!scratch.join("postgresql.auto.conf").exists());
}

/// Peak resident memory of `pid` in KiB (VmHWM).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// A peer that asks for a 16 MiB object 80 times without reading the answers: the agent
/// holds at most its buffer (`agent-buffer-max`), not 80 objects; once the peer reads,
/// every answer arrives whole.
#[test]
fn agent_repo_memory_is_bounded_whatever_the_peer_sends() {
    let scratch = Scratch::new("agent-repo-memory");
    let repo = scratch.join("repo");
    std::fs::create_dir_all(repo.join("main")).unwrap();
    let object: Vec<u8> = (0..16u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(repo.join("main/big"), &object).unwrap();
    let mut peer = Peer::start(&[
        "agent",
        "repo",
        "--stanza=main",
        &format!("--repo-path={}", repo.display()),
        "--agent-buffer-max=64MiB",
    ]);
    let pid = peer.child.id();
    for id in 0..80 {
        let req = Request {
            id,
            ..Request::new(Op::Get, "main/big")
        };
        peer.send(&Message::Request(req), b"");
    }
    // Give it time to fill whatever it would fill.
    let settle = Instant::now() + Duration::from_secs(4);
    while Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(200));
    }
    let peak_mib = peak_rss_kib(pid) / 1024;
    // 64 MiB of answers, one more object being read past the budget's clamp at most, and
    // the process itself.
    assert!(
        peak_mib < 64 + 16 + 48,
        "the agent grew to {peak_mib} MiB for a peer that does not read"
    );
    let mut answers = 0;
    let mut buf = std::io::BufReader::new(&mut peer.from);
    while answers < 80 {
        match protocol::read_frame(&mut buf).unwrap() {
            Some((Message::Answer(a), body)) => {
                assert!(a.error.is_none(), "{a:?}");
                assert_eq!(body.len(), object.len());
                answers += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    drop(buf);
    let (status, err) = peer.finish();
    assert!(status.success(), "{err}");
}
