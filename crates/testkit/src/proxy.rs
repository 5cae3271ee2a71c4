//! A loopback HTTP proxy in front of a test storage server, to break the network in the
//! ways a real one breaks: it can lose the answer to one chosen request after the server
//! has acted on it (the case create-only writes must survive), refuse requests as a server
//! that is down does, and strip a request header (a store that ignores conditional writes).
//!
//! It speaks just enough HTTP/1.1 for object_store's requests: one request per upstream
//! connection (sent with `Connection: close`, so the answer ends where the stream does),
//! and the answer passed back with `Connection: close` too, so every request of the client
//! travels on a connection of its own and a dropped answer hits exactly one request.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// The proxy; it listens on `port` until dropped.
pub struct FaultProxy {
    pub port: u16,
    rules: Arc<Mutex<Rules>>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> FaultProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        let rules = Arc::new(Mutex::new(Rules::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, st) = (rules.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let r = r.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream_port, &r);
                });
            }
        });
        FaultProxy { port, rules, stop }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Lose the answer to the next `method` request whose request line (`PUT /bucket/key
    /// HTTP/1.1`) contains `needle`, after the server has handled it.
    pub fn drop_answer_to(&self, method: &str, needle: &str) {
        let mut r = self.rules.lock().unwrap();
        r.drop_answer = Some((method.to_string(), needle.to_string()));
    }

    /// Request lines whose answers were lost so far (a test checks its fault really hit).
    pub fn dropped(&self) -> Vec<String> {
        self.rules.lock().unwrap().dropped.clone()
    }

    /// Is a planned answer loss still waiting for its request?
    pub fn drop_pending(&self) -> bool {
        self.rules.lock().unwrap().drop_answer.is_some()
    }

    /// Refuse (close unanswered) every request whose request line contains `needle`; an
    /// empty needle refuses everything. `None` lets everything through again.
    pub fn refuse(&self, needle: Option<&str>) {
        self.rules.lock().unwrap().refuse = needle.map(str::to_string);
    }

    /// Forward requests without header `name` (e.g. `if-none-match`: the server then
    /// ignores create-only conditions, as some S3-compatible stores do); `None` stops.
    pub fn strip_header(&self, name: Option<&str>) {
        self.rules.lock().unwrap().strip_header = name.map(str::to_ascii_lowercase);
    }

    /// How many requests were refused so far.
    pub fn refused(&self) -> u64 {
        self.rules.lock().unwrap().refused
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wake the accept loop
    }
}

/// Serve the requests of one client connection, one at a time.
fn serve(mut client: TcpStream, upstream_port: u16, rules: &Mutex<Rules>) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut pending = Vec::new();
    let Some((head, body)) = read_request(&mut client, &mut pending)? else {
        return Ok(());
    };
    let line = String::from_utf8_lossy(&head[..head.iter().position(|b| *b == b'\r').unwrap_or(0)])
        .to_string();
    let method = line.split(' ').next().unwrap_or_default().to_string();
    let (refuse, drop_answer, strip) = {
        let mut r = rules.lock().unwrap();
        let refuse = r.refuse.as_ref().is_some_and(|n| line.contains(n.as_str()));
        if refuse {
            r.refused += 1;
        }
        let drop_answer = !refuse
            && r.drop_answer
                .as_ref()
                .is_some_and(|(m, n)| *m == method && line.contains(n.as_str()));
        if drop_answer {
            r.drop_answer = None;
        }
        (refuse, drop_answer, r.strip_header.clone())
    };
    if refuse {
        return client.shutdown(Shutdown::Both);
    }
    let mut upstream = TcpStream::connect(("127.0.0.1", upstream_port))?;
    let head = match strip {
        Some(name) => without_header(&head, &name),
        None => head,
    };
    upstream.write_all(&with_connection_close(&head))?;
    upstream.write_all(&body)?;
    let mut answer = Vec::new();
    upstream.read_to_end(&mut answer)?;
    if drop_answer {
        // The server acted on the request; its answer never arrives.
        rules.lock().unwrap().dropped.push(line);
        return client.shutdown(Shutdown::Both);
    }
    let split = find(&answer, b"\r\n\r\n").map_or(answer.len(), |i| i + 4);
    client.write_all(&with_connection_close(&answer[..split]))?;
    client.write_all(&answer[split..])?;
    client.shutdown(Shutdown::Both)
}

/// Read one request: its head (through the blank line) and its body (Content-Length bytes).
/// `None` when the client closed the connection first.
fn read_request(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut chunk = [0u8; 64 * 1024];
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = buf[..head_end].to_vec();
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(
        !text.contains("transfer-encoding: chunked"),
        "FaultProxy does not handle chunked request bodies"
    );
    let length: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    while buf.len() < head_end + length {
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[head_end..head_end + length].to_vec();
    Ok(Some((head, body)))
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
