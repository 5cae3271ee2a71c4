//! Resolving option values from the command line, the environment and the config file,
//! against the option table, and reading them back typed.
//!
//! Every value in an [`Invocation`] was validated against its option's [`Kind`], and every
//! option with a default in the table has a value; so the typed getters cannot fail on
//! input, only on a programming error (asking for an option the command does not take, or
//! as the wrong type), which the parser's tests exercise for every command. The getters
//! are for the parser (`super::parse`) alone: the rest of the binary reads typed settings.

use crate::options::{self, Kind, OptionDef, Scope};
use pgstrata_repo::Named;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

pub(crate) struct Invocation {
    pub(crate) command: String,
    /// The repository whose `repo-*` values this holds (1 for the unnumbered options).
    pub(super) repo_index: u8,
    /// The other configured repositories' views of the same invocation: identical but for
    /// the `repo-*` values, which come from their `repoN-*` options.
    pub(super) other_repos: Vec<Invocation>,
    pub(super) args: Vec<String>,
    values: HashMap<&'static str, String>,
    lists: HashMap<&'static str, Vec<String>>,
    /// The options read by name so far: the parser's tests compare them with the table.
    read: std::sync::Mutex<std::collections::BTreeSet<&'static str>>,
    /// The config file actually read, if any.
    pub(super) config_file: Option<PathBuf>,
    /// Problems worth a warning once logging is set up (a config file others can read).
    pub(crate) warnings: Vec<String>,
}

