//! The side that holds a repository: serve it to one peer over a byte stream.
//!
//! [`serve_repo`] is `pgstrata agent repo` on the backup host (repo-remote): it serves the
//! repository directory there, on the same local-directory store a local repository uses
//! (`object_store`'s `LocalFileSystem` with fsync), so a write is on disk before it is
//! acknowledged and a create-only write of an existing object is refused. [`serve`] is
//! the loop itself, over any store: the backup host also runs it to serve its repository
//! (local or an object store) to `pgstrata agent run` on the database host (pg-remote).
//!
//! The peer is not trusted with the repository ([`Policy`]): it reaches only the stanzas
//! it is served, and only adds to them. It creates objects (create-only), reads and lists
//! them, and deletes only what it created on this connection (its lock, staging and
//! resume files). So a database host taken over can neither erase nor overwrite a backup,
//! nor read another stanza's; expire, key removal and the like run on the backup host.
//!
//! Requests run concurrently (up to [`CONCURRENCY`]) and answers go back as they
//! complete. The bytes held for a peer, requests read and answers not yet written, are
//! bounded by a budget ([`Serving::buffer_max`]): a peer that sends requests without
//! reading the answers stalls, it does not grow the holder. Reading and writing the stream
//! are blocking threads (pipes); the requests run on the caller's tokio runtime. When the
//! peer closes the stream the agent finishes what it started and returns.

use crate::client::hello;
use crate::error::{Error, ErrorKind};
use crate::protocol::{self, Answer, Done, Failure, FailureKind, Message, Meta, Op, Request};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::{
    GetOptions, GetRange, GetResult, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload,
};
use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Requests served at once: enough to keep a disk and the link busy, few enough that a
/// peer sending a restore's worth of reads does not make the agent hold them all.
pub const CONCURRENCY: usize = 32;

/// Default of [`Serving::buffer_max`] (the option `agent-buffer-max`).
pub const DEFAULT_BUFFER_MAX: u64 = 256 << 20;

/// What a holder needs to serve [`Op::PutPatch`]: the object a patch makes from an object
/// it holds. The protocol does not know what objects are; pgstrata's repository crate
/// implements this for manifests (a new manifest sent as its difference from the prior
/// one, which the holder rebuilds, compresses and seals itself).
#[async_trait::async_trait]
pub trait Rebuild: Send + Sync {
    /// The bytes to store from `patch` and `base` (the object stored as `base_key`); the
    /// result is sealed, when the repository is encrypted, under the name `seal_as`.
    /// An error (kind [`ErrorKind::Rebuild`]) says why the patch cannot be applied here:
    /// the requester then sends the object whole.
    async fn rebuild(
        &self,
        base_key: &str,
        base: Bytes,
        seal_as: &str,
        patch: Bytes,
    ) -> crate::Result<Bytes>;
}

/// What a holder needs to answer the reads of a peer that holds a session key rather than
/// the stanza's master keys (the agent of a `pg-remote` backup of an encrypted stanza):
/// each whole object read is opened here and sealed again under the peer's session key.
/// pgstrata's repository crate implements it (`cipher::SessionReseal`). Such a peer's
/// `unless_hash` names the object's plain content: what it was sent last time was sealed
/// under another salt or session.
pub trait Reseal: Send + Sync {
    /// The plain content of the object stored as `key`, or `None` when it is not sealed
    /// whole (packs, key files: sent as stored).
    fn open(&self, key: &str, stored: &[u8]) -> crate::Result<Option<Vec<u8>>>;
    /// `plain` sealed under the peer's session key as the object `key`.
    fn seal(&self, key: &str, plain: &[u8]) -> crate::Result<Vec<u8>>;
    /// The frame stored at `offset` of pack `key`, opened (still compressed): a prior
    /// backup's frame the peer reads (a file map).
    fn open_frame(&self, key: &str, offset: u64, stored: &[u8]) -> crate::Result<Vec<u8>>;
}

/// BLAKE3 of an object's bytes as the protocol carries it (hex).
pub fn object_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// What a peer may do to the repository it is served: the stanzas it is given, append-only.
///
/// - every key (and `to`, `base`) lies inside one of `stanzas` (its first path segment);
///   a listing of the whole repository shows those stanzas' objects alone;
/// - `put`, `copy` and `put_patch` are create-only: an overwrite is refused;
/// - `delete` removes only an object this connection created.
///
/// Refusals answer `permission_denied` and change nothing.
pub struct Policy {
    stanzas: Vec<String>,
    created: Mutex<HashSet<String>>,
}

