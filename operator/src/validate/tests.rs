use super::*;
use crate::crd::{ComponentSpec, CredentialsSpec};

fn refused(spec: &CompositionSpec) -> String {
    validate(spec).unwrap_err().to_string()
}

#[test]
fn a_valid_spec_gives_the_context_and_manifests() {
    let valid = validate(&CompositionSpec::test().with_redis(&[
        "redis://redis-0",
        "redis://redis-1:7000",
        "redis://redis-2/1",
    ]))
    .unwrap();
    assert_eq!(valid.context.name, "shop");
    let atomicity = valid.context.atomicity.unwrap();
    assert_eq!(atomicity.redis.len(), 3);
    assert_eq!(atomicity.redis[1].port, 7000);
    assert_eq!(atomicity.interval, Duration::from_millis(5000));
    assert_eq!(atomicity.ttl, Duration::from_millis(10_000));
    assert_eq!(valid.context.addressed.timeout, Duration::from_millis(5000));
    assert_eq!(valid.components[0].full_name(), "store.orders");
    assert_eq!(valid.replicas, 2);
    assert_eq!(
        valid.halt,
        Halt {
            quiet_window: Duration::from_secs(30),
            grace: Duration::from_secs(60)
        }
    );
}

#[test]
fn one_or_three_addresses_pass_and_two_are_refused_with_the_count() {
    assert!(validate(&CompositionSpec::test().with_redis(&["redis://a"])).is_ok());
    assert!(validate(&CompositionSpec::test().with_redis(&[
        "redis://a",
        "redis://b",
        "redis://c"
    ]))
    .is_ok());
    assert_eq!(
        refused(&CompositionSpec::test().with_redis(&["redis://a", "redis://b"])),
        "Atomicity takes an odd number of addresses, 2 given."
    );
    assert_eq!(
        refused(&CompositionSpec::test().with_redis(&[
            "redis://a",
            "redis://b",
            "redis://c",
            "redis://d"
        ])),
        "Atomicity takes an odd number of addresses, 4 given."
    );
}

