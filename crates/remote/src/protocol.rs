//! The agent protocol: frames on a byte stream (the agent's stdin and stdout under SSH).
//!
//! A frame is `u32 LE length of the rest`, `u32 LE length of the header`, the header (one
//! JSON object, a [`Message`] tagged by its `msg` field), then the body (raw bytes: an
//! object's content). Both sides open with a hello frame naming the protocol version; a
//! side that reads another version says so and stops, because the frames that follow
//! would be misread. After the hellos the side that uses the repository sends requests,
//! each with an `id` of its choosing, and the side that holds it answers each request
//! once, with the same `id`, in whatever order they complete.
//!
//! Two sessions exist. `agent repo` (repo-remote): the client uses the repository the
//! agent serves. `agent run` (pg-remote): the client (on the backup host) sends one
//! [`Job`], then serves its repository to the agent (on the database host), which runs
//! the job there and ends with one [`Done`].
//!
//! Neither side trusts the other with more than its part. A [`Job`] names one of three
//! jobs and a few per-job choices, never a command line, an option the database host owns
//! or an environment; a holder serves only its peer's stanzas, append-only (see
//! `agent::Policy`).
//!
//! `docs/remote-protocol.md` specifies the messages; [`PROTOCOL_VERSION`] changes with any
//! change an older peer would misread.

use serde::{Deserialize, Serialize};
use std::io::Read;

/// Version of the frames and messages below. 3: `job` replaced `run` (a typed job instead
/// of a command line and environment).
pub const PROTOCOL_VERSION: u32 = 3;

/// The hello's `hello` field: what speaks.
pub const HELLO: &str = "pgstrata-agent";

/// Largest frame accepted: bounds what a corrupt or hostile length can make a side
/// allocate. Objects are written whole (packs are far smaller than this).
pub const MAX_FRAME: usize = 1 << 30;

/// The first frame each side sends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    pub hello: String,
    pub protocol: u32,
    /// The pgstrata version, for messages.
    pub version: String,
}

