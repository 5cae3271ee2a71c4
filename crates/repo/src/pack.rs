//! Frames and packs: how file contents are stored.
//!
//! A file's bytes are cut into frames of at most `frame_size` raw bytes (a whole number of
//! pages, so a relation block never straddles two frames). Each frame is compressed on its
//! own, so reading any part of a file costs one ranged read and one decode of the frames
//! that hold it, never the whole file. A frame whose bytes are all zero is not stored at
//! all. Frames are appended to pack objects of about `pack_size` bytes; small files thus
//! share objects (one per pack instead of one per file) and large files span several.
//!
//! The manifest records, for every frame, the pack, the offset and stored length, the raw
//! length and an XXH3-64 of the stored bytes, so damage is caught before decoding.
//!
//! In an encrypted stanza each compressed frame is sealed on its own (`cipher`), bound to
//! its pack and offset, so a ranged read still fetches just the frames it needs; the stored
//! length and the XXH3-64 are of the sealed bytes.

use crate::chunk::{frame_check, Chunk, FrameKey};
use crate::codec::{decompress_into, CompressType};
use crate::name::Name;
use crate::{layout, Error, Result, Storage};

/// Default raw bytes per frame: 128 pages of 8 KiB.
pub const DEFAULT_FRAME_SIZE: usize = 1024 * 1024;
/// Default size a pack grows to before it is written.
pub const DEFAULT_PACK_SIZE: usize = 16 * 1024 * 1024;

/// Pack name `<worker>-<seq>` ([`layout::pack_name`]).
fn pack_name(worker: usize, seq: usize) -> Name {
    Name::new(&layout::pack_name(worker, seq))
}

/// Accumulates frames into a pack and writes it when full. One writer per worker; names
/// are `<worker>-<sequence>` so concurrent writers never collide.
///
/// In a local repository a pack's frames go to its staging file as they come
/// ([`Storage::stream_new`]) and a full pack is committed (fsynced and linked into place)
/// behind the writer; elsewhere a pack gathers in memory and is put whole, one request a
/// pack, while the next one fills. Either way a pack is visible only once complete.
pub struct PackWriter {
    storage: Storage,
    runtime: tokio::runtime::Handle,
    stanza: String,
    label: String,
    worker: usize,
    seq: usize,
    /// `<worker>-<seq>`, named once per pack (every frame's extent refers to it).
    name: Name,
    pack_size: usize,
    /// The pack being filled.
    body: PackBody,
    /// A sealed frame on its way to a streamed pack (encrypted stanzas).
    sealed: Vec<u8>,
    /// Pack writes still finishing (with their sequence numbers): a put or a commit
    /// overlaps with compressing the next pack.
    in_flight: std::collections::VecDeque<(usize, tokio::task::JoinHandle<Result<()>>)>,
    /// Bytes written to the repository so far.
    pub written: u64,
    pub packs_written: u64,
}

/// Where the frames of the pack being filled are.
enum PackBody {
    /// Nothing added yet: a writer that stores nothing (a worker of an incremental that
    /// changed little) holds no buffer and no file.
    Empty,
    /// Gathered in memory, to be put whole (object stores).
    Memory(Vec<u8>),
    /// Written to the pack's staging file (a local repository).
    Streamed(crate::storage::StreamedObject),
}

impl PackBody {
    /// Bytes in the pack so far: where the next frame starts.
    fn len(&self) -> usize {
        match self {
            PackBody::Empty => 0,
            PackBody::Memory(buf) => buf.len(),
            PackBody::Streamed(object) => object.len() as usize,
        }
    }
}

impl PackWriter {
    pub fn new(
        storage: Storage,
        runtime: tokio::runtime::Handle,
        stanza: &str,
        label: &str,
        worker: usize,
        pack_size: usize,
    ) -> PackWriter {
        PackWriter {
            storage,
            runtime,
            stanza: stanza.to_string(),
            label: label.to_string(),
            worker,
            seq: 0,
            name: pack_name(worker, 0),
            pack_size,
            body: PackBody::Empty,
            sealed: Vec::new(),
            in_flight: Default::default(),
            written: 0,
            packs_written: 0,
        }
    }

    fn current_key(&self) -> String {
        layout::pack(&self.stanza, &self.label, self.name.as_str())
    }

