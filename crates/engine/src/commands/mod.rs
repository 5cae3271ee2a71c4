//! The commands, one module each (a command with parts of its own is a directory). A
//! command is an async function taking [`crate::Settings`] and its own options, returning
//! its report; the binary parses the command line, calls it and prints the report.
//!
//! A command uses the services at the crate root and never another command: what two
//! commands share is a service (the layering is checked by the test in `lib.rs`).

pub mod annotate;
pub mod archive;
pub mod backup;
pub mod check;
pub mod copy;
pub mod expire;
pub mod info;
pub mod key;
pub mod metrics;
pub mod repo_tools;
pub mod restore;
pub mod restore_test;
pub mod stanza_create;
pub mod stanza_delete;
pub mod stanza_upgrade;
pub mod verify;
pub mod wal_receive;
