//! Repository encryption: everything a stanza stores is authenticated, and everything but
//! a small public header is encrypted, so whoever can read or write the bucket can neither
//! read the database nor forge, swap, replay or truncate what pgstrata will accept.
//!
//! - A random 256-bit **master key** per stanza. It never leaves memory unwrapped.
//! - **Key files** (`<stanza>/keys/<id>.json`, in the clear: they are the public header)
//!   each wrap the master key with a key derived from one passphrase by Argon2id. Adding or
//!   removing a key file rotates passphrases without touching any data.
//! - **Sealed objects** (stanza record, manifests, WAL objects, change maps, the lock):
//!   header, random salt, AES-256-GCM ciphertext and tag. Each object gets its own key,
//!   HKDF-SHA256 of the master key and the salt, so a zero nonce never repeats under one
//!   key. The object's name is associated data: an object copied over another fails.
//! - **Sealed frames** of packs: each frame on its own (ranged reads and delta restore keep
//!   working), salt, ciphertext and tag; associated data is the pack's name and the frame's
//!   offset in it, so moving a frame or a pack is detected.
//!
//! docs/repository-format.md §15 is the specification. AES-GCM and HKDF come from
//! aws-lc-rs (hardware AES and carry-less multiply), Argon2id from RustCrypto; every key is
//! zeroized when dropped.

use crate::{layout, Error, ErrorKind, Named, Result, Storage};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::hkdf::{Salt, HKDF_SHA256};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use zeroize::{Zeroize, Zeroizing};

/// Magic of a sealed object, the first 8 bytes.
pub const SEAL_MAGIC: &[u8; 8] = b"PGSTRSEA";
/// Version of the sealed-object envelope.
pub const SEAL_VERSION: u8 = 1;
/// Cipher id of AES-256-GCM in the envelope.
pub const CIPHER_AES_256_GCM: u8 = 1;
/// Header of a sealed object: magic, version, cipher id, 6 zero bytes.
pub const SEAL_HEADER_LEN: usize = 16;
/// Random salt of each sealed object and frame.
pub const SALT_LEN: usize = 16;
/// AES-GCM tag.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed object adds to its content.
pub const OBJECT_OVERHEAD: usize = SEAL_HEADER_LEN + SALT_LEN + TAG_LEN;
/// Bytes a sealed frame adds to its content.
pub const FRAME_OVERHEAD: usize = SALT_LEN + TAG_LEN;

/// HKDF info of a sealed object's key.
const OBJECT_INFO: &[u8] = b"pgstrata object v1";
/// HKDF info of the local key cache's wrapping key (not a repository object).
const CACHE_INFO: &[u8] = b"pgstrata key cache v1";
/// HKDF info of a sealed frame's key.
const FRAME_INFO: &[u8] = b"pgstrata frame v1";
/// Prefix of a key file's associated data.
const KEY_AAD_PREFIX: &str = "pgstrata key v1";
/// Version of the key file format.
pub const KEY_FILE_VERSION: u32 = 1;

/// Default Argon2id parameters for new key files.
pub const DEFAULT_M_COST_KIB: u32 = 64 * 1024;
pub const DEFAULT_T_COST: u32 = 3;
pub const DEFAULT_P_COST: u32 = 1;
/// Tests only: the memory (KiB) of new key files' Argon2id, so test suites do not spend
/// 64 MiB per command. Never set it in production.
pub const TEST_KDF_MEMORY_ENV: &str = "PGSTRATA_TEST_KDF_MEMORY_KIB";
/// Largest parameters a reader accepts from a key file (they size an allocation and the
/// time spent): 4 GiB of memory, 64 passes, 64 lanes.
const MAX_M_COST_KIB: u32 = 4 * 1024 * 1024;
const MAX_T_COST: u32 = 64;
const MAX_P_COST: u32 = 64;

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

/// The AES-256-GCM key HKDF-SHA256 derives from `ikm` (the master key, or a passphrase for
/// the local key cache), `salt` and `info`.
fn derive(ikm: &[u8], salt: &[u8], info: &[u8]) -> LessSafeKey {
    let prk = Salt::new(HKDF_SHA256, salt).extract(ikm);
    let info = [info];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .expect("HKDF output of one AES key");
    LessSafeKey::new(UnboundKey::from(okm))
}

