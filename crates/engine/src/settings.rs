//! The resolved configuration every command receives. The CLI builds it from its option
//! table (flags, environment, config file); tests and the demo build it directly.

use crate::{Error, Result};
use pgstrata_repo::cipher::{CipherType, Passphrase};
use pgstrata_repo::codec::Compression;
use pgstrata_repo::storage::RepoConfig;
use pgstrata_repo::Storage;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Settings {
    pub stanza: String,
    /// Which repository `repo` is, 1 to 4 (for messages; `repo-*` options are number 1's).
    pub repo_index: u8,
    /// Where the repository is: a local directory or an object store.
    pub repo: RepoConfig,
    /// The repository already opened, used instead of opening `repo` (which then only
    /// names it in messages): the engine's library tests run commands on an in-memory
    /// object store or a fault-injecting wrapper this way. `None` everywhere else.
    pub opened: Option<Storage>,
    pub pg_path: Option<PathBuf>,
    /// Socket directory (starting with '/') or host name, as libpq means it.
    pub pg_host: Option<String>,
    pub pg_port: u16,
    pub pg_user: Option<String>,
    pub pg_database: String,
    /// TLS on TCP connections to PostgreSQL, with libpq's meanings.
    pub pg_sslmode: crate::pg_tls::SslMode,
    /// CA certificates (PEM) that verify-ca and verify-full trust.
    pub pg_sslrootcert: Option<PathBuf>,
    pub compression: Compression,
    /// Worker threads of the parallel stages (`process-max`): at least one.
    pub process_max: std::num::NonZeroUsize,
    pub start_fast: bool,
    /// How long backup and check wait for WAL to reach the archive.
    pub archive_timeout: Duration,
    /// check fails when the oldest WAL file waiting to be archived is older than this.
    pub archive_lag_max: Duration,
    /// Directory of the host-local lock serializing stale-lock takeovers (see `lock`).
    pub lock_path: PathBuf,
    /// The config file in use, passed on to restore_command so archive-get sees the same.
    pub config_file: Option<PathBuf>,
    /// Raw bytes per stored frame.
    pub frame_size: usize,
    /// Size a pack object grows to before it is written.
    pub pack_size: usize,
    /// Files at least this large get pack objects of their own; smaller files share packs
    /// (bundling). 0 gives every file its own packs.
    pub bundle_limit: u64,
    /// stanza-create: whether the new stanza is encrypted (later commands read the stanza).
    pub cipher_type: CipherType,
    /// The passphrase of an encrypted stanza (`repo-cipher-pass`).
    pub cipher_pass: Option<Passphrase>,
    /// Keep the opened master key in the host's key cache (`repo-cipher-key-cache`).
    pub cipher_key_cache: bool,
    /// The physical replication slot `wal-receive` streams through, and `check` looks at
    /// (`wal-receive-slot`, default `pgstrata_<stanza>`).
    pub wal_receive_slot: String,
    /// Where this host remembers what it saw of each repository (`state-path`), to tell
    /// vanished backups from expired ones; `None`: not kept (the expire records alone).
    pub state_path: Option<PathBuf>,
    /// backup: read relation files from this standby instead of the primary
    /// (`backup-standby`).
    pub standby: Option<StandbySource>,
    /// Bytes per second backup reads from the data directory, summed over its workers
    /// (`pg-read-rate-limit`).
    pub pg_read_rate_limit: Option<u64>,
}

/// A streaming standby of the primary a backup reads relation files from.
#[derive(Debug, Clone)]
pub struct StandbySource {
    /// Its data directory (`standby-path`).
    pub path: PathBuf,
    /// Socket directory or host name (`standby-host`), as `pg_host`.
    pub host: String,
    pub port: u16,
}

impl Settings {
    /// Settings of a command that reaches repository `repo` only (no PostgreSQL, no
    /// passphrase), one process, locks in `lock_path`: for tests of the repository
    /// commands without a cluster.
    pub fn for_repository(stanza: &str, repo: RepoConfig, lock_path: PathBuf) -> Settings {
        Settings {
            repo_index: 1,
            stanza: stanza.into(),
            repo,
            opened: None,
            pg_path: None,
            pg_host: None,
            pg_port: 5432,
            pg_user: None,
            pg_database: "postgres".into(),
            pg_sslmode: Default::default(),
            pg_sslrootcert: None,
            compression: Compression::new(pgstrata_repo::codec::CompressType::None, None)
                .expect("no compression"),
            process_max: std::num::NonZeroUsize::MIN,
            start_fast: false,
            archive_timeout: Duration::from_secs(1),
            archive_lag_max: Duration::from_secs(600),
            lock_path,
            config_file: None,
            frame_size: pgstrata_repo::pack::DEFAULT_FRAME_SIZE,
            pack_size: pgstrata_repo::pack::DEFAULT_PACK_SIZE,
            bundle_limit: 0,
            cipher_type: Default::default(),
            cipher_pass: None,
            cipher_key_cache: false,
            standby: None,
            state_path: None,
            wal_receive_slot: String::new(),
            pg_read_rate_limit: None,
        }
    }

    /// Settings of a command on the repository `storage` already opened (an in-memory
    /// store in the engine's library tests), otherwise as [`Settings::for_repository`].
    pub fn for_opened(stanza: &str, storage: Storage, lock_path: PathBuf) -> Settings {
        Settings {
            opened: Some(storage),
            ..Settings::for_repository(stanza, RepoConfig::default(), lock_path)
        }
    }

    /// The repository as stored, without a stanza's key: `open_stanza` attaches it.
    pub fn storage(&self) -> Result<Storage> {
        pgstrata_repo::layout::check_stanza_name(&self.stanza)
            .map_err(|e| Error::config(e.to_string()))?;
        match &self.opened {
            Some(storage) => Ok(storage.clone()),
            None => Ok(Storage::open(&self.repo)?),
        }
    }

    /// [`Settings::storage`] for stanza-create, which first makes the directory of a new
    /// local repository.
    pub fn storage_or_create(&self) -> Result<Storage> {
        match &self.opened {
            Some(_) => self.storage(),
            None => Ok(Storage::open_or_create(&self.repo)?),
        }
    }

    pub fn pg_path(&self) -> Result<&std::path::Path> {
        self.pg_path.as_deref().ok_or_else(|| {
            Error::config(
                "pg-path is not set: give --pg-path or set pg-path in the stanza's config",
            )
        })
    }
}