#[test]
fn credentials_in_an_address_are_refused_without_repeating_them() {
    let message =
        refused(&CompositionSpec::test().with_redis(&["redis://admin:s3cret@redis:6379"]));
    assert!(
        message.starts_with("`spec.context.atomicity.redis`: the address redis://***@redis:6379 carries credentials"),
        "{message}"
    );
    assert!(
        !message.contains("s3cret") && !message.contains("admin"),
        "{message}"
    );

    let mut spec = CompositionSpec::test();
    spec.context.amqp = Some("amqp://guest:hunter2@rabbitmq".into());
    let message = refused(&spec);
    assert!(
        message.starts_with("`spec.context.amqp`: the address"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

#[test]
fn refusals_name_the_field_and_what_was_expected() {
    let cases: Vec<(CompositionSpec, &str)> = vec![
        (
            CompositionSpec { application: "Shop".into(), ..CompositionSpec::test() },
            "`spec.application`: expected 1 to 63 lowercase letters, digits or '-', got \"Shop\"",
        ),
        (
            CompositionSpec { image: "".into(), ..CompositionSpec::test() },
            "`spec.image`: expected an image reference such as registry.example.com/shop:1.0, got \"\"",
        ),
        (
            CompositionSpec { replicas: -1, ..CompositionSpec::test() },
            "`spec.replicas`: expected 0 or more, got -1",
        ),
        (
            CompositionSpec::test().with_components(vec![]),
            "`spec.components`: expected at least one component",
        ),
        (
            CompositionSpec::test().with_components(vec![ComponentSpec {
                name: "orders".into(),
                ..ComponentSpec::test("store", "orders")
            }]),
            "`spec.components[0].name`: expected \"store.orders\", the manifest's namespace.name, got \"orders\"",
        ),
        (
            CompositionSpec::test().with_components(vec![
                ComponentSpec::test("store", "orders"),
                ComponentSpec::test("store", "orders"),
            ]),
            "`spec.components[1].name`: expected each component once, store.orders is listed twice",
        ),
        (
            {
                let mut spec = CompositionSpec::test().with_redis(&["redis://a"]);
                spec.context.atomicity.as_mut().unwrap().interval = 0;
                spec
            },
            "`spec.context.atomicity.interval`: expected a positive whole number of milliseconds, got 0",
        ),
        (
            {
                let mut spec = CompositionSpec::test();
                spec.context.addressed.timeout = -5;
                spec
            },
            "`spec.context.addressed.timeout`: expected a positive whole number of milliseconds, got -5",
        ),
        (
            CompositionSpec::test().with_redis(&["redis://a", "redis://a", "redis://c"]),
            "`spec.context.atomicity.redis[1]`: expected independent servers, redis://a:6379 is listed twice",
        ),
        (
            CompositionSpec::test().with_redis(&[]),
            "`spec.context.atomicity.redis`: expected one address or a list of them",
        ),
        (
            CompositionSpec {
                credentials: Some(CredentialsSpec { secret_name: "Shop_Secrets".into() }),
                ..CompositionSpec::test()
            },
            "`spec.credentials.secretName`: expected the name of a Secret (lowercase letters, digits, '-', '.'), got \"Shop_Secrets\"",
        ),
        (
            CompositionSpec {
                halt: Some(HaltSpec { quiet_window: 30, grace: 10 }),
                ..CompositionSpec::test()
            },
            "`spec.halt.grace`: expected at least quietWindow (30 s), since a halt waits that long for quiet, got 10 s",
        ),
        (
            CompositionSpec {
                halt: Some(HaltSpec { quiet_window: 0, grace: 10 }),
                ..CompositionSpec::test()
            },
            "`spec.halt.quietWindow`: expected a positive whole number of seconds, got 0",
        ),
        (
            CompositionSpec {
                security_context: Some(crate::crd::SecuritySpec { run_as_user: Some(0), ..Default::default() }),
                ..CompositionSpec::test()
            },
            "`spec.securityContext.runAsUser`: expected an id of 1 or more (the restricted Pod Security profile refuses root), got 0",
        ),
        (
            CompositionSpec {
                security_context: Some(crate::crd::SecuritySpec { fs_group: Some(-5), ..Default::default() }),
                ..CompositionSpec::test()
            },
            "`spec.securityContext.fsGroup`: expected an id of 1 or more (the restricted Pod Security profile refuses root), got -5",
        ),
        (
            CompositionSpec {
                security_context: Some(crate::crd::SecuritySpec {
                    image_user: true,
                    run_as_user: Some(1000),
                    ..Default::default()
                }),
                ..CompositionSpec::test()
            },
            "`spec.securityContext.imageUser`: expected either imageUser or runAsUser/runAsGroup, got both",
        ),
    ];
    for (spec, message) in cases {
        assert_eq!(refused(&spec), message);
    }
}

#[test]
fn a_manifest_is_checked_with_the_agents_rules() {
    let mut component = ComponentSpec::test("store", "orders");
    component
        .manifest
        .insert("lifecycle".into(), serde_json::json!(["pause"]));
    let message = refused(&CompositionSpec::test().with_components(vec![component]));
    assert!(
        message.starts_with(
            "spec.components[0].manifest: component store.orders exports pause and no resume"
        ),
        "{message}"
    );
}

#[test]
fn a_manifest_without_program_is_refused_since_a_pod_runs_it() {
    let mut component = ComponentSpec::test("store", "orders");
    component.manifest.remove("program");
    let spec = CompositionSpec::test()
        .with_components(vec![ComponentSpec::test("store", "mail"), component]);
    assert_eq!(
        refused(&spec),
        "`spec.components[1].manifest.program`: component store.orders has none; a pod needs the command that starts its program, as [python3, main.py]"
    );
}

#[test]
fn a_component_with_an_entity_needs_a_store_and_a_cluster_needs_a_store_to_serve() {
    let mut component = ComponentSpec::test("store", "orders");
    let entity = serde_json::json!({"properties": {"n": {"type": "integer"}}});
    component.manifest.insert("entity".into(), entity);
    let mut spec = CompositionSpec::test().with_components(vec![component]);
    assert_eq!(
        refused(&spec),
        "`spec.components[0].manifest.entity`: component store.orders declares an entity, and spec.context.storage names no store; pods keep objects in PostgreSQL (postgres://host:5432/database)"
    );
    spec.storage = Some(crate::crd::StorageSpec {
        cloud_native_pg: "shop-db".into(),
    });
    assert!(refused(&spec).starts_with("`spec.components[0].manifest.entity`"));
    spec.context.storage = Some("postgres://shop-db-rw:5432/app".into());
    let valid = validate(&spec).unwrap();
    assert_eq!(valid.cloud_native_pg.as_deref(), Some("shop-db"));
    assert!(valid.components[0].entity.is_some());
    spec.storage = Some(crate::crd::StorageSpec {
        cloud_native_pg: "Shop_DB".into(),
    });
    assert!(
        refused(&spec).starts_with(
            "`spec.storage.cloudNativePG`: expected the name of a CloudNativePG Cluster"
        ),
        "{}",
        refused(&spec)
    );
    // A cluster without a store to use it for.
    let mut spec = CompositionSpec::test();
    spec.storage = Some(crate::crd::StorageSpec {
        cloud_native_pg: "shop-db".into(),
    });
    assert!(refused(&spec).starts_with("`spec.storage.cloudNativePG`: names where"));
    // A store address with credentials in it is refused, not shown.
    let mut spec = CompositionSpec::test();
    spec.context.storage = Some("postgres://app:hunter2@db/shop".into());
    let refusal = refused(&spec);
    assert!(
        refusal.contains("spec.context.storage") && !refusal.contains("hunter2"),
        "{refusal}"
    );
}

#[test]
fn contradictory_entity_declarations_are_refused_naming_the_field() {
    let entity = serde_json::json!({"properties": {"n": {"type": "integer", "minimum": 0}}, "blank": {"n": 0}});
    let cases = [
        (
            Some(entity.clone()),
            serde_json::json!({"look": {"type": "observation", "once": true}}),
            "`operations.look.once`: only a transition or an assignment is applied once; look is declared observation",
        ),
        (
            Some(serde_json::json!({"properties": {"n": {"type": "integer", "minimum": 0}}, "blank": {"n": -1}})),
            serde_json::json!({}),
            "`entity.blank`: -1 is less than the minimum of 0",
        ),
        (
            None,
            serde_json::json!({"reserve": {"type": "transition"}}),
            "`operations.reserve.type`: reserve is declared transition, which writes the component's entity, and the component declares none",
        ),
    ];
    for (entity, operations, expected) in cases {
        let mut component = ComponentSpec::test("fulfilment", "stock");
        if let Some(entity) = entity {
            component.manifest.insert("entity".into(), entity);
        }
        component.manifest.insert("operations".into(), operations);
        let mut spec = CompositionSpec::test().with_components(vec![component]);
        spec.context.storage = Some("postgres://shop-db-rw:5432/app".into());
        let message = refused(&spec);
        assert!(
            message.starts_with("spec.components[0].manifest: ") && message.contains(expected),
            "{expected}: {message}"
        );
    }
}

#[test]
fn the_program_is_kept_in_the_valid_manifests() {
    let valid = validate(&CompositionSpec::test()).unwrap();
    assert_eq!(
        valid.components[0].program.as_deref(),
        Some(&["python3".to_owned(), "orders.py".to_owned()][..])
    );
}

#[test]
fn a_component_with_events_needs_a_broker() {
    let mut component = ComponentSpec::test("store", "orders");
    let entity = serde_json::json!({"properties": {"n": {"type": "integer"}}});
    component.manifest.insert("entity".into(), entity);
    component
        .manifest
        .insert("events".into(), serde_json::json!({"changed": {}}));
    let mut spec = CompositionSpec::test().with_components(vec![component]);
    spec.context.storage = Some("postgres://shop-db-rw:5432/app".into());
    spec.context.amqp = None;
    assert_eq!(
        refused(&spec),
        "`spec.components[0].manifest.events`: component store.orders declares events, and spec.context.amqp names no broker; events leave through RabbitMQ (amqp://host:5672)"
    );
    spec.context.amqp = Some("amqp://rabbitmq:5672".into());
    spec.credentials = Some(CredentialsSpec {
        secret_name: "shop-secrets".into(),
    });
    let valid = validate(&spec);
    assert!(valid.is_ok(), "{:?}", valid.err());
}

#[test]
fn a_component_with_receivers_needs_a_broker() {
    let mut component = ComponentSpec::test("store", "ledger");
    component.manifest.insert(
        "operations".into(),
        serde_json::json!({"note": {"type": "effect"}}),
    );
    component.manifest.insert(
        "receivers".into(),
        serde_json::json!({"store.orders.changed": "note"}),
    );
    let mut spec = CompositionSpec::test().with_components(vec![component]);
    spec.context.amqp = None;
    assert_eq!(
        refused(&spec),
        "`spec.components[0].manifest.receivers`: component store.ledger receives events, and spec.context.amqp names no broker; events arrive through RabbitMQ (amqp://host:5672)"
    );
    spec.context.amqp = Some("amqp://rabbitmq:5672".into());
    spec.credentials = Some(CredentialsSpec {
        secret_name: "shop-secrets".into(),
    });
    let valid = validate(&spec);
    assert!(valid.is_ok(), "{:?}", valid.err());
}

#[test]
fn a_component_whose_container_would_be_the_agents_or_anothers_is_refused() {
    let manifest = serde_json::json!({ "name": "agent", "program": ["python3", "agent.py"] });
    let named_agent = ComponentSpec {
        name: "agent".into(),
        manifest: manifest.as_object().cloned().unwrap(),
        configuration: None,
        resources: None,
        env: Vec::new(),
    };
    let agent = CompositionSpec::test().with_components(vec![named_agent]);
    let said = refused(&agent);
    assert!(
        said.starts_with(
            "`spec.components[0].name`: agent would run in the container `agent`, the agent's"
        ),
        "{said}"
    );
    let clash = CompositionSpec::test().with_components(vec![
        ComponentSpec::test("a-b", "c"),
        ComponentSpec::test("a", "b-c"),
    ]);
    let said = refused(&clash);
    assert!(
        said.starts_with(
            "`spec.components[1].name`: a.b-c and a-b.c would both run in the container `a-b-c`"
        ),
        "{said}"
    );
}

#[test]
fn a_traces_endpoint_the_agent_would_refuse_is_refused_without_repeating_it() {
    let mut spec = CompositionSpec::test();
    let with = |endpoint: &str| crate::crd::TracesSpec {
        endpoint: endpoint.to_owned(),
        service_name: None,
    };
    spec.traces = Some(with("http://collector:4318"));
    assert!(validate(&spec).unwrap().traces.is_some());
    spec.traces = Some(with("http://shop:secret@collector:4318"));
    assert_eq!(
        refused(&spec),
        "`spec.traces.endpoint`: a URL naming a user or password is refused: it would show in logs"
    );
    spec.traces = Some(with("https://collector:4318"));
    assert_eq!(
        refused(&spec),
        "`spec.traces.endpoint`: expected an http:// URL (spans go over plain HTTP)"
    );
    spec.traces = Some(crate::crd::TracesSpec {
        service_name: Some("shop\n".to_owned()),
        ..with("http://collector:4318")
    });
    assert!(refused(&spec).starts_with("`spec.traces.serviceName`: expected 1 to 253"));
}

#[test]
fn a_disruption_budget_that_would_block_every_drain_is_refused() {
    let mut spec = CompositionSpec::test();
    spec.disruption_budget = Some(crate::crd::DisruptionBudgetSpec {
        max_unavailable: 0,
        ..Default::default()
    });
    assert_eq!(
        refused(&spec),
        "`spec.disruptionBudget.maxUnavailable`: expected 1 or more (0 would block every node drain), got 0"
    );
}

#[test]
fn what_the_pod_settings_may_not_change_or_misspell_is_refused_naming_the_field() {
    let cases = [
        (
            serde_json::json!({ "labels": { "toa.io/composition": "other" } }),
            "`spec.pod.labels.toa.io/composition`: set by the operator, which selects the pods by it",
        ),
        (
            serde_json::json!({ "annotations": { "prometheus.io/port": "9" } }),
            "`spec.pod.annotations.prometheus.io/port`: set by the operator",
        ),
        (
            serde_json::json!({ "annotations": { "container.apparmor.security.beta.kubernetes.io/agent": "unconfined" } }),
            "`spec.pod.annotations.container.apparmor.security.beta.kubernetes.io/agent`: sets a container's AppArmor or seccomp profile",
        ),
        (
            serde_json::json!({ "labels": { "team": "a b" } }),
            "`spec.pod.labels.team`: expected a label value",
        ),
        (
            serde_json::json!({ "nodeSelector": { "-bad": "x" } }),
            "`spec.pod.nodeSelector.-bad`: expected a key",
        ),
        (
            serde_json::json!({ "imagePullSecrets": [{ "name": "Registry" }] }),
            "`spec.pod.imagePullSecrets[0].name`: expected a Secret's name, got \"Registry\"",
        ),
        (
            serde_json::json!({ "serviceAccountName": "Builder" }),
            "`spec.pod.serviceAccountName`: expected a ServiceAccount's name, got \"Builder\"",
        ),
    ];
    for (pod, expected) in cases {
        let mut spec = CompositionSpec::test();
        spec.pod = Some(serde_json::from_value(pod).unwrap());
        let said = refused(&spec);
        assert!(said.starts_with(expected), "{said}");
    }
}

fn with_env(env: serde_json::Value) -> CompositionSpec {
    let component = ComponentSpec {
        env: serde_json::from_value(env).unwrap(),
        ..ComponentSpec::test("store", "orders")
    };
    CompositionSpec::test().with_components(vec![component])
}

#[test]
fn a_components_env_takes_values_and_key_references_and_refuses_the_runtimes_names() {
    let fine = with_env(serde_json::json!([
        { "name": "REGION", "value": "eu" },
        { "name": "PAYMENTS_KEY", "valueFrom": { "secretKeyRef": { "name": "payments", "key": "api-key" } } },
        { "name": "log.format", "valueFrom": { "configMapKeyRef": { "name": "shop", "key": "format", "optional": true } } },
    ]));
    assert!(validate(&fine).is_ok(), "{:?}", validate(&fine).err());
    let cases = [
        (
            serde_json::json!([{ "name": "TOA_PORT", "value": "1" }]),
            "`spec.components[0].env[0].name`: TOA_PORT is the runtime's",
        ),
        (
            serde_json::json!([{ "name": "A", "value": "1" }, { "name": "A", "value": "2" }]),
            "`spec.components[0].env[1].name`: A is listed twice",
        ),
        (
            serde_json::json!([{ "name": "1A", "value": "1" }]),
            "`spec.components[0].env[0].name`: \"1A\" is not a variable name",
        ),
        (
            serde_json::json!([{ "name": "A=B", "value": "1" }]),
            "`spec.components[0].env[0].name`: \"A=B\" is not a variable name",
        ),
        (
            serde_json::json!([{ "name": "A" }]),
            "`spec.components[0].env[0]`: A needs exactly one of value and valueFrom",
        ),
        (
            serde_json::json!([{ "name": "A", "value": "1",
                "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } }]),
            "`spec.components[0].env[0]`: A needs exactly one of value and valueFrom",
        ),
        (
            serde_json::json!([{ "name": "A", "valueFrom": {} }]),
            "`spec.components[0].env[0].valueFrom`: expected exactly one of secretKeyRef and configMapKeyRef",
        ),
        (
            serde_json::json!([{ "name": "A", "valueFrom": { "secretKeyRef": { "name": "Payments", "key": "k" } } }]),
            "`spec.components[0].env[0].valueFrom.secretKeyRef.name`: \"Payments\" is not an object name",
        ),
        (
            serde_json::json!([{ "name": "A", "valueFrom": { "configMapKeyRef": { "name": "shop", "key": "a/b" } } }]),
            "`spec.components[0].env[0].valueFrom.configMapKeyRef.key`: \"a/b\" is not a key",
        ),
    ];
    for (env, expected) in cases {
        let said = refused(&with_env(env.clone()));
        assert!(said.starts_with(expected), "{env}: {said}");
    }
}
