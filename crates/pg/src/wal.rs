//! A WAL decoder for block-change tracking (PostgreSQL 14-18).
//!
//! It reads one WAL segment and reports which relation blocks the records in it touch, and
//! the records that change relation files wholesale: SMGR create and truncate, transaction
//! commit/abort with dropped relations, database create and drop, and WAL switch. It does
//! not replay anything: block references are read from record headers, full-page images
//! and block data are skipped, not decompressed. Every complete record's CRC-32C is checked.
//!
//! Layout facts (src/include/access/xlog_internal.h, xlogrecord.h; xlogreader.c):
//! pages of `page_size` bytes start with a 24-byte header (40 bytes on a segment's first
//! page); records are 8-byte aligned, have a 24-byte header, and may continue across pages
//! and segments. A record that started in the previous segment is skipped here (its block
//! headers were read when that segment was decoded); a record that runs past the end of
//! this segment is read as far as its block headers go, and if they are cut, the segment
//! says so (`incomplete_tail`) so that a user of the map falls back to scanning.
//!
//! [`SegmentDecoder`] takes the pages as they are read, so a reader of `pg_wal` holds a
//! buffer rather than the segment. Most records of a busy cluster touch the same few pages
//! again; those references are caught by a small table of recent ones before the maps.

use crate::{invalid, unsupported, Result};
use std::collections::{BTreeMap, BTreeSet};

/// A relation fork: tablespace, database, relation file number, fork (0 main, 1 fsm, 2 vm,
/// 3 init).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelFork {
    pub spc: u32,
    pub db: u32,
    pub rel: u32,
    pub fork: u8,
}

/// What one segment changes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SegmentChanges {
    /// Blocks referenced by records (modified, or written as full-page images).
    pub blocks: BTreeMap<RelFork, BTreeSet<u32>>,
    /// Forks created (SMGR create): everything in them is new.
    pub created: BTreeSet<RelFork>,
    /// Forks truncated, with the smallest length in blocks they were cut to.
    pub truncated: BTreeMap<RelFork, u32>,
    /// Relations dropped at commit (or abort of their creating transaction): (spc, db, rel).
    pub dropped: BTreeSet<(u32, u32, u32)>,
    /// Databases created by copying files without WAL-logging blocks (FILE_COPY strategy,
    /// and every CREATE DATABASE before PG15), or dropped: (spc, db).
    pub databases: BTreeSet<(u32, u32)>,
    /// Resource managers seen that this decoder does not understand (custom, >= 128).
    pub unknown_rmgrs: BTreeSet<u8>,
    /// A record at the end of the segment whose block headers are cut off.
    pub incomplete_tail: bool,
    /// The segment ended with an XLOG SWITCH record.
    pub switched: bool,
    /// A parameter-change record set wal_level to minimal: until the next one, some
    /// operations (writes to relation files created in the same transaction) skip WAL.
    pub wal_level_minimal: bool,
    pub records: u64,
}

impl SegmentChanges {
    /// Add what `with` lists and `without` does not: the changes of the records `with`
    /// decoded beyond `without` (a record cut at a segment end, decoded whole).
    pub fn add_difference(&mut self, with: &SegmentChanges, without: &SegmentChanges) {
        for (fork, blocks) in &with.blocks {
            let old = without.blocks.get(fork);
            let new: Vec<u32> = blocks
                .iter()
                .filter(|b| old.is_none_or(|o| !o.contains(b)))
                .copied()
                .collect();
            if !new.is_empty() {
                self.blocks.entry(*fork).or_default().extend(new);
            }
        }
        self.created
            .extend(with.created.difference(&without.created).copied());
        for (fork, len) in &with.truncated {
            if without.truncated.get(fork) != Some(len) {
                let e = self.truncated.entry(*fork).or_insert(*len);
                *e = (*e).min(*len);
            }
        }
        self.dropped
            .extend(with.dropped.difference(&without.dropped).copied());
        self.databases
            .extend(with.databases.difference(&without.databases).copied());
        self.unknown_rmgrs.extend(
            with.unknown_rmgrs
                .difference(&without.unknown_rmgrs)
                .copied(),
        );
        self.wal_level_minimal |= with.wal_level_minimal && !without.wal_level_minimal;
    }
}

