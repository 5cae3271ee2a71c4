//! What the copy workers share, read-only: the [`CopyContext`] with the prior backup an
//! incremental compares against and the interrupted backup whose frames it may reuse. Below
//! both the copier (`copy`) and the resume checkpoints (`checkpoints`), which each need it.

use crate::progress::Counters;
use crate::track::WalChanges;
use crate::Result;
use pgstrata_pg::lsn::Lsn;
use pgstrata_repo::codec::CompressType;
use pgstrata_repo::manifest::{FileEntry, StoredManifest};
use pgstrata_repo::Storage;
use std::collections::HashMap;
use std::sync::Arc;

/// Everything a copy worker needs, shared read-only.
pub(super) struct CopyContext {
    pub storage: Storage,
    pub runtime: tokio::runtime::Handle,
    pub stanza: String,
    pub label: String,
    pub compression: pgstrata_repo::codec::Compression,
    pub frame_size: usize,
    pub pack_size: usize,
    pub start_lsn: Lsn,
    pub data_checksums: bool,
    /// PostgreSQL's page size.
    pub page_size: usize,
    pub relseg_size: u32,
    pub counters: Arc<Counters>,
    pub prior: Option<Prior>,
    /// Hash every block of every file instead of trusting size and mtime.
    pub delta: bool,
    /// Files at least this large get pack objects of their own (not shared with others).
    pub bundle_limit: u64,
    /// Blocks changed since the prior backup, learned from the WAL (None: hash files).
    pub wal: Option<WalChanges>,
    /// An interrupted backup whose stored frames may be pointed at.
    pub resume: Option<Resumed>,
    /// Write resume checkpoints as packs are stored.
    pub checkpoints: bool,
    /// `pg-read-rate-limit`: every read of the data directory takes its bytes from it.
    pub read_rate: Option<Arc<pgstrata_repo::rate::RateLimiter>>,
}

impl CopyContext {
    /// `bytes` were just read from the data directory: wait for them under the read limit.
    pub(super) fn after_read(&self, bytes: usize) {
        if let Some(rate) = &self.read_rate {
            rate.acquire_blocking(bytes as u64);
        }
    }
}

/// What an incremental compares against: the prior backup's manifest, opened for reading
/// in order. Its entries are not held: each job is handed the prior's entry of its file
/// as the walk and the prior's entries are read side by side ([`super::ordered`]). Files
/// whose maps are stored apart (format 2) come without them: a map is loaded only for a
/// file that changed.
pub(super) struct Prior {
    pub manifest: Arc<StoredManifest>,
}

impl Prior {
    pub fn new(manifest: Arc<StoredManifest>) -> Prior {
        Prior { manifest }
    }

    pub(super) fn label(&self) -> &str {
        &self.manifest.header().label
    }

    /// The entry with its extents and block hashes, loading its map if it is stored apart.
    pub(super) fn loaded<'e>(
        &self,
        ctx: &CopyContext,
        e: &'e FileEntry,
    ) -> Result<std::borrow::Cow<'e, FileEntry>> {
        if !e.map_unloaded() {
            return Ok(std::borrow::Cow::Borrowed(e));
        }
        Ok(std::borrow::Cow::Owned(ctx.runtime.block_on(
            self.manifest.header().load_map(&ctx.storage, e),
        )?))
    }
}

/// An interrupted backup whose stored frames this backup may point at.
pub(crate) struct Resumed {
    pub label: String,
    pub compression: CompressType,
    /// By path: extents and block hashes of files whose frames are all stored.
    pub files: HashMap<String, FileEntry>,
}
