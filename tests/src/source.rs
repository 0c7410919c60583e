//! The workspace's own source, read as files: its functions' lengths and its modules' uses, for
//! the rules `tests/tests/source.rs` keeps.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a function may be, in lines as its file shows it.
pub const LONGEST: usize = 60;

/// The workspace's root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Every `.rs` file under `dir`, recursively, sorted.
pub fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// A test module in a file of its own (`tests.rs`): exempt from the length rule, and no part
/// of the layers.
pub fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
}

/// The text with comments, strings and character literals blanked out (newlines kept), so
/// braces and paths inside them do not count.
pub fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let end = if rest.starts_with(&['/', '/']) {
            i + rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            block_comment_end(&chars, i)
        } else if let Some(end) = raw_string_end(&chars, i) {
            end
        } else if rest[0] == '"' {
            quoted_end(&chars, i, '"')
        } else if rest[0] == '\'' && is_char_literal(rest) {
            quoted_end(&chars, i, '\'')
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        out.extend(
            chars[i..end]
                .iter()
                .map(|&c| if c == '\n' { '\n' } else { ' ' }),
        );
        i = end;
    }
    out
}

fn block_comment_end(chars: &[char], start: usize) -> usize {
    let (mut depth, mut i) = (0, start);
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => (depth, i) = (depth + 1, i + 2),
            ('*', '/') => {
                (depth, i) = (depth - 1, i + 2);
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// `r"…"`, `r#"…"#`, `br"…"` and so on, when one starts at `start` (and not inside a name).
fn raw_string_end(chars: &[char], start: usize) -> Option<usize> {
    if start > 0 && (chars[start - 1].is_alphanumeric() || chars[start - 1] == '_') {
        return None;
    }
    let mut i = start + usize::from(chars[start] == 'b');
    if chars.get(i) != Some(&'r') {
        return None;
    }
    i += 1;
    let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
    i += hashes;
    if chars.get(i) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let after = chars[i + 1..]
        .windows(closing.len())
        .position(|w| w == closing.as_slice())?;
    Some(i + 1 + after + closing.len())
}

/// A quoted literal from `start` to past its closing `quote`, escapes skipped.
fn quoted_end(chars: &[char], start: usize, quote: char) -> usize {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// `'x'` or `'\n'`, not a lifetime (`'a`).
fn is_char_literal(rest: &[char]) -> bool {
    match rest.get(1) {
        Some('\\') => true,
        Some(_) => rest.get(2) == Some(&'\''),
        None => false,
    }
}

/// Each function of a file whose body ends more than [`LONGEST`] lines after its `fn` line:
/// `(line of fn, name, lines)`.
pub fn long_functions(text: &str) -> Vec<(usize, String, usize)> {
    let code = code_only(text);
    let starts: Vec<usize> = std::iter::once(0)
        .chain(code.match_indices('\n').map(|(at, _)| at + 1))
        .collect();
    let line_of = |at: usize| starts.partition_point(|&s| s <= at);
    let mut long = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(end) = body_end(&code, at).filter(|_| !name.is_empty()) else {
            continue;
        };
        let lines = line_of(end) - line_of(at) + 1;
        if lines > LONGEST {
            long.push((line_of(at), name, lines));
        }
    }
    long
}

/// Where the body of the function declared at `at` closes; `None` for a declaration without a
/// body (`fn f();` in a trait).
fn body_end(code: &str, at: usize) -> Option<usize> {
    let open = at + code[at..].find(['{', ';'])?;
    if code[open..].starts_with(';') {
        return None;
    }
    let mut depth = 0;
    for (offset, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + offset);
                }
            }
            _ => {}
        }
    }
    None
}

/// Module node → the nodes it uses.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// How a crate's modules are read as nodes.
pub struct Layout<'a> {
    /// The crate's `src`.
    pub src: PathBuf,
    /// Folders that group modules by concern: a module inside one is a node of its own
    /// (`calls::broker`); any other module is one node with everything below it.
    pub groups: &'a [&'a str],
    /// The binary's own top-level modules (`main`, …): not part of the library's layers.
    pub binary: &'a [&'a str],
}

impl Layout<'_> {
    /// The node a module path belongs to (`calls::broker::serve` → `calls::broker`).
    fn node(&self, path: &[String]) -> Option<String> {
        let first = path.first()?;
        match path.get(1) {
            Some(second) if self.groups.contains(&first.as_str()) => {
                Some(format!("{first}::{second}"))
            }
            _ => Some(first.clone()),
        }
    }

    /// Every node and the nodes its code uses: `crate::…` and `super::…` paths (braced lists
    /// included) outside comments, literals and test modules. An item the crate root re-exports
    /// (`pub use module::Item`) counts as a use of its module; one the root defines, of `lib`.
    pub fn uses(&self) -> Graph {
        let lib = std::fs::read_to_string(self.src.join("lib.rs")).unwrap();
        let root = Root::read(&lib);
        let mut graph = Graph::new();
        for path in sources(&self.src) {
            let module = module_of(path.strip_prefix(&self.src).unwrap());
            let binary = module.len() == 1 && self.binary.contains(&module[0].as_str());
            if binary || is_test_file(&path) || module == ["lib"] {
                continue;
            }
            let Some(from) = self.node(&module) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).unwrap();
            let code = code_only(text.split("#[cfg(test)]").next().unwrap());
            let used = graph.entry(from.clone()).or_default();
            for path in used_paths(&code, &module) {
                match self.node(&root.resolve(path)) {
                    Some(to) if to != from => {
                        used.insert(to);
                    }
                    _ => {}
                }
            }
        }
        graph
    }
}

