//! Archived WAL objects.
//!
//! ```text
//! offset size
//!  0      8   magic "PGSTRWAL"
//!  8      1   object format version (1, or 2 with a block-change map inside)
//!  9      1   codec id (0 none, 1 gz, 2 lz4, 3 zst, 4 bz2)
//! 10      2   zero
//! 12      4   version 2: length m of the block-change map, u32 little-endian; version 1: zero
//! 16      8   raw length, u64 little-endian
//! 24     32   BLAKE3 of the raw file
//! 56      m   version 2: the segment's block-change map, as a `.map` object holds it
//! 56+m    …   the raw file as one stream of the codec
//! ```
//! The hash in the header lets archive-push compare a resubmitted file with the stored one
//! without decoding it, and lets archive-get prove what it returns is what was pushed. The
//! map rides in the segment's object so that archive-push stores one object a segment (one
//! request to an object store, not two), and sits before the WAL so that a backup reads it
//! with one ranged read of the object's start ([`embedded_map`]).

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
    /// Length of the block-change map between the header and the payload (version 2).
    pub map_len: u32,
}

impl WalHeader {
    /// Length of the WAL file stored.
    pub fn raw_len(&self) -> u64 {
        self.raw_len
    }

    /// Where the compressed WAL starts in the object.
    pub fn payload_start(&self) -> usize {
        HEADER_LEN + self.map_len as usize
    }
}

/// The largest block-change map an object may hold. A map lists each block a segment's
/// records touch at most once, in runs, compressed: far below this for a 1 GiB segment.
const MAX_MAP_LEN: u32 = 64 << 20;

/// Encode a WAL file held in memory: [`encode_read`] of `raw`.
pub fn encode(raw: &[u8], compression: Compression, workers: u32) -> Vec<u8> {
    encode_read(&mut &raw[..], compression, workers, &mut |_| {})
        .expect("reading memory cannot fail")
}

/// Encode the WAL file `input` reads (a version-1 object: no map), reading it in pieces:
/// `each` sees every piece in order (archive-push checks and decodes the segment there),
/// this thread hashes it, and up to `workers` threads compress it
/// ([`Compression::compress_read`]), so archive_command waits for about the slowest of
/// the three and holds a few pieces, not the file.
pub fn encode_read(
    input: &mut dyn std::io::Read,
    compression: Compression,
    workers: u32,
    each: &mut dyn FnMut(&[u8]),
) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.push(1);
    out.push(compression.kind.id());
    out.extend_from_slice(&[0u8; 6]);
    // The raw length and hash are known at the end.
    out.resize(HEADER_LEN, 0);
    let mut hasher = blake3::Hasher::new();
    let raw_len = compression.compress_read(input, workers, &mut out, &mut |piece| {
        hasher.update(piece);
        each(piece);
    })?;
    out[16..24].copy_from_slice(&raw_len.to_le_bytes());
    out[24..HEADER_LEN].copy_from_slice(hasher.finalize().as_bytes());
    Ok(out)
}

/// A WAL object from [`encode`] (version 1) with `map`, the encoded block-change map of
/// its segment, placed before its payload (version 2).
pub fn with_map(obj: &[u8], map: &[u8]) -> Vec<u8> {
    with_map_owned(obj.to_vec(), map)
}

/// [`with_map`] of an object the caller owns: the map goes in in place, so no second copy
/// of the compressed WAL is made (archive-push).
pub fn with_map_owned(mut obj: Vec<u8>, map: &[u8]) -> Vec<u8> {
    let map_len = u32::try_from(map.len())
        .ok()
        .filter(|&m| m <= MAX_MAP_LEN)
        .expect("a block-change map of a sane size");
    obj.splice(HEADER_LEN..HEADER_LEN, map.iter().copied());
    obj[8] = 2;
    obj[12..16].copy_from_slice(&map_len.to_le_bytes());
    obj
}

/// WAL object `obj` without its block-change map: the version-1 object [`with_map`] was
/// given. Objects without a map come back as they are.
pub fn without_map(obj: &[u8], what: &str) -> Result<Vec<u8>> {
    let map_len = embedded_map(obj, what)?.map_or(0, <[u8]>::len);
    let payload = &obj[HEADER_LEN + map_len..];
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&obj[..HEADER_LEN]);
    out[8] = 1;
    out[12..16].fill(0);
    out.extend_from_slice(payload);
    Ok(out)
}

