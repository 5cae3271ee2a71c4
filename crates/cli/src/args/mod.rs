//! What the user asked for, typed: one [`Command`] per invocation, holding one struct of
//! settings per command.
//!
//! Options are resolved in [`resolve`] (command line, environment, config file, defaults,
//! each value checked against the option table in `options.rs`) and turned into these
//! types in [`parse`], the one place that reads an option by its name. Everything after
//! that works with fields: a misspelt field does not compile, and a misspelt option name
//! in the parser fails its tests, which parse every command and compare the names each one
//! read with the names the table lists for it (`parse::tests`). The table stays the one
//! source of help, docs/options.md, the man page and the completions.

pub(crate) mod parse;
pub(crate) mod resolve;

pub(crate) use parse::{command, reporting};
pub(crate) use resolve::{resolve, Invocation};

use pgstrata_engine::commands::archive::AsyncOptions;
use pgstrata_engine::commands::backup::BackupOptions;
use pgstrata_engine::commands::copy::CopyOptions;
use pgstrata_engine::commands::expire::ExpireOptions;
use pgstrata_engine::commands::restore::RestoreOptions;
use pgstrata_engine::commands::restore_test::RestoreTestOptions;
use pgstrata_engine::progress::ProgressMode;
use pgstrata_engine::Settings;
use pgstrata_remote::protocol::JobKind;
use pgstrata_remote::SshTarget;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) use crate::options::{Output, ReportOutput};

/// Set in `agent run`: the job runs for the backup host, which holds the stanza lock and
/// applies retention itself. The parser reads it (a job refuses to go on to another host,
/// and its backup is locked by the caller); `agent_commands` sets it.
static IN_AGENT_RUN: AtomicBool = AtomicBool::new(false);

/// Whether this process is `agent run` doing a backup host's job.
pub(crate) fn in_agent_run() -> bool {
    IN_AGENT_RUN.load(Ordering::Relaxed)
}

/// From now on this process is `agent run` doing a backup host's job.
pub(crate) fn enter_agent_run() {
    IN_AGENT_RUN.store(true, Ordering::Relaxed);
}

/// How the run reports, set up before the command runs: log levels and files, progress.
pub(crate) struct Reporting {
    pub(crate) console: log::LevelFilter,
    pub(crate) file: log::LevelFilter,
    pub(crate) log_path: PathBuf,
    /// For the log file's name.
    pub(crate) stanza: Option<String>,
    /// The progress display, for commands that show one.
    pub(crate) progress: Option<ProgressMode>,
    /// `notify-command`, when set for this command.
    pub(crate) notify: Option<crate::notify::Notify>,
    /// `--repo`, when given (for the notification).
    pub(crate) repo: Option<u8>,
}

/// One invocation's command and its settings.
pub(crate) enum Command {
    /// `help [TOPIC]`.
    Help {
        topic: Option<String>,
    },
    /// `completions SHELL`.
    Completions {
        shell: Option<String>,
    },
    Version,
    Demo {
        pg_bin: Option<PathBuf>,
    },
    Agent(Agent),
    /// stanza-create, check or backup with `pg-remote` or `standby-remote`: a job of
    /// `agent run` on another host.
    OnAnotherHost(RemoteJob),
    StanzaCreate(Repos),
    StanzaUpgrade(Repos),
    Check(Repos),
    Backup(Backup),
    Restore(Restore),
    RestoreTest(RestoreTest),
    /// `restore-table`: restore-test's scratch cluster, dumping tables.
    RestoreTable(RestoreTest),
    ArchivePush(ArchivePush),
    ArchiveGet(ArchiveGet),
    Expire {
        repos: Repos,
        output: ReportOutput,
    },
    Info(Report),
    Verify(Verify),
    Copy(Copy),
    /// `wal-receive`: every configured repository.
    InstantStatus {
        pg_path: PathBuf,
        wait: bool,
        output: Output,
    },
    WalReceive {
        repos: Repos,
        options: pgstrata_engine::commands::wal_receive::WalReceiveOptions,
    },
    KeyAdd(KeyAdd),
    KeyList {
        repos: Repos,
        output: ReportOutput,
    },
    /// `annotate --set=LABEL`.
    Annotate {
        repos: Repos,
        options: pgstrata_engine::commands::annotate::AnnotateOptions,
        output: ReportOutput,
    },
    /// `stanza-delete --force`.
    StanzaDelete {
        repos: Repos,
        force: bool,
    },
    /// `repo-ls [PATH]`.
    RepoLs {
        repos: Repos,
        path: Option<String>,
        recurse: bool,
        output: ReportOutput,
    },
    /// `repo-get PATH`.
    RepoGet {
        repos: Repos,
        path: Option<String>,
    },
    KeyRemove {
        repos: Repos,
        key_id: String,
    },
}

/// The repositories of a command on one stanza: every configured one (`repo-*` and
/// `repoN-*` options), and the one `--repo` names.
pub(crate) struct Repos {
    /// By repository number, 1 first.
    pub(crate) all: Vec<Repo>,
    /// `--repo`, checked to be configured.
    pub(crate) chosen: Option<u8>,
}

