//! Compression codecs. Each frame and each WAL object is one complete stream of its codec,
//! so any of them decodes on its own.

use crate::Named;
use crate::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

// Names as configured (`compress-type`).
crate::named! {
    #[derive(Serialize, Deserialize, Hash)]
    #[serde(rename_all = "lowercase")]
    pub enum CompressType { None = "none", Gz = "gz", Lz4 = "lz4", Zst = "zst", Bz2 = "bz2" }
}

impl CompressType {
    /// The level used when none is configured (pgBackRest's defaults).
    pub fn default_level(self) -> i32 {
        match self {
            CompressType::None => 0,
            CompressType::Gz => 6,
            CompressType::Lz4 => 1,
            CompressType::Zst => 3,
            CompressType::Bz2 => 9,
        }
    }

    /// Allowed levels, for validating configuration.
    pub fn level_range(self) -> (i32, i32) {
        match self {
            CompressType::None => (0, 0),
            CompressType::Gz => (0, 9),
            CompressType::Lz4 => (1, 1),
            CompressType::Zst => (-7, 22),
            CompressType::Bz2 => (1, 9),
        }
    }

    /// One byte identifying the codec inside WAL object headers.
    pub fn id(self) -> u8 {
        match self {
            CompressType::None => 0,
            CompressType::Gz => 1,
            CompressType::Lz4 => 2,
            CompressType::Zst => 3,
            CompressType::Bz2 => 4,
        }
    }

    pub(crate) fn from_id(id: u8) -> Option<CompressType> {
        CompressType::ALL.iter().copied().find(|c| c.id() == id)
    }
}

/// A codec with its level, ready to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compression {
    #[serde(rename = "type")]
    pub kind: CompressType,
    pub level: i32,
}

/// Raw bytes per zstd frame of a WAL object ([`Compression::compress_read`]). A frame
/// of 512 KiB fits a core's L2 cache on many servers (512 KiB to 2 MiB), where zstd's
/// match finder then finds the bytes it compares: level 3 compresses WAL 4-10 % faster than in 1 MiB
/// frames, to the same size within 0.3 % (measured on pgbench WAL). Writers before
/// 2026-11-27 used 1 MiB; readers take any size.
pub const WAL_FRAME: usize = 512 << 10;