impl Invocation {
    /// The definition of `name` for this command, else its only definition (an option of
    /// other commands reads as its default), else, for an option defined per command with
    /// one kind and no default (`pg-path`), its first definition: it reads as unset.
    /// Anything else is a programming error.
    fn def(&self, name: &str) -> &'static OptionDef {
        let def = self.def_quietly(name);
        self.read.lock().expect("not poisoned").insert(def.name);
        def
    }

    /// [`Self::def`], not counted as a read (table-driven walks over every option).
    fn def_quietly(&self, name: &str) -> &'static OptionDef {
        options::find(name, &self.command)
            .or_else(|| options::unique(name))
            .or_else(|| {
                let mut defs = options::OPTIONS.iter().filter(|o| o.name == name);
                let first = defs.next()?;
                defs.all(|o| o.kind == first.kind && o.default.is_none() && first.default.is_none())
                    .then_some(first)
            })
            .unwrap_or_else(|| panic!("option '{name}' is not defined for '{}'", self.command))
    }

    /// The value of an option that has a default in the table.
    fn with_default(&self, name: &str) -> &str {
        self.get(name)
            .unwrap_or_else(|| panic!("option '{name}' has no default in the option table"))
    }

    /// A text or path option's value, if set.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.def(name);
        self.values.get(name).map(String::as_str)
    }

    /// A text option that has a default.
    pub(super) fn text(&self, name: &str) -> &str {
        self.with_default(name)
    }

    pub(super) fn flag(&self, name: &str) -> bool {
        assert_eq!(self.def(name).kind, Kind::Bool, "{name} is not a boolean");
        self.with_default(name) == "true"
    }

    /// An integer (or size) option, if set.
    pub(super) fn int_opt<T: TryFrom<i64>>(&self, name: &str) -> Option<T> {
        assert!(
            matches!(
                self.def(name).kind,
                Kind::Int { .. } | Kind::Size { .. } | Kind::Duration { .. } | Kind::CompressLevel
            ),
            "{name} is not a number"
        );
        let v: i64 = self.get(name)?.parse().expect("validated integer");
        Some(T::try_from(v).unwrap_or_else(|_| panic!("{name}={v} does not fit its type")))
    }

    /// An integer (or size) option that has a default.
    pub(super) fn int<T: TryFrom<i64>>(&self, name: &str) -> T {
        self.with_default(name);
        self.int_opt(name).expect("has a default")
    }

    /// An option whose values are the names of engine type `T`, if set.
    pub(super) fn choice_opt<T: Named>(&self, name: &str) -> Option<T> {
        assert!(
            self.def(name).kind == Kind::Enum(T::NAMES),
            "{name} does not list the names of {}",
            std::any::type_name::<T>()
        );
        let v = self.get(name)?;
        Some(T::parse(v).unwrap_or_else(|| panic!("{name}='{v}' passed validation")))
    }

    /// An option whose values are the names of engine type `T`, with a default.
    pub(super) fn choice<T: Named>(&self, name: &str) -> T {
        self.with_default(name);
        self.choice_opt(name).expect("has a default")
    }

    pub(super) fn list(&self, name: &str) -> &[String] {
        self.def(name);
        self.lists.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The options in effect as `--name=value`, secrets redacted: for the log.
    pub(crate) fn describe(&self) -> String {
        let mut names: Vec<&&str> = self.values.keys().collect();
        names.sort();
        let mut out: Vec<String> = names
            .into_iter()
            .map(|n| {
                let shown = if self.def_quietly(n).secret {
                    "<redacted>"
                } else {
                    self.values[*n].as_str()
                };
                format!("--{n}={shown}")
            })
            .collect();
        for (n, vals) in &self.lists {
            out.extend(vals.iter().map(|v| format!("--{n}={v}")));
        }
        out.join(" ")
    }

    /// Every configured repository's view of this invocation: repository 1 first.
    pub(super) fn repo_views(&self) -> impl Iterator<Item = &Invocation> {
        std::iter::once(self).chain(&self.other_repos)
    }

    /// The view of the repository `--repo` names (repository 1 without it).
    pub(super) fn selected_repo(&self) -> Result<&Invocation, String> {
        let n: u8 = self.int_opt("repo").unwrap_or(1);
        self.repo_views().find(|v| v.repo_index == n).ok_or_else(|| {
            format!(
                "--repo={n}: repository {n} is not configured (set repo{n}-path, or repo{n}-type and its settings, in the config file or as --repo{n}-... options)"
            )
        })
    }

    pub(super) fn stanza(&self) -> Option<&str> {
        self.values.get("stanza").map(String::as_str)
    }

    /// The value of `def` as given or defaulted, not counted as a read: for walks over the
    /// table (what a peer may choose, what restore_command carries).
    pub(super) fn value_of(&self, def: &OptionDef) -> Option<&str> {
        self.values.get(def.name).map(String::as_str)
    }

    /// The values of list option `def`, not counted as a read (see [`Self::value_of`]).
    pub(super) fn values_of(&self, def: &OptionDef) -> &[String] {
        self.lists.get(def.name).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The option names read so far through the typed getters.
    #[cfg(test)]
    pub(super) fn names_read(&self) -> std::collections::BTreeSet<&'static str> {
        self.read.lock().expect("not poisoned").clone()
    }

    pub(super) fn require(&self, name: &str) -> Result<&str, String> {
        self.get(name).ok_or_else(|| {
            format!(
                "option '{name}' is required for {}: give --{name} or set it in the config file",
                self.command
            )
        })
    }
}

/// The command line taken apart: command, positional arguments, (option, value) pairs.
type SplitArgs = (Option<String>, Vec<String>, Vec<(String, String)>);

