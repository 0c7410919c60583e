//! The local HTTP API, served on 127.0.0.1:0 and called over real sockets; the Redis-backed
//! component uses the Redis on 127.0.0.1:6379.

use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;
use toa_agent::api::{router, Host};
use toa_agent::{Answering, Atom, AtomConfig, Metrics, Mode, Scope};
use toa_context::{Atomicity, Credentials};

struct Served {
    base: String,
    client: reqwest::Client,
    application: String,
    /// The calls each component's program answers, as the lock routes see them.
    answering: HashMap<String, Arc<Answering>>,
}

async fn serve() -> Served {
    serve_with(Default::default()).await
}

/// [`serve`], the components' routes guarded by `tokens`.
async fn serve_with(tokens: toa_agent::component_tokens::ComponentTokens) -> Served {
    let application = format!("api-{}", std::process::id());
    let metrics = Metrics::new();
    let atom = |component: &str, mode: Mode, atomicity: Option<Atomicity>| {
        let config = AtomConfig {
            scope: Scope::new(application.clone(), component),
            mode,
            atomicity,
            credentials: Credentials::default(),
            roots: Default::default(),
            instance: "api-test".into(),
            group: None,
        };
        Arc::new(Atom::start(config, metrics.clone()).unwrap())
    };
    let redis = Atomicity::new(
        &["redis://127.0.0.1:6379".to_owned()],
        Some(Duration::from_millis(200)),
        Some(Duration::from_millis(1000)),
    )
    .unwrap();
    let atoms = HashMap::from([
        (
            "local.embedded".to_owned(),
            atom("local.embedded", Mode::Local, None),
        ),
        ("pod.bare".to_owned(), atom("pod.bare", Mode::Pod, None)),
        (
            "pod.redis".to_owned(),
            atom("pod.redis", Mode::Pod, Some(redis)),
        ),
    ]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (_, ready) = tokio::sync::watch::channel(true);
    let answering: HashMap<String, Arc<Answering>> = atoms
        .keys()
        .map(|component| (component.clone(), Arc::default()))
        .collect();
    let host = Host {
        answering: answering.clone(),
        atoms,
        calls: None,
        instance: "api-test".into(),
        ready,
        listeners: Default::default(),
        streams: Default::default(),
        metrics,
        tokens: Arc::new(tokens),
    };
    tokio::spawn(axum::serve(listener, router(Arc::new(host))).into_future());
    Served {
        base,
        client: reqwest::Client::new(),
        application,
        answering,
    }
}

/// Reads the next non-blank JSON line of a stream, within `limit`.
async fn next_line(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buffer: &mut String,
    limit: Duration,
) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(end) = buffer.find('\n') {
            let line: String = buffer.drain(..=end).collect();
            if line.trim().is_empty() {
                continue;
            }
            return Some(serde_json::from_str(&line).unwrap());
        }
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(chunk)) => buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap()),
            _ => return None,
        }
    }
}

async fn error_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (
        status,
        response.json::<Value>().await.unwrap()["error"].clone(),
    )
}

