//! The option table: every option pgstrata accepts, declared once. Parsing, validation,
//! `pgstrata help` and docs/options.md all come from [`OPTIONS`].
//!
//! An option's value comes from, in order of precedence: `--name=value` on the command line,
//! the environment variable `PGSTRATA_NAME` (upper case, '-' as '_'), the stanza's table of
//! the config file, the config file's `[global]` table, and finally the default.

use crate::logging::LogLevel;
use pgstrata_engine::commands::expire::RetentionType;
use pgstrata_engine::commands::restore::{RecoveryType, TargetAction};
use pgstrata_engine::pg_tls::SslMode;
use pgstrata_engine::progress::ProgressMode;
use pgstrata_engine::track::Track;
use pgstrata_repo::cipher::CipherType;
use pgstrata_repo::codec::CompressType;
use pgstrata_repo::manifest::BackupType;
use pgstrata_repo::s3_versions::LockMode;
use pgstrata_repo::storage::RepoKind;
use pgstrata_repo::Named;

pgstrata_repo::named! {
    /// `--output` of info and verify.
    pub(crate) enum Output {
        Text = "text",
        Json = "json",
        /// Prometheus' text format, for node_exporter's textfile collector.
        Prometheus = "prometheus",
    }
}

pgstrata_repo::named! {
    /// `--output` of key-list and restore-test.
    pub(crate) enum ReportOutput {
        Text = "text",
        Json = "json",
    }
}

impl From<ReportOutput> for Output {
    fn from(o: ReportOutput) -> Output {
        match o {
            ReportOutput::Text => Output::Text,
            ReportOutput::Json => Output::Json,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A compression level: an integer in the range of the codec chosen by compress-type.
    CompressLevel,
    Str,
    Path,
    Int {
        min: i64,
        max: i64,
    },
    Bool,
    /// A byte size: a number with an optional unit (KiB, MiB, GiB; KB, MB, GB; k, m, g).
    Size {
        min: u64,
        max: u64,
    },
    Enum(&'static [&'static str]),
    /// May be given several times; values accumulate.
    List,
    /// A length of time in seconds: a number with a unit (s, m, h, d; e.g. 14d).
    Duration {
        min: u64,
        max: u64,
    },
}

/// Where an option may be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Command line, environment, `[global]` or a stanza table.
    Config,
    /// Command line and environment only (per-invocation choices).
    CommandLine,
}

pub(crate) struct OptionDef {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) default: Option<&'static str>,
    pub(crate) scope: Scope,
    /// Commands that accept it; empty means all.
    /// A credential: refused on the command line (other users see it in `ps`, and it would
    /// end up in archive_command or restore_command); taken from the config file or the
    /// environment, never written into restore_command, never shown.
    pub(crate) secret: bool,
    /// A per-job choice the backup host makes for the job it asks of `pgstrata agent run`
    /// (pg-remote): the agent takes this option, and no other, from the peer, validated
    /// here as any value is. The database host's own settings (pg-*, standby-*, paths,
    /// credentials) are never a peer's choice.
    pub(crate) peer: bool,
    pub(crate) commands: &'static [&'static str],
    pub(crate) help: &'static str,
}

pub(crate) const COMMANDS: &[(&str, &str)] = &[
    ("stanza-create", "Record the cluster in the repository (once, before archiving and backups)"),
    ("stanza-upgrade", "After pg_upgrade: make the stanza the new cluster's (read from pg_control at pg-path, cluster stopped or running) in every configured repository; the old cluster's backups and WAL stay and restore, and the next backup is full"),
    ("stanza-delete", "Remove the stanza and every backup and WAL file of it from the repository (--force; refused while the cluster runs at pg-path, and on an immutable repository)"),
    ("check", "Check configuration, connection and WAL archiving end to end"),
    ("backup", "Back up the running cluster"),
    ("restore", "Restore a backup into a data directory and write recovery settings"),
    ("restore-test", "Prove a backup restores and its data is sound: restore it (default the newest) into a scratch directory, start it on a free port with archiving off, recover to consistency, run pg_amcheck on every database and pg_checksums, stop and remove it; exit 0 clean, 4 corruption found, 3 could not run"),
    ("instant-status", "Show how far an instant restore (restore --instant) has brought the data directory at --pg-path: bytes and files local, fetch rate, time left, on-demand fetches and their latency; --wait returns when every block is local (exit 0) or hydration failed (4 damage, 3 otherwise)"),
    ("restore-table", "Get tables back as they were at a time without restoring the database: an instant restore of one database (--db) into a scratch directory that fetches only its catalogs, the tables (--table=SCHEMA.TABLE, repeatable; their TOAST and indexes) and the blocks WAL replay touches, recovery to the target (--type, --target, --set), pg_dump of the tables into --output=FILE.sql, teardown; run as the cluster's OS user"),
    ("archive-push", "Store one WAL file: archive_command = 'pgstrata --stanza=NAME archive-push %p'"),
    ("archive-get", "Fetch one WAL file: restore_command = 'pgstrata --stanza=NAME archive-get %f \"%p\"'"),
    ("expire", "Apply retention (repo-retention-*) or expire one backup (--set), and free storage no kept backup uses"),
    ("info", "Show the stanza's backups and WAL archive"),
    ("key-add", "Add a passphrase to an encrypted stanza: a new key file wrapping its master key (the new passphrase from PGSTRATA_NEW_CIPHER_PASS or --new-cipher-pass-file); no backup data is rewritten"),
    ("key-list", "List an encrypted stanza's keys (id, created, host, user); needs no passphrase"),
    ("key-remove", "Remove one key (--key-id) of an encrypted stanza and start a new master key for everything written afterwards, so the removed passphrase opens nothing newer; the last key is never removed"),
    ("copy", "Copy backups and their WAL from one repository of the stanza to another (--from-repo=N --repo=M): every backup the target lacks (or --set), each object checked on the way, the manifest written last; frames are sealed again when the two repositories do not share master keys (or one is plain); each repository keeps its own retention"),
    ("repo-ls", "List the stanza's objects in the repository (repo-ls [PATH] [--recurse]; PATH a repository key such as main/backup, default the stanza): size, time, name"),
    ("repo-get", "Write one object of the stanza to standard output, opened and checked (repo-get PATH): a WAL object as the segment, a manifest as JSON, any other sealed object decrypted; key files and packs as stored"),
    ("annotate", "Pin a backup so retention never expires it (--set=LABEL --pin), unpin it (--unpin), or change its annotations (--annotation=KEY=VALUE; KEY= removes one)"),
    ("wal-receive", "Stream WAL into every repository of the stanza as the server writes it, through a physical replication slot (wal-receive-slot): the segment being written as a partial object, replaced every wal-receive-flush-interval, each full segment as archive-push stores it; with wal-receive-synchronous, a commit can wait for its WAL to be in the repository (synchronous_standby_names); runs until stopped"),
    ("verify", "Read back every backup (or --set) and the WAL archive and check them against their recorded hashes, without restoring"),
    ("agent", "Serve another host's pgstrata over SSH, as the forced command of its key; started by pgstrata itself, not by hand: 'agent repo --stanza=NAME' serves those stanzas of repo-path to a database host's repo-remote, append-only; 'agent run [--config=FILE] [--stanza=NAME]' does a backup host's stanza-create, check or backup job here (pg-remote) with this host's own settings"),
    ("demo", "Run the whole story on a throwaway cluster and a local repository"),
    ("help", "Show commands, or a command's options ('help COMMAND'; 'help options' prints the reference, 'help man' the man page)"),
    ("completions", "Print a shell completion script: 'completions bash' or 'completions zsh'"),
    ("version", "Print the version"),
];