/// Whether a segment (or page) starts with the continuation of a record begun before it.
pub fn starts_with_continuation(seg: &[u8]) -> bool {
    seg.len() >= SHORT_PHD && u16_at(seg, 2) & XLP_FIRST_IS_CONTRECORD != 0 && u32_at(seg, 16) > 0
}

const XLP_FIRST_IS_CONTRECORD: u16 = 0x0001;
const XLP_LONG_HEADER: u16 = 0x0002;
const SHORT_PHD: usize = 24;
const LONG_PHD: usize = 40;
const RECORD_HEADER: usize = 24;

const RM_XLOG: u8 = 0;
/// `WalLevel`: minimal 0, replica 1, logical 2.
const WAL_LEVEL_REPLICA: i32 = 1;
const RM_XACT: u8 = 1;
const RM_SMGR: u8 = 2;
const RM_DBASE: u8 = 4;

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

/// The page header magic of each major (XLOG_PAGE_MAGIC).
pub fn page_magic(major: u32) -> Option<u16> {
    Some(match major {
        14 => 0xD10D,
        15 => 0xD110,
        16 => 0xD113,
        17 => 0xD116,
        18 => 0xD118,
        _ => return None,
    })
}

/// Decode one segment of a server of `major`, whose pages are `page_size` bytes.
pub fn decode_segment(seg: &[u8], major: u32, page_size: usize) -> Result<SegmentChanges> {
    decode_segment_until(seg, major, page_size, None, u64::MAX)
}

/// Decode a segment that may still be being written (read from `pg_wal`): pages whose
/// address is not `seg_start` plus their offset are left over from a recycled segment and
/// end the decoding, and so does the first record starting at or after LSN `until`. Records
/// before `until` are required to be complete and valid.
pub fn decode_segment_until(
    seg: &[u8],
    major: u32,
    page_size: usize,
    seg_start: Option<u64>,
    until: u64,
) -> Result<SegmentChanges> {
    if seg.is_empty() {
        return Err(invalid(
            "WAL segment",
            format!("0 bytes is not a whole number of {page_size}-byte pages"),
        ));
    }
    let mut decoder = SegmentDecoder::new(major, page_size, seg_start, until)?;
    decoder.feed(seg)?;
    Ok(decoder.finish())
}

/// A segment decoded as its pages come, so that a reader of a file holds a buffer, not the
/// 16 MB segment: [`feed`](Self::feed) whole pages in order (a segment followed by the next
/// one, to read a record cut at its end whole), then [`finish`](Self::finish).
pub struct SegmentDecoder {
    major: u32,
    magic: u16,
    page_size: usize,
    seg_start: Option<u64>,
    until: u64,
    /// Pages fed so far.
    page_no: usize,
    /// Bytes of the record being gathered across page headers.
    rec: Vec<u8>,
    /// Total length of the record being gathered (0: none).
    want: usize,
    /// Continuation bytes of a record from the previous segment still to skip.
    skip: usize,
    /// Decoding has ended (end of written WAL, `until`, a WAL switch).
    done: bool,
    recent: RecentBlocks,
    out: SegmentChanges,
}

impl SegmentDecoder {
    /// A decoder of a segment starting at LSN `seg_start` (when known, recycled pages are
    /// recognized by their address) that stops at the first record at or after `until`.
    pub fn new(
        major: u32,
        page_size: usize,
        seg_start: Option<u64>,
        until: u64,
    ) -> Result<SegmentDecoder> {
        let magic = page_magic(major)
            .ok_or_else(|| unsupported("WAL", format!("PostgreSQL {major} is not supported")))?;
        if page_size < 64 || !page_size.is_multiple_of(8) {
            return Err(invalid(
                "WAL",
                format!("page size {page_size} is not a multiple of 8 of at least 64 bytes"),
            ));
        }
        Ok(SegmentDecoder {
            major,
            magic,
            page_size,
            seg_start,
            until,
            page_no: 0,
            rec: Vec::new(),
            want: 0,
            skip: 0,
            done: false,
            recent: RecentBlocks::new(),
            out: SegmentChanges::default(),
        })
    }

