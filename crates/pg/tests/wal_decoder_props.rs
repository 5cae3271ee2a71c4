//! Property tests of the WAL record decoder: archive-push runs it on every segment, so no
//! input, however damaged or crafted, may make it panic, loop or allocate without bound.
//! Segments are built here the way PostgreSQL lays them out (page headers, records that
//! continue across pages, CRC-32C), then decoded as they are and after random damage.

use pgstrata_pg::wal::{
    decode_segment, decode_segment_until, page_magic, CommitScanner, RelFork, SegmentChanges,
    SegmentDecoder,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const PAGE: usize = 8192;
const MAJOR: u32 = 15;

/// One block reference: (block id, fork, relation file number, block, bytes of block data).
type BlockRef = (u8, u8, u32, u32, u16);

/// A record with a 24-byte header, block headers, main-data header, block data, main data,
/// and a valid CRC.
fn record(rmid: u8, info: u8, blocks: &[BlockRef], main: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    for &(id, fork, rel, blk, len) in blocks {
        body.extend_from_slice(&[id % 33, (fork & 0x0F) | 0x20]);
        body.extend_from_slice(&len.to_le_bytes());
        for v in [1663u32, 5, rel, blk] {
            body.extend_from_slice(&v.to_le_bytes());
        }
    }
    if main.len() < 256 {
        body.extend_from_slice(&[255, main.len() as u8]);
    } else {
        body.push(254);
        body.extend_from_slice(&(main.len() as u32).to_le_bytes());
    }
    for &(.., len) in blocks {
        body.extend(std::iter::repeat_n(0xAB, len as usize));
    }
    body.extend_from_slice(main);
    let mut rec = Vec::with_capacity(24 + body.len());
    rec.extend_from_slice(&((24 + body.len()) as u32).to_le_bytes());
    rec.extend_from_slice(&[0u8; 12]); // xid, prev
    rec.extend_from_slice(&[info, rmid, 0, 0]);
    rec.extend_from_slice(&[0u8; 4]); // crc, below
    rec.extend_from_slice(&body);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[24..]), &rec[..20]);
    rec[20..24].copy_from_slice(&crc.to_le_bytes());
    rec
}

fn page_header(seg: &mut [u8], page: usize, rem_len: usize) {
    let at = page * PAGE;
    let long = page == 0;
    let info: u16 = if long { 0x0002 } else { 0 } | if rem_len > 0 { 0x0001 } else { 0 };
    seg[at..at + 2].copy_from_slice(&page_magic(MAJOR).unwrap().to_le_bytes());
    seg[at + 2..at + 4].copy_from_slice(&info.to_le_bytes());
    seg[at + 8..at + 16].copy_from_slice(&((at) as u64).to_le_bytes());
    seg[at + 16..at + 20].copy_from_slice(&(rem_len as u32).to_le_bytes());
}

/// Lay records out over `pages` pages; returns the segment and how many records it holds
/// whole.
fn segment(records: &[Vec<u8>], pages: usize) -> (Vec<u8>, usize) {
    let (seg, ends) = layout(records, pages);
    (seg, ends.len())
}

/// Lay records out over `pages` pages; returns the segment and the offset just past each
/// record it holds whole.
fn layout(records: &[Vec<u8>], pages: usize) -> (Vec<u8>, Vec<usize>) {
    let mut seg = vec![0u8; pages * PAGE];
    page_header(&mut seg, 0, 0);
    let (mut page, mut pos, mut ends) = (0, 40, Vec::new());
    for rec in records {
        let mut written = 0;
        while written < rec.len() {
            if pos == PAGE {
                page += 1;
                if page == pages {
                    return (seg, ends);
                }
                let rem = if written > 0 { rec.len() - written } else { 0 };
                page_header(&mut seg, page, rem);
                pos = 24;
            }
            let n = (rec.len() - written).min(PAGE - pos);
            let at = page * PAGE + pos;
            seg[at..at + n].copy_from_slice(&rec[written..written + n]);
            written += n;
            pos += n;
        }
        ends.push(page * PAGE + pos);
        pos = (pos + 7) & !7;
    }
    (seg, ends)
}

fn block_ref() -> impl Strategy<Value = BlockRef> {
    (0u8..4, 0u8..4, 16384u32..16400, 0u32..1000, 0u16..300)
}

