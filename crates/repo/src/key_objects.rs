//! The stanza's key objects in storage: key files and grants written create-only, in the
//! clear, and `<stanza>/keys/` listed and read into a [`KeySet`].
//!
//! Apart from `cipher`, which seals and opens with the keys, because storage seals with a
//! `Cipher`: the keys' own objects are read and written through storage, and a module
//! doing both would make `cipher` and `storage` depend on each other.

use crate::cipher::{Grant, KeyFile, KeySet};
use crate::layout::{self, KeysObject};
use crate::{Result, Storage};

impl KeyFile {
    /// Write it, create-only (in the clear: key files are the public header).
    pub async fn store(&self, storage: &Storage, stanza: &str) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("serialize key file");
        storage
            .put_new_unsealed(&layout::key_file(stanza, &self.id), json.into())
            .await
    }
}

impl Grant {
    /// Write it, create-only, in the clear like key files.
    pub async fn store(&self, storage: &Storage, stanza: &str) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("serialize grant");
        storage
            .put_new_unsealed(
                &layout::key_grant(stanza, &self.id, self.generation),
                json.into(),
            )
            .await
    }
}

impl KeySet {
    /// List and read `<stanza>/keys/`.
    pub async fn load(storage: &Storage, stanza: &str) -> Result<KeySet> {
        let mut set = KeySet::default();
        let mut names = Vec::new();
        for o in storage.list(&layout::keys_dir(stanza)).await? {
            names.push(o.key.clone());
            let is_key = match layout::parse_keys_object(&o.key) {
                Some(KeysObject::KeyFile { .. }) => true,
                Some(KeysObject::Grant { .. }) => false,
                None => continue,
            };
            set.encrypted |= is_key;
            let bytes = storage.get_unsealed(&o.key).await?;
            let parsed = if is_key {
                KeyFile::parse(&bytes, &o.key).map(|k| set.files.push(k))
            } else {
                Grant::parse(&bytes, &o.key).map(|g| set.grants.push(g))
            };
            if let Err(e) = parsed {
                log::warn!("{e}: skipped");
                set.skipped.push(e.to_string());
            }
        }
        set.files
            .sort_by(|a, b| (&a.created, &a.id).cmp(&(&b.created, &b.id)));
        set.grants.sort_by_key(|g| g.generation);
        set.fingerprint = KeySet::fingerprint_of(names);
        Ok(set)
    }
}