    /// Decode the next pages (a whole number of them). Returns whether more are wanted:
    /// false once decoding has ended, and the rest of the segment need not be read.
    pub fn feed(&mut self, pages: &[u8]) -> Result<bool> {
        if !pages.len().is_multiple_of(self.page_size) {
            return Err(invalid(
                "WAL segment",
                format!(
                    "{} bytes is not a whole number of {}-byte pages",
                    (self.page_no * self.page_size + pages.len()),
                    self.page_size
                ),
            ));
        }
        for page in pages.chunks(self.page_size) {
            if self.done {
                break;
            }
            self.page(page)?;
            self.page_no += 1;
        }
        Ok(!self.done)
    }

    /// What the records decoded change. A record still being gathered (it runs past the
    /// pages fed) gives its block references if its headers are there, else
    /// `incomplete_tail`.
    pub fn finish(mut self) -> SegmentChanges {
        if self.want > 0 {
            let rec = std::mem::take(&mut self.rec);
            if parse_record(&rec, self.major, &mut self.recent, &mut self.out).is_err() {
                self.out.incomplete_tail = true;
            }
        }
        self.out
    }

    fn page(&mut self, page: &[u8]) -> Result<()> {
        let Some(page_addr) = self.page_addr(page)? else {
            return self.end();
        };
        match self.continue_record(page)? {
            Some(pos) => self.records_from(page, page_addr, pos),
            None => Ok(()),
        }
    }

    /// The WAL address of `page` from its header, or `None` where written WAL ended before
    /// it (an error on a segment's first page: that is not this version's WAL).
    #[inline]
    fn page_addr(&self, page: &[u8]) -> Result<Option<u64>> {
        let page_no = self.page_no;
        if u16_at(page, 0) != self.magic {
            if page_no == 0 {
                return Err(invalid(
                    "WAL segment",
                    format!(
                        "page magic {:#06x} is not PostgreSQL {}'s",
                        u16_at(page, 0),
                        self.major
                    ),
                ));
            }
            // Pages past the end of written WAL (a .partial segment, recycled bytes).
            return Ok(None);
        }
        let page_addr = u64::from_le_bytes(page[8..16].try_into().unwrap());
        if let Some(start) = self.seg_start {
            if page_addr != start + (page_no * self.page_size) as u64 {
                return Ok(None); // a recycled page: written WAL ends before it
            }
        }
        Ok(Some(page_addr))
    }

    /// Take what `page` holds of a record begun on an earlier page (skipped if it began in
    /// the previous segment, gathered otherwise): where the first record starting on this
    /// page is, or `None` when nothing more starts on it (the record goes on, or decoding
    /// ended).
    #[inline]
    fn continue_record(&mut self, page: &[u8]) -> Result<Option<usize>> {
        let page_no = self.page_no;
        let info = u16_at(page, 2);
        let rem_len = u32_at(page, 16) as usize;
        let mut pos = if info & XLP_LONG_HEADER != 0 {
            LONG_PHD
        } else {
            SHORT_PHD
        };
        if page_no == 0 && info & XLP_FIRST_IS_CONTRECORD != 0 {
            self.skip = rem_len;
        }
        if self.skip > 0 {
            let n = self.skip.min(page.len() - pos);
            self.skip -= n;
            if self.skip > 0 {
                return Ok(None);
            }
            pos = align8(pos + n);
        } else if self.want > 0 {
            if info & XLP_FIRST_IS_CONTRECORD == 0 {
                return Err(invalid(
                    "WAL segment",
                    format!(
                        "page {page_no} does not continue the record in progress (have {} of {} bytes)",
                        self.rec.len(),
                        self.want
                    ),
                ));
            }
            let n = (self.want - self.rec.len()).min(page.len() - pos);
            self.rec.extend_from_slice(&page[pos..pos + n]);
            pos += n;
            if self.rec.len() < self.want {
                return Ok(None);
            }
            finish_record(&self.rec, self.major, &mut self.recent, &mut self.out)?;
            self.rec.clear();
            self.want = 0;
            if self.out.switched {
                self.end()?;
                return Ok(None);
            }
            pos = align8(pos);
        }
        Ok(Some(pos))
    }

