//! The agent as it runs in a pod: attached to a program someone else started, with the context
//! from `TOA_*` variables, a control token, and its probe port. What the kubelet relies on: the
//! listeners are bound before anything else, a drain needs the drain key (the local API does not
//! drain a pod) and is answered even
//! while the agent starts, and a program that the kubelet restarted gets the lifecycle again
//! from the same agent, which never lets its ports go.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{event_names, events, free_port, http_get, http_get_or_none, Composition};

const COMPONENT: &str = "agent/tests/components/recorder";

/// The recorder, started as its container would start it.
fn program(port: u16, agent: u16, record: &std::path::Path) -> Child {
    program_from("recorder.py", port, agent, record)
}

fn program_from(script: &str, port: u16, agent: u16, record: &std::path::Path) -> Child {
    Command::new("python3")
        .arg(script)
        .current_dir(support::root().join(COMPONENT))
        .env("TOA_PORT", port.to_string())
        .env("TOA_AGENT", format!("http://127.0.0.1:{agent}"))
        .env("TOA_COMPONENT", "test.recorder")
        .env("TOA_INSTANCE", "pod-1")
        .env("TEST_RECORD", record)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

struct Pod {
    agent: Composition,
    local: u16,
    attach: u16,
    control: u16,
    probe: u16,
    token: &'static str,
    /// The drain key the kubelet's hooks present (the agent has its digest).
    key: &'static str,
}

/// Where pod `name`'s token is mounted: a directory of its own, as the kubelet mounts the Secret
/// (`token`, and `previous` during a rotation).
fn token_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir()
        .join(format!("toa-pod-{}-{name}", std::process::id()))
        .join("token")
}

/// An agent in pod mode (`TOA_APPLICATION` set) attached to `attach`.
fn agent(local: u16, attach: u16, name: &str) -> Pod {
    agent_of(COMPONENT, local, attach, name)
}

fn agent_of(component: &str, local: u16, attach: u16, name: &str) -> Pod {
    let (control, probe) = (free_port(), free_port());
    let token = "pod-token";
    let key = "pod-drain-key";
    let file = token_file(name);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(file.with_file_name("previous"));
    std::fs::write(&file, token).unwrap();
    let agent = Composition::start_at(
        local,
        &[
            component,
            "--attach",
            &attach.to_string(),
            "--control-listen",
            &format!("127.0.0.1:{control}"),
            "--control-token-file",
            file.to_str().unwrap(),
            "--probe-listen",
            &format!("127.0.0.1:{probe}"),
            "--drain-key-sha256",
            &toa_context::control::drain_digest(key),
        ],
        // The node, as this pod sees it, is 127.0.0.1: hooks from there are the kubelet's.
        &[
            ("TOA_APPLICATION", "pod-test"),
            ("TOA_KUBERNETES_NAMESPACE", "pod-tests"),
            ("TOA_INSTANCE", "pod-1"),
            ("TOA_HOST_IPS", "127.0.0.1"),
        ],
    );
    Pod {
        agent,
        local,
        attach,
        control,
        probe,
        token,
        key,
    }
}

