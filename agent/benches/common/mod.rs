//! What the benches share: the figures of a load, the lines they print, a process's memory.
#![allow(dead_code)] // each bench uses part of it

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Prints `BENCH <name> <ours> <baseline> <ratio>`.
pub fn line(name: &str, ours: f64, baseline: Option<f64>) {
    match baseline {
        Some(b) => println!("BENCH {name} {ours:.1} {b:.1} {:.2}", ours / b),
        None => println!("BENCH {name} {ours:.1} - -"),
    }
}

#[derive(Clone, Copy)]
pub struct Figures {
    pub p50: f64,
    pub p99: f64,
    pub rate: f64,
}

/// `total` calls from `callers` tasks at once; the n-th call is given `n`.
pub async fn measure<F, Fut>(callers: usize, total: usize, call: F) -> Figures
where
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                for i in 0..total / callers {
                    let t = Instant::now();
                    call(i * callers + caller).await;
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let seconds = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let pick = |q: f64| all[((all.len() - 1) as f64 * q) as usize];
    Figures {
        p50: pick(0.5),
        p99: pick(0.99),
        rate: all.len() as f64 / seconds,
    }
}

/// `total` POSTs of JSON to `url` from `callers` tasks at once, the n-th with `body(n)`; each
/// must succeed.
pub async fn posts<B>(
    http: reqwest::Client,
    url: String,
    (callers, total): (usize, usize),
    body: B,
) -> Figures
where
    B: Fn(usize) -> String + Send + Sync + Clone + 'static,
{
    measure(callers, total, move |n| {
        let (http, url, body) = (http.clone(), url.clone(), body(n));
        async move { post(&http, &url, body).await }
    })
    .await
}

/// The median of `values`.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// This bench's executable again with `args` (a helper: a bare responder, an echo server), its
/// standard input a pipe that closes with this process: the first line it prints (its address,
/// or that it is ready) and the process.
pub fn helper(args: &[&str]) -> (String, std::process::Child) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let out = child.stdout.take().unwrap();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    (line.trim().to_owned(), child)
}

/// In a [`helper`]: exits when the bench that started it is gone (killed, even), as its end of
/// the standard input pipe closes.
pub fn exit_with_parent() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
}

/// A process's resident memory, in MB.
pub fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// A process's CPU time so far (user and system), in seconds; 0 for a process that is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, [11, 12])
}

