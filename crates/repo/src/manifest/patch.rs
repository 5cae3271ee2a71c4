//! A new manifest sent as its difference from the prior one.
//!
//! Through a repository on another host (`pg-remote`, `repo-remote`), a small incremental's
//! packs are a few hundred kilobytes while its manifest is a fixed cost that grows with
//! the file count (~35 KB for a 1,000-file cluster: every file's content hash is
//! incompressible). Most of it is the prior manifest's text again: unchanged files keep
//! their hashes, sizes and extents. So the writer sends the new manifest's JSON
//! compressed with the prior manifest's JSON as a zstd prefix (the technique of
//! `zstd --patch-from`), and the host that holds the repository, which holds the prior
//! manifest too, rebuilds the new one and stores it. A patch of an incremental's manifest
//! is a few kilobytes.
//!
//! Both sides must store the same bytes, and the holder compresses (and seals) what it
//! stores itself. So a patched manifest is stored in a canonical form
//! (`checked::encode_json`): the JSON compressed in one call at level 3, which both sides
//! compute with the same code;
//! the patch carries the canonical form's BLAKE3, and the holder refuses to write a
//! rebuild that does not match it (the writer then sends the manifest whole). The
//! canonical form is an ordinary manifest object (docs/repository-format.md §8): readers
//! see no difference.
//!
//! Patch layout: `PGSTRMPT` (8 bytes), the BLAKE3 of the canonical object's compressed
//! body (32 bytes, the same as that object's own bytes 8..40), then one zstd frame of the
//! new JSON compressed with the prior JSON as a raw-content prefix.

use super::{Manifest, MAGIC as META_MAGIC, MAX_MANIFEST_RATIO};
use crate::checked;
use crate::cipher::{is_sealed, Cipher};
use crate::{Error, Result};
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use std::io::Read;
use std::sync::Arc;
use zstd::zstd_safe;

const PATCH_MAGIC: &[u8; 8] = b"PGSTRMPT";

/// Largest manifest JSON patched. Each side holds the prior and the new text whole while
/// it patches (about 300 bytes a file: some 200,000 files); larger manifests are sent
/// whole, where they are still a small part of what the backup moves.
pub const MAX_PATCHED_JSON: usize = 64 << 20;

/// The window a prefix of `prefix` bytes and a frame of `len` bytes need: zstd finds
/// matches only within its window, which must reach back over the whole prefix.
fn window_log(prefix: usize, len: usize) -> u32 {
    let need = (prefix + len).max(1 << 10);
    (usize::BITS - (need - 1).leading_zeros()).clamp(10, 30)
}

fn zstd_failed(what: &str, code: usize) -> Error {
    Error::corrupt(format!("{what}: {}", zstd_safe::get_error_name(code)))
}

/// The JSON text of a stored (unsealed) manifest, checked as a reader checks it, or
/// `None` when it inflates beyond [`MAX_PATCHED_JSON`].
fn json_of(stored: &[u8], what: &str) -> Result<Option<Vec<u8>>> {
    Manifest::check_stored(stored, what)?;
    let limit = MAX_PATCHED_JSON as u64;
    let mut json = Vec::new();
    crate::codec::zstd_bounded_reader(&stored[checked::HEADER_LEN..], MAX_MANIFEST_RATIO, what)
        .and_then(|d| {
            d.take(limit + 1)
                .read_to_end(&mut json)
                .map_err(|e| Error::corrupt(format!("{what}: {e}")))
        })?;
    Ok((json.len() as u64 <= limit).then_some(json))
}

/// The canonical stored form of manifest JSON `json`: what both sides of a patch write.
fn stored_of(json: &[u8]) -> Vec<u8> {
    checked::encode_json(META_MAGIC, json)
}

/// For the writer: the manifest `new` (stored form, unsealed) as a patch against `base`
/// (the prior manifest's stored form). Returns the stored form the holder will write
/// (canonical: possibly other bytes than `new`, the same JSON) and the patch; `None` when
/// either manifest is too large to patch.
pub fn make(base: &[u8], new: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    let (Some(old_json), Some(new_json)) = (
        json_of(base, "the prior manifest")?,
        json_of(new, "the new manifest")?,
    ) else {
        return Ok(None);
    };
    let stored = stored_of(&new_json);
    let mut cctx = zstd_safe::CCtx::create();
    for p in [
        zstd_safe::CParameter::CompressionLevel(3),
        zstd_safe::CParameter::WindowLog(window_log(old_json.len(), new_json.len())),
        zstd_safe::CParameter::EnableLongDistanceMatching(true),
    ] {
        cctx.set_parameter(p)
            .map_err(|c| zstd_failed("patch the manifest", c))?;
    }
    cctx.ref_prefix(&old_json)
        .map_err(|c| zstd_failed("patch the manifest", c))?;
    let mut patch = Vec::with_capacity(40 + zstd_safe::compress_bound(new_json.len()));
    patch.extend_from_slice(PATCH_MAGIC);
    patch.extend_from_slice(checked::checksum(&stored));
    let mut body = Vec::with_capacity(zstd_safe::compress_bound(new_json.len()));
    cctx.compress2(&mut body, &new_json)
        .map_err(|c| zstd_failed("patch the manifest", c))?;
    patch.extend_from_slice(&body);
    Ok(Some((stored, patch)))
}

