//! The streaming replication protocol, as much of it as `wal-receive` needs: a physical
//! replication connection, simple queries on it (`IDENTIFY_SYSTEM`, `TIMELINE_HISTORY`),
//! and `START_REPLICATION` with its copy-both stream of WAL and standby status updates.
//!
//! Why not tokio-postgres: it has no copy-both mode, which `START_REPLICATION` answers
//! with. So the connection is made here, message by message: postgres-protocol builds the
//! frontend messages and does SCRAM-SHA-256 and MD5; the backend messages this needs are
//! few and read by hand. Connection settings are the SQL connection's (`pg-host`,
//! `pg-port`, `pg-user`, `pg-sslmode`, `pg-sslrootcert`, `PGPASSWORD`); the password
//! travels only over TLS or a Unix socket unless `pg-sslmode=disable` says otherwise.
//! docs: PostgreSQL's "Streaming Replication Protocol" and "Message Formats".

use crate::{Error, ErrorKind, Result, Settings};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use pgstrata_pg::lsn::Lsn;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long opening the connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A physical replication connection.
pub(crate) struct Replication {
    io: Box<dyn Io>,
    read: BytesMut,
    write: BytesMut,
    /// Where it is connected, for messages.
    pub(crate) target: String,
}

/// What the server streams after `START_REPLICATION`.
#[derive(Debug)]
pub(crate) enum Streamed {
    /// WAL from `start` on; the server has written through `end`.
    Data { start: Lsn, end: Lsn, data: Bytes },
    /// The server's WAL end; `reply` asks for a status update at once.
    Keepalive { end: Lsn, reply: bool },
    /// The timeline being streamed ended (the server was promoted, or follows a new one):
    /// the next timeline and where it starts, when the server said.
    EndOfTimeline { next: Option<(u32, Lsn)> },
}

/// `IDENTIFY_SYSTEM`'s answer.
#[derive(Debug, Clone)]
pub(crate) struct SystemId {
    pub(crate) system_identifier: String,
    pub(crate) timeline: u32,
    pub(crate) position: Lsn,
}

