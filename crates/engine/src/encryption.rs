//! Repository encryption for the commands: which stanzas are encrypted, and opening their
//! master keys once per process (and once per host through the key cache). Opening the
//! stanza ([`open_stanza`]) is the first step of most commands; the key commands
//! themselves (`key-add`, `key-list`, `key-remove`) live in `commands/key.rs`.
//!
//! The rule (docs/repository-format.md §15): a stanza is encrypted when `<stanza>/keys/`
//! holds key files. Then every later command needs a passphrase that opens one of them, and
//! the stanza record must be sealed; a passphrase given for a plain stanza is refused, so a
//! stanza whose key files were deleted and whose record was replaced by a plain one is not
//! taken for a plain stanza and written to in the clear.

use crate::{Error, Result, Settings};
use pgstrata_repo::cipher::{self, Cipher, CipherType, KeyFile, KeySet, Passphrase};
use pgstrata_repo::stanza::StanzaInfo;
use pgstrata_repo::{layout, Named, Storage};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Opened master keys by (repository, stanza, passphrase digest, key set fingerprint):
/// Argon2id runs once per command, however often it opens the stanza, and a change of the
/// key files (a rotation) is picked up by the next opening.
type Opened = HashMap<(String, String, [u8; 32], String), Arc<Cipher>>;
static OPENED: OnceLock<Mutex<Opened>> = OnceLock::new();

/// The session key `agent run` was given by the backup host (`pg-remote`): the stanza it
/// works for opens with it, and no passphrase is needed on this host.
static SESSION: OnceLock<Arc<Cipher>> = OnceLock::new();

/// In `agent run`: seal with the backup host's session key (and open only what it
/// opens) instead of a master key opened with this host's passphrase.
pub fn use_session_key(session: cipher::SessionKey) {
    let _ = SESSION.set(Arc::new(Cipher::from_session(session)));
}

/// The master key the backup host of a `pg-remote` job derives the agent's session key
/// from (`None`: the stanza is not encrypted): the stanza's, opened with this host's
/// passphrase; or, for stanza-create (`create`) of a new stanza with
/// `repo-cipher-type=aes-256-gcm`, a new one whose key file is stored here first, so that
/// the stanza record the agent then seals under the session opens with this passphrase.
pub async fn master_for_peer(s: &Settings, create: bool) -> Result<Option<Arc<Cipher>>> {
    let storage = if create {
        s.storage_or_create()?
    } else {
        s.storage()?
    };
    let keys = KeySet::load(&storage, &s.stanza).await?;
    if keys.encrypted {
        return open_master(s, &storage, &keys).await.map(Some);
    }
    if create
        && s.cipher_type == CipherType::Aes256Gcm
        && !StanzaInfo::exists(&storage, &s.stanza).await?
    {
        let (storage, _) = prepare_new_stanza(s, storage).await?;
        return Ok(storage.cipher().cloned());
    }
    Ok(None)
}

/// Open the repository and load the stanza record, with the stanza's master key attached
/// when it is encrypted.
pub(crate) async fn open_stanza(s: &Settings) -> Result<(Storage, StanzaInfo)> {
    let storage = s.storage()?;
    // Both at once: on an object store each is a round trip, and archive-push pays them
    // for every WAL segment.
    let (keys, stored) = tokio::join!(
        KeySet::load(&storage, &s.stanza),
        StanzaInfo::fetch(&storage, &s.stanza)
    );
    let keys = keys?;
    if !keys.encrypted {
        let info = StanzaInfo::decode(&storage, &s.stanza, stored?)?;
        if s.cipher_pass.is_some() {
            // Deleting the key files and replacing the record by a plain one is how an
            // attacker would get the next backups written in the clear: never advise
            // dropping the passphrase here.
            return Err(Error::config(format!(
                "repo-cipher-pass is set but stanza '{stanza}' has no key files under {keys}/ and an unencrypted stanza record: if this stanza was created encrypted, the repository may have been tampered with (key files deleted, record replaced) so that backups are written in the clear. Nothing was written. Check that the configuration names the right repository and stanza, when and how the stanza was created (your records, the storage's access logs), and restore {keys}/ and stanza.json from a copy",
                stanza = s.stanza,
                keys = layout::keys_dir(&s.stanza)
            )));
        }
        return Ok((storage, info));
    }
    let master = open_master(s, &storage, &keys).await?;
    let storage = storage.with_cipher(master);
    let info = StanzaInfo::decode(&storage, &s.stanza, stored?)?;
    Ok((storage, info))
}