    /// The worker number in this writer's pack names.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Every pack of this writer numbered below the returned sequence number is stored
    /// (its upload finished); a failed upload is returned as the error.
    pub fn stored_below(&mut self) -> Result<usize> {
        while self.in_flight.front().is_some_and(|(_, h)| h.is_finished()) {
            let (_, h) = self.in_flight.pop_front().expect("non-empty");
            self.runtime.block_on(h).expect("pack upload task")?;
        }
        Ok(self.in_flight.front().map_or(self.seq, |(seq, _)| *seq))
    }

    /// Append one compressed frame (sealed first in an encrypted stanza); returns where it
    /// will be found.
    pub fn add(&mut self, compressed: &[u8], raw_len: usize) -> Result<Chunk> {
        let cipher = self.storage.cipher().cloned();
        let overhead = cipher.as_ref().map_or(0, |c| c.frame_overhead());
        let len = self.body.len();
        if len + compressed.len() + overhead > self.pack_size && len > 0 {
            self.flush()?;
        }
        if matches!(self.body, PackBody::Empty) {
            self.body = match self.storage.stream_new(&self.current_key())? {
                Some(object) => PackBody::Streamed(object),
                None => PackBody::Memory(Vec::new()),
            };
        }
        // Sealed frames are bound to their pack's key and offset.
        let sealing = cipher.map(|c| (c, self.current_key()));
        let offset = self.body.len();
        let (stored, check) = match &mut self.body {
            PackBody::Empty => unreachable!("opened above"),
            PackBody::Memory(buf) => {
                make_room(buf, compressed.len() + overhead, self.pack_size);
                match &sealing {
                    Some((c, key)) => c.seal_frame_into(key, offset as u64, compressed, buf)?,
                    None => buf.extend_from_slice(compressed),
                }
                let stored = &buf[offset..];
                (stored.len(), frame_check(stored))
            }
            PackBody::Streamed(object) => {
                let stored = match &sealing {
                    Some((c, key)) => {
                        self.sealed.clear();
                        c.seal_frame_into(key, offset as u64, compressed, &mut self.sealed)?;
                        &self.sealed[..]
                    }
                    None => compressed,
                };
                object.write(stored)?;
                (stored.len(), frame_check(stored))
            }
        };
        Ok(Chunk {
            pack: Some(self.name),
            backup: None,
            offset: offset as u64,
            stored: stored as u32,
            raw: raw_len as u32,
            check: Some(check),
            at: 0,
            frame: 0,
        })
    }

    /// Pack writes allowed to run behind the writer.
    const MAX_IN_FLIGHT: usize = 2;

    /// Wait for every upload; must return before the manifest that references the frames
    /// is written.
    pub fn finish(&mut self) -> Result<()> {
        self.flush()?;
        while let Some((_, h)) = self.in_flight.pop_front() {
            self.runtime.block_on(h).expect("pack upload task")?;
        }
        Ok(())
    }

    /// Start storing the current pack, if it holds anything; at most `MAX_IN_FLIGHT`
    /// writes run at once.
    pub fn flush(&mut self) -> Result<()> {
        let len = self.body.len() as u64;
        let task = match std::mem::replace(&mut self.body, PackBody::Empty) {
            PackBody::Empty => return Ok(()),
            PackBody::Memory(buf) => {
                let (storage, key) = (self.storage.clone(), self.current_key());
                let data = bytes::Bytes::from(buf);
                self.runtime
                    .spawn(async move { storage.put_new_unsealed(&key, data).await })
            }
            PackBody::Streamed(object) => self.runtime.spawn_blocking(move || object.commit()),
        };
        self.in_flight.push_back((self.seq, task));
        while self.in_flight.len() > Self::MAX_IN_FLIGHT {
            let (_, h) = self.in_flight.pop_front().expect("non-empty");
            self.runtime.block_on(h).expect("pack upload task")?;
        }
        self.written += len;
        self.packs_written += 1;
        self.seq += 1;
        self.name = pack_name(self.worker, self.seq);
        Ok(())
    }
}

