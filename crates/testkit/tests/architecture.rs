//! The workspace's layering, checked on its sources: no function over 100 lines outside
//! tests, and no import cycle between the modules of any crate.
//!
//! It reads the sources as text (no parser beyond what these two rules need), so it runs
//! in `cargo test --workspace` without tools of its own. Test code is left out: files named
//! `tests.rs` or under a `tests/` directory, and every item behind `#[cfg(test)]`.
//!
//! Modules are found from files: `src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs` is
//! `a::b`. A module depends on another where it names it with a path from `crate::`,
//! `super::` or `self::`, in a `use` or in code (a name the crate root or a directory module
//! re-exports with `pub use` is followed to the module that defines it). A directory module
//! is one unit seen from outside: an edge between two modules counts between their
//! ancestors that are siblings (`a::b` using `c::d` is `a` using `c`), and a module and its
//! own submodules may use each other (a directory's `mod.rs` holds what its files share).
//! Cycles are looked for among the children of every module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Functions longer than this, in lines from `fn` to its closing brace, are refused.
const MAX_FUNCTION_LINES: usize = 100;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every crate's source directory: `crates/*/src` and `bench/src`.
fn source_dirs() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.unwrap().path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.push(root.join("bench/src"));
    dirs.sort();
    dirs
}

/// The `.rs` files under `dir` that are not test code, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            if p.is_dir() {
                if name != "tests" {
                    todo.push(p);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The index of the line closing the item opened at `start` (the first line after it at
/// the same indentation that starts with `}`), or the last line.
fn item_end(lines: &[&str], start: usize) -> usize {
    let ind = indent(lines[start]);
    (start + 1..lines.len())
        .find(|&k| indent(lines[k]) == ind && lines[k].trim_start().starts_with('}'))
        .unwrap_or(lines.len().saturating_sub(1))
}

/// `lines` without the items behind `#[cfg(test)]` (each replaced by empty lines, so line
/// numbers stay).
fn without_tests<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    let mut out = lines.to_vec();
    let mut i = 0;
    while i < out.len() {
        if out[i].trim() == "#[cfg(test)]" && i + 1 < out.len() {
            let item = i + 1;
            let end = if out[item].trim_end().ends_with(';') {
                item
            } else {
                item_end(&out, item)
            };
            for l in &mut out[i..=end] {
                *l = "";
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The name of the function a line starts, if it starts one with a body: `fn`, after
/// `pub`/`pub(…)`, `const`, `async`, `unsafe` in that order.
fn function_name(line: &str) -> Option<&str> {
    if line.trim_end().ends_with(';') {
        return None;
    }
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        if let Some(r) = r.strip_prefix(' ') {
            rest = r;
        } else if r.starts_with('(') {
            rest = r[r.find(')')? + 1..].strip_prefix(' ')?;
        } else {
            return None;
        }
    }
    for word in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(word).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The functions over `max` lines in `text`: (first line, name, lines).
fn long_functions(text: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.split('\n').collect();
    let lines = without_tests(&lines);
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = function_name(line) {
            let n = item_end(&lines, i) - i + 1;
            if n > max {
                out.push((i + 1, name.to_string(), n));
            }
        }
    }
    out
}

#[test]
fn no_function_is_over_100_lines_outside_tests() {
    let root = workspace_root().canonicalize().unwrap();
    let mut long = Vec::new();
    for dir in source_dirs() {
        for f in rust_files(&dir) {
            let text = std::fs::read_to_string(&f).unwrap();
            let shown = f.canonicalize().unwrap();
            let shown = shown.strip_prefix(&root).unwrap().display().to_string();
            for (line, name, n) in long_functions(&text, MAX_FUNCTION_LINES) {
                long.push(format!("{shown}:{line} {name} ({n} lines)"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "{} functions over {MAX_FUNCTION_LINES} lines; split each into named steps:\n{}",
        long.len(),
        long.join("\n")
    );
}

// ------------------------------------------------------------------------------ imports

/// A module's path in its crate (`""` the crate root), from its file.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

fn parent(module: &str) -> &str {
    module.rsplit_once("::").map_or("", |(p, _)| p)
}

fn join(module: &str, name: &str) -> String {
    if module.is_empty() {
        name.to_string()
    } else {
        format!("{module}::{name}")
    }
}

/// The paths a `use` tree names, braces expanded: `a::{b, c::{d, e}}` gives `a::b`,
/// `a::c::d`, `a::c::e` (`self` inside braces is the prefix itself).
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = Vec::new();
    expand_into("", &tree, &mut out);
    out
}

fn expand_into(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let Some(open) = tree.find('{') else {
        let path = tree.split("as").next().unwrap_or(tree);
        let path = path.strip_suffix("::self").unwrap_or(path);
        out.push(format!("{prefix}{path}"));
        return;
    };
    let head = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut depth = 0;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        if item == "self" {
            out.push(format!("{prefix}{}", head.trim_end_matches("::")));
        } else {
            expand_into(&format!("{prefix}{head}"), item, out);
        }
    }
}

/// One module's source, as the import check reads it.
struct ModuleSource {
    /// Paths it names from `crate::`, `super::` or `self::`, as written.
    paths: Vec<String>,
    /// Names it re-exports with `pub use` (any visibility), and the path each comes from.
    reexports: BTreeMap<String, String>,
}

/// `text` without comments and string literals (their insides blanked), lines kept.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_str, mut block) = (false, 0);
    while let Some(c) = chars.next() {
        if block > 0 {
            if c == '*' && chars.peek() == Some(&'/') {
                chars.next();
                block -= 1;
            } else if c == '/' && chars.peek() == Some(&'*') {
                chars.next();
                block += 1;
            }
            if c == '\n' {
                out.push('\n');
            }
            continue;
        }
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                '\n' => out.push('\n'),
                _ => {}
            }
            continue;
        }
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                block = 1;
            }
            '"' => {
                in_str = true;
                out.push('"');
            }
            // A char literal holding a quote ('"') would open a string.
            '\'' if chars.peek() == Some(&'"') => {
                chars.next();
                out.push_str("' '");
            }
            _ => out.push(c),
        }
    }
    out
}

fn read_module(text: &str) -> ModuleSource {
    let code = code_only(text);
    let lines: Vec<&str> = code.split('\n').collect();
    let code = without_tests(&lines).join("\n");
    let mut paths = Vec::new();
    let mut reexports = BTreeMap::new();
    // `use` statements (braces expanded), then paths in code.
    let mut rest_of_code = String::with_capacity(code.len());
    let mut pos = 0;
    while let Some(found) = find_use(&code, pos) {
        let (start, tree_start, public) = found;
        let end = code[tree_start..]
            .find(';')
            .map_or(code.len(), |e| tree_start + e);
        rest_of_code.push_str(&code[pos..start]);
        for path in expand_use(&code[tree_start..end]) {
            if public {
                let name = path.rsplit("::").next().unwrap_or(&path).to_string();
                reexports.insert(name, path.clone());
            }
            if ["crate::", "super::", "self::"]
                .iter()
                .any(|p| path.starts_with(p))
            {
                paths.push(path);
            }
        }
        pos = end;
    }
    rest_of_code.push_str(&code[pos..]);
    for (i, _) in rest_of_code.match_indices("::") {
        let before = &rest_of_code[..i];
        let word_start = before
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |k| k + 1);
        let path_start = &rest_of_code[word_start..];
        if word_start < i
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|p| path_start.starts_with(p))
            && i == word_start + path_start.find("::").unwrap()
        {
            let len = path_start
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(path_start.len());
            paths.push(path_start[..len].trim_end_matches(':').to_string());
        }
    }
    ModuleSource { paths, reexports }
}

