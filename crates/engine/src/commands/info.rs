//! `info`: what a stanza holds.

use crate::progress::human_bytes;
use crate::reports::{summarize, BackupInfo, DamagedBackup};
use crate::wal_archive::archive_range;
use crate::{open_stanza, Result, Settings};
use pgstrata_repo::manifest::{scan_headers, Manifest, Tracking};

pub use crate::reports::StanzaReport;

pub async fn info(s: &Settings, set: Option<&str>) -> Result<StanzaReport> {
    let (storage, stanza) = open_stanza(s).await?;
    // Each backup's header (with what it uses in packs): no manifest is read whole.
    let scan = scan_headers(&storage, &s.stanza).await?;
    let damaged: Vec<DamagedBackup> = scan
        .damaged
        .iter()
        .filter(|d| set.is_none_or(|want| want == d.label))
        .map(|d| DamagedBackup {
            label: d.label.clone(),
            error: d.error.to_string(),
        })
        .collect();
    let headers: Vec<&Manifest> = scan.headers.iter().collect();
    let usage = crate::garbage::collect_garbage(&storage, &s.stanza, &headers, None, false).await?;
    let seg_size = stanza.cluster.wal_segment_size;
    // Gaps are looked for in the current cluster's archive, from its oldest backup on.
    let oldest_start = scan
        .headers
        .iter()
        .filter(|m| m.cluster == stanza.cluster)
        .filter_map(|m| {
            pgstrata_pg::lsn::parse_segment_name(&m.start.wal, seg_size).map(|(_, n)| n)
        })
        .min();
    let notes = pgstrata_repo::annotation::Annotations::load_all(&storage, &s.stanza).await?;
    let mut backups = Vec::new();
    for header in scan
        .headers
        .iter()
        .filter(|m| set.is_none_or(|w| w == m.label))
    {
        let mut b = if header.stats.page_errors > 0 {
            // Which pages failed is in the file entries.
            summarize(&Manifest::load(&storage, &s.stanza, &header.label).await?)
        } else {
            summarize(header)
        };
        let annotated = notes.apply(&header.label, &header.annotations);
        (b.pinned, b.annotations) = (annotated.pinned, annotated.annotations);
        backups.push(b);
    }
    let repo_size: u64 = storage.list(&s.stanza).await?.iter().map(|o| o.size).sum();
    if let Some(want) = set {
        if backups.is_empty() && damaged.is_empty() {
            return Err(crate::Error::config(format!(
                "backup '{want}' does not exist in stanza '{}'",
                s.stanza
            )));
        }
    }
    let range = archive_range(&storage, &s.stanza, &stanza.cluster.archive_id(), seg_size).await?;
    let empty = crate::wal_archive::ArchivedSegments::new();
    let archived = range.as_ref().map_or(&empty, |r| &r.segments);
    let archive_gaps = crate::wal_archive::archive_gaps(archived, oldest_start, seg_size);
    let archive_lag = s
        .pg_path
        .as_deref()
        .and_then(|p| crate::wal_archive::archive_lag(p, archived, seg_size));
    let mut labels: Vec<String> = scan.headers.iter().map(|m| m.label.clone()).collect();
    labels.extend(scan.damaged.iter().map(|d| d.label.clone()));
    let archive_id = stanza.cluster.archive_id();
    let found = crate::vanished::Found {
        labels: &labels,
        wal: Some((&archive_id, archived)),
        segment_size: seg_size,
    };
    let vanished = crate::vanished::check(s, &storage, &found).await?;
    let prior_clusters = prior_clusters(&storage, &stanza).await?;
    Ok(StanzaReport {
        stanza: s.stanza.clone(),
        repository: storage.description().to_string(),
        system_identifier: stanza.cluster.system_identifier.clone(),
        pg_version: stanza.cluster.major_version,
        archive_min: range.as_ref().map(|r| r.min.clone()),
        archive_max: range.as_ref().map(|r| r.max.clone()),
        archive_max_time: range.as_ref().map(|r| r.max_modified),
        wal_receiving: range.and_then(|r| r.receiving),
        wal_receiver: crate::wal_archive::ReceiverStatus::read(s),
        archive_gaps,
        archive_lag,
        repo_size,
        held_size: usage.held,
        backups,
        damaged,
        vanished,
        immutable: storage
            .object_lock()
            .map(|l| format!("{}, {} days", pgstrata_repo::Named::name(l.mode), l.days)),
        as_of: storage.read_as_of().map(rfc3339),
        prior_clusters,
    })
}

/// The clusters `stanza` belonged to before its stanza-upgrades, with their archives' ranges.
async fn prior_clusters(
    storage: &pgstrata_repo::Storage,
    stanza: &pgstrata_repo::stanza::StanzaInfo,
) -> Result<Vec<crate::reports::PriorCluster>> {
    let mut out = Vec::new();
    for c in &stanza.history[..stanza.history.len() - 1] {
        let range =
            archive_range(storage, &stanza.stanza, &c.archive_id(), c.wal_segment_size).await?;
        out.push(crate::reports::PriorCluster {
            system_identifier: c.system_identifier.clone(),
            pg_version: c.major_version,
            archive_id: c.archive_id(),
            archive_min: range.as_ref().map(|r| r.min.clone()),
            archive_max: range.as_ref().map(|r| r.max.clone()),
        });
    }
    Ok(out)
}

