use super::*;
use crate::codec::CompressType;
use crate::fixture::{file_mut, owner};

fn dir(path: &str) -> Entry {
    Entry::dir(path, owner(0o700))
}

fn stored(pack: &str, raw: u32) -> Chunk {
    Chunk {
        pack: Some(pack.into()),
        backup: None,
        offset: 0,
        stored: 100,
        raw,
        check: Some(0x2d06_8005_38d3_94c2),
        at: 0,
        frame: 0,
    }
}

fn file(path: &str, size: u64, chunks: Vec<Chunk>) -> Entry {
    let blocks = size.div_ceil(8192) as usize;
    Entry::File(Box::new(FileEntry {
        path: path.into(),
        size,
        mtime: 1_740_906_000,
        owner: owner(0o600),
        hash: Some([0xab; 32]),
        chunks: chunks.into(),
        bad_pages: Default::default(),
        block_size: 8192,
        block_hashes: smallvec::smallvec![0x0123_4567_89ab_cdef; blocks],
        map: None,
        packs: Default::default(),
        map_depth: 0,
    }))
}

/// The last format whose manifest holds its entries: what the checks of entries are
/// tested on, as one object ([`Manifest::encode`], [`Manifest::decode`]). Format 4 checks
/// the same entries with the same code as it reads its parts (tested below).
pub(crate) const WHOLE: u32 = 3;

/// A small manifest as a backup wrote it before format 4 (one object, entries in it):
/// root, a database file, a tablespace.
pub(crate) fn sample() -> Manifest {
    Manifest {
        format_version: WHOLE,
        backup_label: "START WAL LOCATION: 0/5000028\n".into(),
        tablespace_map: Some("16400 /srv/ts1\n".into()),
        tablespaces: vec![Tablespace {
            oid: 16400,
            location: "/srv/ts1".into(),
        }],
        links: vec![],
        entries: vec![
            dir(""),
            dir("base"),
            dir("base/5"),
            file(
                "base/5/16384",
                3 * 8192 + 100,
                vec![
                    Chunk {
                        backup: Some("20250301-091500F".into()),
                        frame: 16384,
                        ..stored("0-0", 8192)
                    },
                    Chunk::zeros(8192),
                    Chunk {
                        offset: 100,
                        ..stored("0-0", 8292)
                    },
                ],
            ),
            file("base/5/PG_VERSION", 3, vec![stored("1-0", 3)]),
            dir("global"),
            file("global/pg_control", 8192, vec![stored("2-0", 8192)]),
            dir("pg_tblspc"),
            Entry::link("pg_tblspc/16400", "/srv/ts1", owner(0o777)),
            dir("pg_tblspc/16400/PG_17_202406281"),
            dir("pg_tblspc/16400/PG_17_202406281/5"),
            file("pg_tblspc/16400/PG_17_202406281/5/16500", 0, vec![]),
        ],
        pack_codecs: [("20250301-091500F".to_string(), CompressType::Lz4)].into(),
        ..crate::fixture::manifest("20250302-091500I", Some("20250301-091500F"))
    }
}

fn decode_err(m: &Manifest) -> String {
    match Manifest::decode(&m.encode(), "m") {
        Ok(_) => panic!("a bad manifest was accepted: {:?}", m.entries),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Corrupt, "{e}");
            e.to_string()
        }
    }
}

#[test]
fn a_valid_manifest_round_trips() {
    let m = sample();
    let back = Manifest::decode(&m.encode(), "m").unwrap();
    assert_eq!(
        serde_json::to_value(&back).unwrap(),
        serde_json::to_value(&m).unwrap()
    );
}

