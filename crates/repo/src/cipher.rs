//! Repository encryption: everything a stanza stores is authenticated, and everything but
//! a small public header is encrypted, so whoever can read or write the bucket can neither
//! read the database nor forge, swap, replay or truncate what pgstrata will accept.
//!
//! - Random 256-bit **master keys** per stanza, one per **generation**: stanza-create
//!   makes generation 1, and every `key-remove` starts the next one, which seals
//!   everything written afterwards. They never leave memory unwrapped.
//! - **Key files** (`<stanza>/keys/<id>.json`, in the clear: they are the public header)
//!   each wrap the master keys of the generations that existed when they were made, and an
//!   X25519 private key, with a key derived from one passphrase by Argon2id.
//! - **Grants** (`<stanza>/keys/<id>-<generation>.grant`): a new generation's master key
//!   (and the previous one, which proves the grant's author held it) sealed to a key
//!   file's X25519 public key, so that `key-remove`, which knows one passphrase, can hand
//!   the new master key to the other remaining key files and not to the removed one. Why
//!   revoke: a key file is as public as the repository, so a removed key file and its
//!   passphrase kept by someone would otherwise open every backup written afterwards.
//! - **Sealed objects** (stanza record, manifests, WAL objects, change maps, the lock):
//!   header (naming the generation from 2 on), random salt, AES-256-GCM ciphertext and tag.
//!   Each object gets its own key, HKDF-SHA256 of the master key and the salt, so a zero
//!   nonce never repeats under one key. The object's name is associated data: an object
//!   copied over another fails.
//! - **Sealed frames** of packs: each frame on its own (ranged reads and delta restore keep
//!   working), salt, ciphertext and tag, after a 12-byte generation header from generation
//!   2 on; associated data is the pack's name and the frame's offset in it, so moving a
//!   frame or a pack is detected.
//! - **Session keys**: the backup host of a `pg-remote` backup holds the passphrase; the
//!   database host's agent, which writes the backup, must not. So the backup host derives
//!   a session key from the newest master key and a random session id (HKDF-SHA256) and
//!   gives the agent that key alone. What the agent seals names the session id in its
//!   header (object envelope version 3, frame magic `PGSTRFRS`), and any holder of the
//!   master key derives the session key again to open it. A session key opens only what
//!   was sealed under it: the agent's own writes, and the objects the backup host reseals
//!   for it (`Reseal`); it opens no other backup.
//!
//! docs/repository-format.md §15 is the specification. AES-GCM, HKDF and X25519 come from
//! aws-lc-rs (hardware AES and carry-less multiply), Argon2id from RustCrypto; every key is
//! zeroized when dropped.

use crate::layout::{self, KeysObject};
use crate::{Error, ErrorKind, Named, Result};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey, X25519};
use aws_lc_rs::hkdf::{Salt, HKDF_SHA256};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use zeroize::Zeroizing;

/// Magic of a sealed object, the first 8 bytes.
pub const SEAL_MAGIC: &[u8; 8] = b"PGSTRSEA";
/// Envelope version of objects sealed under master key generation 1 (header bytes 10..16
/// zero): what every pgstrata before key rotation wrote and reads.
pub const SEAL_VERSION_1: u8 = 1;
/// Envelope version of objects sealed under a later generation: bytes 10..14 hold it.
pub const SEAL_VERSION: u8 = 2;
/// Envelope version of objects sealed under a session key (bytes 10..14 hold the
/// generation; the session id follows the header).
pub const SEAL_VERSION_SESSION: u8 = 3;
/// Cipher id of AES-256-GCM in the envelope.
pub const CIPHER_AES_256_GCM: u8 = 1;
/// Header of a sealed object: magic, version, cipher id, generation (version 2) or zero.
pub const SEAL_HEADER_LEN: usize = 16;
/// Random salt of each sealed object and frame.
pub const SALT_LEN: usize = 16;
/// AES-GCM tag.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed object adds to its content.
pub const OBJECT_OVERHEAD: usize = SEAL_HEADER_LEN + SALT_LEN + TAG_LEN;
/// Magic of a frame sealed under master key generation 2 or later, then the generation
/// (u32 big-endian). Generation-1 frames have no header: they start with their salt.
pub const FRAME_MAGIC: &[u8; 8] = b"PGSTRFRG";
/// The header of a frame sealed under generation 2 or later.
pub const FRAME_HEADER_LEN: usize = 12;
/// Magic of a frame sealed under a session key, then the generation (u32 big-endian) and
/// the session id.
pub const FRAME_SESSION_MAGIC: &[u8; 8] = b"PGSTRFRS";
/// The id of a session key: random, in the header of everything sealed under it.
pub const SESSION_ID_LEN: usize = 16;
/// The header of a frame sealed under a session key.
pub const FRAME_SESSION_HEADER_LEN: usize = 12 + SESSION_ID_LEN;

/// HKDF info of a sealed object's key.
const OBJECT_INFO: &[u8] = b"pgstrata object v1";
/// HKDF info of the local key cache's wrapping key (not a repository object).
const CACHE_INFO: &[u8] = b"pgstrata key cache v2";
/// HKDF info of a sealed frame's key.
const FRAME_INFO: &[u8] = b"pgstrata frame v1";
/// HKDF info of a session key (derived from a master key and the session id).
const SESSION_INFO: &[u8] = b"pgstrata session v1";
/// HKDF info of a grant's key.
const GRANT_INFO: &[u8] = b"pgstrata grant v2";
/// HKDF info of a membership tag's key.
const MEMBER_INFO: &[u8] = b"pgstrata member v2";
/// Prefix of a format-1 key file's associated data.
const KEY_AAD_PREFIX_1: &str = "pgstrata key v1";
/// Prefix of a format-2 key file's associated data.
const KEY_AAD_PREFIX: &str = "pgstrata key v2";
/// Version of the key file format written: 2 (generations, X25519). Format 1 (one master
/// key) is still read.
pub const KEY_FILE_VERSION: u32 = 2;
/// Version of the grant format.
pub const GRANT_VERSION: u32 = 2;

/// Default Argon2id parameters for new key files.
pub const DEFAULT_M_COST_KIB: u32 = 64 * 1024;
pub const DEFAULT_T_COST: u32 = 3;
pub const DEFAULT_P_COST: u32 = 1;
/// Tests only: the memory (KiB) of new key files' Argon2id, so test suites do not spend
/// 64 MiB per command. Never set it in production.
pub const TEST_KDF_MEMORY_ENV: &str = "PGSTRATA_TEST_KDF_MEMORY_KIB";
/// Largest parameters a reader accepts from a key file: a key file is as public as the
/// repository, and its parameters size an allocation and the time every command spends.
/// 1 GiB of memory, 10 passes, 16 lanes; a key file asking for more is skipped.
pub const MAX_M_COST_KIB: u32 = 1024 * 1024;
pub const MAX_T_COST: u32 = 10;
pub const MAX_P_COST: u32 = 16;

// Names as configured (`repo-cipher-type`).
crate::named! {
    #[derive(Default)]
    pub enum CipherType { #[default] None = "none", Aes256Gcm = "aes-256-gcm" }
}

/// A passphrase: zeroized when dropped, never shown by `Debug`.
#[derive(Clone)]
pub struct Passphrase(Zeroizing<String>);

impl Passphrase {
    pub fn new(s: impl Into<String>) -> Passphrase {
        Passphrase(Zeroizing::new(s.into()))
    }
    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
    /// A digest of the passphrase, to key a cache without keeping the passphrase there.
    pub fn fingerprint(&self) -> [u8; 32] {
        *blake3::hash(self.bytes()).as_bytes()
    }
}

impl std::fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A 256-bit key, zeroized when dropped.
type Key = Zeroizing<[u8; 32]>;

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    aws_lc_rs::rand::fill(&mut b).expect("system random number generator");
    b
}

/// The AES-256-GCM key HKDF-SHA256 derives from `ikm` (a master key, an X25519 shared
/// secret, or a passphrase for the local key cache), `salt` and `info`.
fn derive(ikm: &[u8], salt: &[u8], info: &[u8]) -> LessSafeKey {
    let prk = Salt::new(HKDF_SHA256, salt).extract(ikm);
    let info = [info];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .expect("HKDF output of one AES key");
    LessSafeKey::new(UnboundKey::from(okm))
}

/// 32 bytes of key material HKDF-SHA256 derives from `ikm`, `salt` and `info` (a session key).
fn derive_key(ikm: &[u8], salt: &[u8], info: &[u8]) -> Key {
    struct Len32;
    impl aws_lc_rs::hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let prk = Salt::new(HKDF_SHA256, salt).extract(ikm);
    let info = [info];
    let mut key = Zeroizing::new([0u8; 32]);
    prk.expand(&info, Len32)
        .and_then(|okm| okm.fill(&mut key[..]))
        .expect("HKDF output of 32 bytes");
    key
}

fn aead_key(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"))
}

/// Each derived key seals exactly one message, so the nonce may be constant.
fn zero_nonce() -> Nonce {
    Nonce::assume_unique_for_key([0u8; NONCE_LEN])
}

/// The open master keys of a stanza, by generation: seal with the newest, open with the
/// one an object or frame names.
pub struct Cipher {
    /// Empty in a session cipher, which holds only [`Cipher::session`].
    masters: BTreeMap<u32, Key>,
    /// The session key this cipher seals with (the agent of a `pg-remote` backup), instead
    /// of a master key.
    session: Option<SessionKey>,
    /// The stanza's newest generation, when this key does not hold it (the key was
    /// removed, or missed a rotation): it still opens what older generations sealed, and
    /// seals nothing, so nothing new is written under a revoked master key.
    behind: Option<u32>,
    /// The key file that opened it (for messages).
    pub key_id: String,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cipher")
            .field("key_id", &self.key_id)
            .field("generations", &self.masters.keys().collect::<Vec<_>>())
            .field("session", &self.session.as_ref().map(|s| hex::encode(s.id)))
            .finish_non_exhaustive()
    }
}

