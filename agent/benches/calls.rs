//! Calls through two agents over the local RabbitMQ, against a bare lapin request/reply between
//! two processes, and the agent's memory.
//!
//!   cargo build --release -p toa-example-terminals && cargo bench -p toa-agent --bench calls
//!
//! `TOA_BENCH_AGENT=<path>` runs another build of the agent (an earlier commit's, say).
//! With `TOA_BENCH_TRACES=1` the agents export their spans (OTLP/HTTP) to a receiver in this
//! process that counts them and answers at once, as a collector on another machine would.
//!
//! Prints `BENCH <name> <ours> <baseline> <ratio>`; latencies in µs, rates per second, RSS in MB,
//! CPU in µs per call (both agents together, from /proc), and per served task by process (the
//! load, the agents, their programs, RabbitMQ) against the bare publisher and consumer's.
//! Ours: caller → agent B (HTTP) → broker → agent A → the Rust terminals program (HTTP) and back.
//! The baseline: a request published to a queue, consumed by another process that replies at
//! once — the broker's round trip with nothing else.

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

mod common;
use common::{cpu_seconds, line, measure, rss_mb, Figures};

const BROKER: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// How many calls each agent's consumer takes at a time (the agent's default, said here so the
/// bounded bare consumer takes the same).
const PREFETCH: &str = "32";

/// A durable quorum queue's declaration: the kind of the agents' shared queues.
fn quorum() -> (QueueDeclareOptions, FieldTable) {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        lapin::types::AMQPValue::LongString("quorum".into()),
    );
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    (options, arguments)
}

/// The spans' receiver, when the agents export them (`TOA_BENCH_TRACES=1`).
static RECEIVER: std::sync::OnceLock<Spans> = std::sync::OnceLock::new();

/// A trace receiver in this process: counts the export requests and their bytes and answers
/// 200 at once (the agent reads no more of the answer).
struct Spans {
    endpoint: String,
    requests: Arc<std::sync::atomic::AtomicU64>,
    bytes: Arc<std::sync::atomic::AtomicU64>,
}

