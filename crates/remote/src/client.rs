//! [`RemoteStore`]: a repository reached through a peer that holds it.
//!
//! Two peers hold repositories. With `repo-remote`, it is `pgstrata agent repo` on the
//! backup host, started over SSH on the first request ([`RemoteStore::ssh`]); the SSH
//! connection is kept for the process's life, and a broken one is made again on the next
//! request. Inside `pgstrata agent run` (pg-remote), it is the backup host that started
//! the agent, at the other end of the agent's stdin and stdout ([`RemoteStore::origin`]);
//! that stream cannot be made again, so its loss is final.
//!
//! Every request carries an id and many are in flight at once: a writer thread sends
//! frames as they are queued and a reader thread hands each answer to the request that
//! waits for it. Plain threads and blocking pipes, not async tasks, so a connection does
//! not belong to whichever tokio runtime happened to open it (commands build more than
//! one). When the connection breaks, every request in flight fails (retryably over SSH,
//! for `pgstrata_repo::Storage` to retry on a new connection).

use crate::error::{Error, ErrorKind};
use crate::protocol::{
    self, Answer, Done, Failure, FailureKind, Hello, Message, Meta, Op, Request,
};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyMode, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, Result,
};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::oneshot;

/// Another host, reached with the system ssh client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SshTarget {
    /// `[user@]host`, as given to ssh.
    pub host: String,
    pub port: Option<u16>,
    /// The ssh client to run (`cmd-ssh`).
    pub ssh: String,
    /// pgstrata's path on the other host (`repo-remote-cmd`, `pg-remote-cmd`).
    pub remote_cmd: String,
}

impl SshTarget {
    /// The ssh command line that runs `pgstrata ARGS` there: batch mode (a password
    /// prompt would hang archive_command), then the remote command, each word quoted for
    /// the remote shell.
    pub fn command(&self, args: &[String]) -> std::process::Command {
        let mut c = std::process::Command::new(&self.ssh);
        c.arg("-o").arg("BatchMode=yes");
        if let Some(p) = self.port {
            c.arg("-p").arg(p.to_string());
        }
        let mut remote = shell_word(&self.remote_cmd);
        for a in args {
            remote.push(' ');
            remote.push_str(&shell_word(a));
        }
        c.arg(&self.host).arg("--").arg(remote);
        c
    }
}

/// `s` as one word for a POSIX shell.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Time allowed for ssh to connect and the agent to say hello.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// A started ssh process running the agent, with the hellos exchanged.
pub struct SshSession {
    pub child: std::process::Child,
    pub input: std::process::ChildStdout,
    pub output: std::process::ChildStdin,
}

impl SshSession {
    /// Start `pgstrata ARGS` on `target` and exchange hellos. Blocking (it waits for the
    /// remote side): call it off the async runtime's threads.
    pub fn start(target: &SshTarget, args: &[String]) -> crate::Result<SshSession> {
        let mut child = target
            .command(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            // ssh's and the agent's messages reach the user as they are.
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|e| {
                Error::with_source(
                    ErrorKind::Io,
                    format!("start '{}' to reach {}", target.ssh, target.host),
                    e,
                )
            })?;
        let mut output = child.stdin.take().expect("piped");
        let mut input = child.stdout.take().expect("piped");
        let peer = format!("the agent on {}", target.host);
        // A watchdog kills ssh if the hello does not come in time (a hanging connect).
        let (hello_done, watchdog) = mpsc::channel::<()>();
        let pid = child.id() as i32;
        std::thread::spawn(move || {
            if watchdog.recv_timeout(CONNECT_TIMEOUT) == Err(mpsc::RecvTimeoutError::Timeout) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        });
        let outcome = hello(&mut input, &mut output, &peer, true);
        let _ = hello_done.send(());
        match outcome {
            Ok(()) => Ok(SshSession {
                child,
                input,
                output,
            }),
            Err(e) if e.kind != ErrorKind::Link => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
            Err(e) => {
                let status = child.wait().ok();
                Err(Error::new(ErrorKind::Link, format!(
                    "could not start the agent on {} with '{}' ({}; ssh exited with {}; its message, if any, is above): check that ssh reaches the host without a password prompt and that the remote command names pgstrata there",
                    target.host,
                    target.remote_cmd,
                    e,
                    match status.and_then(|s| s.code()) {
                        Some(c) => format!("status {c}"),
                        None => "a signal (no answer within the connect timeout?)".to_string(),
                    }
                )))
            }
        }
    }
}