/// Split the command line into the command, positional arguments and raw options.
fn split_args(argv: &[String]) -> Result<SplitArgs, String> {
    let mut command = None;
    let mut positional = Vec::new();
    let mut raw = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let a = &argv[i];
        if a == "--help" || a == "-h" {
            raw.push(("help".to_string(), "true".to_string()));
        } else if a == "--version" {
            command.get_or_insert_with(|| "version".to_string());
        } else if let Some(opt) = a.strip_prefix("--") {
            let (name, value) = match opt.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (opt.to_string(), None),
            };
            let base = match options::indexed(&name) {
                Some(Ok((_, base))) => base.to_string(),
                Some(Err(msg)) => return Err(msg),
                None if options::known(&name) => name.clone(),
                None => return Err(format!("unknown option '--{name}' (see 'pgstrata help')")),
            };
            let is_bool = options::OPTIONS
                .iter()
                .any(|o| o.name == base && o.kind == Kind::Bool);
            let value = match value {
                Some(v) => v,
                None if is_bool => "true".to_string(),
                None => {
                    i += 1;
                    argv.get(i)
                        .cloned()
                        .ok_or_else(|| format!("option '--{name}' needs a value"))?
                }
            };
            raw.push((name, value));
        } else if command.is_none() {
            command = Some(a.clone());
        } else {
            positional.push(a.clone());
        }
        i += 1;
    }
    Ok((command, positional, raw))
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("options", &self.describe())
            .field("config_file", &self.config_file)
            .finish()
    }
}

fn toml_value_string(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Parse and check a config file: every key must be a known option settable in the file.
/// Also returns a warning when the file holds secrets that others may read.
fn load_config(path: &PathBuf) -> Result<(toml::Table, Option<String>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("config file {}: {e}", path.display()))?;
    let mut secrets: Vec<&str> = Vec::new();
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("config file {} is not valid TOML: {e}", path.display()))?;
    for (section, body) in &table {
        let toml::Value::Table(body) = body else {
            return Err(format!(
                "config file {}: '{section}' must be a table ([global] or [STANZA]), not a value",
                path.display()
            ));
        };
        for (key, value) in body {
            let base = match options::indexed(key) {
                Some(Ok((_, base))) => base,
                Some(Err(msg)) => return Err(format!("config file {}: {msg}", path.display())),
                None => key.as_str(),
            };
            let Some(def) = options::OPTIONS.iter().find(|o| o.name == base) else {
                return Err(format!(
                    "config file {}: unknown option '{key}' in [{section}]",
                    path.display()
                ));
            };
            if def.scope != Scope::Config {
                return Err(format!(
                    "config file {}: option '{key}' in [{section}] can only be given on the command line",
                    path.display()
                ));
            }
            let Some(s) = toml_value_string(value) else {
                return Err(format!(
                    "config file {}: option '{key}' in [{section}] must be a string, integer or boolean",
                    path.display()
                ));
            };
            def.validate(&s, &format!("[{section}] in {}", path.display()))?;
            if def.secret && !secrets.contains(&def.name) {
                secrets.push(def.name);
            }
        }
    }
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode())
        .unwrap_or(0);
    let warning = (!secrets.is_empty() && mode & 0o044 != 0).then(|| {
        format!(
            "config file {} holds secrets ({}) but group or others can read it (mode {:04o}): chmod 600 {}",
            path.display(),
            secrets.join(", "),
            mode & 0o7777,
            path.display()
        )
    });
    Ok((table, warning))
}

/// The last `--name` on the command line (`raw`), else the option's environment variable:
/// for the options needed before the config file is read.
fn flag_or_env(
    raw: &[(String, String)],
    env: &HashMap<String, String>,
    name: &str,
) -> Option<String> {
    let env_name = options::env_name(name);
    let from_flag = raw.iter().rev().find(|(n, _)| n == name);
    from_flag
        .map(|(_, v)| v.clone())
        .or_else(|| env.get(&env_name).cloned())
}

pub(crate) fn resolve(
    argv: &[String],
    env: &HashMap<String, String>,
) -> Result<Invocation, String> {
    let mut inv = resolve_repo(argv, env, 1)?;
    if inv.command != "help" {
        let table = match &inv.config_file {
            Some(p) => Some(load_config(p)?.0),
            None => None,
        };
        let (_, _, raw) = split_args(argv)?;
        for n in configured_repos(&raw, env, table.as_ref(), inv.stanza()) {
            inv.other_repos.push(resolve_repo(argv, env, n)?);
        }
    }
    Ok(inv)
}