impl Policy {
    /// Serve `stanzas` (each a stanza name) append-only.
    pub fn append_only(stanzas: Vec<String>) -> Policy {
        Policy {
            stanzas,
            created: Mutex::new(HashSet::new()),
        }
    }

    fn in_stanzas(&self, key: &str) -> bool {
        let first = key.split('/').next().unwrap_or_default();
        self.stanzas.iter().any(|s| s == first)
    }

    fn refuse(&self, why: String) -> Failure {
        Failure {
            kind: FailureKind::PermissionDenied,
            message: format!(
                "refused by the repository's holder, which serves stanza {} append-only: {why}",
                self.stanzas.join(", ")
            ),
        }
    }

    /// Ok when `req` may be served; else the refusal to answer.
    fn admit(&self, req: &Request) -> Result<(), Failure> {
        let listing = matches!(req.op, Op::List | Op::ListDirs);
        let mut keys = vec![req.key.as_str()];
        keys.extend(req.to.as_deref());
        keys.extend(req.base.as_deref());
        for k in keys {
            let whole_repository_listing = listing && k.is_empty();
            if !whole_repository_listing && !self.in_stanzas(k) {
                return Err(self.refuse(format!("'{k}' is outside them")));
            }
        }
        let creates = matches!(req.op, Op::Put | Op::Copy | Op::PutPatch);
        if creates && !req.create_only {
            return Err(self.refuse(format!("{:?} would overwrite '{}'", req.op, req.key)));
        }
        if req.op == Op::Delete && !self.created.lock().unwrap().contains(&req.key) {
            return Err(self.refuse(format!(
                "'{}' was not created on this connection and is not deleted",
                req.key
            )));
        }
        Ok(())
    }

    /// Record what `req`, served, created or deleted.
    fn served(&self, req: &Request) {
        let mut created = self.created.lock().unwrap();
        match req.op {
            Op::Put => {
                created.insert(req.key.clone());
            }
            Op::Copy => {
                created.extend(req.to.clone());
            }
            Op::PutPatch => {
                created.insert(req.key.clone());
                created.extend(req.to.clone());
            }
            Op::Delete => {
                created.remove(&req.key);
            }
            Op::Get | Op::List | Op::ListDirs => {}
        }
    }

    /// A whole-repository listing narrowed to the served stanzas.
    fn narrow(&self, answer: &mut Answer) {
        answer.objects.retain(|m| self.in_stanzas(&m.key));
        answer.prefixes.retain(|p| self.in_stanzas(p));
    }
}

/// A bound on the bytes a holder keeps for its peer, counted in KiB permits.
#[derive(Clone)]
struct Budget {
    permits: Arc<Semaphore>,
    total_kib: u32,
}

