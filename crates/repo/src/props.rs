//! Property tests of every decoder of repository objects: whatever bytes a repository holds
//! (damage, or a writer forging them with valid checksums), decoding returns an error or a
//! value that passes its checks. It never panics, loops or allocates beyond a bound.
//! Bounded case counts keep the run to a few seconds.

use crate::changemap::{ChangeMap, ForkBlocks};
use crate::chunk::MAX_FRAME_LEN;
use crate::codec::{decompress, CompressType, Compression};
use crate::manifest::{Entry, Manifest};
use crate::wal_object;
use crate::Named;
use proptest::prelude::*;

/// `magic`, then BLAKE3 of the zstd-compressed `json` (manifest layout), then the body.
fn sealed_manifest(json: &[u8]) -> Vec<u8> {
    let body = zstd::bulk::compress(json, 1).unwrap();
    let mut out = b"PGSTRMAN".to_vec();
    out.extend_from_slice(blake3::hash(&body).as_bytes());
    out.extend_from_slice(&body);
    out
}

fn sealed_map(json: &[u8], version: u8) -> Vec<u8> {
    let body = zstd::bulk::compress(json, 1).unwrap();
    let mut out = b"PGSTRMAP".to_vec();
    out.push(version);
    out.extend_from_slice(&[0; 7]);
    out.extend_from_slice(blake3::hash(&body).as_bytes());
    out.extend_from_slice(&body);
    out
}

/// Byte-level damage: overwrite, insert and delete at random places.
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, op, byte) in edits {
        let at = at % (bytes.len() + 1);
        match op % 3 {
            0 if at < bytes.len() => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            _ if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => {}
        }
    }
    bytes
}

fn edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..12)
}

/// What validation promises about an accepted manifest: restore can act on it as it is.
fn assert_sound(m: &Manifest) {
    for f in m.files() {
        let sum: u64 = f.chunks.iter().map(|c| c.raw as u64).sum();
        assert_eq!(sum, f.size, "{}", f.path);
        for c in &f.chunks {
            assert!(c.frame_len() <= MAX_FRAME_LEN && c.stored <= MAX_FRAME_LEN);
            assert!(c.at as u64 + c.raw as u64 <= c.frame_len() as u64 || c.is_zero());
        }
    }
    for e in &m.entries[1..] {
        assert!(!e.path().starts_with('/') && !e.path().split('/').any(|c| c == ".."));
        if let Entry::Link(l) = e {
            assert!(l.path.starts_with("pg_tblspc/"));
        }
    }
}

/// Numbers that sit on the edges validation cares about.
fn edgy_number() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(8192),
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 + 1),
        Just(u64::MAX),
        any::<u32>().prop_map(u64::from),
    ]
    .prop_map(serde_json::Value::from)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn manifest_from_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = Manifest::decode(&bytes, "m");
        let _ = Manifest::decode(&sealed_manifest(&bytes), "m");
    }

    /// The JSON of a real manifest, damaged, with a valid checksum.
    #[test]
    fn manifest_with_damaged_json(edits in edits()) {
        let json = serde_json::to_vec(&crate::manifest::tests::sample()).unwrap();
        if let Ok(m) = Manifest::decode(&sealed_manifest(&mutate(json, &edits)), "m") {
            assert_sound(&m);
        }
    }

    /// Any numeric field of any file entry or extent set to an edge value.
    #[test]
    fn manifest_with_forged_numbers(
        entry in 0usize..16,
        chunk in 0usize..4,
        field in prop::sample::select(vec!["size", "block_size", "mode", "o", "s", "r", "a", "f"]),
        value in edgy_number(),
    ) {
        let mut v = serde_json::to_value(crate::manifest::tests::sample()).unwrap();
        let entries = v["entries"].as_array_mut().unwrap();
        let n = entries.len();
        let e = &mut entries[entry % n];
        let target = if e["chunks"].as_array().is_some_and(|c| !c.is_empty()) && field.len() == 1 {
            let c = e["chunks"].as_array_mut().unwrap();
            let k = chunk % c.len();
            &mut c[k]
        } else {
            e
        };
        target[field] = value;
        if let Ok(m) = Manifest::decode(&sealed_manifest(&serde_json::to_vec(&v).unwrap()), "m") {
            assert_sound(&m);
        }
    }

    /// Frames: any codec, any bytes, any expected length; never more than that length.
    #[test]
    fn frames_from_random_and_damaged_streams(
        codec in prop::sample::select(CompressType::ALL.to_vec()),
        raw in prop::collection::vec(any::<u8>(), 0..5000),
        edits in edits(),
        raw_len in 0usize..100_000,
    ) {
        let _ = decompress(codec, &raw, raw_len, "f");
        let stored = Compression::new(codec, None).unwrap().compress(&raw);
        let damaged = mutate(stored, &edits);
        if let Ok(out) = decompress(codec, &damaged, raw.len(), "f") {
            prop_assert_eq!(out.len(), raw.len());
        }
    }

    /// WAL objects: header fields and payload forged, including the raw length.
    #[test]
    fn wal_objects_with_forged_headers(
        codec in 0u8..6,
        raw_len in prop_oneof![Just(u64::MAX), Just(1u64 << 40), 0u64..70_000],
        payload in prop::collection::vec(any::<u8>(), 0..2000),
        edits in edits(),
    ) {
        let mut obj = b"PGSTRWAL".to_vec();
        obj.extend_from_slice(&[1, codec, 0, 0, 0, 0, 0, 0]);
        obj.extend_from_slice(&raw_len.to_le_bytes());
        obj.extend_from_slice(&[0; 32]);
        obj.extend_from_slice(&payload);
        let _ = wal_object::decode(&obj, "w");
        let good = wal_object::encode(&payload, Compression::new(CompressType::Zst, None).unwrap(), 1);
        let damaged = mutate(good, &edits);
        if let Ok(raw) = wal_object::decode(&damaged, "w") {
            prop_assert_eq!(raw, payload);
        }
    }

    /// Change maps: random and damaged JSON with valid checksums, every version byte.
    #[test]
    fn change_maps_with_damaged_json(
        edits in edits(),
        version in any::<u8>(),
        bytes in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let m = ChangeMap {
            segment: "000000010000000000000002".into(),
            usable: true,
            records: 3,
            blocks: vec![ForkBlocks { spc: 1663, db: 5, rel: 16384, fork: 0, runs: vec![(0, 4)] }],
            truncated: vec![(1663, 5, 16384, 0, 2)],
            ..Default::default()
        };
        let json = serde_json::to_vec(&m).unwrap();
        let _ = ChangeMap::decode(&sealed_map(&mutate(json, &edits), version), "c");
        let _ = ChangeMap::decode(&sealed_map(&bytes, version), "c");
        let _ = ChangeMap::decode(&bytes, "c");
    }
}
