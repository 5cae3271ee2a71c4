//! A fault-injecting object store, for testing how pgstrata survives a misbehaving
//! repository: transient errors, permanent errors, hangs (timeouts), truncated reads and
//! slow responses. It wraps any backend and is stacked under [`crate::Storage`] with
//! `Storage::from_store`, the same way a real backend is.

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What to break. Counters count down as faults are injected.
#[derive(Debug, Default, Clone)]
pub struct FaultPlan {
    /// The next N puts fail with a transient (server) error.
    pub transient_puts: u32,
    /// The next N puts succeed on the server but the caller sees a transient error (the
    /// answer was lost).
    pub lost_put_answers: u32,
    /// The next N gets fail with a transient error.
    pub transient_gets: u32,
    /// The next N gets return only half of the bytes.
    pub truncated_gets: u32,
    /// The next N gets never answer (the caller's timeout must fire).
    pub hung_gets: u32,
    /// After this many more successful puts, every put fails permanently (access denied).
    pub deny_puts_after: Option<u32>,
    /// Delay added to every request.
    pub latency: Duration,
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    plan: Mutex<FaultPlan>,
    /// Requests seen, for assertions.
    pub requests: Mutex<u64>,
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

fn transient(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "fault",
        source: format!("injected transient failure: {what} (HTTP 503 Slow Down)").into(),
    }
}

/// Take one fault from a counter.
fn take(counter: &mut u32) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>, plan: FaultPlan) -> FaultyStore {
        FaultyStore {
            inner,
            plan: Mutex::new(plan),
            requests: Mutex::new(0),
        }
    }

    /// Change the plan (between steps of a test).
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.plan.lock().unwrap() = plan;
    }

    async fn before(&self) {
        *self.requests.lock().unwrap() += 1;
        let latency = self.plan.lock().unwrap().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.before().await;
        let (fail, lose, deny) = {
            let mut p = self.plan.lock().unwrap();
            let deny = match &mut p.deny_puts_after {
                Some(0) => true,
                Some(n) => {
                    *n -= 1;
                    false
                }
                None => false,
            };
            (
                take(&mut p.transient_puts),
                take(&mut p.lost_put_answers),
                deny,
            )
        };
        if deny {
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "injected: access denied".into(),
            });
        }
        if fail {
            return Err(transient(&format!("put {location}")));
        }
        let r = self.inner.put_opts(location, payload, opts).await?;
        if lose {
            return Err(transient(&format!("put {location} (answer lost)")));
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.before().await;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.before().await;
        let (fail, truncate, hang) = {
            let mut p = self.plan.lock().unwrap();
            (
                take(&mut p.transient_gets),
                take(&mut p.truncated_gets),
                take(&mut p.hung_gets),
            )
        };
        if hang {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if fail {
            return Err(transient(&format!("get {location}")));
        }
        let r = self.inner.get_opts(location, options).await?;
        if !truncate {
            return Ok(r);
        }
        let GetResult {
            payload,
            meta,
            range,
            attributes,
            extensions,
        } = r;
        let bytes = GetResult {
            payload,
            meta: meta.clone(),
            range: range.clone(),
            attributes: attributes.clone(),
            extensions: extensions.clone(),
        }
        .bytes()
        .await?;
        let half = bytes.slice(0..bytes.len() / 2);
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(half) }).boxed(),
            ),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        *self.requests.lock().unwrap() += 1;
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        *self.requests.lock().unwrap() += 1;
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.before().await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.before().await;
        self.inner.copy_opts(from, to, options).await
    }
}
