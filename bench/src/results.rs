//! Results: one CSV row per measurement, appended under `bench/runs/DATE/SCENARIO.csv` as it
//! is taken (a failed run keeps what it measured), with the commit, the machine and the tool
//! versions on every row; and the markdown tables rendered from those rows, both at the end
//! of a run and by `bench report`, which rewrites the README's tables between markers.
//!
//! A row is one step of one tool in one case: `seconds` for timed steps (with peak RSS and
//! CPU), `bytes` for sizes, `count` for objects or requests. The tables put cases and steps
//! in rows and tools in columns; the first tool is the reference of the ratios.

use crate::tools::Tool;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One command's cost.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub seconds: f64,
    pub max_rss_kb: u64,
    pub user: f64,
    pub sys: f64,
    pub stdout: String,
    pub stderr: String,
    /// What the scratch directory's disk did while the command ran, where it can be read.
    pub disk: Option<DiskTraffic>,
    /// Stopped at the bench's `--step-limit`: `seconds` is a lower bound.
    pub stopped_at_limit: bool,
}

pub const COLUMNS: &[&str] = &[
    "run_id",
    "commit",
    "machine",
    "scenario",
    "params",
    "case",
    "step",
    "tool",
    "tool_rank",
    "tool_version",
    "run",
    "seconds",
    "max_rss_mb",
    "user_s",
    "sys_s",
    "bytes",
    "count",
    "note",
];

#[derive(Clone, Default, Debug)]
pub struct Row {
    pub case: String,
    pub step: String,
    pub tool: String,
    pub run: u64,
    pub seconds: Option<f64>,
    pub max_rss_mb: Option<f64>,
    pub user_s: Option<f64>,
    pub sys_s: Option<f64>,
    pub bytes: Option<u64>,
    pub count: Option<u64>,
    pub note: String,
    /// `seconds` is a lower bound (the command was stopped at the step limit).
    pub stopped_at_limit: bool,
}

impl Row {
    pub fn timed(case: &str, step: &str, tool: &str, run: u64, m: &Measured) -> Row {
        Row {
            case: case.into(),
            step: step.into(),
            tool: tool.into(),
            run,
            seconds: Some(m.seconds),
            max_rss_mb: Some(m.max_rss_kb as f64 / 1024.0),
            user_s: Some(m.user),
            sys_s: Some(m.sys),
            stopped_at_limit: m.stopped_at_limit,
            ..Row::default()
        }
    }
    pub fn bytes(case: &str, step: &str, tool: &str, run: u64, bytes: Option<u64>) -> Row {
        Row {
            case: case.into(),
            step: step.into(),
            tool: tool.into(),
            run,
            bytes,
            ..Row::default()
        }
    }
    pub fn count(case: &str, step: &str, tool: &str, run: u64, count: u64) -> Row {
        Row {
            case: case.into(),
            step: step.into(),
            tool: tool.into(),
            run,
            count: Some(count),
            ..Row::default()
        }
    }
    /// A step whose result is a word ("yes", a track mode).
    pub fn text(case: &str, step: &str, tool: &str, note: &str) -> Row {
        Row {
            case: case.into(),
            step: step.into(),
            tool: tool.into(),
            run: 1,
            note: note.into(),
            ..Row::default()
        }
    }
    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }
    pub fn with_count(mut self, count: Option<u64>) -> Row {
        self.count = count;
        self
    }
}

/// How a row's note begins when its command was stopped at the step limit (the CSV has no
/// column for it: older CSVs stay readable).
const STOPPED: &str = "stopped at the step limit";

/// The rows of one invocation, as written to and read from the CSV.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub fields: BTreeMap<String, String>,
}

impl Record {
    pub fn get(&self, k: &str) -> &str {
        self.fields.get(k).map(String::as_str).unwrap_or("")
    }
    fn num(&self, k: &str) -> Option<f64> {
        self.get(k).parse().ok()
    }
}

