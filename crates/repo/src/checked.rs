//! Checked JSON objects: the stored form of manifests, manifest parts and resume
//! checkpoints (docs/repository-format.md, "Checked JSON objects").
//!
//! `<magic: 8 bytes>`, the BLAKE3 of the body (32 bytes), then the body: one zstd frame of
//! compact UTF-8 JSON. The checksum covers the compressed body, so an object is checked
//! before a byte of it is decompressed, and a manifest part can be checked against the hash
//! its manifest records without being decoded.
//!
//! One implementation for every writer and reader of the form: a backup streams a manifest
//! or part through [`Encoder`] as its entries come; a manifest rebuilt from a patch on
//! another host is stored in the canonical form [`encode_json`], which both sides of the
//! patch compute alike; readers check with [`body`], then decompress within a bound
//! (`codec::zstd_bounded_reader`).

use crate::{Error, Result};
use serde::Serialize;
use std::io::Write;

/// Bytes before the body: the magic and the checksum.
pub(crate) const HEADER_LEN: usize = 40;

/// The zstd level of every body: the manifest's codec does not apply to it.
const LEVEL: i32 = 3;

/// The window of a body written as a stream ([`Encoder`]): 128 KiB, where level 3 would
/// take 2 MiB. Entries repeat their neighbours' keys and paths, not text a megabyte back:
/// a manifest part of 32,768 entries came out 7 % smaller with it (1.76 MB against 1.90),
/// the encoder's state fell from 3.7 MiB to about 1 MiB, and a reader's from 2.6 MiB to
/// a few hundred KiB (a decoder holds the window the frame declares).
const STREAM_WINDOW_LOG: u32 = 17;

/// `value` as a checked object, its JSON compressed as it is written (never held whole).
pub(crate) fn encode(magic: &[u8; 8], value: &impl Serialize) -> Vec<u8> {
    let mut enc = Encoder::new(magic);
    serde_json::to_writer(enc.writer(), value).expect("serialize into memory");
    enc.finish()
}

/// The JSON text `json` as a checked object, compressed in one call: the canonical form
/// that both the writer and the holder of a manifest patch compute from the same JSON
/// (`manifest::patch`). Other bytes than [`encode`] may give for the same JSON (a
/// streamed frame does not record its content size), read the same.
pub(crate) fn encode_json(magic: &[u8; 8], json: &[u8]) -> Vec<u8> {
    let body = zstd::bulk::compress(json, LEVEL).expect("zstd into memory");
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(blake3::hash(&body).as_bytes());
    out.extend_from_slice(&body);
    out
}

/// A checked object written a piece at a time: a manifest's part is compressed as its
/// entries come, and never held as entries.
pub(crate) struct Encoder {
    json: std::io::BufWriter<zstd::stream::write::Encoder<'static, Vec<u8>>>,
}

impl Encoder {
    pub fn new(magic: &[u8; 8]) -> Encoder {
        let mut out = Vec::with_capacity(64 << 10);
        out.extend_from_slice(magic);
        out.extend_from_slice(&[0; 32]);
        let mut enc = zstd::stream::write::Encoder::new(out, LEVEL).expect("zstd encoder");
        enc.window_log(STREAM_WINDOW_LOG).expect("zstd window");
        Encoder {
            json: std::io::BufWriter::with_capacity(64 << 10, enc),
        }
    }

    /// Where the JSON goes. Writes to memory: they do not fail.
    pub fn writer(&mut self) -> &mut impl Write {
        &mut self.json
    }

    /// The JSON text `raw`, as it is.
    pub fn raw(&mut self, raw: &[u8]) {
        self.json.write_all(raw).expect("compress into memory");
    }

    pub fn finish(self) -> Vec<u8> {
        let Ok(enc) = self.json.into_inner() else {
            panic!("compress into memory")
        };
        let mut out = enc.finish().expect("zstd into memory");
        let hash = blake3::hash(&out[HEADER_LEN..]);
        out[8..HEADER_LEN].copy_from_slice(hash.as_bytes());
        out
    }
}

/// The compressed body of `obj`, read from `what`, once its length, its magic and its
/// checksum are checked; damage otherwise, naming `what` and the kind of object (`noun`:
/// "manifest", "resume checkpoint").
pub(crate) fn body<'a>(obj: &'a [u8], magic: &[u8; 8], what: &str, noun: &str) -> Result<&'a [u8]> {
    if obj.len() < HEADER_LEN || &obj[..8] != magic {
        return Err(Error::corrupt(format!(
            "{what}: not a pgstrata {noun} (bad header)"
        )));
    }
    if blake3::hash(&obj[HEADER_LEN..]).as_bytes() != checksum(obj) {
        return Err(Error::corrupt(format!(
            "{what}: {noun} fails its checksum: the repository is damaged"
        )));
    }
    Ok(&obj[HEADER_LEN..])
}

/// The checksum `obj` records (bytes 8..40): the BLAKE3 of its body. What a manifest
/// records of each of its parts, and what a manifest patch names its result by.
pub(crate) fn checksum(obj: &[u8]) -> &[u8] {
    &obj[8..HEADER_LEN]
}
