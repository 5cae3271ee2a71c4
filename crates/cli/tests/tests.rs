//! pgstrata's integration tests, in one binary (one link, one copy of the fixtures): each
//! module drives the real `pgstrata` binary against real PostgreSQL clusters and real
//! storage servers, in temporary directories.

mod common;

mod agent_peer;
mod archive;
mod archive_async;
mod backup;
mod bad_input;
mod copy;
mod encryption;
mod immutable;
mod incremental;
mod instant;
mod manifest;
mod monitoring;
mod multi_repo;
mod object_store;
mod options;
mod remote;
mod restore_safety;
mod restore_test;
mod roundtrip;
mod standby;
mod upgrade;
mod verify;
mod wal_decoder;
mod wal_receive;
mod wal_tracking;