/// For the holder: the stored form (unsealed) that `patch` makes from `base` (the prior
/// manifest's stored form, unsealed). Refused when the patch is damaged, too large, or
/// rebuilds another object than the writer's.
pub fn apply(base: &[u8], patch: &[u8]) -> Result<Vec<u8>> {
    if patch.len() < 40 || &patch[..8] != PATCH_MAGIC {
        return Err(Error::corrupt("not a manifest patch"));
    }
    let Some(old_json) = json_of(base, "the patch's base manifest")? else {
        return Err(Error::corrupt(
            "the patch's base manifest is too large to patch",
        ));
    };
    let frame = &patch[40..];
    let size = match zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n <= MAX_PATCHED_JSON as u64 => n as usize,
        _ => {
            return Err(Error::corrupt(
                "manifest patch: no size, or larger than a patch may make",
            ))
        }
    };
    let mut dctx = zstd_safe::DCtx::create();
    dctx.set_parameter(zstd_safe::DParameter::WindowLogMax(30))
        .map_err(|c| zstd_failed("apply the manifest patch", c))?;
    dctx.ref_prefix(&old_json)
        .map_err(|c| zstd_failed("apply the manifest patch", c))?;
    let mut new_json = Vec::with_capacity(size);
    dctx.decompress(&mut new_json, frame)
        .map_err(|c| zstd_failed("apply the manifest patch", c))?;
    let stored = stored_of(&new_json);
    if checked::checksum(&stored) != &patch[8..40] {
        return Err(Error::corrupt(
            "the manifest rebuilt from the patch is not the writer's (another zstd build?)",
        ));
    }
    Ok(stored)
}

/// The holder's side of a patched manifest (`put_patch`, docs/remote-protocol.md):
/// rebuild it from the prior manifest, and seal it when the stanza is encrypted.
pub struct Rebuilder {
    /// The stanza's master key (`None`: not encrypted, or no key here), resolved the
    /// first time a patch needs it.
    cipher: Shared<BoxFuture<'static, Option<Arc<Cipher>>>>,
}

impl Rebuilder {
    /// For a holder without the stanza's key (`agent repo` on the backup host): patches
    /// of an encrypted stanza's manifests are refused, and the writer sends them whole.
    pub fn without_key() -> Rebuilder {
        Rebuilder::with_key(async { None })
    }

    /// For a holder that can open the stanza's key (the backup host of `pg-remote`, which
    /// has the passphrase): `cipher` resolves to it, or to `None` for a stanza that is not
    /// encrypted.
    pub fn with_key(
        cipher: impl std::future::Future<Output = Option<Arc<Cipher>>> + Send + 'static,
    ) -> Rebuilder {
        Rebuilder {
            cipher: cipher.boxed().shared(),
        }
    }
}

