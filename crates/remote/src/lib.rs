//! pgstrata across hosts.
//!
//! A deployment keeps its repository on a backup host and pushes WAL and backups to it from
//! the database host (`repo-remote = "user@backup-host"`). pgstrata does not open a port
//! for that: it runs the system `ssh` client (so `~/.ssh/config`, agents, known_hosts and
//! `authorized_keys` restrictions apply) and starts `pgstrata agent repo` on the other
//! side, which speaks the framed protocol of [`protocol`] on its stdin and stdout.
//!
//! - [`protocol`]: frames, the version handshake, requests and answers (specified in
//!   `docs/remote-protocol.md`).
//! - [`client`]: [`RemoteStore`], an `object_store::ObjectStore` whose every operation is
//!   a request to the agent. `pgstrata_repo::Storage` stacks on it exactly as on a local
//!   directory or S3, so every command works through it unchanged, with the same
//!   create-only writes, retries and timeouts.
//! - [`agent`]: the agent's side: each request is served by the same local-directory store
//!   a local repository uses (writes fsynced before they are acknowledged, create-only
//!   writes refused when the object exists), many at a time.
//!
//! Why an object-store interface and not a file protocol: the repository is already
//! written through one (write-once objects, ranged reads), so a remote repository is one
//! more backend, not a second code path; and every request carries an id, so many are in
//! flight on the one SSH connection (a restore's ranged reads do not wait a round trip
//! each).

pub mod agent;
pub mod client;
pub mod protocol;

pub use client::{RemoteStore, SshSession, SshTarget};
