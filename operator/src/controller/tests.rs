//! The reconciler's requests, checked one by one and in order against a mock API server
//! (kube's tower-test pattern, as in controller-rs): each scenario lists every request the
//! reconcile must make, answers it, and fails on anything else, including an extra request.

use super::*;
use crate::agent_client::{ControlError, Keys, Reply, Target};
use crate::crd::{conditions, reasons, CompositionSpec};
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

/// A pod's agent status with no calls and no failure.
fn agent(instance: &str, phase: AgentPhase, halt: Option<&str>) -> AgentStatus {
    AgentStatus {
        phase,
        halt: halt.map(str::to_owned),
        instance: instance.into(),
        calls: Calls::default(),
        failure: None,
        key: None,
    }
}

/// Agents that answer from a fixed table and remember what they were told.
#[derive(Default)]
struct FakeAgents {
    statuses: HashMap<IpAddr, AgentStatus>,
    told: StdMutex<Vec<String>>,
}

impl AgentControl for FakeAgents {
    fn status<'a>(&'a self, pod: Target<'a>, _: &'a Keys) -> Reply<'a> {
        let pod = pod.ip;
        let status = self.statuses.get(&pod).cloned();
        Box::pin(async move {
            status.ok_or_else(|| ControlError::Transient(format!("no answer from {pod}")))
        })
    }

    fn halt<'a>(&'a self, pod: Target<'a>, keys: &'a Keys, halt: &'a str) -> Reply<'a> {
        let token = &keys.current;
        let pod = pod.ip;
        self.told
            .lock()
            .unwrap()
            .push(format!("halt {halt} {pod} {token}"));
        let status = self.statuses.get(&pod).cloned();
        Box::pin(async move { status.ok_or_else(|| ControlError::Transient("gone".into())) })
    }

    fn resume<'a>(&'a self, pod: Target<'a>, keys: &'a Keys, halt: &'a str) -> Reply<'a> {
        let token = &keys.current;
        let pod = pod.ip;
        self.told
            .lock()
            .unwrap()
            .push(format!("resume {halt} {pod} {token}"));
        let status = self.statuses.get(&pod).cloned();
        Box::pin(async move { status.ok_or_else(|| ControlError::Transient("gone".into())) })
    }
}

fn context(agents: Arc<FakeAgents>, leader: bool) -> (Arc<Context>, Handle) {
    context_with(agents, leader, Some(ring()))
}

fn context_with(
    agents: Arc<FakeAgents>,
    leader: bool,
    ring: Option<KeyRing>,
) -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let settings = Settings::test();
    let (_, leader) = watch::channel(leader);
    let (_, keys) = watch::channel(ring);
    let mut context = Context::new(client, settings, agents, Metrics::default(), leader, keys);
    context.now = now;
    (Arc::new(context), handle)
}

/// Answers the next request after checking its method and path (query left out) with what
/// `answer` makes of the request's JSON body; returns the request's query and body.
async fn expect(
    handle: &mut Handle,
    method: &str,
    path: &str,
    answer: impl FnOnce(&Value) -> (StatusCode, Value),
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
    let (status, answer) = answer(&body);
    let response = Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
        .unwrap();
    send.send_response(response);
    (query, body)
}

/// Answers with the object as sent, as an API server does for an apply.
fn echo(body: &Value) -> (StatusCode, Value) {
    (StatusCode::OK, body.clone())
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

/// The operator's key in these tests.
fn ring() -> KeyRing {
    KeyRing::new(&[7u8; 32], None)
}

/// The control token of the test Composition, as derived from [`ring`].
fn token() -> String {
    let uid = Composition::test(CompositionSpec::test())
        .metadata
        .uid
        .unwrap();
    ring().keys_for(&uid).current
}

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/shop/deployments/shop";

/// The Deployment applied and answered with `status`; the query and the applied body.
async fn apply_deployment(handle: &mut Handle, status: Value) -> (String, Value) {
    let (query, applied) = expect(handle, "PATCH", DEPLOYMENT, deployment_with(status)).await;
    assert!(!query.contains("dryRun"), "the real apply: {query}");
    (query, applied)
}

const BUDGET: &str = "/apis/policy/v1/namespaces/shop/poddisruptionbudgets/shop";

/// The PodDisruptionBudget, read (none yet) and applied: what was applied.
async fn budget_applied(handle: &mut Handle) -> Value {
    expect(handle, "GET", BUDGET, |_| {
        (StatusCode::NOT_FOUND, not_found())
    })
    .await;
    expect(handle, "PATCH", BUDGET, echo).await.1
}

/// The Deployment as it is read first (its drain key, and whether the tokens may be written):
/// `existing`, or none yet.
async fn deployment_read(handle: &mut Handle, existing: Option<Value>) {
    expect(handle, "GET", DEPLOYMENT, |_| match existing {
        Some(deployment) => (StatusCode::OK, deployment),
        None => (StatusCode::NOT_FOUND, not_found()),
    })
    .await;
}

/// The Deployment read, then tried (a dry run of the apply: the spec is not settled yet), the
/// try answered with `answer`; returns what was tried.
async fn deployment_tried(
    handle: &mut Handle,
    existing: Option<Value>,
    answer: impl FnOnce(&Value) -> (StatusCode, Value),
) -> Value {
    deployment_read(handle, existing).await;
    let (query, tried) = expect(handle, "PATCH", DEPLOYMENT, answer).await;
    assert!(query.contains("dryRun=All"), "{query}");
    tried
}

const SECRET: &str = "/api/v1/namespaces/shop/secrets/shop-control";

/// The control Secret written without a read: a JSON Patch that tests the Secret's owner is the
/// Composition, then replaces its data (answered as taken); returns the data.
async fn secret_written(handle: &mut Handle) -> Value {
    let uid = Composition::test(CompositionSpec::test())
        .metadata
        .uid
        .unwrap();
    let (query, body) = expect(handle, "PATCH", SECRET, |_| {
        (
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "shop-control"}}),
        )
    })
    .await;
    assert!(query.contains("fieldManager=toa-operator"), "{query}");
    assert_eq!(
        body[0],
        json!({"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": uid})
    );
    assert_eq!(
        (&body[1]["op"], &body[1]["path"]),
        (&json!("replace"), &json!("/data"))
    );
    body[1]["value"].clone()
}