/// The master key of stanza `s.stanza` when it is encrypted (`None` when not): for the
/// backup host of `pg-remote`, which rebuilds and seals the manifests the agent sends as
/// patches (`pgstrata_repo::manifest::patch::Rebuilder`).
pub async fn stanza_cipher(s: &Settings) -> Result<Option<Arc<Cipher>>> {
    let storage = s.storage()?;
    let keys = KeySet::load(&storage, &s.stanza).await?;
    if !keys.encrypted {
        return Ok(None);
    }
    open_master(s, &storage, &keys).await.map(Some)
}

/// The passphrase of an encrypted stanza, or a configuration error saying where to set it.
pub(crate) fn passphrase(s: &Settings) -> Result<&Passphrase> {
    s.cipher_pass.as_ref().ok_or_else(|| {
        Error::config(format!(
            "stanza '{}' is encrypted: set repo-cipher-pass in the config file or PGSTRATA_REPO_CIPHER_PASS in the environment",
            s.stanza
        ))
    })
}

async fn open_master(s: &Settings, storage: &Storage, keys: &KeySet) -> Result<Arc<Cipher>> {
    if let Some(session) = SESSION.get() {
        return Ok(session.clone());
    }
    let pass = passphrase(s)?.clone();
    let cache_key = (
        storage.description().to_string(),
        s.stanza.clone(),
        pass.fingerprint(),
        keys.fingerprint.clone(),
    );
    let opened = OPENED.get_or_init(Default::default);
    if let Some(c) = opened.lock().expect("key cache").get(&cache_key) {
        return Ok(c.clone());
    }
    let cache = s
        .cipher_key_cache
        .then(|| HostKeyCache::new(storage, &s.stanza, &keys.fingerprint));
    let cached = cache.as_ref().and_then(|c| c.load(&pass, &keys.files));
    let cipher = match cached {
        Some(mut c) => {
            c.note_newest_generation(keys.newest_generation());
            c
        }
        None => {
            let stanza = s.stanza.clone();
            let pass_for_kdf = pass.clone();
            let keys = keys.clone();
            // Argon2id takes a fraction of a second and 64 MiB: off the async workers.
            let c = tokio::task::spawn_blocking(move || {
                cipher::open_master(&stanza, &keys, &pass_for_kdf)
            })
            .await
            .expect("key derivation thread")?;
            if let Some(cache) = &cache {
                cache.store(&c, &pass, &c.key_id);
            }
            c
        }
    };
    let cipher = Arc::new(cipher);
    log::debug!(
        "stanza '{}' opened with key {} (master key generation {})",
        s.stanza,
        cipher.key_id,
        cipher.generation()
    );
    opened
        .lock()
        .expect("key cache")
        .insert(cache_key, cipher.clone());
    Ok(cipher)
}

/// The host's key cache: an encrypted stanza's master key, wrapped by a key HKDF derives
/// from the passphrase, in `/dev/shm/pgstrata-<uid>/` (memory only, gone at reboot): all
/// its generations, bound to the listing of the stanza's key files and grants.
///
/// Why: Argon2id makes guessing a passphrase from a stolen key file slow, and that costs
/// every command 0.2 s and 64 MiB; archive-push runs once per WAL segment. The cached key
/// is bound to the repository, the stanza, the key file that opened it and the listing of
/// `keys/`, so it stops working when a key file or grant is added or removed (a rotation
/// brings a new generation, which the cached set lacks) or the passphrase changes. Whoever
/// can read the directory (this user, root) can read the passphrase in the config file too.
/// Every failure here is silent: the key is then derived as without a cache.
struct HostKeyCache {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
    context: String,
}

impl HostKeyCache {
    fn new(storage: &Storage, stanza: &str, keys_fingerprint: &str) -> HostKeyCache {
        let place = format!("{}\0{stanza}", storage.description());
        let dir = std::path::PathBuf::from(format!(
            "/dev/shm/pgstrata-{}",
            rustix::process::geteuid().as_raw()
        ));
        let name = blake3::hash(place.as_bytes()).to_hex();
        HostKeyCache {
            file: dir.join(format!("{}.key", &name[..32])),
            dir,
            context: format!("{place}\0{keys_fingerprint}"),
        }
    }

