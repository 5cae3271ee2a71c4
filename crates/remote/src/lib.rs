//! pgstrata across hosts.
//!
//! A deployment keeps its repository on a backup host. pgstrata opens no port for that:
//! it runs the system `ssh` client (so `~/.ssh/config`, agents, known_hosts and
//! `authorized_keys` restrictions apply) and starts `pgstrata agent` on the other side,
//! which speaks the framed protocol of [`protocol`] on its stdin and stdout
//! (`docs/remote-protocol.md` specifies it).
//!
//! - `agent repo` (`repo-remote`, on the backup host): the database host's commands use
//!   the repository there through [`RemoteStore`], an `object_store::ObjectStore` whose
//!   every operation is a request to the agent. `pgstrata_repo::Storage` stacks on it as
//!   on a local directory or S3, so every command works through it unchanged.
//! - `agent run` (`pg-remote`, `standby-remote`, on the host with the data): the backup
//!   host sends a command and serves its repository ([`agent::serve`]); the agent runs the
//!   command there with [`RemoteStore::origin`] as its repository.
//! - [`agent`]: the serving side, on the same local-directory store a local repository
//!   uses (writes fsynced before they are acknowledged, create-only writes refused when
//!   the object exists), many requests at a time.
//!
//! Why an object-store interface and not a file protocol: the repository is already
//! written through one (write-once objects, ranged reads), so a remote repository is one
//! more backend, not a second code path; and every request carries an id, so many are in
//! flight on the one SSH connection (a restore's ranged reads do not wait a round trip
//! each).

pub mod agent;
pub mod client;
pub mod error;
pub mod protocol;

pub use client::{RemoteStore, SshSession, SshTarget};
pub use error::{Error, ErrorKind, Result};
