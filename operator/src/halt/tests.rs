use super::*;

const WINDOW: u64 = 30;
const GRACE: u64 = 60;

fn timing() -> Halt {
    Halt {
        quiet_window: Duration::from_secs(WINDOW),
        grace: Duration::from_secs(GRACE),
    }
}

/// Seconds after the halt's start.
fn t(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn record() -> Record {
    Record::start(t(0))
}

fn status(phase: AgentPhase, halt: Option<&str>, calls: Calls) -> AgentStatus {
    AgentStatus {
        phase,
        halt: halt.map(str::to_owned),
        instance: "i".into(),
        calls,
        failure: None,
        key: None,
    }
}

fn pod(name: &str, status: AgentStatus) -> Pod {
    Pod {
        name: name.into(),
        report: Report::Status(status),
    }
}

fn running(name: &str) -> Pod {
    pod(name, status(AgentPhase::Running, None, Calls::default()))
}

fn paused(name: &str, halt: &str) -> Pod {
    pod(
        name,
        status(AgentPhase::Paused, Some(halt), Calls::default()),
    )
}

/// Paused for `halt`, with its last call `at` seconds after the start.
fn busy(name: &str, halt: &str, at: i64) -> Pod {
    let calls = Calls {
        since_pause: 3,
        last_at_ms: Some(t(at).as_millisecond() as u64),
        in_flight: 0,
    };
    pod(name, status(AgentPhase::Paused, Some(halt), calls))
}

fn unreachable(name: &str) -> Pod {
    Pod {
        name: name.into(),
        report: Report::Unreachable("timed out after 2 s".into()),
    }
}

fn decide_at(halted: bool, record: Option<&Record>, pods: &[Pod], now: Timestamp) -> Decision {
    decide(&Observation {
        halted,
        timing: timing(),
        record,
        pods,
        left: pods.len(),
        now,
    })
}

#[test]
fn nothing_happens_without_a_halt() {
    let decision = decide_at(false, None, &[running("a")], t(0));
    assert_eq!(decision.phase, Phase::Running);
    assert_eq!(decision.step, Step::Nothing);
}

#[test]
fn a_requested_halt_is_recorded_first() {
    let decision = decide_at(true, None, &[running("a")], t(5));
    assert_eq!(decision.phase, Phase::Requested);
    assert_eq!(
        decision.step,
        Step::Record(Record {
            id: format!("h{}", t(5).as_millisecond()),
            started: t(5),
            outcome: Outcome::InProgress,
            busy: Vec::new(),
        })
    );
}

#[test]
fn running_pods_are_told_to_halt() {
    let record = record();
    let pods = [running("a"), paused("b", &record.id), running("c")];
    let decision = decide_at(true, Some(&record), &pods, t(1));
    assert_eq!(decision.phase, Phase::Pausing);
    assert_eq!(
        decision.step,
        Step::Halt {
            id: record.id.clone(),
            pods: vec!["a".into(), "c".into()],
        }
    );
}

#[test]
fn a_starting_pod_is_halted_too() {
    let record = record();
    let pods = [
        paused("a", &record.id),
        pod("new", status(AgentPhase::Starting, None, Calls::default())),
    ];
    let decision = decide_at(true, Some(&record), &pods, t(10));
    assert_eq!(
        decision.step,
        Step::Halt {
            id: record.id.clone(),
            pods: vec!["new".into()],
        }
    );
}

#[test]
fn a_starting_pod_that_knows_the_halt_is_waited_for_not_sent_it_again() {
    let record = record();
    let pods = [
        paused("a", &record.id),
        pod(
            "new",
            status(AgentPhase::Starting, Some(&record.id), Calls::default()),
        ),
    ];
    let decision = decide_at(true, Some(&record), &pods, t(10));
    assert_eq!(decision.phase, Phase::Pausing);
    assert_eq!(decision.step, Step::WaitUntil(t(GRACE as i64)));
    // Still starting at the end of grace: called off, naming it.
    let decision = decide_at(true, Some(&record), &pods, t(GRACE as i64));
    assert_eq!(decision.phase, Phase::CalledOff);
    assert_eq!(
        decision.busy,
        vec!["new: not paused for the halt (starting)".to_owned()]
    );
    // Pausing and resuming pods are waited for too.
    for phase in [AgentPhase::Pausing, AgentPhase::Resuming] {
        let pods = [pod("b", status(phase, Some(&record.id), Calls::default()))];
        let decision = decide_at(true, Some(&record), &pods, t(10));
        assert_eq!(decision.step, Step::WaitUntil(t(GRACE as i64)), "{phase:?}");
    }
}

#[test]
fn a_call_in_flight_keeps_the_composition_busy_whatever_the_window() {
    let record = record();
    let calls = Calls {
        since_pause: 0,
        last_at_ms: None,
        in_flight: 2,
    };
    let pods = [
        paused("a", &record.id),
        pod("b", status(AgentPhase::Paused, Some(&record.id), calls)),
    ];
    // Long after the window: still busy, the window counts from now.
    let at = t(WINDOW as i64 + 5);
    let decision = decide_at(true, Some(&record), &pods, at);
    assert_eq!(decision.phase, Phase::QuietWatch);
    assert_eq!(decision.step, Step::WaitUntil(t(GRACE as i64)));
    let decision = decide_at(true, Some(&record), &pods, t(GRACE as i64));
    assert_eq!(decision.busy, vec!["b: 2 calls in flight".to_owned()]);
}

#[test]
fn a_failed_pause_calls_the_halt_off_at_once_naming_the_pod() {
    let record = record();
    let mut failed = status(AgentPhase::Running, None, Calls::default());
    failed.failure = Some(AgentFailure {
        halt: record.id.clone(),
        command: "pause".into(),
        message: "component b: pause answered 500; and more".into(),
    });
    let pods = [paused("a", &record.id), pod("b", failed.clone())];
    let decision = decide_at(true, Some(&record), &pods, t(3));
    let busy = vec!["b: pause failed: component b: pause answered 500, and more".to_owned()];
    assert_eq!(decision.phase, Phase::CalledOff);
    assert_eq!(
        decision.step,
        Step::Record(record.called_off(t(3), busy.clone()))
    );
    assert_eq!(decision.busy, busy);
    // The record reads back, so every later reconcile names the same failure.
    let Step::Record(written) = decision.step else {
        unreachable!()
    };
    assert_eq!(Record::parse(&written.to_string()).unwrap(), written);
    // A failure for an older halt does not matter to this one.
    failed.failure.as_mut().unwrap().halt = "h-old".into();
    let decision = decide_at(true, Some(&record), &[pod("b", failed)], t(3));
    assert_eq!(decision.phase, Phase::Pausing);
}

#[test]
fn paused_pods_wait_for_the_quiet_window() {
    let record = record();
    let pods = [paused("a", &record.id), paused("b", &record.id)];
    let decision = decide_at(true, Some(&record), &pods, t(10));
    assert_eq!(decision.phase, Phase::QuietWatch);
    assert_eq!(decision.step, Step::WaitUntil(t(WINDOW as i64)));
}

#[test]
fn quiet_for_the_window_stops_the_composition() {
    let record = record();
    let pods = [paused("a", &record.id), paused("b", &record.id)];
    let decision = decide_at(true, Some(&record), &pods, t(WINDOW as i64));
    assert_eq!(decision.phase, Phase::ScalingDown);
    assert_eq!(decision.step, Step::Record(record.with(Outcome::Stopped)));
}

#[test]
fn a_call_after_the_pause_restarts_the_quiet_window() {
    let record = record();
    let pods = [paused("a", &record.id), busy("b", &record.id, 20)];
    let decision = decide_at(true, Some(&record), &pods, t(WINDOW as i64));
    assert_eq!(decision.phase, Phase::QuietWatch);
    assert_eq!(decision.step, Step::WaitUntil(t(20 + WINDOW as i64)));
    let decision = decide_at(true, Some(&record), &pods, t(20 + WINDOW as i64));
    assert_eq!(decision.step, Step::Record(record.with(Outcome::Stopped)));
}

#[test]
fn calls_counted_without_a_time_count_as_busy_now() {
    let record = record();
    let calls = Calls {
        since_pause: 1,
        last_at_ms: None,
        in_flight: 0,
    };
    let pods = [pod(
        "a",
        status(AgentPhase::Paused, Some(&record.id), calls),
    )];
    let decision = decide_at(true, Some(&record), &pods, t(40));
    assert_eq!(decision.phase, Phase::QuietWatch);
    assert_eq!(decision.step, Step::WaitUntil(t(GRACE as i64)));
}

#[test]
fn not_quiet_within_grace_calls_the_halt_off_and_resumes_every_pod() {
    let record = record();
    let pods = [paused("a", &record.id), busy("b", &record.id, 45)];
    // Quiet only from 45 + 30 = 75 s, past the grace of 60 s.
    let decision = decide_at(true, Some(&record), &pods, t(GRACE as i64));
    assert_eq!(decision.phase, Phase::CalledOff);
    // The busy pod is named, the quiet one is not; the record keeps the names.
    assert_eq!(decision.busy, ["b: 3 calls since the pause"]);
    let called_off = record.called_off(t(GRACE as i64), decision.busy.clone());
    assert_eq!(decision.step, Step::Record(called_off.clone()));

    // Later reconciles (whatever status they read) name the same pods, from the record.
    let decision = decide_at(true, Some(&called_off), &pods, t(61));
    assert_eq!(decision.phase, Phase::CalledOff);
    assert_eq!(decision.busy, ["b: 3 calls since the pause"]);
    assert_eq!(
        decision.step,
        Step::Resume(vec![
            ("a".into(), record.id.clone()),
            ("b".into(), record.id.clone())
        ])
    );
}

#[test]
fn a_quiet_window_that_ends_after_grace_does_not_stop() {
    let record = record();
    let pods = [busy("a", &record.id, 31)];
    // Quiet until 61 s, one second past grace: too late even when asked at 61 s.
    let decision = decide_at(true, Some(&record), &pods, t(61));
    assert_eq!(decision.phase, Phase::CalledOff);
}

#[test]
fn a_called_off_halt_is_tried_again_after_grace() {
    let record = record();
    let called_off = record.with(Outcome::CalledOff(t(60)));
    let pods = [running("a")];
    let decision = decide_at(true, Some(&called_off), &pods, t(100));
    assert_eq!(decision.phase, Phase::CalledOff);
    assert_eq!(decision.step, Step::WaitUntil(t(120)));
    let decision = decide_at(true, Some(&called_off), &pods, t(120));
    assert_eq!(decision.phase, Phase::Requested);
    assert_eq!(decision.step, Step::Record(Record::start(t(120))));
}

#[test]
fn unreachable_pods_block_quiet_and_are_reported() {
    let record = record();
    let pods = [paused("a", &record.id), unreachable("b")];
    let decision = decide_at(true, Some(&record), &pods, t(WINDOW as i64 + 1));
    assert_eq!(decision.phase, Phase::Pausing);
    assert_eq!(decision.step, Step::WaitUntil(t(GRACE as i64)));
    assert_eq!(
        decision.unreachable,
        [("b".to_owned(), "timed out after 2 s".to_owned())]
    );
    let decision = decide_at(true, Some(&record), &pods, t(GRACE as i64));
    assert_eq!(decision.phase, Phase::CalledOff);
    assert_eq!(decision.busy, ["b: its agent does not answer"]);
}

#[test]
fn draining_pods_neither_block_nor_get_halted() {
    let record = record();
    let pods = [
        paused("a", &record.id),
        pod("old", status(AgentPhase::Draining, None, Calls::default())),
    ];
    let decision = decide_at(true, Some(&record), &pods, t(WINDOW as i64));
    assert_eq!(decision.step, Step::Record(record.with(Outcome::Stopped)));
}

#[test]
fn a_pod_paused_for_an_older_halt_is_resumed_first() {
    let record = record();
    let pods = [paused("a", "h-old"), running("b")];
    let decision = decide_at(true, Some(&record), &pods, t(1));
    assert_eq!(
        decision.step,
        Step::Resume(vec![("a".into(), "h-old".into())])
    );
}

#[test]
fn a_stopped_halt_scales_down_then_is_halted() {
    let stopped = record().with(Outcome::Stopped);
    let decision = decide_at(true, Some(&stopped), &[unreachable("a")], t(40));
    assert_eq!(decision.phase, Phase::ScalingDown);
    assert_eq!(decision.step, Step::Nothing);
    let decision = decide_at(true, Some(&stopped), &[], t(50));
    assert_eq!(decision.phase, Phase::Halted);
    assert_eq!(decision.step, Step::Nothing);
}

#[test]
fn a_stopped_halt_is_not_halted_while_a_terminating_pod_is_left() {
    // A pod being deleted sends no report (it takes no part in a halt) but is still listed.
    let stopped = record().with(Outcome::Stopped);
    let decision = decide(&Observation {
        halted: true,
        timing: timing(),
        record: Some(&stopped),
        pods: &[],
        left: 1,
        now: t(45),
    });
    assert_eq!(decision.phase, Phase::ScalingDown);
}

#[test]
fn unhalting_resumes_paused_pods_then_clears_the_record() {
    let record = record();
    let pods = [paused("a", &record.id), running("b")];
    let decision = decide_at(false, Some(&record), &pods, t(10));
    assert_eq!(decision.phase, Phase::Resuming);
    assert_eq!(
        decision.step,
        Step::Resume(vec![("a".into(), record.id.clone())])
    );
    let pods = [running("a"), running("b")];
    let decision = decide_at(false, Some(&record), &pods, t(11));
    assert_eq!(decision.step, Step::Clear);
    let stopped = record.with(Outcome::Stopped);
    let decision = decide_at(false, Some(&stopped), &[], t(90));
    assert_eq!(decision.step, Step::Clear);
}

#[test]
fn without_a_record_a_paused_pod_is_resumed() {
    let decision = decide_at(false, None, &[paused("a", "h1")], t(0));
    assert_eq!(decision.phase, Phase::Running);
    assert_eq!(decision.step, Step::Resume(vec![("a".into(), "h1".into())]));
}

#[test]
fn replicas_drop_to_zero_only_once_stopped_while_halted() {
    let record = record();
    assert_eq!(replicas(3, true, None), 3);
    assert_eq!(replicas(3, true, Some(&record)), 3);
    assert_eq!(replicas(3, true, Some(&record.with(Outcome::Stopped))), 0);
    assert_eq!(replicas(3, false, Some(&record.with(Outcome::Stopped))), 3);
}

#[test]
fn the_record_reads_back_what_it_writes() {
    let record = record();
    for outcome in [
        Outcome::InProgress,
        Outcome::Stopped,
        Outcome::CalledOff(t(61)),
    ] {
        let written = record.with(outcome);
        assert_eq!(Record::parse(&written.to_string()), Ok(written));
    }
    let busy = vec![
        "shop-1: 3 calls since the pause".to_owned(),
        "shop-2: its agent does not answer".to_owned(),
    ];
    let written = record.called_off(t(61), busy);
    assert!(written
        .to_string()
        .ends_with(" busy: shop-1: 3 calls since the pause; shop-2: its agent does not answer"));
    assert_eq!(Record::parse(&written.to_string()), Ok(written));
    assert!(Record::parse("h1@2027-01-15T08:00:00Z stopped busy: shop-1").is_err());
    assert_eq!(
        Record::parse("h1@2027-01-15T08:00:00Z stopped").unwrap(),
        Record {
            id: "h1".into(),
            started: "2027-01-15T08:00:00Z".parse().unwrap(),
            outcome: Outcome::Stopped,
            busy: Vec::new(),
        }
    );
}

#[test]
fn a_malformed_record_is_refused_with_the_expected_form() {
    for text in [
        "",
        "h1",
        "@2027-01-15T08:00:00Z",
        "h1@yesterday",
        "h1@2027-01-15T08:00:00Z done",
    ] {
        let error = Record::parse(text).unwrap_err();
        assert!(
            error.starts_with("`toa.io/halt`: expected \"<id>@<RFC 3339 time>\""),
            "{error}"
        );
    }
}

#[test]
fn agent_status_reads_the_control_endpoints_json() {
    let status: AgentStatus = serde_json::from_str(
        r#"{"phase":"paused","halt":"h1","instance":"shop-0","calls":{"since_pause":2,"last_at_ms":1700000000000}}"#,
    )
    .unwrap();
    assert_eq!(
        status,
        AgentStatus {
            phase: AgentPhase::Paused,
            halt: Some("h1".into()),
            instance: "shop-0".into(),
            calls: Calls {
                since_pause: 2,
                last_at_ms: Some(1_700_000_000_000),
                in_flight: 0,
            },
            failure: None,
            key: None,
        },
        "an agent without `in_flight` and `failure` reads as none"
    );
    let status: AgentStatus = serde_json::from_str(
        r#"{"phase":"running","halt":null,"instance":"shop-0","calls":{"since_pause":0,"last_at_ms":null,"in_flight":3},"failure":{"halt":"h1","command":"pause","message":"m"}}"#,
    )
    .unwrap();
    assert_eq!(status.calls.in_flight, 3);
    assert_eq!(status.failure.unwrap().command, "pause");
    for (text, phase) in [
        ("pausing", AgentPhase::Pausing),
        ("resuming", AgentPhase::Resuming),
    ] {
        let status: AgentStatus = serde_json::from_str(&format!(
            r#"{{"phase":"{text}","halt":"h1","instance":"x","calls":{{"since_pause":0,"last_at_ms":null}}}}"#
        ))
        .unwrap();
        assert_eq!(status.phase, phase);
    }
    let status: AgentStatus = serde_json::from_str(
        r#"{"phase":"hibernating","halt":null,"instance":"x","calls":{"since_pause":0,"last_at_ms":null}}"#,
    )
    .unwrap();
    assert_eq!(status.phase, AgentPhase::Unknown);
}
