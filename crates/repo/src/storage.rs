//! The one way pgstrata reads and writes a repository.
//!
//! Everything goes through object_store, so the same code serves a local directory, S3, GCS
//! and Azure. Objects are written once (`put_new` refuses to replace an existing object,
//! with a conditional create on object stores) and never modified; nothing relies on rename
//! or directory semantics. A local repository fsyncs each object (and its directory) before
//! a write returns. A local repository also takes an object as a stream (`stream_new`:
//! packs, written as they fill rather than held in memory), visible only once complete,
//! and many objects staged without an fsync each and then made durable and visible
//! together (`stage_new`, `publish_staged`: one `syncfs` instead of an fsync a file).
//!
//! Every operation runs under a timeout and is retried with exponential backoff when it
//! fails in a way that may be transient (server errors, timeouts, dropped connections,
//! truncated reads); permanent failures (not found, access denied, bad request) stop at once
//! with the object's name. object_store's HTTP client retries individual requests too; this
//! layer covers whole operations and any backend, including fault-injecting test wrappers.

use crate::as_of::AsOfStore;
use crate::cache::{stored_hash, ObjectCache};
use crate::cipher::Cipher;
use crate::rate::{RateLimitedStore, RateLimiter};
use crate::s3_versions::{ObjectLock, S3Versions};
use crate::Named;
use crate::{Error, ErrorKind, Result};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::{
    Attribute, Attributes, CopyMode, CopyOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload,
};
use pgstrata_remote::RemoteStore;
pub use pgstrata_remote::SshTarget;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

mod immutable;
pub use immutable::Deletion;

/// A listed object.
#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Last modification, unix seconds.
    pub modified: i64,
}

/// Which backend, and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct RepoConfig {
    pub kind: RepoKind,
    /// Local: the repository directory. Object stores: a prefix inside the bucket.
    pub path: String,
    pub s3: S3Config,
    pub gcs: GcsConfig,
    pub azure: AzureConfig,
    /// PEM file of CA certificates to trust (object stores).
    pub ca_file: Option<String>,
    pub verify_tls: bool,
    /// Time allowed for one storage operation before it counts as failed (and is retried).
    pub timeout: Duration,
    /// Retries of an operation that failed in a way that may be transient.
    pub retries: u32,
    /// A posix repository on another host (`repo-remote`): `path` is a directory there,
    /// served by `pgstrata agent repo` started over SSH.
    pub remote: Option<SshTarget>,
    /// The stanza the command works on, named on `agent repo`'s command line (which
    /// serves only the stanzas it is given) when no forced command replaces it.
    pub remote_stanza: Option<String>,
    /// Read the repository as it was at this time (unix seconds; `repo-target-time`),
    /// from object versions ([`crate::as_of`]); nothing is written. S3 only.
    pub target_time: Option<i64>,
    /// Bytes per second to and from the repository, summed over the process
    /// (`repo-rate-limit`, [`crate::rate`]).
    pub rate_limit: Option<u64>,
}

// Names as configured (`repo-type`).
crate::named! {
    #[derive(Default)]
    pub enum RepoKind { #[default] Posix = "posix", S3 = "s3", Gcs = "gcs", Azure = "azure" }
}

/// A credential. `Debug` shows only that it is set (`Some(<redacted>)`), never its value,
/// so the configurations holding credentials can derive `Debug` and be logged.
#[derive(Clone)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::ops::Deref for Secret {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<T: Into<String>> From<T> for Secret {
    fn from(value: T) -> Secret {
        Secret(value.into())
    }
}

#[derive(Debug, Clone, Default)]
pub struct S3Config {
    pub bucket: String,
    /// URL; `http://` is allowed (local servers).
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub key: Option<Secret>,
    pub key_secret: Option<Secret>,
    pub token: Option<Secret>,
    /// Path-style requests (`endpoint/bucket/key`) instead of host-style.
    pub path_style: bool,
    pub storage_class: Option<String>,
    /// Server-side encryption with this KMS key.
    pub kms_key_id: Option<String>,
    /// An immutable repository (`repo-s3-object-lock`, `repo-immutable-days`): the bucket
    /// gives every object this retention, and expire deletes nothing before it passes.
    pub object_lock: Option<ObjectLock>,
}

#[derive(Debug, Clone, Default)]
pub struct GcsConfig {
    pub bucket: String,
    /// Service account JSON file; without it, application default credentials.
    pub key_file: Option<String>,
    pub endpoint: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct AzureConfig {
    pub account: String,
    pub container: String,
    pub key: Option<Secret>,
    pub endpoint: Option<String>,
}

/// See [`Storage::serve_every_open_from`].
static ORIGIN: std::sync::OnceLock<(RemoteStore, String)> = std::sync::OnceLock::new();

/// This OS user's [`ObjectCache`], opened on first use by a repository on another host.
fn object_cache() -> Option<&'static ObjectCache> {
    static CACHE: std::sync::OnceLock<Option<ObjectCache>> = std::sync::OnceLock::new();
    CACHE.get_or_init(ObjectCache::open_default).as_ref()
}

#[derive(Clone, Debug)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    /// Shown in messages so the user knows which repository is meant.
    description: String,
    put_attributes: Attributes,
    timeout: Duration,
    retries: u32,
    /// The directory of a local repository (where staging files can be left behind).
    local_root: Option<std::path::PathBuf>,
    /// S3-compatible stores may ignore create-only conditions (see `check_create_only`).
    s3_compatible: bool,
    /// An encrypted stanza's open master key: `put_new` seals and `get` opens whole
    /// objects with it; packs seal their frames themselves (see `cipher`).
    cipher: Option<Arc<Cipher>>,
    /// The repository is on another host, reached through this agent connection. Its
    /// create-only copy makes an independent object there, without the bytes crossing
    /// the line ([`Storage::put_new_twice`]); objects it holds can be read from
    /// [`object_cache`] unless changed, and manifests written as patches
    /// ([`Storage::put_new_twice_against`]).
    remote: Option<RemoteStore>,
    /// An immutable repository's retention ([`S3Config::object_lock`]).
    object_lock: Option<ObjectLock>,
    /// The S3 bucket's versions, where an object lock or a target time needs them.
    versions: Option<Arc<S3Versions>>,
    /// The time the repository is read as of (`repo-target-time`).
    as_of: Option<i64>,
    /// `repo-rate-limit`: its store is wrapped in it; streamed writes take from it too.
    rate: Option<Arc<RateLimiter>>,
}

