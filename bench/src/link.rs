//! A throttled link between the two "hosts" of the two-host scenarios: relays on loopback
//! that forward each connection to a target (a TCP port on 127.0.0.1, or a unix socket, so
//! that a client can reach a cluster listening only on its socket), at most `mbit` Mbit/s
//! in each direction. A [`Link`] is one full-duplex line: every relay opened on it shares its
//! two token buckets (database host -> backup host, backup host -> database host), so SSH
//! sessions, WAL archiving and a replication connection running at once share the rate as
//! they would share a real line. Each relay counts the bytes it moved each way (payload:
//! what the applications wrote, not TCP/IP headers).
//!
//! A relay listens on 127.0.0.1 only and stops (its connections shut down) when dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes read and forwarded at a time: 1.3 ms of a 100 Mbit/s line.
const CHUNK: usize = 16 * 1024;
/// Credit a bucket keeps for a sender that paused (a line's buffering): 10 ms.
const BURST: Duration = Duration::from_millis(10);

/// Which host a relay's clients stand for: it decides which direction's bucket their
/// bytes use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Host {
    Db,
    Backup,
}

/// Where a relay forwards its connections.
#[derive(Clone, Debug)]
pub enum Target {
    Tcp(u16),
    Unix(PathBuf),
}

/// One direction of the line: a rate, and the time at which it is free again.
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

pub struct Link {
    db_to_backup: Arc<Bucket>,
    backup_to_db: Arc<Bucket>,
}

/// Bytes a relay moved, by direction, and the connections it forwarded.
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
    /// What moved after `before` (an earlier reading of the same relay).
    pub fn since(&self, before: Moved) -> Moved {
        Moved {
            to_target: self.to_target - before.to_target,
            from_target: self.from_target - before.from_target,
            connections: self.connections - before.connections,
        }
    }
}

#[derive(Default)]
struct Counts {
    to_target: AtomicU64,
    from_target: AtomicU64,
    connections: AtomicU64,
}

pub struct Relay {
    pub port: u16,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    /// Both ends of every open connection, to shut them down when the relay stops.
    open: Open,
    acceptor: Option<JoinHandle<()>>,
}

impl Link {
    pub fn new(mbit: u64) -> Link {
        let bucket = || {
            Arc::new(Bucket {
                bytes_per_sec: mbit as f64 * 1e6 / 8.0,
                next: Mutex::new(Instant::now()),
            })
        };
        Link {
            db_to_backup: bucket(),
            backup_to_db: bucket(),
        }
    }

    /// A relay on a free loopback port whose clients are on `client`'s side of the line,
    /// forwarding to `target` on the other side.
    pub fn relay(&self, client: Host, target: Target) -> Result<Relay, String> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .map_err(|e| format!("relay: bind 127.0.0.1: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("relay: {e}"))?;
        let (up, down) = match client {
            Host::Backup => (self.backup_to_db.clone(), self.db_to_backup.clone()),
            Host::Db => (self.db_to_backup.clone(), self.backup_to_db.clone()),
        };
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let open: Open = Arc::default();
        let acceptor = {
            let (counts, stop, open) = (counts.clone(), stop.clone(), open.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            if let Err(e) = forward(client, &target, &up, &down, &counts, &open) {
                                eprintln!("[bench] relay {port}: {e}");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(e) => {
                            eprintln!("[bench] relay {port}: accept: {e}");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
        };
        Ok(Relay {
            port,
            counts,
            stop,
            open,
            acceptor: Some(acceptor),
        })
    }

    /// The line's raw rate as an application sees it: `bytes` of random data written
    /// through a fresh relay (database host -> backup host) into a socket that reads and
    /// drops them, timed from the first byte written to the sink's acknowledgement of the
    /// last. Returns seconds.
    pub fn measure_raw(&self, bytes: usize) -> Result<f64, String> {
        let sink = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
        let sink_port = sink.local_addr().map_err(|e| e.to_string())?.port();
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
            .map_err(|e| format!("/dev/urandom: {e}"))?;
        let mut c = TcpStream::connect(("127.0.0.1", relay.port)).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        c.write_all(&data).map_err(|e| e.to_string())?;
        c.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
        let mut ack = Vec::new();
        c.read_to_end(&mut ack).map_err(|e| e.to_string())?;
        let seconds = t0.elapsed().as_secs_f64();
        let got = drain
            .join()
            .map_err(|_| "link sink panicked".to_string())?
            .map_err(|e| format!("link sink: {e}"))?;
        if got != bytes as u64 || ack != b"k" {
            return Err(format!(
                "link test: {got} of {bytes} bytes arrived (ack {ack:?})"
            ));
        }
        Ok(seconds)
    }
}

impl Relay {
    pub fn moved(&self) -> Moved {
        Moved {
            to_target: self.counts.to_target.load(Ordering::Relaxed),
            from_target: self.counts.from_target.load(Ordering::Relaxed),
            connections: self.counts.connections.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for (a, b) in self.open.lock().unwrap_or_else(|e| e.into_inner()).values() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

/// Connect to the target and pump both ways, each direction through its bucket.
fn forward(
    client: TcpStream,
    target: &Target,
    up: &Arc<Bucket>,
    down: &Arc<Bucket>,
    counts: &Arc<Counts>,
    open: &Open,
) -> Result<(), String> {
    client.set_nonblocking(false).map_err(|e| e.to_string())?;
    let _ = client.set_nodelay(true);
    let server = match target {
        Target::Tcp(p) => {
            let s = TcpStream::connect(("127.0.0.1", *p))
                .map_err(|e| format!("connect 127.0.0.1:{p}: {e}"))?;
            let _ = s.set_nodelay(true);
            Stream::Tcp(s)
        }
        Target::Unix(path) => Stream::Unix(
            UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.display()))?,
        ),
    };
    let client = Stream::Tcp(client);
    let id = counts.connections.fetch_add(1, Ordering::Relaxed);
    let clone = |s: &Stream| s.try_clone().map_err(|e| e.to_string());
    open.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, (clone(&client)?, clone(&server)?));
    // Forgotten (its sockets closed) when both directions are done.
    let guard = Arc::new(Forget {
        id,
        open: open.clone(),
    });
    let (c2, s2) = (clone(&client)?, clone(&server)?);
    let (up, down, counts2, guard2) = (up.clone(), down.clone(), counts.clone(), guard.clone());
    let counts = counts.clone();
    std::thread::spawn(move || {
        pump(client, server, &up, &counts.to_target);
        drop(guard);
    });
    std::thread::spawn(move || {
        pump(s2, c2, &down, &counts2.from_target);
        drop(guard2);
    });
    Ok(())
}

/// The open connections of a relay, by number.
type Open = Arc<Mutex<std::collections::HashMap<u64, (Stream, Stream)>>>;

struct Forget {
    id: u64,
    open: Open,
}

impl Drop for Forget {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Copy `from` to `to` at the bucket's rate until `from` ends; then end `to`'s writing
/// (a half-close, as TCP carries it).
fn pump(mut from: Stream, mut to: Stream, bucket: &Bucket, counter: &AtomicU64) {
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
        bucket.take(n);
        if to.write_all(&buf[..n]).is_err() {
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown(Shutdown::Write);
}

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
        let link = Link::new(8); // 1 MB/s
        let relay = link.relay(Host::Backup, Target::Tcp(port)).unwrap();
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
}