fn aead_key(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"))
}

/// Each derived key seals exactly one message, so the nonce may be constant.
fn zero_nonce() -> Nonce {
    Nonce::assume_unique_for_key([0u8; NONCE_LEN])
}

/// The open master key of a stanza: seals and opens its objects and frames.
pub struct Cipher {
    master: Key,
    /// The key file that opened it (for messages).
    pub key_id: String,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cipher")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The envelope header of a sealed object.
fn seal_header() -> [u8; SEAL_HEADER_LEN] {
    let mut h = [0u8; SEAL_HEADER_LEN];
    h[..8].copy_from_slice(SEAL_MAGIC);
    h[8] = SEAL_VERSION;
    h[9] = CIPHER_AES_256_GCM;
    h
}

/// Associated data of a sealed object: its header and its name.
fn object_aad(header: &[u8], key: &str) -> Vec<u8> {
    let mut aad = header.to_vec();
    aad.extend_from_slice(key.as_bytes());
    aad
}

/// Associated data of a cached master key: what it is for and which key file opened it.
fn cache_aad(context: &str, key_id: &str) -> Vec<u8> {
    format!(
        "{}\0{context}\0{key_id}",
        String::from_utf8_lossy(CACHE_INFO)
    )
    .into_bytes()
}

/// Associated data of a sealed frame: its pack's name and its offset in the pack.
fn frame_aad(pack_key: &str, offset: u64) -> Vec<u8> {
    let mut aad = pack_key.as_bytes().to_vec();
    aad.extend_from_slice(&offset.to_be_bytes());
    aad
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
    /// A new random master key.
    pub fn generate() -> Cipher {
        Cipher {
            master: Zeroizing::new(random::<32>()),
            key_id: String::new(),
        }
    }

    /// Seal the whole object stored as `key`.
    pub fn seal_object(&self, key: &str, plain: &[u8]) -> Vec<u8> {
        let header = seal_header();
        let mut out = Vec::with_capacity(plain.len() + OBJECT_OVERHEAD);
        out.extend_from_slice(&header);
        let aad = object_aad(&header, key);
        seal_salted_into(&self.master[..], OBJECT_INFO, &aad, plain, &mut out);
        out
    }

    /// Open the object stored as `key`: refused as damaged unless it was sealed under that
    /// very name with this master key and is whole.
    pub fn open_object(&self, key: &str, sealed: &[u8]) -> Result<Vec<u8>> {
        if sealed.len() < OBJECT_OVERHEAD || !is_sealed(sealed) {
            return Err(damaged(key));
        }
        let (header, body) = sealed.split_at(SEAL_HEADER_LEN);
        if header[8] != SEAL_VERSION || header[9] != CIPHER_AES_256_GCM {
            return Err(Error::new(
                ErrorKind::Format,
                format!(
                    "{key}: sealed with envelope version {} cipher {}, which this pgstrata does not know; upgrade pgstrata",
                    header[8], header[9]
                ),
            ));
        }
        let mut out = Vec::new();
        let aad = object_aad(header, key);
        open_salted_into(&self.master[..], OBJECT_INFO, &aad, body, &mut out)
            .ok_or_else(|| damaged(key))?;
        Ok(out)
    }

    /// The master key wrapped for the local key cache: salt, AES-256-GCM ciphertext and
    /// tag under HKDF-SHA256(passphrase, salt), bound to `context` (repository and stanza)
    /// and the id of the key file `key_id` that `pass` opens. Cheap to open for whoever has
    /// the passphrase, which is the point: Argon2id runs once per host, not once per command.
    pub fn wrap_for_cache(&self, pass: &Passphrase, context: &str, key_id: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(SALT_LEN + 32 + TAG_LEN);
        let aad = cache_aad(context, key_id);
        seal_salted_into(pass.bytes(), CACHE_INFO, &aad, &self.master[..], &mut out);
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
        if wrapped.len() != SALT_LEN + 32 + TAG_LEN {
            return None;
        }
        let mut plain = Zeroizing::new(Vec::new());
        let aad = cache_aad(context, key_id);
        open_salted_into(pass.bytes(), CACHE_INFO, &aad, wrapped, &mut plain)?;
        let mut master = Zeroizing::new([0u8; 32]);
        master.copy_from_slice(&plain);
        Some(Cipher {
            master,
            key_id: key_id.to_string(),
        })
    }

    /// Append frame `plain`, sealed as the frame at `offset` of pack `pack_key`, to `out`.
    pub fn seal_frame_into(&self, pack_key: &str, offset: u64, plain: &[u8], out: &mut Vec<u8>) {
        let aad = frame_aad(pack_key, offset);
        seal_salted_into(&self.master[..], FRAME_INFO, &aad, plain, out);
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
        let aad = frame_aad(pack_key, offset);
        open_salted_into(&self.master[..], FRAME_INFO, &aad, sealed, out)
            .ok_or_else(|| damaged(what))
    }
}

/// Append `salt || ciphertext || tag` to `out`: `plain` sealed with AES-256-GCM under the key
/// HKDF derives from `ikm`, a fresh random salt and `info`, authenticating `aad`. Objects,
/// frames and the cached master key are all sealed this way.
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