fn map_err(e: object_store::Error, what: String) -> Error {
    match e {
        object_store::Error::NotFound { .. } => {
            Error::new(ErrorKind::NotFound, format!("{what}: not found"))
        }
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            Error::new(ErrorKind::AlreadyExists, format!("{what}: already exists"))
        }
        e @ (object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. }
        | object_store::Error::NotSupported { .. }
        | object_store::Error::NotImplemented { .. }
        | object_store::Error::InvalidPath { .. }) => {
            Error::with_source(ErrorKind::Invalid, what, e)
        }
        other => Error::with_source(ErrorKind::Storage, what, other),
    }
}

/// `bytes` if all `want` bytes came. A short read is transient (a dropped connection) or a
/// truncated object: a storage failure, retried, and reported naming the object if it
/// persists.
fn whole(bytes: Bytes, want: u64, what: &str) -> Result<Bytes> {
    if bytes.len() as u64 != want {
        return Err(Error::new(
            ErrorKind::Storage,
            format!("{what}: short read ({} of {want} bytes)", bytes.len()),
        ));
    }
    Ok(bytes)
}

/// A setting an object store cannot go without: empty is refused with `message`.
fn required(value: &str, message: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::new(ErrorKind::Invalid, message));
    }
    Ok(())
}

/// An object store as built, with the URL shown for it; `kind` names it when building fails.
fn built(
    store: object_store::Result<impl ObjectStore>,
    kind: &str,
    url: String,
) -> Result<(Arc<dyn ObjectStore>, String)> {
    let store = store.map_err(|e| map_err(e, format!("configure the {kind} repository")))?;
    Ok((Arc::new(store), url))
}

/// A local repository directory, which must exist. The store and how it is shown.
fn open_local(cfg: &RepoConfig) -> Result<(Arc<dyn ObjectStore>, String)> {
    let dir = std::path::Path::new(&cfg.path);
    if !dir.is_dir() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "repository path {} does not exist or is not a directory (stanza-create makes it)",
                dir.display()
            ),
        ));
    }
    let store = LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| map_err(e, format!("open repository {}", dir.display())))?
        .with_fsync(true)
        .with_automatic_cleanup(true);
    Ok((Arc::new(store), dir.display().to_string()))
}

/// An opened S3 store, how it is shown, and the client of its versions when an object lock
/// or a target time needs it.
type OpenedS3 = (Arc<dyn ObjectStore>, String, Option<Arc<S3Versions>>);

/// An S3 bucket (or an S3-compatible store).
fn open_s3(cfg: &RepoConfig) -> Result<OpenedS3> {
    let c = &cfg.s3;
    required(&c.bucket, "repo-type=s3 needs repo-s3-bucket")?;
    // Environment first (AWS_* variables, web identity, instance metadata when no
    // key is given), then explicit settings.
    let mut b = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(&c.bucket)
        .with_virtual_hosted_style_request(!c.path_style)
        .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
        .with_client_options(client_options(cfg, c.endpoint.as_deref())?)
        .with_retry(http_retry());
    if let Some(e) = &c.endpoint {
        b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
    }
    use object_store::aws::AmazonS3ConfigKey as Key;
    for (key, value) in [
        (Key::Region, c.region.as_deref()),
        (Key::AccessKeyId, c.key.as_deref()),
        (Key::SecretAccessKey, c.key_secret.as_deref()),
        (Key::Token, c.token.as_deref()),
    ] {
        if let Some(v) = value {
            b = b.with_config(key, v);
        }
    }
    if let Some(k) = &c.kms_key_id {
        b = b.with_sse_kms_encryption(k);
    }
    if c.object_lock.is_some() {
        b = b.with_http_connector(crate::s3_versions::ContentMd5Connector);
    }
    let url = format!("s3://{}/{}", c.bucket, cfg.path.trim_matches('/'));
    let store = b
        .build()
        .map_err(|e| map_err(e, "configure the S3 repository".into()))?;
    let versions = match c.object_lock.is_some() || cfg.target_time.is_some() {
        true => Some(Arc::new(S3Versions::new(
            &client_options(cfg, c.endpoint.as_deref())?,
            store.credentials().clone(),
            &crate::s3_versions::Bucket {
                name: &c.bucket,
                endpoint: c.endpoint.as_deref(),
                region: c.region.as_deref(),
                path_style: c.path_style,
            },
            &cfg.path,
        )?)),
        false => None,
    };
    Ok((Arc::new(store), url, versions))
}

/// A Google Cloud Storage bucket. The store and how it is shown.
fn open_gcs(cfg: &RepoConfig) -> Result<(Arc<dyn ObjectStore>, String)> {
    let c = &cfg.gcs;
    required(&c.bucket, "repo-type=gcs needs repo-gcs-bucket")?;
    let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
        .with_bucket_name(&c.bucket)
        .with_client_options(client_options(cfg, c.endpoint.as_deref())?)
        .with_retry(http_retry());
    if let Some(k) = &c.key_file {
        b = b.with_service_account_path(k);
    }
    if let Some(e) = &c.endpoint {
        b = b.with_base_url(e);
        // An http:// endpoint is an emulator, which takes unsigned requests.
        if e.starts_with("http://") && c.key_file.is_none() {
            let anonymous = object_store::gcp::GcpCredential {
                bearer: String::new(),
            };
            b = b.with_credentials(Arc::new(object_store::StaticCredentialProvider::new(
                anonymous,
            )));
        }
    }
    let url = format!("gs://{}/{}", c.bucket, cfg.path.trim_matches('/'));
    built(b.build(), "GCS", url)
}

/// An Azure blob container. The store and how it is shown.
fn open_azure(cfg: &RepoConfig) -> Result<(Arc<dyn ObjectStore>, String)> {
    let c = &cfg.azure;
    let needs = "repo-type=azure needs repo-azure-account and repo-azure-container";
    required(&c.account, needs)?;
    required(&c.container, needs)?;
    let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
        .with_account(&c.account)
        .with_container_name(&c.container)
        .with_client_options(client_options(cfg, c.endpoint.as_deref())?)
        .with_retry(http_retry());
    if let Some(k) = c.key.as_deref() {
        b = b.with_access_key(k);
    }
    if let Some(e) = &c.endpoint {
        b = b
            .with_endpoint(e.clone())
            .with_allow_http(e.starts_with("http://"));
    }
    let path = cfg.path.trim_matches('/');
    let url = format!("azure://{}/{}/{path}", c.account, c.container);
    built(b.build(), "Azure", url)
}

