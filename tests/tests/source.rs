//! Rules of the workspace's own source, read from the files as they are:
//! - no function of `agent/`, `operator/` or `context/` is longer than 60 lines as the file shows
//!   it: from its `fn` line to its closing brace, comments and blank lines included, test
//!   functions of inline `#[cfg(test)]` modules included (clippy's `too_many_lines` counts only
//!   lines of code, so it lets longer ones through); test files (`tests.rs`, `tests/`) are exempt;
//! - no module of the operator or of toa-context uses a module that uses it (the agent keeps its
//!   own, finer rules in `agent/tests/layers.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LONGEST: usize = 60;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
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

/// The text with comments, strings and character literals blanked out (newlines kept), so
/// braces and `crate::` inside them do not count.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
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
        chars[i..end].iter().for_each(|&c| blank(&mut out, c));
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
fn long_functions(text: &str) -> Vec<(usize, String, usize)> {
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
        if name.is_empty() {
            continue;
        }
        let Some(end) = body_end(&code, at) else {
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

fn exempt(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
}

#[test]
fn the_count_is_the_files_own() {
    let twenty = "    let x = 1;\n".repeat(20);
    let blanks = "\n// a comment { with a brace\n".repeat(30);
    let text = format!(
        "fn short() {{}}\n\n#[cfg(test)]\nmod tests {{\n    fn long() {{\n        let s = \"}}\";\n        \
         let r = r#\"}}\"#;\n        let c = '}}';\n{twenty}{blanks}    }}\n}}\nfn f<'a>(x: &'a str) {{}}\n"
    );
    let long = long_functions(&text);
    // `long` spans its `fn` line, 3 lines of literals, 20 of code, 60 blank or comment lines and
    // its brace: 85, though clippy would see 25.
    assert_eq!(long, vec![(5, "long".to_owned(), 85)]);
}

#[test]
fn no_function_is_longer_than_60_lines() {
    let root = workspace();
    let mut seen = 0;
    let mut long = Vec::new();
    for krate in ["agent", "operator", "context"] {
        for path in sources(&root.join(krate).join("src")) {
            if exempt(&path) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            seen += text.matches("fn ").count();
            for (line, name, lines) in long_functions(&text) {
                let file = path.strip_prefix(&root).unwrap().display();
                long.push(format!("{file}:{line} {name}: {lines} lines"));
            }
        }
    }
    assert!(seen > 500, "read the sources: {seen} functions");
    assert!(
        long.is_empty(),
        "functions longer than {LONGEST} lines (split them into named steps, or move a long test \
         to a tests.rs file):\n{}",
        long.join("\n")
    );
}

/// Top-level module of a crate → the top-level modules its code uses (`crate::<module>`, or an
/// item the crate root re-exports from it); comments and test modules do not count.
fn uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let reexports = reexports(&lib);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in sources(src) {
        let relative = path.strip_prefix(src).unwrap().to_str().unwrap().to_owned();
        let module = relative.trim_end_matches(".rs").split('/').next().unwrap();
        if matches!(module, "main" | "bin") || exempt(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = code_only(text.split("#[cfg(test)]").next().unwrap());
        let used = graph.entry(module.to_owned()).or_default();
        for name in crate_paths(&code) {
            let target = reexports.get(&name).cloned().unwrap_or(name);
            if target != module {
                used.insert(target);
            }
        }
    }
    graph
}

/// The first segment of every `crate::…` path, `crate::{a, b::c}` giving `a` and `b`.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let inside = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(inside.split(',').map(ident));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// Items the crate root re-exports (`pub use module::{A, B};`) → their module; items the root
/// defines itself map to `lib`.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in code_only(lib).lines() {
        if let Some(path) = line.trim().strip_prefix("pub use ") {
            let (module, items) = path.split_once("::").unwrap_or((path, ""));
            let items = items.trim_end_matches(';').trim_matches(['{', '}']);
            for item in items.split(',') {
                map.insert(item.trim().to_owned(), module.to_owned());
            }
        } else if let Some(item) = ["pub enum ", "pub struct ", "pub type ", "pub fn "]
            .iter()
            .find_map(|k| line.strip_prefix(k))
        {
            let name: String = item
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            map.insert(name, "lib".to_owned());
        }
    }
    map
}

fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
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

fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    graph
        .iter()
        .flat_map(|(from, used)| used.iter().map(move |to| (from, to)))
        .filter(|(from, to)| reaches(graph, to, from))
        .map(|(from, to)| format!("{from} → {to}"))
        .collect()
}

#[test]
fn no_module_of_the_operator_uses_one_that_uses_it() {
    let graph = uses(&workspace().join("operator/src"));
    assert!(
        graph["controller"].contains("observed") && graph["desired"].contains("names"),
        "sees the uses: {graph:?}"
    );
    assert!(
        graph["names"].is_empty(),
        "the vocabulary is at the bottom: {graph:?}"
    );
    assert_eq!(cycles(&graph), Vec::<String>::new(), "{graph:?}");
}

#[test]
fn no_module_of_the_context_uses_one_that_uses_it() {
    let graph = uses(&workspace().join("context/src"));
    assert!(
        graph["annotations"].contains("address"),
        "sees the uses: {graph:?}"
    );
    assert_eq!(cycles(&graph), Vec::<String>::new(), "{graph:?}");
}

#[test]
fn a_cycle_is_seen() {
    let graph = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
        ("d".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(cycles(&graph), ["a → b", "b → c", "c → a"]);
    let paths = crate_paths(&code_only(
        "use crate::{x, y::Z};\nlet v = crate::w::f(); // crate::no\nlet s = \"crate::nor\";",
    ));
    assert_eq!(paths, ["x", "y", "w"]);
}