/// In a pod one component's routes take its own token only: another component's program (or any
/// other process in the pod) cannot hold its locks, charge its meters, watch or fail its
/// listeners; calls stay open to all. (Before, any process could act as any component.)
#[tokio::test]
async fn in_a_pod_a_components_routes_take_its_own_token_only() {
    let dir = std::env::temp_dir().join(format!("toa-api-tokens-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let names = ["local.embedded".to_owned(), "pod.bare".to_owned()];
    let tokens = toa_agent::component_tokens::ComponentTokens::in_pod(&dir, &names).unwrap();
    let own = std::fs::read_to_string(dir.join("0/token")).unwrap();
    let other = std::fs::read_to_string(dir.join("1/token")).unwrap();
    let served = serve_with(tokens).await;
    let url = |path: &str| format!("{}{path}", served.base);
    let routes = [
        ("GET", "/v1/local.embedded/slots?total=4", None),
        ("GET", "/v1/local.embedded/onassigned", None),
        ("POST", "/v1/local.embedded/onassigned/1/failed", None),
        (
            "POST",
            "/v1/local.embedded/lock",
            Some(json!({"keys": ["k"]})),
        ),
        (
            "POST",
            "/v1/local.embedded/meter",
            Some(json!({"keys": ["k"], "deltas": [1]})),
        ),
    ];
    // Percent-encoded, the name is the same component to the check and to the route.
    let routes = routes.into_iter().chain([
        ("GET", "/v1/local%2Eembedded/slots?total=4", None),
        (
            "POST",
            "/v1/%6Cocal.embedded/lock",
            Some(json!({"keys": ["k"]})),
        ),
    ]);
    for (method, path, body) in routes {
        for token in [None, Some(other.as_str())] {
            let mut request = served.client.request(method.parse().unwrap(), url(path));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = &body {
                request = request.json(body);
            }
            let (status, error) = error_of(request.send().await.unwrap()).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}: {error}");
            assert_eq!(error["code"], "UNAUTHORIZED", "{error}");
        }
    }
    let slots = served
        .client
        .get(url("/v1/local.embedded/slots?total=4"))
        .bearer_auth(&own)
        .send()
        .await
        .unwrap();
    assert_eq!(slots.status(), 200);
    let meter = served
        .client
        .post(url("/v1/local.embedded/meter"))
        .bearer_auth(&own)
        .json(&json!({"keys": ["k"], "deltas": [1]}))
        .send()
        .await
        .unwrap();
    assert_eq!(meter.status(), 200, "{:?}", meter.text().await);
    // An unknown component is still the route's own 404, and calls need no component token.
    let unknown = served
        .client
        .get(url("/v1/nobody/slots?total=4"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let instance = served.client.get(url("/v1/instance")).send().await.unwrap();
    assert_eq!(instance.status(), 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_lock_is_held_while_the_request_is_open_and_released_when_it_closes() {
    let served = serve().await;
    for component in ["local.embedded", "pod.redis"] {
        let url = format!("{}/v1/{component}/lock", served.base);
        let first = served
            .client
            .post(&url)
            .json(&json!({"keys": ["settlement"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 200);
        let mut first_stream = first.bytes_stream();
        let mut buffer = String::new();
        let acquired = next_line(&mut first_stream, &mut buffer, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(acquired["event"], "acquired", "{component}");
        if component == "pod.redis" {
            let key = format!("toa:{}:pod.redis:lock:settlement", served.application);
            let mut redis = redis::Client::open("redis://127.0.0.1:6379")
                .unwrap()
                .get_connection()
                .unwrap();
            let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut redis).unwrap();
            assert!(exists, "the lock is in Redis, not in-process");
        }
        let second = served
            .client
            .post(&url)
            .json(&json!({"keys": ["settlement"]}))
            .send()
            .await
            .unwrap();
        let mut second_stream = second.bytes_stream();
        let mut second_buffer = String::new();
        assert!(
            next_line(
                &mut second_stream,
                &mut second_buffer,
                Duration::from_millis(500)
            )
            .await
            .is_none(),
            "{component}: the second request waits while the first holds"
        );
        drop(first_stream); // the component closes its request
        let next = next_line(
            &mut second_stream,
            &mut second_buffer,
            Duration::from_secs(3),
        )
        .await
        .expect("handed over");
        assert_eq!(next["event"], "acquired");
        assert!(
            next["token"].as_u64() > acquired["token"].as_u64(),
            "{component}: {acquired} then {next}"
        );
    }
}

/// Seed 000: a lock asked for while the program answers a call is waited for only until the
/// agent stops waiting for that call; then `DEADLINE`, and the lock is not taken. Without the
/// call's header the wait has no end.
#[tokio::test]
async fn a_locks_wait_ends_at_its_calls_deadline() {
    let served = serve().await;
    for component in ["local.embedded", "pod.redis"] {
        let url = format!("{}/v1/{component}/lock", served.base);
        let lock = |call: Option<&str>| {
            let request = served.client.post(&url).json(&json!({"keys": ["till"]}));
            match call {
                Some(id) => request.header("toa-call", id),
                None => request,
            }
            .send()
        };
        let mut holder = lock(None).await.unwrap().bytes_stream();
        let mut buffer = String::new();
        let held = next_line(&mut holder, &mut buffer, Duration::from_secs(5)).await;
        assert_eq!(held.unwrap()["event"], "acquired");
        // A call whose agent stops waiting 400 ms from now.
        let until = tokio::time::Instant::now() + Duration::from_millis(400);
        let _answer = served.answering[component].enter("call-1", until);
        let started = tokio::time::Instant::now();
        let mut waiter = lock(Some("call-1")).await.unwrap().bytes_stream();
        let mut waiting = String::new();
        let refused = next_line(&mut waiter, &mut waiting, Duration::from_secs(5)).await;
        let refused = refused.expect("an answer at the deadline");
        assert_eq!(refused["event"], "error", "{component}: {refused}");
        assert_eq!(refused["code"], "DEADLINE", "{component}: {refused}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(350) && waited < Duration::from_secs(3),
            "{component}: refused after {waited:?}, at the deadline"
        );
        // A call the program no longer answers (the agent gave up on it): no lock, at once.
        let mut late = lock(Some("call-2")).await.unwrap().bytes_stream();
        let mut lateness = String::new();
        let refused = next_line(&mut late, &mut lateness, Duration::from_secs(2)).await;
        assert_eq!(
            refused.expect("refused at once")["code"],
            "DEADLINE",
            "{component}"
        );
        // Outside any call: the wait goes on while the holder holds, and ends when it lets go.
        let mut patient = lock(None).await.unwrap().bytes_stream();
        let mut patience = String::new();
        let quiet = next_line(&mut patient, &mut patience, Duration::from_millis(800)).await;
        assert!(quiet.is_none(), "{component}: {quiet:?}");
        drop(holder);
        let next = next_line(&mut patient, &mut patience, Duration::from_secs(5)).await;
        assert_eq!(
            next.expect("handed over")["event"],
            "acquired",
            "{component}"
        );
    }
}

/// The stash: a value under a key of the component's own, for its time to live; `get` after
/// `delete` is null; a bad ttl or key is refused naming it; in a pod without atomicity, 501.
#[tokio::test]
async fn the_stash_keeps_a_value_for_its_ttl() {
    let served = serve().await;
    for component in ["local.embedded", "pod.redis"] {
        // A key with a slash and a space, percent-encoded in the path.
        let url = format!("{}/v1/{component}/stash/rate%2FEUR%20today", served.base);
        let put = |body: Value| served.client.put(&url).json(&body).send();
        let value = json!({"rate": 1.08, "at": [1, 2]});
        assert_eq!(
            put(json!({"value": value, "ttl": 60000}))
                .await
                .unwrap()
                .status(),
            200
        );
        let read = |request: reqwest::RequestBuilder| async move {
            request.send().await.unwrap().json::<Value>().await.unwrap()
        };
        let got = read(served.client.get(&url)).await;
        assert_eq!(got, json!({ "value": value }), "{component}");
        let deleted = read(served.client.delete(&url)).await;
        assert_eq!(deleted, json!({"deleted": true}), "{component}");
        let gone = read(served.client.get(&url)).await;
        assert_eq!(gone, json!({"value": null}), "{component}");
        assert_eq!(
            put(json!({"value": 1, "ttl": 200})).await.unwrap().status(),
            200
        );
        let expired = async {
            while !read(served.client.get(&url)).await["value"].is_null() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), expired)
            .await
            .expect("gone after its ttl");
        let (status, error) = error_of(put(json!({"value": 1, "ttl": 0})).await.unwrap()).await;
        assert_eq!(status, 400);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("ttl: expected 1 to"),
            "{error}"
        );
        let (status, error) = error_of(put(json!({"value": 1})).await.unwrap()).await;
        assert_eq!(status, 400);
        assert!(
            error["message"].as_str().unwrap().contains("ttl"),
            "{error}"
        );
    }
    let bare = format!("{}/v1/pod.bare/stash/k", served.base);
    let (status, error) = error_of(served.client.get(&bare).send().await.unwrap()).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (501, Some("REQUIRES_ATOMICITY"))
    );
}

/// The value of one series of `GET /metrics`, if it is there.
async fn metric(served: &Served, series: &str) -> Option<f64> {
    let text = served
        .client
        .get(format!("{}/metrics", served.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits up to `limit` for a series to have `value`.
async fn metric_reaches(served: &Served, series: &str, value: f64, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let now = metric(served, series).await;
        if now == Some(value) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} is {now:?}, expected {value} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn metrics_follow_locks_slots_and_meter_on_redis() {
    let served = serve().await;
    let labels = format!(
        "{{application=\"{}\",group=\"pod.redis\"}}",
        served.application
    );
    let series = |name: &str| format!("{name}{labels}");
    let lock = || {
        served
            .client
            .post(format!("{}/v1/pod.redis/lock", served.base))
            .json(&json!({"keys": ["metered"]}))
            .send()
    };
    let mut first = lock().await.unwrap().bytes_stream();
    let mut buffer = String::new();
    let acquired = next_line(&mut first, &mut buffer, Duration::from_secs(5)).await;
    assert_eq!(acquired.unwrap()["event"], "acquired");
    assert_eq!(metric(&served, &series("toa_locks_held")).await, Some(1.0));

    // A second holder queues for at least `held` before the first lets go.
    let held = Duration::from_millis(300);
    let asked = std::time::Instant::now();
    let mut second = lock().await.unwrap().bytes_stream();
    let mut second_buffer = String::new();
    assert!(next_line(&mut second, &mut second_buffer, held)
        .await
        .is_none());
    drop(first);
    let next = next_line(&mut second, &mut second_buffer, Duration::from_secs(3)).await;
    assert_eq!(next.unwrap()["event"], "acquired");
    let waited = asked.elapsed().as_secs_f64();
    assert_eq!(
        metric(&served, &series("toa_lock_wait_seconds_count")).await,
        Some(2.0)
    );
    let total_wait = metric(&served, &series("toa_lock_wait_seconds_sum"))
        .await
        .unwrap();
    assert!(
        total_wait >= held.as_secs_f64() && total_wait <= waited + 0.5,
        "lock.wait sums {total_wait} s; the second holder waited {waited} s, at least {held:?}"
    );
    drop(second);
    metric_reaches(
        &served,
        &series("toa_locks_held"),
        0.0,
        Duration::from_secs(3),
    )
    .await;

    let meter = || {
        served
            .client
            .post(format!("{}/v1/pod.redis/meter", served.base))
            .json(&json!({"keys": ["metered"], "deltas": [0]}))
            .send()
    };
    assert_eq!(meter().await.unwrap().status(), 200);
    assert_eq!(meter().await.unwrap().status(), 200);
    assert_eq!(
        metric(&served, &series("toa_meter_calls_total")).await,
        Some(2.0)
    );

    // Alone on its application's membership, the replica comes to own everything: {i 0, n 1}.
    metric_reaches(
        &served,
        &series("toa_slots_replicas"),
        1.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        metric(&served, &series("toa_slots_assigned")).await,
        Some(0.0)
    );
}

#[tokio::test]
async fn slots_meter_and_onassigned() {
    let served = serve().await;
    let get = |path: &str| served.client.get(format!("{}{path}", served.base)).send();
    let slots: Value = get("/v1/local.embedded/slots?total=4")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(slots, json!({"slots": [0, 1, 2, 3]}));
    let slots: Value = get("/v1/pod.bare/slots?total=4")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(slots, json!({"slots": null}));

    let meter = |body: Value| {
        served
            .client
            .post(format!("{}/v1/local.embedded/meter", served.base))
            .json(&body)
            .send()
    };
    let debts: Value = meter(json!({"keys": ["appraise:c1", "appraise"], "deltas": [6000, 6000]}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(debts, json!({"debts": [6000, 6000]}));

    let stream = get("/v1/local.embedded/onassigned").await.unwrap();
    let mut stream = stream.bytes_stream();
    let mut buffer = String::new();
    let first = next_line(&mut stream, &mut buffer, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(first["assignment"], json!({"i": 0, "n": 1, "epoch": 1}));
    let listener = first["listener"].as_u64().unwrap();
    let failed = served
        .client
        .post(format!(
            "{}/v1/local.embedded/onassigned/{listener}/failed",
            served.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 200);
    let after = next_line(&mut stream, &mut buffer, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(after["assignment"], Value::Null);
    let slots: Value = get("/v1/local.embedded/slots?total=4")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        slots,
        json!({"slots": null}),
        "a failed listener leaves the replica owning nothing"
    );
}

#[tokio::test]
async fn bad_requests_get_a_clear_error_and_the_agent_keeps_serving() {
    let served = serve().await;
    let post = |path: &str, body: &'static str| {
        served
            .client
            .post(format!("{}{path}", served.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let (status, error) =
        error_of(post("/v1/local.embedded/lock", "{not json").await.unwrap()).await;
    assert_eq!((status, error["code"].as_str()), (400, Some("BAD_REQUEST")));
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("key must be a string"),
        "{error}"
    );
    let (status, error) = error_of(
        post("/v1/local.embedded/lock", r#"{"key": "a"}"#)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `key`, expected `keys`"),
        "{error}"
    );
    let (status, error) = error_of(
        post("/v1/local.embedded/lock", r#"{"keys": []}"#)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, error["message"].as_str()),
        (400, Some("invalid key \"\": expected at least one key"))
    );
    let (status, error) = error_of(
        post(
            "/v1/local.embedded/meter",
            r#"{"keys": ["a"], "deltas": [-1]}"#,
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        error["message"].as_str().unwrap().contains("deltas"),
        "{error}"
    );
    let (status, error) = error_of(
        post(
            "/v1/local.embedded/meter",
            r#"{"keys": ["a", "b"], "deltas": [1]}"#,
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (status, error["message"].as_str()),
        (
            400,
            Some("meter: expected one delta per key, got 2 keys and 1 deltas")
        )
    );
    let (status, error) =
        error_of(post("/v1/nobody/lock", r#"{"keys": ["a"]}"#).await.unwrap()).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (404, Some("UNKNOWN_COMPONENT"))
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("local.embedded, pod.bare, pod.redis"),
        "{error}"
    );
    let (status, error) = error_of(
        post("/v1/pod.bare/lock", r#"{"keys": ["a"]}"#)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (501, Some("REQUIRES_ATOMICITY"))
    );
    let response = served
        .client
        .get(format!("{}/v1/local.embedded/slots", served.base))
        .send()
        .await
        .unwrap();
    let (status, error) = error_of(response).await;
    assert_eq!(status, 400);
    assert!(
        error["message"].as_str().unwrap().contains("total"),
        "{error}"
    );
    let response = served
        .client
        .post(format!(
            "{}/v1/local.embedded/onassigned/999/failed",
            served.base
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(response).await.0, 404);
    // Still serving.
    let slots: Value = served
        .client
        .get(format!("{}/v1/local.embedded/slots?total=2", served.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(slots, json!({"slots": [0, 1]}));
}

/// Every route the OpenAPI file documents for the local API exists (a missing route answers 404
/// `UNKNOWN_ROUTE`, or 405).
#[tokio::test]
async fn the_openapi_file_documents_routes_that_exist() {
    let served = serve().await;
    let spec: Value = serde_yaml::from_str(include_str!("../openapi.yaml")).unwrap();
    let mut checked = 0;
    for (path, methods) in spec["paths"].as_object().unwrap() {
        // Served by the program (its summary says so), the control port, or only by a running
        // composition.
        let by_the_program = methods.as_object().unwrap().values().any(|method| {
            let summary = method["summary"].as_str().unwrap_or_default();
            summary.starts_with("(served by the program")
        });
        if by_the_program || path.starts_with("/control") || path == "/v1/drain" {
            continue;
        }
        let concrete = path
            .replace("{component}", "local.embedded")
            .replace("{operation}", "x")
            .replace("{listener}", "1")
            .replace("{key}", "k")
            + if path.ends_with("/slots") {
                "?total=1"
            } else {
                ""
            };
        for method in methods.as_object().unwrap().keys() {
            let url = format!("{}{concrete}", served.base);
            let request = match method.as_str() {
                "get" => served.client.get(&url),
                "post" => served
                    .client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body("{}"),
                "put" => served
                    .client
                    .put(&url)
                    .header("content-type", "application/json")
                    .body("{}"),
                "delete" => served.client.delete(&url),
                other => panic!("unexpected method {other}"),
            };
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            // Streams never end: read a body only where it decides (a 404).
            let code = if status == 404 {
                let body: Value = response.json().await.unwrap();
                body["error"]["code"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            } else {
                String::new()
            };
            assert!(
                status != 405 && code != "UNKNOWN_ROUTE",
                "{method} {path} is documented but not served ({status} {code})"
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "checked {checked} routes");
}

/// Single requests cannot exhaust the agent: `total`, keys per call, deltas and bodies are
/// bounded (each refusal a 4xx naming the field and the bound), a 2 MB list of keys is refused
/// at once, and one component holds at most `MAX_STREAMS` streams open.
#[tokio::test]
async fn requests_are_bounded_and_every_refusal_names_the_bound() {
    let served = serve().await;
    let post = |path: &str, body: String| {
        served
            .client
            .post(format!("{}{path}", served.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let get = |path: &str| served.client.get(format!("{}{path}", served.base)).send();

    let (status, error) = error_of(
        get("/v1/local.embedded/slots?total=4294967295")
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        error["message"],
        "total: expected at most 65536 slots, got 4294967295"
    );
    let slots: Value = get("/v1/local.embedded/slots?total=65536")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(slots["slots"].as_array().unwrap().len(), 65536);

    let keys: Vec<String> = (0..65).map(|i| format!("k{i}")).collect();
    let body = json!({ "keys": keys }).to_string();
    let (status, error) = error_of(post("/v1/local.embedded/lock", body).await.unwrap()).await;
    assert_eq!(
        (status, error["message"].as_str()),
        (
            400,
            Some("keys: expected at most 64 keys in one call, got 65")
        )
    );
    let deltas = json!({"keys": ["a", "b"], "deltas": [60000, u64::MAX]}).to_string();
    let (status, error) = error_of(post("/v1/local.embedded/meter", deltas).await.unwrap()).await;
    assert_eq!(status, 400);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("deltas[1]: expected at most"),
        "{error}"
    );
    let debts: Value = post(
        "/v1/local.embedded/meter",
        json!({"keys": ["a"], "deltas": [0]}).to_string(),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(debts, json!({"debts": [0]}), "a refused call charged a");

    // A 2 MB body of keys: refused by its size, at once.
    let huge =
        json!({ "keys": (0..200_000).map(|i| format!("{i:08}")).collect::<Vec<_>>() }).to_string();
    let started = std::time::Instant::now();
    let (status, error) = error_of(post("/v1/local.embedded/lock", huge).await.unwrap()).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (413, Some("PAYLOAD_TOO_LARGE"))
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    // Streams: at most MAX_STREAMS open per component; closing one frees its place.
    let mut open = Vec::new();
    for i in 0..toa_agent::api::MAX_STREAMS {
        let response = post(
            "/v1/local.embedded/lock",
            json!({"keys": [format!("s{i}")]}).to_string(),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 200, "stream {i}");
        open.push(response);
    }
    let (status, error) = error_of(get("/v1/local.embedded/onassigned").await.unwrap()).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (429, Some("TOO_MANY_STREAMS"))
    );
    assert!(
        error["message"].as_str().unwrap().contains("at most 256"),
        "{error}"
    );
    // Another component is not affected.
    let other = get("/v1/pod.redis/onassigned").await.unwrap();
    assert_eq!(other.status(), 200);
    drop(open.pop());
    let mut freed = false;
    for _ in 0..100 {
        let response = get("/v1/local.embedded/onassigned").await.unwrap();
        if response.status() == 200 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "a closed stream did not free its place within 5 s");
}

/// Every refusal is `{"error": {"code", "message"}}` with its status, axum's own included (a
/// path parameter of the wrong type, an unknown route or method, a missing content type: 400), and a
/// body must be the object the API documents, not an array serde would take for it.
#[tokio::test]
async fn every_refusal_has_the_documented_shape() {
    let served = serve().await;
    let url = |path: &str| format!("{}{path}", served.base);
    let json_post = |path: &str, body: &'static str| {
        served
            .client
            .post(url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases = [
        (
            json_post("/v1/local.embedded/lock", r#"[["a"]]"#)
                .await
                .unwrap(),
            400,
            "expected a JSON object, got an array",
        ),
        (
            json_post(
                "/v1/local.embedded/meter",
                r#"{"keys": ["a"], "deltas": [-1]}"#,
            )
            .await
            .unwrap(),
            400,
            "deltas[0]: invalid value",
        ),
        (
            json_post("/v1/call/local.embedded/x", "[]").await.unwrap(),
            400,
            "expected a JSON object",
        ),
        (
            json_post("/v1/call/local.embedded/x", " \"text\"")
                .await
                .unwrap(),
            400,
            "expected a JSON object, got a string",
        ),
        (
            json_post("/v1/call/local.embedded/x", "-12").await.unwrap(),
            400,
            "expected a JSON object, got a number",
        ),
        (
            json_post(
                "/v1/local.embedded/lock",
                r#"{"keys": ["a"], "keys": ["b"]}"#,
            )
            .await
            .unwrap(),
            400,
            "duplicate field `keys`",
        ),
        (
            served
                .client
                .post(url("/v1/local.embedded/onassigned/abc/failed"))
                .send()
                .await
                .unwrap(),
            400,
            "abc",
        ),
        (
            served
                .client
                .get(url("/v1/nothing/here"))
                .send()
                .await
                .unwrap(),
            404,
            "nothing serves GET /v1/nothing/here",
        ),
        (
            served
                .client
                .delete(url("/v1/local.embedded/meter"))
                .send()
                .await
                .unwrap(),
            405,
            "does not take DELETE",
        ),
        (
            served
                .client
                .post(url("/v1/local.embedded/lock"))
                .body(r#"{"keys": ["a"]}"#)
                .send()
                .await
                .unwrap(),
            400,
            "Content-Type: application/json",
        ),
    ];
    for (response, status, says) in cases {
        let got = response.status().as_u16();
        // A request taken by mistake (a lock stream) never ends: bound the read.
        let text = tokio::time::timeout(Duration::from_secs(5), response.text())
            .await
            .unwrap_or_else(|_| panic!("{got}: a stream instead of a refusal"))
            .unwrap();
        let body: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{got}: not JSON: {text:?}"));
        assert_eq!(got, status, "{body}");
        let error = &body["error"];
        assert!(error["code"].is_string(), "{body}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(says), "{status}: {body}");
        // A position the JSON reader counted from the value, not from the body, would mislead.
        assert!(!message.contains(" at line "), "{status}: {body}");
    }
}

/// A call's `toa-call` header (the id of the call the program serves) is read with every call
/// and task: a malformed one is refused, naming the header, before anything else is looked at;
/// a well-formed one passes on to the routing (here: a process that routes no calls).
#[tokio::test]
async fn a_malformed_call_header_is_refused_naming_it() {
    let served = serve().await;
    let post = |path: &str, call: &str| {
        served
            .client
            .post(format!("{}{path}", served.base))
            .header("content-type", "application/json")
            .header("toa-call", call.to_owned())
            .body(r#"{"input": {}}"#)
            .send()
    };
    for path in ["/v1/call/local.embedded/x", "/v1/task/local.embedded/x"] {
        let (status, error) = error_of(post(path, "not an id").await.unwrap()).await;
        assert_eq!(status, 400, "{path}: {error}");
        assert_eq!(error["code"], "BAD_REQUEST");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with("header `toa-call`: expected"),
            "{message}"
        );
        assert!(message.contains("\"not an id\""), "{message}");
        let (status, error) = error_of(post(path, "0123456789abcdef").await.unwrap()).await;
        assert_ne!(status, 400, "{path}: {error}");
    }
}
