use super::*;
use crate::crd::{ComponentSpec, CompositionSpec, CredentialsSpec};
use crate::names::pod_selector;
use crate::observed::rollout::drain_key_of;
use crate::validate::validate;
use k8s_openapi::api::core::v1::PodSpec;

/// The pods' drain key in these tests.
const DRAIN: &str = "d7a1e5d7a1e5d7a1e5d7a1e5d7a1e5d7a1e5d7a1e5d7a1e5d7a1e5d7a1e5d7a1";

fn build(spec: CompositionSpec, replicas: i32) -> Desired {
    let composition = Composition::test(spec);
    let valid = validate(&composition.spec).unwrap();
    let keys = Keys::one("s3cret");
    desired(
        &composition,
        &valid,
        &Settings::test(),
        &keys,
        DRAIN,
        replicas,
    )
    .unwrap()
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

/// The agent container (an init container: a native sidecar).
fn agent_of(desired: &Desired) -> Container {
    all_containers(desired)
        .into_iter()
        .find(|c| c.name == AGENT_CONTAINER)
        .unwrap()
}

/// Every container of the pod, the agent (the init container) first.
fn all_containers(desired: &Desired) -> Vec<Container> {
    let pod_spec = pod(desired);
    pod_spec
        .init_containers
        .iter()
        .flatten()
        .chain(&pod_spec.containers)
        .cloned()
        .collect()
}

fn volume(desired: &Desired, name: &str) -> Volume {
    pod(desired)
        .volumes
        .clone()
        .unwrap()
        .into_iter()
        .find(|v| v.name == name)
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
    let desired = build(CompositionSpec::test(), 2);
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
    let desired = build(CompositionSpec::test(), 0);
    let spec = desired.deployment.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(0));
    let selector = spec.selector.match_labels.unwrap();
    let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
    for (key, value) in &selector {
        assert_eq!(pod_labels.get(key), Some(value), "{key}");
    }
}

#[test]
fn the_agent_is_a_native_sidecar() {
    let native = build(CompositionSpec::test(), 1);
    let pod_spec = pod(&native);
    assert_eq!(pod_spec.containers.len(), 1);
    assert_eq!(pod_spec.containers[0].name, "store-orders");
    assert_eq!(
        pod_spec.containers[0].image.as_deref(),
        Some("registry.example.com/shop:1.0")
    );
    let init = pod_spec.init_containers.clone().unwrap();
    let init_names: Vec<_> = init.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(init_names, ["agent"]);
    assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
    // The startupProbe holds the components back until the listeners are bound; no hook.
    assert!(init[0].startup_probe.is_some());
    assert_eq!(init[0].lifecycle.clone().unwrap().post_start, None);
}

#[test]
fn the_agent_composes_every_component_with_its_control_endpoint() {
    let spec = CompositionSpec::test().with_components(vec![
        crate::crd::ComponentSpec::test("store", "orders"),
        crate::crd::ComponentSpec::test("store", "mail"),
    ]);
    let desired = build(spec, 1);
    let agent = &agent_of(&desired);
    assert_eq!(agent.name, "agent");
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
            "--attach",
            "7100",
            "--probe-listen",
            "0.0.0.0:7092",
            "--declarations",
            "/var/run/toa/declarations",
            "--drain-key-sha256",
            &toa_context::control::drain_digest(DRAIN),
            "--component-tokens",
            "/var/run/toa/tokens",
        ]
    );
    assert!(
        agent.readiness_probe.is_some(),
        "ready by its probe listener"
    );
}

#[test]
fn manifests_are_mounted_one_per_component_directory() {
    let spec = CompositionSpec::test().with_components(vec![
        crate::crd::ComponentSpec::test("store", "orders"),
        crate::crd::ComponentSpec::test("store", "mail"),
    ]);
    let desired = build(spec, 1);
    let data = desired.components.data.clone().unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["store.mail.yaml", "store.orders.yaml"]
    );
    let manifest = toa_context::Manifest::parse(&data["store.orders.yaml"], "cm").unwrap();
    assert_eq!(manifest.full_name(), "store.orders");

    let config_map = volume(&desired, "components").config_map.unwrap();
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
    let secret = volume(&desired, "control").secret.unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("shop-control"));
    let agent = &agent_of(&desired);
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
            (
                "declarations".to_owned(),
                "/var/run/toa/declarations".to_owned()
            ),
            ("control".to_owned(), "/var/run/toa/control".to_owned()),
            ("token-0".to_owned(), "/var/run/toa/tokens/0".to_owned()),
            ("token-1".to_owned(), "/var/run/toa/tokens/1".to_owned()),
        ]
    );
    // The namespace's declarations: optional (a pod never waits on them), read by the agent.
    let declarations = volume(&desired, "declarations").config_map.unwrap();
    assert_eq!(
        (declarations.name.as_str(), declarations.optional),
        ("toa-declarations", Some(true))
    );
    let command = agent.command.clone().unwrap();
    let at = command.iter().position(|a| a == "--declarations").unwrap();
    assert_eq!(command[at + 1], "/var/run/toa/declarations");
}