/// Grow a pack buffer for `more` bytes: doubling from 256 KiB, never past what a full pack
/// holds. Reserving a whole pack up front keeps all of it resident for every pack in
/// flight; growing by `Vec`'s own doubling would let a full pack's buffer reach twice the
/// pack size.
fn make_room(buf: &mut Vec<u8>, more: usize, pack_size: usize) {
    let needed = buf.len() + more;
    if needed <= buf.capacity() {
        return;
    }
    let full = pack_size + DEFAULT_FRAME_SIZE;
    let target = (buf.capacity() * 2).clamp(256 << 10, full).max(needed);
    buf.reserve_exact(target - buf.len());
}

/// Reads frames for a restore: merges frames that lie next to each other in one pack into
/// one ranged read, checks each frame's XXH3 before decoding, and keeps decoded frames
/// until the caller moves on.
pub struct FrameReader<'a> {
    storage: &'a Storage,
    stanza: &'a str,
    label: &'a str,
    manifest: &'a crate::manifest::Manifest,
    /// Decoded frames.
    frames: std::collections::HashMap<FrameKey, Vec<u8>>,
    /// Frames fetched and checked but kept as stored (opened, still compressed), decoded
    /// when an extent is read, and the decoded ones, the one read last at the back. A
    /// group of small files loads hundreds of frames at once, and a restore fetches a
    /// large file's next batch while it writes the current one: held decoded, they were
    /// most of a restore's memory, where stored they are a fraction (frames of mostly
    /// empty pages decode to 20 times their size and more). Only the [`DECODED_KEEP`]
    /// (pinned) or [`DECODED_KEEP_READING`] read last stay decoded: extents are read in
    /// frame order, so a frame is rarely decoded twice.
    stored: std::collections::HashMap<FrameKey, StoredFrame>,
    decoded: std::collections::VecDeque<FrameKey>,
    /// Decode buffers of cleared frames, reused.
    pool: Vec<Vec<u8>>,
    /// While pinned, `clear` keeps the frames (a group of small files loaded at once).
    pinned: bool,
    /// An opened (decrypted, still compressed) frame of an encrypted stanza, reused.
    opened: Vec<u8>,
    /// Bytes fetched from the repository so far.
    pub fetched: u64,
    pub requests: u64,
}

/// A frame fetched and checked, not decoded yet.
struct StoredFrame {
    /// Opened (decrypted) but compressed.
    bytes: bytes::Bytes,
    codec: CompressType,
    raw_len: usize,
}

/// Frames a pinned [`FrameReader`] keeps decoded.
const DECODED_KEEP: usize = 4;
/// Frames an unpinned [`FrameReader`] keeps decoded: the one a file's extents are being
/// read from, and the one an incremental's changed blocks interleave with it.
const DECODED_KEEP_READING: usize = 2;

/// A frame a reader still has to fetch: the extent that needs it, and its identity.
struct WantedFrame<'c> {
    chunk: &'c Chunk,
    /// The file it was wanted for, which an error names.
    file: &'c str,
    key: FrameKey,
}

impl WantedFrame<'_> {
    fn owner(&self) -> &str {
        &self.key.0
    }
    fn pack(&self) -> &str {
        &self.key.1
    }
    fn offset(&self) -> u64 {
        self.key.2
    }
    /// Where its stored bytes end in the pack.
    fn end(&self) -> u64 {
        self.offset() + self.chunk.stored as u64
    }
}

/// Cut frames sorted by (owner, pack, offset) into runs that one ranged read each fetches:
/// frames of one pack at most `MERGE_GAP` apart (the gaps are read and dropped: frames an
/// incremental replaced; on an object store a round trip costs more than the skipped
/// bytes), while the read is shorter than `MAX_READ`.
fn merged_reads<'w, 'c>(wanted: &'w [WantedFrame<'c>]) -> Vec<&'w [WantedFrame<'c>]> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < wanted.len() {
        let first = &wanted[i];
        let mut end = first.end();
        let mut j = i + 1;
        while let Some(next) = wanted.get(j) {
            let joins = next.owner() == first.owner()
                && next.pack() == first.pack()
                && next.offset() >= end
                && next.offset() - end <= MERGE_GAP
                && end - first.offset() < MAX_READ;
            if !joins {
                break;
            }
            end = next.end();
            j += 1;
        }
        runs.push(&wanted[i..j]);
        i = j;
    }
    runs
}

