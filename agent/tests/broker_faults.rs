//! Calls when the broker or a process fails: a broker of the test's own restarted mid-run, and a
//! process that stops answering (a lost node) on the shared broker.

mod support;

use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::rabbit::{queue_exists, RabbitNode};
use support::{broker_context, Composition};

fn terminals(context: &Path, instance: &str, extra: &[(&str, &str)]) -> Composition {
    let record = std::env::temp_dir().join(format!("toa-charges-faults-{}", std::process::id()));
    let record = record.to_str().unwrap().to_owned();
    let mut env = vec![("TOA_INSTANCE", instance), ("TEST_RECORD", record.as_str())];
    env.extend_from_slice(extra);
    let composition = Composition::start(
        &[
            "agent/tests/components/terminals",
            "--context",
            context.to_str().unwrap(),
        ],
        &env,
    );
    composition.wait_ready();
    composition
}

/// A call made from another thread: the answer once it ends, and how long it took.
fn call_async(
    agent: &str,
    target: &str,
    request: &str,
) -> std::thread::JoinHandle<(Value, Duration)> {
    let (agent, target, request) = (agent.to_owned(), target.to_owned(), request.to_owned());
    std::thread::spawn(move || {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .args(["call", &target, &request, "--agent", &agent])
            .output()
            .unwrap();
        (
            serde_json::from_slice::<Value>(&output.stdout).unwrap_or(Value::Null),
            started.elapsed(),
        )
    })
}

#[test]
fn a_broker_restart_abandons_waiting_calls_refuses_names_and_recovers() {
    let mut broker = RabbitNode::start();
    let (context, application, _queues) = broker_context("restart", &broker.url());
    let till = terminals(&context, "till-1", &[]);
    let caller = terminals(&context, "till-2", &[]);
    caller.connect_terminal("till-1", "t1");
    let charge = |amount: u32, extra: &str| {
        format!("{{ input: {{ terminal: t1, amount: {amount}{extra} }}, instance: till-1, timeout: 8000 }}")
    };

    // A call waiting for its reply when the broker goes away ends at once, not at its timeout.
    let waiting = call_async(
        &caller.agent,
        "test.terminals.charge",
        &charge(1, ", sleep_ms: 3000"),
    );
    std::thread::sleep(Duration::from_millis(500));
    broker.stop();
    let (answer, took) = waiting.join().unwrap();
    assert_eq!(answer["error"]["code"], "Abandoned", "{answer}");
    assert!(
        took < Duration::from_secs(8),
        "the waiting call ended at its timeout ({took:?}), not when the connection ended"
    );

    // While the broker is away: a call to a process is an Addressee, at once.
    let (answer, took) = caller.call_until(
        "test.terminals.charge",
        &charge(2, ""),
        Duration::from_secs(5),
        |answer| answer["error"]["code"] == "Addressee",
    );
    assert_eq!(answer["error"]["number"], 403);
    // An ordinary call waits for the broker and goes through once it is back.
    let ordinary = call_async(
        &caller.agent,
        "test.terminals.connect",
        "{ input: { terminal: t9 } }",
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !ordinary.is_finished(),
        "an ordinary call did not wait for the broker"
    );

    broker.start_again();
    // Back: the process answers under its name again, its queues are declared again.
    let (answer, back_after) = caller.call_until(
        "test.terminals.charge",
        &charge(3, ""),
        Duration::from_secs(30),
        |answer| answer["reply"]["charged"] == 3,
    );
    assert_eq!(answer["reply"]["charged"], 3);
    let (answer, _) = ordinary.join().unwrap();
    assert!(
        answer["reply"]["holder"].is_string(),
        "the ordinary call made while the broker was away: {answer}"
    );
    for queue in [
        format!("toa.{application}.test.terminals"),
        format!("toa.{application}.test.terminals@till-1"),
        format!("toa.{application}.test.terminals@till-2"),
    ] {
        assert!(
            queue_exists(&broker.url(), &queue),
            "{queue} missing after the restart"
        );
    }
    eprintln!("Addressee while away took {took:?}; answering again {back_after:?} after the start");
    assert!(
        till.log().contains("reconnected to the broker"),
        "{}",
        till.log()
    );
}