/// The read before an apply of one of the Composition's own objects: none there yet.
async fn absent(handle: &mut Handle, path: &str) {
    expect(handle, "GET", path, |_| {
        (StatusCode::NOT_FOUND, not_found())
    })
    .await;
}

/// A Deployment as an operator wrote it: with the drain key `key` when given, its rollout done
/// when `rolled_over`.
fn existing_deployment(key: Option<&str>, rolled_over: bool) -> Value {
    let uid = Composition::test(CompositionSpec::test())
        .metadata
        .uid
        .unwrap();
    let owner = json!({"apiVersion": "toa.io/v1alpha1", "kind": "Composition", "name": "shop",
        "uid": uid, "controller": true});
    let mut deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "shop", "namespace": "shop", "generation": 2,
            "ownerReferences": [owner]},
        "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2}});
    if let Some(key) = key {
        deployment["metadata"]["annotations"] = json!({names::DRAIN_KEY: key});
    }
    if !rolled_over {
        deployment["status"]["updatedReplicas"] = json!(1);
    }
    deployment
}

fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
           "reason": "NotFound", "message": "not found"})
}

/// `composition` as the controller receives it: through its JSON, as the API server sends it.
fn held(composition: &Composition) -> Arc<Stored> {
    let json = serde_json::to_string(composition).unwrap();
    Arc::new(serde_json::from_str(&json).unwrap())
}

fn composition(spec: CompositionSpec) -> Arc<Composition> {
    Arc::new(Composition::test(spec))
}

/// The Composition as the API server answers a patch of it.
fn stored(composition: &Composition) -> impl FnOnce(&Value) -> (StatusCode, Value) + '_ {
    move |_| (StatusCode::OK, serde_json::to_value(composition).unwrap())
}

/// The Composition's status patch, answered with the Composition; the patch's body.
async fn status_written(handle: &mut Handle, composition: &Composition) -> Value {
    let path = format!("{COMPOSITIONS}/status");
    expect(handle, "PATCH", &path, stored(composition)).await.1
}

/// A Deployment answered with this status (generation 1).
fn deployment_with(status: Value) -> impl FnOnce(&Value) -> (StatusCode, Value) {
    move |body| {
        let mut body = body.clone();
        body["metadata"]["generation"] = json!(1);
        body["status"] = status;
        (StatusCode::OK, body)
    }
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} in {status}"))
}

/// The Deployment read (none yet), ConfigMap apply, control Secret, pod list.
async fn up_to_pods(handle: &mut Handle, pods: Value) {
    deployment_tried(handle, None, echo).await;
    config_maps(handle).await;
    // The control Secret: the derived token, written only into the Composition's own Secret.
    let data = secret_written(handle).await;
    assert_eq!(data["token"], base64(&token()));
    assert!(data.get("previous").is_none(), "{data}");
    pods_listed(handle, pods).await;
}

/// The PodDisruptionBudget (the tests' spec asks for two replicas), then the pod list, answered
/// with `pods`.
async fn pods_listed(handle: &mut Handle, pods: Value) {
    let budget = budget_applied(handle).await;
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    assert_eq!(budget["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    let (query, _) = expect(handle, "GET", "/api/v1/namespaces/shop/pods", |_| {
        (
            StatusCode::OK,
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}),
        )
    })
    .await;
    assert!(
        query.contains("labelSelector=toa.io%2Fcomposition%3Dshop"),
        "{query}"
    );
}

