//! Repository objects built by hand for tests and benchmarks (feature `fixtures`; the
//! binary never has it): the one place that fills in every field of a sample manifest, so
//! the unit tests and `bench manifest_scale` start from the same backup and a new field is
//! added here once.

use crate::codec::{CompressType, Compression};
use crate::manifest::{BackupType, Entry, FileEntry, Manifest, Owner, Stats, WalPoint};
use crate::stanza::ClusterIdentity;

/// The PostgreSQL 17 cluster the samples were taken of.
pub fn cluster() -> ClusterIdentity {
    ClusterIdentity {
        system_identifier: "7412345678901234567".into(),
        major_version: 17,
        catalog_version: 202406281,
        control_version: 1700,
        wal_segment_size: 16 << 20,
        block_size: 8192,
    }
}

/// postgres:postgres (uid and gid 999) with `mode`.
pub fn owner(mode: u32) -> Owner {
    Owner {
        mode,
        uid: 999,
        gid: 999,
        user: Some("postgres".into()),
        group: Some("postgres".into()),
    }
}

/// A point on timeline 1 in segment 000000010000000000000005, 2025-03-02 09:15 UTC.
fn point(lsn: &str) -> WalPoint {
    WalPoint {
        time: "2025-03-02T09:15:00Z".into(),
        epoch: 1_740_906_900,
        lsn: lsn.parse().expect("a valid LSN"),
        timeline: 1,
        wal: "000000010000000000000005".into(),
    }
}

/// A manifest of no entries, in the current format: backup `label` of [`cluster`] in
/// stanza `main` (incremental on `prior`, or full), from 0/5000028 to 0/5000120, zstd
/// level 3 in 1 MiB frames, data checksums on. Fill in `entries` and what the case needs.
pub fn manifest(label: &str, prior: Option<&str>) -> Manifest {
    Manifest {
        format_version: crate::FORMAT_VERSION,
        label: label.into(),
        backup_type: if prior.is_some() {
            BackupType::Incr
        } else {
            BackupType::Full
        },
        prior: prior.map(str::to_string),
        stanza: "main".into(),
        cluster: cluster(),
        server_version_num: 170002,
        start: point("0/5000028"),
        stop: point("0/5000120"),
        backup_label: String::new(),
        tablespace_map: None,
        compression: Compression {
            kind: CompressType::Zst,
            level: 3,
        },
        frame_size: 1 << 20,
        data_checksums: true,
        tablespaces: vec![],
        links: vec![],
        entries: vec![],
        stats: Stats::default(),
        pack_codecs: Default::default(),
        track: None,
        track_reason: None,
        summary_check: None,
        delta_reason: None,
        databases: None,
        annotations: Default::default(),
        packs_used: None,
        parts: Vec::new(),
    }
}

/// The entry of file `path` in `m`, to change it; panics when there is none.
pub fn file_mut<'a>(m: &'a mut Manifest, path: &str) -> &'a mut FileEntry {
    m.entries
        .iter_mut()
        .find_map(|e| match e {
            Entry::File(f) if &*f.path == path => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no file {path} in the manifest"))
}
