//! pgstrata's commands over the services they share, on top of the `pg` and `repo` crates.
//!
//! [`commands`] holds one module per command (`backup`, `restore`, `check`, `info`, ...): an
//! async function taking [`Settings`] (the resolved configuration) and its own options,
//! returning its report. What more than one command needs is a service, a module at the
//! crate root named for what it is: the WAL archive in the repository ([`wal_archive`]),
//! garbage collection ([`garbage`]), opening an encrypted stanza ([`encryption`]), the
//! local cluster and its connection ([`local_cluster`], [`db`]), restoring a data
//! directory ([`data_restore`]), the stanza lock, walking a data directory, reading and
//! checking stored content, worker pools, progress, and the settings. A command uses
//! services and never another command; services never use commands and form layers
//! without cycles (the test `layers` below checks both on every `crate::` path).
//!
//! CPU and file work runs on plain worker threads (`--process-max` of them), which reach
//! the async storage layer through the runtime handle: reading, hashing, checksumming and
//! compressing a file is blocking work, and threads keep it simple.

/// Add counters field by field: `add_fields!(total += part; a, b)` is `total.a += part.a;
/// total.b += part.b;` (workers' tallies summed into a command's report).
macro_rules! add_fields {
    ($total:ident += $part:ident; $($field:ident),+ $(,)?) => {
        $( $total.$field += $part.$field; )+
    };
}
pub(crate) use add_fields;

pub mod commands;

mod content;
mod data_restore;
mod db;
pub mod encryption;
mod error;
mod garbage;
pub mod instant;
mod local_cluster;
mod lock;
mod owner;
pub mod pg_tls;
mod pool;
pub mod progress;
mod replication;
mod reports;
mod settings;
pub mod track;
mod vanished;
mod wal_archive;
mod walk;

pub use error::{Error, ErrorKind, Result};
pub use settings::{Settings, StandbySource};

/// Open the repository and load the stanza record, with its master key when it is
/// encrypted ([`encryption`]); the first step of most commands.
pub(crate) use encryption::open_stanza;

/// The layering of the crate, checked on every `crate::` path (and `super::` path between
/// commands) in its source: a command never uses another command, a service never uses a
/// command, and a service uses only services of lower layers, so the services have no
/// import cycle.
#[cfg(test)]
mod layers {
    use std::path::{Path, PathBuf};

    /// The services, lowest first. A new module at the crate root goes into one of them.
    const LAYERS: &[&[&str]] = &[
        &["error"],
        &["owner", "pg_tls", "progress", "pool", "lock", "content"],
        &["settings", "walk"],
        &["db", "encryption"],
        &["replication"],
        &["local_cluster", "wal_archive", "garbage", "instant"],
        &["track", "data_restore", "vanished"],
        &["reports"],
    ];

    /// What the crate root re-exports, and the service each comes from (`add_fields` is the
    /// root's own macro, usable by all).
    const ROOT_ITEMS: &[(&str, &str)] = &[
        ("Error", "error"),
        ("ErrorKind", "error"),
        ("Result", "error"),
        ("Settings", "settings"),
        ("StandbySource", "settings"),
        ("open_stanza", "encryption"),
        ("add_fields", "error"),
    ];

    /// Where a source file sits: a service, or a command (under `commands/`).
    #[derive(Debug, Clone, PartialEq)]
    enum Module {
        Service(String),
        Command(String),
    }