impl Storage {
    /// Open the repository `cfg` describes. A local repository directory must exist.
    pub fn open(cfg: &RepoConfig) -> Result<Storage> {
        if let Some((store, description)) = ORIGIN.get() {
            let mut storage = Storage::from_store(Arc::new(store.clone()), description.clone())
                .with_limits(cfg.timeout.max(Duration::from_secs(120)), cfg.retries);
            storage.remote = Some(store.clone());
            return Ok(storage);
        }
        let mut remote = None;
        let mut versions = None;
        let (store, description): (Arc<dyn ObjectStore>, String) = match cfg.kind {
            RepoKind::Posix if cfg.remote.is_some() => {
                let target = cfg.remote.clone().expect("checked");
                let description = format!("{}:{}", target.host, cfg.path);
                let store = RemoteStore::ssh(target, cfg.path.clone(), cfg.remote_stanza.clone());
                remote = Some(store.clone());
                (Arc::new(store), description)
            }
            _ if cfg.remote.is_some() => {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    format!(
                        "repo-remote reaches a posix repository on another host; repo-type={} is reached directly",
                        cfg.kind.name()
                    ),
                ))
            }
            RepoKind::Posix => open_local(cfg)?,
            RepoKind::S3 => {
                let (store, description, v) = open_s3(cfg)?;
                versions = v;
                (store, description)
            }
            RepoKind::Gcs => open_gcs(cfg)?,
            RepoKind::Azure => open_azure(cfg)?,
        };
        let store: Arc<dyn ObjectStore> = match cfg.kind {
            RepoKind::Posix => store,
            _ if cfg.path.trim_matches('/').is_empty() => store,
            _ => Arc::new(object_store::prefix::PrefixStore::new(
                store,
                cfg.path.trim_matches('/').to_string(),
            )),
        };
        let store: Arc<dyn ObjectStore> = match (cfg.target_time, &versions) {
            (None, _) => store,
            (Some(time), Some(v)) => Arc::new(AsOfStore::new(store, v.clone(), time)),
            (Some(_), None) => {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    format!(
                        "repo-target-time reads the versions an S3 bucket keeps; repository {description} is of type {}",
                        cfg.kind.name()
                    ),
                ))
            }
        };
        let rate = cfg
            .rate_limit
            .map(|r| RateLimiter::shared(&format!("repository {description}"), r));
        let store: Arc<dyn ObjectStore> = match &rate {
            Some(limiter) => Arc::new(RateLimitedStore::new(store, limiter.clone())),
            None => store,
        };
        let mut put_attributes = Attributes::new();
        if let (RepoKind::S3, Some(class)) = (cfg.kind, &cfg.s3.storage_class) {
            put_attributes.insert(Attribute::StorageClass, class.clone().into());
        }
        Ok(Storage {
            store,
            description,
            local_root: (cfg.kind == RepoKind::Posix && cfg.remote.is_none())
                .then(|| cfg.path.clone().into()),
            s3_compatible: cfg.kind == RepoKind::S3,
            put_attributes,
            timeout: if cfg.timeout.is_zero() {
                Duration::from_secs(120)
            } else {
                cfg.timeout
            },
            retries: cfg.retries,
            cipher: None,
            remote,
            object_lock: cfg.s3.object_lock.filter(|_| cfg.kind == RepoKind::S3),
            versions,
            as_of: cfg.target_time,
            rate,
        })
    }

    /// Make every later [`Storage::open`] of this process open `store` instead of what
    /// its configuration says. `pgstrata agent run` (pg-remote) calls it once, before the
    /// command runs: its one repository is the one the backup host serves over the
    /// agent's stdin and stdout. Fails when called twice.
    pub fn serve_every_open_from(store: RemoteStore, description: String) -> Result<()> {
        ORIGIN.set((store, description)).map_err(|_| {
            Error::new(
                ErrorKind::Invalid,
                "this process's repository was already redirected",
            )
        })
    }

    /// [`Storage::open`], first making the directory of a local repository (stanza-create).
    pub fn open_or_create(cfg: &RepoConfig) -> Result<Storage> {
        if cfg.kind == RepoKind::Posix && cfg.remote.is_none() && ORIGIN.get().is_none() {
            std::fs::create_dir_all(&cfg.path).map_err(|e| {
                Error::with_source(
                    ErrorKind::Storage,
                    format!("create repository directory {}", cfg.path),
                    e,
                )
            })?;
        }
        Storage::open(cfg)
    }

    /// A repository in a local directory, which must exist.
    pub fn local(dir: &std::path::Path) -> Result<Storage> {
        Storage::open(&RepoConfig {
            kind: RepoKind::Posix,
            path: dir.display().to_string(),
            retries: 3,
            ..Default::default()
        })
    }

    /// A repository held in memory (`object_store::memory::InMemory`): tests that need
    /// no directory and no server.
    pub fn in_memory() -> Storage {
        Storage::from_store(Arc::new(object_store::memory::InMemory::new()), "memory")
    }

    /// Wrap any object_store backend (tests' fault-injecting wrappers use this).
    pub fn from_store(store: Arc<dyn ObjectStore>, description: impl Into<String>) -> Storage {
        Storage {
            store,
            description: description.into(),
            put_attributes: Attributes::new(),
            timeout: Duration::from_secs(120),
            retries: 3,
            local_root: None,
            s3_compatible: false,
            cipher: None,
            remote: None,
            object_lock: None,
            versions: None,
            as_of: None,
            rate: None,
        }
    }

    /// The repository's rate limit (`repo-rate-limit`), in bytes per second.
    pub fn rate_limit(&self) -> Option<u64> {
        self.rate.as_ref().map(|r| r.bytes_per_second())
    }

    /// The same repository, sealing and opening objects with `cipher` (an encrypted stanza).
    pub fn with_cipher(mut self, cipher: Arc<Cipher>) -> Storage {
        self.cipher = Some(cipher);
        self
    }

    /// The master key objects are sealed with, when the stanza is encrypted.
    pub fn cipher(&self) -> Option<&Arc<Cipher>> {
        self.cipher.as_ref()
    }

    /// Change the per-operation timeout and retry count.
    pub fn with_limits(mut self, timeout: Duration, retries: u32) -> Storage {
        self.timeout = timeout;
        self.retries = retries;
        self
    }

    /// The underlying object store (for conformance tests).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// Run `op` with the timeout, retrying transient failures with exponential backoff.
    async fn retry<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let err = match tokio::time::timeout(self.timeout, op()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if !e.is_retryable() => return Err(e),
                Ok(Err(e)) => e,
                Err(_) => Error::new(
                    ErrorKind::Storage,
                    format!("{what}: no answer within {}s", self.timeout.as_secs_f64()),
                ),
            };
            if attempt > self.retries {
                return Err(Error {
                    context: format!(
                        "{} (storage of repository {} failed; gave up after {attempt} attempts)",
                        err.context, self.description
                    ),
                    ..err
                });
            }
            log::warn!("{err}; retrying in {} ms", delay.as_millis());
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// [`Storage::retry`] of an operation on one object (or prefix) `key`: each attempt gets
    /// its own copy of the object's path and of `what` (the operation, named in errors).
    async fn retry_object<T, F, Fut>(&self, key: &str, what: String, mut op: F) -> Result<T>
    where
        F: FnMut(ObjPath, String) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let path = Self::path(key)?;
        self.retry(&what, || op(path.clone(), what.clone())).await
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    fn path(key: &str) -> Result<ObjPath> {
        ObjPath::parse(key)
            .map_err(|e| Error::with_source(ErrorKind::Invalid, format!("object name '{key}'"), e))
    }

    /// Write a new object, sealed under its name when the stanza is encrypted; fails with
    /// `AlreadyExists` if another one is there.
    pub async fn put_new(&self, key: &str, data: Bytes) -> Result<()> {
        let data = match &self.cipher {
            Some(c) => Bytes::from(c.seal_object(key, &data)?),
            None => data,
        };
        self.put_new_unsealed(key, data).await
    }

    /// Replace object `key` with `data` (sealed under `sealed_as`'s name in an encrypted
    /// stanza, as [`Storage::put_new_twice`] seals both twins): the one write that is not
    /// create-only, for `verify --repair` to rewrite a damaged twin from its intact one. The
    /// replacement is whole and atomic on every backend (a rename into place on a local
    /// directory, a PUT on object stores): readers see the damaged bytes or the new ones,
    /// never neither.
    pub async fn replace(&self, key: &str, sealed_as: &str, data: Bytes) -> Result<()> {
        if let Some(lock) = self.object_lock {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "repository {} is immutable (repo-s3-object-lock={}): {key} is not rewritten \
                     there; its intact twin serves every read. To restore the redundancy, copy the \
                     backup to another repository (pgstrata copy)",
                    self.description,
                    lock.mode.name()
                ),
            ));
        }
        let data = match &self.cipher {
            Some(c) => Bytes::from(c.seal_object(sealed_as, &data)?),
            None => data,
        };
        self.retry_object(key, format!("rewrite {key}"), |path, what| {
            let opts = PutOptions {
                mode: PutMode::Overwrite,
                attributes: self.put_attributes.clone(),
                ..Default::default()
            };
            let payload = PutPayload::from(data.clone());
            async move {
                self.store
                    .put_opts(&path, payload, opts)
                    .await
                    .map(drop)
                    .map_err(|e| map_err(e, what))
            }
        })
        .await
    }

    /// Write a new object as given: packs (whose frames are sealed one by one), key files
    /// and probes. Fails with `AlreadyExists` if another one is there.
    ///
    /// A lost answer is recognised as described at [`Storage::create_object`]. Callers
    /// whose objects could be written identically by someone else make them unique (the
    /// lock holds a random token).
    pub async fn put_new_unsealed(&self, key: &str, data: Bytes) -> Result<()> {
        self.create_object(key, &data, format!("write {key}"), |path| {
            let opts = PutOptions {
                mode: PutMode::Create,
                attributes: self.put_attributes.clone(),
                ..Default::default()
            };
            let payload = PutPayload::from(data.clone());
            async move { self.store.put_opts(&path, payload, opts).await.map(|_| ()) }
        })
        .await
    }

    /// Store `data` twice, as the new objects `first` and then `second` (a manifest's copy,
    /// then the manifest), each create-only and, in an encrypted stanza, both sealed under
    /// `second`'s name so that they are the same bytes. Where the store copies an object
    /// itself into an independent one (a repository on another host, whose agent copies
    /// on its own disk), `second` is made from `first` there and the bytes cross the line
    /// once. A local directory's copy is a hard link, which would make two names of one
    /// file and no copy at all, so there (and on object stores) `data` is written again.
    pub async fn put_new_twice(&self, first: &str, second: &str, data: Bytes) -> Result<()> {
        let sealed = match &self.cipher {
            Some(c) => Bytes::from(c.seal_object(second, &data)?),
            None => data.clone(),
        };
        self.put_new_unsealed(first, sealed.clone()).await?;
        if self.remote.is_none() {
            self.put_new_unsealed(second, sealed.clone()).await?;
        } else {
            let from = Self::path(first)?;
            self.create_object(second, &sealed, format!("copy {first} to {second}"), |to| {
                let from = from.clone();
                async move {
                    let opts = CopyOptions::new().with_mode(CopyMode::Create);
                    self.store.copy_opts(&from, &to, opts).await
                }
            })
            .await?;
        }
        if let (Some(_), Some(cache)) = (&self.remote, object_cache()) {
            cache.put(
                &self.cache_key(second),
                self.cache_hash(&sealed, &data),
                &data,
            );
        }
        Ok(())
    }

    /// [`Storage::put_new_twice`] of `data`, which is most likely much like the object
    /// `base` (a manifest and its prior one). Through a repository on another host that
    /// this host holds `base` of (in the object cache), `diff(base, data)` makes the
    /// object to store (possibly other bytes of the same meaning) and a patch, and only
    /// the patch crosses the line: the holder rebuilds, seals and stores the object
    /// (`put_patch`, docs/remote-protocol.md). Everywhere else, and when the holder cannot
    /// rebuild it, `data` is written whole as `put_new_twice` does. Returns the object
    /// written (unsealed): `data`, or the other bytes of the same meaning the patch made.
    pub async fn put_new_twice_against(
        &self,
        first: &str,
        second: &str,
        base: &str,
        data: Bytes,
        diff: impl FnOnce(&[u8], &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>>,
    ) -> Result<Bytes> {
        let whole = |data: Bytes| async move {
            self.put_new_twice(first, second, data.clone()).await?;
            Ok(data)
        };
        let (Some(remote), Some(cache)) = (&self.remote, object_cache()) else {
            return whole(data).await;
        };
        let Some(held) = cache.get(&self.cache_key(base)) else {
            return whole(data).await;
        };
        let (stored, patch) = match diff(&held.bytes, &data) {
            Ok(Some((stored, patch))) => (Bytes::from(stored), patch),
            Ok(None) => return whole(data).await,
            Err(e) => {
                log::info!("{second}: not sent as a patch against {base}: {e}");
                return whole(data).await;
            }
        };
        let (to_first, to_second, from) =
            (Self::path(first)?, Self::path(second)?, Self::path(base)?);
        let what = format!("write {second} as a patch against {base}");
        let sent = self
            .retry(&what, || async {
                remote
                    .put_patch(&to_first, &to_second, &from, &patch)
                    .await
                    .map_err(|e| map_err(e, what.clone()))
            })
            .await;
        match sent {
            Ok(hash) => {
                log::debug!(
                    "{second}: sent as a patch of {} bytes against {base} (whole: {} bytes)",
                    patch.len(),
                    stored.len()
                );
                match blake3::Hash::from_hex(&hash) {
                    // A session's reads name the object's plain content (see `cache_hash`).
                    Ok(_) if self.cipher.as_ref().is_some_and(|c| c.is_session()) => {
                        cache.put(&self.cache_key(second), stored_hash(&stored), &stored)
                    }
                    Ok(h) => cache.put(&self.cache_key(second), *h.as_bytes(), &stored),
                    Err(_) => log::debug!("{second}: the holder's hash '{hash}' is not BLAKE3"),
                }
                Ok(stored)
            }
            // The holder cannot rebuild it (no key for this stanza, a manifest too large,
            // another zstd): it wrote nothing.
            Err(e) if e.kind == ErrorKind::Invalid => {
                log::info!("{e}; sending it whole");
                whole(stored).await
            }
            // A retry of a write whose answer was lost: ours if the manifest holds it.
            Err(e) if e.kind == ErrorKind::AlreadyExists => match self.get(second).await {
                Ok(written) if written == stored => Ok(stored),
                _ => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Run `create`, a create-only write of `data` as `key`, with retries.
    ///
    /// A write can succeed on the server and lose its answer; whoever sends it again (this
    /// loop, or object_store's HTTP client within one attempt) then finds the object it
    /// wrote and is refused. So every refusal is checked against what this writer sent: an
    /// object with the same bytes is ours and the write succeeded.
    async fn create_object<F, Fut>(
        &self,
        key: &str,
        data: &Bytes,
        what: String,
        create: F,
    ) -> Result<()>
    where
        F: Fn(ObjPath) -> Fut,
        Fut: Future<Output = object_store::Result<()>>,
    {
        self.retry_object(key, what, |path, what| {
            let attempt = create(path.clone());
            async move {
                let refused = match attempt.await {
                    Ok(()) => return Ok(()),
                    Err(e) => map_err(e, what.clone()),
                };
                if refused.kind != ErrorKind::AlreadyExists {
                    return Err(refused);
                }
                match self.store.get(&path).await {
                    Ok(existing) => {
                        let existing = existing
                            .bytes()
                            .await
                            .map_err(|e| map_err(e, format!("{what}: read back")))?;
                        if existing == *data {
                            log::info!(
                                "{key} was written by this process (its first answer was lost)"
                            );
                            return Ok(());
                        }
                        Err(refused)
                    }
                    // Gone again meanwhile (a lock released): still someone else's.
                    Err(object_store::Error::NotFound { .. }) => Err(refused),
                    Err(e) => Err(map_err(e, format!("{what}: read back"))),
                }
            }
        })
        .await
    }

    /// Read a whole object, opened (and authenticated) when the stanza is encrypted.
    pub async fn get(&self, key: &str) -> Result<Bytes> {
        let stored = self.get_unsealed(key).await?;
        self.open_stored(key, stored)
    }

    /// An object as stored ([`Storage::get_unsealed`]), opened when the stanza is
    /// encrypted: what [`Storage::get`] returns.
    pub fn open_stored(&self, key: &str, stored: Bytes) -> Result<Bytes> {
        match &self.cipher {
            Some(c) => Ok(Bytes::from(c.open_object(key, &stored)?)),
            None => Ok(stored),
        }
    }

    /// The hash an object is kept under in the object cache, which the holder compares
    /// with its own before sending it again: of the bytes stored; under a session key
    /// (the agent of a `pg-remote` backup), whose reads the holder reseals anew each time,
    /// of the plain content, which the holder compares instead
    /// (`pgstrata_remote::agent::Reseal`).
    fn cache_hash(&self, stored: &[u8], plain: &[u8]) -> [u8; 32] {
        match &self.cipher {
            Some(c) if c.is_session() => stored_hash(plain),
            _ => stored_hash(stored),
        }
    }

    /// What object `key` of this repository is kept as in the object cache: the same key
    /// in two repositories (a stanza and label of the same name) are two entries.
    fn cache_key(&self, key: &str) -> String {
        format!("{}\n{key}", self.description)
    }

    /// [`Storage::get`] of an object written once and read again later (a manifest).
    /// Through a repository on another host, the object is kept in this host's object
    /// cache and, on later reads, crosses the line only if its bytes are not the ones
    /// kept (the holder compares hashes).
    pub async fn get_cached(&self, key: &str) -> Result<Bytes> {
        let (Some(remote), Some(cache)) = (&self.remote, object_cache()) else {
            return self.get(key).await;
        };
        let Some(held) = cache.get(&self.cache_key(key)) else {
            let stored = self.get_unsealed(key).await?;
            let plain = self.open_stored(key, stored.clone())?;
            cache.put(
                &self.cache_key(key),
                self.cache_hash(&stored, &plain),
                &plain,
            );
            return Ok(plain);
        };
        let hash = blake3::Hash::from(held.stored_hash).to_hex().to_string();
        let fetched = self
            .retry_object(key, format!("read {key}"), |path, what| {
                let hash = hash.clone();
                async move {
                    remote
                        .get_unless_hash(&path, &hash)
                        .await
                        .map_err(|e| map_err(e, what))
                }
            })
            .await?;
        match fetched {
            None => {
                log::debug!("{key}: unchanged; read from the object cache");
                Ok(held.bytes)
            }
            Some(stored) => {
                let plain = self.open_stored(key, stored.clone())?;
                cache.put(
                    &self.cache_key(key),
                    self.cache_hash(&stored, &plain),
                    &plain,
                );
                Ok(plain)
            }
        }
    }

    /// [`Storage::get`] of an object written by [`Storage::put_new_twice`] under another
    /// name: opened as sealed under `sealed_as`, or else under its own name (how such
    /// objects were sealed before they were written twice with the same bytes).
    pub async fn get_sealed_as(&self, key: &str, sealed_as: &str) -> Result<Bytes> {
        let stored = self.get_unsealed(key).await?;
        match &self.cipher {
            Some(c) => c
                .open_object(sealed_as, &stored)
                .or_else(|_| c.open_object(key, &stored))
                .map(Bytes::from),
            None => Ok(stored),
        }
    }

    /// Read a whole object as stored.
    pub async fn get_unsealed(&self, key: &str) -> Result<Bytes> {
        self.retry_object(key, format!("read {key}"), |path, what| async move {
            let r = self
                .store
                .get(&path)
                .await
                .map_err(|e| map_err(e, what.clone()))?;
            let expected = r.meta.size;
            let b = r.bytes().await.map_err(|e| map_err(e, what.clone()))?;
            whole(b, expected, &what)
        })
        .await
    }

    /// Frames `[offset, length]` of pack `key`, opened (still compressed) by the holder:
    /// how the agent of a `pg-remote` backup, which holds a session key, reads frames of
    /// earlier backups (file maps). Through a repository on another host only.
    pub async fn get_opened_frames(&self, key: &str, frames: &[[u64; 2]]) -> Result<Vec<Bytes>> {
        let Some(remote) = &self.remote else {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{key}: a session key reads frames through the backup host only"),
            ));
        };
        self.retry_object(
            key,
            format!("read frames of {key}"),
            |path, what| async move {
                remote
                    .get_opened_frames(&path, frames)
                    .await
                    .map_err(|e| map_err(e, what))
            },
        )
        .await
    }

    /// [`Storage::get_unsealed`] of an object read once, by a copy to another repository:
    /// where this repository is a local directory and the object is large, it is read with
    /// direct I/O ([`crate::direct`]), past the page cache, into a buffer a direct write
    /// takes as it is. Anywhere else, or where the filesystem refuses direct I/O, as
    /// `get_unsealed` reads it.
    pub async fn get_unsealed_once(&self, key: &str) -> Result<Bytes> {
        if let Some(root) = &self.local_root {
            let path = root.join(Self::path(key)?.as_ref());
            let rate = self.rate.clone();
            let what = format!("read {key}");
            let read = tokio::task::spawn_blocking(move || {
                crate::direct::read_whole(&path, rate.as_deref())
            })
            .await
            .expect("direct read thread")
            .map_err(|e| Error::with_source(ErrorKind::Storage, what, e))?;
            if let Some(bytes) = read {
                return Ok(bytes);
            }
        }
        self.get_unsealed(key).await
    }

    /// Read bytes of an object as stored (pack frames, which are sealed one by one).
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let what = format!("read {key} bytes {}..{}", range.start, range.end);
        self.retry_object(key, what, |path, what| {
            let range = range.clone();
            async move {
                let want = range.end - range.start;
                let end = range.end;
                let failed = match self.store.get_range(&path, range).await {
                    Ok(b) => match whole(b, want, &what) {
                        Ok(b) => return Ok(b),
                        Err(short) => short,
                    },
                    Err(e) => map_err(e, what.clone()),
                };
                // A dropped connection is transient (retried); an object shorter than the
                // range is damage (truncated or replaced), and reading it again will not help.
                if failed.kind == ErrorKind::Storage {
                    if let Ok(meta) = self.store.head(&path).await {
                        if meta.size < end {
                            return Err(Error::corrupt(format!(
                                "{what}: the object is only {} bytes (truncated or replaced): the repository is damaged",
                                meta.size
                            )));
                        }
                    }
                }
                Err(failed)
            }
        })
        .await
    }

    /// The first `len` bytes of an object as stored, or all of it when it is shorter: a
    /// header read together with what usually follows it (a WAL object's block-change map).
    pub async fn get_prefix(&self, key: &str, len: u64) -> Result<Bytes> {
        let what = format!("read {key} bytes 0..{len}");
        self.retry_object(key, what, |path, what| async move {
            let options = object_store::GetOptions {
                range: Some(object_store::GetRange::Bounded(0..len)),
                ..Default::default()
            };
            let r = self
                .store
                .get_opts(&path, options)
                .await
                .map_err(|e| map_err(e, what.clone()))?;
            let expected = r.range.end - r.range.start;
            let b = r.bytes().await.map_err(|e| map_err(e, what.clone()))?;
            whole(b, expected, &what)
        })
        .await
    }

    /// Size of an object, or `None` when it does not exist.
    pub async fn size(&self, key: &str) -> Result<Option<u64>> {
        self.retry_object(key, format!("look up {key}"), |path, what| async move {
            match self.store.head(&path).await {
                Ok(m) => Ok(Some(m.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(map_err(e, what)),
            }
        })
        .await
    }

    pub async fn exists(&self, key: &str) -> Result<bool> {
        Ok(self.size(key).await?.is_some())
    }

    /// Every object under `prefix` (recursively), sorted by name.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.retry_object(prefix, format!("list {prefix}"), |p, what| async move {
            let mut out: Vec<ObjectInfo> = self
                .store
                .list(Some(&p))
                .map_ok(|m| ObjectInfo {
                    key: m.location.to_string(),
                    size: m.size,
                    modified: m.last_modified.timestamp(),
                })
                .try_collect()
                .await
                .map_err(|e| map_err(e, what))?;
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
    }

    /// Immediate child "directories" under `prefix`.
    pub async fn list_dirs(&self, prefix: &str) -> Result<Vec<String>> {
        let r = self
            .retry_object(prefix, format!("list {prefix}"), |p, what| async move {
                self.store
                    .list_with_delimiter(Some(&p))
                    .await
                    .map_err(|e| map_err(e, what))
            })
            .await?;
        let mut out: Vec<String> = r
            .common_prefixes
            .into_iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        out.sort();
        Ok(out)
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        self.delete_many(&[key.to_string()]).await
    }

    /// Delete objects, batched (S3 deletes up to 1000 per request); missing ones are fine.
    pub async fn delete_many(&self, keys: &[String]) -> Result<()> {
        for batch in keys.chunks(1000) {
            let paths: Vec<ObjPath> = batch.iter().map(|k| Self::path(k)).collect::<Result<_>>()?;
            let what = format!(
                "delete {} object(s) starting with {}",
                batch.len(),
                batch[0]
            );
            self.retry(&what, || {
                let (paths, what) = (paths.clone(), what.clone());
                async move {
                    let stream = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
                    let results: Vec<_> = self.store.delete_stream(stream).collect().await;
                    for r in results {
                        match r {
                            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                            Err(e) => return Err(map_err(e, what.clone())),
                        }
                    }
                    Ok(())
                }
            })
            .await?;
        }
        Ok(())
    }
}

impl Storage {
    /// Refuse an S3-compatible store that does not enforce create-only writes
    /// (`If-None-Match: *`): on it, two backups could both take the stanza lock and a
    /// write could replace an object. Writes a probe object twice with different bytes;
    /// the second must be refused. The probe object is removed either way. Local, GCS and
    /// Azure repositories always enforce it and are not probed.
    pub async fn check_create_only(&self, stanza: &str) -> Result<()> {
        if !self.s3_compatible {
            return Ok(());
        }
        let key = crate::layout::create_only_probe(stanza, &crate::layout::unique_name());
        let first = self.put_new(&key, Bytes::from_static(b"first")).await;
        let second = match first {
            Ok(()) => Some(self.put_new(&key, Bytes::from_static(b"second")).await),
            Err(_) => None,
        };
        let cleanup = self.delete(&key).await;
        first?;
        match second.expect("probed twice") {
            Err(e) if e.kind == ErrorKind::AlreadyExists => cleanup,
            Err(e) => Err(e),
            Ok(()) => Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "repository {} does not enforce create-only writes: a second conditional PUT \
                     (If-None-Match: *) of {key} replaced the object instead of failing. pgstrata needs \
                     them (its lock and write-once objects rely on them): use a store that supports \
                     conditional writes (AWS S3, MinIO, Ceph RGW of a recent release...)",
                    self.description
                ),
            )),
        }
    }

    /// Remove the staging files under `prefix` not modified for `older_than`, and return
    /// their names. A local repository writes each object to a staging file `<key>#<n>`
    /// and renames it into place; a writer killed in between leaves the staging file, which
    /// listings skip and nothing else would ever remove. Younger ones may belong to a
    /// write in progress. Object stores have none (a put is atomic there).
    pub fn remove_stale_staging(&self, prefix: &str, older_than: Duration) -> Result<Vec<String>> {
        let Some(root) = &self.local_root else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        let mut dirs = vec![root.join(prefix)];
        while let Some(dir) = dirs.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(local_err(e, "list", &dir)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| local_err(e, "list", &dir))?;
                let path = entry.path();
                let md = match std::fs::symlink_metadata(&path) {
                    Ok(md) => md,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(local_err(e, "stat", &path)),
                };
                if md.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = entry.file_name();
                let is_staging = name
                    .to_str()
                    .and_then(|n| n.rsplit_once('#'))
                    .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                let age = md.modified().ok().and_then(|m| m.elapsed().ok());
                if md.is_file() && is_staging && age.is_some_and(|a| a >= older_than) {
                    match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(local_err(e, "remove", &path)),
                    }
                    let key = path.strip_prefix(root).unwrap_or(&path);
                    removed.push(key.display().to_string());
                }
            }
        }
        removed.sort();
        Ok(removed)
    }
}