pub struct Results {
    pub file: PathBuf,
    pub run_id: String,
    pub commit: String,
    pub machine: String,
    pub scenario: String,
    pub params: String,
    versions: BTreeMap<String, String>,
    /// Column order of the tables: the order the scenario declared its repositories in
    /// (rows arrive in rotated order).
    ranks: BTreeMap<String, usize>,
    pub records: Vec<Record>,
}

impl Results {
    pub fn create(
        out_dir: &Path,
        scenario: &str,
        params: &str,
        tools: &[&Tool],
        pg: &pgstrata_testkit::PgBin,
    ) -> Result<Results, String> {
        std::fs::create_dir_all(out_dir)
            .map_err(|e| format!("create {}: {e}", out_dir.display()))?;
        // A file written with other columns (an older harness) is left alone: SCENARIO.N.csv.
        let header = COLUMNS.join(",") + "\n";
        let file = (0..)
            .map(|n| {
                out_dir.join(if n == 0 {
                    format!("{scenario}.csv")
                } else {
                    format!("{scenario}.{n}.csv")
                })
            })
            .find(|f| std::fs::read_to_string(f).map_or(true, |t| t.starts_with(&header)))
            .expect("a free file name");
        if !file.exists() {
            std::fs::write(&file, &header).map_err(|e| e.to_string())?;
        }
        let mut versions: BTreeMap<String, String> = tools
            .iter()
            .map(|t| (t.label.clone(), t.version.clone()))
            .collect();
        versions.insert("PostgreSQL".into(), format!("{}", pg.major));
        Ok(Results {
            file,
            run_id: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            commit: commit(),
            machine: machine(out_dir),
            scenario: scenario.into(),
            params: params.into(),
            versions,
            ranks: BTreeMap::new(),
            records: Vec::new(),
        })
    }

    /// The version of a tool that is not a [`Tool`] (a PostgreSQL client program), shown
    /// in the table's tools line for columns titled `LABEL` or `LABEL (...)`.
    pub fn add_version(&mut self, label: &str, version: &str) {
        self.versions.insert(label.to_string(), version.to_string());
    }

    /// Declare table columns in this order (later declarations go after earlier ones).
    pub fn declare(&mut self, tools: &[&str]) {
        for t in tools {
            let n = self.ranks.len();
            self.ranks.entry(t.to_string()).or_insert(n);
        }
    }

    pub fn record(&mut self, row: Row) -> Result<(), String> {
        self.declare(&[&row.tool]);
        let rank = self.ranks[&row.tool].to_string();
        let f = |x: Option<f64>, p: usize| x.map(|v| format!("{v:.p$}")).unwrap_or_default();
        let version = self
            .versions
            .get(&base_tool(&row.tool))
            .cloned()
            .unwrap_or_default();
        let values = [
            self.run_id.clone(),
            self.commit.clone(),
            self.machine.clone(),
            self.scenario.clone(),
            self.params.clone(),
            row.case,
            row.step,
            row.tool,
            rank,
            version,
            row.run.to_string(),
            f(row.seconds, 3),
            f(row.max_rss_mb, 1),
            f(row.user_s, 2),
            f(row.sys_s, 2),
            row.bytes.map(|b| b.to_string()).unwrap_or_default(),
            row.count.map(|b| b.to_string()).unwrap_or_default(),
            if row.stopped_at_limit {
                format!("{STOPPED}; {}", row.note)
            } else {
                row.note
            },
        ];
        let line = values
            .iter()
            .map(|v| csv_quote(v))
            .collect::<Vec<_>>()
            .join(",")
            + "\n";
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.file)
            .and_then(|mut fh| fh.write_all(line.as_bytes()))
            .map_err(|e| format!("append to {}: {e}", self.file.display()))?;
        self.records.push(Record {
            fields: COLUMNS.iter().map(|c| c.to_string()).zip(values).collect(),
        });
        Ok(())
    }
}

