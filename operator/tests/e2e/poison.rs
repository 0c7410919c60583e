//! A Composition the operator cannot decode, its configuration nested 200 levels deep (the API
//! server stores it; serde_json reads 128 at most), is refused on its own status and stops no
//! other. It is created before every other scenario and stays stored through the whole suite:
//! every halt beside it, a second operator's first list and the leader killed, the operator's own
//! image, and the operator restarted in the middle of a halt. The suite's end checks
//! ([`still_refused`]) that it was there all along, still refused.

use kube::Api;
use serde_json::{json, Value};
use std::sync::Arc;
use toa_operator::crd::Stored;

use crate::cluster;
use crate::support::{apply, composition, deployment, wait_condition, Suite, PATIENCE};
use crate::wait::eventually;

const NAMESPACE: &str = "e2e-poison";
const NAME: &str = "poison";

/// The poison `InvalidSpec` with the decoder's reason, no Deployment made for it, and a healthy
/// Composition beside it in its namespace reconciled as usual.
pub async fn a_composition_that_cannot_be_decoded_is_refused_on_itself(suite: Arc<Suite>) {
    cluster::restricted_namespace(&suite.admin, NAMESPACE).await;
    let mut poison = composition(NAMESPACE, NAME, json!({ "replicas": 1 }));
    poison["spec"]["components"][0]["configuration"] = nested(200);
    // Created as a user would, with kubectl (Go's decoder takes 10,000 levels).
    let created = suite.kubectl(&["create", "-f", "-"], Some(&poison.to_string()));
    assert!(
        created.success,
        "the API server stores the poison: {created:?}"
    );
    eventually("the poison is refused on its status", PATIENCE, || {
        let suite = suite.clone();
        async move { refused(&suite).await }
    })
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
    assert!(
        deployment(&suite, NAMESPACE, NAME).await.is_none(),
        "nothing is applied for the poison"
    );
}

/// At the suite's end, when the scenario above ran: the poison is still stored and refused.
pub async fn still_refused(suite: &Suite) -> Result<(), String> {
    let api = Api::<Stored>::namespaced(suite.admin.clone(), NAMESPACE);
    match api.get_opt(NAME).await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => refused(suite).await,
        Err(error) => Err(format!("reading {NAMESPACE}/{NAME}: {error}")),
    }
}

/// `Ok` when the poison's `Ready` is `False`, `InvalidSpec`, for its generation, saying why.
async fn refused(suite: &Suite) -> Result<(), String> {
    let api = Api::<Stored>::namespaced(suite.admin.clone(), NAMESPACE);
    let stored = api.get(NAME).await.map_err(|e| e.to_string())?;
    let ready = stored
        .status()
        .and_then(|status| status.conditions.iter().find(|c| c.type_ == "Ready"))
        .ok_or("no Ready condition yet")?;
    let expected = (ready.status.as_str(), ready.reason.as_str()) == ("False", "InvalidSpec")
        && ready.observed_generation == stored.metadata.generation
        && ready
            .message
            .starts_with("the spec cannot be read: recursion limit exceeded");
    if expected {
        Ok(())
    } else {
        Err(format!("{ready:?}"))
    }
}

/// `levels` objects nested in one another.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!({}), |inner, _| json!({ "level": inner }))
}
