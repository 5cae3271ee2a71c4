//! The one network proxy of the tests and benchmarks: a relay on a loopback port that
//! forwards each connection to a target (a TCP port on 127.0.0.1, or a unix socket, so that
//! a client can reach a cluster listening only on its socket) and can make the network
//! between them behave as a real one does:
//!
//! - a rate limit: relays opened on one [`Line`] share its two token buckets (database host
//!   -> backup host and back), so SSH sessions, WAL archiving and a replication connection
//!   running at once share the rate as they would share a real line;
//! - a delay per turn (the client speaking after the server spoke, or first) and per new
//!   connection: a network round trip before every request an object store answers;
//! - counts of the bytes moved each way (payload: what the applications wrote, not TCP/IP
//!   headers), of connections and of turns;
//! - for HTTP/1.1 ([`ProxyBuilder::http`]): the request line of each request, kept, and
//!   faults: lose the answer to one chosen request after the server acted on it (what
//!   create-only writes must survive), refuse requests as a server that is down does, strip
//!   a request header (a store that ignores conditional writes). Each request is sent with
//!   `Connection: close`, so every request travels on a connection of its own and a lost
//!   answer hits exactly one request;
//! - a TLS listener beside the plain one (a client that only speaks https, as pgBackRest to
//!   S3): the proxy ends TLS and forwards plain bytes.
//!
//! It listens on 127.0.0.1 only and stops (its open connections shut down) when dropped.

use crate::{Error, ErrorKind, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes read and forwarded at a time: 1.3 ms of a 100 Mbit/s line.
const CHUNK: usize = 16 * 1024;
/// Credit a bucket keeps for a sender that paused (a line's buffering): 10 ms.
const BURST: Duration = Duration::from_millis(10);

/// Which host a relay's clients stand for on a [`Line`]: it decides which direction's
/// bucket their bytes use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Host {
    Db,
    Backup,
}

/// Where a proxy forwards its connections.
#[derive(Clone, Debug)]
pub enum Target {
    Tcp(u16),
    Unix(PathBuf),
}

/// One direction of a line: a rate, and the time at which it is free again.
struct Bucket {
    bytes_per_sec: f64,
    next: Mutex<Instant>,
}

impl Bucket {
    /// Wait until `n` more bytes fit in the line's rate (virtual time: a late wake-up
    /// does not slow the line down, it is caught up within BURST).
    fn take(&self, n: usize) {
        let due = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let start = (*next).max(now.checked_sub(BURST).unwrap_or(now));
            *next = start + Duration::from_secs_f64(n as f64 / self.bytes_per_sec);
            *next
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}

/// A full-duplex line of `mbit` Mbit/s each way between the two hosts.
pub struct Line {
    db_to_backup: Arc<Bucket>,
    backup_to_db: Arc<Bucket>,
}

impl Line {
    pub fn new(mbit: u64) -> Line {
        let bucket = || {
            Arc::new(Bucket {
                bytes_per_sec: mbit as f64 * 1e6 / 8.0,
                next: Mutex::new(Instant::now()),
            })
        };
        Line {
            db_to_backup: bucket(),
            backup_to_db: bucket(),
        }
    }

    /// A relay whose clients are on `client`'s side of the line, forwarding to `target` on
    /// the other side.
    pub fn relay(&self, client: Host, target: Target) -> Result<Proxy> {
        Proxy::to(target).on_line(self, client).start()
    }

