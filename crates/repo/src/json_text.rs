//! The JSON text forms of typed fields of manifests and extents, kept exactly as format 1
//! writes them: the manifest holds numbers in memory but stores what PostgreSQL and people
//! read.
//!
//! A value that does not have its form fails decoding, and so the manifest is refused as
//! damaged (see `Manifest::decode`).

/// An LSN as PostgreSQL prints it: `X/X`, each part 1 to 8 hex digits (`0/5000028`).
pub(crate) mod lsn {
    use pgstrata_pg::lsn::Lsn;
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(lsn: &Lsn, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(lsn)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        parse(&text).ok_or_else(|| {
            de::Error::invalid_value(de::Unexpected::Str(&text), &"an LSN such as \"0/5000028\"")
        })
    }

    /// Strict: no sign, no spaces, no empty or overlong part (`Lsn::from_str` is lenient).
    fn parse(text: &str) -> Option<Lsn> {
        let (hi, lo) = text.split_once('/')?;
        let part = |p: &str| {
            ((1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(p, 16).ok())
                .flatten()
        };
        Some(Lsn(((part(hi)? as u64) << 32) | part(lo)? as u64))
    }
}

/// A block map: 16 lowercase hex digits (the big-endian digits of the u64) per block,
/// concatenated in block order.
pub(crate) mod block_hashes {
    use serde::{de, Deserializer, Serializer};
    use std::fmt::Write;
    use std::marker::PhantomData;

    const DIGITS: usize = 16;

    pub fn serialize<S: Serializer>(hashes: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let mut text = String::with_capacity(hashes.len() * DIGITS);
        for h in hashes {
            let _ = write!(text, "{h:016x}");
        }
        s.serialize_str(&text)
    }

    /// Into whatever list the field holds (`manifest::BlockHashes`).
    pub(crate) fn deserialize<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: FromIterator<u64>,
    {
        d.deserialize_str(Visitor(PhantomData))
    }

    struct Visitor<T>(PhantomData<T>);

    impl<T: FromIterator<u64>> de::Visitor<'_> for Visitor<T> {
        type Value = T;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("block_hashes: 16 lowercase hex digits for each block")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            let well_formed = text.len().is_multiple_of(DIGITS)
                && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
            if !well_formed {
                return Err(E::custom(format_args!(
                    "block_hashes holds {} characters, not 16 lowercase hex digits for each block",
                    text.len()
                )));
            }
            Ok(text
                .as_bytes()
                .chunks(DIGITS)
                .map(|h| {
                    let digits = std::str::from_utf8(h).expect("checked ASCII");
                    u64::from_str_radix(digits, 16).expect("checked hex digits")
                })
                .collect())
        }
    }
}

/// Lowercase hex digits of `bytes`, exactly `digits` of them, decoded; `None` for anything
/// else.
fn lower_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

/// A frame's check (`h`): XXH3-64 of its stored bytes as 16 lowercase hex digits, held as
/// the number (an extent of zeros has none).
pub(crate) mod frame_check {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(check: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match check {
            Some(h) => s.collect_str(&format_args!("{h:016x}")),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        super::lower_hex::<8>(&text)
            .map(|b| Some(u64::from_be_bytes(b)))
            .ok_or_else(|| {
                de::Error::custom(format_args!("h {text:?} is not 16 lowercase hex digits"))
            })
    }
}

/// A file's content hash: BLAKE3 as 64 lowercase hex digits, or `""` when it was not
/// computed (a WAL-tracked copy), held as the 32 bytes.
pub(crate) mod content_hash {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(hash: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match hash {
            Some(h) => s.serialize_str(&hex::encode(h)),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        if text.is_empty() {
            return Ok(None);
        }
        super::lower_hex::<32>(&text)
            .map(Some)
            .ok_or_else(|| de::Error::custom("hash is neither empty nor 64 lowercase hex digits"))
    }
}

/// A BLAKE3 that must be there: 64 lowercase hex digits, held as the 32 bytes.
pub(crate) mod hash32 {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(hash: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(hash))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        super::lower_hex::<32>(&text)
            .ok_or_else(|| de::Error::custom("hash is not 64 lowercase hex digits"))
    }
}