    /// The key-encryption key this passphrase gives.
    fn derive(&self, pass: &Passphrase, what: &str) -> Result<Key> {
        let bad = |why: String| Error::corrupt(format!("{what}: {why}"));
        if self.algorithm != "argon2id" || self.version != 19 {
            return Err(bad(format!(
                "unknown key derivation {} version {}",
                self.algorithm, self.version
            )));
        }
        if self.m_cost > MAX_M_COST_KIB || self.t_cost > MAX_T_COST || self.p_cost > MAX_P_COST {
            return Err(bad(format!(
                "Argon2id parameters m={} t={} p={} exceed the limits (m {MAX_M_COST_KIB}, t {MAX_T_COST}, p {MAX_P_COST})",
                self.m_cost, self.t_cost, self.p_cost
            )));
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

/// A key file: the master key wrapped by one passphrase, and who made it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyFile {
    /// Key file format, 1.
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
    /// Nonce of the wrapping, hex (12 bytes).
    pub nonce: String,
    /// AES-256-GCM of the master key under the passphrase's key, and the tag, hex.
    pub wrapped_key: String,
}

/// Associated data of a key file's wrapping.
fn key_aad(stanza: &str, id: &str) -> Vec<u8> {
    format!("{KEY_AAD_PREFIX}/{stanza}/{id}").into_bytes()
}

fn is_key_id(id: &str) -> bool {
    id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl KeyFile {
    /// A new key file wrapping `master` with a key derived from `pass`.
    pub fn wrap(
        stanza: &str,
        master: &Cipher,
        pass: &Passphrase,
        created: String,
        host: String,
        user: String,
    ) -> Result<KeyFile> {
        let id = hex::encode(random::<8>());
        let kdf = Kdf::new_random();
        let kek = kdf.derive(pass, "new key")?;
        let nonce = random::<NONCE_LEN>();
        let mut buf = master.master.to_vec();
        aead_key(&kek)
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key_aad(stanza, &id)),
                &mut buf,
            )
            .expect("AES-GCM seal");
        let wrapped_key = hex::encode(&buf);
        buf.zeroize();
        Ok(KeyFile {
            format: KEY_FILE_VERSION,
            id,
            created,
            host,
            user,
            cipher: CipherType::Aes256Gcm.name().into(),
            kdf,
            nonce: hex::encode(nonce),
            wrapped_key,
        })
    }

    /// The master key, when `kek` (derived from this file's `kdf`) opens the wrapping.
    fn unwrap_with(&self, stanza: &str, kek: &[u8; 32]) -> Option<Cipher> {
        let nonce: [u8; NONCE_LEN] = hex::decode(&self.nonce).ok()?.try_into().ok()?;
        let mut buf = Zeroizing::new(hex::decode(&self.wrapped_key).ok()?);
        let plain = aead_key(kek)
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key_aad(stanza, &self.id)),
                &mut buf[..],
            )
            .ok()?;
        let master: [u8; 32] = plain.try_into().ok()?;
        Some(Cipher {
            master: Zeroizing::new(master),
            key_id: self.id.clone(),
        })
    }

    /// Check a key file read from `key` (its name must be its id).
    fn parse(bytes: &[u8], key: &str) -> Result<KeyFile> {
        let k: KeyFile = serde_json::from_slice(bytes).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("{key}: not a valid key file"),
                e,
            )
        })?;
        if k.format != KEY_FILE_VERSION {
            return Err(Error::new(
                ErrorKind::Format,
                format!("{key}: key file format {} is not supported", k.format),
            ));
        }
        let file_id = key.rsplit('/').next().and_then(|n| n.strip_suffix(".json"));
        if !is_key_id(&k.id) || file_id != Some(k.id.as_str()) {
            return Err(Error::corrupt(format!(
                "{key}: key file holds id '{}', not its name",
                k.id
            )));
        }
        Ok(k)
    }

    /// Every key file of the stanza, sorted by creation time then id.
    pub async fn list(storage: &Storage, stanza: &str) -> Result<Vec<KeyFile>> {
        let mut out = Vec::new();
        for o in storage.list(&layout::keys_dir(stanza)).await? {
            if !o.key.ends_with(".json") {
                continue;
            }
            let bytes = storage.get_unsealed(&o.key).await?;
            out.push(KeyFile::parse(&bytes, &o.key)?);
        }
        out.sort_by(|a, b| (&a.created, &a.id).cmp(&(&b.created, &b.id)));
        Ok(out)
    }

    /// Write it, create-only (in the clear: key files are the public header).
    pub async fn store(&self, storage: &Storage, stanza: &str) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("serialize key file");
        storage
            .put_new_unsealed(&layout::key_file(stanza, &self.id), json.into())
            .await
    }
}

