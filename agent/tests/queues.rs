//! Shared queues that lose nothing: tasks through a broker restart (a node of the test's own),
//! a bounded queue, the delivery limit and its dead letters, and agents of the version before
//! durable queues side by side with this one (the shared broker on 5672).

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::rabbit::{OldAgent, RabbitNode};
use support::{broker_context, broker_context_with, events, Composition};

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("toa-queues-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn terminals(context: &Path, instance: &str, env: &[(&str, &str)]) -> Composition {
    let mut all = vec![("TOA_INSTANCE", instance)];
    all.extend_from_slice(env);
    let composition = Composition::start(
        &[
            "agent/tests/components/terminals",
            "--context",
            context.to_str().unwrap(),
        ],
        &all,
    );
    composition.wait_ready();
    composition
}

/// A replica declares the component's queues, then leaves (drained): tasks wait in them.
fn declared_and_left(context: &Path, env: &[(&str, &str)]) {
    let first = terminals(context, "till-1", env);
    let (stopped, log) = first.terminate(Duration::from_secs(30));
    assert!(stopped, "{log}");
}

/// The ids of the notes that ran, sorted.
fn ids(runs: &[Value]) -> Vec<u64> {
    let mut ids: Vec<u64> = runs.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    ids
}

/// A task through the caller's agent: the answer.
fn task(agent: &str, request: &str) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
        .args([
            "call",
            "test.terminals.note",
            request,
            "--agent",
            agent,
            "--task",
        ])
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}

/// An ordinary call to `test.terminals.note` through the agent at `agent`, on a thread of its
/// own: its answer, when joined.
fn call_in_background(agent: &str, request: String) -> std::thread::JoinHandle<Value> {
    let agent = agent.to_owned();
    std::thread::spawn(move || {
        let output = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .args(["call", "test.terminals.note", &request, "--agent", &agent])
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&output.stdout).unwrap_or(Value::Null)
    })
}

