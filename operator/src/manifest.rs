//! Component manifests as a Composition carries them: the free-form object of `manifest.toa.yaml`,
//! read and checked with toa-context's [`Manifest`], so the operator refuses what the agent would.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use toa_context::{Manifest, ManifestError};

/// The file a component directory holds.
pub const FILE: &str = "manifest.toa.yaml";

/// A component as read from its directory: the checked manifest and the object written into the
/// Composition (the manifest as the user wrote it).
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub manifest: Manifest,
    pub object: Map<String, Value>,
}

/// Why a component's manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Invalid(#[from] ManifestError),
}

/// Reads `DIR/manifest.toa.yaml`, or the file itself when `path` names a file.
pub fn read(path: &Path) -> Result<Read, ReadError> {
    let file = if path.is_dir() {
        path.join(FILE)
    } else {
        path.to_owned()
    };
    let yaml = std::fs::read_to_string(&file).map_err(|source| ReadError::Io {
        path: file.clone(),
        source,
    })?;
    Ok(parse(&yaml, &file.display().to_string())?)
}

/// Checks a manifest and keeps its object form; `origin` names it in errors.
pub fn parse(yaml: &str, origin: &str) -> Result<Read, ManifestError> {
    let manifest = Manifest::parse(yaml, origin)?;
    // The manifest parsed, so it is a mapping with string keys and converts to JSON.
    let object = match serde_yaml::from_str::<Value>(yaml) {
        Ok(Value::Object(object)) => object,
        Ok(other) => return Err(refused(origin, format!("expected a mapping, got {other}"))),
        Err(error) => return Err(refused(origin, error.to_string())),
    };
    Ok(Read { manifest, object })
}

/// Checks a manifest carried in a Composition; `origin` names it in errors.
pub fn check(object: &Map<String, Value>, origin: &str) -> Result<Manifest, ManifestError> {
    // JSON is YAML: the same parser as for the file, so the same rules and messages.
    let text = serde_json::to_string(object).map_err(|error| refused(origin, error.to_string()))?;
    Manifest::parse(&text, origin)
}

fn refused(origin: &str, message: String) -> ManifestError {
    ManifestError {
        origin: origin.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_object_as_written_and_checks_it() {
        let read = parse("name: orders\nnamespace: store\nlifecycle: [ready]\n", "m").unwrap();
        assert_eq!(read.manifest.full_name(), "store.orders");
        assert_eq!(
            Value::Object(read.object.clone()),
            serde_json::json!({"name": "orders", "namespace": "store", "lifecycle": ["ready"]})
        );
        assert_eq!(check(&read.object, "again").unwrap(), read.manifest);
    }

    #[test]
    fn refusals_name_the_origin() {
        let error = parse("name: Orders\n", "store/manifest.toa.yaml").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("store/manifest.toa.yaml: `name`"),
            "{error}"
        );
        let object = serde_json::json!({"name": "orders", "lifecycle": ["pause"]});
        let error = check(object.as_object().unwrap(), "spec.components[0].manifest").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("spec.components[0].manifest: component orders exports pause"),
            "{error}"
        );
    }
}