#[async_trait::async_trait]
impl pgstrata_remote::agent::Rebuild for Rebuilder {
    async fn rebuild(
        &self,
        base_key: &str,
        base: Bytes,
        seal_as: &str,
        patch: Bytes,
    ) -> pgstrata_remote::Result<Bytes> {
        use pgstrata_remote::{Error as RemoteError, ErrorKind::Rebuild};
        if !crate::layout::is_manifest_object(base_key)
            || !crate::layout::is_manifest_object(seal_as)
        {
            return Err(RemoteError::new(
                Rebuild,
                format!("{seal_as}: only manifests and their parts are rebuilt from patches"),
            ));
        }
        let cipher = self.cipher.clone().await;
        let base = match (&cipher, is_sealed(&base)) {
            (Some(c), _) => c
                .open_object(base_key, &base)
                .map_err(|e| RemoteError::with_source(Rebuild, format!("open {base_key}"), e))?,
            (None, true) => {
                return Err(RemoteError::new(
                    Rebuild,
                    format!("{base_key} is encrypted and this host does not hold the stanza's key"),
                ))
            }
            (None, false) => base.to_vec(),
        };
        let rebuilding = format!("rebuild {seal_as}");
        let stored = tokio::task::spawn_blocking(move || apply(&base, &patch))
            .await
            .map_err(|e| RemoteError::with_source(Rebuild, &rebuilding, e))?
            .map_err(|e| RemoteError::with_source(Rebuild, &rebuilding, e))?;
        Ok(Bytes::from(match cipher {
            Some(c) => c
                .seal_object(seal_as, &stored)
                .map_err(|e| RemoteError::with_source(Rebuild, format!("seal {seal_as}"), e))?,
            None => stored,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest-like JSON of `files` entries with content hashes, `changed` of them new.
    fn stored_manifest(files: usize, changed: usize, seed: u8) -> Vec<u8> {
        let entries: Vec<serde_json::Value> = (0..files)
            .map(|i| {
                let salt = if i < changed { seed } else { 0 };
                serde_json::json!({
                    "path": format!("base/16384/{}", 16384 + i),
                    "size": 8192 * (i % 7 + 1),
                    "hash": blake3::hash(&[i as u8, (i >> 8) as u8, salt]).to_hex().to_string(),
                })
            })
            .collect();
        checked::encode(META_MAGIC, &serde_json::json!({ "entries": entries }))
    }

    #[test]
    fn a_patch_rebuilds_the_manifest_in_a_fraction_of_its_size() {
        let prior = stored_manifest(2000, 0, 0);
        let new = stored_manifest(2000, 20, 1);
        let (stored, patch) = make(&prior, &new).unwrap().unwrap();
        // The same JSON as the writer's manifest, in the canonical form.
        assert_eq!(json_of(&stored, "x").unwrap(), json_of(&new, "y").unwrap());
        assert!(
            patch.len() * 10 < new.len(),
            "patch {} bytes for a manifest of {}",
            patch.len(),
            new.len()
        );
        assert_eq!(apply(&prior, &patch).unwrap(), stored);
    }

    #[test]
    fn a_patch_against_another_base_or_damaged_is_refused() {
        let prior = stored_manifest(500, 0, 0);
        let other = stored_manifest(500, 100, 9);
        let new = stored_manifest(500, 5, 1);
        let (_, patch) = make(&prior, &new).unwrap().unwrap();
        assert!(apply(&other, &patch).is_err());
        let mut bad = patch.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x55;
        assert!(apply(&prior, &bad).is_err());
        let mut wrong_hash = patch.clone();
        wrong_hash[10] ^= 1;
        let err = apply(&prior, &wrong_hash).unwrap_err();
        assert!(err.to_string().contains("not the writer's"), "{err}");
        assert!(apply(&prior, b"PGSTRMPT").is_err());
        assert!(apply(b"junk", &patch).is_err());
    }

    /// The holder of an encrypted stanza opens the prior manifest, rebuilds and seals the
    /// new one under the manifest's name; without the key it refuses (the writer then
    /// sends the manifest whole), and it rebuilds nothing but manifests.
    #[tokio::test]
    async fn the_holder_rebuilds_and_seals_with_the_stanza_key_and_refuses_without() {
        use pgstrata_remote::agent::Rebuild;
        let (base_key, new_key) = ("s/backup/A/backup.manifest", "s/backup/B/backup.manifest");
        let prior = stored_manifest(300, 0, 0);
        let new = stored_manifest(300, 3, 1);
        let (stored, patch) = make(&prior, &new).unwrap().unwrap();
        let cipher = Arc::new(Cipher::generate());
        let sealed_base = Bytes::from(cipher.seal_object(base_key, &prior).unwrap());

        let key = cipher.clone();
        let holder = Rebuilder::with_key(async move { Some(key) });
        let sealed = holder
            .rebuild(
                base_key,
                sealed_base.clone(),
                new_key,
                Bytes::from(patch.clone()),
            )
            .await
            .unwrap();
        assert_eq!(cipher.open_object(new_key, &sealed).unwrap(), stored);

        let keyless = Rebuilder::without_key();
        let err = keyless
            .rebuild(base_key, sealed_base, new_key, Bytes::from(patch.clone()))
            .await
            .unwrap_err();
        assert_eq!(err.kind, pgstrata_remote::ErrorKind::Rebuild);
        assert!(
            err.to_string().contains("does not hold the stanza's key"),
            "{err}"
        );
        let plain = keyless
            .rebuild(
                base_key,
                Bytes::from(prior.clone()),
                new_key,
                Bytes::from(patch.clone()),
            )
            .await
            .unwrap();
        assert_eq!(&plain[..], &stored[..]);
        let err = keyless
            .rebuild(
                base_key,
                Bytes::from(prior),
                "s/backup/B/pack/0-1",
                Bytes::from(patch),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("only manifests"), "{err}");
    }
}
