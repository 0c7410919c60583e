//! A Composition as the API server holds it, read so that no one object can stop the reading of
//! the others.
//!
//! The API server stores what its schema lets through: free-form manifests and configurations
//! nested 200 levels deep, or fields a newer or older CRD wrote. kube's list and watch decode a
//! whole page of objects at once, so one such object made every list fail (`recursion limit
//! exceeded`): after a restart no Composition in any namespace was reconciled. [`Stored`] is what
//! the controller watches instead. Its spec and status are decoded one object at a time, and a spec
//! that cannot be decoded is kept as the reason it cannot, for the reconcile to report
//! (`InvalidSpec`). Its metadata is decoded without `managedFields`, which mirror the spec's
//! nesting and which the operator never reads.

use super::{Composition, CompositionSpec, CompositionStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A Composition whose spec may not decode. Answers to writes of a Composition (its status, its
/// halt record) are read as this too: they carry the whole object.
#[derive(Deserialize, Clone, Debug)]
pub struct Stored {
    #[serde(deserialize_with = "metadata")]
    pub metadata: ObjectMeta,
    #[serde(default = "no_spec")]
    spec: Decoded<CompositionSpec>,
    #[serde(default)]
    status: Option<Decoded<CompositionStatus>>,
}

/// Why a stored spec cannot be decoded: the decoder's words, with where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the spec cannot be read: {0}")]
pub struct Undecodable(String);

impl Stored {
    /// The Composition, or why its spec cannot be read. A status that does not decode (the
    /// operator's own writing, or someone else's with rights to the status) counts as none: the
    /// next status write replaces it.
    pub fn decode(&self) -> Result<Composition, Undecodable> {
        let spec = self.spec.0.clone().map_err(Undecodable)?;
        let status = self.status().cloned();
        Ok(Composition {
            metadata: self.metadata.clone(),
            spec,
            status,
        })
    }

    /// The status, if there is one that decodes.
    pub fn status(&self) -> Option<&CompositionStatus> {
        self.status.as_ref()?.0.as_ref().ok()
    }
}

impl From<&Composition> for Stored {
    fn from(composition: &Composition) -> Self {
        Self {
            metadata: composition.metadata.clone(),
            spec: Decoded(Ok(composition.spec.clone())),
            status: composition.status.clone().map(|status| Decoded(Ok(status))),
        }
    }
}

/// The Composition's kind, group, version and plural: owner references and events name a Stored
/// exactly as they name a Composition.
impl Resource for Stored {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dynamic: &()) -> Cow<'_, str> {
        Composition::kind(dynamic)
    }

    fn group(dynamic: &()) -> Cow<'_, str> {
        Composition::group(dynamic)
    }

    fn version(dynamic: &()) -> Cow<'_, str> {
        Composition::version(dynamic)
    }

    fn plural(dynamic: &()) -> Cow<'_, str> {
        Composition::plural(dynamic)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A value decoded on its own: read first as raw JSON (which has no nesting limit), then into `T`
/// (which has serde_json's 128 levels); a failure is kept as its message.
#[derive(Clone, Debug)]
struct Decoded<T>(Result<T, String>);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Decoded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Ok(Self(
            serde_json::from_str(raw.get()).map_err(|error| error.to_string()),
        ))
    }
}

fn no_spec() -> Decoded<CompositionSpec> {
    Decoded(Err("the object has no spec".into()))
}

/// The object's metadata without `managedFields` (each entry's `fieldsV1` is as deep as the spec).
fn metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let mut fields = BTreeMap::<String, Box<RawValue>>::deserialize(deserializer)?;
    fields.remove("managedFields");
    let text = serde_json::to_string(&fields).map_err(D::Error::custom)?;
    serde_json::from_str(&text).map_err(D::Error::custom)
}

#[cfg(test)]
mod tests;