/// The repositories numbered 2 and up that some `repoN-*` option is set for: on the command
/// line, in the environment, or in the config file's sections for this stanza or global.
fn configured_repos(
    raw: &[(String, String)],
    env: &HashMap<String, String>,
    table: Option<&toml::Table>,
    stanza: Option<&str>,
) -> Vec<u8> {
    let mut names: Vec<String> = raw.iter().map(|(n, _)| n.clone()).collect();
    names.extend(
        env.keys()
            .filter_map(|k| k.strip_prefix("PGSTRATA_"))
            .map(|k| k.to_lowercase().replace('_', "-")),
    );
    if let Some(t) = table {
        for section in ["global"].into_iter().chain(stanza) {
            if let Some(toml::Value::Table(body)) = t.get(section) {
                names.extend(body.keys().cloned());
            }
        }
    }
    let mut found: Vec<u8> = names
        .iter()
        .filter_map(|n| options::indexed(n)?.ok())
        .map(|(n, _)| n)
        .filter(|n| *n > 1)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Resolve the invocation as repository `repo_index` sees it.
fn resolve_repo(
    argv: &[String],
    env: &HashMap<String, String>,
    repo_index: u8,
) -> Result<Invocation, String> {
    let (command, args, raw) = split_args(argv)?;
    let wants_help = raw.iter().any(|(n, _)| n == "help");
    let command = match (command, wants_help) {
        (Some(c), true) if c != "help" => return Ok(help_invocation(c, repo_index)),
        (None, _) => "help".to_string(),
        (Some(c), _) => c,
    };
    if !options::COMMANDS.iter().any(|(c, _)| *c == command) {
        return Err(format!("unknown command '{command}' (see 'pgstrata help')"));
    }
    let raw: Vec<(String, String)> = raw.into_iter().filter(|(n, _)| n != "help").collect();
    check_command_line(&raw, &command)?;
    let config = read_config_file(&raw, env, &command)?;

    // Checked before anything is named after it (the log file, the spool directory): a
    // name like `../../x` would put them outside their directories.
    let stanza = flag_or_env(&raw, env, "stanza");
    if let Some(s) = &stanza {
        pgstrata_repo::layout::check_stanza_name(s).map_err(|e| e.to_string())?;
    }
    if let (Some(t), Some(s)) = (&config.table, &stanza) {
        if s != "global" && !t.contains_key(s) && t.keys().any(|k| k != "global") {
            log::debug!("config file has no [{s}] table");
        }
    }

    let sources = Sources {
        raw: &raw,
        env,
        table: config.table.as_ref(),
        config_path: &config.path,
        stanza: stanza.as_deref(),
    };
    let (values, lists) = resolve_values(&sources, &command, repo_index)?;
    Ok(Invocation {
        command,
        repo_index,
        other_repos: Vec::new(),
        args,
        values,
        lists,
        read: Default::default(),
        config_file: config.table.as_ref().map(|_| config.path.clone()),
        warnings: config.warnings,
    })
}

/// `pgstrata COMMAND --help`: help about COMMAND.
fn help_invocation(about: String, repo_index: u8) -> Invocation {
    Invocation {
        command: "help".into(),
        repo_index,
        other_repos: Vec::new(),
        args: vec![about],
        values: options::OPTIONS
            .iter()
            .filter(|o| options::unique(o.name).is_some())
            .filter_map(|o| Some((o.name, o.default_value()?)))
            .collect(),
        lists: HashMap::new(),
        read: Default::default(),
        config_file: None,
        warnings: Vec::new(),
    }
}

/// Every option on the command line must apply to `command` and must not be a secret.
fn check_command_line(raw: &[(String, String)], command: &str) -> Result<(), String> {
    for (name, _) in raw {
        let base = match options::indexed(name) {
            Some(Ok((_, base))) => base,
            _ => name.as_str(),
        };
        let Some(def) = options::find(base, command) else {
            return Err(format!(
                "option '--{name}' does not apply to command '{command}'"
            ));
        };
        if def.secret {
            return Err(format!(
                "option '--{name}' is a secret and is not taken from the command line, where \
                 other users can read it: set {name} in the config file (readable by its owner \
                 only) or in the environment variable {}",
                def.env_name()
            ));
        }
    }
    Ok(())
}

/// The config file as read: its path, its tables if it was read, warnings about it.
struct ConfigFile {
    path: PathBuf,
    table: Option<toml::Table>,
    warnings: Vec<String>,
}

/// The config file: --config, else PGSTRATA_CONFIG, else the default (optional).
fn read_config_file(
    raw: &[(String, String)],
    env: &HashMap<String, String>,
    command: &str,
) -> Result<ConfigFile, String> {
    let explicit = flag_or_env(raw, env, "config");
    let (path, required) = match explicit {
        Some(p) => (PathBuf::from(p), true),
        None => (
            PathBuf::from(
                options::find("config", command)
                    .and_then(|o| o.default)
                    .unwrap_or_default(),
            ),
            false,
        ),
    };
    let mut warnings = Vec::new();
    // The agent takes everything from the host that started it (its command line, or
    // the `run` frame): a config file here, perhaps of another user, is not its business.
    let table = if command == "agent" {
        None
    } else if path.exists() {
        let (table, warning) = load_config(&path)?;
        warnings.extend(warning);
        Some(table)
    } else if required {
        return Err(format!("config file {} does not exist", path.display()));
    } else {
        None
    };
    Ok(ConfigFile {
        path,
        table,
        warnings,
    })
}

/// Where option values come from, in order of precedence.
struct Sources<'a> {
    /// The command line's options.
    raw: &'a [(String, String)],
    env: &'a HashMap<String, String>,
    /// The config file's tables, if one was read.
    table: Option<&'a toml::Table>,
    config_path: &'a std::path::Path,
    /// The stanza, whose table of the config file comes before `[global]`.
    stanza: Option<&'a str>,
}