#[test]
fn the_namespace_declarations_hold_the_manifests_and_are_owned_not_controlled() {
    let desired = build(CompositionSpec::test(), 1);
    let declarations = &desired.declarations;
    assert_eq!(
        declarations.metadata.name.as_deref(),
        Some("toa-declarations")
    );
    assert_eq!(declarations.data, desired.components.data);
    let owners = declarations.metadata.owner_references.clone().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].controller),
        ("Composition", None)
    );
}

#[test]
fn the_control_secret_holds_the_given_tokens_and_the_deployment_its_drain_key() {
    let desired = build(CompositionSpec::test(), 1);
    let data = desired.control.data.unwrap();
    assert_eq!(data["token"].0, b"s3cret");
    assert!(!data.contains_key("previous"));
    let owner = Owner::of(&Composition::test(CompositionSpec::test())).unwrap();
    let rotating = Keys {
        current: "new".into(),
        previous: Some("old".into()),
    };
    let data = control_secret(&owner, &rotating).data.unwrap();
    assert_eq!(
        (&data["token"].0[..], &data["previous"].0[..]),
        (&b"new"[..], &b"old"[..])
    );
    assert_eq!(drain_key_of(&desired.deployment).as_deref(), Some(DRAIN));
    let mut other = desired.deployment.clone();
    other.metadata.annotations = Some([(DRAIN_KEY.to_owned(), "short".to_owned())].into());
    assert_eq!(
        drain_key_of(&other),
        None,
        "only a key this operator makes is kept"
    );
}

#[test]
fn the_agent_gets_the_context_and_credentials_from_the_environment() {
    let mut spec =
        CompositionSpec::test().with_redis(&["redis://a:6379", "redis://b:6379", "redis://c:6379"]);
    spec.context.amqp = Some("amqp://rabbit:5672".into());
    spec.credentials = Some(CredentialsSpec {
        secret_name: "shop-backends".into(),
    });
    let desired = build(spec, 1);
    let agent = &agent_of(&desired);
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
        ("TOA_TLS_CA", "ca.crt"),
        ("TOA_STORAGE_USERNAME", "storage-username"),
        ("TOA_STORAGE_PASSWORD", "storage-password"),
        ("TOA_STORAGE_CA", "storage-ca.crt"),
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
fn a_cloudnative_pg_cluster_gives_the_store_its_login_and_ca_and_the_operator_reads_neither() {
    let mut spec = CompositionSpec::test();
    spec.context.storage = Some("postgres://shop-db-rw:5432/app".into());
    spec.credentials = Some(CredentialsSpec {
        secret_name: "shop-backends".into(),
    });
    spec.storage = Some(crate::crd::StorageSpec {
        cloud_native_pg: "shop-db".into(),
    });
    let desired = build(spec, 1);
    let agent = agent_of(&desired);
    let names: Vec<String> = agent
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    let logins = names
        .iter()
        .filter(|n| *n == "TOA_STORAGE_USERNAME")
        .count();
    assert_eq!(
        logins, 1,
        "the credentials Secret's storage keys give way: {names:?}"
    );
    let env = env(&agent);
    assert_eq!(
        env["TOA_STORAGE"].value.as_deref(),
        Some("postgres://shop-db-rw:5432/app")
    );
    for (variable, secret, key) in [
        ("TOA_STORAGE_USERNAME", "shop-db-app", "username"),
        ("TOA_STORAGE_PASSWORD", "shop-db-app", "password"),
        ("TOA_STORAGE_CA", "shop-db-ca", "ca.crt"),
    ] {
        let reference = env[variable]
            .value_from
            .clone()
            .unwrap()
            .secret_key_ref
            .unwrap();
        assert_eq!(
            (reference.name.as_str(), reference.key.as_str()),
            (secret, key)
        );
        assert_eq!(reference.optional, Some(false), "{variable}");
    }
    // Redis's and the broker's still come from the credentials Secret.
    let redis = env["TOA_REDIS_USERNAME"].value_from.clone().unwrap();
    assert_eq!(redis.secret_key_ref.unwrap().name, "shop-backends");
}

#[test]
fn without_atomicity_broker_or_credentials_their_variables_are_absent() {
    let desired = build(CompositionSpec::test(), 1);
    let env = env(&agent_of(&desired));
    let names: Vec<_> = env.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "TOA_ADDRESSED_TIMEOUT",
            "TOA_APPLICATION",
            "TOA_HOST_IPS",
            "TOA_INSTANCE",
            "TOA_KUBERNETES_NAMESPACE",
            "TOA_LIMIT_DELIVERIES",
            "TOA_LIMIT_DRAIN",
            "TOA_LIMIT_EVENTS",
            "TOA_LIMIT_IDEMPOTENCY",
            "TOA_LIMIT_INFLIGHT",
            "TOA_LIMIT_MESSAGE",
            "TOA_LIMIT_ONCE",
            "TOA_LIMIT_OPERATION",
            "TOA_LIMIT_QUEUE",
            "TOA_LIMIT_RUN_COMMAND",
        ]
    );
}