/// The tool a column is about, for its version: "pgBackRest 2.45 (bundle=y)" -> "pgBackRest 2.45".
fn base_tool(col: &str) -> String {
    col.split(" (")
        .next()
        .unwrap_or(col)
        .split(" --")
        .next()
        .unwrap_or(col)
        .to_string()
}

fn csv_quote(v: &str) -> String {
    if v.contains([',', '"', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// Parse a CSV written by [`Results::record`] (quoted fields, doubled quotes, no newlines
/// inside fields except quoted ones).
pub fn read_csv(path: &Path) -> Result<Vec<Record>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let mut rows = Vec::new();
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            ('"', false) if cur.is_empty() => quoted = true,
            (',', false) => fields.push(std::mem::take(&mut cur)),
            ('\n', false) => {
                fields.push(std::mem::take(&mut cur));
                rows.push(std::mem::take(&mut fields));
            }
            (c, _) => cur.push(c),
        }
    }
    let mut it = rows.into_iter();
    let header = it
        .next()
        .ok_or_else(|| format!("{}: empty", path.display()))?;
    Ok(it
        .map(|r| Record {
            fields: header.iter().cloned().zip(r).collect(),
        })
        .collect())
}

pub fn commit() -> String {
    let root = crate::args::workspace_root();
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    format!("{head}{}", if dirty { "-dirty" } else { "" })
}

/// The device holding `dir` (`/dev/vda`), as `df` names it.
pub fn disk_device(dir: &Path) -> Option<String> {
    let out = std::process::Command::new("df")
        .arg("--output=source")
        .arg(dir)
        .output()
        .ok()?;
    let source = String::from_utf8_lossy(&out.stdout);
    Some(source.lines().last()?.trim().to_string()).filter(|d| !d.is_empty())
}

/// "2 CPUs, 23 GiB RAM, disk vda (virtio, SSD) 252G": what the numbers were measured on.
pub fn machine(dir: &Path) -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .map(str::to_string)
        })
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0);
    let sh = |c: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(c)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let dev = disk_device(dir).unwrap_or_default();
    let disk = sh(&format!(
        "lsblk -dno NAME,ROTA,SIZE,MODEL $(lsblk -no PKNAME '{dev}' 2>/dev/null | head -n1 | sed 's|^|/dev/|' | grep -v '^/dev/$' || echo '{dev}') 2>/dev/null | head -n1"
    ));
    let mut d = disk.split_whitespace();
    let disk = match (d.next(), d.next(), d.next()) {
        (Some(n), Some(rota), Some(size)) => format!(
            "disk {n} {size} {}{}",
            if rota == "1" {
                "rotational"
            } else {
                "non-rotational"
            },
            d.next().map(|m| format!(" {m}")).unwrap_or_default()
        ),
        _ => format!("disk {dev}"),
    };
    format!(
        "{cpus} CPUs, {:.0} GiB RAM, {disk}",
        mem_kb as f64 / 1048576.0
    )
}

// ------------------------------------------------------------------------------- tables

/// Markdown for the rows of one invocation: what was run, a table of best times (or sizes,
/// counts) with ratios to the first tool, and a table of peak RSS.
pub fn render(records: &[Record]) -> String {
    let Some(first) = records.first() else {
        return String::new();
    };
    let Columns {
        mut tools,
        keys,
        versions,
        context,
    } = columns(records);
    if tools.is_empty() {
        return context.concat();
    }
    // The declared order (pgstrata first: the reference of the ratios).
    let rank = |t: &String| {
        records
            .iter()
            .find(|r| r.get("tool") == t)
            .and_then(|r| r.get("tool_rank").parse::<usize>().ok())
            .unwrap_or(usize::MAX)
    };
    tools.sort_by_key(|t| (!t.starts_with("pgstrata"), rank(t)));
    let mut out = heading(records, first, &tools, &versions);
    out = out.replacen("\n\n", &format!("\n\n{}", context.concat()), 1);
    out += &tables(records, &tools, &keys);
    out += &notes(records);
    out
}

