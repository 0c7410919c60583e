use super::*;
use serde_json::json;
use Secrets::Unknown;

fn manifest(configuration: Option<Value>) -> Manifest {
    let mut manifest = Manifest::parse("name: notifications\n", "test").unwrap();
    manifest.configuration = configuration;
    manifest
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "provider": {"type": "string", "default": "https://mail.example.com"},
            "batch": {"type": "integer", "minimum": 1, "default": 50},
            "retry": {"type": "object", "properties": {"times": {"type": "integer", "default": 3}}}
        },
        "additionalProperties": false
    })
}

#[test]
fn the_context_gives_values_per_environment() {
    let yaml = "name: shop\nconfiguration:\n  notifications:\n    batch: 10\n  notifications@production:\n    batch: 99\n";
    let local = read(yaml, &Environment::local()).unwrap();
    assert_eq!(local["notifications"], json!({"batch": 10}));
    let production = read(yaml, &Environment::parse("production").unwrap()).unwrap();
    assert_eq!(production["notifications"], json!({"batch": 99}));
    assert!(read("name: shop\n", &Environment::local())
        .unwrap()
        .is_empty());
    let error = read(
        "name: shop\nconfiguration:\n  notifications: 5\n",
        &Environment::local(),
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("`configuration.notifications`"),
        "{error}"
    );
    // The context itself takes the section.
    crate::Context::parse(yaml, &Environment::local()).unwrap();
}

#[test]
fn defaults_fill_what_the_context_leaves_out() {
    let configured = configure(
        &manifest(Some(schema())),
        Some(&json!({"batch": 10})),
        Unknown,
    )
    .unwrap();
    assert_eq!(
        configured,
        json!({"provider": "https://mail.example.com", "batch": 10, "retry": {"times": 3}})
    );
    let defaults = configure(&manifest(Some(schema())), None, Unknown).unwrap();
    assert_eq!(defaults["batch"], json!(50));
}

#[test]
fn a_bad_value_is_refused_naming_it() {
    let error = configure(
        &manifest(Some(schema())),
        Some(&json!({"batch": 0, "provdier": "x"})),
        Unknown,
    )
    .unwrap_err();
    assert!(error.starts_with("notifications: "), "{error}");
    assert!(error.contains("configuration/batch"), "{error}");
    assert!(error.contains("provdier"), "{error}");
}

#[test]
fn values_without_a_schema_are_refused_and_none_is_empty() {
    assert_eq!(
        configure(&manifest(None), None, Unknown).unwrap(),
        json!({})
    );
    let error = configure(&manifest(None), Some(&json!({"a": 1})), Unknown).unwrap_err();
    assert!(error.contains("declares no `configuration`"), "{error}");
    let error = configure(&manifest(Some(json!({"type": "nonsense"}))), None, Unknown).unwrap_err();
    assert!(error.contains("not a valid JSON Schema"), "{error}");
}

fn secret_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "key": {"type": "string", "minLength": 12},
            "port": {"type": "integer"},
            "batch": {"type": "integer", "minimum": 1, "default": 50}
        }
    })
}

#[test]
fn a_secret_stays_a_placeholder_and_is_checked_where_its_value_is_known() {
    let manifest = manifest(Some(secret_schema()));
    let given = json!({"key": "$MAIL_KEY"});
    let lookup = |name: &str| (name == "MAIL_KEY").then(|| "long-enough-value".to_owned());
    // Known: checked with its value, handed on as the placeholder.
    let configured = configure(&manifest, Some(&given), Secrets::Known(&lookup)).unwrap();
    assert_eq!(configured, json!({"key": "$MAIL_KEY", "batch": 50}));
    // Unknown (the operator): "$MAIL_KEY" itself would fail minLength; not checked.
    assert_eq!(
        configure(&manifest, Some(&given), Unknown).unwrap(),
        configured
    );
}

#[test]
fn a_refused_or_missing_secret_is_named_and_its_value_never_repeated() {
    let manifest = manifest(Some(secret_schema()));
    let given = json!({"key": "$MAIL_KEY"});
    let short = |_: &str| Some("hunter2".to_owned());
    let error = configure(&manifest, Some(&given), Secrets::Known(&short)).unwrap_err();
    assert!(error.contains("configuration/key"), "{error}");
    assert!(
        error.contains("the value of $MAIL_KEY is shorter than 12 characters"),
        "{error}"
    );
    assert!(!error.contains("hunter2"), "the value leaked: {error}");

    let none = |_: &str| None;
    let error = configure(&manifest, Some(&given), Secrets::Known(&none)).unwrap_err();
    assert!(
        error.starts_with("notifications: configuration/key"),
        "{error}"
    );
    assert!(
        error.contains("set the environment variable MAIL_KEY"),
        "{error}"
    );

    // Nor where a rule over the whole configuration fails, which would print all of it.
    let mut strict = secret_schema();
    strict["anyOf"] = json!([{"required": ["port"]}]);
    let error = configure(
        &self::manifest(Some(strict)),
        Some(&json!({"key": "$MAIL_KEY"})),
        Secrets::Known(&|_: &str| Some("long-enough-hunter2".to_owned())),
    )
    .unwrap_err();
    assert!(
        error.contains("configuration: the value (holding secrets) is not valid under any"),
        "{error}"
    );
    assert!(!error.contains("hunter2"), "the value leaked: {error}");

    // A secret is a string: where the schema takes a number, the operator refuses it too.
    let error = configure(&manifest, Some(&json!({"port": "$PORT"})), Unknown).unwrap_err();
    assert!(
        error.contains("configuration/port: $PORT is a secret, always a string"),
        "{error}"
    );
    // Where a rule over the whole looks at the secret's value, the operator cannot check it;
    // a rule about the structure it still checks.
    let mut chosen = secret_schema();
    chosen["oneOf"] = json!([{"properties": {"key": {"pattern": "^sk_live_"}}}]);
    chosen["additionalProperties"] = json!(false);
    let operator =
        |given: Value| configure(&self::manifest(Some(chosen.clone())), Some(&given), Unknown);
    operator(json!({"key": "$MAIL_KEY"})).unwrap();
    let error = operator(json!({"key": "$MAIL_KEY", "kye": 1})).unwrap_err();
    assert!(error.contains("'kye' was unexpected"), "{error}");
    let error = operator(json!({"batch": {"of": "$MAIL_KEY"}})).unwrap_err();
    assert!(
        error.contains("configuration/batch") && error.contains("integer"),
        "{error}"
    );

    // A key with `/` or `~` holding a secret: the refusal is still found at the secret.
    let odd =
        json!({"type": "object", "properties": {"a/b~c": {"type": "string", "minLength": 30}}});
    let error = configure(
        &self::manifest(Some(odd)),
        Some(&json!({"a/b~c": "$ODD"})),
        Secrets::Known(&|_: &str| Some("hunter2".to_owned())),
    )
    .unwrap_err();
    assert!(
        error.contains("configuration/a~1b~0c: the value of $ODD is shorter"),
        "{error}"
    );
    assert!(!error.contains("hunter2"), "the value leaked: {error}");

    // And a plain value next to a secret is still checked.
    let error = configure(&manifest, Some(&json!({"key": "$K", "batch": 0})), Unknown);
    assert!(error.unwrap_err().contains("configuration/batch"));
}