impl Storage {
    /// Start the new object `key` as a stream of bytes, when this repository can take one
    /// without the object being held in memory: a local directory, where the bytes go to a
    /// staging file `<key>#<n>` (the name [`Storage::put_new`]'s writes use there, which
    /// listings skip and [`Storage::remove_stale_staging`] removes) and
    /// [`StreamedObject::commit`] links it into place. `None` for every other store: a put
    /// there is one request of the whole object, and a multipart upload would cost several
    /// round trips an object, so callers gather the object in memory and `put_new` it.
    pub fn stream_new(&self, key: &str) -> Result<Option<StreamedObject>> {
        let Some(root) = &self.local_root else {
            return Ok(None);
        };
        // Parsed as every other operation's key is; a valid key names the same file the
        // local store reads (stanza names, labels and pack names are plain).
        let dest = root.join(Self::path(key)?.as_ref());
        let dir = dest.parent().unwrap_or(root);
        std::fs::create_dir_all(dir).map_err(|e| local_err(e, "create directory", dir))?;
        let mut n = 1u32;
        let (file, staging) = loop {
            let mut staging = dest.clone().into_os_string();
            staging.push(format!("#{n}"));
            let staging = std::path::PathBuf::from(staging);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&staging)
            {
                Ok(file) => break (file, staging),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
                Err(e) => return Err(local_err(e, "create", &staging)),
            }
        };
        Ok(Some(StreamedObject {
            rate: self.rate.clone(),
            file: std::io::BufWriter::with_capacity(StreamedObject::BUFFER, file),
            staging: Some(staging),
            dest,
            len: 0,
        }))
    }
}