/// The ConfigMap of manifests and the namespace's declarations, applied.
async fn config_maps(handle: &mut Handle) {
    absent(handle, "/api/v1/namespaces/shop/configmaps/shop-components").await;
    let (query, body) = expect(
        handle,
        "PATCH",
        "/api/v1/namespaces/shop/configmaps/shop-components",
        echo,
    )
    .await;
    assert!(query.contains("fieldManager=toa-operator"), "{query}");
    assert!(query.contains("force=true"), "{query}");
    assert_eq!(body["kind"], "ConfigMap");
    assert!(body["data"]["store.orders.yaml"].is_string(), "{body}");
    // The namespace's declarations: read (none yet), then this Composition's keys, under a
    // manager of its own.
    absent(
        handle,
        "/api/v1/namespaces/shop/configmaps/toa-declarations",
    )
    .await;
    let (query, body) = expect(
        handle,
        "PATCH",
        "/api/v1/namespaces/shop/configmaps/toa-declarations",
        echo,
    )
    .await;
    assert!(query.contains("fieldManager=toa-operator.shop"), "{query}");
    assert!(body["data"]["store.orders.yaml"].is_string(), "{body}");
    assert_eq!(
        body["metadata"]["ownerReferences"][0]["kind"],
        "Composition"
    );
    assert!(
        body["metadata"]["ownerReferences"][0]["controller"].is_null(),
        "{body}"
    );
}

fn base64(text: &str) -> String {
    serde_json::to_value(k8s_openapi::ByteString(text.as_bytes().to_vec()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

fn pod(name: &str, ip: &str) -> Value {
    json!({"metadata": owned(name), "status": {"podIP": ip, "phase": "Running"}})
}

/// A pod's metadata as its Deployment's ReplicaSet writes it.
fn owned(name: &str) -> Value {
    json!({"name": name, "namespace": "shop",
           "labels": {"toa.io/composition": "shop", "pod-template-hash": "5d8f"},
           "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "shop-5d8f",
                                "uid": "rs-1", "controller": true}]})
}

/// A pod with the Composition's labels that no ReplicaSet of its Deployment controls.
fn stray(name: &str, ip: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "shop",
                        "labels": {"toa.io/composition": "shop", "pod-template-hash": "5d8f"}},
           "status": {"podIP": ip, "phase": "Running"}})
}

/// A pod the kubelet evicted: Failed, its IP still in its status.
fn evicted(name: &str, ip: &str) -> Value {
    json!({"metadata": owned(name),
           "status": {"podIP": ip, "phase": "Failed", "reason": "Evicted"}})
}

/// A halted Composition with this halt record.
fn halting(record: &str) -> Arc<Composition> {
    let mut spec = CompositionSpec::test();
    spec.halted = true;
    let mut composition = Composition::test(spec);
    composition.metadata.annotations =
        Some([(halt::ANNOTATION.to_owned(), record.to_owned())].into());
    Arc::new(composition)
}

fn rolled_out(replicas: i32) -> Value {
    json!({"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
           "availableReplicas": replicas})
}

#[tokio::test]
async fn an_invalid_spec_writes_ready_false_and_touches_nothing_else() {
    let (context, mut handle) = context(Arc::default(), true);
    let spec = CompositionSpec::test().with_redis(&["redis://a:6379", "redis://b:6379"]);
    let composition = composition(spec);
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    let body = status_written(&mut handle, &composition).await;
    let ready = condition(&body, conditions::READY);
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], reasons::INVALID_SPEC);
    assert_eq!(
        ready["message"],
        "Atomicity takes an odd number of addresses, 2 given."
    );
    assert_eq!(ready["observedGeneration"], 1);
    assert_eq!(body["status"]["observedGeneration"], 1);
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(RESYNC));
    expect_nothing_more(handle, context).await;
}

/// A stored Composition whose configuration nests 200 levels (the API server keeps it): its
/// status says why it cannot be read, the patch's answer (the whole object again) is read, and
/// nothing else is touched.
#[tokio::test]
async fn a_spec_too_deep_to_decode_is_refused_on_its_own_status() {
    let (context, mut handle) = context(Arc::default(), true);
    let mut poison = serde_json::to_value(Composition::test(CompositionSpec::test())).unwrap();
    let deep = (0..200).fold(json!({}), |inner, _| json!({ "a": inner }));
    poison["spec"]["components"][0]["configuration"] = deep;
    // As the API server sends it: text, read as `Stored` (a `Composition` would not decode).
    let held: Arc<Stored> = Arc::new(serde_json::from_str(&poison.to_string()).unwrap());
    let task = tokio::spawn(reconcile(held, context.clone()));
    let path = format!("{COMPOSITIONS}/status");
    let answer = poison.clone();
    let (_, body) = expect(&mut handle, "PATCH", &path, move |_| {
        (StatusCode::OK, answer)
    })
    .await;
    let ready = condition(&body, conditions::READY);
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], reasons::INVALID_SPEC);
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.starts_with("the spec cannot be read: recursion limit exceeded"),
        "{message}"
    );
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(RESYNC));
    expect_nothing_more(handle, context).await;
}

