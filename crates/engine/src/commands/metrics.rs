//! `--output=prometheus`: info and verify in Prometheus' text exposition format, for
//! node_exporter's textfile collector or any job that publishes a file.
//!
//! pgstrata runs no server: a cron job or systemd timer writes the output to a `.prom` file
//! (see the README). Every family has one HELP and one TYPE line; every sample carries the
//! `stanza` and `repository` labels (the repository's path or URL, never a credential),
//! per-type families also `type`. All families are gauges: they describe the repository when
//! the command ran (`pgstrata_metrics_timestamp_seconds`), so a stale file shows.
//!
//! What the repository can tell, and so what is exported: per backup type the newest
//! backup's end time, age, duration and sizes, and the backup count; the repository's size;
//! the newest archived WAL segment, when it was stored and its age (the archive lag as far as
//! the repository knows: how far the server's current WAL is ahead lives in pg_wal, on the
//! database host, which info does not read). verify records no results in the repository,
//! so its results are exported by `verify --output=prometheus` itself.

use crate::reports::{StanzaReport, VerifyReport};
use pgstrata_repo::manifest::BackupType;
use pgstrata_repo::Named;
use std::fmt::Write;

/// Label pairs of one sample.
type Labels<'a> = Vec<(&'a str, String)>;

/// An exposition being written: families in order, each with its HELP and TYPE once.
struct Exposition<'a> {
    out: String,
    /// The labels every sample carries.
    common: Labels<'a>,
}

impl<'a> Exposition<'a> {
    fn new(stanza: &str, repository: &str) -> Exposition<'a> {
        Exposition {
            out: String::new(),
            common: vec![("stanza", stanza.into()), ("repository", repository.into())],
        }
    }

    /// One gauge family with its samples (extra labels, value); nothing when it has none.
    fn gauge(&mut self, name: &str, help: &str, samples: &[(Labels, f64)]) {
        if samples.is_empty() {
            return;
        }
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} gauge");
        for (extra, value) in samples {
            let labels: Vec<String> = self
                .common
                .iter()
                .chain(extra)
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = writeln!(self.out, "{name}{{{}}} {value}", labels.join(","));
        }
    }

    /// A family of one sample with only the common labels.
    fn single(&mut self, name: &str, help: &str, value: f64) {
        self.gauge(name, help, &[(vec![], value)]);
    }
}