#[test]
fn the_agents_variables_read_back_into_the_validated_context() {
    let mut spec = CompositionSpec::test().with_redis(&["redis://r0", "redis://r1", "redis://r2"]);
    spec.context.amqp = Some("amqp://broker:5673/shop".into());
    spec.credentials = Some(crate::crd::CredentialsSpec {
        secret_name: "shop-backends".into(),
    });
    spec.context.limits = crate::crd::LimitsSpec {
        queue: Some(500),
        drain: Some(4000),
        ..Default::default()
    };
    let valid = validate(&spec).unwrap();
    let desired = build(spec, 1);
    let vars: std::collections::HashMap<String, String> = env(&agent_of(&desired))
        .into_iter()
        .filter_map(|(name, var)| Some((name, var.value?)))
        .collect();
    assert_eq!(
        toa_context::Context::from_vars(&vars).unwrap(),
        valid.context
    );
    assert_eq!(valid.context.limits.queue, 500);
}

#[test]
fn a_composition_not_read_from_the_server_is_refused() {
    let composition = Composition::new("shop", CompositionSpec::test());
    let valid = validate(&composition.spec).unwrap();
    let keys = Keys::one("t");
    let error = desired(&composition, &valid, &Settings::test(), &keys, DRAIN, 1).unwrap_err();
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

#[test]
fn the_agent_attaches_to_the_components_from_port_7100() {
    let desired = build(CompositionSpec::test(), 1);
    let command = agent_of(&desired).command.unwrap();
    let at = command.iter().position(|arg| arg == "--attach").unwrap();
    assert_eq!(command[at + 1], "7100");
    assert_eq!(ATTACH_PORT, 7100);
}

#[test]
fn each_component_runs_its_program_in_its_own_container_in_the_agents_order() {
    let mut mail = crate::crd::ComponentSpec::test("store", "mail");
    mail.manifest.insert(
        "program".into(),
        serde_json::json!(["node", "mail.js", "--quiet"]),
    );
    let spec = CompositionSpec::test().with_components(vec![
        crate::crd::ComponentSpec::test("store", "orders"),
        mail,
    ]);
    let desired = build(spec, 1);
    let pod_spec = pod(&desired);
    let agent = &agent_of(&desired);
    let arguments: Vec<_> = agent
        .command
        .clone()
        .unwrap()
        .into_iter()
        .filter(|arg| arg.starts_with("/components/"))
        .collect();
    assert_eq!(
        arguments,
        ["/components/store.orders", "/components/store.mail"]
    );

    let containers = &pod_spec.containers;
    let names: Vec<_> = containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["store-orders", "store-mail"]);
    let expected = [
        ("store.orders", "7100", vec!["python3", "orders.py"]),
        ("store.mail", "7101", vec!["node", "mail.js", "--quiet"]),
    ];
    for (index, (container, (full_name, port, program))) in
        containers.iter().zip(expected).enumerate()
    {
        assert_eq!(
            container.image.as_deref(),
            Some("registry.example.com/shop:1.0")
        );
        assert_eq!(container.command.clone().unwrap(), program);
        assert_eq!(container.args, None);
        assert_eq!(
            container.working_dir.as_deref(),
            Some(format!("/components/{full_name}").as_str())
        );
        let env = container.env.clone().unwrap();
        let names: Vec<_> = env.iter().map(|var| var.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "TOA_PORT",
                "TOA_AGENT",
                "TOA_COMPONENT",
                "TOA_INSTANCE",
                "TOA_AGENT_TOKEN_FILE",
                "TOA_CONFIGURATION"
            ]
        );
        assert_eq!(env[4].value.as_deref(), Some("/var/run/toa/agent/token"));
        assert_eq!(
            env[5].value.as_deref(),
            Some("{}"),
            "no schema: nothing configured"
        );
        assert_eq!(env[0].value.as_deref(), Some(port));
        assert_eq!(env[1].value.as_deref(), Some("http://127.0.0.1:7090"));
        assert_eq!(env[2].value.as_deref(), Some(full_name));
        let instance = env[3].value_from.clone().unwrap();
        assert_eq!(instance.field_ref.unwrap().field_path, "metadata.name");
        // The image's own /components/<name>/ is the program's directory: nothing is mounted
        // over it; the control token and the agent's binary stay with the agent. Mounted: its
        // own local API token's volume, read-only, and no other component's.
        let mounts = container.volume_mounts.clone().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(
            (
                mounts[0].name.as_str(),
                mounts[0].mount_path.as_str(),
                mounts[0].read_only
            ),
            (
                format!("token-{index}").as_str(),
                "/var/run/toa/agent",
                Some(true)
            )
        );
        let hooks = container.lifecycle.clone().unwrap();
        let post_start = hooks.post_start.unwrap().http_get.unwrap();
        assert_eq!(
            (post_start.path.unwrap(), post_start.port),
            (
                format!("/started/{index}/{}", DRAIN),
                IntOrString::Int(7092)
            )
        );
        let pre_stop = hooks.pre_stop.unwrap();
        assert_eq!(pre_stop.exec, None);
        let drain = pre_stop.http_get.unwrap();
        let path = format!("/drain/{DRAIN}");
        assert_eq!(
            (drain.path.as_deref(), &drain.port, drain.host.as_deref()),
            (Some(path.as_str()), &IntOrString::Int(7092), None)
        );
        assert_eq!(drain.http_headers, None);
    }
}

