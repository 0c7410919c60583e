use super::*;
use crate::crd::CompositionSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};

/// The test Composition's part of the namespace's declarations.
fn part() -> ConfigMap {
    let composition = Composition::test(CompositionSpec::test());
    desired::declarations(&Owner::of(&composition).unwrap(), &composition)
}

#[test]
fn declarations_hold_a_part_with_its_values_and_owner() {
    let part = part();
    assert!(holds(&part, &part));
    let mut more = part.clone();
    more.data
        .as_mut()
        .unwrap()
        .insert("other.yaml".into(), "x".into());
    assert!(
        holds(&more, &part),
        "other Compositions' keys do not matter"
    );
    let mut changed = part.clone();
    for value in changed.data.as_mut().unwrap().values_mut() {
        value.push_str("changed: true\n");
    }
    assert!(!holds(&changed, &part));
    let mut unowned = part.clone();
    unowned.metadata.owner_references = None;
    assert!(!holds(&unowned, &part), "its owner reference is missing");
}

#[test]
fn a_deleted_compositions_declarations_are_orphaned_once_its_owner_reference_is_gone() {
    let mut shared = part();
    let owner = shared.metadata.owner_references.as_ref().unwrap()[0].clone();
    let managers = [
        manager(&owner.name),
        manager("gone"),
        manager("gone"),
        MANAGER.to_owned(),
        "kube-controller-manager".to_owned(),
    ];
    shared.metadata.managed_fields = Some(
        managers
            .iter()
            .map(|manager| ManagedFieldsEntry {
                manager: Some(manager.clone()),
                ..ManagedFieldsEntry::default()
            })
            .collect(),
    );
    assert_eq!(orphaned(&shared), ["gone"]);
    // While its owner reference is there, a Composition's part is its own.
    shared
        .metadata
        .owner_references
        .as_mut()
        .unwrap()
        .push(OwnerReference {
            name: "gone".to_owned(),
            ..owner
        });
    assert!(orphaned(&shared).is_empty());
    // Withdrawing applies nothing but the object's name: every key of that manager goes.
    let withdrawn = withdrawn("shop");
    assert_eq!(withdrawn.data, None);
    assert_eq!(withdrawn.metadata.owner_references, None);
    assert_eq!(withdrawn.metadata.name.as_deref(), Some(DECLARATIONS));
}
