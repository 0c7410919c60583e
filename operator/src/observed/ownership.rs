//! Pure: whether an object under a name the operator derives from a Composition is that
//! Composition's own. The operator changes only objects its Composition controls (an owner
//! reference with `controller: true` and the Composition's uid). Any other object of that name (a
//! namespace's deny-all NetworkPolicy named like a new Composition, another tool's ConfigMap) is
//! never changed: the reconcile stops with `Conflict`, naming the object and who holds it.

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