#[test]
fn the_resources_apply_to_every_component_container_and_the_agent_has_its_own() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let resources = ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".into(),
            Quantity("256Mi".into()),
        )])),
        ..ResourceRequirements::default()
    };
    let mut spec = CompositionSpec::test().with_components(vec![
        crate::crd::ComponentSpec::test("store", "orders"),
        crate::crd::ComponentSpec::test("store", "mail"),
    ]);
    spec.resources = Some(resources.clone());
    let desired = build(spec, 1);
    let containers = all_containers(&desired);
    assert_eq!(containers.len(), 3);
    assert_eq!(containers[0].name, "agent");
    assert_eq!(
        containers[0].resources.as_ref(),
        Some(&Settings::test().agent_resources)
    );
    assert_eq!(containers[1].resources.as_ref(), Some(&resources));
    assert_eq!(containers[2].resources.as_ref(), Some(&resources));
}

#[test]
fn containers_are_named_after_their_components_as_dns_labels_however_long_the_names() {
    let long = "a".repeat(63);
    let longer = format!("{}b", "a".repeat(62));
    let spec = CompositionSpec::test().with_components(vec![
        crate::crd::ComponentSpec::test(&long, &long),
        crate::crd::ComponentSpec::test(&long, &longer),
        crate::crd::ComponentSpec::test("store", "orders"),
        crate::crd::ComponentSpec::test("store", "mail-"),
    ]);
    let desired = build(spec, 1);
    let names: Vec<_> = all_containers(&desired)
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(names[0], "agent");
    assert_eq!(names[3], "store-orders");
    // A name ending in `-` (component names may) is no DNS label as it is: hashed too.
    assert!(
        names[4].starts_with("store-mail-") && names[4].len() == 19,
        "{names:?}"
    );
    // Two long names that share their first 54 characters stay apart.
    assert!(names[1].starts_with(&"a".repeat(54)), "{names:?}");
    assert_ne!(names[1], names[2]);
    // `kubectl logs POD` shows the first component's program, not the agent.
    let template = desired.deployment.spec.as_ref().unwrap().template.clone();
    let annotations = template.metadata.unwrap().annotations.unwrap();
    assert_eq!(
        annotations["kubectl.kubernetes.io/default-container"],
        names[1]
    );
    for name in &names {
        assert!(name.len() <= 63, "{name}");
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{name}"
        );
        assert!(!name.ends_with('-'), "{name}");
    }
}

#[test]
fn the_generated_pod_meets_the_restricted_pod_security_profile() {
    let spec = |security: Option<crate::crd::SecuritySpec>| CompositionSpec {
        security_context: security,
        ..CompositionSpec::test().with_redis(&["redis://a"])
    };
    let variants = [
        None,
        Some(crate::crd::SecuritySpec {
            image_user: true,
            ..Default::default()
        }),
        Some(crate::crd::SecuritySpec {
            run_as_user: Some(1000),
            run_as_group: Some(1000),
            fs_group: Some(2000),
            image_user: false,
        }),
    ];
    for security in variants {
        let desired = build(spec(security.clone()), 2);
        assert_eq!(
            crate::restricted::violations(pod(&desired)),
            Vec::<String>::new(),
            "{security:?}"
        );
    }
}

#[test]
fn everything_runs_as_65532_and_the_agent_reads_its_token_through_the_pods_group() {
    let desired = build(CompositionSpec::test(), 1);
    let pod_spec = pod(&desired);
    let security = pod_spec.security_context.clone().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    // The kubelet writes the Secret's files root-owned; the fsGroup makes them the agent's
    // group's (a real kubelet: 0400 root:root without it, and the agent exits 64).
    assert_eq!(security.fs_group, Some(65532));
    assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    assert_eq!(
        volume(&desired, "control").secret.unwrap().default_mode,
        Some(0o440)
    );
    for container in &pod_spec.containers {
        let security = container.security_context.clone().unwrap();
        assert_eq!(
            (security.run_as_user, security.run_as_group),
            (Some(65532), Some(65532)),
            "{}",
            container.name
        );
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        // Why the agent stopped reaches `Degraded` through its termination message; a
        // component's log stays out of the Composition's status.
        assert_eq!(
            container.termination_message_policy.as_deref(),
            (container.name == AGENT_CONTAINER).then_some("FallbackToLogsOnError"),
            "{}",
            container.name
        );
        // Only the agent's root filesystem is read-only: a component may write where its
        // image lets it.
        let read_only = container.name == AGENT_CONTAINER;
        assert_eq!(
            security.read_only_root_filesystem.unwrap_or(false),
            read_only,
            "{}",
            container.name
        );
    }
}

#[test]
fn components_run_as_the_users_the_spec_names_and_the_agent_stays_65532() {
    let spec = |security| CompositionSpec {
        security_context: Some(security),
        ..CompositionSpec::test()
    };
    let users = |desired: &Desired| -> Vec<(String, Option<i64>, Option<i64>)> {
        all_containers(desired)
            .iter()
            .map(|c| {
                let s = c.security_context.clone().unwrap();
                (c.name.clone(), s.run_as_user, s.run_as_group)
            })
            .collect()
    };
    let image = build(
        spec(crate::crd::SecuritySpec {
            image_user: true,
            ..Default::default()
        }),
        1,
    );
    assert_eq!(
        users(&image),
        [
            ("agent".to_owned(), Some(65532), Some(65532)),
            ("store-orders".to_owned(), None, None)
        ]
    );
    let given = build(
        spec(crate::crd::SecuritySpec {
            run_as_user: Some(1000),
            run_as_group: Some(1001),
            fs_group: Some(2000),
            image_user: false,
        }),
        1,
    );
    assert_eq!(
        users(&given),
        [
            ("agent".to_owned(), Some(65532), Some(65532)),
            ("store-orders".to_owned(), Some(1000), Some(1001))
        ]
    );
    assert_eq!(
        pod(&given).security_context.clone().unwrap().fs_group,
        Some(2000)
    );
}