/// Decode buffers a [`FrameReader`] keeps for reuse: a frame is up to 1 MiB decoded, and a
/// restore has two readers a worker; eight kept were a third of a restore's memory.
const POOL_MAX: usize = 2;

/// Merged reads never exceed this many stored bytes (plus the last frame).
pub(crate) const MAX_READ: u64 = 16 * 1024 * 1024;
/// Frames of one pack at most this far apart are fetched with one read.
pub(crate) const MERGE_GAP: u64 = 128 * 1024;

impl<'a> FrameReader<'a> {
    /// A reader for the frames `manifest`'s chunks point at.
    pub fn new(storage: &'a Storage, manifest: &'a crate::manifest::Manifest) -> FrameReader<'a> {
        FrameReader {
            storage,
            stanza: &manifest.stanza,
            label: &manifest.label,
            manifest,
            frames: Default::default(),
            stored: Default::default(),
            decoded: Default::default(),
            pool: Vec::new(),
            pinned: false,
            opened: Vec::new(),
            fetched: 0,
            requests: 0,
        }
    }

    /// A second, empty reader of the same backup (to fetch one batch while another is
    /// being written); [`FrameReader::absorb_counts`] adds its counts back.
    pub fn sibling(&self) -> FrameReader<'a> {
        FrameReader::new(self.storage, self.manifest)
    }

    /// Add what `other` fetched to this reader's counts.
    pub fn absorb_counts(&mut self, other: &FrameReader) {
        self.fetched += other.fetched;
        self.requests += other.requests;
    }

    /// Whether loaded frames are being kept (`pin`).
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Drop decoded frames (call between batches to bound memory).
    /// The repository this reader reads.
    pub fn storage(&self) -> &'a Storage {
        self.storage
    }

    pub fn clear(&mut self) {
        if !self.pinned {
            // Enough for a batch of frames to come; a group of small files may have had
            // hundreds, and kept they would stay for the rest of the restore.
            let room = POOL_MAX.saturating_sub(self.pool.len());
            self.pool
                .extend(self.frames.drain().map(|(_, v)| v).take(room));
            self.stored.clear();
            self.decoded.clear();
        }
    }

    /// Keep loaded frames across `clear` calls until `unpin`.
    pub fn pin(&mut self) {
        self.pinned = true;
    }

    pub fn unpin(&mut self) {
        self.pinned = false;
        self.clear();
    }

    /// Fetch and decode every frame `chunks` of `file` need that is not already loaded.
    pub async fn load(&mut self, chunks: &[&Chunk], file: &str) -> Result<()> {
        self.load_for_files(chunks.iter().map(|&c| (c, file))).await
    }

    /// [`load`](Self::load) for the chunks of several files at once, each named with its
    /// file: a damaged frame is reported as damage to the file it belongs to.
    pub async fn load_for_files<'c>(
        &mut self,
        chunks: impl IntoIterator<Item = (&'c Chunk, &'c str)>,
    ) -> Result<()> {
        let wanted = self.not_loaded(chunks);
        for run in merged_reads(&wanted) {
            let first = &run[0];
            let key = layout::pack(self.stanza, first.owner(), first.pack());
            let in_context = |e: Error| Error {
                context: format!("{}: {}", first.file, e.context),
                ..e
            };
            // Under a session key (the agent of a pg-remote backup), earlier backups'
            // frames come opened from the backup host, which holds the master keys.
            if self.storage.cipher().is_some_and(|c| c.is_session()) {
                self.load_opened_run(run, &key, in_context).await?;
            } else {
                self.load_run(run, &key, in_context).await?;
            }
        }
        Ok(())
    }

    /// The frames `chunks` need that are not loaded, each once, in pack order.
    fn not_loaded<'c>(
        &self,
        chunks: impl IntoIterator<Item = (&'c Chunk, &'c str)>,
    ) -> Vec<WantedFrame<'c>> {
        let mut seen = std::collections::HashSet::new();
        let mut wanted: Vec<WantedFrame> = chunks
            .into_iter()
            .filter_map(|(c, file)| {
                let key = c.frame_key(self.label)?;
                (!self.frames.contains_key(&key)
                    && !self.stored.contains_key(&key)
                    && seen.insert(key.clone()))
                .then_some(WantedFrame {
                    chunk: c,
                    file,
                    key,
                })
            })
            .collect();
        wanted.sort_by(|a, b| a.key.cmp(&b.key));
        wanted
    }

    /// Load one run of neighbouring frames of pack `key` opened by the backup host (under a
    /// session key): one request for the run, a failure of which `in_context` names the
    /// file of the run's first frame in.
    async fn load_opened_run(
        &mut self,
        run: &[WantedFrame<'_>],
        key: &str,
        in_context: impl FnOnce(Error) -> Error,
    ) -> Result<()> {
        let owner = run[0].owner();
        let frames: Vec<[u64; 2]> = run
            .iter()
            .map(|w| [w.offset(), w.chunk.stored as u64])
            .collect();
        let opened = self
            .storage
            .get_opened_frames(key, &frames)
            .await
            .map_err(in_context)?;
        self.requests += 1;
        for (w, opened) in run.iter().zip(opened) {
            self.fetched += w.chunk.stored as u64;
            let codec = self.manifest.codec_of(owner);
            let raw_len = w.chunk.frame_len() as usize;
            self.keep_frame(&w.key, codec, raw_len, opened);
        }
        Ok(())
    }

    /// Keep frame `key` as loaded: opened (decrypted) but still compressed with `codec`,
    /// `raw_len` bytes decoded. It is decoded when an extent of it is read
    /// ([`FrameReader::bytes`]).
    fn keep_frame(
        &mut self,
        key: &FrameKey,
        codec: CompressType,
        raw_len: usize,
        bytes: bytes::Bytes,
    ) {
        let frame = StoredFrame {
            bytes,
            codec,
            raw_len,
        };
        self.stored.insert(key.clone(), frame);
    }

    /// Load one run of neighbouring frames of pack `key` with one ranged read, checking and
    /// opening (in an encrypted stanza) each, kept as stored until an extent is read.
    /// `in_context` names the file of the run's first frame in a failed read.
    async fn load_run(
        &mut self,
        run: &[WantedFrame<'_>],
        key: &str,
        in_context: impl FnOnce(Error) -> Error,
    ) -> Result<()> {
        let owner = run[0].owner();
        let start = run[0].offset();
        let end = run.last().map_or(start, WantedFrame::end);
        let bytes = self
            .storage
            .get_range(key, start..end)
            .await
            .map_err(in_context)?;
        self.fetched += bytes.len() as u64;
        self.requests += 1;
        for w in run {
            let lo = (w.offset() - start) as usize;
            let stored = &bytes[lo..lo + w.chunk.stored as usize];
            let file = w.file;
            if Some(frame_check(stored)) != w.chunk.check {
                return Err(Error::corrupt(format!(
                    "{file}: stored frame at {key} offset {} fails its checksum: the repository is damaged",
                    w.offset()
                )));
            }
            let what = format!("{file} (frame at {key} offset {})", w.offset());
            let (codec, raw_len) = (self.manifest.codec_of(owner), w.chunk.frame_len() as usize);
            // Opened: decrypted where the stanza is encrypted (into the reused buffer, taken
            // out while `keep_frame` borrows the reader), still compressed.
            let mut scratch = std::mem::take(&mut self.opened);
            let opened = match self.storage.cipher() {
                Some(c) => c
                    .open_frame_into(key, w.offset(), stored, &mut scratch, &what)
                    .map(|()| Some(&scratch[..])),
                None => Ok(None),
            };
            // A copy only where the frame was opened into the scratch buffer; a frame
            // stored in the clear is a slice of the read.
            let kept = opened.map(|opened| match opened {
                Some(o) => bytes::Bytes::copy_from_slice(o),
                None => bytes.slice(lo..lo + w.chunk.stored as usize),
            });
            self.opened = scratch;
            self.keep_frame(&w.key, codec, raw_len, kept?);
        }
        Ok(())
    }

    /// Decode frame `k`, loaded, dropping the decoded frame read longest ago past
    /// [`DECODED_KEEP`] or [`DECODED_KEEP_READING`] (it stays loaded, as stored).
    fn decode(&mut self, k: &FrameKey) -> Result<()> {
        let f = self.stored.get(k).expect("bytes() of a frame not loaded");
        let mut raw = self.pool.pop().unwrap_or_default();
        let what = format!("frame at pack {} offset {} (backup {})", k.1, k.2, k.0);
        decompress_into(f.codec, &f.bytes, f.raw_len, &what, &mut raw)?;
        let keep = if self.pinned {
            DECODED_KEEP
        } else {
            DECODED_KEEP_READING
        };
        if self.decoded.len() >= keep {
            if let Some(old) = self.decoded.pop_front() {
                if let Some(buf) = self.frames.remove(&old) {
                    if self.pool.len() < POOL_MAX {
                        self.pool.push(buf);
                    }
                }
            }
        }
        self.frames.insert(k.clone(), raw);
        self.decoded.push_back(k.clone());
        Ok(())
    }

    /// The bytes of one stored (not all-zero) extent; its frame must have been loaded. An
    /// extent reaching past its frame means a damaged manifest.
    pub fn bytes(&mut self, c: &Chunk) -> Result<&[u8]> {
        let k = c
            .frame_key(self.label)
            .expect("bytes() of an all-zero extent");
        if !self.frames.contains_key(&k) {
            self.decode(&k)?;
        } else if self.decoded.back() != Some(&k) {
            // Read again: the last to be dropped (an incremental's changed blocks take the
            // reader back and forth between a prior frame and its own).
            if let Some(at) = self.decoded.iter().position(|d| d == &k) {
                let again = self.decoded.remove(at).expect("found");
                self.decoded.push_back(again);
            }
        }
        let frame = &self.frames[&k];
        let (start, end) = (c.at as usize, c.at as usize + c.raw as usize);
        frame.get(start..end).ok_or_else(|| {
            Error::corrupt(format!(
                "extent {start}..{end} lies outside its {}-byte frame at pack {} offset {}: the manifest is damaged",
                frame.len(),
                k.1,
                k.2
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(owner: &str, pack: &str, offset: u64, stored: u32) -> Chunk {
        Chunk {
            pack: Some(pack.into()),
            backup: Some(owner.into()),
            offset,
            stored,
            raw: 8192,
            check: None,
            at: 0,
            frame: 0,
        }
    }

    /// Runs as (owner, pack, first offset, end) of each merged read.
    fn runs(chunks: &[Chunk]) -> Vec<(String, String, u64, u64)> {
        let mut wanted: Vec<WantedFrame> = chunks
            .iter()
            .map(|c| WantedFrame {
                chunk: c,
                file: "f",
                key: c.frame_key("self").unwrap(),
            })
            .collect();
        wanted.sort_by(|a, b| a.key.cmp(&b.key));
        merged_reads(&wanted)
            .iter()
            .map(|r| {
                let f = &r[0];
                (
                    f.owner().into(),
                    f.pack().into(),
                    f.offset(),
                    r.last().unwrap().end(),
                )
            })
            .collect()
    }

    #[test]
    fn neighbouring_frames_of_one_pack_are_read_together() {
        let gap = MERGE_GAP;
        let got = runs(&[
            frame("A", "0-0", 1000, 100),
            frame("A", "0-0", 0, 1000),
            // Across a gap of exactly MERGE_GAP: joins.
            frame("A", "0-0", 1100 + gap, 10),
            // One byte further: a new read.
            frame("A", "0-0", 1110 + 2 * gap + 1, 10),
            // Another pack, another owner: new reads.
            frame("A", "0-1", 0, 10),
            frame("B", "0-0", 10, 10),
        ]);
        assert_eq!(
            got,
            vec![
                ("A".into(), "0-0".into(), 0, 1110 + gap),
                (
                    "A".into(),
                    "0-0".into(),
                    1110 + 2 * gap + 1,
                    1120 + 2 * gap + 1
                ),
                ("A".into(), "0-1".into(), 0, 10),
                ("B".into(), "0-0".into(), 10, 20),
            ]
        );
    }

    #[test]
    fn merged_reads_stop_growing_at_max_read() {
        let big = (MAX_READ / 2) as u32;
        let chunks: Vec<Chunk> = (0..5)
            .map(|i| frame("A", "0-0", i * big as u64, big))
            .collect();
        let got = runs(&chunks);
        // A frame joins while the read is shorter than MAX_READ: two half-MAX_READ frames
        // make a full read, and the next frame starts a new one.
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].3 - got[0].2, 2 * big as u64);
        assert!(got.iter().all(|r| r.3 - r.2 <= MAX_READ + big as u64));
    }
}