/// Resolved option values, validated and normalized.
type Values = (
    HashMap<&'static str, String>,
    HashMap<&'static str, Vec<String>>,
);

/// Every option of `command`, as repository `repo_index` sees it: from `sources`, else its
/// default; options of other commands as their defaults.
fn resolve_values(sources: &Sources, command: &str, repo_index: u8) -> Result<Values, String> {
    let mut values = HashMap::new();
    let mut sources_of = HashMap::new();
    let mut lists: HashMap<&'static str, Vec<String>> = HashMap::new();
    for def in options::OPTIONS.iter().filter(|o| o.applies_to(command)) {
        if def.kind == Kind::List {
            let vals: Vec<String> = sources
                .raw
                .iter()
                .filter(|(n, _)| n == def.name)
                .map(|(_, v)| v.clone())
                .collect();
            for v in &vals {
                def.validate(v, &format!("--{}", def.name))?;
            }
            lists.insert(def.name, vals);
            continue;
        }
        match find_value(sources, def, repo_index) {
            Some((v, source)) => {
                values.insert(def.name, def.validate(&v, &source)?);
                sources_of.insert(def.name, source);
            }
            None => {
                if let Some(d) = def.default_value() {
                    values.insert(def.name, d);
                }
            }
        }
    }
    // Options of other commands read as their defaults, so that settings are complete.
    for def in options::OPTIONS.iter().filter(|o| !o.applies_to(command)) {
        if let (Some(d), Some(_)) = (def.default_value(), options::unique(def.name)) {
            values.insert(def.name, d);
        }
    }
    if let (Some(level), Some(codec)) = (values.get("compress-level"), values.get("compress-type"))
    {
        options::check_compress_level(level, codec, &sources_of["compress-level"])?;
    }
    Ok((values, lists))
}

