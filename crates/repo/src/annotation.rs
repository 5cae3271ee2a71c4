//! Annotation records: a backup's pin and annotations, changed after it was taken.
//!
//! A manifest is written once, so what an operator says about a backup later (keep it
//! forever, a ticket number) is a record of its own beside it, create-only, sealed under
//! its name in an encrypted stanza (so one copied from another backup or stanza fails to
//! open and is refused, as expire records are). The records of a backup apply in the
//! order of their `time` (then name) over the manifest's annotations: each sets or clears
//! the pin, sets annotations and removes others. `expire` never expires a pinned backup.
//!
//! Who may write them: anyone who can add objects, the database host behind an
//! append-only agent included. A record only changes what retention keeps, never deletes
//! anything itself; unpinning is an add too, as a new backup that pushes an old one out
//! of a count retention is.

use crate::{layout, Result, Storage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One change of one backup's pin or annotations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnotationRecord {
    /// The record's own name (`<unique>` of its key): one stored under another is refused.
    pub name: String,
    pub stanza: String,
    /// The backup it is about.
    pub label: String,
    /// When it was written: RFC 3339, UTC, with nanoseconds (records apply in this order).
    pub time: String,
    /// Pin (`true`) or unpin (`false`); absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<bool>,
    /// Annotations set (added or changed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Annotations removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unset: Vec<String>,
}

/// A backup's pin and annotations once its records are applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotated {
    pub pinned: bool,
    pub annotations: BTreeMap<String, String>,
}

/// Every annotation record of a stanza, by backup, and those refused.
#[derive(Debug, Default)]
pub struct Annotations {
    by_label: BTreeMap<String, Vec<AnnotationRecord>>,
    pub refused: Vec<String>,
}

impl Annotations {
    /// Backup `label` with manifest annotations `base`, its records applied in order.
    pub fn apply(&self, label: &str, base: &BTreeMap<String, String>) -> Annotated {
        let mut out = Annotated {
            pinned: false,
            annotations: base.clone(),
        };
        for r in self.by_label.get(label).into_iter().flatten() {
            if let Some(pin) = r.pin {
                out.pinned = pin;
            }
            out.annotations.extend(r.set.clone());
            for k in &r.unset {
                out.annotations.remove(k);
            }
        }
        out
    }

    /// Whether backup `label` is pinned.
    pub fn pinned(&self, label: &str) -> bool {
        self.apply(label, &BTreeMap::new()).pinned
    }
}

impl AnnotationRecord {
    pub fn new(
        stanza: &str,
        label: &str,
        pin: Option<bool>,
        set: BTreeMap<String, String>,
        unset: Vec<String>,
    ) -> AnnotationRecord {
        AnnotationRecord {
            name: layout::unique_name(),
            stanza: stanza.to_string(),
            label: label.to_string(),
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            pin,
            set,
            unset,
        }
    }

    /// Store it (create-only; sealed under its name in an encrypted stanza).
    pub async fn write(&self, storage: &Storage) -> Result<()> {
        let key = layout::annotation_record(&self.stanza, &self.label, &self.name);
        let json = serde_json::to_vec(self).expect("an annotation record serializes");
        storage.put_new(&key, json.into()).await
    }
}

impl Annotations {
    /// Every record of `stanza`, each backup's in the order they apply. A record that fails
    /// to open or parse, or whose content names another record, backup or stanza, is
    /// refused: named in `refused`, not applied.
    pub async fn load_all(storage: &Storage, stanza: &str) -> Result<Annotations> {
        let (records, refused) = crate::records::load_records(
            storage,
            &format!("{stanza}/annotations/"),
            "annotation record",
            |r: &AnnotationRecord, key| {
                *key == layout::annotation_record(stanza, &r.label, &r.name) && r.stanza == stanza
            },
        )
        .await?;
        let mut out = Annotations {
            by_label: BTreeMap::new(),
            refused,
        };
        for r in records {
            out.by_label.entry(r.label.clone()).or_default().push(r);
        }
        for records in out.by_label.values_mut() {
            records.sort_by(|a, b| (&a.time, &a.name).cmp(&(&b.time, &b.name)));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_apply_in_order_and_one_under_another_name_is_refused() {
        let storage = Storage::in_memory();
        let base: BTreeMap<String, String> = [("ticket".into(), "OPS-1".into())].into();
        let set = |k: &str, v: &str| [(k.to_string(), v.to_string())].into();
        let first = AnnotationRecord::new("main", "F1", Some(true), set("ticket", "OPS-2"), vec![]);
        first.write(&storage).await.unwrap();
        let second = AnnotationRecord::new(
            "main",
            "F1",
            None,
            set("owner", "dba"),
            vec!["ticket".into()],
        );
        second.write(&storage).await.unwrap();
        let a = Annotations::load_all(&storage, "main").await.unwrap();
        let got = a.apply("F1", &base);
        assert!(got.pinned);
        assert_eq!(got.annotations, set("owner", "dba"));
        assert!(!a.pinned("F2"));
        AnnotationRecord::new("main", "F1", Some(false), BTreeMap::new(), vec![])
            .write(&storage)
            .await
            .unwrap();
        let a = Annotations::load_all(&storage, "main").await.unwrap();
        assert!(!a.pinned("F1"));

        // A pin of F1 copied under F2's name is refused, not applied.
        let pin = AnnotationRecord::new("main", "F1", Some(true), BTreeMap::new(), vec![]);
        let bytes = serde_json::to_vec(&pin).unwrap();
        let forged = layout::annotation_record("main", "F2", &pin.name);
        storage.put_new(&forged, bytes.into()).await.unwrap();
        let a = Annotations::load_all(&storage, "main").await.unwrap();
        assert!(!a.pinned("F2"));
        assert_eq!(a.refused, vec![forged]);
    }
}