impl Compression {
    pub fn new(kind: CompressType, level: Option<i32>) -> Result<Compression> {
        let level = level.unwrap_or(kind.default_level());
        let (lo, hi) = kind.level_range();
        if level < lo || level > hi {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "compress-level {level} is out of range for {}: allowed {lo}..={hi}",
                    kind.name()
                ),
            ));
        }
        Ok(Compression { kind, level })
    }

    /// Compress all of `input` (a WAL file) onto the end of `out` as one stream of the
    /// codec, reading it in pieces of [`WAL_FRAME`] bytes, and return how many bytes were
    /// read. `each` sees every piece, in order, before it is compressed (archive-push hashes
    /// and decodes the segment there), so no more than `workers` + 2 pieces are held at
    /// once (one being read, one queued, one per worker): a 16 MiB segment is never in
    /// memory whole.
    ///
    /// zstd compresses each piece as an independent frame, on up to `workers` threads, the
    /// frames concatenated: one standard stream, which any zstd decoder reads in order, and
    /// whose frames a reader can also decode in parallel (archive-get,
    /// `wal_object::decode_to`). Other codecs stream on this thread.
    pub fn compress_read(
        &self,
        input: &mut dyn Read,
        workers: u32,
        out: &mut Vec<u8>,
        each: &mut dyn FnMut(&[u8]),
    ) -> std::io::Result<u64> {
        let mut piece = Vec::new();
        let mut total = 0u64;
        let mut next_piece = |piece: &mut Vec<u8>| -> std::io::Result<usize> {
            let n = read_piece(input, piece, WAL_FRAME)?;
            total += n as u64;
            if n > 0 {
                each(piece);
            }
            Ok(n)
        };
        match self.kind {
            CompressType::Zst if workers > 1 => {
                self.zstd_frames_in_parallel(&mut next_piece, workers as usize, out)?
            }
            CompressType::Zst => {
                // On this thread, whose compression context lives on from the last file (a
                // new thread would build one for every file).
                while next_piece(&mut piece)? > 0 {
                    out.extend_from_slice(&self.compress(&piece));
                }
            }
            CompressType::None => {
                while next_piece(&mut piece)? > 0 {
                    out.extend_from_slice(&piece);
                }
            }
            _ => {
                let mut enc = self.stream_encoder(std::mem::take(out));
                while next_piece(&mut piece)? > 0 {
                    enc.write_all(&piece)?;
                }
                *out = enc.finish()?;
            }
        }
        Ok(total)
    }

    /// The zstd frames of the pieces `next_piece` fills, compressed on `workers` threads
    /// and appended to `out` in order. Each piece buffer goes back to the reader once its
    /// frame is made; frames done out of order wait (they are small) for the ones before.
    fn zstd_frames_in_parallel(
        &self,
        next_piece: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<usize>,
        workers: usize,
        out: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        use std::sync::mpsc::{channel, sync_channel};
        let (work_tx, work_rx) = sync_channel::<(usize, Vec<u8>)>(workers + 1);
        let work_rx = std::sync::Mutex::new(work_rx);
        let (done_tx, done_rx) = channel::<(usize, Vec<u8>, Vec<u8>)>();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let done_tx = done_tx.clone();
                let work_rx = &work_rx;
                scope.spawn(move || loop {
                    let next = work_rx.lock().expect("no panics while held").recv();
                    let Ok((i, piece)) = next else { return };
                    let frame = self.compress(&piece);
                    if done_tx.send((i, frame, piece)).is_err() {
                        return;
                    }
                });
            }
            drop(done_tx);
            let mut waiting = std::collections::BTreeMap::new();
            let mut written = 0;
            let mut free: Vec<Vec<u8>> = Vec::new();
            let mut place = |(i, frame, piece): (usize, Vec<u8>, Vec<u8>),
                             free: &mut Vec<Vec<u8>>| {
                free.push(piece);
                waiting.insert(i, frame);
                while let Some(frame) = waiting.remove(&written) {
                    out.extend_from_slice(&frame);
                    written += 1;
                }
            };
            // Pieces held: one being compressed by each worker, one queued for the first
            // to finish, and the one being read.
            let (mut sent, mut in_flight) = (0, 0);
            let read = loop {
                while let Ok(done) = done_rx.try_recv() {
                    in_flight -= 1;
                    place(done, &mut free);
                }
                if in_flight > workers {
                    in_flight -= 1;
                    place(done_rx.recv().expect("workers run"), &mut free);
                }
                let mut piece = free.pop().unwrap_or_default();
                match next_piece(&mut piece) {
                    Ok(0) => break Ok(()),
                    Ok(_) => {}
                    Err(e) => break Err(e),
                }
                work_tx.send((sent, piece)).expect("workers run");
                sent += 1;
                in_flight += 1;
            };
            drop(work_tx);
            for done in done_rx {
                place(done, &mut free);
            }
            read
        })
    }

    /// A streaming encoder of one stream of this (non-zstd) codec into `out`.
    fn stream_encoder(&self, out: Vec<u8>) -> Box<dyn StreamEncoder> {
        match self.kind {
            CompressType::Lz4 => Box::new(lz4_flex::frame::FrameEncoder::new(out)),
            CompressType::Gz => Box::new(flate2::write::GzEncoder::new(
                out,
                flate2::Compression::new(self.level as u32),
            )),
            CompressType::Bz2 => Box::new(bzip2::write::BzEncoder::new(
                out,
                bzip2::Compression::new(self.level as u32),
            )),
            CompressType::Zst | CompressType::None => {
                unreachable!("zstd and none are not streamed through an encoder")
            }
        }
    }

    pub fn compress(&self, raw: &[u8]) -> Vec<u8> {
        // Compressing into memory cannot fail except by allocation failure, so the io errors
        // below are unreachable in practice; expect() documents that.
        match self.kind {
            CompressType::None => raw.to_vec(),
            // One compression context per thread and level: creating one per frame costs
            // more than compressing a small frame.
            CompressType::Zst => ZSTD_C.with(|c| {
                let mut c = c.borrow_mut();
                if c.as_ref().is_none_or(|ctx| ctx.level != self.level) {
                    *c = Some(FrameCompressor::new(self.level));
                }
                c.as_mut().expect("set above").compress(raw)
            }),
            _ => {
                let mut enc = self.stream_encoder(Vec::with_capacity(raw.len() / 2));
                enc.write_all(raw).expect("compress into memory");
                enc.finish().expect("compress into memory")
            }
        }
    }
}

/// One stream of a codec being written into memory; `finish` ends it and returns the bytes.
trait StreamEncoder: Write {
    fn finish(self: Box<Self>) -> std::io::Result<Vec<u8>>;
}

impl StreamEncoder for lz4_flex::frame::FrameEncoder<Vec<u8>> {
    fn finish(self: Box<Self>) -> std::io::Result<Vec<u8>> {
        (*self).finish().map_err(std::io::Error::other)
    }
}

impl StreamEncoder for flate2::write::GzEncoder<Vec<u8>> {
    fn finish(self: Box<Self>) -> std::io::Result<Vec<u8>> {
        (*self).finish()
    }
}