/// The block-change map inside WAL object `obj` (version 2), given at least its first
/// `HEADER_LEN + map_len` bytes; `None` when the object holds none (version 1: the map, if
/// any, is a `.map` object of its own). `Err` when the header is bad or `obj` stops short
/// of the map: read [`WalHeader::payload_start`] bytes and call again.
pub fn embedded_map<'a>(obj: &'a [u8], what: &str) -> Result<Option<&'a [u8]>> {
    let h = parse_header(obj, what)?;
    if h.map_len == 0 {
        return Ok(None);
    }
    obj.get(HEADER_LEN..h.payload_start())
        .map(Some)
        .ok_or_else(|| {
            Error::corrupt(format!(
                "{what}: {} bytes, shorter than its block-change map ends ({})",
                obj.len(),
                h.payload_start()
            ))
        })
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
    if obj[8] != 1 && obj[8] != 2 {
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
    let map_len = match obj[8] {
        1 => 0,
        _ => u32::from_le_bytes(obj[12..16].try_into().unwrap()),
    };
    if map_len > MAX_MAP_LEN {
        return Err(Error::corrupt(format!(
            "{what}: header claims a block-change map of {map_len} bytes, more than any ({MAX_MAP_LEN})"
        )));
    }
    Ok(WalHeader {
        codec,
        raw_len,
        hash: obj[24..56].try_into().unwrap(),
        map_len,
    })
}

/// The compressed WAL of object `obj` with header `h`.
fn payload<'a>(obj: &'a [u8], h: &WalHeader, what: &str) -> Result<&'a [u8]> {
    obj.get(h.payload_start()..).ok_or_else(|| {
        Error::corrupt(format!(
            "{what}: {} bytes, shorter than its header and block-change map",
            obj.len()
        ))
    })
}

/// Decode and verify a stored WAL object.
pub fn decode(obj: &[u8], what: &str) -> Result<Vec<u8>> {
    let h = parse_header(obj, what)?;
    let raw = decompress(h.codec, payload(obj, &h, what)?, h.raw_len as usize, what)?;
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
/// few small buffers (no 16 MiB buffer to fault in and free per segment). A zstd object of
/// independent frames (as archive-push writes them) is decoded frame by frame on several
/// threads instead ([`decode_frames_to`]). What was written to `out` is not the WAL file
/// unless this returns `Ok`: write it somewhere PostgreSQL does not look until then.
pub fn decode_to(obj: &[u8], what: &str, out: &mut (impl std::io::Write + Send)) -> Result<()> {
    use std::io::Read;
    use std::sync::mpsc::sync_channel;
    const PIECE: usize = 1 << 20;
    const PIECES_IN_FLIGHT: usize = 3;
    let h = parse_header(obj, what)?;
    let body = payload(obj, &h, what)?;
    if h.codec == CompressType::Zst {
        if let Some(frames) = zstd_frames(body) {
            return decode_frames_to(&frames, &h, what, out);
        }
    }
    let cannot_decode = |e: std::io::Error| {
        Error::with_source(
            crate::ErrorKind::Corrupt,
            format!("{what}: cannot decode {} data", h.codec.name()),
            e,
        )
    };
    let mut reader = crate::codec::reader(h.codec, body)
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

/// The frames of a zstd stream of several, each with its decoded size, when every frame
/// states a size of at most [`MAX_FRAME_RAW`]: a WAL object written as independent frames
/// ([`Compression::compress_read`]). `None` for one frame (objects written before) or
/// anything else, which is decoded as one stream.
fn zstd_frames(body: &[u8]) -> Option<Vec<(&[u8], usize)>> {
    use zstd::zstd_safe;
    let mut frames = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let len = zstd_safe::find_frame_compressed_size(rest).ok()?;
        let size = zstd_safe::get_frame_content_size(&rest[..len]).ok()??;
        if size > MAX_FRAME_RAW as u64 {
            return None;
        }
        frames.push((&rest[..len], size as usize));
        rest = &rest[len..];
    }
    (frames.len() > 1).then_some(frames)
}

/// The chaining value of frame `i`, `data`, as a subtree of its file's BLAKE3 tree: it
/// starts `i` frames of `frame_len` bytes (a power of two of BLAKE3 chunks, see
/// [`subtree_frame_len`]) into the file, which is longer than one frame, so `data` is a
/// whole subtree of that tree.
fn subtree_hash(data: &[u8], i: usize, frame_len: usize) -> blake3::hazmat::ChainingValue {
    use blake3::hazmat::HasherExt;
    blake3::Hasher::new()
        .set_input_offset((i * frame_len) as u64)
        .update(data)
        .finalize_non_root()
}

/// The BLAKE3 hash of a file from the chaining values of its frames ([`subtree_hash`];
/// at least two). BLAKE3 splits an input at the largest power of two of chunks below its
/// length, recursively; above one frame those splits fall on frame boundaries, so the
/// split of `n` frames is the largest power of two below `n`.
fn root_of_subtrees(cvs: &[blake3::hazmat::ChainingValue]) -> blake3::Hash {
    use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, Mode};
    fn split(n: usize) -> usize {
        1 << (usize::BITS - 1 - (n - 1).leading_zeros())
    }
    fn non_root(cvs: &[blake3::hazmat::ChainingValue]) -> blake3::hazmat::ChainingValue {
        if cvs.len() == 1 {
            return cvs[0];
        }
        let (l, r) = cvs.split_at(split(cvs.len()));
        merge_subtrees_non_root(&non_root(l), &non_root(r), Mode::Hash)
    }
    let (l, r) = cvs.split_at(split(cvs.len()));
    merge_subtrees_root(&non_root(l), &non_root(r), Mode::Hash)
}