impl Hello {
    pub fn ours() -> Hello {
        Hello {
            hello: HELLO.to_string(),
            protocol: PROTOCOL_VERSION,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Ok when `self` (the peer's hello) speaks our protocol; else why not, for the user.
    pub fn check(&self, peer: &str) -> crate::Result<()> {
        use crate::{Error, ErrorKind::Protocol};
        if self.hello != HELLO {
            return Err(Error::new(
                Protocol,
                format!(
                    "{peer} did not answer as a pgstrata agent (said '{}')",
                    self.hello
                ),
            ));
        }
        if self.protocol != PROTOCOL_VERSION {
            return Err(Error::new(Protocol, format!(
                "{peer} speaks agent protocol {} (pgstrata {}), this pgstrata {} speaks {}: install the same pgstrata version on both hosts",
                self.protocol,
                self.version,
                env!("CARGO_PKG_VERSION"),
                PROTOCOL_VERSION
            )));
        }
        Ok(())
    }
}

/// Operations on the repository's objects.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Write the body as `key`; `create_only` refuses when it exists.
    Put,
    /// Read `key` (or its `range`); `head_only` answers its metadata alone.
    Get,
    /// Every object under `key` (a prefix), recursively.
    List,
    /// The objects directly under `key` and the common prefixes one level down.
    ListDirs,
    Delete,
    /// Copy `key` to `to`; `create_only` refuses when `to` exists.
    Copy,
    /// Write `key` and then `to`, both create-only, with the object the holder rebuilds
    /// from the body (a patch) and the object `base` it already holds; the answer's `hash`
    /// is the written object's. Holders without a rebuilder answer `not_supported`.
    PutPatch,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub op: Op,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<[u64; 2]>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub create_only: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub head_only: bool,
    /// PutPatch: the object the patch is against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Get: the requester holds the object's bytes with this BLAKE3 (hex); when they are
    /// still the object's, the answer says `unchanged` and carries no body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unless_hash: Option<String>,
    /// Get from a holder that reseals for the requester (a session key's agent): the
    /// frames `[offset, length]` of this pack, each opened; the answer's body is each
    /// opened frame after its length (u32 big-endian), in this order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_frames: Option<Vec<[u64; 2]>>,
}

impl Request {
    /// A request for `op` on `key` with every other field unset (id 0: the sender sets it).
    pub fn new(op: Op, key: impl Into<String>) -> Request {
        Request {
            id: 0,
            op,
            key: key.into(),
            to: None,
            range: None,
            create_only: false,
            head_only: false,
            base: None,
            unless_hash: None,
            open_frames: None,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What went wrong, in the classes the client's object store reports (and pgstrata's
/// retry logic tells apart: only `Other` is worth retrying).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    NotFound,
    AlreadyExists,
    Precondition,
    NotSupported,
    PermissionDenied,
    InvalidPath,
    Other,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// One object's metadata.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Meta {
    pub key: String,
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Answer {
    pub id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    /// Get: the object's metadata; the body holds `range` of its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<[u64; 2]>,
    /// Put: the written object's e-tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
    /// Get with `unless_hash`: the object's bytes have that hash; no body follows.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unchanged: bool,
    /// PutPatch: BLAKE3 (hex) of the bytes written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// List, ListDirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<Meta>,
    /// ListDirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
}

/// The jobs an `agent run` does for the backup host.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum JobKind {
    StanzaCreate,
    Check,
    Backup,
}

impl JobKind {
    pub const ALL: [JobKind; 3] = [JobKind::StanzaCreate, JobKind::Check, JobKind::Backup];

    /// The pgstrata command that does this job.
    pub fn command(self) -> &'static str {
        match self {
            JobKind::StanzaCreate => "stanza-create",
            JobKind::Check => "check",
            JobKind::Backup => "backup",
        }
    }

    pub fn from_command(command: &str) -> Option<JobKind> {
        JobKind::ALL.into_iter().find(|j| j.command() == command)
    }
}

/// `agent run`: the job the backup host asks the database host's agent to do (pg-remote).
/// The agent takes its own settings (data directory, connection, standby) from its own
/// configuration, and from this only `choices`, each an option the option table lets the
/// backup host choose for this job; anything else is refused. The agent then reaches the
/// repository through requests back over the same stream, and ends with [`Done`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Job {
    pub job: JobKind,
    /// The stanza (a name; the agent refuses another than its forced command names).
    pub stanza: String,
    /// `(option, value)`: per-job choices such as `type`, `compress-type`, `process-max`.
    #[serde(default)]
    pub choices: Vec<(String, String)>,
    /// An encrypted stanza's session key (hex, `cipher::SessionKey`): what the agent seals
    /// with. It opens only what the agent writes and what the backup host reseals for it;
    /// the passphrase and the master keys stay on the backup host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealing: Option<String>,
}

/// The end of an `agent run`: what the command printed on standard output, its exit code,
/// and its error message when it failed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Done {
    pub exit_code: i32,
    #[serde(default)]
    pub stdout: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Every frame's header: one message, tagged by its `msg` field.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Message {
    Hello(Hello),
    Request(Request),
    Answer(Answer),
    Job(Job),
    Done(Done),
}

/// Encode one frame.
pub fn frame(message: &Message, body: &[u8]) -> Vec<u8> {
    let mut out = frame_head(message, body.len());
    out.extend_from_slice(body);
    out
}

/// A frame without its body: the lengths and the header, for a writer that sends a large
/// body from where it is instead of copying it behind them.
pub fn frame_head(message: &Message, body_len: usize) -> Vec<u8> {
    let header = serde_json::to_vec(message).expect("protocol headers serialize");
    let rest = 4 + header.len() + body_len;
    let mut out = Vec::with_capacity(8 + header.len() + body_len.min(64 << 10));
    out.extend_from_slice(&(rest as u32).to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out
}

/// Read one frame: its message and body. `Ok(None)` at a clean end of stream.
pub fn read_frame<R: Read>(r: &mut R) -> std::io::Result<Option<(Message, bytes::Bytes)>> {
    Ok(read_frame_reserving(r, |_| ())?.map(|(m, b, ())| (m, b)))
}

/// [`read_frame`], calling `reserve` with the frame's length before a buffer of that size
/// is allocated, and returning what it returned beside the frame: a holder accounts for
/// (and waits for room for) the bytes a peer sends before it holds them.
pub fn read_frame_reserving<R: Read, T>(
    r: &mut R,
    reserve: impl FnOnce(usize) -> T,
) -> std::io::Result<Option<(Message, bytes::Bytes, T)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let rest = u32::from_le_bytes(len) as usize;
    if !(4..=MAX_FRAME).contains(&rest) {
        return Err(bad(format!("a frame of {rest} bytes")));
    }
    let reserved = reserve(rest);
    let mut buf = vec![0u8; rest];
    r.read_exact(&mut buf)?;
    let header_len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
    if header_len > rest - 4 {
        return Err(bad(format!(
            "a header of {header_len} bytes in a frame of {rest}"
        )));
    }
    let mut buf = bytes::Bytes::from(buf);
    let body = buf.split_off(4 + header_len);
    Ok(Some((parse(&buf[4..])?, body, reserved)))
}

/// Parse a frame's header.
fn parse(header: &[u8]) -> std::io::Result<Message> {
    serde_json::from_slice(header).map_err(|e| {
        bad(format!(
            "unreadable header ({e}): {}",
            String::from_utf8_lossy(&header[..header.len().min(200)])
        ))
    })
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("agent protocol: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_lying_length_is_refused() {
        let req = Request {
            id: 7,
            op: Op::Put,
            key: "a/b".into(),
            to: None,
            range: None,
            create_only: true,
            head_only: false,
            base: None,
            unless_hash: Some("ab".into()),
            open_frames: Some(vec![[0, 10]]),
        };
        let req = Message::Request(req);
        let mut bytes = frame(&req, b"body bytes");
        bytes.extend(frame(&Message::Hello(Hello::ours()), b""));
        let mut r = &bytes[..];
        let (m, body) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(m, req);
        assert_eq!(&body[..], b"body bytes");
        let (m, body) = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(m, Message::Hello(Hello::ours()));
        assert!(body.is_empty());
        assert!(read_frame(&mut r).unwrap().is_none());

        let mut lying = frame(&req, b"x");
        lying[4..8].copy_from_slice(&1000u32.to_le_bytes());
        let err = read_frame(&mut &lying[..]).unwrap_err();
        assert!(err.to_string().contains("a header of 1000 bytes"), "{err}");
        let huge = (u32::MAX).to_le_bytes();
        assert!(read_frame(&mut &huge[..]).is_err());
    }

    #[test]
    fn another_protocol_version_is_refused_with_both_versions_named() {
        let mut theirs = Hello::ours();
        theirs.protocol = PROTOCOL_VERSION + 1;
        theirs.version = "9.9.9".into();
        let e = theirs.check("the agent on db1").unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Protocol);
        let msg = e.to_string();
        assert!(
            msg.contains("the agent on db1 speaks agent protocol 4 (pgstrata 9.9.9)"),
            "{msg}"
        );
        assert!(msg.contains("install the same pgstrata version"), "{msg}");
        assert!(Hello::ours().check("x").is_ok());
    }
}
