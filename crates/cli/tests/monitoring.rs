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
