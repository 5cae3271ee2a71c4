//! Directories of this host that pgstrata keeps state in between runs: the object cache,
//! the spool (`spool-path`) and the stale-lock guard (`lock-path`).
//!
//! Whoever else can write into one of them can plant or replace what pgstrata reads back
//! from it (a cached manifest that tells restore what to write, a prefetched WAL segment on
//! its way to PostgreSQL, the lock file that serializes stale-lock takeovers), and whoever
//! owns it can change its mode or rename it away. Such a directory may already exist when
//! pgstrata first uses it: a default under `/tmp` can be made by any local user, an
//! administrator may have made it with the wrong owner. So before use it must be a
//! directory of the user running pgstrata that neither its group nor others can write.
//! Reading by the group is not checked here: the callers make their directories 0700 and
//! their files private.

use crate::{Error, ErrorKind};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Make `dir` (and its parents) 0700 when missing, then [`check`] it.
pub fn create(dir: &Path, what: &str) -> crate::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            Error::with_source(ErrorKind::Invalid, format!("{what} {}", dir.display()), e)
        })?;
    check(dir, what, true)
}

/// Whether `dir` is a directory of this user that no one else can write: `Err` with a
/// sentence naming it as `what` (the option or purpose, e.g. `lock-path`), its owner and
/// mode, what is wrong and how to fix it. A symbolic link at `dir` is refused unless
/// `follow_link` (a directory the operator named may be reached through one: it is the
/// directory the link leads to that must be private then).
pub fn check(dir: &Path, what: &str, follow_link: bool) -> crate::Result<()> {
    let md = if follow_link {
        std::fs::metadata(dir)
    } else {
        std::fs::symlink_metadata(dir)
    }
    .map_err(|e| Error::with_source(ErrorKind::Invalid, format!("{what} {}", dir.display()), e))?;
    if !md.is_dir() {
        let kind = if md.file_type().is_symlink() {
            "a symbolic link"
        } else {
            "a file"
        };
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "{what} {} is not a directory but {kind}: name a directory of this user, mode 0700",
                dir.display()
            ),
        ));
    }
    let me = nix::unistd::geteuid().as_raw();
    let mode = md.mode() & 0o7777;
    let mut wrong = Vec::new();
    if md.uid() != me {
        wrong.push("belongs to another user");
    }
    if mode & 0o022 != 0 {
        wrong.push("is writable by others");
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Invalid,
        format!(
        "{what} {dir} (owner {owner}, mode {mode:04o}) {wrong}: it must belong to this user \
         ({me_name}) and be writable by no one else; fix: chown {me_user} {dir} && chmod 0700 {dir}",
        dir = dir.display(),
        owner = user(md.uid()),
        wrong = wrong.join(" and "),
        me_name = user(me),
        me_user = user_name(me).unwrap_or_else(|| me.to_string()),
        ),
    ))
}

/// `uid N (name)`, or `uid N` for a user the host does not know.
fn user(uid: u32) -> String {
    match user_name(uid) {
        Some(name) => format!("uid {uid} ({name})"),
        None => format!("uid {uid}"),
    }
}

fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_of_another_user_or_writable_by_others_is_named_with_owner_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        for mode in [0o700, 0o750, 0o755, 0o1700] {
            std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(mode)).unwrap();
            check(&mine, "x", false).unwrap();
        }
        for mode in [0o777, 0o770, 0o702, 0o1777] {
            std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check(&mine, "spool-path", false).unwrap_err();
            assert_eq!(e.kind, crate::ErrorKind::Invalid);
            let e = e.to_string();
            assert!(
                e.contains(&format!("spool-path {}", mine.display()))
                    && e.contains(&format!("mode {mode:04o}"))
                    && e.contains("is writable by others")
                    && e.contains("chmod 0700"),
                "{e}"
            );
        }
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = check(&link, "lock-path", false).unwrap_err().to_string();
        assert!(e.contains("not a directory but a symbolic link"), "{e}");
        check(&link, "spool-path", true).unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&mine, Some(65534), None).unwrap();
            let e = check(&mine, "lock-path", false).unwrap_err().to_string();
            assert!(
                e.contains("owner uid 65534")
                    && e.contains("mode 0700")
                    && e.contains("belongs to another user")
                    && !e.contains("writable by others")
                    && e.contains("chown root"),
                "{e}"
            );
        }
    }
}