/// Several expositions (one per repository) as one: each family's HELP and TYPE once,
/// followed by its samples from every part, as the text format requires.
pub fn merge_expositions(parts: &[String]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut families: std::collections::HashMap<String, (Vec<String>, Vec<String>)> =
        std::collections::HashMap::new();
    for part in parts {
        let mut current = String::new();
        for line in part.lines() {
            let header = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "));
            let family = match header {
                Some(rest) => rest.split(' ').next().unwrap_or_default().to_string(),
                None => line
                    .split(['{', ' '])
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            };
            if family != current {
                current = family.clone();
            }
            let entry = families.entry(current.clone()).or_insert_with(|| {
                order.push(current.clone());
                (Vec::new(), Vec::new())
            });
            match header {
                Some(_) if entry.0.len() < 2 && !entry.0.contains(&line.to_string()) => {
                    entry.0.push(line.to_string())
                }
                Some(_) => {}
                None => entry.1.push(line.to_string()),
            }
        }
    }
    let mut out = String::new();
    for f in order {
        let (headers, samples) = &families[&f];
        for l in headers.iter().chain(samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

/// info's report as metrics, ages counted up to `now` (unix seconds).
pub fn render_info(r: &StanzaReport, now: i64) -> String {
    let mut x = Exposition::new(&r.stanza, &r.repository);
    x.single(
        "pgstrata_metrics_timestamp_seconds",
        "When these metrics were taken (unix time).",
        now as f64,
    );
    let mut count = Vec::new();
    let mut newest = Vec::new();
    for t in BackupType::NAMES {
        let of_type: Vec<_> = r.backups.iter().filter(|b| b.backup_type == *t).collect();
        count.push((vec![("type", t.to_string())], of_type.len() as f64));
        if let Some(b) = of_type.into_iter().max_by_key(|b| (b.stop_epoch, &b.label)) {
            newest.push((vec![("type", t.to_string())], b));
        }
    }
    x.gauge(
        "pgstrata_backups",
        "Backups in the repository, per type.",
        &count,
    );
    let per_newest = |value: &dyn Fn(&crate::reports::BackupInfo) -> f64| -> Vec<(Labels, f64)> {
        newest.iter().map(|(l, b)| (l.clone(), value(b))).collect()
    };
    x.gauge(
        "pgstrata_backup_newest_end_timestamp_seconds",
        "When the newest backup of the type ended (unix time).",
        &per_newest(&|b| b.stop_epoch as f64),
    );
    x.gauge(
        "pgstrata_backup_newest_age_seconds",
        "Seconds from the end of the newest backup of the type to when these metrics were taken.",
        &per_newest(&|b| (now - b.stop_epoch) as f64),
    );
    x.gauge(
        "pgstrata_backup_newest_duration_seconds",
        "How long the newest backup of the type took.",
        &per_newest(&|b| (b.stop_epoch - b.start_epoch) as f64),
    );
    x.gauge(
        "pgstrata_backup_newest_database_size_bytes",
        "Size of the cluster the newest backup of the type holds.",
        &per_newest(&|b| b.database_size as f64),
    );
    x.gauge(
        "pgstrata_backup_newest_stored_size_bytes",
        "Bytes the newest backup of the type stored (its new data, compressed).",
        &per_newest(&|b| b.stored_size as f64),
    );
    x.gauge(
        "pgstrata_backup_newest_page_errors",
        "Page checksum errors the newest backup of the type found in the cluster.",
        &per_newest(&|b| b.page_errors as f64),
    );
    x.single(
        "pgstrata_backups_damaged",
        "Backups whose manifest and its copy are both damaged (they cannot be restored).",
        r.damaged.len() as f64,
    );
    x.single(
        "pgstrata_repository_size_bytes",
        "Bytes of all objects of the stanza (packs, manifests, WAL).",
        r.repo_size as f64,
    );
    x.single(
        "pgstrata_repository_held_size_bytes",
        "Bytes in packs that kept backups reference only in part.",
        r.held_size as f64,
    );
    archive_metrics(&mut x, r, now);
    vanished_metrics(&mut x, &r.vanished);
    x.out
}

/// The WAL archive: its newest segment, when it was stored, its age.
fn archive_metrics(x: &mut Exposition, r: &StanzaReport, now: i64) {
    x.single(
        "pgstrata_archive_empty",
        "1 when the stanza's WAL archive holds no segment.",
        if r.archive_max.is_some() { 0.0 } else { 1.0 },
    );
    x.single(
        "pgstrata_archive_gaps",
        "Holes in the WAL archive after the oldest backup's start (point-in-time recovery cannot cross one).",
        r.archive_gaps.len() as f64,
    );
    if let Some(lag) = &r.archive_lag {
        x.single(
            "pgstrata_archive_ready_files",
            "WAL files PostgreSQL has marked ready to archive and not yet archived (pg_wal/archive_status/*.ready).",
            lag.ready as f64,
        );
        x.single(
            "pgstrata_archive_ready_not_in_repository",
            "Ready WAL segments this repository does not hold yet.",
            lag.ready_not_in_repo as f64,
        );
        x.single(
            "pgstrata_archive_oldest_ready_age_seconds",
            "Seconds the oldest WAL file waiting to be archived has waited (0 when none waits).",
            lag.oldest_ready_age_secs.unwrap_or(0) as f64,
        );
    }
    if let Some(w) = &r.wal_receiver {
        x.single(
            "pgstrata_wal_receive_lag_bytes",
            "Bytes of WAL the server had written that this host's wal-receive had not yet stored in every repository, when it last reported.",
            w.lag_bytes as f64,
        );
    }
    if let Some(w) = &r.wal_receiving {
        x.single(
            "pgstrata_wal_receive_last_flush_seconds",
            "Seconds since wal-receive last wrote the segment it is receiving (the storage's clock).",
            (now - w.written) as f64,
        );
    }
    let Some((segment, stored)) = r.archive_max.as_ref().zip(r.archive_max_time) else {
        return;
    };
    x.gauge(
        "pgstrata_archive_newest_segment_info",
        "The newest archived WAL segment (its name in the segment label).",
        &[(vec![("segment", segment.clone())], 1.0)],
    );
    x.single(
        "pgstrata_archive_newest_segment_timestamp_seconds",
        "When the newest archived WAL segment was stored (unix time, the storage's clock).",
        stored as f64,
    );
    x.single(
        "pgstrata_archive_newest_segment_age_seconds",
        "Seconds from the storing of the newest archived WAL segment to when these metrics were taken (the archive's lag as the repository sees it).",
        (now - stored) as f64,
    );
}

/// What vanished (`vanished`), from info (verify's vanished findings show in
/// `pgstrata_verify_ok`: a textfile collector refuses one metric from two files).
fn vanished_metrics(x: &mut Exposition, v: &crate::vanished::Vanished) {
    x.single(
        "pgstrata_vanished_backups",
        "Backups gone from the repository without an expire record naming them (deleted by someone other than expire).",
        v.backups.len() as f64,
    );
    x.single(
        "pgstrata_vanished_wal_segments",
        "Archived WAL segments gone without an expire record naming them.",
        v.wal.len() as f64,
    );
    x.single(
        "pgstrata_expire_records_refused",
        "Expire records that failed to open or were stored under another name (forged or replayed).",
        v.refused_records.len() as f64,
    );
}

/// verify's report as metrics, taken at `now` (unix seconds).
pub fn render_verify(r: &VerifyReport, now: i64) -> String {
    let mut x = Exposition::new(&r.stanza, &r.repository);
    x.single(
        "pgstrata_verify_timestamp_seconds",
        "When verify finished (unix time).",
        now as f64,
    );
    x.single(
        "pgstrata_verify_ok",
        "1 when verify found every backup valid, every manifest object and its copy intact, and the WAL archive undamaged and without gaps.",
        if r.ok { 1.0 } else { 0.0 },
    );
    let invalid = r.backups.iter().filter(|b| !b.ok).count();
    x.gauge(
        "pgstrata_verify_backups",
        "Backups verify checked, by result.",
        &[
            (
                vec![("result", "ok".into())],
                (r.backups.len() - invalid) as f64,
            ),
            (vec![("result", "invalid".into())], invalid as f64),
        ],
    );
    x.single(
        "pgstrata_verify_read_bytes",
        "Bytes of backup file content verify read back and checked.",
        r.backups.iter().map(|b| b.bytes_read).sum::<u64>() as f64,
    );
    x.single(
        "pgstrata_verify_damaged_objects",
        "Manifests, manifest parts and their copies that are missing or fail their check, those whose twin is intact included.",
        r.damaged_objects.len() as f64,
    );
    x.single(
        "pgstrata_verify_wal_segments",
        "Archived WAL segments verify checked.",
        r.wal.segments as f64,
    );
    x.single(
        "pgstrata_verify_wal_damaged",
        "Archived WAL objects that failed their checksum.",
        r.wal.damaged.len() as f64,
    );
    x.single(
        "pgstrata_verify_wal_gaps",
        "Holes in the WAL archive after the oldest backup's start.",
        r.wal.gaps.len() as f64,
    );
    x.out
}

/// `instant-status --output=prometheus`: an instant restore's hydration, labelled with
/// its data directory.
pub fn render_instant(s: &crate::instant::Status, pg_path: &std::path::Path, now: i64) -> String {
    let mut x = Exposition {
        out: String::new(),
        common: vec![("data_directory", pg_path.display().to_string())],
    };
    x.single(
        "pgstrata_metrics_timestamp_seconds",
        "When these values were read (Unix time).",
        now as f64,
    );
    x.single(
        "pgstrata_instant_bytes_local",
        "Bytes of the deferred relation files that are local (fetched or written by PostgreSQL).",
        s.bytes_local as f64,
    );
    x.single(
        "pgstrata_instant_bytes_total",
        "Bytes of the deferred relation files in all.",
        s.bytes_total as f64,
    );
    x.single(
        "pgstrata_instant_fetches_on_demand_total",
        "Reads by PostgreSQL that waited for a fetch from the repository.",
        s.on_demand_fetches as f64,
    );
    x.single(
        "pgstrata_instant_on_demand_latency_seconds",
        "Mean time such a read waited.",
        s.on_demand_latency_ms / 1000.0,
    );
    x.single(
        "pgstrata_instant_failed",
        "1 when hydration stopped on an error (instant-status names the file), else 0.",
        f64::from(u8::from(s.state == "failed")),
    );
    x.single(
        "pgstrata_instant_status_age_seconds",
        "Seconds since the serving process last wrote its status (grows when it is gone).",
        (now - s.updated).max(0) as f64,
    );
    x.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reports::BackupInfo;

    fn backup(label: &str, t: &str, start: i64, stop: i64) -> BackupInfo {
        BackupInfo {
            label: label.into(),
            backup_type: t.into(),
            start_epoch: start,
            stop_epoch: stop,
            database_size: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn merged_expositions_keep_each_family_together() {
        let a = "# HELP x X.\n# TYPE x gauge\nx{repository=\"a\"} 1\n# HELP y Y.\n# TYPE y gauge\ny{repository=\"a\"} 2\n";
        let b = "# HELP x X.\n# TYPE x gauge\nx{repository=\"b\"} 3\n# HELP y Y.\n# TYPE y gauge\ny{repository=\"b\"} 4\n";
        assert_eq!(
            merge_expositions(&[a.to_string(), b.to_string()]),
            "# HELP x X.\n# TYPE x gauge\nx{repository=\"a\"} 1\nx{repository=\"b\"} 3\n\
             # HELP y Y.\n# TYPE y gauge\ny{repository=\"a\"} 2\ny{repository=\"b\"} 4\n"
        );
    }

    #[test]
    fn one_help_and_type_per_family_and_labels_escaped() {
        let r = StanzaReport {
            stanza: "main".into(),
            repository: "s3://bucket/a \"quoted\\\" path".into(),
            system_identifier: "1".into(),
            pg_version: 15,
            prior_clusters: Vec::new(),
            archive_min: Some("000000010000000000000001".into()),
            archive_max: Some("000000010000000000000009".into()),
            archive_max_time: Some(1_699_999_900),
            wal_receiving: None,
            wal_receiver: None,
            archive_gaps: vec![],
            archive_lag: Some(crate::wal_archive::ArchiveLag {
                ready: 2,
                ready_not_in_repo: 1,
                oldest_ready_age_secs: Some(30),
            }),
            repo_size: 5000,
            held_size: 0,
            backups: vec![
                backup("F1", "full", 1_699_990_000, 1_699_990_060),
                backup("F2", "full", 1_699_999_000, 1_699_999_030),
                backup("I1", "incr", 1_699_999_500, 1_699_999_510),
            ],
            damaged: vec![],
            immutable: None,
            as_of: None,
            vanished: Default::default(),
        };
        let text = render_info(&r, 1_700_000_000);
        let mut families = std::collections::BTreeSet::new();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(families.insert(line.to_string()), "twice: {line}");
        }
        assert_eq!(
            text.lines().filter(|l| l.starts_with("# HELP ")).count(),
            families.len()
        );
        let common = r#"stanza="main",repository="s3://bucket/a \"quoted\\\" path""#;
        for want in [
            format!("pgstrata_backups{{{common},type=\"full\"}} 2"),
            format!("pgstrata_backups{{{common},type=\"diff\"}} 0"),
            format!(
                "pgstrata_backup_newest_end_timestamp_seconds{{{common},type=\"full\"}} 1699999030"
            ),
            format!("pgstrata_backup_newest_age_seconds{{{common},type=\"incr\"}} 490"),
            format!("pgstrata_backup_newest_duration_seconds{{{common},type=\"full\"}} 30"),
            format!("pgstrata_archive_newest_segment_age_seconds{{{common}}} 100"),
        ] {
            assert!(text.lines().any(|l| l == want), "no line {want} in\n{text}");
        }
        // No diff backup: no newest-diff samples.
        assert!(!text
            .lines()
            .any(|l| l.starts_with("pgstrata_backup_newest") && l.contains("type=\"diff\"")));
    }
}