#[tokio::test]
async fn an_invalid_spec_whose_status_is_written_makes_no_request() {
    let (context, handle) = context(Arc::default(), true);
    let spec = CompositionSpec::test().with_redis(&["redis://a:6379", "redis://b:6379"]);
    let mut stored = Composition::test(spec);
    stored.status = Some(status::status(
        &Observed {
            generation: Some(1),
            invalid: Some((
                crate::crd::reasons::INVALID_SPEC,
                "Atomicity takes an odd number of addresses, 2 given.",
            )),
            rollout: None,
            refused: None,
            replicas: 2,
            halt: None,
            pods: &[],
            now: "2027-01-01T00:00:00Z".parse().unwrap(),
        },
        None,
    ));
    let action = reconcile(held(&stored), context.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(RESYNC));
    expect_nothing_more(handle, context).await;
}

#[tokio::test]
async fn a_valid_spec_applies_configmap_secret_deployment_then_status() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    // The dry run first: the same pods (a new Deployment is tried at 0 replicas).
    let tried = deployment_tried(&mut handle, None, echo).await;
    assert_eq!(tried["spec"]["replicas"], 0);
    config_maps(&mut handle).await;
    let data = secret_written(&mut handle).await;
    assert_eq!(data["token"], base64(&token()));
    pods_listed(&mut handle, json!([])).await;
    let (query, deployment) = apply_deployment(&mut handle, json!({})).await;
    assert!(query.contains("fieldManager=toa-operator"), "{query}");
    assert_eq!(deployment["kind"], "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(tried["spec"]["template"], deployment["spec"]["template"]);
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("RollingOut"))
    );
    assert_eq!(
        condition(&status, conditions::PROGRESSING)["status"],
        "True"
    );
    assert_eq!(condition(&status, conditions::HALTED)["status"], "False");
    // A rollout under way is looked at again soon.
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(HALT_POLL));
    expect_nothing_more(handle, context).await;
}

/// What the spec adds to the pods that the API server refuses (a toleration's operator, say)
/// is the spec's refusal: `InvalidSpec` with the server's words, found by the dry run before
/// anything is written (the running pods' ConfigMap and Secret stay as they were).
#[tokio::test]
async fn pods_the_api_server_refuses_make_the_spec_invalid_with_its_words() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    let said = "Deployment.apps \"shop\" is invalid: spec.template.spec.tolerations[0].operator: Unsupported value: \"Sometimes\"";
    let refusal = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "message": said, "reason": "Invalid", "code": 422});
    let refused = move |_: &Value| (StatusCode::UNPROCESSABLE_ENTITY, refusal);
    deployment_tried(&mut handle, None, refused).await;
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(ready["reason"], "InvalidSpec");
    assert_eq!(
        ready["message"],
        format!("the API server refuses the pods: {said}")
    );
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(RESYNC));
    expect_nothing_more(handle, context).await;
}

#[tokio::test]
async fn a_rolled_out_deployment_is_ready() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    up_to_pods(&mut handle, json!([])).await;
    apply_deployment(&mut handle, rolled_out(2)).await;
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("RolledOut"))
    );
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(RESYNC));
    expect_nothing_more(handle, context).await;
}

#[tokio::test]
async fn a_requested_halt_is_recorded_on_the_composition() {
    let ip: IpAddr = "10.0.0.7".parse().unwrap();
    let agents = FakeAgents {
        statuses: HashMap::from([(ip, agent("shop-a", AgentPhase::Running, None))]),
        ..FakeAgents::default()
    };
    let agents = Arc::new(agents);
    let (context, mut handle) = context(agents.clone(), true);
    let mut spec = CompositionSpec::test();
    spec.halted = true;
    let composition = composition(spec);
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    up_to_pods(&mut handle, json!([pod("shop-a", "10.0.0.7")])).await;
    let (_, patch) = expect(&mut handle, "PATCH", COMPOSITIONS, stored(&composition)).await;
    let expected = format!("h{}@2027-01-15T08:00:00Z", now().as_millisecond());
    assert_eq!(
        patch,
        json!({"metadata": {"annotations": {"toa.io/halt": expected}}})
    );
    let (_, deployment) = apply_deployment(&mut handle, rolled_out(2)).await;
    // Recorded is not stopped: the pods keep running.
    assert_eq!(deployment["spec"]["replicas"], 2);
    let status = status_written(&mut handle, &composition).await;
    assert_eq!(
        condition(&status, conditions::HALTED)["reason"],
        "HaltRequested"
    );
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(HALT_POLL));
    expect_nothing_more(handle, context).await;
    assert!(agents.told.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_recorded_halt_tells_running_pods_to_halt_with_the_token() {
    let ip: IpAddr = "10.0.0.7".parse().unwrap();
    let agents = Arc::new(FakeAgents {
        statuses: HashMap::from([(ip, agent("shop-a", AgentPhase::Running, None))]),
        ..FakeAgents::default()
    });
    let (context, mut handle) = context(agents.clone(), true);
    let composition = halting("h1@2027-01-15T07:59:50Z");
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    // Two pods; the second one's agent does not answer.
    up_to_pods(
        &mut handle,
        json!([pod("shop-a", "10.0.0.7"), pod("shop-b", "10.0.0.8")]),
    )
    .await;
    apply_deployment(&mut handle, rolled_out(2)).await;
    let status = status_written(&mut handle, &composition).await;
    assert_eq!(condition(&status, conditions::HALTED)["reason"], "Pausing");
    let degraded = condition(&status, conditions::DEGRADED);
    assert_eq!(degraded["status"], "True");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("shop-b: no answer from 10.0.0.8"),
        "{degraded}"
    );
    // Pods were told to halt: looked at again soon, for their answer.
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(HALT_STEP));
    expect_nothing_more(handle, context).await;
    assert_eq!(
        *agents.told.lock().unwrap(),
        [format!("halt h1 10.0.0.7 {}", token())]
    );
}