/// The commands that work on one stanza (`agent` takes a list: see its own definition).
const STANZA_CMDS: [&str; 21] = [
    "stanza-create",
    "stanza-upgrade",
    "check",
    "backup",
    "restore",
    "restore-test",
    "restore-table",
    "archive-push",
    "archive-get",
    "info",
    "expire",
    "verify",
    "key-add",
    "key-list",
    "key-remove",
    "copy",
    "repo-ls",
    "repo-get",
    "stanza-delete",
    "annotate",
    "wal-receive",
];
/// The commands that reach a repository: the stanza commands and `agent`.
const REPO_CMDS: &[&str] = &concat::<_, _, { STANZA_CMDS.len() + 1 }>(["agent"], STANZA_CMDS);

/// `a` then `b`, in a constant (`N` is their lengths' sum).
const fn concat<const A: usize, const B: usize, const N: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; N] {
    assert!(A + B == N, "concat: N must be the sum of the lengths");
    let mut out = [""; N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - A];
        i += 1;
    }
    out
}
const RETENTION_CMDS: &[&str] = &["backup", "expire"];
const PG_CMDS: &[&str] = &["stanza-create", "check", "backup"];
/// The commands that connect to PostgreSQL on this host's own settings.
const PG_CONNECT_CMDS: &[&str] = &["stanza-create", "check", "backup", "wal-receive"];
const COMPRESS_CMDS: &[&str] = &["backup", "archive-push", "wal-receive"];

