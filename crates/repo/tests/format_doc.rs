//! The format document's test vectors, checked against the code: the document is the
//! contract for independent readers and writers, so its examples must stay true.

use pgstrata_repo::codec::{CompressType, Compression};
use pgstrata_repo::{chunk, layout, manifest, wal_object, FORMAT_VERSION};

const DOC: &str = include_str!("../../../docs/repository-format.md");

/// The text between `before` and the next backtick, after `before`.
fn quoted_after<'a>(before: &str) -> &'a str {
    let at = DOC
        .find(before)
        .unwrap_or_else(|| panic!("the format document no longer says {before:?}"))
        + before.len();
    let rest = &DOC[at..];
    &rest[..rest.find('`').unwrap()]
}

#[test]
fn the_version_line_says_the_version_the_code_writes() {
    let line = DOC
        .lines()
        .find(|l| l.starts_with("Repository format version "))
        .expect("the format document has no version line");
    let version = line
        .split("**")
        .nth(1)
        .unwrap_or_else(|| panic!("no version in bold in {line:?}"));
    assert_eq!(
        version,
        FORMAT_VERSION.to_string(),
        "the format document says version {version}, the code writes {FORMAT_VERSION}"
    );
}

/// The rows of the layout's "Object names" table: (pattern, the `layout::` function).
fn documented_names() -> Vec<(&'static str, &'static str)> {
    let start = DOC
        .find("### Object names")
        .expect("the format document has no \"Object names\" table");
    let rows: Vec<_> = DOC[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let unquote = |c: &'static str| c.trim_matches('`');
            (unquote(cells[1]), unquote(cells[2]))
        })
        .collect();
    assert!(rows.len() > 10, "the object names table lost its rows");
    rows
}

/// Names each object-naming function of `layout` makes, for sample arguments: every
/// product of each function must match a documented pattern of that function.
fn made_by(function: &str) -> Option<Vec<String>> {
    let (s, a, l) = ("main", "15-7412345678901234567", "20261128-081500F");
    let seg = "000000010000000A0000002B";
    Some(match function {
        "layout::stanza_info" => vec![layout::stanza_info(s)],
        "layout::stanza_upgrade" => vec![layout::stanza_upgrade(s, 2)],
        "layout::lock" => vec![layout::lock(s)],
        "layout::receiver_lock" => vec![layout::receiver_lock(s)],
        "layout::key_file" => vec![layout::key_file(s, "3f9a0c1d2b4e5f60")],
        "layout::key_grant" => vec![layout::key_grant(s, "3f9a0c1d2b4e5f60", 2)],
        "layout::create_only_probe" => vec![layout::create_only_probe(s, "4242-1795000000")],
        "layout::expire_record" => vec![layout::expire_record(s, &layout::unique_name())],
        "layout::annotation_record" => {
            vec![layout::annotation_record(s, l, &layout::unique_name())]
        }
        "layout::archive_object" => vec![
            layout::archive_object(s, a, seg),
            layout::archive_object(s, a, &format!("{seg}.partial")),
            layout::archive_object(s, a, &layout::received_piece_name(seg, 0, 0x2000)),
            layout::archive_object(s, a, &format!("{seg}.00000028.backup")),
            layout::archive_object(s, a, "00000002.history"),
        ],
        "layout::change_map" => vec![layout::change_map(s, a, seg)],
        "layout::pack" => vec![layout::pack(s, l, &layout::pack_name(3, 12))],
        "layout::resume_checkpoint" => vec![layout::resume_checkpoint(s, l, 3, 0)],
        "layout::manifest_part" => vec![layout::manifest_part(s, l, 7)],
        "layout::manifest_part_copy" => vec![layout::manifest_part_copy(s, l, 7)],
        "layout::manifest_copy" => vec![layout::manifest_copy(s, l)],
        "layout::manifest" => vec![layout::manifest(s, l)],
        _ => return None,
    })
}

/// The functions [`made_by`] knows: every one must be in the document.
const NAMING_FUNCTIONS: [&str; 17] = [
    "layout::stanza_info",
    "layout::stanza_upgrade",
    "layout::expire_record",
    "layout::annotation_record",
    "layout::lock",
    "layout::receiver_lock",
    "layout::key_file",
    "layout::key_grant",
    "layout::create_only_probe",
    "layout::archive_object",
    "layout::change_map",
    "layout::pack",
    "layout::resume_checkpoint",
    "layout::manifest_part",
    "layout::manifest_part_copy",
    "layout::manifest_copy",
    "layout::manifest",
];

/// Whether `name` matches documented `pattern`: literal text, and placeholders `<…>` that
/// each stand for one name component of the form the document gives it.
fn matches(pattern: &str, name: &str) -> bool {
    let Some(open) = pattern.find('<') else {
        return pattern == name;
    };
    let Some(rest) = name.strip_prefix(&pattern[..open]) else {
        return false;
    };
    let close = open + pattern[open..].find('>').expect("placeholder closed");
    let placeholder = &pattern[open + 1..close];
    let after = &pattern[close + 1..];
    let fits = |v: &str| {
        let all = |f: fn(&u8) -> bool| v.as_bytes().iter().all(f);
        let upper_hex = |b: &u8| b.is_ascii_digit() || (b'A'..=b'F').contains(b);
        let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
        match placeholder {
            "stanza" => layout::check_stanza_name(v).is_ok(),
            "label" => manifest::is_backup_label(v),
            "archive-id" => v
                .split_once('-')
                .is_some_and(|(m, id)| m.parse::<u32>().is_ok() && id.parse::<u64>().is_ok()),
            "first 16" => v.len() == 16 && all(upper_hex),
            "24-hex segment" => v.len() == 24 && all(upper_hex),
            "8-hex timeline" => v.len() == 8 && all(upper_hex),
            "8-hex offset" => v.len() == 8 && all(upper_hex),
            "8 chars" => v.len() == 8 && !v.contains('/'),
            "worker" | "seq" | "n" | "generation" => !v.is_empty() && all(u8::is_ascii_digit),
            "id" => v.len() == 16 && all(lower_hex),
            "unique" => !v.is_empty() && !v.contains('/'),
            other => panic!("the format document has a placeholder <{other}> it does not define"),
        }
    };
    (0..=rest.len())
        .filter(|&n| rest.is_char_boundary(n))
        .any(|n| fits(&rest[..n]) && matches(after, &rest[n..]))
}

/// Every object name pattern of the layout is made by a function of `layout.rs`, and
/// every name those functions make is documented: a new kind of object, or a renamed one,
/// fails here until the document says it.
#[test]
fn every_documented_object_name_is_made_by_layout() {
    let rows = documented_names();
    for (pattern, function) in &rows {
        let made = made_by(function).unwrap_or_else(|| {
            panic!("the format document says {function} makes {pattern}: no such function")
        });
        assert!(
            made.iter().any(|name| matches(pattern, name)),
            "{function} makes {made:?}, none of which is the documented {pattern}"
        );
    }
    // A function added to layout.rs that makes an object's name must be known here (and
    // so in the document); prefixes (`…_root`, `…_dir`) and components are not objects.
    let source = include_str!("../src/layout.rs");
    for sig in source.split("\npub fn ").skip(1) {
        let name = &sig[..sig.find('(').unwrap()];
        let components = ["pack_name", "unique_name", "received_piece_name"];
        if sig.contains("-> String")
            && !name.ends_with("_root")
            && !name.ends_with("_dir")
            && !components.contains(&name)
        {
            let function = format!("layout::{name}");
            assert!(
                NAMING_FUNCTIONS.contains(&function.as_str()),
                "{function} makes object names this test and the format document do not know"
            );
        }
    }
    for function in NAMING_FUNCTIONS {
        let documented: Vec<&str> = rows
            .iter()
            .filter(|(_, f)| *f == function)
            .map(|(p, _)| *p)
            .collect();
        assert!(
            !documented.is_empty(),
            "{function} makes object names the format document does not list"
        );
        for name in made_by(function).unwrap() {
            assert!(
                documented.iter().any(|p| matches(p, &name)),
                "{function} makes {name}, which no pattern of the format document matches"
            );
        }
    }
}

#[test]
fn the_name_matcher_tells_names_apart() {
    assert!(matches(
        "<stanza>/backup/<label>/pack/<worker>-<seq>",
        "main/backup/20261128-081500F/pack/3-12"
    ));
    assert!(!matches(
        "<stanza>/backup/<label>/pack/<worker>-<seq>",
        "main/backup/20261128-081500F/pack/3"
    ));
    assert!(!matches(
        "<stanza>/backup/<label>/manifest/<n>",
        "main/backup/20261128-081500F/manifest/7.copy"
    ));
    assert!(!matches("<stanza>/stanza.json", "main/stanza.json.copy"));
}

#[test]
fn frame_check_vector() {
    let v = quoted_after("Test vector: XXH3-64 of the empty string is `");
    assert_eq!(format!("{:016x}", chunk::frame_check(b"")), v);
}

#[test]
fn block_map_vector() {
    let v = quoted_after("of 10,000 zero bytes with `block_size` 8,192 has the `block_hashes` `");
    let data = vec![0u8; 10_000];
    let map: String = data
        .chunks(8192)
        .map(|b| format!("{:016x}", manifest::block_hash(b)))
        .collect();
    assert_eq!(map, v);
}

#[test]
fn wal_object_header_vector() {
    let v = quoted_after("the header of a 16 MiB segment compressed with zst starts\n`");
    let expected: Vec<u8> = v
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let raw = vec![0u8; 16 << 20];
    let obj = wal_object::encode(&raw, Compression::new(CompressType::Zst, None).unwrap(), 1);
    assert_eq!(&obj[..expected.len()], &expected[..]);
    assert_eq!(wal_object::decode(&obj, "vector").unwrap().len(), raw.len());
    let v = quoted_after("With a block-change map of 300 bytes inside, its first 16 bytes are\n`");
    let expected: Vec<u8> = v
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let with_map = wal_object::with_map(&obj, &[7u8; 300]);
    assert_eq!(&with_map[..expected.len()], &expected[..]);
    assert_eq!(
        wal_object::decode(&with_map, "vector").unwrap().len(),
        raw.len()
    );
}

/// §15 reimplemented from the document alone (Argon2id, AES-256-GCM and HKDF-SHA256 used
/// directly): a key file written by the code opens, and so do a sealed object and a sealed
/// frame, with the associated data the document gives.
#[test]
fn encryption_as_documented() {
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    use aws_lc_rs::hkdf::{Salt, HKDF_SHA256};
    use pgstrata_repo::cipher::{Cipher, KeyFile, Passphrase, TEST_KDF_MEMORY_ENV};
    use pgstrata_repo::storage::Storage;
    for s in [
        "magic `PGSTRSEA`",
        "the ASCII string `pgstrata key v2/<stanza>/<id>/<public_key>/<generations>`",
        "info = the ASCII string `pgstrata object v1`",
        "info = the\n  ASCII string `pgstrata frame v1`",
        "u64 **big-endian**",
    ] {
        assert!(DOC.contains(s), "the format document no longer says {s:?}");
    }
    fn open(key: &[u8], nonce: [u8; 12], aad: &[u8], sealed: &[u8]) -> Vec<u8> {
        let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).unwrap());
        let mut buf = sealed.to_vec();
        let n = k
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf,
            )
            .expect("opens as documented")
            .len();
        buf.truncate(n);
        buf
    }
    fn hkdf(master: &[u8], salt: &[u8], info: &[u8]) -> [u8; 32] {
        let mut out = [0u8; 32];
        let info = [info];
        Salt::new(HKDF_SHA256, salt)
            .extract(master)
            .expand(&info, HKDF_SHA256)
            .unwrap()
            .fill(&mut out)
            .unwrap();
        out
    }

    std::env::set_var(TEST_KDF_MEMORY_ENV, "64");
    let master = std::sync::Arc::new(Cipher::generate());
    let kf = KeyFile::wrap(
        "main",
        &master,
        &Passphrase::new("pass"),
        "2026-01-01T00:00:00Z".into(),
        "h".into(),
        "u".into(),
    )
    .unwrap();
    let json: serde_json::Value = serde_json::to_value(&kf).unwrap();
    let kdf = &json["kdf"];
    let params = argon2::Params::new(
        kdf["m_cost"].as_u64().unwrap() as u32,
        kdf["t_cost"].as_u64().unwrap() as u32,
        kdf["p_cost"].as_u64().unwrap() as u32,
        Some(32),
    )
    .unwrap();
    let mut kek = [0u8; 32];
    argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
        .hash_password_into(
            b"pass",
            &hex::decode(kdf["salt"].as_str().unwrap()).unwrap(),
            &mut kek,
        )
        .unwrap();
    let nonce: [u8; 12] = hex::decode(json["nonce"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let id = json["id"].as_str().unwrap();
    let master_key = open(
        &kek,
        nonce,
        format!(
            "pgstrata key v2/main/{id}/{}/1",
            json["public_key"].as_str().unwrap()
        )
        .as_bytes(),
        &hex::decode(json["wrapped_key"].as_str().unwrap()).unwrap(),
    );
    // The X25519 private key, then the master key of generation 1.
    assert_eq!(master_key.len(), 64);
    let master_key = master_key[32..].to_vec();

    // A sealed object, written through the storage layer.
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::local(dir.path())
        .unwrap()
        .with_cipher(master.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let name = "main/backup/20260101-000000F/backup.manifest";
    rt.block_on(storage.put_new(name, bytes::Bytes::from_static(b"the manifest")))
        .unwrap();
    let stored = std::fs::read(dir.path().join(name)).unwrap();
    assert_eq!(&stored[..10], b"PGSTRSEA\x01\x01");
    assert_eq!(&stored[10..16], &[0u8; 6]);
    let key = hkdf(&master_key, &stored[16..32], b"pgstrata object v1");
    let mut aad = stored[..16].to_vec();
    aad.extend_from_slice(name.as_bytes());
    assert_eq!(open(&key, [0; 12], &aad, &stored[32..]), b"the manifest");

    // A sealed frame at offset 77 of a pack.
    let pack = "main/backup/20260101-000000F/pack/0-0";
    let mut frame = Vec::new();
    master
        .seal_frame_into(pack, 77, b"compressed frame", &mut frame)
        .unwrap();
    let key = hkdf(&master_key, &frame[..16], b"pgstrata frame v1");
    let mut aad = pack.as_bytes().to_vec();
    aad.extend_from_slice(&77u64.to_be_bytes());
    assert_eq!(open(&key, [0; 12], &aad, &frame[16..]), b"compressed frame");
}