/// The next `use` statement at or after `from`: where it starts, where its tree starts,
/// and whether it re-exports (`pub use`, `pub(crate) use`).
fn find_use(code: &str, from: usize) -> Option<(usize, usize, bool)> {
    let mut at = from;
    loop {
        let i = at + code[at..].find("use ")?;
        let line_start = code[..i].rfind('\n').map_or(0, |k| k + 1);
        let before = code[line_start..i].trim();
        let public = before.starts_with("pub");
        if before.is_empty() || (public && before.ends_with(['b', ')'])) {
            return Some((line_start, i + 4, public));
        }
        at = i + 4;
    }
}

/// A crate's modules and the modules each one uses.
struct Crate {
    modules: BTreeMap<String, ModuleSource>,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let modules = rust_files(src)
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(&f).unwrap();
                (module_of(src, &f), read_module(&text))
            })
            .collect();
        Crate { modules }
    }

    /// The module a path written in `from` names: its longest prefix that is a module,
    /// followed through re-exports; `None` outside the crate.
    fn resolve(&self, from: &str, path: &str) -> Option<String> {
        let mut segments = path.split("::");
        let mut module = match segments.next()? {
            "crate" => String::new(),
            "self" => from.to_string(),
            "super" => parent(from).to_string(),
            _ => return None,
        };
        let mut rest: Vec<&str> = segments.collect();
        while rest.first() == Some(&"super") {
            module = parent(&module).to_string();
            rest.remove(0);
        }
        self.resolve_in(module, &rest, 0)
    }

    fn resolve_in(&self, mut module: String, rest: &[&str], depth: usize) -> Option<String> {
        let mut i = 0;
        while i < rest.len() && self.modules.contains_key(&join(&module, rest[i])) {
            module = join(&module, rest[i]);
            i += 1;
        }
        // A name the module re-exports: the module that defines it.
        if let (Some(name), true) = (rest.get(i), depth < 8) {
            if let Some(source) = self
                .modules
                .get(&module)
                .and_then(|m| m.reexports.get(*name))
            {
                let target = self.resolve(&module, source).or_else(|| {
                    // A re-export by a relative path (`pub use error::Error`).
                    let parts: Vec<&str> = source.split("::").collect();
                    self.resolve_in(module.clone(), &parts, depth + 1)
                });
                if let Some(t) = target.filter(|t| *t != module) {
                    return Some(t);
                }
            }
        }
        Some(module)
    }

    /// The edges between sibling modules: `(parent, from, to)` for every use of `to`'s
    /// unit by `from`'s, both children of `parent`.
    fn sibling_edges(&self) -> BTreeSet<(String, String, String)> {
        let mut edges = BTreeSet::new();
        for (from, m) in &self.modules {
            for path in &m.paths {
                let Some(to) = self.resolve(from, path) else {
                    continue;
                };
                let (a, b): (Vec<&str>, Vec<&str>) = (
                    from.split("::").filter(|s| !s.is_empty()).collect(),
                    to.split("::").filter(|s| !s.is_empty()).collect(),
                );
                let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
                // A module and its own ancestors or submodules: one unit.
                if common == a.len() || common == b.len() {
                    continue;
                }
                let parent = a[..common].join("::");
                edges.insert((
                    parent.clone(),
                    join(&parent, a[common]),
                    join(&parent, b[common]),
                ));
            }
        }
        edges
    }
}