impl Budget {
    fn new(bytes: u64) -> Budget {
        // `acquire_many` takes a u32 of permits: KiB units keep any sane budget (up to
        // 4 TiB) within it.
        let total_kib = (bytes / 1024).clamp(1, u32::MAX as u64) as u32;
        Budget {
            permits: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    /// KiB permits for `bytes`: one object larger than the whole budget waits until it
    /// has it all, then goes alone.
    fn kib(&self, bytes: u64) -> u32 {
        (bytes.div_ceil(1024)).clamp(1, self.total_kib as u64) as u32
    }

    async fn reserve(&self, bytes: u64) -> OwnedSemaphorePermit {
        self.permits
            .clone()
            .acquire_many_owned(self.kib(bytes))
            .await
            .expect("never closed")
    }
}

/// A repository and how to serve it to one peer.
pub struct Serving {
    pub store: Arc<dyn ObjectStore>,
    /// Serves `put_patch` (without it: `not_supported`).
    pub rebuild: Option<Arc<dyn Rebuild>>,
    /// Reseals whole-object reads for a peer holding a session key (without it: sent as
    /// stored).
    pub reseal: Option<Arc<dyn Reseal>>,
    pub policy: Policy,
    /// Bytes held at most for the peer: request bodies read and answers not yet written.
    pub buffer_max: u64,
}

/// `pgstrata agent repo`: exchange hellos on stdin/stdout, then serve the repository in
/// `root` (created, 0750, when missing) under `policy` until the client closes the stream.
/// Errors are for the agent's stderr, which SSH passes to the client's.
pub async fn serve_repo(
    root: &Path,
    rebuild: Option<Arc<dyn Rebuild>>,
    policy: Policy,
    buffer_max: u64,
) -> crate::Result<()> {
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    hello(&mut input, &mut output, "the client", true)?;
    drop((input, output));
    create_repo_dir(root)?;
    let store: Arc<dyn ObjectStore> = Arc::new(
        LocalFileSystem::new_with_prefix(root)
            .map_err(|e| {
                let what = format!("agent: open repository {}", root.display());
                Error::with_source(ErrorKind::Io, what, e)
            })?
            .with_fsync(true)
            .with_automatic_cleanup(true),
    );
    let serving = Serving {
        store,
        rebuild,
        reseal: None,
        policy,
        buffer_max,
    };
    serve(serving, std::io::stdin(), std::io::stdout()).await?;
    Ok(())
}

/// An answer: its frame's head, its body, and the budget they hold until written.
type Outgoing = (Vec<u8>, Bytes, Option<OwnedSemaphorePermit>);

/// Serve `serving` to the peer at the other end of `input`/`output` (hellos already
/// exchanged) until it closes the stream (`None`) or, in an `agent run`, sends the
/// job's [`Done`].
pub async fn serve(
    serving: Serving,
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
) -> crate::Result<Option<Done>> {
    let budget = Budget::new(serving.buffer_max);
    let serving = Arc::new(serving);
    // The reader thread takes room in the budget for each frame before reading it, and
    // hands frames to this task; the writer thread sends answers and frees their room.
    let mut incoming = spawn_reader(input, budget.clone());
    let (answers, writer) = spawn_writer(output);

    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    let outcome = loop {
        let (message, body, room) = match incoming.recv().await {
            Some(Ok(Some(f))) => f,
            Some(Ok(None)) | None => break Ok(None),
            Some(Err(e)) => {
                break Err(Error::with_source(
                    ErrorKind::Link,
                    "agent: read a request",
                    e,
                ))
            }
        };
        let req = match message {
            Message::Request(r) => r,
            Message::Done(d) => break Ok(Some(d)),
            other => {
                let what = format!("agent: unexpected message {other:?}");
                break Err(Error::new(ErrorKind::Protocol, what));
            }
        };
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let (serving, budget, answers) = (serving.clone(), budget.clone(), answers.clone());
        tasks.spawn(async move {
            let (answer, body, answer_room) = handle(&serving, &budget, req, body).await;
            drop(room);
            let head = protocol::frame_head(&Message::Answer(answer), body.len());
            // A blocking send on a bounded queue: answers wait for the link, not memory.
            let _ =
                tokio::task::spawn_blocking(move || answers.send((head, body, answer_room))).await;
            drop(permit);
        });
        // Reap finished tasks as we go so the set does not grow with the session.
        while tasks.try_join_next().is_some() {}
    };
    while tasks.join_next().await.is_some() {}
    drop(answers);
    join_writer(writer).await?;
    outcome
}

/// A frame as [`serve`]'s reader thread hands it over: the message, its body and the budget
/// they hold; `None` at the end of the stream.
type Incoming = std::io::Result<Option<(Message, Bytes, OwnedSemaphorePermit)>>;

/// Start [`serve`]'s reader thread: it takes room in `budget` for each frame of `input`
/// before reading it, and sends the frames on (the last one an end or an error).
fn spawn_reader(input: impl Read + Send + 'static, budget: Budget) -> mpsc::Receiver<Incoming> {
    let (frames_in, incoming) = mpsc::channel::<Incoming>(4);
    let runtime = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        let mut input = std::io::BufReader::with_capacity(1 << 20, input);
        loop {
            let f = protocol::read_frame_reserving(&mut input, |len| {
                runtime.block_on(budget.reserve(len as u64))
            });
            let last = !matches!(f, Ok(Some(_)));
            if frames_in.blocking_send(f).is_err() || last {
                return;
            }
        }
    });
    incoming
}

/// Start [`serve`]'s writer thread: it writes the answers sent to it to `output` (flushing
/// whenever none is waiting) and frees their room, until every sender is dropped.
fn spawn_writer(
    output: impl Write + Send + 'static,
) -> (
    std::sync::mpsc::SyncSender<Outgoing>,
    std::thread::JoinHandle<std::io::Result<()>>,
) {
    let (answers, outgoing) = std::sync::mpsc::sync_channel::<Outgoing>(CONCURRENCY);
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, output);
        loop {
            let (head, body, room) = match outgoing.try_recv() {
                Ok(f) => f,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    out.flush()?;
                    match outgoing.recv() {
                        Ok(f) => f,
                        Err(_) => break,
                    }
                }
            };
            out.write_all(&head)?;
            out.write_all(&body)?;
            drop((body, room));
        }
        out.flush()
    });
    (answers, writer)
}