#[tokio::test]
async fn a_replica_without_the_lease_makes_no_request() {
    let (context, handle) = context(Arc::default(), false);
    let action = reconcile(held(&composition(CompositionSpec::test())), context.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(NOT_LEADER));
    expect_nothing_more(handle, context).await;
}

#[tokio::test]
async fn failures_back_off_doubling_up_to_five_minutes() {
    let (context, _handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let error = Error::NotStored(desired::NotStored("shop".into()));
    let delays: Vec<_> = (0..8)
        .map(|_| error_policy(held(&composition), &error, context.clone()))
        .collect();
    let expected: Vec<_> = [5, 10, 20, 40, 80, 160, 300, 300]
        .map(|s| Action::requeue(Duration::from_secs(s)))
        .to_vec();
    assert_eq!(delays, expected);
    assert!(context
        .metrics
        .encode()
        .contains("toa_operator_reconcile_errors_total{error=\"not_stored\"} 8"));
}

/// Whether `labels` match a selector of `key=value` and `key` (exists) terms, as the API server
/// reads [`OWNED`].
fn selects(selector: &str, labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    selector.split(',').all(|term| match term.split_once('=') {
        Some((key, value)) => labels.and_then(|l| l.get(key)).map(String::as_str) == Some(value),
        None => labels.is_some_and(|l| l.contains_key(term)),
    })
}

#[test]
fn the_shared_declarations_do_not_reconcile_every_composition() {
    let mut composition = Composition::test(CompositionSpec::test());
    composition.metadata.uid = Some("uid-1".into());
    let valid = crate::validate::validate(&composition.spec).unwrap();
    let settings = Settings::test();
    let drain = "d".repeat(64);
    let objects =
        desired::desired(&composition, &valid, &settings, &Keys::one("t"), &drain, 2).unwrap();
    // Each object of the composition reconciles it when it changes...
    assert!(selects(OWNED, objects.components.metadata.labels.as_ref()));
    assert!(selects(OWNED, objects.control.metadata.labels.as_ref()));
    assert!(selects(OWNED, objects.deployment.metadata.labels.as_ref()));
    // ...but not the ConfigMap every Composition of the namespace writes into.
    assert!(!selects(
        OWNED,
        objects.declarations.metadata.labels.as_ref()
    ));
}

#[tokio::test]
async fn a_reconciled_generation_reads_the_declarations_and_writes_them_only_when_they_lack_its_part(
) {
    for holds in [true, false] {
        let (context, mut handle) = context(Arc::default(), true);
        let composition = settled_at(reasons::ROLLED_OUT);
        let task = tokio::spawn(reconcile(held(&composition), context.clone()));
        // Settled: no dry run.
        deployment_read(&mut handle, None).await;
        manifests_applied(&mut handle).await;
        let part = desired::declarations(&Owner::of(&composition).unwrap(), &composition);
        let mut current = serde_json::to_value(&part).unwrap();
        current["data"]["other.component.yaml"] = json!("name: component\n");
        if !holds {
            current["data"]["store.orders.yaml"] = json!("name: orders\nold: true\n");
        }
        let declarations = "/api/v1/namespaces/shop/configmaps/toa-declarations";
        let answer = |_: &Value| (StatusCode::OK, current.clone());
        expect(&mut handle, "GET", declarations, answer).await;
        if !holds {
            // Read again by the one writer, who checks no other Composition declares its
            // components before it writes.
            expect(&mut handle, "GET", declarations, answer).await;
            let (query, _) = expect(&mut handle, "PATCH", declarations, echo).await;
            assert!(query.contains("fieldManager=toa-operator.shop"), "{query}");
        }
        // Then the Secret, as always.
        secret_written(&mut handle).await;
        task.abort();
    }
}

/// The Composition of the tests' spec whose generation 1 the status observed, `Ready` with
/// `reason`.
fn settled_at(reason: &str) -> Arc<Composition> {
    let mut stored = Composition::test(CompositionSpec::test());
    let ready = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: conditions::READY.to_owned(),
        status: "False".to_owned(),
        reason: reason.to_owned(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()),
    };
    stored.status = Some(crate::CompositionStatus {
        observed_generation: Some(1),
        conditions: vec![ready],
        ..crate::CompositionStatus::default()
    });
    Arc::new(stored)
}