impl Replication {
    /// Open a physical replication connection as `application_name` (what
    /// `synchronous_standby_names` matches).
    pub(crate) async fn connect(s: &Settings, application_name: &str) -> Result<Replication> {
        let host = s
            .pg_host
            .clone()
            .or_else(|| std::env::var("PGHOST").ok())
            .unwrap_or_else(|| "/var/run/postgresql".to_string());
        let user = s.pg_user.clone().unwrap_or_else(crate::db::default_user);
        let unix_socket = host.starts_with('/');
        let target = format!("{host}:{} as {user} (replication)", s.pg_port);
        let cannot = |e: std::io::Error| {
            Error::new(
                ErrorKind::PostgresConnection,
                format!("cannot connect to PostgreSQL at {target}: {e}"),
            )
        };
        // A password is never sent over TCP in the clear unless pg-sslmode=disable says so.
        let mut refuse_password = false;
        let io: Box<dyn Io> = if unix_socket {
            let path = format!("{host}/.s.PGSQL.{}", s.pg_port);
            let stream =
                tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(path))
                    .await
                    .map_err(|_| cannot(std::io::ErrorKind::TimedOut.into()))?
                    .map_err(cannot)?;
            Box::new(stream)
        } else {
            let tcp = tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio::net::TcpStream::connect((host.as_str(), s.pg_port)),
            )
            .await
            .map_err(|_| cannot(std::io::ErrorKind::TimedOut.into()))?
            .map_err(cannot)?;
            tcp.set_nodelay(true).map_err(cannot)?;
            let (io, clear) = tls_or_plain(s, &host, tcp, &target).await?;
            refuse_password = clear && s.pg_sslmode != crate::pg_tls::SslMode::Disable;
            io
        };
        let mut conn = Replication {
            io,
            read: BytesMut::with_capacity(64 << 10),
            write: BytesMut::new(),
            target,
        };
        let password = std::env::var("PGPASSWORD").ok();
        conn.startup(
            &user,
            application_name,
            password.as_deref(),
            refuse_password,
        )
        .await?;
        Ok(conn)
    }

    async fn startup(
        &mut self,
        user: &str,
        app: &str,
        password: Option<&str>,
        refuse_password: bool,
    ) -> Result<()> {
        let params = [
            ("user", user),
            ("replication", "true"),
            ("application_name", app),
        ];
        frontend::startup_message(params.iter().copied(), &mut self.write).map_err(io_err)?;
        self.send().await?;
        let mut scram: Option<ScramSha256> = None;
        loop {
            let (tag, mut body) = self.message().await?;
            match tag {
                b'R' => {
                    let code = body.get_i32();
                    let target = &self.target;
                    let need = || {
                        if refuse_password {
                            return Err(Error::new(
                                ErrorKind::PostgresConnection,
                                format!("{target}: the server asks for a password and the connection is not encrypted (the server offers no TLS): refused; use a Unix socket, TLS, or pg-sslmode=disable on a trusted network"),
                            ));
                        }
                        password.ok_or_else(|| {
                            Error::new(
                                ErrorKind::Postgres,
                                "the server asks for a password and PGPASSWORD is not set",
                            )
                        })
                    };
                    match code {
                        0 => {}
                        3 => {
                            frontend::password_message(need()?.as_bytes(), &mut self.write)
                                .map_err(io_err)?;
                            self.send().await?;
                        }
                        5 => {
                            let salt: [u8; 4] = body[..4].try_into().map_err(|_| short())?;
                            let hash = postgres_protocol::authentication::md5_hash(
                                user.as_bytes(),
                                need()?.as_bytes(),
                                salt,
                            );
                            frontend::password_message(hash.as_bytes(), &mut self.write)
                                .map_err(io_err)?;
                            self.send().await?;
                        }
                        10 => {
                            let s =
                                ScramSha256::new(need()?.as_bytes(), ChannelBinding::unsupported());
                            frontend::sasl_initial_response(
                                "SCRAM-SHA-256",
                                s.message(),
                                &mut self.write,
                            )
                            .map_err(io_err)?;
                            self.send().await?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram.as_mut().ok_or_else(short)?;
                            s.update(&body).map_err(io_err)?;
                            frontend::sasl_response(s.message(), &mut self.write)
                                .map_err(io_err)?;
                            self.send().await?;
                        }
                        12 => {
                            let mut s = scram.take().ok_or_else(short)?;
                            s.finish(&body).map_err(io_err)?;
                        }
                        other => {
                            return Err(Error::new(
                                ErrorKind::Postgres,
                                format!(
                                    "{}: unsupported authentication method {other}",
                                    self.target
                                ),
                            ))
                        }
                    }
                }
                b'Z' => return Ok(()),
                _ => {} // ParameterStatus, BackendKeyData, notices
            }
        }
    }

    /// Write what is queued.
    async fn send(&mut self) -> Result<()> {
        let buf = self.write.split();
        self.io.write_all(&buf).await.map_err(|e| self.lost(e))?;
        self.io.flush().await.map_err(|e| self.lost(e))
    }

    fn lost(&self, e: std::io::Error) -> Error {
        Error::new(
            ErrorKind::PostgresConnection,
            format!("replication connection to {} lost: {e}", self.target),
        )
    }

    /// The next backend message (tag, body); an ErrorResponse is returned as the error.
    async fn message(&mut self) -> Result<(u8, Bytes)> {
        loop {
            if self.read.len() >= 5 {
                let len = i32::from_be_bytes(self.read[1..5].try_into().expect("4 bytes"));
                let len = usize::try_from(len)
                    .ok()
                    .filter(|l| *l >= 4)
                    .ok_or_else(short)?;
                if self.read.len() > len {
                    let mut m = self.read.split_to(1 + len).freeze();
                    let tag = m.get_u8();
                    m.advance(4);
                    if tag == b'E' {
                        return Err(server_error(&m, &self.target));
                    }
                    return Ok((tag, m));
                }
            }
            self.read.reserve(64 << 10);
            let n = self
                .io
                .read_buf(&mut self.read)
                .await
                .map_err(|e| self.lost(e))?;
            if n == 0 {
                return Err(self.lost(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }

    /// Whether a whole message is already read (the stream has more at hand).
    pub(crate) fn has_buffered(&self) -> bool {
        self.read.len() >= 5
            && (i32::from_be_bytes(self.read[1..5].try_into().expect("4 bytes")) as usize)
                < self.read.len()
    }

    /// Run a replication command; its rows, as text.
    pub(crate) async fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        frontend::query(sql, &mut self.write).map_err(io_err)?;
        self.send().await?;
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            match self.message().await {
                Ok((b'D', body)) => rows.push(data_row(body)?),
                Ok((b'Z', _)) => break,
                Ok(_) => {}
                Err(e) if e.kind == ErrorKind::Postgres => failed = Some(e),
                Err(e) => return Err(e),
            }
        }
        match failed {
            Some(e) => Err(e.context(sql)),
            None => Ok(rows),
        }
    }

    pub(crate) async fn identify_system(&mut self) -> Result<SystemId> {
        let rows = self.query("IDENTIFY_SYSTEM").await?;
        let row = rows.first().ok_or_else(short)?;
        let field = |i: usize| row.get(i).cloned().flatten().ok_or_else(short);
        Ok(SystemId {
            system_identifier: field(0)?,
            timeline: field(1)?.parse().map_err(|_| short())?,
            position: crate::db::server_lsn(&field(2)?)?,
        })
    }

    /// Timeline `tli`'s history file: its name and content.
    pub(crate) async fn timeline_history(&mut self, tli: u32) -> Result<(String, Vec<u8>)> {
        let rows = self.query(&format!("TIMELINE_HISTORY {tli}")).await?;
        let row = rows.first().ok_or_else(short)?;
        match (
            row.first().cloned().flatten(),
            row.get(1).cloned().flatten(),
        ) {
            (Some(name), Some(content)) => Ok((name, content.into_bytes())),
            _ => Err(short()),
        }
    }

    /// Start streaming timeline `timeline` from `start` through slot `slot`.
    pub(crate) async fn start(&mut self, slot: &str, start: Lsn, timeline: u32) -> Result<()> {
        let sql = format!("START_REPLICATION SLOT \"{slot}\" PHYSICAL {start} TIMELINE {timeline}");
        frontend::query(&sql, &mut self.write).map_err(io_err)?;
        self.send().await?;
        loop {
            let (tag, _) = self.message().await.map_err(|e| e.context(&sql))?;
            if tag == b'W' {
                return Ok(());
            }
        }
    }

    /// The next thing the server streams.
    pub(crate) async fn next(&mut self) -> Result<Streamed> {
        loop {
            let (tag, mut body) = self.message().await?;
            match tag {
                b'd' if body.first() == Some(&b'w') && body.len() >= 25 => {
                    body.advance(1);
                    let start = Lsn(body.get_u64());
                    let end = Lsn(body.get_u64());
                    body.advance(8); // the send time
                    return Ok(Streamed::Data {
                        start,
                        end,
                        data: body,
                    });
                }
                b'd' if body.first() == Some(&b'k') && body.len() >= 18 => {
                    let end = Lsn(u64::from_be_bytes(body[1..9].try_into().expect("8 bytes")));
                    return Ok(Streamed::Keepalive {
                        end,
                        reply: body[17] != 0,
                    });
                }
                b'c' => {
                    return self
                        .end_of_timeline()
                        .await
                        .map(|next| Streamed::EndOfTimeline { next })
                }
                _ => {}
            }
        }
    }

    /// After the server's CopyDone: answer it, and read the next timeline it names.
    async fn end_of_timeline(&mut self) -> Result<Option<(u32, Lsn)>> {
        frontend::copy_done(&mut self.write);
        self.send().await?;
        let mut next = None;
        loop {
            let (tag, body) = self.message().await?;
            match tag {
                b'D' => {
                    let row = data_row(body)?;
                    if let (Some(Some(tli)), Some(Some(lsn))) = (row.first(), row.get(1)) {
                        next = Some((
                            tli.parse().map_err(|_| short())?,
                            crate::db::server_lsn(lsn)?,
                        ));
                    }
                }
                b'Z' => return Ok(next),
                _ => {}
            }
        }
    }

    /// A standby status update: WAL received through `received`, durable through
    /// `flushed` (what a synchronous commit waits for, and what the slot keeps WAL from).
    pub(crate) async fn status(&mut self, received: Lsn, flushed: Lsn) -> Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
            - PG_EPOCH_MICROS;
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(received.0);
        body.put_u64(flushed.0);
        body.put_u64(flushed.0); // "applied": nothing applies WAL here
        body.put_i64(now);
        body.put_u8(0);
        self.write.put_u8(b'd');
        self.write.put_i32(4 + body.len() as i32);
        self.write.extend_from_slice(&body);
        self.send().await
    }
}

