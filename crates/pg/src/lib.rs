//! What pgstrata knows about PostgreSQL itself, independent of any repository or command.
//!
//! Everything here is a pure function of bytes PostgreSQL wrote (pg_control, data pages,
//! WAL file names) or of the data directory's layout. Nothing here talks to a server or a
//! repository, which keeps these facts testable in isolation and reusable by every command.
//!
//! - [`control`]: parse and check `global/pg_control`.
//! - [`page`]: data page header fields and the page checksum algorithm.
//! - [`lsn`]: log sequence numbers, timelines and WAL segment names.
//! - [`layout`]: which files of a data directory a backup copies, and which are relation files.
//! - [`wal`]: a WAL decoder that lists the blocks and files each segment changes.

pub mod control;
pub mod layout;
pub mod lsn;
pub mod page;
pub mod wal;

/// Errors from reading PostgreSQL's on-disk structures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
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