/// The ConfigMap of manifests, read (none yet) and applied.
async fn manifests_applied(handle: &mut Handle) {
    let path = "/api/v1/namespaces/shop/configmaps/shop-components";
    absent(handle, path).await;
    expect(handle, "PATCH", path, echo).await;
}

/// A generation refused before (the spec, or a Conflict that stopped the reconcile before its
/// pods were tried) is not settled: its Deployment is tried again before anything is written.
#[tokio::test]
async fn a_generation_refused_before_is_tried_again_before_anything_is_written() {
    for reason in [reasons::INVALID_SPEC, reasons::CONFLICT] {
        let (context, mut handle) = context(Arc::default(), true);
        let composition = settled_at(reason);
        let task = tokio::spawn(reconcile(held(&composition), context.clone()));
        let tried = deployment_tried(&mut handle, None, echo).await;
        assert_eq!(tried["kind"], "Deployment", "{reason}");
        manifests_applied(&mut handle).await;
        task.abort();
    }
}

/// A settled generation is not tried; should the real apply be refused (an operator upgrade
/// changed its pods), that is said as the spec's refusal too.
#[tokio::test]
async fn a_settled_generation_whose_apply_is_refused_is_invalid_with_the_servers_words() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = settled_at(reasons::ROLLED_OUT);
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    deployment_read(&mut handle, None).await;
    manifests_applied(&mut handle).await;
    let part = desired::declarations(&Owner::of(&composition).unwrap(), &composition);
    let current = serde_json::to_value(&part).unwrap();
    let declarations = "/api/v1/namespaces/shop/configmaps/toa-declarations";
    expect(&mut handle, "GET", declarations, |_| {
        (StatusCode::OK, current)
    })
    .await;
    secret_written(&mut handle).await;
    pods_listed(&mut handle, json!([])).await;
    let said = "Deployment.apps \"shop\" is invalid: spec.template.spec.containers[0].env[0].name: Invalid value";
    let refusal = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "message": said, "reason": "Invalid", "code": 422});
    let (query, _) = expect(&mut handle, "PATCH", DEPLOYMENT, move |_| {
        (StatusCode::UNPROCESSABLE_ENTITY, refusal)
    })
    .await;
    assert!(!query.contains("dryRun"), "the real apply: {query}");
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(
        (&ready["reason"], &ready["message"]),
        (
            &json!("InvalidSpec"),
            &json!(format!("the API server refuses the pods: {said}"))
        )
    );
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(RESYNC));
    expect_nothing_more(handle, context).await;
}

/// An evicted pod (Failed, its IP still in its status, perhaps another pod's by now) and a pod
/// that only wears the Composition's labels (no ReplicaSet of its Deployment controls it) are not
/// asked anything and do not hold the halt back: with the one running pod paused, the halt
/// goes on to its quiet window. (Asked, it answered nothing, and every halt was called off.)
#[tokio::test]
async fn an_evicted_pod_is_not_asked_and_does_not_hold_a_halt_back() {
    let ip: IpAddr = "10.0.0.7".parse().unwrap();
    let agents = Arc::new(FakeAgents {
        statuses: HashMap::from([(ip, agent("shop-a", AgentPhase::Paused, Some("h1")))]),
        ..FakeAgents::default()
    });
    let (context, mut handle) = context(agents.clone(), true);
    let composition = halting("h1@2027-01-15T07:59:50Z");
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    up_to_pods(
        &mut handle,
        json!([
            pod("shop-a", "10.0.0.7"),
            evicted("shop-b", "10.0.0.8"),
            stray("shop-c", "10.0.0.9")
        ]),
    )
    .await;
    apply_deployment(&mut handle, rolled_out(1)).await;
    let status = status_written(&mut handle, &composition).await;
    assert_eq!(
        condition(&status, conditions::HALTED)["reason"],
        "QuietWatch"
    );
    let degraded = condition(&status, conditions::DEGRADED);
    let message = degraded["message"].as_str().unwrap();
    assert!(message.contains("Evicted"), "{degraded}");
    assert!(
        !message.contains("no answer"),
        "the evicted pod was asked: {degraded}"
    );
    task.await.unwrap().unwrap();
    expect_nothing_more(handle, context).await;
    assert!(agents.told.lock().unwrap().is_empty());
}

/// A Secret of the control Secret's name that the Composition does not own (a user's, or another
/// tool's): the operator, which reads no Secret, finds it when the API server refuses the patch's
/// test of its owner; the conflict is the status, and nothing after it (pods, Deployment) is
/// touched.
#[tokio::test]
async fn a_secret_the_composition_does_not_own_is_not_changed() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    deployment_tried(&mut handle, None, echo).await;
    config_maps(&mut handle).await;
    let (_, body) = expect(&mut handle, "PATCH", SECRET, |_| {
        let invalid = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": 422, "reason": "Invalid",
            "message": "the server rejected our request due to an error in our request"});
        (StatusCode::UNPROCESSABLE_ENTITY, invalid)
    })
    .await;
    assert_eq!(body[0]["op"], "test");
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(ready["reason"], reasons::CONFLICT);
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.starts_with("the Secret shop-control exists and is not this Composition's"),
        "{message}"
    );
    assert!(matches!(task.await.unwrap(), Err(Error::Conflict(_))));
    expect_nothing_more(handle, context).await;
}