/// TLS as `pg-sslmode` says, over `tcp`; and whether the stream is in the clear.
async fn tls_or_plain(
    s: &Settings,
    host: &str,
    mut tcp: tokio::net::TcpStream,
    target: &str,
) -> Result<(Box<dyn Io>, bool)> {
    use crate::pg_tls::SslMode;
    use pgstrata_repo::Named;
    use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
    if s.pg_sslmode == SslMode::Disable {
        return Ok((Box::new(tcp), true));
    }
    let lost = |e: std::io::Error| {
        Error::new(
            ErrorKind::PostgresConnection,
            format!("cannot connect to PostgreSQL at {target}: {e}"),
        )
    };
    let mut req = BytesMut::new();
    frontend::ssl_request(&mut req);
    tcp.write_all(&req).await.map_err(lost)?;
    let answer = tcp.read_u8().await.map_err(lost)?;
    if answer != b'S' {
        if s.pg_sslmode == SslMode::Prefer {
            return Ok((Box::new(tcp), true));
        }
        return Err(Error::new(
            ErrorKind::PostgresConnection,
            format!(
                "cannot connect to PostgreSQL at {target}: the server does not offer TLS and pg-sslmode={}",
                s.pg_sslmode.name()
            ),
        ));
    }
    let mut make = crate::pg_tls::connector(s.pg_sslmode, s.pg_sslrootcert.as_deref())?;
    let tls =
        <crate::pg_tls::MakeRustls as MakeTlsConnect<tokio::net::TcpStream>>::make_tls_connect(
            &mut make, host,
        )
        .map_err(lost)?;
    let stream = tls.connect(tcp).await.map_err(lost)?;
    Ok((Box::new(stream), false))
}

