//! The side that holds a repository: serve it to one peer over a byte stream.
//!
//! [`serve_repo`] is `pgstrata agent repo` on the backup host (repo-remote): it serves the
//! repository directory there, on the same local-directory store a local repository uses
//! (`object_store`'s `LocalFileSystem` with fsync), so a write is on disk before it is
//! acknowledged and a create-only write of an existing object is refused. [`serve`] is
//! the loop itself, over any store: the backup host also runs it to serve its repository
//! (local or an object store) to `pgstrata agent run` on the database host (pg-remote).
//!
//! Requests run concurrently (up to [`CONCURRENCY`]) and answers go back as they
//! complete. Reading and writing the stream are blocking threads (pipes); the requests
//! run on the caller's tokio runtime. When the peer closes the stream the agent finishes
//! what it started and returns.

use crate::client::hello;
use crate::protocol::{self, Answer, Done, Failure, FailureKind, Message, Meta, Op, Request};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::{
    GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

/// Requests served at once: enough to keep a disk and the link busy, few enough that a
/// peer sending a restore's worth of reads does not make the agent hold them all.
pub const CONCURRENCY: usize = 32;

/// What a holder needs to serve [`Op::PutPatch`]: the object a patch makes from an object
/// it holds. The protocol does not know what objects are; pgstrata's repository crate
/// implements this for manifests (a new manifest sent as its difference from the prior
/// one, which the holder rebuilds, compresses and seals itself).
#[async_trait::async_trait]
pub trait Rebuild: Send + Sync {
    /// The bytes to store from `patch` and `base` (the object stored as `base_key`); the
    /// result is sealed, when the repository is encrypted, under the name `seal_as`.
    /// An error says why the patch cannot be applied here: the requester then sends the
    /// object whole.
    async fn rebuild(
        &self,
        base_key: &str,
        base: Bytes,
        seal_as: &str,
        patch: Bytes,
    ) -> Result<Bytes, String>;
}

/// BLAKE3 of an object's bytes as the protocol carries it (hex).
pub fn object_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// `pgstrata agent repo`: exchange hellos on stdin/stdout, then serve the repository in
/// `root` (created, 0750, when missing) until the client closes the stream. Errors are
/// for the agent's stderr, which SSH passes to the client's.
pub async fn serve_repo(root: &Path, rebuild: Option<Arc<dyn Rebuild>>) -> Result<(), String> {
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    hello(&mut input, &mut output, "the client", true)?;
    drop((input, output));
    create_repo_dir(root)?;
    let store: Arc<dyn ObjectStore> = Arc::new(
        LocalFileSystem::new_with_prefix(root)
            .map_err(|e| format!("agent: open repository {}: {e}", root.display()))?
            .with_fsync(true)
            .with_automatic_cleanup(true),
    );
    serve(store, rebuild, std::io::stdin(), std::io::stdout()).await?;
    Ok(())
}

/// Serve `store` to the peer at the other end of `input`/`output` (hellos already
/// exchanged) until it closes the stream (`None`) or, in an `agent run`, sends the
/// command's [`Done`]. `rebuild` serves `put_patch` (without it: `not_supported`).
pub async fn serve(
    store: Arc<dyn ObjectStore>,
    rebuild: Option<Arc<dyn Rebuild>>,
    input: impl Read + Send + 'static,
    output: impl Write + Send + 'static,
) -> Result<Option<Done>, String> {
    // The reader thread hands frames to this task; the writer thread sends answers.
    let (frames_in, mut incoming) = mpsc::channel::<std::io::Result<Option<(Message, Bytes)>>>(4);
    std::thread::spawn(move || {
        let mut input = std::io::BufReader::with_capacity(1 << 20, input);
        loop {
            let f = protocol::read_frame(&mut input);
            let last = !matches!(f, Ok(Some(_)));
            if frames_in.blocking_send(f).is_err() || last {
                return;
            }
        }
    });
    let (answers, outgoing) = std::sync::mpsc::sync_channel::<Vec<u8>>(CONCURRENCY);
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, output);
        loop {
            let frame = match outgoing.try_recv() {
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
            out.write_all(&frame)?;
        }
        out.flush()
    });

    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    let outcome = loop {
        let (message, body) = match incoming.recv().await {
            Some(Ok(Some(f))) => f,
            Some(Ok(None)) | None => break Ok(None),
            Some(Err(e)) => break Err(format!("agent: read a request: {e}")),
        };
        let req = match message {
            Message::Request(r) => r,
            Message::Done(d) => break Ok(Some(d)),
            other => break Err(format!("agent: unexpected message {other:?}")),
        };
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let (store, rebuild, answers) = (store.clone(), rebuild.clone(), answers.clone());
        tasks.spawn(async move {
            let (answer, body) = handle(&*store, rebuild.as_deref(), req, body).await;
            let frame = protocol::frame(&Message::Answer(answer), &body);
            // A blocking send on a bounded queue: answers wait for the link, not memory.
            let _ = tokio::task::spawn_blocking(move || answers.send(frame)).await;
            drop(permit);
        });
        // Reap finished tasks as we go so the set does not grow with the session.
        while tasks.try_join_next().is_some() {}
    };
    while tasks.join_next().await.is_some() {}
    drop(answers);
    let written = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| format!("agent: writer: {e}"))?;
    match written {
        Ok(Ok(())) => {}
        // The peer is gone: nobody to tell.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Ok(Err(e)) => return Err(format!("agent: write an answer: {e}")),
        Err(_) => return Err("agent: the writer thread panicked".into()),
    }
    outcome
}

