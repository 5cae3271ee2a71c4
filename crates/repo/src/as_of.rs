//! A repository read as it was at a time (`repo-target-time`): an object store stacked
//! over an S3 repository that answers every read from the object versions that were
//! current then, and refuses every write.
//!
//! Why: on a versioned bucket (every bucket with Object Lock is one) nothing an attacker
//! holding the repository's credentials does is final before the retention date: a plain
//! delete only puts a delete marker on top, an overwrite only adds a version, and the
//! versions S3 keeps under Object Lock cannot be deleted. Reading each object's newest
//! version written at or before the time, and treating a delete marker as "absent",
//! gives back the repository exactly as it was, so `info`, `verify`, `restore` and the
//! WAL fetches of the restored server see the backups of before the attack.
//!
//! The version index is listed once, on first use (one ListObjectVersions page per 1000
//! versions), and read from memory after that: a restore lists and reads many objects.

use crate::s3_versions::S3Versions;
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The object each name had at the time: its version id, size and modification time.
type Index = BTreeMap<String, (String, u64, i64)>;

/// Clones share the index.
#[derive(Debug, Clone)]
pub struct AsOfStore {
    inner: Arc<dyn ObjectStore>,
    versions: Arc<S3Versions>,
    /// Unix seconds.
    time: i64,
    index: Arc<tokio::sync::OnceCell<Arc<Index>>>,
}

impl std::fmt::Display for AsOfStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} as of {}", self.inner, self.time)
    }
}

impl AsOfStore {
    /// `inner` reads the repository's objects (names relative to the repository), and
    /// `versions` lists their versions.
    pub fn new(inner: Arc<dyn ObjectStore>, versions: Arc<S3Versions>, time: i64) -> AsOfStore {
        AsOfStore {
            inner,
            versions,
            time,
            index: Arc::new(tokio::sync::OnceCell::new()),
        }
    }

    async fn index(&self) -> Result<Arc<Index>> {
        self.index
            .get_or_try_init(|| async {
                let all = self.versions.list_versions("").await.map_err(|e| {
                    object_store::Error::Generic {
                        store: "S3 versions",
                        source: Box::new(e),
                    }
                })?;
                Ok(Arc::new(index_at(all, self.time)))
            })
            .await
            .cloned()
    }

    fn refused(&self, what: &str, location: &Path) -> object_store::Error {
        object_store::Error::NotSupported {
            source: format!(
                "{what} {location}: the repository is read as it was at {} (repo-target-time), and nothing is written to it",
                chrono::DateTime::from_timestamp(self.time, 0)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default()
            )
            .into(),
        }
    }
}

/// For each name, its newest version modified at or before `time`; names whose newest
/// such entry is a delete marker (or that had none yet) are absent. `all` is in
/// [`S3Versions::list_versions`] order: by name, newest first.
fn index_at(all: Vec<crate::s3_versions::ObjectVersion>, time: i64) -> Index {
    let mut index = Index::new();
    let mut decided: BTreeSet<String> = BTreeSet::new();
    for v in all {
        if v.modified > time || decided.contains(&v.key) {
            continue;
        }
        decided.insert(v.key.clone());
        if !v.delete_marker {
            index.insert(v.key, (v.version_id, v.size, v.modified));
        }
    }
    index
}

fn meta(key: &str, (version, size, modified): &(String, u64, i64)) -> ObjectMeta {
    ObjectMeta {
        location: Path::from(key),
        last_modified: chrono::DateTime::from_timestamp(*modified, 0).unwrap_or_default(),
        size: *size,
        e_tag: None,
        version: Some(version.clone()),
    }
}

/// Whether `key` is `prefix` itself or below it, path segment by segment.
fn under(key: &str, prefix: Option<&Path>) -> bool {
    match prefix.map(|p| p.as_ref()) {
        None | Some("") => true,
        Some(p) => key
            .strip_prefix(p)
            .is_some_and(|rest| rest.starts_with('/')),
    }
}

#[async_trait]
impl ObjectStore for AsOfStore {
    async fn put_opts(&self, location: &Path, _: PutPayload, _: PutOptions) -> Result<PutResult> {
        Err(self.refused("write", location))
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        _: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Err(self.refused("write", location))
    }

    async fn get_opts(&self, location: &Path, mut options: GetOptions) -> Result<GetResult> {
        let index = self.index().await?;
        let Some((version, ..)) = index.get(location.as_ref()) else {
            return Err(object_store::Error::NotFound {
                path: location.to_string(),
                source: format!("no version of it at {} (repo-target-time)", self.time).into(),
            });
        };
        options.version = Some(version.clone());
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let this = self.clone();
        locations
            .map(move |location| Err(this.refused("delete", &location?)))
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let this = self.clone();
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            let index = this.index().await?;
            let items: Vec<Result<ObjectMeta>> = index
                .iter()
                .filter(|(k, _)| under(k, prefix.as_ref()))
                .map(|(k, v)| Ok(meta(k, v)))
                .collect();
            Ok::<_, object_store::Error>(futures::stream::iter(items))
        })
        .try_flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let index = self.index().await?;
        let base = prefix.map(|p| p.as_ref().to_string()).unwrap_or_default();
        let mut common = BTreeSet::new();
        let mut objects = Vec::new();
        for (key, v) in index.iter().filter(|(k, _)| under(k, prefix)) {
            let rest = if base.is_empty() {
                key.as_str()
            } else {
                &key[base.len() + 1..]
            };
            match rest.split_once('/') {
                Some((dir, _)) if base.is_empty() => common.insert(dir.to_string()),
                Some((dir, _)) => common.insert(format!("{base}/{dir}")),
                None => {
                    objects.push(meta(key, v));
                    false
                }
            };
        }
        Ok(ListResult {
            common_prefixes: common.into_iter().map(Path::from).collect(),
            objects,
            extensions: Default::default(),
        })
    }

    async fn copy_opts(&self, _: &Path, to: &Path, _: CopyOptions) -> Result<()> {
        Err(self.refused("write", to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3_versions::ObjectVersion;

    fn v(key: &str, id: &str, modified: i64, delete_marker: bool) -> ObjectVersion {
        ObjectVersion {
            key: key.into(),
            version_id: id.into(),
            modified,
            size: 1,
            delete_marker,
            latest: false,
        }
    }

    #[test]
    fn each_name_reads_its_version_of_the_time_and_deleted_names_are_absent() {
        // Newest first within a name, as listed.
        let all = vec![
            v("a", "a3", 300, true), // deleted after the time: a2 was current
            v("a", "a2", 200, false),
            v("a", "a1", 100, false),
            v("b", "b2", 250, true), // deleted before the time
            v("b", "b1", 100, false),
            v("c", "c1", 260, false), // written after the time
        ];
        let index = index_at(all, 255);
        assert_eq!(index.get("a").map(|e| e.0.as_str()), Some("a2"));
        assert!(!index.contains_key("b"));
        assert!(!index.contains_key("c"));
    }

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(under("st/backup/x", Some(&Path::from("st/backup"))));
        assert!(!under("st/backups/x", Some(&Path::from("st/backup"))));
        assert!(under("st/x", None));
    }
}