#[test]
fn no_credentials_or_agent_binary_reach_the_component_containers() {
    let desired = build(CompositionSpec::test(), 1);
    let pod_spec = pod(&desired);
    assert_eq!(pod_spec.automount_service_account_token, Some(false));
    assert_eq!(pod_spec.enable_service_links, Some(false));
    let volumes: Vec<String> = pod_spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    assert_eq!(
        volumes,
        ["components", "declarations", "control", "token-0"]
    );
    let tokens = pod_spec.volumes.as_ref().unwrap()[3]
        .empty_dir
        .clone()
        .unwrap();
    assert_eq!(tokens.medium.as_deref(), Some("Memory"));
    let agent = agent_of(&desired);
    let written: Vec<_> = agent
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.read_only != Some(true))
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    assert_eq!(written, [("token-0", "/var/run/toa/tokens/0")]);
    for container in &pod_spec.containers {
        if container.name != AGENT_CONTAINER {
            let mounts: Vec<_> = container
                .volume_mounts
                .iter()
                .flatten()
                .map(|m| &m.name)
                .collect();
            assert_eq!(mounts, ["token-0"], "{}", container.name);
            let text = serde_json::to_string(container).unwrap();
            assert!(
                !text.contains("s3cret")
                    && !text.contains("toa-agent")
                    && !text.contains(&toa_context::control::drain_digest(DRAIN)),
                "{text}"
            );
        }
    }
}

#[test]
fn the_pod_stops_within_a_grace_period_that_covers_the_drain() {
    let desired = build(CompositionSpec::test(), 1);
    let grace = pod(&desired).termination_grace_period_seconds.unwrap();
    // The drain's 25 s for calls in flight, dispose's 60 s, 5 s to stop the programs, a margin.
    assert_eq!(grace, 95);
    let mut spec = CompositionSpec::test();
    spec.context.limits.drain = Some(10_000);
    spec.context.limits.run_command = Some(120_500);
    let grace = pod(&build(spec, 1))
        .termination_grace_period_seconds
        .unwrap();
    assert_eq!(grace, 10 + 121 + 5 + 5);
    // The agent's own drain: the kubelet's `GET /drain/<key>`, from the node, as the
    // components' hooks; and the node's addresses, which the agent takes hooks from.
    let agent = agent_of(&desired);
    let pre_stop = agent.lifecycle.clone().unwrap().pre_stop.unwrap();
    assert_eq!(pre_stop.exec, None);
    let hook = pre_stop.http_get.unwrap();
    assert_eq!(hook.path.unwrap(), format!("/drain/{DRAIN}"));
    assert_eq!(hook.port, IntOrString::Int(7092));
    let from_the_pod = |name: &str| {
        let env = agent.env.clone().unwrap().into_iter();
        let var = env
            .filter(|var| var.name == name)
            .find_map(|var| var.value_from?.field_ref);
        var.unwrap().field_path
    };
    assert_eq!(from_the_pod("TOA_HOST_IPS"), "status.hostIPs");
    assert_eq!(
        from_the_pod("TOA_KUBERNETES_NAMESPACE"),
        "metadata.namespace"
    );
    // No `--node-networks`: no ranges besides the node's addresses.
    let env = agent.env.clone().unwrap();
    assert!(env.iter().all(|var| var.name != "TOA_NODE_NETWORKS"));
}

#[test]
fn node_networks_reach_the_agent() {
    let composition = Composition::test(CompositionSpec::test());
    let valid = validate(&composition.spec).unwrap();
    let mut settings = Settings::test();
    settings.node_networks = toa_context::network::networks("100.64.0.0/16,fd98::/64").unwrap();
    let desired = desired(
        &composition,
        &valid,
        &settings,
        &Keys::one("s3cret"),
        DRAIN,
        1,
    );
    let env = agent_of(&desired.unwrap()).env.clone().unwrap();
    let networks = env
        .iter()
        .find(|var| var.name == "TOA_NODE_NETWORKS")
        .unwrap();
    assert_eq!(networks.value.as_deref(), Some("100.64.0.0/16,fd98::/64"));
}

#[test]
fn liveness_and_startup_ask_healthz_on_the_probe_port_not_the_control_port() {
    let desired = build(CompositionSpec::test(), 1);
    let agent = agent_of(&desired);
    for (probe, period, failures) in [
        (agent.startup_probe.clone().unwrap(), 1, STARTUP_SECONDS),
        (agent.liveness_probe.clone().unwrap(), 10, 3),
    ] {
        assert_eq!(probe.tcp_socket, None);
        let get = probe.http_get.unwrap();
        assert_eq!(
            (get.path.as_deref(), get.port),
            (Some("/healthz"), IntOrString::Int(7092))
        );
        assert_eq!(probe.period_seconds, Some(period));
        assert_eq!(probe.failure_threshold, Some(failures));
    }
}