impl StreamEncoder for bzip2::write::BzEncoder<Vec<u8>> {
    fn finish(self: Box<Self>) -> std::io::Result<Vec<u8>> {
        (*self).finish()
    }
}

/// Fill `piece` with up to `len` bytes of `input` (fewer only at its end); returns how many.
fn read_piece(input: &mut dyn Read, piece: &mut Vec<u8>, len: usize) -> std::io::Result<usize> {
    piece.clear();
    piece.reserve(len);
    input.take(len as u64).read_to_end(piece)
}

thread_local! {
    static ZSTD_C: std::cell::RefCell<Option<FrameCompressor>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_D: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// A zstd compression context for whole frames, at one level, with zstd's block
/// pre-splitter off.
///
/// Why not `zstd::bulk::Compressor`: zstd 1.5.7 splits each 128 KiB block of levels 1–4
/// by sampling its statistics first (`ZSTD_c_blockSplitterLevel`, experimental, which
/// zstd-safe does not expose). On a full backup of the seed table it took 7 % of all CPU
/// (`perf`), for blocks of pages whose statistics do not change within a block. Turned
/// off (level 1, "no splitting"), the output is an ordinary zstd frame that every
/// decoder reads; only its bytes differ, not the format.
struct FrameCompressor {
    level: i32,
    ctx: std::ptr::NonNull<zstd_sys::ZSTD_CCtx>,
}

impl FrameCompressor {
    fn new(level: i32) -> FrameCompressor {
        use zstd_sys::ZSTD_cParameter::{ZSTD_c_compressionLevel, ZSTD_c_experimentalParam20};
        // SAFETY: plain calls into zstd on a context created here and owned by the value.
        unsafe {
            let ctx = std::ptr::NonNull::new(zstd_sys::ZSTD_createCCtx()).expect("zstd context");
            let set = |param, value| {
                let code = zstd_sys::ZSTD_CCtx_setParameter(ctx.as_ptr(), param, value);
                assert!(
                    zstd_sys::ZSTD_isError(code) == 0,
                    "zstd parameter {param:?} = {value}"
                );
            };
            set(ZSTD_c_compressionLevel, level);
            // ZSTD_c_blockSplitterLevel: 1 is "no splitting".
            set(ZSTD_c_experimentalParam20, 1);
            FrameCompressor { level, ctx }
        }
    }

    /// `raw` as one zstd frame (its content size recorded).
    fn compress(&mut self, raw: &[u8]) -> Vec<u8> {
        // SAFETY: `out` has room for `bound` bytes, what zstd may write; its length is set
        // to what zstd reports having written, checked not to be an error code.
        unsafe {
            let bound = zstd_sys::ZSTD_compressBound(raw.len());
            let mut out: Vec<u8> = Vec::with_capacity(bound);
            let written = zstd_sys::ZSTD_compress2(
                self.ctx.as_ptr(),
                out.as_mut_ptr().cast(),
                bound,
                raw.as_ptr().cast(),
                raw.len(),
            );
            assert!(
                zstd_sys::ZSTD_isError(written) == 0,
                "zstd compress into memory"
            );
            out.set_len(written);
            out
        }
    }
}

impl Drop for FrameCompressor {
    fn drop(&mut self) {
        // SAFETY: the context was created by ZSTD_createCCtx and is freed once, here.
        unsafe {
            zstd_sys::ZSTD_freeCCtx(self.ctx.as_ptr());
        }
    }
}

/// Decode one stream of `kind`. `raw_len` is the expected decoded size; a stream that
/// decodes to anything else is reported as corrupt.
pub fn decompress(
    kind: CompressType,
    stored: &[u8],
    raw_len: usize,
    context: &str,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    decompress_into(kind, stored, raw_len, context, &mut out)?;
    Ok(out)
}

/// Like [`decompress`], into a buffer the caller reuses (restore decodes thousands of
/// frames: fresh buffers each time cost page faults and allocator churn).
pub fn decompress_into(
    kind: CompressType,
    stored: &[u8],
    raw_len: usize,
    context: &str,
    out: &mut Vec<u8>,
) -> Result<()> {
    out.clear();
    out.reserve(raw_len);
    let res = match kind {
        CompressType::None => {
            out.extend_from_slice(stored);
            Ok(())
        }
        CompressType::Zst => ZSTD_D.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new()?);
            }
            d.as_mut()
                .unwrap()
                .decompress_to_buffer(stored, out)
                .map(|_| ())
        }),
        // One byte more than expected is enough to know the stream is wrong: a stream
        // that inflates further is never read to its end.
        _ => reader(kind, stored)
            .and_then(|r| r.take(raw_len as u64 + 1).read_to_end(out).map(|_| ())),
    };
    res.map_err(|e| {
        Error::with_source(
            ErrorKind::Corrupt,
            format!("{context}: cannot decode {} data", kind.name()),
            e,
        )
    })?;
    if out.len() != raw_len {
        return Err(Error::corrupt(format!(
            "{context}: decoded {}{} bytes, expected {raw_len}",
            out.len(),
            if out.len() > raw_len { " or more" } else { "" }
        )));
    }
    Ok(())
}

