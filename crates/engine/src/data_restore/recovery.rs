//! The files that tell PostgreSQL how to recover a restored directory: `backup_label`,
//! the recovery settings in `postgresql.auto.conf`, and `recovery.signal` or
//! `standby.signal`.
//!
//! The settings are rendered by a pure function (tested without a cluster, printed by
//! `--dry-run`), and every file is written durably: temporary name, fsync, rename, fsync of
//! the directory. Settings of an earlier restore (marked with [`MARK`]) and any recovery
//! keys the operator left are replaced, everything else in `postgresql.auto.conf` is kept.

use super::tree::{set_attributes, EntryKind, ParentCache, TargetTree};
use super::{RecoveryType, RestoreOptions};
use crate::Result;
use pgstrata_repo::manifest::Manifest;
use pgstrata_repo::Named;
use std::os::fd::AsFd;

const RECOVERY_KEYS: &[&str] = &[
    "restore_command",
    "recovery_target",
    "recovery_target_time",
    "recovery_target_lsn",
    "recovery_target_xid",
    "recovery_target_name",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_timeline",
];
const MARK: &str = "# pgstrata restore:";

/// The files that make PostgreSQL recover (`--type=preserve` keeps the target's).
pub(super) const SIGNAL_FILES: [&str; 2] = ["recovery.signal", "standby.signal"];

/// Quote a value for postgresql.conf.
fn conf_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

/// restore_command's value: pgstrata's archive-get.
pub(crate) fn restore_command(o: &RestoreOptions) -> String {
    format!("{} archive-get %f \"%p\"", o.archive_get_command)
}

/// The recovery settings this restore adds (without the lines kept from the existing file).
pub(super) fn recovery_settings(label: &str, o: &RestoreOptions) -> Vec<String> {
    let mut conf = vec![format!("{MARK} recovery settings for backup {label}")];
    conf.push(format!(
        "restore_command = {}",
        conf_quote(&restore_command(o))
    ));
    let target = o.target.clone().unwrap_or_default();
    match o.recovery_type {
        RecoveryType::Immediate => conf.push("recovery_target = 'immediate'".into()),
        RecoveryType::Time => conf.push(format!("recovery_target_time = {}", conf_quote(&target))),
        RecoveryType::Lsn => conf.push(format!("recovery_target_lsn = {}", conf_quote(&target))),
        RecoveryType::Xid => conf.push(format!("recovery_target_xid = {}", conf_quote(&target))),
        RecoveryType::Name => conf.push(format!("recovery_target_name = {}", conf_quote(&target))),
        _ => {}
    }
    if o.recovery_type.needs_target() && o.target_exclusive {
        conf.push("recovery_target_inclusive = false".into());
    }
    if let Some(a) = o.target_action {
        if o.recovery_type != RecoveryType::Standby {
            conf.push(format!("recovery_target_action = {}", conf_quote(a.name())));
        }
    }
    if let Some(t) = &o.target_timeline {
        conf.push(format!("recovery_target_timeline = {}", conf_quote(t)));
    }
    if o.archive_off {
        conf.push("archive_mode = 'off'".into());
    }
    for (key, value) in &o.recovery_options {
        conf.retain(|l| setting_key(l) != key);
        conf.push(format!("{key} = {}", conf_quote(value)));
    }
    conf
}

/// The key a postgresql.conf line sets ("" for none).
fn setting_key(line: &str) -> &str {
    line.split('=').next().unwrap_or("").trim()
}

/// `postgresql.auto.conf` with this restore's settings: the existing lines minus earlier
/// recovery settings, then the new ones.
pub(super) fn auto_conf(existing: &str, label: &str, o: &RestoreOptions) -> String {
    let mut conf: Vec<String> = existing
        .lines()
        .filter(|l| {
            let key = setting_key(l);
            !l.starts_with(MARK)
                && !RECOVERY_KEYS.contains(&key)
                && !o.recovery_options.iter().any(|(k, _)| k == key)
        })
        .map(str::to_string)
        .collect();
    conf.extend(recovery_settings(label, o));
    conf.join("\n") + "\n"
}

/// The signal file recovery needs, if any.
pub(super) fn signal_file(t: RecoveryType) -> Option<&'static str> {
    match t {
        RecoveryType::None | RecoveryType::Preserve => None,
        RecoveryType::Standby => Some("standby.signal"),
        _ => Some("recovery.signal"),
    }
}

/// The target's `postgresql.auto.conf`, if it has one.
pub(super) fn read_auto_conf(tree: &TargetTree, cache: &mut ParentCache) -> Result<Option<String>> {
    let Some(mut f) = tree.open_existing("postgresql.auto.conf", false, cache)? else {
        return Ok(None);
    };
    let mut s = String::new();
    std::io::Read::read_to_string(&mut f, &mut s).map_err(|e| {
        let path = tree.display_path("postgresql.auto.conf");
        crate::Error::io(format!("read {}", path.display()), e)
    })?;
    Ok(Some(s))
}

