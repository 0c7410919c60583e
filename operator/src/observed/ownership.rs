//! Pure: whether an object under a name the operator derives from a Composition is that
//! Composition's own. The operator changes only objects its Composition controls (an owner
//! reference with `controller: true` and the Composition's uid). Any other object of that name (a
//! namespace's deny-all NetworkPolicy named like a new Composition, another tool's ConfigMap) is
//! never changed: the reconcile stops with `Conflict`, naming the object and who holds it. In the
//! namespace's shared declarations, a component is one Composition's: a second Composition that
//! declares it is refused the same way.

use crate::names::MANAGER;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Why the existing `kind` object `meta` is not the Composition `uid`'s to change; `None` when
/// the Composition controls it.
pub fn foreign(kind: &str, meta: &ObjectMeta, uid: &str) -> Option<String> {
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|reference| reference.controller == Some(true));
    if controller.is_some_and(|controller| controller.uid == uid) {
        return None;
    }
    let holder = match controller {
        Some(controller) => format!("controlled by the {} {}", controller.kind, controller.name),
        None => match managers(meta).as_slice() {
            [] => "no controller".to_owned(),
            managers => format!("no controller; written by {}", managers.join(", ")),
        },
    };
    let name = meta.name.as_deref().unwrap_or_default();
    Some(format!(
        "the {kind} {name} exists and is not this Composition's ({holder}); the operator does not \
         change it: delete it, or give the Composition another name"
    ))
}

/// Why the Composition applying `part` with the field manager `manager` may not declare its
/// components in `shared` (the namespace's declarations as read): a key of `part` another
/// living Composition's manager holds, or a `shared` that is no Composition's at all.
pub fn declared_elsewhere(shared: &ConfigMap, part: &ConfigMap, manager: &str) -> Option<String> {
    let name = shared.metadata.name.as_deref().unwrap_or_default();
    let prefix = format!("{MANAGER}.");
    let compositions: Vec<&str> = (shared.metadata.owner_references.iter().flatten())
        .filter(|reference| reference.kind == "Composition")
        .map(|reference| reference.name.as_str())
        .collect();
    let composition_owned = !compositions.is_empty();
    if !composition_owned && shared.data.as_ref().is_some_and(|data| !data.is_empty()) {
        return foreign("ConfigMap", &shared.metadata, "");
    }
    let keys = part.data.iter().flatten().map(|(key, _)| key);
    for key in keys {
        let field = format!("f:{key}");
        let holder = shared
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .find(|entry| {
                let other = entry.manager.as_deref().unwrap_or_default();
                let fields = entry.fields_v1.as_ref().map(|fields| &fields.0);
                // A deleted Composition's keys (its owner reference gone) are free to declare
                // again: whoever reconciles next takes them back (`declarations::orphaned`).
                let living = other
                    .strip_prefix(&prefix)
                    .is_some_and(|name| compositions.contains(&name));
                other != manager
                    && living
                    && fields.is_some_and(|fields| fields["f:data"].get(&field).is_some())
            });
        if let Some(holder) = holder {
            let other = holder.manager.as_deref().unwrap_or_default();
            let other = other.strip_prefix(&prefix).unwrap_or(other);
            let component = key.strip_suffix(".yaml").unwrap_or(key);
            return Some(format!(
                "the component {component} is declared in the namespace's ConfigMap {name} by the \
                 Composition {other}; one component is one Composition's in a namespace: rename \
                 it, or remove it from one of them"
            ));
        }
    }
    None
}

/// The field managers that wrote `meta`'s object, each once.
fn managers(meta: &ObjectMeta) -> Vec<String> {
    let mut managers: Vec<String> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect();
    managers.sort_unstable();
    managers.dedup();
    managers
}

#[cfg(test)]
mod tests;
