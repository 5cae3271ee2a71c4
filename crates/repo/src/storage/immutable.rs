//! Immutable repositories (`repo-s3-object-lock`): the checks that the bucket really locks
//! what pgstrata writes, and deletion that never asks S3 to delete a locked version.
//!
//! The lock itself is the bucket's: S3 Object Lock with a default retention gives every
//! new object version a retain-until date of its write time plus the default's days, in
//! its mode, and refuses to delete the version before then, whoever asks (compliance) or
//! whoever lacks `s3:BypassGovernanceRetention` (governance). pgstrata writes plain PUTs
//! and relies on that default rather than sending retention headers itself: then its
//! credentials need no right to change retention, and nothing it could be made to send
//! shortens it. What pgstrata owns is checking the promise (stanza-create, check) and
//! keeping to it (expire): an expired backup leaves the stanza's view at once, through its
//! expire record, and its objects are deleted, every version, by the first expire after
//! their retention has passed.

use super::Storage;
use crate::s3_versions::{LockConfiguration, ObjectLock, ObjectVersion, S3Versions};
use crate::{Error, ErrorKind, Named, Result};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use std::collections::BTreeMap;

/// What [`Storage::delete_retained`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// Objects deleted (every version of each, on an immutable repository).
    pub deleted: u64,
    /// Objects kept because a version's retention has not passed; a later expire deletes
    /// them.
    pub waiting: Vec<String>,
    /// The latest retain-until date among the waiting objects (unix seconds).
    pub waiting_until: Option<i64>,
}

impl Deletion {
    pub fn add(&mut self, other: Deletion) {
        self.deleted += other.deleted;
        self.waiting.extend(other.waiting);
        self.waiting_until = self.waiting_until.max(other.waiting_until);
    }
}

/// How many objects' versions are deleted at once.
const DELETES_AT_ONCE: usize = 16;

impl Storage {
    /// The retention every object of this repository carries, when it is immutable.
    pub fn object_lock(&self) -> Option<ObjectLock> {
        self.object_lock
    }

    /// The client of the S3 bucket's object versions, where an object lock or a target
    /// time needs it.
    pub fn versions(&self) -> Option<&S3Versions> {
        self.versions.as_deref()
    }

    /// The time the repository is read as of (`repo-target-time`), when it is.
    pub fn read_as_of(&self) -> Option<i64> {
        self.as_of
    }

