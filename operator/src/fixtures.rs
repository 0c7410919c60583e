//! Test builders: `CompositionSpec::test().with_redis(&["redis://a"])`.

use crate::crd::{AtomicitySpec, ComponentSpec, CompositionSpec, ContextSpec};
use serde_json::json;

impl CompositionSpec {
    /// A valid spec: application `shop`, one component `store.orders`, no atomicity.
    pub fn test() -> Self {
        Self {
            application: "shop".into(),
            image: "registry.example.com/shop:1.0".into(),
            replicas: 2,
            resources: None,
            components: vec![ComponentSpec::test("store", "orders")],
            context: ContextSpec::default(),
            credentials: None,
            storage: None,
            halted: false,
            halt: None,
            security_context: None,
            logs: None,
            traces: None,
            disruption_budget: None,
            pod: None,
        }
    }

    /// Atomicity over these addresses, with the default timings.
    pub fn with_redis(mut self, redis: &[&str]) -> Self {
        self.context.atomicity = Some(AtomicitySpec {
            redis: redis.iter().map(|address| (*address).to_owned()).collect(),
            interval: 5000,
            ttl: 10_000,
        });
        self
    }

    pub fn with_components(mut self, components: Vec<ComponentSpec>) -> Self {
        self.components = components;
        self
    }
}

impl ComponentSpec {
    /// `namespace.name` with a minimal manifest; its program is `[python3, <name>.py]`.
    pub fn test(namespace: &str, name: &str) -> Self {
        let manifest = json!({
            "name": name,
            "namespace": namespace,
            "program": ["python3", format!("{name}.py")],
            "lifecycle": ["ready"],
        });
        Self {
            name: format!("{namespace}.{name}"),
            manifest: manifest.as_object().cloned().unwrap_or_default(),
            configuration: None,
            resources: None,
            env: Vec::new(),
        }
    }
}

impl crate::desired::Settings {
    /// The agent image `registry.example.com/toa-agent:0.1`, with the default resources.
    pub fn test() -> Self {
        Self {
            agent_image: "registry.example.com/toa-agent:0.1".into(),
            agent_resources: serde_json::from_str(crate::args::DEFAULT_AGENT_RESOURCES)
                .expect("the default resources parse"),
            control_from: None,
            egress: Vec::new(),
            node_networks: Vec::new(),
        }
    }
}

impl crate::crd::Composition {
    /// `shop` in namespace `shop`, as read from the API server (uid, generation 1).
    pub fn test(spec: CompositionSpec) -> Self {
        let mut composition = Self::new("shop", spec);
        composition.metadata.namespace = Some("shop".into());
        composition.metadata.uid = Some("6f1a2b3c-0000-4000-8000-000000000001".into());
        composition.metadata.generation = Some(1);
        composition
    }
}