#[test]
fn the_agent_is_ready_by_its_probe_listener() {
    let desired = build(CompositionSpec::test(), 1);
    let agent = agent_of(&desired);
    let command = agent.command.clone().unwrap();
    let at = command
        .iter()
        .position(|arg| arg == "--probe-listen")
        .unwrap();
    assert_eq!(command[at + 1], "0.0.0.0:7092");
    let readiness = agent.readiness_probe.unwrap().http_get.unwrap();
    assert_eq!(
        (readiness.path.as_deref(), readiness.port),
        (Some("/readyz"), IntOrString::Int(7092))
    );
}

#[test]
fn the_agents_log_level_and_format_come_from_the_spec_and_are_absent_by_default() {
    let unset = env(&agent_of(&build(CompositionSpec::test(), 1)));
    assert!(!unset.contains_key("TOA_LOG_LEVEL") && !unset.contains_key("TOA_LOG_FORMAT"));
    let mut spec = CompositionSpec::test();
    spec.logs = Some(crate::crd::LogsSpec {
        level: Some(toa_context::logs::Level::Debug),
        format: Some(toa_context::logs::Format::Json),
    });
    let set = env(&agent_of(&build(spec, 1)));
    let value = |name: &str| set[name].value.clone().unwrap();
    assert_eq!(
        (value("TOA_LOG_LEVEL"), value("TOA_LOG_FORMAT")),
        ("debug".to_owned(), "json".to_owned())
    );
}

#[test]
fn the_agents_export_spans_where_the_spec_says_named_by_the_composition() {
    let unset = env(&agent_of(&build(CompositionSpec::test(), 1)));
    assert!(!unset.keys().any(|name| name.starts_with("OTEL_")));
    let mut spec = CompositionSpec::test();
    // The Composition `shop` of the application `store`: the spans say which Composition.
    spec.application = "store".to_owned();
    spec.traces = Some(crate::crd::TracesSpec {
        endpoint: "http://collector.monitoring:4318".to_owned(),
        service_name: None,
    });
    let set = env(&agent_of(&build(spec.clone(), 1)));
    let value = |set: &BTreeMap<String, EnvVar>, name: &str| set[name].value.clone().unwrap();
    assert_eq!(
        value(&set, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        "http://collector.monitoring:4318"
    );
    assert_eq!(value(&set, "OTEL_SERVICE_NAME"), "shop");
    spec.traces.as_mut().unwrap().service_name = Some("checkout".to_owned());
    let named = env(&agent_of(&build(spec, 1)));
    assert_eq!(value(&named, "OTEL_SERVICE_NAME"), "checkout");
}

#[test]
fn prometheus_finds_the_agents_metrics_on_the_probe_port() {
    let desired = build(CompositionSpec::test(), 1);
    let template = desired.deployment.spec.as_ref().unwrap().template.clone();
    let annotations = template.metadata.unwrap().annotations.unwrap();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let port: i32 = annotations["prometheus.io/port"].parse().unwrap();
    let named = agent_of(&desired)
        .ports
        .unwrap()
        .into_iter()
        .find(|p| p.name.as_deref() == Some("probe"))
        .unwrap();
    assert_eq!(
        named.container_port, port,
        "the annotated port is the probe port"
    );
}

#[test]
fn the_network_policy_lets_only_the_operator_reach_the_control_port() {
    let composition = Composition::test(CompositionSpec::test());
    let owner = Owner::of(&composition).unwrap();
    let from = ControlFrom {
        namespace: "ops".into(),
        pod_labels: [(
            "app.kubernetes.io/name".to_owned(),
            "toa-operator".to_owned(),
        )]
        .into(),
    };
    let policy = serde_json::to_value(network_policy(&owner, &from, &[])).unwrap();
    assert_eq!(policy["metadata"]["name"], "shop");
    assert_eq!(policy["metadata"]["namespace"], "shop");
    assert_eq!(
        policy["metadata"]["ownerReferences"][0]["kind"],
        "Composition"
    );
    let spec = &policy["spec"];
    assert_eq!(
        spec["podSelector"]["matchLabels"],
        serde_json::to_value(labels("shop")).unwrap()
    );
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
    let ingress = spec["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 2, "{spec}");
    assert_eq!(
        ingress[0]["ports"],
        serde_json::json!([{"port": 7091, "protocol": "TCP"}])
    );
    assert_eq!(
        ingress[0]["from"],
        serde_json::json!([{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "toa-operator"}}
        }])
    );
    assert_eq!(
        ingress[1]["ports"],
        serde_json::json!([{"port": 7092, "protocol": "TCP"}])
    );
    assert!(ingress[1].get("from").is_none(), "{spec}");
    assert!(
        spec.get("egress").is_none(),
        "egress is not restricted: {spec}"
    );

    // With egress rules: Egress too, DNS first, then the rules as given.
    let rules: Vec<k8s_openapi::api::networking::v1::NetworkPolicyEgressRule> =
        serde_json::from_value(serde_json::json!([
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 5672, "protocol": "TCP"}]}
        ]))
        .unwrap();
    let policy = serde_json::to_value(network_policy(&owner, &from, &rules)).unwrap();
    let spec = &policy["spec"];
    assert_eq!(
        spec["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert_eq!(
        spec["egress"],
        serde_json::json!([
            {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 5672, "protocol": "TCP"}]}
        ])
    );
    assert_eq!(spec["ingress"].as_array().unwrap().len(), 2);
}