/// Wait for [`serve`]'s writer thread (its senders dropped): how its writing ended. A peer
/// that is gone (a broken pipe) is nobody to tell, not a failure.
async fn join_writer(writer: std::thread::JoinHandle<std::io::Result<()>>) -> crate::Result<()> {
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| Error::with_source(ErrorKind::Link, "agent: writer", e))?;
    match written {
        Ok(Ok(())) => Ok(()),
        // The peer is gone: nobody to tell.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Ok(Err(e)) => Err(Error::with_source(
            ErrorKind::Link,
            "agent: write an answer",
            e,
        )),
        Err(_) => Err(Error::new(
            ErrorKind::Link,
            "agent: the writer thread panicked",
        )),
    }
}

fn create_repo_dir(root: &Path) -> crate::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(root)
        .map_err(|e| {
            let what = format!("agent: create repository directory {}", root.display());
            Error::with_source(ErrorKind::Io, what, e)
        })
}

fn meta_of(m: &ObjectMeta) -> Meta {
    Meta {
        key: m.location.to_string(),
        size: m.size,
        modified_ns: m.last_modified.timestamp_nanos_opt().unwrap_or(0),
        e_tag: m.e_tag.clone(),
    }
}

fn failure(e: object_store::Error) -> Failure {
    use object_store::Error as E;
    let kind = match &e {
        E::NotFound { .. } => FailureKind::NotFound,
        E::AlreadyExists { .. } => FailureKind::AlreadyExists,
        E::Precondition { .. } => FailureKind::Precondition,
        E::NotSupported { .. } | E::NotImplemented { .. } => FailureKind::NotSupported,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => FailureKind::PermissionDenied,
        E::InvalidPath { .. } => FailureKind::InvalidPath,
        _ => FailureKind::Other,
    };
    Failure {
        kind,
        message: e.to_string(),
    }
}

/// Serve one request: its answer, the answer's body, and the budget the body holds.
async fn handle(
    serving: &Serving,
    budget: &Budget,
    req: Request,
    body: Bytes,
) -> (Answer, Bytes, Option<OwnedSemaphorePermit>) {
    let id = req.id;
    let refused = |f: Failure| {
        let answer = Answer {
            id,
            error: Some(f),
            ..Default::default()
        };
        (answer, Bytes::new(), None)
    };
    if let Err(f) = serving.policy.admit(&req) {
        log::warn!("{}", f.message);
        return refused(f);
    }
    match serve_one(serving, budget, &req, body).await {
        Ok(mut r) => {
            serving.policy.served(&req);
            if matches!(req.op, Op::List | Op::ListDirs) && req.key.is_empty() {
                serving.policy.narrow(&mut r.0);
            }
            r
        }
        Err(e) => refused(failure(e)),
    }
}

/// The bytes of a read, once the budget has room for them (the object's size is known
/// before its bytes are read).
async fn read_within(
    budget: &Budget,
    r: GetResult,
) -> object_store::Result<(Bytes, OwnedSemaphorePermit)> {
    let room = budget.reserve(r.range.end - r.range.start).await;
    Ok((r.bytes().await?, room))
}

/// An answer with its body and the budget the body holds.
type Answered = (Answer, Bytes, Option<OwnedSemaphorePermit>);