    /// Decode the records starting on `page` (at `page_addr`) from `pos`; one running past
    /// the page is kept in `rec` to be continued.
    #[inline]
    fn records_from(&mut self, page: &[u8], page_addr: u64, mut pos: usize) -> Result<()> {
        let page_no = self.page_no;
        // A record header may be split across pages, but its length (the first field) is
        // always on the page where the record starts.
        while pos + 4 <= page.len() {
            if page_addr + pos as u64 >= self.until {
                return self.end();
            }
            let tot_len = u32_at(page, pos) as usize;
            if tot_len == 0 {
                // End of written WAL in this segment.
                return self.end();
            }
            if tot_len < RECORD_HEADER {
                return Err(invalid(
                    "WAL segment",
                    format!("record at page {page_no} offset {pos} has length {tot_len}"),
                ));
            }
            let avail = page.len() - pos;
            if tot_len > avail {
                self.rec.clear();
                self.rec.extend_from_slice(&page[pos..]);
                self.want = tot_len;
                return Ok(());
            }
            finish_record(
                &page[pos..pos + tot_len],
                self.major,
                &mut self.recent,
                &mut self.out,
            )?;
            if self.out.switched {
                return self.end();
            }
            pos = align8(pos + tot_len);
        }
        Ok(())
    }

    /// Decoding ends here: nothing after this point belongs to the segment's records (a
    /// record in progress is still read as far as it goes, by `finish`).
    fn end(&mut self) -> Result<()> {
        self.done = true;
        Ok(())
    }
}

/// Block references seen lately, so that a block referenced again (the same few hot pages,
/// record after record) is not looked up in the maps again: a direct-mapped table indexed
/// by a hash of the reference. A miss only costs the map insertion it would have cost
/// anyway, so a collision is harmless.
struct RecentBlocks {
    slots: Box<[(RelFork, u32)]>,
}

impl RecentBlocks {
    /// A power of two: a slot is the top bits of the hash.
    const SLOTS: usize = 1024;
    /// A fork no record names (fork numbers stop at 3), so empty slots never match.
    const EMPTY: (RelFork, u32) = (
        RelFork {
            spc: 0,
            db: 0,
            rel: 0,
            fork: u8::MAX,
        },
        0,
    );

    fn new() -> RecentBlocks {
        RecentBlocks {
            slots: vec![Self::EMPTY; Self::SLOTS].into_boxed_slice(),
        }
    }

    /// Record a reference to `blkno` of `fork` in `out`.
    fn insert(&mut self, fork: RelFork, blkno: u32, out: &mut SegmentChanges) {
        let h = (fork.rel as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(
                (blkno as u64 ^ ((fork.fork as u64) << 32)).wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
            );
        let slot = &mut self.slots[(h >> (64 - Self::SLOTS.trailing_zeros())) as usize];
        if *slot != (fork, blkno) {
            *slot = (fork, blkno);
            out.blocks.entry(fork).or_default().insert(blkno);
        }
    }
}

fn finish_record(
    rec: &[u8],
    major: u32,
    recent: &mut RecentBlocks,
    out: &mut SegmentChanges,
) -> Result<()> {
    let stored = u32_at(rec, 20);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[RECORD_HEADER..]), &rec[..20]);
    if crc != stored {
        return Err(invalid(
            "WAL record",
            format!("CRC mismatch (stored {stored:08x}, computed {crc:08x})"),
        ));
    }
    out.records += 1;
    parse_record(rec, major, recent, out)
}

fn short(what: &str) -> crate::Error {
    invalid(
        "WAL record",
        format!("{what} runs past the end of the record"),
    )
}