/// One repository's view of the invocation.
pub(crate) struct Repo {
    pub(crate) settings: Settings,
    /// Retention (`repoN-retention-*`) and `--set`, for expire and after a backup.
    pub(crate) expire: ExpireOptions,
    /// What a job on another host gets to choose (`peer` options, this repository's).
    pub(crate) peer_choices: Vec<(String, String)>,
}

impl Repos {
    /// The repository `--repo` names, repository 1 without it.
    pub(crate) fn selected(&self) -> &Repo {
        let n = self.chosen.unwrap_or(1);
        self.all
            .iter()
            .find(|r| r.settings.repo_index == n)
            .expect("--repo was checked when parsed")
    }

    /// Every repository's settings, the selected one first (archive-push writes them all;
    /// archive-get tries them in this order).
    pub(crate) fn selected_first(&self) -> Vec<Settings> {
        let first = self.selected().settings.repo_index;
        let mut all: Vec<&Repo> = self.all.iter().collect();
        all.sort_by_key(|r| (r.settings.repo_index != first, r.settings.repo_index));
        all.into_iter().map(|r| r.settings.clone()).collect()
    }

    /// The repositories a command that can cover all of them works on: the one `--repo`
    /// names, else every configured one.
    pub(crate) fn covered(&self) -> Vec<&Repo> {
        match self.chosen {
            Some(_) => vec![self.selected()],
            None => self.all.iter().collect(),
        }
    }
}

impl Repo {
    /// What expire goes by: retention or `--set`, when either is given.
    pub(crate) fn expire_options(&self) -> Option<&ExpireOptions> {
        let o = &self.expire;
        (o.set.is_some()
            || o.retention_full.is_some()
            || o.retention_diff.is_some()
            || o.retention_window.is_some())
        .then_some(o)
    }
}

/// `agent repo` or `agent run`.
pub(crate) struct Agent {
    /// `repo` or `run` (anything else is refused when it runs).
    pub(crate) mode: Option<String>,
    /// The stanzas it works for (checked names).
    pub(crate) stanzas: Vec<String>,
    /// `agent repo`: the repository it serves.
    pub(crate) repo_path: PathBuf,
    pub(crate) buffer_max: u64,
}

/// A job run on another host (see `agent_commands`).
pub(crate) struct RemoteJob {
    pub(crate) kind: JobKind,
    pub(crate) target: SshTarget,
    /// The configuration file the agent there is told to read (`pg-remote-config` or
    /// `standby-remote-config`).
    pub(crate) config: Option<PathBuf>,
    pub(crate) repos: Repos,
    pub(crate) buffer_max: u64,
}

pub(crate) struct Backup {
    pub(crate) repos: Repos,
    pub(crate) options: BackupOptions,
}

pub(crate) struct Restore {
    pub(crate) repos: Repos,
    pub(crate) options: RestoreOptions,
    /// `--instant --resume`: serve an interrupted instant restore again.
    pub(crate) resume: bool,
    /// `--instant-foreground`: serve in this process.
    pub(crate) foreground: bool,
    /// Where the serving process's log goes.
    pub(crate) log_path: PathBuf,
}

pub(crate) struct RestoreTest {
    pub(crate) repos: Repos,
    pub(crate) options: RestoreTestOptions,
    pub(crate) output: ReportOutput,
}

pub(crate) struct ArchivePush {
    pub(crate) repos: Repos,
    /// The WAL file (`%p`).
    pub(crate) wal: PathBuf,
    /// `archive-async`.
    pub(crate) asynchronous: bool,
    pub(crate) async_options: AsyncOptions,
}

pub(crate) struct ArchiveGet {
    pub(crate) repos: Repos,
    /// The WAL file's name (`%f`).
    pub(crate) name: String,
    /// Where to put it (`%p`).
    pub(crate) dest: PathBuf,
    pub(crate) async_options: AsyncOptions,
}

/// info and verify.
pub(crate) struct Report {
    pub(crate) repos: Repos,
    pub(crate) set: Option<String>,
    pub(crate) output: Output,
}

pub(crate) struct Verify {
    pub(crate) report: Report,
    /// `--repair`: rewrite damaged manifest objects from their intact twins.
    pub(crate) repair: bool,
}

/// `copy --from-repo=N --repo=M`.
pub(crate) struct Copy {
    pub(crate) repos: Repos,
    /// `--from-repo`: the repository copied from (`repos.chosen` is the one copied to).
    pub(crate) from_repo: u8,
    pub(crate) options: CopyOptions,
    pub(crate) output: ReportOutput,
}

pub(crate) struct KeyAdd {
    pub(crate) repos: Repos,
    /// `new-cipher-pass` (environment or config file), checked when it is used.
    pub(crate) new_pass: Option<zeroize::Zeroizing<String>>,
    /// `--new-cipher-pass-file`.
    pub(crate) new_pass_file: Option<PathBuf>,
}
