use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "toa-render-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// Writes `text` to `relative` (creating its directory) and returns the path.
    fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.0.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const CONTEXT: &str = "name: shop
atomicity:
  redis@staging: redis://redis.staging
  redis@production: [redis://redis-0, redis://redis-1, redis://redis-2:7000]
  interval@production: 2000
addressed:
  timeout: 3000
amqp@production: amqp://rabbitmq/shop
";

/// An application with two components, `store.orders` and `mail`.
fn application(context: &str) -> (TempDir, Options) {
    let dir = TempDir::new();
    let context = dir.write("context.toa.yaml", context);
    dir.write(
        "orders/manifest.toa.yaml",
        "name: orders\nnamespace: store\nprogram: [python3, orders.py]\nlifecycle: [ready]\noperations:\n  place: { type: effect }\n",
    );
    dir.write(
        "mail/manifest.toa.yaml",
        "name: mail\nprogram: [python3, mail.py]\n",
    );
    let options = Options {
        context,
        environment: "production".into(),
        image: "registry.example.com/shop:1.0".into(),
        components: vec![dir.0.join("orders"), dir.0.join("mail")],
        name: None,
        namespace: None,
        replicas: 3,
        // A broker in a pod needs its credentials (the context names one in production).
        credentials: Some("shop-backends".into()),
    };
    (dir, options)
}

fn refused(options: &Options) -> String {
    render(options).unwrap_err().to_string()
}

#[test]
fn renders_the_context_for_the_environment_and_the_manifests() {
    let (_dir, options) = application(CONTEXT);
    let composition = render(&options).unwrap();
    assert_eq!(composition.metadata.name.as_deref(), Some("shop"));
    assert_eq!(composition.metadata.namespace, None);
    let spec = &composition.spec;
    assert_eq!(spec.application, "shop");
    assert_eq!(spec.image, "registry.example.com/shop:1.0");
    assert_eq!(spec.replicas, 3);
    let names: Vec<&str> = spec.components.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["store.orders", "mail"]);
    assert_eq!(
        serde_json::Value::Object(spec.components[0].manifest.clone()),
        serde_json::json!({
            "name": "orders", "namespace": "store", "program": ["python3", "orders.py"],
            "lifecycle": ["ready"],
            "operations": { "place": { "type": "effect" } }
        })
    );
    let atomicity = spec.context.atomicity.as_ref().unwrap();
    assert_eq!(
        atomicity.redis,
        [
            "redis://redis-0:6379",
            "redis://redis-1:6379",
            "redis://redis-2:7000"
        ]
    );
    assert_eq!((atomicity.interval, atomicity.ttl), (2000, 10_000));
    assert_eq!(spec.context.addressed.timeout, 3000);
    assert_eq!(
        spec.context.amqp.as_deref(),
        Some("amqp://rabbitmq:5672/shop")
    );
    assert!(crate::validate(spec).is_ok());
}

#[test]
fn an_environment_chain_takes_the_most_specific_value() {
    let (_dir, mut options) = application(CONTEXT);
    options.environment = "staging:production".into();
    let spec = render(&options).unwrap().spec;
    let atomicity = spec.context.atomicity.unwrap();
    assert_eq!(atomicity.redis, ["redis://redis.staging:6379"]);
    assert_eq!(
        atomicity.interval, 2000,
        "interval@production still applies"
    );

    options.environment = "staging".into();
    let spec = render(&options).unwrap().spec;
    assert_eq!(spec.context.atomicity.unwrap().interval, 5000);
    assert_eq!(spec.context.amqp, None);
}