/// The envelope header of an object sealed under generation `generation`.
fn seal_header(generation: u32) -> [u8; SEAL_HEADER_LEN] {
    let mut h = [0u8; SEAL_HEADER_LEN];
    h[..8].copy_from_slice(SEAL_MAGIC);
    h[9] = CIPHER_AES_256_GCM;
    if generation == 1 {
        h[8] = SEAL_VERSION_1;
    } else {
        h[8] = SEAL_VERSION;
        h[10..14].copy_from_slice(&generation.to_be_bytes());
    }
    h
}

/// Associated data of a sealed object: its header and its name.
fn object_aad(header: &[u8], key: &str) -> Vec<u8> {
    let mut aad = header.to_vec();
    aad.extend_from_slice(key.as_bytes());
    aad
}

/// Associated data of a cached key ring: what it is for and which key file opened it.
fn cache_aad(context: &str, key_id: &str) -> Vec<u8> {
    format!(
        "{}\0{context}\0{key_id}",
        String::from_utf8_lossy(CACHE_INFO)
    )
    .into_bytes()
}

/// Associated data of a sealed frame: its pack's name, its offset in the pack, and its
/// generation header (none for generation 1).
fn frame_aad(pack_key: &str, offset: u64, header: &[u8]) -> Vec<u8> {
    let mut aad = pack_key.as_bytes().to_vec();
    aad.extend_from_slice(&offset.to_be_bytes());
    aad.extend_from_slice(header);
    aad
}

/// The generation header of a frame sealed under `generation` (2 or later).
fn frame_header(generation: u32) -> [u8; FRAME_HEADER_LEN] {
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[..8].copy_from_slice(FRAME_MAGIC);
    h[8..].copy_from_slice(&generation.to_be_bytes());
    h
}

/// The envelope header of an object sealed under a session key of `generation`; the
/// session id follows it.
fn session_seal_header(generation: u32) -> [u8; SEAL_HEADER_LEN] {
    let mut h = [0u8; SEAL_HEADER_LEN];
    h[..8].copy_from_slice(SEAL_MAGIC);
    h[8] = SEAL_VERSION_SESSION;
    h[9] = CIPHER_AES_256_GCM;
    h[10..14].copy_from_slice(&generation.to_be_bytes());
    h
}

/// The header of a frame sealed under `session`.
fn session_frame_header(session: &SessionKey) -> [u8; FRAME_SESSION_HEADER_LEN] {
    let mut h = [0u8; FRAME_SESSION_HEADER_LEN];
    h[..8].copy_from_slice(FRAME_SESSION_MAGIC);
    h[8..12].copy_from_slice(&session.generation.to_be_bytes());
    h[12..].copy_from_slice(&session.id);
    h
}

/// Bytes an object sealed under a session key adds to its content.
pub const SESSION_OBJECT_OVERHEAD: usize = OBJECT_OVERHEAD + SESSION_ID_LEN;

/// A session key ([`Cipher::session_for_peer`]): the generation of the master key it comes
/// from, its random id, and the key. It travels to the agent as [`SessionKey::to_wire`].
pub struct SessionKey {
    generation: u32,
    id: [u8; SESSION_ID_LEN],
    key: Key,
}

impl SessionKey {
    /// Hex of the generation (4 bytes), the id and the key: what the backup host sends.
    pub fn to_wire(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(Vec::with_capacity(4 + SESSION_ID_LEN + 32));
        raw.extend_from_slice(&self.generation.to_be_bytes());
        raw.extend_from_slice(&self.id);
        raw.extend_from_slice(&self.key[..]);
        Zeroizing::new(hex::encode(&raw[..]))
    }

    /// What [`SessionKey::to_wire`] made.
    pub fn from_wire(wire: &str) -> Result<SessionKey> {
        let raw = Zeroizing::new(hex::decode(wire).unwrap_or_default());
        if raw.len() != 4 + SESSION_ID_LEN + 32 {
            return Err(Error::new(
                ErrorKind::Invalid,
                "the session key sent is not 52 bytes of hex",
            ));
        }
        let generation = u32::from_be_bytes(raw[..4].try_into().expect("4 bytes"));
        if generation == 0 {
            return Err(Error::new(
                ErrorKind::Invalid,
                "a session key of generation 0",
            ));
        }
        let mut id = [0u8; SESSION_ID_LEN];
        id.copy_from_slice(&raw[4..4 + SESSION_ID_LEN]);
        let mut key = Zeroizing::new([0u8; 32]);
        key.copy_from_slice(&raw[4 + SESSION_ID_LEN..]);
        Ok(SessionKey {
            generation,
            id,
            key,
        })
    }
}

/// The backup host's side of a session ([`pgstrata_remote::agent::Reseal`]): objects the
/// agent reads are opened with the master keys and sealed again under its session key.
/// Packs and key files (not sealed whole) pass as stored.
pub struct SessionReseal {
    master: std::sync::Arc<Cipher>,
    session: Cipher,
}

impl SessionReseal {
    pub fn new(master: std::sync::Arc<Cipher>, session: SessionKey) -> SessionReseal {
        SessionReseal {
            master,
            session: Cipher::from_session(session),
        }
    }
}

impl pgstrata_remote::agent::Reseal for SessionReseal {
    fn open(&self, key: &str, stored: &[u8]) -> pgstrata_remote::Result<Option<Vec<u8>>> {
        if !is_sealed(stored) {
            return Ok(None);
        }
        // A manifest's copy is sealed under the manifest's name (`Storage::put_new_twice`).
        self.master
            .open_object(key, stored)
            .or_else(|e| match layout::copied_from(key) {
                Some(original) => self.master.open_object(original, stored),
                None => Err(e),
            })
            .map(Some)
            .map_err(resealing(key))
    }

    fn seal(&self, key: &str, plain: &[u8]) -> pgstrata_remote::Result<Vec<u8>> {
        self.session.seal_object(key, plain).map_err(resealing(key))
    }

    fn open_frame(
        &self,
        key: &str,
        offset: u64,
        stored: &[u8],
    ) -> pgstrata_remote::Result<Vec<u8>> {
        let mut out = Vec::new();
        let what = format!("frame at {key} offset {offset}");
        self.master
            .open_frame_into(key, offset, stored, &mut out, &what)
            .map_err(resealing(&what))?;
        Ok(out)
    }
}

/// A repository error of resealing `what` for a session, as the remote layer's.
fn resealing(what: &str) -> impl FnOnce(Error) -> pgstrata_remote::Error + '_ {
    move |e| {
        pgstrata_remote::Error::with_source(
            pgstrata_remote::ErrorKind::Reseal,
            format!("reseal {what} for the agent"),
            e,
        )
    }
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SessionKey(generation {}, id {})",
            self.generation,
            hex::encode(self.id)
        )
    }
}

/// Whether stored bytes are a sealed object (start with the envelope's magic).
pub fn is_sealed(obj: &[u8]) -> bool {
    obj.starts_with(SEAL_MAGIC)
}

fn damaged(what: &str) -> Error {
    Error::corrupt(format!(
        "{what} fails authentication: it is damaged, truncated, or not the object stored under this name (the repository is damaged or was tampered with)"
    ))
}

impl Cipher {
    /// A new random master key, generation 1.
    pub fn generate() -> Cipher {
        Cipher {
            masters: [(1, Zeroizing::new(random::<32>()))].into(),
            session: None,
            behind: None,
            key_id: String::new(),
        }
    }

    /// The newest generation it holds: what it seals with.
    pub fn generation(&self) -> u32 {
        match (&self.session, self.masters.keys().next_back()) {
            (Some(s), _) => s.generation,
            (None, Some(g)) => *g,
            (None, None) => unreachable!("a cipher holds a master key or a session key"),
        }
    }

    /// A new session key for a writer that must not hold the master keys (the database
    /// host's agent of a `pg-remote` backup): derived from the newest master key and a
    /// random session id. Refused when this key is behind, as sealing is.
    pub fn session_for_peer(&self) -> Result<SessionKey> {
        let (generation, master) = self.sealing_key()?;
        let id = random::<SESSION_ID_LEN>();
        Ok(SessionKey {
            generation,
            id,
            key: derive_key(&master[..], &id, SESSION_INFO),
        })
    }

    /// Whether this cipher holds a session key, not master keys.
    pub fn is_session(&self) -> bool {
        self.session.is_some()
    }

    /// A cipher that seals with `session` only and opens only what was sealed under it.
    pub fn from_session(session: SessionKey) -> Cipher {
        Cipher {
            masters: BTreeMap::new(),
            key_id: format!("session {}", hex::encode(session.id)),
            session: Some(session),
            behind: None,
        }
    }

    /// The key of session `id` of `generation`: this cipher's own session, or derived from
    /// the master key of that generation.
    fn session_key(&self, generation: u32, id: &[u8], what: &str) -> Result<Key> {
        match &self.session {
            Some(s) if s.generation == generation && s.id[..] == *id => Ok(s.key.clone()),
            Some(_) => Err(Error::new(
                ErrorKind::Invalid,
                format!("{what} was not sealed under this session's key"),
            )),
            None => Ok(derive_key(
                &self.master(generation, what)?[..],
                id,
                SESSION_INFO,
            )),
        }
    }

