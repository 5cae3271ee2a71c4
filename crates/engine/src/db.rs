//! The SQL side of a backup: connecting, identifying the server, starting and stopping
//! backup mode. Both backup calls must run in the same session, which stays open for the
//! whole copy; if pgstrata dies the server ends backup mode itself when the session drops.
//! TCP connections use TLS as `pg-sslmode` says (see [`crate::pg_tls`]).

use crate::error::pg_err;
use crate::{Error, ErrorKind, Result, Settings};
use pgstrata_pg::lsn::Lsn;
use pgstrata_repo::Named;
use tokio_postgres::Client;

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

fn default_user() -> String {
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

impl Db {
    pub async fn connect(s: &Settings) -> Result<Db> {
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
            .connect_timeout(std::time::Duration::from_secs(10));
        if let Ok(pw) = std::env::var("PGPASSWORD") {
            cfg.password(pw);
        }
        let unix_socket = host.starts_with('/');
        cfg.ssl_mode(s.pg_sslmode.wire(unix_socket));
        let mut target = format!("{host}:{} as {user}, database {}", s.pg_port, s.pg_database);
        if !unix_socket {
            target.push_str(&format!(", pg-sslmode={}", s.pg_sslmode.name()));
        }
        let tls = crate::pg_tls::connector(s.pg_sslmode, s.pg_sslrootcert.as_deref())?;
        let (client, conn) = cfg
            .connect(tls)
            .await
            .map_err(pg_err(format!("cannot connect to PostgreSQL at {target}")))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                log::debug!("PostgreSQL connection closed: {e}");
            }
        });
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
        let lsn: Lsn = row.get::<_, String>(0).parse()?;
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
        let lsn: Lsn = row.get::<_, String>(0).parse()?;
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
        Ok(row.get::<_, String>(0).parse()?)
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
