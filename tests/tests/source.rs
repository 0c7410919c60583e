//! Rules of the workspace's own source, read from the files as they are
//! ([`toa_tests::source`]):
//! - no function of `agent/`, `operator/` or `context/` is longer than 60 lines as the file shows
//!   it: from its `fn` line to its closing brace, comments and blank lines included, test
//!   functions of inline `#[cfg(test)]` modules included (clippy's `too_many_lines` counts only
//!   lines of code, so it lets longer ones through); test files (`tests.rs`, `tests/`) are exempt;
//! - no module of any of them uses a module that uses it. The agent's modules are grouped by
//!   concern (`calls/`, `coordination/`, `process/`, `control/`): each module in a group is a node,
//!   the groups form no circle either, the broker never reaches the call router, nothing in
//!   `calls/` reaches `control/`, and the request contract reaches neither the router nor the
//!   broker. The operator's vocabulary (`names`) is at the bottom.

use std::collections::{BTreeMap, BTreeSet};
use toa_tests::source::{
    code_only, cycles, groups, is_test_file, long_functions, reaches, sources, used_paths,
    workspace, Graph, Layout, LONGEST,
};

fn agent() -> Graph {
    Layout {
        src: workspace().join("agent/src"),
        groups: &["calls", "control", "coordination", "process"],
        binary: &["main", "call", "demo"],
    }
    .uses()
}

fn operator() -> Graph {
    Layout {
        src: workspace().join("operator/src"),
        groups: &[],
        binary: &["main", "bin"],
    }
    .uses()
}

fn context() -> Graph {
    Layout {
        src: workspace().join("context/src"),
        groups: &[],
        binary: &[],
    }
    .uses()
}

#[test]
fn the_count_is_the_files_own() {
    let twenty = "    let x = 1;\n".repeat(20);
    let blanks = "\n// a comment { with a brace\n".repeat(30);
    let text = format!(
        "fn short() {{}}\n\n#[cfg(test)]\nmod tests {{\n    fn long() {{\n        let s = \"}}\";\n        \
         let r = r#\"}}\"#;\n        let c = '}}';\n{twenty}{blanks}    }}\n}}\nfn f<'a>(x: &'a str) {{}}\n"
    );
    // `long` spans its `fn` line, 3 lines of literals, 20 of code, 60 blank or comment lines and
    // its brace: 85, though clippy would see 25.
    assert_eq!(long_functions(&text), vec![(5, "long".to_owned(), 85)]);
}

#[test]
fn no_function_is_longer_than_60_lines() {
    let root = workspace();
    let mut seen = 0;
    let mut long = Vec::new();
    for krate in ["agent", "operator", "context"] {
        for path in sources(&root.join(krate).join("src")) {
            if is_test_file(&path) {
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

#[test]
fn no_module_of_the_agent_uses_one_that_uses_it() {
    let graph = agent();
    assert!(graph.len() > 15, "read the modules: {graph:?}");
    assert!(
        graph["calls::router"].contains("calls::broker")
            && graph["calls::broker"].contains("calls::contract")
            && graph["process::compose"].contains("coordination::atom"),
        "sees the uses: {graph:?}"
    );
    // Every use names a module (one through a re-export at the crate root is followed to it).
    let unknown: Vec<&String> = graph
        .values()
        .flatten()
        .filter(|to| !graph.contains_key(*to))
        .collect();
    assert!(unknown.is_empty(), "uses of no module: {unknown:?}");
    assert_eq!(cycles(&graph), Vec::<String>::new(), "{graph:?}");
}

#[test]
fn no_group_of_the_agent_uses_one_that_uses_it() {
    let groups = groups(&agent());
    for group in ["calls", "control", "coordination", "process"] {
        assert!(groups.contains_key(group), "no group {group}: {groups:?}");
    }
    assert_eq!(cycles(&groups), Vec::<String>::new(), "{groups:?}");
}

#[test]
fn the_agents_calls_keep_their_order() {
    let graph = agent();
    assert!(
        !reaches(&graph, "calls::broker", "calls::router"),
        "the broker reaches the call router: {graph:?}"
    );
    for from in graph.keys().filter(|node| node.starts_with("calls::")) {
        for to in graph.keys().filter(|node| node.starts_with("control::")) {
            assert!(!reaches(&graph, from, to), "{from} reaches {to}: {graph:?}");
        }
    }
    for user in ["calls::router", "calls::broker"] {
        assert!(
            !reaches(&graph, "calls::contract", user),
            "the contract reaches {user}: {graph:?}"
        );
    }
}

#[test]
fn no_module_of_the_operator_uses_one_that_uses_it() {
    let graph = operator();
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
    let graph = context();
    assert!(
        graph["annotations"].contains("address"),
        "sees the uses: {graph:?}"
    );
    assert_eq!(cycles(&graph), Vec::<String>::new(), "{graph:?}");
}

#[test]
fn paths_are_read_as_written_and_a_cycle_is_seen() {
    let module = ["calls".to_owned(), "broker".to_owned()];
    let code = code_only(
        "use crate::{calls::once, metrics::Metrics};\nsuper::contract::check(); ycrate::no\n\
         // crate::in_a_comment\nlet s = \"crate::in_a_string\";",
    );
    let read: Vec<String> = used_paths(&code, &module)
        .iter()
        .map(|path| path.join("::"))
        .collect();
    assert_eq!(
        read,
        ["calls::once", "metrics::Metrics", "calls::contract::check"]
    );
    let graph = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
        ("d".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(cycles(&graph), ["a → b", "b → c", "c → a"]);
}