#[test]
fn the_yaml_reads_back_as_the_same_composition() {
    let (_dir, mut options) = application(CONTEXT);
    options.name = Some("shop-store".into());
    options.namespace = Some("shop".into());
    options.credentials = Some("shop-backends".into());
    let composition = render(&options).unwrap();
    let yaml = to_yaml(&composition, &options);
    assert!(
        yaml.starts_with("# Rendered by `toa-operator render` from "),
        "{yaml}"
    );
    assert!(
        yaml.contains(
            "for the environment production.\napiVersion: toa.io/v1alpha1\nkind: Composition\n"
        ),
        "{yaml}"
    );
    assert!(!yaml.contains("status"), "{yaml}");
    let read: Composition = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(read, composition);
    assert_eq!(read.metadata.name.as_deref(), Some("shop-store"));
    assert_eq!(read.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(read.spec.credentials.unwrap().secret_name, "shop-backends");
}

#[test]
fn an_even_number_of_addresses_is_refused_with_the_count() {
    let (_dir, options) =
        application("name: shop\natomicity@production:\n  redis: [redis://a, redis://b]\n");
    let message = refused(&options);
    assert!(
        message.ends_with("context.toa.yaml: Atomicity takes an odd number of addresses, 2 given."),
        "{message}"
    );
}

#[test]
fn a_broker_without_a_credentials_secret_is_refused_naming_both() {
    let (_dir, mut options) = application(CONTEXT);
    options.credentials = None;
    let message = refused(&options);
    assert!(
        message.contains(
            "`spec.context.amqp`: a pod's agent logs in to the broker with the \
             credentials Secret's `amqp-username` and `amqp-password`, and \
             `spec.credentials.secretName` names none"
        ),
        "{message}"
    );
    options.environment = "staging".into();
    assert!(
        render(&options).is_ok(),
        "no broker in staging, nothing to log in to"
    );
}

#[test]
fn credentials_in_an_address_are_refused_without_repeating_them() {
    let (_dir, options) =
        application("name: shop\namqp@production: amqp://shop:hunter2@rabbitmq\n");
    let message = refused(&options);
    assert!(
        message.contains("`amqp`: the address amqp://***@rabbitmq carries credentials"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

#[test]
fn refusals_name_the_file_or_option_at_fault() {
    let (dir, options) = application(CONTEXT);
    let with = |change: &dyn Fn(&mut Options)| {
        let mut options = options.clone();
        change(&mut options);
        refused(&options)
    };
    assert_eq!(
        with(&|o| o.environment = "Production".into()),
        "`environment`: expected names of lowercase letters, digits and '-' separated by ':', got \"Production\""
    );
    let missing = dir.0.join("missing.yaml");
    assert!(with(&|o| o.context = missing.clone())
        .starts_with(&format!("cannot read {}: ", missing.display())));
    assert!(
        with(&|o| o.components.push(dir.0.join("nowhere"))).starts_with(&format!(
            "cannot read {}: ",
            dir.0.join("nowhere").display()
        ))
    );
    assert_eq!(
        with(&|o| o.components.clear()),
        "expected at least one component (--component DIR)"
    );
    assert_eq!(
        with(&|o| o.components.push(dir.0.join("orders"))),
        "the Composition would be refused: `spec.components[2].name`: expected each component once, store.orders is listed twice"
    );
    assert_eq!(
        with(&|o| o.image = "shop 1.0".into()),
        "the Composition would be refused: `spec.image`: expected an image reference such as registry.example.com/shop:1.0, got \"shop 1.0\""
    );
    assert_eq!(
        with(&|o| o.replicas = -1),
        "the Composition would be refused: `spec.replicas`: expected 0 or more, got -1"
    );
    assert_eq!(
        with(&|o| o.name = Some("Shop".into())),
        "`--name`: expected a DNS subdomain: lowercase letters, digits, '-' and '.', got \"Shop\""
    );
    assert_eq!(
        with(&|o| o.namespace = Some("a.b".into())),
        "`--namespace`: expected a DNS label: at most 63 lowercase letters, digits and '-', got \"a.b\""
    );

    let broken = dir.write(
        "broken/manifest.toa.yaml",
        "name: broken\nlifecycle: [pause]\n",
    );
    let message = with(&|o| o.components.push(dir.0.join("broken")));
    assert_eq!(
        message,
        format!(
            "{}: component broken exports pause and no resume: a component that pauses must take back in resume what pause released",
            broken.display()
        )
    );
}

#[test]
fn a_manifest_file_can_be_named_directly() {
    let (dir, mut options) = application(CONTEXT);
    options.components = vec![dir.0.join("mail/manifest.toa.yaml")];
    assert_eq!(render(&options).unwrap().spec.components[0].name, "mail");
}

#[test]
fn renders_the_repositorys_example_context() {
    let (dir, mut options) = application(CONTEXT);
    options.context = Path::new(env!("CARGO_MANIFEST_DIR")).join("../context.toa.yaml");
    options.components = vec![dir.0.join("mail")];
    let spec = render(&options).unwrap().spec;
    assert_eq!(spec.application, "shop");
    assert_eq!(spec.context.atomicity.unwrap().redis.len(), 3);
}

#[test]
fn renders_each_components_configuration_for_the_environment() {
    let (dir, options) = application(
        "name: shop\nconfiguration:\n  mail:\n    provider: smtp://local\n  mail@production:\n    provider: smtp://production\n",
    );
    dir.write(
        "mail/manifest.toa.yaml",
        "name: mail\nprogram: [python3, mail.py]\nconfiguration:\n  type: object\n  properties:\n    provider: { type: string }\n",
    );
    let spec = render(&options).unwrap().spec;
    assert_eq!(
        spec.components[0].configuration, None,
        "store.orders has none"
    );
    assert_eq!(
        spec.components[1]
            .configuration
            .clone()
            .map(serde_json::Value::Object),
        Some(serde_json::json!({"provider": "smtp://production"}))
    );
    // A value the manifest's schema refuses is refused at render, as at reconcile.
    let (dir, options) = application("name: shop\nconfiguration:\n  mail:\n    provider: 5\n");
    dir.write(
        "mail/manifest.toa.yaml",
        "name: mail\nprogram: [python3, mail.py]\nconfiguration:\n  type: object\n  properties:\n    provider: { type: string }\n",
    );
    let error = refused(&options);
    assert!(
        error.contains("spec.components[1].configuration")
            && error.contains("mail: configuration/provider"),
        "{error}"
    );
}
