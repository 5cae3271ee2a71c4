//! pgstrata's repository: where backups and archived WAL live, and the format they are
//! stored in. `docs/repository-format.md` is the specification; this crate is its one
//! implementation, and the two must agree.
//!
//! - [`storage`]: the one way to reach a repository (object_store underneath), write-once,
//!   with timeouts and retries; `fault` (feature `fault-injection`, tests only) wraps any
//!   backend to inject failures; `fixture` (feature `fixtures`, tests and benchmarks only)
//!   builds sample manifests.
//! - [`cipher`]: repository encryption (sealed objects and frames, key files).
//! - [`codec`]: compression types and levels.
//! - [`named`]: enums configured by name (one list of names for parsing, help and docs).
//! - [`layout`]: object names, built and parsed.
//! - [`stanza`]: the record of which cluster a stanza belongs to.
//! - [`chunk`]: extents, the frames they point into, and frame checks; [`name`]: the
//!   interned names (packs, labels, owners) extents and entries hold.
//! - [`pack`]: frames of compressed data grouped into pack objects, and reading them back.
//! - [`manifest`]: a backup's manifest, the object that makes a backup exist; `checked`:
//!   the stored form it shares with resume checkpoints; `map_read`: loading file maps
//!   through the frame reader.
//! - [`expire_record`]: what each expire removed, so a vanished backup is told from an
//!   expired one.
//! - [`resume`]: checkpoints of a running backup, which let the next one reuse its frames.
//! - [`wal_object`]: archived WAL objects; [`changemap`]: the block-change map beside each segment.
//! - [`s3_versions`]: the S3 requests object_store does not make (Object Lock, object
//!   versions), for immutable repositories; [`as_of`]: a repository read as it was at a
//!   time (`repo-target-time`).
//! - `direct`: direct I/O on a local repository's files (a copy's reads and writes).
//! - [`cache`]: objects of a remote repository kept on this host; [`private_dir`]: the
//!   check that a directory pgstrata keeps state in is this user's alone.

pub mod annotation;
pub mod as_of;
pub mod cache;
pub mod changemap;
mod checked;
pub mod chunk;
pub mod cipher;
pub mod codec;
mod direct;
pub mod error;
pub mod expire_record;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixture;
pub(crate) mod json_text;
mod key_objects;
pub mod layout;
pub mod manifest;
mod map_read;
pub mod name;
pub mod named;
pub mod pack;
pub mod private_dir;
#[cfg(test)]
mod props;
pub mod rate;
mod records;
pub mod resume;
pub mod s3_versions;
pub mod stanza;
pub mod storage;
pub mod wal_object;

pub use error::{Error, ErrorKind, Result};
pub use named::Named;
pub use storage::Storage;

/// Version of the repository format written by this code. Bumped on any change that an
/// older reader would misread; readers refuse versions they do not know.
pub const FORMAT_VERSION: u32 = 4;