/// A streaming decoder of `stored` (one stream of codec `kind`), for reading a large object
/// in small pieces.
pub fn reader(kind: CompressType, stored: &[u8]) -> std::io::Result<Box<dyn Read + '_>> {
    Ok(match kind {
        CompressType::None => Box::new(stored),
        CompressType::Zst => Box::new(zstd::stream::read::Decoder::with_buffer(stored)?),
        CompressType::Lz4 => Box::new(lz4_flex::frame::FrameDecoder::new(stored)),
        CompressType::Gz => Box::new(flate2::read::GzDecoder::new(stored)),
        CompressType::Bz2 => Box::new(bzip2::read::BzDecoder::new(stored)),
    })
}

/// How much one zstd stream of JSON metadata may inflate to: `ratio` times its compressed
/// size plus 64 MiB, so that a crafted stream cannot exhaust memory.
fn inflation_limit(compressed: usize, ratio: u64) -> u64 {
    (compressed as u64).saturating_mul(ratio) + (64 << 20)
}

/// Decode one zstd stream of JSON metadata (a change map) holding at most
/// [`inflation_limit`] bytes.
pub(crate) fn zstd_bounded(body: &[u8], ratio: u64, context: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    zstd_bounded_reader(body, ratio, context).and_then(|mut r| {
        r.read_to_end(&mut out).map_err(|e| {
            Error::with_source(ErrorKind::Corrupt, format!("{context}: cannot decode"), e)
        })
    })?;
    Ok(out)
}

/// A reader of one zstd stream of JSON metadata that fails once it has produced more
/// than [`inflation_limit`] bytes: a manifest is parsed from it as it is decoded, without
/// holding its JSON text.
pub(crate) fn zstd_bounded_reader<'a>(
    body: &'a [u8],
    ratio: u64,
    context: &str,
) -> Result<impl Read + 'a> {
    let decoder = zstd::stream::read::Decoder::with_buffer(body).map_err(|e| {
        Error::with_source(ErrorKind::Corrupt, format!("{context}: cannot decode"), e)
    })?;
    Ok(Bounded {
        inner: decoder,
        left: inflation_limit(body.len(), ratio),
        limit: inflation_limit(body.len(), ratio),
        context: context.to_string(),
    })
}

struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
    context: String,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: inflates beyond {} bytes: it is damaged or was altered",
                    self.context, self.limit
                ),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_and_detects_damage() {
        let raw: Vec<u8> = (0..200_000u32)
            .map(|i| (i % 251) as u8 ^ (i / 1000) as u8)
            .collect();
        for &kind in CompressType::ALL {
            let c = Compression::new(kind, None).unwrap();
            let stored = c.compress(&raw);
            assert_eq!(
                decompress(kind, &stored, raw.len(), "t").unwrap(),
                raw,
                "{kind:?}"
            );
            if kind != CompressType::None {
                assert!(stored.len() < raw.len(), "{kind:?} compresses");
                let mut bad = stored.clone();
                bad.truncate(stored.len() / 2);
                assert!(
                    decompress(kind, &bad, raw.len(), "t").is_err(),
                    "{kind:?} truncated"
                );
            }
        }
    }

    /// Frames made without the block pre-splitter are ordinary zstd frames: any decoder
    /// reads them, they record their content size, and a thread's context follows the
    /// level asked for.
    #[test]
    fn zstd_frames_are_ordinary_frames_at_every_level() {
        let page: Vec<u8> = (0..8192u32).map(|i| (i % 97) as u8 & 0x3f).collect();
        let pages: Vec<u8> = page.iter().cycle().take(1 << 20).copied().collect();
        for level in [1, 3, 9, 3] {
            let c = Compression::new(CompressType::Zst, Some(level)).unwrap();
            for raw in [&[][..], &[7u8][..], &page[..], &pages[..]] {
                let stored = c.compress(raw);
                let size = zstd::zstd_safe::get_frame_content_size(&stored)
                    .ok()
                    .flatten();
                assert_eq!(size, Some(raw.len() as u64), "level {level}");
                let back = zstd::bulk::decompress(&stored, raw.len()).unwrap();
                assert_eq!(back, raw, "level {level}, {} bytes", raw.len());
            }
        }
    }

    #[test]
    fn levels_are_checked() {
        assert!(Compression::new(CompressType::Gz, Some(12)).is_err());
        assert!(Compression::new(CompressType::Zst, Some(19)).is_ok());
    }
}