pub fn render_text(r: &StanzaReport) -> String {
    let mut out = format!(
        "stanza: {}\n    PostgreSQL {}, system identifier {}\n",
        r.stanza, r.pg_version, r.system_identifier
    );
    match (&r.archive_min, &r.archive_max) {
        (Some(a), Some(b)) => out.push_str(&format!("    wal archive min/max: {a} / {b}\n")),
        _ => out.push_str("    wal archive: empty\n"),
    }
    if let Some(w) = &r.wal_receiving {
        out.push_str(&format!(
            "    wal-receive: receiving {} ({} stored, last written {})\n",
            w.segment,
            crate::progress::human_bytes(w.stored_bytes),
            rfc3339(w.written)
        ));
    }
    if let Some(w) = &r.wal_receiver {
        out.push_str(&format!(
            "    wal-receive on this host: stored through {} (timeline {}), the server at {}: {} behind, as of {}\n",
            w.flushed,
            w.timeline,
            w.server_end,
            crate::progress::human_bytes(w.lag_bytes),
            rfc3339(w.updated)
        ));
    }
    for (a, b) in &r.archive_gaps {
        out.push_str(&format!(
            "    wal archive GAP: {a} .. {b} missing (point-in-time recovery cannot cross it)\n"
        ));
    }
    if let Some(l) = &r.archive_lag {
        out.push_str(&format!(
            "    wal waiting to be archived: {} ready file(s), {} not in this repository{}\n",
            l.ready,
            l.ready_not_in_repo,
            l.oldest_ready_age_secs
                .map(|a| format!(", oldest ready for {a} s"))
                .unwrap_or_default()
        ));
    }
    for c in &r.prior_clusters {
        out.push_str(&format!(
            "    before stanza-upgrade: PostgreSQL {}, system identifier {}, wal archive {}\n",
            c.pg_version,
            c.system_identifier,
            match (&c.archive_min, &c.archive_max) {
                (Some(a), Some(b)) => format!("min/max: {a} / {b}"),
                _ => "empty".to_string(),
            }
        ));
    }
    for line in r.vanished.lines() {
        out.push_str(&format!("    VANISHED: {line}\n"));
    }
    if let Some(lock) = &r.immutable {
        out.push_str(&format!("    immutable repository (object lock): {lock}\n"));
    }
    if let Some(t) = &r.as_of {
        out.push_str(&format!(
            "    as the repository was at {t} (repo-target-time)\n"
        ));
    }
    out.push_str(&format!(
        "    repository size: {}, held in partly referenced packs: {}\n",
        human_bytes(r.repo_size),
        human_bytes(r.held_size)
    ));
    if r.backups.is_empty() && r.damaged.is_empty() {
        out.push_str("    no backups\n");
    }
    for d in &r.damaged {
        out.push_str(&format!(
            "\n    damaged backup: {} (cannot be restored)\n        {}\n",
            d.label, d.error
        ));
    }
    for b in &r.backups {
        let before_upgrade = r
            .prior_clusters
            .iter()
            .any(|c| c.archive_id == b.archive_id);
        render_backup(&mut out, b, before_upgrade);
    }
    out
}

/// One backup of [`render_text`].
fn render_backup(out: &mut String, b: &BackupInfo, before_upgrade: bool) {
    out.push_str(&format!(
        "\n    {} backup: {}\n        timestamp start/stop: {} / {}\n        lsn start/stop: {} / {} (timeline {})\n        wal start/stop: {} / {}\n        database size: {}, new data stored: {}, files: {}\n",
        b.backup_type,
        b.label,
        b.start_time,
        b.stop_time,
        b.start_lsn,
        b.stop_lsn,
        b.timeline,
        b.wal_start,
        b.wal_stop,
        human_bytes(b.database_size),
        human_bytes(b.stored_size),
        b.files
    ));
    if before_upgrade {
        out.push_str(&format!(
            "        of the PostgreSQL {} cluster before stanza-upgrade (WAL archive {})\n",
            b.pg_version, b.archive_id
        ));
    }
    if b.pinned {
        out.push_str("        pinned: retention keeps it (annotate --unpin to release)\n");
    }
    for (k, v) in &b.annotations {
        // Escaped: a value is one line, whatever the operator typed.
        out.push_str(&format!("        annotation: {k}={}\n", v.escape_debug()));
    }
    if let (Some(read), Some(stored)) = (b.read_rate, b.store_rate) {
        out.push_str(&format!(
            "        rate: {}/s read, {}/s stored\n",
            human_bytes(read),
            human_bytes(stored)
        ));
    }
    if let Some(p) = &b.prior {
        out.push_str(&format!(
            "        compared with: {p}; {} files unchanged, {} read\n",
            b.files_unchanged,
            human_bytes(b.bytes_read)
        ));
    }
    let d = &b.detection;
    if let Some(t) = d.track {
        out.push_str(&format!(
            "        changed blocks found by: {}{}{}\n",
            t.name(),
            if t == Tracking::Wal {
                format!(
                    " ({} files read block by block{})",
                    b.files_tracked,
                    if b.files_hashed.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; files hashed: {}",
                            crate::track::describe_hashed(&b.files_hashed)
                        )
                    }
                )
            } else {
                String::new()
            },
            d.track_reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ));
    }
    if let Some(c) = &d.summary_check {
        out.push_str(&format!("        cross-check: {c}\n"));
    }
    if let Some(r) = &d.delta_reason {
        out.push_str(&format!("        every block hashed: {r}\n"));
    }
    if b.page_errors > 0 {
        out.push_str(&format!(
            "        page checksum errors: {}\n",
            b.page_errors
        ));
        for bp in &b.bad_pages {
            out.push_str(&format!("            {} blocks {:?}\n", bp.path, bp.blocks));
        }
    }
}

/// Unix seconds `t` as an RFC 3339 time, to the second.
fn rfc3339(t: i64) -> String {
    chrono::DateTime::from_timestamp(t, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
