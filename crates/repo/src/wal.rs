//! Archived WAL objects.
//!
//! ```text
//! offset size
//!  0      8   magic "PGSTRWAL"
//!  8      1   object format version (1)
//!  9      1   codec id (0 none, 1 gz, 2 lz4, 3 zst, 4 bz2)
//! 10      6   zero
//! 16      8   raw length, u64 little-endian
//! 24     32   BLAKE3 of the raw file
//! 56      …   the raw file as one stream of the codec
//! ```
//! The hash in the header lets archive-push compare a resubmitted file with the stored one
//! without decoding it, and lets archive-get prove what it returns is what was pushed.

use crate::codec::{decompress, CompressType, Compression};
use crate::{Error, Named, Result};

const MAGIC: &[u8; 8] = b"PGSTRWAL";
pub const HEADER_LEN: usize = 56;
/// The largest WAL file: PostgreSQL's largest segment size, 1 GiB.
pub(crate) const MAX_RAW_LEN: u64 = 1 << 30;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalHeader {
    pub codec: CompressType,
    pub(crate) raw_len: u64,
    pub hash: [u8; 32],
}

/// Encode a WAL file: its BLAKE3 hash (on a second thread) beside its compression with up to
/// `workers` threads ([`Compression::compress_parallel`]), so archive_command waits for the
/// slower of the two, not their sum.
pub fn encode(raw: &[u8], compression: Compression, workers: u32) -> Vec<u8> {
    let (hash, payload) = std::thread::scope(|scope| {
        let hash = scope.spawn(|| hash(raw));
        let payload = compression.compress_parallel(raw, workers);
        (hash.join().expect("hash thread"), payload)
    });
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(1);
    out.push(compression.kind.id());
    out.extend_from_slice(&[0u8; 6]);
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(&hash);
    out.extend_from_slice(&payload);
    out
}

pub fn hash(raw: &[u8]) -> [u8; 32] {
    *blake3::hash(raw).as_bytes()
}

pub fn parse_header(obj: &[u8], what: &str) -> Result<WalHeader> {
    if obj.len() < HEADER_LEN || &obj[..8] != MAGIC {
        return Err(Error::corrupt(format!(
            "{what}: not a pgstrata WAL object (bad header)"
        )));
    }
    if obj[8] != 1 {
        return Err(Error::new(
            crate::ErrorKind::Format,
            format!("{what}: WAL object version {} is not supported", obj[8]),
        ));
    }
    let codec = CompressType::from_id(obj[9])
        .ok_or_else(|| Error::corrupt(format!("{what}: unknown codec id {}", obj[9])))?;
    let raw_len = u64::from_le_bytes(obj[16..24].try_into().unwrap());
    // The length sizes the decode buffer: no WAL file is larger than the largest segment.
    if raw_len > MAX_RAW_LEN {
        return Err(Error::corrupt(format!(
            "{what}: header claims {raw_len} bytes, more than any WAL file ({MAX_RAW_LEN})"
        )));
    }
    Ok(WalHeader {
        codec,
        raw_len,
        hash: obj[24..56].try_into().unwrap(),
    })
}

/// Decode and verify a stored WAL object.
pub fn decode(obj: &[u8], what: &str) -> Result<Vec<u8>> {
    let h = parse_header(obj, what)?;
    let raw = decompress(h.codec, &obj[HEADER_LEN..], h.raw_len as usize, what)?;
    if hash(&raw) != h.hash {
        return Err(Error::corrupt(format!(
            "{what}: content does not match its recorded BLAKE3 hash"
        )));
    }
    Ok(raw)
}

/// Decode stored WAL object `obj` into `out` piece by piece, and check its length and hash
/// at the end. Decompression runs on this thread while a second one hashes and writes the
/// pieces before it, so archive-get waits for about the slower of the two; memory stays at a
/// few small buffers (no 16 MiB buffer to fault in and free per segment). What was written
/// to `out` is not the WAL file unless this returns `Ok`: write it somewhere PostgreSQL does
/// not look until then.
pub fn decode_to(obj: &[u8], what: &str, out: &mut (impl std::io::Write + Send)) -> Result<()> {
    use std::io::Read;
    use std::sync::mpsc::sync_channel;
    const PIECE: usize = 1 << 20;
    const PIECES_IN_FLIGHT: usize = 3;
    let h = parse_header(obj, what)?;
    let cannot_decode = |e: std::io::Error| {
        Error::with_source(
            crate::ErrorKind::Corrupt,
            format!("{what}: cannot decode {} data", h.codec.name()),
            e,
        )
    };
    let mut reader = crate::codec::reader(h.codec, &obj[HEADER_LEN..])
        .map_err(cannot_decode)?
        .take(h.raw_len + 1);
    let (full_tx, full_rx) = sync_channel::<Vec<u8>>(PIECES_IN_FLIGHT);
    let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(PIECES_IN_FLIGHT);
    std::thread::scope(|scope| {
        let sink = scope.spawn(move || -> std::io::Result<[u8; 32]> {
            let mut hasher = blake3::Hasher::new();
            for piece in full_rx {
                hasher.update(&piece);
                out.write_all(&piece)?;
                let _ = empty_tx.try_send(piece);
            }
            Ok(*hasher.finalize().as_bytes())
        });
        let mut decoded = 0u64;
        let produced = loop {
            let mut piece = empty_rx
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(PIECE));
            piece.resize(PIECE, 0);
            let n = match reader.read(&mut piece) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(cannot_decode(e)),
            };
            decoded += n as u64;
            piece.truncate(n);
            // A closed channel means the writer failed: its error is reported below.
            if decoded > h.raw_len || full_tx.send(piece).is_err() {
                break Ok(());
            }
        };
        drop(full_tx);
        let hashed = sink.join().expect("WAL write thread").map_err(|e| {
            Error::with_source(crate::ErrorKind::Storage, format!("{what}: write"), e)
        })?;
        produced?;
        if decoded != h.raw_len {
            return Err(Error::corrupt(format!(
                "{what}: decoded {decoded}{} bytes, expected {}",
                if decoded > h.raw_len { " or more" } else { "" },
                h.raw_len
            )));
        }
        if hashed != h.hash {
            return Err(Error::corrupt(format!(
                "{what}: content does not match its recorded BLAKE3 hash"
            )));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let raw = vec![7u8; 100_000];
        for &kind in CompressType::ALL {
            let obj = encode(&raw, Compression::new(kind, None).unwrap(), 2);
            assert_eq!(decode(&obj, "x").unwrap(), raw);
            let mut streamed = Vec::new();
            decode_to(&obj, "x", &mut streamed).unwrap();
            assert_eq!(streamed, raw);
            let mut bad = obj.clone();
            let last = bad.len() - 3;
            bad[last] ^= 0x40;
            assert!(decode(&bad, "x").is_err(), "{kind:?}");
            assert!(decode_to(&bad, "x", &mut Vec::new()).is_err(), "{kind:?}");
        }
    }
}