#[test]
fn a_component_container_gets_its_configuration_with_the_defaults_filled_in() {
    let mut component = ComponentSpec::test("store", "orders");
    component.manifest.insert(
        "configuration".into(),
        serde_json::json!({
            "type": "object",
            "properties": {
                "provider": {"type": "string"},
                "batch": {"type": "integer", "minimum": 1, "default": 50}
            }
        }),
    );
    component.configuration = serde_json::json!({"provider": "smtp://mail"})
        .as_object()
        .cloned();
    let desired = build(
        CompositionSpec::test().with_components(vec![component.clone()]),
        1,
    );
    let env = pod(&desired).containers[0].env.clone().unwrap();
    let configuration = env
        .iter()
        .find(|var| var.name == "TOA_CONFIGURATION")
        .and_then(|var| var.value.as_deref())
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(configuration).unwrap(),
        serde_json::json!({"provider": "smtp://mail", "batch": 50})
    );

    // A value the schema refuses: the spec is refused, naming the component's configuration.
    component.configuration = serde_json::json!({"batch": 0}).as_object().cloned();
    let error = validate(&CompositionSpec::test().with_components(vec![component]))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("spec.components[0].configuration")
            && error.contains("store.orders: configuration/batch"),
        "{error}"
    );
}

#[test]
fn a_configurations_secret_comes_from_the_credentials_secret_and_only_to_its_component() {
    let mut mailer = ComponentSpec::test("store", "mailer");
    mailer.manifest.insert(
        "configuration".into(),
        serde_json::json!({
            "type": "object",
            "properties": {"password": {"type": "string", "minLength": 20}}
        }),
    );
    // "$MAILER_PASSWORD" is shorter than 20: the value is not the operator's to check.
    mailer.configuration = serde_json::json!({"password": "$MAILER_PASSWORD"})
        .as_object()
        .cloned();
    let components = vec![ComponentSpec::test("store", "orders"), mailer];
    let mut spec = CompositionSpec::test().with_components(components.clone());
    spec.credentials = Some(CredentialsSpec {
        secret_name: "shop-backends".into(),
    });
    let desired = build(spec, 1);
    let containers = &pod(&desired).containers;
    let secret_vars = |index: usize| -> Vec<_> {
        containers[index]
            .env
            .clone()
            .unwrap()
            .into_iter()
            .filter(|var| var.name.starts_with("TOA_SECRET_"))
            .collect()
    };
    assert!(secret_vars(0).is_empty(), "the other component gets none");
    let vars = secret_vars(1);
    assert_eq!(vars.len(), 1, "{vars:?}");
    assert_eq!(vars[0].name, "TOA_SECRET_MAILER_PASSWORD");
    assert!(vars[0].value.is_none());
    let reference = vars[0]
        .value_from
        .as_ref()
        .and_then(|from| from.secret_key_ref.as_ref())
        .unwrap();
    assert_eq!(
        (
            reference.name.as_str(),
            reference.key.as_str(),
            reference.optional
        ),
        ("shop-backends", "MAILER_PASSWORD", Some(false))
    );
    let configuration = containers[1]
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|var| var.name == "TOA_CONFIGURATION")
        .and_then(|var| var.value.clone())
        .unwrap();
    assert_eq!(
        configuration, r#"{"password":"$MAILER_PASSWORD"}"#,
        "the place, not the value"
    );

    // Without a credentials Secret there is nowhere to read it from: refused, naming it.
    let error = validate(&CompositionSpec::test().with_components(components))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("spec.components[1].configuration")
            && error.contains("$MAILER_PASSWORD")
            && error.contains("spec.credentials.secretName"),
        "{error}"
    );
}

