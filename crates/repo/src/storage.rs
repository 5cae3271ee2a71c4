//! The one way pgstrata reads and writes a repository.
//!
//! Everything goes through object_store, so the same code serves a local directory today and
//! an object store tomorrow. Objects are written once (`put_new` refuses to replace an
//! existing object) and never modified; nothing relies on rename or directory semantics.
//! A local repository fsyncs each object (and its directory) before a write returns.

use crate::{Error, ErrorKind, Result};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::ops::Range;
use std::sync::Arc;

/// A listed object.
#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Last modification, unix seconds.
    pub modified: i64,
}

#[derive(Clone, Debug)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    /// Shown in messages so the user knows which repository is meant.
    description: String,
}

fn map_err(e: object_store::Error, what: String) -> Error {
    match e {
        object_store::Error::NotFound { .. } => {
            Error::new(ErrorKind::NotFound, format!("{what}: not found"))
        }
        object_store::Error::AlreadyExists { .. } => {
            Error::new(ErrorKind::AlreadyExists, format!("{what}: already exists"))
        }
        other => Error::with_source(ErrorKind::Storage, what, other),
    }
}

impl Storage {
    /// A repository in a local directory, which must exist.
    pub fn local(dir: &std::path::Path) -> Result<Storage> {
        if !dir.is_dir() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("repository path {} does not exist or is not a directory (stanza-create makes it)", dir.display()),
            ));
        }
        let store = LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| map_err(e, format!("open repository {}", dir.display())))?
            .with_fsync(true)
            .with_automatic_cleanup(true);
        Ok(Storage {
            store: Arc::new(store),
            description: dir.display().to_string(),
        })
    }

    /// Wrap any object_store backend (used by tests' fault-injecting wrappers and, later,
    /// the cloud backends).
    pub fn from_store(store: Arc<dyn ObjectStore>, description: impl Into<String>) -> Storage {
        Storage {
            store,
            description: description.into(),
        }
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    fn path(key: &str) -> Result<ObjPath> {
        ObjPath::parse(key)
            .map_err(|e| Error::with_source(ErrorKind::Invalid, format!("object name '{key}'"), e))
    }

    /// Write a new object; fails with `AlreadyExists` if one is there.
    pub async fn put_new(&self, key: &str, data: Bytes) -> Result<()> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        self.store
            .put_opts(&Self::path(key)?, PutPayload::from(data), opts)
            .await
            .map(|_| ())
            .map_err(|e| map_err(e, format!("write {key}")))
    }

    pub async fn get(&self, key: &str) -> Result<Bytes> {
        let r = self
            .store
            .get(&Self::path(key)?)
            .await
            .map_err(|e| map_err(e, format!("read {key}")))?;
        r.bytes()
            .await
            .map_err(|e| map_err(e, format!("read {key}")))
    }

    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let want = range.end - range.start;
        let b = self
            .store
            .get_range(&Self::path(key)?, range.clone())
            .await
            .map_err(|e| {
                map_err(
                    e,
                    format!("read {key} bytes {}..{}", range.start, range.end),
                )
            })?;
        if b.len() as u64 != want {
            return Err(Error::corrupt(format!(
                "{key}: short read at {}..{} ({} of {want} bytes): object truncated",
                range.start,
                range.end,
                b.len()
            )));
        }
        Ok(b)
    }

    /// Size of an object, or `None` when it does not exist.
    pub async fn size(&self, key: &str) -> Result<Option<u64>> {
        match self.store.head(&Self::path(key)?).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(map_err(e, format!("look up {key}"))),
        }
    }

    pub async fn exists(&self, key: &str) -> Result<bool> {
        Ok(self.size(key).await?.is_some())
    }

    /// Every object under `prefix` (recursively), sorted by name.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let p = Self::path(prefix)?;
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
            .map_err(|e| map_err(e, format!("list {prefix}")))?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Immediate child "directories" under `prefix`.
    pub async fn list_dirs(&self, prefix: &str) -> Result<Vec<String>> {
        let p = Self::path(prefix)?;
        let r = self
            .store
            .list_with_delimiter(Some(&p))
            .await
            .map_err(|e| map_err(e, format!("list {prefix}")))?;
        let mut out: Vec<String> = r
            .common_prefixes
            .into_iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        out.sort();
        Ok(out)
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&Self::path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_err(e, format!("delete {key}"))),
        }
    }
}
