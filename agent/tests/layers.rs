//! The agent's modules form layers: no module of `agent/src` reaches back to one that uses it.
//! Read from the sources: every `crate::<path>` and `super::<path>` (braced lists included) in
//! the code outside the tests and the comments counts as a use. A node is a module inside a group
//! (`calls::broker`, `coordination::atom`, ...) or a top-level module outside the groups
//! (`api`, `config`, ...); the groups themselves must not form a cycle either.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The folders of `agent/src` that group modules by concern.
const GROUPS: [&str; 4] = ["calls", "control", "coordination", "process"];

/// The binary's own modules: not part of the library's layers.
const BINARY: [&str; 4] = ["lib", "main", "call", "demo"];

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The node a module path (`calls::broker::serve` → `calls::broker`) belongs to.
fn node(path: &[String]) -> Option<String> {
    let first = path.first()?;
    match path.get(1) {
        Some(second) if GROUPS.contains(&first.as_str()) => Some(format!("{first}::{second}")),
        _ => Some(first.clone()),
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
        let skip = rest.len() - rest.trim_start_matches([' ', '\n', ',']).len();
        at += skip;
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
fn used_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
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

/// Module node → the nodes it uses.
fn uses() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let module = module_of(path.strip_prefix(&root).unwrap());
            if module.len() == 1 && BINARY.contains(&module[0].as_str()) {
                continue;
            }
            let Some(from) = node(&module) else { continue };
            let text = std::fs::read_to_string(&path).unwrap();
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap()
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let used = graph.entry(from.clone()).or_default();
            for path in used_paths(&code, &module) {
                if let Some(to) = node(&path) {
                    if to != from {
                        used.insert(to);
                    }
                }
            }
        }
    }
    graph
}

/// The same uses between the top-level groups and modules.
fn groups(graph: &Graph) -> Graph {
    let top = |node: &str| node.split("::").next().unwrap().to_owned();
    let mut collapsed = Graph::new();
    for (from, used) in graph {
        let entry = collapsed.entry(top(from)).or_default();
        entry.extend(used.iter().map(|to| top(to)).filter(|to| *to != top(from)));
    }
    collapsed
}

fn reaches(graph: &Graph, from: &str, to: &str) -> bool {
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

fn cycles(graph: &Graph) -> Vec<String> {
    graph
        .iter()
        .flat_map(|(from, used)| used.iter().map(move |to| (from, to)))
        .filter(|(from, to)| reaches(graph, to, from))
        .map(|(from, to)| format!("{from} → {to}"))
        .collect()
}

#[test]
fn no_module_of_the_agent_uses_one_that_uses_it() {
    let graph = uses();
    assert!(graph.len() > 15, "read the modules: {graph:?}");
    assert!(
        graph["calls::router"].contains("calls::broker")
            && graph["calls::broker"].contains("calls::contract")
            && graph["process::compose"].contains("coordination::atom"),
        "sees the uses: {graph:?}"
    );
    // A use through a re-export at the crate root (`crate::Atom`) would hide what it uses.
    let unknown: Vec<&String> = graph
        .values()
        .flatten()
        .filter(|to| !graph.contains_key(*to))
        .collect();
    assert!(unknown.is_empty(), "uses of no module: {unknown:?}");
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "modules in a cycle: {cycles:?}");
}

#[test]
fn no_group_of_the_agent_uses_one_that_uses_it() {
    let groups = groups(&uses());
    for group in GROUPS {
        assert!(groups.contains_key(group), "no group {group}: {groups:?}");
    }
    let cycles = cycles(&groups);
    assert!(cycles.is_empty(), "groups in a cycle: {cycles:?}");
}

#[test]
fn the_broker_does_not_reach_the_router() {
    let graph = uses();
    assert!(
        !reaches(&graph, "calls::broker", "calls::router"),
        "the broker reaches the call router: {graph:?}"
    );
}

#[test]
fn calls_do_not_reach_control() {
    let graph = uses();
    for from in graph.keys().filter(|node| node.starts_with("calls::")) {
        for to in graph.keys().filter(|node| node.starts_with("control::")) {
            assert!(!reaches(&graph, from, to), "{from} reaches {to}: {graph:?}");
        }
    }
}

#[test]
fn the_contract_is_a_leaf_of_calls() {
    let graph = uses();
    for user in ["calls::router", "calls::broker"] {
        assert!(
            !reaches(&graph, "calls::contract", user),
            "the contract reaches {user}: {graph:?}"
        );
    }
}

#[test]
fn paths_are_read_as_written() {
    let module = ["calls".to_owned(), "broker".to_owned()];
    let read: Vec<String> = used_paths(
        "use crate::{calls::once, metrics::Metrics};\nsuper::contract::check(); ycrate::no",
        &module,
    )
    .iter()
    .map(|path| path.join("::"))
    .collect();
    assert_eq!(
        read,
        ["calls::once", "metrics::Metrics", "calls::contract::check"]
    );
}