    /// The same master keys and a new random one for the next generation (key-remove).
    pub fn rotated(&self) -> Result<Cipher> {
        self.sealing_key()?;
        let mut masters: BTreeMap<u32, Key> =
            self.masters.iter().map(|(g, k)| (*g, k.clone())).collect();
        masters.insert(self.generation() + 1, Zeroizing::new(random::<32>()));
        Ok(Cipher {
            masters,
            session: None,
            behind: None,
            key_id: self.key_id.clone(),
        })
    }

    /// The stanza's newest generation is `newest`: when this key lacks it, it stops
    /// sealing (reads of older generations still work).
    pub fn note_newest_generation(&mut self, newest: u32) {
        self.behind = (newest > self.generation()).then_some(newest);
    }

    /// The generation and master key to seal with; refused when the key is behind.
    fn sealing_key(&self) -> Result<(u32, &Key)> {
        if let Some(newest) = self.behind {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "key {} does not hold the stanza's newest master key (generation {newest}; it holds up to {}): it was removed from the stanza or missed a rotation, so it may read what was written before but writes nothing; use the passphrase of a current key (key-list)",
                    self.key_id,
                    self.generation()
                ),
            ));
        }
        let (g, k) = self.masters.iter().next_back().ok_or_else(|| {
            Error::new(
                ErrorKind::Invalid,
                "a session key seals objects and frames only (no key changes)",
            )
        })?;
        Ok((*g, k))
    }

    /// The master key of `generation`, or an error saying why it is not here.
    fn master(&self, generation: u32, what: &str) -> Result<&Key> {
        self.masters.get(&generation).ok_or_else(|| {
            Error::new(
                ErrorKind::Invalid,
                format!(
                    "{what} is sealed under master key generation {generation}, which key {} does not hold (it holds generations {}): it was written after that key was removed from the stanza (key-remove) or after it missed a rotation; use the passphrase of a current key (key-list)",
                    self.key_id,
                    self.masters.keys().map(|g| g.to_string()).collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// Seal the whole object stored as `key`, under the newest generation.
    pub fn seal_object(&self, key: &str, plain: &[u8]) -> Result<Vec<u8>> {
        if let Some(session) = &self.session {
            let header = session_seal_header(session.generation);
            let mut out = Vec::with_capacity(plain.len() + SESSION_OBJECT_OVERHEAD);
            out.extend_from_slice(&header);
            out.extend_from_slice(&session.id);
            let aad = object_aad(&out, key);
            seal_salted_into(&session.key[..], OBJECT_INFO, &aad, plain, &mut out);
            return Ok(out);
        }
        let (generation, master) = self.sealing_key()?;
        let header = seal_header(generation);
        let mut out = Vec::with_capacity(plain.len() + OBJECT_OVERHEAD);
        out.extend_from_slice(&header);
        let aad = object_aad(&header, key);
        seal_salted_into(&master[..], OBJECT_INFO, &aad, plain, &mut out);
        Ok(out)
    }

    /// Open the object stored as `key`: refused as damaged unless it was sealed under that
    /// very name with the master key its header names and is whole.
    pub fn open_object(&self, key: &str, sealed: &[u8]) -> Result<Vec<u8>> {
        if sealed.len() < OBJECT_OVERHEAD || !is_sealed(sealed) {
            return Err(damaged(key));
        }
        let (header, body) = sealed.split_at(SEAL_HEADER_LEN);
        if (header[8], header[9]) == (SEAL_VERSION_SESSION, CIPHER_AES_256_GCM) {
            if sealed.len() < SESSION_OBJECT_OVERHEAD {
                return Err(damaged(key));
            }
            let generation = u32::from_be_bytes(header[10..14].try_into().expect("4 bytes"));
            let (id, body) = body.split_at(SESSION_ID_LEN);
            let session_key = self.session_key(generation, id, key)?;
            let mut out = Vec::new();
            let aad = object_aad(&sealed[..SEAL_HEADER_LEN + SESSION_ID_LEN], key);
            open_salted_into(&session_key[..], OBJECT_INFO, &aad, body, &mut out)
                .ok_or_else(|| damaged(key))?;
            return Ok(out);
        }
        if self.masters.is_empty() {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{key} was not sealed under this session's key"),
            ));
        }
        let generation = match (header[8], header[9]) {
            (SEAL_VERSION_1, CIPHER_AES_256_GCM) => 1,
            (SEAL_VERSION, CIPHER_AES_256_GCM) => {
                u32::from_be_bytes(header[10..14].try_into().expect("4 bytes"))
            }
            (version, cipher) => {
                return Err(Error::new(
                    ErrorKind::Format,
                    format!(
                        "{key}: sealed with envelope version {version} cipher {cipher}, which this pgstrata does not know; upgrade pgstrata"
                    ),
                ))
            }
        };
        if generation < 2 && header[8] == SEAL_VERSION {
            return Err(damaged(key));
        }
        let master = self.master(generation, key)?;
        let mut out = Vec::new();
        let aad = object_aad(header, key);
        open_salted_into(&master[..], OBJECT_INFO, &aad, body, &mut out)
            .ok_or_else(|| damaged(key))?;
        Ok(out)
    }

    /// The master keys wrapped for the local key cache: salt, AES-256-GCM ciphertext and
    /// tag under HKDF-SHA256(passphrase, salt), bound to `context` (repository, stanza and
    /// the listing of its key files) and the id of the key file `key_id` that `pass` opens.
    /// Cheap to open for whoever has the passphrase, which is the point: Argon2id runs
    /// once per host, not once per command.
    pub fn wrap_for_cache(&self, pass: &Passphrase, context: &str, key_id: &str) -> Vec<u8> {
        let mut plain = Zeroizing::new(Vec::with_capacity(self.masters.len() * 36));
        for (g, k) in &self.masters {
            plain.extend_from_slice(&g.to_be_bytes());
            plain.extend_from_slice(&k[..]);
        }
        let mut out = Vec::with_capacity(SALT_LEN + plain.len() + TAG_LEN);
        let aad = cache_aad(context, key_id);
        seal_salted_into(pass.bytes(), CACHE_INFO, &aad, &plain, &mut out);
        out
    }

    /// Open what [`Cipher::wrap_for_cache`] wrote; `None` if it is not exactly that (other
    /// passphrase, context or key id, or damaged): the caller then derives the key anew.
    pub fn open_cached(
        wrapped: &[u8],
        pass: &Passphrase,
        context: &str,
        key_id: &str,
    ) -> Option<Cipher> {
        let mut plain = Zeroizing::new(Vec::new());
        let aad = cache_aad(context, key_id);
        open_salted_into(pass.bytes(), CACHE_INFO, &aad, wrapped, &mut plain)?;
        if plain.is_empty() || plain.len() % 36 != 0 {
            return None;
        }
        let masters = plain
            .chunks(36)
            .map(|c| {
                let mut k = Zeroizing::new([0u8; 32]);
                k.copy_from_slice(&c[4..]);
                (u32::from_be_bytes(c[..4].try_into().expect("4 bytes")), k)
            })
            .collect();
        Some(Cipher {
            masters,
            session: None,
            behind: None,
            key_id: key_id.to_string(),
        })
    }

    /// The oldest generation this cipher holds that `other` does not open as it does: one
    /// `other` lacks (`Err`) or holds under another master key (`Ok`). `None` when `other`
    /// opens everything this one can (what `copy` needs to carry frames as stored).
    pub fn generation_not_shared(&self, other: &Cipher) -> Option<std::result::Result<u32, u32>> {
        self.masters
            .iter()
            .find_map(|(g, key)| match other.masters.get(g) {
                None => Some(Err(*g)),
                Some(theirs) if theirs[..] != key[..] => Some(Ok(*g)),
                Some(_) => None,
            })
    }

    /// Bytes a frame sealed now adds to its compressed form.
    pub fn frame_overhead(&self) -> usize {
        let header = if self.session.is_some() {
            FRAME_SESSION_HEADER_LEN
        } else if self.generation() == 1 {
            0
        } else {
            FRAME_HEADER_LEN
        };
        header + SALT_LEN + TAG_LEN
    }

    /// Append frame `plain`, sealed as the frame at `offset` of pack `pack_key` under the
    /// newest generation, to `out`.
    pub fn seal_frame_into(
        &self,
        pack_key: &str,
        offset: u64,
        plain: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if let Some(session) = &self.session {
            let header = session_frame_header(session);
            out.extend_from_slice(&header);
            let aad = frame_aad(pack_key, offset, &header);
            seal_salted_into(&session.key[..], FRAME_INFO, &aad, plain, out);
            return Ok(());
        }
        let (generation, master) = self.sealing_key()?;
        let header: &[u8] = if generation == 1 {
            &[]
        } else {
            &frame_header(generation)
        };
        out.extend_from_slice(header);
        let aad = frame_aad(pack_key, offset, header);
        seal_salted_into(&master[..], FRAME_INFO, &aad, plain, out);
        Ok(())
    }

    /// Open the sealed frame at `offset` of pack `pack_key` into `out` (replacing its
    /// content); `what` names it in the error.
    pub fn open_frame_into(
        &self,
        pack_key: &str,
        offset: u64,
        sealed: &[u8],
        out: &mut Vec<u8>,
        what: &str,
    ) -> Result<()> {
        let first = self.masters.get(&1);
        if sealed.len() >= FRAME_SESSION_HEADER_LEN && sealed.starts_with(FRAME_SESSION_MAGIC) {
            let (header, body) = sealed.split_at(FRAME_SESSION_HEADER_LEN);
            let generation = u32::from_be_bytes(header[8..12].try_into().expect("4 bytes"));
            let opened = self
                .session_key(generation, &header[12..], what)
                .ok()
                .and_then(|k| {
                    open_salted_into(
                        &k[..],
                        FRAME_INFO,
                        &frame_aad(pack_key, offset, header),
                        body,
                        out,
                    )
                });
            if opened.is_some() {
                return Ok(());
            }
            // A generation-1 frame whose random salt starts with the magic (2^-64) opens
            // as one; otherwise say why it did not open.
            if let Some(m) = first {
                if open_salted_into(
                    &m[..],
                    FRAME_INFO,
                    &frame_aad(pack_key, offset, &[]),
                    sealed,
                    out,
                )
                .is_some()
                {
                    return Ok(());
                }
            }
            self.session_key(generation, &header[12..], what)?;
            return Err(damaged(what));
        }
        let as_generation_1 = |out: &mut Vec<u8>| {
            first.and_then(|m| {
                open_salted_into(
                    &m[..],
                    FRAME_INFO,
                    &frame_aad(pack_key, offset, &[]),
                    sealed,
                    out,
                )
            })
        };
        if sealed.len() >= FRAME_HEADER_LEN && sealed.starts_with(FRAME_MAGIC) {
            let (header, body) = sealed.split_at(FRAME_HEADER_LEN);
            let generation = u32::from_be_bytes(header[8..].try_into().expect("4 bytes"));
            let opened = self.masters.get(&generation).and_then(|m| {
                open_salted_into(
                    &m[..],
                    FRAME_INFO,
                    &frame_aad(pack_key, offset, header),
                    body,
                    out,
                )
            });
            // A generation-1 frame whose random salt starts with the magic (2^-64) opens
            // as one.
            if opened.or_else(|| as_generation_1(out)).is_some() {
                return Ok(());
            }
            self.master(generation, what)?;
            return Err(damaged(what));
        }
        if first.is_none() {
            self.master(1, what)?;
        }
        as_generation_1(out).ok_or_else(|| damaged(what))
    }

    /// The tag that proves a holder of generation `generation`'s master key vouched for key
    /// file `id` with public key `public_key` (hex salt and tag).
    fn member_tag(&self, stanza: &str, id: &str, public_key: &str, generation: u32) -> String {
        let mut out = Vec::new();
        let aad = member_aad(stanza, id, public_key, generation);
        seal_salted_into(
            &self.masters[&generation][..],
            MEMBER_INFO,
            &aad,
            &[],
            &mut out,
        );
        hex::encode(out)
    }

    fn member_tag_holds(
        &self,
        stanza: &str,
        id: &str,
        public_key: &str,
        generation: u32,
        tag: &str,
    ) -> bool {
        let (Some(master), Ok(tag)) = (self.masters.get(&generation), hex::decode(tag)) else {
            return false;
        };
        let aad = member_aad(stanza, id, public_key, generation);
        open_salted_into(&master[..], MEMBER_INFO, &aad, &tag, &mut Vec::new()).is_some()
    }

    /// Whether key file `k` is vouched for by this key's newest master key: made while it
    /// was the newest (its own tag), or given it by a grant (the grant's tag). Only such
    /// key files receive the next generation, so a key file planted by someone without the
    /// master key never does.
    pub fn vouches_for(&self, stanza: &str, set: &KeySet, k: &KeyFile) -> bool {
        let g = self.generation();
        if k.format < 2 {
            return false;
        }
        let own = k.generations.last() == Some(&g)
            && self.member_tag_holds(stanza, &k.id, &k.public_key, g, &k.member_tag);
        own || set.grants.iter().any(|grant| {
            grant.id == k.id
                && grant.generation == g
                && self.member_tag_holds(stanza, &k.id, &k.public_key, g, &grant.member_tag)
        })
    }
}

fn member_aad(stanza: &str, id: &str, public_key: &str, generation: u32) -> Vec<u8> {
    format!(
        "{}/{stanza}/{id}/{public_key}/{generation}",
        String::from_utf8_lossy(MEMBER_INFO)
    )
    .into_bytes()
}

/// Append `salt || ciphertext || tag` to `out`: `plain` sealed with AES-256-GCM under the key
/// HKDF derives from `ikm`, a fresh random salt and `info`, authenticating `aad`. Objects,
/// frames, membership tags and the cached master keys are all sealed this way.
fn seal_salted_into(ikm: &[u8], info: &[u8], aad: &[u8], plain: &[u8], out: &mut Vec<u8>) {
    let salt = random::<SALT_LEN>();
    out.extend_from_slice(&salt);
    let start = out.len();
    out.extend_from_slice(plain);
    let tag = derive(ikm, &salt, info)
        .seal_in_place_separate_tag(zero_nonce(), Aad::from(aad), &mut out[start..])
        .expect("AES-GCM seal");
    out.extend_from_slice(tag.as_ref());
}

/// Open what [`seal_salted_into`] wrote (`sealed` = salt, ciphertext, tag) into `out`,
/// replacing its content; `None` when it is too short or fails authentication.
fn open_salted_into(
    ikm: &[u8],
    info: &[u8],
    aad: &[u8],
    sealed: &[u8],
    out: &mut Vec<u8>,
) -> Option<()> {
    if sealed.len() < SALT_LEN + TAG_LEN {
        return None;
    }
    let (salt, body) = sealed.split_at(SALT_LEN);
    out.clear();
    out.extend_from_slice(body);
    let len = derive(ikm, salt, info)
        .open_in_place(zero_nonce(), Aad::from(aad), out)
        .ok()?
        .len();
    out.truncate(len);
    Some(())
}

/// Argon2id parameters and salt of one key file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Kdf {
    /// Always `argon2id`.
    pub algorithm: String,
    /// Argon2 version, 19 (0x13).
    pub version: u32,
    /// Memory in KiB.
    pub m_cost: u32,
    /// Passes.
    pub t_cost: u32,
    /// Lanes.
    pub p_cost: u32,
    /// Random salt, hex.
    pub salt: String,
}

impl Kdf {
    /// Parameters for a new key file: the defaults, or the tests' lower memory.
    pub fn new_random() -> Kdf {
        let m_cost = std::env::var(TEST_KDF_MEMORY_ENV)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(DEFAULT_M_COST_KIB, |m| m.max(8));
        Kdf {
            algorithm: "argon2id".into(),
            version: 19,
            m_cost,
            t_cost: DEFAULT_T_COST,
            p_cost: DEFAULT_P_COST,
            salt: hex::encode(random::<16>()),
        }
    }

    /// Why a reader will not run these parameters, if it will not: an unknown algorithm,
    /// or a cost above the limits.
    fn refused(&self) -> Option<String> {
        if self.algorithm != "argon2id" || self.version != 19 {
            return Some(format!(
                "unknown key derivation {} version {}",
                self.algorithm, self.version
            ));
        }
        (self.m_cost > MAX_M_COST_KIB || self.t_cost > MAX_T_COST || self.p_cost > MAX_P_COST)
            .then(|| {
                format!(
                    "its Argon2id cost m={} KiB t={} p={} exceeds what a reader runs (m {MAX_M_COST_KIB} KiB, t {MAX_T_COST}, p {MAX_P_COST})",
                    self.m_cost, self.t_cost, self.p_cost
                )
            })
    }

    /// The key-encryption key this passphrase gives.
    fn derive(&self, pass: &Passphrase, what: &str) -> Result<Key> {
        let bad = |why: String| Error::corrupt(format!("{what}: {why}"));
        if let Some(why) = self.refused() {
            return Err(bad(why));
        }
        let salt = hex::decode(&self.salt).map_err(|_| bad("salt is not hex".into()))?;
        let params = argon2::Params::new(self.m_cost, self.t_cost, self.p_cost, Some(32))
            .map_err(|e| bad(format!("Argon2id parameters: {e}")))?;
        let argon =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut kek = Zeroizing::new([0u8; 32]);
        argon
            .hash_password_into(pass.bytes(), &salt, &mut kek[..])
            .map_err(|e| bad(format!("Argon2id: {e}")))?;
        Ok(kek)
    }
}

/// A key file: the master keys wrapped by one passphrase, and who made it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyFile {
    /// Key file format: 2 (1 is still read).
    pub format: u32,
    /// 16 lowercase hex digits; also the file's name.
    pub id: String,
    /// RFC 3339.
    pub created: String,
    pub host: String,
    pub user: String,
    /// `aes-256-gcm`.
    pub cipher: String,
    pub kdf: Kdf,
    /// Format 2: the generations whose master keys it wraps, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<u32>,
    /// Format 2: its X25519 public key, hex; grants are sealed to it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub public_key: String,
    /// Format 2: salt and tag, hex, under its newest generation's master key: whoever made
    /// it held that master key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub member_tag: String,
    /// Nonce of the wrapping, hex (12 bytes).
    pub nonce: String,
    /// AES-256-GCM under the passphrase's key, and the tag, hex: of the master key (format
    /// 1); of the X25519 private key and then the master key of each generation (format 2).
    pub wrapped_key: String,
}

