//! Names that recur across a manifest's entries, held once for the life of the process.
//!
//! A manifest names, for every path, its user and group, and for every extent a pack and
//! often the backup that holds it. A repository has few distinct ones (one or two owners;
//! pack names `<worker>-<seq>` recur across backups; one label per backup), but a manifest
//! of a million files repeats them millions of times. A [`Name`] is four bytes, an index
//! into a process-wide table, in place of a string or a shared pointer's sixteen.
//!
//! The table only grows. Reading a name takes no lock: slots live in segments of doubling
//! size that never move once made. A name read from a manifest costs memory as the rest of
//! the manifest does (it is in it, within the decoder's limits), but is kept for the life
//! of the process; pgstrata's processes that read manifests are one command each.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, OnceLock};

/// An interned name. Equal names have equal indexes; order is the names' order.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Name(NonZeroU32);

/// Distinct names a process takes from manifests: what the 32-bit index holds, with room
/// to spare for the names the process makes itself. Not lower: pack names are
/// `<worker>-<seq>`, and a backup of tens of terabytes has millions of packs.
pub(crate) const MAX_NAMES_READ: usize = 1 << 31;

/// Segment `s` holds the names of indexes `2^s ..= 2^(s+1) - 1`.
const SEGMENTS: usize = 32;

struct Table {
    segments: [OnceLock<Box<[OnceLock<&'static str>]>>; SEGMENTS],
    /// Taken to add a name (and to look one up by its text).
    index: Mutex<BTreeMap<&'static str, Name>>,
}

static TABLE: Table = Table {
    segments: [const { OnceLock::new() }; SEGMENTS],
    index: Mutex::new(BTreeMap::new()),
};

fn slot(index: NonZeroU32) -> (usize, usize) {
    let n = index.get();
    let segment = n.ilog2();
    (segment as usize, (n - (1 << segment)) as usize)
}

impl Name {
    /// The name `name`, added to the table if it is new.
    pub fn new(name: &str) -> Name {
        Self::lookup(name, usize::MAX).expect("no bound")
    }

    /// As [`Name::new`], but `None` when `name` is new and the table holds `bound` names.
    pub(crate) fn lookup(name: &str, bound: usize) -> Option<Name> {
        let mut index = TABLE.index.lock().expect("name table");
        if let Some(n) = index.get(name) {
            return Some(*n);
        }
        if index.len() >= bound {
            return None;
        }
        let n = Name(NonZeroU32::new(index.len() as u32 + 1).expect("from 1"));
        // Kept for the life of the process (bounded above): references to it are 'static.
        let kept: &'static str = Box::leak(name.into());
        let (segment, offset) = slot(n.0);
        TABLE.segments[segment]
            .get_or_init(|| (0..1usize << segment).map(|_| OnceLock::new()).collect())[offset]
            .set(kept)
            .expect("a new slot");
        index.insert(kept, n);
        Some(n)
    }

    pub fn as_str(self) -> &'static str {
        let (segment, offset) = slot(self.0);
        TABLE.segments[segment]
            .get()
            .and_then(|s| s[offset].get())
            .expect("a name is in the table before it is handed out")
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Name) -> std::cmp::Ordering {
        if self == other {
            return std::cmp::Ordering::Equal;
        }
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Name) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Name {
        Name::new(name)
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Name::lookup(&name, MAX_NAMES_READ).ok_or_else(|| {
            serde::de::Error::custom(format_args!("more than {MAX_NAMES_READ} distinct names"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_held_once_read_without_a_lock_and_ordered_as_text() {
        let a = Name::new("pgstrata-name-test-b");
        let b: Name = "pgstrata-name-test-b".into();
        assert_eq!(a, b, "one name, one index");
        let c = Name::new("pgstrata-name-test-a");
        assert_ne!(a, c);
        assert_eq!(&*a, "pgstrata-name-test-b");
        assert!(c < a, "ordered by text, not by index");
        // Enough names to fill several segments; each reads back as written.
        let many: Vec<Name> = (0..5000)
            .map(|i| Name::new(&format!("pgstrata-name-test-{i}")))
            .collect();
        for (i, n) in many.iter().enumerate() {
            assert_eq!(n.as_str(), format!("pgstrata-name-test-{i}"));
        }
        assert_eq!(
            serde_json::to_string(&Some(a)).unwrap(),
            "\"pgstrata-name-test-b\""
        );
        assert_eq!(
            serde_json::from_str::<Option<Name>>("\"pgstrata-name-test-a\"").unwrap(),
            Some(c)
        );
        assert_eq!(std::mem::size_of::<Option<Name>>(), 4);
    }
}
