use super::*;
use kube::core::ObjectList;
use serde_json::{json, Value};

/// `levels` objects nested in one another: `{"a":{"a":…{}}}`.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!({}), |inner, _| json!({ "a": inner }))
}

/// `value` as JSON text; serde_json's own writer has no nesting limit.
fn text(value: &Value) -> String {
    serde_json::to_string(value).unwrap()
}

fn healthy() -> Composition {
    Composition::test(CompositionSpec::test())
}

/// A Composition whose component configuration nests 200 levels, with the managed fields an API
/// server writes for it (as deep again).
fn poison() -> Value {
    let mut object = serde_json::to_value(healthy()).unwrap();
    object["metadata"]["name"] = json!("poison");
    object["spec"]["components"][0]["configuration"] = nested(200);
    object["metadata"]["managedFields"] = json!([{
        "manager": "kubectl-client-side-apply",
        "operation": "Update",
        "fieldsType": "FieldsV1",
        "fieldsV1": nested(210),
    }]);
    object
}

fn page(items: Vec<Value>) -> String {
    text(&json!({
        "apiVersion": "toa.io/v1alpha1",
        "kind": "CompositionList",
        "metadata": { "resourceVersion": "7" },
        "items": items,
    }))
}

#[test]
fn one_deep_composition_fails_a_page_of_compositions_but_not_a_page_of_stored_ones() {
    let page = page(vec![serde_json::to_value(healthy()).unwrap(), poison()]);
    let whole = serde_json::from_str::<ObjectList<Composition>>(&page).unwrap_err();
    assert!(whole.to_string().contains("recursion limit"), "{whole}");

    let list = serde_json::from_str::<ObjectList<Stored>>(&page).unwrap();
    assert_eq!(list.items[0].decode().unwrap(), healthy());
    assert_eq!(list.items[1].metadata.name.as_deref(), Some("poison"));
    let why = list.items[1].decode().unwrap_err().to_string();
    assert!(
        why.starts_with("the spec cannot be read: recursion limit exceeded at line 1"),
        "{why}"
    );
}

#[test]
fn the_metadata_is_read_without_its_managed_fields_and_otherwise_whole() {
    let stored = serde_json::from_str::<Stored>(&text(&poison())).unwrap();
    assert_eq!(stored.metadata.managed_fields, None);
    let mut expected = healthy().metadata;
    expected.name = Some("poison".into());
    assert_eq!(stored.metadata, expected);
}

#[test]
fn a_spec_the_types_refuse_is_undecodable_naming_the_field() {
    let mut object = serde_json::to_value(healthy()).unwrap();
    object["spec"]["replicas"] = json!("three");
    let stored = serde_json::from_str::<Stored>(&text(&object)).unwrap();
    let why = stored.decode().unwrap_err().to_string();
    assert!(why.contains("invalid type: string \"three\""), "{why}");

    object["spec"] = Value::Null;
    let stored = serde_json::from_str::<Stored>(&text(&object)).unwrap();
    assert!(stored.decode().is_err());
    object.as_object_mut().unwrap().remove("spec");
    let stored = serde_json::from_str::<Stored>(&text(&object)).unwrap();
    assert_eq!(
        stored.decode().unwrap_err(),
        Undecodable("the object has no spec".into())
    );
}

#[test]
fn a_status_that_does_not_decode_counts_as_none() {
    let mut object = serde_json::to_value(healthy()).unwrap();
    object["status"] = json!({ "conditions": "all fine" });
    let stored = serde_json::from_str::<Stored>(&text(&object)).unwrap();
    assert_eq!(stored.status(), None);
    assert_eq!(stored.decode().unwrap(), healthy());

    object["status"] = json!({ "observedGeneration": 4 });
    let stored = serde_json::from_str::<Stored>(&text(&object)).unwrap();
    assert_eq!(stored.status().unwrap().observed_generation, Some(4));
}

#[test]
fn a_stored_composition_is_named_as_a_composition() {
    let composition = healthy();
    let stored = Stored::from(&composition);
    assert_eq!(stored.object_ref(&()), composition.object_ref(&()));
    assert_eq!(
        Stored::url_path(&(), Some("shop")),
        Composition::url_path(&(), Some("shop"))
    );
    assert_eq!(stored.decode().unwrap(), composition);
}
