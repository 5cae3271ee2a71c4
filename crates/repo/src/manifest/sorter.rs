//! Entries of a manifest being written, held compressed until they are written in path
//! order.
//!
//! A backup makes its entries in the order its workers finish files (largest first), not
//! in the path order a manifest stores them in. Held decoded until the end, they were most
//! of a backup's memory (about 250 bytes a file). Here they are gathered in runs: every
//! [`RUN_ENTRIES`] entries are sorted by path and kept as compressed JSON (about 77 bytes
//! a file); [`EntrySorter::into_sorted`] merges the runs into one stream in path order,
//! from which [`Manifest::encode_streamed`] writes the manifest.

use super::{Entry, Manifest, MAGIC};
use crate::{Error, ErrorKind, Result};
use std::collections::BinaryHeap;
use std::io::Write;

/// Entries sorted and compressed together: decoded, about 2 MB a run held by each writer.
const RUN_ENTRIES: usize = 8192;

/// Entries in any order, held as sorted compressed runs.
#[derive(Default)]
pub struct EntrySorter {
    pending: Vec<Entry>,
    runs: Vec<Vec<u8>>,
}

impl EntrySorter {
    pub fn push(&mut self, e: Entry) {
        self.pending.push(e);
        if self.pending.len() >= RUN_ENTRIES {
            self.flush();
        }
    }

    /// Take `other`'s entries (another worker's).
    pub fn absorb(&mut self, mut other: EntrySorter) {
        other.flush();
        self.runs.append(&mut other.runs);
    }

    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_unstable_by(|a, b| a.path().cmp(b.path()));
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("zstd encoder");
        for e in &pending {
            serde_json::to_writer(&mut enc, e).expect("serialize into memory");
        }
        self.runs.push(enc.finish().expect("zstd into memory"));
        self.pending = pending;
        self.pending.clear();
    }

    /// Every entry, in path order (a path given twice comes twice).
    pub fn into_sorted(mut self) -> impl Iterator<Item = Result<Entry>> {
        self.flush();
        let mut readers: Vec<RunReader> = self.runs.into_iter().map(run_reader).collect();
        let mut heads = BinaryHeap::new();
        let mut failed = None;
        for (run, r) in readers.iter_mut().enumerate() {
            match r.next() {
                Some(Ok(entry)) => heads.push(Head { entry, run }),
                Some(Err(e)) => failed = Some(e),
                None => {}
            }
        }
        let mut failed = failed.map(run_error);
        std::iter::from_fn(move || {
            if let Some(e) = failed.take() {
                return Some(Err(e));
            }
            let Head { entry, run } = heads.pop()?;
            match readers[run].next() {
                Some(Ok(next)) => heads.push(Head { entry: next, run }),
                Some(Err(e)) => failed = Some(run_error(e)),
                None => {}
            }
            Some(Ok(entry))
        })
    }
}

type RunReader = serde_json::StreamDeserializer<
    'static,
    serde_json::de::IoRead<
        zstd::stream::read::Decoder<'static, std::io::BufReader<std::io::Cursor<Vec<u8>>>>,
    >,
    Entry,
>;

fn run_reader(run: Vec<u8>) -> RunReader {
    let dec = zstd::stream::read::Decoder::new(std::io::Cursor::new(run)).expect("zstd decoder");
    serde_json::Deserializer::from_reader(dec).into_iter::<Entry>()
}

/// A run written here fails to read back only through a bug.
fn run_error(e: serde_json::Error) -> Error {
    Error::with_source(
        ErrorKind::Invalid,
        "reading back the sorted manifest entries",
        e,
    )
}

/// The next entry of one run, ordered for a min-heap by path.
struct Head {
    entry: Entry,
    run: usize,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: BinaryHeap pops its largest.
        (other.entry.path(), other.run).cmp(&(self.entry.path(), self.run))
    }
}

impl Manifest {
    /// The stored form of this manifest (a header: its `entries` are empty) with `entries`
    /// (in path order) as its entries, written as they come: what [`Manifest::encode`]
    /// makes of the same manifest held whole, byte for byte.
    pub fn encode_streamed(&self, entries: impl Iterator<Item = Result<Entry>>) -> Result<Vec<u8>> {
        assert!(self.entries.is_empty(), "a header");
        let header = serde_json::to_string(self).expect("serialize into memory");
        let prefix = header
            .strip_suffix("[]}")
            .filter(|p| p.ends_with("\"entries\":"))
            .expect("entries are the last field");
        let mut out = Vec::with_capacity(64 << 10);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[0; 32]);
        let mut enc = zstd::stream::write::Encoder::new(out, 3).expect("zstd encoder");
        let mut json = std::io::BufWriter::with_capacity(256 << 10, &mut enc);
        let write = |json: &mut std::io::BufWriter<_>, bytes: &[u8]| {
            json.write_all(bytes).expect("compress into memory")
        };
        write(&mut json, prefix.as_bytes());
        write(&mut json, b"[");
        for (i, e) in entries.enumerate() {
            if i > 0 {
                write(&mut json, b",");
            }
            serde_json::to_writer(&mut json, &e?).expect("serialize into memory");
        }
        write(&mut json, b"]}");
        json.flush().expect("compress into memory");
        drop(json);
        let mut out = enc.finish().expect("zstd into memory");
        let hash = blake3::hash(&out[40..]);
        out[8..40].copy_from_slice(hash.as_bytes());
        Ok(out)
    }
}
