//! Errors of the engine. Every error says what was being done and to what; the kind decides
//! the exit code and whether retrying could help.
//!
//! One style across the crates (rustic_core's rules): one error type per crate, a kind to
//! branch on, context on every failure, and the source kept. An error from the repository
//! keeps its repository kind (`ErrorKind::Repo`) and its source chain: a storage outage
//! stays a storage failure (exit 3) and damaged data stays damage (exit 4), whichever layer
//! passes them on. An error shows as the repository's do: its message, then its source's
//! (`pgstrata_repo::error::cause_suffix`).

use pgstrata_repo::error::{cause_suffix, Source};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Configuration or command-line problem: fix the settings.
    Config,
    /// The repository refused or failed, with the repository's own kind: `Corrupt` is
    /// damage (exit 4), `Invalid` a configuration problem (exit 2).
    Repo(pgstrata_repo::ErrorKind),
    /// The PostgreSQL server could not be reached or refused a query.
    Postgres,
    /// A local file operation failed.
    Io,
    /// A state that makes the command unsafe to run (running cluster, non-empty directory,
    /// repository of another cluster...).
    Refused,
    /// Stored data is damaged or does not match what was recorded.
    Integrity,
    /// Waited too long (for WAL to be archived, for example).
    Timeout,
}

#[derive(Debug, thiserror::Error)]
#[error("{message}{}", cause_suffix(.source))]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub source: Option<Source>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }
    pub fn config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Config, message)
    }
    pub fn refused(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Refused, message)
    }
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            message: context.into(),
            source: Some(Box::new(source)),
        }
    }
    pub fn integrity(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Integrity, message)
    }

    /// The same error, its message prefixed with what it happened to (`what: message`).
    pub fn context(mut self, what: impl std::fmt::Display) -> Error {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// True when retrying the command may succeed without anything being changed: the
    /// repository's transient failures (decided in one place,
    /// `pgstrata_repo::ErrorKind::is_retryable`) and timeouts.
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Repo(k) => k.is_retryable(),
            ErrorKind::Timeout => true,
            _ => false,
        }
    }

    /// Stored data is damaged or does not match what was recorded.
    pub(crate) fn is_damage(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Integrity | ErrorKind::Repo(pgstrata_repo::ErrorKind::Corrupt)
        )
    }

    /// Process exit code for this error (documented in the README).
    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Config | ErrorKind::Repo(pgstrata_repo::ErrorKind::Invalid) => 2,
            _ if self.is_damage() => 4,
            _ => 3,
        }
    }
}

/// The repository's kind, context and source carry over unchanged.
impl From<pgstrata_repo::Error> for Error {
    fn from(e: pgstrata_repo::Error) -> Error {
        Error {
            kind: ErrorKind::Repo(e.kind),
            message: e.context,
            source: e.source,
        }
    }
}

impl From<pgstrata_pg::Error> for Error {
    fn from(e: pgstrata_pg::Error) -> Error {
        match e {
            pgstrata_pg::Error::Io { path, source } => Error::io(path, source),
            invalid @ pgstrata_pg::Error::Invalid { .. } => {
                Error::new(ErrorKind::Io, invalid.to_string())
            }
        }
    }
}

/// Attach context to a PostgreSQL client error.
pub(crate) fn pg_err(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Error {
    let context = context.into();
    move |e| {
        // tokio-postgres hides the server's message in the source chain; show it.
        let detail = match e.as_db_error() {
            Some(db) => db.message().to_string(),
            None => {
                let mut s = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(inner) = src {
                    s.push_str(": ");
                    s.push_str(&inner.to_string());
                    src = inner.source();
                }
                s
            }
        };
        Error::new(ErrorKind::Postgres, format!("{context}: {detail}"))
    }
}