#[test]
fn a_lost_node_is_abandoned_until_the_heartbeat_drops_it_then_an_addressee() {
    let (context, _, _queues) = broker_context("lost", "amqp://127.0.0.1:5672");
    let heartbeat = 2;
    let till = terminals(&context, "till-1", &[("TOA_AMQP_HEARTBEAT", "2")]);
    let caller = terminals(&context, "till-2", &[]);
    caller.connect_terminal("till-1", "t1");
    let charge = "{ input: { terminal: t1, amount: 1 }, instance: till-1, timeout: 700 }";

    till.freeze();
    let frozen = Instant::now();
    // The broker still holds its connection and queue: the call is queued, never answered.
    let (_, answer) = caller.call("test.terminals.charge", charge);
    assert_eq!(answer["error"]["code"], "Abandoned", "{answer}");
    assert_eq!(answer["error"]["number"], 404);
    // Once the broker's heartbeat gives up on it, nobody holds the name.
    let (_, _) = caller.call_until(
        "test.terminals.charge",
        charge,
        Duration::from_secs(heartbeat * 4 + 10),
        |answer| answer["error"]["code"] == "Addressee",
    );
    let dropped_after = frozen.elapsed();
    eprintln!(
        "the broker dropped the frozen process after {dropped_after:?} (heartbeat {heartbeat} s)"
    );
    assert!(
        dropped_after >= Duration::from_secs(heartbeat),
        "Addressee after {dropped_after:?}: sooner than the heartbeat could notice"
    );

    // The process comes back: it reconnects and answers under its name again.
    till.thaw();
    caller.call_until(
        "test.terminals.charge",
        charge,
        Duration::from_secs(30),
        |answer| answer["reply"]["charged"] == 1,
    );
}

/// A broker that accepts the connection and never answers (frozen, or still booting) does not
/// hold the agent's start forever: it fails naming the address and the limit.
#[test]
fn a_broker_that_accepts_and_never_answers_fails_the_start_within_the_open_limit() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("amqp://127.0.0.1:{}", silent.local_addr().unwrap().port());
    // Connections are accepted and held open, unanswered.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in silent.incoming() {
            held.push(connection);
        }
    });
    // Not broker_context: its queues' clean-up would wait on this broker too.
    let context =
        std::env::temp_dir().join(format!("toa-context-silent-{}.yaml", std::process::id()));
    std::fs::write(&context, format!("name: silent\namqp: {address}\n")).unwrap();
    let started = Instant::now();
    let mut agent = Composition::start(
        &[
            "agent/tests/components/terminals",
            "--context",
            context.to_str().unwrap(),
        ],
        &[],
    );
    let exited = loop {
        if let Some(success) = agent.exited() {
            break success;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "still starting:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = agent.log();
    assert!(!exited, "{log}");
    assert!(
        log.contains(&format!("the broker at {address} is unreachable"))
            && log.contains("did not finish opening it within 15s"),
        "{log}"
    );
    assert!(!log.contains("Composition complete"), "{log}");
}

/// The TCP connections process `pid` holds to `port` on loopback (from /proc: its sockets' inodes
/// among the system's TCP sockets).
fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let remote = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.len() > 9 && fields[2].ends_with(&remote))
        .filter(|fields| inodes.contains(fields[9]))
        .count()
}

