//! File ownership: names recorded at backup, applied at restore when running as root.

use pgstrata_repo::manifest::Owner;
use pgstrata_repo::name::Name;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

/// Caches uid/gid → name lookups while walking a data directory.
#[derive(Default)]
pub(crate) struct OwnerNames {
    users: HashMap<u32, Option<Name>>,
    groups: HashMap<u32, Option<Name>>,
}

impl OwnerNames {
    pub(crate) fn owner_of(&mut self, md: &std::fs::Metadata) -> Owner {
        let uid = md.uid();
        let gid = md.gid();
        let user = cached(&mut self.users, uid, |id| {
            nix::unistd::User::from_uid(id.into()).ok()?.map(|u| u.name)
        });
        let group = cached(&mut self.groups, gid, |id| {
            nix::unistd::Group::from_gid(id.into())
                .ok()?
                .map(|g| g.name)
        });
        Owner {
            mode: md.mode() & 0o7777,
            uid,
            gid,
            user,
            group,
        }
    }
}

/// The name of `id`, looked up once.
fn cached(
    names: &mut HashMap<u32, Option<Name>>,
    id: u32,
    look_up: impl FnOnce(u32) -> Option<String>,
) -> Option<Name> {
    *names
        .entry(id)
        .or_insert_with(|| look_up(id).map(|n| Name::new(&n)))
}

/// A recorded owner as a lookup key: (user name, group name, uid, gid).
type OwnerKey = (Option<Name>, Option<Name>, u32, u32);

/// Resolves recorded owners to ids on this host (by name first, then by id).
#[derive(Default)]
pub(crate) struct OwnerResolver {
    cache: HashMap<OwnerKey, (u32, u32)>,
}

impl OwnerResolver {
    pub fn ids(&mut self, o: &Owner) -> (u32, u32) {
        *self
            .cache
            .entry((o.user, o.group, o.uid, o.gid))
            .or_insert_with(|| {
                let uid = o.user.as_deref().and_then(|n| {
                    nix::unistd::User::from_name(n)
                        .ok()?
                        .map(|u| u.uid.as_raw())
                });
                let gid = o.group.as_deref().and_then(|n| {
                    nix::unistd::Group::from_name(n)
                        .ok()?
                        .map(|g| g.gid.as_raw())
                });
                (uid.unwrap_or(o.uid), gid.unwrap_or(o.gid))
            })
    }
}

pub(crate) fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}
