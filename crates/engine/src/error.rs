//! Errors of the engine. Every error says what was being done and to what; the kind decides
//! the exit code and whether retrying could help.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Configuration or command-line problem: fix the settings.
    Config,
    /// The repository refused or failed (see the repo error kind in the message).
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

#[derive(Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
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

    /// True when retrying the command may succeed without anything being changed.
    pub fn retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Repo(pgstrata_repo::ErrorKind::Storage) | ErrorKind::Timeout
        )
    }

    /// Process exit code for this error (documented in the README).
    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Config => 2,
            ErrorKind::Integrity | ErrorKind::Repo(pgstrata_repo::ErrorKind::Corrupt) => 4,
            _ => 3,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

impl From<pgstrata_repo::Error> for Error {
    fn from(e: pgstrata_repo::Error) -> Error {
        let kind = match e.kind {
            pgstrata_repo::ErrorKind::Corrupt => ErrorKind::Integrity,
            pgstrata_repo::ErrorKind::Invalid => ErrorKind::Config,
            k => ErrorKind::Repo(k),
        };
        Error {
            kind,
            message: e.to_string(),
            source: None,
        }
    }
}

impl From<pgstrata_pg::Error> for Error {
    fn from(e: pgstrata_pg::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            message: e.to_string(),
            source: None,
        }
    }
}

/// Attach context to a PostgreSQL client error.
pub fn pg_err(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Error {
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