/// Read block references and the main data of one record. `rec` may be cut short (a record
/// continuing into the next segment): then it fails once it needs missing bytes.
fn parse_record(
    rec: &[u8],
    major: u32,
    recent: &mut RecentBlocks,
    out: &mut SegmentChanges,
) -> Result<()> {
    if rec.len() < RECORD_HEADER {
        return Err(short("record header"));
    }
    let info = rec[16];
    let rmid = rec[17];
    let (main_start, main_len) = read_block_headers(rec, major, recent, out)?;
    let main = rec.get(main_start..main_start + main_len);
    if rmid >= 128 {
        out.unknown_rmgrs.insert(rmid);
        return Ok(());
    }
    match rmid {
        RM_XLOG if info & 0xF0 == 0x40 => out.switched = true,
        RM_XLOG if info & 0xF0 == 0x60 => parse_parameter_change(main, out)?,
        RM_SMGR => parse_smgr(info, main.ok_or_else(|| short("SMGR main data"))?, out),
        RM_XACT => {
            let op = info & 0x70;
            if matches!(op, 0x00 | 0x20 | 0x30 | 0x40) && info & 0x80 != 0 {
                let m = main.ok_or_else(|| short("XACT main data"))?;
                parse_xact_dropped(m, out)?;
            }
        }
        RM_DBASE => parse_dbase(
            info,
            major,
            main.ok_or_else(|| short("DBASE main data"))?,
            out,
        ),
        _ => {}
    }
    Ok(())
}

/// Walk a record's block headers (after its fixed header), putting each block reference in
/// `out` through `recent`; the main data's offset and length in `rec`.
#[inline]
fn read_block_headers(
    rec: &[u8],
    major: u32,
    recent: &mut RecentBlocks,
    out: &mut SegmentChanges,
) -> Result<(usize, usize)> {
    let tot_len = u32_at(rec, 0) as usize;
    let mut p = RECORD_HEADER;
    let mut data_total = 0usize; // images + block data, after the headers
    let mut main_len = 0usize;
    let mut last: Option<(u32, u32, u32)> = None;
    let need = |p: usize, n: usize| -> Result<()> {
        if p + n > rec.len() {
            Err(short("block header"))
        } else {
            Ok(())
        }
    };
    let compressed_mask: u8 = if major >= 15 {
        0x04 | 0x08 | 0x10
    } else {
        0x02
    };
    // As DecodeXLogRecord: headers continue while the bytes left exceed the data announced.
    while p + data_total + main_len < tot_len {
        need(p, 1)?;
        let id = rec[p];
        match id {
            255 => {
                need(p, 2)?;
                main_len = rec[p + 1] as usize;
                p += 2;
            }
            254 => {
                need(p, 5)?;
                main_len = u32_at(rec, p + 1) as usize;
                p += 5;
            }
            253 => p += 3, // replication origin
            252 => p += 5, // top-level xid (PG14+)
            0..=32 => {
                need(p, 4)?;
                let fork_flags = rec[p + 1];
                let data_length = u16_at(rec, p + 2) as usize;
                p += 4;
                data_total += data_length;
                if fork_flags & 0x10 != 0 {
                    need(p, 5)?;
                    let img_len = u16_at(rec, p) as usize;
                    let bimg_info = rec[p + 4];
                    p += 5;
                    data_total += img_len;
                    if bimg_info & 0x01 != 0 && bimg_info & compressed_mask != 0 {
                        p += 2; // hole length
                    }
                }
                let rel = if fork_flags & 0x80 != 0 {
                    last.ok_or_else(|| {
                        invalid("WAL record", "SAME_REL without a previous block reference")
                    })?
                } else {
                    need(p, 12)?;
                    let r = (u32_at(rec, p), u32_at(rec, p + 4), u32_at(rec, p + 8));
                    p += 12;
                    r
                };
                last = Some(rel);
                need(p, 4)?;
                let blkno = u32_at(rec, p);
                p += 4;
                let fork = RelFork {
                    spc: rel.0,
                    db: rel.1,
                    rel: rel.2,
                    fork: fork_flags & 0x0F,
                };
                recent.insert(fork, blkno, out);
            }
            other => return Err(invalid("WAL record", format!("unknown block id {other}"))),
        }
    }
    Ok((p + data_total, main_len))
}