/// Exchange hellos on a fresh stream; `send_first` for the side that starts the
/// connection's reading (either order works on pipes; both sides send before reading).
/// A peer that answered and is not one we can speak to is `Protocol` (permanent); a
/// stream that ended or failed before it answered, `Link`.
pub fn hello(
    input: &mut impl Read,
    output: &mut impl Write,
    peer: &str,
    send_first: bool,
) -> crate::Result<()> {
    let send = |output: &mut dyn Write| {
        output
            .write_all(&protocol::frame(&Message::Hello(Hello::ours()), b""))
            .and_then(|_| output.flush())
            .map_err(|e| Error::with_source(ErrorKind::Link, format!("send hello to {peer}"), e))
    };
    if send_first {
        send(output)?;
    }
    match protocol::read_frame(input) {
        Ok(Some((Message::Hello(h), _))) => h.check(peer)?,
        Ok(Some((other, _))) => {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("{peer} did not open with a hello (sent {other:?})"),
            ))
        }
        Ok(None) => {
            return Err(Error::new(
                ErrorKind::Link,
                format!("{peer} closed the connection"),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(Error::new(ErrorKind::Protocol, format!(
                "{peer} did not answer as a pgstrata agent ({e}): does the remote shell print something on login?"
            )))
        }
        Err(e) => {
            return Err(Error::with_source(
                ErrorKind::Link,
                format!("read {peer}'s hello"),
                e,
            ))
        }
    }
    if !send_first {
        send(output)?;
    }
    Ok(())
}

type Reply = crate::Result<(Answer, Bytes)>;

/// A frame to send, and who to tell once it is written and flushed.
type Outgoing = (Vec<u8>, Option<oneshot::Sender<std::io::Result<()>>>);

/// One live connection: requests out, answers in.
struct Channel {
    frames: mpsc::Sender<Outgoing>,
    pending: Arc<Mutex<Pending>>,
    /// The ssh process, killed when the channel goes.
    child: Option<Mutex<std::process::Child>>,
    /// Whether a lost connection may be made again (SSH) or is final (origin).
    retryable: bool,
}

impl Drop for Channel {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            let mut c = c.lock().unwrap();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set when the connection broke: why, for every later request on it.
    broken: Option<Error>,
}

impl Pending {
    fn fail_all(&mut self, why: Error) {
        for (_, w) in self.waiting.drain() {
            let _ = w.send(Err(copy_of(&why)));
        }
        self.broken.get_or_insert(why);
    }
}

/// The same failure again, for one more request (its source shown in the message).
fn copy_of(e: &Error) -> Error {
    Error::new(e.kind, e.to_string())
}

