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
use crate::{Error, Result};

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

pub fn encode(raw: &[u8], compression: Compression) -> Vec<u8> {
    let payload = compression.compress(raw);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(1);
    out.push(compression.kind.id());
    out.extend_from_slice(&[0u8; 6]);
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(raw).as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Named;

    #[test]
    fn round_trip_and_damage() {
        let raw = vec![7u8; 100_000];
        for &kind in CompressType::ALL {
            let obj = encode(&raw, Compression::new(kind, None).unwrap());
            assert_eq!(decode(&obj, "x").unwrap(), raw);
            let mut bad = obj.clone();
            let last = bad.len() - 3;
            bad[last] ^= 0x40;
            assert!(decode(&bad, "x").is_err(), "{kind:?}");
        }
    }
}
