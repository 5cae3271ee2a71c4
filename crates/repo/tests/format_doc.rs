//! The format document's test vectors, checked against the code: the document is the
//! contract for independent readers and writers, so its examples must stay true.

use pgstrata_repo::codec::{CompressType, Compression};
use pgstrata_repo::{chunk, manifest, wal};

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
    let obj = wal::encode(&raw, Compression::new(CompressType::Zst, None).unwrap(), 1);
    assert_eq!(&obj[..expected.len()], &expected[..]);
    assert_eq!(wal::decode(&obj, "vector").unwrap().len(), raw.len());
    let v = quoted_after("With a block-change map of 300 bytes inside, its first 16 bytes are\n`");
    let expected: Vec<u8> = v
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let with_map = wal::with_map(&obj, &[7u8; 300]);
    assert_eq!(&with_map[..expected.len()], &expected[..]);
    assert_eq!(wal::decode(&with_map, "vector").unwrap().len(), raw.len());
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
