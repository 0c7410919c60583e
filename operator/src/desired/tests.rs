use super::*;
use crate::crd::{CompositionSpec, CredentialsSpec};
use crate::validate::validate;
use k8s_openapi::api::core::v1::PodSpec;

fn settings(sidecar: Sidecar) -> Settings {
    Settings {
        agent_image: "registry.example.com/toa-agent:0.1".into(),
        sidecar,
    }
}

fn build(spec: CompositionSpec, sidecar: Sidecar, replicas: i32) -> Desired {
    let composition = Composition::test(spec);
    let valid = validate(&composition.spec).unwrap();
    desired(&composition, &valid, &settings(sidecar), "s3cret", replicas).unwrap()
}

fn pod(desired: &Desired) -> &PodSpec {
    desired
        .deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn env(container: &Container) -> BTreeMap<String, EnvVar> {
    container
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|var| (var.name.clone(), var))
        .collect()
}

#[test]
fn every_object_is_labelled_and_owned_by_the_composition() {
    let desired = build(CompositionSpec::test(), Sidecar::Native, 2);
    let metas = [
        &desired.components.metadata,
        &desired.control.metadata,
        &desired.deployment.metadata,
    ];
    let names: Vec<_> = metas.iter().map(|m| m.name.clone().unwrap()).collect();
    assert_eq!(names, ["shop-components", "shop-control", "shop"]);
    for meta in metas {
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        let labels = meta.labels.clone().unwrap();
        assert_eq!(labels["app.kubernetes.io/name"], "toa");
        assert_eq!(labels["app.kubernetes.io/instance"], "shop");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "toa-operator");
        assert_eq!(labels["toa.io/composition"], "shop");
        let owners = meta.owner_references.clone().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "Composition");
        assert_eq!(owners[0].name, "shop");
        assert_eq!(owners[0].controller, Some(true));
    }
}

#[test]
fn the_deployment_selects_its_own_pods_with_the_requested_replicas() {
    let desired = build(CompositionSpec::test(), Sidecar::Native, 0);
    let spec = desired.deployment.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(0));
    let selector = spec.selector.match_labels.unwrap();
    let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
    for (key, value) in &selector {
        assert_eq!(pod_labels.get(key), Some(value), "{key}");
    }
}

#[test]
fn the_agent_is_a_native_sidecar_on_new_servers_and_a_container_on_old_ones() {
    let native = build(CompositionSpec::test(), Sidecar::Native, 1);
    let pod_spec = pod(&native);
    assert_eq!(pod_spec.containers.len(), 1);
    assert_eq!(pod_spec.containers[0].name, "component");
    assert_eq!(
        pod_spec.containers[0].image.as_deref(),
        Some("registry.example.com/shop:1.0")
    );
    let init = pod_spec.init_containers.clone().unwrap();
    assert_eq!(init[0].name, "agent");
    assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));

    let plain = build(CompositionSpec::test(), Sidecar::Plain, 1);
    let pod_spec = pod(&plain);
    assert_eq!(pod_spec.init_containers, None);
    let names: Vec<_> = pod_spec
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["component", "agent"]);
    assert_eq!(pod_spec.containers[1].restart_policy, None);
}

#[test]
fn sidecar_style_follows_the_server_version() {
    assert_eq!(Sidecar::for_server("1", "29"), Sidecar::Native);
    assert_eq!(Sidecar::for_server("1", "33+"), Sidecar::Native);
    assert_eq!(Sidecar::for_server("2", "0"), Sidecar::Native);
    assert_eq!(Sidecar::for_server("1", "28"), Sidecar::Plain);
    assert_eq!(Sidecar::for_server("1", "20"), Sidecar::Plain);
    assert_eq!(Sidecar::for_server("", "x"), Sidecar::Plain);
}

#[test]
fn the_agent_composes_every_component_with_its_control_endpoint() {
    let spec = CompositionSpec::test().with_components(vec![
        crate::crd::ComponentSpec::test("store", "orders"),
        crate::crd::ComponentSpec::test("store", "mail"),
    ]);
    let desired = build(spec, Sidecar::Plain, 1);
    let agent = &pod(&desired).containers[1];
    assert_eq!(
        agent.image.as_deref(),
        Some("registry.example.com/toa-agent:0.1")
    );
    assert_eq!(
        agent.command.clone().unwrap(),
        [
            "toa-agent",
            "compose",
            "/components/store.orders",
            "/components/store.mail",
            "--listen",
            "127.0.0.1:7090",
            "--control-listen",
            "0.0.0.0:7091",
            "--control-token-file",
            "/var/run/toa/control/token",
        ]
    );
    let probe = agent.liveness_probe.clone().unwrap();
    assert_eq!(probe.tcp_socket.unwrap().port, IntOrString::Int(7091));
    assert_eq!(agent.readiness_probe, None);
}