/// Records of the resource managers the decoder reads main data of (XLOG, XACT, SMGR,
/// DBASE), others, and custom ones, with random main data.
fn any_record() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec![0u8, 1, 2, 4, 10, 130]),
        any::<u8>(),
        prop::collection::vec(block_ref(), 0..4),
        prop::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(|(rmid, info, blocks, main)| record(rmid, info, &blocks, &main))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The commit scanner, given a segment as it grows by pieces of any length, reports
    /// the end of the last commit (or prepare) record that each piece completes, and
    /// nothing for other records.
    #[test]
    fn the_commit_scanner_finds_every_commit_end(
        kinds in prop::collection::vec((prop::sample::select(vec![0u8, 1, 2, 10]), any::<u8>(), 0usize..9000), 1..30),
        cuts in prop::collection::vec(1usize..4 * PAGE, 0..12),
    ) {
        let records: Vec<Vec<u8>> = kinds
            .iter()
            .map(|&(rmid, info, len)| record(rmid, info, &[], &vec![7u8; len]))
            .collect();
        let (seg, ends) = layout(&records, 4);
        let commit_ends: Vec<usize> = ends
            .iter()
            .zip(&kinds)
            .filter(|(_, &(rmid, info, _))| rmid == 1 && matches!(info & 0x70, 0x00 | 0x10 | 0x30 | 0x40))
            .map(|(&end, _)| end)
            .collect();
        let mut cuts = cuts;
        cuts.push(seg.len());
        cuts.sort();
        cuts.dedup();
        let mut scanner = CommitScanner::new(PAGE);
        let mut from = 0;
        for cut in cuts {
            let expected = commit_ends.iter().filter(|&&e| e > from && e <= cut).max().copied();
            prop_assert_eq!(scanner.scan(&seg[..cut]), expected, "bytes {}..{}", from, cut);
            from = cut;
        }
    }

    /// Well-formed segments decode, counting every whole record.
    #[test]
    fn well_formed_segments_decode(records in prop::collection::vec(any_record(), 1..40)) {
        let (seg, whole) = segment(&records, 4);
        // Main data is random, so a record may be refused as malformed; it must not panic.
        if let Ok(c) = decode_segment(&seg, MAJOR, PAGE) {
            prop_assert!(c.records as usize <= whole);
        }
    }

    /// Damaged segments never panic: random bytes overwritten, anywhere.
    #[test]
    fn damaged_segments_never_panic(
        records in prop::collection::vec(any_record(), 1..30),
        damage in prop::collection::vec((0usize..4 * PAGE, any::<u8>()), 1..20),
        until in any::<u64>(),
    ) {
        let (mut seg, _) = segment(&records, 4);
        for (at, byte) in damage {
            seg[at] = byte;
        }
        let _ = decode_segment(&seg, MAJOR, PAGE);
        let _ = decode_segment_until(&seg, MAJOR, PAGE, Some(0), until);
    }

    /// Records whose CRC is recomputed after damage reach the record parser with any
    /// content: lengths, block ids and counts in main data that lie.
    #[test]
    fn forged_records_never_panic(
        rmid in prop::sample::select(vec![0u8, 1, 2, 4]),
        info in any::<u8>(),
        blocks in prop::collection::vec(block_ref(), 0..3),
        main in prop::collection::vec(any::<u8>(), 0..64),
        damage in prop::collection::vec((24usize..200, any::<u8>()), 0..8),
    ) {
        let mut rec = record(rmid, info, &blocks, &main);
        for (at, byte) in damage {
            if at < rec.len() {
                rec[at] = byte;
            }
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[24..]), &rec[..20]);
        rec[20..24].copy_from_slice(&crc.to_le_bytes());
        let (seg, _) = segment(&[rec], 2);
        let _ = decode_segment(&seg, MAJOR, PAGE);
    }

    /// Every block a whole record references is reported, however often and in whatever
    /// order the same blocks recur (heap records: main data is not read).
    #[test]
    fn every_referenced_block_is_reported(
        refs in prop::collection::vec(
            prop::collection::vec((0u8..4, 0u8..3, 16384u32..16387, 0u32..6, 0u16..40), 0..4),
            1..300,
        ),
    ) {
        let records: Vec<Vec<u8>> = refs.iter().map(|b| record(10, 0, b, &[])).collect();
        let (seg, whole) = segment(&records, 4);
        let mut expected: BTreeMap<RelFork, BTreeSet<u32>> = BTreeMap::new();
        for blocks in &refs[..whole] {
            for &(_, fork, rel, blk, _) in blocks {
                let fork = RelFork { spc: 1663, db: 5, rel, fork };
                expected.entry(fork).or_default().insert(blk);
            }
        }
        let got = decode_segment(&seg, MAJOR, PAGE).unwrap();
        prop_assert_eq!(got.records as usize, whole);
        prop_assert_eq!(got.blocks, expected);
    }

    /// Pages fed a few at a time decode as the whole segment does, damaged or not.
    #[test]
    fn pages_fed_in_pieces_decode_as_the_whole(
        records in prop::collection::vec(any_record(), 1..40),
        damage in prop::collection::vec((0usize..4 * PAGE, any::<u8>()), 0..3),
        pieces in prop::collection::vec(1usize..3, 4),
        until in prop::sample::select(vec![u64::MAX, 3 * PAGE as u64, 5000]),
    ) {
        let (mut seg, _) = segment(&records, 4);
        for (at, byte) in damage {
            seg[at] = byte;
        }
        let whole = decode_segment_until(&seg, MAJOR, PAGE, Some(0), until);
        let mut decoder = SegmentDecoder::new(MAJOR, PAGE, Some(0), until).unwrap();
        let mut rest = &seg[..];
        let mut fed: Result<SegmentChanges, String> = Err("not fed".into());
        for n in pieces {
            let (piece, after) = rest.split_at((n * PAGE).min(rest.len()));
            rest = after;
            match decoder.feed(piece) {
                Err(e) => {
                    fed = Err(e.to_string());
                    break;
                }
                Ok(true) if !rest.is_empty() => {}
                Ok(_) => {
                    fed = Ok(std::mem::replace(
                        &mut decoder,
                        SegmentDecoder::new(MAJOR, PAGE, Some(0), until).unwrap(),
                    )
                    .finish());
                    break;
                }
            }
        }
        prop_assert_eq!(whole.map_err(|e| e.to_string()), fed);
    }

    /// Pure noise with a valid first page header.
    #[test]
    fn noise_never_panics(noise in prop::collection::vec(any::<u8>(), 2 * PAGE)) {
        let mut seg = noise;
        page_header(&mut seg, 0, 0);
        let _ = decode_segment(&seg, MAJOR, PAGE);
        let _ = decode_segment(&seg, MAJOR, 64);
    }
}

