//! `annotate`: pin a backup (retention keeps it), unpin it, or change its annotations,
//! after it was taken. A manifest is written once, so each change is an annotation record
//! beside it (`pgstrata_repo::annotation`).

use crate::{open_stanza, Error, Result, Settings};
use pgstrata_repo::annotation::{AnnotationRecord, Annotations};
use pgstrata_repo::manifest::{list_backups, Manifest};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default)]
pub struct AnnotateOptions {
    /// The backup (`--set`).
    pub label: String,
    /// `--pin` (`Some(true)`) or `--unpin` (`Some(false)`).
    pub pin: Option<bool>,
    /// `--annotation=KEY=VALUE`.
    pub set: BTreeMap<String, String>,
    /// `--annotation=KEY=`.
    pub unset: Vec<String>,
}

/// The backup's pin and annotations afterwards.
#[derive(Debug, Serialize)]
pub struct AnnotateReport {
    pub label: String,
    pub pinned: bool,
    pub annotations: BTreeMap<String, String>,
}

pub async fn annotate(s: &Settings, o: &AnnotateOptions) -> Result<AnnotateReport> {
    if o.pin.is_none() && o.set.is_empty() && o.unset.is_empty() {
        return Err(Error::config(
            "annotate needs --pin, --unpin or --annotation=KEY=VALUE (KEY= removes one)",
        ));
    }
    let (storage, _) = open_stanza(s).await?;
    let labels = list_backups(&storage, &s.stanza).await?;
    if !labels.contains(&o.label) {
        return Err(Error::config(format!(
            "backup '{}' does not exist in stanza '{}' (backups: {})",
            o.label,
            s.stanza,
            labels.join(", ")
        )));
    }
    AnnotationRecord::new(&s.stanza, &o.label, o.pin, o.set.clone(), o.unset.clone())
        .write(&storage)
        .await?;
    let header = Manifest::load_header(&storage, &s.stanza, &o.label).await?;
    let now = Annotations::load_all(&storage, &s.stanza)
        .await?
        .apply(&o.label, &header.annotations);
    log::info!(
        "backup {}: {}",
        o.label,
        if now.pinned { "pinned" } else { "not pinned" }
    );
    Ok(AnnotateReport {
        label: o.label.clone(),
        pinned: now.pinned,
        annotations: now.annotations,
    })
}

pub fn render_text(r: &AnnotateReport) -> String {
    let mut out = format!(
        "backup {}: {}\n",
        r.label,
        if r.pinned {
            "pinned (retention keeps it)"
        } else {
            "not pinned"
        }
    );
    for (k, v) in &r.annotations {
        out.push_str(&format!("  annotation: {k}={}\n", v.escape_debug()));
    }
    out
}
