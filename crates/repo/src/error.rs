//! Errors of the repository layer.
//!
//! Every error carries a kind (what a caller may branch on), a context string naming the
//! object or operation, and its source (kept, so `source()` walks down to the backend's own
//! error). Whether a failure is worth retrying is decided here, once
//! ([`ErrorKind::is_retryable`]); the storage layer's retry loop and the engine's
//! `Error::is_retryable` both ask it. How an error shows (context, then its source's
//! message) is written once, [`cause_suffix`], and the engine's errors show the same way;
//! the type itself is declared as the remote layer's is (`pgstrata_remote::kinded_error!`).

/// The failure underneath an error, and how it shows after the error's own words: the
/// remote layer's (the lowest crate with such an error), the same for every layer.
pub use pgstrata_remote::error::{cause_suffix, Source};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object does not exist.
    NotFound,
    /// A write-once object already exists.
    AlreadyExists,
    /// Stored bytes fail their checksum or cannot be decoded.
    Corrupt,
    /// Stored data is valid but says something unexpected (wrong format version, ...).
    Format,
    /// The storage backend failed; may be transient.
    Storage,
    /// Invalid argument from the caller (bad option value and such).
    Invalid,
}

impl ErrorKind {
    /// True when repeating the same operation may succeed: only storage failures (server
    /// errors, timeouts, dropped connections, short reads) are transient. A missing or
    /// existing object, damaged data and a refused request stay what they are.
    pub fn is_retryable(self) -> bool {
        self == ErrorKind::Storage
    }
}

pgstrata_remote::kinded_error! {
    pub struct Error(ErrorKind);
    pub(crate) fn with_source;
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn corrupt(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Corrupt, context)
    }

    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

/// Refuses stored data of a format newer than this build reads (`supported`), naming it
/// (`what`): the data is fine, this pgstrata is too old for it.
pub(crate) fn check_format_version(what: &str, found: u32, supported: u32) -> Result<()> {
    if found > supported {
        return Err(Error::new(
            ErrorKind::Format,
            format!(
                "{what}: format {found} is newer than this pgstrata understands ({supported}); \
                 upgrade pgstrata"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_format_is_refused_naming_the_object_and_both_versions() {
        assert!(check_format_version("stanza/main/stanza.info", 2, 2).is_ok());
        let e = check_format_version("stanza/main/stanza.info", 3, 2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Format);
        let shown = e.to_string();
        assert!(
            shown.starts_with("stanza/main/stanza.info: format 3 "),
            "{shown}"
        );
        assert!(shown.contains("(2); upgrade pgstrata"), "{shown}");
    }

    #[test]
    fn an_error_shows_its_source_after_its_context() {
        let io = std::io::Error::other("disk on fire");
        let e = Error::with_source(ErrorKind::Storage, "read pack p1", io);
        assert_eq!(e.to_string(), "read pack p1: disk on fire");
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(Error::corrupt("pack p1").to_string(), "pack p1");
    }
}
