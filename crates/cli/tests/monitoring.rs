//! What operators watch: `--output=prometheus` read by a real Prometheus parser (Python's
//! prometheus_client), and the progress line under a real pseudo-terminal (`script`).

use crate::common::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

/// One sample as prometheus_client parsed it.
#[derive(Debug, serde::Deserialize)]
struct Sample {
    /// The type of its family (gauge, counter, ...).
    family_type: String,
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of an exposition, parsed by prometheus_client.
fn parse_prometheus(text: &str) -> Vec<Sample> {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
rows = []
for f in text_string_to_metric_families(sys.stdin.read()):
    for s in f.samples:
        rows.append({"family_type": f.type, "name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps(rows))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (run .ci/setup)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refused the output:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The one sample named `name` whose labels include `want`.
fn sample(rows: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let hits: Vec<f64> = rows
        .iter()
        .filter(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .collect();
    assert_eq!(hits.len(), 1, "{name} {want:?}: {hits:?} in {rows:?}");
    hits[0]
}

/// `pgstrata ARGS` under a pseudo-terminal (`script`), as the PostgreSQL OS user with the
/// test environment; returns everything the terminal showed.
fn on_terminal(env: &Env, args: &[&str]) -> String {
    let c = env.cmd(args);
    let line: Vec<String> = std::iter::once(c.get_program())
        .chain(c.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect();
    let mut script = Command::new("script");
    script
        .args(["-q", "-e", "-c", &line.join(" "), "/dev/null"])
        .stdin(Stdio::null());
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            script.env(k, v);
        }
    }
    let out = script.output().expect("run script (util-linux)");
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{args:?} under script: {shown}");
    shown
}

#[test]
fn prometheus_metrics_parse_and_match_info() {
    let env = Env::new("metrics");
    env.stanza_create();
    env.backup(&["--type=full"]);
    env.sql("CREATE TABLE t AS SELECT generate_series(1, 1000) AS i");
    let full = env.backup(&["--type=full"]);
    env.sql("INSERT INTO t SELECT generate_series(1, 1000)");
    env.backup(&["--type=incr"]);
    env.flush_wal();

    let info = env.info_json();
    let text = env.ok(&["--output=prometheus", "info"]);
    let rows = parse_prometheus(&text);
    let repo = env.repo.display().to_string();
    let here = [("stanza", STANZA), ("repository", repo.as_str())];
    assert!(
        rows.iter().all(|s| s.family_type == "gauge"
            && s.labels.get("stanza").map(String::as_str) == Some(STANZA)),
        "every sample is a gauge with the stanza label:\n{text}"
    );
    let typed = |t: &'static str| [here[0], here[1], ("type", t)];
    assert_eq!(sample(&rows, "pgstrata_backups", &typed("full")), 2.0);
    assert_eq!(sample(&rows, "pgstrata_backups", &typed("incr")), 1.0);
    assert_eq!(sample(&rows, "pgstrata_backups", &typed("diff")), 0.0);
    // The newest full's end time is the one info's JSON gives.
    let newest_full = info_backup(&info, &full);
    let stop = chrono::DateTime::parse_from_rfc3339(newest_full["stop_time"].as_str().unwrap())
        .unwrap()
        .timestamp() as f64;
    let end = "pgstrata_backup_newest_end_timestamp_seconds";
    assert_eq!(sample(&rows, end, &typed("full")), stop);
    let age = sample(&rows, "pgstrata_backup_newest_age_seconds", &typed("full"));
    assert!((0.0..600.0).contains(&age), "{age}");
    assert_eq!(
        sample(&rows, "pgstrata_repository_size_bytes", &here),
        info["repo_size"].as_f64().unwrap()
    );
    let newest_segment = info["archive_max"].as_str().unwrap();
    let mut segment = here.to_vec();
    segment.push(("segment", newest_segment));
    assert_eq!(
        sample(&rows, "pgstrata_archive_newest_segment_info", &segment),
        1.0
    );
    let lag = sample(&rows, "pgstrata_archive_newest_segment_age_seconds", &here);
    assert!((-5.0..600.0).contains(&lag), "{lag}");
    // One HELP and one TYPE per family (the parser would merge repeats silently).
    let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let mut distinct = types.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(types.len(), distinct.len(), "{text}");

    // verify's results, from verify itself.
    let rows = parse_prometheus(&env.ok(&["--output=prometheus", "verify"]));
    assert_eq!(sample(&rows, "pgstrata_verify_ok", &here), 1.0);
    let ok = [here[0], here[1], ("result", "ok")];
    assert_eq!(sample(&rows, "pgstrata_verify_backups", &ok), 3.0);

    // Progress: a live line with a percentage on a terminal, for backup, verify and restore;
    // nothing off a terminal (the log gets a line at most every 30 s); nothing with off.
    let shown = on_terminal(&env, &["--start-fast", "--type=full", "backup"]);
    assert!(
        shown.contains("backup: ") && shown.contains("(100%)") && shown.contains("files"),
        "{shown}"
    );
    let shown = on_terminal(&env, &["verify"]);
    assert!(
        shown.contains("verify: ") && shown.contains("(100%)"),
        "{shown}"
    );
    let target = env.scratch.join("restored");
    let pg_path = format!("--pg-path={}", target.display());
    let shown = on_terminal(&env, &[&pg_path, "--archive-mode=off", "restore"]);
    assert!(
        shown.contains("restore: ") && shown.contains("(100%)"),
        "{shown}"
    );
    let shown = on_terminal(&env, &["--progress=off", "verify"]);
    assert!(!shown.contains('%'), "{shown}");
    let out = env.cmd(&["verify"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains('%'), "{stderr}");
    let out = env.cmd(&["--progress=on", "verify"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("verify: ") && stderr.contains("(100%)"),
        "{stderr}"
    );
}

/// A notify-command script that keeps each summary and the environment it ran in, as
/// `<n>.json` and `<n>.env` in `dir`.
fn recording_hook(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    pgstrata_testkit::give_to_pg_user(dir);
    let script = dir.join("hook.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nn=$(date +%s%N)\ncat > {d}/$n.json\nenv > {d}/$n.env\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

/// The summaries the hook got, oldest first, each with its environment.
fn summaries(dir: &std::path::Path) -> Vec<(serde_json::Value, String)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| {
            let json = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
            (
                json,
                std::fs::read_to_string(p.with_extension("env")).unwrap(),
            )
        })
        .collect()
}

/// notify-command hears how backup, verify and expire ended (always, or failures only),
/// with the command's report, in an environment without pgstrata's secrets; a hook that
/// fails or hangs is logged and killed, and never changes the command's exit code.
#[test]
fn a_notify_command_hears_how_commands_ended_and_cannot_change_it() {
    let env = Env::new("notify");
    let dir = env.scratch.join("hook");
    let hook = recording_hook(&dir);
    let with_hook = |args: &[&str], on: &str| {
        let mut c = env.cmd(args);
        c.env("PGSTRATA_NOTIFY_COMMAND", &hook);
        c.env("PGSTRATA_NOTIFY_ON", on);
        c.env("AWS_SECRET_ACCESS_KEY", "a secret the hook must not see");
        c
    };
    env.stanza_create();
    env.pgbench_init(1);
    let label = run_ok(with_hook(
        &["--start-fast", "--type=full", "backup"],
        "always",
    ));
    let label = label.trim();
    let got = summaries(&dir);
    assert_eq!(got.len(), 1, "{got:?}");
    let (s, hook_env) = &got[0];
    assert_eq!(s["command"], "backup", "{s}");
    assert_eq!(s["stanza"], STANZA, "{s}");
    assert_eq!(s["result"], "ok", "{s}");
    assert_eq!(s["exit_code"], 0, "{s}");
    assert_eq!(s["report"]["label"], label, "{s}");
    assert!(
        s["report"]["stats"]["db_size"].as_u64().unwrap() > 10 << 20,
        "{s}"
    );
    assert!(s["error"].is_null(), "{s}");
    assert!(!hook_env.contains("a secret"), "{hook_env}");
    assert!(!hook_env.contains("PGSTRATA_"), "{hook_env}");

    // notify-on=failure: a verify that succeeds says nothing; one that fails does.
    run_ok(with_hook(&["verify"], "failure"));
    assert_eq!(summaries(&dir).len(), 1);
    let (code, _) = run_fail(with_hook(&["--set=20990101-000000F", "verify"], "failure"));
    let got = summaries(&dir);
    assert_eq!(got.len(), 2, "{got:?}");
    let s = &got[1].0;
    assert_eq!(
        (s["command"].as_str(), s["result"].as_str()),
        (Some("verify"), Some("failed"))
    );
    assert_eq!(s["exit_code"], code, "{s}");
    assert!(
        s["error"].as_str().unwrap().contains("20990101-000000F"),
        "{s}"
    );

    // A hook that fails, and one that hangs past notify-timeout: logged, the command's
    // own result stands.
    let failing = dir.join("failing.sh");
    std::fs::write(&failing, "#!/bin/sh\necho hook trouble >&2\nexit 3\n").unwrap();
    let hanging = dir.join("hanging.sh");
    std::fs::write(&hanging, "#!/bin/sh\nsleep 60\n").unwrap();
    for script in [&failing, &hanging] {
        std::fs::set_permissions(script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut c = env.cmd(&["--repo-retention-full=1", "expire"]);
        c.env("PGSTRATA_NOTIFY_COMMAND", script);
        c.env("PGSTRATA_NOTIFY_ON", "always");
        c.env("PGSTRATA_NOTIFY_TIMEOUT", "2s");
        c.stderr(Stdio::piped());
        let started = std::time::Instant::now();
        let out = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        assert!(stderr.contains("notify-command"), "{stderr}");
        if script == &failing {
            assert!(stderr.contains("hook trouble"), "{stderr}");
        } else {
            assert!(stderr.contains("killed"), "{stderr}");
        }
    }
}