/// A new object of a local repository being written ([`Storage::stream_new`]). Nothing is
/// visible under its key until [`StreamedObject::commit`] returns; dropped before that, its
/// staging file is removed.
#[derive(Debug)]
pub struct StreamedObject {
    /// The repository's rate limit, which the bytes written take from.
    rate: Option<Arc<RateLimiter>>,
    file: std::io::BufWriter<std::fs::File>,
    /// The staging file, until it is committed or removed.
    staging: Option<std::path::PathBuf>,
    dest: std::path::PathBuf,
    len: u64,
}

impl StreamedObject {
    /// Bytes gathered before a write to the staging file: small frames (a file of a page
    /// or two) are hundreds of bytes, and a system call each would cost more than them.
    const BUFFER: usize = 256 * 1024;

    /// Append `bytes` to the object.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        if let Some(rate) = &self.rate {
            rate.acquire_blocking(bytes.len() as u64);
        }
        self.file
            .write_all(bytes)
            .map_err(|e| local_err(e, "write", self.staging.as_deref().unwrap_or(&self.dest)))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Make the object durable and visible: the staging file is fsynced, linked to the
    /// object's name (create-only: an object already there is an `AlreadyExists` error and
    /// stays as it was) and removed, and the directory fsynced, as a local `put_new` does.
    pub fn commit(mut self) -> Result<()> {
        let staging = self.staging.take().expect("committed once");
        let outcome = self.publish(&staging);
        if let Err(e) = std::fs::remove_file(&staging) {
            if e.kind() != std::io::ErrorKind::NotFound && outcome.is_ok() {
                return Err(local_err(e, "remove", &staging));
            }
        }
        outcome?;
        let dir = self
            .dest
            .parent()
            .expect("an object's file is in a directory");
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| local_err(e, "fsync", dir))
    }

    /// Write `data`, the whole object, with `O_DIRECT` ([`crate::direct`]): straight to the
    /// disk, without the kernel copying every byte into the page cache and writing it back
    /// later (the larger part of a local copy's time when it was written through the
    /// cache). Direct writes are still not durable until the device's cache is flushed, so
    /// the object is staged and published as any other. Returns false, having written
    /// nothing, where the filesystem refuses direct I/O.
    fn write_direct(&mut self, data: &[u8]) -> Result<bool> {
        debug_assert!(self.len == 0 && self.file.buffer().is_empty());
        let path = self.staging.clone().expect("a staging file");
        let file = self.file.get_ref();
        let written = crate::direct::write_all(file, data, self.rate.as_deref())
            .map_err(|e| local_err(e, "write", &path))?;
        if written {
            file.set_len(data.len() as u64)
                .map_err(|e| local_err(e, "truncate", &path))?;
            self.len = data.len() as u64;
        }
        Ok(written)
    }

    /// Finish writing without making the object durable or visible: its bytes are in the
    /// staging file, flushed to the kernel but not fsynced. [`Storage::publish_staged`]
    /// makes many such objects durable with one `syncfs` and links them into place, so
    /// that the disk writes them back in its own order instead of one fsync at a time.
    pub fn stage(mut self) -> Result<StagedObject> {
        use std::io::Write;
        let staging = self.staging.take().expect("staged once");
        if let Err(e) = self.file.flush() {
            let _ = std::fs::remove_file(&staging);
            return Err(local_err(e, "write", &staging));
        }
        // Start writing the bytes back now, without waiting: the disk works while the next
        // objects are written, and the one syncfs at the end finds little left to do.
        // SAFETY: a plain system call on an open descriptor; its failure changes nothing.
        unsafe {
            nix::libc::sync_file_range(
                std::os::fd::AsRawFd::as_raw_fd(self.file.get_ref()),
                0,
                0,
                nix::libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        Ok(StagedObject {
            staging: Some(staging),
            dest: std::mem::take(&mut self.dest),
            len: self.len,
        })
    }

    fn publish(&mut self, staging: &std::path::Path) -> Result<()> {
        use std::io::Write;
        self.file
            .flush()
            .and_then(|()| self.file.get_ref().sync_all())
            .map_err(|e| local_err(e, "write", staging))?;
        match std::fs::hard_link(staging, &self.dest) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::with_source(
                ErrorKind::AlreadyExists,
                format!("write {}: another object is there", self.dest.display()),
                e,
            )),
            Err(e) => Err(local_err(e, "link", &self.dest)),
        }
    }
}