impl Channel {
    /// Start the threads that carry a connection whose hellos were exchanged.
    fn start(
        mut input: impl Read + Send + 'static,
        mut output: impl Write + Send + 'static,
        peer: String,
        child: Option<std::process::Child>,
        retryable: bool,
    ) -> Channel {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (frames, outgoing) = mpsc::channel::<Outgoing>();
        let broken = pending.clone();
        let what = peer.clone();
        std::thread::spawn(move || {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut output);
            loop {
                // Flush when nothing else is queued, or someone waits for this frame.
                let (frame, ack) = match outgoing.try_recv() {
                    Ok(next) => next,
                    Err(mpsc::TryRecvError::Disconnected) => break,
                    Err(mpsc::TryRecvError::Empty) => {
                        if let Err(e) = out.flush() {
                            broken.lock().unwrap().fail_all(Error::with_source(
                                ErrorKind::Link,
                                format!("connection to {what} lost"),
                                e,
                            ));
                            return;
                        }
                        match outgoing.recv() {
                            Ok(next) => next,
                            Err(_) => break,
                        }
                    }
                };
                let mut r = out.write_all(&frame);
                if r.is_ok() && ack.is_some() {
                    r = out.flush();
                }
                if let Some(ack) = ack {
                    let _ = ack.send(r.as_ref().map(|_| ()).map_err(clone_io));
                }
                if let Err(e) = r {
                    broken.lock().unwrap().fail_all(Error::with_source(
                        ErrorKind::Link,
                        format!("connection to {what} lost"),
                        e,
                    ));
                    return;
                }
            }
            let _ = out.flush();
        });
        let answers = pending.clone();
        std::thread::spawn(move || {
            let mut input = std::io::BufReader::with_capacity(1 << 20, &mut input);
            let why = loop {
                match protocol::read_frame(&mut input) {
                    Ok(Some((Message::Answer(a), body))) => {
                        let w = answers.lock().unwrap().waiting.remove(&a.id);
                        if let Some(w) = w {
                            let _ = w.send(Ok((a, body)));
                        }
                    }
                    Ok(Some((other, _))) => {
                        break Error::new(
                            ErrorKind::Protocol,
                            format!("{peer} sent an unexpected message: {other:?}"),
                        )
                    }
                    Ok(None) => {
                        break Error::new(ErrorKind::Link, format!("connection to {peer} closed"))
                    }
                    Err(e) => {
                        break Error::with_source(
                            ErrorKind::Link,
                            format!("connection to {peer} lost"),
                            e,
                        )
                    }
                }
            };
            answers.lock().unwrap().fail_all(why);
        });
        Channel {
            frames,
            pending,
            child: child.map(Mutex::new),
            retryable,
        }
    }

    fn is_broken(&self) -> bool {
        self.pending.lock().unwrap().broken.is_some()
    }

    /// Queue a frame; flushed when the writer has nothing else to send.
    fn send(
        &self,
        frame: Vec<u8>,
        flush: bool,
    ) -> crate::Result<Option<oneshot::Receiver<std::io::Result<()>>>> {
        let (ack, acked) = if flush {
            let (a, b) = oneshot::channel();
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        self.frames
            .send((frame, ack))
            .map_err(|_| Error::new(ErrorKind::Link, "the connection's writer is gone"))?;
        Ok(acked)
    }
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

/// A repository held by a peer.
#[derive(Clone)]
pub struct RemoteStore {
    inner: Arc<Inner>,
}

enum Source {
    /// `pgstrata agent repo --repo-path=PATH` on the target, started on demand.
    Ssh {
        target: SshTarget,
        path: String,
        stanza: Option<String>,
    },
    /// The backup host that started this `agent run`: one stream, never made again.
    Origin,
}

struct Inner {
    source: Source,
    conn: tokio::sync::Mutex<Option<Arc<Channel>>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteStore({self})")
    }
}

impl std::fmt::Display for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner.source {
            Source::Ssh { target, path, .. } => write!(f, "{}:{path}", target.host),
            Source::Origin => f.write_str("the backup host's repository"),
        }
    }
}

impl RemoteStore {
    /// The repository in `path` on `target`, for `stanza` (named on the agent's command
    /// line: without a forced command, `agent repo` serves that stanza only). One
    /// connection per target, path and stanza for the whole process: every
    /// `Storage::open` of it shares it.
    pub fn ssh(target: SshTarget, path: String, stanza: Option<String>) -> RemoteStore {
        type Shared = HashMap<(SshTarget, String, Option<String>), RemoteStore>;
        static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();
        let mut shared = SHARED.get_or_init(Default::default).lock().unwrap();
        shared
            .entry((target.clone(), path.clone(), stanza.clone()))
            .or_insert_with(|| RemoteStore {
                inner: Arc::new(Inner {
                    source: Source::Ssh {
                        target,
                        path,
                        stanza,
                    },
                    conn: tokio::sync::Mutex::new(None),
                    next_id: AtomicU64::new(1),
                }),
            })
            .clone()
    }