pub(crate) const OPTIONS: &[OptionDef] = &[
    OptionDef { name: "config", kind: Kind::Path, default: Some("/etc/pgstrata/pgstrata.toml"), scope: Scope::CommandLine, secret: false, peer: false, commands: &[],
        help: "Configuration file (TOML: a [global] table and one table per stanza). A missing default file is ignored; a missing file given explicitly is an error." },
    OptionDef { name: "stanza", kind: Kind::Str, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &STANZA_CMDS,
        help: "Stanza name: the cluster being backed up. Letters, digits, '-' and '_'." },
    OptionDef { name: "stanza", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["agent"],
        help: "The stanzas an agent works for, written in the forced command of authorized_keys. 'agent repo' (required, repeatable) serves only these stanzas, append-only. 'agent run' (optional) does jobs for this stanza only; without it, for any stanza whose settings are in its configuration file." },
    OptionDef { name: "agent-buffer-max", kind: Kind::Size { min: 1 << 20, max: 1 << 40 }, default: Some("256MiB"), scope: Scope::Config, secret: false, peer: false, commands: &["agent", "stanza-create", "check", "backup"],
        help: "Most bytes a host serving a repository to its peer ('agent repo', or the backup host serving 'agent run' with pg-remote) holds at once for it: requests read and answers not yet sent. A peer that sends faster than it reads waits; it cannot grow the holder's memory past this (plus the largest single object, when one is larger)." },
    OptionDef { name: "repo", kind: Kind::Int { min: 1, max: 4 }, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["stanza-create", "stanza-upgrade", "check", "backup", "restore", "restore-test", "archive-get", "info", "expire", "verify", "key-add", "key-list", "key-remove", "copy", "repo-ls", "repo-get", "stanza-delete", "annotate", "restore-table"],
        help: "The repository to use, 1 to 4 (repository N's options are repoN-path, repoN-type, ...; the unnumbered repo-* options are repository 1's, also written repo1-*). Default: backup, restore, restore-test, expire and the key commands use repository 1; stanza-create, stanza-upgrade, check, info and verify every configured repository; archive-get tries this one first, then the others; copy: the repository to copy to (required). archive-push always writes every repository." },
    OptionDef { name: "from-repo", kind: Kind::Int { min: 1, max: 4 }, default: Some("1"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["copy"],
        help: "The repository copy reads from, 1 to 4 (--repo names the one it writes to)." },
    OptionDef { name: "repo-path", kind: Kind::Path, default: Some("/var/lib/pgstrata"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Repository directory (posix), or the prefix inside the bucket (object stores)." },
    OptionDef { name: "repo-type", kind: Kind::Enum(RepoKind::NAMES), default: Some("posix"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Where the repository is: a local directory (posix), or an S3, GCS or Azure object store. With an object store, repo-path is a prefix inside the bucket." },
    OptionDef { name: "repo-s3-bucket", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "S3 bucket." },
    OptionDef { name: "repo-s3-endpoint", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "S3 endpoint URL (default: AWS for the region; http:// is allowed for local servers). Also AWS_ENDPOINT." },
    OptionDef { name: "repo-s3-region", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "S3 region (also AWS_REGION / AWS_DEFAULT_REGION)." },
    OptionDef { name: "repo-s3-key", kind: Kind::Str, default: None, scope: Scope::Config, secret: true, peer: false, commands: REPO_CMDS,
        help: "S3 access key id. Without it: AWS_ACCESS_KEY_ID, web identity (AWS_WEB_IDENTITY_TOKEN_FILE), then instance metadata." },
    OptionDef { name: "repo-s3-key-secret", kind: Kind::Str, default: None, scope: Scope::Config, secret: true, peer: false, commands: REPO_CMDS,
        help: "S3 secret access key (also AWS_SECRET_ACCESS_KEY)." },
    OptionDef { name: "repo-s3-token", kind: Kind::Str, default: None, scope: Scope::Config, secret: true, peer: false, commands: REPO_CMDS,
        help: "S3 session token (also AWS_SESSION_TOKEN)." },
    OptionDef { name: "repo-s3-uri-style", kind: Kind::Enum(&["host", "path"]), default: Some("host"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "host: bucket.endpoint/key; path: endpoint/bucket/key (most local S3 servers)." },
    OptionDef { name: "repo-s3-storage-class", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Storage class of objects written (e.g. STANDARD_IA)." },
    OptionDef { name: "repo-s3-kms-key-id", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Server-side encryption of objects written with this KMS key (aws:kms)." },
    OptionDef { name: "repo-s3-object-lock", kind: Kind::Enum(LockMode::NAMES), default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Make the repository immutable with S3 Object Lock: compliance (no one can delete an object before its retention has passed) or governance (only a user with s3:BypassGovernanceRetention can). The bucket must have Object Lock on, with a default retention in this mode of at least repo-immutable-days (stanza-create and check refuse it otherwise, saying how to set it). expire removes an expired backup from view at once and deletes its objects at the first expire after their retention; verify --repair is refused." },
    OptionDef { name: "repo-immutable-days", kind: Kind::Int { min: 1, max: 36_500 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Days every object of an immutable repository is kept from deletion (required with repo-s3-object-lock; the bucket's default retention must be at least this long). An attacker holding the repository's credentials can hide objects (a delete marker) but not remove them for this long: repo-target-time reads them back." },
    OptionDef { name: "repo-target-time", kind: Kind::Str, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["info", "restore", "verify", "archive-get", "copy", "repo-ls", "repo-get"],
        help: "Read the repository as it was at this time ('2026-11-28 10:00:00+00' or RFC 3339): each object in its version current then; objects deleted since come back, objects written since are not seen. Needs a versioned S3 bucket (every bucket with Object Lock is one). Nothing is written to the repository; restore writes it into restore_command too, so recovery fetches the WAL as of the same time." },
    OptionDef { name: "repo-s3-ca-file", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "PEM file of CA certificates to trust for the object store (GCS and Azure too)." },
    OptionDef { name: "repo-gcs-bucket", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "GCS bucket." },
    OptionDef { name: "repo-gcs-key", kind: Kind::Path, default: None, scope: Scope::Config, secret: true, peer: false, commands: REPO_CMDS,
        help: "GCS service account JSON file (default: GOOGLE_APPLICATION_CREDENTIALS / application default credentials)." },
    OptionDef { name: "repo-gcs-endpoint", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "GCS endpoint URL (for emulators)." },
    OptionDef { name: "repo-azure-account", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Azure storage account." },
    OptionDef { name: "repo-azure-container", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Azure blob container." },
    OptionDef { name: "repo-azure-key", kind: Kind::Str, default: None, scope: Scope::Config, secret: true, peer: false, commands: REPO_CMDS,
        help: "Azure shared key (also AZURE_STORAGE_ACCESS_KEY)." },
    OptionDef { name: "repo-azure-endpoint", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Azure endpoint URL (for emulators)." },
    OptionDef { name: "repo-cipher-type", kind: Kind::Enum(CipherType::NAMES), default: Some("none"), scope: Scope::Config, secret: false, peer: true, commands: &["stanza-create"],
        help: "Encrypt the new stanza: aes-256-gcm seals every object (authenticated, object names bound) under a random master key wrapped by repo-cipher-pass. Chosen at stanza-create; later commands learn it from the stanza." },
    OptionDef { name: "repo-cipher-pass", kind: Kind::Str, default: None, scope: Scope::Config, secret: true, peer: false, commands: REPO_CMDS,
        help: "Passphrase of an encrypted stanza (needed by every command of it). Losing every passphrase of a stanza loses its backups." },
    OptionDef { name: "repo-cipher-key-cache", kind: Kind::Bool, default: Some("true"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Keep an encrypted stanza's master key, wrapped by a key derived from the passphrase, in /dev/shm/pgstrata-<uid> (memory, 0700, this user only), so the slow passphrase derivation (Argon2id, 64 MiB) runs once per host and boot rather than once per command (archive-push runs once per WAL segment). Someone who can read it can read the passphrase in the config file too; set false to derive it every time." },
    OptionDef { name: "new-cipher-pass", kind: Kind::Str, default: None, scope: Scope::Config, secret: true, peer: false, commands: &["key-add"],
        help: "The passphrase key-add adds (PGSTRATA_NEW_CIPHER_PASS; or --new-cipher-pass-file)." },
    OptionDef { name: "new-cipher-pass-file", kind: Kind::Path, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["key-add"],
        help: "A file holding the passphrase key-add adds (its first line)." },
    OptionDef { name: "key-id", kind: Kind::Str, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["key-remove"],
        help: "The key key-remove removes (as key-list shows it)." },
    OptionDef { name: "repo-remote", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "The backup host holding this posix repository, as ssh takes it ([user@]host): repo-path is then a directory there, reached through 'pgstrata agent repo' started over SSH (the system ssh client, so ~/.ssh/config, agents and known_hosts apply; no password prompt). Writes there are fsynced before they are acknowledged, as locally." },
    OptionDef { name: "repo-remote-port", kind: Kind::Int { min: 1, max: 65535 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "SSH port of repo-remote (default: ssh's, from ~/.ssh/config or 22)." },
    OptionDef { name: "repo-remote-cmd", kind: Kind::Path, default: Some("pgstrata"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "pgstrata's path on repo-remote (the same version as here)." },
    OptionDef { name: "cmd-ssh", kind: Kind::Path, default: Some("ssh"), scope: Scope::Config, secret: false, peer: false, commands: &[],
        help: "The ssh client that reaches repo-remote and pg-remote." },
    OptionDef { name: "repo-storage-verify-tls", kind: Kind::Bool, default: Some("true"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Verify the object store's TLS certificate." },
    OptionDef { name: "repo-storage-timeout", kind: Kind::Int { min: 1, max: 3600 }, default: Some("120"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Seconds one storage operation may take before it is retried." },
    OptionDef { name: "repo-rate-limit", kind: Kind::Size { min: 64 << 10, max: 1 << 50 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Bytes per second to and from this repository (e.g. \"50MiB\"), summed over all workers of a command (on a backup host, a pg-remote agent's bytes too): a token bucket they share, which lends at most 100 ms of credit after a pause. Progress shows the rate and the limit; info shows each backup's read and stored rates. Default: no limit." },
    OptionDef { name: "repo-storage-retries", kind: Kind::Int { min: 0, max: 100 }, default: Some("4"), scope: Scope::Config, secret: false, peer: false, commands: REPO_CMDS,
        help: "Retries of a storage operation that failed in a way that may be transient (5xx, timeouts, dropped connections)." },
    OptionDef { name: "pg-path", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["stanza-create", "stanza-upgrade", "check", "backup", "restore", "info", "stanza-delete", "archive-get"],
        help: "Data directory of the cluster (for restore: where to restore; for info: whose WAL waiting to be archived to show, when readable)." },
    OptionDef { name: "backup-standby", kind: Kind::Bool, default: Some("false"), scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "Read relation files from a streaming standby of the primary (standby-path, standby-host, standby-port) so the primary does not pay the I/O: pg_backup_start and pg_backup_stop run on the primary, pgstrata waits until the standby has replayed past the start (at most archive-timeout), then reads every relation file from the standby and only the other files (configuration, pg_control) from the primary. The standby must stream from this primary, on its timeline." },
    OptionDef { name: "standby-path", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "Data directory of the standby backup-standby reads (on the host the backup runs on: this one, pg-remote, or standby-remote)." },
    OptionDef { name: "standby-host", kind: Kind::Str, default: Some("/var/run/postgresql"), scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "Socket directory or host name of the standby (the connection uses pg-user, pg-database and the TLS settings of pg-*)." },
    OptionDef { name: "standby-port", kind: Kind::Int { min: 1, max: 65535 }, default: Some("5432"), scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "Port of the standby." },
    OptionDef { name: "standby-remote", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "With backup-standby, the standby's host as ssh takes it ([user@]host), when it is not this host: the backup then runs there as 'pgstrata agent run' (standby-path, standby-host and standby-port as seen there), reads, hashes and compresses every relation file there, and reads the primary's few other files (configuration, pg_control, SLRUs) through its database connection: pg-host and pg-port must reach the primary from the standby's host, and pg-user must be a superuser (or be granted pg_ls_dir, pg_stat_file and pg_read_binary_file)." },
    OptionDef { name: "standby-remote-port", kind: Kind::Int { min: 1, max: 65535 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "SSH port of standby-remote." },
    OptionDef { name: "standby-remote-cmd", kind: Kind::Path, default: Some("pgstrata"), scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "pgstrata's path on standby-remote." },
    OptionDef { name: "pg-remote", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: PG_CMDS,
        help: "The database host, as ssh takes it ([user@]host), when this is a backup host: stanza-create, check and backup run there as a job of 'pgstrata agent run' started over SSH, with the database host's own settings (pg-path, pg-host, pg-port, pg-user, standby, passphrase: from its configuration file) and this host's per-job choices (type, compression, process-max, ...); it reads, checksums, hashes and compresses the data directory with process-max workers, and sends only compressed frames and metadata over the link into this host's repository, which it may only add to." },
    OptionDef { name: "pg-remote-port", kind: Kind::Int { min: 1, max: 65535 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: PG_CMDS,
        help: "SSH port of pg-remote (default: ssh's, from ~/.ssh/config or 22)." },
    OptionDef { name: "pg-remote-cmd", kind: Kind::Path, default: Some("pgstrata"), scope: Scope::Config, secret: false, peer: false, commands: PG_CMDS,
        help: "pgstrata's path on pg-remote (the same version as here)." },
    OptionDef { name: "pg-remote-config", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: PG_CMDS,
        help: "The configuration file 'agent run' reads on pg-remote (default: its PGSTRATA_CONFIG, else /etc/pgstrata/pgstrata.toml), sent on its command line. A forced command in that host's authorized_keys replaces the command line, and with it this choice: the database host's own --config wins." },
    OptionDef { name: "standby-remote-config", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["backup"],
        help: "The configuration file 'agent run' reads on standby-remote, as pg-remote-config is for pg-remote." },
    OptionDef { name: "pg-host", kind: Kind::Str, default: Some("/var/run/postgresql"), scope: Scope::Config, secret: false, peer: false, commands: PG_CONNECT_CMDS,
        help: "Socket directory (starting with '/') or host name of the server, as libpq means it." },
    OptionDef { name: "pg-port", kind: Kind::Int { min: 1, max: 65535 }, default: Some("5432"), scope: Scope::Config, secret: false, peer: false, commands: PG_CONNECT_CMDS,
        help: "Server port." },
    OptionDef { name: "pg-user", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: PG_CONNECT_CMDS,
        help: "Database user (default: PGUSER, else the operating system user). A password comes from PGPASSWORD." },
    OptionDef { name: "pg-sslmode", kind: Kind::Enum(SslMode::NAMES), default: Some("prefer"), scope: Scope::Config, secret: false, peer: false, commands: PG_CONNECT_CMDS,
        help: "TLS on TCP connections, as libpq's sslmode: prefer and require encrypt without checking the server's certificate; verify-ca checks it chains to pg-sslrootcert; verify-full also checks it names pg-host. Unless it is disable, a password (PGPASSWORD) never crosses TCP in the clear: when the connection is not encrypted (prefer against a server without TLS), a server asking for a cleartext or MD5 password is refused; scram-sha-256 still works. disable: no TLS, and any password request is answered. Unix sockets never use TLS and have no such restriction." },
    OptionDef { name: "pg-sslrootcert", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: PG_CONNECT_CMDS,
        help: "PEM file of the CA certificates verify-ca and verify-full trust (default: ~/.postgresql/root.crt)." },
    OptionDef { name: "pg-database", kind: Kind::Str, default: Some("postgres"), scope: Scope::Config, secret: false, peer: false, commands: PG_CONNECT_CMDS,
        help: "Database to connect to." },
    OptionDef { name: "compress-type", kind: Kind::Enum(CompressType::NAMES), default: Some("zst"), scope: Scope::Config, secret: false, peer: true, commands: COMPRESS_CMDS,
        help: "Compression of backup data and archived WAL." },
    OptionDef { name: "compress-level", kind: Kind::CompressLevel, default: None, scope: Scope::Config, secret: false, peer: true, commands: COMPRESS_CMDS,
        help: "Compression level of compress-type (default: the codec's own)." },
    OptionDef { name: "pg-read-rate-limit", kind: Kind::Size { min: 64 << 10, max: 1 << 50 }, default: None, scope: Scope::Config, secret: false, peer: true, commands: &["backup"],
        help: "Bytes per second backup reads from the data directory (e.g. \"100MiB\"), summed over its workers, so a backup leaves the database's disks to the database. Default: no limit." },
    OptionDef { name: "process-max", kind: Kind::Int { min: 1, max: 256 }, default: Some("1"), scope: Scope::Config, secret: false, peer: true, commands: &["backup", "restore", "restore-test", "verify", "archive-push", "archive-get", "copy", "restore-table"],
        help: "Worker threads reading, checksumming, compressing and writing in parallel (archive-push with archive-async: WAL files pushed at once; archive-get: segments prefetched at once; copy: twice as many objects in flight)." },
    OptionDef { name: "start-fast", kind: Kind::Bool, default: Some("false"), scope: Scope::Config, secret: false, peer: true, commands: &["backup"],
        help: "Ask for an immediate checkpoint instead of waiting for the next one." },
    OptionDef { name: "archive-timeout", kind: Kind::Int { min: 1, max: 86400 }, default: Some("60"), scope: Scope::Config, secret: false, peer: true, commands: &["backup", "check", "archive-push"],
        help: "Seconds to wait for WAL to reach the archive (archive-push with archive-async: for the asynchronous worker to acknowledge the file)." },
    OptionDef { name: "archive-lag-max", kind: Kind::Int { min: 1, max: 604_800 }, default: Some("600"), scope: Scope::Config, secret: false, peer: true, commands: &["check"],
        help: "check fails when the oldest WAL file waiting in pg_wal to be archived has waited longer than this many seconds (archiving stuck or falling behind)." },
    OptionDef { name: "archive-async", kind: Kind::Bool, default: Some("false"), scope: Scope::Config, secret: false, peer: false, commands: &["archive-push"],
        help: "Push WAL asynchronously: a background worker started on demand pushes every file PostgreSQL has marked ready, process-max at a time, ahead of PostgreSQL's calls, and acknowledges each one durably in spool-path once every repository has it; archive-push returns when its file is acknowledged." },
    OptionDef { name: "spool-path", kind: Kind::Path, default: Some("/var/spool/pgstrata"), scope: Scope::Config, secret: false, peer: false, commands: &["archive-push", "archive-get", "restore"],
        help: "Directory on the database host for archive-async's acknowledgements (out/) and archive-get's prefetched segments (in/), one subdirectory per stanza. It must belong to the user running pgstrata and be writable by no one else (mode 0700): otherwise archive-push with archive-async fails, naming its owner and mode, and archive-get fetches without prefetching, with a warning (as it does, quietly, without write access there)." },
    OptionDef { name: "archive-push-queue-max", kind: Kind::Size { min: 16 << 20, max: 1 << 50 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["archive-push"],
        help: "With archive-async: when more WAL than this waits to be pushed, acknowledge it without pushing, with a warning, rather than let pg_wal fill the disk and stop the primary. The archive then has a gap (check, info and verify report it) and backups before it cannot be recovered past it. Off by default." },
    OptionDef { name: "archive-get-queue-max", kind: Kind::Size { min: 0, max: 1 << 40 }, default: Some("128MiB"), scope: Scope::Config, secret: false, peer: false, commands: &["archive-get", "restore"],
        help: "archive-get prefetch: when PostgreSQL asks for a segment, a background worker fetches up to this much of the following WAL into spool-path, process-max at a time, and later calls are served from there (verified before use). A timeline switch or a jump moves the queue. 0 turns prefetch off. restore carries a value given to it into the restore_command it writes." },
    OptionDef { name: "type", kind: Kind::Enum(BackupType::NAMES), default: Some("incr"), scope: Scope::CommandLine, secret: false, peer: true, commands: &["backup"],
        help: "Backup type: full; diff stores what changed since the newest full backup; incr what changed since the newest backup. Without a prior backup, diff and incr take a full one." },
    OptionDef { name: "delta", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: true, commands: &["backup"],
        help: "Read and hash every block of every file instead of trusting unchanged size and mtime (turned on by itself after a timeline switch or a clock going backwards)." },
    OptionDef { name: "track", kind: Kind::Enum(Track::NAMES), default: Some("auto"), scope: Scope::CommandLine, secret: false, peer: true, commands: &["backup"],
        help: "How an incremental finds changed blocks in changed files: wal reads only the blocks the block-change maps (written by archive-push) list, and fails (before the backup starts, when it can tell) if they have a gap; hash reads and hashes whole files; auto uses the maps when they cover the whole window and says why when they do not." },
    OptionDef { name: "annotation", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: true, commands: &["backup"],
        help: "A note on the backup, KEY=VALUE (repeatable): recorded in its manifest and shown by info (e.g. --annotation=ticket=OPS-42)." },
    OptionDef { name: "annotation", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["annotate"],
        help: "Set an annotation of the backup, KEY=VALUE (repeatable); KEY= removes it. Shown by info." },
    OptionDef { name: "pin", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["annotate"],
        help: "Pin the backup: retention never expires it (and keeps the WAL that makes it consistent), and expire --set refuses it until it is unpinned." },
    OptionDef { name: "unpin", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["annotate"],
        help: "Unpin the backup: retention treats it as any other again." },
    OptionDef { name: "resume", kind: Kind::Bool, default: Some("true"), scope: Scope::Config, secret: false, peer: true, commands: &["backup"],
        help: "Reuse the frames an interrupted backup stored: the next backup reads and hashes every block as usual, but points the blocks that still match at the interrupted backup's frames instead of compressing and storing them again. While a backup runs it writes small checkpoint objects (under <label>/resume/) that make this possible; false writes none and reuses nothing." },
    OptionDef { name: "bundle", kind: Kind::Bool, default: Some("true"), scope: Scope::Config, secret: false, peer: true, commands: &["backup"],
        help: "Bundle files smaller than bundle-limit into shared pack objects (false: every file gets pack objects of its own)." },
    OptionDef { name: "bundle-size", kind: Kind::Size { min: 1 << 20, max: 1 << 30 }, default: Some("16MiB"), scope: Scope::Config, secret: false, peer: true, commands: &["backup"],
        help: "Size a pack object grows to before it is written." },
    OptionDef { name: "bundle-limit", kind: Kind::Size { min: 0, max: 1 << 30 }, default: Some("2MiB"), scope: Scope::Config, secret: false, peer: true, commands: &["backup"],
        help: "Files at least this large get pack objects of their own, so expire can free them whole when they change." },
    OptionDef { name: "repo-retention-full", kind: Kind::Int { min: 1, max: 9_999_999 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: RETENTION_CMDS,
        help: "Full backups to keep (a count, or days with repo-retention-full-type=time). Backups older than the oldest kept full are expired. When set, backup runs expire after it succeeds." },
    OptionDef { name: "repo-retention-full-type", kind: Kind::Enum(RetentionType::NAMES), default: Some("count"), scope: Scope::Config, secret: false, peer: false, commands: RETENTION_CMDS,
        help: "How repo-retention-full counts: backups, or days (keeping the newest full older than the window too)." },
    OptionDef { name: "repo-retention-diff", kind: Kind::Int { min: 1, max: 9_999_999 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: RETENTION_CMDS,
        help: "Differential backups to keep." },
    OptionDef { name: "repo-retention-window", kind: Kind::Duration { min: 60, max: 100 * 365 * 86400 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: RETENTION_CMDS,
        help: "Keep what restores to any point in this recent window (e.g. 14d; units s, m, h, d): the newest backup that ended before the window began, every backup after it, and all WAL from that backup's start. With repo-retention-full or repo-retention-diff too, a backup expires only when every rule set expires it. When set, backup runs expire after it succeeds." },
    OptionDef { name: "repo-retention-archive", kind: Kind::Int { min: 1, max: 9_999_999 }, default: None, scope: Scope::Config, secret: false, peer: false, commands: RETENTION_CMDS,
        help: "Keep continuous WAL (point-in-time recovery) from the oldest start among the N newest kept backups on; older kept backups keep only the WAL that makes them consistent (default: all kept backups)." },
    OptionDef { name: "type", kind: Kind::Enum(RecoveryType::NAMES), default: Some("default"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Recovery type: replay all WAL (default), stop when consistent (immediate), stop at a target (time, lsn, xid, name), become a standby, write no recovery settings (none), or keep the target's recovery settings and signal files as they were (preserve: a delta restore of a standby stays one)." },
    OptionDef { name: "recovery-option", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "A setting for postgresql.auto.conf with the recovery settings, KEY=VALUE (repeatable; e.g. primary_conninfo=..., recovery_target_action=promote); one of pgstrata's own keys given here replaces pgstrata's value (restore_command included)." },
    OptionDef { name: "type", kind: Kind::Enum(RecoveryType::NAMES), default: Some("immediate"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore-test", "restore-table"],
        help: "How far the scratch cluster recovers before it is checked: to consistency (immediate), all archived WAL (default), or a target (time, lsn, xid, name with --target). standby and none are refused." },
    OptionDef { name: "set", kind: Kind::Str, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore", "restore-test", "info", "expire", "verify", "copy", "annotate", "restore-table"],
        help: "Backup label. restore, restore-test: default the latest (for --type=time, the newest backup that ended before the target); expire: expire just this backup; info, verify: just this backup; copy: copy just this backup (default: every backup the target lacks); annotate: the backup (required)." },
    OptionDef { name: "repair", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["verify"],
        help: "Rewrite each damaged or missing manifest, manifest part or copy whose twin is intact from that twin (under the stanza lock), then report what is left." },
    OptionDef { name: "instant", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Return as soon as the data directory can be started: relation files of 1 MiB or more (base/, global/, tablespaces) are links to a FUSE filesystem that a background process serves (mounted as the user running restore, which must be the cluster's owner, not root), fetching each block from the repository the first time PostgreSQL reads it and every other block in the background (process-max workers, recently read files first); once all is local the links are replaced by the files and the process leaves when PostgreSQL closes the last one. Its log is log-path/STANZA-instant.log; follow it with instant-status. Needs the fuse3 package (fusermount3). Not with --delta." },
    OptionDef { name: "resume", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "With --instant: serve the interrupted instant restore of pg-path again (its process was killed, the host restarted); nothing already local is fetched again. Restart PostgreSQL afterwards if it was running: its files failed under it." },
    OptionDef { name: "instant-foreground", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "With --instant: serve in this process until done instead of starting a background process (under a supervisor such as systemd); restore --instant itself starts its background process so." },
    OptionDef { name: "delta", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Restore over an existing directory, rewriting only files whose content differs and removing files the backup lacks." },
    OptionDef { name: "force", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Restore over an existing directory, removing everything in it first." },
    OptionDef { name: "dry-run", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore", "expire"],
        help: "Change nothing; say what would be done. restore: print the backup, targets, tablespaces and recovery settings after checking the targets, and write nothing. expire: list the backups that would be expired, each with the rule that expires it, the WAL segments, and the packs and bytes that would be freed (takes no lock)." },
    OptionDef { name: "tablespace-map", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Restore a tablespace elsewhere: OID=DIR (repeatable)." },
    OptionDef { name: "tablespace-map-all", kind: Kind::Path, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Restore every tablespace not named by --tablespace-map into DIR/<OID> (the links in pg_tblspc point there)." },
    OptionDef { name: "link-all", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Restore the data directory's symbolic links (pg_wal, log directories, configuration files linked from elsewhere: those at its top, which backup follows and records) as links to where they pointed, their content written there. By default they are restored as the directories and files they pointed to, inside the data directory. A target overlapping the data directory, a tablespace or another link is refused; a non-empty directory target needs --delta or --force." },
    OptionDef { name: "link-map", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "Restore one link of the data directory as a link to another place: NAME=DIR (repeatable), e.g. pg_wal=/fast/wal; a directory of the backup that was no link (pg_wal) becomes one. DIR must be absolute." },
    OptionDef { name: "db-include", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore", "restore-test"],
        help: "Restore only this database (repeatable), and the system databases (template0, template1, postgres), which are always restored. The other databases' files are written as sparse zeroed files, nothing fetched: the cluster starts, and they are to be dropped. Needs a backup that recorded its databases." },
    OptionDef { name: "db-exclude", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore", "restore-test"],
        help: "Do not restore this database (repeatable): its files are written as sparse zeroed files, nothing fetched (also with --delta). A system database cannot be excluded." },
    OptionDef { name: "target", kind: Kind::Str, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore", "restore-test", "restore-table"],
        help: "Recovery target for --type=time (with time zone), lsn, xid or name." },
    OptionDef { name: "target-action", kind: Kind::Enum(TargetAction::NAMES), default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "What the server does at the target (PostgreSQL's default: pause)." },
    OptionDef { name: "target-timeline", kind: Kind::Str, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore", "restore-test", "restore-table"],
        help: "Timeline to recover along: current, latest or a number (PostgreSQL's default: latest)." },
    OptionDef { name: "target-exclusive", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore", "restore-test", "restore-table"],
        help: "Stop just before the target instead of just after it." },
    OptionDef { name: "archive-mode", kind: Kind::Enum(&["preserve", "off"]), default: Some("preserve"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore"],
        help: "off: the restored cluster does not archive WAL (for copies that must not write into the source's archive); preserve: keep the backed-up setting." },
    OptionDef { name: "pg-path", kind: Kind::Path, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["instant-status"],
        help: "The data directory an instant restore was made into." },
    OptionDef { name: "db", kind: Kind::Str, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore-table"],
        help: "The database the tables are in." },
    OptionDef { name: "table", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore-table"],
        help: "A table to get back, SCHEMA.TABLE (or TABLE, found in the search path), as pg_dump's --table takes it; repeatable. Its TOAST table and indexes come with it." },
    OptionDef { name: "output", kind: Kind::Path, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore-table"],
        help: "The file pg_dump writes the tables to (plain SQL: load it with psql); it must not exist." },
    OptionDef { name: "wait", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["instant-status"],
        help: "Return only when every block is local (exit 0) or hydration failed (exit 4 damage, 3 otherwise)." },
    OptionDef { name: "pg-path", kind: Kind::Path, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore-test", "restore-table"],
        help: "Scratch directory for the test restore: absent or empty; the data directory, socket and server log go inside it. Default: a new directory in TMPDIR (or /tmp). Never taken from the config file, whose pg-path is the live cluster's. Needs room for the whole database." },
    OptionDef { name: "restore-test-preload", kind: Kind::List, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore-test"],
        help: "A library the scratch server preloads (repeatable; its shared_preload_libraries): the backup's own shared_preload_libraries, like every setting of the backup that runs a command or loads code, is not used. For extensions the restored cluster cannot start or recover without (a custom WAL resource manager, for example)." },
    OptionDef { name: "keep", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["restore-test"],
        help: "Keep the scratch directory (stopped cluster, server log) instead of removing it." },
    OptionDef { name: "output", kind: Kind::Enum(Output::NAMES), default: Some("text"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["info", "verify", "instant-status"],
        help: "Output format. prometheus: metrics in Prometheus' text format, for node_exporter's textfile collector (info: newest backup per type, its end time, age and sizes, backup counts, repository size, newest archived WAL segment and its age; verify: its results; instant-status: bytes local and in all, on-demand fetches and their latency, failure)." },
    OptionDef { name: "output", kind: Kind::Enum(ReportOutput::NAMES), default: Some("text"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["key-list", "restore-test", "copy", "expire", "repo-ls", "annotate"],
        help: "Output format." },
    OptionDef { name: "force", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["stanza-delete"],
        help: "Yes, delete the stanza: every backup and all WAL of it in the repository." },
    OptionDef { name: "recurse", kind: Kind::Bool, default: Some("false"), scope: Scope::CommandLine, secret: false, peer: false, commands: &["repo-ls"],
        help: "List every object below PATH, not just its objects and directories." },
    OptionDef { name: "progress", kind: Kind::Enum(ProgressMode::NAMES), default: Some("auto"), scope: Scope::Config, secret: false, peer: true, commands: &["backup", "restore", "restore-test", "verify", "copy"],
        help: "Progress (bytes done of the total, percent, rate, time left): auto shows a live line on standard error when it is a terminal, else logs a progress line at info level at most every 30 s; on always shows the live line; off shows nothing." },
    OptionDef { name: "log-level-console", kind: Kind::Enum(LogLevel::NAMES), default: Some("warn"), scope: Scope::Config, secret: false, peer: true, commands: &[],
        help: "Messages shown on standard error." },
    OptionDef { name: "log-level-file", kind: Kind::Enum(LogLevel::NAMES), default: Some("off"), scope: Scope::Config, secret: false, peer: false, commands: &[],
        help: "Messages written to the log file in log-path." },
    OptionDef { name: "log-path", kind: Kind::Path, default: Some("/var/log/pgstrata"), scope: Scope::Config, secret: false, peer: false, commands: &[],
        help: "Directory for log files, named STANZA-COMMAND.log." },
    OptionDef { name: "state-path", kind: Kind::Path, default: Some("/var/lib/pgstrata/state"), scope: Scope::Config, secret: false, peer: false, commands: &["backup", "expire", "info", "verify", "stanza-delete", "wal-receive"],
        help: "Directory where this host remembers the backups and newest WAL it saw in each repository, to report those that vanish without an expire record (an attacker deleting backups); created mode 0700. When it cannot be made, a warning, and only the repository's expire records are used." },
    OptionDef { name: "notify-command", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: crate::notify::COMMANDS,
        help: "A program run on this host when backup, expire, verify, copy or restore-test ends (see notify-on), with a JSON summary on its standard input: command, stanza, repo, result (ok or failed), exit_code, report (what --output=json gives), duration_ms, error, host, time. It gets a clean environment (PATH and LANG only: no passphrases or keys) and runs for at most notify-timeout; its failure is logged and never changes the command's exit code." },
    OptionDef { name: "notify-on", kind: Kind::Enum(crate::notify::NotifyOn::NAMES), default: Some("failure"), scope: Scope::Config, secret: false, peer: false, commands: crate::notify::COMMANDS,
        help: "When notify-command runs: after a failure only, or always." },
    OptionDef { name: "notify-timeout", kind: Kind::Duration { min: 1, max: 3600 }, default: Some("60s"), scope: Scope::Config, secret: false, peer: false, commands: crate::notify::COMMANDS,
        help: "How long notify-command may run before it is killed." },
    OptionDef { name: "wal-receive-slot", kind: Kind::Str, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["wal-receive", "check"],
        help: "The physical replication slot wal-receive streams through, created when absent (default pgstrata_STANZA, lower case, other characters as _); also its application_name, the name synchronous_standby_names gives. check reports the slot's state." },
    OptionDef { name: "wal-receive-flush-interval", kind: Kind::Duration { min: 1, max: 3600 }, default: Some("1s"), scope: Scope::Config, secret: false, peer: false, commands: &["wal-receive"],
        help: "Longest time WAL received waits before it is written to the repositories; asynchronously, a streamed commit is also written at once when nothing was written for this long (so asynchronous mode loses at most this much of the last commits, and a quiet cluster's commits none)." },
    OptionDef { name: "wal-receive-synchronous", kind: Kind::Bool, default: Some("false"), scope: Scope::Config, secret: false, peer: false, commands: &["wal-receive"],
        help: "Write the partial segment and report it flushed at once each time a transaction commit (or prepare) was streamed, so that with synchronous_standby_names naming the slot every commit waits until its WAL is in every repository (commits stop while a repository cannot be written: pair it with a standby, ANY 1 (standby1, pgstrata_main))." },
    OptionDef { name: "lock-path", kind: Kind::Path, default: Some("/tmp/pgstrata"), scope: Scope::Config, secret: false, peer: false, commands: &["backup", "expire", "copy", "stanza-delete", "wal-receive"],
        help: "Directory of the host-local lock that lets one process at a time remove a stale stanza lock; created mode 0700, and refused when another user owns it or others can write to it (give each OS user running pgstrata its own)." },
    OptionDef { name: "pg-bin", kind: Kind::Path, default: None, scope: Scope::CommandLine, secret: false, peer: false, commands: &["demo"],
        help: "Directory of the PostgreSQL server binaries for the demo (default: pg_config --bindir, else the newest /usr/lib/postgresql/*/bin)." },
    OptionDef { name: "pg-bin", kind: Kind::Path, default: None, scope: Scope::Config, secret: false, peer: false, commands: &["restore-test", "restore-table"],
        help: "Directory of the server binaries (postgres, pg_ctl, pg_amcheck, pg_checksums) of the backup's major version (default: PGSTRATA_PG<major>_BIN, else /usr/lib/postgresql/<major>/bin)." },
];

/// The environment variable that sets option `name`: `PGSTRATA_` and the name in capitals,
/// `-` as `_`.
pub(crate) fn env_name(name: &str) -> String {
    format!("PGSTRATA_{}", name.to_uppercase().replace('-', "_"))
}

impl OptionDef {
    pub(crate) fn applies_to(&self, command: &str) -> bool {
        self.commands.is_empty() || self.commands.contains(&command)
    }

    pub(crate) fn env_name(&self) -> String {
        env_name(self.name)
    }

    pub(crate) fn allowed(&self) -> String {
        match self.kind {
            Kind::Str => "text".into(),
            Kind::Path => "a path".into(),
            Kind::Int { min, max } => format!("an integer from {min} to {max}"),
            Kind::Bool => "true or false".into(),
            Kind::Size { min, max } => format!(
                "a size from {} to {} (e.g. 16MiB)",
                fmt_size(min),
                fmt_size(max)
            ),
            Kind::Enum(vals) => vals.join(", "),
            Kind::List => "text, repeatable".into(),
            Kind::Duration { min, max } => format!(
                "a duration from {} to {} (a number and s, m, h or d: e.g. 14d)",
                fmt_duration(min),
                fmt_duration(max)
            ),
            Kind::CompressLevel => {
                let per_codec: Vec<String> = CompressType::ALL
                    .iter()
                    .filter(|c| **c != CompressType::None)
                    .map(|c| match c.level_range() {
                        (lo, hi) if lo == hi => format!("{} {lo}", c.name()),
                        (lo, hi) => {
                            format!("{} {lo} to {hi} (default {})", c.name(), c.default_level())
                        }
                    })
                    .collect();
                format!("an integer: {}", per_codec.join("; "))
            }
        }
    }

    /// The default, normalized as a given value would be (`16MiB` as bytes).
    pub(crate) fn default_value(&self) -> Option<String> {
        let d = self.default?;
        Some(
            self.validate(d, "the option table")
                .unwrap_or_else(|e| panic!("bad default: {e}")),
        )
    }

    /// Check a value and return it normalized.
    pub(crate) fn validate(&self, value: &str, source: &str) -> Result<String, String> {
        let bad = |why: String| Err(format!("option '{}' (from {source}): {why}", self.name));
        match self.kind {
            // The range depends on compress-type: checked again once both are known
            // (`check_compress_level`).
            Kind::CompressLevel => match value.trim().parse::<i32>() {
                Ok(v)
                    if CompressType::ALL
                        .iter()
                        .any(|c| in_range(v, c.level_range())) =>
                {
                    Ok(v.to_string())
                }
                _ => bad(format!(
                    "'{value}' is not allowed; expected {}",
                    self.allowed()
                )),
            },
            Kind::Int { min, max } => match value.trim().parse::<i64>() {
                Ok(v) if v >= min && v <= max => Ok(v.to_string()),
                _ => bad(format!(
                    "'{value}' is not allowed; expected {}",
                    self.allowed()
                )),
            },
            Kind::Bool => match value.trim() {
                "true" | "y" | "yes" | "on" | "1" => Ok("true".into()),
                "false" | "n" | "no" | "off" | "0" => Ok("false".into()),
                _ => bad(format!("'{value}' is not allowed; expected true or false")),
            },
            Kind::Size { min, max } => match parse_size(value) {
                Some(v) if v >= min && v <= max => Ok(v.to_string()),
                _ => bad(format!(
                    "'{value}' is not allowed; expected {}",
                    self.allowed()
                )),
            },
            Kind::Duration { min, max } => match parse_duration(value) {
                Some(v) if v >= min && v <= max => Ok(v.to_string()),
                _ => bad(format!(
                    "'{value}' is not allowed; expected {}",
                    self.allowed()
                )),
            },
            Kind::Enum(vals) => {
                if vals.contains(&value) {
                    Ok(value.to_string())
                } else {
                    bad(format!(
                        "'{value}' is not allowed; allowed: {}",
                        vals.join(", ")
                    ))
                }
            }
            Kind::Str | Kind::Path | Kind::List => {
                if value.is_empty() {
                    bad("empty value".into())
                } else {
                    Ok(value.to_string())
                }
            }
        }
    }
}

fn in_range(v: i32, (lo, hi): (i32, i32)) -> bool {
    lo <= v && v <= hi
}

/// A compression level must be one the chosen codec accepts.
pub(crate) fn check_compress_level(
    level: &str,
    compress_type: &str,
    source: &str,
) -> Result<(), String> {
    let (Ok(level), Some(codec)) = (level.parse::<i32>(), CompressType::parse(compress_type))
    else {
        return Ok(()); // each was validated on its own
    };
    let (lo, hi) = codec.level_range();
    if in_range(level, (lo, hi)) {
        Ok(())
    } else {
        Err(format!(
            "option 'compress-level' (from {source}): {level} is not allowed with compress-type={compress_type}; expected {lo} to {hi}"
        ))
    }
}

/// Parse a size like `16MiB`, `2MB`, `512k` or `1048576` into bytes.
pub(crate) fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parse a duration like `14d`, `36h`, `90m` or `30s` into seconds (a unit is required:
/// a bare number is ambiguous).
pub(crate) fn parse_duration(v: &str) -> Option<u64> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn fmt_duration(secs: u64) -> String {
    match secs {
        s if s >= 86400 && s % 86400 == 0 => format!("{}d", s / 86400),
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn fmt_size(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => n.to_string(),
    }
}

/// Find the definition of `name` for `command`.
pub(crate) fn find(name: &str, command: &str) -> Option<&'static OptionDef> {
    OPTIONS
        .iter()
        .find(|o| o.name == name && o.applies_to(command))
}

/// The definition of `name` when only one command family defines it (not `type`, `delta`).
pub(crate) fn unique(name: &str) -> Option<&'static OptionDef> {
    let mut defs = OPTIONS.iter().filter(|o| o.name == name);
    let first = defs.next()?;
    defs.next().is_none().then_some(first)
}

pub(crate) fn known(name: &str) -> bool {
    OPTIONS.iter().any(|o| o.name == name)
}

/// Repositories are numbered 1 to [`REPO_MAX`]; `repo-*` options are repository 1's.
pub(crate) const REPO_MAX: u8 = 4;

/// Whether `name` is a repository option of repository 1 (`repo-path`, `repo-s3-bucket`,
/// ...): repositories 2 to 4 take it as `repoN-...`.
pub(crate) fn is_repo_option(name: &str) -> bool {
    name.starts_with("repo-")
}

/// A numbered repository option, `repoN-X` for repository option `repo-X`: `(N, "repo-X")`.
/// `repo1-X` is `repo-X`. `Err` for a number out of range or an unknown `X`.
pub(crate) fn indexed(name: &str) -> Option<Result<(u8, &'static str), String>> {
    let rest = name.strip_prefix("repo")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || !rest[digits..].starts_with('-') {
        return None;
    }
    let base = format!("repo{}", &rest[digits..]);
    let Some(def) = OPTIONS
        .iter()
        .find(|o| o.name == base && is_repo_option(o.name))
    else {
        return Some(Err(format!(
            "unknown option '{name}': '{base}' is not a repository option (see 'pgstrata help options')"
        )));
    };
    match rest[..digits].parse::<u8>() {
        Ok(n) if (1..=REPO_MAX).contains(&n) => Some(Ok((n, def.name))),
        _ => Some(Err(format!(
            "option '{name}': repositories are numbered 1 to {REPO_MAX}"
        ))),
    }
}

/// The name of repository option `base` (`repo-X`) for repository `n`.
pub(crate) fn repo_option_name(base: &str, n: u8) -> String {
    if n == 1 {
        base.to_string()
    } else {
        format!("repo{n}{}", &base["repo".len()..])
    }
}

/// The option reference (docs/options.md), generated from the table.
pub(crate) fn reference_markdown() -> String {
    let mut out = String::from(
        "# pgstrata option reference\n\n\
         Generated by `pgstrata help options` from the option table in `crates/cli/src/options.rs`; \
         do not edit by hand.\n\n\
         Precedence: `--name=value` on the command line, then the environment variable \
         `PGSTRATA_NAME`, then the stanza's table in the config file, then `[global]`, then the default. \
         Options marked *command line* cannot be set in the config file.\n\n\
         | option | allowed | default | where | commands | description |\n|---|---|---|---|---|---|\n",
    );
    for o in OPTIONS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            o.name,
            o.allowed(),
            o.default
                .map(|d| format!("`{d}`"))
                .unwrap_or_else(|| "-".into()),
            match o.scope {
                Scope::Config => "config, env, command line",
                Scope::CommandLine => "command line, env",
            },
            if o.commands.is_empty() {
                "all".to_string()
            } else {
                o.commands.join(", ")
            },
            if o.peer {
                format!(
                    "{} *With pg-remote, the backup host's choice for the job.*",
                    o.help
                )
            } else {
                o.help.to_string()
            }
        ));
    }
    out.push_str("\n## Commands\n\n");
    for (c, h) in COMMANDS {
        out.push_str(&format!("- `{c}`: {h}\n"));
    }
    out
}

pub(crate) fn command_help(command: &str) -> String {
    let desc = COMMANDS
        .iter()
        .find(|(c, _)| *c == command)
        .map(|(_, h)| *h)
        .unwrap_or("");
    let mut out = format!("pgstrata {command}: {desc}\n\nOptions:\n");
    for o in OPTIONS.iter().filter(|o| o.applies_to(command)) {
        out.push_str(&format!(
            "  --{:<20} {} [{}{}]\n",
            o.name,
            o.help,
            o.allowed(),
            o.default
                .map(|d| format!("; default {d}"))
                .unwrap_or_default()
        ));
    }
    out
}

pub(crate) fn general_help() -> String {
    let mut out = String::from("pgstrata: PostgreSQL backup and restore\n\nUsage: pgstrata [--option=value ...] COMMAND [ARGS]\n\nCommands:\n");
    for (c, h) in COMMANDS {
        out.push_str(&format!("  {c:<15} {h}\n"));
    }
    out.push_str("\n'pgstrata help COMMAND' lists a command's options; 'pgstrata help options' prints the full reference; 'pgstrata help man' the man page.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgstrata_repo::named::check_named;

    /// Durations need a unit and stay in the option's range; the error says what is allowed.
    #[test]
    fn a_retention_window_is_a_duration_with_a_unit() {
        let window = OPTIONS
            .iter()
            .find(|o| o.name == "repo-retention-window")
            .unwrap();
        assert_eq!(window.validate("14d", "test"), Ok((14 * 86400).to_string()));
        assert_eq!(
            window.validate(" 36h ", "test"),
            Ok((36 * 3600).to_string())
        );
        assert_eq!(window.validate("90m", "test"), Ok("5400".to_string()));
        for bad in ["14", "14w", "d", "", "30s", "99999999d"] {
            let err = window.validate(bad, "test").unwrap_err();
            assert!(err.contains("a duration from 1m to 36500d"), "{bad}: {err}");
        }
    }

    /// Every enum the table takes its values from names each value once, and the names parse
    /// back: a value added to an enum but not to its names would fail here.
    #[test]
    fn every_named_enum_names_each_value_once() {
        check_named::<RepoKind>();
        check_named::<CompressType>();
        check_named::<CipherType>();
        check_named::<BackupType>();
        check_named::<Track>();
        check_named::<RetentionType>();
        check_named::<RecoveryType>();
        check_named::<TargetAction>();
        check_named::<SslMode>();
        check_named::<LogLevel>();
        check_named::<Output>();
        check_named::<ReportOutput>();
    }
}
