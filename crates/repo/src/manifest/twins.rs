//! Checking each twin of a backup's manifest on its own.
//!
//! A manifest and each of its parts are written twice (the object and its `.copy`), and a
//! reader takes the copy when the object fails its check ([`super::read_with_copy`]): the
//! backup restores with one of the two damaged. That is what redundancy is for, but it is
//! also how redundancy is lost without anyone noticing: the next damage to the surviving
//! twin loses the backup. `verify` therefore reads every twin itself, and reports each one
//! that fails, saying whether its twin is intact (and so whether `verify --repair` can
//! rewrite it).

use super::{parts, Manifest};
use crate::{layout, ErrorKind, Result, Storage};

/// One object of a twinned pair (a manifest or a part, or the copy of one) that is missing
/// or fails its check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DamagedTwin {
    /// The damaged object.
    pub key: String,
    /// Its twin: the copy of an original, or the original of a copy.
    pub twin: String,
    /// Whether the twin passed its check (the backup still restores, from the twin).
    pub twin_intact: bool,
    /// What is wrong with `key`.
    pub why: String,
}

impl DamagedTwin {
    /// Rewrite this damaged object from its intact twin (sealed, in an encrypted stanza,
    /// under the original's name as both twins are), then check it as `check_twins` does.
    /// The caller holds the stanza lock, so expire cannot remove the backup meanwhile.
    pub async fn repair(&self, storage: &Storage) -> Result<()> {
        if !self.twin_intact {
            return Err(crate::Error::corrupt(format!(
                "{} cannot be repaired: its twin {} is damaged too",
                self.key, self.twin
            )));
        }
        let original = layout::copied_from(&self.key).unwrap_or(&self.key);
        let intact = storage.get_sealed_as(&self.twin, original).await?;
        storage.replace(&self.key, original, intact.clone()).await?;
        let written = storage.get_sealed_as(&self.key, original).await?;
        if written != intact {
            return Err(crate::Error::corrupt(format!(
                "{}: rewritten from {}, but reads back different bytes",
                self.key, self.twin
            )));
        }
        Ok(())
    }
}

/// A pair: the original's key and its copy's.
struct Pair {
    key: String,
    copy: String,
}

/// The format that brought manifest copies: a manifest of an older one may have none.
const COPIES_SINCE: u32 = 3;

impl Manifest {
    /// Check each twin of backup `label`'s manifest and of its parts (format 4) on its
    /// own, as stored (never from the manifest cache): those missing or failing their
    /// checks. A part is checked against the hash the manifest records for it.
    pub async fn check_twins(
        storage: &Storage,
        stanza: &str,
        label: &str,
    ) -> Result<Vec<DamagedTwin>> {
        let mut damaged = Vec::new();
        let pair = Pair {
            key: layout::manifest(stanza, label),
            copy: layout::manifest_copy(stanza, label),
        };
        if !storage.exists(&pair.key).await? {
            // Not a backup (any more): expired since it was listed.
            return Ok(damaged);
        }
        let decode = |obj: &[u8], key: &str| Manifest::decode_at(obj, key, stanza, label);
        let has_copy = |m: &Manifest| m.format_version >= COPIES_SINCE;
        let manifest = check_pair(storage, &pair, &decode, has_copy, &mut damaged).await?;
        let Some(manifest) = manifest else {
            return Ok(damaged);
        };
        for (n, part) in manifest.parts.iter().enumerate() {
            let pair = Pair {
                key: layout::manifest_part(stanza, label, n),
                copy: layout::manifest_part_copy(stanza, label, n),
            };
            let check = |obj: &[u8], key: &str| parts::check_part(obj, key, part);
            check_pair(storage, &pair, &check, |_| true, &mut damaged).await?;
        }
        Ok(damaged)
    }
}

/// Check both objects of `pair` with `check`, adding those that fail to `damaged`; what
/// the first intact one decodes to. When the original is intact and `has_copy` says of it
/// that it was written with a copy, a missing copy is damage too (a removed copy is lost
/// redundancy like a damaged one); otherwise an absent copy is passed over.
async fn check_pair<T>(
    storage: &Storage,
    pair: &Pair,
    check: &impl Fn(&[u8], &str) -> Result<T>,
    has_copy: impl Fn(&T) -> bool,
    damaged: &mut Vec<DamagedTwin>,
) -> Result<Option<T>> {
    let original = check_one(storage, &pair.key, &pair.key, false, check).await?;
    let copy_required = matches!(&original, Ok(Some(m)) if has_copy(m));
    let copy = check_one(storage, &pair.copy, &pair.key, !copy_required, check).await?;
    let (original_ok, copy_ok) = (original.is_ok(), matches!(copy, Ok(Some(_))));
    let mut intact = None;
    for (result, key, twin, twin_intact) in [
        (original, &pair.key, &pair.copy, copy_ok),
        (copy, &pair.copy, &pair.key, original_ok),
    ] {
        match result {
            Ok(Some(decoded)) if intact.is_none() => intact = Some(decoded),
            Ok(_) => {}
            Err(why) => damaged.push(DamagedTwin {
                key: key.clone(),
                twin: twin.clone(),
                twin_intact,
                why,
            }),
        }
    }
    Ok(intact)
}

/// Object `key` (sealed under `sealed_as`'s name) checked with `check`: `Ok(Some)` what it
/// decodes to, `Ok(None)` absent where that is allowed, `Err` why it is damaged. Storage
/// failures other than damage or absence are the outer error.
async fn check_one<T>(
    storage: &Storage,
    key: &str,
    sealed_as: &str,
    may_be_absent: bool,
    check: &impl Fn(&[u8], &str) -> Result<T>,
) -> Result<std::result::Result<Option<T>, String>> {
    let got = match storage.get_sealed_as(key, sealed_as).await {
        Ok(obj) => check(&obj, key).map(Some),
        Err(e) if e.is_not_found() && may_be_absent => return Ok(Ok(None)),
        Err(e) if e.is_not_found() => return Ok(Err(format!("{key} is missing"))),
        Err(e) => Err(e),
    };
    match got {
        Ok(decoded) => Ok(Ok(decoded)),
        Err(e) if e.kind == ErrorKind::Corrupt => Ok(Err(e.to_string())),
        Err(e) => Err(e),
    }
}