/// The length of `frames` (decoded sizes) if they are whole subtrees of their file's
/// BLAKE3 tree ([`subtree_hash`]): at least two, all of one length that is a power of two
/// of BLAKE3's 1 KiB chunks, but the last, which is not empty and not longer. Every object
/// archive-push writes qualifies, whichever frame size its writer used
/// ([`WAL_FRAME`](crate::codec::WAL_FRAME)).
fn subtree_frame_len(frames: &[(&[u8], usize)]) -> Option<usize> {
    let (last, rest) = frames.split_last()?;
    let len = rest.first()?.1;
    (len.is_power_of_two()
        && len >= blake3::CHUNK_LEN
        && rest.iter().all(|f| f.1 == len)
        && (1..=len).contains(&last.1))
    .then_some(len)
}

/// Largest decoded frame [`decode_frames_to`] takes: each decoder holds one.
const MAX_FRAME_RAW: usize = 4 << 20;

/// [`decode_to`] of a WAL object written as independent zstd frames: the frames are
/// decoded on up to four threads (the cores there are) while this thread hashes and writes
/// them in order. A decoder takes a buffer before it claims the next frame, and frames are
/// claimed in order, so the frame the writer waits for always has its buffer: a few
/// buffers bound the memory, whatever the object's length.
fn decode_frames_to(
    frames: &[(&[u8], usize)],
    h: &WalHeader,
    what: &str,
    out: &mut (impl std::io::Write + Send),
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc::{channel, sync_channel};
    let total: u64 = frames.iter().map(|f| f.1 as u64).sum();
    if total != h.raw_len {
        return Err(Error::corrupt(format!(
            "{what}: its frames hold {total} bytes, expected {}",
            h.raw_len
        )));
    }
    // Frames that are whole subtrees of the file's BLAKE3 tree are hashed by the decoders
    // too, and the writer only writes.
    let subtree_len = subtree_frame_len(frames);
    let decoders = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
        .min(frames.len());
    let buffers = decoders + 2;
    let (free_tx, free_rx) = sync_channel::<Vec<u8>>(buffers);
    for _ in 0..buffers {
        free_tx.send(Vec::new()).expect("room for every buffer");
    }
    let free_rx = std::sync::Mutex::new(free_rx);
    let (done_tx, done_rx) = channel::<DecodedFrame>();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..decoders {
            let done_tx = done_tx.clone();
            let decoder = FrameDecoder {
                frames,
                subtree_len,
                free: &free_rx,
                next: &next,
                stop: &stop,
            };
            scope.spawn(move || decoder.run(done_tx));
        }
        drop(done_tx);
        let written = write_frames_in_order(
            frames.len(),
            subtree_len.is_some(),
            &done_rx,
            &free_tx,
            h,
            what,
            out,
        );
        // Decoders waiting for a buffer see the channel closed; the others, `stop`.
        stop.store(true, Ordering::Relaxed);
        drop(free_tx);
        written
    })
}