    /// The line's raw rate as an application sees it: `bytes` of random data written
    /// through a fresh relay (database host -> backup host) into a socket that reads and
    /// drops them, timed from the first byte written to the sink's acknowledgement of the
    /// last. Returns seconds.
    pub fn measure_raw(&self, bytes: usize) -> Result<f64> {
        let io = |what: &'static str| move |e| Error::io(format!("line test: {what}"), e);
        let sink = TcpListener::bind(("127.0.0.1", 0)).map_err(io("bind the sink"))?;
        let sink_port = sink.local_addr().map_err(io("bind the sink"))?.port();
        let drain = std::thread::spawn(move || -> std::io::Result<u64> {
            let (mut s, _) = sink.accept()?;
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0u64;
            loop {
                match s.read(&mut buf)? {
                    0 => break,
                    n => got += n as u64,
                }
            }
            s.write_all(b"k")?;
            Ok(got)
        });
        let relay = self.relay(Host::Db, Target::Tcp(sink_port))?;
        let mut data = vec![0u8; bytes];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut data))
            .map_err(io("read /dev/urandom"))?;
        let mut c = TcpStream::connect(("127.0.0.1", relay.port)).map_err(io("connect"))?;
        let t0 = Instant::now();
        c.write_all(&data).map_err(io("send"))?;
        c.shutdown(Shutdown::Write).map_err(io("send"))?;
        let mut ack = Vec::new();
        c.read_to_end(&mut ack)
            .map_err(io("read the acknowledgement"))?;
        let seconds = t0.elapsed().as_secs_f64();
        let got = drain
            .join()
            .map_err(|_| Error::new(ErrorKind::Failed, "line test: the sink panicked"))?
            .map_err(io("the sink"))?;
        if got != bytes as u64 || ack != b"k" {
            return Err(Error::new(
                ErrorKind::Failed,
                format!("line test: {got} of {bytes} bytes arrived (ack {ack:?})"),
            ));
        }
        Ok(seconds)
    }
}

/// Bytes a proxy moved, by direction, and the connections it forwarded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Moved {
    /// From its clients to its target.
    pub to_target: u64,
    /// From its target back to its clients.
    pub from_target: u64,
    pub connections: u64,
}

impl Moved {
    pub fn total(&self) -> u64 {
        self.to_target + self.from_target
    }
    /// What moved after `before` (an earlier reading of the same proxy).
    pub fn since(&self, before: Moved) -> Moved {
        Moved {
            to_target: self.to_target - before.to_target,
            from_target: self.from_target - before.from_target,
            connections: self.connections - before.connections,
        }
    }
}

/// One HTTP request seen by the proxy.
#[derive(Clone, Debug)]
pub struct Request {
    /// The number of the turn it started (see [`Proxy::turns`]).
    pub turn: u64,
    /// `PUT /bucket/key HTTP/1.1`.
    pub line: String,
}

/// The faults of an HTTP proxy.
#[derive(Debug, Default)]
struct Rules {
    /// Lose the answer to the next request with this method whose request line contains
    /// this text (the server still gets and serves the request).
    drop_answer: Option<(String, String)>,
    /// Close connections of requests whose request line contains this text, unanswered
    /// and not forwarded (an empty text refuses everything: a server that is down).
    refuse: Option<String>,
    /// Remove this request header (lower case) before forwarding.
    strip_header: Option<String>,
    /// Answers lost so far.
    dropped: Vec<String>,
    /// Requests refused so far.
    refused: u64,
}

/// How a proxy treats its connections; made by [`Proxy::to`].
pub struct ProxyBuilder {
    target: Target,
    /// (client -> target, target -> client) buckets.
    rate: Option<(Arc<Bucket>, Arc<Bucket>)>,
    turn_delay: Duration,
    connect_delay: Duration,
    http: bool,
    tls: Option<(PathBuf, PathBuf)>,
}

impl ProxyBuilder {
    /// Share `line`'s rate, the clients being on `client`'s side.
    pub fn on_line(mut self, line: &Line, client: Host) -> ProxyBuilder {
        self.rate = Some(match client {
            Host::Backup => (line.backup_to_db.clone(), line.db_to_backup.clone()),
            Host::Db => (line.db_to_backup.clone(), line.backup_to_db.clone()),
        });
        self
    }

    /// Hold the first bytes of each turn (the client speaking after the server spoke, or
    /// first) for `delay`: one round trip more for every request, whatever its size, and
    /// two for a request whose body follows an interim answer (`Expect: 100-continue`).
    /// Answers are not delayed; connections are delayed independently, as on a network.
    pub fn delay_per_turn(mut self, delay: Duration) -> ProxyBuilder {
        self.turn_delay = delay;
        self
    }