/// Associated data of a key file's wrapping.
fn key_aad(stanza: &str, k: &KeyFile) -> Vec<u8> {
    if k.format == 1 {
        return format!("{KEY_AAD_PREFIX_1}/{stanza}/{}", k.id).into_bytes();
    }
    let generations: Vec<String> = k.generations.iter().map(|g| g.to_string()).collect();
    format!(
        "{KEY_AAD_PREFIX}/{stanza}/{}/{}/{}",
        k.id,
        k.public_key,
        generations.join(",")
    )
    .into_bytes()
}

fn is_key_id(id: &str) -> bool {
    id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A new X25519 private key and its public key.
fn new_identity() -> (Key, Vec<u8>) {
    loop {
        let private = Zeroizing::new(random::<32>());
        if let Some(public) = public_of(&private) {
            return (private, public);
        }
    }
}

fn public_of(private: &[u8; 32]) -> Option<Vec<u8>> {
    let key = PrivateKey::from_private_key(&X25519, &private[..]).ok()?;
    Some(key.compute_public_key().ok()?.as_ref().to_vec())
}

/// What key file `k`'s passphrase opens: the master keys, and (format 2) the private key.
struct Unwrapped {
    masters: BTreeMap<u32, Key>,
    private: Option<Key>,
}

impl KeyFile {
    /// A new key file wrapping every master key of `master` with a key derived from
    /// `pass` (refused when `master` is behind: a new key must open what is written next).
    pub fn wrap(
        stanza: &str,
        master: &Cipher,
        pass: &Passphrase,
        created: String,
        host: String,
        user: String,
    ) -> Result<KeyFile> {
        let (newest, _) = master.sealing_key()?;
        let (private, public) = new_identity();
        let mut k = KeyFile {
            format: KEY_FILE_VERSION,
            id: hex::encode(random::<8>()),
            created,
            host,
            user,
            cipher: CipherType::Aes256Gcm.name().into(),
            kdf: Kdf::new_random(),
            generations: master.masters.keys().copied().collect(),
            public_key: hex::encode(public),
            member_tag: String::new(),
            nonce: String::new(),
            wrapped_key: String::new(),
        };
        k.member_tag = master.member_tag(stanza, &k.id, &k.public_key, newest);
        let kek = k.kdf.derive(pass, "new key")?;
        let nonce = random::<NONCE_LEN>();
        let mut buf = Zeroizing::new(private.to_vec());
        for m in master.masters.values() {
            buf.extend_from_slice(&m[..]);
        }
        aead_key(&kek)
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key_aad(stanza, &k)),
                &mut *buf,
            )
            .expect("AES-GCM seal");
        k.wrapped_key = hex::encode(&buf[..]);
        k.nonce = hex::encode(nonce);
        Ok(k)
    }

    /// What `kek` (derived from this file's `kdf`) opens, if it opens the wrapping.
    fn unwrap_with(&self, stanza: &str, kek: &[u8; 32]) -> Option<Unwrapped> {
        let nonce: [u8; NONCE_LEN] = hex::decode(&self.nonce).ok()?.try_into().ok()?;
        let mut buf = Zeroizing::new(hex::decode(&self.wrapped_key).ok()?);
        let plain = aead_key(kek)
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key_aad(stanza, self)),
                &mut buf[..],
            )
            .ok()?;
        let key_at = |i: usize| -> Key {
            let mut k = Zeroizing::new([0u8; 32]);
            k.copy_from_slice(&plain[i * 32..(i + 1) * 32]);
            k
        };
        if self.format == 1 {
            return (plain.len() == 32).then(|| Unwrapped {
                masters: [(1, key_at(0))].into(),
                private: None,
            });
        }
        if plain.len() != 32 * (1 + self.generations.len()) {
            return None;
        }
        Some(Unwrapped {
            private: Some(key_at(0)),
            masters: self
                .generations
                .iter()
                .enumerate()
                .map(|(i, g)| (*g, key_at(i + 1)))
                .collect(),
        })
    }

    /// Check a key file read from `key` (its name must be its id, its Argon2id cost within
    /// the limits, its generations ascending from 1).
    pub(crate) fn parse(bytes: &[u8], key: &str) -> Result<KeyFile> {
        let k: KeyFile = serde_json::from_slice(bytes).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("{key}: not a valid key file"),
                e,
            )
        })?;
        if k.format != 1 && k.format != KEY_FILE_VERSION {
            return Err(Error::new(
                ErrorKind::Format,
                format!("{key}: key file format {} is not supported", k.format),
            ));
        }
        let named = layout::parse_keys_object(key) == Some(KeysObject::KeyFile { id: &k.id });
        if !is_key_id(&k.id) || !named {
            return Err(Error::corrupt(format!(
                "{key}: key file holds id '{}', not its name",
                k.id
            )));
        }
        if let Some(why) = k.kdf.refused() {
            return Err(Error::corrupt(format!("{key}: {why}")));
        }
        let generations_ok =
            k.generations.first() == Some(&1) && k.generations.windows(2).all(|w| w[1] == w[0] + 1);
        if k.format == 2 && (!generations_ok || k.public_key.len() != 64) {
            return Err(Error::corrupt(format!(
                "{key}: format 2 key file without a valid list of generations and public key"
            )));
        }
        Ok(k)
    }
}

