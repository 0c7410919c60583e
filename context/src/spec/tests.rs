use super::*;
use crate::annotations::{IfAbsent, Kind, SETTINGS};
use crate::Environment;

#[test]
fn a_context_reads_back_from_its_wire_form() {
    let yaml = "name: shop\natomicity:\n  redis: [redis://r0, redis://r1:6380/2, redis://r2]\n  interval: 700\namqp: amqp://broker:5673/vh\nlimits:\n  queue: 8\n";
    let context = Context::parse(yaml, &Environment::local()).unwrap();
    let spec = ContextSpec::from(&context);
    assert_eq!(spec.limits.queue, Some(8));
    assert_eq!(spec.limits.operation, Some(60_000));
    assert_eq!(spec.validate("shop").unwrap(), context);
}

#[test]
fn unknown_fields_of_a_stored_object_are_taken() {
    let json = serde_json::json!({
        "addressed": { "timeout": 100, "retries": 3 },
        "limits": { "queue": 5, "newer": 1 },
        "newer": true,
    });
    let spec: ContextSpec = serde_json::from_value(json).unwrap();
    let context = spec.validate("shop").unwrap();
    assert_eq!(context.limits.queue, 5);
    assert_eq!(context.addressed.timeout.as_millis(), 100);
}

#[test]
fn the_schema_says_each_setting_and_its_default() {
    let schema = serde_json::to_value(schemars::schema_for!(ContextSpec)).unwrap();
    for setting in SETTINGS.iter().filter(|s| s.section() == Some("limits")) {
        let field = setting.annotation.trim_start_matches("limits.");
        let description = schema["$defs"]["LimitsSpec"]["properties"][field]["description"]
            .as_str()
            .unwrap_or_else(|| panic!("{} is described", setting.annotation));
        let default = match (setting.kind, setting.if_absent) {
            (Kind::Millis, IfAbsent::Millis(duration)) => duration.as_millis().to_string(),
            (Kind::Count, IfAbsent::Count(count)) => count.to_string(),
            other => panic!("a limit has a default: {other:?}"),
        };
        assert!(
            description.ends_with(&format!("(default {default})."))
                || description.ends_with(&format!("(default {default})")),
            "{}: {description}",
            setting.annotation
        );
    }
}

/// A duration past what the wire's integers hold is written as the longest they hold: `render`
/// of such a context does not fail (it once panicked).
#[test]
fn a_duration_past_the_wires_integers_is_written_as_the_longest() {
    // Parsing refuses more than ten years; a context made in code may still hold more.
    let mut context = crate::Context::parse("name: a\n", &crate::Environment::local()).unwrap();
    context.limits.drain = std::time::Duration::from_millis(u64::MAX);
    let spec = ContextSpec::from(&context);
    assert_eq!(spec.limits.drain, Some(i64::MAX));
}