/// What [`render`]'s tables are made of.
struct Columns {
    /// The tools, in the order first seen.
    tools: Vec<String>,
    /// (case, step) of the rows, in the order first seen.
    keys: Vec<(String, String)>,
    /// Each tool's version, by its base name.
    versions: BTreeMap<String, String>,
    /// A line for each record of the source measured (not a tool's).
    context: Vec<String>,
}

fn columns(records: &[Record]) -> Columns {
    let mut c = Columns {
        tools: Vec::new(),
        keys: Vec::new(),
        versions: BTreeMap::new(),
        context: Vec::new(),
    };
    for r in records {
        if r.get("tool") == "source" {
            let v = r
                .num("bytes")
                .map(|b| format!("{:.1} MB", b / 1048576.0))
                .or_else(|| r.num("seconds").map(|s| format!("{s:.2} s")))
                .unwrap_or_else(|| r.get("count").to_string());
            let note = if r.get("note").is_empty() {
                String::new()
            } else {
                format!(" ({})", r.get("note"))
            };
            c.context
                .push(format!("- source: {} {v}{note}\n", r.get("step")));
            continue;
        }
        if !c.tools.contains(&r.get("tool").to_string()) {
            c.tools.push(r.get("tool").into());
        }
        let k = (r.get("case").to_string(), r.get("step").to_string());
        if !c.keys.contains(&k) {
            c.keys.push(k);
        }
        if !r.get("tool_version").is_empty() {
            c.versions
                .insert(base_tool(r.get("tool")), r.get("tool_version").into());
        }
    }
    c
}

/// What was run, by which tools, and how to read the tables.
fn heading(
    records: &[Record],
    first: &Record,
    tools: &[String],
    versions: &BTreeMap<String, String>,
) -> String {
    let runs = records
        .iter()
        .filter_map(|r| r.get("run").parse::<u64>().ok())
        .max()
        .unwrap_or(1);
    // Scenarios that sample every process of a tool (both hosts) say so in each timed note.
    let timed: Vec<&Record> = records
        .iter()
        .filter(|r| r.num("seconds").is_some() && r.get("tool") != "source")
        .collect();
    let all_processes = !timed.is_empty()
        && timed.iter().all(|r| {
            let note = r.get("note");
            let note = note
                .strip_prefix(STOPPED)
                .map_or(note, |n| n.trim_start_matches("; "));
            note.starts_with("all processes")
        });
    let rss = if all_processes {
        "all the tool's processes summed, sampled from /proc"
    } else {
        "largest single process (wait4)"
    };
    format!(
        "{} `{}` — {} (commit {}; {})\n\n- tools: {}\n- times: wall clock of the command, best of {runs} run(s), sync + 1 s pause before each; \
         ratio (×) = that tool / {} (> 1: {} is faster or smaller); peak RSS: {rss}\n\n",
        first.get("run_id"),
        first.get("scenario"),
        first.get("params"),
        first.get("commit"),
        first.get("machine"),
        versions.iter().map(|(k, v)| if k == v { v.clone() } else { format!("{k}: {v}") }).collect::<Vec<_>>().join("; "),
        tools[0],
        tools[0]
    )
}

/// One cell of [`render`]'s table: the value compared (best seconds, bytes, count), its
/// text, and the peak RSS of the best run.
fn cell(
    records: &[Record],
    case: &str,
    step: &str,
    tool: &str,
) -> Option<(f64, String, Option<f64>)> {
    let rs: Vec<&Record> = records
        .iter()
        .filter(|r| r.get("case") == case && r.get("step") == step && r.get("tool") == tool)
        .collect();
    let best = rs
        .iter()
        .filter(|r| r.num("seconds").is_some())
        .min_by(|a, b| a.num("seconds").partial_cmp(&b.num("seconds")).unwrap());
    if let Some(b) = best {
        let s = b.num("seconds").unwrap();
        let req = b
            .num("count")
            .map(|c| format!(", {c:.0} req"))
            .unwrap_or_default();
        let at_least = if b.get("note").starts_with(STOPPED) {
            "≥ "
        } else {
            ""
        };
        return Some((s, format!("{at_least}{s:.2} s{req}"), b.num("max_rss_mb")));
    }
    let r = rs.first()?;
    if let Some(bytes) = r.num("bytes") {
        return Some((bytes, format!("{:.2} MB", bytes / 1048576.0), None));
    }
    if let Some(c) = r.num("count") {
        return Some((c, format!("{c:.0}"), None));
    }
    (!r.get("note").is_empty()).then(|| (f64::NAN, r.get("note").to_string(), None))
}