    fn layer(service: &str) -> usize {
        LAYERS
            .iter()
            .position(|l| l.contains(&service))
            .unwrap_or_else(|| panic!("service {service} is in no layer of LAYERS"))
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The module `path` (relative to `src/`) belongs to; None for the crate root and
    /// `commands/mod.rs`, which only declare modules.
    fn module_of(rel: &Path) -> Option<Module> {
        let parts: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        match parts.as_slice() {
            [root] if root == "lib" => None,
            [c, m] if c == "commands" && m == "mod" => None,
            [c, command, ..] if c == "commands" => Some(Module::Command(command.clone())),
            [service, ..] => Some(Module::Service(service.clone())),
            [] => None,
        }
    }

    fn ident(text: &str) -> String {
        text.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    }

    /// The first segments of the paths that start at `text` (just after `prefix::`):
    /// `name` or each top-level name of a `{a, b::c}` group.
    fn names_at(text: &str) -> Vec<String> {
        let Some(group) = text.strip_prefix('{') else {
            return vec![ident(text)];
        };
        let (mut depth, mut names, mut start) = (0, vec![], true);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => start = true,
                c if start && !c.is_whitespace() => {
                    names.push(ident(&group[i..]));
                    start = false;
                }
                _ => {}
            }
        }
        names
    }

    /// Every `crate::` path in `text`, as the module it names: commands as
    /// `Module::Command`, services (and root re-exports, as their service) as
    /// `Module::Service`.
    fn uses(text: &str) -> Vec<Module> {
        let mut found = vec![];
        for (at, _) in text.match_indices("crate::") {
            for name in names_at(&text[at + 7..]) {
                if name == "commands" {
                    let after = &text[at + 7 + "commands::".len()..];
                    found.extend(names_at(after).into_iter().map(Module::Command));
                } else {
                    let service = ROOT_ITEMS
                        .iter()
                        .find(|(item, _)| *item == name)
                        .map_or(name.as_str(), |(_, s)| s);
                    found.push(Module::Service(service.to_string()));
                }
            }
        }
        found
    }

    /// The commands a command's file names through `super::` (from `commands/<c>.rs`) or
    /// `super::super::` (from a file of `commands/<c>/`), other than itself.
    fn sibling_commands(rel: &Path, text: &str, commands: &[String]) -> Vec<String> {
        let prefix = if rel.components().count() == 2 {
            "super::"
        } else {
            "super::super::"
        };
        let mut found = vec![];
        for (at, _) in text.match_indices(prefix) {
            if prefix == "super::" && text[..at].ends_with("super::") {
                continue;
            }
            for name in names_at(&text[at + prefix.len()..]) {
                if commands.contains(&name) {
                    found.push(name);
                }
            }
        }
        found
    }

    /// The wrong imports in `files` (path relative to `src/`, text).
    fn wrong_imports(files: &[(PathBuf, String)]) -> Vec<String> {
        let commands: Vec<String> = files
            .iter()
            .filter_map(|(rel, _)| match module_of(rel) {
                Some(Module::Command(c)) => Some(c),
                _ => None,
            })
            .collect();
        let mut wrong = vec![];
        for (rel, text) in files {
            let Some(module) = module_of(rel) else {
                continue;
            };
            let at = rel.display();
            for used in uses(text) {
                match (&module, &used) {
                    (Module::Command(c), Module::Command(d)) if c != d => {
                        wrong.push(format!("command {at} uses command crate::commands::{d}"))
                    }
                    (Module::Service(_), Module::Command(d)) => {
                        wrong.push(format!("service {at} uses command crate::commands::{d}"))
                    }
                    (Module::Service(s), Module::Service(t)) if s != t && layer(t) >= layer(s) => {
                        wrong.push(format!(
                            "service {at} uses crate::{t}, not of a lower layer"
                        ))
                    }
                    (_, Module::Service(t)) => {
                        layer(t);
                    }
                    _ => {}
                }
            }
            if let Module::Command(c) = &module {
                for d in sibling_commands(rel, text, &commands) {
                    if d != *c {
                        wrong.push(format!("command {at} uses command {d} through super::"));
                    }
                }
            }
        }
        wrong
    }

    fn sources() -> Vec<(PathBuf, String)> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut paths = vec![];
        rust_files(&src, &mut paths);
        paths
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap();
                (p.strip_prefix(&src).unwrap().to_path_buf(), text)
            })
            .collect()
    }

    #[test]
    fn commands_use_services_and_services_use_lower_layers() {
        let files = sources();
        for (rel, _) in &files {
            if let Some(Module::Service(s)) = module_of(rel) {
                layer(&s);
            }
        }
        let wrong = wrong_imports(&files);
        assert!(wrong.is_empty(), "imports against the layers: {wrong:#?}");
    }

    /// The check finds each kind of wrong import (and passes the right ones).
    #[test]
    fn wrong_imports_are_found() {
        let file = |rel: &str, text: &str| (PathBuf::from(rel), text.to_string());
        let right = [
            file(
                "commands/check.rs",
                "use crate::{open_stanza, Error};\nuse crate::wal_archive::x;",
            ),
            file(
                "commands/backup/copy.rs",
                "use super::copy_context::X; use crate::commands::backup::Y;",
            ),
            file(
                "wal_archive.rs",
                "use crate::{encryption::open_stanza, Result};",
            ),
            file("commands/info.rs", "mod tests { use super::*; }"),
        ];
        assert_eq!(wrong_imports(&right), Vec::<String>::new());
        for wrong in [
            file(
                "commands/check.rs",
                "use crate::commands::backup::wait_for_wal;",
            ),
            file("commands/check.rs", "use crate::commands::{info, check};"),
            file("commands/check.rs", "use super::info::x;"),
            file("commands/backup/copy.rs", "use super::super::restore::x;"),
            file("lock.rs", "/// See [`crate::commands::expire`]."),
            file("lock.rs", "use crate::{Result, wal_archive::x};"),
            file("error.rs", "use crate::Settings;"),
        ] {
            let mut files = right.to_vec();
            files.push(wrong.clone());
            files.push(file("commands/info.rs", ""));
            files.push(file("commands/restore.rs", ""));
            assert_eq!(wrong_imports(&files).len(), 1, "{wrong:?}");
        }
    }
}
