//! Errors of the engine. Every error says what was being done and to what; the kind decides
//! the exit code and whether retrying could help.
//!
//! One style across the crates (rustic_core's rules), for whoever adds a failure:
//! - One error type per library crate (`pgstrata_pg::Error`, `pgstrata_repo::Error`,
//!   `pgstrata_remote::Error`, this one), each with a kind to branch on. No `String` errors
//!   and no `map_err(|e| e.to_string())`: a reason flattened to text cannot be branched on.
//! - Context on every failure (what was done, to what), and the failure underneath kept as
//!   the source, not copied into the message: `source()` walks down to the backend's or
//!   the server's own error (a PostgreSQL refusal's SQLSTATE is [`Error::sqlstate`]).
//! - A kind passes up unchanged: a repository error keeps its kind (`ErrorKind::Repo`) and
//!   a remote one its (`ErrorKind::Remote`), so a storage outage stays a storage failure
//!   (exit 3) and damaged data stays damage (exit 4), whichever layer passes them on;
//!   `pgstrata_pg`'s damaged bytes become `Integrity`, its unsupported releases `Refused`.
//!   To add words, [`Error::context`]; to judge, wrap it as the source of a new kind.
//! - Retryable or permanent is asked of the error ([`Error::is_retryable`]: transient
//!   storage or link failures, timeouts, a failed PostgreSQL connection, the server's
//!   transient SQLSTATEs), and damage too ([`Error::is_damage`]); never read from text.
//! - The exit code comes from the kind alone ([`Error::exit_code`]; the binary's `main`
//!   uses nothing else): 2 configuration, 4 damage, 3 the rest.
//!
//! An error shows as the repository's do: its message, then its source's
//! (`pgstrata_repo::error::cause_suffix`), a PostgreSQL client error as the server's words.