    /// The directory, if it is ours and no one else's (created 0700 when absent).
    fn private_dir(&self) -> Option<&std::path::Path> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        if !std::path::Path::new("/dev/shm").is_dir() {
            return None;
        }
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&self.dir);
        let m = std::fs::symlink_metadata(&self.dir).ok()?;
        let ours =
            m.is_dir() && m.uid() == rustix::process::geteuid().as_raw() && m.mode() & 0o077 == 0;
        ours.then_some(self.dir.as_path())
    }

    /// The cached key, if one opens with this passphrase for a key file the stanza still has.
    fn load(&self, pass: &Passphrase, keys: &[KeyFile]) -> Option<Cipher> {
        self.private_dir()?;
        let bytes = std::fs::read(&self.file).ok()?;
        let nl = bytes.iter().position(|b| *b == b'\n')?;
        let key_id = std::str::from_utf8(&bytes[..nl]).ok()?;
        if !keys.iter().any(|k| k.id == key_id) {
            return None;
        }
        let c = Cipher::open_cached(&bytes[nl + 1..], pass, &self.context, key_id)?;
        log::debug!("master key from the host key cache (key {key_id})");
        Some(c)
    }

    /// Cache `c`, opened by `pass` through key file `key_id`: written under a temporary
    /// name, 0600, renamed into place.
    fn store(&self, c: &Cipher, pass: &Passphrase, key_id: &str) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let Some(dir) = self.private_dir() else {
            return;
        };
        // The id of the key file that opened it, a newline, the wrapped key.
        let mut content = format!("{key_id}\n").into_bytes();
        content.extend(c.wrap_for_cache(pass, &self.context, key_id));
        let tmp = dir.join(format!(".{}.tmp", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&content))
            .and_then(|_| std::fs::rename(&tmp, &self.file));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            log::debug!("host key cache {}: {e}", self.file.display());
        }
    }
}

/// stanza-create's first step: for a new encrypted stanza, a random master key and its
/// first key file, and the storage that seals with it. Returns the key file written (to
/// remove again if the stanza turns out to exist already).
pub(crate) async fn prepare_new_stanza(
    s: &Settings,
    storage: Storage,
) -> Result<(Storage, Option<KeyFile>)> {
    match s.cipher_type {
        CipherType::None => {
            if s.cipher_pass.is_some() {
                return Err(Error::config(
                    "repo-cipher-pass is set but repo-cipher-type is none: set repo-cipher-type=aes-256-gcm to encrypt the stanza, or remove the passphrase",
                ));
            }
            Ok((storage, None))
        }
        // The backup host stored the key file before it sent the session key.
        CipherType::Aes256Gcm if SESSION.get().is_some() => {
            let session = SESSION.get().expect("checked").clone();
            Ok((storage.with_cipher(session), None))
        }
        CipherType::Aes256Gcm => {
            let pass = passphrase(s)?.clone();
            let master = Arc::new(Cipher::generate());
            let key = new_key_file(s, &master, pass.clone()).await?;
            key.store(&storage, &s.stanza).await?;
            if s.cipher_key_cache {
                let listing = vec![layout::key_file(&s.stanza, &key.id)];
                HostKeyCache::new(&storage, &s.stanza, &KeySet::fingerprint_of(listing))
                    .store(&master, &pass, &key.id);
            }
            log::info!("stanza '{}' is encrypted; key {} created", s.stanza, key.id);
            Ok((storage.with_cipher(master), Some(key)))
        }
    }
}

/// Refuse stanza-create of an existing stanza with another cipher type.
pub(crate) fn check_cipher_type(s: &Settings, existing: &Storage) -> Result<()> {
    let encrypted = existing.cipher().is_some();
    if encrypted != (s.cipher_type == CipherType::Aes256Gcm) {
        return Err(Error::config(format!(
            "stanza '{}' exists and is {}; repo-cipher-type={} cannot change that (encryption is chosen when a stanza is created)",
            s.stanza,
            if encrypted { "encrypted" } else { "not encrypted" },
            s.cipher_type.name()
        )));
    }
    Ok(())
}

pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) async fn new_key_file(
    s: &Settings,
    master: &Arc<Cipher>,
    pass: Passphrase,
) -> Result<KeyFile> {
    let (stanza, master) = (s.stanza.clone(), master.clone());
    let created = now();
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map_or_else(|| nix::unistd::geteuid().to_string(), |u| u.name);
    let host = crate::lock::hostname();
    Ok(tokio::task::spawn_blocking(move || {
        KeyFile::wrap(&stanza, &master, &pass, created, host, user)
    })
    .await
    .expect("key derivation thread")?)
}