/// The table of best values with ratios to the first tool, then the table of peak RSS.
fn tables(records: &[Record], tools: &[String], keys: &[(String, String)]) -> String {
    let mut out = format!(
        "| case | step | {} |\n|---|---|{}\n",
        tools.join(" | "),
        "---:|".repeat(tools.len())
    );
    let mut rss = String::new();
    for (case, step) in keys {
        let cells: Vec<_> = tools.iter().map(|t| cell(records, case, step, t)).collect();
        let reference = cells[0]
            .as_ref()
            .map(|c| c.0)
            .filter(|v| v.is_finite() && *v > 0.0);
        let text: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| match (c, reference) {
                (None, _) => String::new(),
                (Some((v, t, _)), Some(r)) if i > 0 && v.is_finite() => {
                    // A lower bound's ratio is one too.
                    let at_least = if t.starts_with('≥') { "≥ " } else { "" };
                    format!("{t} ({at_least}{:.2}×)", v / r)
                }
                (Some((_, t, _)), _) => t.clone(),
            })
            .collect();
        out += &format!("| {case} | {step} | {} |\n", text.join(" | "));
        if cells
            .iter()
            .any(|c| c.as_ref().is_some_and(|c| c.2.is_some()))
        {
            let r: Vec<String> = cells
                .iter()
                .map(|c| {
                    c.as_ref()
                        .and_then(|c| c.2)
                        .map(|m| format!("{m:.0}"))
                        .unwrap_or_default()
                })
                .collect();
            rss += &format!("| {case} | {step} | {} |\n", r.join(" | "));
        }
    }
    if !rss.is_empty() {
        out += &format!(
            "\nPeak RSS, MB (of the best run):\n\n| case | step | {} |\n|---|---|{}\n{rss}",
            tools.join(" | "),
            "---:|".repeat(tools.len())
        );
    }
    out
}

/// The notes of the measured rows, one a line.
fn notes(records: &[Record]) -> String {
    let notes: Vec<String> = records
        .iter()
        .filter(|r| {
            !r.get("note").is_empty()
                && r.get("tool") != "source"
                && (r.num("seconds").is_some()
                    || r.num("bytes").is_some()
                    || r.num("count").is_some())
        })
        .map(|r| {
            format!(
                "- {} / {} / {} (run {}): {}",
                r.get("case"),
                r.get("step"),
                r.get("tool"),
                r.get("run"),
                r.get("note")
            )
        })
        .collect();
    if notes.is_empty() {
        return String::new();
    }
    format!("\nNotes:\n\n{}\n", notes.join("\n"))
}

/// The MB/s table of the latest limits measurement (`bench limits`).
pub fn render_limits(rows: &[Record]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut out = format!(
        "{} — {} ({})\n\n| what | step | MB/s | × cores | note |\n|---|---|---:|---:|---|\n",
        first.get("run_id"),
        first.get("params"),
        first.get("machine")
    );
    for r in rows {
        let (s, b): (f64, f64) = (
            r.get("seconds").parse().unwrap_or(0.0),
            r.get("bytes").parse().unwrap_or(0.0),
        );
        let rate = if s > 0.0 { b / 1048576.0 / s } else { 0.0 };
        let cores: f64 = r.get("count").parse().unwrap_or(0.0);
        let all = if cores > 0.0 {
            format!("{:.0}", rate * cores)
        } else {
            String::new()
        };
        out += &format!(
            "| {} | {} | {rate:.0} | {all} | {} |\n",
            r.get("case"),
            r.get("step"),
            r.get("note")
        );
    }
    out
}