/// The commit record that used to panic: XACT with HAS_INFO whose xinfo announces
/// subtransactions and dropped relations that the main data does not hold.
#[test]
fn a_commit_record_announcing_missing_counts_is_refused() {
    let mut main = vec![0u8; 12];
    main[8..12].copy_from_slice(&0x7u32.to_le_bytes());
    let rec = record(1, 0x80, &[], &main);
    let (seg, _) = segment(&[rec], 1);
    let err = decode_segment(&seg, MAJOR, PAGE).unwrap_err().to_string();
    assert!(err.contains("runs past the end"), "{err}");
}

/// A segment that starts with the end of a record begun in the previous one: the
/// continuation (here across a page boundary) is passed over, the commit after it found.
#[test]
fn the_commit_scanner_passes_over_a_continued_record() {
    let mut seg = vec![0u8; 2 * PAGE];
    let cont = PAGE + 100 - 40;
    page_header(&mut seg, 0, cont);
    page_header(&mut seg, 1, cont - (PAGE - 40));
    // Continuation bytes that would read as a commit record if taken for one.
    let fake = record(1, 0, &[], &[1; 50]);
    seg[40..40 + fake.len()].copy_from_slice(&fake);
    let commit = record(1, 0, &[], &[9; 30]);
    let at = PAGE + 24 + (cont - (PAGE - 40)).next_multiple_of(8);
    seg[at..at + commit.len()].copy_from_slice(&commit);
    let mut scanner = CommitScanner::new(PAGE);
    assert_eq!(scanner.scan(&seg[..PAGE]), None);
    assert_eq!(scanner.scan(&seg), Some(at + commit.len()));
}
