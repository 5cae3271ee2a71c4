//! `restore`: rebuild a data directory from one backup, with the recovery settings that
//! bring it to a consistent state or to a target. The work is [`crate::data_restore`]'s,
//! which `restore-test` shares; the command is its plan (`--dry-run` prints it) and its
//! execution, with their options and report.

pub use crate::data_restore::{
    parse_target_time, plan, restore, RecoveryType, RestoreCounts, RestoreOptions, RestorePlan,
    RestoreReport, TargetAction,
};