/// The cycles of a directed graph, one per strongly connected component of more than one
/// node (its nodes, sorted).
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(n) = todo.pop() {
            for &m in &next[n] {
                if seen.insert(m) {
                    todo.push(m);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&n| (n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for &n in next.keys() {
        if !reached[n].contains(n) {
            continue;
        }
        let mut component: Vec<String> = reached[n]
            .iter()
            .filter(|m| reached[*m].contains(n))
            .map(|m| m.to_string())
            .collect();
        component.sort();
        if !out.contains(&component) {
            out.push(component);
        }
    }
    out
}

/// The import cycles of the crate at `src`, each shown with the edges that make it.
fn import_cycles(src: &Path) -> Vec<String> {
    let krate = Crate::read(src);
    let edges = krate.sibling_edges();
    let mut by_parent: BTreeMap<&str, BTreeSet<(String, String)>> = BTreeMap::new();
    for (parent, a, b) in &edges {
        by_parent
            .entry(parent)
            .or_default()
            .insert((a.clone(), b.clone()));
    }
    let mut out = Vec::new();
    for siblings in by_parent.values() {
        for cycle in cycles(siblings) {
            let used: Vec<String> = siblings
                .iter()
                .filter(|(a, b)| cycle.contains(a) && cycle.contains(b))
                .map(|(a, b)| format!("{a} -> {b}"))
                .collect();
            out.push(format!("{{{}}}: {}", cycle.join(", "), used.join(", ")));
        }
    }
    out
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let root = workspace_root().canonicalize().unwrap();
    let mut found = Vec::new();
    for src in source_dirs() {
        let name = src
            .canonicalize()
            .unwrap()
            .strip_prefix(&root)
            .unwrap()
            .display()
            .to_string();
        for cycle in import_cycles(&src) {
            found.push(format!("{name}: {cycle}"));
        }
    }
    assert!(
        found.is_empty(),
        "import cycles between modules (module -> module it uses):\n{}",
        found.join("\n")
    );
}

// ------------------------------------------------------------------- the checks checked

#[test]
fn long_functions_are_counted_from_fn_to_closing_brace_and_tests_are_left_out() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let text = format!(
        "pub(crate) async fn long() {{\n{}}}\n\nfn short() {{\n{}}}\n\n#[cfg(test)]\nmod tests {{\n    fn in_tests() {{\n{}    }}\n}}\n",
        body(100),
        body(98),
        body(200)
    );
    assert_eq!(
        long_functions(&text, 100),
        vec![(1, "long".to_string(), 102)]
    );
    assert_eq!(function_name("    fn declared(&self);"), None);
    assert_eq!(function_name("    pub unsafe fn f<T>()"), Some("f"));
}

#[test]
fn use_trees_expand_and_paths_in_code_are_found() {
    assert_eq!(
        expand_use("crate::{a::X, b::{self, Y as Z}, c}"),
        vec!["crate::a::X", "crate::b", "crate::b::Y", "crate::c"]
    );
    let m = read_module(
        "use crate::a::{X, Y};\npub use b::Thing;\n// crate::comment::Not\nfn f() { super::c::g(\"crate::s::Not\"); }\n#[cfg(test)]\nmod tests {\n    use crate::t::T;\n}\n",
    );
    assert_eq!(m.paths, vec!["crate::a::X", "crate::a::Y", "super::c::g"]);
    assert_eq!(
        m.reexports.get("Thing").map(String::as_str),
        Some("b::Thing")
    );
}

#[test]
fn a_cycle_is_found_between_siblings_and_not_between_a_directory_and_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "mod a;\nmod b;\nmod d;\npub use d::Error;\n");
    // A directory module and its files use each other: allowed.
    write("a/mod.rs", "mod x;\nuse self::x::f;\npub struct S;\n");
    write(
        "a/x.rs",
        "use super::S;\nuse crate::Error;\npub fn f() {}\n",
    );
    write("d.rs", "pub struct Error;\n");
    write("b.rs", "pub fn g() {}\n");
    assert_eq!(import_cycles(dir.path()), Vec::<String>::new());
    // A file of `a` using `b`, and `b` using `a` (its directory module): a cycle.
    write("a/x.rs", "use super::S;\nuse crate::b::g;\npub fn f() {}\n");
    write("b.rs", "pub fn g() { crate::a::S; }\n");
    assert_eq!(import_cycles(dir.path()), vec!["{a, b}: a -> b, b -> a"]);
}