/// A control Secret that does not exist yet is created, owned by the Composition.
#[tokio::test]
async fn a_missing_secret_is_created_owned_by_the_composition() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    deployment_tried(&mut handle, None, echo).await;
    config_maps(&mut handle).await;
    expect(&mut handle, "PATCH", SECRET, |_| {
        (StatusCode::NOT_FOUND, not_found())
    })
    .await;
    let (query, body) = expect(&mut handle, "POST", "/api/v1/namespaces/shop/secrets", echo).await;
    assert!(query.contains("fieldManager=toa-operator"), "{query}");
    assert_eq!(body["metadata"]["name"], "shop-control");
    assert_eq!(body["data"]["token"], base64(&token()));
    assert_eq!(
        body["metadata"]["ownerReferences"][0]["uid"],
        json!(composition.metadata.uid)
    );
    pods_listed(&mut handle, json!([])).await;
    task.abort();
}

/// A ConfigMap under the name the operator derives for the manifests (`<name>-components`) that
/// the Composition does not control (a user's, here) is never changed: the reconcile reads it,
/// says `Conflict` naming it and who wrote it, and writes nothing else (no apply of it, no
/// declarations, Secret or Deployment).
#[tokio::test]
async fn a_foreign_object_under_a_derived_name_is_not_changed() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    deployment_tried(&mut handle, None, echo).await;
    let users = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shop-components", "namespace": "shop",
            "managedFields": [{"manager": "kubectl-create", "operation": "Update"}]},
        "data": {"mine": "keep"}});
    let path = "/api/v1/namespaces/shop/configmaps/shop-components";
    expect(&mut handle, "GET", path, |_| (StatusCode::OK, users)).await;
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], reasons::CONFLICT);
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.starts_with("the ConfigMap shop-components exists and is not this Composition's (no controller; written by kubectl-create)"),
        "{message}"
    );
    assert!(matches!(task.await.unwrap(), Err(Error::Conflict(_))));
    expect_nothing_more(handle, context).await;
}

/// A component another Composition of the namespace declares (`store.orders`, which `orders`
/// declared first, declared again by `shop`) is refused: `Conflict` naming the component and
/// the Composition that holds it, and the declarations are not written (nor the Secret or the
/// Deployment).
#[tokio::test]
async fn a_component_another_composition_declares_is_not_taken_over() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    deployment_tried(&mut handle, None, echo).await;
    let components = "/api/v1/namespaces/shop/configmaps/shop-components";
    absent(&mut handle, components).await;
    expect(&mut handle, "PATCH", components, echo).await;
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "toa-declarations", "namespace": "shop",
            "ownerReferences": [{"apiVersion": "toa.io/v1alpha1", "kind": "Composition",
                "name": "orders", "uid": "orders-uid"}],
            "managedFields": [{"manager": "toa-operator.orders", "operation": "Apply",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:data": {"f:store.orders.yaml": {}}}}]},
        "data": {"store.orders.yaml": "name: orders\n"}});
    let declarations = "/api/v1/namespaces/shop/configmaps/toa-declarations";
    expect(&mut handle, "GET", declarations, |_| {
        (StatusCode::OK, theirs)
    })
    .await;
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(ready["reason"], reasons::CONFLICT);
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.starts_with("the component store.orders is declared in the namespace's ConfigMap toa-declarations by the Composition orders"),
        "{message}"
    );
    assert!(matches!(task.await.unwrap(), Err(Error::Conflict(_))));
    expect_nothing_more(handle, context).await;
}

/// A Deployment of the Composition's name that another object controls (a Composition of the
/// same name deleted and made again, or anything else) is not taken over either.
#[tokio::test]
async fn a_deployment_another_object_controls_is_not_taken_over() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    let mut theirs = existing_deployment(Some(&"ab".repeat(32)), true);
    theirs["metadata"]["ownerReferences"][0]["uid"] = json!("another-uid");
    theirs["metadata"]["ownerReferences"][0]["kind"] = json!("Application");
    deployment_read(&mut handle, Some(theirs)).await;
    let status = status_written(&mut handle, &composition).await;
    let ready = condition(&status, conditions::READY);
    assert_eq!(ready["reason"], reasons::CONFLICT);
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("the Deployment shop exists and is not this Composition's (controlled by the Application shop)"),
        "{message}"
    );
    assert!(matches!(task.await.unwrap(), Err(Error::Conflict(_))));
    expect_nothing_more(handle, context).await;
}

/// A rotation of the operator's key: the Secret holds the new token and the previous one.
#[tokio::test]
async fn during_a_rotation_the_secret_holds_the_new_and_the_previous_token() {
    let rotating = KeyRing::new(&[8u8; 32], Some(&[7u8; 32]));
    let (context, mut handle) = context_with(Arc::default(), true, Some(rotating.clone()));
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    deployment_tried(&mut handle, None, echo).await;
    config_maps(&mut handle).await;
    let data = secret_written(&mut handle).await;
    let uid = composition.metadata.uid.clone().unwrap();
    assert_eq!(data["token"], base64(&rotating.keys_for(&uid).current));
    assert_eq!(data["previous"], base64(&token()), "the old key's token");
    task.abort();
}