/// A failure of the blocking task that opens or reseals, or of the opening or resealing,
/// as the store's error the peer is answered with.
fn agent_failure(
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> object_store::Error {
    object_store::Error::Generic {
        store: "agent",
        source: source.into(),
    }
}

/// A create-only or overwriting put.
fn create_or_overwrite(create_only: bool) -> PutOptions {
    PutOptions {
        mode: if create_only {
            PutMode::Create
        } else {
            PutMode::Overwrite
        },
        ..Default::default()
    }
}

async fn serve_one(
    serving: &Serving,
    budget: &Budget,
    req: &Request,
    body: Bytes,
) -> object_store::Result<Answered> {
    let store = &*serving.store;
    let path = |k: &str| ObjPath::parse(k).map_err(object_store::Error::from);
    let mut answer = Answer {
        id: req.id,
        ..Default::default()
    };
    let key = path(&req.key)?;
    match req.op {
        Op::Put => {
            let opts = create_or_overwrite(req.create_only);
            let r = store.put_opts(&key, PutPayload::from(body), opts).await?;
            answer.e_tag = r.e_tag;
            Ok((answer, Bytes::new(), None))
        }
        Op::Get if req.open_frames.is_some() => {
            get_opened_frames(serving, budget, req, &key, answer).await
        }
        Op::Get => get(serving, budget, req, &key, answer).await,
        Op::List => {
            let prefix = (!req.key.is_empty()).then_some(&key);
            answer.objects = store
                .list(prefix)
                .map_ok(|m| meta_of(&m))
                .try_collect()
                .await?;
            Ok((answer, Bytes::new(), None))
        }
        Op::ListDirs => {
            let prefix = (!req.key.is_empty()).then_some(&key);
            let r = store.list_with_delimiter(prefix).await?;
            answer.objects = r.objects.iter().map(meta_of).collect();
            answer.prefixes = r.common_prefixes.iter().map(|p| p.to_string()).collect();
            Ok((answer, Bytes::new(), None))
        }
        Op::Delete => {
            store.delete(&key).await?;
            Ok((answer, Bytes::new(), None))
        }
        // An independent object, never the store's own copy: a local directory's is a
        // hard link, and the one caller (a manifest's second copy, `put_new_twice`) needs
        // two files. It costs a read on this host, not the bytes crossing the line again.
        Op::Copy => {
            let to = path(req.to.as_deref().unwrap_or_default())?;
            let (bytes, _room) = read_within(budget, store.get(&key).await?).await?;
            let opts = create_or_overwrite(req.create_only);
            store.put_opts(&to, PutPayload::from(bytes), opts).await?;
            Ok((answer, Bytes::new(), None))
        }
        Op::PutPatch => put_patch(serving, budget, req, &key, body, answer).await,
    }
}

/// [`Op::Get`] with `open_frames`: the frames named, read with one ranged read, each opened
/// with the holder's keys and sent with its length before it.
async fn get_opened_frames(
    serving: &Serving,
    budget: &Budget,
    req: &Request,
    key: &ObjPath,
    mut answer: Answer,
) -> object_store::Result<Answered> {
    let frames = req.open_frames.as_deref().unwrap_or_default();
    let Some(reseal) = &serving.reseal else {
        return Err(object_store::Error::NotSupported {
            source: "this holder opens no frames: read them as stored".into(),
        });
    };
    let (Some(start), Some(end)) = (
        frames.iter().map(|f| f[0]).min(),
        frames.iter().map(|f| f[0].saturating_add(f[1])).max(),
    ) else {
        return Ok((answer, Bytes::new(), None));
    };
    let r = serving
        .store
        .get_opts(
            key,
            GetOptions {
                range: Some(GetRange::Bounded(start..end)),
                ..Default::default()
            },
        )
        .await?;
    answer.meta = Some(meta_of(&r.meta));
    let (stored, room) = read_within(budget, r).await?;
    let (reseal, key, frames) = (reseal.clone(), req.key.clone(), frames.to_vec());
    let body = tokio::task::spawn_blocking(move || {
        let mut body = Vec::with_capacity(stored.len());
        for [offset, len] in frames {
            let lo = (offset - start) as usize;
            let frame = stored.get(lo..lo + len as usize).ok_or_else(|| {
                crate::Error::new(
                    crate::ErrorKind::Reseal,
                    format!("{key}: the frame at {offset} lies past the object"),
                )
            })?;
            let opened = reseal.open_frame(&key, offset, frame)?;
            body.extend_from_slice(&(opened.len() as u32).to_be_bytes());
            body.extend_from_slice(&opened);
        }
        Ok::<_, crate::Error>(Bytes::from(body))
    })
    .await
    .map_err(agent_failure)?
    .map_err(agent_failure)?;
    Ok((answer, body, Some(room)))
}

/// [`Op::Get`]: an object's head, a range of it, or the whole of it (resealed for the
/// requester where the holder reseals; not sent when the requester holds it already).
async fn get(
    serving: &Serving,
    budget: &Budget,
    req: &Request,
    key: &ObjPath,
    mut answer: Answer,
) -> object_store::Result<Answered> {
    let opts = GetOptions {
        head: req.head_only,
        range: req.range.map(|[a, b]| GetRange::Bounded(a..b)),
        ..Default::default()
    };
    let whole = opts.range.is_none() && !opts.head;
    let r = serving.store.get_opts(key, opts).await?;
    answer.meta = Some(meta_of(&r.meta));
    answer.range = Some([r.range.start, r.range.end]);
    if req.head_only {
        return Ok((answer, Bytes::new(), None));
    }
    let (bytes, room) = read_within(budget, r).await?;
    if let (true, Some(reseal)) = (whole, &serving.reseal) {
        let (reseal, key, unless) = (reseal.clone(), req.key.clone(), req.unless_hash.clone());
        let resealed = tokio::task::spawn_blocking(move || {
            let Some(plain) = reseal.open(&key, &bytes)? else {
                return Ok(Some(bytes));
            };
            if unless.as_deref() == Some(&object_hash(&plain)) {
                return Ok(None);
            }
            reseal.seal(&key, &plain).map(|b| Some(Bytes::from(b)))
        })
        .await
        .map_err(agent_failure)?
        .map_err(|m: crate::Error| agent_failure(m))?;
        let Some(resealed) = resealed else {
            answer.unchanged = true;
            return Ok((answer, Bytes::new(), None));
        };
        let len = resealed.len() as u64;
        answer.range = Some([0, len]);
        if let Some(meta) = &mut answer.meta {
            meta.size = len;
        }
        return Ok((answer, resealed, Some(room)));
    }
    // The requester holds these bytes already: say so instead of sending them.
    if whole && req.unless_hash.as_deref() == Some(&object_hash(&bytes)) {
        answer.unchanged = true;
        return Ok((answer, Bytes::new(), None));
    }
    Ok((answer, bytes, Some(room)))
}

/// [`Op::PutPatch`]: the object rebuilt from its base and the patch in `body`, stored
/// create-only at `key` and at the request's `to`; the answer carries its hash.
async fn put_patch(
    serving: &Serving,
    budget: &Budget,
    req: &Request,
    key: &ObjPath,
    body: Bytes,
    mut answer: Answer,
) -> object_store::Result<Answered> {
    let store = &*serving.store;
    let path = |k: &str| ObjPath::parse(k).map_err(object_store::Error::from);
    let (Some(rebuild), Some(base), Some(to)) = (&serving.rebuild, &req.base, &req.to) else {
        return Err(object_store::Error::NotSupported {
            source: "this agent rebuilds no patched objects: send the object whole".into(),
        });
    };
    let to = path(to)?;
    let (base_bytes, _room) = read_within(budget, store.get(&path(base)?).await?).await?;
    let bytes = rebuild
        .rebuild(base, base_bytes, to.as_ref(), body)
        .await
        .map_err(|e| object_store::Error::NotSupported { source: e.into() })?;
    store
        .put_opts(
            key,
            PutPayload::from(bytes.clone()),
            create_or_overwrite(true),
        )
        .await?;
    store
        .put_opts(
            &to,
            PutPayload::from(bytes.clone()),
            create_or_overwrite(true),
        )
        .await?;
    answer.hash = Some(object_hash(&bytes));
    Ok((answer, Bytes::new(), None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::RemoteStore;
    use object_store::{CopyMode, CopyOptions, ObjectStoreExt};

    type Served = tokio::task::JoinHandle<crate::Result<Option<Done>>>;

    /// `store` served by [`serve`], append-only for `stanzas`, over two OS pipes: the
    /// server, the pipe its answers come out of, and the pipe requests go into.
    fn served_over_pipes(
        store: Arc<dyn ObjectStore>,
        rebuild: Option<Arc<dyn Rebuild>>,
        stanzas: &[&str],
    ) -> (Served, std::io::PipeReader, std::io::PipeWriter) {
        let (to_agent_r, to_agent_w) = std::io::pipe().unwrap();
        let (to_client_r, to_client_w) = std::io::pipe().unwrap();
        let serving = Serving {
            store,
            rebuild,
            reseal: None,
            policy: Policy::append_only(stanzas.iter().map(|s| s.to_string()).collect()),
            buffer_max: DEFAULT_BUFFER_MAX,
        };
        let server = tokio::spawn(serve(serving, to_agent_r, to_client_w));
        (server, to_client_r, to_agent_w)
    }

    /// `store` served by [`serve`] over two OS pipes (stanzas `stanza` and `s`), and the
    /// RemoteStore at their other end.
    fn served(
        store: Arc<dyn ObjectStore>,
        rebuild: Option<Arc<dyn Rebuild>>,
    ) -> (Served, RemoteStore) {
        let (server, answers, requests) = served_over_pipes(store, rebuild, &["stanza", "s"]);
        (server, RemoteStore::origin(answers, requests))
    }

    /// Asserts that `result` failed with the object store error `$kind`.
    macro_rules! assert_kind {
        ($result:expr, $kind:ident) => {{
            let err = $result.unwrap_err();
            assert!(matches!(err, object_store::Error::$kind { .. }), "{err}");
        }};
    }

    fn create() -> PutOptions {
        PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        }
    }

    /// A RemoteStore talking to `serve` over two OS pipes: puts, create-only refusals,
    /// ranged gets, lists and deletes arrive as the local store does them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_served_over_pipes_behaves_as_the_local_one() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let (server, remote) = served(local, None);
        let p = ObjPath::from("stanza/obj");
        remote
            .put_opts(&p, PutPayload::from_static(b"0123456789"), create())
            .await
            .unwrap();
        assert_kind!(
            remote
                .put_opts(&p, PutPayload::from_static(b"x"), create())
                .await,
            AlreadyExists
        );
        let part = remote.get_range(&p, 2..5).await.unwrap();
        assert_eq!(&part[..], b"234");
        let listed: Vec<_> = remote.list(None).try_collect().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].size, 10);
        // A copy is a file of its own (the local store's would be a hard link), and a
        // create-only copy onto an existing object is refused.
        let copied = ObjPath::from("stanza/copied");
        let create_copy = CopyOptions::new().with_mode(CopyMode::Create);
        remote
            .copy_opts(&p, &copied, create_copy.clone())
            .await
            .unwrap();
        assert_eq!(
            &remote.get(&copied).await.unwrap().bytes().await.unwrap()[..],
            b"0123456789"
        );
        use std::os::unix::fs::MetadataExt;
        let links = std::fs::metadata(dir.path().join("stanza/copied"))
            .unwrap()
            .nlink();
        assert_eq!(links, 1, "the copy is a hard link");
        assert_kind!(
            remote.copy_opts(&p, &copied, create_copy).await,
            AlreadyExists
        );
        remote.delete(&copied).await.unwrap();
        remote.delete(&p).await.unwrap();
        assert_kind!(remote.get(&p).await, NotFound);
        remote
            .finish(Done {
                exit_code: 7,
                ..Default::default()
            })
            .await
            .unwrap();
        let done = server.await.unwrap().unwrap().unwrap();
        assert_eq!(done.exit_code, 7);
    }

    /// Appends the patch to the base: enough to see what the holder was given.
    struct Append;

    #[async_trait::async_trait]
    impl Rebuild for Append {
        async fn rebuild(
            &self,
            base_key: &str,
            base: Bytes,
            seal_as: &str,
            patch: Bytes,
        ) -> crate::Result<Bytes> {
            if &patch[..] == b"refuse" {
                return Err(Error::new(ErrorKind::Rebuild, "cannot"));
            }
            Ok(Bytes::from(
                [
                    &base[..],
                    b"+",
                    &patch[..],
                    b" from ",
                    base_key.as_bytes(),
                    b" as ",
                    seal_as.as_bytes(),
                ]
                .concat(),
            ))
        }
    }

    /// A get that names the hash of the bytes the requester holds moves no body while they
    /// are the object's; a patched put writes both objects with what the holder rebuilt,
    /// and a holder without a rebuilder, or one that cannot, writes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unchanged_objects_and_patches_do_not_cross_whole() {
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let (server, remote) = served(local.clone(), Some(Arc::new(Append)));
        let base = ObjPath::from("s/base");
        remote
            .put_opts(&base, PutPayload::from_static(b"BASE"), create())
            .await
            .unwrap();

        let same = remote
            .get_unless_hash(&base, &object_hash(b"BASE"))
            .await
            .unwrap();
        assert!(same.is_none(), "unchanged bytes were sent");
        let other = remote
            .get_unless_hash(&base, &object_hash(b"old"))
            .await
            .unwrap();
        assert_eq!(other.as_deref(), Some(&b"BASE"[..]));

        let (first, second) = (ObjPath::from("s/new.copy"), ObjPath::from("s/new"));
        let hash = remote
            .put_patch(&first, &second, &base, b"DELTA")
            .await
            .unwrap();
        let want = b"BASE+DELTA from s/base as s/new";
        for p in [&first, &second] {
            let got = local.get(p).await.unwrap().bytes().await.unwrap();
            assert_eq!(&got[..], want);
        }
        assert_eq!(hash, object_hash(want));
        // Create-only: a second patched write of the same objects is refused.
        assert_kind!(
            remote.put_patch(&first, &second, &base, b"DELTA").await,
            AlreadyExists
        );
        // A rebuild that fails writes nothing and says the patch is not supported.
        let (f2, s2) = (ObjPath::from("s/n2.copy"), ObjPath::from("s/n2"));
        assert_kind!(
            remote.put_patch(&f2, &s2, &base, b"refuse").await,
            NotSupported
        );
        assert!(local.head(&f2).await.is_err() && local.head(&s2).await.is_err());
        remote.finish(Done::default()).await.unwrap();
        server.await.unwrap().unwrap();

        // Without a rebuilder: not supported, nothing written.
        let (server, remote) = served(local.clone(), None);
        assert_kind!(
            remote.put_patch(&f2, &s2, &base, b"DELTA").await,
            NotSupported
        );
        assert!(local.head(&f2).await.is_err());
        remote.finish(Done::default()).await.unwrap();
        server.await.unwrap().unwrap();
    }

    /// A hostile peer's requests, as raw frames: each one outside the policy is refused
    /// with `permission_denied` and changes nothing; what the policy allows still works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_reaches_its_stanzas_only_and_only_adds() {
        let dir = tempfile::tempdir().unwrap();
        for (k, v) in [("main/backup.manifest", "M"), ("other/stanza.json", "O")] {
            let p = dir.path().join(k);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
        let local: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let (server, mut to_client_r, mut to_agent_w) = served_over_pipes(local, None, &["main"]);
        let mut next_id = 0;
        let mut ask = move |op: Op, key: &str, to: Option<&str>, create_only: bool, body: &[u8]| {
            next_id += 1;
            let req = Request {
                id: next_id,
                to: to.map(str::to_string),
                create_only,
                ..Request::new(op, key)
            };
            to_agent_w
                .write_all(&protocol::frame(&Message::Request(req), body))
                .unwrap();
            match protocol::read_frame(&mut to_client_r).unwrap() {
                Some((Message::Answer(a), body)) => (a, body),
                other => panic!("{other:?}"),
            }
        };
        let denied = |a: &Answer| {
            a.error
                .as_ref()
                .is_some_and(|e| e.kind == FailureKind::PermissionDenied)
        };
        let forbidden: &[(Op, &str, Option<&str>, bool)] = &[
            (Op::Put, "main/backup.manifest", None, false),
            (Op::Put, "other/stanza.json", None, true),
            (Op::Put, "other/new", None, true),
            (Op::Delete, "main/backup.manifest", None, false),
            (Op::Delete, "other/stanza.json", None, false),
            (Op::Copy, "main/backup.manifest", Some("main/x"), false),
            (Op::Copy, "other/stanza.json", Some("main/stolen"), true),
            (Op::Get, "other/stanza.json", None, false),
            (Op::List, "other", None, false),
            (Op::ListDirs, "other/", None, false),
            (Op::Get, "../etc/passwd", None, false),
            (Op::Get, "main/../other/stanza.json", None, false),
        ];
        for &(op, key, to, create_only) in forbidden {
            let (a, body) = ask(op, key, to, create_only, b"EVIL");
            assert!(
                a.error.is_some() && body.is_empty(),
                "{op:?} {key} was served: {a:?}"
            );
            if !key.contains("..") {
                assert!(denied(&a), "{op:?} {key}: {a:?}");
            }
        }
        // A listing of the whole repository shows the served stanza alone.
        let (a, _) = ask(Op::List, "", None, false, b"");
        let keys: Vec<_> = a.objects.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["main/backup.manifest"]);
        let (a, _) = ask(Op::ListDirs, "", None, false, b"");
        assert_eq!(a.prefixes, ["main"]);
        // Allowed: read, create, and delete what this connection created.
        let (a, body) = ask(Op::Get, "main/backup.manifest", None, false, b"");
        assert!(a.error.is_none() && &body[..] == b"M", "{a:?}");
        let (a, _) = ask(Op::Put, "main/lock", None, true, b"L");
        assert!(a.error.is_none(), "{a:?}");
        let (a, _) = ask(Op::Delete, "main/lock", None, false, b"");
        assert!(a.error.is_none(), "{a:?}");
        // ... once: deleted, it is no longer this connection's to delete.
        let (a, _) = ask(Op::Delete, "main/lock", None, false, b"");
        assert!(denied(&a), "{a:?}");
        drop(ask);
        server.await.unwrap().unwrap();
        // Nothing changed.
        let read = |k: &str| std::fs::read_to_string(dir.path().join(k)).unwrap();
        assert_eq!(read("main/backup.manifest"), "M");
        assert_eq!(read("other/stanza.json"), "O");
        for gone in ["other/new", "main/x", "main/stolen", "main/lock"] {
            assert!(!dir.path().join(gone).exists(), "{gone} exists");
        }
    }
}