/// A frame [`decode_frames_to`]'s decoders hand its writer: its index, and its decoded
/// bytes with their subtree's chaining value (when the frames are subtrees).
type DecodedFrame = (
    usize,
    std::io::Result<(Vec<u8>, Option<blake3::hazmat::ChainingValue>)>,
);

/// One of [`decode_frames_to`]'s decoder threads: what it shares with the others.
struct FrameDecoder<'a, 'f> {
    frames: &'a [(&'f [u8], usize)],
    subtree_len: Option<usize>,
    /// Buffers free to decode into.
    free: &'a std::sync::Mutex<std::sync::mpsc::Receiver<Vec<u8>>>,
    /// The next frame to claim.
    next: &'a std::sync::atomic::AtomicUsize,
    /// Set when the writer has finished or failed.
    stop: &'a std::sync::atomic::AtomicBool,
}

impl FrameDecoder<'_, '_> {
    /// Take a free buffer, claim the next frame, decode it into the buffer and send it to
    /// the writer, until the frames, the buffers or the writer are done.
    fn run(self, done: std::sync::mpsc::Sender<DecodedFrame>) {
        use std::sync::atomic::Ordering;
        let mut d = match zstd::bulk::Decompressor::new() {
            Ok(d) => d,
            Err(e) => {
                let _ = done.send((usize::MAX, Err(e)));
                return;
            }
        };
        loop {
            let Ok(mut buf) = self.free.lock().expect("no panics while held").recv() else {
                return;
            };
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let Some(&(frame, size)) = self.frames.get(i) else {
                return;
            };
            buf.clear();
            buf.reserve(size);
            let decoded = d.decompress_to_buffer(frame, &mut buf).and_then(|n| {
                if n == size {
                    let cv = self.subtree_len.map(|len| subtree_hash(&buf, i, len));
                    Ok((buf, cv))
                } else {
                    Err(std::io::Error::other(format!(
                        "frame {i} decoded to {n} bytes, its header says {size}"
                    )))
                }
            });
            if done.send((i, decoded)).is_err() {
                return;
            }
        }
    }
}