#[test]
fn manifests_are_mounted_one_per_component_directory() {
    let spec = CompositionSpec::test().with_components(vec![
        crate::crd::ComponentSpec::test("store", "orders"),
        crate::crd::ComponentSpec::test("store", "mail"),
    ]);
    let desired = build(spec, Sidecar::Native, 1);
    let data = desired.components.data.clone().unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["store.mail.yaml", "store.orders.yaml"]
    );
    let manifest = toa_context::Manifest::parse(&data["store.orders.yaml"], "cm").unwrap();
    assert_eq!(manifest.full_name(), "store.orders");

    let volumes = pod(&desired).volumes.clone().unwrap();
    let config_map = volumes[0].config_map.clone().unwrap();
    assert_eq!(config_map.name, "shop-components");
    let items: Vec<_> = config_map
        .items
        .unwrap()
        .into_iter()
        .map(|item| (item.key, item.path))
        .collect();
    assert_eq!(
        items,
        [
            (
                "store.orders.yaml".to_owned(),
                "store.orders/manifest.toa.yaml".to_owned()
            ),
            (
                "store.mail.yaml".to_owned(),
                "store.mail/manifest.toa.yaml".to_owned()
            ),
        ]
    );
    let secret = volumes[1].secret.clone().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("shop-control"));
    let agent = &pod(&desired).init_containers.clone().unwrap()[0];
    let mounts: Vec<_> = agent
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| (m.name, m.mount_path))
        .collect();
    assert_eq!(
        mounts,
        [
            ("components".to_owned(), "/components".to_owned()),
            ("control".to_owned(), "/var/run/toa/control".to_owned()),
        ]
    );
}

#[test]
fn the_control_secret_holds_the_given_token() {
    let desired = build(CompositionSpec::test(), Sidecar::Native, 1);
    let data = desired.control.data.unwrap();
    assert_eq!(data["token"].0, b"s3cret");
}

#[test]
fn the_agent_gets_the_context_and_credentials_from_the_environment() {
    let mut spec =
        CompositionSpec::test().with_redis(&["redis://a:6379", "redis://b:6379", "redis://c:6379"]);
    spec.context.amqp = Some("amqp://rabbit:5672".into());
    spec.credentials = Some(CredentialsSpec {
        secret_name: "shop-backends".into(),
    });
    let desired = build(spec, Sidecar::Native, 1);
    let agent = &pod(&desired).init_containers.clone().unwrap()[0];
    let env = env(agent);
    let value = |name: &str| env[name].value.clone().unwrap();
    assert_eq!(value("TOA_APPLICATION"), "shop");
    assert_eq!(
        value("TOA_ATOMICITY_REDIS"),
        "redis://a:6379,redis://b:6379,redis://c:6379"
    );
    assert_eq!(value("TOA_ATOMICITY_INTERVAL"), "5000");
    assert_eq!(value("TOA_ATOMICITY_TTL"), "10000");
    assert_eq!(value("TOA_ADDRESSED_TIMEOUT"), "5000");
    assert!(value("TOA_AMQP").starts_with("amqp://rabbit:5672"));
    assert!(!env.contains_key("TOA_ENV"));
    let instance = env["TOA_INSTANCE"].value_from.clone().unwrap();
    assert_eq!(instance.field_ref.unwrap().field_path, "metadata.name");
    for (variable, key) in [
        ("TOA_REDIS_USERNAME", "redis-username"),
        ("TOA_REDIS_PASSWORD", "redis-password"),
        ("TOA_AMQP_USERNAME", "amqp-username"),
        ("TOA_AMQP_PASSWORD", "amqp-password"),
    ] {
        let reference = env[variable]
            .value_from
            .clone()
            .unwrap()
            .secret_key_ref
            .unwrap();
        assert_eq!(reference.name, "shop-backends");
        assert_eq!(reference.key, key);
        assert_eq!(reference.optional, Some(true));
    }
}

#[test]
fn without_atomicity_broker_or_credentials_their_variables_are_absent() {
    let desired = build(CompositionSpec::test(), Sidecar::Native, 1);
    let env = env(&pod(&desired).init_containers.clone().unwrap()[0]);
    let names: Vec<_> = env.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["TOA_ADDRESSED_TIMEOUT", "TOA_APPLICATION", "TOA_INSTANCE"]
    );
}

#[test]
fn a_composition_not_read_from_the_server_is_refused() {
    let composition = Composition::new("shop", CompositionSpec::test());
    let valid = validate(&composition.spec).unwrap();
    let error = desired(&composition, &valid, &settings(Sidecar::Plain), "t", 1).unwrap_err();
    assert_eq!(error, NotStored("shop".into()));
}

#[test]
fn the_controllers_watch_selector_matches_the_labels() {
    let labels = labels("shop");
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some(MANAGER)
    );
    assert_eq!(pod_selector("shop"), "toa.io/composition=shop");
}
