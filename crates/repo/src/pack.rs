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

use crate::codec::{decompress, CompressType};
use crate::{layout, Error, Result, Storage};
use serde::{Deserialize, Serialize};

/// Default raw bytes per frame: 128 pages of 8 KiB.
pub const DEFAULT_FRAME_SIZE: usize = 1024 * 1024;
/// Default size a pack grows to before it is written.
pub const DEFAULT_PACK_SIZE: usize = 16 * 1024 * 1024;

/// Where one frame of a file lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Pack name within the backup that stored it; `None` for an all-zero frame.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<String>,
    /// Label of the backup holding the pack when it is not the manifest's own backup.
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    #[serde(rename = "o", default)]
    pub offset: u64,
    #[serde(rename = "s", default)]
    pub stored: u32,
    #[serde(rename = "r")]
    pub raw: u32,
    /// XXH3-64 of the stored bytes, hex.
    #[serde(rename = "h", default, skip_serializing_if = "String::is_empty")]
    pub check: String,
}

/// Frame checksum used in chunks.
pub fn frame_check(stored: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(stored))
}

/// Accumulates frames into a pack and writes it when full. One writer per worker; names
/// are `<worker>-<sequence>` so concurrent writers never collide.
pub struct PackWriter {
    storage: Storage,
    runtime: tokio::runtime::Handle,
    stanza: String,
    label: String,
    worker: usize,
    seq: usize,
    pack_size: usize,
    buf: Vec<u8>,
    /// Bytes written to the repository so far.
    pub written: u64,
    pub packs_written: u64,
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
            pack_size,
            buf: Vec::with_capacity(pack_size + DEFAULT_FRAME_SIZE),
            written: 0,
            packs_written: 0,
        }
    }

    fn current_name(&self) -> String {
        format!("{}-{}", self.worker, self.seq)
    }

    /// Append one compressed frame; returns where it will be found.
    pub fn add(&mut self, stored: &[u8], raw_len: usize) -> Result<Chunk> {
        if self.buf.len() + stored.len() > self.pack_size && !self.buf.is_empty() {
            self.flush()?;
        }
        let chunk = Chunk {
            pack: Some(self.current_name()),
            backup: None,
            offset: self.buf.len() as u64,
            stored: stored.len() as u32,
            raw: raw_len as u32,
            check: frame_check(stored),
        };
        self.buf.extend_from_slice(stored);
        Ok(chunk)
    }

    /// Write the current pack, if it holds anything. Must be called before the manifest
    /// that references its frames is written.
    pub fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let key = layout::pack(&self.stanza, &self.label, &self.current_name());
        let data = bytes::Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(self.pack_size + DEFAULT_FRAME_SIZE),
        ));
        let len = data.len() as u64;
        self.runtime.block_on(self.storage.put_new(&key, data))?;
        self.written += len;
        self.packs_written += 1;
        self.seq += 1;
        Ok(())
    }
}

/// Fetch and decode one chunk of a file stored in backup `label` (the chunk's own backup
/// label, if set, takes precedence).
pub async fn read_chunk(
    storage: &Storage,
    stanza: &str,
    label: &str,
    codec: CompressType,
    chunk: &Chunk,
    file: &str,
) -> Result<Vec<u8>> {
    let Some(pack) = &chunk.pack else {
        return Ok(vec![0u8; chunk.raw as usize]);
    };
    let key = layout::pack(stanza, chunk.backup.as_deref().unwrap_or(label), pack);
    let stored = storage
        .get_range(&key, chunk.offset..chunk.offset + chunk.stored as u64)
        .await
        .map_err(|e| Error {
            context: format!("{file}: {}", e.context),
            ..e
        })?;
    if frame_check(&stored) != chunk.check {
        return Err(Error::corrupt(format!(
            "{file}: stored frame at {key} offset {} fails its checksum: the repository is damaged",
            chunk.offset
        )));
    }
    decompress(
        codec,
        &stored,
        chunk.raw as usize,
        &format!("{file} (frame at {key} offset {})", chunk.offset),
    )
}