#[test]
fn a_disruption_budget_limits_drains_from_two_replicas_on() {
    let one = CompositionSpec {
        replicas: 1,
        ..CompositionSpec::test()
    };
    assert!(build(one, 1).disruption_budget.is_none());
    let mut off = CompositionSpec::test();
    off.disruption_budget = Some(crate::crd::DisruptionBudgetSpec {
        enabled: false,
        ..Default::default()
    });
    assert!(build(off, 2).disruption_budget.is_none(), "turned off");
    // Made by the spec's count: while halted too, so it is in place when the pods come back.
    let two = build(CompositionSpec::test(), 0);
    let budget = two.disruption_budget.unwrap();
    let spec = budget.spec.unwrap();
    assert_eq!(
        spec.max_unavailable,
        Some(IntOrString::Int(1)),
        "one at a time by default"
    );
    // Pods that are not ready never hold a drain up.
    assert_eq!(
        spec.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    // It selects exactly the Deployment's pods.
    let deployment = two.deployment.spec.unwrap();
    assert_eq!(
        spec.selector.unwrap().match_labels,
        deployment.selector.match_labels
    );
    assert_eq!(
        budget.metadata.owner_references,
        two.deployment.metadata.owner_references
    );
    let mut asked = CompositionSpec::test();
    asked.disruption_budget = Some(crate::crd::DisruptionBudgetSpec {
        max_unavailable: 2,
        ..Default::default()
    });
    let three = build(asked, 3).disruption_budget.unwrap().spec.unwrap();
    assert_eq!(three.max_unavailable, Some(IntOrString::Int(2)));
}

#[test]
fn the_pod_gets_the_specs_placement_registries_and_metadata_and_keeps_the_operators() {
    let mut spec = CompositionSpec::test();
    let pod: crate::crd::PodSettings = serde_json::from_value(serde_json::json!({
        "labels": { "team": "payments" },
        "annotations": {
            "sidecar.istio.io/inject": "false",
            "cluster-autoscaler.kubernetes.io/safe-to-evict": "true"
        },
        "imagePullSecrets": [{ "name": "registry" }],
        "nodeSelector": { "kubernetes.io/arch": "arm64" },
        "tolerations": [{ "key": "dedicated", "operator": "Equal", "value": "toa", "effect": "NoSchedule" }],
        "priorityClassName": "high",
        "serviceAccountName": "builder",
    }))
    .unwrap();
    spec.pod = Some(pod);
    let mut mail = crate::crd::ComponentSpec::test("store", "mail");
    mail.resources =
        serde_json::from_value(serde_json::json!({ "limits": { "memory": "64Mi" } })).unwrap();
    spec.components.push(mail);
    spec.resources =
        serde_json::from_value(serde_json::json!({ "limits": { "memory": "1Gi" } })).unwrap();
    let desired = build(spec, 2);
    let template = desired.deployment.spec.unwrap().template;
    let metadata = template.metadata.unwrap();
    let labels = metadata.labels.unwrap();
    assert_eq!(labels["team"], "payments");
    assert_eq!(
        labels["toa.io/composition"], "shop",
        "the operator's labels stay"
    );
    let annotations = metadata.annotations.unwrap();
    assert_eq!(annotations["sidecar.istio.io/inject"], "false");
    assert_eq!(annotations["prometheus.io/port"], "7092");
    let pod = template.spec.unwrap();
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "registry");
    assert_eq!(pod.node_selector.unwrap()["kubernetes.io/arch"], "arm64");
    assert_eq!(
        pod.tolerations.unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
    assert_eq!(pod.service_account_name.as_deref(), Some("builder"));
    // What the operator needs is not the spec's to change; the token only when asked for.
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert!(pod.security_context.unwrap().run_as_non_root.unwrap());
    // Each component's own resources, else the composition's.
    // Even a spec that got past validation cannot move the pods off the operator's selector.
    let composition = Composition::test(CompositionSpec::test());
    let mut valid = validate(&composition.spec).unwrap();
    valid
        .pod
        .labels
        .insert("toa.io/composition".into(), "other".into());
    let keys = Keys::one("s3cret");
    let made = super::desired(&composition, &valid, &Settings::test(), &keys, DRAIN, 1).unwrap();
    let made = made.deployment.spec.unwrap().template.metadata.unwrap();
    assert_eq!(made.labels.unwrap()["toa.io/composition"], "shop");
    let memory = |c: &Container| {
        c.resources.clone().unwrap().limits.unwrap()["memory"]
            .0
            .clone()
    };
    assert_eq!(memory(&pod.containers[0]), "1Gi");
    assert_eq!(memory(&pod.containers[1]), "64Mi");
}

#[test]
fn a_components_own_variables_follow_the_runtimes_in_its_container_only() {
    let mut orders = crate::crd::ComponentSpec::test("store", "orders");
    orders.env = serde_json::from_value(serde_json::json!([
        { "name": "REGION", "value": "eu" },
        { "name": "PAYMENTS_KEY", "valueFrom": { "secretKeyRef": { "name": "payments", "key": "api-key" } } },
        { "name": "FORMAT", "valueFrom": { "configMapKeyRef": { "name": "shop", "key": "format", "optional": true } } },
    ]))
    .unwrap();
    let spec = CompositionSpec::test().with_components(vec![
        orders,
        crate::crd::ComponentSpec::test("store", "mail"),
    ]);
    let desired = build(spec, 1);
    let containers = &pod(&desired).containers;
    let env = containers[0].env.clone().unwrap();
    let names: Vec<_> = env.iter().map(|var| var.name.as_str()).collect();
    assert_eq!(names[..1], ["TOA_PORT"]);
    assert_eq!(
        names[names.len() - 3..],
        ["REGION", "PAYMENTS_KEY", "FORMAT"]
    );
    let [region, key, format] = &env[env.len() - 3..] else {
        unreachable!()
    };
    assert_eq!(
        (region.value.as_deref(), &region.value_from),
        (Some("eu"), &None)
    );
    let secret = key.value_from.clone().unwrap().secret_key_ref.unwrap();
    assert_eq!(
        (secret.name.as_str(), secret.key.as_str(), secret.optional),
        ("payments", "api-key", None)
    );
    let config = format
        .value_from
        .clone()
        .unwrap()
        .config_map_key_ref
        .unwrap();
    assert_eq!(
        (config.name.as_str(), config.key.as_str(), config.optional),
        ("shop", "format", Some(true))
    );
    // Not the other component's, nor the agent's.
    let others = [&containers[1], &agent_of(&desired)];
    for container in others {
        let env = container.env.clone().unwrap_or_default();
        assert!(
            !env.iter().any(|var| var.name == "REGION"),
            "{}",
            container.name
        );
    }
}
