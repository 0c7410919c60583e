//! The program of a manifest without `program:` (seed manifests have none): the SDK runtime its
//! modules are written for, told by their files. `operations/`, `rc/`, `receivers/` and
//! `events/` holding TypeScript or JavaScript run `toa-node` (found in `node_modules/.bin` above
//! the component, as npm scripts find it, else on `PATH`); holding Python, `python3 -m toa`
//! (the Python SDK installed, or on `PYTHONPATH`). Both kinds, or none, leave it to the manifest.

use std::path::Path;

/// The folders whose modules an SDK loads.
const FOLDERS: [&str; 4] = ["operations", "rc", "receivers", "events"];

/// The command of the SDK runtime whose modules `dir` holds: `Ok(None)` when it holds none;
/// `Err` naming one of each when it holds both.
pub fn program_of(dir: &Path) -> Result<Option<Vec<String>>, String> {
    let (mut script, mut python) = (None, None);
    for folder in FOLDERS {
        let Ok(entries) = std::fs::read_dir(dir.join(folder)) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            let path = format!("{folder}/{name}");
            if is_script(&name) {
                script.get_or_insert(path);
            } else if name.ends_with(".py") {
                python.get_or_insert(path);
            }
        }
    }
    match (script, python) {
        (Some(script), Some(python)) => Err(format!(
            "no `program`, and modules in TypeScript or JavaScript ({script}) and in Python \
             ({python}): say which runs, as program: [toa-node] or program: [python3, -m, toa]"
        )),
        (Some(_), None) => Ok(Some(vec!["toa-node".to_owned()])),
        (None, Some(_)) => Ok(Some(["python3", "-m", "toa"].map(str::to_owned).to_vec())),
        (None, None) => Ok(None),
    }
}

/// A module `toa-node` loads (a type declaration is none).
fn is_script(name: &str) -> bool {
    let loaded = [".ts", ".mts", ".js", ".mjs"];
    loaded.iter().any(|ext| name.ends_with(ext)) && !name.ends_with(".d.ts")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(name: &str, files: &[&str]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("toa-sdk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for file in files {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        dir
    }

    #[test]
    fn the_modules_tell_which_sdk_runs_the_component() {
        let typescript = component("ts", &["operations/appraise.ts", "types/index.d.ts"]);
        assert_eq!(
            program_of(&typescript).unwrap(),
            Some(vec!["toa-node".to_owned()])
        );
        let python = component(
            "py",
            &["rc/poller.py", "receivers/store.orders.approved.py"],
        );
        assert_eq!(
            program_of(&python).unwrap().unwrap(),
            ["python3", "-m", "toa"]
        );
        let declarations = component("none", &["operations/types.d.ts", "README.md"]);
        assert_eq!(program_of(&declarations).unwrap(), None);
        let both = component("both", &["operations/a.ts", "events/changed.py"]);
        let refused = program_of(&both).unwrap_err();
        assert!(
            refused.contains("(operations/a.ts)") && refused.contains("(events/changed.py)"),
            "{refused}"
        );
    }
}
