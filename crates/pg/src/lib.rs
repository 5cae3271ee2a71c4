//! What pgstrata knows about PostgreSQL itself, independent of any repository or command.
//!
//! Everything here is a pure function of bytes PostgreSQL wrote (pg_control, data pages,
//! WAL file names) or of the data directory's layout. Nothing here talks to a server or a
//! repository, which keeps these facts testable in isolation and reusable by every command.
//!
//! - [`control`]: parse and check `global/pg_control`.
//! - [`page`]: data page header fields and the page checksum algorithm.
//! - [`lsn`]: log sequence numbers, timelines and WAL segment names.
//! - [`data_dir`]: which files of a data directory a backup copies, and which are relation files.
//! - [`wal`]: a WAL decoder that lists the blocks and files each segment changes.

pub mod control;
pub mod data_dir;
pub mod lsn;
pub mod page;
pub mod wal;

/// Errors from reading PostgreSQL's on-disk structures. The variants are the kinds a
/// caller branches on (the engine maps each to its own kind, and so to an exit code):
/// damage, a version pgstrata does not read, and a file that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes (or text) are not what PostgreSQL writes: a failed CRC, a torn file, a
    /// WAL record that does not decode. Damage, not a setting to fix.
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    /// Well-formed, of a PostgreSQL version or build pgstrata does not read (outside
    /// 14-18): the data is fine, this pgstrata cannot handle it.
    #[error("{what}: {reason}")]
    Unsupported { what: String, reason: String },
    /// A file of the data directory could not be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Invalid {
        what: what.into(),
        reason: reason.into(),
    }
}

pub(crate) fn unsupported(what: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Unsupported {
        what: what.into(),
        reason: reason.into(),
    }
}
