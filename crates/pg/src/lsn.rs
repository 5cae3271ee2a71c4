//! Log sequence numbers and WAL segment file names.
//!
//! A WAL segment is named `TTTTTTTTXXXXXXXXYYYYYYYY`: timeline, then the segment number split
//! into a "log" part and a "segment within log" part, where one log holds 4 GiB of WAL. The
//! split depends on the segment size, which is why every function here takes it.

use std::fmt;
use std::str::FromStr;

/// A position in the WAL, printed the way PostgreSQL prints it (`16/B374D848`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Lsn> {
        let (hi, lo) = s.trim().split_once('/').ok_or_else(|| {
            crate::invalid(format!("LSN '{s}'"), "expected the form X/X in hexadecimal")
        })?;
        let parse = |p: &str| {
            u32::from_str_radix(p, 16).map_err(|_| {
                crate::invalid(format!("LSN '{s}'"), "expected the form X/X in hexadecimal")
            })
        };
        Ok(Lsn(((parse(hi)? as u64) << 32) | parse(lo)? as u64))
    }
}

impl Lsn {
    /// The segment number holding this position.
    pub fn segment(self, seg_size: u64) -> u64 {
        self.0 / seg_size
    }
}

/// Name of the WAL segment `segno` on `timeline`.
pub fn segment_name(timeline: u32, segno: u64, seg_size: u64) -> String {
    let per_log = 0x1_0000_0000u64 / seg_size;
    format!(
        "{:08X}{:08X}{:08X}",
        timeline,
        segno / per_log,
        segno % per_log
    )
}

/// Parse a 24-character segment name into (timeline, segment number).
pub fn parse_segment_name(name: &str, seg_size: u64) -> Option<(u32, u64)> {
    if name.len() < 24 || !name[..24].bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let tli = u32::from_str_radix(&name[0..8], 16).ok()?;
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let seg = u64::from_str_radix(&name[16..24], 16).ok()?;
    let per_log = 0x1_0000_0000u64 / seg_size;
    Some((tli, log * per_log + seg))
}

/// True for a plain 24-hex-digit WAL segment name (not .partial, .backup or .history).
pub fn is_segment_name(name: &str) -> bool {
    name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The segments that hold WAL from `start` up to and including the byte before `stop`,
/// as PostgreSQL needs them to make a backup consistent. `stop` itself lies in the last one
/// unless it sits exactly on a segment boundary.
pub fn segments_between(timeline: u32, start: Lsn, stop: Lsn, seg_size: u64) -> Vec<String> {
    let first = start.segment(seg_size);
    let last = if stop.0.is_multiple_of(seg_size) && stop.0 > start.0 {
        stop.0 / seg_size - 1
    } else {
        stop.segment(seg_size)
    };
    (first..=last.max(first))
        .map(|s| segment_name(timeline, s, seg_size))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    const SEG: u64 = 16 * 1024 * 1024;

    #[test]
    fn lsn_round_trip() {
        let l: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(l.0, 0x16_B374_D848);
        assert_eq!(l.to_string(), "16/B374D848");
        assert!("16B374D848".parse::<Lsn>().is_err());
    }

    #[test]
    fn names() {
        let l: Lsn = "1/2A000028".parse().unwrap();
        let n = segment_name(3, l.segment(SEG), SEG);
        assert_eq!(n, "00000003000000010000002A");
        assert_eq!(parse_segment_name(&n, SEG), Some((3, l.segment(SEG))));
        let segs = segments_between(
            1,
            "0/2000028".parse().unwrap(),
            "0/4000000".parse().unwrap(),
            SEG,
        );
        assert_eq!(
            segs,
            vec!["000000010000000000000002", "000000010000000000000003"]
        );
    }
}
