//! Errors of the remote layer: reaching the other host, speaking the agent protocol with
//! it, serving a repository to it.
//!
//! As in the other crates: a kind to branch on, a context naming what failed, the source
//! kept; shown as the repository's errors are (context, then the source's message). What
//! crosses into `object_store` (the [`crate::RemoteStore`] side) goes as that crate's
//! errors, which `pgstrata_repo` already sorts into its kinds; this type is for the rest:
//! starting ssh, the hellos, an agent's serving loop, rebuilding a patched object.

/// The failure underneath an error, kept so `source()` walks down to it.
pub type Source = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The peer could not be reached or the connection to it broke (ssh failed, the
    /// stream closed or failed): a new connection may succeed.
    Link,
    /// The peer answered and is not one this pgstrata can speak to (not an agent, another
    /// protocol version), or sent what the protocol does not allow: permanent until the
    /// hosts are set up alike.
    Protocol,
    /// A file operation on this host failed (the served repository's directory, starting
    /// the ssh client).
    Io,
    /// An object cannot be made from a patch here (not a manifest, a damaged base or
    /// patch, no key to open the base): the requester sends the object whole.
    Rebuild,
    /// An object or frame cannot be opened with the master key and sealed again for a
    /// peer holding a session key: it is damaged or not the object stored under its name.
    Reseal,
}

impl ErrorKind {
    /// True when trying again may succeed without anything being changed: only a link
    /// that failed.
    pub fn is_retryable(self) -> bool {
        self == ErrorKind::Link
    }
}

#[derive(Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub context: String,
    pub source: Option<Source>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    pub fn with_source(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl Into<Source>,
    ) -> Error {
        Error {
            kind,
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// True when trying again may succeed (see [`ErrorKind::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.context)?;
        match &self.source {
            Some(s) => write!(f, ": {s}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|s| s as _)
    }
}
