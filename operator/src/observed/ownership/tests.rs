use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, OwnerReference,
};
use serde_json::json;
use std::collections::BTreeMap;

fn reference(kind: &str, name: &str, uid: &str, controller: Option<bool>) -> OwnerReference {
    OwnerReference {
        api_version: "toa.io/v1alpha1".to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller,
        block_owner_deletion: None,
    }
}

fn written_by(manager: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.to_owned()),
        fields_v1: Some(FieldsV1(fields)),
        ..ManagedFieldsEntry::default()
    }
}

#[test]
fn only_an_object_the_composition_controls_is_its_own() {
    let ours = ObjectMeta {
        name: Some("shop".to_owned()),
        owner_references: Some(vec![reference("Composition", "shop", "u1", Some(true))]),
        ..ObjectMeta::default()
    };
    assert_eq!(foreign("Deployment", &ours, "u1"), None);
    // The same name, another Composition's (one deleted and made again, for instance).
    let why = foreign("Deployment", &ours, "u2").unwrap();
    assert!(why.starts_with("the Deployment shop exists and is not this Composition's (controlled by the Composition shop)"), "{why}");
    // Owned, but not as its controller: not its own either.
    let shared = ObjectMeta {
        owner_references: Some(vec![reference("Composition", "shop", "u1", None)]),
        ..ours.clone()
    };
    assert!(foreign("Deployment", &shared, "u1").is_some());
}

#[test]
fn a_users_object_is_named_with_who_wrote_it() {
    let policy = ObjectMeta {
        name: Some("default-deny".to_owned()),
        managed_fields: Some(vec![
            written_by("kubectl-client-side-apply", json!({})),
            written_by("kubectl-client-side-apply", json!({})),
        ]),
        ..ObjectMeta::default()
    };
    let why = foreign("NetworkPolicy", &policy, "u1").unwrap();
    assert_eq!(
        why,
        "the NetworkPolicy default-deny exists and is not this Composition's (no controller; \
         written by kubectl-client-side-apply); the operator does not change it: delete it, or \
         give the Composition another name"
    );
    let bare = ObjectMeta {
        name: Some("x".to_owned()),
        ..ObjectMeta::default()
    };
    assert!(foreign("Secret", &bare, "u1")
        .unwrap()
        .contains("(no controller)"));
}

fn declarations(
    owners: Vec<OwnerReference>,
    managed: Vec<ManagedFieldsEntry>,
    keys: &[&str],
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("toa-declarations".to_owned()),
            owner_references: Some(owners),
            managed_fields: Some(managed),
            ..ObjectMeta::default()
        },
        data: Some(
            keys.iter()
                .map(|k| (k.to_string(), "name: x\n".to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

fn part(keys: &[&str]) -> ConfigMap {
    ConfigMap {
        data: Some(
            keys.iter()
                .map(|k| (k.to_string(), "name: x\n".to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..ConfigMap::default()
    }
}

#[test]
fn a_component_another_composition_declares_is_refused_naming_it() {
    let shared = declarations(
        vec![reference("Composition", "orders", "u1", None)],
        vec![written_by(
            "toa-operator.orders",
            json!({"f:data": {"f:store.orders.yaml": {}}}),
        )],
        &["store.orders.yaml"],
    );
    let why =
        declared_elsewhere(&shared, &part(&["store.orders.yaml"]), "toa-operator.rogue").unwrap();
    assert!(
        why.starts_with("the component store.orders is declared in the namespace's ConfigMap toa-declarations by the Composition orders"),
        "{why}"
    );
    // Its own keys, and keys nobody holds, are its to apply.
    assert_eq!(
        declared_elsewhere(
            &shared,
            &part(&["store.orders.yaml"]),
            "toa-operator.orders"
        ),
        None
    );
    assert_eq!(
        declared_elsewhere(
            &shared,
            &part(&["store.catalog.yaml"]),
            "toa-operator.rogue"
        ),
        None
    );
}

#[test]
fn a_deleted_compositions_component_is_free_to_declare() {
    // `orders` was deleted: the garbage collector removed its owner reference, its field
    // manager's entry stays until someone takes its keys back.
    let shared = declarations(
        vec![reference("Composition", "shop", "u2", None)],
        vec![written_by(
            "toa-operator.orders",
            json!({"f:data": {"f:store.orders.yaml": {}}}),
        )],
        &["store.orders.yaml"],
    );
    let part = part(&["store.orders.yaml"]);
    assert_eq!(
        declared_elsewhere(&shared, &part, "toa-operator.shop"),
        None
    );
}

#[test]
fn declarations_no_composition_made_are_not_changed() {
    let users = declarations(
        Vec::new(),
        vec![written_by("kubectl-create", json!({"f:data": {}}))],
        &["a.b.yaml"],
    );
    let why = declared_elsewhere(&users, &part(&["c.d.yaml"]), "toa-operator.shop").unwrap();
    assert!(why.starts_with("the ConfigMap toa-declarations exists and is not this Composition's (no controller; written by kubectl-create)"), "{why}");
}