/// The last invocation's rows of each scenario found under `runs_dir`.
pub fn latest(runs_dir: &Path) -> Result<BTreeMap<String, Vec<Record>>, String> {
    let mut by_scenario: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs_dir)
        .map_err(|e| format!("read {}: {e}", runs_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&d)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect();
        files.sort();
        for f in files {
            for r in read_csv(&f)? {
                by_scenario
                    .entry(r.get("scenario").to_string())
                    .or_default()
                    .push(r);
            }
        }
    }
    for rows in by_scenario.values_mut() {
        let last = rows
            .iter()
            .map(|r| r.get("run_id").to_string())
            .max()
            .unwrap_or_default();
        rows.retain(|r| r.get("run_id") == last);
    }
    Ok(by_scenario)
}

/// Replace the text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` in the README
/// with each scenario's latest table. Returns the names updated.
pub fn rewrite_readme(readme: &Path, runs_dir: &Path) -> Result<Vec<String>, String> {
    let mut text =
        std::fs::read_to_string(readme).map_err(|e| format!("read {}: {e}", readme.display()))?;
    let mut updated = Vec::new();
    for (scenario, rows) in latest(runs_dir)? {
        let (open, close) = (
            format!("<!-- bench:{scenario} -->"),
            format!("<!-- /bench:{scenario} -->"),
        );
        let (Some(a), Some(b)) = (text.find(&open), text.find(&close)) else {
            eprintln!(
                "[bench] report: no markers {open} ... {close} in {}",
                readme.display()
            );
            continue;
        };
        let body = if scenario == "limits" {
            render_limits(&rows)
        } else {
            render(&rows)
        };
        text = format!("{}{open}\n{body}\n{}", &text[..a], &text[b..]);
        updated.push(scenario);
    }
    std::fs::write(readme, text).map_err(|e| format!("write {}: {e}", readme.display()))?;
    Ok(updated)
}

/// Bytes a disk read and wrote and the milliseconds it was busy (`/proc/diskstats`):
/// whether a step was bound by the disk, and by how much of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskTraffic {
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub busy_ms: u64,
}