pub use crate::direct::DIRECT_MIN;

/// An object written to its staging file and not yet durable ([`StreamedObject::stage`]):
/// invisible (listings skip staging names) until [`Storage::publish_staged`]; dropped
/// before that, its staging file is removed.
#[derive(Debug)]
pub struct StagedObject {
    staging: Option<std::path::PathBuf>,
    dest: std::path::PathBuf,
    len: u64,
}

impl StagedObject {
    /// Bytes of the object.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the object has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for StagedObject {
    fn drop(&mut self) {
        if let Some(staging) = self.staging.take() {
            let _ = std::fs::remove_file(staging);
        }
    }
}

impl Storage {
    /// Write the new object `key` to a staging file without an fsync, where this
    /// repository is a local directory (`None` elsewhere: write it with `put_new_unsealed`).
    /// An object of [`DIRECT_MIN`] bytes or more is written with direct I/O where the
    /// filesystem takes it ([`StreamedObject::write_direct`]).
    pub fn stage_new(&self, key: &str, data: &[u8]) -> Result<Option<StagedObject>> {
        let Some(mut object) = self.stream_new(key)? else {
            return Ok(None);
        };
        if data.len() < DIRECT_MIN || !object.write_direct(data)? {
            object.write(data)?;
        }
        object.stage().map(Some)
    }