/// Open the master key of `stanza` with `pass`, trying every key file (Argon2id runs once
/// per distinct parameters and salt). None opens: one line, a configuration error.
pub fn open_master(stanza: &str, keys: &[KeyFile], pass: &Passphrase) -> Result<Cipher> {
    let mut keks: HashMap<&Kdf, Key> = HashMap::new();
    for k in keys {
        let kek = match keks.get(&k.kdf) {
            Some(kek) => kek,
            None => {
                let what = layout::key_file(stanza, &k.id);
                let kek = k.kdf.derive(pass, &what)?;
                keks.entry(&k.kdf).or_insert(kek)
            }
        };
        if let Some(c) = k.unwrap_with(stanza, kek) {
            return Ok(c);
        }
    }
    Err(Error::new(
        ErrorKind::Invalid,
        format!(
            "the passphrase opens none of stanza {stanza}'s {} key{}",
            keys.len(),
            if keys.len() == 1 { "" } else { "s" }
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

    /// The host key cache's wrapping opens only with the same passphrase, context and key id.
    #[test]
    fn cached_key_opens_only_as_it_was_wrapped() {
        let mut c = Cipher::generate();
        c.key_id = "k1".into();
        let pass = Passphrase::new("secret");
        let wrapped = c.wrap_for_cache(&pass, "repo\0main", "k1");
        let back = Cipher::open_cached(&wrapped, &pass, "repo\0main", "k1").expect("opens");
        // The same master key: it opens what the original sealed.
        let sealed = c.seal_object("main/stanza.json", b"record");
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
        let sealed = c.seal_object("main/backup/L/backup.manifest", &plain);
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
        let sealed = c.seal_object(key, b"{\"stanza\":\"main\"}");
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
        c.seal_frame_into("main/backup/L/pack/0-0", 0, b"first frame", &mut pack);
        let second_at = pack.len();
        c.seal_frame_into(
            "main/backup/L/pack/0-0",
            second_at as u64,
            b"second",
            &mut pack,
        );
        assert_eq!(second_at, b"first frame".len() + FRAME_OVERHEAD);
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

    #[test]
    fn key_files_wrap_the_master_key_for_their_passphrase_only() {
        let master = Cipher::generate();
        let a = key_file(&master, "first passphrase");
        let b = key_file(&master, "second passphrase");
        assert!(is_key_id(&a.id) && a.id != b.id && a.kdf.salt != b.kdf.salt);
        let keys = vec![a.clone(), b.clone()];
        let probe = b"probe";
        let sealed = master.seal_object("k", probe);
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
        assert!(open_master("main", &[renamed], &Passphrase::new("first passphrase")).is_err());
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
            open_master("main", &[greedy], &Passphrase::new("x"))
                .unwrap_err()
                .kind,
            ErrorKind::Corrupt
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
