use super::*;
use serde_json::json;

/// A Composition as `kubectl apply` would send it, with these Redis addresses.
fn with_redis(redis: &[&str]) -> Composition {
    Composition::new("shop", CompositionSpec::test().with_redis(redis))
}

fn cel_messages(composition: &Composition) -> Result<(), Vec<String>> {
    kube::core::cel::validate_cel(composition)
        .map_err(|errors| errors.iter().map(|error| error.message.clone()).collect())
}

#[test]
fn the_generated_crd_matches_crds_composition_yaml() {
    let committed = include_str!("../../../crds/composition.yaml");
    assert!(
        crd_yaml() == committed,
        "crds/composition.yaml differs from the CRD generated from operator/src/crd.rs; \
         regenerate it with `cargo run -p toa-operator --bin crdgen > crds/composition.yaml`"
    );
}

#[test]
fn the_helm_charts_crd_matches_the_generated_crd() {
    let chart = include_str!("../../../charts/toa-operator/files/composition.yaml");
    assert!(
        crd_yaml() == chart,
        "charts/toa-operator/files/composition.yaml differs from the CRD generated from \
         operator/src/crd.rs; copy it from crds/composition.yaml after regenerating that \
         (`cargo run -p toa-operator --bin crdgen > crds/composition.yaml`)"
    );
}

#[test]
fn the_cel_rule_passes_one_and_three_addresses_and_refuses_two_with_the_count() {
    assert_eq!(cel_messages(&with_redis(&["redis://a"])), Ok(()));
    assert_eq!(
        cel_messages(&with_redis(&["redis://a", "redis://b", "redis://c"])),
        Ok(())
    );
    assert_eq!(
        cel_messages(&with_redis(&["redis://a", "redis://b"])),
        Err(vec![
            "Atomicity takes an odd number of addresses, 2 given.".to_owned()
        ])
    );
    // Without atomicity there is nothing to count.
    assert_eq!(
        cel_messages(&Composition::new("shop", CompositionSpec::test())),
        Ok(())
    );
}

#[test]
fn the_crd_names_and_columns() {
    let crd = Composition::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("compositions.toa.io"));
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["comp".to_owned()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    let subresources = version.subresources.as_ref().unwrap();
    assert!(subresources.status.is_some());
    // `kubectl scale` and an autoscaler: spec.replicas, the pods counted, their selector.
    let scale = subresources.scale.as_ref().unwrap();
    assert_eq!(
        (
            scale.spec_replicas_path.as_str(),
            scale.status_replicas_path.as_str(),
            scale.label_selector_path.as_deref()
        ),
        (
            ".spec.replicas",
            ".status.replicas",
            Some(".status.selector")
        )
    );
    let columns: Vec<(&str, &str)> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|column| (column.name.as_str(), column.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Ready", ".status.ready"),
            ("Up-to-date", ".status.updatedReplicas"),
            (
                "Halted",
                r#".status.conditions[?(@.type=="Halted")].status"#
            ),
            (
                "Degraded",
                r#".status.conditions[?(@.type=="Degraded")].status"#
            ),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn lists_merge_by_key_under_server_side_apply() {
    let schema = serde_json::to_value(&Composition::crd().spec.versions[0].schema).unwrap();
    let root = &schema["openAPIV3Schema"]["properties"];
    let conditions = &root["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    let components = &root["spec"]["properties"]["components"];
    assert_eq!(components["x-kubernetes-list-type"], "map");
    assert_eq!(components["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(components["minItems"], 1);
    let manifest = &components["items"]["properties"]["manifest"];
    assert_eq!(manifest["x-kubernetes-preserve-unknown-fields"], true);
}

#[test]
fn omitted_fields_take_their_defaults() {
    let composition: Composition = serde_yaml::from_str(
        "apiVersion: toa.io/v1alpha1
kind: Composition
metadata: { name: shop }
spec:
  application: shop
  image: shop:1
  components: [{ name: orders, manifest: { name: orders } }]
  context: { atomicity: { redis: [redis://a] } }
",
    )
    .unwrap();
    let spec = composition.spec;
    assert_eq!(spec.replicas, 1);
    assert!(!spec.halted);
    let atomicity = spec.context.atomicity.unwrap();
    assert_eq!((atomicity.interval, atomicity.ttl), (5000, 10_000));
    assert_eq!(spec.context.addressed.timeout, 5000);
    assert_eq!(HaltSpec::default().quiet_window, 30);
    assert_eq!(HaltSpec::default().grace, 60);
}

#[test]
fn condition_finds_a_condition_by_type() {
    let mut composition = Composition::new("shop", CompositionSpec::test());
    assert!(composition.condition(conditions::READY).is_none());
    composition.status = Some(CompositionStatus {
        observed_generation: Some(3),
        conditions: vec![Condition {
            type_: conditions::READY.into(),
            status: "False".into(),
            reason: reasons::INVALID_SPEC.into(),
            message: "Atomicity takes an odd number of addresses, 2 given.".into(),
            observed_generation: Some(3),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }],
        ..CompositionStatus::default()
    });
    let ready = composition.condition(conditions::READY).unwrap();
    assert_eq!(ready.reason, "InvalidSpec");
    assert!(composition.condition(conditions::HALTED).is_none());
}

#[test]
fn the_crd_stays_well_under_the_api_servers_limits() {
    // etcd takes objects up to 1.5 MiB, and a large schema costs every client that reads it:
    // the CRD stays under 200 KiB.
    let size = crate::crd::crd_yaml().len();
    assert!(size < 200 * 1024, "{size} bytes");
}