/// How many times a process's threads have been switched out so far, voluntarily (to sleep,
/// woken later) or not: the sum over its threads now in `/proc`.
pub fn context_switches(pid: u32) -> u64 {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    threads
        .filter_map(|thread| std::fs::read_to_string(thread.ok()?.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The CPU time of a process's children that ended and were reaped (cutime and cstime).
fn children_cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, [13, 14])
}

/// The sum of two clock-tick fields of `/proc/<pid>/stat`, counted after the command's closing
/// parenthesis (utime and stime are the 12th and 13th there), in seconds; 0 for a process that
/// is gone.
fn stat_seconds(pid: u32, fields: [usize; 2]) -> f64 {
    let values = stat_fields(pid);
    let field = |i: usize| {
        values
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf only reads a constant of the system.
    (field(fields[0]) + field(fields[1])) / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The CPU time so far of every process named `name` (its command, as /proc gives it), in
/// seconds, with that of their children reaped: a server's processes, whichever connection they
/// serve, and those that ended meanwhile (a server's parent process reaps its backends and
/// workers, and their time is added to its own children's).
pub fn cpu_seconds_named(name: &str) -> f64 {
    processes()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .map(|pid| cpu_seconds(pid) + children_cpu_seconds(pid))
        .sum()
}

/// A process's children (an agent's programs), from every process's parent in /proc:
/// `task/<pid>/children` lists only the children of the one thread, and a program may be spawned
/// from any of the agent's.
pub fn children(pid: u32) -> Vec<u32> {
    let parent = pid.to_string();
    processes()
        .filter(|child| stat_fields(*child).get(1) == Some(&parent))
        .collect()
}

/// Every process's id, from /proc.
fn processes() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
}

/// The fields of `/proc/<pid>/stat` after the command's closing parenthesis (the state first,
/// then the parent's id); none for a process that is gone.
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after.split_whitespace().map(str::to_owned).collect()
}

/// The workspace's root, where the benches' agents run.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A child process (an agent, a bench's helper), killed when dropped.
pub struct Process(pub std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A POST of JSON `body`, which must succeed.
pub async fn post(http: &reqwest::Client, url: &str, body: String) {
    let response = http
        .post(url)
        .body(body)
        .header("content-type", "application/json");
    let answer = response.send().await.unwrap();
    assert!(
        answer.status().is_success(),
        "{}",
        answer.text().await.unwrap()
    );
}

/// Waits (60 s at most) for the agent on `port` to be ready.
pub async fn wait_ready(http: &reqwest::Client, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = format!("http://127.0.0.1:{port}/readyz");
    loop {
        if let Ok(answer) = http.get(&url).send().await {
            if answer.status().is_success() {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the agent was not ready in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `toa-agent compose` of `components` on `port`, in `application` with `context` (its other
/// lines: `amqp`, `storage`), the tests' PostgreSQL login and `env` given; killed when dropped.
pub fn compose(
    port: u16,
    (application, context): (&str, &str),
    components: &[&str],
    env: &[(&str, &str)],
) -> Process {
    let file = std::env::temp_dir().join(format!("toa-bench-{application}-{port}.yaml"));
    std::fs::write(&file, format!("name: {application}\n{context}")).unwrap();
    // Another build of the agent, to compare one with another in the same harness.
    let agent = std::env::var("TOA_BENCH_AGENT");
    let agent = agent.as_deref().unwrap_or(env!("CARGO_BIN_EXE_toa-agent"));
    let child = std::process::Command::new(agent)
        .current_dir(root())
        .arg("compose")
        .args(components)
        .arg("--context")
        .arg(&file)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("TOA_STORAGE_USERNAME", "toa")
        .env("TOA_STORAGE_PASSWORD", "toa")
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    Process(child)
}

/// A connection to the tests' PostgreSQL as its owner, with the agent's session setting that
/// keeps plans on the indexes (docs/component-protocol.md): without it a bare client's prepared
/// statements, planned while its table was small, scanned the table whole in some runs (the
/// baseline at half its speed, the ratio above 1).
pub async fn connect() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(
        "host=127.0.0.1 port=5432 user=toa password=toa dbname=toa options='-c enable_seqscan=off'",
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    client
}

/// One write of the bare events pair: a transaction updating the row `o-<n % objects>` of
/// `table` and inserting its two event rows (`changed`, `noted`) into `<table>_outbox`, then both
/// events published persistent, each awaiting its confirm, to `exchange`.
pub async fn bare_write(
    clients: &[tokio::sync::Mutex<tokio_postgres::Client>],
    channel: &lapin::Channel,
    (table, exchange): (&str, &str),
    (n, objects): (usize, usize),
) {
    let id = format!("o-{}", n % objects);
    let state = tokio_postgres::types::Json(serde_json::json!({ "total": n }));
    let mut client = clients[n % clients.len()].lock().await;
    let transaction = client.transaction().await.unwrap();
    let row = transaction
        .query_one(&format!("UPDATE {table} SET version = version + 1, state = $2 WHERE id = $1 RETURNING version"), &[&id, &state])
        .await
        .unwrap();
    let version: i64 = row.get(0);
    for label in ["changed", "noted"] {
        transaction
            .execute(&format!("INSERT INTO {table}_outbox (id, version, label, payload) VALUES ($1, $2, $3, $4)"), &[&id, &version, &label, &state])
            .await
            .unwrap();
    }
    transaction.commit().await.unwrap();
    drop(client);
    for label in ["changed", "noted"] {
        let body = serde_json::to_vec(&state.0).unwrap();
        let properties = lapin::BasicProperties::default().with_delivery_mode(2);
        let confirm = channel
            .basic_publish(
                exchange.into(),
                label.into(),
                Default::default(),
                &body,
                properties,
            )
            .await
            .unwrap();
        confirm.await.unwrap();
    }
}