/// A DataRow's fields, as text.
fn data_row(mut body: Bytes) -> Result<Vec<Option<String>>> {
    if body.len() < 2 {
        return Err(short());
    }
    let n = body.get_i16();
    let mut row = Vec::with_capacity(n.max(0) as usize);
    for _ in 0..n {
        if body.len() < 4 {
            return Err(short());
        }
        let len = body.get_i32();
        if len < 0 {
            row.push(None);
            continue;
        }
        let len = len as usize;
        if body.len() < len {
            return Err(short());
        }
        row.push(Some(
            String::from_utf8_lossy(&body.split_to(len)).into_owned(),
        ));
    }
    Ok(row)
}

/// An ErrorResponse as an error: its message and SQLSTATE.
fn server_error(body: &[u8], target: &str) -> Error {
    let (mut message, mut code) = (String::new(), String::new());
    for field in body.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let text = String::from_utf8_lossy(&field[1..]).into_owned();
        match field[0] {
            b'M' => message = text,
            b'C' => code = text,
            _ => {}
        }
    }
    Error::new(
        ErrorKind::Postgres,
        format!("PostgreSQL at {target}: {message} (SQLSTATE {code})"),
    )
}

fn short() -> Error {
    Error::new(
        ErrorKind::Postgres,
        "the server sent a replication message pgstrata cannot read",
    )
}

fn io_err(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Postgres, format!("replication message: {e}"))
}
