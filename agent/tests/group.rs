//! Seed 000's second terminal: two `compose` processes of one application on one machine, on the
//! default context (no Redis), form a local group: the slots divide, a lock excludes across
//! them, a meter of ten a minute holds across both, and when one is killed the other owns all
//! 16 slots. Ownership is checked from the programs' own record afterwards.

mod support;

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{events, Composition};

const BOUND: Duration = Duration::from_secs(20);
const TOTAL: u32 = 16;
const TERMINALS: &str = "agent/tests/components/terminals";

/// CLOCK_MONOTONIC in seconds: the clock the programs record with (Python's `time.monotonic`).
fn monotonic() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// A compose of `components`, the process `name` of the local group `group` (its files in
/// `runtime`), with `env` besides; once it is ready.
fn member(
    components: &[&str],
    name: &str,
    (group, runtime): (&str, &Path),
    env: &[(&str, &str)],
) -> Composition {
    let mut all = vec![
        ("TOA_ALONE", "false"),
        ("TOA_LOCAL_GROUP", group),
        ("TOA_RUNTIME_DIR", runtime.to_str().unwrap()),
        ("TOA_INSTANCE", name),
    ];
    all.extend_from_slice(env);
    let composition = Composition::start(components, &all);
    composition.wait_ready();
    composition
}

fn start(name: &str, group: &str, runtime: &Path, record: &Path) -> Composition {
    let record = [("TEST_RECORD", record.to_str().unwrap())];
    member(
        &["agent/tests/components/assigned"],
        name,
        (group, runtime),
        &record,
    )
}

fn slots(composition: &Composition) -> Option<Vec<u64>> {
    let url = format!("{}/v1/test.assigned/slots?total={TOTAL}", composition.agent);
    let (status, response) = support::http_get(&url);
    assert_eq!(status, 200, "{response}");
    let body = response.split("\r\n\r\n").nth(1).unwrap();
    let body: Value = serde_json::from_str(body).unwrap();
    let slots = body["slots"].as_array()?;
    Some(slots.iter().map(|slot| slot.as_u64().unwrap()).collect())
}

/// A lock taken through the local API: the open request holds it.
struct Lock {
    stream: BufReader<TcpStream>,
}