/// An XLOG parameter-change record (xl_parameter_change: MaxConnections,
/// max_worker_processes, max_wal_senders, max_prepared_xacts, max_locks_per_xact, wal_level
/// (int32 each), then bools): whether it sets wal_level below replica.
fn parse_parameter_change(main: Option<&[u8]>, out: &mut SegmentChanges) -> Result<()> {
    let m = main.ok_or_else(|| short("XLOG parameter-change main data"))?;
    if m.len() < 24 {
        return Err(short("XLOG parameter-change main data"));
    }
    if (u32_at(m, 20) as i32) < WAL_LEVEL_REPLICA {
        out.wal_level_minimal = true;
    }
    Ok(())
}

/// An SMGR record: a fork created, or a relation's forks truncated.
fn parse_smgr(info: u8, m: &[u8], out: &mut SegmentChanges) {
    match info & 0xF0 {
        0x10 if m.len() >= 16 => {
            out.created.insert(RelFork {
                spc: u32_at(m, 0),
                db: u32_at(m, 4),
                rel: u32_at(m, 8),
                fork: u32_at(m, 12) as u8,
            });
        }
        0x20 if m.len() >= 20 => {
            let blkno = u32_at(m, 0);
            let (spc, db, rel) = (u32_at(m, 4), u32_at(m, 8), u32_at(m, 12));
            let flags = u32_at(m, 16);
            for (flag, fork) in [(0x1, 0u8), (0x4, 1), (0x2, 2)] {
                if flags & flag != 0 {
                    // The FSM and VM are truncated to lengths derived from blkno; treat
                    // them as truncated to 0 so nothing stale survives.
                    let limit = if fork == 0 { blkno } else { 0 };
                    let e = out
                        .truncated
                        .entry(RelFork { spc, db, rel, fork })
                        .or_insert(limit);
                    *e = (*e).min(limit);
                }
            }
        }
        _ => {}
    }
}

/// A DBASE record: a database created by copying files (its blocks are not in the WAL), or
/// dropped.
fn parse_dbase(info: u8, major: u32, m: &[u8], out: &mut SegmentChanges) {
    let op = info & 0xF0;
    let (file_copy, wal_log, drop) = if major >= 15 {
        (0x00, Some(0x10), 0x20)
    } else {
        (0x00, None, 0x10)
    };
    if op == file_copy && m.len() >= 8 {
        out.databases.insert((u32_at(m, 4), u32_at(m, 0)));
    } else if Some(op) == wal_log {
        // Blocks are WAL-logged one by one; nothing to add.
    } else if op == drop && m.len() >= 8 {
        let db = u32_at(m, 0);
        // The count is bounded by the bytes present, not trusted.
        let n = (u32_at(m, 4) as usize).min((m.len() - 8) / 4);
        for i in 0..n {
            if let Some(spc) = m.get(8 + 4 * i..12 + 4 * i) {
                out.databases
                    .insert((u32::from_le_bytes(spc.try_into().unwrap()), db));
            }
        }
    }
}

