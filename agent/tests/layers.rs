//! The agent's modules form layers: no module of `agent/src` reaches back to one that uses it.
//! Read from the sources: every `crate::<module>` (and a submodule's `super::<sibling>`) outside
//! the tests counts as a use of that top-level module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules it uses.
fn uses() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path
                .strip_prefix(&root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            let module = relative.trim_end_matches(".rs").split('/').next().unwrap();
            if matches!(module, "lib" | "main" | "call" | "demo") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let used = graph.entry(module.to_owned()).or_default();
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    used.insert(name);
                }
            }
        }
    }
    graph
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

#[test]
fn no_module_of_the_agent_uses_one_that_uses_it() {
    let graph = uses();
    assert!(graph.len() > 10, "read the modules: {graph:?}");
    assert!(
        graph["calls"].contains("broker"),
        "sees the uses: {graph:?}"
    );
    let cycles: Vec<String> = graph
        .iter()
        .flat_map(|(from, used)| used.iter().map(move |to| (from, to)))
        .filter(|(from, to)| reaches(&graph, to, from))
        .map(|(from, to)| format!("{from} → {to}"))
        .collect();
    assert!(cycles.is_empty(), "modules in a cycle: {cycles:?}");
}
