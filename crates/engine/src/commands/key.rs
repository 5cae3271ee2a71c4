//! The key commands, `key-add`, `key-list` and `key-remove`: they change only key files and
//! grants, never backup data. What a key is and how a stanza's master keys are opened is
//! [`crate::encryption`]'s.
//!
//! `key-remove` revokes: it starts a new master key generation, grants it to the remaining
//! key files, and everything written afterwards is sealed under it, so the removed key
//! file, put back by whoever kept a copy, opens nothing written later. A writer notices a
//! new generation when the listing of `keys/` changes: every command lists it first, and
//! the caches of opened keys are keyed by that listing. A writer that opened the keys
//! before the removal (a backup or an archive-push running meanwhile) seals what it still
//! writes under the old generation until its next command.

use crate::encryption::{new_key_file, now, passphrase};
use crate::{open_stanza, Error, Result, Settings};
use pgstrata_repo::cipher::{self, Cipher, Grant, KeyFile, KeySet, Passphrase};
use pgstrata_repo::stanza::StanzaInfo;
use pgstrata_repo::{layout, Storage};
use std::sync::Arc;

/// What `key-list` shows of a key file (its public part).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeyInfo {
    pub id: String,
    pub created: String,
    pub host: String,
    pub user: String,
}

/// `key-add`: another key file wrapping the stanza's master keys (every generation) with
/// `new_pass`. Needs a passphrase that opens a current key; rewrites nothing.
pub async fn key_add(s: &Settings, new_pass: Passphrase) -> Result<KeyInfo> {
    let (storage, _) = open_stanza(s).await?;
    let master = encrypted(s, &storage)?.clone();
    let key = new_key_file(s, &master, new_pass).await?;
    key.store(&storage, &s.stanza).await?;
    log::info!("key {} added to stanza '{}'", key.id, s.stanza);
    Ok(info_of(&key))
}

/// `key-list`: the stanza's key files. Reads only the public key files, so it needs no
/// passphrase.
pub async fn key_list(s: &Settings) -> Result<Vec<KeyInfo>> {
    let storage = s.storage()?;
    let keys = KeySet::load(&storage, &s.stanza).await?;
    if !keys.encrypted {
        StanzaInfo::load(&storage, &s.stanza).await?;
        return Err(Error::config(format!(
            "stanza '{}' is not encrypted: it has no keys",
            s.stanza
        )));
    }
    Ok(keys.files.iter().map(info_of).collect())
}

/// `key-remove`: revoke one key. Needs a passphrase that opens a current key of the stanza
/// (it may be the one removed) and never removes the last key. A new master key generation
/// seals everything written afterwards: it is granted to every remaining key file the
/// current master key vouches for, and a format-1 key file of the passphrase given is
/// replaced by a format-2 one holding it; the removed key file and its grants are deleted
/// last. Remaining key files that cannot receive it (format 1 of another passphrase, or
/// not vouched for) are named in a warning: they keep opening only older generations.
pub async fn key_remove(s: &Settings, id: &str) -> Result<()> {
    let (storage, _) = open_stanza(s).await?;
    let current = encrypted(s, &storage)?.clone();
    let keys = KeySet::load(&storage, &s.stanza).await?;
    cipher::check_removal(&s.stanza, &keys.files, id)?;
    let next = Arc::new(current.rotated()?);
    let generation = next.generation();
    let remaining: Vec<&KeyFile> = keys.files.iter().filter(|k| k.id != id).collect();
    let (granted, rest): (Vec<&KeyFile>, Vec<&KeyFile>) = remaining
        .into_iter()
        .partition(|k| current.vouches_for(&s.stanza, &keys, k));
    let (own, left_out): (Vec<&KeyFile>, Vec<&KeyFile>) =
        rest.into_iter().partition(|k| k.id == current.key_id);
    if granted.is_empty() && own.is_empty() {
        return Err(Error::config(format!(
            "no remaining key of stanza '{}' can receive the new master key (key files made by an older pgstrata, or not vouched for: {}): key-add a new passphrase first, then remove key {id}",
            s.stanza,
            left_out.iter().map(|k| k.id.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    for k in &granted {
        Grant::new(&s.stanza, k, &next, now())?
            .store(&storage, &s.stanza)
            .await?;
    }
    for old in &own {
        let key = new_key_file(s, &next, passphrase(s)?.clone()).await?;
        key.store(&storage, &s.stanza).await?;
        storage
            .delete(&layout::key_file(&s.stanza, &old.id))
            .await?;
        log::info!(
            "key {} (made by an older pgstrata) replaced by key {} for the same passphrase",
            old.id,
            key.id
        );
    }
    for k in &left_out {
        log::warn!(
            "key {} does not receive master key generation {generation} ({}): its passphrase opens only what was written before; remove it (key-remove), and key-add its holder's passphrase again if needed",
            k.id,
            if k.format < 2 { "made by an older pgstrata" } else { "not vouched for by the stanza's master key: did you add it?" }
        );
    }
    storage.delete(&layout::key_file(&s.stanza, id)).await?;
    for g in keys.grants.iter().filter(|g| g.id == id) {
        storage
            .delete(&layout::key_grant(&s.stanza, id, g.generation))
            .await?;
    }
    log::info!(
        "key {id} removed from stanza '{}'; master key generation {generation} seals everything written from now on",
        s.stanza
    );
    Ok(())
}

fn encrypted<'a>(s: &Settings, storage: &'a Storage) -> Result<&'a Arc<Cipher>> {
    storage.cipher().ok_or_else(|| {
        Error::config(format!(
            "stanza '{}' is not encrypted: it has no keys (encryption is chosen at stanza-create with repo-cipher-type=aes-256-gcm)",
            s.stanza
        ))
    })
}

fn info_of(k: &KeyFile) -> KeyInfo {
    KeyInfo {
        id: k.id.clone(),
        created: k.created.clone(),
        host: k.host.clone(),
        user: k.user.clone(),
    }
}