use pgstrata_repo::error::{cause_suffix, Source};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Configuration or command-line problem: fix the settings.
    Config,
    /// The repository refused or failed, with the repository's own kind: `Corrupt` is
    /// damage (exit 4), `Invalid` a configuration problem (exit 2).
    Repo(pgstrata_repo::ErrorKind),
    /// The other host could not be reached, or its agent not spoken to, with the remote
    /// layer's own kind (`Link` is retryable).
    Remote(pgstrata_remote::ErrorKind),
    /// The PostgreSQL server refused a query or a login; its SQLSTATE is
    /// [`Error::sqlstate`].
    Postgres,
    /// PostgreSQL could not be reached, or the connection to it broke (refused, timed out,
    /// closed, TLS failed).
    PostgresConnection,
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
#[error("{message}{}", shown_cause(.source))]
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
    /// `pgstrata_repo::ErrorKind::is_retryable`), timeouts, a PostgreSQL connection that
    /// failed, and the server's transient refusals (by SQLSTATE: too many connections,
    /// shutting down, ...).
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            ErrorKind::Repo(k) => k.is_retryable(),
            ErrorKind::Remote(k) => k.is_retryable(),
            ErrorKind::Timeout | ErrorKind::PostgresConnection => true,
            ErrorKind::Postgres => self.sqlstate().is_some_and(sqlstate_is_transient),
            _ => false,
        }
    }

    /// Stored data is damaged or does not match what was recorded: a repository's objects,
    /// a data directory's `pg_control`, WAL. Exit 4.
    pub fn is_damage(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Integrity | ErrorKind::Repo(pgstrata_repo::ErrorKind::Corrupt)
        )
    }

    /// The SQLSTATE the PostgreSQL server answered with (`42P01`, ...), when the error is
    /// its refusal.
    pub fn sqlstate(&self) -> Option<&str> {
        self.source
            .as_deref()?
            .downcast_ref::<tokio_postgres::Error>()?
            .code()
            .map(|c| c.code())
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

/// The remote layer's kind, context and source carry over unchanged.
impl From<pgstrata_remote::Error> for Error {
    fn from(e: pgstrata_remote::Error) -> Error {
        Error {
            kind: ErrorKind::Remote(e.kind),
            message: e.context,
            source: e.source,
        }
    }
}

/// Each kind of `pgstrata_pg` error keeps its meaning: a damaged `pg_control` or WAL is
/// damage (exit 4), a PostgreSQL release pgstrata does not read is a refusal, an unreadable
/// file an I/O failure.
impl From<pgstrata_pg::Error> for Error {
    fn from(e: pgstrata_pg::Error) -> Error {
        use pgstrata_pg::Error as Pg;
        match e {
            Pg::Io { path, source } => Error::io(path, source),
            damaged @ Pg::Invalid { .. } => Error::integrity(damaged.to_string()),
            unsupported @ Pg::Unsupported { .. } => Error::refused(unsupported.to_string()),
        }
    }
}

/// Attach context to a PostgreSQL client error, kept as the source (its SQLSTATE is
/// [`Error::sqlstate`]): a server's refusal of a query or login is `Postgres`, a connection
/// that could not be made or broke is `PostgresConnection`.
pub(crate) fn pg_err(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Error {
    let context = context.into();
    move |e| {
        let kind = if e.as_db_error().is_none() && is_connection_failure(&e) {
            ErrorKind::PostgresConnection
        } else {
            ErrorKind::Postgres
        };
        Error {
            kind,
            message: context,
            source: Some(Box::new(e)),
        }
    }
}

/// Whether a client error (not the server's answer) is the connection's: it timed out,
/// closed, or failed on the socket or the TLS handshake underneath (an `io::Error` in its
/// source chain). A row that does not convert, or a count of rows that is wrong, is not.
fn is_connection_failure(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() || e.to_string().starts_with("timeout") {
        return true;
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        if inner.is::<std::io::Error>() {
            return true;
        }
        src = inner.source();
    }
    false
}

/// SQLSTATEs after which the same query may succeed later: the connection's exceptions
/// (class 08), lack of resources (53: too many connections, out of memory or disk), the
/// server shutting down or starting up (57P01-57P03), and a serialization failure or
/// deadlock (40001, 40P01).
fn sqlstate_is_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(code, "57P01" | "57P02" | "57P03" | "40001" | "40P01")
}

/// What an error shows after its own message: for a PostgreSQL client error the server's
/// message (tokio-postgres shows "db error" and keeps that in its chain) or the whole
/// chain of a client failure; else as the repository's errors show (`cause_suffix`).
fn shown_cause(source: &Option<Source>) -> String {
    let Some(pg) = source
        .as_deref()
        .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
    else {
        return cause_suffix(source);
    };
    if let Some(db) = pg.as_db_error() {
        return format!(": {}", db.message());
    }
    let mut shown = format!(": {pg}");
    let mut src = std::error::Error::source(pg);
    while let Some(inner) = src {
        shown.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgstrata_pg::control::ControlData;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What a connection gets from a server speaking the real protocol that reads the
    /// startup message and answers `answer` (an ErrorResponse's fields, or nothing: it
    /// hangs up), as tokio-postgres reports it.
    async fn login_answered(answer: Option<(&str, &str)>) -> tokio_postgres::Error {
        let (client_end, mut server_end) = tokio::io::duplex(4096);
        let frame = answer.map(|(code, message)| {
            let mut fields = Vec::new();
            for (tag, value) in [
                (b'S', "FATAL"),
                (b'V', "FATAL"),
                (b'C', code),
                (b'M', message),
            ] {
                fields.push(tag);
                fields.extend_from_slice(value.as_bytes());
                fields.push(0);
            }
            fields.push(0);
            let mut frame = vec![b'E'];
            frame.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
            frame.extend(fields);
            frame
        });
        let server = tokio::spawn(async move {
            let len = server_end.read_u32().await.unwrap();
            let mut startup = vec![0; len as usize - 4];
            server_end.read_exact(&mut startup).await.unwrap();
            if let Some(frame) = frame {
                server_end.write_all(&frame).await.unwrap();
            }
        });
        let refused = tokio_postgres::Config::new()
            .user("backup")
            .dbname("nope")
            .ssl_mode(tokio_postgres::config::SslMode::Disable)
            .connect_raw(client_end, tokio_postgres::NoTls)
            .await
            .err()
            .expect("the login fails");
        server.await.unwrap();
        refused
    }

    #[tokio::test]
    async fn a_servers_refusal_keeps_its_sqlstate_and_message() {
        let e = pg_err("cannot connect")(
            login_answered(Some(("3D000", "database \"nope\" does not exist"))).await,
        );
        assert_eq!(e.kind, ErrorKind::Postgres);
        assert_eq!(e.sqlstate(), Some("3D000"));
        assert_eq!(
            e.to_string(),
            "cannot connect: database \"nope\" does not exist"
        );
        let source = std::error::Error::source(&e).expect("kept");
        assert!(source.downcast_ref::<tokio_postgres::Error>().is_some());
        assert!(!e.is_retryable() && !e.is_damage());
        assert_eq!(e.exit_code(), 3);

        // Too many connections: the same login may succeed later.
        let e = pg_err("cannot connect")(
            login_answered(Some(("53300", "sorry, too many clients already"))).await,
        );
        assert_eq!(e.sqlstate(), Some("53300"));
        assert!(e.is_retryable());
    }

    #[tokio::test]
    async fn a_broken_connection_is_a_connection_failure_and_retryable() {
        let e = pg_err("cannot connect")(login_answered(None).await);
        assert_eq!(e.kind, ErrorKind::PostgresConnection, "{e}");
        assert_eq!(e.sqlstate(), None);
        assert!(e.is_retryable());
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().starts_with("cannot connect: "), "{e}");
    }

    /// `?` on a `pgstrata_pg` result, as the commands use it.
    fn read_control(bytes: &[u8]) -> Result<ControlData> {
        Ok(ControlData::parse(bytes)?)
    }

    #[test]
    fn a_damaged_pg_control_is_damage_and_an_old_release_a_refusal() {
        let e = read_control(&[0u8; 100]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Integrity);
        assert!(e.is_damage() && !e.is_retryable());
        assert_eq!(e.exit_code(), 4);
        assert!(e.to_string().starts_with("pg_control: "), "{e}");

        // PostgreSQL 12's control version: readable, not a release pgstrata reads.
        let mut pg12 = vec![0u8; 8192];
        pg12[8..12].copy_from_slice(&1201u32.to_le_bytes());
        let e = read_control(&pg12).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Refused);
        assert!(!e.is_damage());
        assert_eq!(e.exit_code(), 3);

        let missing = ControlData::read(std::path::Path::new("/nonexistent")).unwrap_err();
        let e = Error::from(missing);
        assert_eq!(e.kind, ErrorKind::Io);
        assert!(e.to_string().contains("global/pg_control"), "{e}");
    }
}