/// Starts the receiver when `TOA_BENCH_TRACES=1`; says which way this run goes.
async fn traced() {
    use std::sync::atomic::Ordering::Relaxed;
    if std::env::var("TOA_BENCH_TRACES").as_deref() != Ok("1") {
        println!("BENCH tracing off");
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let spans = Spans {
        endpoint: format!("http://{}", listener.local_addr().unwrap()),
        requests: Arc::default(),
        bytes: Arc::default(),
    };
    let (requests, bytes) = (spans.requests.clone(), spans.bytes.clone());
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| async move {
            requests.fetch_add(1, Relaxed);
            bytes.fetch_add(body.len() as u64, Relaxed);
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("BENCH tracing on, exported to {}", spans.endpoint);
    RECEIVER.set(spans).ok();
}

/// A bare consumer acking each delivery of the quorum queue `queue` at once, `prefetch` unacked
/// at most (0: no limit; the served tasks' baseline).
async fn acknowledge(queue: &str, prefetch: u16) {
    let (_connection, _channel, mut consumer) = consuming(queue, true, prefetch).await;
    while let Some(Ok(delivery)) = consumer.next().await {
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
}

/// `--load URL CALLERS SECONDS`: ordinary calls of `{"input":{"n":1}}` to `URL` from `CALLERS`
/// tasks for `SECONDS` (the profiling harness's load, scripts/profile-calls); prints the count.
/// With `TOA_LOAD_SAMPLE=N`, one call in N carries a sampled `traceparent` and the others an
/// unsampled one, so agents exporting spans record one call in N (the harness's hops).
async fn load(args: &[String]) {
    let (url, callers, seconds) = (&args[0], args[1].parse().unwrap(), args[2].parse().unwrap());
    let sample: Option<u64> = std::env::var("TOA_LOAD_SAMPLE")
        .ok()
        .map(|n| n.parse().expect("TOA_LOAD_SAMPLE: a whole number of calls"));
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|caller: u64| {
            let (http, url, count) = (http.clone(), url.clone(), count.clone());
            tokio::spawn(async move {
                let mut made = 0u64;
                while Instant::now() < until {
                    made += 1;
                    let mut request = http
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(r#"{"input":{"n":1}}"#);
                    if let Some(every) = sample {
                        use toa_context::trace::{TraceParent, SAMPLED, TRACEPARENT};
                        // A trace id of this process, caller and call: never one of another call.
                        let trace = (u128::from(std::process::id()) << 96)
                            | (u128::from(caller) << 64)
                            | u128::from(made);
                        let parent = TraceParent {
                            trace_id: trace.to_be_bytes(),
                            parent_id: made.to_be_bytes(),
                            flags: if made.is_multiple_of(every) {
                                SAMPLED
                            } else {
                                0
                            },
                        };
                        request = request.header(TRACEPARENT, parent.to_string());
                    }
                    let response = request.send().await.unwrap();
                    assert_eq!(response.status(), 200);
                    let _ = response.bytes().await.unwrap();
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect::<Vec<tokio::task::JoinHandle<()>>>();
    for task in tasks {
        task.await.unwrap();
    }
    println!("{}", count.load(std::sync::atomic::Ordering::Relaxed));
}

/// A channel consuming `queue` (a transient classic queue, or with `durable` a quorum queue),
/// once it says `ready` to the process that started this one.
async fn consuming(
    queue: &str,
    durable: bool,
    prefetch: u16,
) -> (Connection, lapin::Channel, lapin::Consumer) {
    let connection = Connection::connect(BROKER, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let (options, arguments) = if durable {
        quorum()
    } else {
        let options = QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        (options, FieldTable::default())
    };
    channel
        .queue_declare(queue.into(), options, arguments)
        .await
        .unwrap();
    channel
        .basic_qos(prefetch, Default::default())
        .await
        .unwrap();
    let consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    println!("ready");
    (connection, channel, consumer)
}

/// The bare responder: consumes `queue` (a transient classic queue, or with `durable` a quorum
/// queue) and replies to each request at once.
async fn respond(queue: &str, durable: bool) {
    let (_connection, channel, mut consumer) = consuming(queue, durable, 0).await;
    while let Some(Ok(delivery)) = consumer.next().await {
        let channel = channel.clone();
        tokio::spawn(async move {
            let properties = BasicProperties::default()
                .with_correlation_id(delivery.properties.correlation_id().clone().unwrap());
            let to = delivery.properties.reply_to().clone().unwrap();
            channel
                .basic_publish(
                    "".into(),
                    to,
                    BasicPublishOptions::default(),
                    &delivery.data,
                    properties,
                )
                .await
                .unwrap();
            delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
        });
    }
}

/// The bare requester's calls waiting for their replies, by correlation id.
type Pending = Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>;

/// The bare requester's connection and channel, the calls waiting for their replies, and its
/// reply queue (exclusive; a task of its own hands each reply to its call).
async fn requester() -> (Connection, lapin::Channel, Pending, String) {
    let connection = Connection::connect(BROKER, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let replies = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
        .name()
        .as_str()
        .to_owned();
    let pending: Pending = Arc::default();
    let mut consumer = channel
        .basic_consume(
            replies.as_str().into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let waiting = pending.clone();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let id = delivery.properties.correlation_id().clone().unwrap();
            if let Some(tx) = waiting.lock().unwrap().remove(id.as_str()) {
                let _ = tx.send(());
            }
        }
    });
    (connection, channel, pending, replies)
}

/// `--bare-load CALLERS SECONDS [quorum]`: bare lapin round trips to a responder of its own
/// (on a transient queue, or a durable quorum queue as the agents' shared ones are) from
/// `CALLERS` tasks for about `SECONDS` (the profiling harness's baseline beside its hops), in
/// rounds; prints the count and the seconds they took.
async fn bare_load(args: &[String]) {
    let (callers, seconds): (usize, f64) = (args[0].parse().unwrap(), args[1].parse().unwrap());
    let durable = args.get(2).is_some_and(|kind| kind == "quorum");
    let queue = format!("bench-bare-load-{}", std::process::id());
    let flag = if durable {
        "--quorum-responder"
    } else {
        "--responder"
    };
    let mut responder = start_responder(flag, &queue);
    let (connection, channel, pending, replies) = requester().await;
    let started = Instant::now();
    let mut count = 0;
    while started.elapsed().as_secs_f64() < seconds {
        // Rounds of 50 calls per caller: `measure` makes exactly `total` calls.
        bare_round_trips(callers, callers * 50, &channel, &pending, &queue, &replies).await;
        count += callers * 50;
    }
    let took = started.elapsed().as_secs_f64();
    let _ = responder.kill();
    let _ = responder.wait();
    if durable {
        // A durable queue outlives its responder.
        let deleting = connection.create_channel().await.unwrap();
        let _ = deleting
            .queue_delete(queue.as_str().into(), Default::default())
            .await;
    }
    println!("{count} {took}");
}

fn agent(bin: &str, dir: &Path, context: &Path, instance: &str, port: u16) -> Child {
    let traces = RECEIVER.get().map(|spans| spans.endpoint.clone());
    Command::new(bin)
        .envs(traces.map(|endpoint| ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)))
        .args([
            "compose",
            dir.to_str().unwrap(),
            "--context",
            context.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("TOA_INSTANCE", instance)
        .env("TOA_PREFETCH", PREFETCH)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(position) = args.iter().position(|a| a == "--responder") {
        return respond(&args[position + 1], false).await;
    }
    if let Some(position) = args.iter().position(|a| a == "--quorum-responder") {
        return respond(&args[position + 1], true).await;
    }
    if let Some(position) = args.iter().position(|a| a == "--acker") {
        let prefetch = args.get(position + 2).map_or(0, |p| p.parse().unwrap());
        return acknowledge(&args[position + 1], prefetch).await;
    }
    if let Some(position) = args.iter().position(|a| a == "--load") {
        return load(&args[position + 1..]).await;
    }
    if let Some(position) = args.iter().position(|a| a == "--bare-load") {
        return bare_load(&args[position + 1..]).await;
    }
    traced().await;
    let exe = std::env::current_exe().unwrap();
    let release = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .to_path_buf();
    let program = release.join("toa-example-terminals");
    assert!(
        program.exists(),
        "{} is missing: run `cargo build --release -p toa-example-terminals` first",
        program.display()
    );

    // A component directory whose program is the release build of the Rust example.
    let application = format!("bench-{}", std::process::id());
    let dir = std::env::temp_dir().join(&application).join("terminals");
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/terminals/manifest.toa.yaml"),
    )
    .unwrap();
    let manifest = manifest.replace(
        "program: [cargo, run, --quiet, -p, toa-example-terminals]",
        &format!("program: [{}]", program.display()),
    );
    std::fs::write(dir.join("manifest.toa.yaml"), manifest).unwrap();
    let context = dir.parent().unwrap().join("context.toa.yaml");
    // Atomicity for the records of idempotency keys (the local Redis).
    std::fs::write(
        &context,
        format!(
            "name: {application}\namqp: amqp://127.0.0.1:5672\natomicity:\n  redis: redis://127.0.0.1:6379\n"
        ),
    )
    .unwrap();

    // Another build of the agent, to compare one with another in the same harness.
    let bin = std::env::var("TOA_BENCH_AGENT");
    let bin = bin.as_deref().unwrap_or(env!("CARGO_BIN_EXE_toa-agent"));
    println!("BENCH agent {bin}");
    let (port_a, port_b) = (17301, 17302);
    let mut a = agent(bin, &dir, &context, "till-a", port_a);
    let mut b = agent(bin, &dir, &context, "till-b", port_b);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    for port in [port_a, port_b] {
        while http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            .map(|r| r.status() != 200)
            .unwrap_or(true)
        {
            assert!(Instant::now() < deadline, "the agents did not get ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_mb(a.id());
    // A loopback HTTP round trip with nothing else: the program alone, asked as agent A asks
    // it (each call crosses two such hops, B's from its caller and A's to its program).
    let (mut lone, lone_url) = lone_program(&program).await;
    // Agent A holds terminal t1 (the call is addressed to it, so it lands there).
    let connect = serde_json::json!({"input": {"terminal": "t1"}});
    http.post(format!(
        "http://127.0.0.1:{port_a}/v1/call/terminals/connect"
    ))
    .json(&connect)
    .send()
    .await
    .unwrap();
    loop {
        let answer: serde_json::Value = http
            .post(format!("http://127.0.0.1:{port_b}/v1/call/terminals/charge"))
            .json(&serde_json::json!({"input": {"terminal": "t1", "amount": 1}, "instance": "till-a"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if answer["reply"]["by"] == "till-a" {
            break;
        }
        // The ordinary connect may have landed on B: connect on A's own name is not possible,
        // so connect again until A holds it.
        http.post(format!(
            "http://127.0.0.1:{port_a}/v1/call/terminals/connect"
        ))
        .json(&connect)
        .send()
        .await
        .unwrap();
    }

    // The baseline's two processes: this one asks, the responder answers.
    let queue = format!("bench-bare-{}", std::process::id());
    let mut transient_responder = start_responder("--responder", &queue);
    let durable_queue = format!("bench-bare-quorum-{}", std::process::id());
    let mut quorum_responder = start_responder("--quorum-responder", &durable_queue);
    let (connection, channel, pending, replies) = requester().await;

    for callers in [1usize, 32] {
        let total = if callers == 1 { 1000 } else { 6400 };
        let usage = Usage::start(vec![
            ("client", vec![std::process::id()]),
            ("program", vec![lone.id()]),
        ]);
        let hop = http_round_trips(&http, &lone_url, callers, total).await;
        let usage = usage.end(total);
        // Both ends' CPU per round trip (the broker idle meanwhile), where the load is enough
        // to read: one caller's thousand round trips are a few of /proc's 10 ms ticks.
        if callers > 1 {
            line(
                &format!("http_loopback_{callers}callers_cpu_us"),
                usage.part("client") + usage.part("program"),
                None,
            );
        }
        line(
            &format!("http_loopback_{callers}callers_p50_us"),
            hop.p50,
            None,
        );
        line(
            &format!("http_loopback_{callers}callers_per_s"),
            hop.rate,
            None,
        );
        let bare_quorum =
            bare_round_trips(callers, total, &channel, &pending, &durable_queue, &replies).await;
        let responder_cpu = cpu_seconds(transient_responder.id());
        let bare = bare_round_trips(callers, total, &channel, &pending, &queue, &replies).await;
        let responder_cpu = cpu_seconds(transient_responder.id()) - responder_cpu;
        for (name, path, body) in [
            (
                "addressed",
                "terminals/charge",
                serde_json::json!({"input": {"terminal": "t1", "amount": 1}, "instance": "till-a"}),
            ),
            (
                "ordinary",
                "terminals/echo",
                serde_json::json!({"input": {"n": 1}}),
            ),
        ] {
            let url = format!("http://127.0.0.1:{port_b}/v1/call/{path}");
            let (http, body) = (http.clone(), body.clone());
            let agents_cpu = || cpu_seconds(a.id()) + cpu_seconds(b.id());
            let cpu = agents_cpu();
            let ours = measure(callers, total, move |_| {
                let (http, url, body) = (http.clone(), url.clone(), body.clone());
                async move {
                    let response = http.post(&url).json(&body).send().await.unwrap();
                    assert_eq!(response.status(), 200);
                    let _ = response.bytes().await.unwrap();
                }
            })
            .await;
            line(
                &format!("call_{name}_{callers}callers_p50_us_vs_bare_lapin"),
                ours.p50,
                Some(bare.p50),
            );
            line(
                &format!("call_{name}_{callers}callers_p99_us_vs_bare_lapin"),
                ours.p99,
                Some(bare.p99),
            );
            line(
                &format!("call_{name}_{callers}callers_per_s_vs_bare_lapin"),
                ours.rate,
                Some(bare.rate),
            );
            // Both agents' CPU per call, in µs (= ms per 1,000 calls; 250 µs is 0.25 vCPU per
            // 1,000 calls/s): ratio against the bare responder's, which also takes every call
            // once and publishes every reply.
            line(
                &format!("call_{name}_{callers}callers_agents_cpu_us_per_call_vs_bare_responder"),
                (agents_cpu() - cpu) * 1e6 / total as f64,
                Some(responder_cpu * 1e6 / total as f64),
            );
            if name == "ordinary" {
                // The same kind of queue as ours: what the agent adds, apart from durability.
                line(
                    &format!("call_{name}_{callers}callers_p50_us_vs_bare_lapin_quorum"),
                    ours.p50,
                    Some(bare_quorum.p50),
                );
            }
        }
    }
    // The cost of an idempotency key: ordinary calls with a fresh key each (a claim and a
    // record on Redis) against the same calls without one, in alternating rounds.
    let url = format!("http://127.0.0.1:{port_b}/v1/call/terminals/echo");
    let (with, without) = alternating(&http, &url, |http, url, keyed| {
        let mut body = serde_json::json!({"input": {"n": 1}});
        if keyed {
            body["key"] = serde_json::json!(format!("{:x}", rand::random::<u64>()));
        }
        http.post(url).json(&body)
    })
    .await;
    line(
        "call_ordinary_with_key_p50_us_vs_without",
        with,
        Some(without),
    );
    // The cost of a trace with no exporter configured (the agents' setting here): a sampled
    // `traceparent` read, written into the AMQP headers and passed to the program, against none.
    let (with, without) = alternating(&http, &url, |http, url, traced| {
        let request = http.post(url).json(&serde_json::json!({"input": {"n": 1}}));
        if traced {
            let (trace, span) = (rand::random::<u128>() | 1, rand::random::<u64>() | 1);
            request.header("traceparent", format!("00-{trace:032x}-{span:016x}-01"))
        } else {
            request
        }
    })
    .await;
    line(
        "call_ordinary_traced_unexported_p50_us_vs_without",
        with,
        Some(without),
    );

    // Durable tasks: ours (caller's agent → persistent publish with confirm to the quorum
    // queue, served by the agents meanwhile) against bare lapin publishing persistent messages
    // with confirms to a quorum queue of its own, 32 publishers each.
    let loaded = rss_mb(a.id());
    let durable = format!("bench-durable-{}", std::process::id());
    let confirming = connection.create_channel().await.unwrap();
    confirming
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        lapin::types::AMQPValue::LongString("quorum".into()),
    );
    confirming
        .queue_declare(
            durable.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .unwrap();
    let bare_tasks = bare_publishes(32, 6400, &confirming, &durable).await;
    // A channel of its own for the drains' passive declares (one that finds no queue closes it).
    let watching = connection.create_channel().await.unwrap();
    // The same publisher with a bare consumer acking each task meanwhile: the baseline of
    // tasks served as they are accepted. Emptied first: the consumer would drain the phase
    // before's tasks too.
    confirming
        .queue_purge(durable.as_str().into(), Default::default())
        .await
        .unwrap();
    let mut acker = start_responder("--acker", &durable);
    let bare_usage = Usage::start(vec![
        ("publisher", vec![std::process::id()]),
        ("consumer", vec![acker.id()]),
    ]);
    let bare_served = bare_publishes(32, 6400, &confirming, &durable).await;
    drained(&watching, &durable).await;
    let bare_usage = bare_usage.end(6400);
    let _ = acker.kill();
    let _ = acker.wait();
    // The same with the consumer taking at most the agents' prefetch at a time (each agent's
    // consumer does), where the bare one above takes all it is sent.
    let mut acker = common::helper(&["--acker", &durable, PREFETCH]).1;
    let bounded_usage = Usage::start(vec![
        ("publisher", vec![std::process::id()]),
        ("consumer", vec![acker.id()]),
    ]);
    let bounded_served = bare_publishes(32, 6400, &confirming, &durable).await;
    drained(&watching, &durable).await;
    let bounded_usage = bounded_usage.end(6400);
    let _ = acker.kill();
    let _ = acker.wait();
    let url = format!("http://127.0.0.1:{port_b}/v1/task/terminals/echo");
    let programs: Vec<u32> = [a.id(), b.id()]
        .into_iter()
        .flat_map(common::children)
        .collect();
    assert_eq!(programs.len(), 2, "each agent runs one program");
    let usage = Usage::start(vec![
        ("load", vec![std::process::id()]),
        ("agents", vec![a.id(), b.id()]),
        ("programs", programs),
    ]);
    let served_tasks = post_tasks(&http, &url).await;
    drained(&watching, &format!("toa.{application}.terminals#tasks")).await;
    let usage = usage.end(6400);
    line(
        "task_durable_served_32callers_per_s_vs_bare_lapin_confirmed_consumed",
        served_tasks.rate,
        Some(bare_served.rate),
    );
    // Where a served task's CPU goes, from its accepting to its run's ack, against the bare
    // pair's (µs of CPU per task; the broker is every `beam.smp`).
    line(
        "task_durable_served_all_done_per_s_vs_bare",
        usage.rate,
        Some(bare_usage.rate),
    );
    line(
        "task_durable_served_cpu_us_per_task_vs_bare",
        usage.total(),
        Some(bare_usage.total()),
    );
    line(
        "task_durable_served_broker_cpu_us_per_task_vs_bare",
        usage.part("broker"),
        Some(bare_usage.part("broker")),
    );
    line(
        "task_durable_served_load_cpu_us_per_task_vs_bare_publisher",
        usage.part("load"),
        Some(bare_usage.part("publisher")),
    );
    line(
        "task_durable_served_agents_cpu_us_per_task_vs_bare_consumer",
        usage.part("agents"),
        Some(bare_usage.part("consumer")),
    );
    line(
        "task_durable_served_programs_cpu_us_per_task",
        usage.part("programs"),
        None,
    );
    line(
        "task_durable_served_32callers_per_s_vs_bare_consumer_prefetch_32",
        served_tasks.rate,
        Some(bounded_served.rate),
    );
    line(
        "task_durable_served_broker_cpu_us_per_task_vs_bare_consumer_prefetch_32",
        usage.part("broker"),
        Some(bounded_usage.part("broker")),
    );
    line(
        "task_durable_served_cpu_us_per_task_vs_bare_consumer_prefetch_32",
        usage.total(),
        Some(bounded_usage.total()),
    );
    line(
        "task_durable_served_cores_busy_vs_bare",
        usage.cores(),
        Some(bare_usage.cores()),
    );
    // Like the bare publisher, with nobody consuming: a third agent, of another component,
    // publishes to the queue A and B declared, once they are gone.
    let caller_dir = dir.parent().unwrap().join("caller");
    std::fs::create_dir_all(&caller_dir).unwrap();
    std::fs::write(
        caller_dir.join("manifest.toa.yaml"),
        format!("name: caller\nprogram: [{}]\n", program.display()),
    )
    .unwrap();
    let port_c = 17303;
    let mut c = agent(bin, &caller_dir, &context, "caller", port_c);
    for child in [&mut a, &mut b] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while http
        .get(format!("http://127.0.0.1:{port_c}/readyz"))
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "the caller agent did not get ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("http://127.0.0.1:{port_c}/v1/task/terminals/echo");
    let ours_tasks = post_tasks(&http, &url).await;
    line(
        "task_durable_32callers_per_s_vs_bare_lapin_confirmed",
        ours_tasks.rate,
        Some(bare_tasks.rate),
    );
    line(
        "task_durable_32callers_p50_us_vs_bare_lapin_confirmed",
        ours_tasks.p50,
        Some(bare_tasks.p50),
    );
    let _ = confirming
        .queue_delete(durable.as_str().into(), Default::default())
        .await;

    let _ = c.kill();
    let _ = c.wait();
    line("agent_rss_idle_mb", idle, None);
    line("agent_rss_loaded_mb", loaded, None);
    if let Some(spans) = RECEIVER.get() {
        use std::sync::atomic::Ordering::Relaxed;
        let (requests, bytes) = (spans.requests.load(Relaxed), spans.bytes.load(Relaxed));
        line("traces_exported_requests", requests as f64, None);
        line("traces_exported_mb", bytes as f64 / 1e6, None);
    }
    for child in [
        &mut a,
        &mut b,
        &mut transient_responder,
        &mut quorum_responder,
        &mut lone,
    ] {
        let _ = child.kill();
        let _ = child.wait();
    }
    // The application's queues are durable: remove them (each run's tasks queue kept 6,400
    // tasks on the machine's broker while this named an older queue).
    let components = ["terminals", "caller"];
    for queue in components
        .map(|c| [format!("{c}#tasks"), format!("{c}#dead"), c.to_owned()])
        .concat()
    {
        let _ = channel
            .queue_delete(
                format!("toa.{application}.{queue}").as_str().into(),
                Default::default(),
            )
            .await;
    }
    let _ = channel
        .queue_delete(durable_queue.as_str().into(), Default::default())
        .await;
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

/// 6400 tasks through an agent's local API at `url`, 32 at a time.
/// The median p50 of single-caller calls made by `make(…, true)` and by `make(…, false)`, in six
/// alternating rounds of 300 each (so the machine's drift falls on both).
async fn alternating(
    http: &reqwest::Client,
    url: &str,
    make: fn(&reqwest::Client, &str, bool) -> reqwest::RequestBuilder,
) -> (f64, f64) {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..6 {
        for on in [round % 2 == 0, round % 2 == 1] {
            let (http, url) = (http.clone(), url.to_owned());
            let figures = measure(1, 300, move |_| {
                let request = make(&http, &url, on);
                async move {
                    let response = request.send().await.unwrap();
                    assert_eq!(response.status(), 200);
                    let _ = response.bytes().await.unwrap();
                }
            })
            .await;
            if on { &mut with } else { &mut without }.push(figures.p50);
        }
    }
    (common::median(with), common::median(without))
}

async fn post_tasks(http: &reqwest::Client, url: &str) -> Figures {
    let (http, url) = (http.clone(), url.to_owned());
    measure(32, 6400, move |_| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let response = http
                .post(&url)
                .json(&serde_json::json!({"input": {"n": 1}}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let _ = response.bytes().await.unwrap();
        }
    })
    .await
}

/// `total` persistent publishes from `callers` tasks to the quorum queue `durable` on the
/// confirming `channel`, each awaiting its confirm.
async fn bare_publishes(
    callers: usize,
    total: usize,
    channel: &lapin::Channel,
    durable: &str,
) -> Figures {
    let (channel, durable) = (channel.clone(), durable.to_owned());
    measure(callers, total, move |_| {
        let (channel, durable) = (channel.clone(), durable.clone());
        async move {
            let confirm = channel
                .basic_publish(
                    "".into(),
                    durable.as_str().into(),
                    BasicPublishOptions::default(),
                    br#"{"operation":"echo","input":{"n":1}}"#,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(confirm.is_ack());
        }
    })
    .await
}

/// The CPU each part of a phase takes (µs per task), from `/proc`: the parts named, by their
/// processes, and the broker (every `beam.smp`, with the children it reaped).
struct Usage {
    parts: Vec<(&'static str, Vec<u32>)>,
    start: Vec<f64>,
    began: Instant,
}

/// What a phase took: CPU per task by part, tasks per second, and cores busy.
struct Used {
    parts: Vec<(&'static str, f64)>,
    rate: f64,
}

impl Usage {
    fn start(mut parts: Vec<(&'static str, Vec<u32>)>) -> Self {
        parts.push(("broker", Vec::new()));
        let start = parts.iter().map(Self::seconds).collect();
        Usage {
            parts,
            start,
            began: Instant::now(),
        }
    }

    fn seconds((name, pids): &(&'static str, Vec<u32>)) -> f64 {
        if *name == "broker" {
            return common::cpu_seconds_named("beam.smp");
        }
        pids.iter().map(|pid| cpu_seconds(*pid)).sum()
    }

    fn end(self, tasks: usize) -> Used {
        let seconds = self.began.elapsed().as_secs_f64();
        let parts = self
            .parts
            .iter()
            .zip(&self.start)
            .map(|(part, start)| (part.0, (Self::seconds(part) - start) * 1e6 / tasks as f64))
            .collect();
        Used {
            parts,
            rate: tasks as f64 / seconds,
        }
    }
}

impl Used {
    fn part(&self, name: &str) -> f64 {
        self.parts
            .iter()
            .find_map(|(part, us)| (*part == name).then_some(*us))
            .unwrap_or(f64::NAN)
    }

    fn total(&self) -> f64 {
        self.parts.iter().map(|(_, us)| us).sum()
    }

    /// How many cores the phase's processes kept busy on average.
    fn cores(&self) -> f64 {
        self.total() * self.rate / 1e6
    }
}

/// Waits, up to a minute, until the queue `queue` has no message ready: every task taken (the
/// consumers' prefetch may hold a few more unacked, a fraction of the 6,400).
async fn drained(channel: &lapin::Channel, queue: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let declared = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        if declared.message_count() == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{queue} was not drained in a minute"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The terminals program on a port of its own, no agent in front: asked as an agent asks it.
async fn lone_program(program: &Path) -> (Child, String) {
    let port = common::free_port();
    let child = Command::new(program)
        .env("TOA_PORT", port.to_string())
        .env_remove("TOA_AGENT_TOKEN")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the lone program did not serve");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, format!("http://127.0.0.1:{port}/operations/echo"))
}

/// `total` loopback HTTP round trips to the lone program from `callers` tasks, each the request
/// agent A makes of its program for an ordinary call.
async fn http_round_trips(
    http: &reqwest::Client,
    url: &str,
    callers: usize,
    total: usize,
) -> Figures {
    let (http, url) = (http.clone(), url.to_owned());
    measure(callers, total, move |_| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let body = r#"{"input":{"n":1},"call":{"id":"00000000000000000000000000000001","redelivered":false,"deadline_ms":null}}"#;
            let response = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let _ = response.bytes().await.unwrap();
        }
    })
    .await
}

/// Starts this program as a bare responder (`flag`) on `queue`; returns once it consumes.
fn start_responder(flag: &str, queue: &str) -> Child {
    common::helper(&[flag, queue]).1
}

/// The bare request/reply round trip to the responder on `queue`.
async fn bare_round_trips(
    callers: usize,
    total: usize,
    channel: &lapin::Channel,
    pending: &Pending,
    queue: &str,
    replies: &str,
) -> Figures {
    let (channel, pending, queue, replies) = (
        channel.clone(),
        pending.clone(),
        queue.to_owned(),
        replies.to_owned(),
    );
    measure(callers, total, move |_| {
        let (channel, pending, queue, replies) = (
            channel.clone(),
            pending.clone(),
            queue.clone(),
            replies.clone(),
        );
        async move {
            let id = format!("{:x}", rand::random::<u64>());
            let (tx, rx) = oneshot::channel();
            pending.lock().unwrap().insert(id.clone(), tx);
            let properties = BasicProperties::default()
                .with_correlation_id(id.as_str().into())
                .with_reply_to(replies.as_str().into());
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    br#"{"input":{"terminal":"t1","amount":1}}"#,
                    properties,
                )
                .await
                .unwrap();
            rx.await.unwrap();
        }
    })
    .await
}