/// A grant: the master key of generation `generation` (and of the one before, which proves
/// its author held it) sealed to key file `id`'s X25519 public key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Grant {
    /// Grant format, 2.
    pub format: u32,
    /// The key file it is for.
    pub id: String,
    pub generation: u32,
    /// RFC 3339.
    pub created: String,
    /// X25519 public key of the ephemeral key, hex.
    pub ephemeral_key: String,
    /// AES-256-GCM (zero nonce; key HKDF-SHA256 of the X25519 shared secret) of the master
    /// keys of generations `generation - 1` and `generation`, and the tag, hex.
    pub wrapped_keys: String,
    /// As a key file's: under generation `generation`'s master key, for key file `id`.
    pub member_tag: String,
}

fn grant_aad(stanza: &str, id: &str, generation: u32) -> Vec<u8> {
    format!(
        "{}/{stanza}/{id}/{generation}",
        String::from_utf8_lossy(GRANT_INFO)
    )
    .into_bytes()
}

/// The key that seals a grant: HKDF-SHA256 of the X25519 shared secret, salt = the
/// ephemeral then the recipient's public key.
fn grant_key(shared: &[u8], ephemeral: &[u8], recipient: &[u8]) -> LessSafeKey {
    let mut salt = ephemeral.to_vec();
    salt.extend_from_slice(recipient);
    derive(shared, &salt, GRANT_INFO)
}

impl Grant {
    /// The newest generation of `ring` (which must be the one after `k`'s) for key file `k`.
    pub fn new(stanza: &str, k: &KeyFile, ring: &Cipher, created: String) -> Result<Grant> {
        let generation = ring.generation();
        let recipient = hex::decode(&k.public_key)
            .map_err(|_| Error::corrupt(format!("key {}: public key is not hex", k.id)))?;
        let ephemeral = PrivateKey::generate(&X25519).expect("X25519 key");
        let ephemeral_public = ephemeral
            .compute_public_key()
            .expect("X25519 public key")
            .as_ref()
            .to_vec();
        let mut buf = Zeroizing::new(Vec::with_capacity(64 + TAG_LEN));
        buf.extend_from_slice(&ring.masters[&(generation - 1)][..]);
        buf.extend_from_slice(&ring.masters[&generation][..]);
        agreement::agree(
            &ephemeral,
            UnparsedPublicKey::new(&X25519, &recipient),
            Error::corrupt(format!("key {}: not an X25519 public key", k.id)),
            |shared| {
                grant_key(shared, &ephemeral_public, &recipient)
                    .seal_in_place_append_tag(
                        zero_nonce(),
                        Aad::from(grant_aad(stanza, &k.id, generation)),
                        &mut *buf,
                    )
                    .expect("AES-GCM seal");
                Ok(())
            },
        )?;
        Ok(Grant {
            format: GRANT_VERSION,
            id: k.id.clone(),
            generation,
            created,
            ephemeral_key: hex::encode(&ephemeral_public),
            wrapped_keys: hex::encode(&buf[..]),
            member_tag: ring.member_tag(stanza, &k.id, &k.public_key, generation),
        })
    }

    /// The master keys of generations `generation - 1` and `generation`, when `private`
    /// (key file `k`'s) opens it.
    fn open(&self, stanza: &str, k: &KeyFile, private: &[u8; 32]) -> Option<(Key, Key)> {
        let recipient = hex::decode(&k.public_key).ok()?;
        let ephemeral = hex::decode(&self.ephemeral_key).ok()?;
        let mut buf = Zeroizing::new(hex::decode(&self.wrapped_keys).ok()?);
        let own = PrivateKey::from_private_key(&X25519, &private[..]).ok()?;
        let plain_len = agreement::agree(
            &own,
            UnparsedPublicKey::new(&X25519, &ephemeral),
            (),
            |shared| {
                grant_key(shared, &ephemeral, &recipient)
                    .open_in_place(
                        zero_nonce(),
                        Aad::from(grant_aad(stanza, &k.id, self.generation)),
                        &mut buf[..],
                    )
                    .map(|p| p.len())
                    .map_err(|_| ())
            },
        )
        .ok()?;
        if plain_len != 64 {
            return None;
        }
        let (mut prev, mut next) = (Zeroizing::new([0u8; 32]), Zeroizing::new([0u8; 32]));
        prev.copy_from_slice(&buf[..32]);
        next.copy_from_slice(&buf[32..64]);
        Some((prev, next))
    }

    pub(crate) fn parse(bytes: &[u8], key: &str) -> Result<Grant> {
        let g: Grant = serde_json::from_slice(bytes).map_err(|e| {
            Error::with_source(ErrorKind::Corrupt, format!("{key}: not a valid grant"), e)
        })?;
        if g.format != GRANT_VERSION {
            return Err(Error::new(
                ErrorKind::Format,
                format!("{key}: grant format {} is not supported", g.format),
            ));
        }
        let named = layout::parse_keys_object(key)
            == Some(KeysObject::Grant {
                id: &g.id,
                generation: Some(g.generation),
            });
        if !named || !is_key_id(&g.id) || g.generation < 2 {
            return Err(Error::corrupt(format!(
                "{key}: grant for key '{}' generation {}, not its name",
                g.id, g.generation
            )));
        }
        Ok(g)
    }
}

