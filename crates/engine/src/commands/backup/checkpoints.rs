//! Resume checkpoints (see `pgstrata_repo::resume` for the format and the why): the copy
//! workers' checkpoints while a backup runs, finding the interrupted backup the next one
//! reuses, and removing a complete backup's checkpoints.

use super::copy_context::{CopyContext, Resumed};
use crate::{Error, Result};
use pgstrata_repo::layout::{self, BackupObject};
use pgstrata_repo::manifest::FileEntry;
use pgstrata_repo::pack::PackWriter;
use pgstrata_repo::resume::{self, Checkpoint};
use pgstrata_repo::{Storage, FORMAT_VERSION};
use std::collections::HashMap;

/// Files smaller than this are not checkpointed. Resuming saves compressing and storing
/// data, which for small files costs little next to reading them, and a pack of bundled
/// small files holds tens of thousands of them, which would all wait in memory until the
/// pack is stored (on 90,000 files that was a third of the backup's peak).
pub(crate) const MIN_FILE_SIZE: u64 = 1 << 20;

/// A worker writes no checkpoint before it has stored new frames for this much of its
/// files' data: a backup killed before that loses seconds of work, and the incrementals
/// of most days store less, so they pay nothing for resume (on a backup host over a slow
/// line, a checkpoint of one changed 1 GB segment is a third of what its incremental
/// stores).
pub(crate) const MIN_NEW_BYTES: u64 = 64 << 20;

/// The newest interrupted backup of the stanza, when it is newer than every complete one
/// (`complete`, oldest first) and left checkpoints. Damaged checkpoints are passed over
/// with a warning: resuming is an optimisation, never a reason to fail a backup.
pub(crate) async fn find(
    storage: &Storage,
    stanza: &str,
    complete: &[String],
    page_size: u32,
) -> Result<Option<Resumed>> {
    use futures::{StreamExt, TryStreamExt};
    let newest_complete = complete.last().map(String::as_str).unwrap_or("");
    let dirs = storage.list_dirs(&layout::backup_root(stanza)).await?;
    let Some(label) = dirs
        .into_iter()
        .filter(|d| resume::resumable(d, complete.contains(d), newest_complete))
        .max()
    else {
        return Ok(None);
    };
    let checkpoints = storage.list(&layout::resume_dir(stanza, &label)).await?;
    if checkpoints.is_empty() {
        return Ok(None);
    }
    let packs: HashMap<String, u64> = storage
        .list(&layout::pack_dir(stanza, &label))
        .await?
        .into_iter()
        .filter_map(|o| match layout::parse_backup_object(stanza, &o.key)? {
            (_, BackupObject::Pack(name)) => Some((name.to_string(), o.size)),
            _ => None,
        })
        .collect();
    let loaded: Vec<Option<Checkpoint>> = futures::stream::iter(checkpoints)
        .map(|o| {
            let label = label.clone();
            async move {
                let bytes = storage.get(&o.key).await?;
                Ok::<_, Error>(
                    match Checkpoint::decode(&bytes, &o.key, stanza, &label, page_size) {
                        Ok(c) => Some(c),
                        Err(e) => {
                            log::warn!("not resuming from {}: {e}", o.key);
                            None
                        }
                    },
                )
            }
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    let mut compression = None;
    let mut files = HashMap::new();
    for c in loaded.into_iter().flatten() {
        if compression.is_some_and(|k| k != c.compression) {
            log::warn!("not resuming from backup {label}: its checkpoints name different codecs");
            return Ok(None);
        }
        compression = Some(c.compression);
        for f in c.files {
            // Only frames that are really there: a pack cut short is not trusted.
            let stored = f.chunks.iter().all(|c| match (&c.pack, &c.backup) {
                (Some(p), None) => packs
                    .get(&**p)
                    .is_some_and(|size| c.offset + c.stored as u64 <= *size),
                _ => true,
            });
            if stored {
                files.insert(f.path.to_string(), f);
            }
        }
    }
    let Some(compression) = compression else {
        return Ok(None);
    };
    Ok(Some(Resumed {
        label,
        compression,
        files,
    }))
}

/// One copy worker's checkpoints: files with new frames wait here until every pack they
/// use is stored, then go into the next checkpoint object.
#[derive(Default)]
pub(super) struct Checkpointer {
    /// Files with new frames, extents and block hashes inline.
    pending: Vec<FileEntry>,
    written: usize,
    /// `stored_below` at the last checkpoint: a new one is due only when it moves.
    stored_below: usize,
    /// Bytes of file data in the new frames of the files added so far.
    new_bytes: u64,
}

impl Checkpointer {
    /// Remember a copied file whose new frames this worker wrote.
    pub fn add(&mut self, inline: FileEntry) {
        self.new_bytes += inline
            .chunks
            .iter()
            .filter(|c| c.pack.is_some() && c.backup.is_none())
            .map(|c| c.raw as u64)
            .sum::<u64>();
        self.pending.push(inline);
    }

    /// Write a checkpoint of the files whose packs are all stored now (`all`: every
    /// pending file, once the writer has finished), once there is enough to be worth
    /// resuming ([`MIN_NEW_BYTES`]).
    pub fn write_due(
        &mut self,
        ctx: &CopyContext,
        writer: &mut PackWriter,
        all: bool,
    ) -> Result<()> {
        if self.pending.is_empty() || self.new_bytes < MIN_NEW_BYTES {
            return Ok(());
        }
        let below = writer.stored_below()?;
        if !all && below == self.stored_below {
            return Ok(());
        }
        self.stored_below = below;
        let own_max = |f: &FileEntry| {
            f.chunks
                .iter()
                .filter(|c| c.backup.is_none())
                .filter_map(|c| layout::parse_pack_name(c.pack.as_deref()?))
                .map(|(_, seq)| seq)
                .max()
        };
        let (ready, waiting): (Vec<FileEntry>, Vec<FileEntry>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|f| all || own_max(f).is_none_or(|seq| seq < below));
        self.pending = waiting;
        if ready.is_empty() {
            return Ok(());
        }
        let key = layout::resume_checkpoint(&ctx.stanza, &ctx.label, writer.worker(), self.written);
        self.written += 1;
        let checkpoint = Checkpoint {
            format_version: FORMAT_VERSION,
            stanza: ctx.stanza.clone(),
            label: ctx.label.clone(),
            compression: ctx.compression.kind,
            files: ready,
        };
        let bytes = bytes::Bytes::from(checkpoint.encode());
        if let Err(e) = ctx.runtime.block_on(ctx.storage.put_new(&key, bytes)) {
            // The backup does not need it; only a resume after a crash would.
            log::warn!("resume checkpoint {key} not written: {e}");
        }
        Ok(())
    }
}

/// Remove a complete backup's checkpoints: its manifest describes everything they did.
pub(crate) async fn remove_checkpoints(storage: &Storage, stanza: &str, label: &str) {
    let result = async {
        let keys: Vec<String> = storage
            .list(&layout::resume_dir(stanza, label))
            .await?
            .into_iter()
            .map(|o| o.key)
            .collect();
        storage.delete_many(&keys).await
    }
    .await;
    if let Err(e) = result {
        log::warn!("backup {label}: its resume checkpoints were not removed ({e}); expire will remove them");
    }
}
