//! The JSON text forms of typed manifest fields, kept exactly as format 1 writes them:
//! the manifest holds numbers in memory but stores what PostgreSQL and people read.
//!
//! A value that does not have its form fails decoding, and so the manifest is refused as
//! damaged (see `Manifest::decode`).

/// An LSN as PostgreSQL prints it: `X/X`, each part 1 to 8 hex digits (`0/5000028`).
pub(super) mod lsn {
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
pub(super) mod block_hashes {
    use serde::{de, Deserializer, Serializer};
    use std::fmt::Write;

    const DIGITS: usize = 16;

    pub fn serialize<S: Serializer>(hashes: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let mut text = String::with_capacity(hashes.len() * DIGITS);
        for h in hashes {
            let _ = write!(text, "{h:016x}");
        }
        s.serialize_str(&text)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_str(Visitor)
    }

    struct Visitor;

    impl de::Visitor<'_> for Visitor {
        type Value = Vec<u64>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("block_hashes: 16 lowercase hex digits for each block")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u64>, E> {
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