/// Everything under `<stanza>/keys/`: the key files and grants that parse, and what was
/// skipped (a key file that is not valid, or asks for more Argon2id than a reader runs, is
/// skipped with a warning naming it: one hostile file must not stop every command).
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    /// Usable key files, sorted by creation time then id.
    pub files: Vec<KeyFile>,
    pub grants: Vec<Grant>,
    /// One line per skipped object: its name and why.
    pub skipped: Vec<String>,
    /// Digest of the names of every object under `keys/`: changes whenever a key file or
    /// grant is added or removed, so a cached master key set is looked at again.
    pub fingerprint: String,
    /// Whether any `.json` object is there: the stanza is encrypted (§15), even when no
    /// key file is usable.
    pub encrypted: bool,
}

impl KeySet {
    /// The fingerprint of a listing of `keys/`.
    pub fn fingerprint_of(mut names: Vec<String>) -> String {
        names.sort();
        blake3::hash(names.join("\n").as_bytes()).to_hex()[..32].to_string()
    }

    /// The newest generation any key file or grant names.
    pub fn newest_generation(&self) -> u32 {
        let files = self
            .files
            .iter()
            .map(|k| k.generations.last().copied().unwrap_or(1));
        let grants = self.grants.iter().map(|g| g.generation);
        files.chain(grants).max().unwrap_or(1)
    }
}

/// Open the master keys of `stanza` with `pass`, trying every key file (Argon2id runs once
/// per distinct parameters and salt), then the grants to the key file that opens. None
/// opens: one line, a configuration error. A key behind the stanza's newest generation
/// opens for reading only ([`Cipher::note_newest_generation`]).
pub fn open_master(stanza: &str, set: &KeySet, pass: &Passphrase) -> Result<Cipher> {
    let mut keks: HashMap<&Kdf, Key> = HashMap::new();
    for k in &set.files {
        let kek = match keks.get(&k.kdf) {
            Some(kek) => kek,
            None => {
                let what = layout::key_file(stanza, &k.id);
                let kek = k.kdf.derive(pass, &what)?;
                keks.entry(&k.kdf).or_insert(kek)
            }
        };
        let Some(Unwrapped {
            mut masters,
            private,
        }) = k.unwrap_with(stanza, kek)
        else {
            continue;
        };
        if let Some(private) = private {
            for g in set.grants.iter().filter(|g| g.id == k.id) {
                let newest = *masters.keys().next_back().expect("a master key");
                if g.generation != newest + 1 {
                    continue;
                }
                // The chain: a grant counts only if its author held the generation before.
                match g.open(stanza, k, &private) {
                    Some((prev, next)) if prev[..] == masters[&newest][..] => {
                        masters.insert(g.generation, next);
                    }
                    _ => log::warn!(
                        "{}: the grant does not open with key {} or does not continue its master keys: ignored (the repository is damaged or was tampered with)",
                        layout::key_grant(stanza, &g.id, g.generation),
                        k.id
                    ),
                }
            }
        }
        let mut c = Cipher {
            masters,
            session: None,
            behind: None,
            key_id: k.id.clone(),
        };
        c.note_newest_generation(set.newest_generation());
        return Ok(c);
    }
    let skipped = if set.skipped.is_empty() {
        String::new()
    } else {
        format!(
            " ({} skipped: {})",
            set.skipped.len(),
            set.skipped.join("; ")
        )
    };
    Err(Error::new(
        ErrorKind::Invalid,
        format!(
            "the passphrase opens none of stanza {stanza}'s {} key{}{skipped}",
            set.files.len(),
            if set.files.len() == 1 { "" } else { "s" }
        ),
    ))
}