/// [`decode_frames_to`]'s writer: take the `count` decoded frames as they come, write them
/// to `out` in order (returning each buffer to `free`), and check the file's BLAKE3 against
/// `h`'s, from the frames' chaining values when they are `subtrees`.
fn write_frames_in_order(
    count: usize,
    subtrees: bool,
    done: &std::sync::mpsc::Receiver<DecodedFrame>,
    free: &std::sync::mpsc::SyncSender<Vec<u8>>,
    h: &WalHeader,
    what: &str,
    out: &mut impl std::io::Write,
) -> Result<()> {
    let mut hasher = blake3::Hasher::new();
    let mut subtree_cvs = Vec::with_capacity(if subtrees { count } else { 0 });
    let mut waiting = std::collections::BTreeMap::new();
    let mut want = 0;
    while want < count {
        let Ok((i, decoded)) = done.recv() else {
            return Err(Error::corrupt(format!("{what}: a frame decoder stopped")));
        };
        let decoded = decoded.map_err(|e| {
            Error::with_source(
                crate::ErrorKind::Corrupt,
                format!("{what}: cannot decode zst data"),
                e,
            )
        })?;
        waiting.insert(i, decoded);
        while let Some((buf, cv)) = waiting.remove(&want) {
            match cv {
                Some(cv) => subtree_cvs.push(cv),
                None => {
                    hasher.update(&buf);
                }
            }
            out.write_all(&buf).map_err(|e| {
                Error::with_source(crate::ErrorKind::Storage, format!("{what}: write"), e)
            })?;
            let _ = free.try_send(buf);
            want += 1;
        }
    }
    let hash = if subtrees {
        root_of_subtrees(&subtree_cvs)
    } else {
        hasher.finalize()
    };
    if *hash.as_bytes() != h.hash {
        return Err(Error::corrupt(format!(
            "{what}: content does not match its recorded BLAKE3 hash"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::WAL_FRAME;

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

    /// archive-push's one pass: whatever the codec, the worker count and the reads' sizes,
    /// the pieces seen are the file in order, in frames, the object decodes to the file,
    /// and zstd's frames come out the same with one thread or four.
    #[test]
    fn encoding_while_reading_sees_the_file_in_order_and_stores_it() {
        /// Hands out at most 7,000 bytes a read, as a pipe or a slow disk may.
        struct Dribble<'a>(&'a [u8]);
        impl std::io::Read for Dribble<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(7000).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let data: Vec<u8> = (0..(5 << 20) + 12345u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8 & 0x1f)
            .collect();
        for len in [0, 1, WAL_FRAME, data.len()] {
            let raw = &data[..len];
            for &kind in CompressType::ALL {
                let mut objects = Vec::new();
                for workers in [1, 2, 4] {
                    let mut seen = Vec::new();
                    let mut sizes = Vec::new();
                    let obj = encode_read(
                        &mut Dribble(raw),
                        Compression::new(kind, None).unwrap(),
                        workers,
                        &mut |piece| {
                            seen.extend_from_slice(piece);
                            sizes.push(piece.len());
                        },
                    )
                    .unwrap();
                    assert!(seen == raw, "{kind:?} {workers} {len}");
                    assert_eq!(sizes.len(), len.div_ceil(WAL_FRAME), "{kind:?} {len}");
                    assert!(sizes.iter().rev().skip(1).all(|&n| n == WAL_FRAME));
                    assert_eq!(parse_header(&obj, "x").unwrap().raw_len(), len as u64);
                    assert!(
                        decode(&obj, "x").unwrap() == raw,
                        "{kind:?} {workers} {len}"
                    );
                    assert!(obj == encode(raw, Compression::new(kind, None).unwrap(), workers));
                    objects.push(obj);
                }
                if matches!(kind, CompressType::Zst | CompressType::None) {
                    assert!(objects.windows(2).all(|w| w[0] == w[1]), "{kind:?} {len}");
                }
            }
        }
    }

    /// A version-2 object carries its map before the WAL: the map reads from the object's
    /// first bytes alone, the WAL decodes as from version 1, and a header that claims more
    /// map than the object holds is damage.
    #[test]
    fn map_inside_the_object() {
        let raw: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let map = b"PGSTRMAP and the rest of a map".to_vec();
        for &kind in CompressType::ALL {
            let v1 = encode(&raw, Compression::new(kind, None).unwrap(), 2);
            assert_eq!(embedded_map(&v1, "x").unwrap(), None);
            let v2 = with_map(&v1, &map);
            assert_eq!(with_map_owned(v1.clone(), &map), v2);
            assert_eq!(v2[8], 2);
            assert_eq!(without_map(&v2, "x").unwrap(), v1);
            assert_eq!(without_map(&v1, "x").unwrap(), v1);
            assert_eq!(v2.len(), v1.len() + map.len());
            let h = parse_header(&v2, "x").unwrap();
            assert_eq!(h.hash, parse_header(&v1, "x").unwrap().hash);
            assert_eq!(h.payload_start(), HEADER_LEN + map.len());
            let prefix = &v2[..h.payload_start()];
            assert_eq!(embedded_map(prefix, "x").unwrap(), Some(&map[..]));
            assert!(embedded_map(&v2[..HEADER_LEN + 3], "x").is_err());
            assert_eq!(decode(&v2, "x").unwrap(), raw, "{kind:?}");
            let mut streamed = Vec::new();
            decode_to(&v2, "x", &mut streamed).unwrap();
            assert_eq!(streamed, raw, "{kind:?}");
        }
        let v2 = with_map(
            &encode(&raw, Compression::new(CompressType::Zst, None).unwrap(), 1),
            &map,
        );
        // A map length beyond the object, or beyond any map.
        let mut long = v2.clone();
        long[12..16].copy_from_slice(&(v2.len() as u32).to_le_bytes());
        assert!(decode(&long, "x").is_err());
        long[12..16].copy_from_slice(&(MAX_MAP_LEN + 1).to_le_bytes());
        assert!(parse_header(&long, "x").is_err());
        // A map length off by one leaves the WAL's stream misaligned.
        let mut off = v2.clone();
        off[12..16].copy_from_slice(&(map.len() as u32 + 1).to_le_bytes());
        assert!(decode(&off, "x").is_err());
        // Versions beyond 2 are refused.
        let mut v3 = v2;
        v3[8] = 3;
        assert!(parse_header(&v3, "x").is_err());
    }
    /// The hash assembled from frames' subtrees is BLAKE3's, at lengths around the tree's
    /// splits, for today's frame size and the 1 MiB of earlier writers.
    #[test]
    fn frame_subtrees_make_the_files_blake3_hash() {
        for frame in [WAL_FRAME, 1 << 20, 4 << 10] {
            for len in [
                frame + 1,
                2 * frame,
                2 * frame + 1,
                3 * frame,
                4 * frame + 7,
                5 * frame + 12345,
                8 * frame,
                9 * frame - 1,
                16 * frame,
            ] {
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
                    .collect();
                let chunks: Vec<&[u8]> = data.chunks(frame).collect();
                let sizes: Vec<(&[u8], usize)> = chunks.iter().map(|c| (*c, c.len())).collect();
                assert_eq!(subtree_frame_len(&sizes), Some(frame), "length {len}");
                let cvs: Vec<_> = chunks
                    .iter()
                    .enumerate()
                    .map(|(i, c)| subtree_hash(c, i, frame))
                    .collect();
                assert_eq!(root_of_subtrees(&cvs), blake3::hash(&data), "length {len}");
            }
        }
    }

    /// Frames that are not whole subtrees are hashed in order instead.
    #[test]
    fn frames_of_other_shapes_are_not_taken_for_subtrees() {
        let f = |sizes: &[usize]| -> Option<usize> {
            let frames: Vec<(&[u8], usize)> = sizes.iter().map(|&s| (&[][..], s)).collect();
            subtree_frame_len(&frames)
        };
        assert_eq!(f(&[4096, 4096, 1]), Some(4096));
        assert_eq!(f(&[4096]), None, "one frame");
        assert_eq!(f(&[3000, 3000, 10]), None, "not a power of two");
        assert_eq!(f(&[512, 512, 10]), None, "below one BLAKE3 chunk");
        assert_eq!(f(&[4096, 2048, 10]), None, "unequal");
        assert_eq!(f(&[4096, 4096, 4097]), None, "last longer");
        assert_eq!(f(&[4096, 4096, 0]), None, "last empty");
    }

    /// A segment-sized zstd object is independent frames, one standard stream (decoded
    /// whole by any zstd reader), decoded in parallel by archive-get; damage in any frame,
    /// a missing frame, or objects written as one frame before all behave as they should.
    #[test]
    fn segments_are_frames_decoded_in_parallel_and_one_frame_objects_still_read() {
        let raw: Vec<u8> = (0..(5 << 20) + 12345u32)
            .map(|i| {
                (i.wrapping_mul(2654435761) >> 24) as u8 & if i % 3 == 0 { 0xff } else { 0x0f }
            })
            .collect();
        let zst = Compression::new(CompressType::Zst, None).unwrap();
        let obj = encode(&raw, zst, 2);
        let frames = zstd_frames(&obj[HEADER_LEN..]).expect("several frames");
        assert_eq!(frames.len(), raw.len().div_ceil(WAL_FRAME));
        assert!(frames.iter().all(|f| f.1 <= WAL_FRAME));
        assert_eq!(zstd::decode_all(&obj[HEADER_LEN..]).unwrap(), raw);
        let mut streamed = Vec::new();
        decode_to(&obj, "x", &mut streamed).unwrap();
        assert!(streamed == raw);
        assert!(decode(&obj, "x").unwrap() == raw);

        // A flipped byte inside the third frame.
        let third = HEADER_LEN + frames[0].0.len() + frames[1].0.len() + 100;
        let mut bad = obj.clone();
        bad[third] ^= 0x10;
        assert!(decode_to(&bad, "x", &mut Vec::new()).is_err());
        // The last frame gone: the frames no longer add up to the header's length.
        let cut = obj.len() - frames.last().unwrap().0.len();
        let err = decode_to(&obj[..cut], "x", &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("expected"), "{err}");

        // Written in 1 MiB frames (before 2026-11-27): read the same way.
        let mut mib = obj[..HEADER_LEN].to_vec();
        for c in raw.chunks(1 << 20) {
            mib.extend_from_slice(&zst.compress(c));
        }
        let mib_frames = zstd_frames(&mib[HEADER_LEN..]).expect("several frames");
        assert_eq!(subtree_frame_len(&mib_frames), Some(1 << 20));
        let mut streamed = Vec::new();
        decode_to(&mib, "x", &mut streamed).unwrap();
        assert!(streamed == raw);

        // Written as one frame (before frames): read as one stream.
        let mut old = obj[..HEADER_LEN].to_vec();
        old.extend_from_slice(&zst.compress(&raw));
        assert!(zstd_frames(&old[HEADER_LEN..]).is_none());
        let mut streamed = Vec::new();
        decode_to(&old, "x", &mut streamed).unwrap();
        assert!(streamed == raw);
    }
}