    /// Wait `delay` before connecting to the target for each new connection (a TCP
    /// handshake's round trip; moto closes the connection after each answer where a real
    /// store keeps it, so the default, none, does not charge it per request).
    pub fn delay_per_connection(mut self, delay: Duration) -> ProxyBuilder {
        self.connect_delay = delay;
        self
    }

    /// The clients speak HTTP/1.1: keep each request's line, apply the faults, and send
    /// every request with `Connection: close`.
    pub fn http(mut self) -> ProxyBuilder {
        self.http = true;
        self
    }

    /// Listen for TLS too (on [`Proxy::tls_port`]) with this PEM certificate chain and key.
    pub fn tls(mut self, cert: &Path, key: &Path) -> ProxyBuilder {
        self.tls = Some((cert.to_path_buf(), key.to_path_buf()));
        self
    }

    pub fn start(self) -> Result<Proxy> {
        let listen = || -> Result<(TcpListener, u16)> {
            let io = |e| Error::io("proxy: listen on 127.0.0.1", e);
            let l = TcpListener::bind(("127.0.0.1", 0)).map_err(io)?;
            let port = l.local_addr().map_err(io)?.port();
            l.set_nonblocking(true).map_err(io)?;
            Ok((l, port))
        };
        let (plain, port) = listen()?;
        let tls = match &self.tls {
            Some((cert, key)) => Some((listen()?, Arc::new(tls_config(cert, key)?))),
            None => None,
        };
        let tls_port = tls.as_ref().map(|((_, p), _)| *p);
        let shared = Arc::new(Shared {
            opts: self,
            counts: Counts::default(),
            rules: Mutex::default(),
            requests: Mutex::default(),
            open: Mutex::default(),
            stop: AtomicBool::new(false),
        });
        let mut acceptors = vec![accept_loop(plain, port, shared.clone(), None)];
        if let Some(((listener, p), config)) = tls {
            acceptors.push(accept_loop(listener, p, shared.clone(), Some(config)));
        }
        Ok(Proxy {
            port,
            tls_port,
            shared,
            acceptors,
        })
    }
}

/// The proxy; it listens on `port` (and `tls_port`) until dropped.
pub struct Proxy {
    pub port: u16,
    pub tls_port: Option<u16>,
    shared: Arc<Shared>,
    acceptors: Vec<JoinHandle<()>>,
}

struct Shared {
    opts: ProxyBuilder,
    counts: Counts,
    rules: Mutex<Rules>,
    requests: Mutex<Vec<Request>>,
    /// Both ends of every open connection, to shut them down when the proxy stops.
    open: Mutex<std::collections::HashMap<u64, (Stream, Stream)>>,
    stop: AtomicBool,
}

#[derive(Default)]
struct Counts {
    to_target: AtomicU64,
    from_target: AtomicU64,
    connections: AtomicU64,
    turns: AtomicU64,
}

impl Proxy {
    /// A proxy to `target`, set up by the builder's methods, then `start`.
    pub fn to(target: Target) -> ProxyBuilder {
        ProxyBuilder {
            target,
            rate: None,
            turn_delay: Duration::ZERO,
            connect_delay: Duration::ZERO,
            http: false,
            tls: None,
        }
    }

