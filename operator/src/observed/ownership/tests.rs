use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, OwnerReference,
};
use serde_json::json;

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
