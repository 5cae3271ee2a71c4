//! Data pages: the header fields a backup looks at and PostgreSQL's page checksum.
//!
//! The checksum (src/include/storage/checksum_impl.h) views the page as rows of 32 u32
//! words, runs 32 FNV-1a-like lanes over it with pd_checksum taken as zero, folds them, mixes
//! in the absolute block number and maps the result into 1..=65535.

const N_SUMS: usize = 32;
const FNV_PRIME: u32 = 16_777_619;
const BASE_OFFSETS: [u32; N_SUMS] = [
    0x5B1F36E9, 0xB8525960, 0x02AB50AA, 0x1DE66D2A, 0x79FF467A, 0x9BB9F8A3, 0x217E7CD2, 0x83E13D2C,
    0xF8D4474F, 0xE39EB970, 0x42C6AE16, 0x993216FA, 0x7B093B5D, 0x98DAFF3C, 0xF718902A, 0x0B1C9CDB,
    0xE58F764B, 0x187636BC, 0x5D7B3BB1, 0xE73DE7DE, 0x92BEC979, 0xCCA6C0B2, 0x304A0979, 0x85AA43D4,
    0x783125BB, 0x6CA8EAA2, 0xE407EAC6, 0x4B5CFC3E, 0x9FBF8C76, 0x15CA20BE, 0xF2CA9FD3, 0x959BD756,
];

#[inline(always)]
fn mix(sum: u32, value: u32) -> u32 {
    let tmp = sum ^ value;
    tmp.wrapping_mul(FNV_PRIME) ^ (tmp >> 17)
}

/// The page's LSN (pd_lsn is stored as two u32 halves, high first).
pub fn page_lsn(page: &[u8]) -> u64 {
    let hi = u32::from_le_bytes(page[0..4].try_into().unwrap()) as u64;
    let lo = u32::from_le_bytes(page[4..8].try_into().unwrap()) as u64;
    (hi << 32) | lo
}

/// The checksum stored in the page header.
pub(crate) fn stored_checksum(page: &[u8]) -> u16 {
    u16::from_le_bytes([page[8], page[9]])
}

/// A new page (pd_upper == 0) carries no checksum; PostgreSQL accepts it only when all zero.
pub(crate) fn is_new(page: &[u8]) -> bool {
    u16::from_le_bytes([page[14], page[15]]) == 0
}

/// PostgreSQL's checksum of `page` as block number `blkno` (counted from the start of the
/// relation fork, across 1 GiB segment files).
pub fn checksum(page: &[u8], blkno: u32) -> u16 {
    let mut sums = BASE_OFFSETS;
    for (row_index, row) in page.chunks_exact(4 * N_SUMS).enumerate() {
        for (j, word) in row.chunks_exact(4).enumerate() {
            let mut v = u32::from_le_bytes(word.try_into().unwrap());
            if row_index == 0 && j == 2 {
                // Bytes 8..12 hold pd_checksum (low half) and pd_flags: checksum as zero.
                v &= 0xFFFF_0000;
            }
            sums[j] = mix(sums[j], v);
        }
    }
    for _ in 0..2 {
        for s in sums.iter_mut() {
            *s = mix(*s, 0);
        }
    }
    let folded = sums.iter().fold(0u32, |acc, s| acc ^ s) ^ blkno;
    ((folded % 65535) + 1) as u16
}

/// Outcome of checking one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageCheck {
    Valid,
    /// An all-zero new page: valid, nothing to check.
    Zero,
    /// Stored and computed checksum differ.
    Mismatch {
        stored: u16,
        computed: u16,
    },
}

/// Verify one page the way PostgreSQL's buffer manager would on read.
pub fn verify(page: &[u8], blkno: u32) -> PageCheck {
    // A non-zero page with pd_upper == 0 is damaged: it falls through to the checksum
    // check, which will almost certainly fail and report it.
    if is_new(page) && page.iter().all(|b| *b == 0) {
        return PageCheck::Zero;
    }
    let stored = stored_checksum(page);
    let computed = checksum(page, blkno);
    if stored == computed {
        PageCheck::Valid
    } else {
        PageCheck::Mismatch { stored, computed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_page_is_valid_and_a_flipped_bit_is_caught() {
        let page = vec![0u8; 8192];
        assert_eq!(verify(&page, 7), PageCheck::Zero);
        let mut page = vec![0u8; 8192];
        page[14] = 0x10; // pd_upper
        page[100] = 42;
        let c = checksum(&page, 3);
        page[8..10].copy_from_slice(&c.to_le_bytes());
        assert_eq!(verify(&page, 3), PageCheck::Valid);
        assert_ne!(
            verify(&page, 4),
            PageCheck::Valid,
            "block number is mixed in"
        );
        page[4000] ^= 1;
        assert!(matches!(verify(&page, 3), PageCheck::Mismatch { .. }));
    }
}