/// A program started from `script` and its agent attached to it, ready; and the program's record.
fn ready_pod(script: &str, name: &str) -> (Child, Pod, std::path::PathBuf) {
    let record = std::env::temp_dir().join(format!("toa-pod-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&record);
    let (local, attach) = (free_port(), free_port());
    let program = program_from(script, attach, local, &record);
    let pod = agent(local, attach, name);
    pod.agent.wait_ready();
    (program, pod, record)
}

/// A request to the agent's port on loopback.
fn request(port: u16, method: &str, path: &str, headers: &str) -> (u16, String) {
    support::request("127.0.0.1", port, method, path, headers)
}

/// After a drain asked by a hook: the agent, a native sidecar, stays until the kubelet stops it
/// after the component containers, and answers its own preStop hook (the same `GET
/// /drain/<key>` from the node) at once, drained; then SIGTERM, as the kubelet sends it, and it
/// exits 0.
fn stopped_by_the_kubelet(pod: &mut Pod) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pod
        .agent
        .log()
        .contains("drained: the probe port answers until the stop signal")
    {
        assert_eq!(
            pod.agent.exited(),
            None,
            "the agent exited after the drain:\n{}",
            pod.agent.log()
        );
        assert!(Instant::now() < deadline, "{}", pod.agent.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(pod.agent.exited(), None, "{}", pod.agent.log());
    let asked = Instant::now();
    let (status, answer) = request(pod.probe, "GET", &format!("/drain/{}", pod.key), "");
    assert_eq!(
        status,
        200,
        "the agent's own preStop hook after the drain: {answer}\n{}",
        pod.agent.log()
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(pod.agent.exited(), None, "{}", pod.agent.log());
    pod.agent.signal_term();
    assert!(wait_exit(&mut pod.agent, Duration::from_secs(10)));
}

fn wait_exit(agent: &mut Composition, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(success) = agent.exited() {
            return success;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not stop within {limit:?}:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_listeners_are_bound_once_healthz_answers_before_the_program_serves() {
    // Nothing serves the attach port yet: the agent waits for its program, listeners bound.
    let (local, attach) = (free_port(), free_port());
    let pod = agent(local, attach, "early");
    // What the native sidecar's startupProbe waits for: `/healthz` on the probe port.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while http_get_or_none(&format!("http://127.0.0.1:{}/healthz", pod.probe)) != Some(200) {
        assert!(
            std::time::Instant::now() < deadline,
            "no /healthz in 30 s:\n{}",
            pod.agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The probes answer at once: alive, not ready.
    assert_eq!(
        http_get(&format!("http://127.0.0.1:{}/healthz", pod.probe)).0,
        200
    );
    assert_eq!(
        http_get(&format!("http://127.0.0.1:{}/readyz", pod.probe)).0,
        503
    );
    // A program that tries the agent's ports finds them taken.
    for port in [pod.local, pod.control, pod.probe] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_err(),
            "port {port} was free for the program"
        );
    }
    assert!(!pod.agent.log().contains("Composition complete"));
}

#[test]
fn in_a_pod_a_taken_local_port_stops_the_start_instead_of_moving() {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let mut pod = agent(taken, free_port(), "taken");
    assert!(!wait_exit(&mut pod.agent, Duration::from_secs(10)));
    let log = pod.agent.log();
    assert!(
        log.contains(&format!("local API 127.0.0.1:{taken}")),
        "{log}"
    );
}

#[test]
fn a_pods_drain_needs_the_drain_key_and_answers_once_dispose_ran() {
    let (mut program, mut pod, record) = ready_pod("recorder.py", "drain");
    let key = pod.key;

    // The program can reach both ports, but the local API does not drain a pod at all, and the
    // probe port's hooks need the key.
    let (status, answer) = request(pod.local, "POST", "/v1/drain", "");
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("DRAIN_IN_POD"), "{answer}");
    let with_key = format!("x-toa-drain: {key}\r\n");
    assert_eq!(request(pod.local, "POST", "/v1/drain", &with_key).0, 403);
    assert_eq!(request(pod.probe, "GET", "/drain/guess", "").0, 401);
    let digest = toa_context::control::drain_digest(key);
    assert_eq!(
        request(pod.probe, "GET", &format!("/drain/{digest}"), "").0,
        401,
        "the digest the agent has opens nothing"
    );
    let header = format!("x-toa-drain: {key}\r\n");
    assert_eq!(
        request(pod.probe, "GET", "/drain", &header).0,
        401,
        "the probe port takes the key in the path"
    );
    let (status, answer) = request(pod.probe, "GET", "/drain/", "");
    assert_eq!(status, 401);
    assert!(answer.contains("drain key"), "{answer}");
    // From anywhere but the node, the key opens nothing: anyone who may read the pod spec has it.
    for path in [format!("/drain/{key}"), format!("/started/0/{key}")] {
        let (status, answer) = support::request_from("127.0.0.2", pod.probe, &path);
        assert_eq!(status, 403, "{path}: {answer}");
        assert!(
            answer.contains("a kubelet hook comes from the node; 127.0.0.2 is not one"),
            "{answer}"
        );
    }
    assert_eq!(request(pod.probe, "GET", "/elsewhere", "").0, 404);
    assert_eq!(pod.agent.exited(), None, "{}", pod.agent.log());
    let (_, body) = support::control(pod.control, "GET", "/control/status", Some(pod.token), "");
    assert_eq!(body["phase"], "running");

    // The components' preStop hook: the key in the path, on the probe port, as the kubelet sends
    // it.
    let (status, answer) = request(pod.probe, "GET", &format!("/drain/{key}"), "");
    assert_eq!(status, 200, "{answer}");
    let names = event_names(&record);
    assert_eq!(
        names.last().map(String::as_str),
        Some("dispose"),
        "{names:?}"
    );
    stopped_by_the_kubelet(&mut pod);
    program.kill().unwrap();
    program.wait().unwrap();
}

/// `toa-agent drain` is for local runs: in a pod its local API refuses, and only the node's hooks
/// drain (the agent's own `preStop` is one of them).
#[test]
fn in_a_pod_toa_agent_drain_is_refused_and_the_nodes_hook_drains() {
    let (mut program, mut pod, record) = ready_pod("recorder.py", "own");
    let drain = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .arg("drain")
            .args(args)
            .output()
            .unwrap()
    };
    // Through the local API, as in a local run: refused in a pod.
    let local = format!("http://127.0.0.1:{}", pod.local);
    let refused = drain(&["--agent", &local]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("403"), "{said}");
    let old = drain(&[
        "--probe",
        &format!("127.0.0.1:{}", pod.probe),
        "--key",
        pod.key,
    ]);
    assert!(!old.status.success(), "the pod form of `drain` is gone");
    assert_ne!(
        events(&record).last().map(|e| e["event"].clone()),
        Some("dispose".into())
    );
    let (status, answer) = request(pod.probe, "GET", &format!("/drain/{}", pod.key), "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        events(&record).last().map(|e| e["event"].clone()),
        Some("dispose".into())
    );
    stopped_by_the_kubelet(&mut pod);
    program.kill().unwrap();
    program.wait().unwrap();
}

/// The run commands the recorder ran, in order.
fn run_commands(record: &std::path::Path) -> Vec<String> {
    event_names(record)
        .into_iter()
        .filter(|e| ["preflight", "settle", "ready", "dispose"].contains(&e.as_str()))
        .collect()
}

#[test]
fn a_restarted_container_gets_the_lifecycle_again_from_the_same_agent() {
    // As a kubelet runs a component container: its postStart hook tells the agent at each start.
    // The first start is the pod's; after a crash the kubelet starts a new program on the same
    // port and calls the hook again. The agent stays (its ports with it) and runs the lifecycle
    // for the new program.
    let (mut first, mut pod, record) = ready_pod("recorder.py", "again");
    let key = pod.key;
    let started = format!("//started/0/{key}");
    assert_eq!(request(pod.probe, "GET", &started, "").0, 200);
    // Nothing else does it: a program without the key is refused, and a bad index is named.
    assert_eq!(request(pod.probe, "GET", "/started/0/guess", "").0, 401);
    let (status, answer) = request(pod.probe, "GET", &format!("/started/x/{key}"), "");
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("expected a container index"), "{answer}");
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = program(pod.attach, pod.local, &record);
    assert_eq!(request(pod.probe, "GET", &started, "").0, 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !pod.agent.log().contains("the component serves again") {
        assert!(Instant::now() < deadline, "{}", pod.agent.log());
        assert_eq!(pod.agent.exited(), None, "{}", pod.agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        run_commands(&record),
        [
            "preflight",
            "settle",
            "ready",
            "preflight",
            "settle",
            "ready"
        ]
    );
    let (ok, answer) = pod.agent.call("test.recorder.echo", "{ input: { n: 2 } }");
    assert!(ok, "{answer}");
    let (status, body) =
        support::control(pod.control, "GET", "/control/status", Some(pod.token), "");
    assert_eq!((status, body["phase"].as_str()), (200, Some("running")));
    assert_eq!(
        http_get(&format!("http://127.0.0.1:{}/readyz", pod.probe)).0,
        200
    );
    second.kill().unwrap();
    second.wait().unwrap();
}

#[test]
fn a_stop_while_starting_answers_the_drain_at_once() {
    // Nothing serves the attach port: the agent is still waiting for its program when the pod
    // is deleted. The hooks get their answer at once, not after the grace period.
    let (local, attach) = (free_port(), free_port());
    let mut pod = agent(local, attach, "starting");
    let key = pod.key;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", pod.probe)).is_err() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    let asked = Instant::now();
    let (status, _) = request(pod.probe, "GET", &format!("/drain/{key}"), "");
    assert_eq!(status, 200);
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    stopped_by_the_kubelet(&mut pod);
    assert!(
        pod.agent.log().contains("stopped while starting"),
        "{}",
        pod.agent.log()
    );
}

/// The listening socket on `port` of process `pid`, duplicated into this process (pidfd_getfd:
/// the same socket, not a copy), found through the process's descriptors and its TCP table.
fn listener_of(pid: u32, port: u16) -> i32 {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    let inode = table
        .lines()
        .skip(1)
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            // 0A: LISTEN.
            (local == port && fields.get(3) == Some(&"0A")).then(|| fields[9].to_owned())
        })
        .unwrap_or_else(|| panic!("nothing listens on {port}"));
    let socket = format!("socket:[{inode}]");
    let fd = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(Result::ok)
        .find(|entry| {
            std::fs::read_link(entry.path()).is_ok_and(|link| link.as_os_str() == socket.as_str())
        })
        .and_then(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .unwrap_or_else(|| panic!("process {pid} holds no {socket}"));
    // SAFETY: plain system calls on descriptors this test owns.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let stolen = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as i32;
        assert!(
            stolen >= 0,
            "pidfd_getfd: {}",
            std::io::Error::last_os_error()
        );
        libc::close(pidfd);
        stolen
    }
}

#[test]
fn a_server_that_dies_stops_the_agent_and_says_which() {
    let (mut program, mut pod, _record) = ready_pod("recorder.py", "dies");
    // The probe listener's socket, shut down under the agent: it accepts nothing any more.
    let socket = listener_of(pod.agent.pid(), pod.probe);
    // SAFETY: the descriptor was duplicated into this process above.
    unsafe {
        assert_eq!(libc::shutdown(socket, libc::SHUT_RDWR), 0);
        libc::close(socket);
    }
    let succeeded = wait_exit(&mut pod.agent, Duration::from_secs(15));
    let log = pod.agent.log();
    assert!(!succeeded, "the agent exited successfully:\n{log}");
    assert!(
        log.contains("the probe endpoint stopped: accepting connections failed"),
        "the log does not name the server:\n{log}"
    );
    let _ = program.kill();
    let _ = program.wait();
}

#[test]
fn control_requests_are_signed_for_this_pod_and_now() {
    let (mut program, pod, _record) = ready_pod("recorder.py", "signed");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let body = r#"{"halt":"h1"}"#;
    let nonces = std::cell::Cell::new(0u64);
    let signed = |pod_name: &str, ts: u64, path: &str| {
        nonces.set(nonces.get() + 1);
        let nonce = format!("{:016x}", nonces.get());
        toa_context::control::Signed {
            method: "POST",
            path,
            pod: pod_name,
            ts,
            nonce: &nonce,
            body: body.as_bytes(),
        }
        .authorization(pod.token)
    };
    let halt = |authorization: &str| {
        support::control_with(
            pod.control,
            "POST",
            "/control/halt",
            Some(authorization),
            body,
        )
    };
    let refused = |(status, answer): (u16, serde_json::Value), why: &str| {
        assert_eq!(status, 401, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(why), "{message}");
    };
    refused(
        halt(&signed("pod-2", now, "/control/halt")),
        "signed for pod",
    );
    refused(
        halt(&signed("pod-1", now - 120, "/control/halt")),
        "more than 30 s",
    );
    refused(
        halt(&signed("pod-1", now, "/control/resume")),
        "does not match",
    );
    let right = signed("pod-1", now, "/control/halt");
    let (status, answer) = halt(&right);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["halt"], "h1");
    // The same signed request again (a listener on the pod's old IP replaying it): refused.
    refused(halt(&right), "taken already");
    // The token itself, as operators before signing sent it: still taken.
    let (status, answer) =
        support::control(pod.control, "GET", "/control/status", Some(pod.token), "");
    assert_eq!((status, answer["instance"].as_str()), (200, Some("pod-1")));
    let _ = program.kill();
    let _ = program.wait();
}

/// A token rotation needs no restart: the agent reads the mounted files again, takes requests
/// signed with the new token and the previous one while both are there, reports the new key id,
/// and refuses the old token once `previous` is gone.
#[test]
fn a_rotated_token_is_read_again_and_the_previous_one_taken_meanwhile() {
    let (mut program, pod, _record) = ready_pod("recorder.py", "rotated");
    let file = token_file("rotated");
    let previous = file.with_file_name("previous");
    let status =
        |token: &str| support::control(pod.control, "GET", "/control/status", Some(token), "");
    let (code, before) = status(pod.token);
    assert_eq!(code, 200, "{before}");
    assert_eq!(before["key"], toa_context::control::key_id(pod.token));
    // The rotation, as the kubelet writes the Secret's new version: new `token`, old `previous`.
    std::fs::write(&previous, pod.token).unwrap();
    std::fs::write(&file, "rotated-token").unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let (code, answer) = status("rotated-token");
        if code == 200 {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "the new token was not read within 15 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(after["key"], toa_context::control::key_id("rotated-token"));
    assert_eq!(
        status(pod.token).0,
        200,
        "the previous token was refused during the rotation"
    );
    // The rotation ends: `previous` goes, and so does the old token.
    std::fs::remove_file(&previous).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while status(pod.token).0 != 401 {
        assert!(
            Instant::now() < deadline,
            "the old token was still taken 15 s after it went"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = program.kill();
    let _ = program.wait();
}

/// The configuration is the Composition's: the operator checked it and gives it to the
/// component's container. A schema whose required value has no default (a secret, say) does not
/// stop the pod's agent, which starts no program and has no values to check.
#[test]
fn in_a_pod_the_configuration_is_not_the_agents_to_refuse() {
    let dir = std::env::temp_dir().join(format!("toa-pod-configured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = std::fs::read_to_string(support::root().join(COMPONENT).join("manifest.toa.yaml"))
        .unwrap()
        + "configuration:\n  type: object\n  properties:\n    password: { type: string }\n  required: [password]\n";
    std::fs::write(dir.join("manifest.toa.yaml"), manifest).unwrap();
    let record = dir.join("record");
    let (local, attach) = (free_port(), free_port());
    let mut program = program(attach, local, &record);
    let mut pod = agent_of(dir.to_str().unwrap(), local, attach, "configured");
    // A refusal would end the agent before this, naming `configuration`.
    pod.agent.wait_ready();
    assert_eq!(pod.agent.exited(), None, "{}", pod.agent.log());
    program.kill().unwrap();
    program.wait().unwrap();
}