/// Whether key `id` may be removed from `keys`: it must exist, and must not be the last.
pub fn check_removal(stanza: &str, keys: &[KeyFile], id: &str) -> Result<()> {
    if !keys.iter().any(|k| k.id == id) {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "stanza {stanza} has no key '{id}' (key-list shows its keys: {})",
                keys.iter()
                    .map(|k| k.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if keys.len() <= 1 {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "key '{id}' is the last key of stanza {stanza}: removing it would make every backup unreadable; add another key first (key-add)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The host key cache's wrapping opens only with the same passphrase, context and key id.
    #[test]
    fn cached_key_opens_only_as_it_was_wrapped() {
        let mut c = Cipher::generate();
        c.key_id = "k1".into();
        let pass = Passphrase::new("secret");
        let wrapped = c.wrap_for_cache(&pass, "repo\0main", "k1");
        let back = Cipher::open_cached(&wrapped, &pass, "repo\0main", "k1").expect("opens");
        // The same master key: it opens what the original sealed.
        let sealed = c.seal_object("main/stanza.json", b"record").unwrap();
        assert_eq!(
            back.open_object("main/stanza.json", &sealed).unwrap(),
            b"record"
        );
        let other = Passphrase::new("other");
        assert!(Cipher::open_cached(&wrapped, &other, "repo\0main", "k1").is_none());
        assert!(Cipher::open_cached(&wrapped, &pass, "repo\0test", "k1").is_none());
        assert!(Cipher::open_cached(&wrapped, &pass, "repo\0main", "k2").is_none());
        let mut flipped = wrapped.clone();
        flipped[20] ^= 1;
        assert!(Cipher::open_cached(&flipped, &pass, "repo\0main", "k1").is_none());
        assert!(Cipher::open_cached(&wrapped[1..], &pass, "repo\0main", "k1").is_none());
    }

    fn low_memory() {
        std::env::set_var(TEST_KDF_MEMORY_ENV, "64");
    }

    fn key_file(master: &Cipher, pass: &str) -> KeyFile {
        low_memory();
        KeyFile::wrap(
            "main",
            master,
            &Passphrase::new(pass),
            "2026-01-01T00:00:00Z".into(),
            "h".into(),
            "u".into(),
        )
        .unwrap()
    }

    #[test]
    fn objects_round_trip_and_bind_their_name() {
        let c = Cipher::generate();
        let plain = b"manifest body with a marker".repeat(100);
        let sealed = c
            .seal_object("main/backup/L/backup.manifest", &plain)
            .unwrap();
        assert!(is_sealed(&sealed));
        assert_eq!(sealed.len(), plain.len() + OBJECT_OVERHEAD);
        assert!(!sealed.windows(6).any(|w| w == b"marker"));
        assert_eq!(
            c.open_object("main/backup/L/backup.manifest", &sealed)
                .unwrap(),
            plain
        );
        // The same content sealed twice differs (a fresh salt, so a fresh key).
        assert_ne!(
            sealed,
            c.seal_object("main/backup/L/backup.manifest", &plain)
                .unwrap()
        );
        // Another name: refused as damage, naming the object.
        let e = c
            .open_object("main/backup/L/backup.manifest.copy", &sealed)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(e.context.contains("backup.manifest.copy"), "{e}");
        // Another master key: refused.
        assert!(Cipher::generate()
            .open_object("main/backup/L/backup.manifest", &sealed)
            .is_err());
    }

    #[test]
    fn tampered_or_truncated_objects_are_refused() {
        let c = Cipher::generate();
        let key = "main/stanza.json";
        let sealed = c.seal_object(key, b"{\"stanza\":\"main\"}").unwrap();
        for i in [
            0,
            9,
            SEAL_HEADER_LEN + 1,
            SEAL_HEADER_LEN + SALT_LEN,
            sealed.len() - 1,
        ] {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            let e = c.open_object(key, &bad).unwrap_err();
            assert!(
                matches!(e.kind, ErrorKind::Corrupt | ErrorKind::Format),
                "byte {i}: {e}"
            );
        }
        for len in [0, 10, OBJECT_OVERHEAD - 1, sealed.len() - 1] {
            assert_eq!(
                c.open_object(key, &sealed[..len]).unwrap_err().kind,
                ErrorKind::Corrupt,
                "{len} bytes"
            );
        }
        let mut longer = sealed.clone();
        longer.push(0);
        assert!(c.open_object(key, &longer).is_err());
    }

    #[test]
    fn frames_bind_pack_and_offset() {
        let c = Cipher::generate();
        let mut pack = Vec::new();
        c.seal_frame_into("main/backup/L/pack/0-0", 0, b"first frame", &mut pack)
            .unwrap();
        let second_at = pack.len();
        c.seal_frame_into(
            "main/backup/L/pack/0-0",
            second_at as u64,
            b"second",
            &mut pack,
        )
        .unwrap();
        assert_eq!(second_at, b"first frame".len() + c.frame_overhead());
        let mut out = Vec::new();
        c.open_frame_into(
            "main/backup/L/pack/0-0",
            second_at as u64,
            &pack[second_at..],
            &mut out,
            "f",
        )
        .unwrap();
        assert_eq!(out, b"second");
        // Read at another offset or in another pack: refused.
        assert!(c
            .open_frame_into(
                "main/backup/L/pack/0-0",
                0,
                &pack[second_at..],
                &mut out,
                "f"
            )
            .is_err());
        assert!(c
            .open_frame_into(
                "main/backup/L/pack/0-1",
                0,
                &pack[..second_at],
                &mut out,
                "f"
            )
            .is_err());
        let mut bad = pack[..second_at].to_vec();
        bad[20] ^= 0x80;
        let e = c
            .open_frame_into("main/backup/L/pack/0-0", 0, &bad, &mut out, "the frame")
            .unwrap_err();
        assert!(e.context.contains("the frame"), "{e}");
        assert!(c
            .open_frame_into(
                "main/backup/L/pack/0-0",
                0,
                &pack[..second_at - 1],
                &mut out,
                "f"
            )
            .is_err());
    }

    /// What an agent seals under a session key opens with the master key; the session key
    /// opens nothing else (not the master's objects, not another session's), and travels
    /// as 52 bytes of hex.
    #[test]
    fn a_session_key_seals_for_the_master_and_opens_only_its_own() {
        let master = Arc::new(Cipher::generate().rotated().unwrap());
        let wire = master.session_for_peer().unwrap().to_wire();
        let agent = Cipher::from_session(SessionKey::from_wire(&wire).unwrap());
        assert_eq!(agent.generation(), 2);
        let key = "main/backup/L/backup.manifest";
        let sealed = agent.seal_object(key, b"manifest").unwrap();
        assert_eq!(sealed[8], SEAL_VERSION_SESSION);
        assert_eq!(sealed.len(), b"manifest".len() + SESSION_OBJECT_OVERHEAD);
        assert_eq!(master.open_object(key, &sealed).unwrap(), b"manifest");
        assert_eq!(agent.open_object(key, &sealed).unwrap(), b"manifest");
        // Bound to its name and whole, as every sealed object.
        assert!(master
            .open_object("main/backup/M/backup.manifest", &sealed)
            .is_err());
        let mut bad = sealed.clone();
        bad[SEAL_HEADER_LEN] ^= 1; // the session id
        assert!(master.open_object(key, &bad).is_err());
        // The agent opens neither the master's objects nor another session's.
        let by_master = master.seal_object(key, b"other backup").unwrap();
        assert!(agent.open_object(key, &by_master).is_err());
        let other = Cipher::from_session(master.session_for_peer().unwrap());
        let by_other = other.seal_object(key, b"x").unwrap();
        assert!(agent.open_object(key, &by_other).is_err());
        assert!(master.open_object(key, &by_other).is_ok());
        // Frames: the session header, opened by the master at their pack and offset only.
        let pack = "main/backup/L/pack/0-0";
        let mut frames = Vec::new();
        agent
            .seal_frame_into(pack, 0, b"first", &mut frames)
            .unwrap();
        assert_eq!(frames.len(), 5 + agent.frame_overhead());
        assert!(frames.starts_with(FRAME_SESSION_MAGIC));
        let at = frames.len();
        agent
            .seal_frame_into(pack, at as u64, b"second", &mut frames)
            .unwrap();
        let mut out = Vec::new();
        master
            .open_frame_into(pack, at as u64, &frames[at..], &mut out, "f")
            .unwrap();
        assert_eq!(out, b"second");
        assert!(master
            .open_frame_into(pack, 0, &frames[at..], &mut out, "f")
            .is_err());
        let mut master_frame = Vec::new();
        master
            .seal_frame_into(pack, 0, b"m", &mut master_frame)
            .unwrap();
        assert!(agent
            .open_frame_into(pack, 0, &master_frame, &mut out, "f")
            .is_err());
        // A session key changes no keys and is refused in any other form.
        assert!(agent.rotated().is_err());
        assert!(SessionKey::from_wire(&wire[2..]).is_err());
        assert!(SessionKey::from_wire("zz").is_err());
        // A key behind the newest generation gives no session.
        let mut behind = Cipher::generate();
        behind.note_newest_generation(2);
        assert!(behind.session_for_peer().is_err());
    }

    /// The backup host reseals what the agent reads: the agent opens it, manifest copies
    /// (sealed under the manifest's name) included; packs pass as stored.
    #[test]
    fn the_holder_reseals_whole_objects_for_the_session() {
        use pgstrata_remote::agent::Reseal;
        let master = Arc::new(Cipher::generate());
        let session = master.session_for_peer().unwrap();
        let agent = Cipher::from_session(SessionKey::from_wire(&session.to_wire()).unwrap());
        let reseal = SessionReseal::new(master.clone(), session);
        let (manifest, copy) = (
            "s/backup/L/backup.manifest",
            "s/backup/L/backup.manifest.copy",
        );
        let stored = master.seal_object(manifest, b"prior").unwrap();
        for key in [manifest, copy] {
            let plain = reseal.open(key, &stored).unwrap().unwrap();
            let sent = reseal.seal(key, &plain).unwrap();
            assert_eq!(agent.open_object(key, &sent).unwrap(), b"prior");
        }
        // Under another name it is not the object: refused, nothing sent.
        assert!(reseal.open("s/backup/M/backup.manifest", &stored).is_err());
        assert_eq!(reseal.open("s/backup/L/pack/0-0", b"frames").unwrap(), None);
    }

    #[test]
    fn key_files_wrap_the_master_key_for_their_passphrase_only() {
        let master = Cipher::generate();
        let a = key_file(&master, "first passphrase");
        let b = key_file(&master, "second passphrase");
        assert!(is_key_id(&a.id) && a.id != b.id && a.kdf.salt != b.kdf.salt);
        let keys = set_of(vec![a.clone(), b.clone()], vec![]);
        let probe = b"probe";
        let sealed = master.seal_object("k", probe).unwrap();
        for (pass, id) in [("first passphrase", &a.id), ("second passphrase", &b.id)] {
            let opened = open_master("main", &keys, &Passphrase::new(pass)).unwrap();
            assert_eq!(&opened.key_id, id);
            assert_eq!(opened.open_object("k", &sealed).unwrap(), probe);
        }
        let e = open_master("main", &keys, &Passphrase::new("wrong")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert_eq!(
            e.context,
            "the passphrase opens none of stanza main's 2 keys"
        );
        // Bound to its stanza: the same file does not open for another stanza.
        assert!(open_master("other", &keys, &Passphrase::new("first passphrase")).is_err());
        // A key file that lies about its id (renamed) does not open either.
        let mut renamed = a.clone();
        renamed.id = "0123456789abcdef".into();
        assert!(open_master(
            "main",
            &set_of(vec![renamed], vec![]),
            &Passphrase::new("first passphrase")
        )
        .is_err());
        // Its JSON round-trips and is checked against its name.
        let json = serde_json::to_vec(&a).unwrap();
        let key = layout::key_file("main", &a.id);
        assert_eq!(KeyFile::parse(&json, &key).unwrap().id, a.id);
        assert_eq!(
            KeyFile::parse(&json, &layout::key_file("main", &b.id))
                .unwrap_err()
                .kind,
            ErrorKind::Corrupt
        );
        // Absurd parameters are refused before anything is allocated.
        let mut greedy = a.clone();
        greedy.kdf.m_cost = u32::MAX;
        assert_eq!(
            open_master("main", &set_of(vec![greedy], vec![]), &Passphrase::new("x"))
                .unwrap_err()
                .kind,
            ErrorKind::Corrupt
        );
    }

    fn set_of(files: Vec<KeyFile>, grants: Vec<Grant>) -> KeySet {
        KeySet {
            encrypted: !files.is_empty(),
            files,
            grants,
            ..KeySet::default()
        }
    }

    /// A key file as pgstrata wrote them before key rotation (format 1: one master key,
    /// no public key).
    fn format_1_key_file(master: &Cipher, pass: &str) -> KeyFile {
        low_memory();
        let mut k = KeyFile {
            format: 1,
            id: hex::encode(random::<8>()),
            created: "2025-01-01T00:00:00Z".into(),
            host: "h".into(),
            user: "u".into(),
            cipher: "aes-256-gcm".into(),
            kdf: Kdf::new_random(),
            generations: vec![],
            public_key: String::new(),
            member_tag: String::new(),
            nonce: String::new(),
            wrapped_key: String::new(),
        };
        let kek = k.kdf.derive(&Passphrase::new(pass), "k").unwrap();
        let nonce = random::<NONCE_LEN>();
        let mut buf = master.masters[&1].to_vec();
        aead_key(&kek)
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(format!("pgstrata key v1/main/{}", k.id).as_bytes()),
                &mut buf,
            )
            .unwrap();
        k.nonce = hex::encode(nonce);
        k.wrapped_key = hex::encode(buf);
        k
    }

    /// key-remove's rotation: what generation 1 sealed stays readable by every current
    /// key; what generation 2 seals names its generation (envelope version 2, a frame
    /// header) and opens only for the keys granted it; the removed key, put back, still
    /// opens generation 1, is refused on generation 2 with a line saying why, and seals
    /// nothing.
    #[test]
    fn the_first_generation_not_shared_is_named() {
        let first = Cipher::generate();
        assert_eq!(first.generation_not_shared(&first), None);
        assert_eq!(
            first.generation_not_shared(&Cipher::generate()),
            Some(Ok(1))
        );
        // Rotated on one side: generation 2 is missing on the other, which still opens
        // everything the older side holds.
        let rotated = first.rotated().unwrap();
        assert_eq!(rotated.generation_not_shared(&first), Some(Err(2)));
        assert_eq!(first.generation_not_shared(&rotated), None);
        // Rotated on both sides apart: generation 2 differs.
        assert_eq!(
            rotated.generation_not_shared(&first.rotated().unwrap()),
            Some(Ok(2))
        );
    }

    #[test]
    fn a_removed_key_opens_nothing_sealed_after_the_rotation() {
        let first = Cipher::generate();
        let a = key_file(&first, "kept");
        let r = key_file(&first, "removed");
        let old_object = first.seal_object("main/stanza.json", b"record").unwrap();
        let mut old_frame = Vec::new();
        first
            .seal_frame_into("main/backup/F/pack/0-0", 0, b"old frame", &mut old_frame)
            .unwrap();
        assert_eq!(&old_object[8..16], &[1, 1, 0, 0, 0, 0, 0, 0]);

        // key-remove of r, run with a's passphrase.
        let before = set_of(vec![a.clone(), r.clone()], vec![]);
        let current = open_master("main", &before, &Passphrase::new("kept")).unwrap();
        assert!(current.vouches_for("main", &before, &a));
        assert!(current.vouches_for("main", &before, &r));
        let next = current.rotated().unwrap();
        assert_eq!(next.generation(), 2);
        let grant = Grant::new("main", &a, &next, "2026-01-02T00:00:00Z".into()).unwrap();
        let after = set_of(vec![a.clone()], vec![grant.clone()]);
        let kept = open_master("main", &after, &Passphrase::new("kept")).unwrap();
        assert_eq!(kept.generation(), 2);
        let name = "main/backup/L/backup.manifest";
        let new_object = kept.seal_object(name, b"new manifest").unwrap();
        assert_eq!(new_object[8], SEAL_VERSION);
        assert_eq!(&new_object[10..14], &2u32.to_be_bytes());
        let mut new_frame = Vec::new();
        kept.seal_frame_into("main/backup/L/pack/0-0", 0, b"new frame", &mut new_frame)
            .unwrap();
        assert_eq!(&new_frame[..FRAME_HEADER_LEN], &frame_header(2));
        assert_eq!(new_frame.len(), b"new frame".len() + kept.frame_overhead());
        // The kept key reads both generations.
        let mut out = Vec::new();
        assert_eq!(
            kept.open_object(name, &new_object).unwrap(),
            b"new manifest"
        );
        assert_eq!(
            kept.open_object("main/stanza.json", &old_object).unwrap(),
            b"record"
        );
        kept.open_frame_into("main/backup/L/pack/0-0", 0, &new_frame, &mut out, "f")
            .unwrap();
        assert_eq!(out, b"new frame");
        kept.open_frame_into("main/backup/F/pack/0-0", 0, &old_frame, &mut out, "f")
            .unwrap();
        assert_eq!(out, b"old frame");

        // The removed key file put back.
        let put_back = set_of(vec![a.clone(), r.clone()], vec![grant.clone()]);
        let removed = open_master("main", &put_back, &Passphrase::new("removed")).unwrap();
        assert_eq!(removed.generation(), 1);
        assert_eq!(
            removed
                .open_object("main/stanza.json", &old_object)
                .unwrap(),
            b"record"
        );
        let e = removed.open_object(name, &new_object).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(
            e.context.contains("master key generation 2") && e.context.contains(&r.id),
            "{e}"
        );
        let e = removed
            .open_frame_into(
                "main/backup/L/pack/0-0",
                0,
                &new_frame,
                &mut out,
                "the frame",
            )
            .unwrap_err();
        assert!(
            e.context
                .contains("the frame is sealed under master key generation 2"),
            "{e}"
        );
        let e = removed.seal_object("main/x", b"x").unwrap_err();
        assert!(e.context.contains("newest master key (generation 2"), "{e}");
        assert!(removed
            .seal_frame_into("p", 0, b"x", &mut Vec::new())
            .is_err());
        assert!(removed.rotated().is_err());
        assert!(KeyFile::wrap(
            "main",
            &removed,
            &Passphrase::new("x"),
            "c".into(),
            "h".into(),
            "u".into()
        )
        .is_err());

        // A key file added after the rotation holds both generations and is vouched for;
        // the next rotation reaches it and the kept key, not a key file planted by
        // someone who holds only generation 1 (the removed key's holder).
        let added = key_file(&kept, "added");
        assert_eq!(added.generations, vec![1, 2]);
        let planted = key_file(&removed_but_writable(&removed), "planted");
        let all = set_of(
            vec![a.clone(), added.clone(), planted.clone()],
            vec![grant.clone()],
        );
        assert!(kept.vouches_for("main", &all, &a));
        assert!(kept.vouches_for("main", &all, &added));
        assert!(!kept.vouches_for("main", &all, &planted));
        let opened = open_master("main", &all, &Passphrase::new("added")).unwrap();
        assert_eq!(
            opened.open_object(name, &new_object).unwrap(),
            b"new manifest"
        );

        // A grant that does not continue the key's master keys (made by someone who holds
        // another generation 1) is ignored.
        let stranger = Cipher::generate().rotated().unwrap();
        let forged = Grant::new("main", &a, &stranger, "c".into()).unwrap();
        let forged_set = set_of(vec![a.clone()], vec![forged]);
        let e = open_master("main", &forged_set, &Passphrase::new("kept")).unwrap();
        assert_eq!(e.generation(), 1);
        // A grant opens for its key file only.
        let misdirected = set_of(
            vec![r.clone()],
            vec![Grant {
                id: r.id.clone(),
                ..grant
            }],
        );
        assert_eq!(
            open_master("main", &misdirected, &Passphrase::new("removed"))
                .unwrap()
                .generation(),
            1
        );
    }

    /// A cipher holding what `c` holds, able to seal (what a removed key's holder can do
    /// with a pgstrata of their own).
    fn removed_but_writable(c: &Cipher) -> Cipher {
        Cipher {
            masters: c.masters.iter().map(|(g, k)| (*g, k.clone())).collect(),
            session: None,
            behind: None,
            key_id: c.key_id.clone(),
        }
    }

    /// Stanzas encrypted before key rotation: their format-1 key files and generation-1
    /// objects and frames read as before, and the key cache keeps every generation.
    #[test]
    fn format_1_key_files_still_open_and_the_cache_keeps_every_generation() {
        let first = Cipher::generate();
        let old = format_1_key_file(&first, "old");
        let sealed = first.seal_object("main/stanza.json", b"record").unwrap();
        let set = set_of(vec![old.clone()], vec![]);
        let json = serde_json::to_vec(&old).unwrap();
        assert!(!String::from_utf8_lossy(&json).contains("public_key"));
        let parsed = KeyFile::parse(&json, &layout::key_file("main", &old.id)).unwrap();
        let opened = open_master(
            "main",
            &set_of(vec![parsed], vec![]),
            &Passphrase::new("old"),
        )
        .unwrap();
        assert_eq!(
            opened.open_object("main/stanza.json", &sealed).unwrap(),
            b"record"
        );
        // Not vouched for (no public key to grant to).
        assert!(!opened.vouches_for("main", &set, &old));

        let two = opened.rotated().unwrap();
        let pass = Passphrase::new("p");
        let wrapped = two.wrap_for_cache(&pass, "ctx", "k");
        let back = Cipher::open_cached(&wrapped, &pass, "ctx", "k").unwrap();
        assert_eq!(back.generation(), 2);
        assert_eq!(
            back.open_object("main/stanza.json", &sealed).unwrap(),
            b"record"
        );
        let newer = two.seal_object("main/y", b"y").unwrap();
        assert_eq!(back.open_object("main/y", &newer).unwrap(), b"y");
        assert!(Cipher::open_cached(&wrapped, &pass, "ctx with other key files", "k").is_none());
    }

    /// A key file is as public as the repository: one asking for more Argon2id than a
    /// reader runs, or not a key file at all, is refused when read, naming it and why.
    #[test]
    fn key_files_beyond_the_argon2id_limits_are_refused_when_read() {
        let a = key_file(&Cipher::generate(), "a");
        let name = layout::key_file("main", &a.id);
        for (m, t, p) in [
            (MAX_M_COST_KIB + 1, 1, 1),
            (64, MAX_T_COST + 1, 1),
            (64, 1, MAX_P_COST + 1),
        ] {
            let mut k = a.clone();
            (k.kdf.m_cost, k.kdf.t_cost, k.kdf.p_cost) = (m, t, p);
            let e = KeyFile::parse(&serde_json::to_vec(&k).unwrap(), &name).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Corrupt);
            assert!(
                e.context.contains(&name) && e.context.contains("Argon2id cost"),
                "{e}"
            );
        }
        let mut k = a.clone();
        (k.kdf.m_cost, k.kdf.t_cost, k.kdf.p_cost) = (MAX_M_COST_KIB, MAX_T_COST, MAX_P_COST);
        KeyFile::parse(&serde_json::to_vec(&k).unwrap(), &name).unwrap();
        let e = KeyFile::parse(b"{ not json", &name).unwrap_err();
        assert!(e.context.contains("not a valid key file"), "{e}");
        // No usable key file: the error names what was skipped.
        let set = KeySet {
            encrypted: true,
            skipped: vec![format!("{name}: not a valid key file")],
            ..KeySet::default()
        };
        let e = open_master("main", &set, &Passphrase::new("a")).unwrap_err();
        assert!(
            e.context.contains("1 skipped") && e.context.contains(&name),
            "{e}"
        );
    }

    #[test]
    fn the_last_key_is_never_removed() {
        let master = Cipher::generate();
        let a = key_file(&master, "a");
        let b = key_file(&master, "b");
        let both = vec![a.clone(), b.clone()];
        check_removal("main", &both, &a.id).unwrap();
        let e = check_removal("main", std::slice::from_ref(&b), &b.id).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.context.contains("last key"), "{e}");
        let e = check_removal("main", &both, "ffffffffffffffff").unwrap_err();
        assert!(e.context.contains("no key"), "{e}");
        assert!(check_removal("main", &[], &a.id).is_err());
    }

    #[test]
    fn passphrases_never_show() {
        let p = Passphrase::new("hunter2");
        assert_eq!(format!("{p:?}"), "<redacted>");
        assert!(!format!("{:?}", Cipher::generate()).contains("master"));
    }
}