    /// Make staged objects durable and visible, all at once: one `syncfs` of the
    /// repository's filesystem writes back their bytes (so no object is ever visible with
    /// bytes a crash could lose), then each is linked to its name (create-only) and its
    /// staging file removed, and a second `syncfs` makes the names durable. Returns, in
    /// order, whether each was published (false: another object had its name already,
    /// and stays as it was). A crash before the end leaves staging files, which
    /// `remove_stale_staging` removes, and objects whose bytes are durable.
    pub fn publish_staged(&self, mut staged: Vec<StagedObject>) -> Result<Vec<bool>> {
        let Some(root) = &self.local_root else {
            assert!(
                staged.is_empty(),
                "objects are staged in local repositories only"
            );
            return Ok(Vec::new());
        };
        if staged.is_empty() {
            return Ok(Vec::new());
        }
        let sync = || {
            let dir = std::fs::File::open(root).map_err(|e| local_err(e, "open", root))?;
            nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir))
                .map_err(|e| local_err(std::io::Error::from(e), "syncfs", root))
        };
        sync()?;
        let mut published = Vec::with_capacity(staged.len());
        for object in &mut staged {
            let staging = object.staging.take().expect("published once");
            let linked = match std::fs::hard_link(&staging, &object.dest) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(local_err(e, "link", &object.dest)),
            };
            let removed = std::fs::remove_file(&staging);
            published.push(linked?);
            if let Err(e) = removed {
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(local_err(e, "remove", &staging));
                }
            }
        }
        sync()?;
        Ok(published)
    }
}