/// Waits until `path` holds `count` JSON lines, within `limit`.
fn wait_lines(path: &Path, count: usize, limit: Duration) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let lines = events(path);
        if lines.len() >= count {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {count} lines in {path:?} after {limit:?}",
            lines.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tasks_confirmed_before_a_broker_restart_all_run_after_it_each_once() {
    let mut broker = RabbitNode::start();
    let (context, _, _queues) = broker_context("restart-tasks", &broker.url());
    let notes = temp("restart-notes");
    let notes_env = [("TEST_NOTES", notes.to_str().unwrap())];
    declared_and_left(&context, &notes_env);
    let record = temp("restart-caller");
    let caller = Composition::caller(&context, &record);
    const TASKS: usize = 500;
    let agent = caller.agent.clone();
    let senders: Vec<_> = (0..8)
        .map(|worker| {
            let agent = agent.clone();
            std::thread::spawn(move || {
                (worker..TASKS)
                    .step_by(8)
                    .map(|id| (id, task(&agent, &format!("{{ input: {{ id: {id} }} }}"))))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for sender in senders {
        for (id, answer) in sender.join().unwrap() {
            assert_eq!(answer, serde_json::json!({"reply": null}), "task {id}");
        }
    }
    assert!(events(&notes).is_empty(), "nothing ran before the restart");

    broker.restart();
    let _replica = terminals(&context, "till-2", &notes_env);
    let runs = wait_lines(&notes, TASKS, Duration::from_secs(60));
    let expected: Vec<u64> = (0..TASKS as u64).collect();
    assert_eq!(ids(&runs), expected, "each task ran exactly once");
}

/// What befalls the broker, or the busy replica, once the tasks are queued behind it.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// A clean stop and a start.
    Restart,
    /// SIGKILL and a start.
    Kill,
    /// SIGSTOP for three heartbeats, then SIGCONT.
    Freeze,
    /// The replica SIGKILLed with two tasks running and its prefetch full; another one started.
    KillReplica,
}

/// Tasks accepted while the only replica is busy (both its consumers' prefetch full of long
/// calls and tasks), then `fault`: every accepted task runs, and none is dead-lettered (issue 25).
/// The caller makes ordinary calls first, which once sent its tasks to the transient calls queue,
/// where a broker restart dropped them.
fn tasks_behind_a_busy_replica_survive(fault: Fault, name: &str) {
    let mut broker = RabbitNode::start();
    let (context, _, _queues) = broker_context(name, &broker.url());
    let notes = temp(&format!("{name}-notes"));
    let starts = temp(&format!("{name}-starts"));
    let env = [
        ("TEST_NOTES", notes.to_str().unwrap()),
        ("TEST_NOTE_STARTS", starts.to_str().unwrap()),
        ("TOA_PREFETCH", "2"),
        ("TOA_AMQP_HEARTBEAT", "2"),
    ];
    let (replica, probe) = probed(&context, "till-1", &env);
    let caller = Composition::caller(&context, &temp(&format!("{name}-caller")));
    // Two long ordinary calls (ids 1000, 1001) and two long tasks (100, 101) fill both prefetches.
    let busy: Vec<_> = (0..2)
        .map(|i| {
            let request = format!("{{ input: {{ id: {}, sleep_ms: 8000 }} }}", 1000 + i);
            call_in_background(&caller.agent, request)
        })
        .collect();
    wait_lines(&starts, 2, Duration::from_secs(15));
    let mut accepted: Vec<u64> = vec![100, 101];
    for id in &accepted {
        let answer = task(
            &caller.agent,
            &format!("{{ input: {{ id: {id}, sleep_ms: 8000 }} }}"),
        );
        assert_eq!(answer, serde_json::json!({"reply": null}), "task {id}");
    }
    wait_lines(&starts, 4, Duration::from_secs(15));
    for id in 0..20 {
        let answer = task(&caller.agent, &format!("{{ input: {{ id: {id} }} }}"));
        assert_eq!(answer, serde_json::json!({"reply": null}), "task {id}");
        accepted.push(id);
    }
    // The scenario: the 20 queued, not started, behind the four long ones.
    assert_eq!(
        events(&starts).len(),
        4,
        "only the long calls and tasks started"
    );

    let mut replicas = vec![(replica, probe)];
    match fault {
        Fault::Restart => broker.restart(),
        Fault::Kill => broker.kill_and_start(),
        Fault::Freeze => {
            broker.freeze();
            std::thread::sleep(Duration::from_secs(7));
            broker.thaw();
        }
        Fault::KillReplica => {
            replicas.pop().unwrap().0.kill();
            replicas.push(probed(&context, "till-2", &env));
        }
    }
    for thread in busy {
        let _ = thread.join();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    accepted.sort_unstable();
    loop {
        let mut ran: Vec<u64> = ids(&events(&notes))
            .into_iter()
            .filter(|id| *id < 1000)
            .collect();
        ran.dedup();
        if ran == accepted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{fault:?}: ran {ran:?} of {accepted:?}\n{}",
            replicas[0].0.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let dead: u64 = replicas
        .iter()
        .map(|(_, probe)| dead_lettered(*probe))
        .sum();
    assert_eq!(dead, 0, "{fault:?}: a task was dead-lettered");
    // The fault happened as meant: the frozen broker lost the replica's connection, and the
    // killed replica's two running tasks started again on the other.
    match fault {
        Fault::Freeze => {
            let log = replicas[0].0.log();
            assert!(
                log.contains("the connection to the broker ended"),
                "the freeze went unnoticed:\n{log}"
            );
        }
        Fault::KillReplica => {
            let again: Vec<Value> = events(&starts)
                .into_iter()
                .filter(|start| start["id"] == 100 || start["id"] == 101)
                .collect();
            assert_eq!(again.len(), 4, "{again:?}");
        }
        Fault::Restart | Fault::Kill => {}
    }
}

#[test]
fn tasks_queued_behind_a_busy_replica_survive_a_broker_restart() {
    tasks_behind_a_busy_replica_survive(Fault::Restart, "busy-restart");
}

#[test]
fn tasks_queued_behind_a_busy_replica_survive_a_broker_killed_and_started() {
    tasks_behind_a_busy_replica_survive(Fault::Kill, "busy-kill");
}

#[test]
fn tasks_queued_behind_a_busy_replica_survive_a_broker_frozen_past_its_heartbeat() {
    tasks_behind_a_busy_replica_survive(Fault::Freeze, "busy-freeze");
}

#[test]
fn tasks_queued_behind_a_busy_replica_survive_it_killed_with_them_in_its_buffer() {
    tasks_behind_a_busy_replica_survive(Fault::KillReplica, "busy-replica");
}

#[test]
fn a_full_queue_refuses_a_call_unavailable_naming_it() {
    let (context, application, _queues) =
        broker_context_with("bounded", "amqp://127.0.0.1:5672", "limits:\n  queue: 5\n");
    let notes = temp("bounded-notes");
    let notes_env = [("TEST_NOTES", notes.to_str().unwrap())];
    declared_and_left(&context, &notes_env);
    let record = temp("bounded-caller");
    let caller = Composition::caller(&context, &record);
    // A quorum queue checks its bound as it takes a message, so it may take one past it.
    let mut taken = 0;
    let refused = loop {
        let answer = task(&caller.agent, &format!("{{ input: {{ id: {taken} }} }}"));
        if answer != serde_json::json!({"reply": null}) {
            break answer;
        }
        taken += 1;
        assert!(
            taken <= 7,
            "the queue took {taken} calls past its bound of 5"
        );
    };
    assert!(taken >= 5, "refused after {taken}: {refused}");
    assert_eq!(refused["error"]["code"], "UNAVAILABLE", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    let queue = format!("toa.{application}.test.terminals#tasks");
    assert!(
        message.contains(&queue) && message.contains("full"),
        "{message}"
    );
    // Nothing was dropped: the five run once a replica is back.
    let _replica = terminals(&context, "till-2", &notes_env);
    let runs = wait_lines(&notes, taken, Duration::from_secs(20));
    assert_eq!(ids(&runs), (0..taken as u64).collect::<Vec<_>>());
}

/// `toa_calls_dead_lettered_total` on the probe port `probe`.
fn dead_lettered(probe: u16) -> u64 {
    let (_, metrics) = support::http_get(&format!("http://127.0.0.1:{probe}/metrics"));
    metrics
        .lines()
        .find(|line| line.starts_with("toa_calls_dead_lettered_total{"))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// A replica of terminals with its probes on a free port: the composition and the port.
fn probed(context: &Path, instance: &str, env: &[(&str, &str)]) -> (Composition, u16) {
    let probe = support::free_port();
    let listen = format!("127.0.0.1:{probe}");
    let mut all = env.to_vec();
    all.push(("TOA_PROBE_LISTEN", &listen));
    (terminals(context, instance, &all), probe)
}

/// `first` (`till-1`) killed (SIGKILL: no drain) once its program started the one call or task
/// `starts` records, then `till-2` the same way; then a third replica (`till-3`) started, and its
/// probe port.
fn killed_under_it_twice(
    first: Composition,
    context: &Path,
    starts: &Path,
    env: &[(&str, &str)],
) -> (Composition, u16) {
    wait_lines(starts, 1, Duration::from_secs(15));
    first.kill();
    let second = terminals(context, "till-2", env);
    wait_lines(starts, 2, Duration::from_secs(15));
    second.kill();
    probed(context, "till-3", env)
}

#[test]
fn a_call_that_takes_its_program_down_each_time_is_dead_lettered_and_its_caller_told() {
    let (context, _, _queues) = broker_context_with(
        "dead-call",
        "amqp://127.0.0.1:5672",
        "limits:\n  deliveries: 2\n",
    );
    let starts = temp("dead-call-starts");
    let env = [("TEST_NOTE_STARTS", starts.to_str().unwrap())];
    let (one, probe_one) = probed(&context, "till-1", &env);
    let (two, probe_two) = probed(&context, "till-2", &env);
    let caller = Composition::caller(&context, &temp("dead-call-caller"));
    // Each program the call reaches dies under it; the call goes to the other replica once.
    let (ok, answer) = caller.call("test.terminals.note", "{ input: { id: 1, crash: true } }");
    assert!(!ok);
    assert_eq!(answer["error"]["code"], "FAILED", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("delivered 2 times"), "{message}");
    let pids: Vec<u64> = events(&starts)
        .iter()
        .map(|s| s["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "started twice, not a third time");
    assert_ne!(pids[0], pids[1], "on both replicas");
    assert_eq!(dead_lettered(probe_one) + dead_lettered(probe_two), 1);
    assert!(one.log().contains("dead-lettered") || two.log().contains("dead-lettered"));
}

#[test]
fn a_task_whose_process_dies_under_it_each_time_is_dead_lettered_by_the_broker() {
    let (context, _, _queues) = broker_context_with(
        "dead-task",
        "amqp://127.0.0.1:5672",
        "limits:\n  deliveries: 2\n",
    );
    let starts = temp("dead-task-starts");
    let notes = temp("dead-task-notes");
    let env = [
        ("TEST_NOTE_STARTS", starts.to_str().unwrap()),
        ("TEST_NOTES", notes.to_str().unwrap()),
    ];
    let replica = terminals(&context, "till-1", &env);
    let caller = Composition::caller(&context, &temp("dead-task-caller"));
    let answer = task(&caller.agent, "{ input: { id: 1, sleep_ms: 20000 } }");
    assert_eq!(answer, serde_json::json!({"reply": null}));
    // Each process that takes the task dies under it (SIGKILL: no drain); the broker counts.
    let (replica, probe) = killed_under_it_twice(replica, &context, &starts, &env);
    let deadline = Instant::now() + Duration::from_secs(15);
    while dead_lettered(probe) == 0 {
        assert!(Instant::now() < deadline, "the task was not dead-lettered");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Logged with its id (the call id, 32 hex digits) and operation, never its input.
    let log = replica.log();
    let line = log
        .lines()
        .find(|line| line.contains("dead-lettered"))
        .unwrap_or_else(|| panic!("no dead-letter line:\n{log}"));
    let id: String = line
        .split("call=")
        .nth(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_hexdigit).collect())
        .unwrap_or_default();
    assert_eq!(id.len(), 32, "{line}");
    assert!(
        line.contains("operation=\"note\"") && !line.contains("sleep_ms"),
        "{line}"
    );
    assert_eq!(
        events(&starts).len(),
        2,
        "the task did not start a third time"
    );
    assert!(events(&notes).is_empty());
}

/// An ordinary call whose agents die under it (SIGKILL: the classic calls queue redelivers it
/// with only the `redelivered` flag) is counted on Redis: its second delivery runs, its third is
/// dead-lettered without running, and its caller is told. Without the count it went round the
/// replicas without end.
#[test]
fn an_ordinary_call_whose_agents_die_under_it_is_counted_on_redis_and_dead_lettered() {
    let (context, _, _queues) = broker_context_with(
        "dead-agents",
        "amqp://127.0.0.1:5672",
        "atomicity:\n  redis: redis://127.0.0.1:6379\nlimits:\n  deliveries: 2\n",
    );
    let starts = temp("dead-agents-starts");
    let notes = temp("dead-agents-notes");
    let env = [
        ("TEST_NOTE_STARTS", starts.to_str().unwrap()),
        ("TEST_NOTES", notes.to_str().unwrap()),
    ];
    let replica = terminals(&context, "till-1", &env);
    let caller = Composition::caller(&context, &temp("dead-agents-caller"));
    let waiting = call_in_background(
        &caller.agent,
        "{ input: { id: 1, sleep_ms: 20000 } }".into(),
    );
    let (_replica, probe) = killed_under_it_twice(replica, &context, &starts, &env);
    let answer = waiting.join().unwrap();
    assert_eq!(answer["error"]["code"], "FAILED", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("delivered 2 times"), "{message}");
    assert_eq!(dead_lettered(probe), 1);
    assert_eq!(
        events(&starts).len(),
        2,
        "the call did not start a third time"
    );
    assert!(events(&notes).is_empty());
}

#[test]
fn agents_before_durable_queues_and_this_one_answer_each_others_calls_and_a_changed_bound_loses_nothing(
) {
    let broker = "amqp://127.0.0.1:5672";
    let (context, application, _queues) = broker_context("rollout", broker);
    let legacy = format!("toa.{application}.test.terminals");
    let record = temp("rollout-caller");
    let caller = Composition::caller(&context, &record);

    // Only an old replica serves: a new caller's call reaches it, and so does a task (no
    // #tasks queue yet: it goes where old agents take tasks).
    let old = OldAgent::serve(broker, &legacy);
    let (ok, answer) = caller.call("test.terminals.note", "{ input: { id: 1 } }");
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"], "old");
    assert_eq!(
        task(&caller.agent, "{ input: { id: 0 } }"),
        serde_json::json!({"reply": null})
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while old.taken.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "the old replica did not get the task"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(old);

    // A new replica: an old caller's call (to the old queue) reaches it too.
    let notes = temp("rollout-notes");
    let notes_env = [("TEST_NOTES", notes.to_str().unwrap())];
    let new = terminals(&context, "till-1", &notes_env);
    let reply = support::rabbit::request(
        broker,
        &legacy,
        r#"{"operation": "note", "input": {"id": 2}}"#,
    );
    assert!(reply["reply"]["pid"].is_u64(), "{reply}");
    let (ok, answer) = caller.call("test.terminals.note", "{ input: { id: 3 } }");
    assert!(ok && answer["reply"]["pid"].is_u64(), "{answer}");

    // Another replica with another bound: it serves the queue as it is, and says so.
    let (changed, _, _more_queues) =
        broker_context_with("rollout", broker, "limits:\n  queue: 7\n");
    let other = terminals(&changed, "till-2", &notes_env);
    assert!(
        other.log().contains("exists with other arguments"),
        "{}",
        other.log()
    );
    drop(new);
    for id in 10..20 {
        let (ok, answer) = caller.call(
            "test.terminals.note",
            &format!("{{ input: {{ id: {id} }} }}"),
        );
        assert!(ok, "call {id}: {answer}\n{}", other.log());
    }
    let ids: Vec<u64> = events(&notes)
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 12, "{ids:?}");
}
