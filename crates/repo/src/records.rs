//! Records that commands keep in the repository beside the backups (expire records,
//! annotation records): small JSON objects, written create-only and sealed under their
//! own name in an encrypted stanza, that readers believe only when their content names the
//! key they are stored under.

use crate::{Error, ErrorKind, Result, Storage};
use serde::de::DeserializeOwned;

/// Every record under `prefix` that opens, parses and `belongs` to its key (the record and
/// the key it was read from); the keys of the others, refused (logged, not believed).
/// `what` names the kind in messages ("expire record").
pub(crate) async fn load_records<T: DeserializeOwned>(
    storage: &Storage,
    prefix: &str,
    what: &str,
    belongs: impl Fn(&T, &str) -> bool,
) -> Result<(Vec<T>, Vec<String>)> {
    let (mut records, mut refused) = (Vec::new(), Vec::new());
    for o in storage.list(prefix).await? {
        let record = match storage.get(&o.key).await {
            Ok(bytes) => serde_json::from_slice::<T>(&bytes)
                .map_err(|e| Error::corrupt(format!("{}: {e}", o.key))),
            Err(e) if e.is_not_found() => continue,
            Err(e) if e.kind == ErrorKind::Corrupt => Err(e),
            Err(e) => return Err(e),
        };
        match record {
            Ok(r) if belongs(&r, &o.key) => records.push(r),
            Ok(_) => {
                log::error!("{}: an {what} stored under another name: refused", o.key);
                refused.push(o.key);
            }
            Err(e) => {
                log::error!("{e}: the {what} is refused");
                refused.push(o.key);
            }
        }
    }
    Ok((records, refused))
}

/// The `<unique>` of a record's key `<...>/<unique>.json`.
pub(crate) fn record_name(key: &str) -> Option<&str> {
    key.rsplit('/').next()?.strip_suffix(".json")
}