/// What the crate root says of the names it holds: its modules, the names it re-exports
/// (`pub use calls::broker;`, `pub use crd::{Composition, …};`) with the paths they stand for, and
/// the items it defines itself (which stand for `lib`).
struct Root {
    modules: BTreeSet<String>,
    names: BTreeMap<String, Vec<String>>,
}

impl Root {
    fn read(lib: &str) -> Self {
        let mut root = Self {
            modules: BTreeSet::new(),
            names: BTreeMap::new(),
        };
        for line in code_only(lib).lines().map(str::trim) {
            let word = |rest: &str| -> String {
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            if let Some(path) = line.strip_prefix("pub use ") {
                let path = path.trim_end_matches(';');
                let (module, items) = path.split_once("::{").unwrap_or((path, ""));
                if items.is_empty() {
                    let segments: Vec<String> = module.split("::").map(str::to_owned).collect();
                    root.names
                        .insert(segments.last().unwrap().clone(), segments);
                    continue;
                }
                for item in items.trim_end_matches('}').split(',').map(str::trim) {
                    let segments = module.split("::").chain([item]).map(str::to_owned);
                    root.names.insert(item.to_owned(), segments.collect());
                }
            } else if let Some(module) = ["pub mod ", "pub(crate) mod ", "mod "]
                .iter()
                .find_map(|k| line.strip_prefix(k))
            {
                root.modules.insert(word(module));
            } else if let Some(item) = ["pub enum ", "pub struct ", "pub type ", "pub fn "]
                .iter()
                .find_map(|k| line.strip_prefix(k))
            {
                root.names.insert(word(item), vec!["lib".to_owned()]);
            }
        }
        root
    }

    /// The path a use names, re-exports followed (`crate::Atom` → `coordination::atom::Atom`).
    fn resolve(&self, mut path: Vec<String>) -> Vec<String> {
        // Each step replaces a re-exported name by what it stands for; a few are enough.
        for _ in 0..4 {
            let Some(first) = path.first().filter(|first| !self.modules.contains(*first)) else {
                break;
            };
            let Some(target) = self.names.get(first) else {
                break;
            };
            path = target.iter().chain(&path[1..]).cloned().collect();
        }
        path
    }
}

/// The module path of a source file: `calls/broker/mod.rs` → `calls::broker`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|part| part.to_str().unwrap().to_owned())
        .collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    path
}

/// The paths at the start of `text`, and how much of it they take: `a::b::C` → `a::b::C`;
/// `a::{b, c::{d, *}}` → `a::b`, `a::c::d`, `a::c`.
fn tails(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut at = 0;
    let mut prefix: Vec<String> = Vec::new();
    loop {
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            if !text[at..].starts_with('{') {
                return (vec![prefix], at);
            }
            let (inner, taken) = list(&text[at + 1..]);
            let all = inner
                .into_iter()
                .map(|tail| prefix.iter().cloned().chain(tail).collect())
                .collect();
            return (all, at + 1 + taken);
        }
        at += name.len();
        if name != "self" {
            prefix.push(name);
        }
        if !text[at..].starts_with("::") {
            return (vec![prefix], at);
        }
        at += 2;
    }
}

/// The paths of a braced list after its `{`, and how much of the text they take with the `}`.
fn list(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut found = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        at += rest.len() - rest.trim_start_matches([' ', '\n', ',']).len();
        if text[at..].starts_with('}') {
            return (found, at + 1);
        }
        let (paths, taken) = tails(&text[at..]);
        found.extend(paths);
        // `*` (or anything not a path) takes one character.
        at += taken.max(1);
    }
    (found, at)
}

/// The absolute paths `code` (of the module at `module`) uses.
pub fn used_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = code[from..].find(['c', 's']) {
        let at = from + offset;
        from = at + 1;
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[at..];
        let (base, rest) = if let Some(rest) = rest.strip_prefix("crate::") {
            (Vec::new(), rest)
        } else if rest.starts_with("super::") {
            let mut base = module.to_vec();
            let mut rest = rest;
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            (base, rest)
        } else {
            continue;
        };
        for tail in tails(rest).0 {
            found.push(base.iter().cloned().chain(tail).collect());
        }
    }
    found
}

/// The same uses between the top-level groups and modules.
pub fn groups(graph: &Graph) -> Graph {
    let top = |node: &str| node.split("::").next().unwrap().to_owned();
    let mut collapsed = Graph::new();
    for (from, used) in graph {
        let entry = collapsed.entry(top(from)).or_default();
        entry.extend(used.iter().map(|to| top(to)).filter(|to| *to != top(from)));
    }
    collapsed
}

/// Whether `from` uses `to`, directly or through others.
pub fn reaches(graph: &Graph, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(at) = stack.pop() {
        if at == to {
            return true;
        }
        if seen.insert(at.clone()) {
            stack.extend(graph.get(&at).into_iter().flatten().cloned());
        }
    }
    false
}

/// Every use that closes a circle, as `from → to`.
pub fn cycles(graph: &Graph) -> Vec<String> {
    graph
        .iter()
        .flat_map(|(from, used)| used.iter().map(move |to| (from, to)))
        .filter(|(from, to)| reaches(graph, to, from))
        .map(|(from, to)| format!("{from} → {to}"))
        .collect()
}