impl DiskTraffic {
    /// The counters of `device` ([`disk_device`]: a disk or partition).
    pub fn now(device: &str) -> Option<DiskTraffic> {
        let name = device.strip_prefix("/dev/")?;
        let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
        // Fields: major minor name, then reads completed, merged, sectors read, ms reading,
        // writes completed, merged, sectors written, ms writing, in flight, ms doing I/O.
        let fields: Vec<u64> = stats
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&name))?[3..]
            .iter()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        Some(DiskTraffic {
            read_bytes: fields.get(2)? * 512,
            written_bytes: fields.get(6)? * 512,
            busy_ms: *fields.get(9)?,
        })
    }

    /// What happened between `before` and these counters.
    pub fn since(&self, before: &DiskTraffic) -> DiskTraffic {
        DiskTraffic {
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            written_bytes: self.written_bytes.saturating_sub(before.written_bytes),
            busy_ms: self.busy_ms.saturating_sub(before.busy_ms),
        }
    }

    /// "R MB read + W MB written (X MB/s together), busy B %" over `seconds`.
    pub fn describe(&self, seconds: f64) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        format!(
            "disk: {:.0} MB read + {:.0} MB written ({:.0} MB/s together), busy {:.0} %",
            mb(self.read_bytes),
            mb(self.written_bytes),
            mb(self.read_bytes + self.written_bytes) / seconds.max(1e-6),
            self.busy_ms as f64 / 10.0 / seconds.max(1e-6)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(dir: &Path) -> Results {
        Results {
            file: dir.join("t.csv"),
            run_id: "2026-01-01T00:00:00Z".into(),
            commit: "abc".into(),
            machine: "2 CPUs".into(),
            scenario: "t".into(),
            params: "scale=1, copies=2".into(),
            versions: BTreeMap::new(),
            ranks: BTreeMap::new(),
            records: Vec::new(),
        }
    }

    #[test]
    fn rows_survive_the_csv_and_the_table_puts_the_declared_order_first() {
        let dir = std::env::temp_dir().join(format!("bench-results-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = results(&dir);
        std::fs::write(&r.file, COLUMNS.join(",") + "\n").unwrap();
        r.declare(&["pgstrata", "pgBackRest 2.45 (bundle=n)"]);
        let m = Measured {
            seconds: 4.0,
            max_rss_kb: 2048,
            ..Default::default()
        };
        r.record(
            Row::timed("zst", "restore", "pgBackRest 2.45 (bundle=n)", 1, &m)
                .note("a \"quoted\", note"),
        )
        .unwrap();
        let m = Measured {
            seconds: 2.0,
            max_rss_kb: 1024,
            ..Default::default()
        };
        r.record(Row::timed("zst", "restore", "pgstrata", 1, &m))
            .unwrap();
        let back = read_csv(&r.file).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].get("note"), "a \"quoted\", note");
        assert_eq!(back[0].get("params"), "scale=1, copies=2");
        let table = render(&back);
        assert!(
            table.contains("| zst | restore | 2.00 s | 4.00 s (2.00×) |"),
            "pgstrata first, the peer with its ratio:\n{table}"
        );
        assert!(
            table.contains("| zst | restore | 1 | 2 |"),
            "peak RSS in MB:\n{table}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_command_stopped_at_the_step_limit_is_shown_as_a_lower_bound() {
        let dir = std::env::temp_dir().join(format!("bench-limit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = results(&dir);
        std::fs::write(&r.file, COLUMNS.join(",") + "\n").unwrap();
        r.declare(&["pgstrata", "peer"]);
        let done = Measured {
            seconds: 10.0,
            ..Default::default()
        };
        let stopped = Measured {
            seconds: 600.0,
            stopped_at_limit: true,
            ..Default::default()
        };
        r.record(Row::timed("c", "restore", "pgstrata", 1, &done))
            .unwrap();
        r.record(Row::timed("c", "restore", "peer", 1, &stopped).note("12 req"))
            .unwrap();
        let back = read_csv(&r.file).unwrap();
        assert_eq!(back[1].get("note"), "stopped at the step limit; 12 req");
        let table = render(&back);
        assert!(
            table.contains("| c | restore | 10.00 s | ≥ 600.00 s (≥ 60.00×) |"),
            "{table}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn readme_tables_are_replaced_between_markers_only() {
        let dir = std::env::temp_dir().join(format!("bench-readme-test-{}", std::process::id()));
        let runs = dir.join("runs/2026-01-01");
        std::fs::create_dir_all(&runs).unwrap();
        let mut r = results(&runs);
        r.file = runs.join("t.csv");
        std::fs::write(&r.file, COLUMNS.join(",") + "\n").unwrap();
        r.record(Row::bytes(
            "zst",
            "backup size",
            "pgstrata",
            1,
            Some(3 << 20),
        ))
        .unwrap();
        let readme = dir.join("README.md");
        std::fs::write(
            &readme,
            "before\n<!-- bench:t -->\nold table\n<!-- /bench:t -->\nafter\n",
        )
        .unwrap();
        assert_eq!(
            rewrite_readme(&readme, &dir.join("runs")).unwrap(),
            vec!["t".to_string()]
        );
        let text = std::fs::read_to_string(&readme).unwrap();
        assert!(
            text.starts_with("before\n<!-- bench:t -->\n")
                && text.ends_with("<!-- /bench:t -->\nafter\n"),
            "{text}"
        );
        assert!(
            !text.contains("old table") && text.contains("| zst | backup size | 3.00 MB |"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