    /// Refuse an immutable repository whose bucket does not lock what pgstrata writes as
    /// configured: Object Lock off, no default retention, another mode, fewer days. Then
    /// write a probe object and read back the retention S3 gave it. Not immutable: nothing
    /// to check.
    pub async fn check_object_lock(&self, stanza: &str) -> Result<()> {
        let (Some(lock), Some(versions)) = (self.object_lock, &self.versions) else {
            return Ok(());
        };
        let want = lock.mode.s3_name();
        let fix = format!(
            "aws s3api put-object-lock-configuration --bucket <bucket> --object-lock-configuration \
             '{{\"ObjectLockEnabled\":\"Enabled\",\"Rule\":{{\"DefaultRetention\":{{\"Mode\":\"{want}\",\"Days\":{}}}}}}}'",
            lock.days
        );
        let problem = match versions.lock_configuration().await? {
            LockConfiguration::Disabled => Some(format!(
                "its bucket has no Object Lock. Object Lock is enabled when a bucket is made \
                 (aws s3api create-bucket --object-lock-enabled-for-bucket ...), which also turns \
                 versioning on; then give it a default retention: {fix}"
            )),
            LockConfiguration::Enabled(None) => Some(format!(
                "its bucket has Object Lock but no default retention, so the objects pgstrata \
                 writes would not be locked. Set one: {fix}"
            )),
            LockConfiguration::Enabled(Some((mode, days))) if mode != want || days < lock.days => {
                Some(format!(
                    "its bucket's default retention is {mode} for {days} day(s), less than \
                     repo-s3-object-lock={} with repo-immutable-days={} asks. Set it: {fix}",
                    lock.mode.name(),
                    lock.days
                ))
            }
            LockConfiguration::Enabled(Some(_)) => None,
        };
        if let Some(problem) = problem {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "repository {} is configured immutable, but {problem}",
                    self.description
                ),
            ));
        }
        self.probe_retention(stanza, lock, versions).await
    }

    /// Write a probe and check the retention S3 gave it; the probe is then deleted (a
    /// delete marker: its locked version stays until its retention passes).
    async fn probe_retention(
        &self,
        stanza: &str,
        lock: ObjectLock,
        versions: &S3Versions,
    ) -> Result<()> {
        let key = crate::layout::create_only_probe(stanza, &crate::layout::unique_name());
        self.put_new_unsealed(&key, Bytes::from_static(b"retention probe"))
            .await?;
        let written = chrono::Utc::now().timestamp();
        let retention = versions.retention(&key).await;
        self.delete(&key).await?;
        let want = lock.mode.s3_name();
        // An hour of slack for clocks that differ.
        match retention? {
            Some((mode, until)) if mode == want && until >= lock.retained_until(written) - 3600 => {
                Ok(())
            }
            got => Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "repository {}: a probe object written now got the retention {}, not {want} \
                     until {} days from now: the bucket does not lock pgstrata's objects as \
                     configured",
                    self.description,
                    match got {
                        Some((mode, until)) => format!(
                            "{mode} until {}",
                            chrono::DateTime::from_timestamp(until, 0)
                                .unwrap_or_default()
                                .to_rfc3339()
                        ),
                        None => "none".into(),
                    },
                    lock.days
                ),
            )),
        }
    }

    /// Delete objects that expire removes (backups' manifests and packs, WAL). On an
    /// immutable repository, each object goes, every version of it, only once the
    /// retention of all its versions has passed; the others stay as they are (readable,
    /// not hidden behind a delete marker) and are counted as waiting. Elsewhere this is
    /// [`Storage::delete_many`].
    pub async fn delete_retained(&self, keys: &[String]) -> Result<Deletion> {
        let (Some(lock), Some(versions)) = (self.object_lock, &self.versions) else {
            self.delete_many(keys).await?;
            return Ok(Deletion {
                deleted: keys.len() as u64,
                ..Default::default()
            });
        };
        // One listing of versions per directory, not per object.
        let mut by_dir: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for key in keys {
            let dir = key.rsplit_once('/').map_or("", |(dir, _)| dir);
            by_dir.entry(dir).or_default().push(key);
        }
        let now = chrono::Utc::now().timestamp();
        let mut out = Deletion::default();
        for (dir, wanted) in by_dir {
            let what = format!("list the versions in {dir}");
            let prefix = format!("{dir}/");
            let listed = self
                .retry(&what, || versions.list_versions(&prefix))
                .await?;
            let mut of_key: BTreeMap<&str, Vec<&ObjectVersion>> = BTreeMap::new();
            for v in &listed {
                of_key.entry(v.key.as_str()).or_default().push(v);
            }
            let mut doomed = Vec::new();
            for key in wanted {
                let all = of_key.remove(key).unwrap_or_default();
                let until = all
                    .iter()
                    .filter(|v| !v.delete_marker)
                    .map(|v| lock.retained_until(v.modified))
                    .max();
                match until {
                    Some(until) if until > now => {
                        out.waiting.push(key.to_string());
                        out.waiting_until = out.waiting_until.max(Some(until));
                    }
                    _ if all.is_empty() => {}
                    _ => doomed.push((key, all)),
                }
            }
            let results: Vec<Deletion> = futures::stream::iter(doomed)
                .map(|(key, all)| self.delete_versions(versions, key, all))
                .buffer_unordered(DELETES_AT_ONCE)
                .try_collect()
                .await?;
            for r in results {
                out.add(r);
            }
        }
        Ok(out)
    }

    /// Delete every version of `key`; one S3 still refuses (its retention was made longer
    /// than the bucket's default said) leaves the object waiting.
    async fn delete_versions(
        &self,
        versions: &S3Versions,
        key: &str,
        all: Vec<&ObjectVersion>,
    ) -> Result<Deletion> {
        for v in all {
            let what = format!("delete version {} of {key}", v.version_id);
            match self
                .retry(&what, || versions.delete_version(key, &v.version_id))
                .await
            {
                Ok(()) => {}
                Err(e) if e.kind == ErrorKind::Invalid => {
                    log::info!("{key} stays: {e}");
                    return Ok(Deletion {
                        waiting: vec![key.to_string()],
                        ..Default::default()
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Deletion {
            deleted: 1,
            ..Default::default()
        })
    }
}