fn create_repo_dir(root: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(root)
        .map_err(|e| format!("agent: create repository directory {}: {e}", root.display()))
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

async fn handle(
    store: &dyn ObjectStore,
    rebuild: Option<&dyn Rebuild>,
    req: Request,
    body: Bytes,
) -> (Answer, Bytes) {
    let id = req.id;
    match serve_one(store, rebuild, req, body).await {
        Ok(r) => r,
        Err(e) => (
            Answer {
                id,
                error: Some(failure(e)),
                ..Default::default()
            },
            Bytes::new(),
        ),
    }
}

async fn serve_one(
    store: &dyn ObjectStore,
    rebuild: Option<&dyn Rebuild>,
    req: Request,
    body: Bytes,
) -> object_store::Result<(Answer, Bytes)> {
    let path = |k: &str| ObjPath::parse(k).map_err(object_store::Error::from);
    let mut answer = Answer {
        id: req.id,
        ..Default::default()
    };
    let key = path(&req.key)?;
    match req.op {
        Op::Put => {
            let opts = PutOptions {
                mode: if req.create_only {
                    PutMode::Create
                } else {
                    PutMode::Overwrite
                },
                ..Default::default()
            };
            let r = store.put_opts(&key, PutPayload::from(body), opts).await?;
            answer.e_tag = r.e_tag;
            Ok((answer, Bytes::new()))
        }
        Op::Get => {
            let opts = GetOptions {
                head: req.head_only,
                range: req.range.map(|[a, b]| GetRange::Bounded(a..b)),
                ..Default::default()
            };
            let whole = opts.range.is_none() && !opts.head;
            let r = store.get_opts(&key, opts).await?;
            answer.meta = Some(meta_of(&r.meta));
            answer.range = Some([r.range.start, r.range.end]);
            let bytes = if req.head_only {
                Bytes::new()
            } else {
                r.bytes().await?
            };
            // The requester holds these bytes already: say so instead of sending them.
            if whole && req.unless_hash.as_deref() == Some(&object_hash(&bytes)) {
                answer.unchanged = true;
                return Ok((answer, Bytes::new()));
            }
            Ok((answer, bytes))
        }
        Op::List => {
            let prefix = (!req.key.is_empty()).then_some(&key);
            answer.objects = store
                .list(prefix)
                .map_ok(|m| meta_of(&m))
                .try_collect()
                .await?;
            Ok((answer, Bytes::new()))
        }
        Op::ListDirs => {
            let prefix = (!req.key.is_empty()).then_some(&key);
            let r = store.list_with_delimiter(prefix).await?;
            answer.objects = r.objects.iter().map(meta_of).collect();
            answer.prefixes = r.common_prefixes.iter().map(|p| p.to_string()).collect();
            Ok((answer, Bytes::new()))
        }
        Op::Delete => {
            store.delete(&key).await?;
            Ok((answer, Bytes::new()))
        }
        // An independent object, never the store's own copy: a local directory's is a
        // hard link, and the one caller (a manifest's second copy, `put_new_twice`) needs
        // two files. It costs a read on this host, not the bytes crossing the line again.
        Op::Copy => {
            let to = path(req.to.as_deref().unwrap_or_default())?;
            let mode = if req.create_only {
                PutMode::Create
            } else {
                PutMode::Overwrite
            };
            let bytes = store.get(&key).await?.bytes().await?;
            let opts = PutOptions {
                mode,
                ..Default::default()
            };
            store.put_opts(&to, PutPayload::from(bytes), opts).await?;
            Ok((answer, Bytes::new()))
        }
        Op::PutPatch => {
            let (Some(rebuild), Some(base), Some(to)) = (rebuild, &req.base, &req.to) else {
                return Err(object_store::Error::NotSupported {
                    source: "this agent rebuilds no patched objects: send the object whole".into(),
                });
            };
            let to = path(to)?;
            let base_bytes = store.get(&path(base)?).await?.bytes().await?;
            let bytes = rebuild
                .rebuild(base, base_bytes, to.as_ref(), body)
                .await
                .map_err(|m| object_store::Error::NotSupported { source: m.into() })?;
            let create = || PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            store
                .put_opts(&key, PutPayload::from(bytes.clone()), create())
                .await?;
            store
                .put_opts(&to, PutPayload::from(bytes.clone()), create())
                .await?;
            answer.hash = Some(object_hash(&bytes));
            Ok((answer, Bytes::new()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::RemoteStore;
    use object_store::{CopyMode, CopyOptions, ObjectStoreExt};

    type Served = tokio::task::JoinHandle<Result<Option<Done>, String>>;

    /// `store` served by [`serve`] over two OS pipes, and the RemoteStore at their other end.
    fn served(
        store: Arc<dyn ObjectStore>,
        rebuild: Option<Arc<dyn Rebuild>>,
    ) -> (Served, RemoteStore) {
        let (to_agent_r, to_agent_w) = std::io::pipe().unwrap();
        let (to_client_r, to_client_w) = std::io::pipe().unwrap();
        let server = tokio::spawn(serve(store, rebuild, to_agent_r, to_client_w));
        (server, RemoteStore::origin(to_client_r, to_agent_w))
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
            .put(&p, PutPayload::from_static(b"0123456789"))
            .await
            .unwrap();
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let again = remote
            .put_opts(&p, PutPayload::from_static(b"x"), create)
            .await
            .unwrap_err();
        assert!(
            matches!(again, object_store::Error::AlreadyExists { .. }),
            "{again}"
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
        let again = remote
            .copy_opts(&p, &copied, create_copy)
            .await
            .unwrap_err();
        assert!(
            matches!(again, object_store::Error::AlreadyExists { .. }),
            "{again}"
        );
        remote.delete(&copied).await.unwrap();
        remote.delete(&p).await.unwrap();
        let gone = remote.get(&p).await.unwrap_err();
        assert!(
            matches!(gone, object_store::Error::NotFound { .. }),
            "{gone}"
        );
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
        ) -> Result<Bytes, String> {
            if &patch[..] == b"refuse" {
                return Err("cannot".into());
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
            .put(&base, PutPayload::from_static(b"BASE"))
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
        let again = remote
            .put_patch(&first, &second, &base, b"DELTA")
            .await
            .unwrap_err();
        assert!(
            matches!(again, object_store::Error::AlreadyExists { .. }),
            "{again}"
        );
        // A rebuild that fails writes nothing and says the patch is not supported.
        let (f2, s2) = (ObjPath::from("s/n2.copy"), ObjPath::from("s/n2"));
        let refused = remote
            .put_patch(&f2, &s2, &base, b"refuse")
            .await
            .unwrap_err();
        assert!(
            matches!(refused, object_store::Error::NotSupported { .. }),
            "{refused}"
        );
        assert!(local.head(&f2).await.is_err() && local.head(&s2).await.is_err());
        remote.finish(Done::default()).await.unwrap();
        server.await.unwrap().unwrap();

        // Without a rebuilder: not supported, nothing written.
        let (server, remote) = served(local.clone(), None);
        let refused = remote
            .put_patch(&f2, &s2, &base, b"DELTA")
            .await
            .unwrap_err();
        assert!(
            matches!(refused, object_store::Error::NotSupported { .. }),
            "{refused}"
        );
        assert!(local.head(&f2).await.is_err());
        remote.finish(Done::default()).await.unwrap();
        server.await.unwrap().unwrap();
    }
}
