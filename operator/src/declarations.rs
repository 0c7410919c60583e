//! The namespace's shared [`DECLARATIONS`] ConfigMap, the one object a reconcile writes that is
//! not its Composition's alone: every Composition of the namespace applies its part of it (its
//! components' manifests, built by [`desired::declarations`]) under a field manager of its own
//! ([`manager`]), and takes back the parts of Compositions that were deleted.
//!
//! Kept apart from [`crate::controller`] because sharing gives it rules nothing else has: a field
//! manager per Composition, an owner reference per Composition and no controller, a read before
//! a write (the API server serialises writes to one object, so a write on every reconcile cost
//! seconds per reconcile with 100 Compositions, in the benchmark), one writer per namespace at a
//! time ([`Writers`]), and the clean-up of a deleted Composition's keys ([`orphaned`],
//! [`withdrawn`]). The functions below [`reconcile`] are pure.

use crate::crd::Composition;
use crate::desired::{self, Owner};
use crate::kube_io;
use crate::names::{DECLARATIONS, MANAGER};
use crate::observed::ownership;
use crate::Error;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One writer at a time per namespace for the shared declarations ConfigMap: concurrent
/// applies to one object conflict and are retried by the API server, so 100 at once cost
/// far more than 100 in a row (the benchmark).
#[derive(Debug, Default)]
pub struct Writers(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Writers {
    /// The lock the writers of `namespace`'s [`DECLARATIONS`] take.
    fn of(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(namespace.to_owned())
            .or_default()
            .clone()
    }
}

/// Makes the namespace's [`DECLARATIONS`] (through `config_maps`, the namespace's ConfigMaps)
/// hold `composition`'s part, then takes back the parts of deleted Compositions found in it.
pub async fn reconcile(
    config_maps: &Api<ConfigMap>,
    writers: &Writers,
    composition: &Composition,
    owner: &Owner,
) -> Result<(), Error> {
    let writer = writers.of(&owner.namespace);
    let shared = apply_part(config_maps, &writer, composition, owner).await?;
    Ok(take_back_orphans(config_maps, &writer, &owner.namespace, &shared).await?)
}

/// Applies `composition`'s part unless the shared ConfigMap is known to hold it; returns the
/// shared ConfigMap as read or as applied. A component another Composition declares, or a
/// ConfigMap of that name no Composition made, is a [`Error::Conflict`]
/// ([`ownership::declared_elsewhere`]) and nothing is written.
///
/// Every Composition of the namespace writes into this one ConfigMap, and the API server
/// serialises those writes: with 100 Compositions reconciling at once, applying it on every
/// reconcile made each reconcile take seconds (the benchmark). Once this generation was
/// reconciled (so applied), a read that finds it holding this Composition's part is enough;
/// otherwise the read and the write are made by one writer at a time, so two Compositions that
/// declare one component at once do not both find it free.
async fn apply_part(
    config_maps: &Api<ConfigMap>,
    writer: &tokio::sync::Mutex<()>,
    composition: &Composition,
    owner: &Owner,
) -> Result<ConfigMap, Error> {
    let part = desired::declarations(owner, composition);
    let manager = manager(&owner.name);
    let previous = composition.status.as_ref();
    let reconciled = previous.and_then(|p| p.observed_generation).is_some()
        && previous.and_then(|p| p.observed_generation) == composition.metadata.generation;
    let applied = |current: &ConfigMap| {
        reconciled
            && holds(current, &part)
            && ownership::declared_elsewhere(current, &part, &manager).is_none()
    };
    if reconciled {
        if let Some(current) = config_maps.get_opt(DECLARATIONS).await? {
            if applied(&current) {
                return Ok(current);
            }
        }
    }
    let _one_writer = writer.lock().await;
    let current = config_maps.get_opt(DECLARATIONS).await?;
    if let Some(current) = current {
        if let Some(why) = ownership::declared_elsewhere(&current, &part, &manager) {
            return Err(Error::Conflict(why));
        }
        if applied(&current) {
            return Ok(current);
        }
    }
    Ok(kube_io::apply_as(config_maps, &part, &manager).await?)
}

/// A deleted Composition's keys: taken back by whichever Composition of the namespace
/// reconciles next, once the garbage collector removed the deleted one's owner reference.
async fn take_back_orphans(
    config_maps: &Api<ConfigMap>,
    writer: &tokio::sync::Mutex<()>,
    namespace: &str,
    shared: &ConfigMap,
) -> Result<(), kube::Error> {
    for gone in orphaned(shared) {
        let _one_writer = writer.lock().await;
        kube_io::apply_as(config_maps, &withdrawn(namespace), &manager(&gone)).await?;
        tracing::info!(%namespace, composition = %gone, "took back the declarations of a deleted Composition");
    }
    Ok(())
}

/// Whether `current` (the namespace's [`DECLARATIONS`] as read) holds this Composition's part
/// `part`: each of its keys with the same value, and its owner reference.
pub fn holds(current: &ConfigMap, part: &ConfigMap) -> bool {
    let data = current.data.clone().unwrap_or_default();
    let owners = current
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    part.data
        .iter()
        .flatten()
        .all(|(key, value)| data.get(key) == Some(value))
        && part
            .metadata
            .owner_references
            .iter()
            .flatten()
            .all(|owner| owners.iter().any(|o| o.uid == owner.uid))
}

/// The field manager a Composition applies its part of [`DECLARATIONS`] with.
pub fn manager(composition: &str) -> String {
    format!("{MANAGER}.{composition}")
}

/// The Compositions whose part of `current` (the namespace's [`DECLARATIONS`] as read) outlived
/// them: a field manager [`manager`] of a name no owner reference has any more (the garbage
/// collector removes a deleted owner's reference from an object that has other owners).
pub fn orphaned(current: &ConfigMap) -> Vec<String> {
    let owners: Vec<&str> = current
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|owner| owner.name.as_str())
        .collect();
    let prefix = format!("{MANAGER}.");
    let mut orphans: Vec<String> = current
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.as_deref()?.strip_prefix(prefix.as_str()))
        .filter(|name| !owners.contains(name))
        .map(str::to_owned)
        .collect();
    orphans.sort_unstable();
    orphans.dedup();
    orphans
}

/// Applied as a gone Composition's [`manager`], takes back everything it applied to
/// [`DECLARATIONS`] that no other Composition applies too.
pub fn withdrawn(namespace: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(DECLARATIONS.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests;
