//! Rate limits: `repoN-rate-limit` (bytes per second to and from a repository) and
//! `pg-read-rate-limit` (bytes per second read from the data directory).
//!
//! A limit is one [`RateLimiter`] shared by every worker of the process that moves those
//! bytes, so the sum is what is limited, not each worker's share. It schedules rather
//! than counts: each caller reserves its bytes at the limiter's rate after the bytes
//! reserved before it (a "virtual clock"), then waits until its turn, so the rate holds
//! over any stretch of time whatever the number of callers. A limiter left idle lends at
//! most [`BURST`] of credit, so a pause is not made up by a burst.
//!
//! Where it applies: [`RateLimitedStore`] wraps a repository's object store (puts before
//! they are sent, gets by the bytes they returned), and a local repository's streamed
//! pack writes take their bytes from the same limiter ([`crate::Storage::stream_new`]).
//! On a backup host serving a database host's agent (`pg-remote`), the repository is the
//! backup host's, so its limit covers the agent's bytes too.

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Credit an idle limiter lends: a caller after a pause may go this far ahead of the rate.
pub const BURST: Duration = Duration::from_millis(100);

/// The process's shared limiters, by name and rate.
type Limiters = HashMap<(String, u64), Arc<RateLimiter>>;

/// A token bucket over a virtual clock, shared by the callers it limits.
#[derive(Debug)]
pub struct RateLimiter {
    bytes_per_second: u64,
    /// When the bytes reserved so far will have passed at the limit.
    next_free: Mutex<Instant>,
}

impl RateLimiter {
    pub fn new(bytes_per_second: u64) -> RateLimiter {
        RateLimiter {
            bytes_per_second: bytes_per_second.max(1),
            next_free: Mutex::new(Instant::now()),
        }
    }

    /// The process's limiter named `name` at `bytes_per_second`: every open of one
    /// repository (or of the data directory) in a process shares one.
    pub fn shared(name: &str, bytes_per_second: u64) -> Arc<RateLimiter> {
        static ALL: OnceLock<Mutex<Limiters>> = OnceLock::new();
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .expect("rate limiters");
        all.entry((name.to_string(), bytes_per_second))
            .or_insert_with(|| Arc::new(RateLimiter::new(bytes_per_second)))
            .clone()
    }

    pub fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }

    /// Reserve `bytes`: how long the caller must wait before moving them.
    fn reserve(&self, bytes: u64) -> Duration {
        let now = Instant::now();
        let mut next = self.next_free.lock().expect("rate limiter");
        let start = (*next).max(now.checked_sub(BURST).unwrap_or(now));
        let took = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second as f64);
        *next = start + took;
        // The bytes go at the end of their slot: a caller never runs ahead of the rate
        // by more than the burst lent after a pause.
        next.saturating_duration_since(now)
    }

    /// Wait (asynchronously) until `bytes` may move.
    pub async fn acquire(&self, bytes: u64) {
        let wait = self.reserve(bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Wait (blocking this thread) until `bytes` may move: for writers on blocking threads.
    pub fn acquire_blocking(&self, bytes: u64) {
        let wait = self.reserve(bytes);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

/// An object store whose puts and gets take their bytes from a [`RateLimiter`].
#[derive(Debug)]
pub struct RateLimitedStore {
    inner: Arc<dyn ObjectStore>,
    limiter: Arc<RateLimiter>,
}

impl RateLimitedStore {
    pub fn new(inner: Arc<dyn ObjectStore>, limiter: Arc<RateLimiter>) -> RateLimitedStore {
        RateLimitedStore { inner, limiter }
    }
}

impl std::fmt::Display for RateLimitedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RateLimited({}, {} B/s)",
            self.inner, self.limiter.bytes_per_second
        )
    }
}

#[async_trait]
impl ObjectStore for RateLimitedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.limiter.acquire(payload.content_length() as u64).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        // Not used by pgstrata (objects are put whole); passed through unlimited.
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let head = options.head;
        let got = self.inner.get_opts(location, options).await?;
        if !head {
            self.limiter.acquire(got.range.end - got.range.start).await;
        }
        Ok(got)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four callers sharing one limiter move their bytes at the limit together, not four
    /// times it; after a pause, no more than the burst is lent.
    #[test]
    fn callers_sharing_a_limiter_move_their_sum_at_the_limit() {
        let limiter = Arc::new(RateLimiter::new(4 << 20)); // 4 MiB/s
        let started = Instant::now();
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let l = limiter.clone();
                std::thread::spawn(move || (0..8).for_each(|_| l.acquire_blocking(64 << 10)))
            })
            .collect();
        workers.into_iter().for_each(|w| w.join().unwrap());
        // 4 x 8 x 64 KiB = 2 MiB at 4 MiB/s: 0.5 s, less the burst lent at the start.
        let took = started.elapsed().as_secs_f64();
        assert!(took >= 0.5 - BURST.as_secs_f64() - 0.02, "{took}");
        assert!(took < 1.5, "{took}");
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        limiter.acquire_blocking(1 << 20); // 0.25 s worth
        let took = started.elapsed().as_secs_f64();
        assert!(
            took >= 0.25 - BURST.as_secs_f64() - 0.02,
            "the pause is not credited: {took}"
        );
    }
}
