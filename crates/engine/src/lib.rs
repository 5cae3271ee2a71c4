//! pgstrata's commands, one module each, on top of the `pg` and `repo` crates.
//!
//! Commands are async functions taking [`Settings`] (the resolved configuration) and their
//! own options. CPU and file work runs on plain worker threads (`--process-max` of them),
//! which reach the async storage layer through the runtime handle: reading, hashing,
//! checksumming and compressing a file is blocking work, and threads keep it simple.

/// Add counters field by field: `add_fields!(total += part; a, b)` is `total.a += part.a;
/// total.b += part.b;` (workers' tallies summed into a command's report).
macro_rules! add_fields {
    ($total:ident += $part:ident; $($field:ident),+ $(,)?) => {
        $( $total.$field += $part.$field; )+
    };
}
pub(crate) use add_fields;

pub mod archive;
pub mod archive_async;
pub mod backup;
pub mod check;
mod content;
mod db;
mod error;
pub mod expire;
pub mod info;
pub mod keys;
mod lock;
pub mod metrics;
mod owner;
pub mod pg_tls;
mod pool;
pub mod progress;
pub mod restore;
pub mod restore_test;
mod settings;
pub mod stanza;
pub mod track;
pub mod verify;
mod walk;

pub use error::{Error, ErrorKind, Result};
pub use settings::{Settings, StandbySource};

/// Open the repository and load the stanza record, with its master key when it is
/// encrypted (`keys`); the first step of most commands.
pub(crate) use keys::open_stanza;