impl Lock {
    fn ask(composition: &Composition, key: &str) -> Self {
        let address = composition.agent.strip_prefix("http://").unwrap();
        let mut stream = TcpStream::connect(address).unwrap();
        let body = format!(r#"{{"keys":["{key}"]}}"#);
        write!(
            stream,
            "POST /v1/test.assigned/lock HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        Self {
            stream: BufReader::new(stream),
        }
    }

    /// Whether `acquired` came within `wait`.
    fn acquired(&mut self, wait: Duration) -> bool {
        self.told("acquired", wait)
    }

    /// Whether the stream told `event` within `wait`.
    fn told(&mut self, event: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let (mut line, told) = (String::new(), format!(r#""event":"{event}""#));
        loop {
            // The whole wait, across the keep-alive lines that come meanwhile.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.stream.get_ref().set_read_timeout(Some(left)).unwrap();
            line.clear();
            match self.stream.read_line(&mut line) {
                Ok(0) | Err(_) => return false,
                Ok(_) if line.contains(&told) => return true,
                Ok(_) => {}
            }
        }
    }
}

fn meter(composition: &Composition) -> u64 {
    let url = format!("{}/v1/test.assigned/meter", composition.agent);
    let (status, response) = support::post(&url, r#"{"keys":["appraise"],"deltas":[6000]}"#);
    assert_eq!(status, 200, "{response}");
    let body: Value = serde_json::from_str(response.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    body["debts"][0].as_u64().unwrap()
}

/// A directory of the test's own, empty: `toa-group-<name>-<pid>` in the temp directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toa-group-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_composes_of_one_application_share_slots_locks_and_meters_and_the_survivor_takes_all() {
    let scratch = scratch("e2e");
    let runtime = scratch.join("run");
    let group = format!("e2e-{}", std::process::id());
    let records: [PathBuf; 2] = [scratch.join("first.jsonl"), scratch.join("second.jsonl")];
    let first = start("first", &group, &runtime, &records[0]);
    // Alone so far (and the first ever): it owns every slot at once.
    until("the first owning all", || {
        (slots(&first)?.len() == TOTAL as usize).then_some(())
    });
    let started = Instant::now();
    let second = start("second", &group, &runtime, &records[1]);
    assert!(
        first.log().contains("this process leads"),
        "{}",
        first.log()
    );
    assert!(
        second
            .log()
            .contains("joined the application's first process"),
        "{}",
        second.log()
    );

    // 16 slots split between the two, none twice.
    let (mine, theirs) = until("the slots split", || {
        let (a, b) = (slots(&first)?, slots(&second)?);
        (a.len() + b.len() == TOTAL as usize && !a.is_empty() && !b.is_empty()).then_some((a, b))
    });
    assert!(
        mine.iter().all(|slot| !theirs.contains(slot)),
        "{mine:?} {theirs:?}"
    );
    println!(
        "the second owned its share {:?} after it started",
        started.elapsed()
    );

    // A lock held through the first excludes the second until released.
    let mut held = Lock::ask(&first, "settlement");
    assert!(held.acquired(BOUND));
    let mut waiting = Lock::ask(&second, "settlement");
    assert!(
        !waiting.acquired(Duration::from_millis(500)),
        "held by the first"
    );
    drop(held);
    assert!(waiting.acquired(BOUND), "released by the first");
    drop(waiting);

    // Ten a minute across both: each appraisal charges 6 s; the eleventh passes a minute's debt.
    let debts: Vec<u64> = (0..11)
        .map(|n| meter(if n % 2 == 0 { &first } else { &second }))
        .collect();
    assert!(debts[9] <= 60_000, "{debts:?}");
    assert!(debts[10] > 60_000, "one debt for both: {debts:?}");

    // The first is killed: the second owns all 16.
    let killed_at = monotonic();
    first.kill();
    until("the survivor owning all", || {
        (slots(&second)?.len() == TOTAL as usize).then_some(())
    });
    let (stopped, log) = second.terminate(BOUND);
    assert!(stopped, "{log}");
    no_slot_owned_twice(&records, killed_at);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// A process stopped (SIGSTOP) while it holds a lock keeps it only until the leader takes its
/// silence for an end (5 s): the other process gets it then, and the stopped one, once it runs
/// again, tells its holder the lock was lost.
#[test]
fn a_stopped_process_holds_no_lock_for_long_and_is_told_it_lost_it_when_it_runs_again() {
    let scratch = scratch("stop");
    let (runtime, group) = (scratch.join("run"), format!("stop-{}", std::process::id()));
    let first = start("first", &group, &runtime, &scratch.join("first.jsonl"));
    let second = start("second", &group, &runtime, &scratch.join("second.jsonl"));
    let mut held = Lock::ask(&second, "nightly");
    assert!(held.acquired(BOUND));
    let signal = |signal| {
        // SAFETY: a signal to the agent this test started.
        assert_eq!(unsafe { libc::kill(second.pid() as i32, signal) }, 0);
    };
    signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let mut waiting = Lock::ask(&first, "nightly");
    assert!(
        !waiting.acquired(Duration::from_secs(1)),
        "held by the second"
    );
    assert!(waiting.acquired(BOUND), "the stopped process's lock freed");
    println!("granted {:?} after the holder stopped", stopped.elapsed());
    signal(libc::SIGCONT);
    assert!(held.told("lost", BOUND), "the holder is told");
    drop((held, waiting));
    for composition in [first, second] {
        let (stopped, log) = composition.terminate(BOUND);
        assert!(stopped, "{log}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// A call handed to a process that was stopped (SIGSTOP) before it read it goes to the other
/// process once the stopped one is taken for gone (5 s), and the stopped one, when it runs again,
/// does not run it as well: each call starts once, in the process that answered it.
#[test]
fn a_call_handed_to_a_stopped_process_runs_once_elsewhere_and_not_when_it_resumes() {
    let scratch = scratch("resume");
    let (runtime, group) = (
        scratch.join("run"),
        format!("resume-{}", std::process::id()),
    );
    let (notes, starts) = (scratch.join("notes.jsonl"), scratch.join("starts.jsonl"));
    let env = [
        ("TEST_NOTES", notes.to_str().unwrap()),
        ("TEST_NOTE_STARTS", starts.to_str().unwrap()),
    ];
    let start = |name: &str| member(&[TERMINALS], name, (&group, &runtime), &env);
    let (first, second) = (start("first"), start("second"));
    let pid = |name: &str, on: &Composition| {
        let body = format!(r#"{{"instance":"{name}"}}"#);
        support::call_with(&on.agent, "test.terminals.pid", "", &body).1["reply"].as_u64()
    };
    let first_pid = pid("first", &first).unwrap();
    // SAFETY: signals to the agent this test started.
    let signal = |signal| assert_eq!(unsafe { libc::kill(second.pid() as i32, signal) }, 0);
    signal(libc::SIGSTOP);
    // SIGSTOP takes effect as each thread next runs: under load a call made at once reached the
    // process before it stopped, and its program started it (a record of that, not a fault).
    until("the second stopped", || stopped(second.pid()).then_some(()));
    // Two calls in a row: the group hands them out in turn, so one goes to the stopped process.
    for id in [900, 901] {
        let body = format!(r#"{{"input":{{"id":{id}}}}}"#);
        let (status, answer) = support::call_with(&first.agent, "test.terminals.note", "", &body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["reply"]["pid"].as_u64(), Some(first_pid), "{answer}");
    }
    signal(libc::SIGCONT);
    // Once the second answers again, anything it would have run of what it read meanwhile has
    // started: its program records a start first thing.
    until("the second joined again", || pid("second", &first));
    let started: Vec<Value> = events(&starts)
        .into_iter()
        .filter(|s| s["id"].as_u64() >= Some(900))
        .collect();
    assert_eq!(started.len(), 2, "each call started once: {started:?}");
    assert!(
        started.iter().all(|s| s["pid"].as_u64() == Some(first_pid)),
        "{started:?}"
    );
    for composition in [first, second] {
        let (stopped, log) = composition.terminate(BOUND);
        assert!(stopped, "{log}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Whether every thread of the process `pid` is stopped (state `T` in /proc).
fn stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // `pid (comm) state …`: the state follows the last parenthesis.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

/// From each program's record: the slots it owned from each assignment to the next (the killed
/// one's until it was killed); no two overlapping spans of the two share a slot.
fn no_slot_owned_twice(records: &[PathBuf; 2], killed_at: f64) {
    let spans = |record: &Path, end: f64| -> Vec<(f64, f64, Vec<u32>)> {
        let heard: Vec<(f64, Vec<u32>)> = events(record)
            .iter()
            .filter(|event| event["event"] == "assigned")
            .map(|event| {
                let owned = match &event["assignment"] {
                    Value::Null => Vec::new(),
                    share => {
                        let (i, n) = (share["i"].as_u64().unwrap(), share["n"].as_u64().unwrap());
                        (i as u32..TOTAL).step_by(n as usize).collect()
                    }
                };
                (event["at"].as_f64().unwrap(), owned)
            })
            .collect();
        let ends = heard.iter().skip(1).map(|(at, _)| *at).chain([end]);
        heard
            .iter()
            .zip(ends)
            .map(|((from, owned), to)| (*from, to, owned.clone()))
            .collect()
    };
    let first = spans(&records[0], killed_at);
    let second = spans(&records[1], f64::MAX);
    assert!(
        first
            .iter()
            .any(|(_, _, owned)| owned.len() == TOTAL as usize),
        "the first owned all before the second came: {first:?}"
    );
    for (a_from, a_to, a_owned) in &first {
        for (b_from, b_to, b_owned) in &second {
            let overlap = a_from < b_to && b_from < a_to;
            let shared: Vec<_> = a_owned
                .iter()
                .filter(|slot| b_owned.contains(slot))
                .collect();
            assert!(
                !overlap || shared.is_empty(),
                "slots {shared:?} owned by both between {} and {}",
                a_from.max(*b_from),
                a_to.min(*b_to)
            );
        }
    }
}

/// The seed's terminals in two processes of one group: ordinary calls and tasks reach replicas in
/// both, a call addressed to a process runs there, and one to a process nobody runs is refused.
#[test]
fn calls_between_two_composes_reach_either_and_addressed_calls_the_process_named() {
    let scratch = scratch("calls");
    let (runtime, notes) = (scratch.join("run"), scratch.join("notes.jsonl"));
    let group = format!("calls-{}", std::process::id());
    let charges = scratch.join("charges.jsonl");
    let env = [
        ("TEST_RECORD", charges.to_str().unwrap()),
        ("TEST_NOTES", notes.to_str().unwrap()),
    ];
    let start = |name: &str| member(&[TERMINALS], name, (&group, &runtime), &env);
    let (first, second) = (start("first"), start("second"));
    let call = |on: &Composition, target: &str, body: &str| {
        support::call_with(&on.agent, target, "", body)
    };
    let pid_of = |name: &str, on: &Composition| {
        let body = format!(r#"{{"instance":"{name}"}}"#);
        let (status, answer) = call(on, "test.terminals.pid", &body);
        assert_eq!(status, 200, "{answer}");
        answer["reply"]
            .as_u64()
            .unwrap_or_else(|| panic!("{answer}"))
    };
    // Addressed calls run in the process named, whichever process they are made from.
    let pids = [pid_of("first", &second), pid_of("second", &first)];
    assert_eq!(pid_of("first", &first), pids[0]);
    assert_ne!(pids[0], pids[1]);
    let (_, refused) = call(&first, "test.terminals.pid", r#"{"instance":"third"}"#);
    assert_eq!(
        refused["error"]["code"], "Addressee",
        "no process third: {refused}"
    );

    // Ordinary calls from one process reach the replicas of both.
    let ran: Vec<u64> = (0..6)
        .map(|id| {
            let body = format!(r#"{{"input":{{"id":{id}}}}}"#);
            let (status, answer) = call(&first, "test.terminals.note", &body);
            assert_eq!(status, 200, "{answer}");
            answer["reply"]["pid"].as_u64().unwrap()
        })
        .collect();
    assert!(
        ran.contains(&pids[0]) && ran.contains(&pids[1]),
        "{ran:?} {pids:?}"
    );

    // Tasks too: each is run once, by either.
    for id in 100..106 {
        let url = format!("{}/v1/task/test.terminals/note", second.agent);
        let (status, answer) = support::post(&url, &format!(r#"{{"input":{{"id":{id}}}}}"#));
        assert!(status < 300, "{answer}");
    }
    let tasks = until("the six tasks ran", || {
        let ran: Vec<Value> = events(&notes)
            .into_iter()
            .filter(|n| n["id"].as_u64() >= Some(100))
            .collect();
        (ran.len() >= 6).then_some(ran)
    });
    let mut ids: Vec<u64> = tasks.iter().map(|n| n["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (100..106).collect::<Vec<_>>(), "each task once");
    let where_: Vec<u64> = tasks.iter().map(|n| n["pid"].as_u64().unwrap()).collect();
    assert!(
        where_.contains(&pids[0]) && where_.contains(&pids[1]),
        "{where_:?}"
    );

    // Seed 001: the terminal is connected wherever the call lands; the charge goes to its holder.
    let (status, connected) = call(
        &second,
        "test.terminals.connect",
        r#"{"input":{"terminal":"t1"}}"#,
    );
    assert_eq!(status, 200, "{connected}");
    let holder = connected["reply"]["holder"].as_str().unwrap().to_owned();
    let body = format!(r#"{{"input":{{"terminal":"t1","amount":5}},"instance":"{holder}"}}"#);
    let (status, charged) = call(&first, "test.terminals.charge", &body);
    assert_eq!(
        (status, &charged),
        (200, &serde_json::json!({"reply": {"charged": 5}}))
    );
    drop((first, second));
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Seed 003 in two processes of one group: one copy of each object (the kettle's stock set
/// through one process is sold through the other, and never twice), and an event one process's
/// component publishes reaches the receiver that only the other runs.
#[test]
fn two_composes_share_one_store_and_their_events() {
    let scratch = std::env::temp_dir().join(format!("toa-group-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let runtime = scratch.join("run");
    let group = format!("store-{}", std::process::id());
    let start = |name: &str, components: &[&str]| member(components, name, (&group, &runtime), &[]);
    let stock = "agent/tests/components/stock-retry";
    let first = start("first", &[stock, "agent/tests/components/orders-events"]);
    let second = start("second", &[stock, "agent/tests/components/follower"]);
    let call = |on: &Composition, target: &str, body: &str| {
        support::call_with(&on.agent, target, "", body)
    };
    let (status, set) = call(
        &first,
        "fulfilment.stock.transit",
        r#"{"query":{"id":"kettle"},"input":{"available":5}}"#,
    );
    assert_eq!(status, 200, "{set}");
    // Whichever replica each observation reaches (the group hands calls out in turn), one stock.
    let observed = |count: usize| -> Vec<Value> {
        (0..count)
            .map(|n| {
                let on = if n % 2 == 0 { &first } else { &second };
                let (_, seen) = call(
                    on,
                    "fulfilment.stock.observe",
                    r#"{"query":{"id":"kettle"}}"#,
                );
                seen["reply"]["available"].clone()
            })
            .collect()
    };
    assert_eq!(observed(6), vec![serde_json::json!(5); 6]);
    // Ten customers press Buy, through either process at once: five kettles sell, no more.
    let sold: Vec<bool> = std::thread::scope(|scope| {
        let buyers: Vec<_> = (0..10)
            .map(|n| {
                let on = if n % 2 == 0 { &first } else { &second };
                scope.spawn(move || {
                    let body = r#"{"query":{"id":"kettle"},"input":{"quantity":1}}"#;
                    let (status, answer) = call(on, "fulfilment.stock.reserve", body);
                    match answer["error"]["code"].as_str() {
                        Some("OUT_OF_STOCK") => false,
                        None if status == 200 => true,
                        _ => panic!("{status} {answer}"),
                    }
                })
            })
            .collect();
        buyers
            .into_iter()
            .map(|buyer| buyer.join().unwrap())
            .collect()
    });
    assert_eq!(sold.iter().filter(|sold| **sold).count(), 5, "{sold:?}");
    assert_eq!(observed(6), vec![serde_json::json!(0); 6]);

    // store.orders runs in the first only, store.follower in the second only.
    let (status, changed) = call(
        &first,
        "store.orders.transit",
        r#"{"query":{"id":"o1"},"input":{"status":"approved"}}"#,
    );
    assert_eq!(status, 200, "{changed}");
    until("the follower heard the change", || {
        let (_, seen) = call(
            &second,
            "store.follower.observe",
            r#"{"query":{"id":"o1"}}"#,
        );
        (seen["reply"]["status"] == "approved").then_some(())
    });
    drop((first, second));
    let _ = std::fs::remove_dir_all(&scratch);
}

/// An ordinary call whose process is killed while it runs is handed to another process of the
/// group (at least once, as over a broker); a bad `TOA_ALONE` stops the start, naming it.
#[test]
fn a_call_running_in_a_killed_process_runs_again_in_the_other() {
    let scratch = scratch("kill");
    let (runtime, starts) = (scratch.join("run"), scratch.join("starts.jsonl"));
    let group = format!("kill-{}", std::process::id());
    let notes = scratch.join("notes.jsonl");
    let env = [
        ("TEST_NOTES", notes.to_str().unwrap()),
        ("TEST_NOTE_STARTS", starts.to_str().unwrap()),
    ];
    let start = |name: &str| member(&[TERMINALS], name, (&group, &runtime), &env);
    let (first, second) = (start("first"), start("second"));
    let pid = |name: &str| {
        let body = format!(r#"{{"instance":"{name}"}}"#);
        support::call_with(&first.agent, "test.terminals.pid", "", &body).1["reply"].as_u64()
    };
    let (first_pid, second_pid) = (pid("first").unwrap(), pid("second").unwrap());
    // Slow calls from the first until one starts in the second; that one is killed under it.
    let (agent, mut killed) = (first.agent.clone(), None);
    let mut second = Some(second);
    for id in 0..6 {
        let agent = agent.clone();
        let body = format!(r#"{{"input":{{"id":{id},"sleep_ms":3000}}}}"#);
        let call = std::thread::spawn(move || {
            support::call_with(&agent, "test.terminals.note", "", &body)
        });
        let started = until("the call started", || {
            events(&starts).into_iter().find(|s| s["id"] == id)
        });
        if started["pid"].as_u64() == Some(second_pid) {
            second.take().unwrap().kill();
            killed = Some(call.join().unwrap());
            break;
        }
        let _ = call.join();
    }
    let (status, answer) = killed.expect("a call handed to the second within six");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["reply"]["pid"].as_u64(),
        Some(first_pid),
        "run again in the first: {answer}"
    );
    drop(first);

    let refused = support::compose_once(
        &["agent/tests/components/terminals"],
        &[("TOA_ALONE", "maybe")],
    );
    assert_eq!(refused.status.code(), Some(64));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("TOA_ALONE: expected true or false, got \"maybe\""),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&scratch);
}