/// Write `backup_label`, the recovery settings and the signal file, durably, owned by
/// `ids` (the data directory's owner, when running as root). With `--type=preserve`,
/// `preserved` is the target's `postgresql.auto.conf` from before the restore, written
/// back as it was (the backup's copy replaced it), and the signal files are left alone.
pub(super) fn write_recovery_files(
    tree: &TargetTree,
    m: &Manifest,
    o: &RestoreOptions,
    ids: Option<(u32, u32)>,
    preserved: Option<&str>,
) -> Result<()> {
    let mut cache = ParentCache::default();
    let write = |name: &str, content: &str, cache: &mut ParentCache| {
        let path = tree.display_path(name);
        tree.write_durably(
            name,
            content.as_bytes(),
            |f| set_attributes(f.as_fd(), EntryKind::File, 0o600, ids, None, &path),
            cache,
        )
    };
    write("backup_label", &m.backup_label, &mut cache)?;
    tree.remove("tablespace_map", &mut cache)?;
    if o.recovery_type == RecoveryType::Preserve {
        if let Some(conf) = preserved {
            write("postgresql.auto.conf", conf, &mut cache)?;
        }
        return tree.root.sync();
    }
    for stale in SIGNAL_FILES {
        tree.remove(stale, &mut cache)?;
    }
    let Some(signal) = signal_file(o.recovery_type) else {
        return tree.root.sync();
    };
    let existing = read_auto_conf(tree, &mut cache)?.unwrap_or_default();
    write(
        "postgresql.auto.conf",
        &auto_conf(&existing, &m.label, o),
        &mut cache,
    )?;
    write(signal, "", &mut cache)?;
    tree.root.sync()
}

#[cfg(test)]
mod tests {
    use super::super::TargetAction;
    use super::*;

    const LABEL: &str = "20261123-101010F";

    fn options(t: RecoveryType) -> RestoreOptions {
        RestoreOptions {
            set: None,
            delta: false,
            force: false,
            dry_run: false,
            tablespace_map: vec![],
            tablespace_root: None,
            link_all: false,
            link_map: vec![],
            recovery_type: t,
            target: Some("it's 'quoted'".into()),
            target_action: Some(TargetAction::Promote),
            target_timeline: None,
            target_exclusive: true,
            archive_off: true,
            archive_get_command: "/usr/bin/pgstrata --stanza=main".into(),
            db_include: vec![],
            db_exclude: vec![],
            recovery_options: vec![],
            instant: false,
        }
    }

    /// A recovery option is written after pgstrata's settings; one of pgstrata's own keys
    /// replaces pgstrata's line, and an existing line of the same key goes.
    #[test]
    fn recovery_options_are_added_and_replace_the_same_key() {
        let mut o = options(RecoveryType::Immediate);
        o.recovery_options = vec![
            ("recovery_target".into(), "latest'ish".into()),
            ("work_mem".into(), "5MB".into()),
        ];
        let conf = auto_conf("work_mem = '1MB'\nshared_buffers = '1GB'\n", LABEL, &o);
        assert!(!conf.contains("'immediate'"), "{conf}");
        assert!(conf.contains("recovery_target = 'latest''ish'"), "{conf}");
        assert_eq!(conf.matches("work_mem").count(), 1, "{conf}");
        assert!(conf.contains("work_mem = '5MB'"), "{conf}");
        assert!(conf.contains("shared_buffers = '1GB'"), "{conf}");
        assert_eq!(signal_file(RecoveryType::Preserve), None);
    }

    #[test]
    fn earlier_recovery_settings_are_replaced_and_other_lines_kept() {
        let existing = "work_mem = '64MB'\nrestore_command = 'old'\n# pgstrata restore: recovery settings for backup OLD\nrecovery_target_name = 'old'\n";
        let conf = auto_conf(existing, LABEL, &options(RecoveryType::Name));
        assert_eq!(
            conf,
            "work_mem = '64MB'\n\
             # pgstrata restore: recovery settings for backup 20261123-101010F\n\
             restore_command = '/usr/bin/pgstrata --stanza=main archive-get %f \"%p\"'\n\
             recovery_target_name = 'it''s ''quoted'''\n\
             recovery_target_inclusive = false\n\
             recovery_target_action = 'promote'\n\
             archive_mode = 'off'\n"
        );
    }

    #[test]
    fn standby_gets_no_target_action_and_its_own_signal() {
        let s = recovery_settings(LABEL, &options(RecoveryType::Standby));
        assert!(!s.iter().any(|l| l.starts_with("recovery_target_action")));
        assert_eq!(signal_file(RecoveryType::Standby), Some("standby.signal"));
        assert_eq!(signal_file(RecoveryType::Default), Some("recovery.signal"));
        assert_eq!(signal_file(RecoveryType::None), None);
    }
}