/// Until the operator's key is read, nothing is written.
#[tokio::test]
async fn without_the_operators_key_nothing_is_written() {
    let (context, handle) = context_with(Arc::default(), true, None);
    let result = reconcile(held(&composition(CompositionSpec::test())), context.clone()).await;
    assert!(matches!(result, Err(Error::NoKey)), "{result:?}");
    expect_nothing_more(handle, context).await;
}

/// The drain key an existing Deployment holds is kept (its pods do not change with it), and is
/// what the hooks present and what the agent has the digest of.
#[tokio::test]
async fn a_deployments_drain_key_is_kept() {
    let (context, mut handle) = context(Arc::default(), true);
    let composition = composition(CompositionSpec::test());
    let task = tokio::spawn(reconcile(held(&composition), context.clone()));
    let key = "0123456789abcdef".repeat(4);
    deployment_tried(
        &mut handle,
        Some(existing_deployment(Some(&key), true)),
        echo,
    )
    .await;
    config_maps(&mut handle).await;
    secret_written(&mut handle).await;
    pods_listed(&mut handle, json!([])).await;
    let (_, applied) = apply_deployment(&mut handle, json!({})).await;
    assert_eq!(applied["metadata"]["annotations"][names::DRAIN_KEY], key);
    let text = applied["spec"]["template"].to_string();
    assert!(text.contains(&format!("/drain/{key}")), "{text}");
    let digest = toa_context::control::drain_digest(&key);
    assert!(
        text.contains(&format!("--drain-key-sha256\",\"{digest}")),
        "{text}"
    );
    task.abort();
}

/// A Deployment an operator before derived tokens made (no drain key), or one whose pods are not
/// all of its current template yet: the control Secret is left as it is, so that old pods'
/// agents, whose hooks' drain key derives from the token they read, keep their drain; the
/// Deployment is rolled over to the new drain key meanwhile.
#[tokio::test]
async fn the_tokens_wait_until_no_pod_of_an_older_template_is_left() {
    for existing in [
        existing_deployment(None, true),
        existing_deployment(Some(&"ab".repeat(32)), false),
    ] {
        let (context, mut handle) = context(Arc::default(), true);
        let composition = composition(CompositionSpec::test());
        let task = tokio::spawn(reconcile(held(&composition), context.clone()));
        let upgraded = existing["metadata"]["annotations"].is_null();
        deployment_tried(&mut handle, Some(existing), echo).await;
        config_maps(&mut handle).await;
        // No Secret: the pod list comes next.
        pods_listed(&mut handle, json!([])).await;
        let (_, applied) = apply_deployment(&mut handle, json!({})).await;
        let key = applied["metadata"]["annotations"][names::DRAIN_KEY]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(key.len(), 64);
        assert_eq!(
            upgraded,
            key != "ab".repeat(32),
            "a new key only where there was none"
        );
        task.abort();
    }
}

/// Every Composition is reconciled when the key is first read and when it rotates.
#[tokio::test]
async fn a_new_key_reconciles_every_composition() {
    use futures::StreamExt;
    let (keys_tx, keys) = watch::channel(None);
    let mut changes = Box::pin(key_changes(keys));
    let wait = Duration::from_millis(200);
    let quiet = tokio::time::timeout(wait, changes.next()).await;
    assert!(quiet.is_err(), "nothing before the key is read");
    keys_tx.send(Some(ring())).unwrap();
    let first = tokio::time::timeout(wait, changes.next()).await;
    assert_eq!(first.unwrap(), Some(()));
    keys_tx
        .send(Some(KeyRing::new(&[8u8; 32], Some(&[7u8; 32]))))
        .unwrap();
    let rotated = tokio::time::timeout(wait, changes.next()).await;
    assert_eq!(rotated.unwrap(), Some(()));
    drop(keys_tx);
    let ended = tokio::time::timeout(wait, changes.next()).await;
    assert_eq!(ended.unwrap(), None);
}

#[test]
fn a_halt_scaling_down_is_looked_at_again_within_a_step_not_at_the_resync() {
    // Nothing pending in the status (the Deployment reports 0 of 0), a pod still terminating.
    let decision = Decision {
        phase: halt::Phase::ScalingDown,
        step: Step::Nothing,
        unreachable: vec![],
        busy: vec![],
    };
    let now: Timestamp = "2027-01-01T00:00:00Z".parse().unwrap();
    assert_eq!(
        next(&decision, &CompositionStatus::default(), now),
        Action::requeue(HALT_STEP)
    );
    let halted = Decision {
        phase: halt::Phase::Halted,
        ..decision
    };
    assert_eq!(
        next(&halted, &CompositionStatus::default(), now),
        Action::requeue(RESYNC)
    );
}