impl Drop for StreamedObject {
    fn drop(&mut self) {
        if let Some(staging) = self.staging.take() {
            let _ = std::fs::remove_file(staging);
        }
    }
}

fn local_err(e: std::io::Error, what: &str, path: &std::path::Path) -> Error {
    Error::with_source(ErrorKind::Storage, format!("{what} {}", path.display()), e)
}

/// HTTP client settings shared by the object-store backends.
fn client_options(cfg: &RepoConfig, endpoint: Option<&str>) -> Result<object_store::ClientOptions> {
    let mut o = object_store::ClientOptions::new()
        .with_allow_invalid_certificates(!cfg.verify_tls)
        .with_connect_timeout(Duration::from_secs(10))
        .with_timeout(if cfg.timeout.is_zero() {
            Duration::from_secs(120)
        } else {
            cfg.timeout
        })
        .with_pool_max_idle_per_host(64);
    if endpoint.is_some_and(|e| e.starts_with("http://")) {
        o = o.with_allow_http(true);
    }
    if let Some(ca) = &cfg.ca_file {
        let pem = std::fs::read(ca)
            .map_err(|e| Error::with_source(ErrorKind::Invalid, format!("CA file {ca}"), e))?;
        let certs = object_store::Certificate::from_pem_bundle(&pem).map_err(|e| {
            Error::with_source(
                ErrorKind::Invalid,
                format!("CA file {ca}: not PEM certificates"),
                e,
            )
        })?;
        for c in certs {
            o = o.with_root_certificate(c);
        }
    }
    Ok(o)
}

/// Request-level retries inside object_store's HTTP client; operation-level retries are
/// `Storage::retry`'s.
fn http_retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(60),
        ..Default::default()
    }
}
