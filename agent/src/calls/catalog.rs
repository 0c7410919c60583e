//! Every component's declarations this process knows, so a call's request contract is checked
//! before anything is sent, without a hand-written list: this process's own components, the
//! component directories beside them (a local run), and a directory of manifests named
//! `<component>.yaml` (`--declarations`, in a pod the namespace's declarations mounted from a
//! ConfigMap). The sources are read again every [`RELOAD`]: a component deployed, changed or
//! removed later is known without a restart. This process's own components never change.

use crate::component::Component;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How often the sources are read again.
pub const RELOAD: Duration = Duration::from_secs(1);

/// Where declarations come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A directory whose subdirectories hold `manifest.toa.yaml` (the layout of a local run).
    Neighbours(PathBuf),
    /// A directory of manifests, one file `<component>.yaml` each.
    Manifests(PathBuf),
}

type Known = HashMap<String, Arc<Component>>;

pub struct Catalog {
    own: Known,
    sources: Vec<Source>,
    known: watch::Sender<Arc<Known>>,
    /// The text each other component was read from, to tell a change and to warn once per text.
    texts: Mutex<BTreeMap<PathBuf, String>>,
}

impl Catalog {
    pub fn new(own: &[Arc<Component>], sources: Vec<Source>) -> Arc<Self> {
        let own: Known = own.iter().map(|c| (c.name.clone(), c.clone())).collect();
        let (known, _) = watch::channel(Arc::new(own.clone()));
        let catalog = Arc::new(Self {
            own,
            sources,
            known,
            texts: Mutex::default(),
        });
        catalog.reload();
        catalog
    }

    /// Reads the sources again every [`RELOAD`] while the catalog is in use.
    pub fn keep_reloading(self: &Arc<Self>) {
        if self.sources.is_empty() {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD).await;
                let Some(catalog) = weak.upgrade() else {
                    return;
                };
                // Reading files blocks; the catalog is small.
                let _ = tokio::task::spawn_blocking(move || catalog.reload()).await;
            }
        });
    }

    pub fn get(&self, component: &str) -> Option<Arc<Component>> {
        self.known.borrow().get(component).cloned()
    }

    /// The component's declarations, waiting up to `limit` for them to appear.
    pub async fn find(&self, component: &str, limit: Duration) -> Option<Arc<Component>> {
        let mut known = self.known.subscribe();
        let found =
            tokio::time::timeout(limit, known.wait_for(|known| known.contains_key(component)))
                .await
                .ok()?
                .ok()?
                .get(component)
                .cloned();
        found
    }

    /// Reads every source; publishes the result when something changed.
    pub fn reload(&self) {
        let mut texts = self.texts.lock().expect("texts");
        let mut read = BTreeMap::new();
        for source in &self.sources {
            for path in manifest_files(source) {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    read.insert(path, text);
                }
            }
        }
        if *texts == read {
            return;
        }
        let current = self.known.borrow().clone();
        let mut next = self.own.clone();
        for (path, text) in &read {
            // Never started from here: the directory only says where the declarations came from.
            let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
            let parsed = toa_context::Manifest::parse(text, &path.display().to_string())
                .map_err(|e| e.to_string())
                .and_then(|manifest| Component::new(manifest, dir).map_err(|e| e.to_string()));
            match parsed {
                Ok(component) if self.own.contains_key(&component.name) => {}
                Ok(component) => {
                    let name = component.name.clone();
                    // Unchanged text: keep the compiled component.
                    let same = texts.get(path) == Some(text);
                    let component = match current.get(&name) {
                        Some(known) if same => known.clone(),
                        _ => Arc::new(component),
                    };
                    next.entry(name).or_insert(component);
                }
                Err(error) if texts.get(path) != Some(text) => {
                    tracing::warn!(%error, "a component's declarations are not valid; calls to it are refused")
                }
                Err(_) => {}
            }
        }
        for name in next.keys().filter(|n| !current.contains_key(*n)) {
            tracing::info!(component = %name, "declarations found");
        }
        for name in current.keys().filter(|n| !next.contains_key(*n)) {
            tracing::info!(component = %name, "declarations removed");
        }
        *texts = read;
        self.known.send_replace(Arc::new(next));
    }
}

/// The manifest files a source holds now.
fn manifest_files(source: &Source) -> Vec<PathBuf> {
    let (dir, pick): (&Path, fn(&Path) -> Option<PathBuf>) = match source {
        Source::Neighbours(dir) => (dir, |entry| {
            let path = entry.join("manifest.toa.yaml");
            path.is_file().then_some(path)
        }),
        Source::Manifests(dir) => (dir, |entry| {
            let yaml = entry.extension().is_some_and(|e| e == "yaml" || e == "yml");
            // A mounted ConfigMap also holds `..data` links and hidden entries: skip them.
            let hidden = entry
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            (yaml && !hidden && entry.is_file()).then(|| entry.to_path_buf())
        }),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries.flatten().filter_map(|e| pick(&e.path())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(name: &str, operation: &str) -> String {
        format!("name: {name}\nnamespace: test\noperations:\n  {operation}:\n    input: {{ type: object }}\n")
    }

    #[test]
    fn changes_to_the_manifests_are_picked_up_and_own_components_never_change() {
        let dir = std::env::temp_dir().join(format!("toa-catalog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("test.a.yaml"), manifest("a", "first")).unwrap();
        std::fs::write(dir.join("test.own.yaml"), manifest("own", "other")).unwrap();
        std::fs::write(dir.join("broken.yaml"), "name: [").unwrap();
        let own = Component::new(
            toa_context::Manifest::parse(&manifest("own", "mine"), "own").unwrap(),
            PathBuf::new(),
        )
        .unwrap();
        let catalog = Catalog::new(&[Arc::new(own)], vec![Source::Manifests(dir.clone())]);
        let ops = |name: &str| -> Vec<String> {
            catalog
                .get(name)
                .map(|c| c.manifest.operations.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert_eq!(ops("test.a"), ["first"]);
        assert_eq!(
            ops("test.own"),
            ["mine"],
            "this process's own declarations win"
        );
        assert!(catalog.get("test.b").is_none());

        std::fs::write(dir.join("test.a.yaml"), manifest("a", "second")).unwrap();
        std::fs::write(dir.join("test.b.yaml"), manifest("b", "third")).unwrap();
        catalog.reload();
        assert_eq!(ops("test.a"), ["second"]);
        assert_eq!(ops("test.b"), ["third"]);

        std::fs::remove_file(dir.join("test.a.yaml")).unwrap();
        catalog.reload();
        assert!(
            catalog.get("test.a").is_none(),
            "a removed component is forgotten"
        );
        assert_eq!(ops("test.own"), ["mine"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