/// Relations dropped by a commit or abort record (xl_xact_commit / xl_xact_abort with
/// XLOG_XACT_HAS_INFO): xact_time, xinfo, then optional dbinfo, subxacts, relfilelocators.
fn parse_xact_dropped(m: &[u8], out: &mut SegmentChanges) -> Result<()> {
    // Every read is checked: the counts come from the record and may lie.
    let count_at = |p: usize, what: &str| {
        m.get(p..p + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
            .ok_or_else(|| short(what))
    };
    let mut p = 8; // xact_time
    let xinfo = count_at(p, "XACT xinfo")?;
    p += 4;
    if xinfo & 0x1 != 0 {
        p += 8; // dbId, tsId
    }
    if xinfo & 0x2 != 0 {
        let n = count_at(p, "XACT subtransactions")?;
        p += 4 + 4 * n;
    }
    if xinfo & 0x4 != 0 {
        let n = count_at(p, "XACT dropped relations")?;
        p += 4;
        for i in 0..n {
            let o = p + 12 * i;
            if o + 12 > m.len() {
                return Err(short("XACT dropped relations"));
            }
            out.dropped
                .insert((u32_at(m, o), u32_at(m, o + 4), u32_at(m, o + 8)));
        }
    }
    Ok(())
}

/// Finds where transaction commits end in a segment as it is streamed, so that
/// `wal-receive` can store a commit's WAL at once (a synchronous commit waits for it)
/// without decoding every record: only record headers are read, and page headers skipped.
///
/// [`scan`](Self::scan) is given the segment's bytes from its start as they grow (any
/// length, not whole pages). It is a hint, not a check: bytes that do not look like WAL
/// (a zero length, the padding after a WAL switch) end the scan of the segment, and no
/// CRC is checked; the segment is verified when it is stored whole.
#[derive(Debug, Clone)]
pub struct CommitScanner {
    page_size: usize,
    /// Offset in the segment scanned to.
    pos: usize,
    /// Length of the record in progress (0: between records) and bytes of it seen.
    rec_len: usize,
    rec_seen: usize,
    /// The record in progress is a continuation from the previous segment (not read).
    rec_skipped: bool,
    /// Bytes 16 and 17 of the record header: xl_info, xl_rmid.
    info_rmid: [u8; 2],
    done: bool,
}

impl CommitScanner {
    /// A scanner of a segment from its first byte, with pages of `page_size` bytes.
    pub fn new(page_size: usize) -> CommitScanner {
        CommitScanner {
            page_size,
            pos: 0,
            rec_len: 0,
            rec_seen: 0,
            rec_skipped: false,
            info_rmid: [0; 2],
            done: false,
        }
    }

    /// Scan what `seg` (the segment from its start) holds beyond what was scanned: the
    /// offset just past the last record there that a synchronous commit waits for (commit,
    /// prepare, commit or abort of a prepared transaction), if any.
    pub fn scan(&mut self, seg: &[u8]) -> Option<usize> {
        let mut last = None;
        while !self.done && self.pos < seg.len() {
            let in_page = self.pos % self.page_size;
            if in_page == 0 {
                // A page header, whole, before anything else on the page.
                let long = u16_at_checked(seg, self.pos + 2).map(|i| i & XLP_LONG_HEADER != 0);
                let Some(long) = long else { break };
                let header = if long { LONG_PHD } else { SHORT_PHD };
                if seg.len() < self.pos + header {
                    break;
                }
                if self.pos == 0 && u16_at(seg, 2) & XLP_FIRST_IS_CONTRECORD != 0 {
                    // The end of a record begun in the previous segment.
                    self.rec_len = u32_at(seg, 16) as usize;
                    self.rec_seen = 0;
                    self.rec_skipped = true;
                }
                self.pos += header;
                continue;
            }
            if self.rec_len == 0 {
                // A record starts here; its length is always on this page.
                if seg.len() < self.pos + 4 {
                    break;
                }
                let len = u32_at(seg, self.pos) as usize;
                if len < RECORD_HEADER {
                    self.done = true; // end of written WAL, or padding after a switch
                    break;
                }
                (self.rec_len, self.rec_seen, self.rec_skipped) = (len, 0, false);
            }
            let page_end = self.pos - in_page + self.page_size;
            let n = (self.rec_len - self.rec_seen)
                .min(page_end - self.pos)
                .min(seg.len() - self.pos);
            for (i, slot) in self.info_rmid.iter_mut().enumerate() {
                let at = 16 + i;
                if !self.rec_skipped && (self.rec_seen..self.rec_seen + n).contains(&at) {
                    *slot = seg[self.pos + at - self.rec_seen];
                }
            }
            self.pos += n;
            self.rec_seen += n;
            if self.rec_seen == self.rec_len {
                let [info, rmid] = self.info_rmid;
                // XLOG_XACT_OPMASK: COMMIT 0x00, PREPARE 0x10, COMMIT_PREPARED 0x30,
                // ABORT_PREPARED 0x40.
                if !self.rec_skipped
                    && rmid == RM_XACT
                    && matches!(info & 0x70, 0x00 | 0x10 | 0x30 | 0x40)
                {
                    last = Some(self.pos);
                }
                self.rec_len = 0;
                self.pos = align8(self.pos).min(page_end);
            }
        }
        last
    }
}

fn u16_at_checked(b: &[u8], o: usize) -> Option<u16> {
    (b.len() >= o + 2).then(|| u16_at(b, o))
}