/// Entries are read with `kind` first (as written) without serde's buffering; an entry
/// whose keys come in another order is the same entry, and an unknown kind is damage.
#[test]
fn entries_read_the_same_whatever_their_key_order() {
    let m = sample();
    let mut json: serde_json::Value = serde_json::from_str(&json_of(&m)).unwrap();
    for entry in json["entries"].as_array_mut().unwrap() {
        let object = entry.as_object_mut().unwrap();
        let kind = object.remove("kind").unwrap();
        object.insert("kind".into(), kind); // now the last key
    }
    let reordered = serde_json::to_string(&json).unwrap();
    assert!(reordered.contains(r#""path":"base/5/16384""#) && !reordered.contains(r#"{"kind""#));
    let back = Manifest::decode(&encode_json(&reordered), "m").unwrap();
    assert_eq!(json_of(&back), json_of(&m));

    let bad = json_of(&m).replacen(r#""kind":"file""#, r#""kind":"socket""#, 1);
    let err = Manifest::decode(&encode_json(&bad), "m")
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid manifest"), "{err}");
}

/// The header (everything but the entries, with what the backup uses in packs) reads
/// without the entries; manifests written before `packs_used`, or with their entries
/// before other fields, are decoded whole instead; `packs_used` must match the entries.
#[test]
fn a_header_reads_without_its_entries() {
    let mut m = sample();
    assert_eq!(
        Manifest::decode_header(&m.encode(), "m")
            .unwrap()
            .map(|h| h.label),
        None
    );
    m.set_packs_used();
    assert!(!m.packs_used.as_ref().unwrap().is_empty());
    let h = Manifest::decode_header(&m.encode(), "m")
        .unwrap()
        .expect("a header");
    assert!(h.entries.is_empty());
    assert_eq!(
        serde_json::to_value(&h).unwrap(),
        serde_json::to_value(m.clone().into_header()).unwrap()
    );
    assert_eq!(h.packs_used(), m.pack_usage());
    assert_eq!(
        json_of(&m).rfind(r#""entries":"#),
        json_of(&m).find(r#""entries":"#)
    );
    assert!(json_of(&m).find(r#""entries":"#) > json_of(&m).find(r#""stats":"#));

    // Keys in another order (alphabetical: entries before stats): read whole.
    let value: serde_json::Value = serde_json::from_str(&json_of(&m)).unwrap();
    let reordered = encode_json(&serde_json::to_string(&value).unwrap());
    assert!(Manifest::decode_header(&reordered, "m").unwrap().is_none());
    assert_eq!(
        Manifest::decode(&reordered, "m").unwrap().packs_used,
        m.packs_used
    );

    // A header that does not match the entries is damage; so is a bad checksum.
    let mut wrong = m.clone();
    wrong.packs_used.as_mut().unwrap()[0].2 += 1;
    let err = decode_err(&wrong);
    assert!(err.contains("packs_used does not match"), "{err}");
    let mut damaged = m.encode();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    let err = Manifest::decode_header(&damaged, "m")
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum"), "{err}");
}

/// A manifest opened as a stream hands over the entries a whole decode holds, checked as
/// a whole decode checks them; one that fails a check is refused (its copy read instead),
/// as `load` refuses it.
#[tokio::test]
async fn a_stored_manifest_streams_the_entries_of_a_whole_decode() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::local(dir.path()).unwrap();
    let mut m = sample();
    m.set_packs_used();
    let (stanza, label) = (m.stanza.clone(), m.label.clone());
    let key = layout::manifest(&stanza, &label);
    storage.put_new(&key, m.encode().into()).await.unwrap();

    let stored = Manifest::open(&storage, &stanza, &label, &["global/pg_control", "nowhere"])
        .await
        .unwrap();
    let whole = Manifest::load(&storage, &stanza, &label).await.unwrap();
    // What the check kept: directories and links, the files asked for, counts.
    let layout: Vec<&Entry> = whole
        .entries
        .iter()
        .filter(|e| !matches!(e, Entry::File(_)))
        .collect();
    assert_eq!(
        serde_json::to_value(stored.layout()).unwrap(),
        serde_json::to_value(&layout).unwrap()
    );
    let kept: Vec<&str> = stored.kept().iter().map(|f| &*f.path).collect();
    assert_eq!(kept, vec!["global/pg_control"]);
    assert_eq!(
        stored.files(),
        (
            whole.files().count() as u64,
            whole.files().map(|f| f.size).sum()
        )
    );
    assert_eq!(
        serde_json::to_value(stored.header()).unwrap(),
        serde_json::to_value(whole.clone().into_header()).unwrap()
    );
    for _ in 0..2 {
        let mut streamed = Vec::new();
        stored
            .for_each_entry::<crate::Error>(|e| {
                streamed.push(e);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            serde_json::to_value(&streamed).unwrap(),
            serde_json::to_value(&whole.entries).unwrap()
        );
    }
    // The caller may stop the reading with its own error.
    let mut seen = 0;
    let err = stored
        .for_each_entry(|_| {
            seen += 1;
            Err(crate::Error::new(ErrorKind::Invalid, "enough"))
        })
        .await
        .unwrap_err();
    assert_eq!((seen, err.kind), (1, ErrorKind::Invalid));

    // Entries out of order: refused as damaged, the intact copy read instead; with both
    // damaged, the error names both.
    let mut bad = m.clone();
    bad.label = "20250302-091600I".into();
    let last = bad.entries.last().unwrap().clone();
    bad.entries.push(last);
    let bad_key = layout::manifest(&stanza, &bad.label);
    storage
        .put_new(&bad_key, bad.encode().into())
        .await
        .unwrap();
    let err = Manifest::open(&storage, &stanza, &bad.label, &[])
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("not sorted"), "{err}");
    let mut good = m.clone();
    good.label = bad.label.clone();
    storage
        .put_new(
            &layout::manifest_copy(&stanza, &bad.label),
            good.encode().into(),
        )
        .await
        .unwrap();
    let from_copy = Manifest::open(&storage, &stanza, &bad.label, &[])
        .await
        .unwrap();
    let mut paths = Vec::new();
    from_copy
        .for_each_entry::<crate::Error>(|e| {
            paths.push(e.path().to_string());
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(
        paths,
        good.entries.iter().map(|e| e.path()).collect::<Vec<_>>()
    );
}

/// The JSON inside an encoded manifest.
fn json_of(m: &Manifest) -> String {
    let enc = m.encode();
    String::from_utf8(zstd::decode_all(&enc[40..]).unwrap()).unwrap()
}

/// `json` stored as a manifest, checksum and all.
fn encode_json(json: &str) -> Vec<u8> {
    crate::checked::encode_json(MAGIC, json.as_bytes())
}

/// LSNs, block maps and the tracking method are typed in memory but stored in format 1's
/// text: decoding and encoding again gives the same JSON, byte for byte.
#[test]
fn typed_fields_keep_their_stored_text() {
    let mut m = sample();
    m.start.lsn = Lsn(0x16_B374_D848);
    m.track = Some(Tracking::Wal);
    file_mut(&mut m, "base/5/16384").block_hashes =
        smallvec::smallvec![0x6207_9793_0ab0_991a, 0, 1, u64::MAX];
    let json = json_of(&m);
    for text in [
        r#""lsn":"16/B374D848""#,
        r#""lsn":"0/5000120""#,
        r#""track":"wal""#,
        r#""block_hashes":"620797930ab0991a00000000000000000000000000000001ffffffffffffffff""#,
    ] {
        assert!(json.contains(text), "{text} not in {json}");
    }
    let back = Manifest::decode(&encode_json(&json), "m").unwrap();
    assert_eq!(back.start.lsn, Lsn(0x16_B374_D848));
    assert_eq!(back.track, Some(Tracking::Wal));
    assert_eq!(
        file_mut(&mut back.clone(), "base/5/16384").block_hash(3),
        Some(u64::MAX)
    );
    assert_eq!(json_of(&back), json);
}

/// A stored LSN, block map or tracking method that does not have its form is damage.
#[test]
fn malformed_typed_text_is_refused() {
    let json = json_of(&sample());
    let hashes = format!(r#""block_hashes":"{}""#, "0123456789abcdef".repeat(4));
    assert!(json.contains(&hashes) && json.contains(r#""lsn":"0/5000028""#));
    let cases = [
        (r#""lsn":"0/5000028""#, r#""lsn":"05000028""#, "an LSN"),
        (r#""lsn":"0/5000028""#, r#""lsn":" 0/5000028""#, "an LSN"),
        (r#""lsn":"0/5000028""#, r#""lsn":"0/+5000028""#, "an LSN"),
        (r#""lsn":"0/5000028""#, r#""lsn":"0/123456789""#, "an LSN"),
        (
            &hashes,
            &hashes.replace("0123", "0A23"),
            "16 lowercase hex digits",
        ),
        (
            &hashes,
            &hashes.replace("0123", "012"),
            "16 lowercase hex digits",
        ),
        (&hashes, r#""block_hashes":7"#, "16 lowercase hex digits"),
        (
            r#""data_checksums""#,
            r#""track":"auto","data_checksums""#,
            "unknown variant",
        ),
    ];
    for (from, to, why) in cases {
        let err = Manifest::decode(&encode_json(&json.replacen(from, to, 1)), "m").unwrap_err();
        assert_eq!(err.kind, ErrorKind::Corrupt, "{to}: {err}");
        let text = err.to_string();
        assert!(text.contains(why), "{to}: {text}");
    }
}

#[test]
fn damage_and_future_versions_are_refused() {
    let enc = sample().encode();
    let mut bad = enc.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(Manifest::decode(&bad, "m")
        .unwrap_err()
        .to_string()
        .contains("checksum"));
    assert!(Manifest::decode(&enc[..39], "m").is_err());
    let mut future = sample();
    future.format_version = FORMAT_VERSION + 1;
    let e = Manifest::decode(&future.encode(), "m").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Format);
}

/// Each forged entry is refused, naming the entry.
#[test]
fn forged_paths_and_links_are_refused() {
    type Forge = fn(&mut Manifest);
    let cases: [(&str, &str, Forge); 9] = [
        ("base/../../etc/passwd", "'..'", |m| {
            m.entries.push(file("base/../../etc/passwd", 0, vec![]))
        }),
        ("/etc/passwd", "absolute", |m| {
            m.entries.insert(1, file("/etc/passwd", 0, vec![]))
        }),
        ("base//5", "empty component", |m| {
            m.entries.insert(2, dir("base//5"))
        }),
        ("base/./x", "'.'", |m| m.entries.insert(3, dir("base/./x"))),
        ("base/1", "tablespace link", |m| {
            m.entries
                .insert(2, Entry::link("base/1", "/etc", owner(0o777)))
        }),
        ("pg_tblspc/16400/passwd", "under the link", |m| {
            m.entries.push(file("pg_tblspc/16400/passwd", 0, vec![]))
        }),
        // Files are not kept while checking (a stream holds directories only).
        ("base/5/16384/x", "not a directory of the manifest", |m| {
            m.entries.insert(4, file("base/5/16384/x", 0, vec![]))
        }),
        ("zzz/x", "not a directory of the manifest", |m| {
            m.entries.push(file("zzz/x", 0, vec![]))
        }),
        ("base", "listed twice", |m| m.entries.insert(2, dir("base"))),
    ];
    for (path, why, forge) in cases {
        let mut m = sample();
        forge(&mut m);
        let err = decode_err(&m);
        assert!(
            err.contains(&format!("entry {path:?}")) && err.contains(why),
            "{path}: {err}"
        );
    }
}

#[test]
fn links_must_be_tablespaces_with_absolute_targets() {
    let mut m = sample();
    m.tablespaces[0].location = "srv/ts1".into();
    assert!(decode_err(&m).contains("not an absolute path"));
    let mut m = sample();
    if let Entry::Link(l) = &mut m.entries[8] {
        l.target = "/etc".into();
    }
    assert!(decode_err(&m).contains("differs from tablespace location"));
    let mut m = sample();
    m.tablespaces.push(Tablespace {
        oid: 16500,
        location: "/etc".into(),
    });
    assert!(decode_err(&m).contains("no link entry pg_tblspc/16500"));
}

/// The data directory's links are names at its top, once each, with a target; one
/// elsewhere (which restore would make outside the data directory) is refused.
#[test]
fn data_directory_links_are_top_level_names() {
    let link = |path: &str, target: &str| DataLink {
        path: path.into(),
        target: target.into(),
    };
    let mut m = sample();
    m.links = vec![link("pg_wal", "/fast/wal"), link("log", "../logs")];
    let back = Manifest::decode(&m.encode(), "m").unwrap();
    assert_eq!(back.links, m.links);
    for bad in [
        link("base/x", "/tmp"),
        link("..", "/tmp"),
        link("pg_tblspc", "/tmp"),
        link("pg_wal", ""),
    ] {
        let mut m = sample();
        m.links = vec![bad.clone()];
        assert!(decode_err(&m).contains("link"), "{bad:?}");
    }
    let mut m = sample();
    m.links = vec![link("pg_wal", "/a"), link("pg_wal", "/b")];
    assert!(decode_err(&m).contains("listed twice"));
}

#[test]
fn modes_are_masked_and_setuid_is_refused() {
    let mut m = sample();
    file_mut(&mut m, "base/5/PG_VERSION").owner.mode = 0o4755;
    let err = decode_err(&m);
    assert!(
        err.contains("\"base/5/PG_VERSION\"") && err.contains("setuid"),
        "{err}"
    );
    let mut m = sample();
    file_mut(&mut m, "base/5/PG_VERSION").owner.mode = 0o100600;
    assert!(decode_err(&m).contains("beyond 7777"));
    // A setgid or sticky directory is read, and restored with permission bits only.
    let mut m = sample();
    if let Entry::Dir(d) = &mut m.entries[1] {
        d.owner.mode = 0o3750;
    }
    let back = Manifest::decode(&m.encode(), "m").unwrap();
    let Entry::Dir(d) = &back.entries[1] else {
        panic!()
    };
    assert_eq!(d.owner.mode, 0o750);
}

#[test]
fn extents_and_block_maps_must_add_up() {
    type Forge = fn(&mut FileEntry);
    let cases: [(&str, Forge); 10] = [
        ("not its size", |f| f.size += 1),
        ("more than its size", |f| f.chunks.push(Chunk::zeros(1))),
        ("block_size 1073741824", |f| f.block_size = 1 << 30),
        ("without a block_size", |f| f.block_size = 0),
        ("not one for each of 4 blocks", |f| f.block_hashes.push(0)),
        ("covers no bytes", |f| f.chunks.push(Chunk::zeros(0))),
        ("outside its", |f| f.chunks[0].at = 10_000),
        ("overflows", |f| f.chunks[2].offset = u64::MAX - 10),
        ("frame length", |f| f.chunks[0].frame = u32::MAX),
        ("pack name", |f| f.chunks[2].pack = Some("../0-0".into())),
    ];
    for (why, forge) in cases {
        let mut m = sample();
        forge(file_mut(&mut m, "base/5/16384"));
        let err = decode_err(&m);
        assert!(
            err.contains("entry \"base/5/16384\"") && err.contains(why),
            "{why}: {err}"
        );
    }
}

#[test]
fn header_fields_are_bounded() {
    let mut m = sample();
    m.cluster.wal_segment_size = 0;
    assert!(decode_err(&m).contains("wal_segment_size"));
    let mut m = sample();
    m.label = "../x".into();
    assert!(decode_err(&m).contains("not a backup label"));
    let mut m = sample();
    m.frame_size = 0;
    assert!(decode_err(&m).contains("frame_size"));
    let mut m = sample();
    m.entries.clear();
    assert!(decode_err(&m).contains("no entries"));
}

#[test]
fn a_compression_bomb_is_refused_before_it_inflates() {
    // 512 MiB of spaces compresses to a few KiB; the reader stops at its bound.
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    let zeros = vec![b' '; 1 << 20];
    for _ in 0..512 {
        std::io::Write::write_all(&mut enc, &zeros).unwrap();
    }
    let body = enc.finish().unwrap();
    let mut obj = MAGIC.to_vec();
    obj.extend_from_slice(blake3::hash(&body).as_bytes());
    obj.extend_from_slice(&body);
    let err = Manifest::decode(&obj, "m").unwrap_err().to_string();
    assert!(err.contains("inflates beyond"), "{err}");
}

#[test]
fn databases_and_annotations_round_trip_and_are_bounded() {
    use super::Database;
    // Older manifests have neither field: they read as "not recorded" and "none".
    let m = sample();
    let json = json_of(&m);
    assert!(
        !json.contains("databases") && !json.contains("annotations"),
        "{json}"
    );
    let back = Manifest::decode(&m.encode(), "m").unwrap();
    assert!(back.databases.is_none() && back.annotations.is_empty());

    let mut m = sample();
    m.databases = Some(vec![
        Database {
            name: "postgres".into(),
            oid: 5,
        },
        Database {
            name: "app".into(),
            oid: 16390,
        },
    ]);
    m.annotations
        .insert("ticket".into(), "OPS-1 = nightly".into());
    let back = Manifest::decode(&m.encode(), "m").unwrap();
    assert_eq!(back.databases, m.databases);
    assert_eq!(back.annotations, m.annotations);
    assert!(!back.databases.as_ref().unwrap()[1].is_system());

    let mut dup = m.clone();
    dup.databases.as_mut().unwrap()[1].oid = 5;
    assert!(decode_err(&dup).contains("listed twice"));
    let mut bad = m.clone();
    bad.databases.as_mut().unwrap()[1].name = "x".repeat(64);
    assert!(decode_err(&bad).contains("database name"));
    let mut bad = m.clone();
    bad.annotations.insert("a=b".into(), "v".into());
    assert!(decode_err(&bad).contains("annotation key"));
    let mut bad = m;
    bad.annotations.insert("k".into(), "nul\0".into());
    assert!(decode_err(&bad).contains("annotation \"k\""));
}

#[test]
fn a_file_map_round_trips_and_refuses_damage() {
    let map = FileMap {
        chunks: vec![
            Chunk {
                backup: Some("20250301-091500F".into()),
                ..stored("0-0", 8192)
            },
            Chunk::zeros(100),
        ],
        block_hashes: vec![0x0123_4567_89ab_cdef, u64::MAX],
    };
    let bytes = map.encode();
    assert_eq!(&bytes[..8], b"PGSTRMAP");
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
    assert_eq!(&bytes[12..20], &0x0123_4567_89ab_cdef_u64.to_le_bytes());
    assert_eq!(FileMap::decode(&bytes, "m").unwrap(), map);
    for (bad, why) in [
        (b"PGSTRMAQ".to_vec(), "bad header"),
        (bytes[..19].to_vec(), "past its end"),
        (bytes[..bytes.len() - 1].to_vec(), "extents"),
    ] {
        let e = FileMap::decode(&bad, "m").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
}

/// `base/5/16384` of the sample with its map stored apart by the sample's own backup, in
/// its pack `3-0`.
fn with_stored_map(m: &mut Manifest) -> FileMap {
    let f = file_mut(m, "base/5/16384");
    let map = f.take_map();
    let map_ref = Chunk {
        offset: 500,
        stored: 60,
        raw: map.encode().len() as u32,
        ..stored("3-0", 0)
    };
    f.set_map(map_ref, &map);
    map
}

/// Put `map`, as read from `f`'s map frame, into `f` as manifest `label` sees it.
fn attach(f: &mut FileEntry, map: FileMap, label: &str) {
    let owner = f.map.as_ref().unwrap().owner(label).to_string();
    let super::MapFrame::Whole(map) = super::MapFrame::Whole(map).rebased(&owner, label) else {
        unreachable!()
    };
    f.chunks = map.chunks.into();
    f.block_hashes = map.block_hashes.into();
}

#[test]
fn a_stored_map_is_referenced_with_the_packs_it_uses() {
    let mut m = sample();
    let map = with_stored_map(&mut m);
    let f = file_mut(&mut m, "base/5/16384").clone();
    assert!(f.chunks.is_empty() && f.block_hashes.is_empty() && f.map_unloaded());
    // The prior's pack, this backup's data pack and the pack of the map itself; the
    // frame two extents share is counted once.
    let packs: Vec<(Option<&str>, &str, u64)> = f
        .packs
        .iter()
        .map(|p| (p.backup.as_deref(), &*p.pack, p.stored))
        .collect();
    assert_eq!(
        packs,
        vec![
            (None, "0-0", 100),
            (None, "3-0", 60),
            (Some("20250301-091500F"), "0-0", 100)
        ]
    );
    let back = Manifest::decode(&m.encode(), "m").unwrap();
    let usage = back.pack_usage();
    assert_eq!(usage[&("20250301-091500F".into(), "0-0".into())], 100);
    assert_eq!(usage[&(m.label.clone(), "3-0".into())], 60);

    // Loaded into a later manifest that carried the entry, the extents are seen from it.
    let mut carried = f.clone();
    carried.rebase(&m.label, "20250303-091500I");
    assert_eq!(
        carried.map.as_ref().unwrap().backup.as_deref(),
        Some(m.label.as_str())
    );
    attach(&mut carried, map.clone(), "20250303-091500I");
    assert_eq!(
        carried.chunks[0].backup.as_deref(),
        Some("20250301-091500F")
    );
    assert_eq!(carried.chunks[2].backup.as_deref(), Some(m.label.as_str()));
    assert_eq!(carried.block_hashes.as_slice(), map.block_hashes);
    let mut later = sample();
    later.label = "20250303-091500I".into();
    later.pack_codecs.insert(m.label.clone(), CompressType::Zst);
    super::validate::check_loaded_map(&later, &carried, "later").unwrap();
}

#[test]
fn forged_map_references_are_refused() {
    type Forge = fn(&mut FileEntry);
    let cases: [(&str, Forge); 7] = [
        ("both a map and inline", |f| f.chunks.push(Chunk::zeros(1))),
        ("not a whole stored frame", |f| {
            let map = f.map.as_mut().unwrap();
            map.frame = map.raw + 1;
        }),
        ("listed twice", |f| f.packs.push(f.packs[0].clone())),
        ("does not list the map's own pack", |f| {
            f.packs.retain(|p| &*p.pack != "3-0")
        }),
        ("is not <worker>-<seq>", |f| f.packs[0].pack = "../x".into()),
        ("map_depth 9 is more than 8", |f| f.map_depth = 9),
        ("packs or map_depth without a map", |f| f.map = None),
    ];
    for (why, forge) in cases {
        let mut m = sample();
        with_stored_map(&mut m);
        forge(file_mut(&mut m, "base/5/16384"));
        let err = decode_err(&m);
        assert!(err.contains(why), "{why}: {err}");
    }
    let mut m = sample();
    with_stored_map(&mut m);
    m.format_version = 1;
    assert!(decode_err(&m).contains("format 1 manifest"));

    // A loaded map whose extents reach a pack the entry does not list is damage.
    let mut m = sample();
    let mut map = with_stored_map(&mut m);
    map.chunks[2].pack = Some("9-9".into());
    let mut f = file_mut(&mut m, "base/5/16384").clone();
    attach(&mut f, map, &m.label);
    let e = super::validate::check_loaded_map(&m, &f, "m").unwrap_err();
    assert!(e.to_string().contains("does not list"), "{e}");
}

/// Where each byte of a file comes from under `chunks`: (pack, byte of the decoded frame),
/// or `None` for zeros.
fn byte_sources(chunks: &[Chunk]) -> Vec<Option<(String, u32)>> {
    chunks
        .iter()
        .flat_map(|c| (0..c.raw).map(move |j| c.pack.as_ref().map(|p| (p.to_string(), c.at + j))))
        .collect()
}

#[test]
fn a_delta_map_changes_grows_and_cuts_its_base() {
    let frame = |pack: &str, at: u32, raw: u32, frame: u32| Chunk {
        at,
        frame,
        ..stored(pack, raw)
    };
    // Blocks of 4 bytes: 12 bytes in frame A, then 8 zero bytes.
    let base = FileMap {
        chunks: vec![frame("0-0", 0, 12, 0), Chunk::zeros(8)],
        block_hashes: vec![1, 2, 3, 4, 5],
    };
    let a = |at: u32| Some(("0-0".to_string(), at));
    let b = |at: u32| Some(("1-0".to_string(), at));

    // Block 1 changed; blocks 5 and 6 (2 bytes) added, all from frame B.
    let grown = MapDelta {
        size: 26,
        base: stored("9-9", 50),
        runs: vec![
            MapRun {
                first: 1,
                count: 1,
                chunks: vec![frame("1-0", 0, 4, 10)],
            },
            MapRun {
                first: 5,
                count: 2,
                chunks: vec![frame("1-0", 4, 6, 10)],
            },
        ],
        hashes: vec![20, 60, 70],
    };
    let bytes = grown.encode();
    assert_eq!(&bytes[..8], b"PGSTRMDL");
    let MapFrame::Delta(decoded) = MapFrame::decode(&bytes, "d").unwrap() else {
        panic!("not read as a delta")
    };
    assert_eq!(decoded, grown);
    let m = decoded.apply(base.clone(), 4, "d").unwrap();
    assert_eq!(m.block_hashes, vec![1, 20, 3, 4, 5, 60, 70]);
    let mut expected: Vec<_> = (0..4).map(a).collect();
    expected.extend((0..4).map(b));
    expected.extend((8..12).map(a));
    expected.extend((0..8).map(|_| None));
    expected.extend((4..10).map(b));
    assert_eq!(byte_sources(&m.chunks), expected);

    // Cut to 10 bytes, its last (partial) block changed.
    let cut = MapDelta {
        size: 10,
        base: stored("9-9", 50),
        runs: vec![MapRun {
            first: 2,
            count: 1,
            chunks: vec![frame("1-0", 0, 2, 10)],
        }],
        hashes: vec![30],
    };
    let m = cut.apply(base.clone(), 4, "d").unwrap();
    assert_eq!(m.block_hashes, vec![1, 2, 30]);
    let mut expected: Vec<_> = (0..8).map(a).collect();
    expected.extend((0..2).map(b));
    assert_eq!(byte_sources(&m.chunks), expected);

    // Damage: bytes in neither map, runs that do not hold their blocks, hashes missing.
    let damaged = |edit: fn(&mut MapDelta), why: &str| {
        let mut d = grown.clone();
        edit(&mut d);
        let e = d.apply(base.clone(), 4, "d").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(e.to_string().contains(why), "{why}: {e}");
    };
    damaged(|d| d.runs[1].first = 6, "in neither map");
    damaged(|d| d.size = 40, "holds 6 bytes, not 8");
    damaged(|d| d.runs[0].chunks[0].raw = 3, "holds 3 bytes, not 4");
    damaged(|d| d.hashes.pop().map(drop).unwrap_or(()), "hashes for");
    damaged(|d| d.runs.swap(0, 1), "out of order");
}

#[test]
fn owner_names_are_held_once_and_read_back_as_written() {
    let a = Name::new("pgstrata-test-owner");
    let b: Name = "pgstrata-test-owner".into();
    assert_eq!(a, b, "one name, one index");
    assert_ne!(a, Name::new("pgstrata-test-other"));
    assert_eq!(&*a, "pgstrata-test-owner");
    assert_eq!(format!("{a:?}"), "\"pgstrata-test-owner\"");
    let o = Owner {
        mode: 0o600,
        uid: 7,
        gid: 8,
        user: Some(a),
        group: None,
    };
    let json = serde_json::to_string(&o).unwrap();
    assert!(json.contains("\"user\":\"pgstrata-test-owner\""), "{json}");
    assert!(json.contains("\"group\":null"), "{json}");
    assert_eq!(serde_json::from_str::<Owner>(&json).unwrap(), o);
    // Four bytes where a shared string took sixteen: the owner of every entry.
    assert!(std::mem::size_of::<Owner>() <= 20);
}

#[test]
fn entries_keep_their_json_form_and_cost_one_pointer_a_slot() {
    let o = owner(0o700);
    let dir = Entry::dir("base", o.clone());
    let link = Entry::link("pg_tblspc/16400", "/srv/ts1", o.clone());
    let json = serde_json::to_string(&[&dir, &link]).unwrap();
    assert_eq!(
        json,
        r#"[{"kind":"dir","path":"base","mode":448,"uid":999,"gid":999,"user":"postgres","group":"postgres"},{"kind":"link","path":"pg_tblspc/16400","target":"/srv/ts1","mode":448,"uid":999,"gid":999,"user":"postgres","group":"postgres"}]"#
    );
    let back: Vec<Entry> = serde_json::from_str(&json).unwrap();
    assert_eq!((back[0].path(), back[0].owner()), ("base", &o));
    let Entry::Link(l) = &back[1] else {
        panic!("a link reads back as a link")
    };
    assert_eq!(
        (l.path.as_str(), l.target.as_str()),
        ("pg_tblspc/16400", "/srv/ts1")
    );
    // Every slot of a manifest's entry list: a tag and a pointer. A file's entry, one per
    // file in memory, holds a small file's extent and up to two block hashes itself (they
    // were two more allocations of 64 and 32 bytes); its path is boxed and its nearly
    // always empty lists are thin (it was 208 bytes without the extent and hashes).
    assert_eq!(std::mem::size_of::<Entry>(), 16);
    assert!(std::mem::size_of::<FileEntry>() <= 200);
    // An extent names its pack and backup by `Name`s: 48 bytes, not 72.
    assert!(std::mem::size_of::<Chunk>() <= 48);
}

#[test]
fn pack_usage_counts_each_inline_frame_once_per_owner_and_pack() {
    let mut m = sample();
    // Two more files bundled into frames already used: "1-0" at 0 (PG_VERSION's) and the
    // prior backup's "0-0" at 0; the second names the manifest's own label explicitly,
    // which is the same frame as naming none.
    let own = m.label.clone();
    m.entries
        .push(file("base/5/16385", 3, vec![stored("1-0", 3)]));
    m.entries.push(file(
        "base/5/16386",
        3,
        vec![Chunk {
            backup: Some(own.as_str().into()),
            ..stored("1-0", 3)
        }],
    ));
    m.entries.push(file(
        "base/5/16387",
        8192,
        vec![Chunk {
            backup: Some("20250301-091500F".into()),
            frame: 16384,
            ..stored("0-0", 8192)
        }],
    ));
    let usage = m.pack_usage();
    let stored_of = |owner: &str, pack: &str| usage[&(owner.to_string(), pack.to_string())];
    // Every frame here is stored in 100 bytes. "0-0" of the prior backup: the one frame at
    // offset 0, however many files use it.
    assert_eq!(stored_of("20250301-091500F", "0-0"), 100);
    // This backup's "0-0" (offset 100), "1-0" (once for three files) and "2-0".
    assert_eq!(stored_of(&own, "0-0"), 100);
    assert_eq!(stored_of(&own, "1-0"), 100);
    assert_eq!(stored_of(&own, "2-0"), 100);
    assert_eq!(usage.len(), 4);
}

/// Format 4: the entries are written in parts, each checked against the manifest before
/// its entries are read; a damaged or missing part is read from its copy, and a part
/// whose copy fails too makes the backup damaged. `load`, `load_header` and `open` read
/// the same backup a whole manifest of format 3 describes.
#[tokio::test]
async fn a_manifest_of_format_4_is_read_from_its_parts() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::local(dir.path()).unwrap();
    let mut m = sample();
    m.format_version = FORMAT_VERSION;
    m.set_packs_used();
    let (stanza, label) = (m.stanza.clone(), m.label.clone());
    let entries = serde_json::to_value(&m.entries).unwrap();
    m.publish_with(&storage, 2).await.unwrap();
    assert_eq!(serde_json::to_value(&m.entries).unwrap(), entries);
    let n = m.entries.len();
    assert_eq!(m.parts.len(), n.div_ceil(2));
    assert_eq!(m.parts.iter().map(|p| p.entries as usize).sum::<usize>(), n);
    let file = |key: String| dir.path().join(key);
    for i in 0..m.parts.len() {
        assert!(file(layout::manifest_part(&stanza, &label, i)).exists());
        assert!(file(layout::manifest_part_copy(&stanza, &label, i)).exists());
    }

    let read_all = || async {
        let whole = Manifest::load(&storage, &stanza, &label).await?;
        let stored = Manifest::open(&storage, &stanza, &label, &["global/pg_control"]).await?;
        let mut streamed = Vec::new();
        stored
            .for_each_entry::<crate::Error>(|e| {
                streamed.push(e);
                Ok(())
            })
            .await?;
        Ok::<_, crate::Error>((whole, stored, streamed))
    };
    let (whole, stored, streamed) = read_all().await.unwrap();
    assert_eq!(serde_json::to_value(&whole.entries).unwrap(), entries);
    assert_eq!(serde_json::to_value(&streamed).unwrap(), entries);
    assert_eq!(whole.parts, m.parts);
    assert_eq!(stored.kept().len(), 1);
    let header = Manifest::load_header(&storage, &stanza, &label)
        .await
        .unwrap();
    assert!(header.entries.is_empty());
    assert_eq!(
        (header.parts, header.packs_used),
        (m.parts.clone(), m.packs_used.clone())
    );

    // A damaged part: its copy is read. Another valid part in its place is damage too.
    let part1 = file(layout::manifest_part(&stanza, &label, 1));
    let part0_bytes = std::fs::read(file(layout::manifest_part(&stanza, &label, 0))).unwrap();
    std::fs::write(&part1, &part0_bytes).unwrap();
    let (whole, _, streamed) = read_all().await.unwrap();
    assert_eq!(serde_json::to_value(&whole.entries).unwrap(), entries);
    assert_eq!(serde_json::to_value(&streamed).unwrap(), entries);
    // With its copy missing as well, the backup is damaged, named in the error.
    std::fs::remove_file(file(layout::manifest_part_copy(&stanza, &label, 1))).unwrap();
    for err in [
        Manifest::load(&storage, &stanza, &label).await.unwrap_err(),
        Manifest::open(&storage, &stanza, &label, &[])
            .await
            .unwrap_err(),
    ] {
        assert_eq!(err.kind, ErrorKind::Corrupt, "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("backup '{label}' is damaged")),
            "{text}"
        );
        assert!(text.contains("manifest/1.copy is missing"), "{text}");
    }

    // A manifest that says another count than its part holds is damaged.
    let mut miscounted = sample();
    (miscounted.format_version, miscounted.label) = (FORMAT_VERSION, "20250302-091600I".into());
    miscounted.set_packs_used();
    miscounted.publish(&storage).await.unwrap();
    miscounted.parts[0].entries += 1;
    miscounted.entries.clear();
    let forged = miscounted.encode();
    for key in [
        layout::manifest(&stanza, &miscounted.label),
        layout::manifest_copy(&stanza, &miscounted.label),
    ] {
        std::fs::write(file(key), &forged).unwrap();
    }
    let err = Manifest::load(&storage, &stanza, &miscounted.label)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("entries where the manifest says"),
        "{err}"
    );

    // Entries out of order across two parts are refused as in one manifest.
    let mut unsorted = sample();
    (unsorted.format_version, unsorted.label) = (FORMAT_VERSION, "20250302-091700I".into());
    unsorted.set_packs_used();
    // A writer refuses them (it checks the order), so two parts are swapped afterwards,
    // their objects and their place in the list.
    unsorted.publish_with(&storage, 1).await.unwrap();
    let last = unsorted.entries.len() - 1;
    for key in [layout::manifest_part, layout::manifest_part_copy] {
        let (a, b) = (
            file(key(&stanza, &unsorted.label, 1)),
            file(key(&stanza, &unsorted.label, last)),
        );
        let (bytes_a, bytes_b) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        std::fs::write(&a, bytes_b).unwrap();
        std::fs::write(&b, bytes_a).unwrap();
    }
    unsorted.parts.swap(1, last);
    for key in [layout::manifest, layout::manifest_copy] {
        std::fs::remove_file(file(key(&stanza, &unsorted.label))).unwrap();
    }
    unsorted.entries.clear();
    unsorted.publish_object(&storage).await.unwrap();
    for err in [
        Manifest::load(&storage, &stanza, &unsorted.label)
            .await
            .unwrap_err(),
        Manifest::open(&storage, &stanza, &unsorted.label, &[])
            .await
            .unwrap_err(),
    ] {
        assert_eq!(err.kind, ErrorKind::Corrupt, "{err}");
    }

    // Format 4 keeps entries in parts only: one object with its entries is refused, and
    // so are parts in a manifest of an earlier format.
    let mut inline = sample();
    inline.format_version = FORMAT_VERSION;
    inline.set_packs_used();
    let err = Manifest::decode(&inline.encode(), "m").unwrap_err();
    assert!(
        err.to_string()
            .contains("format 4 and not entries in parts"),
        "{err}"
    );
    let mut old = whole.clone().into_header();
    old.format_version = WHOLE;
    let err = Manifest::decode(&old.encode(), "m").unwrap_err();
    assert!(
        err.to_string().contains("parts in a format 3 manifest"),
        "{err}"
    );
}

/// A writer of parts as the entries come: in order only; a place kept for an entry that
/// comes last (a backup's `global/pg_control`) cuts the part before it and gets a part of
/// its own; the manifest it finishes reads back as the entries given, in order.
#[tokio::test]
async fn parts_are_written_as_the_entries_come_with_a_place_kept_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::local(dir.path()).unwrap();
    let mut m = sample();
    m.format_version = FORMAT_VERSION;
    let entries = std::mem::take(&mut m.entries);
    let kept = entries
        .iter()
        .position(|e| e.path() == "global/pg_control")
        .expect("the sample has pg_control");
    assert!(
        kept > 2 && kept + 1 < entries.len(),
        "a place in the middle"
    );
    let mut writer = PartsWriter::new(&m.stanza, &m.label, m.prior.as_deref(), 2);
    let mut cut = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let part = if i == kept {
            writer.reserve(e.path()).unwrap()
        } else {
            writer.push(e).unwrap()
        };
        if let Some(part) = part {
            cut.push(part);
        }
    }
    // Before it: a disordered or doubled entry, and an entry no place was kept for.
    let err = writer.push(&entries[0]).err().unwrap();
    assert!(
        err.to_string().contains("must be unique and in path order"),
        "{err}"
    );
    let err = writer.fill(entries[0].clone()).err().unwrap();
    assert!(err.to_string().contains("no place was kept"), "{err}");
    let last = writer.cut();
    cut.extend(last);
    cut.push(writer.fill(entries[kept].clone()).unwrap());
    // Stored in any order: the list orders them.
    for part in cut.into_iter().rev() {
        writer.stored(part.store(&storage).await.unwrap());
    }
    writer.finish(&mut m).unwrap();
    let sizes: Vec<u32> = m.parts.iter().map(|p| p.entries).collect();
    let before = kept.div_ceil(2);
    assert_eq!(
        sizes.len(),
        before + 1 + (entries.len() - kept - 1).div_ceil(2)
    );
    assert_eq!(
        sizes[before], 1,
        "the kept entry has a part of its own: {sizes:?}"
    );
    assert_eq!(sizes.iter().sum::<u32>() as usize, entries.len());
    m.publish_object(&storage).await.unwrap();
    let read = Manifest::load(&storage, &m.stanza, &m.label).await.unwrap();
    assert_eq!(
        serde_json::to_value(&read.entries).unwrap(),
        serde_json::to_value(&entries).unwrap()
    );
    assert_eq!(
        read.packs_used,
        Some(
            read.pack_usage()
                .into_iter()
                .map(|((o, p), n)| (o, p, n))
                .collect()
        )
    );

    // A place kept and never filled: no manifest.
    let mut writer = PartsWriter::new(&m.stanza, "20250302-091800I", None, 2);
    writer.push(&entries[0]).unwrap();
    writer.reserve("zzz").unwrap();
    let err = writer.finish(&mut m.clone()).unwrap_err();
    assert!(err.to_string().contains("never came"), "{err}");
}
