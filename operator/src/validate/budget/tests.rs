use super::*;
use serde_json::{json, Map, Value};

/// The test spec, its one component's configuration an array of `items` distinct objects under
/// `uniqueItems`: each compared with the others (about 0.3 s for 10,000 in a debug build).
fn costly(items: usize) -> CompositionSpec {
    let mut spec = CompositionSpec::test();
    let schema = json!({
        "type": "object",
        "properties": { "rows": { "type": "array", "uniqueItems": true } },
    });
    spec.components[0]
        .manifest
        .insert("configuration".into(), schema);
    let rows = (0..items)
        .map(|i| json!({ "k": i, "v": [i, i + 1] }))
        .collect();
    let mut configuration = Map::new();
    configuration.insert("rows".into(), Value::Array(rows));
    spec.components[0].configuration = Some(configuration);
    spec
}

#[tokio::test]
async fn a_check_within_its_budget_answers_as_the_check_itself() {
    let budget = Budget::default();
    let spec = CompositionSpec::test();
    assert_eq!(
        budget.check(&spec).await.unwrap(),
        super::super::validate(&spec)
    );
    let spec = CompositionSpec::test().with_redis(&["redis://a:6379", "redis://b:6379"]);
    assert_eq!(
        budget.check(&spec).await.unwrap().unwrap_err().0,
        "Atomicity takes an odd number of addresses, 2 given."
    );
}

/// 200 ms for a check that takes about a second alone (more under load, never less): refused
/// naming the component it was at, and its slot held until the thread is done.
#[tokio::test]
async fn a_check_past_its_budget_is_refused_naming_the_field_and_keeps_its_slot() {
    let budget = Budget::new(2, Duration::from_millis(200));
    let refused = budget.check(&costly(40_000)).await.unwrap().unwrap_err();
    // At the manifest's schemas or at the configuration, as the machine's load has it.
    assert!(refused.0.starts_with("`spec.components[0]."), "{refused}");
    assert!(
        refused.0.ends_with(
            "`: checking it took longer than 200 ms (its schemas and their patterns are compiled \
             and evaluated within that budget); make its schemas cheaper"
        ),
        "{refused}"
    );
    assert_eq!(budget.slots.available_permits(), 1, "still running");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while budget.slots.available_permits() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the check never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a budget that runs out names: the last field the check reached.
#[test]
fn the_progress_is_the_field_whose_schemas_the_check_is_at() {
    let progress = Progress::default();
    assert_eq!(progress.last_or("spec"), "spec");
    super::super::validate_noting(&costly(10), &progress).unwrap();
    assert_eq!(progress.last_or("spec"), "spec.components[0].configuration");
}

#[tokio::test]
async fn with_every_slot_held_a_check_is_busy_not_refused() {
    let budget = Budget::new(1, Duration::from_millis(20));
    let _held = budget.slots.clone().acquire_owned().await.unwrap();
    assert_eq!(
        budget.check(&CompositionSpec::test()).await.unwrap_err(),
        Busy(1)
    );
}