/// While the broker stays frozen, the agent keeps one attempt to reconnect, not one more every
/// 15 s: lapin holds an attempt's thread and socket until the broker answers. Thawed, it
/// reconnects.
#[test]
fn a_broker_frozen_for_long_gets_one_reconnect_attempt_at_a_time() {
    let broker = RabbitNode::start();
    let (context, _, _queues) = broker_context("frozen-long", &broker.url());
    let till = terminals(&context, "till-1", &[("TOA_AMQP_HEARTBEAT", "2")]);
    broker.freeze();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !till.log().contains("the connection to the broker ended") {
        assert!(Instant::now() < deadline, "{}", till.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The fault's length: past two opening limits (15 s each).
    std::thread::sleep(Duration::from_secs(35));
    let held = connections_to(till.pid(), broker.port);
    broker.thaw();
    assert!(held <= 1, "{held} connections to the frozen broker");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !till.log().contains("reconnected to the broker") {
        assert!(Instant::now() < deadline, "{}", till.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A consumer that ends under a living connection (here its queue deleted from outside; in
/// production also RabbitMQ's consumer timeout, which closes the channel of a call that runs
/// longer) makes the agent open a new session, which serves the queue again: calls go through.
/// Before, nothing consumed it any more.
#[test]
fn a_consumer_the_broker_ended_is_replaced_by_a_new_session() {
    let (context, application, _queues) = broker_context("consumer-ended", "amqp://127.0.0.1:5672");
    let till = terminals(&context, "till-1", &[]);
    let queue = format!("toa.{application}.test.terminals");
    let deleted = Command::new("rabbitmqctl")
        .args(["-q", "delete_queue", &queue])
        .output()
        .unwrap();
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while !till
        .log()
        .contains("the consumer stopped: opening a new session")
    {
        assert!(Instant::now() < deadline, "{}", till.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    till.call_until(
        "test.terminals.connect",
        "{ input: { terminal: t1 } }",
        Duration::from_secs(15),
        |answer| answer["reply"]["holder"] == "till-1",
    );
}

#[test]
fn a_bad_heartbeat_or_prefetch_is_refused_before_any_program_runs() {
    let (context, _, _queues) = broker_context("bad-heartbeat", "amqp://127.0.0.1:5672");
    for (name, value) in [("TOA_AMQP_HEARTBEAT", "0"), ("TOA_PREFETCH", "many")] {
        let output = support::compose_once(
            &[
                "agent/tests/components/terminals",
                "--context",
                context.to_str().unwrap(),
            ],
            &[(name, value)],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        // 64 (EX_USAGE): refused while reading the configuration, before any program started
        // (a refusal after the start exits 1).
        assert_eq!(output.status.code(), Some(64), "{name}={value}: {stderr}");
        assert!(
            stderr.contains(&format!("{name} must be a whole number from 1 to"))
                && stderr.contains(value),
            "{name}={value}: {stderr}"
        );
    }
}

#[test]
fn a_channel_the_broker_closed_heals_and_a_frozen_broker_answers_at_the_deadline() {
    // Messages over 4 KiB are refused by this node with a channel close.
    let broker = RabbitNode::start_with("max_message_size = 4096\n");
    let (context, _, _queues) = broker_context("channel", &broker.url());
    let _till = terminals(&context, "till-1", &[]);
    let caller = terminals(&context, "till-2", &[]);
    caller.connect_terminal("till-1", "t1");
    let charge = |extra: &str| {
        format!(
            "{{ input: {{ terminal: t1, amount: 1{extra} }}, instance: till-1, timeout: 2000 }}"
        )
    };

    let big = format!(", note: {}", "x".repeat(6000));
    let (ok, answer) = caller.call("test.terminals.charge", &charge(&big));
    assert!(!ok, "the broker took a message over its limit: {answer}");
    // The next call goes through, without a restart: the session was replaced.
    let (ok, answer) = caller.call("test.terminals.connect", "{ input: { terminal: t2 } }");
    assert!(
        ok,
        "the call after a closed channel failed: {answer}\n{}",
        caller.log()
    );
    caller.connect_terminal("till-1", "t1");
    let (answer, _) = caller.call_until(
        "test.terminals.charge",
        &charge(""),
        Duration::from_secs(10),
        |answer| answer["reply"]["charged"] == 1,
    );
    assert_eq!(answer["reply"]["charged"], 1);

    // Frozen: the publish's confirm never comes; the call ends at its deadline all the same.
    broker.freeze();
    let started = Instant::now();
    let (_, answer) = caller.call("test.terminals.charge", &charge(""));
    let took = started.elapsed();
    broker.thaw();
    assert_eq!(answer["error"]["code"], "Abandoned", "{answer}");
    assert!(
        took < Duration::from_millis(3000),
        "a 2 s call to a frozen broker took {took:?}"
    );
}