    /// An HTTP proxy to a test storage server on `upstream_port`, faults off.
    pub fn http(upstream_port: u16) -> Proxy {
        Proxy::to(Target::Tcp(upstream_port))
            .http()
            .start()
            .expect("start the proxy")
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn moved(&self) -> Moved {
        let c = &self.shared.counts;
        Moved {
            to_target: c.to_target.load(Ordering::Relaxed),
            from_target: c.from_target.load(Ordering::Relaxed),
            connections: c.connections.load(Ordering::Relaxed),
        }
    }

    /// Turns (see [`ProxyBuilder::delay_per_turn`]) so far: each HTTP request is one.
    pub fn turns(&self) -> u64 {
        self.shared.counts.turns.load(Ordering::SeqCst)
    }

    /// The HTTP requests seen so far, in the order their turns started.
    pub fn requests(&self) -> Vec<Request> {
        let mut r = self.shared.requests.lock().unwrap().clone();
        r.sort_by_key(|r| r.turn);
        r
    }

    /// Lose the answer to the next `method` request whose request line (`PUT /bucket/key
    /// HTTP/1.1`) contains `needle`, after the server has handled it.
    pub fn drop_answer_to(&self, method: &str, needle: &str) {
        self.rules().drop_answer = Some((method.to_string(), needle.to_string()));
    }

    /// Request lines whose answers were lost so far (a test checks its fault really hit).
    pub fn dropped(&self) -> Vec<String> {
        self.rules().dropped.clone()
    }

    /// Is a planned answer loss still waiting for its request?
    pub fn drop_pending(&self) -> bool {
        self.rules().drop_answer.is_some()
    }

    /// Refuse (close unanswered) every request whose request line contains `needle`; an
    /// empty needle refuses everything. `None` lets everything through again.
    pub fn refuse(&self, needle: Option<&str>) {
        self.rules().refuse = needle.map(str::to_string);
    }

    /// Forward requests without header `name` (e.g. `if-none-match`: the server then
    /// ignores create-only conditions, as some S3-compatible stores do); `None` stops.
    pub fn strip_header(&self, name: Option<&str>) {
        self.rules().strip_header = name.map(str::to_ascii_lowercase);
    }

    /// How many requests were refused so far.
    pub fn refused(&self) -> u64 {
        self.rules().refused
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        assert!(self.shared.opts.http, "faults need an HTTP proxy");
        self.shared.rules.lock().unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for a in self.acceptors.drain(..) {
            let _ = a.join();
        }
        let open = self.shared.open.lock().unwrap_or_else(|e| e.into_inner());
        for (a, b) in open.values() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    port: u16,
    shared: Arc<Shared>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        while !shared.stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((client, _)) => {
                    let (shared, tls) = (shared.clone(), tls.clone());
                    std::thread::spawn(move || {
                        if let Err(e) = serve(client, &shared, tls) {
                            eprintln!("[proxy {port}] {e}");
                        }
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => {
                    eprintln!("[proxy {port}] accept: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    })
}

/// One client connection: (TLS ended,) the HTTP request's faults applied, then bytes
/// pumped both ways.
fn serve(
    client: TcpStream,
    shared: &Arc<Shared>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    let o = &shared.opts;
    client.set_nonblocking(false)?;
    let _ = client.set_nodelay(true);
    let mut client = match tls {
        Some(config) => {
            let (plain, bridge) = UnixStream::pair()?;
            std::thread::spawn(move || {
                let _ = end_tls(client, bridge, config);
            });
            Stream::Unix(plain)
        }
        None => Stream::Tcp(client),
    };
    let connection_turn_spoken = Arc::new(AtomicBool::new(true));
    let mut first = Vec::new();
    let mut drop_answer = false;
    if o.http {
        match http_request_head(&mut client, shared, &connection_turn_spoken)? {
            Some((head, drop)) => (first, drop_answer) = (head, drop),
            None => return Ok(()),
        }
    }
    std::thread::sleep(o.connect_delay);
    let mut server = connect_target(&o.target)?;
    if !first.is_empty() {
        server.write_all(&first)?;
        shared
            .counts
            .to_target
            .fetch_add(first.len() as u64, Ordering::Relaxed);
    }
    let id = shared.counts.connections.fetch_add(1, Ordering::Relaxed);
    let clone = |s: &Stream| s.try_clone();
    shared
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, (clone(&client)?, clone(&server)?));
    let forget = Forget {
        id,
        shared: shared.clone(),
    };
    let (c2, s2) = (clone(&client)?, clone(&server)?);
    let (shared2, spoken2) = (shared.clone(), connection_turn_spoken.clone());
    let up = std::thread::spawn(move || {
        pump(client, server, &shared2, Direction::Up(&spoken2));
    });
    let answer = if drop_answer {
        Direction::Lost
    } else {
        Direction::Down(&connection_turn_spoken)
    };
    pump(s2, c2, shared, answer);
    let _ = up.join();
    drop(forget);
    Ok(())
}

/// Read the client's first HTTP request head and apply the rules to it: `None` when the
/// connection ends here (closed before a head, or the request refused); else what to send
/// the target first (the head, rewritten, and what came after it) and whether to drop the
/// answer. The head starts the connection's first turn: it is counted and delayed here.
fn http_request_head(
    client: &mut Stream,
    shared: &Shared,
    connection_turn_spoken: &AtomicBool,
) -> std::io::Result<Option<(Vec<u8>, bool)>> {
    let mut first = Vec::new();
    let Some(head) = read_head(client, &mut first)? else {
        return Ok(None);
    };
    let line = String::from_utf8_lossy(&head[..find(&head, b"\r\n").unwrap_or(0)]).to_string();
    let method = line.split(' ').next().unwrap_or_default().to_string();
    let drop_answer;
    let strip = {
        let mut r = shared.rules.lock().unwrap();
        if r.refuse.as_ref().is_some_and(|n| line.contains(n.as_str())) {
            r.refused += 1;
            client.shutdown(Shutdown::Both)?;
            return Ok(None);
        }
        drop_answer = r
            .drop_answer
            .as_ref()
            .is_some_and(|(m, n)| *m == method && line.contains(n.as_str()));
        if drop_answer {
            r.drop_answer = None;
            r.dropped.push(line.clone());
        }
        r.strip_header.clone()
    };
    let head = match strip {
        Some(name) => without_header(&head, &name),
        None => head,
    };
    let rest = first.split_off(find(&first, b"\r\n\r\n").map_or(first.len(), |i| i + 4));
    first = with_connection_close(&head);
    first.extend_from_slice(&rest);
    connection_turn_spoken.store(false, Ordering::SeqCst);
    let turn = shared.counts.turns.fetch_add(1, Ordering::SeqCst) + 1;
    shared.requests.lock().unwrap().push(Request { turn, line });
    std::thread::sleep(shared.opts.turn_delay);
    Ok(Some((first, drop_answer)))
}

/// A connection to the proxied server.
fn connect_target(target: &Target) -> std::io::Result<Stream> {
    let context = |what: String| {
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{what}: {e}"))
    };
    Ok(match target {
        Target::Tcp(p) => {
            let s = TcpStream::connect(("127.0.0.1", *p))
                .map_err(context(format!("connect 127.0.0.1:{p}")))?;
            let _ = s.set_nodelay(true);
            Stream::Tcp(s)
        }
        Target::Unix(path) => Stream::Unix(
            UnixStream::connect(path).map_err(context(format!("connect {}", path.display())))?,
        ),
    })
}

/// Forgets an open connection (its sockets then close) when both directions are done.
struct Forget {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for Forget {
    fn drop(&mut self) {
        self.shared
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

enum Direction<'a> {
    /// Client to target; the flag says the server spoke since the client last did.
    Up(&'a AtomicBool),
    /// Target to client.
    Down(&'a AtomicBool),
    /// Target to nowhere: the answer is read to its end, then the client is cut off.
    Lost,
}

/// Copy `from` to `to` (through the line's bucket, counting, delaying each turn) until
/// `from` ends; then end `to`'s writing (a half-close, as TCP carries it).
fn pump(mut from: Stream, mut to: Stream, shared: &Shared, direction: Direction) {
    let o = &shared.opts;
    let (bucket, counter) = match direction {
        Direction::Up(_) => (o.rate.as_ref().map(|r| &r.0), &shared.counts.to_target),
        _ => (o.rate.as_ref().map(|r| &r.1), &shared.counts.from_target),
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        };
        match direction {
            Direction::Up(spoken) => {
                if spoken.swap(false, Ordering::SeqCst) {
                    shared.counts.turns.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(o.turn_delay);
                }
            }
            Direction::Down(spoken) => spoken.store(true, Ordering::SeqCst),
            Direction::Lost => continue,
        }
        if let Some(b) = bucket {
            b.take(n);
        }
        if to.write_all(&buf[..n]).is_err() {
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
    let how = match direction {
        // The server acted on the request; its answer never arrives.
        Direction::Lost => Shutdown::Both,
        _ => Shutdown::Write,
    };
    let _ = to.shutdown(how);
}

/// Read from `client` into `buf` until it holds a whole request head; returns the head
/// (through the blank line). `None` when the client closed the connection first.
fn read_head(client: &mut Stream, buf: &mut Vec<u8>) -> std::io::Result<Option<Vec<u8>>> {
    let mut chunk = [0u8; CHUNK];
    loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            return Ok(Some(buf[..i + 4].to_vec()));
        }
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A message head with its Connection headers replaced by `Connection: close`.
fn with_connection_close(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut lines: Vec<&str> = text
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    // The head ends with two empty strings (the blank line); insert before them.
    let at = lines.len().saturating_sub(2).max(1);
    lines.insert(at, "Connection: close");
    lines.join("\r\n").into_bytes()
}

/// A message head without header `name` (lower case).
fn without_header(head: &[u8], name: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let prefix = format!("{name}:");
    text.split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with(&prefix))
        .collect::<Vec<_>>()
        .join("\r\n")
        .into_bytes()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("proxy: certificate {}: {e}", cert.display()),
            )
        })?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::new(ErrorKind::Io, format!("proxy: key {}: {e}", key.display())))?;
    rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
    .map_err(|e| Error::new(ErrorKind::Io, format!("proxy: TLS: {e}")))
}

/// End TLS on `tcp`, passing the plain bytes to and from `plain` (the other end of which
/// the proxy serves as any client), until either side is done. When the server side is
/// done the client connection is closed completely: a TLS client cannot be half-closed.
fn end_tls(
    mut tcp: TcpStream,
    mut plain: UnixStream,
    config: Arc<rustls::ServerConfig>,
) -> std::io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)?;
    }
    let mut buf = vec![0u8; CHUNK];
    // A client may send its first request with its last handshake message: rustls holds it
    // decrypted already, and no further bytes would wake the poll below for it.
    let mut client_done = pass_plain(&mut conn, &mut plain, &mut buf)?;
    if client_done {
        let _ = plain.shutdown(Shutdown::Write);
    }
    loop {
        while conn.wants_write() {
            conn.write_tls(&mut tcp)?;
        }
        let (tcp_ready, plain_ready) = {
            let tcp_fd = tcp.as_fd();
            let plain_fd = plain.as_fd();
            let mut fds = vec![PollFd::new(plain_fd, PollFlags::POLLIN)];
            if !client_done {
                fds.push(PollFd::new(tcp_fd, PollFlags::POLLIN));
            }
            poll(&mut fds, PollTimeout::NONE)?;
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (fds.get(1).is_some_and(ready), ready(&fds[0]))
        };
        if tcp_ready {
            let n = conn.read_tls(&mut tcp)?;
            conn.process_new_packets().map_err(std::io::Error::other)?;
            client_done = pass_plain(&mut conn, &mut plain, &mut buf)?;
            if n == 0 || client_done {
                client_done = true;
                let _ = plain.shutdown(Shutdown::Write);
            }
        }
        if plain_ready {
            let n = plain.read(&mut buf)?;
            if n == 0 {
                conn.send_close_notify();
                while conn.wants_write() {
                    conn.write_tls(&mut tcp)?;
                }
                let _ = tcp.shutdown(Shutdown::Both);
                return Ok(());
            }
            conn.writer().write_all(&buf[..n])?;
        }
    }
}

/// Write what `conn` holds decrypted to `plain`; true when the client closed its side.
fn pass_plain(
    conn: &mut rustls::ServerConnection,
    plain: &mut UnixStream,
    buf: &mut [u8],
) -> std::io::Result<bool> {
    loop {
        match conn.reader().read(buf) {
            Ok(0) => return Ok(true),
            Ok(k) => plain.write_all(&buf[..k])?,
            Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(x) => return Err(x),
        }
    }
}

/// A client's or target's end of a connection.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server answering each connection's request with its length, then closing.
    fn answering_server() -> u16 {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut s = s.unwrap();
                std::thread::spawn(move || {
                    let mut buf = vec![];
                    let _ = read_head(&mut Stream::Tcp(s.try_clone().unwrap()), &mut buf);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                        text.len()
                    );
                });
            }
        });
        port
    }

    fn get(port: u16, path: &str) -> std::io::Result<String> {
        let mut c = TcpStream::connect(("127.0.0.1", port))?;
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\nX-Drop: me\r\n\r\n")?;
        let mut out = String::new();
        c.read_to_string(&mut out)?;
        Ok(out)
    }

    #[test]
    fn a_relay_forwards_both_ways_at_the_rate_and_counts() {
        let echo = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).unwrap();
            s.write_all(&buf[..1000]).unwrap();
        });
        let line = Line::new(8); // 1 MB/s
        let relay = line.relay(Host::Backup, Target::Tcp(port)).unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", relay.port)).unwrap();
        let t0 = Instant::now();
        c.write_all(&vec![7u8; 500_000]).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        let s = t0.elapsed().as_secs_f64();
        assert_eq!(back, vec![7u8; 1000]);
        assert!((0.45..1.0).contains(&s), "500 kB at 1 MB/s took {s:.3} s");
        let m = relay.moved();
        assert_eq!(
            (m.to_target, m.from_target, m.connections),
            (500_000, 1000, 1)
        );
    }

    #[test]
    fn http_requests_are_delayed_counted_and_faulted() {
        let proxy = Proxy::to(Target::Tcp(answering_server()))
            .http()
            .delay_per_turn(Duration::from_millis(100))
            .start()
            .unwrap();
        let t0 = Instant::now();
        let answer = get(proxy.port, "/a").unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(100), "delayed a turn");
        assert!(answer.contains("Connection: close\r\n"), "{answer}");
        proxy.strip_header(Some("X-Drop"));
        let answer = get(proxy.port, "/b").unwrap();
        assert!(
            !answer.contains("X-Drop") && answer.contains("GET /b"),
            "{answer}"
        );
        proxy.drop_answer_to("GET", "/c");
        assert_eq!(get(proxy.port, "/c").unwrap(), "", "the answer was lost");
        assert_eq!(proxy.dropped(), ["GET /c HTTP/1.1"]);
        proxy.refuse(Some("/d"));
        assert_eq!(get(proxy.port, "/d").unwrap_or_default(), "");
        assert_eq!(proxy.refused(), 1);
        let lines: Vec<String> = proxy.requests().into_iter().map(|r| r.line).collect();
        assert_eq!(
            lines,
            ["GET /a HTTP/1.1", "GET /b HTTP/1.1", "GET /c HTTP/1.1"]
        );
        assert_eq!(proxy.turns(), 3);
    }

    #[test]
    fn tls_is_ended_and_plain_bytes_forwarded() {
        let dir = std::env::temp_dir().join(format!("pgstrata-proxy-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        let proxy = Proxy::to(Target::Tcp(answering_server()))
            .http()
            .tls(&cert, &key)
            .start()
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(&cert).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let tcp = TcpStream::connect(("127.0.0.1", proxy.tls_port.unwrap())).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        write!(tls, "GET /secure HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = tls.read_to_string(&mut out);
        assert!(
            out.starts_with("HTTP/1.1 200 OK") && out.contains("GET /secure"),
            "{out}"
        );
        assert_eq!(proxy.requests()[0].line, "GET /secure HTTP/1.1");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
