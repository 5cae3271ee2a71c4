//! The SQL side of a backup: connecting, identifying the server, starting and stopping
//! backup mode. Both backup calls must run in the same session, which stays open for the
//! whole copy; if pgstrata dies the server ends backup mode itself when the session drops.
//! TCP connections use TLS as `pg-sslmode` says (see [`crate::pg_tls`]).

use crate::error::pg_err;
use crate::pg_tls::PasswordGuard;
use crate::{Error, ErrorKind, Result, Settings};
use pgstrata_pg::lsn::Lsn;
use pgstrata_repo::Named;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::Client;

/// How long opening the connection to one address may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct Db {
    client: Client,
    pub(crate) version_num: u32,
    target: String,
}

/// What the server says about itself.
#[derive(Debug, Clone)]
pub(crate) struct ServerIdentity {
    pub system_identifier: u64,
    pub(crate) data_directory: String,
    pub(crate) in_recovery: bool,
    pub archive_mode: String,
    pub archive_command: String,
    pub wal_level: String,
}

pub(crate) fn default_user() -> String {
    std::env::var("PGUSER")
        .ok()
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .unwrap_or_else(|| "postgres".to_string())
}

/// An LSN as the server printed it (`pg_lsn::text`). One it could not have printed is the
/// server's fault, not damage.
pub(crate) fn server_lsn(text: &str) -> Result<Lsn> {
    text.parse().map_err(|e: pgstrata_pg::Error| {
        Error::new(
            ErrorKind::Postgres,
            format!("the server answered an unreadable {e}"),
        )
    })
}

/// Run a connection's I/O until it closes.
fn spawn_connection<C>(conn: C)
where
    C: std::future::Future<Output = std::result::Result<(), tokio_postgres::Error>>
        + Send
        + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            log::debug!("PostgreSQL connection closed: {e}");
        }
    });
}

/// A TCP connection to `host`:`port` as tokio-postgres opens one: each address the name
/// resolves to in turn, each within [`CONNECT_TIMEOUT`], with TCP keepalive (a backup's
/// session idles through the whole copy) and no Nagle delay.
async fn tcp_connect(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_keepalive(true)?;
        match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr)).await {
            Ok(Ok(stream)) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                last = Some(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer from {addr} in {CONNECT_TIMEOUT:?}"),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{host} resolves to no address"),
        )
    }))
}

impl Db {
    pub async fn connect(s: &Settings) -> Result<Db> {
        Db::connect_with_password(s, std::env::var("PGPASSWORD").ok()).await
    }

    /// As [`Db::connect`], with the password given (`PGPASSWORD` there).
    pub(crate) async fn connect_with_password(
        s: &Settings,
        password: Option<String>,
    ) -> Result<Db> {
        let mut cfg = tokio_postgres::Config::new();
        let host = s
            .pg_host
            .clone()
            .or_else(|| std::env::var("PGHOST").ok())
            .unwrap_or_else(|| "/var/run/postgresql".to_string());
        let user = s.pg_user.clone().unwrap_or_else(default_user);
        cfg.host(&host)
            .port(s.pg_port)
            .user(&user)
            .dbname(&s.pg_database)
            .application_name("pgstrata")
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(pw) = password {
            cfg.password(pw);
        }
        let unix_socket = host.starts_with('/');
        cfg.ssl_mode(s.pg_sslmode.wire(unix_socket));
        let mut target = format!("{host}:{} as {user}, database {}", s.pg_port, s.pg_database);
        if !unix_socket {
            target.push_str(&format!(", pg-sslmode={}", s.pg_sslmode.name()));
        }
        let mut tls = crate::pg_tls::connector(s.pg_sslmode, s.pg_sslrootcert.as_deref())?;
        let cannot = format!("cannot connect to PostgreSQL at {target}");
        let client = if unix_socket {
            let (client, conn) = cfg.connect(tls).await.map_err(pg_err(&cannot))?;
            spawn_connection(conn);
            client
        } else {
            let unreachable = |e: Box<dyn std::error::Error + Send + Sync>| Error {
                kind: ErrorKind::PostgresConnection,
                message: cannot.clone(),
                source: Some(e),
            };
            let stream = tcp_connect(&host, s.pg_port)
                .await
                .map_err(|e| unreachable(e.into()))?;
            let stream = PasswordGuard::new(stream, s.pg_sslmode);
            let refusal = stream.refusal();
            let tls = MakeTlsConnect::<PasswordGuard<TcpStream>>::make_tls_connect(&mut tls, &host)
                .map_err(|e| unreachable(e.into()))?;
            let (client, conn) = cfg.connect_raw(stream, tls).await.map_err(|e| {
                match refusal.password_kind() {
                    Some(kind) => Error::refused(format!(
                        "{cannot}: the server at {host}:{} asked for a {kind} password on a connection without TLS, \
                         and pgstrata refused to send it (anyone on the network path could read it). \
                         Enable TLS on the server (ssl = on), or have it authenticate with scram-sha-256 \
                         (password_encryption and pg_hba.conf), or set pg-sslmode=disable to send it in the clear knowingly",
                        s.pg_port
                    )),
                    None => pg_err(&cannot)(e),
                }
            })?;
            spawn_connection(conn);
            client
        };
        let row = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(pg_err("query server version"))?;
        let version_num = row.get::<_, i32>(0) as u32;
        if !(140000..190000).contains(&version_num) {
            return Err(Error::refused(format!(
                "server at {target} is version {version_num}: pgstrata supports PostgreSQL 14 to 18"
            )));
        }
        Ok(Db {
            client,
            version_num,
            target,
        })
    }

