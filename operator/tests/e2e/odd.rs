//! Compositions with odd values, generated from a fixed seed and sent to the real API server: deep,
//! huge, wrongly typed, out of range, empty, control characters. Each is refused by the API server
//! with a message naming the field, or stored; every one stored gets a `Ready` condition for its
//! generation (reconciled, whatever it says), and a healthy Composition made after all of them is
//! still reconciled: no value stops the operator or another object.

use kube::api::{DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use std::sync::Arc;
use toa_operator::crd::Stored;
use toa_operator::Composition;

use crate::cluster;
use crate::support::{apply, components_of, composition, wait_condition, Suite, PATIENCE};
use crate::wait::eventually;

const NAMESPACE: &str = "e2e-odd";
/// How many Compositions are tried.
const COUNT: usize = 60;

/// A deterministic generator (xorshift64*): the same Compositions on every run.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize].clone()
    }
}

/// `levels` nested objects around a number.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}

/// Odd values: a path into the Composition (`/spec/replicas`) and what to put there.
fn odd(seeded: &mut Seeded) -> (&'static str, Value) {
    let paths = [
        "/spec/replicas",
        "/spec/application",
        "/spec/image",
        "/spec/components",
        "/spec/components/0/name",
        "/spec/components/0/manifest/program",
        "/spec/components/0/manifest/operations",
        "/spec/components/0/configuration",
        "/spec/context",
        "/spec/context/limits",
        "/spec/halt",
        "/spec/credentials",
    ];
    let values = [
        json!(null),
        json!(-1),
        json!(0),
        json!(2_147_483_648_i64),
        json!(1.5),
        json!(""),
        json!("Ünïcödé"),
        json!("a\u{0000}b\u{0007}"),
        json!("x".repeat(300_000)),
        json!([]),
        json!([1, "two", null, {}]),
        json!({}),
        json!({ "unknown": { "deep": nested(10) } }),
        nested(31),
        nested(40),
        json!((0..20_000).collect::<Vec<u32>>()),
        json!({ "atomicity": { "redis": ["redis://a", "redis://b"] } }),
        json!({ "operation": -5, "deliveries": 1e12 }),
        json!({ "quietWindow": -1, "grace": 4_294_967_296_i64 }),
        json!({ "secretName": "../../etc" }),
    ];
    (seeded.pick(&paths), seeded.pick(&values))
}

/// The base Composition, `name`, with `value` put at `path` (made if missing).
fn with_odd(name: &str, path: &str, value: Value) -> Value {
    let mut object = composition(NAMESPACE, name, json!({ "replicas": 0 }));
    object["spec"]["components"] =
        components_of(&format!("c{:03}", name[1..].parse::<u32>().unwrap()));
    let mut at = &mut object;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for part in &parts[..parts.len() - 1] {
        at = match part.parse::<usize>() {
            Ok(index) => &mut at[index],
            Err(_) => &mut at[*part],
        };
    }
    at[parts[parts.len() - 1]] = value;
    object
}

pub async fn odd_compositions_are_refused_or_reconciled(suite: Arc<Suite>) {
    cluster::restricted_namespace(&suite.admin, NAMESPACE).await;
    let resource = ApiResource::erase::<Composition>(&());
    let api = Api::<DynamicObject>::namespaced_with(suite.admin.clone(), NAMESPACE, &resource);
    let mut seeded = Seeded(0x70A_0DD5);
    let (mut stored, mut refused) = (Vec::new(), Vec::new());
    for i in 0..COUNT {
        let name = format!("o{i:03}");
        let (path, value) = odd(&mut seeded);
        let object: DynamicObject = serde_json::from_value(with_odd(&name, path, value)).unwrap();
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => stored.push(name),
            Err(kube::Error::Api(status)) => {
                // The API server says what was wrong, naming the field.
                assert!(
                    status.message.contains("spec") || status.message.contains("metadata"),
                    "{name} ({path}): {}",
                    status.message
                );
                if refused.len() < 3 {
                    let message: String = status.message.chars().take(200).collect();
                    eprintln!("e2e: odd: {name} ({path}) refused: {message}");
                }
                refused.push(name);
            }
            Err(error) => panic!("{name} ({path}): not an API answer: {error}"),
        }
    }
    eprintln!(
        "e2e: odd: {} refused by the API server, {} stored",
        refused.len(),
        stored.len()
    );
    assert!(
        !stored.is_empty() && !refused.is_empty(),
        "both kinds tried"
    );
    let stored = Arc::new(stored);
    eventually(
        "every stored odd Composition is reconciled",
        PATIENCE,
        || {
            let (suite, stored) = (suite.clone(), stored.clone());
            async move { unreconciled(&suite, &stored).await }
        },
    )
    .await;
    apply(
        &suite,
        &composition(NAMESPACE, "healthy", json!({ "replicas": 0 })),
    )
    .await;
    wait_condition(
        &suite, NAMESPACE, "healthy", "Ready", "True", None, PATIENCE,
    )
    .await;
}

/// `Ok` once each of `names` has a `Ready` condition for its generation.
async fn unreconciled(suite: &Suite, names: &[String]) -> Result<(), String> {
    let api = Api::<Stored>::namespaced(suite.admin.clone(), NAMESPACE);
    let list = api
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let waiting: Vec<String> = names
        .iter()
        .filter(|name| {
            let found = list.items.iter().find(|s| s.name_any() == **name);
            let reconciled = found.is_some_and(|stored| {
                let generation = stored.metadata.generation;
                let conditions = stored
                    .status()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default();
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.observed_generation == generation)
            });
            !reconciled
        })
        .cloned()
        .collect();
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(format!("not reconciled yet: {waiting:?}"))
    }
}