/// The value of `def` for repository `repo_index` and where it came from: the last
/// `--name`, the environment, the stanza's table, `[global]` (the last two only for options
/// the config file may set).
fn find_value(sources: &Sources, def: &OptionDef, repo_index: u8) -> Option<(String, String)> {
    // A repository option is read under this repository's names: repo-X or repo1-X for
    // repository 1, repoN-X for repository N.
    let names: Vec<String> = if options::is_repo_option(def.name) {
        let mut v = vec![options::repo_option_name(def.name, repo_index)];
        if repo_index == 1 {
            v.push(format!("repo1{}", &def.name["repo".len()..]));
        }
        v
    } else {
        vec![def.name.to_string()]
    };
    let from_flag = sources
        .raw
        .iter()
        .rev()
        .find(|(n, _)| names.contains(n))
        .map(|(n, v)| (v.clone(), format!("--{n}")));
    let from_env = || {
        names.iter().find_map(|n| {
            let e = options::env_name(n);
            sources.env.get(&e).map(|v| (v.clone(), e))
        })
    };
    let from_table = |section: &str| {
        let body = sources.table.and_then(|t| t.get(section))?;
        names.iter().find_map(|n| {
            body.get(n.as_str()).and_then(toml_value_string).map(|v| {
                (
                    v,
                    format!("{n} in [{section}] of {}", sources.config_path.display()),
                )
            })
        })
    };
    from_flag.or_else(from_env).or_else(|| {
        if def.scope == Scope::Config {
            sources
                .stanza
                .and_then(from_table)
                .or_else(|| from_table("global"))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    /// The agent runs as whatever user SSH logs in as, where the config file may belong
    /// to someone else (the Debian package's is postgres's, 0600): it never reads one.
    #[test]
    fn the_agent_reads_no_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "this is [not toml").unwrap();
        let env = HashMap::from([("PGSTRATA_CONFIG".to_string(), cfg.display().to_string())]);
        let inv = resolve(&argv("agent repo --repo-path=/srv/repo"), &env).unwrap();
        assert_eq!(inv.get("repo-path"), Some("/srv/repo"));
        assert!(inv.config_file.is_none());
        assert!(resolve(&argv("info --stanza=main"), &env).is_err());
    }

    #[test]
    fn a_stanza_name_that_is_not_letters_digits_dash_underscore_is_refused() {
        let env = HashMap::new();
        for bad in ["../../x", "a/b", ".", ""] {
            let e = resolve(&argv(&format!("--stanza={bad} info")), &env).unwrap_err();
            assert!(e.contains("is not allowed"), "{bad}: {e}");
        }
        let env = HashMap::from([("PGSTRATA_STANZA".to_string(), "../x".to_string())]);
        assert!(resolve(&argv("info"), &env).is_err());
        assert!(resolve(&argv("--stanza=main-2_b info"), &HashMap::new()).is_ok());
    }

    #[test]
    fn precedence_flag_env_stanza_global_default() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "[global]\nrepo-path = \"/g\"\nprocess-max = 3\ncompress-type = \"lz4\"\n[main]\nrepo-path = \"/s\"\n").unwrap();
        let mut env = HashMap::new();
        let base = format!("--config={} --stanza=main backup", cfg.display());
        let inv = resolve(&argv(&base), &env).unwrap();
        assert_eq!(inv.get("repo-path"), Some("/s"));
        assert_eq!(inv.get("process-max"), Some("3"));
        assert_eq!(inv.get("pg-port"), Some("5432"));
        env.insert("PGSTRATA_REPO_PATH".to_string(), "/e".to_string());
        assert_eq!(
            resolve(&argv(&base), &env).unwrap().get("repo-path"),
            Some("/e")
        );
        let inv = resolve(&argv(&format!("{base} --repo-path=/f")), &env).unwrap();
        assert_eq!(inv.get("repo-path"), Some("/f"));
        assert_eq!(inv.get("compress-type"), Some("lz4"));
    }

    #[test]
    fn numbered_repositories_come_from_repo_n_options_everywhere() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            "[global]\nrepo-path = \"/one\"\nrepo-retention-full = 2\n[main]\nrepo3-type = \"s3\"\nrepo3-s3-bucket = \"b\"\nrepo3-retention-full = 7\n",
        )
        .unwrap();
        let mut env = HashMap::new();
        env.insert("PGSTRATA_REPO2_PATH".to_string(), "/two".to_string());
        let base = format!("--config={} --stanza=main", cfg.display());
        let inv = resolve(&argv(&format!("{base} --repo4-path=/four info")), &env).unwrap();
        let views: Vec<(u8, Option<&str>)> = inv
            .repo_views()
            .map(|v| (v.repo_index, v.get("repo-path")))
            .collect();
        assert_eq!(
            views,
            [
                (1, Some("/one")),
                (2, Some("/two")),
                (3, Some("/var/lib/pgstrata")),
                (4, Some("/four"))
            ]
        );
        let three = inv.repo_views().find(|v| v.repo_index == 3).unwrap();
        assert_eq!(three.get("repo-type"), Some("s3"));
        assert_eq!(three.get("repo-s3-bucket"), Some("b"));
        // Retention is per repository; other options are shared.
        let expire = resolve(&argv(&format!("{base} --repo=3 expire")), &env).unwrap();
        assert_eq!(
            expire.selected_repo().unwrap().get("repo-retention-full"),
            Some("7")
        );
        assert_eq!(expire.get("repo-retention-full"), Some("2"));
        // repo1-X is repo-X.
        let one = resolve(&argv("--stanza=main --repo1-path=/x info"), &HashMap::new()).unwrap();
        assert_eq!(one.get("repo-path"), Some("/x"));
        assert!(one.other_repos.is_empty());
        // Out of range, unknown, not configured, secrets on the command line.
        let err = |a: &str| resolve(&argv(a), &HashMap::new()).map(|_| ()).unwrap_err();
        assert!(err("--stanza=m --repo5-path=/x info").contains("numbered 1 to 4"));
        assert!(err("--stanza=m --repo2-bogus=1 info")
            .contains("'repo-bogus' is not a repository option"));
        assert!(err("--stanza=m --repo2-s3-key=k info").contains("secret"));
        let inv = resolve(&argv("--stanza=m --repo=2 info"), &HashMap::new()).unwrap();
        assert!(inv
            .selected_repo()
            .unwrap_err()
            .contains("repository 2 is not configured"));
    }

    #[test]
    fn bad_input_is_refused_with_the_option_name() {
        let env = HashMap::new();
        for (args, says) in [
            ("--stanza=x --bogus=1 backup", &["--bogus"][..]),
            (
                "--stanza=x --compress-type=rar backup",
                &["compress-type", "zst"],
            ),
            ("--stanza=x --process-max=0 backup", &["process-max"]),
            ("--stanza=x --target=x backup", &["does not apply"]),
        ] {
            let e = resolve(&argv(args), &env).unwrap_err();
            assert!(says.iter().all(|s| e.contains(s)), "{args}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        let refused_config = |toml: &str| {
            std::fs::write(&cfg, toml).unwrap();
            let args = format!("--config={} --stanza=x info", cfg.display());
            resolve(&argv(&args), &env).unwrap_err()
        };
        let e = refused_config("[global]\nrepo-paht = \"/g\"\n");
        assert!(e.contains("repo-paht"), "{e}");
        let e = refused_config("[global\nrepo-path = 1");
        assert!(e.contains("not valid TOML"), "{e}");
    }

    #[test]
    fn secrets_come_only_from_the_config_file_or_the_environment() {
        let mut env = HashMap::new();
        for name in [
            "repo-s3-key-secret",
            "repo-s3-key",
            "repo-azure-key",
            "repo-gcs-key",
        ] {
            let e = resolve(&argv(&format!("--stanza=x --{name}=hunter2 info")), &env).unwrap_err();
            let var = format!("PGSTRATA_{}", name.to_uppercase().replace('-', "_"));
            assert!(
                e.contains("config file") && e.contains(&var) && !e.contains("hunter2"),
                "{e}"
            );
        }
        env.insert("PGSTRATA_REPO_S3_KEY_SECRET".into(), "from-env".into());
        let inv = resolve(&argv("--stanza=x info"), &env).unwrap();
        assert_eq!(inv.get("repo-s3-key-secret"), Some("from-env"));

        // In a file others can read: a warning naming the file, the secret and the fix.
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "[main]\nrepo-s3-key-secret = \"hunter2\"\n").unwrap();
        let args = argv(&format!("--config={} --stanza=main info", cfg.display()));
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
        let inv = resolve(&args, &HashMap::new()).unwrap();
        assert_eq!(inv.get("repo-s3-key-secret"), Some("hunter2"));
        let [w] = inv.warnings.as_slice() else {
            panic!("one warning: {:?}", inv.warnings)
        };
        assert!(
            w.contains("repo-s3-key-secret") && w.contains("chmod 600") && w.contains("0644"),
            "{w}"
        );
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(resolve(&args, &HashMap::new()).unwrap().warnings.is_empty());
        // No secrets, no warning.
        std::fs::write(&cfg, "[main]\nrepo-path = \"/r\"\n").unwrap();
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(resolve(&args, &HashMap::new()).unwrap().warnings.is_empty());
    }

    #[test]
    fn compress_level_is_checked_against_the_codec() {
        let env = HashMap::new();
        let ok = |a: &str| resolve(&argv(a), &env);
        assert!(ok("--stanza=x --compress-type=zst --compress-level=19 backup").is_ok());
        assert!(ok("--stanza=x --compress-type=zst --compress-level=-5 backup").is_ok());
        let e = ok("--stanza=x --compress-type=gz --compress-level=19 backup").unwrap_err();
        assert!(
            e.contains("compress-level") && e.contains("gz") && e.contains("0 to 9"),
            "{e}"
        );
        // Default codec (zst) with a level it has; and one no codec has.
        assert!(ok("--stanza=x --compress-level=22 backup").is_ok());
        let e = ok("--stanza=x --compress-level=40 backup").unwrap_err();
        assert!(e.contains("bz2 1 to 9"), "{e}");
    }

    #[test]
    fn every_default_is_an_allowed_value() {
        for o in crate::options::OPTIONS {
            o.default_value(); // panics naming the option otherwise
        }
    }

    #[test]
    fn docs_match_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/options.md");
        let docs = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            docs == crate::options::reference_markdown(),
            "docs/options.md is stale: run `cargo run -q -p pgstrata -- help options > docs/options.md`"
        );
    }

    /// The example configuration the Debian package installs as /etc/pgstrata/pgstrata.toml
    /// parses as it ships (all commented out), and with every commented setting switched on
    /// (so each names a real option with an allowed value).
    #[test]
    fn the_packaged_example_configuration_is_valid() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/pgstrata.toml");
        let example = std::fs::read_to_string(path).unwrap();
        let is_setting = |l: &str| {
            (l.starts_with('[') && l.ends_with(']'))
                || l.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
                })
        };
        let switched_on: String = example
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(setting) if is_setting(setting) => format!("{setting}\n"),
                _ => format!("{l}\n"),
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let on = dir.path().join("on.toml");
        std::fs::write(&on, &switched_on).unwrap();
        let env = HashMap::new();
        for command in ["backup", "stanza-create", "verify"] {
            let shipped = resolve(
                &argv(&format!("--config={path} --stanza=main {command}")),
                &env,
            );
            assert!(shipped.is_ok(), "{command}: {:?}", shipped.err());
            let inv = resolve(
                &argv(&format!(
                    "--config={} --stanza=main {command}",
                    on.display()
                )),
                &env,
            )
            .unwrap_or_else(|e| panic!("{command}, every setting on: {e}\n{switched_on}"));
            assert_eq!(inv.get("repo-type"), Some("s3"), "{switched_on}");
            if command == "backup" {
                assert_eq!(inv.get("pg-path"), Some("/var/lib/postgresql/15/main"));
                assert_eq!(inv.get("repo-retention-full"), Some("2"));
            }
        }
    }
}