    pub fn major(&self) -> u32 {
        self.version_num / 10000
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    pub async fn identity(&self) -> Result<ServerIdentity> {
        let row = self
            .client
            .query_one(
                "SELECT system_identifier::text, current_setting('data_directory'), pg_is_in_recovery(), \
                 current_setting('archive_mode'), current_setting('archive_command'), current_setting('wal_level') \
                 FROM pg_control_system()",
                &[],
            )
            .await
            .map_err(pg_err("query server identity"))?;
        let sysid: String = row.get(0);
        Ok(ServerIdentity {
            system_identifier: sysid.parse().unwrap_or(0),
            data_directory: row.get(1),
            in_recovery: row.get(2),
            archive_mode: row.get(3),
            archive_command: row.get(4),
            wal_level: row.get(5),
        })
    }

    /// Run `since_15`, or `before_15` on PostgreSQL 14: version 15 renamed the backup
    /// functions.
    async fn query_backup_function(
        &self,
        since_15: &str,
        before_15: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        what: &str,
    ) -> Result<tokio_postgres::Row> {
        let sql = if self.major() >= 15 {
            since_15
        } else {
            before_15
        };
        self.client
            .query_one(sql, params)
            .await
            .map_err(pg_err(what))
    }

    /// The cluster's databases (name and OID), by OID: recorded in the manifest for
    /// selective restore.
    pub(crate) async fn databases(&self) -> Result<Vec<pgstrata_repo::manifest::Database>> {
        let rows = self
            .client
            .query(
                "SELECT datname::text, oid::int8 FROM pg_database ORDER BY oid",
                &[],
            )
            .await
            .map_err(pg_err("list the databases"))?;
        Ok(rows
            .iter()
            .map(|r| pgstrata_repo::manifest::Database {
                name: r.get(0),
                oid: r.get::<_, i64>(1) as u32,
            })
            .collect())
    }

    /// Enter backup mode; returns the start LSN and its timeline.
    pub(crate) async fn backup_start(&self, label: &str, fast: bool) -> Result<(Lsn, u32)> {
        let row = self
            .query_backup_function(
                "SELECT pg_backup_start($1, $2)::text",
                "SELECT pg_start_backup($1, $2, false)::text",
                &[&label, &fast],
                "start backup",
            )
            .await?;
        let lsn = server_lsn(row.get(0))?;
        let tli = self.timeline_of(lsn).await?;
        Ok((lsn, tli))
    }

    /// Leave backup mode without waiting for archiving (pgstrata waits on the repository
    /// itself, with a timeout). Returns (stop LSN, backup_label text, tablespace_map text).
    pub(crate) async fn backup_stop(&self) -> Result<(Lsn, String, Option<String>)> {
        let row = self
            .query_backup_function(
                "SELECT lsn::text, labelfile, spcmapfile FROM pg_backup_stop(false)",
                "SELECT lsn::text, labelfile, spcmapfile FROM pg_stop_backup(false, false)",
                &[],
                "stop backup",
            )
            .await?;
        let lsn = server_lsn(row.get(0))?;
        let map: Option<String> = row.get(2);
        Ok((lsn, row.get(1), map.filter(|m| !m.is_empty())))
    }

    /// How far WAL is flushed to disk now (a primary only): every byte before it is final
    /// in pg_wal.
    pub(crate) async fn wal_flush_lsn(&self) -> Result<Lsn> {
        let row = self
            .client
            .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
            .await
            .map_err(pg_err("read the current WAL position"))?;
        server_lsn(row.get(0))
    }

    /// Physical replication slot `slot`: None when there is none; Some(None) when it has
    /// reserved no WAL yet; else its restart position.
    pub(crate) async fn physical_slot_restart(&self, slot: &str) -> Result<Option<Option<Lsn>>> {
        let rows = self
            .client
            .query(
                "SELECT restart_lsn::text, slot_type FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(pg_err("read the replication slots"))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let kind: String = row.get(1);
        if kind != "physical" {
            return Err(Error::config(format!(
                "replication slot {slot} is a {kind} slot: wal-receive needs a physical one (wal-receive-slot)"
            )));
        }
        let at: Option<String> = row.get(0);
        at.as_deref().map(server_lsn).transpose().map(Some)
    }

    /// Replication slot `slot`: whether a receiver uses it now, and the bytes of WAL the
    /// server keeps for it (None when it reserves none). None when there is no such slot.
    pub(crate) async fn slot_state(&self, slot: &str) -> Result<Option<(bool, Option<i64>)>> {
        let rows = self
            .client
            .query(
                "SELECT active, pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END, restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(pg_err("read the replication slots"))?;
        Ok(rows.first().map(|r| (r.get(0), r.get(1))))
    }

    /// Create physical replication slot `slot`, reserving WAL from now: its restart
    /// position.
    pub(crate) async fn create_physical_slot(&self, slot: &str) -> Result<Option<Lsn>> {
        let row = self
            .client
            .query_one(
                "SELECT lsn::text FROM pg_create_physical_replication_slot($1, true)",
                &[&slot],
            )
            .await
            .map_err(pg_err(&format!("create replication slot {slot}")))?;
        let at: Option<String> = row.get(0);
        at.as_deref().map(server_lsn).transpose()
    }

    pub(crate) async fn timeline_of(&self, lsn: Lsn) -> Result<u32> {
        let row = self
            .client
            .query_one(
                "SELECT pg_walfile_name($1::text::pg_lsn)",
                &[&lsn.to_string()],
            )
            .await
            .map_err(pg_err("find WAL file name"))?;
        let name: String = row.get(0);
        u32::from_str_radix(&name[..8], 16).map_err(|_| {
            Error::new(
                ErrorKind::Postgres,
                format!("unexpected WAL file name {name}"),
            )
        })
    }

    /// PostgreSQL 17+ WAL summaries (summarize_wal = on) on `timeline` lying within
    /// `[from, to)`: every (spc, db, rel, fork, block) they list, and forks whose length
    /// they record as limited (truncated, created or dropped). `None` when the server has
    /// no summaries to offer.
    #[allow(clippy::type_complexity)]
    pub(crate) async fn wal_summaries(
        &self,
        timeline: u32,
        from: Lsn,
        to: Lsn,
    ) -> Result<Option<(Vec<(u32, u32, u32, u8, u32)>, Vec<(u32, u32, u32, u8)>)>> {
        if self.major() < 17 {
            return Ok(None);
        }
        let on: String = self
            .client
            .query_one("SELECT current_setting('summarize_wal')", &[])
            .await
            .map_err(pg_err("query summarize_wal"))?
            .get(0);
        if on != "on" {
            return Ok(None);
        }
        let rows = self
            .client
            .query(
                "SELECT s.start_lsn::text, s.end_lsn::text FROM pg_available_wal_summaries() s \
                 WHERE s.tli = $1::int8 AND s.start_lsn >= $2::text::pg_lsn AND s.end_lsn <= $3::text::pg_lsn",
                &[&(timeline as i64), &from.to_string(), &to.to_string()],
            )
            .await
            .map_err(pg_err("list WAL summaries"))?;
        let mut blocks = Vec::new();
        let mut limited = Vec::new();
        for r in rows {
            let (start, end): (String, String) = (r.get(0), r.get(1));
            let contents = self
                .client
                .query(
                    "SELECT reltablespace::int8, reldatabase::int8, relfilenode::int8, relforknumber::int4, \
                     relblocknumber::int8, is_limit_block FROM pg_wal_summary_contents($1::int8, $2::text::pg_lsn, $3::text::pg_lsn)",
                    &[&(timeline as i64), &start, &end],
                )
                .await
                .map_err(pg_err("read WAL summary"))?;
            for c in contents {
                let key = (
                    c.get::<_, i64>(0) as u32,
                    c.get::<_, i64>(1) as u32,
                    c.get::<_, i64>(2) as u32,
                    c.get::<_, i32>(3) as u8,
                );
                if c.get::<_, bool>(5) {
                    limited.push(key);
                } else {
                    blocks.push((key.0, key.1, key.2, key.3, c.get::<_, i64>(4) as u32));
                }
            }
        }
        Ok(Some((blocks, limited)))
    }

    /// Write a restore point and switch WAL; returns the name of the segment that must
    /// reach the archive.
    pub(crate) async fn switch_wal(&self) -> Result<String> {
        self.client
            .query_one(
                "SELECT pg_create_restore_point('pgstrata check')::text",
                &[],
            )
            .await
            .map_err(pg_err("create restore point"))?;
        let row = self
            .client
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await
            .map_err(pg_err("switch WAL"))?;
        Ok(row.get(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg_tls::SslMode;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn settings(port: u16, mode: SslMode) -> Settings {
        Settings {
            pg_host: Some("127.0.0.1".into()),
            pg_port: port,
            pg_user: Some("backup".into()),
            pg_sslmode: mode,
            ..Settings::for_repository("st", Default::default(), std::env::temp_dir())
        }
    }

    /// A server that refuses TLS ('N'), reads the startup message and asks for a password
    /// with authentication request `auth` (code and payload); returns the messages the
    /// client sent after the startup message.
    async fn fake_server(listener: tokio::net::TcpListener, auth: Vec<u8>) -> Vec<u8> {
        async fn read_message(sock: &mut TcpStream) -> Option<Vec<u8>> {
            let len = sock.read_u32().await.ok()? as usize;
            let mut body = vec![0; len - 4];
            sock.read_exact(&mut body).await.unwrap();
            Some(body)
        }
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut first = read_message(&mut sock).await.expect("a first message");
        if first == 80877103u32.to_be_bytes() {
            sock.write_all(b"N").await.unwrap();
            // require gives up here.
            let Some(startup) = read_message(&mut sock).await else {
                return Vec::new();
            };
            first = startup;
        }
        assert_eq!(first[..4], 196608u32.to_be_bytes(), "a startup message");
        let mut request = vec![b'R'];
        request.extend_from_slice(&(4 + auth.len() as u32).to_be_bytes());
        request.extend_from_slice(&auth);
        sock.write_all(&request).await.unwrap();
        // Every message until the connection closes or a password message ('p') arrives.
        let mut received = Vec::new();
        while let Ok(kind) = sock.read_u8().await {
            received.push(kind);
            let Some(body) = read_message(&mut sock).await else {
                break;
            };
            received.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
            received.extend_from_slice(&body);
            if kind == b'p' {
                break;
            }
        }
        received
    }

    /// Connect with pg-sslmode `mode` to a fake server asking with `auth`; returns the
    /// connection's error (if any) and what the server received after the startup message.
    async fn against_fake_server(mode: SslMode, auth: Vec<u8>) -> (Option<Error>, Vec<u8>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(fake_server(listener, auth));
        let result =
            Db::connect_with_password(&settings(port, mode), Some("secret-pw".into())).await;
        let err = result.err();
        (err, server.await.unwrap())
    }

    fn sent_password(received: &[u8]) -> bool {
        received.windows(9).any(|w| w == b"secret-pw")
    }

    /// The attack: a server (or whoever answers in its place) that declines TLS and asks for
    /// the password in clear text or as MD5. pgstrata refuses to answer, says why and how
    /// to fix it, and the password never leaves; with pg-sslmode=disable it is sent, so the
    /// refusal is the guard's, not a broken connection.
    #[tokio::test]
    async fn no_password_leaves_in_clear_text_without_tls() {
        let cleartext = 3u32.to_be_bytes().to_vec();
        let md5 = [5u32.to_be_bytes().as_slice(), b"salt"].concat();
        for (auth, kind) in [(&cleartext, "cleartext"), (&md5, "MD5")] {
            for mode in [SslMode::Prefer, SslMode::Require] {
                let (err, received) = against_fake_server(mode, auth.clone()).await;
                let err = err.expect("refused").to_string();
                assert!(!sent_password(&received), "{kind}, {mode:?}: password sent");
                assert!(
                    !received.contains(&b'p'),
                    "{kind}, {mode:?}: a password message was sent: {received:?}"
                );
                if mode == SslMode::Prefer {
                    assert!(
                        err.contains("127.0.0.1")
                            && err.contains(&format!("{kind} password"))
                            && err.contains("without TLS")
                            && err.contains("refused to send")
                            && err.contains("scram-sha-256")
                            && err.contains("pg-sslmode=disable"),
                        "{err}"
                    );
                } else {
                    assert!(err.contains("does not support TLS"), "{err}");
                }
            }
            let (_, received) = against_fake_server(SslMode::Disable, auth.clone()).await;
            assert_eq!(received.first(), Some(&b'p'), "{kind}: {received:?}");
            if kind == "cleartext" {
                assert!(sent_password(&received), "{received:?}");
            }
        }
        // SCRAM-SHA-256 proves the password without revealing it: still allowed.
        let sasl = [10u32.to_be_bytes().as_slice(), b"SCRAM-SHA-256\0\0"].concat();
        let (err, received) = against_fake_server(SslMode::Prefer, sasl).await;
        assert!(
            !err.as_ref()
                .is_some_and(|e| e.to_string().contains("without TLS")),
            "{err:?}"
        );
        assert_eq!(received.first(), Some(&b'p'), "the SCRAM exchange starts");
        assert!(!sent_password(&received));
    }
}