    /// The repository of the host that started this `agent run`, over the stream the
    /// hellos and the [`protocol::Job`] came on.
    pub fn origin(
        input: impl Read + Send + 'static,
        output: impl Write + Send + 'static,
    ) -> RemoteStore {
        let channel = Channel::start(input, output, "the backup host".to_string(), None, false);
        RemoteStore {
            inner: Arc::new(Inner {
                source: Source::Origin,
                conn: tokio::sync::Mutex::new(Some(Arc::new(channel))),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// End an `agent run`: send `done` to the origin and wait until it is written.
    pub async fn finish(&self, done: Done) -> crate::Result<()> {
        let conn = self.inner.conn.lock().await.clone();
        let Some(conn) = conn else {
            return Err(Error::new(ErrorKind::Link, "no connection to finish"));
        };
        let acked = conn.send(protocol::frame(&Message::Done(done), b""), true)?;
        let what = "send the result to the backup host";
        match acked.expect("asked").await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::with_source(ErrorKind::Link, what, e)),
            Err(_) => Err(Error::new(
                ErrorKind::Link,
                format!("{what}: the connection is gone"),
            )),
        }
    }

    /// The whole object `location`, unless its bytes still hash to `hash` (the requester
    /// holds them): then `None`, and they did not cross the line.
    pub async fn get_unless_hash(&self, location: &Path, hash: &str) -> Result<Option<Bytes>> {
        let mut req = request(Op::Get, location);
        req.unless_hash = Some(hash.to_string());
        let (answer, body) = self.call(req, b"").await?;
        if answer.unchanged {
            return Ok(None);
        }
        let size = answer.meta.map_or(0, |m| m.size);
        if body.len() as u64 != size {
            return Err(generic(format!(
                "{location}: short read ({} of {size} bytes)",
                body.len()
            )));
        }
        Ok(Some(body))
    }

    /// The frames `[offset, length]` of pack `location`, opened by a holder that reseals
    /// for this session (`Request::open_frames`), in the order asked.
    pub async fn get_opened_frames(
        &self,
        location: &Path,
        frames: &[[u64; 2]],
    ) -> Result<Vec<Bytes>> {
        let mut req = request(Op::Get, location);
        req.open_frames = Some(frames.to_vec());
        let (_, body) = self.call(req, b"").await?;
        let mut opened = Vec::with_capacity(frames.len());
        let mut at = 0;
        while opened.len() < frames.len() {
            let len = body
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
                .filter(|len| at + 4 + len <= body.len())
                .ok_or_else(|| generic(format!("{location}: the opened frames are cut short")))?;
            opened.push(body.slice(at + 4..at + 4 + len));
            at += 4 + len;
        }
        Ok(opened)
    }

    /// Write `first` and then `second`, both create-only, with the object the holder
    /// rebuilds from `patch` and the object `base` it holds. Returns the BLAKE3 (hex) of
    /// the bytes written. A holder that cannot rebuild answers `NotSupported` before
    /// writing anything.
    pub async fn put_patch(
        &self,
        first: &Path,
        second: &Path,
        base: &Path,
        patch: &[u8],
    ) -> Result<String> {
        let mut req = request(Op::PutPatch, first);
        req.to = Some(second.to_string());
        req.base = Some(base.to_string());
        req.create_only = true;
        let (answer, _) = self.call(req, patch).await?;
        answer
            .hash
            .ok_or_else(|| generic(format!("{first}: the agent did not say what it wrote")))
    }

    async fn conn(&self) -> Result<Arc<Channel>> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.is_broken() || !c.retryable {
                return Ok(c.clone());
            }
        }
        let Source::Ssh {
            target,
            path,
            stanza,
        } = &self.inner.source
        else {
            unreachable!("the origin's channel is made with the store");
        };
        let mut args = vec![
            "agent".to_string(),
            "repo".to_string(),
            format!("--repo-path={path}"),
        ];
        args.extend(stanza.iter().map(|s| format!("--stanza={s}")));
        let target = target.clone();
        let session = tokio::task::spawn_blocking(move || {
            SshSession::start(&target, &args).map(|s| (s, target))
        })
        .await
        .map_err(|e| generic(format!("start the agent: {e}")))?
        .map_err(|e| store_error(e, true))?;
        let (s, target) = session;
        let c = Arc::new(Channel::start(
            s.input,
            s.output,
            format!("the agent on {}", target.host),
            Some(s.child),
            true,
        ));
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn call(&self, mut req: Request, body: &[u8]) -> Result<(Answer, Bytes)> {
        req.id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let key = req.key.clone();
        if 64 * 1024 + body.len() > protocol::MAX_FRAME {
            return Err(permanent(format!(
                "{key}: {} bytes is more than one agent request carries",
                body.len()
            )));
        }
        let conn = self.conn().await?;
        let lost = |why: Error| store_error(why, conn.retryable);
        let op = req.op;
        let sent = body.len();
        let (tx, rx) = oneshot::channel();
        {
            let mut p = conn.pending.lock().unwrap();
            if let Some(why) = &p.broken {
                return Err(lost(copy_of(why)));
            }
            p.waiting.insert(req.id, tx);
        }
        if let Err(why) = conn.send(protocol::frame(&Message::Request(req), body), false) {
            return Err(lost(why));
        }
        let (answer, body) = rx
            .await
            .map_err(|_| {
                lost(Error::new(
                    ErrorKind::Link,
                    "the connection's reader is gone",
                ))
            })?
            .map_err(lost)?;
        log::debug!(
            "agent {op:?} {key}: {sent} bytes sent, {} bytes back",
            body.len()
        );
        match answer.error {
            Some(f) => Err(into_error(f, &key)),
            None => Ok((answer, body)),
        }
    }
}

fn request(op: Op, key: &Path) -> Request {
    Request::new(op, key.to_string())
}

/// A failure worth retrying (object_store's catch-all: pgstrata retries these).
fn generic(why: impl Into<crate::error::Source>) -> object_store::Error {
    object_store::Error::Generic {
        store: "remote",
        source: why.into(),
    }
}

/// A failure not worth retrying.
fn permanent(why: impl Into<crate::error::Source>) -> object_store::Error {
    object_store::Error::NotSupported { source: why.into() }
}

/// `e` as the store reports it, kept as the source: worth retrying when it is a link that
/// failed and the link can be made again (over SSH, not the origin's one stream).
fn store_error(e: Error, link_can_be_remade: bool) -> object_store::Error {
    if e.is_retryable() && link_can_be_remade {
        generic(e)
    } else {
        permanent(e)
    }
}

fn into_error(f: Failure, key: &str) -> object_store::Error {
    let source = f.message.into();
    let path = key.to_string();
    match f.kind {
        FailureKind::NotFound => object_store::Error::NotFound { path, source },
        FailureKind::AlreadyExists => object_store::Error::AlreadyExists { path, source },
        FailureKind::Precondition => object_store::Error::Precondition { path, source },
        FailureKind::NotSupported | FailureKind::InvalidPath => {
            object_store::Error::NotSupported { source }
        }
        FailureKind::PermissionDenied => object_store::Error::PermissionDenied { path, source },
        FailureKind::Other => object_store::Error::Generic {
            store: "remote",
            source,
        },
    }
}

fn object_meta(m: Meta) -> Result<ObjectMeta> {
    Ok(ObjectMeta {
        location: Path::parse(&m.key)?,
        last_modified: chrono::DateTime::from_timestamp_nanos(m.modified_ns),
        size: m.size,
        e_tag: m.e_tag,
        version: None,
    })
}

fn unsupported(what: &str) -> object_store::Error {
    object_store::Error::NotImplemented {
        operation: what.to_string(),
        implementer: "pgstrata remote repository".to_string(),
    }
}

#[async_trait]
impl ObjectStore for RemoteStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let mut req = request(Op::Put, location);
        req.create_only = match opts.mode {
            PutMode::Overwrite => false,
            PutMode::Create => true,
            PutMode::Update(_) => return Err(unsupported("conditional update")),
        };
        let body: Bytes = payload.into();
        let (answer, _) = self.call(req, &body).await?;
        Ok(PutResult {
            e_tag: answer.e_tag,
            version: None,
            extensions: Default::default(),
        })
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Err(unsupported("multipart upload"))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if options.if_match.is_some()
            || options.if_none_match.is_some()
            || options.if_modified_since.is_some()
            || options.if_unmodified_since.is_some()
            || options.version.is_some()
        {
            return Err(unsupported("conditional get"));
        }
        let mut req = request(Op::Get, location);
        req.head_only = options.head;
        req.range = match options.range {
            None => None,
            Some(GetRange::Bounded(r)) => Some([r.start, r.end]),
            Some(_) => return Err(unsupported("open-ended range")),
        };
        let (answer, body) = self.call(req, b"").await?;
        let meta = object_meta(
            answer
                .meta
                .ok_or_else(|| generic(format!("{location}: the agent sent no metadata")))?,
        )?;
        let range = answer.range.map_or(0..meta.size, |[a, b]| a..b);
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(body) }).boxed(),
            ),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let store = self.clone();
        locations
            .map(move |location| {
                let store = store.clone();
                async move {
                    let location = location?;
                    store.call(request(Op::Delete, &location), b"").await?;
                    Ok(location)
                }
            })
            .buffered(16)
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let store = self.clone();
        let key = prefix.cloned().unwrap_or_default();
        futures::stream::once(async move {
            let (answer, _) = store.call(request(Op::List, &key), b"").await?;
            Ok::<_, object_store::Error>(futures::stream::iter(
                answer.objects.into_iter().map(object_meta),
            ))
        })
        .map(|r| match r {
            Ok(s) => s.boxed(),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let key = prefix.cloned().unwrap_or_default();
        let (answer, _) = self.call(request(Op::ListDirs, &key), b"").await?;
        Ok(ListResult {
            objects: answer
                .objects
                .into_iter()
                .map(object_meta)
                .collect::<Result<_>>()?,
            common_prefixes: answer
                .prefixes
                .iter()
                .map(Path::parse)
                .collect::<std::result::Result<_, _>>()?,
            extensions: Default::default(),
        })
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        let mut req = request(Op::Copy, from);
        req.to = Some(to.to_string());
        req.create_only = matches!(options.mode, CopyMode::Create);
        self.call(req, b"").await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remote_command_is_quoted_for_the_remote_shell() {
        let t = SshTarget {
            host: "backup@bk1".into(),
            port: Some(2222),
            ssh: "ssh".into(),
            remote_cmd: "/opt/pg strata/pgstrata".into(),
        };
        let c = t.command(&[
            "agent".into(),
            "repo".into(),
            "--repo-path=/srv/it's here".into(),
        ]);
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "-o",
                "BatchMode=yes",
                "-p",
                "2222",
                "backup@bk1",
                "--",
                "'/opt/pg strata/pgstrata' agent repo '--repo-path=/srv/it'\\''s here'"
            ]
        );
    }

    /// A peer that hangs up before its hello is a link failure, worth a new connection;
    /// one that answers with something else (a login banner) is not one to speak to, and
    /// the store does not retry it. The error stays the source of the store's.
    #[test]
    fn a_lost_hello_is_retryable_and_a_wrong_one_is_not() {
        let mut sent = Vec::new();
        let lost = hello(&mut &b""[..], &mut sent, "the agent on bk1", true).unwrap_err();
        assert_eq!(lost.kind, ErrorKind::Link);
        assert_eq!(lost.to_string(), "the agent on bk1 closed the connection");
        assert!(matches!(
            store_error(lost, true),
            object_store::Error::Generic { .. }
        ));

        let banner = b"Welcome to bk1! Last login: yesterday\n".repeat(4);
        let wrong = hello(&mut &banner[..], &mut sent, "the agent on bk1", true).unwrap_err();
        assert_eq!(wrong.kind, ErrorKind::Protocol, "{wrong}");
        assert!(!wrong.is_retryable());
        let stored = store_error(wrong, true);
        let object_store::Error::NotSupported { source } = &stored else {
            panic!("retried: {stored:?}");
        };
        let kept = source
            .downcast_ref::<Error>()
            .expect("the remote error is the source");
        assert_eq!(kept.kind, ErrorKind::Protocol);
    }
}
