//! Block-change maps: for each archived WAL segment, the relation blocks and files its
//! records change, written by archive-push next to the segment so that an incremental backup
//! can learn what changed without reading the database.
//!
//! Object `<stanza>/archive/<archive-id>/<first 16 of name>/<segment>.map`:
//!
//! ```text
//! offset size
//!  0      8   magic "PGSTRMAP"
//!  8      1   map format version (3; 1 and 2 are still read)
//!  9      7   zero
//! 16     32   BLAKE3 of the rest
//! 48      …   zstd-compressed JSON of ChangeMap
//! ```
//! A segment that cannot be decoded still gets a map, with `usable: false` and the reason,
//! so a backup knows to fall back to hashing instead of guessing.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"PGSTRMAP";
/// Map format version written. 2 added `wal_level_minimal`, 3 `completes_previous`; older
/// maps are still read. A reader that knows only an older version refuses newer maps, so it
/// hashes instead of trusting a map whose flags it cannot see.
pub(crate) const VERSION: u8 = 3;

/// Blocks of one relation fork, as runs `[first block, count]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkBlocks {
    pub spc: u32,
    pub db: u32,
    pub rel: u32,
    pub fork: u8,
    pub runs: Vec<(u32, u32)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeMap {
    pub segment: String,
    /// False when the segment could not be decoded; `reason` says why.
    pub usable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub records: u64,
    pub switched: bool,
    /// The last record's block headers run into the next segment and were not read.
    pub incomplete_tail: bool,
    /// A parameter-change record in the segment set wal_level=minimal (format version 2;
    /// false in version-1 maps, whose decoder did not look).
    #[serde(default)]
    pub wal_level_minimal: bool,
    /// The previous segment's map has an incomplete tail, and this map also lists the
    /// changes of that cut record, decoded whole from both segments (format version 3;
    /// false in older maps).
    #[serde(default)]
    pub completes_previous: bool,
    /// Resource managers the decoder does not understand (custom ones): their records may
    /// change relations in ways the map does not show.
    pub unknown_rmgrs: Vec<u8>,
    pub blocks: Vec<ForkBlocks>,
    /// Forks created: [spc, db, rel, fork].
    pub created: Vec<(u32, u32, u32, u8)>,
    /// Forks truncated: [spc, db, rel, fork, new length in blocks].
    pub truncated: Vec<(u32, u32, u32, u8, u32)>,
    /// Relations dropped: [spc, db, rel].
    pub dropped: Vec<(u32, u32, u32)>,
    /// Database directories created by file copy or dropped: [spc, db].
    pub databases: Vec<(u32, u32)>,
}

impl ChangeMap {
    /// Turn a sorted block set into runs.
    pub fn runs(blocks: impl IntoIterator<Item = u32>) -> Vec<(u32, u32)> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for b in blocks {
            match runs.last_mut() {
                Some((start, n)) if *start + *n == b => *n += 1,
                _ => runs.push((b, 1)),
            }
        }
        runs
    }

    /// Whether the one thing keeping this map from being complete is its last record,
    /// cut at the segment end: reading that record from the next segment completes it.
    pub fn only_tail_cut(&self) -> bool {
        // The checks of `complete` before its last one.
        self.incomplete_tail
            && self.usable
            && !self.wal_level_minimal
            && self.unknown_rmgrs.is_empty()
    }

    /// Whether a backup may rely on this map alone: `Err` of kind `Format` (the map is
    /// sound but cannot be relied on) saying why not.
    pub fn complete(&self) -> crate::Result<()> {
        let why = if !self.usable {
            self.reason
                .clone()
                .unwrap_or_else(|| "not decodable".into())
        } else if self.wal_level_minimal {
            "the server ran with wal_level=minimal, which does not WAL-log every change".into()
        } else if !self.unknown_rmgrs.is_empty() {
            format!(
                "it has records of unknown resource managers {:?}",
                self.unknown_rmgrs
            )
        } else if self.incomplete_tail {
            // Last: the other reasons cannot be mended by reading the next segment.
            "its last record's block references run into the next segment".into()
        } else {
            return Ok(());
        };
        Err(crate::Error::new(crate::ErrorKind::Format, why))
    }

    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("serialize change map");
        let body = zstd::bulk::compress(&json, 3).expect("zstd into memory");
        let mut out = Vec::with_capacity(48 + body.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&[0u8; 7]);
        out.extend_from_slice(blake3::hash(&body).as_bytes());
        out.extend_from_slice(&body);
        out
    }

    pub fn decode(obj: &[u8], what: &str) -> Result<ChangeMap> {
        if obj.len() < 48 || &obj[..8] != MAGIC {
            return Err(Error::corrupt(format!("{what}: not a pgstrata change map")));
        }
        if !(1..=VERSION).contains(&obj[8]) {
            return Err(Error::new(
                crate::ErrorKind::Format,
                format!("{what}: change map version {} is not supported", obj[8]),
            ));
        }
        if blake3::hash(&obj[48..]).as_bytes() != &obj[16..48] {
            return Err(Error::corrupt(format!(
                "{what}: change map fails its checksum"
            )));
        }
        // Real maps compress about 5 to 20 times.
        let json = crate::codec::zstd_bounded(&obj[48..], 256, what)?;
        serde_json::from_slice(&json).map_err(|e| {
            Error::with_source(
                crate::ErrorKind::Corrupt,
                format!("{what}: invalid change map"),
                e,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_runs_and_damage() {
        assert_eq!(
            ChangeMap::runs([1, 2, 3, 7, 9, 10]),
            vec![(1, 3), (7, 1), (9, 2)]
        );
        let m = ChangeMap {
            segment: "000000010000000000000002".into(),
            usable: true,
            records: 3,
            blocks: vec![ForkBlocks {
                spc: 1663,
                db: 5,
                rel: 16384,
                fork: 0,
                runs: vec![(0, 4)],
            }],
            ..Default::default()
        };
        let enc = m.encode();
        assert_eq!(ChangeMap::decode(&enc, "m").unwrap(), m);
        let mut bad = enc.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(ChangeMap::decode(&bad, "m").is_err());
        assert!(m.complete().is_ok());
        let unusable = ChangeMap {
            usable: false,
            reason: Some("bad page".into()),
            ..m
        };
        assert_eq!(unusable.complete().unwrap_err().to_string(), "bad page");
    }

    #[test]
    fn version_1_maps_are_read_and_minimal_wal_is_not_relied_on() {
        let m = ChangeMap {
            segment: "000000010000000000000003".into(),
            usable: true,
            ..Default::default()
        };
        let mut v1 = m.encode();
        assert_eq!(v1[8], VERSION);
        v1[8] = 1;
        assert_eq!(ChangeMap::decode(&v1, "v1").unwrap(), m);
        let mut future = m.encode();
        future[8] = VERSION + 1;
        assert!(ChangeMap::decode(&future, "future")
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        let minimal = ChangeMap {
            wal_level_minimal: true,
            ..m
        };
        assert!(minimal
            .complete()
            .unwrap_err()
            .to_string()
            .contains("wal_level=minimal"));
    }
}
