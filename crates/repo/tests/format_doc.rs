//! The format document's test vectors, checked against the code: the document is the
//! contract for independent readers and writers, so its examples must stay true.

use pgstrata_repo::codec::{CompressType, Compression};
use pgstrata_repo::{manifest, pack, wal};

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
    assert_eq!(pack::frame_check(b""), v);
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
    let obj = wal::encode(&raw, Compression::new(CompressType::Zst, None).unwrap());
    assert_eq!(&obj[..expected.len()], &expected[..]);
    assert_eq!(wal::decode(&obj, "vector").unwrap().len(), raw.len());
}
